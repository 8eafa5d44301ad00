// kernel matmul+full+broadcast+max+broadcast+add+full+broadcast+mul+erf+full+broadcast+add+mul+full+broadcast+mul (4 workgroups)
@group(0) @binding(0) var b0: texture_2d<f32>;
@group(0) @binding(1) var b1: texture_2d<f32>;
@group(0) @binding(2) var<storage, read_write> b2: array<f32>;
@group(0) @binding(3) var<storage, read_write> b3: array<vec4<f32>>;

fn fg_t0(q: u32) -> vec4<f32> {
    return vec4<f32>(textureLoad(b0, vec2<u32>(q & 1023u, q >> 10u), 0));
}

fn fg_t1(q: u32) -> vec4<f32> {
    return vec4<f32>(textureLoad(b1, vec2<u32>(q & 1023u, q >> 10u), 0));
}

fn v0(i: u32) -> f32 {
    return fg_t0(i >> 2u)[i & 3u];
}

fn v1(i: u32) -> f32 {
    return fg_t1(i >> 2u)[i & 3u];
}

fn v2(i: u32) -> f32 {
    return b2[i];
}

// matmul : f32[72,40]
fn v3(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 40u;
    cr = cr / 40u;
    let c0 = cr;
    var acc: f32 = 0.0f;
    for (var kk = 0u; kk < 33u; kk = kk + 1u) {
        acc = acc + v0(c0 * 33u + kk) * v1(kk * 40u + c1);
    }
    return acc;
}

// full : f32[]
fn v4(i: u32) -> f32 {
    return 0.0f;
}

// broadcast : f32[72,40]
fn v5(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 40u;
    cr = cr / 40u;
    let c0 = cr;
    return v4(0u);
}

// max : f32[72,40]
fn v6(i: u32) -> f32 {
    return max(v3(i), v5(i));
}

// broadcast : f32[72,40]
fn v7(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 40u;
    cr = cr / 40u;
    let c0 = cr;
    return v2(c1);
}

// add : f32[72,40]
fn v8(i: u32) -> f32 {
    return (v6(i) + v7(i));
}

// full : f32[]
fn v9(i: u32) -> f32 {
    return 0.70710677f;
}

// broadcast : f32[72,40]
fn v10(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 40u;
    cr = cr / 40u;
    let c0 = cr;
    return v9(0u);
}

// mul : f32[72,40]
fn v11(i: u32) -> f32 {
    return (v8(i) * v10(i));
}

// erf : f32[72,40]
fn v12(i: u32) -> f32 {
    return fg_erf(v11(i));
}

// full : f32[]
fn v13(i: u32) -> f32 {
    return 1.0f;
}

// broadcast : f32[72,40]
fn v14(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 40u;
    cr = cr / 40u;
    let c0 = cr;
    return v13(0u);
}

// add : f32[72,40]
fn v15(i: u32) -> f32 {
    return (v12(i) + v14(i));
}

// mul : f32[72,40]
fn v16(i: u32) -> f32 {
    return (v8(i) * v15(i));
}

// full : f32[]
fn v17(i: u32) -> f32 {
    return 0.5f;
}

// broadcast : f32[72,40]
fn v18(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 40u;
    cr = cr / 40u;
    let c0 = cr;
    return v17(0u);
}

// mul : f32[72,40]
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
    if (wg >= 4u) { return; }
    let tile_col = wg % 2u;
    let tile_row = (wg / 2u) % 2u;
    let bt = wg / 4u;
    let a_base = 0u;
    let b_base = 0u;
    let row0 = tile_row * 64u;
    let col0 = tile_col * 32u;
    let ar0 = a_base + min(row0 + 0u + lane, 71u) * 33u;
    let ar1 = a_base + min(row0 + 8u + lane, 71u) * 33u;
    let ar2 = a_base + min(row0 + 16u + lane, 71u) * 33u;
    let ar3 = a_base + min(row0 + 24u + lane, 71u) * 33u;
    let ar4 = a_base + min(row0 + 32u + lane, 71u) * 33u;
    let ar5 = a_base + min(row0 + 40u + lane, 71u) * 33u;
    let ar6 = a_base + min(row0 + 48u + lane, 71u) * 33u;
    let ar7 = a_base + min(row0 + 56u + lane, 71u) * 33u;
    let bcol = b_base + min(col0 / 4u + lane, 9u);
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
    var acc16 = vec4<f32>();
    var acc17 = vec4<f32>();
    var acc18 = vec4<f32>();
    var acc19 = vec4<f32>();
    var acc20 = vec4<f32>();
    var acc21 = vec4<f32>();
    var acc22 = vec4<f32>();
    var acc23 = vec4<f32>();
    var acc24 = vec4<f32>();
    var acc25 = vec4<f32>();
    var acc26 = vec4<f32>();
    var acc27 = vec4<f32>();
    var acc28 = vec4<f32>();
    var acc29 = vec4<f32>();
    var acc30 = vec4<f32>();
    var acc31 = vec4<f32>();
    var acc32 = vec4<f32>();
    var acc33 = vec4<f32>();
    var acc34 = vec4<f32>();
    var acc35 = vec4<f32>();
    var acc36 = vec4<f32>();
    var acc37 = vec4<f32>();
    var acc38 = vec4<f32>();
    var acc39 = vec4<f32>();
    var acc40 = vec4<f32>();
    var acc41 = vec4<f32>();
    var acc42 = vec4<f32>();
    var acc43 = vec4<f32>();
    var acc44 = vec4<f32>();
    var acc45 = vec4<f32>();
    var acc46 = vec4<f32>();
    var acc47 = vec4<f32>();
    var acc48 = vec4<f32>();
    var acc49 = vec4<f32>();
    var acc50 = vec4<f32>();
    var acc51 = vec4<f32>();
    var acc52 = vec4<f32>();
    var acc53 = vec4<f32>();
    var acc54 = vec4<f32>();
    var acc55 = vec4<f32>();
    var acc56 = vec4<f32>();
    var acc57 = vec4<f32>();
    var acc58 = vec4<f32>();
    var acc59 = vec4<f32>();
    var acc60 = vec4<f32>();
    var acc61 = vec4<f32>();
    var acc62 = vec4<f32>();
    var acc63 = vec4<f32>();
    for (var k4 = 0u; k4 < 8u; k4 = k4 + 1u) {
        let a0 = vec4<f32>(v0(ar0 + k4 * 4u + 0u), v0(ar0 + k4 * 4u + 1u), v0(ar0 + k4 * 4u + 2u), v0(ar0 + k4 * 4u + 3u));
        let a1 = vec4<f32>(v0(ar1 + k4 * 4u + 0u), v0(ar1 + k4 * 4u + 1u), v0(ar1 + k4 * 4u + 2u), v0(ar1 + k4 * 4u + 3u));
        let a2 = vec4<f32>(v0(ar2 + k4 * 4u + 0u), v0(ar2 + k4 * 4u + 1u), v0(ar2 + k4 * 4u + 2u), v0(ar2 + k4 * 4u + 3u));
        let a3 = vec4<f32>(v0(ar3 + k4 * 4u + 0u), v0(ar3 + k4 * 4u + 1u), v0(ar3 + k4 * 4u + 2u), v0(ar3 + k4 * 4u + 3u));
        let a4 = vec4<f32>(v0(ar4 + k4 * 4u + 0u), v0(ar4 + k4 * 4u + 1u), v0(ar4 + k4 * 4u + 2u), v0(ar4 + k4 * 4u + 3u));
        let a5 = vec4<f32>(v0(ar5 + k4 * 4u + 0u), v0(ar5 + k4 * 4u + 1u), v0(ar5 + k4 * 4u + 2u), v0(ar5 + k4 * 4u + 3u));
        let a6 = vec4<f32>(v0(ar6 + k4 * 4u + 0u), v0(ar6 + k4 * 4u + 1u), v0(ar6 + k4 * 4u + 2u), v0(ar6 + k4 * 4u + 3u));
        let a7 = vec4<f32>(v0(ar7 + k4 * 4u + 0u), v0(ar7 + k4 * 4u + 1u), v0(ar7 + k4 * 4u + 2u), v0(ar7 + k4 * 4u + 3u));
        let w0 = fg_t1(bcol + (k4 * 4u + 0u) * 10u);
        let w1 = fg_t1(bcol + (k4 * 4u + 1u) * 10u);
        let w2 = fg_t1(bcol + (k4 * 4u + 2u) * 10u);
        let w3 = fg_t1(bcol + (k4 * 4u + 3u) * 10u);
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
        acc16 = fma(vec4<f32>(subgroupBroadcast(a2.x, 0u)), w0, acc16);
        acc16 = fma(vec4<f32>(subgroupBroadcast(a2.y, 0u)), w1, acc16);
        acc16 = fma(vec4<f32>(subgroupBroadcast(a2.z, 0u)), w2, acc16);
        acc16 = fma(vec4<f32>(subgroupBroadcast(a2.w, 0u)), w3, acc16);
        acc17 = fma(vec4<f32>(subgroupBroadcast(a2.x, 1u)), w0, acc17);
        acc17 = fma(vec4<f32>(subgroupBroadcast(a2.y, 1u)), w1, acc17);
        acc17 = fma(vec4<f32>(subgroupBroadcast(a2.z, 1u)), w2, acc17);
        acc17 = fma(vec4<f32>(subgroupBroadcast(a2.w, 1u)), w3, acc17);
        acc18 = fma(vec4<f32>(subgroupBroadcast(a2.x, 2u)), w0, acc18);
        acc18 = fma(vec4<f32>(subgroupBroadcast(a2.y, 2u)), w1, acc18);
        acc18 = fma(vec4<f32>(subgroupBroadcast(a2.z, 2u)), w2, acc18);
        acc18 = fma(vec4<f32>(subgroupBroadcast(a2.w, 2u)), w3, acc18);
        acc19 = fma(vec4<f32>(subgroupBroadcast(a2.x, 3u)), w0, acc19);
        acc19 = fma(vec4<f32>(subgroupBroadcast(a2.y, 3u)), w1, acc19);
        acc19 = fma(vec4<f32>(subgroupBroadcast(a2.z, 3u)), w2, acc19);
        acc19 = fma(vec4<f32>(subgroupBroadcast(a2.w, 3u)), w3, acc19);
        acc20 = fma(vec4<f32>(subgroupBroadcast(a2.x, 4u)), w0, acc20);
        acc20 = fma(vec4<f32>(subgroupBroadcast(a2.y, 4u)), w1, acc20);
        acc20 = fma(vec4<f32>(subgroupBroadcast(a2.z, 4u)), w2, acc20);
        acc20 = fma(vec4<f32>(subgroupBroadcast(a2.w, 4u)), w3, acc20);
        acc21 = fma(vec4<f32>(subgroupBroadcast(a2.x, 5u)), w0, acc21);
        acc21 = fma(vec4<f32>(subgroupBroadcast(a2.y, 5u)), w1, acc21);
        acc21 = fma(vec4<f32>(subgroupBroadcast(a2.z, 5u)), w2, acc21);
        acc21 = fma(vec4<f32>(subgroupBroadcast(a2.w, 5u)), w3, acc21);
        acc22 = fma(vec4<f32>(subgroupBroadcast(a2.x, 6u)), w0, acc22);
        acc22 = fma(vec4<f32>(subgroupBroadcast(a2.y, 6u)), w1, acc22);
        acc22 = fma(vec4<f32>(subgroupBroadcast(a2.z, 6u)), w2, acc22);
        acc22 = fma(vec4<f32>(subgroupBroadcast(a2.w, 6u)), w3, acc22);
        acc23 = fma(vec4<f32>(subgroupBroadcast(a2.x, 7u)), w0, acc23);
        acc23 = fma(vec4<f32>(subgroupBroadcast(a2.y, 7u)), w1, acc23);
        acc23 = fma(vec4<f32>(subgroupBroadcast(a2.z, 7u)), w2, acc23);
        acc23 = fma(vec4<f32>(subgroupBroadcast(a2.w, 7u)), w3, acc23);
        acc24 = fma(vec4<f32>(subgroupBroadcast(a3.x, 0u)), w0, acc24);
        acc24 = fma(vec4<f32>(subgroupBroadcast(a3.y, 0u)), w1, acc24);
        acc24 = fma(vec4<f32>(subgroupBroadcast(a3.z, 0u)), w2, acc24);
        acc24 = fma(vec4<f32>(subgroupBroadcast(a3.w, 0u)), w3, acc24);
        acc25 = fma(vec4<f32>(subgroupBroadcast(a3.x, 1u)), w0, acc25);
        acc25 = fma(vec4<f32>(subgroupBroadcast(a3.y, 1u)), w1, acc25);
        acc25 = fma(vec4<f32>(subgroupBroadcast(a3.z, 1u)), w2, acc25);
        acc25 = fma(vec4<f32>(subgroupBroadcast(a3.w, 1u)), w3, acc25);
        acc26 = fma(vec4<f32>(subgroupBroadcast(a3.x, 2u)), w0, acc26);
        acc26 = fma(vec4<f32>(subgroupBroadcast(a3.y, 2u)), w1, acc26);
        acc26 = fma(vec4<f32>(subgroupBroadcast(a3.z, 2u)), w2, acc26);
        acc26 = fma(vec4<f32>(subgroupBroadcast(a3.w, 2u)), w3, acc26);
        acc27 = fma(vec4<f32>(subgroupBroadcast(a3.x, 3u)), w0, acc27);
        acc27 = fma(vec4<f32>(subgroupBroadcast(a3.y, 3u)), w1, acc27);
        acc27 = fma(vec4<f32>(subgroupBroadcast(a3.z, 3u)), w2, acc27);
        acc27 = fma(vec4<f32>(subgroupBroadcast(a3.w, 3u)), w3, acc27);
        acc28 = fma(vec4<f32>(subgroupBroadcast(a3.x, 4u)), w0, acc28);
        acc28 = fma(vec4<f32>(subgroupBroadcast(a3.y, 4u)), w1, acc28);
        acc28 = fma(vec4<f32>(subgroupBroadcast(a3.z, 4u)), w2, acc28);
        acc28 = fma(vec4<f32>(subgroupBroadcast(a3.w, 4u)), w3, acc28);
        acc29 = fma(vec4<f32>(subgroupBroadcast(a3.x, 5u)), w0, acc29);
        acc29 = fma(vec4<f32>(subgroupBroadcast(a3.y, 5u)), w1, acc29);
        acc29 = fma(vec4<f32>(subgroupBroadcast(a3.z, 5u)), w2, acc29);
        acc29 = fma(vec4<f32>(subgroupBroadcast(a3.w, 5u)), w3, acc29);
        acc30 = fma(vec4<f32>(subgroupBroadcast(a3.x, 6u)), w0, acc30);
        acc30 = fma(vec4<f32>(subgroupBroadcast(a3.y, 6u)), w1, acc30);
        acc30 = fma(vec4<f32>(subgroupBroadcast(a3.z, 6u)), w2, acc30);
        acc30 = fma(vec4<f32>(subgroupBroadcast(a3.w, 6u)), w3, acc30);
        acc31 = fma(vec4<f32>(subgroupBroadcast(a3.x, 7u)), w0, acc31);
        acc31 = fma(vec4<f32>(subgroupBroadcast(a3.y, 7u)), w1, acc31);
        acc31 = fma(vec4<f32>(subgroupBroadcast(a3.z, 7u)), w2, acc31);
        acc31 = fma(vec4<f32>(subgroupBroadcast(a3.w, 7u)), w3, acc31);
        acc32 = fma(vec4<f32>(subgroupBroadcast(a4.x, 0u)), w0, acc32);
        acc32 = fma(vec4<f32>(subgroupBroadcast(a4.y, 0u)), w1, acc32);
        acc32 = fma(vec4<f32>(subgroupBroadcast(a4.z, 0u)), w2, acc32);
        acc32 = fma(vec4<f32>(subgroupBroadcast(a4.w, 0u)), w3, acc32);
        acc33 = fma(vec4<f32>(subgroupBroadcast(a4.x, 1u)), w0, acc33);
        acc33 = fma(vec4<f32>(subgroupBroadcast(a4.y, 1u)), w1, acc33);
        acc33 = fma(vec4<f32>(subgroupBroadcast(a4.z, 1u)), w2, acc33);
        acc33 = fma(vec4<f32>(subgroupBroadcast(a4.w, 1u)), w3, acc33);
        acc34 = fma(vec4<f32>(subgroupBroadcast(a4.x, 2u)), w0, acc34);
        acc34 = fma(vec4<f32>(subgroupBroadcast(a4.y, 2u)), w1, acc34);
        acc34 = fma(vec4<f32>(subgroupBroadcast(a4.z, 2u)), w2, acc34);
        acc34 = fma(vec4<f32>(subgroupBroadcast(a4.w, 2u)), w3, acc34);
        acc35 = fma(vec4<f32>(subgroupBroadcast(a4.x, 3u)), w0, acc35);
        acc35 = fma(vec4<f32>(subgroupBroadcast(a4.y, 3u)), w1, acc35);
        acc35 = fma(vec4<f32>(subgroupBroadcast(a4.z, 3u)), w2, acc35);
        acc35 = fma(vec4<f32>(subgroupBroadcast(a4.w, 3u)), w3, acc35);
        acc36 = fma(vec4<f32>(subgroupBroadcast(a4.x, 4u)), w0, acc36);
        acc36 = fma(vec4<f32>(subgroupBroadcast(a4.y, 4u)), w1, acc36);
        acc36 = fma(vec4<f32>(subgroupBroadcast(a4.z, 4u)), w2, acc36);
        acc36 = fma(vec4<f32>(subgroupBroadcast(a4.w, 4u)), w3, acc36);
        acc37 = fma(vec4<f32>(subgroupBroadcast(a4.x, 5u)), w0, acc37);
        acc37 = fma(vec4<f32>(subgroupBroadcast(a4.y, 5u)), w1, acc37);
        acc37 = fma(vec4<f32>(subgroupBroadcast(a4.z, 5u)), w2, acc37);
        acc37 = fma(vec4<f32>(subgroupBroadcast(a4.w, 5u)), w3, acc37);
        acc38 = fma(vec4<f32>(subgroupBroadcast(a4.x, 6u)), w0, acc38);
        acc38 = fma(vec4<f32>(subgroupBroadcast(a4.y, 6u)), w1, acc38);
        acc38 = fma(vec4<f32>(subgroupBroadcast(a4.z, 6u)), w2, acc38);
        acc38 = fma(vec4<f32>(subgroupBroadcast(a4.w, 6u)), w3, acc38);
        acc39 = fma(vec4<f32>(subgroupBroadcast(a4.x, 7u)), w0, acc39);
        acc39 = fma(vec4<f32>(subgroupBroadcast(a4.y, 7u)), w1, acc39);
        acc39 = fma(vec4<f32>(subgroupBroadcast(a4.z, 7u)), w2, acc39);
        acc39 = fma(vec4<f32>(subgroupBroadcast(a4.w, 7u)), w3, acc39);
        acc40 = fma(vec4<f32>(subgroupBroadcast(a5.x, 0u)), w0, acc40);
        acc40 = fma(vec4<f32>(subgroupBroadcast(a5.y, 0u)), w1, acc40);
        acc40 = fma(vec4<f32>(subgroupBroadcast(a5.z, 0u)), w2, acc40);
        acc40 = fma(vec4<f32>(subgroupBroadcast(a5.w, 0u)), w3, acc40);
        acc41 = fma(vec4<f32>(subgroupBroadcast(a5.x, 1u)), w0, acc41);
        acc41 = fma(vec4<f32>(subgroupBroadcast(a5.y, 1u)), w1, acc41);
        acc41 = fma(vec4<f32>(subgroupBroadcast(a5.z, 1u)), w2, acc41);
        acc41 = fma(vec4<f32>(subgroupBroadcast(a5.w, 1u)), w3, acc41);
        acc42 = fma(vec4<f32>(subgroupBroadcast(a5.x, 2u)), w0, acc42);
        acc42 = fma(vec4<f32>(subgroupBroadcast(a5.y, 2u)), w1, acc42);
        acc42 = fma(vec4<f32>(subgroupBroadcast(a5.z, 2u)), w2, acc42);
        acc42 = fma(vec4<f32>(subgroupBroadcast(a5.w, 2u)), w3, acc42);
        acc43 = fma(vec4<f32>(subgroupBroadcast(a5.x, 3u)), w0, acc43);
        acc43 = fma(vec4<f32>(subgroupBroadcast(a5.y, 3u)), w1, acc43);
        acc43 = fma(vec4<f32>(subgroupBroadcast(a5.z, 3u)), w2, acc43);
        acc43 = fma(vec4<f32>(subgroupBroadcast(a5.w, 3u)), w3, acc43);
        acc44 = fma(vec4<f32>(subgroupBroadcast(a5.x, 4u)), w0, acc44);
        acc44 = fma(vec4<f32>(subgroupBroadcast(a5.y, 4u)), w1, acc44);
        acc44 = fma(vec4<f32>(subgroupBroadcast(a5.z, 4u)), w2, acc44);
        acc44 = fma(vec4<f32>(subgroupBroadcast(a5.w, 4u)), w3, acc44);
        acc45 = fma(vec4<f32>(subgroupBroadcast(a5.x, 5u)), w0, acc45);
        acc45 = fma(vec4<f32>(subgroupBroadcast(a5.y, 5u)), w1, acc45);
        acc45 = fma(vec4<f32>(subgroupBroadcast(a5.z, 5u)), w2, acc45);
        acc45 = fma(vec4<f32>(subgroupBroadcast(a5.w, 5u)), w3, acc45);
        acc46 = fma(vec4<f32>(subgroupBroadcast(a5.x, 6u)), w0, acc46);
        acc46 = fma(vec4<f32>(subgroupBroadcast(a5.y, 6u)), w1, acc46);
        acc46 = fma(vec4<f32>(subgroupBroadcast(a5.z, 6u)), w2, acc46);
        acc46 = fma(vec4<f32>(subgroupBroadcast(a5.w, 6u)), w3, acc46);
        acc47 = fma(vec4<f32>(subgroupBroadcast(a5.x, 7u)), w0, acc47);
        acc47 = fma(vec4<f32>(subgroupBroadcast(a5.y, 7u)), w1, acc47);
        acc47 = fma(vec4<f32>(subgroupBroadcast(a5.z, 7u)), w2, acc47);
        acc47 = fma(vec4<f32>(subgroupBroadcast(a5.w, 7u)), w3, acc47);
        acc48 = fma(vec4<f32>(subgroupBroadcast(a6.x, 0u)), w0, acc48);
        acc48 = fma(vec4<f32>(subgroupBroadcast(a6.y, 0u)), w1, acc48);
        acc48 = fma(vec4<f32>(subgroupBroadcast(a6.z, 0u)), w2, acc48);
        acc48 = fma(vec4<f32>(subgroupBroadcast(a6.w, 0u)), w3, acc48);
        acc49 = fma(vec4<f32>(subgroupBroadcast(a6.x, 1u)), w0, acc49);
        acc49 = fma(vec4<f32>(subgroupBroadcast(a6.y, 1u)), w1, acc49);
        acc49 = fma(vec4<f32>(subgroupBroadcast(a6.z, 1u)), w2, acc49);
        acc49 = fma(vec4<f32>(subgroupBroadcast(a6.w, 1u)), w3, acc49);
        acc50 = fma(vec4<f32>(subgroupBroadcast(a6.x, 2u)), w0, acc50);
        acc50 = fma(vec4<f32>(subgroupBroadcast(a6.y, 2u)), w1, acc50);
        acc50 = fma(vec4<f32>(subgroupBroadcast(a6.z, 2u)), w2, acc50);
        acc50 = fma(vec4<f32>(subgroupBroadcast(a6.w, 2u)), w3, acc50);
        acc51 = fma(vec4<f32>(subgroupBroadcast(a6.x, 3u)), w0, acc51);
        acc51 = fma(vec4<f32>(subgroupBroadcast(a6.y, 3u)), w1, acc51);
        acc51 = fma(vec4<f32>(subgroupBroadcast(a6.z, 3u)), w2, acc51);
        acc51 = fma(vec4<f32>(subgroupBroadcast(a6.w, 3u)), w3, acc51);
        acc52 = fma(vec4<f32>(subgroupBroadcast(a6.x, 4u)), w0, acc52);
        acc52 = fma(vec4<f32>(subgroupBroadcast(a6.y, 4u)), w1, acc52);
        acc52 = fma(vec4<f32>(subgroupBroadcast(a6.z, 4u)), w2, acc52);
        acc52 = fma(vec4<f32>(subgroupBroadcast(a6.w, 4u)), w3, acc52);
        acc53 = fma(vec4<f32>(subgroupBroadcast(a6.x, 5u)), w0, acc53);
        acc53 = fma(vec4<f32>(subgroupBroadcast(a6.y, 5u)), w1, acc53);
        acc53 = fma(vec4<f32>(subgroupBroadcast(a6.z, 5u)), w2, acc53);
        acc53 = fma(vec4<f32>(subgroupBroadcast(a6.w, 5u)), w3, acc53);
        acc54 = fma(vec4<f32>(subgroupBroadcast(a6.x, 6u)), w0, acc54);
        acc54 = fma(vec4<f32>(subgroupBroadcast(a6.y, 6u)), w1, acc54);
        acc54 = fma(vec4<f32>(subgroupBroadcast(a6.z, 6u)), w2, acc54);
        acc54 = fma(vec4<f32>(subgroupBroadcast(a6.w, 6u)), w3, acc54);
        acc55 = fma(vec4<f32>(subgroupBroadcast(a6.x, 7u)), w0, acc55);
        acc55 = fma(vec4<f32>(subgroupBroadcast(a6.y, 7u)), w1, acc55);
        acc55 = fma(vec4<f32>(subgroupBroadcast(a6.z, 7u)), w2, acc55);
        acc55 = fma(vec4<f32>(subgroupBroadcast(a6.w, 7u)), w3, acc55);
        acc56 = fma(vec4<f32>(subgroupBroadcast(a7.x, 0u)), w0, acc56);
        acc56 = fma(vec4<f32>(subgroupBroadcast(a7.y, 0u)), w1, acc56);
        acc56 = fma(vec4<f32>(subgroupBroadcast(a7.z, 0u)), w2, acc56);
        acc56 = fma(vec4<f32>(subgroupBroadcast(a7.w, 0u)), w3, acc56);
        acc57 = fma(vec4<f32>(subgroupBroadcast(a7.x, 1u)), w0, acc57);
        acc57 = fma(vec4<f32>(subgroupBroadcast(a7.y, 1u)), w1, acc57);
        acc57 = fma(vec4<f32>(subgroupBroadcast(a7.z, 1u)), w2, acc57);
        acc57 = fma(vec4<f32>(subgroupBroadcast(a7.w, 1u)), w3, acc57);
        acc58 = fma(vec4<f32>(subgroupBroadcast(a7.x, 2u)), w0, acc58);
        acc58 = fma(vec4<f32>(subgroupBroadcast(a7.y, 2u)), w1, acc58);
        acc58 = fma(vec4<f32>(subgroupBroadcast(a7.z, 2u)), w2, acc58);
        acc58 = fma(vec4<f32>(subgroupBroadcast(a7.w, 2u)), w3, acc58);
        acc59 = fma(vec4<f32>(subgroupBroadcast(a7.x, 3u)), w0, acc59);
        acc59 = fma(vec4<f32>(subgroupBroadcast(a7.y, 3u)), w1, acc59);
        acc59 = fma(vec4<f32>(subgroupBroadcast(a7.z, 3u)), w2, acc59);
        acc59 = fma(vec4<f32>(subgroupBroadcast(a7.w, 3u)), w3, acc59);
        acc60 = fma(vec4<f32>(subgroupBroadcast(a7.x, 4u)), w0, acc60);
        acc60 = fma(vec4<f32>(subgroupBroadcast(a7.y, 4u)), w1, acc60);
        acc60 = fma(vec4<f32>(subgroupBroadcast(a7.z, 4u)), w2, acc60);
        acc60 = fma(vec4<f32>(subgroupBroadcast(a7.w, 4u)), w3, acc60);
        acc61 = fma(vec4<f32>(subgroupBroadcast(a7.x, 5u)), w0, acc61);
        acc61 = fma(vec4<f32>(subgroupBroadcast(a7.y, 5u)), w1, acc61);
        acc61 = fma(vec4<f32>(subgroupBroadcast(a7.z, 5u)), w2, acc61);
        acc61 = fma(vec4<f32>(subgroupBroadcast(a7.w, 5u)), w3, acc61);
        acc62 = fma(vec4<f32>(subgroupBroadcast(a7.x, 6u)), w0, acc62);
        acc62 = fma(vec4<f32>(subgroupBroadcast(a7.y, 6u)), w1, acc62);
        acc62 = fma(vec4<f32>(subgroupBroadcast(a7.z, 6u)), w2, acc62);
        acc62 = fma(vec4<f32>(subgroupBroadcast(a7.w, 6u)), w3, acc62);
        acc63 = fma(vec4<f32>(subgroupBroadcast(a7.x, 7u)), w0, acc63);
        acc63 = fma(vec4<f32>(subgroupBroadcast(a7.y, 7u)), w1, acc63);
        acc63 = fma(vec4<f32>(subgroupBroadcast(a7.z, 7u)), w2, acc63);
        acc63 = fma(vec4<f32>(subgroupBroadcast(a7.w, 7u)), w3, acc63);
    }
    {
        let k4 = 8u;
        let a0 = vec4<f32>(v0(ar0 + k4 * 4u + 0u), 0.0f, 0.0f, 0.0f);
        let a1 = vec4<f32>(v0(ar1 + k4 * 4u + 0u), 0.0f, 0.0f, 0.0f);
        let a2 = vec4<f32>(v0(ar2 + k4 * 4u + 0u), 0.0f, 0.0f, 0.0f);
        let a3 = vec4<f32>(v0(ar3 + k4 * 4u + 0u), 0.0f, 0.0f, 0.0f);
        let a4 = vec4<f32>(v0(ar4 + k4 * 4u + 0u), 0.0f, 0.0f, 0.0f);
        let a5 = vec4<f32>(v0(ar5 + k4 * 4u + 0u), 0.0f, 0.0f, 0.0f);
        let a6 = vec4<f32>(v0(ar6 + k4 * 4u + 0u), 0.0f, 0.0f, 0.0f);
        let a7 = vec4<f32>(v0(ar7 + k4 * 4u + 0u), 0.0f, 0.0f, 0.0f);
        let w0 = fg_t1(bcol + (k4 * 4u + 0u) * 10u);
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
        acc16 = fma(vec4<f32>(subgroupBroadcast(a2.x, 0u)), w0, acc16);
        acc17 = fma(vec4<f32>(subgroupBroadcast(a2.x, 1u)), w0, acc17);
        acc18 = fma(vec4<f32>(subgroupBroadcast(a2.x, 2u)), w0, acc18);
        acc19 = fma(vec4<f32>(subgroupBroadcast(a2.x, 3u)), w0, acc19);
        acc20 = fma(vec4<f32>(subgroupBroadcast(a2.x, 4u)), w0, acc20);
        acc21 = fma(vec4<f32>(subgroupBroadcast(a2.x, 5u)), w0, acc21);
        acc22 = fma(vec4<f32>(subgroupBroadcast(a2.x, 6u)), w0, acc22);
        acc23 = fma(vec4<f32>(subgroupBroadcast(a2.x, 7u)), w0, acc23);
        acc24 = fma(vec4<f32>(subgroupBroadcast(a3.x, 0u)), w0, acc24);
        acc25 = fma(vec4<f32>(subgroupBroadcast(a3.x, 1u)), w0, acc25);
        acc26 = fma(vec4<f32>(subgroupBroadcast(a3.x, 2u)), w0, acc26);
        acc27 = fma(vec4<f32>(subgroupBroadcast(a3.x, 3u)), w0, acc27);
        acc28 = fma(vec4<f32>(subgroupBroadcast(a3.x, 4u)), w0, acc28);
        acc29 = fma(vec4<f32>(subgroupBroadcast(a3.x, 5u)), w0, acc29);
        acc30 = fma(vec4<f32>(subgroupBroadcast(a3.x, 6u)), w0, acc30);
        acc31 = fma(vec4<f32>(subgroupBroadcast(a3.x, 7u)), w0, acc31);
        acc32 = fma(vec4<f32>(subgroupBroadcast(a4.x, 0u)), w0, acc32);
        acc33 = fma(vec4<f32>(subgroupBroadcast(a4.x, 1u)), w0, acc33);
        acc34 = fma(vec4<f32>(subgroupBroadcast(a4.x, 2u)), w0, acc34);
        acc35 = fma(vec4<f32>(subgroupBroadcast(a4.x, 3u)), w0, acc35);
        acc36 = fma(vec4<f32>(subgroupBroadcast(a4.x, 4u)), w0, acc36);
        acc37 = fma(vec4<f32>(subgroupBroadcast(a4.x, 5u)), w0, acc37);
        acc38 = fma(vec4<f32>(subgroupBroadcast(a4.x, 6u)), w0, acc38);
        acc39 = fma(vec4<f32>(subgroupBroadcast(a4.x, 7u)), w0, acc39);
        acc40 = fma(vec4<f32>(subgroupBroadcast(a5.x, 0u)), w0, acc40);
        acc41 = fma(vec4<f32>(subgroupBroadcast(a5.x, 1u)), w0, acc41);
        acc42 = fma(vec4<f32>(subgroupBroadcast(a5.x, 2u)), w0, acc42);
        acc43 = fma(vec4<f32>(subgroupBroadcast(a5.x, 3u)), w0, acc43);
        acc44 = fma(vec4<f32>(subgroupBroadcast(a5.x, 4u)), w0, acc44);
        acc45 = fma(vec4<f32>(subgroupBroadcast(a5.x, 5u)), w0, acc45);
        acc46 = fma(vec4<f32>(subgroupBroadcast(a5.x, 6u)), w0, acc46);
        acc47 = fma(vec4<f32>(subgroupBroadcast(a5.x, 7u)), w0, acc47);
        acc48 = fma(vec4<f32>(subgroupBroadcast(a6.x, 0u)), w0, acc48);
        acc49 = fma(vec4<f32>(subgroupBroadcast(a6.x, 1u)), w0, acc49);
        acc50 = fma(vec4<f32>(subgroupBroadcast(a6.x, 2u)), w0, acc50);
        acc51 = fma(vec4<f32>(subgroupBroadcast(a6.x, 3u)), w0, acc51);
        acc52 = fma(vec4<f32>(subgroupBroadcast(a6.x, 4u)), w0, acc52);
        acc53 = fma(vec4<f32>(subgroupBroadcast(a6.x, 5u)), w0, acc53);
        acc54 = fma(vec4<f32>(subgroupBroadcast(a6.x, 6u)), w0, acc54);
        acc55 = fma(vec4<f32>(subgroupBroadcast(a6.x, 7u)), w0, acc55);
        acc56 = fma(vec4<f32>(subgroupBroadcast(a7.x, 0u)), w0, acc56);
        acc57 = fma(vec4<f32>(subgroupBroadcast(a7.x, 1u)), w0, acc57);
        acc58 = fma(vec4<f32>(subgroupBroadcast(a7.x, 2u)), w0, acc58);
        acc59 = fma(vec4<f32>(subgroupBroadcast(a7.x, 3u)), w0, acc59);
        acc60 = fma(vec4<f32>(subgroupBroadcast(a7.x, 4u)), w0, acc60);
        acc61 = fma(vec4<f32>(subgroupBroadcast(a7.x, 5u)), w0, acc61);
        acc62 = fma(vec4<f32>(subgroupBroadcast(a7.x, 6u)), w0, acc62);
        acc63 = fma(vec4<f32>(subgroupBroadcast(a7.x, 7u)), w0, acc63);
    }
    let gc0 = col0 + lane * 4u + 0u;
    let gc1 = col0 + lane * 4u + 1u;
    let gc2 = col0 + lane * 4u + 2u;
    let gc3 = col0 + lane * 4u + 3u;
    let h7_0 = v7(bt * 2880u + row0 * 40u + min(gc0, 39u));
    let h7_1 = v7(bt * 2880u + row0 * 40u + min(gc1, 39u));
    let h7_2 = v7(bt * 2880u + row0 * 40u + min(gc2, 39u));
    let h7_3 = v7(bt * 2880u + row0 * 40u + min(gc3, 39u));
    if (row0 + 0u < 72u) {
        let idx = bt * 2880u + (row0 + 0u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc0.x, h7_0), e19_acc(idx + gc1, acc0.y, h7_1), e19_acc(idx + gc2, acc0.z, h7_2), e19_acc(idx + gc3, acc0.w, h7_3)); }
    }
    if (row0 + 1u < 72u) {
        let idx = bt * 2880u + (row0 + 1u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc1.x, h7_0), e19_acc(idx + gc1, acc1.y, h7_1), e19_acc(idx + gc2, acc1.z, h7_2), e19_acc(idx + gc3, acc1.w, h7_3)); }
    }
    if (row0 + 2u < 72u) {
        let idx = bt * 2880u + (row0 + 2u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc2.x, h7_0), e19_acc(idx + gc1, acc2.y, h7_1), e19_acc(idx + gc2, acc2.z, h7_2), e19_acc(idx + gc3, acc2.w, h7_3)); }
    }
    if (row0 + 3u < 72u) {
        let idx = bt * 2880u + (row0 + 3u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc3.x, h7_0), e19_acc(idx + gc1, acc3.y, h7_1), e19_acc(idx + gc2, acc3.z, h7_2), e19_acc(idx + gc3, acc3.w, h7_3)); }
    }
    if (row0 + 4u < 72u) {
        let idx = bt * 2880u + (row0 + 4u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc4.x, h7_0), e19_acc(idx + gc1, acc4.y, h7_1), e19_acc(idx + gc2, acc4.z, h7_2), e19_acc(idx + gc3, acc4.w, h7_3)); }
    }
    if (row0 + 5u < 72u) {
        let idx = bt * 2880u + (row0 + 5u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc5.x, h7_0), e19_acc(idx + gc1, acc5.y, h7_1), e19_acc(idx + gc2, acc5.z, h7_2), e19_acc(idx + gc3, acc5.w, h7_3)); }
    }
    if (row0 + 6u < 72u) {
        let idx = bt * 2880u + (row0 + 6u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc6.x, h7_0), e19_acc(idx + gc1, acc6.y, h7_1), e19_acc(idx + gc2, acc6.z, h7_2), e19_acc(idx + gc3, acc6.w, h7_3)); }
    }
    if (row0 + 7u < 72u) {
        let idx = bt * 2880u + (row0 + 7u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc7.x, h7_0), e19_acc(idx + gc1, acc7.y, h7_1), e19_acc(idx + gc2, acc7.z, h7_2), e19_acc(idx + gc3, acc7.w, h7_3)); }
    }
    if (row0 + 8u < 72u) {
        let idx = bt * 2880u + (row0 + 8u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc8.x, h7_0), e19_acc(idx + gc1, acc8.y, h7_1), e19_acc(idx + gc2, acc8.z, h7_2), e19_acc(idx + gc3, acc8.w, h7_3)); }
    }
    if (row0 + 9u < 72u) {
        let idx = bt * 2880u + (row0 + 9u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc9.x, h7_0), e19_acc(idx + gc1, acc9.y, h7_1), e19_acc(idx + gc2, acc9.z, h7_2), e19_acc(idx + gc3, acc9.w, h7_3)); }
    }
    if (row0 + 10u < 72u) {
        let idx = bt * 2880u + (row0 + 10u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc10.x, h7_0), e19_acc(idx + gc1, acc10.y, h7_1), e19_acc(idx + gc2, acc10.z, h7_2), e19_acc(idx + gc3, acc10.w, h7_3)); }
    }
    if (row0 + 11u < 72u) {
        let idx = bt * 2880u + (row0 + 11u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc11.x, h7_0), e19_acc(idx + gc1, acc11.y, h7_1), e19_acc(idx + gc2, acc11.z, h7_2), e19_acc(idx + gc3, acc11.w, h7_3)); }
    }
    if (row0 + 12u < 72u) {
        let idx = bt * 2880u + (row0 + 12u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc12.x, h7_0), e19_acc(idx + gc1, acc12.y, h7_1), e19_acc(idx + gc2, acc12.z, h7_2), e19_acc(idx + gc3, acc12.w, h7_3)); }
    }
    if (row0 + 13u < 72u) {
        let idx = bt * 2880u + (row0 + 13u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc13.x, h7_0), e19_acc(idx + gc1, acc13.y, h7_1), e19_acc(idx + gc2, acc13.z, h7_2), e19_acc(idx + gc3, acc13.w, h7_3)); }
    }
    if (row0 + 14u < 72u) {
        let idx = bt * 2880u + (row0 + 14u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc14.x, h7_0), e19_acc(idx + gc1, acc14.y, h7_1), e19_acc(idx + gc2, acc14.z, h7_2), e19_acc(idx + gc3, acc14.w, h7_3)); }
    }
    if (row0 + 15u < 72u) {
        let idx = bt * 2880u + (row0 + 15u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc15.x, h7_0), e19_acc(idx + gc1, acc15.y, h7_1), e19_acc(idx + gc2, acc15.z, h7_2), e19_acc(idx + gc3, acc15.w, h7_3)); }
    }
    if (row0 + 16u < 72u) {
        let idx = bt * 2880u + (row0 + 16u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc16.x, h7_0), e19_acc(idx + gc1, acc16.y, h7_1), e19_acc(idx + gc2, acc16.z, h7_2), e19_acc(idx + gc3, acc16.w, h7_3)); }
    }
    if (row0 + 17u < 72u) {
        let idx = bt * 2880u + (row0 + 17u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc17.x, h7_0), e19_acc(idx + gc1, acc17.y, h7_1), e19_acc(idx + gc2, acc17.z, h7_2), e19_acc(idx + gc3, acc17.w, h7_3)); }
    }
    if (row0 + 18u < 72u) {
        let idx = bt * 2880u + (row0 + 18u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc18.x, h7_0), e19_acc(idx + gc1, acc18.y, h7_1), e19_acc(idx + gc2, acc18.z, h7_2), e19_acc(idx + gc3, acc18.w, h7_3)); }
    }
    if (row0 + 19u < 72u) {
        let idx = bt * 2880u + (row0 + 19u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc19.x, h7_0), e19_acc(idx + gc1, acc19.y, h7_1), e19_acc(idx + gc2, acc19.z, h7_2), e19_acc(idx + gc3, acc19.w, h7_3)); }
    }
    if (row0 + 20u < 72u) {
        let idx = bt * 2880u + (row0 + 20u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc20.x, h7_0), e19_acc(idx + gc1, acc20.y, h7_1), e19_acc(idx + gc2, acc20.z, h7_2), e19_acc(idx + gc3, acc20.w, h7_3)); }
    }
    if (row0 + 21u < 72u) {
        let idx = bt * 2880u + (row0 + 21u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc21.x, h7_0), e19_acc(idx + gc1, acc21.y, h7_1), e19_acc(idx + gc2, acc21.z, h7_2), e19_acc(idx + gc3, acc21.w, h7_3)); }
    }
    if (row0 + 22u < 72u) {
        let idx = bt * 2880u + (row0 + 22u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc22.x, h7_0), e19_acc(idx + gc1, acc22.y, h7_1), e19_acc(idx + gc2, acc22.z, h7_2), e19_acc(idx + gc3, acc22.w, h7_3)); }
    }
    if (row0 + 23u < 72u) {
        let idx = bt * 2880u + (row0 + 23u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc23.x, h7_0), e19_acc(idx + gc1, acc23.y, h7_1), e19_acc(idx + gc2, acc23.z, h7_2), e19_acc(idx + gc3, acc23.w, h7_3)); }
    }
    if (row0 + 24u < 72u) {
        let idx = bt * 2880u + (row0 + 24u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc24.x, h7_0), e19_acc(idx + gc1, acc24.y, h7_1), e19_acc(idx + gc2, acc24.z, h7_2), e19_acc(idx + gc3, acc24.w, h7_3)); }
    }
    if (row0 + 25u < 72u) {
        let idx = bt * 2880u + (row0 + 25u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc25.x, h7_0), e19_acc(idx + gc1, acc25.y, h7_1), e19_acc(idx + gc2, acc25.z, h7_2), e19_acc(idx + gc3, acc25.w, h7_3)); }
    }
    if (row0 + 26u < 72u) {
        let idx = bt * 2880u + (row0 + 26u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc26.x, h7_0), e19_acc(idx + gc1, acc26.y, h7_1), e19_acc(idx + gc2, acc26.z, h7_2), e19_acc(idx + gc3, acc26.w, h7_3)); }
    }
    if (row0 + 27u < 72u) {
        let idx = bt * 2880u + (row0 + 27u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc27.x, h7_0), e19_acc(idx + gc1, acc27.y, h7_1), e19_acc(idx + gc2, acc27.z, h7_2), e19_acc(idx + gc3, acc27.w, h7_3)); }
    }
    if (row0 + 28u < 72u) {
        let idx = bt * 2880u + (row0 + 28u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc28.x, h7_0), e19_acc(idx + gc1, acc28.y, h7_1), e19_acc(idx + gc2, acc28.z, h7_2), e19_acc(idx + gc3, acc28.w, h7_3)); }
    }
    if (row0 + 29u < 72u) {
        let idx = bt * 2880u + (row0 + 29u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc29.x, h7_0), e19_acc(idx + gc1, acc29.y, h7_1), e19_acc(idx + gc2, acc29.z, h7_2), e19_acc(idx + gc3, acc29.w, h7_3)); }
    }
    if (row0 + 30u < 72u) {
        let idx = bt * 2880u + (row0 + 30u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc30.x, h7_0), e19_acc(idx + gc1, acc30.y, h7_1), e19_acc(idx + gc2, acc30.z, h7_2), e19_acc(idx + gc3, acc30.w, h7_3)); }
    }
    if (row0 + 31u < 72u) {
        let idx = bt * 2880u + (row0 + 31u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc31.x, h7_0), e19_acc(idx + gc1, acc31.y, h7_1), e19_acc(idx + gc2, acc31.z, h7_2), e19_acc(idx + gc3, acc31.w, h7_3)); }
    }
    if (row0 + 32u < 72u) {
        let idx = bt * 2880u + (row0 + 32u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc32.x, h7_0), e19_acc(idx + gc1, acc32.y, h7_1), e19_acc(idx + gc2, acc32.z, h7_2), e19_acc(idx + gc3, acc32.w, h7_3)); }
    }
    if (row0 + 33u < 72u) {
        let idx = bt * 2880u + (row0 + 33u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc33.x, h7_0), e19_acc(idx + gc1, acc33.y, h7_1), e19_acc(idx + gc2, acc33.z, h7_2), e19_acc(idx + gc3, acc33.w, h7_3)); }
    }
    if (row0 + 34u < 72u) {
        let idx = bt * 2880u + (row0 + 34u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc34.x, h7_0), e19_acc(idx + gc1, acc34.y, h7_1), e19_acc(idx + gc2, acc34.z, h7_2), e19_acc(idx + gc3, acc34.w, h7_3)); }
    }
    if (row0 + 35u < 72u) {
        let idx = bt * 2880u + (row0 + 35u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc35.x, h7_0), e19_acc(idx + gc1, acc35.y, h7_1), e19_acc(idx + gc2, acc35.z, h7_2), e19_acc(idx + gc3, acc35.w, h7_3)); }
    }
    if (row0 + 36u < 72u) {
        let idx = bt * 2880u + (row0 + 36u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc36.x, h7_0), e19_acc(idx + gc1, acc36.y, h7_1), e19_acc(idx + gc2, acc36.z, h7_2), e19_acc(idx + gc3, acc36.w, h7_3)); }
    }
    if (row0 + 37u < 72u) {
        let idx = bt * 2880u + (row0 + 37u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc37.x, h7_0), e19_acc(idx + gc1, acc37.y, h7_1), e19_acc(idx + gc2, acc37.z, h7_2), e19_acc(idx + gc3, acc37.w, h7_3)); }
    }
    if (row0 + 38u < 72u) {
        let idx = bt * 2880u + (row0 + 38u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc38.x, h7_0), e19_acc(idx + gc1, acc38.y, h7_1), e19_acc(idx + gc2, acc38.z, h7_2), e19_acc(idx + gc3, acc38.w, h7_3)); }
    }
    if (row0 + 39u < 72u) {
        let idx = bt * 2880u + (row0 + 39u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc39.x, h7_0), e19_acc(idx + gc1, acc39.y, h7_1), e19_acc(idx + gc2, acc39.z, h7_2), e19_acc(idx + gc3, acc39.w, h7_3)); }
    }
    if (row0 + 40u < 72u) {
        let idx = bt * 2880u + (row0 + 40u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc40.x, h7_0), e19_acc(idx + gc1, acc40.y, h7_1), e19_acc(idx + gc2, acc40.z, h7_2), e19_acc(idx + gc3, acc40.w, h7_3)); }
    }
    if (row0 + 41u < 72u) {
        let idx = bt * 2880u + (row0 + 41u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc41.x, h7_0), e19_acc(idx + gc1, acc41.y, h7_1), e19_acc(idx + gc2, acc41.z, h7_2), e19_acc(idx + gc3, acc41.w, h7_3)); }
    }
    if (row0 + 42u < 72u) {
        let idx = bt * 2880u + (row0 + 42u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc42.x, h7_0), e19_acc(idx + gc1, acc42.y, h7_1), e19_acc(idx + gc2, acc42.z, h7_2), e19_acc(idx + gc3, acc42.w, h7_3)); }
    }
    if (row0 + 43u < 72u) {
        let idx = bt * 2880u + (row0 + 43u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc43.x, h7_0), e19_acc(idx + gc1, acc43.y, h7_1), e19_acc(idx + gc2, acc43.z, h7_2), e19_acc(idx + gc3, acc43.w, h7_3)); }
    }
    if (row0 + 44u < 72u) {
        let idx = bt * 2880u + (row0 + 44u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc44.x, h7_0), e19_acc(idx + gc1, acc44.y, h7_1), e19_acc(idx + gc2, acc44.z, h7_2), e19_acc(idx + gc3, acc44.w, h7_3)); }
    }
    if (row0 + 45u < 72u) {
        let idx = bt * 2880u + (row0 + 45u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc45.x, h7_0), e19_acc(idx + gc1, acc45.y, h7_1), e19_acc(idx + gc2, acc45.z, h7_2), e19_acc(idx + gc3, acc45.w, h7_3)); }
    }
    if (row0 + 46u < 72u) {
        let idx = bt * 2880u + (row0 + 46u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc46.x, h7_0), e19_acc(idx + gc1, acc46.y, h7_1), e19_acc(idx + gc2, acc46.z, h7_2), e19_acc(idx + gc3, acc46.w, h7_3)); }
    }
    if (row0 + 47u < 72u) {
        let idx = bt * 2880u + (row0 + 47u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc47.x, h7_0), e19_acc(idx + gc1, acc47.y, h7_1), e19_acc(idx + gc2, acc47.z, h7_2), e19_acc(idx + gc3, acc47.w, h7_3)); }
    }
    if (row0 + 48u < 72u) {
        let idx = bt * 2880u + (row0 + 48u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc48.x, h7_0), e19_acc(idx + gc1, acc48.y, h7_1), e19_acc(idx + gc2, acc48.z, h7_2), e19_acc(idx + gc3, acc48.w, h7_3)); }
    }
    if (row0 + 49u < 72u) {
        let idx = bt * 2880u + (row0 + 49u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc49.x, h7_0), e19_acc(idx + gc1, acc49.y, h7_1), e19_acc(idx + gc2, acc49.z, h7_2), e19_acc(idx + gc3, acc49.w, h7_3)); }
    }
    if (row0 + 50u < 72u) {
        let idx = bt * 2880u + (row0 + 50u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc50.x, h7_0), e19_acc(idx + gc1, acc50.y, h7_1), e19_acc(idx + gc2, acc50.z, h7_2), e19_acc(idx + gc3, acc50.w, h7_3)); }
    }
    if (row0 + 51u < 72u) {
        let idx = bt * 2880u + (row0 + 51u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc51.x, h7_0), e19_acc(idx + gc1, acc51.y, h7_1), e19_acc(idx + gc2, acc51.z, h7_2), e19_acc(idx + gc3, acc51.w, h7_3)); }
    }
    if (row0 + 52u < 72u) {
        let idx = bt * 2880u + (row0 + 52u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc52.x, h7_0), e19_acc(idx + gc1, acc52.y, h7_1), e19_acc(idx + gc2, acc52.z, h7_2), e19_acc(idx + gc3, acc52.w, h7_3)); }
    }
    if (row0 + 53u < 72u) {
        let idx = bt * 2880u + (row0 + 53u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc53.x, h7_0), e19_acc(idx + gc1, acc53.y, h7_1), e19_acc(idx + gc2, acc53.z, h7_2), e19_acc(idx + gc3, acc53.w, h7_3)); }
    }
    if (row0 + 54u < 72u) {
        let idx = bt * 2880u + (row0 + 54u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc54.x, h7_0), e19_acc(idx + gc1, acc54.y, h7_1), e19_acc(idx + gc2, acc54.z, h7_2), e19_acc(idx + gc3, acc54.w, h7_3)); }
    }
    if (row0 + 55u < 72u) {
        let idx = bt * 2880u + (row0 + 55u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc55.x, h7_0), e19_acc(idx + gc1, acc55.y, h7_1), e19_acc(idx + gc2, acc55.z, h7_2), e19_acc(idx + gc3, acc55.w, h7_3)); }
    }
    if (row0 + 56u < 72u) {
        let idx = bt * 2880u + (row0 + 56u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc56.x, h7_0), e19_acc(idx + gc1, acc56.y, h7_1), e19_acc(idx + gc2, acc56.z, h7_2), e19_acc(idx + gc3, acc56.w, h7_3)); }
    }
    if (row0 + 57u < 72u) {
        let idx = bt * 2880u + (row0 + 57u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc57.x, h7_0), e19_acc(idx + gc1, acc57.y, h7_1), e19_acc(idx + gc2, acc57.z, h7_2), e19_acc(idx + gc3, acc57.w, h7_3)); }
    }
    if (row0 + 58u < 72u) {
        let idx = bt * 2880u + (row0 + 58u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc58.x, h7_0), e19_acc(idx + gc1, acc58.y, h7_1), e19_acc(idx + gc2, acc58.z, h7_2), e19_acc(idx + gc3, acc58.w, h7_3)); }
    }
    if (row0 + 59u < 72u) {
        let idx = bt * 2880u + (row0 + 59u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc59.x, h7_0), e19_acc(idx + gc1, acc59.y, h7_1), e19_acc(idx + gc2, acc59.z, h7_2), e19_acc(idx + gc3, acc59.w, h7_3)); }
    }
    if (row0 + 60u < 72u) {
        let idx = bt * 2880u + (row0 + 60u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc60.x, h7_0), e19_acc(idx + gc1, acc60.y, h7_1), e19_acc(idx + gc2, acc60.z, h7_2), e19_acc(idx + gc3, acc60.w, h7_3)); }
    }
    if (row0 + 61u < 72u) {
        let idx = bt * 2880u + (row0 + 61u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc61.x, h7_0), e19_acc(idx + gc1, acc61.y, h7_1), e19_acc(idx + gc2, acc61.z, h7_2), e19_acc(idx + gc3, acc61.w, h7_3)); }
    }
    if (row0 + 62u < 72u) {
        let idx = bt * 2880u + (row0 + 62u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc62.x, h7_0), e19_acc(idx + gc1, acc62.y, h7_1), e19_acc(idx + gc2, acc62.z, h7_2), e19_acc(idx + gc3, acc62.w, h7_3)); }
    }
    if (row0 + 63u < 72u) {
        let idx = bt * 2880u + (row0 + 63u) * 40u;
        if (gc0 < 40u) { b3[(idx + gc0) >> 2u] = vec4<f32>(e19_acc(idx + gc0, acc63.x, h7_0), e19_acc(idx + gc1, acc63.y, h7_1), e19_acc(idx + gc2, acc63.z, h7_2), e19_acc(idx + gc3, acc63.w, h7_3)); }
    }
}
