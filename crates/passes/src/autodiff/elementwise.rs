//! Vector-Jacobian products of the elementwise ops: unary, binary, select and cast.
//!
//! `x` is an operand, `y` the node's value and `gy` its cotangent (same shape); every rule
//! multiplies `gy` by the local derivative, written with forward values where that is
//! cheaper (`exp`: `gy·y`, `tanh`: `gy·(1 − y²)`).

use super::Emit;
use fusegraph_ir::{BinaryOp, IrError, NodeId, UnaryOp};

type R = Result<Option<NodeId>, IrError>;

/// `2/√π`, the scale of the derivative of `erf`.
const TWO_OVER_SQRT_PI: f64 = std::f64::consts::FRAC_2_SQRT_PI;

/// The cotangent of the operand `x` of `y = u(x)`; `None` for the zero-derivative ops
/// (`floor`, `ceil`, `sign`) and for `not` (bool, never reached).
pub(super) fn unary(e: &mut Emit<'_>, u: UnaryOp, x: NodeId, y: NodeId, gy: NodeId) -> R {
    let dx = match u {
        UnaryOp::Neg => e.unary(UnaryOp::Neg, gy)?,
        UnaryOp::Abs => {
            let s = e.unary(UnaryOp::Sign, x)?;
            e.mul(gy, s)?
        }
        UnaryOp::Exp => e.mul(gy, y)?,
        UnaryOp::Log => e.div(gy, x)?,
        UnaryOp::Sqrt => {
            // d√x = 1/(2√x)
            let half = e.scale(gy, 0.5)?;
            e.div(half, y)?
        }
        UnaryOp::Rsqrt => {
            // d x^(-1/2) = −x^(-3/2)/2 = −y³/2, as ((−gy/2)·y)·y·y: each product lies
            // between `gy` and the result, so none overflows where the result does not. `y³`
            // first would overflow f16 for `y` over 40 (a layer norm's 1/σ of a row of variance
            // 3e-4), and with it every mixed-precision step of the LM demo.
            let t = e.scale(gy, -0.5)?;
            let t = e.mul(t, y)?;
            let t = e.mul(t, y)?;
            e.mul(t, y)?
        }
        UnaryOp::Recip => {
            // d(1/x) = −1/x² = −y², as (−gy·y)·y (no `y²` to overflow: see `Rsqrt`)
            let t = e.unary(UnaryOp::Neg, gy)?;
            let t = e.mul(t, y)?;
            e.mul(t, y)?
        }
        UnaryOp::Tanh => {
            let y2 = e.mul(y, y)?;
            let one = e.full_like(y, 1.0)?;
            let d = e.sub(one, y2)?;
            e.mul(gy, d)?
        }
        UnaryOp::Sigmoid => {
            let one = e.full_like(y, 1.0)?;
            let c = e.sub(one, y)?;
            let d = e.mul(y, c)?;
            e.mul(gy, d)?
        }
        UnaryOp::Erf => {
            let x2 = e.mul(x, x)?;
            let n = e.unary(UnaryOp::Neg, x2)?;
            let ex = e.unary(UnaryOp::Exp, n)?;
            let d = e.scale(ex, TWO_OVER_SQRT_PI)?;
            e.mul(gy, d)?
        }
        UnaryOp::Sin => {
            let c = e.unary(UnaryOp::Cos, x)?;
            e.mul(gy, c)?
        }
        UnaryOp::Cos => {
            let s = e.unary(UnaryOp::Sin, x)?;
            let t = e.mul(gy, s)?;
            e.unary(UnaryOp::Neg, t)?
        }
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Sign | UnaryOp::Not => return Ok(None),
    };
    Ok(Some(dx))
}

/// The cotangents of both operands of `y = b(a, c)`, only those in `want`. Comparisons and
/// logical ops have bool results and are never reached.
pub(super) fn binary(
    e: &mut Emit<'_>,
    b: BinaryOp,
    xs: &[NodeId],
    y: NodeId,
    gy: NodeId,
    want: &[bool],
) -> Result<Vec<Option<NodeId>>, IrError> {
    let (a, c) = (xs[0], xs[1]);
    let (wa, wc) = (want[0], want[1]);
    let mut da = None;
    let mut dc = None;
    match b {
        BinaryOp::Add => {
            da = Some(gy);
            dc = Some(gy);
        }
        BinaryOp::Sub => {
            da = Some(gy);
            if wc {
                dc = Some(e.unary(UnaryOp::Neg, gy)?);
            }
        }
        BinaryOp::Mul => {
            if wa {
                da = Some(e.mul(gy, c)?);
            }
            if wc {
                dc = Some(e.mul(gy, a)?);
            }
        }
        BinaryOp::Div => {
            if wa {
                da = Some(e.div(gy, c)?);
            }
            if wc {
                // d(a/c)/dc = −a/c² = −y/c
                let t = e.mul(gy, y)?;
                let t = e.div(t, c)?;
                dc = Some(e.unary(UnaryOp::Neg, t)?);
            }
        }
        BinaryOp::Pow => {
            if wa {
                // c · a^(c−1)
                let one = e.full_like(c, 1.0)?;
                let cm1 = e.sub(c, one)?;
                let p = e.bin(BinaryOp::Pow, a, cm1)?;
                let d = e.mul(c, p)?;
                da = Some(e.mul(gy, d)?);
            }
            if wc {
                // ln(a) · a^c where a > 0, else 0 (hides ln 0 = −∞ times 0^c = 0).
                let l = e.unary(UnaryOp::Log, a)?;
                let d = e.mul(l, y)?;
                let t = e.mul(gy, d)?;
                let zero = e.full_like(a, 0.0)?;
                let pos = e.bin(BinaryOp::Gt, a, zero)?;
                dc = Some(e.select(pos, t, zero)?);
            }
        }
        BinaryOp::Max | BinaryOp::Min => {
            let zero = e.full_like(gy, 0.0)?;
            if wa && wc {
                // The selected side gets the cotangent; ties go to the first operand.
                let cmp = if b == BinaryOp::Max { BinaryOp::Ge } else { BinaryOp::Le };
                let first = e.bin(cmp, a, c)?;
                da = Some(e.select(first, gy, zero)?);
                dc = Some(e.select(first, zero, gy)?);
            } else {
                // One side wants a cotangent, the other is a bound (relu's `0`, a clamp's
                // limit): the side gets it where the result passed the bound, written with
                // the result rather than the operand, so the operand need not be kept for
                // the backward pass (`relu(x·W + b)` stores only its result, and the product
                // fuses with the bias and the relu). At a tie the bound won: no cotangent
                // (relu'(0) = 0, as PyTorch and JAX define it).
                let cmp = if b == BinaryOp::Max { BinaryOp::Gt } else { BinaryOp::Lt };
                let (bound, d) = if wa { (c, &mut da) } else { (a, &mut dc) };
                let passed = e.bin(cmp, y, bound)?;
                *d = Some(e.select(passed, gy, zero)?);
            }
        }
        BinaryOp::Eq
        | BinaryOp::Ne
        | BinaryOp::Lt
        | BinaryOp::Le
        | BinaryOp::Gt
        | BinaryOp::Ge
        | BinaryOp::And
        | BinaryOp::Or => {}
    }
    Ok(vec![da.filter(|_| wa), dc.filter(|_| wc)])
}

/// `select(cond, t, f)`: the cotangent goes to `t` where `cond` holds and to `f` elsewhere;
/// the condition (bool) gets none.
pub(super) fn select(
    e: &mut Emit<'_>,
    xs: &[NodeId],
    gy: NodeId,
    want: &[bool],
) -> Result<Vec<Option<NodeId>>, IrError> {
    let cond = xs[0];
    let zero = e.full_like(gy, 0.0)?;
    let dt = if want[1] { Some(e.select(cond, gy, zero)?) } else { None };
    let df = if want[2] { Some(e.select(cond, zero, gy)?) } else { None };
    Ok(vec![None, dt, df])
}

/// `cast`: a float operand gets the cotangent cast back to its dtype; an integer or bool
/// operand stops the gradient.
pub(super) fn cast(e: &mut Emit<'_>, x: NodeId, gy: NodeId) -> R {
    let to = e.dtype(x);
    if !to.is_float() {
        return Ok(None);
    }
    Ok(Some(e.cast(gy, to)?))
}
