//! Host tensors: typed data plus a shape, the values fed to and read back from executables.

use crate::{DType, IrError, Result, Shape, TensorType};
use half::{bf16, f16};

/// Typed element storage of a [`HostTensor`].
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    /// f32 elements.
    F32(Vec<f32>),
    /// f16 elements.
    F16(Vec<f16>),
    /// bf16 elements.
    BF16(Vec<bf16>),
    /// i32 elements.
    I32(Vec<i32>),
    /// u32 elements.
    U32(Vec<u32>),
    /// bool elements.
    Bool(Vec<bool>),
    /// The packed blocks of a block type (the [`DType`], one whose [`DType::block`] is
    /// `Some`), as a GGUF file holds them (see [`crate::quant`]).
    Blocks(DType, Vec<u8>),
}

impl HostData {
    /// A block type's packed bytes; `None` for the element types.
    pub fn blocks(&self) -> Option<&[u8]> {
        match self {
            HostData::Blocks(_, b) => Some(b),
            _ => None,
        }
    }
}

/// The bf16 nearest `v` (ties to even), through f32: `half`'s `bf16::from_f64` misrounds
/// some values (0.0091857915 gives 0.009155273, not the nearest 0.009216309).
pub fn bf16_nearest(v: f64) -> bf16 {
    bf16::from_f32(v as f32)
}

/// A Rust element type that maps to a [`DType`].
pub trait Element: Copy + 'static {
    /// The matching dtype.
    const DTYPE: DType;
    /// Wraps a vector.
    fn wrap(v: Vec<Self>) -> HostData;
    /// Borrows the vector back, if the dtype matches.
    fn unwrap(d: &HostData) -> Option<&[Self]>;
}

macro_rules! element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn wrap(v: Vec<Self>) -> HostData {
                HostData::$d(v)
            }
            fn unwrap(d: &HostData) -> Option<&[Self]> {
                match d {
                    HostData::$d(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
element!(f32, F32);
element!(f16, F16);
element!(bf16, BF16);
element!(i32, I32);
element!(u32, U32);
element!(bool, Bool);

/// A tensor in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    shape: Shape,
    data: HostData,
}

impl HostTensor {
    /// A tensor from a shape and row-major data; errors if the lengths disagree.
    pub fn new<T: Element>(shape: impl Into<Shape>, data: Vec<T>) -> Result<Self> {
        let shape = shape.into();
        if shape.numel() != data.len() {
            return Err(IrError::ty(
                "tensor",
                format!("{} values given for shape {shape} ({} elements)", data.len(), shape.numel()),
            ));
        }
        Ok(HostTensor { shape, data: T::wrap(data) })
    }

    /// A tensor of `dtype` from f64 values, each converted as [`crate::Op::Cast`] would
    /// (floats round, integers truncate and saturate, bool is `v != 0`); a block type's
    /// values (a last dimension of whole blocks) quantized by [`crate::quant::quantize`] from
    /// their f32 roundings (one of [`crate::quant::QUANTIZED`]: quantizing to a k-quant or an
    /// IQ type is an error).
    pub fn from_f64(dtype: DType, shape: impl Into<Shape>, values: &[f64]) -> Result<Self> {
        let shape = shape.into();
        let blocks = |values: &[f64]| -> Result<Vec<u8>> {
            check_blocks(dtype, &shape)?;
            crate::quant::quantize(dtype, &values.iter().map(|&v| v as f32).collect::<Vec<_>>())
        };
        let data = match dtype {
            DType::F32 => HostData::F32(values.iter().map(|&v| v as f32).collect()),
            DType::F16 => HostData::F16(values.iter().map(|&v| f16::from_f64(v)).collect()),
            DType::BF16 => HostData::BF16(values.iter().map(|&v| bf16_nearest(v)).collect()),
            DType::I32 => HostData::I32(values.iter().map(|&v| v as i32).collect()),
            DType::U32 => HostData::U32(values.iter().map(|&v| v as u32).collect()),
            DType::Bool => HostData::Bool(values.iter().map(|&v| v != 0.0).collect()),
            _ => HostData::Blocks(dtype, blocks(values)?),
        };
        if shape.numel() != values.len() {
            return Err(IrError::ty(
                "tensor",
                format!("{} values given for shape {shape} ({} elements)", values.len(), shape.numel()),
            ));
        }
        Ok(HostTensor { shape, data })
    }

    /// A tensor of a block type from its packed blocks (as a GGUF file holds them): `shape`'s
    /// last dimension whole blocks, and exactly its blocks' bytes.
    pub fn from_blocks(dtype: DType, shape: impl Into<Shape>, bytes: Vec<u8>) -> Result<Self> {
        let shape = shape.into();
        check_blocks(dtype, &shape)?;
        if bytes.len() != dtype.data_bytes(shape.numel()) {
            let need = dtype.data_bytes(shape.numel());
            return Err(IrError::ty("tensor", format!("{} bytes given for {dtype}{shape} ({need})", bytes.len())));
        }
        Ok(HostTensor { shape, data: HostData::Blocks(dtype, bytes) })
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        match self.data {
            HostData::F32(_) => DType::F32,
            HostData::F16(_) => DType::F16,
            HostData::BF16(_) => DType::BF16,
            HostData::I32(_) => DType::I32,
            HostData::U32(_) => DType::U32,
            HostData::Bool(_) => DType::Bool,
            HostData::Blocks(dtype, _) => dtype,
        }
    }

    /// The tensor type.
    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype(), self.shape.clone())
    }

    /// The typed data.
    pub fn data(&self) -> &HostData {
        &self.data
    }

    /// The elements as a slice of `T`, if the dtype matches.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        T::unwrap(&self.data)
    }

    /// Every element widened to f64 (exact for all dtypes; a block type's values as
    /// [`crate::quant::dequantize`] gives them).
    pub fn to_f64(&self) -> Vec<f64> {
        let blocks = |bytes: &[u8]| -> Vec<f64> {
            let v = crate::quant::dequantize(self.dtype(), bytes, self.shape.numel());
            v.expect("whole blocks, checked when made").into_iter().map(f64::from).collect()
        };
        match &self.data {
            HostData::F32(v) => v.iter().map(|&x| x as f64).collect(),
            HostData::F16(v) => v.iter().map(|&x| x.to_f64()).collect(),
            HostData::BF16(v) => v.iter().map(|&x| x.to_f64()).collect(),
            HostData::I32(v) => v.iter().map(|&x| x as f64).collect(),
            HostData::U32(v) => v.iter().map(|&x| x as f64).collect(),
            HostData::Bool(v) => v.iter().map(|&x| x as u8 as f64).collect(),
            other => blocks(other.blocks().expect("a block type's data")),
        }
    }

    /// The device storage layout: f16 and bf16 as packed halves, bool as one u32 word each,
    /// block types as their packed blocks, padded with zeros to whole 4-byte words.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out: Vec<u8> = match &self.data {
            HostData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::U32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::Bool(v) => v.iter().flat_map(|&x| (x as u32).to_le_bytes()).collect(),
            other => other.blocks().expect("a block type's data").to_vec(),
        };
        out.resize(self.dtype().buffer_bytes(self.shape.numel()), 0);
        out
    }

    /// Reads a tensor of type `ty` from its device storage layout (see [`Self::to_bytes`]).
    pub fn from_bytes(ty: &TensorType, bytes: &[u8]) -> Result<Self> {
        let n = ty.shape.numel();
        if bytes.len() < ty.dtype.data_bytes(n) {
            return Err(IrError::ty("tensor", format!("{} bytes cannot hold {ty}", bytes.len())));
        }
        let word = |i: usize| [bytes[4 * i], bytes[4 * i + 1], bytes[4 * i + 2], bytes[4 * i + 3]];
        let data = match ty.dtype {
            DType::F32 => HostData::F32((0..n).map(|i| f32::from_le_bytes(word(i))).collect()),
            DType::I32 => HostData::I32((0..n).map(|i| i32::from_le_bytes(word(i))).collect()),
            DType::U32 => HostData::U32((0..n).map(|i| u32::from_le_bytes(word(i))).collect()),
            DType::Bool => HostData::Bool((0..n).map(|i| u32::from_le_bytes(word(i)) != 0).collect()),
            DType::F16 => HostData::F16((0..n).map(|i| f16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).collect()),
            DType::BF16 => {
                HostData::BF16((0..n).map(|i| bf16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).collect())
            }
            _ => return HostTensor::from_blocks(ty.dtype, ty.shape.clone(), bytes[..ty.dtype.data_bytes(n)].to_vec()),
        };
        Ok(HostTensor { shape: ty.shape.clone(), data })
    }
}

/// That a tensor of block type `dtype` and `shape` is whole blocks along its last axis.
pub(crate) fn check_blocks(dtype: DType, shape: &Shape) -> Result<()> {
    let (elems, _) = dtype.block().ok_or_else(|| IrError::ty("tensor", format!("{dtype} is not a block type")))?;
    match shape.dims().last() {
        Some(&last) if last % elems == 0 => Ok(()),
        _ => Err(IrError::ty(
            "tensor",
            format!("{dtype}{shape}: a {dtype} tensor's last dimension is whole blocks of {elems}"),
        )),
    }
}
