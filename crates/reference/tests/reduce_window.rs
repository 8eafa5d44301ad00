//! Reductions, argmax, matmul, conv2d, pooling, composites, errors and the comparison helper.

mod common;

use common::{assert_approx, eval, eval1, f32c, konst, range};
use fusegraph_ir::{DType, GraphBuilder, HostTensor, ReduceKind};
use fusegraph_reference::{assert_close, evaluate, tolerance, RefError};
use std::collections::BTreeMap;

#[test]
fn reductions_with_and_without_keep_dims() {
    let b = GraphBuilder::new();
    let x = f32c(&b, [2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(eval1(&b, &x.sum(&[1], false).unwrap()), (vec![2], vec![6.0, 15.0]));
    assert_eq!(eval1(&b, &x.sum(&[1], true).unwrap()), (vec![2, 1], vec![6.0, 15.0]));
    assert_eq!(eval1(&b, &x.sum(&[0, 1], false).unwrap()), (vec![], vec![21.0]));
    assert_eq!(eval1(&b, &x.sum(&[0, 1], true).unwrap()), (vec![1, 1], vec![21.0]));
    assert_eq!(eval1(&b, &x.max(&[0], false).unwrap()), (vec![3], vec![4.0, 5.0, 6.0]));
    assert_eq!(eval1(&b, &x.min(&[0], true).unwrap()), (vec![1, 3], vec![1.0, 2.0, 3.0]));
    assert_eq!(eval1(&b, &x.prod(&[1], false).unwrap()), (vec![2], vec![6.0, 120.0]));
    assert_eq!(eval1(&b, &x.sum(&[], false).unwrap()), (vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));

    // Non-adjacent axes: Σ_{i,k} y[i, j, k].
    let y = f32c(&b, [2, 2, 2], &range(8));
    assert_eq!(eval1(&b, &y.sum(&[0, 2], false).unwrap()), (vec![2], vec![10.0, 18.0]));
    assert_eq!(eval1(&b, &y.max(&[0, 2], true).unwrap()), (vec![1, 2, 1], vec![5.0, 7.0]));

    // f32 sums accumulate in f64 and round once.
    let z = f32c(&b, [3], &[1.0, 1e-8, 1e-8]);
    assert_eq!(eval1(&b, &z.sum(&[0], false).unwrap()).1, vec![(1.0 + 2e-8f32 as f64) as f32 as f64]);
}

#[test]
fn empty_reductions_give_identities() {
    let b = GraphBuilder::new();
    let f = b.full(DType::F32, [2, 0], 0.0).unwrap();
    assert_eq!(eval1(&b, &f.sum(&[1], false).unwrap()), (vec![2], vec![0.0, 0.0]));
    assert_eq!(eval1(&b, &f.prod(&[1], false).unwrap()).1, vec![1.0, 1.0]);
    assert_eq!(eval1(&b, &f.max(&[1], false).unwrap()).1, vec![f64::NEG_INFINITY; 2]);
    assert_eq!(eval1(&b, &f.min(&[1], true).unwrap()), (vec![2, 1], vec![f64::INFINITY; 2]));
    assert_eq!(eval1(&b, &f.sum(&[0], false).unwrap()), (vec![0], vec![]));
    let i = b.full(DType::I32, [0], 0.0).unwrap();
    assert_eq!(eval1(&b, &i.max(&[0], false).unwrap()).1, vec![i32::MIN as f64]);
    assert_eq!(eval1(&b, &i.min(&[0], false).unwrap()).1, vec![i32::MAX as f64]);
    let u = b.full(DType::U32, [0], 0.0).unwrap();
    assert_eq!(eval1(&b, &u.max(&[0], false).unwrap()).1, vec![0.0]);
    assert_eq!(eval1(&b, &u.min(&[0], false).unwrap()).1, vec![u32::MAX as f64]);
    let h = b.full(DType::F16, [0], 0.0).unwrap();
    assert_eq!(eval1(&b, &h.max(&[0], false).unwrap()).1, vec![f64::NEG_INFINITY]);
}

#[test]
fn integer_reductions_wrap() {
    let b = GraphBuilder::new();
    let x = konst(&b, DType::I32, [3], &[i32::MAX as f64, 1.0, 0.0]);
    assert_eq!(eval1(&b, &x.sum(&[0], false).unwrap()).1, vec![i32::MIN as f64]);
    let big = konst(&b, DType::I32, [3], &[65536.0, 65536.0, 3.0]);
    assert_eq!(eval1(&b, &big.prod(&[0], false).unwrap()).1, vec![0.0]);
    let m = konst(&b, DType::I32, [4], &[-5.0, i32::MIN as f64, 7.0, 2.0]);
    assert_eq!(eval1(&b, &m.max(&[0], false).unwrap()).1, vec![7.0]);
    assert_eq!(eval1(&b, &m.min(&[0], false).unwrap()).1, vec![i32::MIN as f64]);
    let u = konst(&b, DType::U32, [2], &[u32::MAX as f64, 2.0]);
    assert_eq!(eval1(&b, &u.sum(&[0], false).unwrap()).1, vec![1.0]);
    assert_eq!(eval1(&b, &u.prod(&[0], false).unwrap()).1, vec![u32::MAX as f64 - 1.0]);
}

#[test]
fn argmax_takes_first_maximum() {
    let b = GraphBuilder::new();
    let x = f32c(&b, [2, 3], &[1.0, 3.0, 3.0, 2.0, 2.0, 1.0]);
    let a1 = x.argmax(1, false).unwrap();
    assert_eq!(a1.dtype(), DType::I32);
    assert_eq!(eval1(&b, &a1), (vec![2], vec![1.0, 0.0]));
    assert_eq!(eval1(&b, &x.argmax(0, false).unwrap()), (vec![3], vec![1.0, 0.0, 0.0]));
    assert_eq!(eval1(&b, &x.argmax(1, true).unwrap()), (vec![2, 1], vec![1.0, 0.0]));
    let i = konst(&b, DType::I32, [4], &[-3.0, -1.0, -1.0, -2.0]);
    assert_eq!(eval1(&b, &i.argmax(0, false).unwrap()), (vec![], vec![1.0]));
}

#[test]
fn matmul_2x3_by_3x2() {
    let b = GraphBuilder::new();
    let l = f32c(&b, [2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let r = f32c(&b, [3, 2], &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
    assert_eq!(eval1(&b, &l.matmul(&r).unwrap()), (vec![2, 2], vec![58.0, 64.0, 139.0, 154.0]));
}

#[test]
fn matmul_broadcasts_batches() {
    let b = GraphBuilder::new();
    let l = f32c(&b, [2, 1, 2], &[1.0, 2.0, 3.0, 4.0]);
    let r = f32c(&b, [1, 2, 1], &[5.0, 6.0]);
    assert_eq!(eval1(&b, &l.matmul(&r).unwrap()), (vec![2, 1, 1], vec![17.0, 39.0]));
    let l2 = f32c(&b, [1, 2], &[1.0, 2.0]);
    let r2 = f32c(&b, [3, 2, 1], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    assert_eq!(eval1(&b, &l2.matmul(&r2).unwrap()), (vec![3, 1, 1], vec![1.0, 2.0, 3.0]));
    // [2,1] batch × [3] batch → [2,3] batch; check against a naive loop.
    let a = f32c(&b, [2, 1, 2, 3], &range(12));
    let c = f32c(&b, [3, 3, 2], &range(18).iter().map(|v| v - 5.0).collect::<Vec<_>>());
    let (dims, got) = eval1(&b, &a.matmul(&c).unwrap());
    assert_eq!(dims, vec![2, 3, 2, 2]);
    let mut want: Vec<f64> = Vec::new();
    for i in 0..2 {
        for j in 0..3 {
            for m in 0..2 {
                for n in 0..2 {
                    want.push((0..3).map(|k| (i * 6 + m * 3 + k) as f64 * ((j * 6 + k * 2 + n) as f64 - 5.0)).sum());
                }
            }
        }
    }
    assert_eq!(got, want);
}

#[test]
fn integer_matmul_wraps() {
    let b = GraphBuilder::new();
    let l = konst(&b, DType::I32, [1, 2], &[65536.0, 65536.0]);
    let r = konst(&b, DType::I32, [2, 1], &[65536.0, 1.0]);
    assert_eq!(eval1(&b, &l.matmul(&r).unwrap()).1, vec![65536.0]);
    let ul = konst(&b, DType::U32, [1, 1], &[u32::MAX as f64]);
    assert_eq!(eval1(&b, &ul.matmul(&ul).unwrap()).1, vec![1.0]);
}

#[test]
fn conv2d_padding_stride_groups() {
    let b = GraphBuilder::new();
    let ch0: Vec<f64> = (1..=9).map(f64::from).collect();
    let ch1: Vec<f64> = (1..=9).map(|v| 10.0 * v as f64).collect();
    let x = f32c(&b, [1, 2, 3, 3], &[ch0, ch1].concat());
    // Output channel 0 sees input channel 0 only, output channel 1 input channel 1 only.
    let w = f32c(&b, [2, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0, 0.0, 1.0, 1.0, 0.0]);
    let y = x.conv2d(&w, [2, 2], [1, 1], [1, 1], 2).unwrap();
    assert_eq!(eval1(&b, &y), (vec![1, 2, 2, 2], vec![4.0, 18.0, 36.0, 77.0, 0.0, 20.0, 40.0, 140.0]));
}

#[test]
fn conv2d_dilation_and_full_channels() {
    let b = GraphBuilder::new();
    let x = f32c(&b, [1, 1, 4, 4], &range(16));
    let w = f32c(&b, [1, 1, 2, 2], &[1.0; 4]);
    let y = x.conv2d(&w, [1, 1], [0, 0], [2, 2], 1).unwrap();
    assert_eq!(eval1(&b, &y), (vec![1, 1, 2, 2], vec![20.0, 24.0, 36.0, 40.0]));
    // Two input channels summed, two batch items, 1x1 kernel.
    let x2 = f32c(&b, [2, 2, 1, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let w2 = f32c(&b, [3, 2, 1, 1], &[1.0, 1.0, 1.0, -1.0, 0.5, 0.0]);
    let y2 = x2.conv2d(&w2, [1, 1], [0, 0], [1, 1], 1).unwrap();
    assert_eq!(
        eval1(&b, &y2),
        (vec![2, 3, 1, 2], vec![4.0, 6.0, -2.0, -2.0, 0.5, 1.0, 12.0, 14.0, -2.0, -2.0, 2.5, 3.0])
    );
}

#[test]
fn pooling() {
    let b = GraphBuilder::new();
    let x = f32c(&b, [1, 1, 3, 3], &(1..=9).map(f64::from).collect::<Vec<_>>());
    let mx = x.max_pool2d([2, 2], [2, 2], [1, 1]).unwrap();
    assert_eq!(eval1(&b, &mx), (vec![1, 1, 2, 2], vec![1.0, 3.0, 7.0, 9.0]));
    let avg = x.avg_pool2d([2, 2], [2, 2], [1, 1]).unwrap();
    assert_eq!(eval1(&b, &avg).1, vec![0.25, 1.25, 2.75, 7.0]);
    // Padding never wins a max, even over negative values.
    let n = x.neg().unwrap().max_pool2d([2, 2], [2, 2], [1, 1]).unwrap();
    assert_eq!(eval1(&b, &n).1, vec![-1.0, -2.0, -4.0, -5.0]);
    let full = x.avg_pool2d([3, 3], [1, 1], [0, 0]).unwrap();
    assert_eq!(eval1(&b, &full), (vec![1, 1, 1, 1], vec![5.0]));
    let ov = x.max_pool2d([2, 2], [1, 1], [0, 0]).unwrap();
    assert_eq!(eval1(&b, &ov).1, vec![5.0, 6.0, 8.0, 9.0]);
}

#[test]
fn softmax_composite_sums_to_one() {
    let b = GraphBuilder::new();
    let x = f32c(&b, [2, 4], &[0.0, 2f64.ln(), 3f64.ln(), 4f64.ln(), 100.0, 100.0, 100.0, 100.0]);
    let s = x.softmax(1).unwrap();
    let (dims, got) = eval1(&b, &s);
    assert_eq!(dims, vec![2, 4]);
    assert_approx(&got, &[0.1, 0.2, 0.3, 0.4, 0.25, 0.25, 0.25, 0.25], 1e-6);
    let (_, sums) = eval1(&b, &s.sum(&[1], false).unwrap());
    assert_approx(&sums, &[1.0, 1.0], 1e-6);
}

#[test]
fn gelu_and_layer_norm_composites() {
    let b = GraphBuilder::new();
    let vals = [-2.0, -0.5, 0.0, 1.0];
    let x = f32c(&b, [4], &vals);
    let (_, g) = eval1(&b, &x.gelu().unwrap());
    let want: Vec<f64> =
        vals.iter().map(|&v| 0.5 * v * (1.0 + fusegraph_reference::erf(v / std::f64::consts::SQRT_2))).collect();
    assert_approx(&g, &want, 1e-6);
    let (_, n) = eval1(&b, &x.layer_norm(&[0], 0.0).unwrap());
    let mean = vals.iter().sum::<f64>() / 4.0;
    let var = vals.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / 4.0;
    assert_approx(&n, &vals.map(|v| (v - mean) / var.sqrt()), 1e-6);
}

#[test]
fn feed_and_parameter_errors() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2]).unwrap();
    let w = b.parameter("w", DType::F32, [2]).unwrap();
    let unused = b.input("unused", DType::I32, [1]).unwrap();
    let y = x.mul(&w).unwrap();
    let g = b.graph();
    let ok_x = HostTensor::new([2], vec![1.0f32, 2.0]).unwrap();
    let feeds = BTreeMap::from([("x".to_string(), ok_x.clone())]);
    let params = BTreeMap::from([("w".to_string(), HostTensor::new([2], vec![3.0f32, 4.0]).unwrap())]);
    let out = evaluate(&g, &[y.id()], &feeds, &params).unwrap();
    assert_eq!(out[0].as_slice::<f32>().unwrap(), &[3.0, 8.0]);

    let e = evaluate(&g, &[unused.id()], &BTreeMap::new(), &params).unwrap_err();
    assert!(matches!(&e, RefError::MissingFeed { name, .. } if name == "unused"), "{e}");
    assert!(e.to_string().contains("i32[1]"), "{e}");
    let e = evaluate(&g, &[y.id()], &feeds, &BTreeMap::new()).unwrap_err();
    assert!(matches!(&e, RefError::MissingParameter { name, .. } if name == "w"), "{e}");
    let bad = BTreeMap::from([("x".to_string(), HostTensor::new([3], vec![1.0f32, 2.0, 3.0]).unwrap())]);
    let e = evaluate(&g, &[y.id()], &bad, &params).unwrap_err();
    assert_eq!(e.to_string(), "input `x`: expected f32[2], got f32[3]");
    let bad_w = BTreeMap::from([("w".to_string(), HostTensor::new([2], vec![1i32, 2]).unwrap())]);
    let e = evaluate(&g, &[y.id()], &feeds, &bad_w).unwrap_err();
    assert!(matches!(e, RefError::ParameterType { .. }), "{e}");

    // An id from a larger graph is not in this one.
    let big = GraphBuilder::new();
    let mut last = big.scalar(DType::F32, 0.0).unwrap();
    for _ in 0..10 {
        last = last.add_scalar(1.0).unwrap();
    }
    let e = evaluate(&g, &[last.id()], &feeds, &params).unwrap_err();
    assert!(matches!(e, RefError::Ir(_)), "{e}");
}

#[test]
fn repeated_and_multiple_outputs() {
    let b = GraphBuilder::new();
    let x = f32c(&b, [2], &[1.0, 2.0]);
    let y = x.add(&x).unwrap();
    let out = eval(&b, &[&y, &x, &y], &[]);
    assert_eq!(out.len(), 3);
    assert_eq!(out[0], out[2]);
    assert_eq!(out[1].to_f64(), vec![1.0, 2.0]);
}

#[test]
fn assert_close_and_tolerances() {
    assert_eq!(tolerance(DType::F32), (1e-5, 1e-5));
    assert_eq!(tolerance(DType::F16), (2e-3, 2e-3));
    assert_eq!(tolerance(DType::I32), (0.0, 0.0));
    assert_eq!(tolerance(DType::Bool), (0.0, 0.0));
    let a = HostTensor::new([2, 2], vec![1.0f32, f32::NAN, f32::INFINITY, 100.0]).unwrap();
    let b = HostTensor::new([2, 2], vec![1.000001f32, f32::NAN, f32::INFINITY, 100.0005]).unwrap();
    assert_close(&a, &b, 1e-5, 1e-5).unwrap();
    let c = HostTensor::new([2, 2], vec![1.1f32, 0.0, f32::NEG_INFINITY, 100.0]).unwrap();
    let msg = assert_close(&c, &a, 1e-5, 1e-5).unwrap_err();
    assert!(msg.starts_with("3 of 4 elements"), "{msg}");
    assert!(msg.contains("[0, 0]") && msg.contains("[0, 1]") && msg.contains("[1, 0]"), "{msg}");
    let i = HostTensor::new([2, 2], vec![1i32, 2, 3, 4]).unwrap();
    assert!(assert_close(&i, &a, 1.0, 1.0).unwrap_err().contains("type mismatch"));
    let flat = HostTensor::new([4], vec![1.0f32, f32::NAN, f32::INFINITY, 100.0]).unwrap();
    assert!(assert_close(&flat, &a, 0.0, 0.0).is_err());
    let j = HostTensor::new([2, 2], vec![1i32, 2, 3, 5]).unwrap();
    assert!(assert_close(&i, &j, 0.0, 0.0).unwrap_err().contains("[1, 1]: got 4, want 5"));
}

#[test]
fn reduce_kind_matches_builder_helpers() {
    let b = GraphBuilder::new();
    let x = f32c(&b, [3], &[2.0, -1.0, 4.0]);
    for (kind, want) in
        [(ReduceKind::Sum, 5.0), (ReduceKind::Prod, -8.0), (ReduceKind::Max, 4.0), (ReduceKind::Min, -1.0)]
    {
        assert_eq!(eval1(&b, &x.reduce(kind, &[0], false).unwrap()).1, vec![want], "{kind:?}");
    }
}
