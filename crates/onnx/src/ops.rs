//! Each ONNX op as IR ops (`apply`), following the operator specification of the opsets
//! read (13–21): attributes with their defaults, negative axes counted from the end,
//! multidirectional broadcasting (the IR's binary ops broadcast as numpy does), and the
//! inputs that must be known at import (shapes, axes, pads, slice bounds) read from their
//! values.

use crate::node::{axes, axis, input, known_ints, node_err, tensor, Attrs};
use crate::proto::NodeProto;
use crate::window::{conv, pool, resize};
use crate::{host_tensor, Result, Value};
use fusegraph_ir::{DType, GraphBuilder, HostTensor, IrError, Tensor};

/// The op types [`apply`] maps (ONNX's default domain).
pub const SUPPORTED: &[&str] = &[
    "Abs",
    "Add",
    "And",
    "ArgMax",
    "AveragePool",
    "BatchNormalization",
    "Cast",
    "Ceil",
    "Clip",
    "Concat",
    "Constant",
    "ConstantOfShape",
    "Conv",
    "Cos",
    "Div",
    "Dropout",
    "Einsum",
    "Elu",
    "Equal",
    "Erf",
    "Exp",
    "Expand",
    "Flatten",
    "Floor",
    "Gather",
    "GatherElements",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "Greater",
    "GreaterOrEqual",
    "HardSigmoid",
    "HardSwish",
    "Identity",
    "LayerNormalization",
    "LeakyRelu",
    "Less",
    "LessOrEqual",
    "Log",
    "LogSoftmax",
    "MatMul",
    "Max",
    "MaxPool",
    "Min",
    "Mul",
    "Neg",
    "Not",
    "Or",
    "Pad",
    "Pow",
    "Range",
    "Reciprocal",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "Relu",
    "Reshape",
    "Resize",
    "Shape",
    "Sigmoid",
    "Sign",
    "Sin",
    "Size",
    "Slice",
    "Softmax",
    "Softplus",
    "Split",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Sum",
    "Tanh",
    "Tile",
    "Transpose",
    "Unsqueeze",
    "Where",
];

/// Results known from the inputs' shapes alone, or from the attributes: `Shape`, `Size`,
/// `Constant`.
pub(crate) fn known_result(node: &NodeProto, ins: &[Option<Value>], _opset: i64) -> Result<Option<Vec<Value>>> {
    let dims = |v: &Value| -> Vec<usize> {
        match v {
            Value::Known(h) => h.shape().dims().to_vec(),
            Value::Node(t) => t.dims().to_vec(),
        }
    };
    let a = Attrs(node);
    let ints = |v: Vec<f64>| -> Result<Value> {
        let n = v.len();
        Ok(Value::Known(HostTensor::from_f64(DType::I32, vec![n], &v).map_err(|e| node_err(node, e.to_string()))?))
    };
    Ok(Some(match node.op_type.as_str() {
        "Shape" => {
            let d = dims(input(node, ins, 0)?);
            let r = d.len() as i64;
            let clamp = |x: i64| (if x < 0 { x + r } else { x }).clamp(0, r) as usize;
            let (start, end) = (clamp(a.int("start", 0)), clamp(a.int("end", r)));
            vec![ints(d[start..end.max(start)].iter().map(|&x| x as f64).collect())?]
        }
        "Size" => {
            let n: usize = dims(input(node, ins, 0)?).iter().product();
            let t = HostTensor::from_f64(DType::I32, Vec::<usize>::new(), &[n as f64]);
            vec![Value::Known(t.map_err(|e| node_err(node, e.to_string()))?)]
        }
        "Constant" => {
            let t = if let Some(t) = a.get("value").and_then(|v| v.t.as_ref()) {
                host_tensor(t, None)?
            } else if let Some(v) = a.get("value_float") {
                HostTensor::new(Vec::<usize>::new(), vec![v.f]).map_err(|e| node_err(node, e.to_string()))?
            } else if let Some(v) = a.get("value_floats") {
                HostTensor::new(vec![v.floats.len()], v.floats.clone()).map_err(|e| node_err(node, e.to_string()))?
            } else if let Some(v) = a.get("value_int") {
                HostTensor::from_f64(DType::I32, Vec::<usize>::new(), &[v.i as f64])
                    .map_err(|e| node_err(node, e.to_string()))?
            } else if let Some(v) = a.get("value_ints") {
                return Ok(Some(vec![ints(v.ints.iter().map(|&x| x as f64).collect())?]));
            } else {
                return Err(node_err(node, "no value attribute this importer reads"));
            };
            vec![Value::Known(t)]
        }
        _ => return Ok(None),
    }))
}

/// Records `node` applied to `ins` into `b`; its outputs in order.
pub fn apply(b: &GraphBuilder, node: &NodeProto, ins: &[Option<Value>], opset: i64) -> Result<Vec<Tensor>> {
    let ir = |e: IrError| node_err(node, e.to_string());
    let a = Attrs(node);
    let x = |i: usize| -> Result<Tensor> { tensor(b, input(node, ins, i)?).map_err(ir) };
    let opt = |i: usize| -> Result<Option<Tensor>> {
        ins.get(i).and_then(Option::as_ref).map(|v| tensor(b, v).map_err(ir)).transpose()
    };
    let one = |t: std::result::Result<Tensor, IrError>| t.map(|t| vec![t]).map_err(ir);
    let op = node.op_type.as_str();
    match op {
        "Identity" => Ok(vec![x(0)?]),
        "Dropout" => {
            // Inference, or training at ratio 0: the identity, and a mask of every element
            // kept. (Inputs 1 and 2, the ratio and training_mode, must be known at import.)
            let known = |i: usize, default: f64| -> Result<f64> {
                match ins.get(i).and_then(Option::as_ref) {
                    None => Ok(default),
                    Some(Value::Known(h)) => Ok(h.to_f64().first().copied().unwrap_or(default)),
                    Some(Value::Node(_)) => Err(node_err(node, format!("input {i} must be known at import"))),
                }
            };
            if known(2, 0.0)? != 0.0 && known(1, 0.5)? != 0.0 {
                return Err(node_err(node, "training_mode at a ratio other than 0 (random dropout) is not supported"));
            }
            let t = x(0)?;
            let mask = b.full(DType::Bool, t.dims().to_vec(), 1.0).map_err(ir)?;
            Ok(vec![t, mask])
        }
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Equal" | "Less" | "LessOrEqual" | "Greater" | "GreaterOrEqual"
        | "And" | "Or" => {
            let (l, mut r) = (x(0)?, x(1)?);
            if op == "Pow" && l.dtype().is_int() {
                // Integer powers through f32, rounded back.
                let (lf, rf) = (l.cast(DType::F32).map_err(ir)?, r.cast(DType::F32).map_err(ir)?);
                let p = lf.pow(&rf).and_then(|p| p.add_scalar(0.5)).and_then(|p| p.floor()).map_err(ir)?;
                return one(p.cast(l.dtype()));
            }
            if op == "Pow" && r.dtype() != l.dtype() {
                r = r.cast(l.dtype()).map_err(ir)?;
            }
            one(match op {
                "Add" => l.add(&r),
                "Sub" => l.sub(&r),
                "Mul" => l.mul(&r),
                "Div" => l.div(&r),
                "Pow" => l.pow(&r),
                "Equal" => l.eq(&r),
                "Less" => l.lt(&r),
                "LessOrEqual" => l.le(&r),
                "Greater" => l.gt(&r),
                "GreaterOrEqual" => l.ge(&r),
                "And" => l.and(&r),
                _ => l.or(&r),
            })
        }
        "Max" | "Min" | "Sum" => {
            let mut acc = x(0)?;
            for i in 1..ins.len() {
                let r = x(i)?;
                acc = match op {
                    "Max" => acc.maximum(&r),
                    "Min" => acc.minimum(&r),
                    _ => acc.add(&r),
                }
                .map_err(ir)?;
            }
            Ok(vec![acc])
        }
        "Not" | "Neg" | "Abs" | "Exp" | "Log" | "Sqrt" | "Reciprocal" | "Tanh" | "Sigmoid" | "Erf" | "Sin" | "Cos"
        | "Floor" | "Ceil" | "Sign" | "Relu" => {
            let t = x(0)?;
            one(match op {
                "Not" => t.not(),
                "Neg" => t.neg(),
                "Abs" => t.abs(),
                "Exp" => t.exp(),
                "Log" => t.log(),
                "Sqrt" => t.sqrt(),
                "Reciprocal" => t.recip(),
                "Tanh" => t.tanh(),
                "Sigmoid" => t.sigmoid(),
                "Erf" => t.erf(),
                "Sin" => t.sin(),
                "Cos" => t.cos(),
                "Floor" => t.floor(),
                "Ceil" => t.ceil(),
                "Sign" => t.sign(),
                _ => t.relu(),
            })
        }
        "LeakyRelu" => {
            let t = x(0)?;
            let alpha = a.float("alpha", 0.01);
            one(t.ge(&t.full_like(0.0).map_err(ir)?).and_then(|p| p.select(&t, &t.mul_scalar(alpha)?)))
        }
        "Elu" => {
            let t = x(0)?;
            let alpha = a.float("alpha", 1.0);
            let neg = t.exp().and_then(|e| e.add_scalar(-1.0)).and_then(|e| e.mul_scalar(alpha)).map_err(ir)?;
            one(t.gt(&t.full_like(0.0).map_err(ir)?).and_then(|p| p.select(&t, &neg)))
        }
        "HardSigmoid" | "HardSwish" => {
            let t = x(0)?;
            let (alpha, beta) =
                if op == "HardSwish" { (1.0 / 6.0, 0.5) } else { (a.float("alpha", 0.2), a.float("beta", 0.5)) };
            let hs = t
                .mul_scalar(alpha)
                .and_then(|v| v.add_scalar(beta))
                .and_then(|v| v.maximum(&v.full_like(0.0)?))
                .and_then(|v| v.minimum(&v.full_like(1.0)?))
                .map_err(ir)?;
            one(if op == "HardSwish" { t.mul(&hs) } else { Ok(hs) })
        }
        "Softplus" => one(x(0)?.exp().and_then(|e| e.add_scalar(1.0)).and_then(|e| e.log())),
        "Gelu" => {
            let t = x(0)?;
            one(match a.string("approximate", "none").as_str() {
                "tanh" => t.gelu_tanh(),
                _ => t.gelu(),
            })
        }
        "Clip" => {
            let mut t = x(0)?;
            if let Some(lo) = opt(1)? {
                t = t.maximum(&lo).map_err(ir)?;
            }
            if let Some(hi) = opt(2)? {
                t = t.minimum(&hi).map_err(ir)?;
            }
            Ok(vec![t])
        }
        "Where" => one(x(0)?.select(&x(1)?, &x(2)?)),
        "Cast" => {
            let to = a.int("to", 0) as i32;
            let dtype = crate::dtype_of(to).ok_or_else(|| node_err(node, format!("to element type {to}")))?;
            one(x(0)?.cast(dtype))
        }
        "MatMul" => {
            let (l, r) = (x(0)?, x(1)?);
            let (lv, rv) = (l.rank() == 1, r.rank() == 1);
            let l = if lv { l.reshape([1, l.dims()[0]]).map_err(ir)? } else { l };
            let r = if rv { r.reshape([r.dims()[0], 1]).map_err(ir)? } else { r };
            let y = l.matmul(&r).map_err(ir)?;
            // A vector operand's axis is removed from the result again.
            let mut d = y.dims().to_vec();
            if rv {
                d.pop();
            }
            if lv {
                d.remove(d.len() - if rv { 1 } else { 2 });
            }
            one(y.reshape(d))
        }
        "Gemm" => {
            let (mut l, mut r) = (x(0)?, x(1)?);
            if a.int("transA", 0) != 0 {
                l = l.t().map_err(ir)?;
            }
            if a.int("transB", 0) != 0 {
                r = r.t().map_err(ir)?;
            }
            let mut y = l.matmul(&r).map_err(ir)?;
            let alpha = a.float("alpha", 1.0);
            if alpha != 1.0 {
                y = y.mul_scalar(alpha).map_err(ir)?;
            }
            if let Some(c) = opt(2)? {
                let beta = a.float("beta", 1.0);
                let c = if beta != 1.0 { c.mul_scalar(beta).map_err(ir)? } else { c };
                y = y.add(&c).map_err(ir)?;
            }
            Ok(vec![y])
        }
        "Conv" => conv(node, x(0)?, x(1)?, opt(2)?),
        "BatchNormalization" => {
            let (t, eps) = (x(0)?, a.float("epsilon", 1e-5));
            if a.int("training_mode", 0) == 0 {
                return one(t.batch_norm(&x(3)?, &x(4)?, &x(1)?, &x(2)?, eps, 1));
            }
            // Training: normalized by the batch's statistics (over every axis but the
            // channels; the variance biased), and the running ones updated by `momentum`.
            let over: Vec<usize> = (0..t.rank()).filter(|&q| q != 1).collect();
            let (mean, var) = (t.mean(&over, false).map_err(ir)?, t.variance(&over, false).map_err(ir)?);
            let y = t.batch_norm(&mean, &var, &x(1)?, &x(2)?, eps, 1).map_err(ir)?;
            let m = a.float("momentum", 0.9);
            let running = |old: Tensor, now: &Tensor| -> std::result::Result<Tensor, IrError> {
                old.mul_scalar(m)?.add(&now.mul_scalar(1.0 - m)?)
            };
            Ok(vec![y, running(x(3)?, &mean).map_err(ir)?, running(x(4)?, &var).map_err(ir)?])
        }
        "LayerNormalization" => {
            let t = x(0)?;
            let r = t.rank();
            let from = axis(node, a.int("axis", -1), r)?;
            let over: Vec<usize> = (from..r).collect();
            let eps = a.float("epsilon", 1e-5);
            let mut y = t.layer_norm(&over, eps).map_err(ir)?;
            y = y.mul(&x(1)?).map_err(ir)?;
            if let Some(bias) = opt(2)? {
                y = y.add(&bias).map_err(ir)?;
            }
            // The optional outputs: the mean and the reciprocal standard deviation, kept
            // along the normalized axes.
            let mean = t.mean(&over, true).map_err(ir)?;
            let inv = t.variance(&over, true).and_then(|v| v.add_scalar(eps)).and_then(|v| v.rsqrt()).map_err(ir)?;
            Ok(vec![y, mean, inv])
        }
        "MaxPool" | "AveragePool" => pool(b, node, x(0)?),
        "GlobalAveragePool" | "GlobalMaxPool" => {
            let t = x(0)?;
            let spatial: Vec<usize> = (2..t.rank()).collect();
            one(if op == "GlobalMaxPool" { t.max(&spatial, true) } else { t.mean(&spatial, true) })
        }
        "Softmax" | "LogSoftmax" => {
            let t = x(0)?;
            let ax = axis(node, a.int("axis", -1), t.rank())?;
            one(if op == "Softmax" { t.softmax(ax) } else { t.log_softmax(ax) })
        }
        "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceProd" => {
            let input = x(0)?;
            // Axes are an input from opset 13 for ReduceSum and 18 for the others.
            let from_input = op == "ReduceSum" || opset >= 18;
            let given = if from_input { known_ints(node, ins, 1)? } else { a.ints("axes") };
            let keep = a.int("keepdims", 1) != 0;
            // Bools reduce as u32 (max as or, min as and; their identities false and true).
            let bools = input.dtype() == DType::Bool;
            let t = if bools { input.cast(DType::U32).map_err(ir)? } else { input.clone() };
            let back = |r: std::result::Result<Tensor, IrError>| match bools {
                true => one(r.and_then(|r| r.cast(DType::Bool))),
                false => one(r),
            };
            let list = match given {
                Some(v) if !v.is_empty() => axes(node, &v, t.rank())?,
                _ if a.int("noop_with_empty_axes", 0) != 0 => return Ok(vec![input]),
                _ => (0..t.rank()).collect(),
            };
            back(match op {
                "ReduceSum" => t.sum(&list, keep),
                "ReduceMean" => t.mean(&list, keep),
                "ReduceMax" => t.max(&list, keep),
                "ReduceMin" => t.min(&list, keep),
                _ => t.prod(&list, keep),
            })
        }
        "ArgMax" => {
            let t = x(0)?;
            let ax = axis(node, a.int("axis", 0), t.rank())?;
            let keep = a.int("keepdims", 1) != 0;
            if a.int("select_last_index", 0) == 0 {
                return one(t.argmax(ax, keep));
            }
            // The last maximum: the first of the axis reversed, counted from the end.
            let d = t.dims()[ax];
            let rev = b.constant(DType::I32, [d], &(0..d).rev().map(|i| i as f64).collect::<Vec<_>>()).map_err(ir)?;
            let first = t.gather(&rev, ax).and_then(|r| r.argmax(ax, keep)).map_err(ir)?;
            one(first.full_like((d - 1) as f64).and_then(|last| last.sub(&first)))
        }
        "Reshape" => {
            let t = x(0)?;
            let shape = known_ints(node, ins, 1)?.ok_or_else(|| node_err(node, "no shape"))?;
            let allow_zero = a.int("allowzero", 0) != 0;
            let mut dims: Vec<usize> = Vec::with_capacity(shape.len());
            let mut infer = None;
            for (i, &s) in shape.iter().enumerate() {
                match s {
                    -1 => infer = Some(i),
                    0 if !allow_zero => dims.push(*t.dims().get(i).ok_or_else(|| node_err(node, "0 past the rank"))?),
                    s if s >= 0 => dims.push(s as usize),
                    s => return Err(node_err(node, format!("dimension {s}"))),
                }
                if infer == Some(i) {
                    dims.push(1);
                }
            }
            if let Some(i) = infer {
                let known: usize = dims.iter().enumerate().filter(|&(j, _)| j != i).map(|(_, d)| d).product();
                let n = t.shape().numel();
                if known == 0 || n % known != 0 {
                    return Err(node_err(node, format!("{} elements do not fit {shape:?}", n)));
                }
                dims[i] = n / known;
            }
            one(t.reshape(dims))
        }
        "Flatten" => {
            let t = x(0)?;
            let r = t.rank();
            let at = a.int("axis", 1);
            let at = if at < 0 { at + r as i64 } else { at };
            if !(0..=r as i64).contains(&at) {
                return Err(node_err(node, format!("axis {at} for rank {r}")));
            }
            let outer: usize = t.dims()[..at as usize].iter().product();
            one(t.reshape([outer, t.shape().numel() / outer.max(1)]))
        }
        "Squeeze" | "Unsqueeze" => {
            let t = x(0)?;
            let given = known_ints(node, ins, 1)?;
            let mut dims = t.dims().to_vec();
            if op == "Squeeze" {
                let list = match given {
                    Some(v) => axes(node, &v, dims.len())?,
                    None => (0..dims.len()).filter(|&i| dims[i] == 1).collect(),
                };
                if let Some(&bad) = list.iter().find(|&&i| dims[i] != 1) {
                    return Err(node_err(node, format!("axis {bad} has size {}", dims[bad])));
                }
                for &i in list.iter().rev() {
                    dims.remove(i);
                }
            } else {
                let v = given.ok_or_else(|| node_err(node, "no axes"))?;
                for &i in &axes(node, &v, dims.len() + v.len())? {
                    dims.insert(i, 1);
                }
            }
            one(t.reshape(dims))
        }
        "Transpose" => {
            let t = x(0)?;
            let perm: Vec<usize> = match a.ints("perm") {
                Some(p) => p.iter().map(|&v| axis(node, v, t.rank())).collect::<Result<_>>()?,
                None => (0..t.rank()).rev().collect(),
            };
            one(t.transpose(&perm))
        }
        "Concat" => {
            let parts: Vec<Tensor> = (0..ins.len()).filter(|&i| ins[i].is_some()).map(x).collect::<Result<_>>()?;
            let r = parts.first().map_or(0, Tensor::rank);
            let refs: Vec<&Tensor> = parts.iter().collect();
            one(b.concat(&refs, axis(node, a.int("axis", 0), r)?))
        }
        "Split" => {
            let t = x(0)?;
            let ax = axis(node, a.int("axis", 0), t.rank())?;
            let dim = t.dims()[ax];
            let n = node.output.len();
            let sizes = match known_ints(node, ins, 1)?.or_else(|| a.ints("split")) {
                Some(s) => s.iter().map(|&v| v as usize).collect::<Vec<_>>(),
                None => {
                    let parts = a.int("num_outputs", n as i64) as usize;
                    let each = dim.div_ceil(parts.max(1));
                    (0..parts).map(|i| each.min(dim.saturating_sub(i * each))).collect()
                }
            };
            if sizes.iter().sum::<usize>() != dim || sizes.len() != n {
                return Err(node_err(node, format!("parts {sizes:?} of {dim} for {n} outputs")));
            }
            let mut start = 0;
            let mut out = Vec::new();
            for s in sizes {
                out.push(t.narrow(ax, start, s).map_err(ir)?);
                start += s;
            }
            Ok(out)
        }
        "Slice" => {
            let t = x(0)?;
            let r = t.rank();
            let starts = known_ints(node, ins, 1)?.ok_or_else(|| node_err(node, "no starts"))?;
            let ends = known_ints(node, ins, 2)?.ok_or_else(|| node_err(node, "no ends"))?;
            let list = known_ints(node, ins, 3)?.unwrap_or_else(|| (0..starts.len() as i64).collect());
            let steps = known_ints(node, ins, 4)?.unwrap_or_else(|| vec![1; starts.len()]);
            let (mut lo, mut hi, mut st): (Vec<usize>, Vec<usize>, Vec<usize>) =
                (vec![0; r], t.dims().to_vec(), vec![1; r]);
            // Axes walked backwards (negative steps), as the indices they take.
            let mut backwards: Vec<(usize, Vec<f64>)> = Vec::new();
            for (j, &ax) in list.iter().enumerate() {
                let ax = axis(node, ax, r)?;
                let d = t.dims()[ax] as i64;
                let wrap = |v: i64| if v < 0 { v + d } else { v };
                match steps[j] {
                    0 => return Err(node_err(node, "a step of 0")),
                    s if s > 0 => {
                        lo[ax] = wrap(starts[j]).clamp(0, d) as usize;
                        hi[ax] = (wrap(ends[j]).clamp(0, d) as usize).max(lo[ax]);
                        st[ax] = s as usize;
                    }
                    s => {
                        let (first, end) = (wrap(starts[j]).clamp(0, d - 1), wrap(ends[j]).clamp(-1, d - 1));
                        let idx = (0..).map(|n| first + n * s).take_while(|&i| i > end).map(|i| i as f64).collect();
                        backwards.push((ax, idx));
                    }
                }
            }
            let mut y = t.slice(&lo, &hi, &st).map_err(ir)?;
            for (ax, idx) in backwards {
                let i = b.constant(DType::I32, [idx.len()], &idx).map_err(ir)?;
                y = y.gather(&i, ax).map_err(ir)?;
            }
            Ok(vec![y])
        }
        "Gather" => {
            let t = x(0)?;
            let ax = axis(node, a.int("axis", 0), t.rank())?;
            let dim = t.dims()[ax] as f64;
            // Negative indices count from the end.
            let idx = match input(node, ins, 1)? {
                Value::Known(h) => {
                    let v: Vec<f64> = h.to_f64().into_iter().map(|i| if i < 0.0 { i + dim } else { i }).collect();
                    b.constant(DType::I32, h.shape().clone(), &v).map_err(ir)?
                }
                Value::Node(i) => {
                    let i = i.cast(DType::I32).map_err(ir)?;
                    let neg = i.lt(&i.full_like(0.0).map_err(ir)?).map_err(ir)?;
                    neg.select(&i.add_scalar(dim).map_err(ir)?, &i).map_err(ir)?
                }
            };
            one(t.gather(&idx, ax))
        }
        "GatherElements" => {
            // Element (c₀, …, c_axis, …) of the result is the data's at the index along
            // `axis`: one gather from the flattened data at computed flat positions.
            let (t, i) = (x(0)?, x(1)?.cast(DType::I32).map_err(ir)?);
            let r = t.rank();
            let ax = axis(node, a.int("axis", 0), r)?;
            let dim = t.dims()[ax] as f64;
            let zero = i.full_like(0.0).map_err(ir)?;
            let i = i.lt(&zero).and_then(|neg| neg.select(&i.add_scalar(dim)?, &i)).map_err(ir)?;
            let strides: Vec<usize> = (0..r).map(|q| t.dims()[q + 1..].iter().product()).collect();
            let mut flat = i.mul_scalar(strides[ax] as f64).map_err(ir)?;
            for (q, &stride) in strides.iter().enumerate().filter(|&(q, _)| q != ax) {
                let coord = b.iota(DType::I32, i.dims().to_vec(), q).map_err(ir)?;
                flat = flat.add(&coord.mul_scalar(stride as f64).map_err(ir)?).map_err(ir)?;
            }
            one(t.reshape([t.shape().numel()]).and_then(|d| d.gather(&flat, 0)))
        }
        "Resize" => resize(b, node, x(0)?, ins),
        "Einsum" => {
            let operands = (0..ins.len()).map(x).collect::<Result<Vec<_>>>()?;
            Ok(vec![crate::einsum::einsum(node, &a.string("equation", ""), operands)?])
        }
        "Expand" => {
            let t = x(0)?;
            let shape = known_ints(node, ins, 1)?.ok_or_else(|| node_err(node, "no shape"))?;
            // Numpy broadcasting of the two shapes (a 1 in `shape` keeps the input's size).
            let r = shape.len().max(t.rank());
            let pad =
                |d: &[i64]| -> Vec<i64> { std::iter::repeat_n(1, r - d.len()).chain(d.iter().copied()).collect() };
            let own: Vec<i64> = pad(&t.dims().iter().map(|&d| d as i64).collect::<Vec<_>>());
            let want = pad(&shape);
            let dims: Vec<usize> = own.iter().zip(&want).map(|(&o, &w)| if w == 1 { o } else { w } as usize).collect();
            one(t.broadcast_to(dims))
        }
        "Tile" => {
            let t = x(0)?;
            let reps = known_ints(node, ins, 1)?.ok_or_else(|| node_err(node, "no repeats"))?;
            if reps.len() != t.rank() {
                return Err(node_err(node, format!("{} repeats for rank {}", reps.len(), t.rank())));
            }
            // [d0, d1, …] as [1, d0, 1, d1, …], broadcast to [r0, d0, r1, d1, …], merged.
            let inter: Vec<usize> = t.dims().iter().flat_map(|&d| [1, d]).collect();
            let wide: Vec<usize> = t.dims().iter().zip(&reps).flat_map(|(&d, &r)| [r as usize, d]).collect();
            let out: Vec<usize> = t.dims().iter().zip(&reps).map(|(&d, &r)| d * r as usize).collect();
            one(t.reshape(inter).and_then(|v| v.broadcast_to(wide)).and_then(|v| v.reshape(out)))
        }
        "Pad" => {
            let t = x(0)?;
            let mode = a.string("mode", "constant");
            let pads = known_ints(node, ins, 1)?.ok_or_else(|| node_err(node, "no pads"))?;
            let r = t.rank();
            let list = known_ints(node, ins, 3)?.unwrap_or_else(|| (0..r as i64).collect());
            let (mut low, mut high) = (vec![0; r], vec![0; r]);
            for (j, &ax) in list.iter().enumerate() {
                let ax = axis(node, ax, r)?;
                let (l, h) = (pads[j], pads[j + list.len()]);
                if l < 0 || h < 0 {
                    return Err(node_err(node, "negative pads are not supported"));
                }
                (low[ax], high[ax]) = (l as usize, h as usize);
            }
            if mode != "constant" {
                // Edge, reflect and wrap: each padded axis gathered at the indices the mode
                // maps its positions to.
                let mut y = t;
                for ax in 0..r {
                    if low[ax] + high[ax] == 0 {
                        continue;
                    }
                    let d = y.dims()[ax] as i64;
                    let from = |i: i64| -> Option<i64> {
                        match mode.as_str() {
                            "edge" => Some(i.clamp(0, d - 1)),
                            "wrap" => Some(i.rem_euclid(d)),
                            "reflect" if d > 1 => {
                                let p = i.rem_euclid(2 * (d - 1));
                                Some(if p < d { p } else { 2 * (d - 1) - p })
                            }
                            "reflect" => Some(0),
                            _ => None,
                        }
                    };
                    let idx: Vec<f64> = (-(low[ax] as i64)..d + high[ax] as i64)
                        .map(|i| from(i).map(|v| v as f64))
                        .collect::<Option<_>>()
                        .ok_or_else(|| node_err(node, format!("mode `{mode}`")))?;
                    let i = b.constant(DType::I32, [idx.len()], &idx).map_err(ir)?;
                    y = y.gather(&i, ax).map_err(ir)?;
                }
                return Ok(vec![y]);
            }
            match ins.get(2).and_then(Option::as_ref) {
                Some(Value::Known(h)) => one(t.pad(&low, &high, h.to_f64().first().copied().unwrap_or(0.0))),
                None => one(t.pad(&low, &high, 0.0)),
                // A value known at run time: zeros padded, then the value where the mask of
                // the original elements is 0.
                Some(v @ Value::Node(_)) => {
                    let v = tensor(b, v).map_err(ir)?;
                    let inner = t.pad(&low, &high, 0.0).map_err(ir)?;
                    let kept = b
                        .full(DType::Bool, t.dims().to_vec(), 1.0)
                        .and_then(|m| m.pad(&low, &high, 0.0))
                        .map_err(ir)?;
                    one(kept.select(&inner, &v.reshape(Vec::<usize>::new()).map_err(ir)?))
                }
            }
        }
        "ConstantOfShape" => {
            let shape = known_ints(node, ins, 0)?.ok_or_else(|| node_err(node, "no shape"))?;
            let (dtype, value) = match a.get("value").and_then(|v| v.t.as_ref()) {
                Some(t) => {
                    let h = host_tensor(t, None)?;
                    (h.dtype(), h.to_f64().first().copied().unwrap_or(0.0))
                }
                None => (DType::F32, 0.0),
            };
            one(b.full(dtype, shape.iter().map(|&d| d as usize).collect::<Vec<_>>(), value))
        }
        "Range" => {
            let scalar = |i: usize| -> Result<f64> {
                match input(node, ins, i)? {
                    Value::Known(h) => Ok(h.to_f64()[0]),
                    Value::Node(_) => Err(node_err(node, format!("input {i} must be known at import"))),
                }
            };
            let (start, limit, delta) = (scalar(0)?, scalar(1)?, scalar(2)?);
            let n = if delta == 0.0 { 0.0 } else { ((limit - start) / delta).ceil().max(0.0) };
            let dtype = match input(node, ins, 0)? {
                Value::Known(h) => h.dtype(),
                Value::Node(t) => t.dtype(),
            };
            let v: Vec<f64> = (0..n as usize).map(|i| start + i as f64 * delta).collect();
            one(b.constant(dtype, [v.len()], &v))
        }
        other => Err(node_err(node, format!("`{other}` is not mapped"))),
    }
}
