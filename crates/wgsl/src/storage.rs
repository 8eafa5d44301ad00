//! How each dtype is stored in a binding and moved between memory and the element functions
//! (f16 native, packed two to a word, or as words in the serial loop family).

use crate::options::*;
use fusegraph_ir::DType;

pub(crate) fn storage_elem(dtype: DType, opts: &LowerOptions) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 if opts.f16_native => "f16",
        DType::I32 => "i32",
        _ => "u32",
    }
}

/// Whether a binding of `dtype` stores two 16-bit halves in each `u32` word: f16 without
/// native f16, and bf16 always (read only: no kernel computes a bf16, see [`bf16_load`]).
pub(crate) fn packed_halves(dtype: DType, opts: &LowerOptions) -> bool {
    (dtype == DType::F16 && !opts.f16_native) || dtype == DType::BF16
}

/// Element `i` of a bf16 binding `b` (halves packed in words) as the f32 it is exactly: its
/// bits are an f32's top half.
pub(crate) fn bf16_load(b: &str, i: &str) -> String {
    format!("bitcast<f32>(({b}[{i} >> 1u] >> (({i} & 1u) << 4u)) << 16u)")
}

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

/// Whether an f16 binding that a loop or row kernel reads or writes four adjacent elements
/// at a time (its quads: see [`quad_view`]) is declared as pairs of `u32` words and
/// converted by integer operations (`fg_f16x4_from_words`, `fg_f16x4_to_words` in
/// shaders/helpers.wgsl), native f16 or not: in the serial loop family ([`Spread::Serial`]),
/// for the adapters whose own f16 conversions are slower than the copy they convert
/// (lavapipe, 16 Mi elements: an f16 copy through `vec4<f16>` 32–37 ms, through words
/// 20–24 ms, an f32 copy 23 ms).
pub(crate) fn f16_words(dtype: DType, opts: &LowerOptions) -> bool {
    dtype == DType::F16 && opts.forms.loops == Spread::Serial
}

/// Whether a binding of `dtype` can be read and written in quads: `vec4`s of its storage
/// type, or pairs of words for f16 in the serial loop family (see [`f16_words`]).
pub(crate) fn quad_storage(dtype: DType, opts: &LowerOptions) -> bool {
    vec4_storage(dtype, opts) || f16_words(dtype, opts)
}

/// The element type of a binding read and written in quads: `vec4` of its storage type, or
/// a pair of words for f16 in the serial loop family (see [`f16_words`]).
pub(crate) fn quad_elem(dtype: DType, opts: &LowerOptions) -> String {
    if f16_words(dtype, opts) {
        "vec2<u32>".to_string()
    } else {
        format!("vec4<{}>", storage_elem(dtype, opts))
    }
}

/// The quad of a binding of `dtype` that stores the four values `values` (WGSL expressions
/// of the values' computed type).
pub(crate) fn quad_value(dtype: DType, opts: &LowerOptions, values: &[String]) -> String {
    if f16_words(dtype, opts) {
        format!("fg_f16x4_to_words(vec4<f32>({}))", values.join(", "))
    } else {
        let stored: Vec<String> = values.iter().map(|v| store_value(dtype, v)).collect();
        format!("vec4<{}>({})", storage_elem(dtype, opts), stored.join(", "))
    }
}

/// Whether a binding of `dtype` can be read and written as `vec4`s of its storage type.
pub(crate) fn vec4_storage(dtype: DType, opts: &LowerOptions) -> bool {
    matches!(dtype, DType::F32 | DType::I32 | DType::U32) || (dtype == DType::F16 && opts.f16_native)
}

/// A stored element `v` as the value kernels compute with (bools are stored as `u32`, f16
/// values computed in f32).
pub(crate) fn load_value(dtype: DType, v: &str) -> String {
    match dtype {
        DType::Bool => format!("{v} != 0u"),
        DType::F16 => format!("f32({v})"),
        _ => v.to_string(),
    }
}

pub(crate) fn store_value(dtype: DType, v: &str) -> String {
    match dtype {
        DType::Bool => format!("select(0u, 1u, {v})"),
        DType::F16 => format!("f16({v})"),
        _ => v.to_string(),
    }
}
