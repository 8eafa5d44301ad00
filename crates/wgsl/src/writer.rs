//! Small helpers for writing WGSL text: types, literals, index arithmetic.

use fusegraph_ir::DType;
use std::fmt::Write;

/// The WGSL type a value of `dtype` is computed in (f16 computes in f32, bf16 and the block
/// types are read as f32).
pub fn vty(dtype: DType) -> &'static str {
    match dtype {
        DType::I32 => "i32",
        DType::U32 => "u32",
        DType::Bool => "bool",
        // The floats and the storage types.
        _ => "f32",
    }
}

/// A WGSL literal of `v` in the compute type of `dtype`, exact for every value.
pub fn literal(dtype: DType, v: f64) -> String {
    match dtype {
        DType::I32 => {
            let i = v as i32;
            if i == i32::MIN {
                "bitcast<i32>(0x80000000u)".into()
            } else {
                format!("{i}i")
            }
        }
        DType::U32 => format!("{}u", v as u32),
        DType::Bool => (if v != 0.0 { "true" } else { "false" }).into(),
        // The floats and the storage types, computed in f32.
        _ => {
            // An f16 value is the f16 nearest `v` (computed in f32); a bf16 one likewise.
            let f = match dtype {
                DType::F16 => half::f16::from_f64(v).to_f32(),
                DType::BF16 => fusegraph_ir::bf16_nearest(v).to_f32(),
                _ => v as f32,
            };
            if f.is_finite() {
                let s = format!("{f:?}");
                if s.contains('.') || s.contains('e') {
                    format!("{s}f")
                } else {
                    format!("{s}.0f")
                }
            } else {
                format!("bitcast<f32>({:#x}u)", f.to_bits())
            }
        }
    }
}

/// Emits `let c{k} = ...;` lines that unravel the row-major linear index `idx` over `dims`,
/// and returns the coordinate expressions (a literal `0u` for size-1 axes).
pub fn unravel(out: &mut String, dims: &[usize], idx: &str, prefix: &str) -> Vec<String> {
    let mut coords = vec![String::from("0u"); dims.len()];
    let nontrivial: Vec<usize> = (0..dims.len()).filter(|&a| dims[a] != 1).collect();
    // A value with no elements is never read at an index (a concat's empty part, an empty
    // slice's consumers): no coordinates, and no division by its zero extent.
    if nontrivial.is_empty() || dims.contains(&0) {
        return coords;
    }
    let _ = writeln!(out, "    var {prefix}r = {idx};");
    for (n, &a) in nontrivial.iter().enumerate().rev() {
        let name = format!("{prefix}{a}");
        if n == 0 {
            let _ = writeln!(out, "    let {name} = {prefix}r;");
        } else {
            let _ = writeln!(out, "    let {name} = {prefix}r % {}u;", dims[a]);
            let _ = writeln!(out, "    {prefix}r = {prefix}r / {}u;", dims[a]);
        }
        coords[a] = name;
    }
    coords
}

/// Row-major linear index expression of coordinate expressions over `dims`.
pub fn ravel(coords: &[String], dims: &[usize]) -> String {
    let strides = fusegraph_ir::Shape::new(dims.to_vec()).strides();
    let terms: Vec<String> = coords
        .iter()
        .zip(&strides)
        .zip(dims)
        .filter(|((c, _), &d)| d != 1 && c.as_str() != "0u")
        .map(|((c, &s), _)| if s == 1 { c.clone() } else { format!("{c} * {s}u") })
        .collect();
    if terms.is_empty() {
        "0u".into()
    } else {
        terms.join(" + ")
    }
}
