// kernel iota+iota+ge+broadcast+transpose+matmul+full+broadcast+mul+full+broadcast+select+reduce+broadcast+sub+exp+reduce+broadcast+div+matmul (4 workgroups)
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
        acc = acc + fg_q[kk] * fg_kt[(c2 % 32u) * 8u + kk];
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
var<private> fg_x: array<f32, 32>;
var<workgroup> fg_kt: array<f32, 256>;
var<workgroup> fg_vt: array<f32, 256>;
var<workgroup> fg_more: atomic<u32>;
var<workgroup> fg_tail: u32;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let wg = wid.y * nwg.x + wid.x;
    if (wg >= 4u) {
        return;
    }
    let qi = (wg % 2u) * 64u + lid;
    let r = (wg / 2u) * 70u + min(qi, 69u);
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
    let fg_end = u32(clamp(i32(min((wg % 2u) * 64u + 63u, 69u)) + (1i), 0i, 70i));
    let fg_skip = (fg_end + 31u) / 32u * 32u;
    for (var j0 = 0u; j0 < 70u; j0 = j0 + 32u) {
        if (j0 == fg_skip) {
            if (!(m > -1000000000.0f && exp(-1000000000.0f - m) == 0.0f)) {
                atomicOr(&fg_more, 1u);
            }
            workgroupBarrier();
            if (lid == 0u) {
                fg_tail = atomicLoad(&fg_more);
            }
            if (workgroupUniformLoad(&fg_tail) == 0u) {
                break;
            }
        }
        for (var t = lid; t < 256u; t = t + 64u) {
            let j = min(j0 + t / 8u, 69u);
            fg_kt[t] = f32(v7(c0 * 560u + t % 8u * 70u + j));
        }
        for (var t = lid; t < 256u; t = t + 64u) {
            let j = min(j0 + t / 8u, 69u);
            fg_vt[t] = f32(v2(c0 * 560u + j * 8u + t % 8u));
        }
        workgroupBarrier();
        var bm: f32 = bitcast<f32>(0xff800000u);
        for (var jj = 0u; jj < 32u; jj = jj + 1u) {
            let j = j0 + jj;
            let x = select(bitcast<f32>(0xff800000u), f32(v14(r * 70u + min(j, 69u))), j < 70u);
            fg_x[jj] = x;
            bm = max(bm, x);
        }
        let n = max(m, bm);
        if (n != bitcast<f32>(0xff800000u)) {
            let scale = exp(m - n);
            var ps = 0.0f;
            for (var jj = 0u; jj < 32u; jj = jj + 1u) {
                let p = exp(fg_x[jj] - n);
                fg_x[jj] = p;
                ps = ps + p;
            }
            l = l * scale + ps;
            for (var d = 0u; d < 8u; d = d + 1u) {
                var a = acc[d] * scale;
                for (var jj = 0u; jj < 32u; jj = jj + 1u) {
                    a = a + fg_x[jj] * fg_vt[jj * 8u + d];
                }
                acc[d] = a;
            }
            m = n;
        }
        workgroupBarrier();
    }
    if (qi < 70u) {
        for (var d = 0u; d < 8u; d = d + 1u) {
            b3[r * 8u + d] = acc[d] / l;
        }
    }
}
