// kernel matmul+full+broadcast+max+broadcast+add+full+broadcast+mul+erf+full+broadcast+add+mul+full+broadcast+mul (1 workgroups)
@group(0) @binding(0) var<storage, read_write> b0: array<f32>;
@group(0) @binding(1) var<storage, read_write> b1: array<f32>;
@group(0) @binding(2) var<storage, read_write> b2: array<f32>;
@group(0) @binding(3) var<storage, read_write> b3: array<f32>;

fn v0(i: u32) -> f32 {
    return b0[i];
}

fn v1(i: u32) -> f32 {
    return b1[i];
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

fn e19(i: u32) -> f32 {
    let x3 = v3(i);
    let x5 = v5(i);
    let x6 = max(x3, x5);
    let x7 = v7(i);
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

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (t < 180u) { b3[t] = e19(t); }
}
