//! Gradient accumulation: 4 micro-batches equal one step on the 4× batch.

use fusegraph::crates::nn::Params;
use fusegraph::train::{build_step, Sgd, TrainOptions, Trainer};
use fusegraph::{Device, GraphBuilder, HostTensor};
use fusegraph_workloads::demo::{blobs, mlp, mlp_model};

const MICRO: usize = 16;
const N: usize = 4;
const DIMS: [usize; 3] = [8, 16, 4];
const NAMES: [&str; 4] = ["fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias"];

fn trainer(batch: usize, accumulate: usize) -> Trainer {
    let b = GraphBuilder::new();
    let model = mlp_model(&DIMS).unwrap();
    let mut p = Params::of(&model, 11).unwrap();
    let fwd = mlp(&b, &model, batch).unwrap();
    let opts = TrainOptions { accumulate, ..Default::default() };
    let sgd = Sgd { lr: 0.2, momentum: 0.9, weight_decay: 0.01 };
    let s = build_step(&b, &mut p, &fwd, &sgd, &opts).unwrap();
    Trainer::new(&Device::shared().unwrap(), s, &p).unwrap()
}

fn batch(x: &[f32], y: &[i32], from: usize, rows: usize) -> (HostTensor, HostTensor) {
    let d = DIMS[0];
    (
        HostTensor::new([rows, d], x[from * d..(from + rows) * d].to_vec()).unwrap(),
        HostTensor::new([rows], y[from..from + rows].to_vec()).unwrap(),
    )
}

fn values(t: &Trainer, name: &str) -> Vec<f32> {
    t.parameter(name).unwrap().as_slice::<f32>().unwrap().to_vec()
}

#[test]
fn four_micro_batches_equal_one_step_on_the_four_times_larger_batch() {
    let (x, y) = blobs(2, 2 * N * MICRO, DIMS[0], DIMS[2]);
    let mut big = trainer(N * MICRO, 1);
    let mut acc = trainer(MICRO, N);
    let initial: Vec<Vec<f32>> = NAMES.iter().map(|n| values(&acc, n)).collect();
    // Two optimizer steps, so the accumulators' reset and the momentum carry over are checked.
    for window in 0..2 {
        let (xb, yb) = batch(&x, &y, window * N * MICRO, N * MICRO);
        let out = big.step(&[("x", &xb), ("y", &yb)]).unwrap();
        assert!(out.applied && out.window_end);
        let mut mean = 0.0;
        for m in 0..N {
            let (xm, ym) = batch(&x, &y, (window * N + m) * MICRO, MICRO);
            let r = acc.step(&[("x", &xm), ("y", &ym)]).unwrap();
            mean += r.loss / N as f32;
            assert_eq!(r.window_end, m == N - 1);
            assert_eq!(r.applied, m == N - 1);
            if window == 0 && m < N - 1 {
                // Inside the window nothing moves.
                assert_eq!(values(&acc, "fc0.weight"), initial[0]);
            }
        }
        assert!((mean - out.loss).abs() <= 1e-5 * out.loss.abs(), "mean micro loss {mean} vs {}", out.loss);
        for name in NAMES {
            let (a, b) = (values(&big, name), values(&acc, name));
            for (p, q) in a.iter().zip(&b) {
                assert!((p - q).abs() <= 1e-5 * (1.0 + p.abs()), "{name} after step {window}: {p} vs {q}");
            }
            assert!(values(&acc, &format!("{name}.grad_acc")).iter().all(|&v| v == 0.0), "accumulator reset");
        }
    }
    assert_ne!(values(&acc, "fc0.weight"), initial[0]);
}
