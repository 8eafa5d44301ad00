//! Element types.

use std::fmt;
use std::str::FromStr;

/// The element type of a tensor.
///
/// Storage on the device: `F32`, `I32`, `U32` take 4 bytes; `F16` takes 2 bytes (as WGSL `f16`
/// where the adapter has `SHADER_F16`, otherwise two halves packed in one `u32`); `BF16` takes
/// 2 bytes (two to a `u32`); `Bool` takes a whole 4-byte word (0 or 1) because WGSL has no
/// byte-addressable storage.
///
/// `BF16` is a storage type: parameters and inputs hold it (half the bytes of f32, the
/// weights of most checkpoints as written), and the one op that takes it is
/// [`crate::Op::Cast`] to a computing float type — exact, since a bf16 is the top half of an
/// f32. WGSL has no bf16 arithmetic; a kernel widens the bits as it loads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16 (`half::f16` on the host).
    F16,
    /// bfloat16, the top half of a binary32 (`half::bf16` on the host): storage only (see
    /// the type's docs).
    BF16,
    /// Two's complement 32-bit signed integer.
    I32,
    /// 32-bit unsigned integer.
    U32,
    /// Boolean.
    Bool,
}

impl DType {
    /// Every dtype, in a fixed order.
    pub const ALL: [DType; 6] = [DType::F32, DType::F16, DType::BF16, DType::I32, DType::U32, DType::Bool];

    /// The dtypes ops compute in (every dtype but the storage-only [`DType::BF16`]).
    pub const COMPUTED: [DType; 5] = [DType::F32, DType::F16, DType::I32, DType::U32, DType::Bool];

    /// The lower-case name used in the text form (`f32`, `f16`, `bf16`, `i32`, `u32`, `bool`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::Bool => "bool",
        }
    }

    /// Whether this is a floating-point type that ops compute in (not the storage-only
    /// [`DType::BF16`]).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16)
    }

    /// Whether values of this type are stored only, never computed with: the one op that
    /// reads them is a cast.
    pub fn is_storage_only(self) -> bool {
        self == DType::BF16
    }

    /// Whether this is an integer type.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::U32)
    }

    /// Whether arithmetic (add, mul, reductions, matmul) is defined on this type.
    pub fn is_numeric(self) -> bool {
        !matches!(self, DType::Bool | DType::BF16)
    }

    /// Bytes one element occupies on the device (see the type's docs for the layouts).
    pub fn storage_bytes(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            _ => 4,
        }
    }

    /// Bytes a tensor of `numel` elements occupies on the device, rounded up to whole 4-byte
    /// words (the granularity of WGSL storage and of buffer copies).
    pub fn buffer_bytes(self, numel: usize) -> usize {
        (numel * self.storage_bytes()).div_ceil(4) * 4
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown dtype `{s}` (expected f32, f16, bf16, i32, u32 or bool)"))
    }
}
