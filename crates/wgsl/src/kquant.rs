//! The k-quant weights ([`DType::Q4K`], [`DType::Q5K`], [`DType::Q6K`]) and the word-aligned
//! blocks with a minimum ([`DType::Q4_1`], [`DType::Q5_1`]) read by whole words in the
//! matrix–vector kernel's loop ([`crate::matmul_gemv`]'s `packed_loop`): a chunk per step —
//! 64 values of a Q4_K/Q5_K block (a pair of sub-blocks sharing their bytes, the low nibbles
//! one sub-block and the high the other), 32 of a Q6_K block (one of its eight groups, whose
//! low nibbles, high pairs and two scales lie in runs of 32, 32 and 2 bytes), a whole Q4_1 or
//! Q5_1 block — converted four values to a `vec4<f32>`, in the f32 operations of the element
//! functions (`storage::block_load`), so both readings give the same values.

use crate::matmul::line;
use fusegraph_ir::DType;

/// Values of a k-quant weight's chunk ([`DType::Q4K`]: a pair of sub-blocks; [`DType::Q6K`]:
/// a group), `None` for another type.
pub(crate) fn chunk(dtype: DType) -> Option<usize> {
    match dtype {
        DType::Q4K | DType::Q5K => Some(64),
        DType::Q6K | DType::Q4_1 | DType::Q5_1 => Some(32),
        _ => None,
    }
}

/// The loads of chunk `blk` (an expression) of column `cl0` for step `u`: its place
/// (`kb{u}`, the chunk's first `k`) and, for each product `p` of binding slot `slots[p]`, the
/// words `x{p}_{u}_…` its values need. `k` is the product's depth.
pub(crate) fn load(s: &mut String, ind: usize, dtype: DType, slots: &[usize], k: usize, u: usize, blk: &str) {
    let w = line;
    let per_row = k / 256;
    let c = chunk(dtype).expect("a k-quant");
    w(s, ind, format!("let kb{u} = ({blk}) * {c}u;"));
    if let DType::Q4_1 | DType::Q5_1 = dtype {
        // Word-aligned blocks: the scale and minimum, Q5_1's fifth bits, 4 words of nibbles.
        let words = dtype.block().expect("a block type").1 / 4;
        w(s, ind, format!("let wb{u} = (cl0 * {}u + ({blk})) * {words}u;", k / 32));
        for (p, slot) in slots.iter().enumerate() {
            for j in 0..words {
                w(s, ind, format!("let x{p}_{u}_{j} = b{slot}[wb{u} + {j}u];"));
            }
        }
    } else if dtype != DType::Q6K {
        // Word-aligned super-blocks of 36 (Q4_K) or 44 (Q5_K) words: d and dmin, three words
        // of scales, Q5_K's 8 words of fifth bits (all 32 bytes serve each pair of
        // sub-blocks), 32 of nibbles (8 per pair).
        let (words, nibbles) = if dtype == DType::Q5K { (44, 12) } else { (36, 4) };
        w(s, ind, format!("let pr{u} = ({blk}) & 3u;"));
        w(s, ind, format!("let wb{u} = (cl0 * {per_row}u + ({blk}) / 4u) * {words}u;"));
        for (p, slot) in slots.iter().enumerate() {
            for j in 0..4 {
                w(s, ind, format!("let x{p}_{u}_{j} = b{slot}[wb{u} + {j}u];"));
            }
            for t in 0..8 {
                w(s, ind, format!("let x{p}_{u}_{} = b{slot}[wb{u} + {nibbles}u + pr{u} * 8u + {t}u];", 4 + t));
                if dtype == DType::Q5K {
                    w(s, ind, format!("let x{p}_{u}_f{t} = b{slot}[wb{u} + 4u + {t}u];"));
                }
            }
        }
    } else {
        // 210-byte super-blocks (at even offsets): group `rg` of half `hc` takes 32 bytes of
        // low nibbles, 32 of high pairs and 2 scale bytes; 9 words cover a 32-byte run at
        // either alignment.
        w(s, ind, format!("let hc{u} = (({blk}) >> 2u) & 1u;"));
        w(s, ind, format!("let rg{u} = ({blk}) & 3u;"));
        w(s, ind, format!("let base{u} = (cl0 * {per_row}u + ({blk}) / 8u) * 210u;"));
        w(s, ind, format!("let lo{u} = (base{u} + 64u * hc{u} + 32u * (rg{u} & 1u)) >> 2u;"));
        w(s, ind, format!("let hi{u} = (base{u} + 128u + 32u * hc{u}) >> 2u;"));
        w(s, ind, format!("let sa{u} = base{u} + 192u + 8u * hc{u} + 2u * rg{u};"));
        for (p, slot) in slots.iter().enumerate() {
            for t in 0..9 {
                w(s, ind, format!("let x{p}_{u}_l{t} = b{slot}[lo{u} + {t}u];"));
                w(s, ind, format!("let x{p}_{u}_h{t} = b{slot}[hi{u} + {t}u];"));
            }
            w(s, ind, format!("let x{p}_{u}_s = b{slot}[sa{u} >> 2u];"));
            w(s, ind, format!("let x{p}_{u}_d = b{slot}[(base{u} + 208u) >> 2u];"));
        }
    }
}

/// The chunk's values of product `p` at step `u` (after [`load`]): each quad's first place
/// in the chunk and its `vec4<f32>`, with the statements they need written into `s`.
pub(crate) fn quads(s: &mut String, ind: usize, dtype: DType, p: usize, u: usize) -> Vec<(usize, String)> {
    let w = line;
    let x = |name: String| format!("x{p}_{u}_{name}");
    let mut out = Vec::new();
    if let DType::Q4_1 | DType::Q5_1 = dtype {
        w(s, ind, format!("let dm{p}_{u} = unpack2x16float({});", x("0".into())));
        let first = if dtype == DType::Q5_1 { 2 } else { 1 };
        for t in 0..4 {
            let q = x(format!("{}", first + t));
            for (h, shifts) in [(0, "0u, 8u, 16u, 24u"), (16, "4u, 12u, 20u, 28u")] {
                let mut v = format!("(vec4<u32>({q}) >> vec4<u32>({shifts})) & vec4<u32>(15u)");
                if dtype == DType::Q5_1 {
                    let bits = (0..4).map(|c| format!("{}u", h + 4 * t + c)).collect::<Vec<_>>().join(", ");
                    let fifth = format!("(vec4<u32>({}) >> vec4<u32>({bits})) & vec4<u32>(1u)", x("1".into()));
                    v = format!("({v}) | (({fifth}) << vec4<u32>(4u))");
                }
                out.push((h + 4 * t, format!("vec4<f32>({v}) * dm{p}_{u}.x + dm{p}_{u}.y")));
            }
        }
    } else if dtype != DType::Q6K {
        w(s, ind, format!("let dm{p}_{u} = unpack2x16float({});", x("0".into())));
        // Scale byte `n` of the twelve lies in word `1 + n / 4`: byte `j mod 4` of the first
        // word, `j + 4` of the second or third, `j` of the first or second.
        let (x1, x2, x3) = (x("1".into()), x("2".into()), x("3".into()));
        // Sub-blocks `2·pr` (low nibbles) and `2·pr + 1` (high): 6-bit scale and min each.
        for h in 0..2 {
            let j = format!("j{p}_{u}_{h}");
            w(s, ind, format!("let {j} = 2u * pr{u} + {h}u;"));
            let byte = |word: String| format!("extractBits({word}, ({j} & 3u) * 8u, 8u)");
            w(s, ind, format!("let a{p}_{u}_{h} = {};", byte(x1.clone())));
            w(s, ind, format!("let c{p}_{u}_{h} = {};", byte(format!("select({x3}, {x2}, {j} < 4u)"))));
            w(s, ind, format!("let e{p}_{u}_{h} = {};", byte(format!("select({x2}, {x1}, {j} < 4u)"))));
            let (a, c, e) = (format!("a{p}_{u}_{h}"), format!("c{p}_{u}_{h}"), format!("e{p}_{u}_{h}"));
            let sc = format!("select(({c} & 15u) | (({a} >> 6u) << 4u), {a} & 63u, {j} < 4u)");
            let m = format!("select(({c} >> 4u) | (({e} >> 6u) << 4u), {c} & 63u, {j} < 4u)");
            w(s, ind, format!("let ks{p}_{u}_{h} = dm{p}_{u}.x * f32({sc});"));
            w(s, ind, format!("let km{p}_{u}_{h} = dm{p}_{u}.y * f32({m});"));
        }
        for t in 0..8 {
            let q = x(format!("{}", 4 + t));
            for (h, shifts) in [(0, "0u, 8u, 16u, 24u"), (1, "4u, 12u, 20u, 28u")] {
                let mut q = format!("(vec4<u32>({q}) >> vec4<u32>({shifts})) & vec4<u32>(15u)");
                if dtype == DType::Q5K {
                    // Bit `j` of each value's byte of the fifth bits.
                    let f = x(format!("f{t}"));
                    let fifth =
                        format!("(vec4<u32>({f}) >> (vec4<u32>(0u, 8u, 16u, 24u) + j{p}_{u}_{h})) & vec4<u32>(1u)");
                    q = format!("({q}) | (({fifth}) << vec4<u32>(4u))");
                }
                out.push((32 * h + 4 * t, format!("ks{p}_{u}_{h} * vec4<f32>({q}) - km{p}_{u}_{h}")));
            }
        }
    } else {
        w(s, ind, format!("let aligned{p}_{u} = (base{u} & 3u) == 0u;"));
        w(s, ind, format!("let d{p}_{u} = unpack2x16float({})[((base{u} + 208u) >> 1u) & 1u];", x("d".into())));
        let scale = |second: usize| {
            format!("extractBits(bitcast<i32>({}), (sa{u} & 3u) * 8u + {}u, 8u)", x("s".into()), 8 * second)
        };
        w(s, ind, format!("let ks{p}_{u}_0 = d{p}_{u} * f32({});", scale(0)));
        w(s, ind, format!("let ks{p}_{u}_1 = d{p}_{u} * f32({});", scale(1)));
        for t in 0..8 {
            // The run's word `t`, whole or from two words shifted by half a word.
            let word = |run: &str| {
                let (a, b) = (x(format!("{run}{t}")), x(format!("{run}{}", t + 1)));
                format!("select(({a} >> 16u) | ({b} << 16u), {a}, aligned{p}_{u})")
            };
            w(s, ind, format!("let ql{p}_{u}_{t} = {};", word("l")));
            w(s, ind, format!("let qh{p}_{u}_{t} = {};", word("h")));
            let low = format!(
                "(vec4<u32>(ql{p}_{u}_{t}) >> (vec4<u32>(0u, 8u, 16u, 24u) + (rg{u} >> 1u) * 4u)) & vec4<u32>(15u)"
            );
            let high =
                format!("(vec4<u32>(qh{p}_{u}_{t}) >> (vec4<u32>(0u, 8u, 16u, 24u) + 2u * rg{u})) & vec4<u32>(3u)");
            let q = format!("vec4<f32>(vec4<i32>(({low}) | (({high}) << vec4<u32>(4u))) - vec4<i32>(32))");
            out.push((4 * t, format!("ks{p}_{u}_{} * {q}", usize::from(t >= 4))));
        }
    }
    out
}
