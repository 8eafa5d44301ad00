//! Window ops on NCHW tensors: 2-D convolution and pooling.

use crate::numeric::round_to;
use crate::Value;
use fusegraph_ir::{PoolKind, TensorType};

/// The input coordinate `o·stride − pad + k·dilation`, if it lies in `0..size`.
fn tap(o: usize, stride: usize, pad: usize, k: usize, dilation: usize, size: usize) -> Option<usize> {
    (o * stride + k * dilation).checked_sub(pad).filter(|&i| i < size)
}

/// `out[n,o,y,x] = Σ_{c, ky, kx} in[n, g·cpg + c, y·sh − ph + ky·dh, x·sw − pw + kx·dw] ·
/// w[o, c, ky, kx]` with `g = o / (O / groups)`; out-of-range taps contribute 0.
pub(crate) fn conv2d(
    x: &Value,
    w: &Value,
    ty: &TensorType,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
) -> Vec<f64> {
    let [nb, c, h, wd] = dims4(&x.ty);
    let [o, cpg, kh, kw] = dims4(&w.ty);
    let [_, _, oh, ow] = dims4(ty);
    let opg = o / groups;
    let mut out = Vec::with_capacity(ty.shape.numel());
    for b in 0..nb {
        for oc in 0..o {
            let g = oc / opg;
            for y in 0..oh {
                for xo in 0..ow {
                    let mut acc = 0.0;
                    for ci in 0..cpg {
                        let plane = (b * c + g * cpg + ci) * h;
                        let wbase = (oc * cpg + ci) * kh;
                        for ky in 0..kh {
                            let Some(iy) = tap(y, stride[0], padding[0], ky, dilation[0], h) else { continue };
                            for kx in 0..kw {
                                let Some(ix) = tap(xo, stride[1], padding[1], kx, dilation[1], wd) else { continue };
                                acc += x.data[(plane + iy) * wd + ix] * w.data[(wbase + ky) * kw + kx];
                            }
                        }
                    }
                    out.push(round_to(ty.dtype, acc));
                }
            }
        }
    }
    out
}

/// Max over the in-range window positions (padding never wins), or the sum over them divided
/// by the full window size (padding counts as zeros).
pub(crate) fn pool(
    x: &Value,
    ty: &TensorType,
    kind: PoolKind,
    window: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
) -> Vec<f64> {
    let [nb, c, h, wd] = dims4(&x.ty);
    let [_, _, oh, ow] = dims4(ty);
    let area = (window[0] * window[1]) as f64;
    let mut out = Vec::with_capacity(ty.shape.numel());
    for plane in 0..nb * c {
        for y in 0..oh {
            for xo in 0..ow {
                let mut acc = match kind {
                    PoolKind::Max => f64::NEG_INFINITY,
                    PoolKind::Avg => 0.0,
                };
                for ky in 0..window[0] {
                    let Some(iy) = tap(y, stride[0], padding[0], ky, 1, h) else { continue };
                    for kx in 0..window[1] {
                        let Some(ix) = tap(xo, stride[1], padding[1], kx, 1, wd) else { continue };
                        let v = x.data[(plane * h + iy) * wd + ix];
                        acc = match kind {
                            PoolKind::Max => acc.max(v),
                            PoolKind::Avg => acc + v,
                        };
                    }
                }
                if kind == PoolKind::Avg {
                    acc /= area;
                }
                out.push(round_to(ty.dtype, acc));
            }
        }
    }
    out
}

fn dims4(ty: &TensorType) -> [usize; 4] {
    let d = &ty.shape.0;
    [d[0], d[1], d[2], d[3]]
}
