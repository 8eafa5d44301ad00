// kernel matmul+full+broadcast+max+broadcast+add+full+broadcast+mul+erf+full+broadcast+add+mul+full+broadcast+mul (1 workgroups)
@group(0) @binding(0) var<storage, read_write> b0: array<f32>;
@group(0) @binding(1) var b1: texture_2d<f32>;
@group(0) @binding(2) var<storage, read_write> b2: array<f32>;
@group(0) @binding(3) var<storage, read_write> b3: array<vec4<f32>>;

fn fg_t1(q: u32) -> vec4<f32> {
    return vec4<f32>(textureLoad(b1, vec2<u32>(q & 1023u, q >> 10u), 0));
}

fn v0(i: u32) -> f32 {
    return b0[i];
}

fn v1(i: u32) -> f32 {
    return fg_t1(i >> 2u)[i & 3u];
}

fn v2(i: u32) -> f32 {
    return b2[i];
}

// matmul : f32[9,20]
fn v3(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 20u;
    cr = cr / 20u;
    let c0 = cr;
    var acc: f32 = 0.0f;
    for (var kk = 0u; kk < 33u; kk = kk + 1u) {
        acc = acc + v0(c0 * 33u + kk) * v1(kk * 20u + c1);
    }
    return acc;
}

// full : f32[]
fn v4(i: u32) -> f32 {
    return 0.0f;
}

// broadcast : f32[9,20]
fn v5(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 20u;
    cr = cr / 20u;
    let c0 = cr;
    return v4(0u);
}

// max : f32[9,20]
fn v6(i: u32) -> f32 {
    return max(v3(i), v5(i));
}

// broadcast : f32[9,20]
fn v7(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 20u;
    cr = cr / 20u;
    let c0 = cr;
    return v2(c1);
}

// add : f32[9,20]
fn v8(i: u32) -> f32 {
    return (v6(i) + v7(i));
}

// full : f32[]
fn v9(i: u32) -> f32 {
    return 0.70710677f;
}

// broadcast : f32[9,20]
fn v10(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 20u;
    cr = cr / 20u;
    let c0 = cr;
    return v9(0u);
}

// mul : f32[9,20]
fn v11(i: u32) -> f32 {
    return (v8(i) * v10(i));
}

// erf : f32[9,20]
fn v12(i: u32) -> f32 {
    return fg_erf(v11(i));
}

// full : f32[]
fn v13(i: u32) -> f32 {
    return 1.0f;
}

// broadcast : f32[9,20]
fn v14(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 20u;
    cr = cr / 20u;
    let c0 = cr;
    return v13(0u);
}

// add : f32[9,20]
fn v15(i: u32) -> f32 {
    return (v12(i) + v14(i));
}

// mul : f32[9,20]
fn v16(i: u32) -> f32 {
    return (v8(i) * v15(i));
}

// full : f32[]
fn v17(i: u32) -> f32 {
    return 0.5f;
}

// broadcast : f32[9,20]
fn v18(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 20u;
    cr = cr / 20u;
    let c0 = cr;
    return v17(0u);
}

// mul : f32[9,20]
fn v19(i: u32) -> f32 {
    return (v16(i) * v18(i));
}

fn e19_acc(i: u32, acc: f32, h7: f32) -> f32 {
    let x3 = acc;
    let x5 = v5(i);
    let x6 = max(x3, x5);
    let x7 = h7;
    let x8 = (x6 + x7);
    let x10 = v10(i);
    let x11 = (x8 * x10);
    let x12 = fg_erf(x11);
    let x14 = v14(i);
    let x15 = (x12 + x14);
    let x16 = (x8 * x15);
    let x18 = v18(i);
    let x19 = (x16 * x18);
    return x19;
}

// The error function (Abramowitz & Stegun 7.1.26, absolute error below 1.5e-7).
fn fg_erf(x: f32) -> f32 {
    let a = abs(x);
    let t = 1.0f / (1.0f + 0.3275911f * a);
    let poly = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
    return sign(x) * (1.0f - poly * exp(-a * a));
}

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let wg = wid.y * nwg.x + wid.x;
    if (wg >= 1u) { return; }
    let tile_col = wg % 1u;
    let tile_row = (wg / 1u) % 1u;
    let bt = wg / 1u;
    let a_base = 0u;
    let b_base = 0u;
    let row0 = tile_row * 16u;
    let col0 = tile_col * 32u;
    let ar0 = a_base + min(row0 + 0u + lane, 8u) * 33u;
    let ar1 = a_base + min(row0 + 8u + lane, 8u) * 33u;
    let bcol = b_base + min(col0 / 4u + lane, 4u);
    var acc0 = vec4<f32>();
    var acc1 = vec4<f32>();
    var acc2 = vec4<f32>();
    var acc3 = vec4<f32>();
    var acc4 = vec4<f32>();
    var acc5 = vec4<f32>();
    var acc6 = vec4<f32>();
    var acc7 = vec4<f32>();
    var acc8 = vec4<f32>();
    var acc9 = vec4<f32>();
    var acc10 = vec4<f32>();
    var acc11 = vec4<f32>();
    var acc12 = vec4<f32>();
    var acc13 = vec4<f32>();
    var acc14 = vec4<f32>();
    var acc15 = vec4<f32>();
    for (var k4 = 0u; k4 < 8u; k4 = k4 + 1u) {
        let a0 = vec4<f32>(v0(ar0 + k4 * 4u + 0u), v0(ar0 + k4 * 4u + 1u), v0(ar0 + k4 * 4u + 2u), v0(ar0 + k4 * 4u + 3u));
        let a1 = vec4<f32>(v0(ar1 + k4 * 4u + 0u), v0(ar1 + k4 * 4u + 1u), v0(ar1 + k4 * 4u + 2u), v0(ar1 + k4 * 4u + 3u));
        let w0 = fg_t1(bcol + (k4 * 4u + 0u) * 5u);
        let w1 = fg_t1(bcol + (k4 * 4u + 1u) * 5u);
        let w2 = fg_t1(bcol + (k4 * 4u + 2u) * 5u);
        let w3 = fg_t1(bcol + (k4 * 4u + 3u) * 5u);
        acc0 = fma(vec4<f32>(subgroupBroadcast(a0.x, 0u)), w0, acc0);
        acc0 = fma(vec4<f32>(subgroupBroadcast(a0.y, 0u)), w1, acc0);
        acc0 = fma(vec4<f32>(subgroupBroadcast(a0.z, 0u)), w2, acc0);
        acc0 = fma(vec4<f32>(subgroupBroadcast(a0.w, 0u)), w3, acc0);
        acc1 = fma(vec4<f32>(subgroupBroadcast(a0.x, 1u)), w0, acc1);
        acc1 = fma(vec4<f32>(subgroupBroadcast(a0.y, 1u)), w1, acc1);
        acc1 = fma(vec4<f32>(subgroupBroadcast(a0.z, 1u)), w2, acc1);
        acc1 = fma(vec4<f32>(subgroupBroadcast(a0.w, 1u)), w3, acc1);
        acc2 = fma(vec4<f32>(subgroupBroadcast(a0.x, 2u)), w0, acc2);
        acc2 = fma(vec4<f32>(subgroupBroadcast(a0.y, 2u)), w1, acc2);
        acc2 = fma(vec4<f32>(subgroupBroadcast(a0.z, 2u)), w2, acc2);
        acc2 = fma(vec4<f32>(subgroupBroadcast(a0.w, 2u)), w3, acc2);
        acc3 = fma(vec4<f32>(subgroupBroadcast(a0.x, 3u)), w0, acc3);
        acc3 = fma(vec4<f32>(subgroupBroadcast(a0.y, 3u)), w1, acc3);
        acc3 = fma(vec4<f32>(subgroupBroadcast(a0.z, 3u)), w2, acc3);
        acc3 = fma(vec4<f32>(subgroupBroadcast(a0.w, 3u)), w3, acc3);
        acc4 = fma(vec4<f32>(subgroupBroadcast(a0.x, 4u)), w0, acc4);
        acc4 = fma(vec4<f32>(subgroupBroadcast(a0.y, 4u)), w1, acc4);
        acc4 = fma(vec4<f32>(subgroupBroadcast(a0.z, 4u)), w2, acc4);
        acc4 = fma(vec4<f32>(subgroupBroadcast(a0.w, 4u)), w3, acc4);
        acc5 = fma(vec4<f32>(subgroupBroadcast(a0.x, 5u)), w0, acc5);
        acc5 = fma(vec4<f32>(subgroupBroadcast(a0.y, 5u)), w1, acc5);
        acc5 = fma(vec4<f32>(subgroupBroadcast(a0.z, 5u)), w2, acc5);
        acc5 = fma(vec4<f32>(subgroupBroadcast(a0.w, 5u)), w3, acc5);
        acc6 = fma(vec4<f32>(subgroupBroadcast(a0.x, 6u)), w0, acc6);
        acc6 = fma(vec4<f32>(subgroupBroadcast(a0.y, 6u)), w1, acc6);
        acc6 = fma(vec4<f32>(subgroupBroadcast(a0.z, 6u)), w2, acc6);
        acc6 = fma(vec4<f32>(subgroupBroadcast(a0.w, 6u)), w3, acc6);
        acc7 = fma(vec4<f32>(subgroupBroadcast(a0.x, 7u)), w0, acc7);
        acc7 = fma(vec4<f32>(subgroupBroadcast(a0.y, 7u)), w1, acc7);
        acc7 = fma(vec4<f32>(subgroupBroadcast(a0.z, 7u)), w2, acc7);
        acc7 = fma(vec4<f32>(subgroupBroadcast(a0.w, 7u)), w3, acc7);
        acc8 = fma(vec4<f32>(subgroupBroadcast(a1.x, 0u)), w0, acc8);
        acc8 = fma(vec4<f32>(subgroupBroadcast(a1.y, 0u)), w1, acc8);
        acc8 = fma(vec4<f32>(subgroupBroadcast(a1.z, 0u)), w2, acc8);
        acc8 = fma(vec4<f32>(subgroupBroadcast(a1.w, 0u)), w3, acc8);
        acc9 = fma(vec4<f32>(subgroupBroadcast(a1.x, 1u)), w0, acc9);
        acc9 = fma(vec4<f32>(subgroupBroadcast(a1.y, 1u)), w1, acc9);
        acc9 = fma(vec4<f32>(subgroupBroadcast(a1.z, 1u)), w2, acc9);
        acc9 = fma(vec4<f32>(subgroupBroadcast(a1.w, 1u)), w3, acc9);
        acc10 = fma(vec4<f32>(subgroupBroadcast(a1.x, 2u)), w0, acc10);
        acc10 = fma(vec4<f32>(subgroupBroadcast(a1.y, 2u)), w1, acc10);
        acc10 = fma(vec4<f32>(subgroupBroadcast(a1.z, 2u)), w2, acc10);
        acc10 = fma(vec4<f32>(subgroupBroadcast(a1.w, 2u)), w3, acc10);
        acc11 = fma(vec4<f32>(subgroupBroadcast(a1.x, 3u)), w0, acc11);
        acc11 = fma(vec4<f32>(subgroupBroadcast(a1.y, 3u)), w1, acc11);
        acc11 = fma(vec4<f32>(subgroupBroadcast(a1.z, 3u)), w2, acc11);
        acc11 = fma(vec4<f32>(subgroupBroadcast(a1.w, 3u)), w3, acc11);
        acc12 = fma(vec4<f32>(subgroupBroadcast(a1.x, 4u)), w0, acc12);
        acc12 = fma(vec4<f32>(subgroupBroadcast(a1.y, 4u)), w1, acc12);
        acc12 = fma(vec4<f32>(subgroupBroadcast(a1.z, 4u)), w2, acc12);
        acc12 = fma(vec4<f32>(subgroupBroadcast(a1.w, 4u)), w3, acc12);
        acc13 = fma(vec4<f32>(subgroupBroadcast(a1.x, 5u)), w0, acc13);
        acc13 = fma(vec4<f32>(subgroupBroadcast(a1.y, 5u)), w1, acc13);
        acc13 = fma(vec4<f32>(subgroupBroadcast(a1.z, 5u)), w2, acc13);
        acc13 = fma(vec4<f32>(subgroupBroadcast(a1.w, 5u)), w3, acc13);
        acc14 = fma(vec4<f32>(subgroupBroadcast(a1.x, 6u)), w0, acc14);
        acc14 = fma(vec4<f32>(subgroupBroadcast(a1.y, 6u)), w1, acc14);
        acc14 = fma(vec4<f32>(subgroupBroadcast(a1.z, 6u)), w2, acc14);
        acc14 = fma(vec4<f32>(subgroupBroadcast(a1.w, 6u)), w3, acc14);
        acc15 = fma(vec4<f32>(subgroupBroadcast(a1.x, 7u)), w0, acc15);
        acc15 = fma(vec4<f32>(subgroupBroadcast(a1.y, 7u)), w1, acc15);
        acc15 = fma(vec4<f32>(subgroupBroadcast(a1.z, 7u)), w2, acc15);
        acc15 = fma(vec4<f32>(subgroupBroadcast(a1.w, 7u)), w3, acc15);
    }
    {
        let k4 = 8u;
        let a0 = vec4<f32>(v0(ar0 + k4 * 4u + 0u), 0.0f, 0.0f, 0.0f);
        let a1 = vec4<f32>(v0(ar1 + k4 * 4u + 0u), 0.0f, 0.0f, 0.0f);
        let w0 = fg_t1(bcol + (k4 * 4u + 0u) * 5u);
        acc0 = fma(vec4<f32>(subgroupBroadcast(a0.x, 0u)), w0, acc0);
        acc1 = fma(vec4<f32>(subgroupBroadcast(a0.x, 1u)), w0, acc1);
        acc2 = fma(vec4<f32>(subgroupBroadcast(a0.x, 2u)), w0, acc2);
        acc3 = fma(vec4<f32>(subgroupBroadcast(a0.x, 3u)), w0, acc3);
        acc4 = fma(vec4<f32>(subgroupBroadcast(a0.x, 4u)), w0, acc4);
        acc5 = fma(vec4<f32>(subgroupBroadcast(a0.x, 5u)), w0, acc5);
        acc6 = fma(vec4<f32>(subgroupBroadcast(a0.x, 6u)), w0, acc6);
        acc7 = fma(vec4<f32>(subgroupBroadcast(a0.x, 7u)), w0, acc7);
        acc8 = fma(vec4<f32>(subgroupBroadcast(a1.x, 0u)), w0, acc8);
        acc9 = fma(vec4<f32>(subgroupBroadcast(a1.x, 1u)), w0, acc9);
        acc10 = fma(vec4<f32>(subgroupBroadcast(a1.x, 2u)), w0, acc10);
        acc11 = fma(vec4<f32>(subgroupBroadcast(a1.x, 3u)), w0, acc11);
        acc12 = fma(vec4<f32>(subgroupBroadcast(a1.x, 4u)), w0, acc12);
        acc13 = fma(vec4<f32>(subgroupBroadcast(a1.x, 5u)), w0, acc13);
        acc14 = fma(vec4<f32>(subgroupBroadcast(a1.x, 6u)), w0, acc14);
        acc15 = fma(vec4<f32>(subgroupBroadcast(a1.x, 7u)), w0, acc15);
    }
    let gc0 = col0 + lane * 4u + 0u;
    let gc1 = col0 + lane * 4u + 1u;
    let gc2 = col0 + lane * 4u + 2u;
    let gc3 = col0 + lane * 4u + 3u;
    let h7_0 = v7(bt * 180u + row0 * 20u + min(gc0, 19u));
    let h7_1 = v7(bt * 180u + row0 * 20u + min(gc1, 19u));
    let h7_2 = v7(bt * 180u + row0 * 20u + min(gc2, 19u));
    let h7_3 = v7(bt * 180u + row0 * 20u + min(gc3, 19u));
    if (row0 + 0u < 9u) {
        let idx = bt * 180u + (row0 + 0u) * 20u;
        if (gc0 < 20u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc0.x, h7_0), e19_acc(idx + gc1, acc0.y, h7_1), e19_acc(idx + gc2, acc0.z, h7_2), e19_acc(idx + gc3, acc0.w, h7_3)); }
    }
    if (row0 + 1u < 9u) {
        let idx = bt * 180u + (row0 + 1u) * 20u;
        if (gc0 < 20u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc1.x, h7_0), e19_acc(idx + gc1, acc1.y, h7_1), e19_acc(idx + gc2, acc1.z, h7_2), e19_acc(idx + gc3, acc1.w, h7_3)); }
    }
    if (row0 + 2u < 9u) {
        let idx = bt * 180u + (row0 + 2u) * 20u;
        if (gc0 < 20u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc2.x, h7_0), e19_acc(idx + gc1, acc2.y, h7_1), e19_acc(idx + gc2, acc2.z, h7_2), e19_acc(idx + gc3, acc2.w, h7_3)); }
    }
    if (row0 + 3u < 9u) {
        let idx = bt * 180u + (row0 + 3u) * 20u;
        if (gc0 < 20u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc3.x, h7_0), e19_acc(idx + gc1, acc3.y, h7_1), e19_acc(idx + gc2, acc3.z, h7_2), e19_acc(idx + gc3, acc3.w, h7_3)); }
    }
    if (row0 + 4u < 9u) {
        let idx = bt * 180u + (row0 + 4u) * 20u;
        if (gc0 < 20u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc4.x, h7_0), e19_acc(idx + gc1, acc4.y, h7_1), e19_acc(idx + gc2, acc4.z, h7_2), e19_acc(idx + gc3, acc4.w, h7_3)); }
    }
    if (row0 + 5u < 9u) {
        let idx = bt * 180u + (row0 + 5u) * 20u;
        if (gc0 < 20u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc5.x, h7_0), e19_acc(idx + gc1, acc5.y, h7_1), e19_acc(idx + gc2, acc5.z, h7_2), e19_acc(idx + gc3, acc5.w, h7_3)); }
    }
    if (row0 + 6u < 9u) {
        let idx = bt * 180u + (row0 + 6u) * 20u;
        if (gc0 < 20u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc6.x, h7_0), e19_acc(idx + gc1, acc6.y, h7_1), e19_acc(idx + gc2, acc6.z, h7_2), e19_acc(idx + gc3, acc6.w, h7_3)); }
    }
    if (row0 + 7u < 9u) {
        let idx = bt * 180u + (row0 + 7u) * 20u;
        if (gc0 < 20u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc7.x, h7_0), e19_acc(idx + gc1, acc7.y, h7_1), e19_acc(idx + gc2, acc7.z, h7_2), e19_acc(idx + gc3, acc7.w, h7_3)); }
    }
    if (row0 + 8u < 9u) {
        let idx = bt * 180u + (row0 + 8u) * 20u;
        if (gc0 < 20u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc8.x, h7_0), e19_acc(idx + gc1, acc8.y, h7_1), e19_acc(idx + gc2, acc8.z, h7_2), e19_acc(idx + gc3, acc8.w, h7_3)); }
    }
    if (row0 + 9u < 9u) {
        let idx = bt * 180u + (row0 + 9u) * 20u;
        if (gc0 < 20u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc9.x, h7_0), e19_acc(idx + gc1, acc9.y, h7_1), e19_acc(idx + gc2, acc9.z, h7_2), e19_acc(idx + gc3, acc9.w, h7_3)); }
    }
    if (row0 + 10u < 9u) {
        let idx = bt * 180u + (row0 + 10u) * 20u;
        if (gc0 < 20u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc10.x, h7_0), e19_acc(idx + gc1, acc10.y, h7_1), e19_acc(idx + gc2, acc10.z, h7_2), e19_acc(idx + gc3, acc10.w, h7_3)); }
    }
    if (row0 + 11u < 9u) {
        let idx = bt * 180u + (row0 + 11u) * 20u;
        if (gc0 < 20u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc11.x, h7_0), e19_acc(idx + gc1, acc11.y, h7_1), e19_acc(idx + gc2, acc11.z, h7_2), e19_acc(idx + gc3, acc11.w, h7_3)); }
    }
    if (row0 + 12u < 9u) {
        let idx = bt * 180u + (row0 + 12u) * 20u;
        if (gc0 < 20u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc12.x, h7_0), e19_acc(idx + gc1, acc12.y, h7_1), e19_acc(idx + gc2, acc12.z, h7_2), e19_acc(idx + gc3, acc12.w, h7_3)); }
    }
    if (row0 + 13u < 9u) {
        let idx = bt * 180u + (row0 + 13u) * 20u;
        if (gc0 < 20u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc13.x, h7_0), e19_acc(idx + gc1, acc13.y, h7_1), e19_acc(idx + gc2, acc13.z, h7_2), e19_acc(idx + gc3, acc13.w, h7_3)); }
    }
    if (row0 + 14u < 9u) {
        let idx = bt * 180u + (row0 + 14u) * 20u;
        if (gc0 < 20u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc14.x, h7_0), e19_acc(idx + gc1, acc14.y, h7_1), e19_acc(idx + gc2, acc14.z, h7_2), e19_acc(idx + gc3, acc14.w, h7_3)); }
    }
    if (row0 + 15u < 9u) {
        let idx = bt * 180u + (row0 + 15u) * 20u;
        if (gc0 < 20u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc15.x, h7_0), e19_acc(idx + gc1, acc15.y, h7_1), e19_acc(idx + gc2, acc15.z, h7_2), e19_acc(idx + gc3, acc15.w, h7_3)); }
    }
}
