// kernel add+full+broadcast+mul+tanh+sub+add+full+broadcast+mul+tanh+sub+add+full+broadcast+mul+tanh+sub+add+full+broadcast+mul+tanh+sub+add+full+broadcast+mul+tanh+sub (1 workgroups)
enable f16;

@group(0) @binding(0) var<storage, read_write> b0: array<vec4<f16>>;
@group(0) @binding(1) var<storage, read_write> b1: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read_write> b2: array<vec4<f16>>;

fn v0(i: u32) -> f32 {
    return f32(b0[i >> 2u][i & 3u]);
}

fn v1(i: u32) -> f32 {
    return f32(b1[i >> 2u][i & 3u]);
}

// add : f16[1000]
fn v2(i: u32) -> f32 {
    return fg_round_f16((v0(i) + v1(i)));
}

// full : f16[]
fn v3(i: u32) -> f32 {
    return 0.5f;
}

// broadcast : f16[1000]
fn v4(i: u32) -> f32 {
    var cr = i;
    let c0 = cr;
    return v3(0u);
}

// mul : f16[1000]
fn v5(i: u32) -> f32 {
    return fg_round_f16((v2(i) * v4(i)));
}

// tanh : f16[1000]
fn v6(i: u32) -> f32 {
    return fg_round_f16(fg_tanh(v5(i)));
}

// sub : f16[1000]
fn v7(i: u32) -> f32 {
    return fg_round_f16((v6(i) - v1(i)));
}

// add : f16[1000]
fn v8(i: u32) -> f32 {
    return fg_round_f16((v7(i) + v1(i)));
}

// full : f16[]
fn v9(i: u32) -> f32 {
    return 0.5f;
}

// broadcast : f16[1000]
fn v10(i: u32) -> f32 {
    var cr = i;
    let c0 = cr;
    return v9(0u);
}

// mul : f16[1000]
fn v11(i: u32) -> f32 {
    return fg_round_f16((v8(i) * v10(i)));
}

// tanh : f16[1000]
fn v12(i: u32) -> f32 {
    return fg_round_f16(fg_tanh(v11(i)));
}

// sub : f16[1000]
fn v13(i: u32) -> f32 {
    return fg_round_f16((v12(i) - v1(i)));
}

// add : f16[1000]
fn v14(i: u32) -> f32 {
    return fg_round_f16((v13(i) + v1(i)));
}

// full : f16[]
fn v15(i: u32) -> f32 {
    return 0.5f;
}

// broadcast : f16[1000]
fn v16(i: u32) -> f32 {
    var cr = i;
    let c0 = cr;
    return v15(0u);
}

// mul : f16[1000]
fn v17(i: u32) -> f32 {
    return fg_round_f16((v14(i) * v16(i)));
}

// tanh : f16[1000]
fn v18(i: u32) -> f32 {
    return fg_round_f16(fg_tanh(v17(i)));
}

// sub : f16[1000]
fn v19(i: u32) -> f32 {
    return fg_round_f16((v18(i) - v1(i)));
}

// add : f16[1000]
fn v20(i: u32) -> f32 {
    return fg_round_f16((v19(i) + v1(i)));
}

// full : f16[]
fn v21(i: u32) -> f32 {
    return 0.5f;
}

// broadcast : f16[1000]
fn v22(i: u32) -> f32 {
    var cr = i;
    let c0 = cr;
    return v21(0u);
}

// mul : f16[1000]
fn v23(i: u32) -> f32 {
    return fg_round_f16((v20(i) * v22(i)));
}

// tanh : f16[1000]
fn v24(i: u32) -> f32 {
    return fg_round_f16(fg_tanh(v23(i)));
}

// sub : f16[1000]
fn v25(i: u32) -> f32 {
    return fg_round_f16((v24(i) - v1(i)));
}

// add : f16[1000]
fn v26(i: u32) -> f32 {
    return fg_round_f16((v25(i) + v1(i)));
}

// full : f16[]
fn v27(i: u32) -> f32 {
    return 0.5f;
}

// broadcast : f16[1000]
fn v28(i: u32) -> f32 {
    var cr = i;
    let c0 = cr;
    return v27(0u);
}

// mul : f16[1000]
fn v29(i: u32) -> f32 {
    return fg_round_f16((v26(i) * v28(i)));
}

// tanh : f16[1000]
fn v30(i: u32) -> f32 {
    return fg_round_f16(fg_tanh(v29(i)));
}

// sub : f16[1000]
fn v31(i: u32) -> f32 {
    return fg_round_f16((v30(i) - v1(i)));
}

fn e31(i: u32) -> f32 {
    let y0 = v0(i);
    let y1 = v1(i);
    let x2 = fg_round_f16((y0 + y1));
    let x4 = v4(i);
    let x5 = fg_round_f16((x2 * x4));
    let x6 = fg_round_f16(fg_tanh(x5));
    let x7 = fg_round_f16((x6 - y1));
    let x8 = fg_round_f16((x7 + y1));
    let x10 = v10(i);
    let x11 = fg_round_f16((x8 * x10));
    let x12 = fg_round_f16(fg_tanh(x11));
    let x13 = fg_round_f16((x12 - y1));
    let x14 = fg_round_f16((x13 + y1));
    let x16 = v16(i);
    let x17 = fg_round_f16((x14 * x16));
    let x18 = fg_round_f16(fg_tanh(x17));
    let x19 = fg_round_f16((x18 - y1));
    let x20 = fg_round_f16((x19 + y1));
    let x22 = v22(i);
    let x23 = fg_round_f16((x20 * x22));
    let x24 = fg_round_f16(fg_tanh(x23));
    let x25 = fg_round_f16((x24 - y1));
    let x26 = fg_round_f16((x25 + y1));
    let x28 = v28(i);
    let x29 = fg_round_f16((x26 * x28));
    let x30 = fg_round_f16(fg_tanh(x29));
    let x31 = fg_round_f16((x30 - y1));
    return x31;
}

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
    var r = select(n, s, a < 0x38800000u);
    r = select(r, bitcast<f32>((b & 0x80000000u) | 0x7f800000u), a >= 0x477ff000u);
    return select(r, x, a > 0x7f800000u);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let stride = nwg.x * nwg.y * 256u;
    for (var t = (wid.y * nwg.x + wid.x) * 256u + lid; t < 250u; t = t + stride) {
        let i_0 = 4u * t + 0u;
        let i_1 = 4u * t + 1u;
        let i_2 = 4u * t + 2u;
        let i_3 = 4u * t + 3u;
        let vq0 = b0[i_0 >> 2u];
        let y0_0 = f32(vq0[0u]);
        let y0_1 = f32(vq0[1u]);
        let y0_2 = f32(vq0[2u]);
        let y0_3 = f32(vq0[3u]);
        let vq1 = b1[i_0 >> 2u];
        let y1_0 = f32(vq1[0u]);
        let y1_1 = f32(vq1[1u]);
        let y1_2 = f32(vq1[2u]);
        let y1_3 = f32(vq1[3u]);
        let x2_0 = fg_round_f16((y0_0 + y1_0));
        let x2_1 = fg_round_f16((y0_1 + y1_1));
        let x2_2 = fg_round_f16((y0_2 + y1_2));
        let x2_3 = fg_round_f16((y0_3 + y1_3));
        let x4_0 = v4(i_0);
        let x4_1 = v4(i_1);
        let x4_2 = v4(i_2);
        let x4_3 = v4(i_3);
        let x5_0 = fg_round_f16((x2_0 * x4_0));
        let x5_1 = fg_round_f16((x2_1 * x4_1));
        let x5_2 = fg_round_f16((x2_2 * x4_2));
        let x5_3 = fg_round_f16((x2_3 * x4_3));
        let x6_0 = fg_round_f16(fg_tanh(x5_0));
        let x6_1 = fg_round_f16(fg_tanh(x5_1));
        let x6_2 = fg_round_f16(fg_tanh(x5_2));
        let x6_3 = fg_round_f16(fg_tanh(x5_3));
        let x7_0 = fg_round_f16((x6_0 - y1_0));
        let x7_1 = fg_round_f16((x6_1 - y1_1));
        let x7_2 = fg_round_f16((x6_2 - y1_2));
        let x7_3 = fg_round_f16((x6_3 - y1_3));
        let x8_0 = fg_round_f16((x7_0 + y1_0));
        let x8_1 = fg_round_f16((x7_1 + y1_1));
        let x8_2 = fg_round_f16((x7_2 + y1_2));
        let x8_3 = fg_round_f16((x7_3 + y1_3));
        let x10_0 = v10(i_0);
        let x10_1 = v10(i_1);
        let x10_2 = v10(i_2);
        let x10_3 = v10(i_3);
        let x11_0 = fg_round_f16((x8_0 * x10_0));
        let x11_1 = fg_round_f16((x8_1 * x10_1));
        let x11_2 = fg_round_f16((x8_2 * x10_2));
        let x11_3 = fg_round_f16((x8_3 * x10_3));
        let x12_0 = fg_round_f16(fg_tanh(x11_0));
        let x12_1 = fg_round_f16(fg_tanh(x11_1));
        let x12_2 = fg_round_f16(fg_tanh(x11_2));
        let x12_3 = fg_round_f16(fg_tanh(x11_3));
        let x13_0 = fg_round_f16((x12_0 - y1_0));
        let x13_1 = fg_round_f16((x12_1 - y1_1));
        let x13_2 = fg_round_f16((x12_2 - y1_2));
        let x13_3 = fg_round_f16((x12_3 - y1_3));
        let x14_0 = fg_round_f16((x13_0 + y1_0));
        let x14_1 = fg_round_f16((x13_1 + y1_1));
        let x14_2 = fg_round_f16((x13_2 + y1_2));
        let x14_3 = fg_round_f16((x13_3 + y1_3));
        let x16_0 = v16(i_0);
        let x16_1 = v16(i_1);
        let x16_2 = v16(i_2);
        let x16_3 = v16(i_3);
        let x17_0 = fg_round_f16((x14_0 * x16_0));
        let x17_1 = fg_round_f16((x14_1 * x16_1));
        let x17_2 = fg_round_f16((x14_2 * x16_2));
        let x17_3 = fg_round_f16((x14_3 * x16_3));
        let x18_0 = fg_round_f16(fg_tanh(x17_0));
        let x18_1 = fg_round_f16(fg_tanh(x17_1));
        let x18_2 = fg_round_f16(fg_tanh(x17_2));
        let x18_3 = fg_round_f16(fg_tanh(x17_3));
        let x19_0 = fg_round_f16((x18_0 - y1_0));
        let x19_1 = fg_round_f16((x18_1 - y1_1));
        let x19_2 = fg_round_f16((x18_2 - y1_2));
        let x19_3 = fg_round_f16((x18_3 - y1_3));
        let x20_0 = fg_round_f16((x19_0 + y1_0));
        let x20_1 = fg_round_f16((x19_1 + y1_1));
        let x20_2 = fg_round_f16((x19_2 + y1_2));
        let x20_3 = fg_round_f16((x19_3 + y1_3));
        let x22_0 = v22(i_0);
        let x22_1 = v22(i_1);
        let x22_2 = v22(i_2);
        let x22_3 = v22(i_3);
        let x23_0 = fg_round_f16((x20_0 * x22_0));
        let x23_1 = fg_round_f16((x20_1 * x22_1));
        let x23_2 = fg_round_f16((x20_2 * x22_2));
        let x23_3 = fg_round_f16((x20_3 * x22_3));
        let x24_0 = fg_round_f16(fg_tanh(x23_0));
        let x24_1 = fg_round_f16(fg_tanh(x23_1));
        let x24_2 = fg_round_f16(fg_tanh(x23_2));
        let x24_3 = fg_round_f16(fg_tanh(x23_3));
        let x25_0 = fg_round_f16((x24_0 - y1_0));
        let x25_1 = fg_round_f16((x24_1 - y1_1));
        let x25_2 = fg_round_f16((x24_2 - y1_2));
        let x25_3 = fg_round_f16((x24_3 - y1_3));
        let x26_0 = fg_round_f16((x25_0 + y1_0));
        let x26_1 = fg_round_f16((x25_1 + y1_1));
        let x26_2 = fg_round_f16((x25_2 + y1_2));
        let x26_3 = fg_round_f16((x25_3 + y1_3));
        let x28_0 = v28(i_0);
        let x28_1 = v28(i_1);
        let x28_2 = v28(i_2);
        let x28_3 = v28(i_3);
        let x29_0 = fg_round_f16((x26_0 * x28_0));
        let x29_1 = fg_round_f16((x26_1 * x28_1));
        let x29_2 = fg_round_f16((x26_2 * x28_2));
        let x29_3 = fg_round_f16((x26_3 * x28_3));
        let x30_0 = fg_round_f16(fg_tanh(x29_0));
        let x30_1 = fg_round_f16(fg_tanh(x29_1));
        let x30_2 = fg_round_f16(fg_tanh(x29_2));
        let x30_3 = fg_round_f16(fg_tanh(x29_3));
        let x31_0 = fg_round_f16((x30_0 - y1_0));
        let x31_1 = fg_round_f16((x30_1 - y1_1));
        let x31_2 = fg_round_f16((x30_2 - y1_2));
        let x31_3 = fg_round_f16((x30_3 - y1_3));
        b2[t] = vec4<f16>(f16(x31_0), f16(x31_1), f16(x31_2), f16(x31_3));
    }
}
