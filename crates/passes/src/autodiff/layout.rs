//! Vector-Jacobian products of the layout ops (broadcast, transpose, slice, concat, pad,
//! gather) and of reductions.
//!
//! Each is the transpose of a linear map written with the IR's own ops: broadcast ↔ sum,
//! slice ↔ interior-zero insertion plus pad, concat ↔ slices, pad ↔ slice, and gather ↔ a
//! one-hot matmul (the IR has no scatter).

use super::Emit;
use fusegraph_ir::op::reduced_dims;
use fusegraph_ir::{BinaryOp, DType, IrError, NodeId, Op, ReduceKind};

type R = Result<NodeId, IrError>;

/// `broadcast_in_dim(x, dims)`: sums the cotangent over the result axes that are not in
/// `dims` and over those where the operand dim is 1 but the result dim is not, then reshapes
/// to the operand shape.
pub(super) fn broadcast(e: &mut Emit<'_>, x: NodeId, dims: &[usize], gy: NodeId) -> R {
    let xd = e.dims(x);
    let yd = e.dims(gy);
    let axes: Vec<usize> = (0..yd.len())
        .filter(|&j| match dims.iter().position(|&d| d == j) {
            None => true,
            Some(i) => xd[i] == 1 && yd[j] != 1,
        })
        .collect();
    let s = e.sum(gy, axes, false)?;
    e.reshape(s, xd)
}

/// `transpose(x, perm)`: transposes the cotangent with the inverse permutation.
pub(super) fn transpose(e: &mut Emit<'_>, perm: &[usize], gy: NodeId) -> R {
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    e.transpose(gy, inv)
}

/// Inserts `s − 1` zeros between consecutive elements along `axis` (length `n` becomes
/// `(n − 1)·s + 1`): reshape `[.., n, ..]` → `[.., n, 1, ..]`, pad the new axis to `s`,
/// merge to `[.., n·s, ..]`, and drop the trailing `s − 1` zeros.
pub(super) fn dilate(e: &mut Emit<'_>, x: NodeId, axis: usize, s: usize) -> R {
    let d = e.dims(x);
    let n = d[axis];
    if s <= 1 || n <= 1 {
        return Ok(x);
    }
    let mut split = d.clone();
    split.insert(axis + 1, 1);
    let r = e.reshape(x, split)?;
    let mut high = vec![0; d.len() + 1];
    high[axis + 1] = s - 1;
    let p = e.pad(r, vec![0; d.len() + 1], high, 0.0)?;
    let mut merged = d.clone();
    merged[axis] = n * s;
    let m = e.reshape(p, merged.clone())?;
    let mut limit = merged;
    limit[axis] = (n - 1) * s + 1;
    e.slice(m, vec![0; d.len()], limit, vec![1; d.len()])
}

/// `slice(x, start, stride)`: puts the cotangent back where its elements came from, zeros
/// elsewhere: interior zeros for each strided axis ([`dilate`]), then a pad to the operand
/// extent.
pub(super) fn slice(e: &mut Emit<'_>, gy: NodeId, x_dims: &[usize], start: &[usize], stride: &[usize]) -> R {
    let dtype = e.dtype(gy);
    if e.dims(gy).contains(&0) {
        return e.full(dtype, x_dims.to_vec(), 0.0);
    }
    let mut cur = gy;
    for (axis, &s) in stride.iter().enumerate() {
        cur = dilate(e, cur, axis, s)?;
    }
    let cd = e.dims(cur);
    let high: Vec<usize> = (0..x_dims.len()).map(|i| x_dims[i] - start[i] - cd[i]).collect();
    e.pad(cur, start.to_vec(), high, 0.0)
}

/// `concat(xs, axis)`: each wanted operand gets its slab of the cotangent.
pub(super) fn concat(
    e: &mut Emit<'_>,
    xs: &[NodeId],
    axis: usize,
    gy: NodeId,
    want: &[bool],
) -> Result<Vec<Option<NodeId>>, IrError> {
    let yd = e.dims(gy);
    let mut offset = 0;
    let mut out = Vec::with_capacity(xs.len());
    for (&x, &w) in xs.iter().zip(want) {
        let len = e.dims(x)[axis];
        if w {
            let mut start = vec![0; yd.len()];
            let mut limit = yd.clone();
            start[axis] = offset;
            limit[axis] = offset + len;
            out.push(Some(e.slice(gy, start, limit, vec![1; yd.len()])?));
        } else {
            out.push(None);
        }
        offset += len;
    }
    Ok(out)
}

/// `pad(x, low, high)`: the cotangent without the padding.
pub(super) fn pad(e: &mut Emit<'_>, x: NodeId, low: &[usize], gy: NodeId) -> R {
    let xd = e.dims(x);
    let limit: Vec<usize> = low.iter().zip(&xd).map(|(l, d)| l + d).collect();
    e.slice(gy, low.to_vec(), limit, vec![1; xd.len()])
}

/// `gather(table, indices, axis)`: the table's cotangent is the scatter-add of the
/// cotangent's rows, built without a scatter as a one-hot matmul. With `P`, `D`, `Q` the
/// products of the table dims before, at and after `axis` and `N` the index count:
/// `onehot[d, n] = (clamp(indices[n]) == d)` in the float dtype, and
/// `dtable[p, d, q] = Σ_n onehot[d, n] · gy[p, n, q]`, one `matmul` of `[D, N]` by
/// `[P, N, Q]`. Indices are clamped as the forward op clamps them.
pub(super) fn gather(e: &mut Emit<'_>, table: NodeId, indices: NodeId, axis: usize, gy: NodeId) -> R {
    let td = e.dims(table);
    let dtype = e.dtype(table);
    let p: usize = td[..axis].iter().product();
    let d = td[axis];
    let q: usize = td[axis + 1..].iter().product();
    let n: usize = e.dims(indices).iter().product();
    if p * d * q * n == 0 {
        return e.full(dtype, td, 0.0);
    }
    let it = e.dtype(indices);
    let flat = e.reshape(indices, vec![n])?;
    let top = e.full(it, vec![n], (d - 1) as f64)?;
    let mut clamped = e.bin(BinaryOp::Min, flat, top)?;
    if it == DType::I32 {
        let zero = e.full(it, vec![n], 0.0)?;
        clamped = e.bin(BinaryOp::Max, clamped, zero)?;
    }
    let rows = e.broadcast_in_dim(clamped, vec![d, n], vec![1])?;
    let counter = e.iota(it, vec![d, n], 0)?;
    let hit = e.bin(BinaryOp::Eq, rows, counter)?;
    let onehot = e.cast(hit, dtype)?;
    let g3 = e.reshape(gy, vec![p, n, q])?;
    let dt = e.matmul(onehot, g3)?; // [P, D, Q]
    e.reshape(dt, td)
}

/// `dynamic_update_slice(x, u, start)` along `axis`: the operand's cotangent is `gy` with
/// the window zeroed (the same op writing zeros), the update's is the window of `gy` (a
/// gather of the `u` positions from the start clamped as the forward op clamps it).
pub(super) fn dynamic_update_slice(
    e: &mut Emit<'_>,
    xs: &[NodeId],
    axis: usize,
    gy: NodeId,
    want: &[bool],
) -> Result<Vec<Option<NodeId>>, IrError> {
    let (update, start) = (xs[1], xs[2]);
    let (d, u) = (e.dims(xs[0])[axis], e.dims(update)[axis]);
    let operand = match want[0] {
        true => {
            let zeros = e.full_like(update, 0.0)?;
            Some(e.op(Op::DynamicUpdateSlice { axis }, &[gy, zeros, start])?)
        }
        false => None,
    };
    let update = match want[1] {
        true if !e.dims(start).is_empty() => {
            return Err(IrError::ty(
                "dynamic_update_slice",
                "the update's gradient with a start per index of axis 0 is not supported (one start is)",
            ));
        }
        true => {
            let s = e.cast(start, DType::I32)?;
            let zero = e.full(DType::I32, vec![], 0.0)?;
            let top = e.full(DType::I32, vec![], (d - u) as f64)?;
            let s = e.bin(BinaryOp::Max, s, zero)?;
            let s = e.bin(BinaryOp::Min, s, top)?;
            let s = e.broadcast_in_dim(s, vec![u], vec![])?;
            let positions = e.iota(DType::I32, vec![u], 0)?;
            let rows = e.add(positions, s)?;
            Some(e.op(Op::Gather { axis }, &[gy, rows])?)
        }
        false => None,
    };
    Ok(vec![operand, update, None])
}

/// `reduce(x, kind, axes)`; `y` is the reduced value, `gy` its cotangent (with or without
/// the kept axes). Sum broadcasts the cotangent back; prod uses `gy·y/x` (an element equal
/// to zero is not handled); max and min split the cotangent equally among the positions
/// equal to the extremum.
pub(super) fn reduce(e: &mut Emit<'_>, kind: ReduceKind, axes: &[usize], x: NodeId, y: NodeId, gy: NodeId) -> R {
    let xd = e.dims(x);
    let keep = reduced_dims(&xd, axes, true);
    let all: Vec<usize> = (0..xd.len()).collect();
    let back = |e: &mut Emit<'_>, v: NodeId| -> R {
        let r = e.reshape(v, keep.clone())?;
        e.broadcast_in_dim(r, xd.clone(), all.clone())
    };
    match kind {
        ReduceKind::Sum => back(e, gy),
        ReduceKind::Prod => {
            let t = e.mul(gy, y)?;
            let b = back(e, t)?;
            e.div(b, x)
        }
        ReduceKind::Max | ReduceKind::Min => {
            let yb = back(e, y)?;
            let hit = e.bin(BinaryOp::Eq, x, yb)?;
            let mask = e.cast(hit, e.dtype(x))?;
            let count = e.sum(mask, axes.to_vec(), true)?;
            let gk = e.reshape(gy, keep.clone())?;
            let share = e.div(gk, count)?;
            let sb = e.broadcast_in_dim(share, xd.clone(), all.clone())?;
            e.mul(sb, mask)
        }
    }
}
