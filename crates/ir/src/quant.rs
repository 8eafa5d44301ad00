//! llama.cpp's block types on the host (every [`DType`] whose [`DType::block`] is `Some`):
//! quantization to the blocks of 32 with a uniform step (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1) by
//! llama.cpp's reference round-to-nearest (`quantize_row_q8_0_ref` and its siblings, which
//! the `gguf` package's `quants` module reproduces), and dequantization of every block type
//! as the `gguf` package and a kernel compute it (in f32: a block's f16 scale times its
//! integer or level; for the super-blocks the sub-block's scale first, less its min).

use crate::{DType, IrError, Result};
use half::f16;

/// The block types [`quantize`] writes: llama.cpp's blocks of 32 with a uniform step, and
/// MXFP4 (the nearest level under the block's power-of-two scale).
pub const QUANTIZED: [DType; 6] = [DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::Q4_1, DType::Q5_1, DType::MXFP4];

/// The packed blocks of `values` (a multiple of 32 of them) in `dtype`, one of [`QUANTIZED`]
/// (llama.cpp's `quantize_row_*_ref`). The
/// k-quants and the IQ types are read as files hold them, never quantized here (llama.cpp
/// chooses their scales by a search): an error names the type.
pub fn quantize(dtype: DType, values: &[f32]) -> Result<Vec<u8>> {
    let (elems, bytes) = block_of(dtype, values.len())?;
    if !QUANTIZED.contains(&dtype) {
        return Err(IrError::ty(
            "tensor",
            format!("{dtype} blocks are read as a file holds them; quantizing to {dtype} is not supported"),
        ));
    }
    let mut out = Vec::with_capacity(values.len() / elems * bytes);
    for x in values.chunks_exact(elems) {
        match dtype {
            DType::Q8_0 => {
                let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                out.extend(x.iter().map(|&v| (v * id).round() as i8 as u8));
            }
            DType::MXFP4 => {
                // llama.cpp's `quantize_row_mxfp4_ref`: the scale `2^(⌊log2 amax⌋ − 2)` (so
                // that amax lands among the top levels), each value its nearest level (the
                // first of equals).
                let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                let e = if amax > 0.0 { (amax.log2().floor() - 2.0 + 127.0) as u8 } else { 0 };
                let d = e8m0_half(e);
                let q: Vec<u8> = x
                    .iter()
                    .map(|&v| {
                        let err = |n: usize| (d * MXFP4_LEVELS[n] as f32 - v).abs();
                        (0..16).fold(0, |best, n| if err(n) < err(best) { n } else { best }) as u8
                    })
                    .collect();
                out.push(e);
                pack_32(&mut out, &q, false);
            }
            DType::Q4_1 | DType::Q5_1 => {
                // The block's range in 15 or 31 steps up from its minimum.
                let (min, max) = x.iter().fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
                let top = if dtype == DType::Q5_1 { 31 } else { 15 };
                let d = (max - min) / top as f32;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
                let q: Vec<u8> = x.iter().map(|&v| (((v - min) * id + 0.5) as u8).min(top)).collect();
                pack_32(&mut out, &q, dtype == DType::Q5_1);
            }
            _ => {
                // The value of largest magnitude (the first of equals) maps to the lowest
                // integer, -8 or -16.
                let (mut amax, mut max) = (0f32, 0f32);
                for &v in x {
                    if amax < v.abs() {
                        (amax, max) = (v.abs(), v);
                    }
                }
                let half = if dtype == DType::Q5_0 { 16.0 } else { 8.0 };
                let d = max / -half;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                let q: Vec<u8> =
                    x.iter().map(|&v| ((v * id + half + 0.5) as i8).clamp(0, 2 * half as i8 - 1) as u8).collect();
                pack_32(&mut out, &q, dtype == DType::Q5_0);
            }
        }
    }
    Ok(out)
}

/// The values of packed blocks of `dtype`, a block type: `numel` of them, read from `data`.
pub fn dequantize(dtype: DType, data: &[u8], numel: usize) -> Result<Vec<f32>> {
    let (elems, bytes) = block_of(dtype, numel)?;
    if data.len() < numel / elems * bytes {
        let need = numel / elems * bytes;
        return Err(IrError::ty("tensor", format!("{} bytes cannot hold {numel} {dtype} values ({need})", data.len())));
    }
    let mut out = Vec::with_capacity(numel);
    for b in data.chunks_exact(bytes).take(numel / elems) {
        match dtype {
            DType::Q8_0 => {
                let d = half(b);
                out.extend(b[2..].iter().map(|&q| d * q as i8 as f32));
            }
            DType::Q4_0 => out.extend(unpack_32(&b[2..], false).map(|q| half(b) * (q as i32 - 8) as f32)),
            DType::Q5_0 => out.extend(unpack_32(&b[2..], true).map(|q| half(b) * (q as i32 - 16) as f32)),
            DType::Q4_1 | DType::Q5_1 => {
                let (d, m) = (half(b), half(&b[2..]));
                out.extend(unpack_32(&b[4..], dtype == DType::Q5_1).map(|q| d * q as f32 + m));
            }
            DType::Q4K | DType::Q5K => {
                // Q5_K: 32 bytes of fifth bits (value `l` of sub-block `j`: bit `j` of byte
                // `l`) between the scales and the nibbles.
                let (d, dmin) = (half(b), half(&b[2..]));
                let (high, nibbles) = if dtype == DType::Q5K { (Some(&b[16..48]), &b[48..]) } else { (None, &b[16..]) };
                for (i, chunk) in nibbles.chunks_exact(32).enumerate() {
                    for (shift, j) in [(0, 2 * i), (4, 2 * i + 1)] {
                        let (sc, m) = q4k_scale_min(&b[4..16], j);
                        let (dj, mj) = (d * sc as f32, dmin * m as f32);
                        out.extend(chunk.iter().enumerate().map(|(l, &q)| {
                            let fifth = high.map_or(0, |h| ((h[l] >> j) & 1) << 4);
                            dj * (((q >> shift) & 0x0f) | fifth) as f32 - mj
                        }));
                    }
                }
            }
            DType::Q2K => {
                // Sub-block `e / 16`'s scale and min: the low and high nibble of its byte.
                let (scales, qs, d, dmin) = (&b[..16], &b[16..80], half(&b[80..]), half(&b[82..]));
                for e in 0..256 {
                    let sc = scales[e / 16];
                    let (dl, ml) = (d * (sc & 0x0f) as f32, dmin * (sc >> 4) as f32);
                    let q = k_pair(qs, e);
                    out.push(dl * q as f32 - ml);
                }
            }
            DType::Q3K => {
                // Value `e`: its low pair as Q2_K's, less 4 where bit `e / 32` of mask byte
                // `e mod 32` is clear; sub-block `s`'s 6-bit scale the nibble `s / 8` of byte
                // `s mod 8` and the pair `s / 4` of byte `8 + s mod 4`, less 32.
                let (hmask, qs, scales, d) = (&b[..32], &b[32..96], &b[96..108], half(&b[108..]));
                for e in 0..256 {
                    let sb = e / 16;
                    let low = (scales[sb % 8] >> (4 * (sb / 8))) & 0x0f;
                    let high = (scales[8 + sb % 4] >> (2 * (sb / 4))) & 3;
                    let dl = d * ((low | (high << 4)) as i8 - 32) as f32;
                    let q = k_pair(qs, e);
                    let h = (hmask[e % 32] >> (e / 32)) & 1;
                    out.push(dl * (q as i8 - 4 * (1 - h as i8)) as f32);
                }
            }
            DType::IQ4NL => out.extend(unpack_32(&b[2..], false).map(|n| half(b) * IQ4NL_LEVELS[n as usize] as f32)),
            DType::MXFP4 => {
                out.extend(unpack_32(&b[1..], false).map(|n| e8m0_half(b[0]) * MXFP4_LEVELS[n as usize] as f32))
            }
            DType::IQ4XS => {
                // Sub-block `j`'s scale: nibble `j mod 2` of byte `4 + j / 2` and bits `2·j`
                // of the little-endian u16 at byte 2, less 32; its values a block of 32's
                // nibbles at byte `8 + 16·j`.
                let (d, high) = (half(b), u16::from_le_bytes([b[2], b[3]]));
                for j in 0..8 {
                    let low = (b[4 + j / 2] >> (4 * (j % 2))) & 0x0f;
                    let sc = (low | (((high >> (2 * j)) & 3) as u8) << 4) as i8 - 32;
                    let dl = d * sc as f32;
                    out.extend(unpack_32(&b[8 + 16 * j..], false).map(|n| dl * IQ4NL_LEVELS[n as usize] as f32));
                }
            }
            DType::Q6K => {
                let (ql, qh, scales, d) = (&b[..128], &b[128..192], &b[192..208], half(&b[208..]));
                for e in 0..256 {
                    let (c, r, l) = (e / 128, (e % 128) / 32, e % 32);
                    let low = ql[64 * c + 32 * (r % 2) + l];
                    let low = if r < 2 { low & 0x0f } else { low >> 4 };
                    let high = (qh[32 * c + l] >> (2 * r)) & 0x03;
                    let q = ((low | (high << 4)) as i32 - 32) as f32;
                    out.push(d * scales[e / 16] as i8 as f32 * q);
                }
            }
            _ => unreachable!("{dtype} is not a block type (block_of)"),
        }
    }
    Ok(out)
}

/// Value `e`'s 2-bit pair in a Q2_K or Q3_K super-block's 64 bytes `qs`: bits
/// `2·((e mod 128) / 32)` of byte `32·(e / 128) + e mod 32`.
fn k_pair(qs: &[u8], e: usize) -> u8 {
    (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3
}

/// The 16 levels an MXFP4 nibble indexes: FP4 (E2M1) values doubled (llama.cpp's
/// `kvalues_mxfp4`), their scale halved to match ([`e8m0_half`]).
pub const MXFP4_LEVELS: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// An E8M0 scale byte `e` as the f32 `2^(e − 128)` (half the scale, for the doubled
/// [`MXFP4_LEVELS`]; llama.cpp's `ggml_e8m0_to_fp32_half`, subnormal for `e` < 2).
pub fn e8m0_half(e: u8) -> f32 {
    f32::from_bits(if e < 2 { 0x0020_0000 << e } else { (e as u32 - 1) << 23 })
}

/// The 16 levels an IQ4_NL or IQ4_XS nibble indexes (llama.cpp's `kvalues_iq4nl`).
pub const IQ4NL_LEVELS: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// Appends a block of 32's values `q` (4 or 5 bits each) as llama.cpp packs them: where
/// `fifth`, a little-endian word of their fifth bits (bit `j` for value `j`); then 16 bytes,
/// value `j`'s low nibble in byte `j % 16`, the low half for `j` < 16.
fn pack_32(out: &mut Vec<u8>, q: &[u8], fifth: bool) {
    if fifth {
        let high = (0..32).fold(0u32, |h, j| h | (u32::from(q[j] >> 4) << j));
        out.extend_from_slice(&high.to_le_bytes());
    }
    out.extend((0..16).map(|j| (q[j] & 0x0f) | (q[j + 16] << 4)));
}

/// The 32 values [`pack_32`] packed into `b` (which starts at the fifth bits' word where
/// `fifth`, else at the nibbles).
fn unpack_32(b: &[u8], fifth: bool) -> impl Iterator<Item = u32> + '_ {
    let (high, nibbles) = if fifth { (u32::from_le_bytes([b[0], b[1], b[2], b[3]]), &b[4..]) } else { (0, b) };
    let values = nibbles[..16].iter().map(|&q| q & 0x0f).chain(nibbles[..16].iter().map(|&q| q >> 4));
    values.enumerate().map(move |(j, n)| n as u32 | ((high >> j) & 1) << 4)
}

/// The f16 at the start of `b`, as f32.
fn half(b: &[u8]) -> f32 {
    f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// Sub-block `j`'s 6-bit scale and min in a Q4_K block's twelve scale bytes `s`: the first
/// four sub-blocks' in the low six bits of bytes `j` and `j + 4`, the last four's low
/// nibbles in byte `j + 4` and top two bits in the top bits of bytes `j − 4` and `j`.
pub fn q4k_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 0x3f, s[j + 4] & 0x3f)
    } else {
        ((s[j + 4] & 0x0f) | ((s[j - 4] >> 2) & 0x30), (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30))
    }
}

/// `dtype`'s block (elements, bytes), if it is a block type and `numel` whole blocks.
fn block_of(dtype: DType, numel: usize) -> Result<(usize, usize)> {
    let (elems, bytes) = dtype.block().ok_or_else(|| IrError::ty("tensor", format!("{dtype} is not a block type")))?;
    if !numel.is_multiple_of(elems) {
        return Err(IrError::ty("tensor", format!("{numel} values are not whole {dtype} blocks of {elems}")));
    }
    Ok((elems, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_q4_0_and_q5_0_round_trip_within_half_a_step() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37 % 64) as f32 - 31.5) / 7.0).collect();
        for dtype in [DType::Q8_0, DType::Q4_0, DType::Q5_0] {
            let q = quantize(dtype, &x).unwrap();
            assert_eq!(q.len(), dtype.data_bytes(64));
            let back = dequantize(dtype, &q, 64).unwrap();
            for block in 0..2 {
                let r = &x[32 * block..32 * block + 32];
                // The value of largest magnitude is ±127 steps (q8_0), or -8 (q4_0) or -16
                // (q5_0) steps, whose other end is 7 or 15 steps: values past it clamp there.
                let max = r.iter().copied().fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
                let (d, lo, hi) = match dtype {
                    DType::Q8_0 => (max.abs() / 127.0, -max.abs(), max.abs()),
                    _ => {
                        let half = if dtype == DType::Q5_0 { 16.0 } else { 8.0 };
                        let d = max / -half;
                        (d.abs(), (-half * d).min((half - 1.0) * d), (-half * d).max((half - 1.0) * d))
                    }
                };
                for (a, b) in r.iter().zip(&back[32 * block..]) {
                    assert!((a.clamp(lo, hi) - b).abs() <= d * 0.501, "{dtype}: {a} → {b}, step {d}");
                }
            }
        }
    }

    #[test]
    fn partial_blocks_and_element_types_are_errors() {
        assert!(quantize(DType::Q8_0, &[1.0; 31]).unwrap_err().to_string().contains("whole q8_0 blocks"));
        assert!(quantize(DType::F32, &[1.0; 32]).unwrap_err().to_string().contains("not a block type"));
        assert!(dequantize(DType::Q4_0, &[0; 17], 32).unwrap_err().to_string().contains("17 bytes"));
        // The k-quants and IQ types are read, never written.
        for dtype in DType::ALL.into_iter().filter(|d| d.block().is_some() && !QUANTIZED.contains(d)) {
            let n = dtype.block().unwrap().0;
            let err = quantize(dtype, &vec![1.0; n]).unwrap_err().to_string();
            assert!(err.contains(&format!("quantizing to {dtype} is not supported")), "{err}");
            assert!(dequantize(dtype, &vec![0; dtype.data_bytes(n)], n).is_ok(), "{dtype}");
        }
    }
}
