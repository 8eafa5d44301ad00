//! The builder: model code records ops through [`Tensor`] handles, candle-style
//! (`x.matmul(&w)?.add(&b)?.relu()?`). Every call checks shapes and dtypes and returns a
//! `Result` whose error names the op and the types.

use crate::op::broadcast_shapes;
use crate::{BinaryOp, DType, Graph, IrError, NodeId, Op, PoolKind, ReduceKind, Result, Shape, TensorType, UnaryOp};
use std::cell::RefCell;
use std::rc::Rc;

/// Records ops into a [`Graph`]. Cheap to clone; clones share the graph.
#[derive(Clone, Debug, Default)]
pub struct GraphBuilder {
    graph: Rc<RefCell<Graph>>,
}

/// A handle to a value recorded in a [`GraphBuilder`]'s graph.
#[derive(Clone, Debug)]
pub struct Tensor {
    id: NodeId,
    ty: TensorType,
    builder: GraphBuilder,
}

impl GraphBuilder {
    /// A builder with an empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the graph recorded so far.
    pub fn graph(&self) -> Graph {
        self.graph.borrow().clone()
    }

    fn leaf(&self, op: Op, dtype: DType, shape: impl Into<Shape>) -> Result<Tensor> {
        let ty = TensorType::new(dtype, shape);
        let id = self.graph.borrow_mut().add_leaf(op, ty.clone())?;
        Ok(Tensor { id, ty, builder: self.clone() })
    }

    /// A value fed at run time under `name`.
    pub fn input(&self, name: &str, dtype: DType, shape: impl Into<Shape>) -> Result<Tensor> {
        self.leaf(Op::Input { name: name.into() }, dtype, shape)
    }

    /// A persistent device-resident value (a weight) named `name`. A name is one node: asking
    /// again for a name this graph has returns its node, which must have the type asked for
    /// ([`IrError::Type`] otherwise).
    pub fn parameter(&self, name: &str, dtype: DType, shape: impl Into<Shape>) -> Result<Tensor> {
        let ty = TensorType::new(dtype, shape);
        let existing = {
            let g = self.graph.borrow();
            g.node_ids().into_iter().find(|&id| matches!(&g.node(id).op, Op::Parameter { name: n } if n == name))
        };
        match existing {
            Some(id) => {
                let t = self.tensor(id)?;
                if t.ty != ty {
                    return Err(IrError::Type {
                        op: "parameter".into(),
                        detail: format!("`{name}` is {} in this graph; asked for {ty}", t.ty),
                    });
                }
                Ok(t)
            }
            None => self.leaf(Op::Parameter { name: name.into() }, ty.dtype, ty.shape),
        }
    }

    /// Literal data, row-major.
    pub fn constant(&self, dtype: DType, shape: impl Into<Shape>, values: &[f64]) -> Result<Tensor> {
        self.leaf(Op::Constant { values: values.to_vec() }, dtype, shape)
    }

    /// A tensor whose every element is `value`.
    pub fn full(&self, dtype: DType, shape: impl Into<Shape>, value: f64) -> Result<Tensor> {
        self.leaf(Op::Full { value }, dtype, shape)
    }

    /// A rank-0 tensor holding `value`.
    pub fn scalar(&self, dtype: DType, value: f64) -> Result<Tensor> {
        self.full(dtype, Shape::scalar(), value)
    }

    /// A tensor whose elements count along `axis`.
    pub fn iota(&self, dtype: DType, shape: impl Into<Shape>, axis: usize) -> Result<Tensor> {
        self.leaf(Op::Iota { axis }, dtype, shape)
    }

    /// Runs `f` on the graph being recorded, for passes that append to it (autodiff).
    /// Existing handles stay valid: passes may add nodes but must not remove any.
    pub fn edit<R>(&self, f: impl FnOnce(&mut Graph) -> R) -> R {
        f(&mut self.graph.borrow_mut())
    }

    /// A handle to an existing node of this builder's graph.
    pub fn tensor(&self, id: NodeId) -> Result<Tensor> {
        let g = self.graph.borrow();
        g.check(id)?;
        Ok(Tensor { id, ty: g.ty(id).clone(), builder: self.clone() })
    }

    /// Joins tensors along `axis`.
    pub fn concat(&self, parts: &[&Tensor], axis: usize) -> Result<Tensor> {
        let ids: Vec<NodeId> = parts.iter().map(|t| t.id).collect();
        if parts.iter().any(|t| !Rc::ptr_eq(&t.builder.graph, &self.graph)) {
            return Err(IrError::ForeignTensor { op: "concat".into() });
        }
        self.op(Op::Concat { axis }, &ids)
    }

    fn op(&self, op: Op, operands: &[NodeId]) -> Result<Tensor> {
        let id = self.graph.borrow_mut().add_op(op, operands)?;
        let ty = self.graph.borrow().ty(id).clone();
        Ok(Tensor { id, ty, builder: self.clone() })
    }
}

impl Tensor {
    /// The node this handle names.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The value's type.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// The value's shape.
    pub fn shape(&self) -> &Shape {
        &self.ty.shape
    }

    /// The dims of the shape.
    pub fn dims(&self) -> &[usize] {
        &self.ty.shape.0
    }

    /// The value's dtype.
    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.ty.shape.rank()
    }

    /// The builder that recorded this value.
    pub fn builder(&self) -> &GraphBuilder {
        &self.builder
    }

    /// Names the node (shown in the text form and DOT).
    pub fn named(self, name: &str) -> Self {
        self.builder.graph.borrow_mut().set_name(self.id, name);
        self
    }

    pub(crate) fn op(&self, op: Op, others: &[&Tensor]) -> Result<Tensor> {
        if others.iter().any(|t| !Rc::ptr_eq(&t.builder.graph, &self.builder.graph)) {
            return Err(IrError::ForeignTensor { op: op.name().into() });
        }
        let mut ids = vec![self.id];
        ids.extend(others.iter().map(|t| t.id));
        self.builder.op(op, &ids)
    }

    // ---- elementwise ----

    /// `op(self)` elementwise.
    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        self.op(Op::Unary(op), &[])
    }

    /// `op(self, rhs)` elementwise, broadcasting both NumPy-style with explicit broadcast nodes.
    pub fn binary(&self, op: BinaryOp, rhs: &Tensor) -> Result<Tensor> {
        let (l, r) = self.broadcast_pair(rhs, op.name())?;
        l.op(Op::Binary(op), &[&r])
    }

    fn broadcast_pair(&self, rhs: &Tensor, op: &str) -> Result<(Tensor, Tensor)> {
        if self.shape() == rhs.shape() {
            return Ok((self.clone(), rhs.clone()));
        }
        let shape = broadcast_shapes(self.dims(), rhs.dims())
            .ok_or_else(|| IrError::ty(op, format!("lhs {} and rhs {}: shapes do not broadcast", self.ty, rhs.ty)))?;
        Ok((self.broadcast_to(shape.clone())?, rhs.broadcast_to(shape)?))
    }

    /// A scalar of this tensor's dtype, broadcast to its shape.
    pub fn full_like(&self, value: f64) -> Result<Tensor> {
        self.builder.full(self.dtype(), self.shape().clone(), value)
    }

    pub(crate) fn scalar_like(&self, value: f64) -> Result<Tensor> {
        self.builder.scalar(self.dtype(), value)
    }

    /// Negation.
    pub fn neg(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Neg)
    }
    /// Absolute value.
    pub fn abs(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Abs)
    }
    /// `e^x`.
    pub fn exp(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Exp)
    }
    /// Natural log.
    pub fn log(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Log)
    }
    /// Square root.
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sqrt)
    }
    /// `1/sqrt(x)`.
    pub fn rsqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Rsqrt)
    }
    /// `1/x`.
    pub fn recip(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Recip)
    }
    /// Hyperbolic tangent.
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Tanh)
    }
    /// Logistic sigmoid.
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sigmoid)
    }
    /// Error function.
    pub fn erf(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Erf)
    }
    /// Sine.
    pub fn sin(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sin)
    }
    /// Cosine.
    pub fn cos(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Cos)
    }
    /// Floor.
    pub fn floor(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Floor)
    }
    /// Ceiling.
    pub fn ceil(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Ceil)
    }
    /// Sign (−1, 0, 1).
    pub fn sign(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sign)
    }
    /// Logical not.
    pub fn not(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Not)
    }

    /// `self + rhs` (broadcasting).
    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Add, rhs)
    }
    /// `self - rhs` (broadcasting).
    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Sub, rhs)
    }
    /// `self * rhs` (broadcasting).
    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Mul, rhs)
    }
    /// `self / rhs` (broadcasting).
    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Div, rhs)
    }
    /// `self ^ rhs` (broadcasting).
    pub fn pow(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Pow, rhs)
    }
    /// Elementwise maximum (broadcasting).
    pub fn maximum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Max, rhs)
    }
    /// Elementwise minimum (broadcasting).
    pub fn minimum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Min, rhs)
    }
    /// `self == rhs` → bool (broadcasting).
    pub fn eq(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Eq, rhs)
    }
    /// `self != rhs` → bool (broadcasting).
    pub fn ne(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Ne, rhs)
    }
    /// `self < rhs` → bool (broadcasting).
    pub fn lt(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Lt, rhs)
    }
    /// `self <= rhs` → bool (broadcasting).
    pub fn le(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Le, rhs)
    }
    /// `self > rhs` → bool (broadcasting).
    pub fn gt(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Gt, rhs)
    }
    /// `self >= rhs` → bool (broadcasting).
    pub fn ge(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Ge, rhs)
    }
    /// Logical and (broadcasting).
    pub fn and(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::And, rhs)
    }
    /// Logical or (broadcasting).
    pub fn or(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Or, rhs)
    }

    /// `self + value`.
    pub fn add_scalar(&self, value: f64) -> Result<Tensor> {
        self.add(&self.scalar_like(value)?)
    }
    /// `self * value`.
    pub fn mul_scalar(&self, value: f64) -> Result<Tensor> {
        self.mul(&self.scalar_like(value)?)
    }

    /// `self ? on_true : on_false` elementwise, `self` bool; all three broadcast together.
    pub fn select(&self, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        let shape = broadcast_shapes(self.dims(), on_true.dims())
            .and_then(|s| broadcast_shapes(&s, on_false.dims()))
            .ok_or_else(|| {
            IrError::ty(
                "select",
                format!(
                    "condition {}, on_true {} and on_false {}: shapes do not broadcast",
                    self.ty, on_true.ty, on_false.ty
                ),
            )
        })?;
        let c = self.broadcast_to(shape.clone())?;
        let (t, f) = (on_true.broadcast_to(shape.clone())?, on_false.broadcast_to(shape)?);
        c.op(Op::Select, &[&t, &f])
    }

    /// Converts to `dtype` (a no-op node is not recorded when the dtype already matches).
    pub fn cast(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        self.op(Op::Cast { to: dtype }, &[])
    }

    // ---- layout ----

    /// Broadcasts NumPy-style (aligned from the right) to `shape`; no node if already there.
    pub fn broadcast_to(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if &shape == self.shape() {
            return Ok(self.clone());
        }
        if shape.rank() < self.rank() {
            return Err(IrError::ty(
                "broadcast",
                format!("operand {} cannot broadcast to lower rank {shape}", self.ty),
            ));
        }
        let offset = shape.rank() - self.rank();
        self.broadcast_in_dim(shape.0.clone(), (offset..shape.rank()).collect())
    }

    /// XLA's `broadcast_in_dim`: operand axis `i` becomes result axis `dims[i]`.
    pub fn broadcast_in_dim(&self, shape: Vec<usize>, dims: Vec<usize>) -> Result<Tensor> {
        self.op(Op::Broadcast { shape, dims }, &[])
    }

    /// Same elements in a new shape.
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if &shape == self.shape() {
            return Ok(self.clone());
        }
        self.op(Op::Reshape { shape: shape.0 }, &[])
    }

    /// Permutes axes: result axis `i` is axis `perm[i]`.
    pub fn transpose(&self, perm: &[usize]) -> Result<Tensor> {
        self.op(Op::Transpose { perm: perm.to_vec() }, &[])
    }

    /// Swaps the last two axes.
    pub fn t(&self) -> Result<Tensor> {
        let r = self.rank();
        if r < 2 {
            return Err(IrError::ty("transpose", format!("operand {}: t() needs rank ≥ 2", self.ty)));
        }
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        self.transpose(&perm)
    }

    /// Strided slice.
    pub fn slice(&self, start: &[usize], limit: &[usize], stride: &[usize]) -> Result<Tensor> {
        self.op(Op::Slice { start: start.to_vec(), limit: limit.to_vec(), stride: stride.to_vec() }, &[])
    }

    /// Elements `start..start+len` of `axis`.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Tensor> {
        if axis >= self.rank() {
            return Err(IrError::ty("slice", format!("axis {axis} out of range for {}", self.ty)));
        }
        let mut s = vec![0; self.rank()];
        let mut l = self.dims().to_vec();
        s[axis] = start;
        l[axis] = start.saturating_add(len);
        self.slice(&s, &l, &vec![1; self.rank()])
    }

    /// Pads with `value`.
    pub fn pad(&self, low: &[usize], high: &[usize], value: f64) -> Result<Tensor> {
        self.op(Op::Pad { low: low.to_vec(), high: high.to_vec(), value }, &[])
    }

    /// Embedding lookup: rows of `self` along `axis` selected by `indices`.
    pub fn gather(&self, indices: &Tensor, axis: usize) -> Result<Tensor> {
        self.op(Op::Gather { axis }, &[indices])
    }

    // ---- reductions ----

    /// Reduces over `axes` with `kind`.
    pub fn reduce(&self, kind: ReduceKind, axes: &[usize], keep_dims: bool) -> Result<Tensor> {
        let mut axes = axes.to_vec();
        axes.sort_unstable();
        self.op(Op::Reduce { kind, axes, keep_dims }, &[])
    }
    /// Sum over `axes`.
    pub fn sum(&self, axes: &[usize], keep_dims: bool) -> Result<Tensor> {
        self.reduce(ReduceKind::Sum, axes, keep_dims)
    }
    /// Maximum over `axes`.
    pub fn max(&self, axes: &[usize], keep_dims: bool) -> Result<Tensor> {
        self.reduce(ReduceKind::Max, axes, keep_dims)
    }
    /// Minimum over `axes`.
    pub fn min(&self, axes: &[usize], keep_dims: bool) -> Result<Tensor> {
        self.reduce(ReduceKind::Min, axes, keep_dims)
    }
    /// Product over `axes`.
    pub fn prod(&self, axes: &[usize], keep_dims: bool) -> Result<Tensor> {
        self.reduce(ReduceKind::Prod, axes, keep_dims)
    }
    /// Index of the maximum along `axis` (i32).
    pub fn argmax(&self, axis: usize, keep_dims: bool) -> Result<Tensor> {
        self.op(Op::ArgMax { axis, keep_dims }, &[])
    }

    // ---- contractions and windows ----

    /// Batched matrix product with broadcast batch dims.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.op(Op::MatMul, &[rhs])
    }

    /// NCHW convolution with an OIHW weight.
    pub fn conv2d(
        &self,
        weight: &Tensor,
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Result<Tensor> {
        self.op(Op::Conv2d { stride, padding, dilation, groups }, &[weight])
    }

    /// Max pooling, NCHW.
    pub fn max_pool2d(&self, window: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Result<Tensor> {
        self.op(Op::Pool { kind: PoolKind::Max, window, stride, padding }, &[])
    }

    /// Average pooling, NCHW (padding counts as zeros).
    pub fn avg_pool2d(&self, window: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Result<Tensor> {
        self.op(Op::Pool { kind: PoolKind::Avg, window, stride, padding }, &[])
    }

    // ---- composites, written with primitives ----

    /// `max(x, 0)`.
    pub fn relu(&self) -> Result<Tensor> {
        self.maximum(&self.scalar_like(0.0)?)
    }

    /// GELU, exact form: `x · (1 + erf(x/√2)) / 2`.
    pub fn gelu(&self) -> Result<Tensor> {
        let inner = self.mul_scalar(std::f64::consts::FRAC_1_SQRT_2)?.erf()?.add_scalar(1.0)?;
        self.mul(&inner)?.mul_scalar(0.5)
    }

    /// GELU, tanh form: `x · (1 + tanh(√(2/π)(x + 0.044715x³))) / 2`.
    pub fn gelu_tanh(&self) -> Result<Tensor> {
        let x3 = self.mul(self)?.mul(self)?;
        let inner = self.add(&x3.mul_scalar(0.044715)?)?.mul_scalar((2.0 / std::f64::consts::PI).sqrt())?;
        self.mul(&inner.tanh()?.add_scalar(1.0)?)?.mul_scalar(0.5)
    }

    /// `x · sigmoid(x)`.
    pub fn silu(&self) -> Result<Tensor> {
        self.mul(&self.sigmoid()?)
    }

    /// Mean over `axes`.
    pub fn mean(&self, axes: &[usize], keep_dims: bool) -> Result<Tensor> {
        let count: usize = axes.iter().filter_map(|&a| self.dims().get(a)).product();
        self.sum(axes, keep_dims)?.mul_scalar(1.0 / count.max(1) as f64)
    }

    /// Population variance over `axes`.
    pub fn variance(&self, axes: &[usize], keep_dims: bool) -> Result<Tensor> {
        let centered = self.sub(&self.mean(axes, true)?)?;
        let v = centered.mul(&centered)?.mean(axes, true)?;
        if keep_dims {
            Ok(v)
        } else {
            v.reshape(crate::op::reduced_dims(self.dims(), axes, false))
        }
    }

    /// Softmax along `axis` (max-subtracted for stability).
    pub fn softmax(&self, axis: usize) -> Result<Tensor> {
        let e = self.sub(&self.max(&[axis], true)?)?.exp()?;
        e.div(&e.sum(&[axis], true)?)
    }

    /// Log-softmax along `axis`.
    pub fn log_softmax(&self, axis: usize) -> Result<Tensor> {
        let shifted = self.sub(&self.max(&[axis], true)?)?;
        shifted.sub(&shifted.exp()?.sum(&[axis], true)?.log()?)
    }

    /// Layer norm over `axes` without affine parameters: `(x − mean) / sqrt(var + eps)`.
    pub fn layer_norm(&self, axes: &[usize], eps: f64) -> Result<Tensor> {
        let centered = self.sub(&self.mean(axes, true)?)?;
        let var = centered.mul(&centered)?.mean(axes, true)?;
        centered.mul(&var.add_scalar(eps)?.rsqrt()?)
    }

    /// Batch norm for inference along `axis`: `(x − mean)·(gamma·rsqrt(var + eps)) + beta`,
    /// each statistic a vector of `x.dims()[axis]` elements. Written in the form the
    /// batch-norm folding pass recognizes after a conv2d (axis 1) or matmul (last axis).
    pub fn batch_norm(
        &self,
        mean: &Tensor,
        var: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        eps: f64,
        axis: usize,
    ) -> Result<Tensor> {
        let shape = self.dims().to_vec();
        if axis >= shape.len() {
            return Err(IrError::ty("batch_norm", format!("axis {axis} out of range for {}", self.ty)));
        }
        let along = |v: &Tensor| v.broadcast_in_dim(shape.clone(), vec![axis]);
        let scale = var.add_scalar(eps)?.rsqrt()?.mul(gamma)?;
        self.sub(&along(mean)?)?.mul(&along(&scale)?)?.add(&along(beta)?)
    }
}
