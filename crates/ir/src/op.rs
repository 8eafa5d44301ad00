//! The primitive operations and their typing rules.
//!
//! Every variant documents its typing rule; [`infer_type`] implements all of them in one place,
//! and both the builder and the verifier call it, so a verified graph is well typed and later
//! passes index operands without fallbacks.

use crate::{DType, IrError, Result, Shape, TensorType};

/// Elementwise operations of one operand. Result type = operand type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnaryOp {
    /// `-x`; numeric types other than u32.
    Neg,
    /// `|x|`; numeric types other than u32.
    Abs,
    /// `e^x`; float.
    Exp,
    /// Natural logarithm; float.
    Log,
    /// Square root; float.
    Sqrt,
    /// `1/sqrt(x)`; float.
    Rsqrt,
    /// `1/x`; float.
    Recip,
    /// Hyperbolic tangent; float.
    Tanh,
    /// `1/(1+e^-x)`; float.
    Sigmoid,
    /// The error function; float.
    Erf,
    /// Sine; float.
    Sin,
    /// Cosine; float.
    Cos,
    /// Round toward −∞; float.
    Floor,
    /// Round toward +∞; float.
    Ceil,
    /// −1, 0 or 1; numeric types other than u32.
    Sign,
    /// Logical not; bool.
    Not,
}

impl UnaryOp {
    /// Every unary op.
    pub const ALL: [UnaryOp; 16] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Recip,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Erf,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Sign,
        UnaryOp::Not,
    ];

    /// The mnemonic.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Recip => "recip",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Erf => "erf",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Sign => "sign",
            UnaryOp::Not => "not",
        }
    }

    /// Whether the op accepts operands of `dtype`.
    pub fn accepts(self, dtype: DType) -> bool {
        match self {
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign => matches!(dtype, DType::F32 | DType::F16 | DType::I32),
            UnaryOp::Not => dtype == DType::Bool,
            _ => dtype.is_float(),
        }
    }
}

/// Elementwise operations of two operands of identical type (broadcasting is explicit, through
/// [`Op::Broadcast`]). Result type = operand type, except comparisons, which give bool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinaryOp {
    /// `a + b` (integers wrap); numeric.
    Add,
    /// `a - b` (integers wrap); numeric.
    Sub,
    /// `a * b` (integers wrap); numeric.
    Mul,
    /// `a / b`; integer division truncates, and `x / 0 = x` (WGSL's rule); numeric.
    Div,
    /// `a ^ b`; float, defined for `a ≥ 0`.
    Pow,
    /// Larger of the two; numeric.
    Max,
    /// Smaller of the two; numeric.
    Min,
    /// `a == b` → bool; any type.
    Eq,
    /// `a != b` → bool; any type.
    Ne,
    /// `a < b` → bool; numeric.
    Lt,
    /// `a <= b` → bool; numeric.
    Le,
    /// `a > b` → bool; numeric.
    Gt,
    /// `a >= b` → bool; numeric.
    Ge,
    /// Logical and; bool.
    And,
    /// Logical or; bool.
    Or,
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: [BinaryOp; 15] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Eq,
        BinaryOp::Ne,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
        BinaryOp::And,
        BinaryOp::Or,
    ];

    /// The mnemonic.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
            BinaryOp::Eq => "eq",
            BinaryOp::Ne => "ne",
            BinaryOp::Lt => "lt",
            BinaryOp::Le => "le",
            BinaryOp::Gt => "gt",
            BinaryOp::Ge => "ge",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
        }
    }

    /// Whether the result is bool regardless of the operand type.
    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge)
    }

    /// Whether the op accepts operands of `dtype`.
    pub fn accepts(self, dtype: DType) -> bool {
        match self {
            BinaryOp::Pow => dtype.is_float(),
            BinaryOp::And | BinaryOp::Or => dtype == DType::Bool,
            BinaryOp::Eq | BinaryOp::Ne => !dtype.is_storage_only(),
            _ => dtype.is_numeric(),
        }
    }
}

/// The combining function of a reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReduceKind {
    /// Sum (0 for an empty reduction).
    Sum,
    /// Maximum (−∞ / the type's minimum for an empty reduction).
    Max,
    /// Minimum (+∞ / the type's maximum for an empty reduction).
    Min,
    /// Product (1 for an empty reduction).
    Prod,
}

impl ReduceKind {
    /// Every reduction kind.
    pub const ALL: [ReduceKind; 4] = [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min, ReduceKind::Prod];

    /// The name used in attributes.
    pub fn name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "sum",
            ReduceKind::Max => "max",
            ReduceKind::Min => "min",
            ReduceKind::Prod => "prod",
        }
    }

    /// The value an empty reduction of `dtype` yields, which leaves any other operand
    /// unchanged: 0, 1, the lowest or the highest value of the type.
    pub fn identity(self, dtype: DType) -> f64 {
        match (self, dtype) {
            (ReduceKind::Sum, _) => 0.0,
            (ReduceKind::Prod, _) => 1.0,
            (ReduceKind::Max, DType::I32) => i32::MIN as f64,
            (ReduceKind::Max, DType::U32 | DType::Bool) => 0.0,
            (ReduceKind::Max, _) => f64::NEG_INFINITY,
            (ReduceKind::Min, DType::I32) => i32::MAX as f64,
            (ReduceKind::Min, DType::U32) => u32::MAX as f64,
            (ReduceKind::Min, DType::Bool) => 1.0,
            (ReduceKind::Min, _) => f64::INFINITY,
        }
    }
}

/// The kind of a pooling window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKind {
    /// Maximum over the window; padding never wins.
    Max,
    /// Mean over the window, padding counted as zeros (PyTorch's `count_include_pad=True`).
    Avg,
}

impl PoolKind {
    /// The name used in attributes.
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Max => "max",
            PoolKind::Avg => "avg",
        }
    }
}

/// A primitive operation. Operands are the node's incoming edges, in operand order.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A value fed at run time. No operands; type given at creation.
    Input {
        /// The feed name.
        name: String,
    },
    /// A device-resident value that persists across runs (weights, optimizer state). No
    /// operands; type given at creation.
    Parameter {
        /// The parameter name.
        name: String,
    },
    /// Literal data, row-major. No operands; type given at creation; `values.len()` equals the
    /// element count and every value is representable in the dtype.
    Constant {
        /// The elements, as f64 (exact for every dtype fusegraph has).
        values: Vec<f64>,
    },
    /// Every element equals `value`. No operands; type given at creation.
    Full {
        /// The fill value.
        value: f64,
    },
    /// Element = its index along `axis`. No operands; numeric type given at creation;
    /// `axis < rank`.
    Iota {
        /// The counting axis.
        axis: usize,
    },
    /// `op(x)` elementwise. One operand accepted by [`UnaryOp::accepts`]; result = operand type.
    Unary(UnaryOp),
    /// `op(a, b)` elementwise. Two operands of identical type accepted by
    /// [`BinaryOp::accepts`]; result = operand type, or bool for comparisons.
    Binary(BinaryOp),
    /// `cond ? a : b` elementwise. Operands `(cond: bool[s], a: T[s], b: T[s])`; result `T[s]`.
    Select,
    /// Converts every element to `to`: floats to integers truncate toward zero and saturate;
    /// to bool is `x != 0`; from bool is 0 or 1. One operand of any type; result `to[s]`.
    Cast {
        /// The target dtype.
        to: DType,
    },
    /// Broadcast in dimension (XLA's `broadcast_in_dim`): operand axis `i` maps to result axis
    /// `dims[i]`. `dims` strictly increasing, one per operand axis, each `< shape.len()`, and
    /// each operand dim equals its result dim or is 1. Result: operand dtype, `shape`.
    Broadcast {
        /// The result shape.
        shape: Vec<usize>,
        /// Result axis of each operand axis.
        dims: Vec<usize>,
    },
    /// Same elements, row-major, new shape of equal element count. Result: operand dtype,
    /// `shape`.
    Reshape {
        /// The result shape.
        shape: Vec<usize>,
    },
    /// Permutes axes: result axis `i` is operand axis `perm[i]`. `perm` a permutation of
    /// `0..rank`.
    Transpose {
        /// The permutation.
        perm: Vec<usize>,
    },
    /// Strided slice: per axis, elements `start, start+stride, …` below `limit`.
    /// `start ≤ limit ≤ dim`, `stride ≥ 1`. Result dim `ceil((limit−start)/stride)`.
    Slice {
        /// First index per axis.
        start: Vec<usize>,
        /// Exclusive end per axis.
        limit: Vec<usize>,
        /// Step per axis.
        stride: Vec<usize>,
    },
    /// Joins one or more operands of one dtype and rank along `axis`; other dims equal.
    Concat {
        /// The joining axis.
        axis: usize,
    },
    /// Pads with `value`: `low[i]` elements before and `high[i]` after axis `i`.
    Pad {
        /// Elements added before each axis.
        low: Vec<usize>,
        /// Elements added after each axis.
        high: Vec<usize>,
        /// The fill value.
        value: f64,
    },
    /// Embedding-style lookup: operands `(table: T[d0..dr], indices: i32|u32[i...])`; result
    /// `T[d0..axis, i..., daxis+1..]`. Out-of-range indices clamp to `[0, d_axis − 1]`.
    Gather {
        /// The axis of `table` that the indices select along.
        axis: usize,
    },
    /// XLA's `DynamicUpdateSlice` along one axis: operands `(operand: T[d…], update: T[d…
    /// but u along axis], start: i32|u32[])`; the result is `operand` with `update` written
    /// at `[s, s + u)` along `axis`, `s` the start clamped to `[0, d_axis − u]` so the window
    /// fits. A start of shape `[d0]` (`axis` > 0) gives each index `b` of the leading axis its
    /// own window start `start[b]` (a batch of caches, each sequence at its own position).
    /// Result: the operand's type. Where the result takes the operand's buffer (an in-place
    /// update), the kernel writes the windows alone.
    DynamicUpdateSlice {
        /// The axis the window lies along.
        axis: usize,
    },
    /// Reduces the numeric operand over `axes` (sorted, unique, `< rank`); the reduced axes are
    /// removed, or kept as size 1 with `keep_dims`. Result dtype = operand dtype.
    Reduce {
        /// The combining function.
        kind: ReduceKind,
        /// The reduced axes.
        axes: Vec<usize>,
        /// Keep reduced axes as size 1.
        keep_dims: bool,
    },
    /// Index of the first maximum along `axis` of a numeric operand → i32. Axis removed unless
    /// `keep_dims`.
    ArgMax {
        /// The searched axis.
        axis: usize,
        /// Keep the axis as size 1.
        keep_dims: bool,
    },
    /// Batched matrix product: `lhs: T[..., m, k]`, `rhs: T[..., k, n]`, both rank ≥ 2, numeric
    /// `T`, batch dims broadcast NumPy-style → `T[batch..., m, n]`.
    MatMul,
    /// 2-D convolution, NCHW: `input: T[n, c, h, w]`, `weight: T[o, c/groups, kh, kw]`, float
    /// `T`, `c` and `o` divisible by `groups` → `T[n, o, oh, ow]` with
    /// `oh = (h + 2·pad_h − dil_h·(kh−1) − 1)/stride_h + 1` (likewise `ow`).
    Conv2d {
        /// Stride (h, w), each ≥ 1.
        stride: [usize; 2],
        /// Symmetric zero padding (h, w).
        padding: [usize; 2],
        /// Dilation (h, w), each ≥ 1.
        dilation: [usize; 2],
        /// Group count ≥ 1.
        groups: usize,
    },
    /// 2-D pooling, NCHW: `x: T[n, c, h, w]` float → `T[n, c, oh, ow]`, output size as for
    /// [`Op::Conv2d`] with dilation 1.
    Pool {
        /// Max or average.
        kind: PoolKind,
        /// Window (h, w), each ≥ 1.
        window: [usize; 2],
        /// Stride (h, w), each ≥ 1.
        stride: [usize; 2],
        /// Symmetric padding (h, w), each smaller than the window.
        padding: [usize; 2],
    },
}

impl Op {
    /// The mnemonic printed in the text form.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Parameter { .. } => "parameter",
            Op::Constant { .. } => "constant",
            Op::Full { .. } => "full",
            Op::Iota { .. } => "iota",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Select => "select",
            Op::Cast { .. } => "cast",
            Op::Broadcast { .. } => "broadcast",
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Slice { .. } => "slice",
            Op::Concat { .. } => "concat",
            Op::Pad { .. } => "pad",
            Op::Gather { .. } => "gather",
            Op::DynamicUpdateSlice { .. } => "dynamic_update_slice",
            Op::Reduce { .. } => "reduce",
            Op::ArgMax { .. } => "argmax",
            Op::MatMul => "matmul",
            Op::Conv2d { .. } => "conv2d",
            Op::Pool { .. } => "pool",
        }
    }

    /// Whether the op has no operands and its type is given at creation.
    pub fn is_leaf(&self) -> bool {
        matches!(
            self,
            Op::Input { .. } | Op::Parameter { .. } | Op::Constant { .. } | Op::Full { .. } | Op::Iota { .. }
        )
    }

    /// Whether each output element depends only on the same element of each operand.
    pub fn is_elementwise(&self) -> bool {
        matches!(self, Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. })
    }

    /// The operand axes a reduction ([`Op::Reduce`], or [`Op::ArgMax`] along its axis)
    /// combines into each output element; `None` for every other op.
    pub fn reduced_axes(&self) -> Option<Vec<usize>> {
        match self {
            Op::Reduce { axes, .. } => Some(axes.clone()),
            Op::ArgMax { axis, .. } => Some(vec![*axis]),
            _ => None,
        }
    }
}

fn err<T>(op: &Op, detail: impl Into<String>) -> Result<T> {
    Err(IrError::ty(op.name(), detail))
}

fn list(types: &[&TensorType]) -> String {
    types.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
}

/// Broadcasts two batch shapes NumPy-style (aligned from the right, 1 stretches).
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank { a[i + a.len() - rank] } else { 1 };
        let db = if i + b.len() >= rank { b[i + b.len() - rank] } else { 1 };
        out[i] = match (da, db) {
            _ if da == db => da,
            (1, d) | (d, 1) => d,
            _ => return None,
        };
    }
    Some(out)
}

/// Output spatial size of a window op, or `None` if the window does not fit.
pub fn window_out(size: usize, window: usize, stride: usize, pad: usize, dilation: usize) -> Option<usize> {
    if window == 0 || stride == 0 {
        return None;
    }
    let span = dilation * (window - 1) + 1;
    let padded = size + 2 * pad;
    if padded < span {
        return None;
    }
    Some((padded - span) / stride + 1)
}

/// Infers the result type of a non-leaf `op` applied to operands of types `operands`, or
/// explains why the typing rule rejects them. Leaves have no inferred type: their type is
/// given at creation, and [`check_leaf`] checks it.
pub fn infer_type(op: &Op, operands: &[&TensorType]) -> Result<TensorType> {
    let arity = match op {
        _ if op.is_leaf() => 0,
        Op::Unary(_) | Op::Cast { .. } | Op::Broadcast { .. } | Op::Reshape { .. } | Op::Transpose { .. } => 1,
        Op::Slice { .. } | Op::Pad { .. } | Op::Reduce { .. } | Op::ArgMax { .. } | Op::Pool { .. } => 1,
        Op::Binary(_) | Op::Gather { .. } | Op::MatMul | Op::Conv2d { .. } => 2,
        Op::Select | Op::DynamicUpdateSlice { .. } => 3,
        Op::Concat { .. } => usize::MAX,
        _ => unreachable!("all ops are listed above"),
    };
    if op.is_leaf() {
        return err(op, "a leaf has no operands; its type is given when it is created");
    }
    if arity != usize::MAX && operands.len() != arity {
        return err(op, format!("expects {arity} operand(s), got {} ({})", operands.len(), list(operands)));
    }
    // Storage-only types (bf16) are read by a cast to a computing float type and nothing else.
    match op {
        Op::Cast { to } if to.is_storage_only() => {
            return err(op, format!("to {to}: a storage type, which only inputs and parameters hold"));
        }
        Op::Cast { to } if to.is_float() => {}
        _ => {
            if let Some(x) = operands.iter().find(|t| t.dtype.is_storage_only()) {
                return err(op, format!("operand {x}: {} is a storage type; cast it to f32 or f16 first", x.dtype));
            }
        }
    }
    match op {
        Op::Unary(u) => {
            let x = operands[0];
            if !u.accepts(x.dtype) {
                return err(op, format!("operand {x}: dtype {} is not supported", x.dtype));
            }
            Ok(x.clone())
        }
        Op::Binary(b) => {
            let (l, r) = (operands[0], operands[1]);
            if l.shape != r.shape {
                return err(op, format!("lhs {l} and rhs {r}: shapes differ (broadcast explicitly)"));
            }
            if l.dtype != r.dtype {
                return err(op, format!("lhs {l} and rhs {r}: dtypes differ (cast explicitly)"));
            }
            if !b.accepts(l.dtype) {
                return err(op, format!("lhs {l} and rhs {r}: dtype {} is not supported", l.dtype));
            }
            let dtype = if b.is_comparison() { DType::Bool } else { l.dtype };
            Ok(TensorType::new(dtype, l.shape.clone()))
        }
        Op::Select => {
            let (c, a, b) = (operands[0], operands[1], operands[2]);
            if c.dtype != DType::Bool {
                return err(op, format!("condition {c} must be bool"));
            }
            if a != b || c.shape != a.shape {
                return err(
                    op,
                    format!("condition {c}, on_true {a} and on_false {b} must have one shape and equal branch types"),
                );
            }
            Ok(a.clone())
        }
        Op::Cast { to } => Ok(TensorType::new(*to, operands[0].shape.clone())),
        Op::Broadcast { shape, dims } => {
            let x = operands[0];
            if dims.len() != x.shape.rank() {
                return err(
                    op,
                    format!("operand {x} has rank {} but dims {dims:?} has {} entries", x.shape.rank(), dims.len()),
                );
            }
            for (i, &d) in dims.iter().enumerate() {
                if d >= shape.len() || (i > 0 && d <= dims[i - 1]) {
                    return err(
                        op,
                        format!(
                            "operand {x} to {}: dims {dims:?} must be increasing and below rank {}",
                            Shape::new(shape.clone()),
                            shape.len()
                        ),
                    );
                }
                let od = x.shape.0[i];
                if od != 1 && od != shape[d] {
                    return err(
                        op,
                        format!(
                            "operand {x} cannot broadcast to {}: dim {i} is {od}, target {}",
                            Shape::new(shape.clone()),
                            shape[d]
                        ),
                    );
                }
            }
            Ok(TensorType::new(x.dtype, shape.clone()))
        }
        Op::Reshape { shape } => {
            let x = operands[0];
            let target = Shape::new(shape.clone());
            if target.numel() != x.shape.numel() {
                return err(
                    op,
                    format!(
                        "operand {x} ({} elements) cannot reshape to {target} ({} elements)",
                        x.shape.numel(),
                        target.numel()
                    ),
                );
            }
            Ok(TensorType::new(x.dtype, target))
        }
        Op::Transpose { perm } => {
            let x = operands[0];
            let mut seen = vec![false; x.shape.rank()];
            if perm.len() != x.shape.rank()
                || perm.iter().any(|&p| p >= seen.len() || std::mem::replace(&mut seen[p], true))
            {
                return err(op, format!("operand {x}: {perm:?} is not a permutation of 0..{}", x.shape.rank()));
            }
            Ok(TensorType::new(x.dtype, perm.iter().map(|&p| x.shape.0[p]).collect::<Vec<_>>()))
        }
        Op::Slice { start, limit, stride } => {
            let x = operands[0];
            let r = x.shape.rank();
            if start.len() != r || limit.len() != r || stride.len() != r {
                return err(
                    op,
                    format!(
                        "operand {x}: start {start:?}, limit {limit:?} and stride {stride:?} need {r} entries each"
                    ),
                );
            }
            let mut dims = Vec::with_capacity(r);
            for i in 0..r {
                if start[i] > limit[i] || limit[i] > x.shape.0[i] || stride[i] == 0 {
                    return err(
                        op,
                        format!(
                            "operand {x}: axis {i}: need start {} ≤ limit {} ≤ dim {} and stride {} ≥ 1",
                            start[i], limit[i], x.shape.0[i], stride[i]
                        ),
                    );
                }
                dims.push((limit[i] - start[i]).div_ceil(stride[i]));
            }
            Ok(TensorType::new(x.dtype, dims))
        }
        Op::Concat { axis } => {
            let Some(first) = operands.first() else {
                return err(op, "needs at least one operand");
            };
            if *axis >= first.shape.rank() {
                return err(op, format!("axis {axis} out of range for {first}"));
            }
            let mut dims = first.shape.0.clone();
            dims[*axis] = 0;
            for t in operands {
                let ok = t.dtype == first.dtype
                    && t.shape.rank() == first.shape.rank()
                    && (0..dims.len()).all(|i| i == *axis || t.shape.0[i] == first.shape.0[i]);
                if !ok {
                    return err(
                        op,
                        format!("operands {} must agree in dtype and in every dim but axis {axis}", list(operands)),
                    );
                }
                dims[*axis] += t.shape.0[*axis];
            }
            Ok(TensorType::new(first.dtype, dims))
        }
        Op::Pad { low, high, .. } => {
            let x = operands[0];
            if low.len() != x.shape.rank() || high.len() != x.shape.rank() {
                return err(op, format!("operand {x}: low {low:?} and high {high:?} need {} entries", x.shape.rank()));
            }
            let dims: Vec<usize> = (0..low.len()).map(|i| low[i] + x.shape.0[i] + high[i]).collect();
            Ok(TensorType::new(x.dtype, dims))
        }
        Op::Gather { axis } => {
            let (t, i) = (operands[0], operands[1]);
            if *axis >= t.shape.rank() {
                return err(op, format!("axis {axis} out of range for table {t}"));
            }
            if !i.dtype.is_int() {
                return err(op, format!("indices {i} must be i32 or u32"));
            }
            let mut dims = t.shape.0[..*axis].to_vec();
            dims.extend_from_slice(&i.shape.0);
            dims.extend_from_slice(&t.shape.0[axis + 1..]);
            Ok(TensorType::new(t.dtype, dims))
        }
        Op::DynamicUpdateSlice { axis } => {
            let (x, u, s) = (operands[0], operands[1], operands[2]);
            let Some(&dim) = x.shape.0.get(*axis) else {
                return err(op, format!("axis {axis} out of range for {x}"));
            };
            let fits = u.dtype == x.dtype
                && u.shape.rank() == x.shape.rank()
                && (0..x.shape.rank()).all(|a| a == *axis || u.shape.0[a] == x.shape.0[a])
                && (1..=dim).contains(&u.shape.0[*axis]);
            if !fits {
                return err(op, format!("update {u} must be {x} but for 1..={dim} along axis {axis}"));
            }
            let per_row = s.shape.rank() == 1 && *axis > 0 && s.shape.0[0] == x.shape.0[0];
            if !(s.shape.rank() == 0 || per_row) || !s.dtype.is_int() {
                return err(
                    op,
                    format!("start {s} must be a rank-0 i32 or u32, or one per index of axis 0 (of {x}) past axis 0"),
                );
            }
            Ok(x.clone())
        }
        Op::Reduce { axes, keep_dims, .. } => {
            let x = operands[0];
            if !x.dtype.is_numeric() {
                return err(op, format!("operand {x}: cannot reduce {}", x.dtype));
            }
            if axes.iter().enumerate().any(|(i, &a)| a >= x.shape.rank() || (i > 0 && a <= axes[i - 1])) {
                return err(
                    op,
                    format!("operand {x}: axes {axes:?} must be sorted, unique and below rank {}", x.shape.rank()),
                );
            }
            Ok(TensorType::new(x.dtype, reduced_dims(&x.shape.0, axes, *keep_dims)))
        }
        Op::ArgMax { axis, keep_dims } => {
            let x = operands[0];
            if !x.dtype.is_numeric() || *axis >= x.shape.rank() || x.shape.0[*axis] == 0 {
                return err(
                    op,
                    format!("operand {x}: needs a numeric tensor and a non-empty axis {axis} below its rank"),
                );
            }
            Ok(TensorType::new(DType::I32, reduced_dims(&x.shape.0, &[*axis], *keep_dims)))
        }
        Op::MatMul => {
            let (l, r) = (operands[0], operands[1]);
            let pre = format!("lhs {l} and rhs {r}");
            if l.dtype != r.dtype || !l.dtype.is_numeric() {
                return err(op, format!("{pre}: need one numeric dtype"));
            }
            if l.shape.rank() < 2 || r.shape.rank() < 2 {
                return err(op, format!("{pre}: both need rank ≥ 2"));
            }
            let (ld, rd) = (&l.shape.0, &r.shape.0);
            let (m, k) = (ld[ld.len() - 2], ld[ld.len() - 1]);
            let (k2, n) = (rd[rd.len() - 2], rd[rd.len() - 1]);
            if k != k2 {
                return err(op, format!("{pre}: inner dimensions {k} and {k2} differ"));
            }
            let Some(mut dims) = broadcast_shapes(&ld[..ld.len() - 2], &rd[..rd.len() - 2]) else {
                return err(op, format!("{pre}: batch dimensions do not broadcast"));
            };
            dims.extend([m, n]);
            Ok(TensorType::new(l.dtype, dims))
        }
        Op::Conv2d { stride, padding, dilation, groups } => {
            let (x, w) = (operands[0], operands[1]);
            let pre = format!("input {x} and weight {w}");
            if x.dtype != w.dtype || !x.dtype.is_float() || x.shape.rank() != 4 || w.shape.rank() != 4 {
                return err(op, format!("{pre}: need rank-4 NCHW / OIHW tensors of one float dtype"));
            }
            let (n, c, h, wd) = (x.shape.0[0], x.shape.0[1], x.shape.0[2], x.shape.0[3]);
            let (o, ci, kh, kw) = (w.shape.0[0], w.shape.0[1], w.shape.0[2], w.shape.0[3]);
            if *groups == 0 || c % groups != 0 || o % groups != 0 || ci != c / groups {
                return err(op, format!("{pre}: groups {groups} must divide channels {c} and outputs {o}, and weight dim 1 ({ci}) must be {}", c / groups.max(&1)));
            }
            let oh = window_out(h, kh, stride[0], padding[0], dilation[0].max(1));
            let ow = window_out(wd, kw, stride[1], padding[1], dilation[1].max(1));
            match (oh, ow) {
                (Some(oh), Some(ow)) if dilation[0] > 0 && dilation[1] > 0 => {
                    Ok(TensorType::new(x.dtype, [n, o, oh, ow]))
                }
                _ => err(
                    op,
                    format!(
                        "{pre}: window does not fit (stride {stride:?}, padding {padding:?}, dilation {dilation:?})"
                    ),
                ),
            }
        }
        Op::Pool { window, stride, padding, .. } => {
            let x = operands[0];
            if !x.dtype.is_float() || x.shape.rank() != 4 {
                return err(op, format!("operand {x}: needs a rank-4 NCHW float tensor"));
            }
            if padding[0] >= window[0].max(1) || padding[1] >= window[1].max(1) {
                return err(op, format!("operand {x}: padding {padding:?} must be smaller than window {window:?}"));
            }
            let oh = window_out(x.shape.0[2], window[0], stride[0], padding[0], 1);
            let ow = window_out(x.shape.0[3], window[1], stride[1], padding[1], 1);
            match (oh, ow) {
                (Some(oh), Some(ow)) => Ok(TensorType::new(x.dtype, [x.shape.0[0], x.shape.0[1], oh, ow])),
                _ => err(
                    op,
                    format!(
                        "operand {x}: window {window:?} with stride {stride:?} and padding {padding:?} does not fit"
                    ),
                ),
            }
        }
        _ => unreachable!("leaves returned above"),
    }
}

/// The dims left after reducing `axes`.
pub fn reduced_dims(dims: &[usize], axes: &[usize], keep_dims: bool) -> Vec<usize> {
    dims.iter()
        .enumerate()
        .filter_map(|(i, &d)| match (axes.contains(&i), keep_dims) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

/// Checks a leaf op against the type it is created with.
pub fn check_leaf(op: &Op, ty: &TensorType) -> Result<()> {
    match op {
        Op::Input { .. } | Op::Parameter { .. } if ty.dtype.block().is_some() => {
            if let Err(IrError::Type { detail, .. }) = crate::host::check_blocks(ty.dtype, &ty.shape) {
                return err(op, detail);
            }
        }
        Op::Input { .. } | Op::Parameter { .. } => {}
        _ if ty.dtype.is_storage_only() => {
            return err(op, format!("{ty}: a storage type, which only inputs and parameters hold"));
        }
        _ => {}
    }
    match op {
        Op::Constant { values } => {
            if values.len() != ty.shape.numel() {
                return err(op, format!("{} values given for {ty} ({} elements)", values.len(), ty.shape.numel()));
            }
            if let Some(v) = values.iter().find(|&&v| !representable(v, ty.dtype)) {
                return err(op, format!("value {v} is not representable in {}", ty.dtype));
            }
            Ok(())
        }
        Op::Full { value } if !representable(*value, ty.dtype) => {
            err(op, format!("value {value} is not representable in {}", ty.dtype))
        }
        Op::Iota { axis } if *axis >= ty.shape.rank() || !ty.dtype.is_numeric() => {
            err(op, format!("axis {axis} of {ty}: needs a numeric type and an axis below its rank"))
        }
        Op::Input { name } | Op::Parameter { name } if name.is_empty() => err(op, "needs a non-empty name"),
        _ if op.is_leaf() => Ok(()),
        _ => err(op, "is not a leaf"),
    }
}

/// Whether `v` is exactly representable in `dtype` (floats: any value, rounded on use).
pub fn representable(v: f64, dtype: DType) -> bool {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => true,
        DType::I32 => v.fract() == 0.0 && v >= i32::MIN as f64 && v <= i32::MAX as f64,
        DType::U32 => v.fract() == 0.0 && v >= 0.0 && v <= u32::MAX as f64,
        DType::Bool => v == 0.0 || v == 1.0,
        // The block types.
        _ => false,
    }
}
