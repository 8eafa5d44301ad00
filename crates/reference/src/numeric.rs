//! Scalar semantics: rounding to a dtype, casts, the error function and the elementwise ops.

use fusegraph_ir::{f16, BinaryOp, DType, UnaryOp};

/// Rounds an f64 result to what a value of `dtype` holds, as the GPU kernels store it.
///
/// * `F32`: round to nearest binary32 (`x as f32`).
/// * `F16`: round to nearest binary16 (`half::f16::from_f64`).
/// * `I32` / `U32`: truncate toward zero, then wrap modulo 2³² (two's complement for `I32`);
///   this is how integer add/sub/mul/neg/abs and integer reductions overflow. NaN gives 0 and
///   ±∞ saturate (they never arise from integer arithmetic).
/// * `Bool`: 1 if `v != 0` (NaN counts as non-zero), else 0.
pub fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F32 => v as f32 as f64,
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::I32 => wrap_i128(v) as i32 as f64,
        DType::U32 => wrap_i128(v) as u32 as f64,
        DType::Bool => bool01(v != 0.0),
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
        DType::F32 | DType::F16 => round_to(to, v),
        DType::Bool => bool01(v != 0.0),
        DType::I32 => match from {
            DType::U32 => (v as u32) as i32 as f64,
            _ => v as i32 as f64,
        },
        DType::U32 => match from {
            DType::I32 => (v as i32) as u32 as f64,
            _ => v as u32 as f64,
        },
    }
}

/// Converts a literal (a `Full`, `Constant` or `Pad` value) to `dtype` with the saturating
/// float-to-integer rule of [`cast_value`] from a float.
pub fn literal(dtype: DType, v: f64) -> f64 {
    cast_value(DType::F32, dtype, v)
}

// W. J. Cody, "Rational Chebyshev approximations for the error function", Math. Comp. 23
// (1969), coefficients as in SPECFUN's CALERF.
const ERF_A: [f64; 5] = [
    3.161_123_743_870_565_6,
    113.864_154_151_050_16,
    377.485_237_685_302_02,
    3_209.377_589_138_469_5,
    0.185_777_706_184_603_15,
];
const ERF_B: [f64; 4] =
    [23.601_290_952_344_12, 244.024_637_934_444_17, 1_282.616_526_077_372_3, 2_844.236_833_439_170_6];
const ERF_C: [f64; 9] = [
    0.564_188_496_988_670_1,
    8.883_149_794_388_376,
    66.119_190_637_141_63,
    298.635_138_197_400_1,
    881.952_221_241_769_1,
    1_712.047_612_634_070_6,
    2_051.078_377_826_071_5,
    1_230.339_354_797_997_2,
    2.153_115_354_744_038_5e-8,
];
const ERF_D: [f64; 8] = [
    15.744_926_110_709_835,
    117.693_950_891_312_5,
    537.181_101_862_009_9,
    1_621.389_574_566_690_2,
    3_290.799_235_733_459_6,
    4_362.619_090_143_247,
    3_439.367_674_143_721_6,
    1_230.339_354_803_749_4,
];
const ERF_P: [f64; 6] = [
    0.305_326_634_961_232_36,
    0.360_344_899_949_804_45,
    0.125_781_726_111_229_24,
    0.016_083_785_148_742_275,
    6.587_491_615_298_378e-4,
    0.016_315_387_137_302_097,
];
const ERF_Q: [f64; 5] = [
    2.568_520_192_289_822,
    1.872_952_849_923_467_3,
    0.527_905_102_951_428_4,
    0.060_518_341_312_441_32,
    2.335_204_976_268_691_8e-3,
];

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
        let mut num = ERF_A[4] * ysq;
        let mut den = ysq;
        for i in 0..3 {
            num = (num + ERF_A[i]) * ysq;
            den = (den + ERF_B[i]) * ysq;
        }
        return x * (num + ERF_A[3]) / (den + ERF_B[3]);
    }
    // erfc(y) for y > 0.46875.
    let erfc = if y <= 4.0 {
        let mut num = ERF_C[8] * y;
        let mut den = y;
        for i in 0..7 {
            num = (num + ERF_C[i]) * y;
            den = (den + ERF_D[i]) * y;
        }
        exp_neg_sq(y) * (num + ERF_C[7]) / (den + ERF_D[7])
    } else if y >= 26.543 {
        0.0
    } else {
        let ysq = 1.0 / (y * y);
        let mut num = ERF_P[5] * ysq;
        let mut den = ysq;
        for i in 0..4 {
            num = (num + ERF_P[i]) * ysq;
            den = (den + ERF_Q[i]) * ysq;
        }
        let r = ysq * (num + ERF_P[4]) / (den + ERF_Q[4]);
        let frac_1_sqrt_pi = 0.564_189_583_547_756_3;
        exp_neg_sq(y) * (frac_1_sqrt_pi - r) / y
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
