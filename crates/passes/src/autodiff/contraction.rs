//! Vector-Jacobian products of the contractions and windows: matmul, conv2d and pooling.
//!
//! Convolution gradients are convolutions again (any stride, padding, dilation and group
//! count):
//! - input: insert `stride − 1` zeros between the cotangent's elements, pad (or crop) it by
//!   `dilation·(k − 1) − padding` on each side (plus the rows the forward stride dropped at
//!   the end), and convolve with stride 1 and the forward dilation with the weight
//!   flipped spatially and transposed per group (`[O, C/G, kh, kw]` → `[C, O/G, kh, kw]`);
//! - weight: convolve the input, batch and channel axes swapped per group
//!   (`[C/G, G·N, h, w]`), with the cotangent as the kernel (`[O, N, oh, ow]`), stride and
//!   dilation exchanged, the forward padding, `groups` groups; then keep the first `kh × kw`
//!   positions and swap the two leading axes.
//!
//! Average pooling is a depthwise convolution with a constant kernel, so it reuses the input
//! rule. Max pooling unfolds the `-∞`-padded input into one strided slice per window
//! position, compares each with the pooled value, splits the cotangent equally among the
//! tied positions of each window, and scatters back with the strided-slice rule.

use super::layout::{dilate, slice};
use super::Emit;
use fusegraph_ir::{BinaryOp, DType, IrError, NodeId, Op, PoolKind};

type R = Result<NodeId, IrError>;

/// The attributes of a convolution.
#[derive(Clone, Copy, Debug)]
pub(super) struct ConvGeom {
    pub(super) stride: [usize; 2],
    pub(super) padding: [usize; 2],
    pub(super) dilation: [usize; 2],
    pub(super) groups: usize,
}

/// The attributes of a pooling window.
#[derive(Clone, Copy, Debug)]
pub(super) struct PoolGeom {
    pub(super) kind: PoolKind,
    pub(super) window: [usize; 2],
    pub(super) stride: [usize; 2],
    pub(super) padding: [usize; 2],
}

/// Sums `x` over its leading axes and over the axes where `target` has 1 but `x` has not
/// (NumPy broadcasting in reverse), then reshapes to `target`.
fn unbroadcast(e: &mut Emit<'_>, x: NodeId, target: &[usize]) -> R {
    let xd = e.dims(x);
    let lead = xd.len() - target.len();
    let axes: Vec<usize> = (0..xd.len()).filter(|&j| j < lead || (target[j - lead] == 1 && xd[j] != 1)).collect();
    let s = e.sum(x, axes, false)?;
    e.reshape(s, target.to_vec())
}

/// `C = A·B` with broadcast batch dims: `dA = dC·Bᵀ`, `dB = Aᵀ·dC`, each summed over the
/// batch dims its operand was broadcast along.
pub(super) fn matmul(
    e: &mut Emit<'_>,
    xs: &[NodeId],
    gy: NodeId,
    want: &[bool],
) -> Result<Vec<Option<NodeId>>, IrError> {
    let (a, b) = (xs[0], xs[1]);
    let mut out = vec![None, None];
    if want[0] {
        let bt = e.swap_last(b)?;
        let full = e.matmul(gy, bt)?;
        let target = e.dims(a);
        out[0] = Some(unbroadcast(e, full, &target)?);
    }
    if want[1] {
        let at = e.swap_last(a)?;
        let full = e.matmul(at, gy)?;
        let target = e.dims(b);
        out[1] = Some(unbroadcast(e, full, &target)?);
    }
    Ok(out)
}

fn conv(e: &mut Emit<'_>, x: NodeId, w: NodeId, g: ConvGeom) -> R {
    e.op(Op::Conv2d { stride: g.stride, padding: g.padding, dilation: g.dilation, groups: g.groups }, &[x, w])
}

/// Reverses `x` along `axis` (a gather with descending indices).
fn flip(e: &mut Emit<'_>, x: NodeId, axis: usize) -> R {
    let n = e.dims(x)[axis];
    if n <= 1 {
        return Ok(x);
    }
    let idx = e.constant(DType::I32, vec![n], (0..n).rev().map(|i| i as f64).collect())?;
    e.op(Op::Gather { axis }, &[x, idx])
}

/// `conv2d(x, w)`: the cotangents of the input and of the weight (see the module docs).
pub(super) fn conv2d(
    e: &mut Emit<'_>,
    xs: &[NodeId],
    gy: NodeId,
    geom: ConvGeom,
    want: &[bool],
) -> Result<Vec<Option<NodeId>>, IrError> {
    let (x, w) = (xs[0], xs[1]);
    let xd = e.dims(x);
    let wd = e.dims(w);
    let mut out = vec![None, None];
    if want[0] {
        let (o, cpg, kh, kw) = (wd[0], wd[1], wd[2], wd[3]);
        let groups = geom.groups;
        let opg = o / groups;
        let r = e.reshape(w, vec![groups, opg, cpg, kh, kw])?;
        let t = e.transpose(r, vec![0, 2, 1, 3, 4])?;
        let wt = e.reshape(t, vec![groups * cpg, opg, kh, kw])?;
        let wt = flip(e, wt, 2)?;
        let wt = flip(e, wt, 3)?;
        out[0] = Some(conv_input_grad(e, gy, wt, [xd[2], xd[3]], geom)?);
    }
    if want[1] {
        out[1] = Some(conv_weight_grad(e, x, gy, [wd[2], wd[3]], geom)?);
    }
    Ok(out)
}

/// The input cotangent of a convolution whose output cotangent is `gy` (`[N, O, oh, ow]`),
/// given the flipped, group-transposed weight `wt` (`[C, O/G, kh, kw]`) and the input's
/// spatial size.
fn conv_input_grad(e: &mut Emit<'_>, gy: NodeId, wt: NodeId, in_hw: [usize; 2], geom: ConvGeom) -> R {
    let kd = e.dims(wt);
    let mut cur = gy;
    for ax in 0..2 {
        cur = dilate(e, cur, 2 + ax, geom.stride[ax])?;
    }
    let cd = e.dims(cur);
    let (mut low, mut high) = ([0i64; 2], [0i64; 2]);
    for ax in 0..2 {
        let span = (geom.dilation[ax] * (kd[2 + ax] - 1)) as i64;
        low[ax] = span - geom.padding[ax] as i64;
        // The conv output length is len + low + high − span, which must be the input size.
        high[ax] = in_hw[ax] as i64 + span - cd[2 + ax] as i64 - low[ax];
    }
    let padded = pad_or_crop(e, cur, low, high)?;
    let g = ConvGeom { stride: [1, 1], padding: [0, 0], dilation: geom.dilation, groups: geom.groups };
    conv(e, padded, wt, g)
}

/// Pads (positive amounts) or crops (negative amounts) the two spatial axes of an NCHW value.
fn pad_or_crop(e: &mut Emit<'_>, x: NodeId, low: [i64; 2], high: [i64; 2]) -> R {
    let pos = |v: i64| v.max(0) as usize;
    let neg = |v: i64| (-v).max(0) as usize;
    let padded = e.pad(x, vec![0, 0, pos(low[0]), pos(low[1])], vec![0, 0, pos(high[0]), pos(high[1])], 0.0)?;
    let d = e.dims(padded);
    let start = vec![0, 0, neg(low[0]), neg(low[1])];
    let limit = vec![d[0], d[1], d[2] - neg(high[0]), d[3] - neg(high[1])];
    e.slice(padded, start, limit, vec![1; 4])
}

/// The weight cotangent of a convolution of `x` (`[N, C, h, w]`) whose output cotangent is
/// `gy`, for a kernel of spatial size `k`.
fn conv_weight_grad(e: &mut Emit<'_>, x: NodeId, gy: NodeId, k: [usize; 2], geom: ConvGeom) -> R {
    let xd = e.dims(x);
    let (n, c, h, w) = (xd[0], xd[1], xd[2], xd[3]);
    let groups = geom.groups;
    let cpg = c / groups;
    let r = e.reshape(x, vec![n, groups, cpg, h, w])?;
    let t = e.transpose(r, vec![2, 1, 0, 3, 4])?;
    let xs = e.reshape(t, vec![cpg, groups * n, h, w])?;
    let gt = e.transpose(gy, vec![1, 0, 2, 3])?; // [O, N, oh, ow]
    let g = ConvGeom { stride: geom.dilation, padding: geom.padding, dilation: geom.stride, groups };
    let full = conv(e, xs, gt, g)?; // [C/G, O, kh', kw'] with kh' ≥ kh
    let fd = e.dims(full);
    let cut = e.slice(full, vec![0; 4], vec![fd[0], fd[1], k[0], k[1]], vec![1; 4])?;
    e.transpose(cut, vec![1, 0, 2, 3])
}

/// `pool(x)`: average pooling as a depthwise convolution with the constant kernel
/// `1/(kh·kw)`; max pooling by the equality mask over an unfold of strided slices (ties split
/// equally).
pub(super) fn pool(e: &mut Emit<'_>, geom: PoolGeom, x: NodeId, y: NodeId, gy: NodeId) -> R {
    let PoolGeom { kind, window, stride, padding } = geom;
    let xd = e.dims(x);
    let dtype = e.dtype(x);
    let (n, c, h, w) = (xd[0], xd[1], xd[2], xd[3]);
    if kind == PoolKind::Avg {
        let area = (window[0] * window[1]) as f64;
        let wt = e.full(dtype, vec![c, 1, window[0], window[1]], 1.0 / area)?;
        let geom = ConvGeom { stride, padding, dilation: [1, 1], groups: c };
        return conv_input_grad(e, gy, wt, [h, w], geom);
    }
    let yd = e.dims(y);
    let (oh, ow) = (yd[2], yd[3]);
    let pads = vec![0, 0, padding[0], padding[1]];
    let xp = e.pad(x, pads.clone(), pads, f64::NEG_INFINITY)?;
    let pd = e.dims(xp);
    let strides = vec![1, 1, stride[0], stride[1]];
    let mut taps = Vec::with_capacity(window[0] * window[1]);
    let mut count = None;
    for ky in 0..window[0] {
        for kx in 0..window[1] {
            let start = vec![0, 0, ky, kx];
            let limit = vec![n, c, ky + (oh - 1) * stride[0] + 1, kx + (ow - 1) * stride[1] + 1];
            let tap = e.slice(xp, start.clone(), limit, strides.clone())?;
            let hit = e.bin(BinaryOp::Eq, tap, y)?;
            let mask = e.cast(hit, dtype)?;
            count = Some(match count {
                Some(total) => e.add(total, mask)?,
                None => mask,
            });
            taps.push((start, mask));
        }
    }
    let count = count.expect("a window has at least one position");
    let share = e.div(gy, count)?;
    let mut acc = None;
    for (start, mask) in taps {
        let part = e.mul(share, mask)?;
        let back = slice(e, part, &pd, &start, &strides)?;
        acc = Some(match acc {
            Some(total) => e.add(total, back)?,
            None => back,
        });
    }
    let acc = acc.expect("a window has at least one position");
    e.slice(acc, vec![0, 0, padding[0], padding[1]], vec![n, c, padding[0] + h, padding[1] + w], vec![1; 4])
}
