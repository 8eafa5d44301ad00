//! safetensors files ↔ [`HostTensor`]s: the weight file format Hugging Face, PyTorch and
//! candle write, so weights saved here load elsewhere and the other way round.
//!
//! f32, f16, bf16, i32 and u32 are stored as themselves (little-endian), bool as `BOOL` (a
//! byte per element). Reading also takes `U8` (as bool).

use crate::{HostTensor, Shape};
use half::{bf16, f16};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// An error reading or writing a safetensors file.
#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    /// Reading or writing the file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The bytes are not a valid safetensors file (truncated, bad header, offsets outside the
    /// data).
    #[error("safetensors: {0}")]
    Format(String),
    /// A tensor has a dtype fusegraph does not read.
    #[error("safetensors: tensor `{name}` has dtype {dtype}, which fusegraph does not read (F32, F16, BF16, I32, U32, BOOL, U8 do)")]
    Dtype {
        /// The tensor's key.
        name: String,
        /// The file's dtype.
        dtype: String,
    },
    /// A tensor's dtype has no safetensors dtype (the block types).
    #[error("safetensors: tensor `{name}` is {dtype}, which safetensors has no dtype for (dequantize it to write it)")]
    Unwritable {
        /// The tensor's key.
        name: String,
        /// Its dtype.
        dtype: crate::DType,
    },
}

fn format_err(e: impl std::fmt::Display) -> SafetensorsError {
    SafetensorsError::Format(e.to_string())
}

/// The safetensors encoding of `tensors` (keys need not be sorted; the format sorts them).
pub fn to_bytes<'a>(tensors: impl IntoIterator<Item = (&'a str, &'a HostTensor)>) -> Result<Vec<u8>, SafetensorsError> {
    let encoded: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(name, t)| {
            let (dtype, bytes) =
                encode(t).ok_or(SafetensorsError::Unwritable { name: name.into(), dtype: t.dtype() })?;
            Ok((name, dtype, t.shape().dims().to_vec(), bytes))
        })
        .collect::<Result<_, SafetensorsError>>()?;
    let mut views = Vec::with_capacity(encoded.len());
    for (name, dtype, shape, bytes) in &encoded {
        views.push((*name, TensorView::new(*dtype, shape.clone(), bytes).map_err(format_err)?));
    }
    safetensors::serialize(views, None).map_err(format_err)
}

/// Writes `tensors` to a safetensors file at `path`, through a temporary file renamed into
/// place, so a failed write leaves any previous file whole.
pub fn write<'a>(
    path: &Path,
    tensors: impl IntoIterator<Item = (&'a str, &'a HostTensor)>,
) -> Result<(), SafetensorsError> {
    let bytes = to_bytes(tensors)?;
    let io = |source| SafetensorsError::Io { path: path.to_path_buf(), source };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".partial");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Every tensor of a safetensors encoding, by key.
pub fn from_bytes(bytes: &[u8]) -> Result<BTreeMap<String, HostTensor>, SafetensorsError> {
    let file = SafeTensors::deserialize(bytes).map_err(format_err)?;
    file.iter().map(|(name, view)| Ok((name.to_string(), decode(name, &view)?))).collect()
}

/// Every tensor of the safetensors file at `path`, by key, decoded from the memory-mapped
/// file (no copy of the whole file is made first).
pub fn read(path: &Path) -> Result<BTreeMap<String, HostTensor>, SafetensorsError> {
    let io = |source| SafetensorsError::Io { path: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: the map is read-only; a file changed by another process while it is read is
    // outside what this reader supports (as for every mmap reader).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    from_bytes(&map).map_err(|e| match e {
        SafetensorsError::Format(m) => SafetensorsError::Format(format!("{}: {m}", path.display())),
        other => other,
    })
}

/// The safetensors dtype and little-endian bytes of a host tensor (none for a block type).
fn encode(t: &HostTensor) -> Option<(Dtype, Vec<u8>)> {
    use crate::HostData;
    Some(match t.data() {
        HostData::F32(v) => (Dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        HostData::F16(v) => (Dtype::F16, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        HostData::BF16(v) => (Dtype::BF16, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        HostData::I32(v) => (Dtype::I32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        HostData::U32(v) => (Dtype::U32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        HostData::Bool(v) => (Dtype::BOOL, v.iter().map(|&x| x as u8).collect()),
        // The block types.
        _ => return None,
    })
}

/// A host tensor from a safetensors view (`name` is its key, for errors): F32, F16, BF16, I32
/// and U32 as themselves, BOOL and U8 as bool, F8_E4M3 (FP8 as `float8_e4m3fn`: no
/// infinities, `0x7f`/`0xff` NaN) widened exactly to f32.
pub fn decode(name: &str, view: &TensorView<'_>) -> Result<HostTensor, SafetensorsError> {
    let shape = Shape::new(view.shape());
    let raw = view.data();
    let words = || raw.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
    let halves = || raw.chunks_exact(2).map(|c| [c[0], c[1]]);
    let t = match view.dtype() {
        Dtype::F32 => HostTensor::new(shape, words().map(f32::from_le_bytes).collect::<Vec<_>>()),
        Dtype::I32 => HostTensor::new(shape, words().map(i32::from_le_bytes).collect::<Vec<_>>()),
        Dtype::U32 => HostTensor::new(shape, words().map(u32::from_le_bytes).collect::<Vec<_>>()),
        Dtype::F16 => HostTensor::new(shape, halves().map(f16::from_le_bytes).collect::<Vec<_>>()),
        Dtype::BF16 => HostTensor::new(shape, halves().map(bf16::from_le_bytes).collect::<Vec<_>>()),
        Dtype::BOOL | Dtype::U8 => HostTensor::new(shape, raw.iter().map(|&x| x != 0).collect::<Vec<_>>()),
        Dtype::F8_E4M3 => HostTensor::new(shape, raw.iter().map(|&x| e4m3(x)).collect::<Vec<_>>()),
        other => return Err(SafetensorsError::Dtype { name: name.to_string(), dtype: format!("{other:?}") }),
    };
    t.map_err(|e| SafetensorsError::Format(format!("tensor `{name}`: {e}")))
}

/// The value of an FP8 E4M3 (`float8_e4m3fn`) byte: sign, 4 exponent bits (bias 7), 3
/// mantissa bits; exponent 0 subnormal; all ones in exponent and mantissa NaN.
pub fn e4m3(x: u8) -> f32 {
    let (sign, e, m) = (if x & 0x80 != 0 { -1.0 } else { 1.0 }, (x >> 3) & 0x0f, x & 0x07);
    match (e, m) {
        (0x0f, 0x07) => f32::NAN,
        (0, _) => sign * m as f32 / 8.0 * 2f32.powi(-6),
        _ => sign * (1.0 + m as f32 / 8.0) * 2f32.powi(e as i32 - 7),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FP8 E4M3 bytes as `float8_e4m3fn` reads them: the normal and subnormal extremes, signs,
    /// NaN, and every finite byte of one sign larger than the one before.
    #[test]
    fn e4m3_bytes_read_as_float8_e4m3fn() {
        for (byte, want) in [(0x00, 0.0), (0x38, 1.0), (0x40, 2.0), (0xb0, -0.5), (0x7e, 448.0), (0x08, 2f32.powi(-6))]
        {
            assert_eq!(e4m3(byte), want, "{byte:#04x}");
        }
        assert_eq!((e4m3(0x01), e4m3(0x07)), (2f32.powi(-9), 7.0 * 2f32.powi(-9)));
        assert!(e4m3(0x7f).is_nan() && e4m3(0xff).is_nan());
        assert!((1..0x7f).all(|b| e4m3(b) > e4m3(b - 1) && e4m3(b | 0x80) == -e4m3(b)));
    }

    #[test]
    fn every_dtype_round_trips() {
        let tensors = [
            ("a", HostTensor::new([2, 2], vec![1.5f32, -2.0, 3.25, 0.0]).unwrap()),
            ("b", HostTensor::new([3], vec![f16::from_f32(0.5), f16::from_f32(-1.0), f16::from_f32(7.0)]).unwrap()),
            ("c", HostTensor::new([2], vec![-3i32, 9]).unwrap()),
            ("d", HostTensor::new([1], vec![7u32]).unwrap()),
            ("e", HostTensor::new([3], vec![true, false, true]).unwrap()),
        ];
        let bytes = to_bytes(tensors.iter().map(|(n, t)| (*n, t))).unwrap();
        let back = from_bytes(&bytes).unwrap();
        assert_eq!(back.len(), tensors.len());
        for (n, t) in &tensors {
            assert_eq!(&back[*n], t, "{n}");
        }
    }

    #[test]
    fn bf16_reads_as_itself_and_unknown_dtypes_are_named() {
        let values = [1.0f32, -0.15625, 3.0e5];
        let raw: Vec<u8> = values.iter().flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes()).collect();
        let view = TensorView::new(Dtype::BF16, vec![3], &raw).unwrap();
        let bytes = safetensors::serialize([("w", view)], None).unwrap();
        let t = &from_bytes(&bytes).unwrap()["w"];
        let want: Vec<f64> = values.iter().map(|v| f32::from_bits(v.to_bits() & 0xffff_0000) as f64).collect();
        assert_eq!(t.dtype(), crate::DType::BF16);
        assert_eq!(t.to_f64(), want);

        let raw = [0u8; 16];
        let view = TensorView::new(Dtype::F64, vec![2], &raw).unwrap();
        let bytes = safetensors::serialize([("h.0.w", view)], None).unwrap();
        let err = from_bytes(&bytes).unwrap_err().to_string();
        assert!(err.contains("`h.0.w`") && err.contains("F64"), "{err}");
        assert!(matches!(from_bytes(&bytes[..bytes.len() - 3]), Err(SafetensorsError::Format(_))));
    }
}
