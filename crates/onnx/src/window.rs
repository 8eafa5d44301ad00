//! The window ops — `Conv`, `MaxPool`, `AveragePool`, `Resize` — onto the IR's 2-D windows
//! and gathers: padding modes and `auto_pad`, 1-D as 2-D with a unit height.

use crate::node::{axis, node_err, Attrs};
use crate::proto::NodeProto;
use crate::{Result, Value};
use fusegraph_ir::{DType, GraphBuilder, IrError, Tensor};
use std::collections::BTreeMap;

/// `Conv` (2-D, or 1-D as 2-D with a unit height): groups, strides, dilations, pads
/// (asymmetric ones as an explicit pad) or `auto_pad`, and the bias.
pub(crate) fn conv(node: &NodeProto, x: Tensor, w: Tensor, bias: Option<Tensor>) -> Result<Vec<Tensor>> {
    let ir = |e: IrError| node_err(node, e.to_string());
    let a = Attrs(node);
    let one_d = x.rank() == 3;
    let (x, w) = if one_d {
        let (xd, wd) = (x.dims().to_vec(), w.dims().to_vec());
        (x.reshape([xd[0], xd[1], 1, xd[2]]).map_err(ir)?, w.reshape([wd[0], wd[1], 1, wd[2]]).map_err(ir)?)
    } else {
        (x, w)
    };
    if x.rank() != 4 {
        return Err(node_err(node, format!("input {} (1-D and 2-D convolutions are supported)", x.ty())));
    }
    let two = |name: &str, default: i64| -> Vec<usize> {
        let v = a.ints(name).unwrap_or_else(|| vec![default; if one_d { 1 } else { 2 }]);
        let v: Vec<usize> = v.iter().map(|&x| x as usize).collect();
        if one_d {
            vec![1, v[0]]
        } else {
            v
        }
    };
    let (stride, dilation) = (two("strides", 1), two("dilations", 1));
    let kernel = [w.dims()[2], w.dims()[3]];
    let pads = window_pads(node, &a, &x, kernel, [stride[0], stride[1]], [dilation[0], dilation[1]], one_d)?;
    let (x, padding) = symmetric(node, x, pads, 0.0)?;
    let groups = a.int("group", 1) as usize;
    let mut y = x.conv2d(&w, [stride[0], stride[1]], padding, [dilation[0], dilation[1]], groups).map_err(ir)?;
    if let Some(bias) = bias {
        y = y.add(&bias.broadcast_in_dim(y.dims().to_vec(), vec![1]).map_err(ir)?).map_err(ir)?;
    }
    if one_d {
        let d = y.dims().to_vec();
        y = y.reshape([d[0], d[1], d[3]]).map_err(ir)?;
    }
    Ok(vec![y])
}

/// The pads before and after each spatial axis (of extents `dims`) of a window of
/// `span` (its dilated extent) moving by `stride`: `pads`, or as `auto_pad` says.
fn spatial_pads(
    node: &NodeProto,
    a: &Attrs<'_>,
    dims: &[usize],
    span: &[usize],
    stride: &[usize],
) -> Result<(Vec<usize>, Vec<usize>)> {
    let n = dims.len();
    let (mut begin, mut end) = (vec![0; n], vec![0; n]);
    match a.string("auto_pad", "NOTSET").as_str() {
        "NOTSET" => match a.ints("pads") {
            Some(p) if p.len() == 2 * n => {
                begin = p[..n].iter().map(|&v| v as usize).collect();
                end = p[n..].iter().map(|&v| v as usize).collect();
            }
            Some(p) if !p.is_empty() => return Err(node_err(node, format!("{} pads", p.len()))),
            _ => {}
        },
        "VALID" => {}
        mode @ ("SAME_UPPER" | "SAME_LOWER") => {
            for i in 0..n {
                let total = ((dims[i].div_ceil(stride[i]) - 1) * stride[i] + span[i]).saturating_sub(dims[i]);
                let (small, big) = (total / 2, total - total / 2);
                (begin[i], end[i]) = if mode == "SAME_UPPER" { (small, big) } else { (big, small) };
            }
        }
        other => return Err(node_err(node, format!("auto_pad `{other}`"))),
    }
    Ok((begin, end))
}

/// The pads `[top, left, bottom, right]` of a 2-D window op on `x` (rank 4; `one_d`: a 1-D
/// op's attributes, of its last axis, under a unit height).
fn window_pads(
    node: &NodeProto,
    a: &Attrs<'_>,
    x: &Tensor,
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    one_d: bool,
) -> Result<[usize; 4]> {
    let axes = if one_d { 1..2 } else { 0..2 };
    let dims: Vec<usize> = axes.clone().map(|i| x.dims()[2 + i]).collect();
    let span: Vec<usize> = axes.clone().map(|i| (kernel[i] - 1) * dilation[i] + 1).collect();
    let step: Vec<usize> = axes.map(|i| stride[i]).collect();
    let (begin, end) = spatial_pads(node, a, &dims, &span, &step)?;
    Ok(if one_d { [0, begin[0], 0, end[0]] } else { [begin[0], begin[1], end[0], end[1]] })
}

/// Symmetric padding for the IR's window ops: `x` padded explicitly with `value` where the
/// two sides differ (then no padding is left to the op).
fn symmetric(node: &NodeProto, x: Tensor, p: [usize; 4], value: f64) -> Result<(Tensor, [usize; 2])> {
    if p[0] == p[2] && p[1] == p[3] {
        return Ok((x, [p[0], p[1]]));
    }
    let padded = x.pad(&[0, 0, p[0], p[1]], &[0, 0, p[2], p[3]], value).map_err(|e| node_err(node, e.to_string()))?;
    Ok((padded, [0, 0]))
}

/// A pooling's window along each spatial axis.
struct Window {
    kernel: Vec<usize>,
    stride: Vec<usize>,
    dilation: Vec<usize>,
    /// Padding before and after (`pads` or `auto_pad`).
    begin: Vec<usize>,
    end: Vec<usize>,
    /// `ceil_mode`'s padding after that: one more window where the last would start inside
    /// the input or its leading padding (its elements count in no average).
    extra: Vec<usize>,
    /// The output's extent.
    out: Vec<usize>,
}

impl Window {
    /// The window of pooling `node` over `x` (rank ≥ 3).
    fn of(node: &NodeProto, a: &Attrs<'_>, x: &Tensor) -> Result<Window> {
        let n =
            x.rank().checked_sub(2).filter(|&n| n >= 1).ok_or_else(|| node_err(node, format!("input {}", x.ty())))?;
        let list = |name: &str, default: usize| -> Result<Vec<usize>> {
            let v = a.ints(name).map_or(vec![default as i64; n], |v| v.to_vec());
            match v.len() == n && v.iter().all(|&q| q >= 1) {
                true => Ok(v.iter().map(|&q| q as usize).collect()),
                false => Err(node_err(node, format!("{name} {v:?} for {n} spatial axes"))),
            }
        };
        if a.ints("kernel_shape").is_none() {
            return Err(node_err(node, "no kernel_shape"));
        }
        let (kernel, stride, dilation) = (list("kernel_shape", 0)?, list("strides", 1)?, list("dilations", 1)?);
        let dims = &x.dims()[2..];
        let span: Vec<usize> = (0..n).map(|i| (kernel[i] - 1) * dilation[i] + 1).collect();
        let (begin, end) = spatial_pads(node, a, dims, &span, &stride)?;
        let (mut extra, mut out) = (vec![0; n], vec![0; n]);
        for i in 0..n {
            let padded = dims[i] + begin[i] + end[i];
            if padded < span[i] {
                return Err(node_err(node, format!("a window of {} past axis {} of {}", span[i], i + 2, x.ty())));
            }
            if a.int("ceil_mode", 0) != 0 {
                let last_start = (padded - span[i]).div_ceil(stride[i]) * stride[i];
                if last_start < dims[i] + begin[i] {
                    extra[i] = (last_start + span[i]).saturating_sub(padded);
                }
            }
            out[i] = (padded + extra[i] - span[i]) / stride[i] + 1;
        }
        Ok(Window { kernel, stride, dilation, begin, end, extra, out })
    }

    /// Padding after each axis, `ceil_mode`'s included.
    fn after(&self) -> Vec<usize> {
        self.end.iter().zip(&self.extra).map(|(e, x)| e + x).collect()
    }

    /// Whether any padding is there, `ceil_mode`'s included.
    fn padded(&self) -> bool {
        self.begin.iter().chain(&self.after()).any(|&p| p > 0)
    }

    /// The same window with a unit axis first (1-D pooling as 2-D).
    fn unit_first(&self) -> Window {
        let one = |v: &[usize], first: usize| [&[first][..], v].concat();
        Window {
            kernel: one(&self.kernel, 1),
            stride: one(&self.stride, 1),
            dilation: one(&self.dilation, 1),
            begin: one(&self.begin, 0),
            end: one(&self.end, 0),
            extra: one(&self.extra, 0),
            out: one(&self.out, 1),
        }
    }

    /// Ones where an average's elements count — inside `x` (and inside its padding with
    /// `count_include_pad`) — zeros in the rest of the padding: `x`'s shape padded as the
    /// window pads it.
    fn counted(&self, b: &GraphBuilder, x: &Tensor, include_pad: bool) -> std::result::Result<Tensor, IrError> {
        let ones = b.full(x.dtype(), x.dims().to_vec(), 1.0)?;
        let zeros = vec![0; self.begin.len()];
        match include_pad {
            true => {
                ones.pad(&edges(&self.begin), &edges(&self.end), 1.0)?.pad(&edges(&zeros), &edges(&self.extra), 0.0)
            }
            false => ones.pad(&edges(&self.begin), &edges(&self.after()), 0.0),
        }
    }
}

/// Per-axis pads of the spatial axes as pads of a whole tensor (none on batch and channels).
fn edges(v: &[usize]) -> Vec<usize> {
    [&[0, 0][..], v].concat()
}

/// `MaxPool` and `AveragePool` (`count_include_pad` 0 divides by the window's elements inside
/// the input): 1-D and 2-D on the IR's window ops; dilated, 3-D and up, or with MaxPool's
/// Indices output, as the maximum or sum of one strided slice per window tap
/// ([`pool_taps`]).
pub(crate) fn pool(b: &GraphBuilder, node: &NodeProto, x: Tensor) -> Result<Vec<Tensor>> {
    let ir = |e: IrError| node_err(node, e.to_string());
    let a = Attrs(node);
    let window = Window::of(node, &a, &x)?;
    let indices = node.op_type == "MaxPool" && node.output.len() > 1;
    let taps = indices || x.rank() > 4 || window.dilation.iter().any(|&d| d != 1);
    // Integers through f32 (exact below 2^24).
    let dtype = x.dtype();
    let x = if dtype.is_int() { x.cast(DType::F32).map_err(ir)? } else { x };
    let back = |y: Tensor| if dtype.is_int() { y.cast(dtype).map_err(ir) } else { Ok(y) };
    let y = if taps {
        let mut ys = pool_taps(b, node, &a, x, &window)?;
        ys[0] = back(ys[0].clone())?;
        return Ok(ys);
    } else if x.rank() == 3 {
        // 1-D pooling as 2-D with a unit height.
        let d = x.dims().to_vec();
        let y = pool_2d(b, node, &a, x.reshape([d[0], d[1], 1, d[2]]).map_err(ir)?, &window.unit_first())?;
        let o = y.dims().to_vec();
        y.reshape([o[0], o[1], o[3]]).map_err(ir)?
    } else {
        pool_2d(b, node, &a, x, &window)?
    };
    Ok(vec![back(y)?])
}

/// [`pool`] of any number of spatial axes, dilations included: padded as `w` says, then the
/// maximum or sum over the window's taps of the input sliced at each tap's offset with the
/// pooling's strides; an average divides by the same sum over [`Window::counted`].
fn pool_taps(b: &GraphBuilder, node: &NodeProto, a: &Attrs<'_>, x: Tensor, w: &Window) -> Result<Vec<Tensor>> {
    let ir = |e: IrError| node_err(node, e.to_string());
    let n = w.kernel.len();
    let max = node.op_type == "MaxPool";
    // The window's taps of `t` (padded already): `t` sliced at each tap's offset.
    let taps = |t: &Tensor| -> Result<Vec<Tensor>> {
        (0..w.kernel.iter().product::<usize>())
            .map(|tap| {
                let (mut start, mut limit, mut step) = (vec![0, 0], t.dims()[..2].to_vec(), vec![1, 1]);
                let mut rest = tap;
                for i in (0..n).rev() {
                    let at = (rest % w.kernel[i]) * w.dilation[i];
                    rest /= w.kernel[i];
                    start.insert(2, at);
                    limit.insert(2, at + (w.out[i] - 1) * w.stride[i] + 1);
                    step.insert(2, w.stride[i]);
                }
                t.slice(&start, &limit, &step).map_err(ir)
            })
            .collect()
    };
    let fold =
        |ts: Vec<Tensor>, f: &dyn Fn(&Tensor, &Tensor) -> std::result::Result<Tensor, IrError>| -> Result<Tensor> {
            let mut it = ts.into_iter();
            let first = it.next().expect("a window of at least one tap");
            it.try_fold(first, |acc, v| f(&acc, &v).map_err(ir))
        };
    let fill = if max { f64::NEG_INFINITY } else { 0.0 };
    let (before, after) = (edges(&w.begin), edges(&w.after()));
    let values = taps(&x.pad(&before, &after, fill).map_err(ir)?)?;
    if max {
        let y = fold(values.clone(), &|a, v| a.maximum(v))?;
        if node.output.len() < 2 {
            return Ok(vec![y]);
        }
        // Indices: each window's first maximum, as its place in the input flattened (the
        // spatial axes column-major with storage_order 1); -1 in the padding.
        let d = x.dims().to_vec();
        let mut order: Vec<usize> = (0..2).chain((2..d.len()).rev()).collect();
        if a.int("storage_order", 0) == 0 {
            order = (0..d.len()).collect();
        }
        let laid: Vec<usize> = order.iter().map(|&q| d[q]).collect();
        let inverse: Vec<usize> =
            (0..d.len()).map(|q| order.iter().position(|&o| o == q).expect("a permutation")).collect();
        let flat = b
            .iota(DType::I32, [d.iter().product::<usize>()], 0)
            .and_then(|f| f.reshape(laid))
            .and_then(|f| f.transpose(&inverse))
            .map_err(ir)?;
        let places = taps(&flat.pad(&before, &after, -1.0).map_err(ir)?)?;
        let none = b.full(DType::I32, y.dims().to_vec(), -1.0).map_err(ir)?;
        let mut found = none.clone();
        for (v, place) in values.iter().zip(places) {
            let first = found.eq(&none).and_then(|unset| v.eq(&y)?.and(&unset)).map_err(ir)?;
            found = first.select(&place, &found).map_err(ir)?;
        }
        return Ok(vec![y, found]);
    }
    let sum = fold(values, &|a, v| a.add(v))?;
    let counted = w.counted(b, &x, a.int("count_include_pad", 0) != 0).map_err(ir)?;
    let count = fold(taps(&counted)?, &|a, v| a.add(v))?;
    Ok(vec![sum.div(&count).map_err(ir)?])
}

/// [`pool`] of a rank-4 input on the IR's 2-D window ops, `w` of its two spatial axes
/// (undilated).
fn pool_2d(b: &GraphBuilder, node: &NodeProto, a: &Attrs<'_>, x: Tensor, w: &Window) -> Result<Tensor> {
    let ir = |e: IrError| node_err(node, e.to_string());
    let (kernel, stride) = ([w.kernel[0], w.kernel[1]], [w.stride[0], w.stride[1]]);
    let after = w.after();
    let all = [w.begin[0], w.begin[1], after[0], after[1]];
    if node.op_type == "MaxPool" {
        let (x, padding) = symmetric(node, x, all, f64::NEG_INFINITY)?;
        return x.max_pool2d(kernel, stride, padding).map_err(ir);
    }
    let (xp, padding) = symmetric(node, x.clone(), all, 0.0)?;
    let avg = xp.avg_pool2d(kernel, stride, padding).map_err(ir)?;
    let include_pad = a.int("count_include_pad", 0) != 0;
    if !w.padded() || include_pad && w.extra.iter().all(|&e| e == 0) {
        return Ok(avg);
    }
    // The average over the padding counted as zeros, divided by the share of the window
    // that counts: the same pooling of ones where elements count.
    let share = w.counted(b, &x, include_pad).and_then(|c| c.avg_pool2d(kernel, stride, [0, 0])).map_err(ir)?;
    avg.div(&share).map_err(ir)
}

/// `Resize` in `nearest`, `linear` and `cubic` modes (the latter two separable: one axis at a
/// time, as bilinear and bicubic are): each resized axis gathered at source indices computed
/// at import from its coordinate transformation, linear as the two neighbours weighted, cubic
/// as four with Keys' coefficients (`cubic_coeff_a`, `exclude_outside` renormalizing those
/// inside; `antialias` widens a downsampling's linear or cubic support by the inverse
/// scale). Sizes with `keep_aspect_ratio_policy` `not_larger` / `not_smaller` scale every
/// resized axis by the least / greatest of their ratios.
pub(crate) fn resize(b: &GraphBuilder, node: &NodeProto, x: Tensor, ins: &[Option<Value>]) -> Result<Vec<Tensor>> {
    let ir = |e: IrError| node_err(node, e.to_string());
    let a = Attrs(node);
    let r = x.rank();
    let mode = a.string("mode", "nearest");
    if !["nearest", "linear", "cubic"].contains(&mode.as_str()) {
        return Err(node_err(node, format!("mode `{mode}` (nearest, linear and cubic are supported)")));
    }
    let antialias = a.int("antialias", 0) != 0 && mode != "nearest";
    let coeff_a = a.float("cubic_coeff_a", -0.75);
    let policy = a.string("keep_aspect_ratio_policy", "stretch");
    if !["stretch", "not_larger", "not_smaller"].contains(&policy.as_str()) {
        return Err(node_err(node, format!("keep_aspect_ratio_policy `{policy}`")));
    }
    let transform = a.string("coordinate_transformation_mode", "half_pixel");
    let list: Vec<usize> = match a.ints("axes") {
        Some(v) => v.iter().map(|&q| axis(node, q, r)).collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    let floats = |i: usize| -> Result<Option<Vec<f64>>> {
        match ins.get(i).and_then(Option::as_ref) {
            Some(Value::Known(h)) if h.shape().numel() > 0 => Ok(Some(h.to_f64())),
            Some(Value::Known(_)) | None => Ok(None),
            Some(Value::Node(_)) => Err(node_err(node, format!("input {i} must be known at import"))),
        }
    };
    let (scales, sizes) = (floats(2)?, floats(3)?);
    let crop = transform == "tf_crop_and_resize";
    // The region of interest: starts, then ends, of the resized axes, in fractions of each.
    let roi = match floats(1)? {
        Some(v) if v.len() == 2 * list.len() => v,
        _ if crop => {
            return Err(node_err(node, format!("tf_crop_and_resize needs a roi of {} values", 2 * list.len())))
        }
        _ => Vec::new(),
    };
    let extrapolation = a.float("extrapolation_value", 0.0);
    // One scale for every resized axis where sizes keep the aspect ratio.
    let kept = match (&sizes, policy.as_str()) {
        (Some(s), "not_larger" | "not_smaller") => {
            let ratios = list.iter().zip(s).map(|(&ax, &n)| n / x.dims()[ax] as f64);
            Some(if policy == "not_larger" { ratios.fold(f64::INFINITY, f64::min) } else { ratios.fold(0.0, f64::max) })
        }
        _ => None,
    };
    let mut y = x;
    for (j, &ax) in list.iter().enumerate() {
        let len = y.dims()[ax];
        let (out, scale) = match (&sizes, &scales, kept) {
            // (Rounding half up.)
            (Some(_), _, Some(k)) => ((k * len as f64 + 0.5).floor() as usize, k),
            (Some(s), _, None) => (s[j] as usize, s[j] / len as f64),
            (None, Some(s), _) => ((len as f64 * s[j]).floor() as usize, s[j]),
            (None, None, _) => return Err(node_err(node, "neither scales nor sizes")),
        };
        if out == len && scale == 1.0 && !crop {
            continue;
        }
        let source = |o: usize| -> f64 {
            let o = o as f64;
            match transform.as_str() {
                "asymmetric" => o / scale,
                "align_corners" if out == 1 => 0.0,
                // (The resized length unrounded, where scales are given.)
                "align_corners" => o * (len as f64 - 1.0) / (len as f64 * scale - 1.0),
                "pytorch_half_pixel" if out == 1 => 0.0,
                "tf_half_pixel_for_nn" => (o + 0.5) / scale,
                "tf_crop_and_resize" => {
                    let (start, end, width) = (roi[j], roi[j + list.len()], len as f64 * scale);
                    let span = (end - start) * (len as f64 - 1.0);
                    let at = if width == 1.0 { span / 2.0 } else { o * span / (width - 1.0) };
                    at + start * (len as f64 - 1.0)
                }
                "half_pixel_symmetric" => {
                    let adjustment = out as f64 / (scale * len as f64);
                    let center = len as f64 / 2.0;
                    center * (1.0 - adjustment) + (o + 0.5) / scale - 0.5
                }
                _ => (o + 0.5) / scale - 0.5,
            }
        };
        let last = len as f64 - 1.0;
        let gather = |idx: Vec<f64>| -> Result<Tensor> {
            let i = b.constant(DType::I32, [idx.len()], &idx).map_err(ir)?;
            y.gather(&i, ax).map_err(ir)
        };
        y = if mode == "nearest" {
            let nearest = a.string("nearest_mode", "round_prefer_floor");
            let pick = |x: f64| -> f64 {
                match nearest.as_str() {
                    "floor" => x.floor(),
                    "ceil" => x.ceil(),
                    "round_prefer_ceil" if x.fract() == 0.5 || x.fract() == -0.5 => x.ceil(),
                    "round_prefer_ceil" => x.round(),
                    _ if x.fract() == 0.5 || x.fract() == -0.5 => x.floor(),
                    _ => x.round(),
                }
            };
            gather((0..out).map(|o| pick(source(o)).clamp(0.0, last)).collect())?
        } else {
            let exclude = a.int("exclude_outside", 0) != 0;
            // Per tap, its source index and weight at each output position: the source
            // coordinate `c` is `base + ratio`, `ratio` in (0, 1] (ONNX's reference prefers the
            // left neighbour); tap `i` reads `base + i`, clamped to the edge.
            let mut taps: BTreeMap<i64, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
            for o in 0..out {
                let c = source(o);
                let ratio = if c.fract() == 0.0 { 1.0 } else { c - c.floor() };
                let base = c - ratio;
                let mut k = tap_weights(mode == "cubic", ratio, if antialias { scale.min(1.0) } else { 1.0 }, coeff_a);
                if exclude {
                    let inside = |i: i64| (0.0..=last).contains(&(base + i as f64));
                    let total: f64 = k.iter().filter(|(i, _)| inside(*i)).map(|(_, w)| w).sum();
                    k.iter_mut().for_each(|(i, w)| *w = if inside(*i) { *w / total } else { 0.0 });
                }
                for (i, w) in k {
                    let (idx, ws) = taps.entry(i).or_insert_with(|| (vec![0.0; out], vec![0.0; out]));
                    idx[o] = (base + i as f64).clamp(0.0, last);
                    ws[o] = w;
                }
            }
            let mut shape = vec![1; r];
            shape[ax] = out;
            let mut sum: Option<Tensor> = None;
            for (_, (i, w)) in taps {
                let w = b.constant(y.dtype(), shape.clone(), &w).map_err(ir)?;
                let term = gather(i)?.mul(&w).map_err(ir)?;
                sum = Some(match sum {
                    None => term,
                    Some(s) => s.add(&term).map_err(ir)?,
                });
            }
            sum.expect("at least two taps")
        };
        // A crop's positions outside the input take the extrapolation value.
        let outside: Vec<f64> =
            (0..out).map(|o| f64::from(u8::from(crop && !(0.0..=last).contains(&source(o))))).collect();
        if outside.contains(&1.0) {
            let mut shape = vec![1; r];
            shape[ax] = out;
            let m = b.constant(y.dtype(), shape, &outside).map_err(ir)?.broadcast_to(y.dims().to_vec()).map_err(ir)?;
            let keep = m.mul_scalar(-1.0).and_then(|m| m.add_scalar(1.0)).map_err(ir)?;
            y = y.mul(&keep).and_then(|v| v.add(&m.mul_scalar(extrapolation)?)).map_err(ir)?;
        }
    }
    Ok(vec![y])
}

/// The taps of a point `ratio` ∈ (0, 1] past tap 0, as (offset, weight): cubic (Keys'
/// kernel with parameter `a`) or linear, its support widened by `1 / scale` where `scale` < 1
/// (antialiasing a downsampling) and the weights then normalized, as ONNX's reference
/// computes them.
fn tap_weights(cubic: bool, ratio: f64, scale: f64, a: f64) -> Vec<(i64, f64)> {
    let keys = |x: f64| {
        let x = x.abs();
        match x {
            _ if x <= 1.0 => ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0,
            _ if x < 2.0 => ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a,
            _ => 0.0,
        }
    };
    let (support, kernel): (f64, &dyn Fn(f64) -> f64) =
        if cubic { (2.0, &keys) } else { (1.0, &|x: f64| (1.0 - x.abs()).clamp(0.0, 1.0)) };
    let start = (-support / scale).floor() as i64 + 1;
    let taps: Vec<(i64, f64)> = (start..2 - start).map(|i| (i, kernel(scale * (i as f64 - ratio)))).collect();
    let total: f64 = taps.iter().map(|(_, w)| w).sum();
    taps.into_iter().map(|(i, w)| (i, w / total)).collect()
}
