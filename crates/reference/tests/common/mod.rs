//! Helpers shared by the integration tests.
#![allow(dead_code)]

use fusegraph_ir::{DType, GraphBuilder, HostTensor, Shape, Tensor};
use fusegraph_reference::evaluate;
use std::collections::BTreeMap;

/// Evaluates `outs` with the given feeds and no parameters; panics on error.
pub fn eval(b: &GraphBuilder, outs: &[&Tensor], feeds: &[(&str, HostTensor)]) -> Vec<HostTensor> {
    let feeds: BTreeMap<String, HostTensor> = feeds.iter().map(|(n, t)| (n.to_string(), t.clone())).collect();
    let ids: Vec<_> = outs.iter().map(|t| t.id()).collect();
    evaluate(&b.graph(), &ids, &feeds, &BTreeMap::new()).expect("evaluate")
}

/// Evaluates one output and returns its shape and values as f64.
pub fn eval1(b: &GraphBuilder, out: &Tensor) -> (Vec<usize>, Vec<f64>) {
    let t = &eval(b, &[out], &[])[0];
    assert_eq!(t.ty(), *out.ty(), "result type differs from the node type");
    (t.shape().0.clone(), t.to_f64())
}

/// A constant of `dtype`.
pub fn konst(b: &GraphBuilder, dtype: DType, shape: impl Into<Shape>, values: &[f64]) -> Tensor {
    b.constant(dtype, shape, values).expect("constant")
}

/// A constant f32 tensor.
pub fn f32c(b: &GraphBuilder, shape: impl Into<Shape>, values: &[f64]) -> Tensor {
    konst(b, DType::F32, shape, values)
}

/// `0, 1, …, n−1` as f64.
pub fn range(n: usize) -> Vec<f64> {
    (0..n).map(|i| i as f64).collect()
}

/// Asserts values within `tol` of `want`.
pub fn assert_approx(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "lengths differ: {got:?} vs {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol, "element {i}: got {g}, want {w} (all: {got:?})");
    }
}
