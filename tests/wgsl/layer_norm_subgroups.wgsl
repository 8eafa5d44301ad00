// kernel reduce+full+broadcast+mul+broadcast+sub+mul+reduce+full+broadcast+mul+full+broadcast+add+rsqrt+broadcast+mul+broadcast+mul+broadcast+add (8 workgroups)
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

// reduce : f32[8,1]
fn v3(i: u32) -> f32 {
    return fg_red0[0];
}

// full : f32[]
fn v4(i: u32) -> f32 {
    return 0.010416667f;
}

// broadcast : f32[8,1]
fn v5(i: u32) -> f32 {
    var cr = i;
    let c0 = cr;
    return v4(0u);
}

// mul : f32[8,1]
fn v6(i: u32) -> f32 {
    return fg_rs0;
}

var<private> fg_rs0: f32;
fn c6(i: u32) -> f32 {
    return (v3(i) * v5(i));
}

// broadcast : f32[8,96]
fn v7(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 96u;
    cr = cr / 96u;
    let c0 = cr;
    return v6(c0);
}

// sub : f32[8,96]
fn v8(i: u32) -> f32 {
    return (v0(i) - v7(i));
}

// mul : f32[8,96]
fn v9(i: u32) -> f32 {
    return (v8(i) * v8(i));
}

// reduce : f32[8,1]
fn v10(i: u32) -> f32 {
    return fg_red1[0];
}

// full : f32[]
fn v11(i: u32) -> f32 {
    return 0.010416667f;
}

// broadcast : f32[8,1]
fn v12(i: u32) -> f32 {
    var cr = i;
    let c0 = cr;
    return v11(0u);
}

// mul : f32[8,1]
fn v13(i: u32) -> f32 {
    return fg_rs1;
}

var<private> fg_rs1: f32;
fn c13(i: u32) -> f32 {
    return (v10(i) * v12(i));
}

// full : f32[]
fn v14(i: u32) -> f32 {
    return 1e-5f;
}

// broadcast : f32[8,1]
fn v15(i: u32) -> f32 {
    var cr = i;
    let c0 = cr;
    return v14(0u);
}

// add : f32[8,1]
fn v16(i: u32) -> f32 {
    return fg_rs2;
}

var<private> fg_rs2: f32;
fn c16(i: u32) -> f32 {
    return (v13(i) + v15(i));
}

// rsqrt : f32[8,1]
fn v17(i: u32) -> f32 {
    return fg_rs3;
}

var<private> fg_rs3: f32;
fn c17(i: u32) -> f32 {
    return inverseSqrt(v16(i));
}

// broadcast : f32[8,96]
fn v18(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 96u;
    cr = cr / 96u;
    let c0 = cr;
    return v17(c0);
}

// mul : f32[8,96]
fn v19(i: u32) -> f32 {
    return (v8(i) * v18(i));
}

// broadcast : f32[8,96]
fn v20(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 96u;
    cr = cr / 96u;
    let c0 = cr;
    return v1(c1);
}

// mul : f32[8,96]
fn v21(i: u32) -> f32 {
    return (v19(i) * v20(i));
}

// broadcast : f32[8,96]
fn v22(i: u32) -> f32 {
    var cr = i;
    let c1 = cr % 96u;
    cr = cr / 96u;
    let c0 = cr;
    return v2(c1);
}

// add : f32[8,96]
fn v23(i: u32) -> f32 {
    return (v21(i) + v22(i));
}

fn e23(i: u32) -> f32 {
    let x7 = v7(i);
    let y0 = v0(i);
    let x8 = (y0 - x7);
    let x18 = v18(i);
    let x19 = (x8 * x18);
    let x20 = v20(i);
    let x21 = (x19 * x20);
    let x22 = v22(i);
    let x23 = (x21 + x22);
    return x23;
}

fn fg_elem(row: u32, e: u32) -> u32 {
    var rr = row;
    let r0 = rr;
    var qr = e;
    let q0 = qr;
    return r0 * 96u + q0;
}

var<workgroup> fg_red0: array<f32, 128>;
var<workgroup> fg_red1: array<f32, 128>;
@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg_id: u32, @builtin(num_subgroups) sg_count: u32, @builtin(subgroup_invocation_id) sg_lane: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= 8u) { return; }
    {
        var n0 = 0.0f;
        var m0 = 0.0f;
        var q0 = 0.0f;
        var e = lid;
        for (; e < 96u; e = e + 128u) {
            let x0 = v0(fg_elem(row, e));
            n0 = n0 + 1.0f;
            let d0 = x0 - m0;
            m0 = m0 + d0 / n0;
            q0 = q0 + d0 * (x0 - m0);
        }
        var n = n0;
        var mean = m0;
        var ssd = q0;
        {
            let acc = n * mean;
            let part = subgroupAdd(acc);
            if (sg_lane == 0u) { fg_red0[sg_id] = part; }
            workgroupBarrier();
            if (lid == 0u) {
                var total = fg_red0[0];
                for (var j = 1u; j < sg_count; j = j + 1u) {
                    total = total + fg_red0[j];
                }
                fg_red0[0] = total;
            }
            workgroupBarrier();
        }
        fg_rs0 = c6(row);
        let t = v7(fg_elem(row, 0u));
        {
            let acc = ssd + n * (mean - t) * (mean - t);
            let part = subgroupAdd(acc);
            if (sg_lane == 0u) { fg_red1[sg_id] = part; }
            workgroupBarrier();
            if (lid == 0u) {
                var total = fg_red1[0];
                for (var j = 1u; j < sg_count; j = j + 1u) {
                    total = total + fg_red1[j];
                }
                fg_red1[0] = total;
            }
            workgroupBarrier();
        }
    }
    fg_rs1 = c13(row);
    fg_rs2 = c16(row);
    fg_rs3 = c17(row);
    for (var e = lid; e < 96u; e = e + 128u) {
        let idx = fg_elem(row, e);
        b3[idx] = e23(idx);
    }
}
