// kernel matmul+full+broadcast+max+broadcast+add+full+broadcast+mul+erf+full+broadcast+add+mul+full+broadcast+mul (1 workgroups)
enable f16;
enable wgpu_cooperative_matrix;

@group(0) @binding(0) var<storage, read_write> b0: array<f16>;
@group(0) @binding(1) var<storage, read_write> b1: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read_write> b2: array<f16>;
@group(0) @binding(3) var<storage, read_write> b3: array<vec4<f16>>;

fn v0(i: u32) -> f32 {
    return f32(b0[i]);
}

fn v1(i: u32) -> f32 {
    return f32(b1[i >> 2u][i & 3u]);
}

fn v2(i: u32) -> f32 {
    return f32(b2[i]);
}

// matmul : f16[9,20]
fn v3(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 20u;
    cr = cr / 20u;
    let c0 = cr;
    var acc: f32 = 0.0f;
    for (var kk = 0u; kk < 33u; kk = kk + 1u) {
        acc = acc + v0(c0 * 33u + kk) * v1(kk * 20u + c1);
    }
    return fg_round_f16(acc);
}

// full : f16[]
fn v4(i: u32) -> f32 {
    return 0.0f;
}

// broadcast : f16[9,20]
fn v5(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 20u;
    cr = cr / 20u;
    let c0 = cr;
    return v4(0u);
}

// max : f16[9,20]
fn v6(i: u32) -> f32 {
    return max(v3(i), v5(i));
}

// broadcast : f16[9,20]
fn v7(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 20u;
    cr = cr / 20u;
    let c0 = cr;
    return v2(c1);
}

// add : f16[9,20]
fn v8(i: u32) -> f32 {
    return fg_round_f16((v6(i) + v7(i)));
}

// full : f16[]
fn v9(i: u32) -> f32 {
    return 0.70703125f;
}

// broadcast : f16[9,20]
fn v10(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 20u;
    cr = cr / 20u;
    let c0 = cr;
    return v9(0u);
}

// mul : f16[9,20]
fn v11(i: u32) -> f32 {
    return fg_round_f16((v8(i) * v10(i)));
}

// erf : f16[9,20]
fn v12(i: u32) -> f32 {
    return fg_round_f16(fg_erf(v11(i)));
}

// full : f16[]
fn v13(i: u32) -> f32 {
    return 1.0f;
}

// broadcast : f16[9,20]
fn v14(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 20u;
    cr = cr / 20u;
    let c0 = cr;
    return v13(0u);
}

// add : f16[9,20]
fn v15(i: u32) -> f32 {
    return fg_round_f16((v12(i) + v14(i)));
}

// mul : f16[9,20]
fn v16(i: u32) -> f32 {
    return fg_round_f16((v8(i) * v15(i)));
}

// full : f16[]
fn v17(i: u32) -> f32 {
    return 0.5f;
}

// broadcast : f16[9,20]
fn v18(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 20u;
    cr = cr / 20u;
    let c0 = cr;
    return v17(0u);
}

// mul : f16[9,20]
fn v19(i: u32) -> f32 {
    return fg_round_f16((v16(i) * v18(i)));
}

fn e19_acc(i: u32, acc: f32, h7: f32) -> f32 {
    let x3 = fg_round_f16(acc);
    let x5 = v5(i);
    let x6 = max(x3, x5);
    let x7 = h7;
    let x8 = fg_round_f16((x6 + x7));
    let x10 = v10(i);
    let x11 = fg_round_f16((x8 * x10));
    let x12 = fg_round_f16(fg_erf(x11));
    let x14 = v14(i);
    let x15 = fg_round_f16((x12 + x14));
    let x16 = fg_round_f16((x8 * x15));
    let x18 = v18(i);
    let x19 = fg_round_f16((x16 * x18));
    return x19;
}

var<workgroup> fg_tile_a: array<f16, 2048>;
var<workgroup> fg_tile_b: array<f16, 2048>;
var<workgroup> fg_tile_c: array<f32, 2048>;

// The error function (Abramowitz & Stegun 7.1.26, absolute error below 1.5e-7).
fn fg_erf(x: f32) -> f32 {
    let a = abs(x);
    let t = 1.0f / (1.0f + 0.3275911f * a);
    let poly = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
    return sign(x) * (1.0f - poly * exp(-a * a));
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
    let r = select(n, s, a < 0x38800000u);
    // From 65520 (and ±inf, NaN): x·2^127 overflows to ±inf with x's sign, and a NaN stays
    // NaN (one multiply, where testing the sign, the infinity and a NaN would take five operations).
    return select(r, x * 0x1p127f, a >= 0x477ff000u);
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg_id: u32) {
    let wg = wid.y * nwg.x + wid.x;
    if (wg >= 1u) { return; }
    let tile_col = wg % 1u;
    let tile_row = (wg / 1u) % 1u;
    let bt = wg / 1u;
    let a_base = 0u;
    let b_base = 0u;
    let o_base = bt * 180u;
    let row0 = tile_row * 64u;
    let col0 = tile_col * 64u;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let sg_row = (sg_id / 2u) * 32u;
    let sg_col = (sg_id % 2u) * 32u;
    var fg_c0_0 = coop_mat16x16<f32, C>();
    var fg_c0_1 = coop_mat16x16<f32, C>();
    var fg_c1_0 = coop_mat16x16<f32, C>();
    var fg_c1_1 = coop_mat16x16<f32, C>();
    var pb0 = vec4<f16>();
    { let kq = (0u + lid) / 16u; let o = ((0u + lid) % 16u) * 4u; if (col0 + o < 20u && 0u + kq < 33u) { pb0 = b1[(col0 + o + (0u + kq) * 20u) >> 2u]; } }
    var pb1 = vec4<f16>();
    { let kq = (128u + lid) / 16u; let o = ((128u + lid) % 16u) * 4u; if (col0 + o < 20u && 0u + kq < 33u) { pb1 = b1[(col0 + o + (0u + kq) * 20u) >> 2u]; } }
    var pb2 = vec4<f16>();
    { let kq = (256u + lid) / 16u; let o = ((256u + lid) % 16u) * 4u; if (col0 + o < 20u && 0u + kq < 33u) { pb2 = b1[(col0 + o + (0u + kq) * 20u) >> 2u]; } }
    var pb3 = vec4<f16>();
    { let kq = (384u + lid) / 16u; let o = ((384u + lid) % 16u) * 4u; if (col0 + o < 20u && 0u + kq < 33u) { pb3 = b1[(col0 + o + (0u + kq) * 20u) >> 2u]; } }
    for (var k0 = 0u; k0 < 33u; k0 = k0 + 32u) {
        for (var l = 0u; l < 4u; l = l + 1u) {
            let e = l * 128u + lid;
            let r = row0 + (e / 32u) * 4u;
            let kk = e % 32u;
            let gk = k0 + kk;
            var x = vec4<f32>();
            if (gk < 33u) {
                if (r + 0u < 9u) { x.x = v0(a_base + (r + 0u) * 33u + gk); }
                if (r + 1u < 9u) { x.y = v0(a_base + (r + 1u) * 33u + gk); }
                if (r + 2u < 9u) { x.z = v0(a_base + (r + 2u) * 33u + gk); }
                if (r + 3u < 9u) { x.w = v0(a_base + (r + 3u) * 33u + gk); }
            }
            let ia = (e / 32u) * 128u + kk;
            fg_tile_a[ia + 0u] = f16(x.x);
            fg_tile_a[ia + 32u] = f16(x.y);
            fg_tile_a[ia + 64u] = f16(x.z);
            fg_tile_a[ia + 96u] = f16(x.w);
        }
        { let kq = (0u + lid) / 16u; let o = ((0u + lid) % 16u) * 4u;
            fg_tile_b[(kq) * 64u + o + 0u] = pb0.x;
            fg_tile_b[(kq) * 64u + o + 1u] = pb0.y;
            fg_tile_b[(kq) * 64u + o + 2u] = pb0.z;
            fg_tile_b[(kq) * 64u + o + 3u] = pb0.w;
        }
        { let kq = (128u + lid) / 16u; let o = ((128u + lid) % 16u) * 4u;
            fg_tile_b[(kq) * 64u + o + 0u] = pb1.x;
            fg_tile_b[(kq) * 64u + o + 1u] = pb1.y;
            fg_tile_b[(kq) * 64u + o + 2u] = pb1.z;
            fg_tile_b[(kq) * 64u + o + 3u] = pb1.w;
        }
        { let kq = (256u + lid) / 16u; let o = ((256u + lid) % 16u) * 4u;
            fg_tile_b[(kq) * 64u + o + 0u] = pb2.x;
            fg_tile_b[(kq) * 64u + o + 1u] = pb2.y;
            fg_tile_b[(kq) * 64u + o + 2u] = pb2.z;
            fg_tile_b[(kq) * 64u + o + 3u] = pb2.w;
        }
        { let kq = (384u + lid) / 16u; let o = ((384u + lid) % 16u) * 4u;
            fg_tile_b[(kq) * 64u + o + 0u] = pb3.x;
            fg_tile_b[(kq) * 64u + o + 1u] = pb3.y;
            fg_tile_b[(kq) * 64u + o + 2u] = pb3.z;
            fg_tile_b[(kq) * 64u + o + 3u] = pb3.w;
        }
        workgroupBarrier();
        pb0 = vec4<f16>();
        { let kq = (0u + lid) / 16u; let o = ((0u + lid) % 16u) * 4u; if (col0 + o < 20u && k0 + 32u + kq < 33u) { pb0 = b1[(col0 + o + (k0 + 32u + kq) * 20u) >> 2u]; } }
        pb1 = vec4<f16>();
        { let kq = (128u + lid) / 16u; let o = ((128u + lid) % 16u) * 4u; if (col0 + o < 20u && k0 + 32u + kq < 33u) { pb1 = b1[(col0 + o + (k0 + 32u + kq) * 20u) >> 2u]; } }
        pb2 = vec4<f16>();
        { let kq = (256u + lid) / 16u; let o = ((256u + lid) % 16u) * 4u; if (col0 + o < 20u && k0 + 32u + kq < 33u) { pb2 = b1[(col0 + o + (k0 + 32u + kq) * 20u) >> 2u]; } }
        pb3 = vec4<f16>();
        { let kq = (384u + lid) / 16u; let o = ((384u + lid) % 16u) * 4u; if (col0 + o < 20u && k0 + 32u + kq < 33u) { pb3 = b1[(col0 + o + (k0 + 32u + kq) * 20u) >> 2u]; } }
        for (var kk = 0u; kk < 32u; kk = kk + 16u) {
            let fa0 = coopLoadT<coop_mat16x16<f16, A>>(&fg_tile_a[(sg_row + 0u) * 32u + kk], 32u);
            let fa1 = coopLoadT<coop_mat16x16<f16, A>>(&fg_tile_a[(sg_row + 16u) * 32u + kk], 32u);
            let fb0 = coopLoadT<coop_mat16x16<f16, B>>(&fg_tile_b[kk * 64u + sg_col + 0u], 64u);
            let fb1 = coopLoadT<coop_mat16x16<f16, B>>(&fg_tile_b[kk * 64u + sg_col + 16u], 64u);
            fg_c0_0 = coopMultiplyAdd(fa0, fb0, fg_c0_0);
            fg_c0_1 = coopMultiplyAdd(fa0, fb1, fg_c0_1);
            fg_c1_0 = coopMultiplyAdd(fa1, fb0, fg_c1_0);
            fg_c1_1 = coopMultiplyAdd(fa1, fb1, fg_c1_1);
        }
        workgroupBarrier();
    }
    var acc0_0 = vec4<f32>();
    var acc1_0 = vec4<f32>();
    var acc2_0 = vec4<f32>();
    var acc3_0 = vec4<f32>();
    var acc4_0 = vec4<f32>();
    var acc5_0 = vec4<f32>();
    var acc6_0 = vec4<f32>();
    var acc7_0 = vec4<f32>();
    let my_pass = ((ty * 8u) % 32u) / 16u;
    let band_row = ((ty * 8u) / 32u) * 16u + (ty * 8u) % 16u;
    coopStoreT(fg_c0_0, &fg_tile_c[(sg_row / 2u) * 64u + sg_col + 0u], 64u);
    coopStoreT(fg_c0_1, &fg_tile_c[(sg_row / 2u) * 64u + sg_col + 16u], 64u);
    workgroupBarrier();
    if (my_pass == 0u) {
        acc0_0 = vec4<f32>(fg_tile_c[(band_row + 0u) * 64u + tx * 4u + 0u], fg_tile_c[(band_row + 0u) * 64u + tx * 4u + 1u], fg_tile_c[(band_row + 0u) * 64u + tx * 4u + 2u], fg_tile_c[(band_row + 0u) * 64u + tx * 4u + 3u]);
        acc1_0 = vec4<f32>(fg_tile_c[(band_row + 1u) * 64u + tx * 4u + 0u], fg_tile_c[(band_row + 1u) * 64u + tx * 4u + 1u], fg_tile_c[(band_row + 1u) * 64u + tx * 4u + 2u], fg_tile_c[(band_row + 1u) * 64u + tx * 4u + 3u]);
        acc2_0 = vec4<f32>(fg_tile_c[(band_row + 2u) * 64u + tx * 4u + 0u], fg_tile_c[(band_row + 2u) * 64u + tx * 4u + 1u], fg_tile_c[(band_row + 2u) * 64u + tx * 4u + 2u], fg_tile_c[(band_row + 2u) * 64u + tx * 4u + 3u]);
        acc3_0 = vec4<f32>(fg_tile_c[(band_row + 3u) * 64u + tx * 4u + 0u], fg_tile_c[(band_row + 3u) * 64u + tx * 4u + 1u], fg_tile_c[(band_row + 3u) * 64u + tx * 4u + 2u], fg_tile_c[(band_row + 3u) * 64u + tx * 4u + 3u]);
        acc4_0 = vec4<f32>(fg_tile_c[(band_row + 4u) * 64u + tx * 4u + 0u], fg_tile_c[(band_row + 4u) * 64u + tx * 4u + 1u], fg_tile_c[(band_row + 4u) * 64u + tx * 4u + 2u], fg_tile_c[(band_row + 4u) * 64u + tx * 4u + 3u]);
        acc5_0 = vec4<f32>(fg_tile_c[(band_row + 5u) * 64u + tx * 4u + 0u], fg_tile_c[(band_row + 5u) * 64u + tx * 4u + 1u], fg_tile_c[(band_row + 5u) * 64u + tx * 4u + 2u], fg_tile_c[(band_row + 5u) * 64u + tx * 4u + 3u]);
        acc6_0 = vec4<f32>(fg_tile_c[(band_row + 6u) * 64u + tx * 4u + 0u], fg_tile_c[(band_row + 6u) * 64u + tx * 4u + 1u], fg_tile_c[(band_row + 6u) * 64u + tx * 4u + 2u], fg_tile_c[(band_row + 6u) * 64u + tx * 4u + 3u]);
        acc7_0 = vec4<f32>(fg_tile_c[(band_row + 7u) * 64u + tx * 4u + 0u], fg_tile_c[(band_row + 7u) * 64u + tx * 4u + 1u], fg_tile_c[(band_row + 7u) * 64u + tx * 4u + 2u], fg_tile_c[(band_row + 7u) * 64u + tx * 4u + 3u]);
    }
    workgroupBarrier();
    coopStoreT(fg_c1_0, &fg_tile_c[(sg_row / 2u) * 64u + sg_col + 0u], 64u);
    coopStoreT(fg_c1_1, &fg_tile_c[(sg_row / 2u) * 64u + sg_col + 16u], 64u);
    workgroupBarrier();
    if (my_pass == 1u) {
        acc0_0 = vec4<f32>(fg_tile_c[(band_row + 0u) * 64u + tx * 4u + 0u], fg_tile_c[(band_row + 0u) * 64u + tx * 4u + 1u], fg_tile_c[(band_row + 0u) * 64u + tx * 4u + 2u], fg_tile_c[(band_row + 0u) * 64u + tx * 4u + 3u]);
        acc1_0 = vec4<f32>(fg_tile_c[(band_row + 1u) * 64u + tx * 4u + 0u], fg_tile_c[(band_row + 1u) * 64u + tx * 4u + 1u], fg_tile_c[(band_row + 1u) * 64u + tx * 4u + 2u], fg_tile_c[(band_row + 1u) * 64u + tx * 4u + 3u]);
        acc2_0 = vec4<f32>(fg_tile_c[(band_row + 2u) * 64u + tx * 4u + 0u], fg_tile_c[(band_row + 2u) * 64u + tx * 4u + 1u], fg_tile_c[(band_row + 2u) * 64u + tx * 4u + 2u], fg_tile_c[(band_row + 2u) * 64u + tx * 4u + 3u]);
        acc3_0 = vec4<f32>(fg_tile_c[(band_row + 3u) * 64u + tx * 4u + 0u], fg_tile_c[(band_row + 3u) * 64u + tx * 4u + 1u], fg_tile_c[(band_row + 3u) * 64u + tx * 4u + 2u], fg_tile_c[(band_row + 3u) * 64u + tx * 4u + 3u]);
        acc4_0 = vec4<f32>(fg_tile_c[(band_row + 4u) * 64u + tx * 4u + 0u], fg_tile_c[(band_row + 4u) * 64u + tx * 4u + 1u], fg_tile_c[(band_row + 4u) * 64u + tx * 4u + 2u], fg_tile_c[(band_row + 4u) * 64u + tx * 4u + 3u]);
        acc5_0 = vec4<f32>(fg_tile_c[(band_row + 5u) * 64u + tx * 4u + 0u], fg_tile_c[(band_row + 5u) * 64u + tx * 4u + 1u], fg_tile_c[(band_row + 5u) * 64u + tx * 4u + 2u], fg_tile_c[(band_row + 5u) * 64u + tx * 4u + 3u]);
        acc6_0 = vec4<f32>(fg_tile_c[(band_row + 6u) * 64u + tx * 4u + 0u], fg_tile_c[(band_row + 6u) * 64u + tx * 4u + 1u], fg_tile_c[(band_row + 6u) * 64u + tx * 4u + 2u], fg_tile_c[(band_row + 6u) * 64u + tx * 4u + 3u]);
        acc7_0 = vec4<f32>(fg_tile_c[(band_row + 7u) * 64u + tx * 4u + 0u], fg_tile_c[(band_row + 7u) * 64u + tx * 4u + 1u], fg_tile_c[(band_row + 7u) * 64u + tx * 4u + 2u], fg_tile_c[(band_row + 7u) * 64u + tx * 4u + 3u]);
    }
    let gc0 = col0 + tx * 4u;
    let h7_0 = v7(o_base + min(row0 + ty * 8u, 8u) * 20u + min(gc0 + 0u, 19u));
    let h7_1 = v7(o_base + min(row0 + ty * 8u, 8u) * 20u + min(gc0 + 1u, 19u));
    let h7_2 = v7(o_base + min(row0 + ty * 8u, 8u) * 20u + min(gc0 + 2u, 19u));
    let h7_3 = v7(o_base + min(row0 + ty * 8u, 8u) * 20u + min(gc0 + 3u, 19u));
    if (row0 + ty * 8u + 0u < 9u) {
        let idx = o_base + (row0 + ty * 8u + 0u) * 20u;
        if (gc0 + 0u < 20u) { b3[(idx + gc0 + 0u) >> 2u] = vec4<f16>(f16(e19_acc(idx + gc0 + 0u, acc0_0.x, h7_0)), f16(e19_acc(idx + gc0 + 1u, acc0_0.y, h7_1)), f16(e19_acc(idx + gc0 + 2u, acc0_0.z, h7_2)), f16(e19_acc(idx + gc0 + 3u, acc0_0.w, h7_3))); }
    }
    if (row0 + ty * 8u + 1u < 9u) {
        let idx = o_base + (row0 + ty * 8u + 1u) * 20u;
        if (gc0 + 0u < 20u) { b3[(idx + gc0 + 0u) >> 2u] = vec4<f16>(f16(e19_acc(idx + gc0 + 0u, acc1_0.x, h7_0)), f16(e19_acc(idx + gc0 + 1u, acc1_0.y, h7_1)), f16(e19_acc(idx + gc0 + 2u, acc1_0.z, h7_2)), f16(e19_acc(idx + gc0 + 3u, acc1_0.w, h7_3))); }
    }
    if (row0 + ty * 8u + 2u < 9u) {
        let idx = o_base + (row0 + ty * 8u + 2u) * 20u;
        if (gc0 + 0u < 20u) { b3[(idx + gc0 + 0u) >> 2u] = vec4<f16>(f16(e19_acc(idx + gc0 + 0u, acc2_0.x, h7_0)), f16(e19_acc(idx + gc0 + 1u, acc2_0.y, h7_1)), f16(e19_acc(idx + gc0 + 2u, acc2_0.z, h7_2)), f16(e19_acc(idx + gc0 + 3u, acc2_0.w, h7_3))); }
    }
    if (row0 + ty * 8u + 3u < 9u) {
        let idx = o_base + (row0 + ty * 8u + 3u) * 20u;
        if (gc0 + 0u < 20u) { b3[(idx + gc0 + 0u) >> 2u] = vec4<f16>(f16(e19_acc(idx + gc0 + 0u, acc3_0.x, h7_0)), f16(e19_acc(idx + gc0 + 1u, acc3_0.y, h7_1)), f16(e19_acc(idx + gc0 + 2u, acc3_0.z, h7_2)), f16(e19_acc(idx + gc0 + 3u, acc3_0.w, h7_3))); }
    }
    if (row0 + ty * 8u + 4u < 9u) {
        let idx = o_base + (row0 + ty * 8u + 4u) * 20u;
        if (gc0 + 0u < 20u) { b3[(idx + gc0 + 0u) >> 2u] = vec4<f16>(f16(e19_acc(idx + gc0 + 0u, acc4_0.x, h7_0)), f16(e19_acc(idx + gc0 + 1u, acc4_0.y, h7_1)), f16(e19_acc(idx + gc0 + 2u, acc4_0.z, h7_2)), f16(e19_acc(idx + gc0 + 3u, acc4_0.w, h7_3))); }
    }
    if (row0 + ty * 8u + 5u < 9u) {
        let idx = o_base + (row0 + ty * 8u + 5u) * 20u;
        if (gc0 + 0u < 20u) { b3[(idx + gc0 + 0u) >> 2u] = vec4<f16>(f16(e19_acc(idx + gc0 + 0u, acc5_0.x, h7_0)), f16(e19_acc(idx + gc0 + 1u, acc5_0.y, h7_1)), f16(e19_acc(idx + gc0 + 2u, acc5_0.z, h7_2)), f16(e19_acc(idx + gc0 + 3u, acc5_0.w, h7_3))); }
    }
    if (row0 + ty * 8u + 6u < 9u) {
        let idx = o_base + (row0 + ty * 8u + 6u) * 20u;
        if (gc0 + 0u < 20u) { b3[(idx + gc0 + 0u) >> 2u] = vec4<f16>(f16(e19_acc(idx + gc0 + 0u, acc6_0.x, h7_0)), f16(e19_acc(idx + gc0 + 1u, acc6_0.y, h7_1)), f16(e19_acc(idx + gc0 + 2u, acc6_0.z, h7_2)), f16(e19_acc(idx + gc0 + 3u, acc6_0.w, h7_3))); }
    }
    if (row0 + ty * 8u + 7u < 9u) {
        let idx = o_base + (row0 + ty * 8u + 7u) * 20u;
        if (gc0 + 0u < 20u) { b3[(idx + gc0 + 0u) >> 2u] = vec4<f16>(f16(e19_acc(idx + gc0 + 0u, acc7_0.x, h7_0)), f16(e19_acc(idx + gc0 + 1u, acc7_0.y, h7_1)), f16(e19_acc(idx + gc0 + 2u, acc7_0.z, h7_2)), f16(e19_acc(idx + gc0 + 3u, acc7_0.w, h7_3))); }
    }
}
