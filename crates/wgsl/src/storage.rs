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
