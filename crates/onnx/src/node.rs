//! What every op's mapping reads from a node: its attributes with their defaults, its
//! inputs (known values where they must be static), axes counted from the end.

use crate::proto::{AttributeProto, NodeProto};
use crate::{node_name, OnnxError, Result, Value};
use fusegraph_ir::{GraphBuilder, IrError, Tensor};

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
pub(crate) struct Attrs<'a>(pub(crate) &'a NodeProto);

impl Attrs<'_> {
    pub(crate) fn get(&self, name: &str) -> Option<&AttributeProto> {
        self.0.attribute.iter().find(|a| a.name == name)
    }
    pub(crate) fn int(&self, name: &str, default: i64) -> i64 {
        self.get(name).map_or(default, |a| a.i)
    }
    pub(crate) fn float(&self, name: &str, default: f64) -> f64 {
        self.get(name).map_or(default, |a| a.f as f64)
    }
    pub(crate) fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.get(name).map(|a| a.ints.clone())
    }
    pub(crate) fn string(&self, name: &str, default: &str) -> String {
        self.get(name).map_or(default.to_string(), |a| String::from_utf8_lossy(&a.s).into_owned())
    }
}

pub(crate) fn input<'a>(node: &NodeProto, ins: &'a [Option<Value>], i: usize) -> Result<&'a Value> {
    ins.get(i).and_then(Option::as_ref).ok_or_else(|| node_err(node, format!("input {i} is missing")))
}

/// The known integer values of input `i` (`None` where the input is absent).
pub(crate) fn known_ints(node: &NodeProto, ins: &[Option<Value>], i: usize) -> Result<Option<Vec<i64>>> {
    match ins.get(i).and_then(Option::as_ref) {
        None => Ok(None),
        Some(Value::Known(h)) => Ok(Some(h.to_f64().into_iter().map(|v| v as i64).collect())),
        Some(Value::Node(_)) => {
            Err(node_err(node, format!("input {i} is computed at run time; it must be known at import")))
        }
    }
}

/// `a` (possibly negative) as an axis of a rank-`r` tensor.
pub(crate) fn axis(node: &NodeProto, a: i64, r: usize) -> Result<usize> {
    let x = if a < 0 { a + r as i64 } else { a };
    if x < 0 || x >= r as i64 {
        return Err(node_err(node, format!("axis {a} out of range for rank {r}")));
    }
    Ok(x as usize)
}

pub(crate) fn axes(node: &NodeProto, v: &[i64], r: usize) -> Result<Vec<usize>> {
    let mut out: Vec<usize> = v.iter().map(|&a| axis(node, a, r)).collect::<Result<_>>()?;
    out.sort_unstable();
    out.dedup();
    Ok(out)
}
