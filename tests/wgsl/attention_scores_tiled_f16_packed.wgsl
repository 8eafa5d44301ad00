// kernel transpose+matmul+full+broadcast+mul+reduce+broadcast+sub+exp+reduce+broadcast+div+matmul (2 workgroups)
@group(0) @binding(0) var<storage, read_write> b0: array<u32>;
@group(0) @binding(1) var<storage, read_write> b1: array<u32>;
@group(0) @binding(2) var<storage, read_write> b2: array<u32>;
@group(0) @binding(3) var<storage, read_write> b3: array<u32>;

fn v0(i: u32) -> f32 {
    return select(unpack2x16float(b0[i >> 1u]).x, unpack2x16float(b0[i >> 1u]).y, (i & 1u) == 1u);
}

fn v1(i: u32) -> f32 {
    return select(unpack2x16float(b1[i >> 1u]).x, unpack2x16float(b1[i >> 1u]).y, (i & 1u) == 1u);
}

fn v2(i: u32) -> f32 {
    return select(unpack2x16float(b2[i >> 1u]).x, unpack2x16float(b2[i >> 1u]).y, (i & 1u) == 1u);
}

// transpose : f16[2,8,16]
fn v3(i: u32) -> f32 {
    var cr = i;
    let c2 = cr % 16u;
    cr = cr / 16u;
    let c1 = cr % 8u;
    cr = cr / 8u;
    let c0 = cr;
    return v0(c0 * 128u + c2 * 8u + c1);
}

// matmul : f16[2,16,16]
fn v4(i: u32) -> f32 {
    var cr = i;
    let c2 = cr % 16u;
    cr = cr / 16u;
    let c1 = cr % 16u;
    cr = cr / 16u;
    let c0 = cr;
    var acc: f32 = 0.0f;
    for (var kk = 0u; kk < 8u; kk = kk + 1u) {
        acc = acc + fg_q[kk] * fg_kt[(c2 % 16u) * 8u + kk];
    }
    return fg_round_f16(acc);
}

// full : f16[]
fn v5(i: u32) -> f32 {
    return 0.35009766f;
}

// broadcast : f16[2,16,16]
fn v6(i: u32) -> f32 {
    var cr = i;
    let c2 = cr % 16u;
    cr = cr / 16u;
    let c1 = cr % 16u;
    cr = cr / 16u;
    let c0 = cr;
    return v5(0u);
}

// mul : f16[2,16,16]
fn v7(i: u32) -> f32 {
    return fg_round_f16((v4(i) * v6(i)));
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

var<private> fg_q: array<f32, 8>;
var<private> fg_x: array<f32, 16>;
var<workgroup> fg_kt: array<f32, 128>;
var<workgroup> fg_vt: array<f32, 128>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let wg = wid.y * nwg.x + wid.x;
    if (wg >= 2u) {
        return;
    }
    let qi = (wg % 1u) * 64u + lid;
    let r = (wg / 1u) * 16u + min(qi, 15u);
    var cr = r;
    let c1 = cr % 16u;
    cr = cr / 16u;
    let c0 = cr;
    for (var kk = 0u; kk < 8u; kk = kk + 1u) {
        fg_q[kk] = v1(c0 * 128u + c1 * 8u + kk);
    }
    var m: f32 = bitcast<f32>(0xff800000u);
    var l = 0.0f;
    var acc: array<f32, 8>;
    for (var j0 = 0u; j0 < 16u; j0 = j0 + 16u) {
        for (var t = lid; t < 128u; t = t + 64u) {
            let j = min(j0 + t / 8u, 15u);
            fg_kt[t] = f32(v3(c0 * 128u + t % 8u * 16u + j));
        }
        for (var t = lid; t < 128u; t = t + 64u) {
            let j = min(j0 + t / 8u, 15u);
            fg_vt[t] = f32(v2(c0 * 128u + j * 8u + t % 8u));
        }
        workgroupBarrier();
        var bm: f32 = bitcast<f32>(0xff800000u);
        for (var jj = 0u; jj < 16u; jj = jj + 1u) {
            let j = j0 + jj;
            let x = select(bitcast<f32>(0xff800000u), f32(v7(r * 16u + min(j, 15u))), j < 16u);
            fg_x[jj] = x;
            bm = max(bm, x);
        }
        let n = max(m, bm);
        if (n != bitcast<f32>(0xff800000u)) {
            let scale = exp(m - n);
            var ps = 0.0f;
            for (var jj = 0u; jj < 16u; jj = jj + 1u) {
                let p = exp(fg_x[jj] - n);
                fg_x[jj] = p;
                ps = ps + p;
            }
            l = l * scale + ps;
            for (var d = 0u; d < 8u; d = d + 1u) {
                var a = acc[d] * scale;
                for (var jj = 0u; jj < 16u; jj = jj + 1u) {
                    a = a + fg_x[jj] * fg_vt[jj * 8u + d];
                }
                acc[d] = a;
            }
            m = n;
        }
        workgroupBarrier();
    }
    if (qi < 16u) {
        for (var d = 0u; d < 8u; d = d + 2u) {
            b3[(r * 8u + d) >> 1u] = pack2x16float(vec2<f32>(acc[d] / l, acc[d + 1u] / l));
        }
    }
}
