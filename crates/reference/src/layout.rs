//! Data movement: broadcast, transpose, slice, concat, pad, gather, and the index walkers they
//! share.

use crate::Value;
use fusegraph_ir::{Shape, TensorType};

/// Calls `f(offset)` for every index of `dims` in row-major order, where
/// `offset = base + Σ idx[a]·strides[a]`.
pub(crate) fn for_each_offset(dims: &[usize], strides: &[usize], base: usize, mut f: impl FnMut(usize)) {
    let n: usize = dims.iter().product();
    if n == 0 {
        return;
    }
    let rank = dims.len();
    let mut idx = vec![0usize; rank];
    let mut off = base;
    for _ in 0..n {
        f(off);
        let mut a = rank;
        while a > 0 {
            a -= 1;
            idx[a] += 1;
            off += strides[a];
            if idx[a] < dims[a] {
                break;
            }
            off -= strides[a] * dims[a];
            idx[a] = 0;
        }
    }
}

/// The elements `src[base + Σ idx[a]·strides[a]]` for every index of `dims`, row-major.
pub(crate) fn strided(src: &[f64], dims: &[usize], strides: &[usize], base: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(dims.iter().product());
    for_each_offset(dims, strides, base, |o| out.push(src[o]));
    out
}

/// Product of `dims`.
pub(crate) fn numel(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// `broadcast_in_dim`: result axis `dims[i]` reads operand axis `i` (index 0 where the operand
/// dim is 1); result axes not in `dims` are replicated.
pub(crate) fn broadcast(x: &Value, ty: &TensorType, dims: &[usize]) -> Vec<f64> {
    let src = x.ty.shape.strides();
    let mut strides = vec![0; ty.shape.rank()];
    for (i, &d) in dims.iter().enumerate() {
        if x.ty.shape.0[i] != 1 {
            strides[d] = src[i];
        }
    }
    strided(&x.data, &ty.shape.0, &strides, 0)
}

/// Result axis `i` is operand axis `perm[i]`.
pub(crate) fn transpose(x: &Value, ty: &TensorType, perm: &[usize]) -> Vec<f64> {
    let src = x.ty.shape.strides();
    let strides: Vec<usize> = perm.iter().map(|&p| src[p]).collect();
    strided(&x.data, &ty.shape.0, &strides, 0)
}

/// Per axis, elements `start, start + stride, …` below `limit`.
pub(crate) fn slice(x: &Value, ty: &TensorType, start: &[usize], stride: &[usize]) -> Vec<f64> {
    let src = x.ty.shape.strides();
    let base = start.iter().zip(&src).map(|(s, st)| s * st).sum();
    let strides: Vec<usize> = stride.iter().zip(&src).map(|(s, st)| s * st).collect();
    strided(&x.data, &ty.shape.0, &strides, base)
}

/// Joins `parts` along `axis`.
pub(crate) fn concat(parts: &[&Value], ty: &TensorType, axis: usize) -> Vec<f64> {
    let dims = &ty.shape.0;
    let outer = numel(&dims[..axis]);
    let inner = numel(&dims[axis + 1..]);
    let mut out = Vec::with_capacity(numel(dims));
    for o in 0..outer {
        for p in parts {
            let chunk = p.ty.shape.0[axis] * inner;
            out.extend_from_slice(&p.data[o * chunk..(o + 1) * chunk]);
        }
    }
    out
}

/// Places the operand at offset `low` in a result filled with `value` (already converted to
/// the dtype).
pub(crate) fn pad(x: &Value, ty: &TensorType, low: &[usize], value: f64) -> Vec<f64> {
    let dst = ty.shape.strides();
    let base = low.iter().zip(&dst).map(|(l, st)| l * st).sum();
    let mut out = vec![value; ty.shape.numel()];
    let mut src = x.data.iter();
    for_each_offset(&x.ty.shape.0, &dst, base, |o| {
        out[o] = *src.next().expect("one source element per operand index");
    });
    out
}

/// `result[pre…, idx…, post…] = table[pre…, clamp(indices[idx…], 0, d − 1), post…]`.
///
/// A table whose `axis` is empty has nothing to read: such a gather yields zeros.
pub(crate) fn gather(table: &Value, indices: &Value, axis: usize) -> Vec<f64> {
    let dims = &table.ty.shape.0;
    let outer = numel(&dims[..axis]);
    let d = dims[axis];
    let inner = numel(&dims[axis + 1..]);
    let n = indices.data.len();
    if d == 0 {
        return vec![0.0; outer * n * inner];
    }
    let rows: Vec<usize> = indices.data.iter().map(|&i| i.clamp(0.0, (d - 1) as f64) as usize).collect();
    let mut out = Vec::with_capacity(outer * n * inner);
    for o in 0..outer {
        for &r in &rows {
            let start = (o * d + r) * inner;
            out.extend_from_slice(&table.data[start..start + inner]);
        }
    }
    out
}

/// `operand` with `update` written at `[s, s + u)` along `axis`, `s` the start (one, or one
/// per index of axis 0) clamped to `[0, d − u]` (XLA's `DynamicUpdateSlice`).
pub(crate) fn dynamic_update_slice(operand: &Value, update: &Value, start: &Value, axis: usize) -> Vec<f64> {
    let dims = &operand.ty.shape.0;
    let (outer, d, inner) = (numel(&dims[..axis]), dims[axis], numel(&dims[axis + 1..]));
    let u = update.ty.shape.0[axis];
    // A start per index of axis 0, or one for all.
    let per_lead = outer / dims[0].max(1);
    let mut out = operand.data.clone();
    for o in 0..outer {
        let at = if start.data.len() == 1 { 0 } else { o / per_lead };
        let s = start.data[at].clamp(0.0, (d - u) as f64) as usize;
        let (to, from) = ((o * d + s) * inner, o * u * inner);
        out[to..to + u * inner].copy_from_slice(&update.data[from..from + u * inner]);
    }
    out
}

/// Element = its index along `axis` (before rounding to the dtype).
pub(crate) fn iota(shape: &Shape, axis: usize) -> Vec<f64> {
    let dims = &shape.0;
    let outer = numel(&dims[..axis]);
    let d = dims[axis];
    let inner = numel(&dims[axis + 1..]);
    let mut out = Vec::with_capacity(shape.numel());
    for _ in 0..outer {
        for k in 0..d {
            out.extend(std::iter::repeat_n(k as f64, inner));
        }
    }
    out
}
