//! A training step as one executable: forward, backward (autodiff) and the update, with the
//! parameters updated on the device after every run.

use fusegraph::crates::reference::{assert_close, evaluate};
use fusegraph::{grad, CompileOptions, DType, Device, GraphBuilder, HostTensor};
use std::collections::BTreeMap;

#[test]
fn sgd_on_linear_regression_lowers_the_loss_and_matches_the_reference_step() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [32, 4]).unwrap();
    let t = b.input("t", DType::F32, [32, 1]).unwrap();
    let w = b.parameter("w", DType::F32, [4, 1]).unwrap();
    let diff = x.matmul(&w).unwrap().sub(&t).unwrap();
    let loss = diff.mul(&diff).unwrap().mean(&[0, 1], false).unwrap();
    let gw = &grad(&loss, &[&w]).unwrap()[0];
    let new_w = w.sub(&gw.mul_scalar(0.1).unwrap()).unwrap();
    let g = b.graph();

    let xs: Vec<f32> = fusegraph::workloads::random_values(1, 128);
    let true_w = [0.5f32, -1.0, 2.0, 0.25];
    let ts: Vec<f32> = (0..32).map(|r| (0..4).map(|c| xs[r * 4 + c] * true_w[c]).sum()).collect();
    let xv = HostTensor::new([32, 4], xs).unwrap();
    let tv = HostTensor::new([32, 1], ts).unwrap();
    let w0 = HostTensor::new([4, 1], vec![0.0f32; 4]).unwrap();

    let device = Device::shared().unwrap();
    let opts = CompileOptions { updates: vec![("w".into(), new_w.id())], ..Default::default() };
    let mut exe = device.compile(&g, &[loss.id()], &opts).unwrap();
    exe.set_parameter("w", &w0).unwrap();
    let feeds = [("x", &xv), ("t", &tv)];
    let first = exe.run(&feeds).unwrap()[0].as_slice::<f32>().unwrap()[0];

    // The first update equals the reference's w − 0.1·∇w.
    let f = BTreeMap::from([("x".to_string(), xv.clone()), ("t".to_string(), tv.clone())]);
    let p = BTreeMap::from([("w".to_string(), w0.clone())]);
    let want = evaluate(&g, &[new_w.id()], &f, &p).unwrap();
    assert_close(&exe.parameter("w").unwrap(), &want[0], 1e-5, 1e-6).unwrap();

    let mut last = first;
    for _ in 0..50 {
        last = exe.run(&feeds).unwrap()[0].as_slice::<f32>().unwrap()[0];
    }
    assert!(last < first * 0.05, "loss {first} -> {last}");
}

#[test]
fn bad_updates_are_typed_errors() {
    let b = GraphBuilder::new();
    let w = b.parameter("w", DType::F32, [2]).unwrap();
    let y = w.sum(&[0], false).unwrap();
    let device = Device::shared().unwrap();
    let bad_name = CompileOptions { updates: vec![("nope".into(), w.id())], ..Default::default() };
    assert!(matches!(
        device.compile(&b.graph(), &[y.id()], &bad_name),
        Err(fusegraph::RuntimeError::UnknownParameter { .. })
    ));
    let bad_type = CompileOptions { updates: vec![("w".into(), y.id())], ..Default::default() };
    let e = device.compile(&b.graph(), &[y.id()], &bad_type).err().unwrap();
    assert_eq!(e.to_string(), "parameter update `w`: expected f32[2], got f32[]");
}
