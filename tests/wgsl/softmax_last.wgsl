// kernel reduce+broadcast+sub+exp+reduce+broadcast+div (13 workgroups)
@group(0) @binding(0) var<storage, read_write> b0: array<f32>;
@group(0) @binding(1) var<storage, read_write> b1: array<f32>;

fn v0(i: u32) -> f32 {
    return b0[i];
}

// reduce : f32[13,1]
fn v1(i: u32) -> f32 {
    return fg_red0[0];
}

// broadcast : f32[13,100]
fn v2(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 100u;
    cr = cr / 100u;
    let c0 = cr;
    return v1(c0);
}

// sub : f32[13,100]
fn v3(i: u32) -> f32 {
    return (v0(i) - v2(i));
}

// exp : f32[13,100]
fn v4(i: u32) -> f32 {
    return exp(v3(i));
}

// reduce : f32[13,1]
fn v5(i: u32) -> f32 {
    return fg_red1[0];
}

// broadcast : f32[13,100]
fn v6(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 100u;
    cr = cr / 100u;
    let c0 = cr;
    return v5(c0);
}

// div : f32[13,100]
fn v7(i: u32) -> f32 {
    return (v4(i) / v6(i));
}

fn e7(i: u32) -> f32 {
    let x2 = v2(i);
    let y0 = v0(i);
    let x3 = (y0 - x2);
    let x4 = exp(x3);
    let x6 = v6(i);
    let x7 = (x4 / x6);
    return x7;
}

fn fg_elem(row: u32, e: u32) -> u32 {
    var rr = row;
    let r0 = rr;
    var qr = e;
    let q0 = qr;
    return r0 * 100u + q0;
}

var<workgroup> fg_red0: array<f32, 128>;
var<workgroup> fg_red1: array<f32, 128>;
@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= 13u) { return; }
    {
        var m0: f32 = bitcast<f32>(0xff800000u);
        var s0: f32 = 0.0f;
        var e = lid;
        for (; e < 100u; e = e + 128u) {
            let x0 = v0(fg_elem(row, e));
            let n0 = max(m0, x0);
            s0 = select(s0 * exp(m0 - n0) + exp(x0 - n0), s0, x0 == bitcast<f32>(0xff800000u));
            m0 = n0;
        }
        let m = m0;
        let s = s0;
        {
            let acc = m;
            fg_red0[lid] = acc;
            workgroupBarrier();
            for (var w = 64u; w > 0u; w = w >> 1u) {
                if (lid < w) { fg_red0[lid] = max(fg_red0[lid], fg_red0[lid + w]); }
                workgroupBarrier();
            }
        }
        let row_max = fg_red0[0];
        {
            let acc = select(s * exp(m - row_max), s, m == bitcast<f32>(0xff800000u));
            fg_red1[lid] = acc;
            workgroupBarrier();
            for (var w = 64u; w > 0u; w = w >> 1u) {
                if (lid < w) { fg_red1[lid] = fg_red1[lid] + fg_red1[lid + w]; }
                workgroupBarrier();
            }
        }
    }
    for (var e = lid; e < 100u; e = e + 128u) {
        let idx = fg_elem(row, e);
        b1[idx] = e7(idx);
    }
}
