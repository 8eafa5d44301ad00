//! Runs in flight: `Executable::submit` returns before the device runs, later runs take an
//! earlier run's output as a feed on the device (`Feed::Output`), from another executable or
//! from their own, and a feed that cannot be taken is a typed error before anything is
//! written.

use fusegraph::{CompileOptions, DType, Device, Feed, GraphBuilder, HostTensor, RuntimeError};

/// `y = 2x + 1` of `x: f32[4, 1]`, as `[4]`.
fn affine() -> fusegraph::Executable {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [4, 1]).unwrap();
    let y = x.mul_scalar(2.0).unwrap().add_scalar(1.0).unwrap().reshape([4]).unwrap();
    Device::shared().unwrap().compile(&b.graph(), &[y.id()], &CompileOptions::default()).unwrap()
}

/// `z = x · x` of `x: f32[4]`, and `x + 1`.
fn square() -> fusegraph::Executable {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [4]).unwrap();
    let z = x.mul(&x).unwrap();
    let w = x.add_scalar(1.0).unwrap();
    Device::shared().unwrap().compile(&b.graph(), &[z.id(), w.id()], &CompileOptions::default()).unwrap()
}

/// Six runs of one executable, each fed the one before's output on the device and none
/// waited for until all are submitted, then a run of another executable fed the last one's
/// output: every run's outputs are what the host computes step by step.
#[test]
fn runs_in_flight_feed_each_other_on_the_device() {
    let (a, s) = (affine(), square());
    let x0 = vec![0.5f32, -1.25, 3.0, 0.0];
    let first = HostTensor::new([4, 1], x0.clone()).unwrap();
    let mut runs = vec![a.submit(&[("x", Feed::Host(&first))]).unwrap()];
    for _ in 0..5 {
        let next = a.submit(&[("x", Feed::Output(runs.last().unwrap(), 0))]).unwrap();
        runs.push(next);
    }
    let last = s.submit(&[("x", Feed::Output(runs.last().unwrap(), 0))]).unwrap();
    let mut want = x0;
    for run in runs {
        want = want.iter().map(|v| 2.0 * v + 1.0).collect();
        assert_eq!(run.wait().unwrap()[0].as_slice::<f32>().unwrap(), want.as_slice());
    }
    let out = last.wait().unwrap();
    let squares: Vec<f32> = want.iter().map(|v| v * v).collect();
    assert_eq!(out[0].as_slice::<f32>().unwrap(), squares.as_slice());
    assert_eq!(out[1].as_slice::<f32>().unwrap(), want.iter().map(|v| v + 1.0).collect::<Vec<_>>().as_slice());
    // A run dropped unread, then an ordinary run: the staging buffers came back unmapped.
    drop(a.submit(&[("x", Feed::Host(&first))]).unwrap());
    let again = a.run(&[("x", &first)]).unwrap();
    assert_eq!(again[0].as_slice::<f32>().unwrap(), &[2.0, -1.5, 7.0, 1.0]);
}

/// A chained feed from an overwritten output, of another element count or type, or past
/// the outputs, is `RuntimeError::ChainedFeed` naming the input; an executable whose submit
/// failed runs as before.
#[test]
fn chained_feeds_that_cannot_be_taken_are_typed_errors() {
    let (a, s) = (affine(), square());
    let x = HostTensor::new([4, 1], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let older = a.submit(&[("x", Feed::Host(&x))]).unwrap();
    let newer = a.submit(&[("x", Feed::Host(&x))]).unwrap();
    let reason = |e: RuntimeError| match e {
        RuntimeError::ChainedFeed { name, reason } => {
            assert_eq!(name, "x");
            reason
        }
        other => panic!("expected ChainedFeed, got {other}"),
    };
    let e = reason(s.submit(&[("x", Feed::Output(&older, 0))]).err().unwrap());
    assert!(e.contains("overwritten"), "{e}");
    let e = reason(s.submit(&[("x", Feed::Output(&newer, 1))]).err().unwrap());
    assert!(e.contains("output 1 of a run with 1 outputs"), "{e}");
    let run_s = s.submit(&[("x", Feed::Output(&newer, 0))]).unwrap();
    // `s`'s second output is f32[4]: the right count for `a`'s f32[4, 1]; an i32 is not.
    let b = GraphBuilder::new();
    let n = b.input("x", DType::I32, [4]).unwrap().add_scalar(1.0).unwrap();
    let ints = Device::shared().unwrap().compile(&b.graph(), &[n.id()], &CompileOptions::default()).unwrap();
    let e = reason(ints.submit(&[("x", Feed::Output(&run_s, 1))]).err().unwrap());
    assert!(e.contains("f32[4]") && e.contains("i32[4]"), "{e}");
    let b = GraphBuilder::new();
    let wide = b.input("x", DType::F32, [8]).unwrap().neg().unwrap();
    let wide = Device::shared().unwrap().compile(&b.graph(), &[wide.id()], &CompileOptions::default()).unwrap();
    let e = reason(wide.submit(&[("x", Feed::Output(&run_s, 0))]).err().unwrap());
    assert!(e.contains("f32[8]"), "{e}");
    let chained = a.submit(&[("x", Feed::Output(&run_s, 1))]).unwrap();
    let (older, newer) = (older.wait().unwrap(), newer.wait().unwrap());
    assert_eq!(older, newer);
    assert_eq!(run_s.wait().unwrap()[1].as_slice::<f32>().unwrap(), &[4.0, 6.0, 8.0, 10.0]);
    assert_eq!(chained.wait().unwrap()[0].as_slice::<f32>().unwrap(), &[9.0, 13.0, 17.0, 21.0]);
}
