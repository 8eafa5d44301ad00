//! Scalar semantics: rounding to a dtype, casts, the error function and the elementwise ops.

use fusegraph_ir::{f16, BinaryOp, DType, UnaryOp};

/// Rounds an f64 result to what a value of `dtype` holds, as the GPU kernels store it.
///
/// * `F32`: round to nearest binary32 (`x as f32`).
/// * `F16`: round to nearest binary16 (`half::f16::from_f64`).
/// * `BF16`: round to nearest bfloat16 ([`fusegraph_ir::bf16_nearest`]).
/// * `I32` / `U32`: truncate toward zero, then wrap modulo 2³² (two's complement for `I32`);
///   this is how integer add/sub/mul/neg/abs and integer reductions overflow. NaN gives 0 and
///   ±∞ saturate (they never arise from integer arithmetic).
/// * `Bool`: 1 if `v != 0` (NaN counts as non-zero), else 0.
/// * The block types: round to nearest binary32, what a block's value is (no op computes
///   one: their values come from their blocks, [`fusegraph_ir::quant::dequantize`]).
pub fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => fusegraph_ir::bf16_nearest(v).to_f64(),
        DType::I32 => wrap_i128(v) as i32 as f64,
        DType::U32 => wrap_i128(v) as u32 as f64,
        DType::Bool => bool01(v != 0.0),
        // f32 and the block types.
        _ => v as f32 as f64,
    }
}

/// `v` truncated toward zero as an i128 (saturating at ±∞, NaN → 0): exact for every integer
/// an f64 holds, so a following `as i32` / `as u32` wraps modulo 2³².
fn wrap_i128(v: f64) -> i128 {
    v as i128
}

/// Wraps an exact integer result to `dtype` (i32 or u32) modulo 2³².
pub(crate) fn wrap_int(dtype: DType, v: i128) -> f64 {
    match dtype {
        DType::U32 => v as u32 as f64,
        _ => v as i32 as f64,
    }
}

pub(crate) fn bool01(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// Converts a value held in `from` to `to`, as [`fusegraph_ir::Op::Cast`] does: floats to
/// integers truncate toward zero and saturate (NaN → 0); `i32 ↔ u32` reinterpret the bits;
/// anything to bool is `v != 0`; bool is 0 or 1; integers to floats round to the float dtype.
pub fn cast_value(from: DType, to: DType, v: f64) -> f64 {
    match to {
        DType::Bool => bool01(v != 0.0),
        DType::I32 => match from {
            DType::U32 => (v as u32) as i32 as f64,
            _ => v as i32 as f64,
        },
        DType::U32 => match from {
            DType::I32 => (v as i32) as u32 as f64,
            _ => v as u32 as f64,
        },
        // The floats and the storage types.
        _ => round_to(to, v),
    }
}

/// Converts a literal (a `Full`, `Constant` or `Pad` value) to `dtype` with the saturating
/// float-to-integer rule of [`cast_value`] from a float.
pub fn literal(dtype: DType, v: f64) -> f64 {
    cast_value(DType::F32, dtype, v)
}

/// W. J. Cody, "Rational Chebyshev approximations for the error function", Math. Comp. 23
/// (1969): the coefficients of SPECFUN's CALERF, as published.
#[allow(clippy::excessive_precision)]
mod cody {
    pub(super) const A: [f64; 5] = [
        3.16112374387056560e00,
        1.13864154151050156e02,
        3.77485237685302021e02,
        3.20937758913846947e03,
        1.85777706184603153e-1,
    ];
    pub(super) const B: [f64; 4] =
        [2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03, 2.84423683343917062e03];
    pub(super) const C: [f64; 9] = [
        5.64188496988670089e-1,
        8.88314979438837594e00,
        6.61191906371416295e01,
        2.98635138197400131e02,
        8.81952221241769090e02,
        1.71204761263407058e03,
        2.05107837782607147e03,
        1.23033935479799725e03,
        2.15311535474403846e-8,
    ];
    pub(super) const D: [f64; 8] = [
        1.57449261107098347e01,
        1.17693950891312499e02,
        5.37181101862009858e02,
        1.62138957456669019e03,
        3.29079923573345963e03,
        4.36261909014324716e03,
        3.43936767414372164e03,
        1.23033935480374942e03,
    ];
    pub(super) const P: [f64; 6] = [
        3.05326634961232344e-1,
        3.60344899949804439e-1,
        1.25781726111229246e-1,
        1.60837851487422766e-2,
        6.58749161529837803e-4,
        1.63153871373020978e-2,
    ];
    pub(super) const Q: [f64; 5] = [
        2.56852019228982242e00,
        1.87295284992346725e00,
        5.27905102951428412e-1,
        6.05183413124413191e-2,
        2.33520497626869185e-3,
    ];
    /// 1/√π.
    pub(super) const FRAC_1_SQRT_PI: f64 = 5.6418958354775628695e-1;
}

/// `exp(-y²)` computed as `exp(-ysq²)·exp(-del)` with `ysq = y` rounded down to 1/16, which
/// keeps `y²` from losing bits (Cody's trick).
fn exp_neg_sq(y: f64) -> f64 {
    let ysq = (y * 16.0).trunc() / 16.0;
    let del = (y - ysq) * (y + ysq);
    (-ysq * ysq).exp() * (-del).exp()
}

/// The error function in double precision (Cody's rational Chebyshev approximation, relative
/// error below about 1e-16 on `[-∞, ∞]`). `erf(NaN)` is NaN.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let y = x.abs();
    if y <= 0.46875 {
        let ysq = if y > 1.11e-16 { y * y } else { 0.0 };
        let mut num = cody::A[4] * ysq;
        let mut den = ysq;
        for i in 0..3 {
            num = (num + cody::A[i]) * ysq;
            den = (den + cody::B[i]) * ysq;
        }
        return x * (num + cody::A[3]) / (den + cody::B[3]);
    }
    // erfc(y) for y > 0.46875.
    let erfc = if y <= 4.0 {
        let mut num = cody::C[8] * y;
        let mut den = y;
        for i in 0..7 {
            num = (num + cody::C[i]) * y;
            den = (den + cody::D[i]) * y;
        }
        exp_neg_sq(y) * (num + cody::C[7]) / (den + cody::D[7])
    } else if y >= 26.543 {
        0.0
    } else {
        let ysq = 1.0 / (y * y);
        let mut num = cody::P[5] * ysq;
        let mut den = ysq;
        for i in 0..4 {
            num = (num + cody::P[i]) * ysq;
            den = (den + cody::Q[i]) * ysq;
        }
        let r = ysq * (num + cody::P[4]) / (den + cody::Q[4]);
        exp_neg_sq(y) * (cody::FRAC_1_SQRT_PI - r) / y
    };
    let r = (0.5 - erfc) + 0.5;
    if x < 0.0 {
        -r
    } else {
        r
    }
}

fn sign(x: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else if x.is_nan() {
        x
    } else {
        0.0
    }
}

/// `op(x)` for an operand of `dtype`, rounded to `dtype`.
pub fn unary(op: UnaryOp, dtype: DType, x: f64) -> f64 {
    let r = match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Erf => erf(x),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Sign => sign(x),
        UnaryOp::Not => bool01(x == 0.0),
    };
    // Integer neg/abs of i32::MIN give 2³¹, which wraps back to i32::MIN, as on the GPU.
    round_to(dtype, r)
}

/// Integer division with WGSL's rules: truncation toward zero, `x / 0 = x`, and
/// `i32::MIN / -1 = i32::MIN`.
fn int_div(dtype: DType, a: f64, b: f64) -> f64 {
    if b == 0.0 {
        return a;
    }
    let (a, b) = (a as i64, b as i64);
    // i64 division truncates toward zero; i32::MIN / -1 = 2³¹ wraps back to i32::MIN.
    round_to(dtype, (a / b) as f64)
}

/// `op(a, b)` for operands of `dtype`; the result is rounded to `dtype`, or is 0/1 for
/// comparisons.
pub fn binary(op: BinaryOp, dtype: DType, a: f64, b: f64) -> f64 {
    let int = dtype.is_int();
    let r = match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        // Products of two 32-bit integers are exact in i128 (not always in f64).
        BinaryOp::Mul if int => return wrap_int(dtype, (a as i128) * (b as i128)),
        BinaryOp::Mul => a * b,
        BinaryOp::Div if int => return int_div(dtype, a, b),
        BinaryOp::Div => a / b,
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Max => a.max(b),
        BinaryOp::Min => a.min(b),
        BinaryOp::Eq => return bool01(a == b),
        BinaryOp::Ne => return bool01(a != b),
        BinaryOp::Lt => return bool01(a < b),
        BinaryOp::Le => return bool01(a <= b),
        BinaryOp::Gt => return bool01(a > b),
        BinaryOp::Ge => return bool01(a >= b),
        BinaryOp::And => return bool01(a != 0.0 && b != 0.0),
        BinaryOp::Or => return bool01(a != 0.0 || b != 0.0),
    };
    round_to(dtype, r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        // Reference values from CPython's math.erf (correctly rounded libm erf).
        let cases = [
            (0.0, 0.0),
            (1e-20, 1.1283791670955125e-20),
            (0.1, 0.1124629160182849),
            (0.46875, 0.49261347321793797),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (-2.0, -0.9953222650189527),
            (2.5, 0.999593047982555),
            (3.0, 0.9999779095030014),
            (4.0, 0.9999999845827421),
            (4.5, 0.9999999998033839),
            (-6.0, -1.0),
            (30.0, 1.0),
            (f64::INFINITY, 1.0),
            (f64::NEG_INFINITY, -1.0),
        ];
        for (x, want) in cases {
            let got = erf(x);
            assert!((got - want).abs() <= 2e-16_f64.max(1e-15 * want.abs()), "erf({x}) = {got}, want {want}");
        }
        assert!(erf(f64::NAN).is_nan());
    }

    #[test]
    fn erf_is_odd_and_monotone() {
        let mut prev = -1.0;
        for i in -600..=600 {
            let x = i as f64 / 100.0;
            let v = erf(x);
            assert_eq!(v, -erf(-x));
            assert!(v >= prev, "erf not monotone at {x}");
            prev = v;
        }
    }

    #[test]
    fn rounding() {
        assert_eq!(round_to(DType::F32, 0.1), 0.1f32 as f64);
        assert_eq!(round_to(DType::F16, 1.0 + 1.0 / 4096.0), 1.0);
        assert_eq!(round_to(DType::F16, 70000.0), f64::INFINITY);
        assert_eq!(round_to(DType::I32, 2147483648.0), -2147483648.0);
        assert_eq!(round_to(DType::I32, -2147483649.0), 2147483647.0);
        assert_eq!(round_to(DType::U32, -1.0), 4294967295.0);
        assert_eq!(round_to(DType::U32, 4294967296.0 + 5.0), 5.0);
        assert_eq!(round_to(DType::I32, -2.7), -2.0);
        assert_eq!(round_to(DType::Bool, -3.0), 1.0);
        assert_eq!(round_to(DType::Bool, 0.0), 0.0);
    }

    #[test]
    fn casts() {
        assert_eq!(cast_value(DType::F32, DType::I32, -2.9), -2.0);
        assert_eq!(cast_value(DType::F32, DType::I32, 3e10), i32::MAX as f64);
        assert_eq!(cast_value(DType::F32, DType::I32, -3e10), i32::MIN as f64);
        assert_eq!(cast_value(DType::F32, DType::I32, f64::NAN), 0.0);
        assert_eq!(cast_value(DType::F32, DType::U32, -5.5), 0.0);
        assert_eq!(cast_value(DType::F32, DType::U32, 1e11), u32::MAX as f64);
        assert_eq!(cast_value(DType::I32, DType::U32, -1.0), u32::MAX as f64);
        assert_eq!(cast_value(DType::U32, DType::I32, 4294967295.0), -1.0);
        assert_eq!(cast_value(DType::U32, DType::I32, 2147483648.0), i32::MIN as f64);
        assert_eq!(cast_value(DType::F32, DType::Bool, -0.5), 1.0);
        assert_eq!(cast_value(DType::I32, DType::F16, 2049.0), 2048.0);
        assert_eq!(cast_value(DType::Bool, DType::F32, 1.0), 1.0);
    }

    #[test]
    fn integer_arithmetic_wraps() {
        let (max, min) = (i32::MAX as f64, i32::MIN as f64);
        assert_eq!(binary(BinaryOp::Add, DType::I32, max, 1.0), min);
        assert_eq!(binary(BinaryOp::Sub, DType::I32, min, 1.0), max);
        assert_eq!(binary(BinaryOp::Mul, DType::I32, 65536.0, 65536.0), 0.0);
        assert_eq!(binary(BinaryOp::Mul, DType::I32, max, max), 1.0);
        assert_eq!(binary(BinaryOp::Mul, DType::U32, 4294967295.0, 4294967295.0), 1.0);
        assert_eq!(binary(BinaryOp::Sub, DType::U32, 0.0, 1.0), 4294967295.0);
        assert_eq!(unary(UnaryOp::Neg, DType::I32, min), min);
        assert_eq!(unary(UnaryOp::Abs, DType::I32, min), min);
        assert_eq!(binary(BinaryOp::Div, DType::I32, -7.0, 2.0), -3.0);
        assert_eq!(binary(BinaryOp::Div, DType::I32, 7.0, -2.0), -3.0);
        assert_eq!(binary(BinaryOp::Div, DType::I32, 7.0, 0.0), 7.0);
        assert_eq!(binary(BinaryOp::Div, DType::U32, 9.0, 0.0), 9.0);
        assert_eq!(binary(BinaryOp::Div, DType::I32, min, -1.0), min);
        assert_eq!(binary(BinaryOp::Div, DType::U32, 4294967295.0, 2.0), 2147483647.0);
    }

    #[test]
    fn float_ops() {
        assert_eq!(unary(UnaryOp::Sigmoid, DType::F32, 0.0), 0.5);
        assert_eq!(unary(UnaryOp::Sign, DType::F32, -3.0), -1.0);
        assert_eq!(unary(UnaryOp::Sign, DType::I32, 0.0), 0.0);
        assert_eq!(unary(UnaryOp::Rsqrt, DType::F32, 4.0), 0.5);
        assert_eq!(unary(UnaryOp::Floor, DType::F32, -1.5), -2.0);
        assert_eq!(unary(UnaryOp::Ceil, DType::F32, -1.5), -1.0);
        assert_eq!(unary(UnaryOp::Not, DType::Bool, 1.0), 0.0);
        assert_eq!(binary(BinaryOp::Pow, DType::F32, 2.0, 10.0), 1024.0);
        assert_eq!(binary(BinaryOp::Div, DType::F32, 1.0, 0.0), f64::INFINITY);
        assert_eq!(binary(BinaryOp::Lt, DType::F32, 1.0, 2.0), 1.0);
        assert_eq!(binary(BinaryOp::And, DType::Bool, 1.0, 0.0), 0.0);
        assert_eq!(binary(BinaryOp::Or, DType::Bool, 1.0, 0.0), 1.0);
        assert_eq!(binary(BinaryOp::Add, DType::F16, 2048.0, 1.0), 2048.0);
    }
}
