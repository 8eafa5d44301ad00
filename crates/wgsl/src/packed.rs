//! Packed weights — [`DType`]'s block types, and bf16 two values to a word — and the two
//! ways kernels read them, in the f32 operations of `fusegraph_ir::quant::dequantize`, so
//! that both give the same values:
//!
//! - an element at a time, by the binding's element function ([`block_load`]);
//! - a chunk at a time by whole words, in the matrix–vector kernel's loop (`matmul_gemv`'s
//!   `packed_loop`): [`chunk`] values a step, whose words [`load`] issues and [`quads`]
//!   converts to `vec4<f32>`s, four values each.
//!
//! The chunks: 8 bf16 values; a whole block of 32 (Q8_0, Q4_0, Q5_0 and IQ4_NL at even byte
//! offsets, so that their values' words are the block's words shifted by half a word or
//! not; Q4_1 and Q5_1 word-aligned); a quarter of a Q4_K, Q5_K, IQ4_XS, Q2_K or Q3_K
//! super-block (64 values: a pair of sub-blocks sharing their bytes, the low nibbles one and
//! the high the other; a pair of blocks of 32; two shifts of a half's 32 bytes of 2-bit
//! pairs, whose four scales are one word; Q3_K's likewise, with its runs of mask bits and
//! scale bytes at either alignment); 32 values of a Q6_K super-block (one of its eight
//! groups, whose low nibbles, high pairs and two scales lie in runs of 32, 32 and 2 bytes).
//! IQ4_NL's and IQ4_XS's levels come from `fg_iq4nl4` (shaders/helpers.wgsl). A new block
//! type is an arm in each of the four functions; a type [`chunk`] does not name is read
//! through its element function.

use crate::matmul::line;
use fusegraph_ir::DType;

/// The statements of an element function that return element `i` of a binding `b` of a
/// block type (see [`DType`]) as the f32 its block gives, in the order of
/// `fusegraph_ir::quant::dequantize`'s f32 operations. `q8_0`, `q4_0`: the block's f16 scale
/// (at an even byte offset, so within one word) times the element's signed byte, or its
/// nibble less 8 (elements 0–15 of a block are the low nibbles of its 16 bytes, 16–31 the
/// high ones); `q5_0`: its nibble and its bit of the word after the scale (at an odd
/// half-word), less 16; `q4_1`, `q5_1` (word-aligned): the nibble (and bit) times the scale,
/// plus the minimum. `q4_k` (word-aligned super-blocks): sub-block `j`'s 6-bit scale and min from
/// the twelve scale bytes, the nibble from the low or high half of byte `32·(j / 2) + l`;
/// `q5_k` likewise, with bit `j` of byte `l` of the 32 before the nibbles as the fifth.
/// `q6_k`: the low nibble and the high pair of the element's 6 bits, less 32, times its
/// sub-block's signed scale and the f16 scale.
pub(crate) fn block_load(dtype: DType, b: &str) -> String {
    let byte = |at: &str| format!("extractBits({b}[({at}) >> 2u], (({at}) & 3u) * 8u, 8u)");
    let lines: Vec<String> = match dtype {
        DType::Q4K | DType::Q5K => vec![
            format!("let wb = (i >> 8u) * {}u;", dtype.block().expect("a block type").1 / 4),
            format!("let dm = unpack2x16float({b}[wb]);"),
            "let j = (i >> 5u) & 7u;".into(),
            format!("let a = {};", byte("wb * 4u + 4u + (j & 3u)")),
            format!("let c = {};", byte("wb * 4u + 8u + j")),
            format!("let bj = {};", byte("wb * 4u + 4u + j")),
            "let sc = select((c & 15u) | ((a >> 6u) << 4u), a & 63u, j < 4u);".into(),
            "let m = select((c >> 4u) | ((bj >> 6u) << 4u), c & 63u, j < 4u);".into(),
            "let at = 32u * (j >> 1u) + (i & 31u);".into(),
            format!(
                "let n = extractBits({b}[wb + {}u + (at >> 2u)], (at & 3u) * 8u + (j & 1u) * 4u, 4u);",
                if dtype == DType::Q5K { 12 } else { 4 }
            ),
            match dtype {
                DType::Q5K => {
                    format!("let q = n | (extractBits({b}[wb + 4u + ((i & 31u) >> 2u)], (i & 3u) * 8u + j, 1u) << 4u);")
                }
                _ => "let q = n;".into(),
            },
            "return dm.x * f32(sc) * f32(q) - dm.y * f32(m);".into(),
        ],
        DType::Q4_1 | DType::Q5_1 => {
            // Word-aligned blocks: the scale and minimum, Q5_1's fifth bits, the nibbles.
            let (words, nibbles) = if dtype == DType::Q5_1 { (6, 2) } else { (5, 1) };
            vec![
                format!("let wb = (i >> 5u) * {words}u;"),
                format!("let dm = unpack2x16float({b}[wb]);"),
                "let j = i & 31u;".into(),
                format!("let n = extractBits({b}[wb + {nibbles}u + ((j & 15u) >> 2u)], (j & 3u) * 8u + (j >> 4u) * 4u, 4u);"),
                match dtype {
                    DType::Q5_1 => format!("let q = n | (extractBits({b}[wb + 1u], j, 1u) << 4u);"),
                    _ => "let q = n;".into(),
                },
                "return f32(q) * dm.x + dm.y;".into(),
            ]
        }
        DType::Q6K => vec![
            "let base = (i >> 8u) * 210u;".into(),
            "let e = i & 255u;".into(),
            "let r = (e >> 5u) & 3u;".into(),
            "let lo = base + 64u * (e >> 7u) + 32u * (r & 1u) + (e & 31u);".into(),
            format!("let low = extractBits({b}[lo >> 2u], (lo & 3u) * 8u + (r >> 1u) * 4u, 4u);"),
            "let hi = base + 128u + 32u * (e >> 7u) + (e & 31u);".into(),
            format!("let high = extractBits({b}[hi >> 2u], (hi & 3u) * 8u + 2u * r, 2u);"),
            "let sa = base + 192u + (e >> 4u);".into(),
            format!("let sc = extractBits(bitcast<i32>({b}[sa >> 2u]), (sa & 3u) * 8u, 8u);"),
            format!("let d = unpack2x16float({b}[(base + 208u) >> 2u])[((base + 208u) >> 1u) & 1u];"),
            "return d * f32(sc) * f32(i32(low | (high << 4u)) - 32);".into(),
        ],
        DType::Q2K => vec![
            // Word-aligned super-blocks of 21 words: 16 scale bytes, 64 bytes of pairs, d and dmin.
            "let wb = (i >> 8u) * 21u;".into(),
            "let e = i & 255u;".into(),
            format!("let sc = extractBits({b}[wb + (e >> 6u)], ((e >> 4u) & 3u) * 8u, 8u);"),
            "let at = 16u + 32u * (e >> 7u) + (e & 31u);".into(),
            format!("let q = extractBits({b}[wb + (at >> 2u)], (at & 3u) * 8u + 2u * ((e >> 5u) & 3u), 2u);"),
            format!("let dm = unpack2x16float({b}[wb + 20u]);"),
            "return dm.x * f32(sc & 15u) * f32(q) - dm.y * f32(sc >> 4u);".into(),
        ],
        DType::Q3K => vec![
            // 110-byte super-blocks (at even offsets): 32 bytes of high-bit masks, 64 of low
            // pairs, 12 of scales (sub-block `s`: nibble `s / 8` of byte `s mod 8`, pair `s / 4`
            // of byte `8 + s mod 4`), the f16 scale.
            "let base = (i >> 8u) * 110u;".into(),
            "let e = i & 255u;".into(),
            "let sb = e >> 4u;".into(),
            "let la = base + 96u + (sb & 7u);".into(),
            format!("let ls = extractBits({b}[la >> 2u], (la & 3u) * 8u + 4u * (sb >> 3u), 4u);"),
            "let ha = base + 104u + (sb & 3u);".into(),
            format!("let hs = extractBits({b}[ha >> 2u], (ha & 3u) * 8u + 2u * (sb >> 2u), 2u);"),
            "let sc = i32(ls | (hs << 4u)) - 32;".into(),
            "let at = base + 32u + 32u * (e >> 7u) + (e & 31u);".into(),
            format!("let q = extractBits({b}[at >> 2u], (at & 3u) * 8u + 2u * ((e >> 5u) & 3u), 2u);"),
            "let hm = base + (e & 31u);".into(),
            format!("let h = extractBits({b}[hm >> 2u], (hm & 3u) * 8u + (e >> 5u), 1u);"),
            format!("let d = unpack2x16float({b}[(base + 108u) >> 2u])[((base + 108u) >> 1u) & 1u];"),
            "return d * f32(sc) * f32(i32(q | (h << 2u)) - 4);".into(),
        ],
        DType::IQ4XS => vec![
            // Word-aligned super-blocks of 34 words: d and the scales' high pairs, their low
            // nibbles, eight blocks of 32 nibbles.
            "let wb = (i >> 8u) * 34u;".into(),
            "let e = i & 255u;".into(),
            "let j = e >> 5u;".into(),
            format!("let w0 = {b}[wb];"),
            format!(
                "let sc = i32(extractBits({b}[wb + 1u], 4u * j, 4u) | (extractBits(w0, 16u + 2u * j, 2u) << 4u)) - 32;"
            ),
            "let l = e & 31u;".into(),
            "let at = 8u + 16u * j + (l & 15u);".into(),
            format!("let n = extractBits({b}[wb + (at >> 2u)], (at & 3u) * 8u + (l >> 4u) * 4u, 4u);"),
            "return unpack2x16float(w0).x * f32(sc) * fg_iq4nl(n);".into(),
        ],
        DType::MXFP4 => vec![
            // 17-byte blocks: the scale byte, 32 nibbles as Q4_0's.
            "let base = (i >> 5u) * 17u;".into(),
            format!("let e = {};", byte("base")),
            "let j = i & 31u;".into(),
            "let at = base + 1u + (j & 15u);".into(),
            format!(
                "return fg_e8m0_half(e) * fg_mxfp4(extractBits({b}[at >> 2u], (at & 3u) * 8u + (j >> 4u) * 4u, 4u));"
            ),
        ],
        _ => {
            let (_, bytes) = dtype.block().expect("a block type");
            let mut head = vec![
                format!("let base = (i >> 5u) * {bytes}u;"),
                format!("let d = unpack2x16float({b}[base >> 2u])[(base >> 1u) & 1u];"),
            ];
            head.extend(match dtype {
                DType::Q8_0 => vec![
                    "let at = base + 2u + (i & 31u);".to_string(),
                    format!("return f32(extractBits(bitcast<i32>({b}[at >> 2u]), (at & 3u) * 8u, 8u)) * d;"),
                ],
                DType::Q5_0 => vec![
                    "let j = i & 31u;".to_string(),
                    format!("let w0 = {b}[base >> 2u];"),
                    format!("let w1 = {b}[(base >> 2u) + 1u];"),
                    "let high = select(w1, (w0 >> 16u) | (w1 << 16u), (base & 3u) == 0u);".to_string(),
                    "let at = base + 6u + (j & 15u);".to_string(),
                    format!("let n = extractBits({b}[at >> 2u], (at & 3u) * 8u + (j >> 4u) * 4u, 4u);"),
                    "return f32(i32(n | (extractBits(high, j, 1u) << 4u)) - 16) * d;".to_string(),
                ],
                DType::IQ4NL => vec![
                    "let j = i & 31u;".to_string(),
                    "let at = base + 2u + (j & 15u);".to_string(),
                    format!("return fg_iq4nl(extractBits({b}[at >> 2u], (at & 3u) * 8u + (j >> 4u) * 4u, 4u)) * d;"),
                ],
                _ => vec![
                    "let j = i & 31u;".to_string(),
                    "let at = base + 2u + (j & 15u);".to_string(),
                    format!("return (f32(extractBits({b}[at >> 2u], (at & 3u) * 8u + (j >> 4u) * 4u, 4u)) - 8.0) * d;"),
                ],
            });
            head
        }
    };
    lines.join("\n    ")
}

/// Values of a chunk of a packed `dtype` read a step at a time by whole words; `None` where
/// the kernel reads it through its element function.
pub(crate) fn chunk(dtype: DType) -> Option<usize> {
    match dtype {
        DType::BF16 => Some(8),
        DType::Q8_0 | DType::Q4_0 | DType::Q5_0 | DType::IQ4NL | DType::Q4_1 | DType::Q5_1 | DType::Q6K => Some(32),
        DType::Q4K | DType::Q5K | DType::Q2K | DType::Q3K | DType::IQ4XS => Some(64),
        _ => None,
    }
}

/// The four nibbles, low or `high`, of the four bytes of word `q`, as a `vec4<u32>`.
fn nibbles(q: &str, high: bool) -> String {
    let shifts = if high { "4u, 12u, 20u, 28u" } else { "0u, 8u, 16u, 24u" };
    format!("(vec4<u32>({q}) >> vec4<u32>({shifts})) & vec4<u32>(15u)")
}

/// The bits of word `q` at `shifts` (a `vec4<u32>` expression) as four values' fifth bits
/// (each `16` or `0`).
fn fifth_bits(q: &str, shifts: &str) -> String {
    format!("(((vec4<u32>({q}) >> {shifts}) & vec4<u32>(1u)) << vec4<u32>(4u))")
}

/// The field of each of word `q`'s four bytes at bit `shift` of the byte (a `u32`
/// expression), `mask` wide, as a `vec4<u32>`.
fn byte_fields(q: &str, shift: &str, mask: u32) -> String {
    format!("(vec4<u32>({q}) >> (vec4<u32>(0u, 8u, 16u, 24u) + {shift})) & vec4<u32>({mask}u)")
}

/// Word `t` of a run of bytes read as words `a`, `b` (its word and the next) from the run's
/// word-aligned start: `a` where the run starts `aligned`, else the half words across both.
fn run_word(a: &str, b: &str, aligned: &str) -> String {
    format!("select(({a} >> 16u) | ({b} << 16u), {a}, {aligned})")
}

/// `vec4<u32>(first, first + 1, first + 2, first + 3)`.
fn four_from(first: usize) -> String {
    format!("vec4<u32>({}u, {}u, {}u, {}u)", first, first + 1, first + 2, first + 3)
}

/// The loads of chunk `blk` (an expression) of column `cl0` for step `u`: its place
/// (`kb{u}`, the chunk's first `k`) and, for each product `p` of binding slot `slots[p]`, the
/// words `x{p}_{u}_…` its values need. `k` is the product's depth.
pub(crate) fn load(s: &mut String, ind: usize, dtype: DType, slots: &[usize], k: usize, u: usize, blk: &str) {
    let w = line;
    let c = chunk(dtype).expect("a packed type");
    w(s, ind, format!("let kb{u} = ({blk}) * {c}u;"));
    let fetch = |s: &mut String, at: &str, names: &[(String, usize)]| {
        for (p, slot) in slots.iter().enumerate() {
            for (name, j) in names {
                w(s, ind, format!("let x{p}_{u}_{name} = b{slot}[{at} + {j}u];"));
            }
        }
    };
    let run = |first: usize, count: usize| -> Vec<(String, usize)> {
        (0..count).map(|j| (format!("{}", first + j), j)).collect()
    };
    match dtype {
        DType::BF16 => {
            w(s, ind, format!("let wb{u} = (cl0 * {k}u + kb{u}) >> 1u;"));
            fetch(s, &format!("wb{u}"), &run(0, c / 2));
        }
        DType::Q8_0 | DType::Q4_0 | DType::Q5_0 | DType::IQ4NL => {
            // The scale's word and the values' (Q5_0: the fifth bits first) one word past them.
            let bytes = dtype.block().expect("a block type").1;
            w(s, ind, format!("let base{u} = (cl0 * {}u + {blk}) * {bytes}u;", k / 32));
            w(s, ind, format!("let wb{u} = base{u} >> 2u;"));
            fetch(s, &format!("wb{u}"), &run(0, (bytes - 2) / 4 + 1));
            w(s, ind, format!("let aligned{u} = (base{u} & 3u) == 0u;"));
        }
        DType::Q4_1 | DType::Q5_1 => {
            // The scale and minimum, Q5_1's fifth bits, 4 words of nibbles.
            let words = dtype.block().expect("a block type").1 / 4;
            w(s, ind, format!("let wb{u} = (cl0 * {}u + ({blk})) * {words}u;", k / 32));
            fetch(s, &format!("wb{u}"), &run(0, words));
        }
        DType::Q4K | DType::Q5K => {
            // Super-blocks of 36 (Q4_K) or 44 (Q5_K) words: d and dmin, three words of scales,
            // Q5_K's 8 words of fifth bits (all 32 bytes serve each pair of sub-blocks), 32 of
            // nibbles (8 per pair).
            let (words, nibbles) = if dtype == DType::Q5K { (44, 12) } else { (36, 4) };
            w(s, ind, format!("let pr{u} = ({blk}) & 3u;"));
            w(s, ind, format!("let wb{u} = (cl0 * {}u + ({blk}) / 4u) * {words}u;", k / 256));
            fetch(s, &format!("wb{u}"), &run(0, 4));
            fetch(s, &format!("wb{u} + {nibbles}u + pr{u} * 8u"), &run(4, 8));
            if dtype == DType::Q5K {
                fetch(s, &format!("wb{u} + 4u"), &(0..8).map(|t| (format!("f{t}"), t)).collect::<Vec<_>>());
            }
        }
        DType::IQ4XS => {
            // Super-blocks of 34 words: d and the scales' high pairs, their low nibbles, 32
            // words of nibbles (4 per block of 32, 8 per pair).
            w(s, ind, format!("let pr{u} = ({blk}) & 3u;"));
            w(s, ind, format!("let wb{u} = (cl0 * {}u + ({blk}) / 4u) * 34u;", k / 256));
            fetch(s, &format!("wb{u}"), &run(0, 2));
            fetch(s, &format!("wb{u} + 2u + pr{u} * 8u"), &run(2, 8));
        }
        DType::Q2K => {
            // Super-blocks of 21 words: 4 of scales (one per chunk), 16 of pairs (8 per half:
            // both chunks of a half read them, at their own shifts), d and dmin.
            w(s, ind, format!("let pr{u} = ({blk}) & 3u;"));
            w(s, ind, format!("let wb{u} = (cl0 * {}u + ({blk}) / 4u) * 21u;", k / 256));
            fetch(s, &format!("wb{u} + 4u + (pr{u} >> 1u) * 8u"), &run(0, 8));
            fetch(s, &format!("wb{u} + pr{u}"), &[("s".to_string(), 0)]);
            fetch(s, &format!("wb{u} + 20u"), &[("d".to_string(), 0)]);
        }
        DType::Q3K => {
            // 110-byte super-blocks (at even offsets): the chunk's 32-byte runs of low pairs
            // (its half's) and of high-bit masks (all of them), 4-byte runs of its scales'
            // low nibbles and high pairs, the f16 scale (in the word after the high pairs'
            // first); 9 and 2 words cover such runs at either alignment.
            w(s, ind, format!("let pr{u} = ({blk}) & 3u;"));
            w(s, ind, format!("let base{u} = (cl0 * {}u + ({blk}) / 4u) * 110u;", k / 256));
            w(s, ind, format!("let qa{u} = (base{u} + 32u + 32u * (pr{u} >> 1u)) >> 2u;"));
            w(s, ind, format!("let la{u} = (base{u} + 96u + 4u * (pr{u} & 1u)) >> 2u;"));
            let named = |c: &str, n: usize| (0..n).map(|t| (format!("{c}{t}"), t)).collect::<Vec<_>>();
            fetch(s, &format!("qa{u}"), &named("q", 9));
            fetch(s, &format!("(base{u} >> 2u)"), &named("m", 9));
            fetch(s, &format!("la{u}"), &named("l", 2));
            fetch(s, &format!("((base{u} + 104u) >> 2u)"), &named("h", 2));
        }
        DType::Q6K => {
            // 210-byte super-blocks (at even offsets): group `rg` of half `hc` takes 32 bytes
            // of low nibbles, 32 of high pairs and 2 scale bytes; 9 words cover a 32-byte run
            // at either alignment.
            w(s, ind, format!("let hc{u} = (({blk}) >> 2u) & 1u;"));
            w(s, ind, format!("let rg{u} = ({blk}) & 3u;"));
            w(s, ind, format!("let base{u} = (cl0 * {}u + ({blk}) / 8u) * 210u;", k / 256));
            w(s, ind, format!("let lo{u} = (base{u} + 64u * hc{u} + 32u * (rg{u} & 1u)) >> 2u;"));
            w(s, ind, format!("let hi{u} = (base{u} + 128u + 32u * hc{u}) >> 2u;"));
            w(s, ind, format!("let sa{u} = base{u} + 192u + 8u * hc{u} + 2u * rg{u};"));
            fetch(s, &format!("lo{u}"), &(0..9).map(|t| (format!("l{t}"), t)).collect::<Vec<_>>());
            fetch(s, &format!("hi{u}"), &(0..9).map(|t| (format!("h{t}"), t)).collect::<Vec<_>>());
            fetch(s, &format!("(sa{u} >> 2u)"), &[("s".to_string(), 0)]);
            fetch(s, &format!("((base{u} + 208u) >> 2u)"), &[("d".to_string(), 0)]);
        }
        _ => unreachable!("{dtype:?} is not read by words"),
    }
}

/// The chunk's values of product `p` at step `u` (after [`load`]): each quad's first place
/// in the chunk and its `vec4<f32>`, with the statements they need written into `s`.
pub(crate) fn quads(s: &mut String, ind: usize, dtype: DType, p: usize, u: usize) -> Vec<(usize, String)> {
    let w = line;
    let x = |name: &str| format!("x{p}_{u}_{name}");
    let mut out = Vec::new();
    match dtype {
        // Two to a word, each the top half of its f32.
        DType::BF16 => {
            for e in (0..8).step_by(4) {
                let (a, b) = (x(&format!("{}", e / 2)), x(&format!("{}", e / 2 + 1)));
                let halves = format!("{a} << 16u, {a} & 0xffff0000u, {b} << 16u, {b} & 0xffff0000u");
                out.push((e, format!("bitcast<vec4<f32>>(vec4<u32>({halves}))")));
            }
        }
        DType::Q8_0 | DType::Q4_0 | DType::Q5_0 | DType::IQ4NL => {
            let value_words = (dtype.block().expect("a block type").1 - 2) / 4;
            w(s, ind, format!("let d{p}_{u} = unpack2x16float({})[(base{u} >> 1u) & 1u];", x("0")));
            for t in 0..value_words {
                let (a, b) = (x(&format!("{t}")), x(&format!("{}", t + 1)));
                let q = format!("q{p}_{u}_{t}");
                w(s, ind, format!("let {q} = select({b}, ({a} >> 16u) | ({b} << 16u), aligned{u});"));
                match dtype {
                    DType::Q8_0 => {
                        let bytes =
                            format!("(vec4<i32>(bitcast<i32>({q})) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u)");
                        out.push((4 * t, format!("vec4<f32>({bytes}) * d{p}_{u}")));
                    }
                    DType::Q4_0 => {
                        for half in [0, 16] {
                            let v = nibbles(&q, half == 16);
                            out.push((half + 4 * t, format!("(vec4<f32>({v}) - 8.0) * d{p}_{u}")));
                        }
                    }
                    DType::IQ4NL => {
                        for half in [0, 16] {
                            let v = format!("fg_iq4nl4({}) * d{p}_{u}", nibbles(&q, half == 16));
                            out.push((half + 4 * t, v));
                        }
                    }
                    // Q5_0: the first word after the scale holds each value's fifth bit.
                    _ if t > 0 => {
                        let e = 4 * (t - 1);
                        for half in [0, 16] {
                            let high = fifth_bits(&format!("q{p}_{u}_0"), &four_from(half + e));
                            let v = format!("({}) | {high}", nibbles(&q, half == 16));
                            out.push((half + e, format!("(vec4<f32>({v}) - 16.0) * d{p}_{u}")));
                        }
                    }
                    _ => {}
                }
            }
        }
        DType::Q4_1 | DType::Q5_1 => {
            w(s, ind, format!("let dm{p}_{u} = unpack2x16float({});", x("0")));
            let first = if dtype == DType::Q5_1 { 2 } else { 1 };
            for t in 0..4 {
                let q = x(&format!("{}", first + t));
                for half in [0, 16] {
                    let mut v = nibbles(&q, half == 16);
                    if dtype == DType::Q5_1 {
                        v = format!("({v}) | {}", fifth_bits(&x("1"), &four_from(half + 4 * t)));
                    }
                    out.push((half + 4 * t, format!("vec4<f32>({v}) * dm{p}_{u}.x + dm{p}_{u}.y")));
                }
            }
        }
        DType::Q4K | DType::Q5K => {
            w(s, ind, format!("let dm{p}_{u} = unpack2x16float({});", x("0")));
            // Scale byte `n` of the twelve lies in word `1 + n / 4`: byte `j mod 4` of the first
            // word, `j + 4` of the second or third, `j` of the first or second.
            let (x1, x2, x3) = (x("1"), x("2"), x("3"));
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
                let q = x(&format!("{}", 4 + t));
                for h in 0..2 {
                    let mut v = nibbles(&q, h == 1);
                    if dtype == DType::Q5K {
                        // Bit `j` of each value's byte of the fifth bits.
                        let shifts = format!("(vec4<u32>(0u, 8u, 16u, 24u) + j{p}_{u}_{h})");
                        v = format!("({v}) | {}", fifth_bits(&x(&format!("f{t}")), &shifts));
                    }
                    out.push((32 * h + 4 * t, format!("ks{p}_{u}_{h} * vec4<f32>({v}) - km{p}_{u}_{h}")));
                }
            }
        }
        DType::IQ4XS => {
            // Blocks `2·pr` and `2·pr + 1`: 6-bit scales, 16 bytes of nibbles each.
            w(s, ind, format!("let d{p}_{u} = unpack2x16float({}).x;", x("0")));
            for h in 0..2 {
                let j = format!("(2u * pr{u} + {h}u)");
                let sc = format!(
                    "extractBits({}, 4u * {j}, 4u) | (extractBits({}, 16u + 2u * {j}, 2u) << 4u)",
                    x("1"),
                    x("0")
                );
                w(s, ind, format!("let ks{p}_{u}_{h} = d{p}_{u} * f32(i32({sc}) - 32);"));
                for t in 0..4 {
                    let q = x(&format!("{}", 2 + 4 * h + t));
                    for half in [0, 16] {
                        out.push((
                            32 * h + half + 4 * t,
                            format!("ks{p}_{u}_{h} * fg_iq4nl4({})", nibbles(&q, half == 16)),
                        ));
                    }
                }
            }
        }
        DType::Q2K => {
            // Values `32·rr + l` of the chunk: pair `2·(2·(pr mod 2) + rr)` of byte `l` of the
            // half's 32; sub-block `i` of the four the chunk's scale word's byte `i`.
            w(s, ind, format!("let dm{p}_{u} = unpack2x16float({});", x("d")));
            for i in 0..4 {
                w(s, ind, format!("let sc{p}_{u}_{i} = extractBits({}, {}u, 8u);", x("s"), 8 * i));
                w(s, ind, format!("let ks{p}_{u}_{i} = dm{p}_{u}.x * f32(sc{p}_{u}_{i} & 15u);"));
                w(s, ind, format!("let km{p}_{u}_{i} = dm{p}_{u}.y * f32(sc{p}_{u}_{i} >> 4u);"));
            }
            for rr in 0..2 {
                let shift = format!("2u * (2u * (pr{u} & 1u) + {rr}u)");
                for t in 0..8 {
                    let q = byte_fields(&x(&format!("{t}")), &shift, 3);
                    let i = 2 * rr + t / 4;
                    out.push((32 * rr + 4 * t, format!("ks{p}_{u}_{i} * vec4<f32>({q}) - km{p}_{u}_{i}")));
                }
            }
        }
        DType::Q3K => {
            w(s, ind, format!("let aligned{p}_{u} = (base{u} & 3u) == 0u;"));
            // A run's word `t`, whole or from two words shifted by half a word.
            let word = |run: &str, t: usize| {
                run_word(&x(&format!("{run}{t}")), &x(&format!("{run}{}", t + 1)), &format!("aligned{p}_{u}"))
            };
            w(s, ind, format!("let d{p}_{u} = unpack2x16float({})[((base{u} + 108u) >> 1u) & 1u];", x("h1")));
            w(s, ind, format!("let ls{p}_{u} = {};", word("l", 0)));
            w(s, ind, format!("let hs{p}_{u} = {};", word("h", 0)));
            // Sub-block `i` of the chunk's four (`4·pr + i`): nibble `pr / 2` of the low run's
            // byte `i`, pair `pr` of the high run's, less 32.
            for i in 0..4 {
                let low = format!("extractBits(ls{p}_{u}, {}u + 4u * (pr{u} >> 1u), 4u)", 8 * i);
                let high = format!("extractBits(hs{p}_{u}, {}u + 2u * pr{u}, 2u)", 8 * i);
                w(s, ind, format!("let ks{p}_{u}_{i} = d{p}_{u} * f32(i32({low} | ({high} << 4u)) - 32);"));
            }
            for t in 0..8 {
                w(s, ind, format!("let qw{p}_{u}_{t} = {};", word("q", t)));
                w(s, ind, format!("let mw{p}_{u}_{t} = {};", word("m", t)));
                // Values `32·rr + 4·t …` of the chunk: pair `2·(pr mod 2) + rr` of the low
                // bytes, bit `2·pr + rr` of the masks.
                for rr in 0..2 {
                    let low = byte_fields(&format!("qw{p}_{u}_{t}"), &format!("2u * (2u * (pr{u} & 1u) + {rr}u)"), 3);
                    let high = byte_fields(&format!("mw{p}_{u}_{t}"), &format!("2u * pr{u} + {rr}u"), 1);
                    let q = format!("vec4<i32>(({low}) | (({high}) << vec4<u32>(2u))) - vec4<i32>(4)");
                    out.push((32 * rr + 4 * t, format!("ks{p}_{u}_{} * vec4<f32>({q})", 2 * rr + t / 4)));
                }
            }
        }
        DType::Q6K => {
            w(s, ind, format!("let aligned{p}_{u} = (base{u} & 3u) == 0u;"));
            w(s, ind, format!("let d{p}_{u} = unpack2x16float({})[((base{u} + 208u) >> 1u) & 1u];", x("d")));
            let scale = |second: usize| {
                format!("extractBits(bitcast<i32>({}), (sa{u} & 3u) * 8u + {}u, 8u)", x("s"), 8 * second)
            };
            w(s, ind, format!("let ks{p}_{u}_0 = d{p}_{u} * f32({});", scale(0)));
            w(s, ind, format!("let ks{p}_{u}_1 = d{p}_{u} * f32({});", scale(1)));
            for t in 0..8 {
                let word = |run: &str| {
                    run_word(&x(&format!("{run}{t}")), &x(&format!("{run}{}", t + 1)), &format!("aligned{p}_{u}"))
                };
                w(s, ind, format!("let ql{p}_{u}_{t} = {};", word("l")));
                w(s, ind, format!("let qh{p}_{u}_{t} = {};", word("h")));
                let low = byte_fields(&format!("ql{p}_{u}_{t}"), &format!("(rg{u} >> 1u) * 4u"), 15);
                let high = byte_fields(&format!("qh{p}_{u}_{t}"), &format!("2u * rg{u}"), 3);
                let q = format!("vec4<f32>(vec4<i32>(({low}) | (({high}) << vec4<u32>(4u))) - vec4<i32>(32))");
                out.push((4 * t, format!("ks{p}_{u}_{} * {q}", usize::from(t >= 4))));
            }
        }
        _ => unreachable!("{dtype:?} is not read by words"),
    }
    out
}
