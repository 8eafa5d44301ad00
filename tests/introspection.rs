//! `Executable::stats()` and `to_dot()` say what fused, on a real device.

use fusegraph::{CompileOptions, DType, Device, GraphBuilder};

#[test]
fn stats_and_dot_of_a_fused_softmax() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [8, 128]).unwrap();
    let y = x.softmax(1).unwrap();
    let device = Device::shared().unwrap();
    let fused = device.compile(&b.graph(), &[y.id()], &CompileOptions::default()).unwrap();
    let unfused = device.compile(&b.graph(), &[y.id()], &CompileOptions::unfused()).unwrap();
    assert_eq!(fused.stats().kernels.len(), 1);
    assert_eq!(unfused.stats().kernels.len(), 7);
    assert_eq!(fused.stats().kernels[0].members.len(), 7);
    // Fused: read x once, write y once. Unfused: every intermediate is written and read.
    assert_eq!(fused.stats().bytes_moved, 2 * 8 * 128 * 4);
    assert!(unfused.stats().bytes_moved > 4 * fused.stats().bytes_moved);
    let dot = fused.to_dot();
    assert_eq!(dot.matches("subgraph cluster_").count(), 1);
}
