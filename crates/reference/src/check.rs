//! Comparing results against the oracle.

use fusegraph_ir::{DType, HostTensor};

/// The default `(rtol, atol)` for comparing a computed tensor of `dtype` with the reference:
/// f32 `(1e-5, 1e-5)`, f16 `(2e-3, 2e-3)`, the storage types (stored, never computed:
/// exact) `(0, 0)`, integers and bool exact `(0, 0)`.
pub fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (1e-5, 1e-5),
        DType::F16 => (2e-3, 2e-3),
        // The storage types, the integers and bool.
        _ => (0.0, 0.0),
    }
}

/// How many mismatching elements [`assert_close`] names.
const SHOWN: usize = 8;

fn close(g: f64, w: f64, rtol: f64, atol: f64) -> bool {
    if g.is_nan() || w.is_nan() {
        return g.is_nan() && w.is_nan();
    }
    if g.is_infinite() || w.is_infinite() {
        return g == w;
    }
    (g - w).abs() <= atol + rtol * w.abs()
}

/// Checks that `got` matches `want`: same dtype, same shape, and every element within
/// `|g − w| ≤ atol + rtol·|w|` (NaN matches NaN; infinities must be equal).
///
/// On failure the message names the count of mismatches and the first few by
/// multi-dimensional index, with both values.
pub fn assert_close(got: &HostTensor, want: &HostTensor, rtol: f64, atol: f64) -> Result<(), String> {
    if got.dtype() != want.dtype() || got.shape() != want.shape() {
        return Err(format!("type mismatch: got {}, want {}", got.ty(), want.ty()));
    }
    let (g, w) = (got.to_f64(), want.to_f64());
    let bad: Vec<usize> = (0..g.len()).filter(|&i| !close(g[i], w[i], rtol, atol)).collect();
    if bad.is_empty() {
        return Ok(());
    }
    let mut msg =
        format!("{} of {} elements of {} differ (rtol {rtol:e}, atol {atol:e}):", bad.len(), g.len(), got.ty());
    for &i in bad.iter().take(SHOWN) {
        let idx = got.shape().unravel(i);
        msg.push_str(&format!("\n  at {idx:?}: got {}, want {} (diff {:e})", g[i], w[i], (g[i] - w[i]).abs()));
    }
    if bad.len() > SHOWN {
        msg.push_str(&format!("\n  … and {} more", bad.len() - SHOWN));
    }
    Err(msg)
}
