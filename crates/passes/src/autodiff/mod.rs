//! Reverse-mode automatic differentiation on the graph IR.
//!
//! [`grad`] appends the backward graph of a scalar loss to the same [`Graph`] as ordinary
//! IR, so the fusion, scheduling and memory passes see forward and backward together (a
//! backward elementwise chain fuses with the forward values it reads, and liveness frees
//! forward activations as soon as their last backward use has run).
//!
//! The walk: the nodes the loss depends on, in topological order; the seed `d loss = 1`; then
//! in reverse order each node's cotangent is pushed to its operands by the op's
//! vector-Jacobian product, and contributions to one node are summed with `add`. Only float
//! nodes that lie on a path from some `wrt` node to the loss receive cotangents, so the
//! gradient of an unrelated subgraph is never built.
//!
//! Rules, by file: `elementwise.rs` (unary, binary, select, cast), `layout.rs` (broadcast,
//! reshape, transpose, slice, concat, pad, gather, reduce) and `contraction.rs` (matmul,
//! conv2d, pool). Every op whose result is integer or bool (comparisons, `and`, `or`, `not`,
//! `argmax`, casts to integers) and every op with a zero derivative (`floor`, `ceil`, `sign`)
//! stops the gradient without an error; only an integer or bool `wrt` node is an error.
//!
//! Limits and conventions (each tested against central finite differences):
//! - ties of `max`/`min` (binary) send the whole cotangent to the first operand;
//! - ties of `reduce max/min` and of max pooling split the cotangent equally among the tied
//!   positions;
//! - `reduce prod` uses `g · prod / x`, so an operand element equal to zero gets a NaN or
//!   infinite gradient (zeros are not handled);
//! - `pow` gives the exponent a zero gradient where the base is ≤ 0 (`ln a` is undefined);
//! - `gather` builds the table gradient as a one-hot matmul (`[d_axis, n_indices]` one-hot
//!   matrix), which costs `d_axis · n_indices` elements; out-of-range indices are clamped
//!   as in the forward op.

mod contraction;
mod elementwise;
mod layout;

use fusegraph_ir::{BinaryOp, DType, Graph, IrError, NodeId, Op, ReduceKind, TensorType, UnaryOp};
use std::collections::{BTreeMap, BTreeSet};
use thiserror::Error;

/// An error of [`grad`].
#[derive(Debug, Clone, PartialEq, Error)]
pub enum GradError {
    /// A node id was not in the graph, or an emitted backward op failed its typing rule (a
    /// bug in a rule; the message names the op and the types).
    #[error(transparent)]
    Ir(#[from] IrError),
    /// The loss is not a rank-0 f32 or f16 value.
    #[error("grad: the loss %{node} is {ty}; it must be a rank-0 f32 or f16 value")]
    NotScalar {
        /// The loss node.
        node: usize,
        /// Its type.
        ty: TensorType,
    },
    /// A gradient was requested of a value that has none: a `wrt` node of integer or bool
    /// type.
    #[error("grad: %{node} ({op}) has an integer or bool type and is not differentiable")]
    NotDifferentiable {
        /// The mnemonic of the node's op.
        op: String,
        /// The node.
        node: usize,
    },
}

/// Appends to `g` the backward graph of the scalar `loss` (a rank-0 f32 or f16 node) with
/// respect to each node in `wrt` (usually parameters or inputs), and returns one gradient
/// node per `wrt` entry, each of the same type as that node. A `wrt` node the loss does not
/// depend on (or depends on only through integer values or zero-derivative ops) gets a
/// `full` of zeros; a `wrt` node listed twice gets the same gradient node twice.
///
/// Nothing of the forward graph is changed; the new nodes only read forward values. The
/// graph still verifies afterwards.
///
/// Errors: [`GradError::NotScalar`] for a loss that is not a rank-0 float,
/// [`GradError::NotDifferentiable`] for an integer or bool `wrt` node, [`GradError::Ir`]
/// for an id not in the graph.
///
/// ```
/// use fusegraph_ir::{DType, GraphBuilder};
/// let b = GraphBuilder::new();
/// let x = b.input("x", DType::F32, [3]).unwrap();
/// let loss = x.mul(&x).unwrap().sum(&[0], false).unwrap(); // Σ x²
/// let mut g = b.graph();
/// let dx = fusegraph_passes::grad(&mut g, loss.id(), &[x.id()]).unwrap()[0];
/// assert_eq!(g.ty(dx), x.ty()); // evaluates to 2·x
/// ```
pub fn grad(g: &mut Graph, loss: NodeId, wrt: &[NodeId]) -> Result<Vec<NodeId>, GradError> {
    g.check(loss)?;
    let loss_ty = g.ty(loss).clone();
    if loss_ty.shape.rank() != 0 || !loss_ty.dtype.is_float() {
        return Err(GradError::NotScalar { node: loss.index(), ty: loss_ty });
    }
    for &w in wrt {
        g.check(w)?;
        if !g.ty(w).dtype.is_float() {
            return Err(GradError::NotDifferentiable { op: g.node(w).op.name().into(), node: w.index() });
        }
    }
    let order = g.reachable(&[loss])?;
    let targets: BTreeSet<NodeId> = wrt.iter().copied().collect();
    // Float nodes on a path from a target to the loss: the only ones that get cotangents.
    let mut needed = BTreeSet::new();
    for &id in &order {
        if g.ty(id).dtype.is_float() && (targets.contains(&id) || g.operands(id).iter().any(|o| needed.contains(o))) {
            needed.insert(id);
        }
    }
    let mut e = Emit { g };
    let mut cotangent: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    if needed.contains(&loss) {
        cotangent.insert(loss, e.full(loss_ty.dtype, Vec::new(), 1.0)?);
    }
    for &id in order.iter().rev() {
        let Some(&gy) = cotangent.get(&id) else { continue };
        let op = e.g.node(id).op.clone();
        if op.is_leaf() {
            continue;
        }
        let xs = e.g.operands(id);
        let want: Vec<bool> = xs.iter().map(|x| needed.contains(x)).collect();
        if !want.contains(&true) {
            continue;
        }
        let contributions = vjp(&mut e, &op, id, &xs, &want, gy)?;
        for ((&x, c), w) in xs.iter().zip(contributions).zip(&want) {
            let Some(c) = c.filter(|_| *w) else { continue };
            debug_assert_eq!(e.g.ty(c), e.g.ty(x), "the cotangent of {x} from {} has the wrong type", op.name());
            let total = match cotangent.get(&x) {
                Some(&prev) => e.add(prev, c)?,
                None => c,
            };
            cotangent.insert(x, total);
        }
    }
    wrt.iter()
        .map(|&w| match cotangent.get(&w) {
            Some(&c) => Ok(c),
            None => Ok(e.full_like(w, 0.0)?),
        })
        .collect()
}

/// The contributions of cotangent `gy` of node `y = op(xs...)` to each operand (`None` where
/// the operand gets none or is not wanted).
fn vjp(
    e: &mut Emit<'_>,
    op: &Op,
    y: NodeId,
    xs: &[NodeId],
    want: &[bool],
    gy: NodeId,
) -> Result<Vec<Option<NodeId>>, GradError> {
    let one = |v: Result<NodeId, IrError>| v.map(|n| vec![Some(n)]).map_err(GradError::from);
    match op {
        Op::Unary(u) => Ok(vec![elementwise::unary(e, *u, xs[0], y, gy)?]),
        Op::Binary(b) => Ok(elementwise::binary(e, *b, xs, y, gy, want)?),
        Op::Select => Ok(elementwise::select(e, xs, gy, want)?),
        Op::Cast { .. } => Ok(vec![elementwise::cast(e, xs[0], gy)?]),
        Op::Broadcast { dims, .. } => one(layout::broadcast(e, xs[0], dims, gy)),
        Op::Reshape { .. } => {
            let dims = e.dims(xs[0]);
            one(e.reshape(gy, dims))
        }
        Op::Transpose { perm } => one(layout::transpose(e, perm, gy)),
        Op::Slice { start, stride, .. } => {
            let dims = e.dims(xs[0]);
            one(layout::slice(e, gy, &dims, start, stride))
        }
        Op::Concat { axis } => Ok(layout::concat(e, xs, *axis, gy, want)?),
        Op::Pad { low, .. } => one(layout::pad(e, xs[0], low, gy)),
        Op::Gather { axis } => Ok(vec![Some(layout::gather(e, xs[0], xs[1], *axis, gy)?), None]),
        Op::DynamicUpdateSlice { axis } => Ok(layout::dynamic_update_slice(e, xs, *axis, gy, want)?),
        Op::Reduce { kind, axes, .. } => one(layout::reduce(e, *kind, axes, xs[0], y, gy)),
        Op::MatMul => Ok(contraction::matmul(e, xs, gy, want)?),
        Op::Conv2d { stride, padding, dilation, groups } => {
            let geom =
                contraction::ConvGeom { stride: *stride, padding: *padding, dilation: *dilation, groups: *groups };
            Ok(contraction::conv2d(e, xs, gy, geom, want)?)
        }
        Op::Pool { kind, window, stride, padding } => {
            let geom = contraction::PoolGeom { kind: *kind, window: *window, stride: *stride, padding: *padding };
            one(contraction::pool(e, geom, xs[0], y, gy))
        }
        // Integer results never carry cotangents; leaves have no operands.
        Op::ArgMax { .. }
        | Op::Input { .. }
        | Op::Parameter { .. }
        | Op::Constant { .. }
        | Op::Full { .. }
        | Op::Iota { .. } => Ok(vec![None; xs.len()]),
    }
}

/// Emits backward ops into the graph; helpers skip nodes that would be identities.
pub(crate) struct Emit<'g> {
    pub(crate) g: &'g mut Graph,
}

type R = Result<NodeId, IrError>;

impl Emit<'_> {
    fn dims(&self, x: NodeId) -> Vec<usize> {
        self.g.ty(x).shape.0.clone()
    }

    fn dtype(&self, x: NodeId) -> DType {
        self.g.ty(x).dtype
    }

    fn op(&mut self, op: Op, args: &[NodeId]) -> R {
        self.g.add_op(op, args)
    }

    fn full(&mut self, dtype: DType, shape: Vec<usize>, value: f64) -> R {
        self.g.add_leaf(Op::Full { value }, TensorType::new(dtype, shape))
    }

    fn full_like(&mut self, x: NodeId, value: f64) -> R {
        let ty = self.g.ty(x).clone();
        self.g.add_leaf(Op::Full { value }, ty)
    }

    fn constant(&mut self, dtype: DType, shape: Vec<usize>, values: Vec<f64>) -> R {
        self.g.add_leaf(Op::Constant { values }, TensorType::new(dtype, shape))
    }

    fn iota(&mut self, dtype: DType, shape: Vec<usize>, axis: usize) -> R {
        self.g.add_leaf(Op::Iota { axis }, TensorType::new(dtype, shape))
    }

    fn unary(&mut self, u: UnaryOp, x: NodeId) -> R {
        self.op(Op::Unary(u), &[x])
    }

    fn bin(&mut self, b: BinaryOp, x: NodeId, y: NodeId) -> R {
        self.op(Op::Binary(b), &[x, y])
    }

    fn add(&mut self, x: NodeId, y: NodeId) -> R {
        self.bin(BinaryOp::Add, x, y)
    }

    fn sub(&mut self, x: NodeId, y: NodeId) -> R {
        self.bin(BinaryOp::Sub, x, y)
    }

    fn mul(&mut self, x: NodeId, y: NodeId) -> R {
        self.bin(BinaryOp::Mul, x, y)
    }

    fn div(&mut self, x: NodeId, y: NodeId) -> R {
        self.bin(BinaryOp::Div, x, y)
    }

    /// `x · c` for a literal `c`.
    fn scale(&mut self, x: NodeId, c: f64) -> R {
        let k = self.full_like(x, c)?;
        self.mul(x, k)
    }

    fn select(&mut self, cond: NodeId, a: NodeId, b: NodeId) -> R {
        self.op(Op::Select, &[cond, a, b])
    }

    fn cast(&mut self, x: NodeId, to: DType) -> R {
        if self.dtype(x) == to {
            return Ok(x);
        }
        self.op(Op::Cast { to }, &[x])
    }

    fn reshape(&mut self, x: NodeId, shape: Vec<usize>) -> R {
        if self.dims(x) == shape {
            return Ok(x);
        }
        self.op(Op::Reshape { shape }, &[x])
    }

    fn transpose(&mut self, x: NodeId, perm: Vec<usize>) -> R {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(x);
        }
        self.op(Op::Transpose { perm }, &[x])
    }

    /// Swaps the last two axes.
    fn swap_last(&mut self, x: NodeId) -> R {
        let r = self.dims(x).len();
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        self.transpose(x, perm)
    }

    fn broadcast_in_dim(&mut self, x: NodeId, shape: Vec<usize>, dims: Vec<usize>) -> R {
        if self.dims(x) == shape {
            return Ok(x); // dims must then be the identity
        }
        self.op(Op::Broadcast { shape, dims }, &[x])
    }

    fn sum(&mut self, x: NodeId, axes: Vec<usize>, keep_dims: bool) -> R {
        if axes.is_empty() {
            return Ok(x);
        }
        self.op(Op::Reduce { kind: ReduceKind::Sum, axes, keep_dims }, &[x])
    }

    fn slice(&mut self, x: NodeId, start: Vec<usize>, limit: Vec<usize>, stride: Vec<usize>) -> R {
        let d = self.dims(x);
        if start.iter().all(|&s| s == 0) && limit == d && stride.iter().all(|&s| s == 1) {
            return Ok(x);
        }
        self.op(Op::Slice { start, limit, stride }, &[x])
    }

    fn pad(&mut self, x: NodeId, low: Vec<usize>, high: Vec<usize>, value: f64) -> R {
        if low.iter().chain(&high).all(|&p| p == 0) {
            return Ok(x);
        }
        self.op(Op::Pad { low, high, value }, &[x])
    }

    fn matmul(&mut self, a: NodeId, b: NodeId) -> R {
        self.op(Op::MatMul, &[a, b])
    }
}
