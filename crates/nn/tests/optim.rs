//! Optimizer steps on the CPU reference, against hand-computed values.

mod common;

use common::{eval, f32s};
use fusegraph_ir::{DType, GraphBuilder, HostTensor};
use fusegraph_nn::{Adam, Init, NnError, Optimizer, Params, Sgd};

fn scalar(v: f32) -> HostTensor {
    HostTensor::new(Vec::<usize>::new(), vec![v]).unwrap()
}

fn close(got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!((*g as f64 - w).abs() <= tol * (1.0 + w.abs()), "got {got:?}, want {want:?}");
    }
}

/// One parameter `w` = [1, -2] with an input gradient `g`, optimizer state from `p`.
fn setup(p: &mut Params) -> (GraphBuilder, Vec<(String, fusegraph_ir::Tensor)>, fusegraph_ir::Tensor) {
    let b = GraphBuilder::new();
    let w = p.parameter(&b, "w", DType::F32, &[2], Init::Zeros).unwrap();
    p.insert("w", HostTensor::new([2], vec![1.0f32, -2.0]).unwrap());
    let g = b.input("g", DType::F32, [2]).unwrap();
    (b, vec![("w".to_string(), w)], g)
}

#[test]
fn sgd_with_momentum_and_weight_decay_matches_hand_computation() {
    let mut p = Params::new(0);
    let (b, params, g) = setup(&mut p);
    let sgd = Sgd { lr: 0.1, momentum: 0.9, weight_decay: 0.01 };
    let up = sgd.step(&b, &mut p, &params, std::slice::from_ref(&g), None).unwrap();
    assert_eq!(up.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["w", "w.momentum"]);
    // Existing momentum buffer [0.5, 0.5].
    p.insert("w.momentum", HostTensor::new([2], vec![0.5f32, 0.5]).unwrap());
    let gv = HostTensor::new([2], vec![0.2f32, 0.4]).unwrap();
    let out = eval(&b, &p, &[&up[0].1, &up[1].1], &[("g", gv)]);
    // g' = g + 0.01·w = [0.21, 0.38]; buf = 0.9·0.5 + g' = [0.66, 0.83]; w − 0.1·buf.
    close(&f32s(&out[1]), &[0.66, 0.83], 1e-6);
    close(&f32s(&out[0]), &[1.0 - 0.066, -2.0 - 0.083], 1e-6);
}

#[test]
fn adam_and_adamw_match_hand_computation_with_bias_correction() {
    for decoupled in [false, true] {
        let mut p = Params::new(0);
        let (b, params, g) = setup(&mut p);
        let adam = Adam { lr: 0.01, beta1: 0.9, beta2: 0.99, eps: 1e-3, weight_decay: 0.1, decoupled };
        let up = adam.step(&b, &mut p, &params, std::slice::from_ref(&g), None).unwrap();
        let names: Vec<&str> = up.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["optim.step", "w", "w.adam_m", "w.adam_v"]);
        // State after 2 steps: t = 2 → this is step 3.
        p.insert("optim.step", scalar(2.0));
        p.insert("w.adam_m", HostTensor::new([2], vec![0.1f32, -0.2]).unwrap());
        p.insert("w.adam_v", HostTensor::new([2], vec![0.01f32, 0.04]).unwrap());
        let gv = HostTensor::new([2], vec![0.5f32, -1.0]).unwrap();
        let outs: Vec<&fusegraph_ir::Tensor> = up.iter().map(|(_, t)| t).collect();
        let out = eval(&b, &p, &outs, &[("g", gv)]);
        let (w, m0, v0, gs) = ([1.0f64, -2.0], [0.1f64, -0.2], [0.01f64, 0.04], [0.5f64, -1.0]);
        let t = 3.0f64;
        let (bc1, bc2) = (1.0 - 0.9f64.powf(t), 1.0 - 0.99f64.powf(t));
        let mut want_w = [0.0; 2];
        let (mut want_m, mut want_v) = ([0.0; 2], [0.0; 2]);
        for i in 0..2 {
            let gi = if decoupled { gs[i] } else { gs[i] + 0.1 * w[i] };
            want_m[i] = 0.9 * m0[i] + 0.1 * gi;
            want_v[i] = 0.99 * v0[i] + 0.01 * gi * gi;
            let base = if decoupled { w[i] * (1.0 - 0.01 * 0.1) } else { w[i] };
            want_w[i] = base - (0.01 / bc1) * want_m[i] / (want_v[i].sqrt() / bc2.sqrt() + 1e-3);
        }
        close(&f32s(&out[0]), &[3.0], 0.0);
        close(&f32s(&out[1]), &want_w, 1e-6);
        close(&f32s(&out[2]), &want_m, 1e-6);
        close(&f32s(&out[3]), &want_v, 1e-6);
    }
}

#[test]
fn a_masked_step_keeps_every_value_even_with_a_nan_gradient() {
    let mut p = Params::new(0);
    let (b, params, g) = setup(&mut p);
    let apply = b.input("apply", DType::F32, []).unwrap();
    let up = Adam::new(0.1).step(&b, &mut p, &params, std::slice::from_ref(&g), Some(&apply)).unwrap();
    let outs: Vec<&fusegraph_ir::Tensor> = up.iter().map(|(_, t)| t).collect();
    let gv = HostTensor::new([2], vec![f32::NAN, 1.0]).unwrap();
    let out = eval(&b, &p, &outs, &[("g", gv.clone()), ("apply", scalar(0.0))]);
    close(&f32s(&out[0]), &[0.0], 0.0);
    close(&f32s(&out[1]), &[1.0, -2.0], 0.0);
    close(&f32s(&out[2]), &[0.0, 0.0], 0.0);
    let out = eval(&b, &p, &outs, &[("g", gv), ("apply", scalar(1.0))]);
    close(&f32s(&out[0]), &[1.0], 0.0);
    // The first Adam step moves each weight by lr against the sign of its gradient.
    close(&f32s(&out[1])[1..], &[-2.1], 1e-6);
}

#[test]
fn bad_configurations_are_typed_errors() {
    let mut p = Params::new(0);
    let (b, params, g) = setup(&mut p);
    let grads = std::slice::from_ref(&g);
    let bad = |r: Result<Vec<(String, fusegraph_ir::Tensor)>, NnError>| matches!(r, Err(NnError::Config(_)));
    assert!(bad(Sgd { lr: -1.0, momentum: 0.0, weight_decay: 0.0 }.step(&b, &mut p, &params, grads, None)));
    assert!(bad(Sgd { lr: 0.1, momentum: 1.0, weight_decay: 0.0 }.step(&b, &mut p, &params, grads, None)));
    assert!(bad(Adam { eps: 0.0, ..Adam::new(0.1) }.step(&b, &mut p, &params, grads, None)));
    assert!(bad(Adam { beta2: f64::NAN, ..Adam::new(0.1) }.step(&b, &mut p, &params, grads, None)));
    assert!(bad(Sgd::new(0.1).step(&b, &mut p, &params, &[], None)));
    let wrong = b.input("g3", DType::F32, [3]).unwrap();
    assert!(bad(Sgd::new(0.1).step(&b, &mut p, &params, &[wrong], None)));
    let apply = b.input("apply", DType::F32, [2]).unwrap();
    assert!(bad(Sgd::new(0.1).step(&b, &mut p, &params, grads, Some(&apply))));
}
