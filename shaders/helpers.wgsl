// Helper functions shared by generated kernels. The lowering copies in the ones a kernel
// calls; each starts at a line `// fn NAME` so it can be picked out by name.

// fn fg_erf
// The error function (Abramowitz & Stegun 7.1.26, absolute error below 1.5e-7).
fn fg_erf(x: f32) -> f32 {
    let a = abs(x);
    let t = 1.0f / (1.0f + 0.3275911f * a);
    let poly = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
    return sign(x) * (1.0f - poly * exp(-a * a));
}

// fn fg_tanh
// tanh as a rational minimax fit on [-7.9053, 7.9053] (the f32 coefficients Eigen and XLA's
// CPU backend use; relative error below 3e-7 over [-12, 12], where it is ±1 to f32 beyond,
// and down to 1e-30, simulated in f32), NaN for NaN. Nine multiply-adds and one division,
// written as `fma` (a driver may not fuse `a * b + c` itself). Drivers may lower the builtin
// to two exponentials and a division (lavapipe: about 40 instructions against 25).
fn fg_tanh(x: f32) -> f32 {
    let c = clamp(x, -7.90531110763549805f, 7.90531110763549805f);
    let c2 = c * c;
    var p = fma(c2, -2.76076847742355e-16f, 2.00018790482477e-13f);
    p = fma(p, c2, -8.60467152213735e-11f);
    p = fma(p, c2, 5.12229709037114e-8f);
    p = fma(p, c2, 1.48572235717979e-5f);
    p = fma(p, c2, 6.37261928875436e-4f);
    p = fma(p, c2, 4.89352455891786e-3f);
    var q = fma(c2, 1.19825839466702e-6f, 1.18534705686654e-4f);
    q = fma(q, c2, 2.26843463243900e-3f);
    q = fma(q, c2, 4.89352518554385e-3f);
    // NaN by its bits: a compiler may fold `x != x` to false (WGSL lets it assume no NaNs).
    let nan = (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
    return select(c * p / q, x, nan);
}

// fn fg_round_f16
// f32 to the nearest f16 value (ties to even), kept in f32: f16 subnormals kept, ±inf from
// 65520 up, NaN stays NaN (the reference's cast). Integer operations and one `round`:
// SPIR-V's `quantizeToF16` flushes f16 subnormals to zero, and lavapipe converts its lanes
// one at a time (the cast of the f32 weights made a mixed-precision matmul ~40% slower).
fn fg_round_f16(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    let a = b & 0x7fffffffu;
    // Normal halves: drop the 13 low mantissa bits, ties to even (a carry into the exponent
    // is the right result).
    let n = bitcast<f32>((b + 0xfffu + ((b >> 13u) & 1u)) & 0xffffe000u);
    // Below 2^-14: the nearest multiple of 2^-24 (both scalings are exact).
    let s = round(x * 0x1p24f) * 0x1p-24f;
    let r = select(n, s, a < 0x38800000u);
    // From 65520 (and ±inf, NaN): x·2^127 overflows to ±inf with x's sign, and a NaN stays
    // NaN (one multiply, where testing the sign, the infinity and a NaN would take five operations).
    return select(r, x * 0x1p127f, a >= 0x477ff000u);
}

// fn fg_iq4nl4
// The IQ4_NL levels of four nibbles as f32: llama.cpp's `kvalues_iq4nl` (-127, -104, -83,
// -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113; `fusegraph_ir::quant::IQ4NL_LEVELS`)
// as bytes in four words, level `n` byte `n mod 4` of word `n / 4`, sign-extended.
fn fg_iq4nl4(n: vec4<u32>) -> vec4<f32> {
    let lo = select(vec4<u32>(0xbfad9881u), vec4<u32>(0xf6eaddcfu), n >= vec4<u32>(4u));
    let hi = select(vec4<u32>(0x26190d01u), vec4<u32>(0x71594535u), n >= vec4<u32>(12u));
    let w = select(lo, hi, n >= vec4<u32>(8u));
    return vec4<f32>(bitcast<vec4<i32>>(w << ((vec4<u32>(3u) - (n & vec4<u32>(3u))) * 8u)) >> vec4<u32>(24u));
}

// fn fg_iq4nl
// The IQ4_NL level of one nibble (see fg_iq4nl4).
fn fg_iq4nl(n: u32) -> f32 {
    return fg_iq4nl4(vec4<u32>(n)).x;
}

// fn fg_mxfp4
// The MXFP4 level of one nibble: FP4 (E2M1) doubled (0, 1, 2, 3, 4, 6, 8, 12, their negatives
// from 8; `fusegraph_ir::quant::MXFP4_LEVELS`): below 4 the magnitude itself, from 4 two or
// three times a power of two.
fn fg_mxfp4(n: u32) -> f32 {
    let m = n & 7u;
    let v = select(m, (2u + (m & 1u)) << (max(m >> 1u, 1u) - 1u), m >= 4u);
    return select(f32(v), -f32(v), n >= 8u);
}

// fn fg_e8m0_half
// An E8M0 scale byte as `2^(e − 128)` (`fusegraph_ir::quant::e8m0_half`; subnormal below 2).
fn fg_e8m0_half(e: u32) -> f32 {
    return bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << e, e < 2u));
}

// fn fg_round_f16x4
// `fg_round_f16` of each component.
fn fg_round_f16x4(v: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(fg_round_f16(v.x), fg_round_f16(v.y), fg_round_f16(v.z), fg_round_f16(v.w));
}

// fn fg_f16x4_from_words
// Four f16 values, two to a word (the first in the low half), to f32, exactly: subnormals,
// ±0, ±inf and NaN included. Integer operations and one conversion: a CPU adapter's own
// f16 conversions are slower (lavapipe: a 16 Mi-element f16 copy 32–37 ms through
// `vec4<f16>`, 20–24 ms through these, 23 ms for an f32 copy of twice the bytes).
fn fg_f16x4_from_words(w: vec2<u32>) -> vec4<f32> {
    let h = vec4<u32>(w.x & 0xffffu, w.x >> 16u, w.y & 0xffffu, w.y >> 16u);
    let em = h & vec4<u32>(0x7fffu);
    // Normal: rebias the exponent (15 to 127). Subnormal: the integer times 2^-24 (no f32
    // subnormal in between, which a driver may flush). Inf and NaN: the top exponent.
    let normal = bitcast<vec4<f32>>((em << vec4<u32>(13u)) + vec4<u32>(0x38000000u));
    let sub = vec4<f32>(em) * 0x1p-24f;
    let special = bitcast<vec4<f32>>((em << vec4<u32>(13u)) | vec4<u32>(0x7f800000u));
    let r = select(select(normal, sub, em < vec4<u32>(0x400u)), special, em >= vec4<u32>(0x7c00u));
    return bitcast<vec4<f32>>(bitcast<vec4<u32>>(r) | ((h & vec4<u32>(0x8000u)) << vec4<u32>(16u)));
}

// fn fg_f16x4_to_words
// Four f16 values held in f32 to f16, two to a word (the first in the low half): exact for
// every f16 value, ±0, ±inf and NaN (made quiet) — every f16 value a kernel computes is
// rounded to one already (`fg_round_f16`), so no rounding here. Integer operations and one
// conversion (see `fg_f16x4_from_words`).
fn fg_f16x4_to_words(x: vec4<f32>) -> vec2<u32> {
    let b = bitcast<vec4<u32>>(x);
    let a = b & vec4<u32>(0x7fffffffu);
    // From 2^-14: rebias the exponent, drop the 13 zero mantissa bits. Below: the multiple
    // of 2^-24.
    let normal = (a - vec4<u32>(0x38000000u)) >> vec4<u32>(13u);
    var h = select(normal, vec4<u32>(abs(x) * 0x1p24f), a < vec4<u32>(0x38800000u));
    h = select(h, vec4<u32>(0x7c00u), a >= vec4<u32>(0x7f800000u));
    h = select(h, vec4<u32>(0x7e00u), a > vec4<u32>(0x7f800000u));
    h = h | ((b >> vec4<u32>(16u)) & vec4<u32>(0x8000u));
    return vec2<u32>(h.x | (h.y << 16u), h.z | (h.w << 16u));
}

// fn fg_div_i32
// Integer division with WGSL's rules made explicit: x / 0 = x and MIN / -1 = MIN.
fn fg_div_i32(a: i32, b: i32) -> i32 {
    let bad = b == 0i || (a == bitcast<i32>(0x80000000u) && b == -1i);
    return select(a / select(b, 1i, bad), a, bad);
}

// fn fg_div_u32
// Unsigned division with x / 0 = x.
fn fg_div_u32(a: u32, b: u32) -> u32 {
    return select(a / select(b, 1u, b == 0u), a, b == 0u);
}

// fn fg_f2i
// Float to i32: truncate toward zero, saturate, NaN to 0.
fn fg_f2i(x: f32) -> i32 {
    if (x != x) { return 0i; }
    if (x >= 2147483648.0f) { return 2147483647i; }
    if (x <= -2147483648.0f) { return bitcast<i32>(0x80000000u); }
    return i32(x);
}

// fn fg_f2u
// Float to u32: truncate toward zero, saturate, NaN to 0.
fn fg_f2u(x: f32) -> u32 {
    if (x != x || x <= 0.0f) { return 0u; }
    if (x >= 4294967296.0f) { return 4294967295u; }
    return u32(x);
}
