// kernel add+full+broadcast+mul+tanh+sub+add+full+broadcast+mul+tanh+sub+add+full+broadcast+mul+tanh+sub+add+full+broadcast+mul+tanh+sub+add+full+broadcast+mul+tanh+sub (4 workgroups)
enable f16;

@group(0) @binding(0) var<storage, read_write> b0: array<f16>;
@group(0) @binding(1) var<storage, read_write> b1: array<f16>;
@group(0) @binding(2) var<storage, read_write> b2: array<f16>;

fn v0(i: u32) -> f32 {
    return f32(b0[i]);
}

fn v1(i: u32) -> f32 {
    return f32(b1[i]);
}

// add : f16[1000]
fn v2(i: u32) -> f32 {
    return (v0(i) + v1(i));
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
    return (v2(i) * v4(i));
}

// tanh : f16[1000]
fn v6(i: u32) -> f32 {
    return tanh(clamp(v5(i), -15.0f, 15.0f));
}

// sub : f16[1000]
fn v7(i: u32) -> f32 {
    return (v6(i) - v1(i));
}

// add : f16[1000]
fn v8(i: u32) -> f32 {
    return (v7(i) + v1(i));
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
    return (v8(i) * v10(i));
}

// tanh : f16[1000]
fn v12(i: u32) -> f32 {
    return tanh(clamp(v11(i), -15.0f, 15.0f));
}

// sub : f16[1000]
fn v13(i: u32) -> f32 {
    return (v12(i) - v1(i));
}

// add : f16[1000]
fn v14(i: u32) -> f32 {
    return (v13(i) + v1(i));
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
    return (v14(i) * v16(i));
}

// tanh : f16[1000]
fn v18(i: u32) -> f32 {
    return tanh(clamp(v17(i), -15.0f, 15.0f));
}

// sub : f16[1000]
fn v19(i: u32) -> f32 {
    return (v18(i) - v1(i));
}

// add : f16[1000]
fn v20(i: u32) -> f32 {
    return (v19(i) + v1(i));
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
    return (v20(i) * v22(i));
}

// tanh : f16[1000]
fn v24(i: u32) -> f32 {
    return tanh(clamp(v23(i), -15.0f, 15.0f));
}

// sub : f16[1000]
fn v25(i: u32) -> f32 {
    return (v24(i) - v1(i));
}

// add : f16[1000]
fn v26(i: u32) -> f32 {
    return (v25(i) + v1(i));
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
    return (v26(i) * v28(i));
}

// tanh : f16[1000]
fn v30(i: u32) -> f32 {
    return tanh(clamp(v29(i), -15.0f, 15.0f));
}

// sub : f16[1000]
fn v31(i: u32) -> f32 {
    return (v30(i) - v1(i));
}

fn e31(i: u32) -> f32 {
    let y0 = v0(i);
    let y1 = v1(i);
    let x2 = (y0 + y1);
    let x4 = v4(i);
    let x5 = (x2 * x4);
    let x6 = tanh(clamp(x5, -15.0f, 15.0f));
    let x7 = (x6 - y1);
    let x8 = (x7 + y1);
    let x10 = v10(i);
    let x11 = (x8 * x10);
    let x12 = tanh(clamp(x11, -15.0f, 15.0f));
    let x13 = (x12 - y1);
    let x14 = (x13 + y1);
    let x16 = v16(i);
    let x17 = (x14 * x16);
    let x18 = tanh(clamp(x17, -15.0f, 15.0f));
    let x19 = (x18 - y1);
    let x20 = (x19 + y1);
    let x22 = v22(i);
    let x23 = (x20 * x22);
    let x24 = tanh(clamp(x23, -15.0f, 15.0f));
    let x25 = (x24 - y1);
    let x26 = (x25 + y1);
    let x28 = v28(i);
    let x29 = (x26 * x28);
    let x30 = tanh(clamp(x29, -15.0f, 15.0f));
    let x31 = (x30 - y1);
    return x31;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let stride = nwg.x * nwg.y * 256u;
    for (var t = (wid.y * nwg.x + wid.x) * 256u + lid; t < 1000u; t = t + stride) {
        if (t < 1000u) { b2[t] = f16(e31(t)); }
    }
}
