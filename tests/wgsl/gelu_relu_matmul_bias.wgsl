// kernel matmul+full+broadcast+max+broadcast+add+full+broadcast+mul+erf+full+broadcast+add+mul+full+broadcast+mul (1 workgroups)
@group(0) @binding(0) var<storage, read_write> b0: array<f32>;
@group(0) @binding(1) var<storage, read_write> b1: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> b2: array<f32>;
@group(0) @binding(3) var<storage, read_write> b3: array<vec4<f32>>;

fn v0(i: u32) -> f32 {
    return b0[i];
}

fn v1(i: u32) -> f32 {
    return b1[i >> 2u][i & 3u];
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

var<workgroup> fg_tile_a: array<vec4<f32>, 128>;
var<workgroup> fg_tile_b: array<vec4<f32>, 512>;

// The error function (Abramowitz & Stegun 7.1.26, absolute error below 1.5e-7).
fn fg_erf(x: f32) -> f32 {
    let a = abs(x);
    let t = 1.0f / (1.0f + 0.3275911f * a);
    let poly = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
    return sign(x) * (1.0f - poly * exp(-a * a));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let wg = wid.y * nwg.x + wid.x;
    if (wg >= 1u) { return; }
    let tile_col = wg % 1u;
    let tile_row = (wg / 1u) % 1u;
    let bt = wg / 1u;
    let a_base = 0u;
    let b_base = 0u;
    let o_base = bt * 180u;
    let row0 = tile_row * 16u;
    let col0 = tile_col * 64u;
    let tx = lid % 16u;
    let ty = lid / 16u;
    var acc0_0 = vec4<f32>();
    var acc1_0 = vec4<f32>();
    var acc2_0 = vec4<f32>();
    var acc3_0 = vec4<f32>();
    var pb0 = vec4<f32>();
    { let kq = (0u + lid) / 16u; let o = ((0u + lid) % 16u) * 4u; if (col0 + o < 20u && 0u + kq < 33u) { pb0 = b1[(col0 + o + (0u + kq) * 20u) >> 2u]; } }
    var pb1 = vec4<f32>();
    { let kq = (64u + lid) / 16u; let o = ((64u + lid) % 16u) * 4u; if (col0 + o < 20u && 0u + kq < 33u) { pb1 = b1[(col0 + o + (0u + kq) * 20u) >> 2u]; } }
    var pb2 = vec4<f32>();
    { let kq = (128u + lid) / 16u; let o = ((128u + lid) % 16u) * 4u; if (col0 + o < 20u && 0u + kq < 33u) { pb2 = b1[(col0 + o + (0u + kq) * 20u) >> 2u]; } }
    var pb3 = vec4<f32>();
    { let kq = (192u + lid) / 16u; let o = ((192u + lid) % 16u) * 4u; if (col0 + o < 20u && 0u + kq < 33u) { pb3 = b1[(col0 + o + (0u + kq) * 20u) >> 2u]; } }
    var pb4 = vec4<f32>();
    { let kq = (256u + lid) / 16u; let o = ((256u + lid) % 16u) * 4u; if (col0 + o < 20u && 0u + kq < 33u) { pb4 = b1[(col0 + o + (0u + kq) * 20u) >> 2u]; } }
    var pb5 = vec4<f32>();
    { let kq = (320u + lid) / 16u; let o = ((320u + lid) % 16u) * 4u; if (col0 + o < 20u && 0u + kq < 33u) { pb5 = b1[(col0 + o + (0u + kq) * 20u) >> 2u]; } }
    var pb6 = vec4<f32>();
    { let kq = (384u + lid) / 16u; let o = ((384u + lid) % 16u) * 4u; if (col0 + o < 20u && 0u + kq < 33u) { pb6 = b1[(col0 + o + (0u + kq) * 20u) >> 2u]; } }
    var pb7 = vec4<f32>();
    { let kq = (448u + lid) / 16u; let o = ((448u + lid) % 16u) * 4u; if (col0 + o < 20u && 0u + kq < 33u) { pb7 = b1[(col0 + o + (0u + kq) * 20u) >> 2u]; } }
    for (var k0 = 0u; k0 < 33u; k0 = k0 + 32u) {
        for (var l = 0u; l < 2u; l = l + 1u) {
            let e = l * 64u + lid;
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
            fg_tile_a[kk * 4u + e / 32u] = x;
        }
        { let kq = (0u + lid) / 16u; let o = ((0u + lid) % 16u) * 4u;
            fg_tile_b[kq * 16u + o / 4u] = pb0;
        }
        { let kq = (64u + lid) / 16u; let o = ((64u + lid) % 16u) * 4u;
            fg_tile_b[kq * 16u + o / 4u] = pb1;
        }
        { let kq = (128u + lid) / 16u; let o = ((128u + lid) % 16u) * 4u;
            fg_tile_b[kq * 16u + o / 4u] = pb2;
        }
        { let kq = (192u + lid) / 16u; let o = ((192u + lid) % 16u) * 4u;
            fg_tile_b[kq * 16u + o / 4u] = pb3;
        }
        { let kq = (256u + lid) / 16u; let o = ((256u + lid) % 16u) * 4u;
            fg_tile_b[kq * 16u + o / 4u] = pb4;
        }
        { let kq = (320u + lid) / 16u; let o = ((320u + lid) % 16u) * 4u;
            fg_tile_b[kq * 16u + o / 4u] = pb5;
        }
        { let kq = (384u + lid) / 16u; let o = ((384u + lid) % 16u) * 4u;
            fg_tile_b[kq * 16u + o / 4u] = pb6;
        }
        { let kq = (448u + lid) / 16u; let o = ((448u + lid) % 16u) * 4u;
            fg_tile_b[kq * 16u + o / 4u] = pb7;
        }
        workgroupBarrier();
        pb0 = vec4<f32>();
        { let kq = (0u + lid) / 16u; let o = ((0u + lid) % 16u) * 4u; if (col0 + o < 20u && k0 + 32u + kq < 33u) { pb0 = b1[(col0 + o + (k0 + 32u + kq) * 20u) >> 2u]; } }
        pb1 = vec4<f32>();
        { let kq = (64u + lid) / 16u; let o = ((64u + lid) % 16u) * 4u; if (col0 + o < 20u && k0 + 32u + kq < 33u) { pb1 = b1[(col0 + o + (k0 + 32u + kq) * 20u) >> 2u]; } }
        pb2 = vec4<f32>();
        { let kq = (128u + lid) / 16u; let o = ((128u + lid) % 16u) * 4u; if (col0 + o < 20u && k0 + 32u + kq < 33u) { pb2 = b1[(col0 + o + (k0 + 32u + kq) * 20u) >> 2u]; } }
        pb3 = vec4<f32>();
        { let kq = (192u + lid) / 16u; let o = ((192u + lid) % 16u) * 4u; if (col0 + o < 20u && k0 + 32u + kq < 33u) { pb3 = b1[(col0 + o + (k0 + 32u + kq) * 20u) >> 2u]; } }
        pb4 = vec4<f32>();
        { let kq = (256u + lid) / 16u; let o = ((256u + lid) % 16u) * 4u; if (col0 + o < 20u && k0 + 32u + kq < 33u) { pb4 = b1[(col0 + o + (k0 + 32u + kq) * 20u) >> 2u]; } }
        pb5 = vec4<f32>();
        { let kq = (320u + lid) / 16u; let o = ((320u + lid) % 16u) * 4u; if (col0 + o < 20u && k0 + 32u + kq < 33u) { pb5 = b1[(col0 + o + (k0 + 32u + kq) * 20u) >> 2u]; } }
        pb6 = vec4<f32>();
        { let kq = (384u + lid) / 16u; let o = ((384u + lid) % 16u) * 4u; if (col0 + o < 20u && k0 + 32u + kq < 33u) { pb6 = b1[(col0 + o + (k0 + 32u + kq) * 20u) >> 2u]; } }
        pb7 = vec4<f32>();
        { let kq = (448u + lid) / 16u; let o = ((448u + lid) % 16u) * 4u; if (col0 + o < 20u && k0 + 32u + kq < 33u) { pb7 = b1[(col0 + o + (k0 + 32u + kq) * 20u) >> 2u]; } }
        for (var kk = 0u; kk < 32u; kk = kk + 1u) {
            let a0 = fg_tile_a[kk * 4u + ty * 1u + 0u];
            let b0 = fg_tile_b[kk * 16u + tx];
            acc0_0 = acc0_0 + a0.x * b0;
            acc1_0 = acc1_0 + a0.y * b0;
            acc2_0 = acc2_0 + a0.z * b0;
            acc3_0 = acc3_0 + a0.w * b0;
        }
        workgroupBarrier();
    }
    let gc0 = col0 + tx * 4u;
    let h7_0 = v7(o_base + min(row0 + ty * 4u, 8u) * 20u + min(gc0 + 0u, 19u));
    let h7_1 = v7(o_base + min(row0 + ty * 4u, 8u) * 20u + min(gc0 + 1u, 19u));
    let h7_2 = v7(o_base + min(row0 + ty * 4u, 8u) * 20u + min(gc0 + 2u, 19u));
    let h7_3 = v7(o_base + min(row0 + ty * 4u, 8u) * 20u + min(gc0 + 3u, 19u));
    if (row0 + ty * 4u + 0u < 9u) {
        let idx = o_base + (row0 + ty * 4u + 0u) * 20u;
        if (gc0 + 0u < 20u) { b3[(idx + gc0 + 0u) >> 2u] = vec4<f32>(e19_acc(idx + gc0 + 0u, acc0_0.x, h7_0), e19_acc(idx + gc0 + 1u, acc0_0.y, h7_1), e19_acc(idx + gc0 + 2u, acc0_0.z, h7_2), e19_acc(idx + gc0 + 3u, acc0_0.w, h7_3)); }
    }
    if (row0 + ty * 4u + 1u < 9u) {
        let idx = o_base + (row0 + ty * 4u + 1u) * 20u;
        if (gc0 + 0u < 20u) { b3[(idx + gc0 + 0u) >> 2u] = vec4<f32>(e19_acc(idx + gc0 + 0u, acc1_0.x, h7_0), e19_acc(idx + gc0 + 1u, acc1_0.y, h7_1), e19_acc(idx + gc0 + 2u, acc1_0.z, h7_2), e19_acc(idx + gc0 + 3u, acc1_0.w, h7_3)); }
    }
    if (row0 + ty * 4u + 2u < 9u) {
        let idx = o_base + (row0 + ty * 4u + 2u) * 20u;
        if (gc0 + 0u < 20u) { b3[(idx + gc0 + 0u) >> 2u] = vec4<f32>(e19_acc(idx + gc0 + 0u, acc2_0.x, h7_0), e19_acc(idx + gc0 + 1u, acc2_0.y, h7_1), e19_acc(idx + gc0 + 2u, acc2_0.z, h7_2), e19_acc(idx + gc0 + 3u, acc2_0.w, h7_3)); }
    }
    if (row0 + ty * 4u + 3u < 9u) {
        let idx = o_base + (row0 + ty * 4u + 3u) * 20u;
        if (gc0 + 0u < 20u) { b3[(idx + gc0 + 0u) >> 2u] = vec4<f32>(e19_acc(idx + gc0 + 0u, acc3_0.x, h7_0), e19_acc(idx + gc0 + 1u, acc3_0.y, h7_1), e19_acc(idx + gc0 + 2u, acc3_0.z, h7_2), e19_acc(idx + gc0 + 3u, acc3_0.w, h7_3)); }
    }
}
