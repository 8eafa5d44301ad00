//! The reference interpreter: evaluates every fusegraph op on the CPU, the oracle that all GPU
//! tests compare against.
//!
//! Each value is held as `Vec<f64>` plus its [`TensorType`]. Every op computes in f64 and rounds
//! its result to the node's dtype ([`round_to`]); reductions, matrix products and convolutions
//! accumulate in f64 (integers: exactly, modulo 2⁶⁴) and round once at the end. Integer
//! arithmetic wraps modulo 2³², integer division follows WGSL (`x / 0 = x`,
//! `i32::MIN / -1 = i32::MIN`), and casts follow [`fusegraph_ir::Op::Cast`].
//!
//! ```
//! use fusegraph_ir::{DType, GraphBuilder, HostTensor};
//! use std::collections::BTreeMap;
//!
//! let b = GraphBuilder::new();
//! let x = b.input("x", DType::F32, [2]).unwrap();
//! let y = x.mul(&x).unwrap().add_scalar(1.0).unwrap();
//! let feeds = BTreeMap::from([("x".to_string(), HostTensor::new([2], vec![2.0f32, 3.0]).unwrap())]);
//! let out = fusegraph_reference::evaluate(&b.graph(), &[y.id()], &feeds, &BTreeMap::new()).unwrap();
//! assert_eq!(out[0].as_slice::<f32>().unwrap(), &[5.0, 10.0]);
//! ```

#![warn(missing_docs)]

mod check;
mod layout;
mod numeric;
mod reduce;
mod window;

pub use check::{assert_close, tolerance};
pub use numeric::{cast_value, erf, round_to};

use fusegraph_ir::{Graph, HostTensor, IrError, NodeId, Op, TensorType};
use std::collections::{BTreeMap, HashMap};
use thiserror::Error;

/// An error evaluating a graph.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum RefError {
    /// An input reachable from the outputs has no feed.
    #[error("input `{name}` ({expected}) was not fed")]
    MissingFeed {
        /// The input's name.
        name: String,
        /// The input node's type.
        expected: TensorType,
    },
    /// A feed's type differs from its input node's type.
    #[error("input `{name}`: expected {expected}, got {got}")]
    FeedType {
        /// The input's name.
        name: String,
        /// The input node's type.
        expected: TensorType,
        /// The fed tensor's type.
        got: TensorType,
    },
    /// A parameter reachable from the outputs has no value.
    #[error("parameter `{name}` ({expected}) has no value")]
    MissingParameter {
        /// The parameter's name.
        name: String,
        /// The parameter node's type.
        expected: TensorType,
    },
    /// A parameter value's type differs from its parameter node's type.
    #[error("parameter `{name}`: expected {expected}, got {got}")]
    ParameterType {
        /// The parameter's name.
        name: String,
        /// The parameter node's type.
        expected: TensorType,
        /// The given tensor's type.
        got: TensorType,
    },
    /// The graph failed verification, an output id is not in the graph, or a result could not
    /// be converted to a host tensor.
    #[error(transparent)]
    Ir(#[from] IrError),
}

/// A value during interpretation: row-major elements, each already rounded to `ty.dtype`.
#[derive(Clone, Debug)]
pub(crate) struct Value {
    pub(crate) ty: TensorType,
    pub(crate) data: Vec<f64>,
}

/// Evaluates `outputs` of `g` given named input feeds and parameter values.
///
/// The graph is verified first; then only the nodes the outputs depend on
/// ([`Graph::reachable`]) are evaluated, so unrelated inputs need no feed. Each fed tensor must
/// have exactly its input node's type (likewise parameters). Returns one tensor per output, in
/// order, each of its node's type.
pub fn evaluate(
    g: &Graph,
    outputs: &[NodeId],
    feeds: &BTreeMap<String, HostTensor>,
    params: &BTreeMap<String, HostTensor>,
) -> Result<Vec<HostTensor>, RefError> {
    fusegraph_ir::verify(g)?;
    let order = g.reachable(outputs)?;
    let mut values: HashMap<NodeId, Value> = HashMap::with_capacity(order.len());
    for id in order {
        let operands = g.operands(id);
        let args: Vec<&Value> = operands.iter().map(|o| &values[o]).collect();
        let node = g.node(id);
        let data = eval_node(&node.op, &node.ty, &args, feeds, params)?;
        debug_assert_eq!(data.len(), node.ty.shape.numel(), "{} produced a wrong element count", node.op.name());
        values.insert(id, Value { ty: node.ty.clone(), data });
    }
    outputs
        .iter()
        .map(|id| {
            let v = &values[id];
            Ok(HostTensor::from_f64(v.ty.dtype, v.ty.shape.clone(), &v.data)?)
        })
        .collect()
}

/// Looks up a leaf's host tensor and checks its type.
fn leaf_value(
    name: &str,
    ty: &TensorType,
    table: &BTreeMap<String, HostTensor>,
    is_param: bool,
) -> Result<Vec<f64>, RefError> {
    let (name, expected) = (name.to_string(), ty.clone());
    let Some(t) = table.get(&name) else {
        return Err(if is_param {
            RefError::MissingParameter { name, expected }
        } else {
            RefError::MissingFeed { name, expected }
        });
    };
    let got = t.ty();
    if got != expected {
        return Err(if is_param {
            RefError::ParameterType { name, expected, got }
        } else {
            RefError::FeedType { name, expected, got }
        });
    }
    Ok(t.to_f64())
}

/// Computes one node's elements from its (already evaluated) operands.
fn eval_node(
    op: &Op,
    ty: &TensorType,
    args: &[&Value],
    feeds: &BTreeMap<String, HostTensor>,
    params: &BTreeMap<String, HostTensor>,
) -> Result<Vec<f64>, RefError> {
    let dtype = ty.dtype;
    let data = match op {
        Op::Input { name } => leaf_value(name, ty, feeds, false)?,
        Op::Parameter { name } => leaf_value(name, ty, params, true)?,
        Op::Constant { values } => values.iter().map(|&v| numeric::literal(dtype, v)).collect(),
        Op::Full { value } => vec![numeric::literal(dtype, *value); ty.shape.numel()],
        Op::Iota { axis } => layout::iota(&ty.shape, *axis).into_iter().map(|v| round_to(dtype, v)).collect(),
        Op::Unary(u) => {
            let x = args[0];
            x.data.iter().map(|&v| numeric::unary(*u, x.ty.dtype, v)).collect()
        }
        Op::Binary(b) => {
            let (l, r) = (args[0], args[1]);
            l.data.iter().zip(&r.data).map(|(&a, &c)| numeric::binary(*b, l.ty.dtype, a, c)).collect()
        }
        Op::Select => {
            let (c, a, b) = (args[0], args[1], args[2]);
            c.data.iter().zip(a.data.iter().zip(&b.data)).map(|(&c, (&a, &b))| if c != 0.0 { a } else { b }).collect()
        }
        Op::Cast { to } => {
            let x = args[0];
            x.data.iter().map(|&v| cast_value(x.ty.dtype, *to, v)).collect()
        }
        Op::Broadcast { dims, .. } => layout::broadcast(args[0], ty, dims),
        Op::Reshape { .. } => args[0].data.clone(),
        Op::Transpose { perm } => layout::transpose(args[0], ty, perm),
        Op::Slice { start, stride, .. } => layout::slice(args[0], ty, start, stride),
        Op::Concat { axis } => layout::concat(args, ty, *axis),
        Op::Pad { low, value, .. } => layout::pad(args[0], ty, low, numeric::literal(dtype, *value)),
        Op::Gather { axis } => layout::gather(args[0], args[1], *axis),
        Op::DynamicUpdateSlice { axis } => layout::dynamic_update_slice(args[0], args[1], args[2], *axis),
        Op::Reduce { kind, axes, .. } => reduce::reduce(args[0], ty, *kind, axes),
        Op::ArgMax { axis, .. } => reduce::argmax(args[0], *axis),
        Op::MatMul => reduce::matmul(args[0], args[1]),
        Op::Conv2d { stride, padding, dilation, groups } => {
            window::conv2d(args[0], args[1], ty, *stride, *padding, *dilation, *groups)
        }
        Op::Pool { kind, window, stride, padding } => window::pool(args[0], ty, *kind, *window, *stride, *padding),
    };
    Ok(data)
}
