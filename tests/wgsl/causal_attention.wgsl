// kernel iota+iota+ge+broadcast+transpose+matmul+full+broadcast+mul+full+broadcast+select+reduce+broadcast+sub+exp+reduce+broadcast+div+matmul (3 workgroups)
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

// iota : i32[70,70]
fn v3(i: u32) -> i32 {
    var cr = i;
    let c1 = cr % 70u;
    cr = cr / 70u;
    let c0 = cr;
    return i32(c0);
}

// iota : i32[70,70]
fn v4(i: u32) -> i32 {
    var cr = i;
    let c1 = cr % 70u;
    cr = cr / 70u;
    let c0 = cr;
    return i32(c1);
}

// ge : bool[70,70]
fn v5(i: u32) -> bool {
    return (v3(i) >= v4(i));
}

// broadcast : bool[2,70,70]
fn v6(i: u32) -> bool {
    var cr = i;
    let c2 = cr % 70u;
    cr = cr / 70u;
    let c1 = cr % 70u;
    cr = cr / 70u;
    let c0 = cr;
    return v5(c1 * 70u + c2);
}

// transpose : f32[2,8,70]
fn v7(i: u32) -> f32 {
    var cr = i;
    let c2 = cr % 70u;
    cr = cr / 70u;
    let c1 = cr % 8u;
    cr = cr / 8u;
    let c0 = cr;
    return v0(c0 * 560u + c2 * 8u + c1);
}

// matmul : f32[2,70,70]
fn v8(i: u32) -> f32 {
    var cr = i;
    let c2 = cr % 70u;
    cr = cr / 70u;
    let c1 = cr % 70u;
    cr = cr / 70u;
    let c0 = cr;
    var acc: f32 = 0.0f;
    for (var kk = 0u; kk < 8u; kk = kk + 1u) {
        acc = acc + fg_q[kk] * v7(c0 * 560u + kk * 70u + c2);
    }
    return acc;
}

// full : f32[]
fn v9(i: u32) -> f32 {
    return 0.35f;
}

// broadcast : f32[2,70,70]
fn v10(i: u32) -> f32 {
    var cr = i;
    let c2 = cr % 70u;
    cr = cr / 70u;
    let c1 = cr % 70u;
    cr = cr / 70u;
    let c0 = cr;
    return v9(0u);
}

// mul : f32[2,70,70]
fn v11(i: u32) -> f32 {
    return (v8(i) * v10(i));
}

// full : f32[]
fn v12(i: u32) -> f32 {
    return -1000000000.0f;
}

// broadcast : f32[2,70,70]
fn v13(i: u32) -> f32 {
    var cr = i;
    let c2 = cr % 70u;
    cr = cr / 70u;
    let c1 = cr % 70u;
    cr = cr / 70u;
    let c0 = cr;
    return v12(0u);
}

// select : f32[2,70,70]
fn v14(i: u32) -> f32 {
    return select(v13(i), v11(i), v6(i));
}

var<private> fg_q: array<f32, 8>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = (wid.y * nwg.x + wid.x) * 64u + lid;
    if (r >= 140u) {
        return;
    }
    var cr = r;
    let c1 = cr % 70u;
    cr = cr / 70u;
    let c0 = cr;
    for (var kk = 0u; kk < 8u; kk = kk + 1u) {
        fg_q[kk] = v1(c0 * 560u + c1 * 8u + kk);
    }
    var m: f32 = bitcast<f32>(0xff800000u);
    var l = 0.0f;
    var acc: array<f32, 8>;
    let fg_end = u32(clamp(i32(c1) + (1i), 0i, 70i));
    for (var j = 0u; j < 70u; j = j + 1u) {
        if (j == fg_end && m > -1000000000.0f && exp(-1000000000.0f - m) == 0.0f) {
            break;
        }
        let x = f32(v14(r * 70u + j));
        let n = max(m, x);
        if (n == bitcast<f32>(0xff800000u)) {
            continue;
        }
        let scale = exp(m - n);
        let p = exp(x - n);
        l = l * scale + p;
        for (var d = 0u; d < 8u; d = d + 1u) {
            acc[d] = acc[d] * scale + p * f32(v2(c0 * 560u + j * 8u + d));
        }
        m = n;
    }
    for (var d = 0u; d < 8u; d = d + 1u) {
        b3[r * 8u + d] = acc[d] / l;
    }
}
