//! Reductions, argmax and the matrix product, accumulated in f64 (floats) or exactly modulo 2⁶⁴
//! (integers), rounded to the dtype once at the end.

use crate::layout::{for_each_offset, numel};
use crate::numeric::{round_to, wrap_int};
use crate::Value;
use fusegraph_ir::op::broadcast_shapes;
use fusegraph_ir::{DType, ReduceKind, TensorType};

/// The result of an empty reduction of `kind` in `dtype`.
pub(crate) fn identity(kind: ReduceKind, dtype: DType) -> f64 {
    kind.identity(dtype)
}

/// Reduces `x` over `axes` with `kind`; `ty` is the result type (with or without kept dims,
/// the row-major order of the remaining elements is the same).
pub(crate) fn reduce(x: &Value, ty: &TensorType, kind: ReduceKind, axes: &[usize]) -> Vec<f64> {
    let in_dims = &x.ty.shape.0;
    // Output strides over the kept axes, 0 on reduced ones.
    let kept: Vec<usize> = (0..in_dims.len()).filter(|a| !axes.contains(a)).collect();
    let kept_dims: Vec<usize> = kept.iter().map(|&a| in_dims[a]).collect();
    let kept_strides = fusegraph_ir::Shape::new(kept_dims).strides();
    let mut strides = vec![0; in_dims.len()];
    for (k, &a) in kept.iter().enumerate() {
        strides[a] = kept_strides[k];
    }
    let n = ty.shape.numel();
    let dtype = x.ty.dtype;
    let int_arith = dtype.is_int() && matches!(kind, ReduceKind::Sum | ReduceKind::Prod);
    if int_arith {
        let mut acc = vec![if kind == ReduceKind::Sum { 0i64 } else { 1i64 }; n];
        let mut src = x.data.iter();
        for_each_offset(in_dims, &strides, 0, |o| {
            let v = *src.next().expect("one element per index") as i64;
            acc[o] = match kind {
                ReduceKind::Sum => acc[o].wrapping_add(v),
                _ => acc[o].wrapping_mul(v),
            };
        });
        return acc.into_iter().map(|a| wrap_int(dtype, a as i128)).collect();
    }
    let mut acc = vec![identity(kind, dtype); n];
    let mut src = x.data.iter();
    for_each_offset(in_dims, &strides, 0, |o| {
        let v = *src.next().expect("one element per index");
        acc[o] = match kind {
            ReduceKind::Sum => acc[o] + v,
            ReduceKind::Prod => acc[o] * v,
            ReduceKind::Max => acc[o].max(v),
            ReduceKind::Min => acc[o].min(v),
        };
    });
    acc.into_iter().map(|a| round_to(dtype, a)).collect()
}

/// Index of the first maximum along `axis` (a later element wins only if strictly greater).
pub(crate) fn argmax(x: &Value, axis: usize) -> Vec<f64> {
    let dims = &x.ty.shape.0;
    let outer = numel(&dims[..axis]);
    let d = dims[axis];
    let inner = numel(&dims[axis + 1..]);
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for p in 0..inner {
            let at = |k: usize| x.data[(o * d + k) * inner + p];
            let mut best = 0;
            for k in 1..d {
                if at(k) > at(best) {
                    best = k;
                }
            }
            out.push(best as f64);
        }
    }
    out
}

/// Offsets of each batch matrix of an operand with batch dims `dims`, broadcast to the result
/// batch dims `out` (aligned from the right; size-1 dims repeat), `mat` elements per matrix.
fn batch_offsets(dims: &[usize], out: &[usize], mat: usize) -> Vec<usize> {
    let own = fusegraph_ir::Shape::new(dims.to_vec()).strides();
    let lead = out.len() - dims.len();
    let strides: Vec<usize> =
        (0..out.len()).map(|a| if a < lead || dims[a - lead] == 1 { 0 } else { own[a - lead] * mat }).collect();
    let mut offs = Vec::with_capacity(numel(out));
    for_each_offset(out, &strides, 0, |o| offs.push(o));
    offs
}

/// Batched `lhs[..., m, k] · rhs[..., k, n]` with NumPy batch broadcasting.
pub(crate) fn matmul(l: &Value, r: &Value) -> Vec<f64> {
    let (ld, rd) = (&l.ty.shape.0, &r.ty.shape.0);
    let (m, k) = (ld[ld.len() - 2], ld[ld.len() - 1]);
    let n = rd[rd.len() - 1];
    let (lb, rb) = (&ld[..ld.len() - 2], &rd[..rd.len() - 2]);
    let batch = broadcast_shapes(lb, rb).expect("verified matmul batch dims broadcast");
    let loffs = batch_offsets(lb, &batch, m * k);
    let roffs = batch_offsets(rb, &batch, k * n);
    let dtype = l.ty.dtype;
    let mut out = Vec::with_capacity(numel(&batch) * m * n);
    if dtype.is_int() {
        let mut row = vec![0i64; n];
        for (&lo, &ro) in loffs.iter().zip(&roffs) {
            for i in 0..m {
                row.fill(0);
                for p in 0..k {
                    let a = l.data[lo + i * k + p] as i64;
                    let rrow = &r.data[ro + p * n..ro + (p + 1) * n];
                    for (acc, &b) in row.iter_mut().zip(rrow) {
                        *acc = acc.wrapping_add(a.wrapping_mul(b as i64));
                    }
                }
                out.extend(row.iter().map(|&v| wrap_int(dtype, v as i128)));
            }
        }
    } else {
        let mut row = vec![0f64; n];
        for (&lo, &ro) in loffs.iter().zip(&roffs) {
            for i in 0..m {
                row.fill(0.0);
                for p in 0..k {
                    let a = l.data[lo + i * k + p];
                    let rrow = &r.data[ro + p * n..ro + (p + 1) * n];
                    for (acc, &b) in row.iter_mut().zip(rrow) {
                        *acc += a * b;
                    }
                }
                out.extend(row.iter().map(|&v| round_to(dtype, v)));
            }
        }
    }
    out
}
