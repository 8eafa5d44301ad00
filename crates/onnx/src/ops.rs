//! Each ONNX op as IR ops (`apply`), following the operator specification of the opsets
//! read (13–21): attributes with their defaults, negative axes counted from the end,
//! multidirectional broadcasting (the IR's binary ops broadcast as numpy does), and the
//! inputs that must be known at import (shapes, axes, pads, slice bounds) read from their
//! values.

use crate::proto::{AttributeProto, NodeProto};
use crate::{host_tensor, node_name, OnnxError, Result, Value};
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

pub(crate) fn node_err(node: &NodeProto, detail: impl Into<String>) -> OnnxError {
    OnnxError::Node { node: node_name(node), op: node.op_type.clone(), detail: detail.into() }
}

/// A value as a node of `b`: a known value recorded as a constant.
pub fn tensor(b: &GraphBuilder, v: &Value) -> std::result::Result<Tensor, IrError> {
    match v {
        Value::Node(t) => Ok(t.clone()),
        Value::Known(h) => b.constant(h.dtype(), h.shape().clone(), &h.to_f64()),
    }
}

/// The node's attributes.
struct Attrs<'a>(&'a NodeProto);

impl Attrs<'_> {
    fn get(&self, name: &str) -> Option<&AttributeProto> {
        self.0.attribute.iter().find(|a| a.name == name)
    }
    fn int(&self, name: &str, default: i64) -> i64 {
        self.get(name).map_or(default, |a| a.i)
    }
    fn float(&self, name: &str, default: f64) -> f64 {
        self.get(name).map_or(default, |a| a.f as f64)
    }
    fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.get(name).map(|a| a.ints.clone())
    }
    fn string(&self, name: &str, default: &str) -> String {
        self.get(name).map_or(default.to_string(), |a| String::from_utf8_lossy(&a.s).into_owned())
    }
}

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

fn input<'a>(node: &NodeProto, ins: &'a [Option<Value>], i: usize) -> Result<&'a Value> {
    ins.get(i).and_then(Option::as_ref).ok_or_else(|| node_err(node, format!("input {i} is missing")))
}

/// The known integer values of input `i` (`None` where the input is absent).
fn known_ints(node: &NodeProto, ins: &[Option<Value>], i: usize) -> Result<Option<Vec<i64>>> {
    match ins.get(i).and_then(Option::as_ref) {
        None => Ok(None),
        Some(Value::Known(h)) => Ok(Some(h.to_f64().into_iter().map(|v| v as i64).collect())),
        Some(Value::Node(_)) => {
            Err(node_err(node, format!("input {i} is computed at run time; it must be known at import")))
        }
    }
}

/// `a` (possibly negative) as an axis of a rank-`r` tensor.
fn axis(node: &NodeProto, a: i64, r: usize) -> Result<usize> {
    let x = if a < 0 { a + r as i64 } else { a };
    if x < 0 || x >= r as i64 {
        return Err(node_err(node, format!("axis {a} out of range for rank {r}")));
    }
    Ok(x as usize)
}

fn axes(node: &NodeProto, v: &[i64], r: usize) -> Result<Vec<usize>> {
    let mut out: Vec<usize> = v.iter().map(|&a| axis(node, a, r)).collect::<Result<_>>()?;
    out.sort_unstable();
    out.dedup();
    Ok(out)
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
            // Inference: the identity, and a mask of every element kept.
            if let Some(Value::Known(h)) = ins.get(2).and_then(Option::as_ref) {
                if h.to_f64().first().is_some_and(|&v| v != 0.0) {
                    return Err(node_err(node, "training_mode (random dropout) is not supported"));
                }
            } else if ins.get(2).and_then(Option::as_ref).is_some() {
                return Err(node_err(node, "training_mode computed at run time"));
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
        "Conv" => conv(b, node, x(0)?, x(1)?, opt(2)?),
        "BatchNormalization" => {
            let t = x(0)?;
            one(t.batch_norm(&x(3)?, &x(4)?, &x(1)?, &x(2)?, a.float("epsilon", 1e-5), 1))
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
            let t = x(0)?;
            // Axes are an input from opset 13 for ReduceSum and 18 for the others.
            let from_input = op == "ReduceSum" || opset >= 18;
            let given = if from_input { known_ints(node, ins, 1)? } else { a.ints("axes") };
            let keep = a.int("keepdims", 1) != 0;
            // Bools reduce as u32 (max as or, min as and; their identities false and true).
            let t = if t.dtype() == DType::Bool { t.cast(DType::U32).map_err(ir)? } else { t };
            let back = |r: std::result::Result<Tensor, IrError>| match x(0)?.dtype() {
                DType::Bool => one(r.and_then(|r| r.cast(DType::Bool))),
                _ => one(r),
            };
            let list = match given {
                Some(v) if !v.is_empty() => axes(node, &v, t.rank())?,
                _ if a.int("noop_with_empty_axes", 0) != 0 => return Ok(vec![x(0)?]),
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

/// `Conv` (2-D, or 1-D as 2-D with a unit height): groups, strides, dilations, pads
/// (asymmetric ones as an explicit pad) or `auto_pad`, and the bias.
fn conv(b: &GraphBuilder, node: &NodeProto, x: Tensor, w: Tensor, bias: Option<Tensor>) -> Result<Vec<Tensor>> {
    let ir = |e: IrError| node_err(node, e.to_string());
    let _ = b;
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

/// The pads `[top, left, bottom, right]` of a window op: `pads`, or as `auto_pad` says.
fn window_pads(
    node: &NodeProto,
    a: &Attrs<'_>,
    x: &Tensor,
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    one_d: bool,
) -> Result<[usize; 4]> {
    match a.string("auto_pad", "NOTSET").as_str() {
        "NOTSET" => {
            let p: Vec<usize> = a.ints("pads").unwrap_or_default().iter().map(|&v| v as usize).collect();
            Ok(match (p.len(), one_d) {
                (0, _) => [0; 4],
                (2, true) => [0, p[0], 0, p[1]],
                (4, false) => [p[0], p[1], p[2], p[3]],
                (n, _) => return Err(node_err(node, format!("{n} pads"))),
            })
        }
        "VALID" => Ok([0; 4]),
        mode @ ("SAME_UPPER" | "SAME_LOWER") => {
            let mut out = [0; 4];
            for s in 0..2 {
                let d = x.dims()[2 + s];
                let want = d.div_ceil(stride[s]);
                let span = (kernel[s] - 1) * dilation[s] + 1;
                let total = ((want - 1) * stride[s] + span).saturating_sub(d);
                let (small, big) = (total / 2, total - total / 2);
                (out[s], out[s + 2]) = if mode == "SAME_UPPER" { (small, big) } else { (big, small) };
            }
            Ok(out)
        }
        other => Err(node_err(node, format!("auto_pad `{other}`"))),
    }
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

/// `MaxPool` and `AveragePool` (2-D; `count_include_pad` 0 divides by the window's
/// elements inside the input).
fn pool(b: &GraphBuilder, node: &NodeProto, x: Tensor) -> Result<Vec<Tensor>> {
    let ir = |e: IrError| node_err(node, e.to_string());
    let a = Attrs(node);
    // 1-D pooling as 2-D with a unit height; integers through f32 (exact below 2^24).
    if x.rank() == 3 {
        let d = x.dims().to_vec();
        let y = pool_2d(b, node, &a, x.reshape([d[0], d[1], 1, d[2]]).map_err(ir)?, true)?;
        let o = y.dims().to_vec();
        return Ok(vec![y.reshape([o[0], o[1], o[3]]).map_err(ir)?]);
    }
    if x.dtype().is_int() {
        let dtype = x.dtype();
        let y = pool_2d(b, node, &a, x.cast(DType::F32).map_err(ir)?, false)?;
        return Ok(vec![y.cast(dtype).map_err(ir)?]);
    }
    Ok(vec![pool_2d(b, node, &a, x, false)?])
}

/// [`pool`] of a rank-4 input (`one_d`: a 1-D pooling's attributes, of one spatial axis).
fn pool_2d(b: &GraphBuilder, node: &NodeProto, a: &Attrs<'_>, x: Tensor, one_d: bool) -> Result<Tensor> {
    let ir = |e: IrError| node_err(node, e.to_string());
    if x.rank() != 4 {
        return Err(node_err(node, format!("input {} (1-D and 2-D pooling are supported)", x.ty())));
    }
    if a.int("ceil_mode", 0) != 0 {
        return Err(node_err(node, "ceil_mode = 1 is not supported"));
    }
    if a.ints("dilations").is_some_and(|d| d.iter().any(|&v| v != 1)) {
        return Err(node_err(node, "dilated pooling is not supported"));
    }
    let k = a.ints("kernel_shape").ok_or_else(|| node_err(node, "no kernel_shape"))?;
    let s = a.ints("strides").unwrap_or_else(|| vec![1; k.len()]);
    let (kernel, stride) = match (k.len(), s.len(), one_d) {
        (1, 1, true) => ([1, k[0] as usize], [1, s[0] as usize]),
        (2, 2, false) => ([k[0] as usize, k[1] as usize], [s[0] as usize, s[1] as usize]),
        _ => return Err(node_err(node, format!("kernel_shape {k:?} and strides {s:?}"))),
    };
    let pads = window_pads(node, a, &x, kernel, stride, [1, 1], one_d)?;
    let max = node.op_type == "MaxPool";
    if max {
        if node.output.len() > 1 {
            return Err(node_err(node, "the Indices output is not supported"));
        }
        let (x, padding) = symmetric(node, x, pads, f64::NEG_INFINITY)?;
        return x.max_pool2d(kernel, stride, padding).map_err(ir);
    }
    let (xp, padding) = symmetric(node, x.clone(), pads, 0.0)?;
    let avg = xp.avg_pool2d(kernel, stride, padding).map_err(ir)?;
    if a.int("count_include_pad", 0) != 0 || pads == [0; 4] {
        return Ok(avg);
    }
    // The average over the padding counted as zeros, divided by the share of the window
    // inside the input: the same pooling of ones.
    let ones = b.full(x.dtype(), x.dims().to_vec(), 1.0).map_err(ir)?;
    let (op, padding) = symmetric(node, ones, pads, 0.0)?;
    let share = op.avg_pool2d(kernel, stride, padding).map_err(ir)?;
    avg.div(&share).map_err(ir)
}

/// `Resize` in `nearest` and `linear` modes (the latter separable: one axis at a time, as
/// bilinear and trilinear are): each resized axis gathered at source indices computed at
/// import from its coordinate transformation, linear as the two neighbours weighted.
fn resize(b: &GraphBuilder, node: &NodeProto, x: Tensor, ins: &[Option<Value>]) -> Result<Vec<Tensor>> {
    let ir = |e: IrError| node_err(node, e.to_string());
    let a = Attrs(node);
    let r = x.rank();
    let mode = a.string("mode", "nearest");
    if mode != "nearest" && mode != "linear" {
        return Err(node_err(node, format!("mode `{mode}` (nearest and linear are supported)")));
    }
    if a.int("antialias", 0) != 0 || a.string("keep_aspect_ratio_policy", "stretch") != "stretch" {
        return Err(node_err(node, "antialias and keep_aspect_ratio_policy other than stretch are not supported"));
    }
    let transform = a.string("coordinate_transformation_mode", "half_pixel");
    if transform == "tf_crop_and_resize" {
        return Err(node_err(node, "coordinate_transformation_mode tf_crop_and_resize is not supported"));
    }
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
    let mut y = x;
    for (j, &ax) in list.iter().enumerate() {
        let len = y.dims()[ax];
        let (out, scale) = match (&sizes, &scales) {
            (Some(s), _) => (s[j] as usize, s[j] / len as f64),
            (None, Some(s)) => ((len as f64 * s[j]).floor() as usize, s[j]),
            (None, None) => return Err(node_err(node, "neither scales nor sizes")),
        };
        if out == len && scale == 1.0 {
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
            let coords: Vec<f64> = (0..out).map(|o| source(o).clamp(0.0, last)).collect();
            let lo: Vec<f64> = coords.iter().map(|c| c.floor()).collect();
            let hi: Vec<f64> = lo.iter().map(|l| (l + 1.0).min(last)).collect();
            let w: Vec<f64> = coords.iter().zip(&lo).map(|(c, l)| c - l).collect();
            let mut shape = vec![1; r];
            shape[ax] = out;
            let w = b.constant(y.dtype(), shape, &w).map_err(ir)?;
            let (l, h) = (gather(lo)?, gather(hi)?);
            h.sub(&l).and_then(|d| d.mul(&w)).and_then(|d| l.add(&d)).map_err(ir)?
        };
    }
    Ok(vec![y])
}
