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
///
/// `Q8_0` and `Q4_0` are llama.cpp's block types, storage only too: each run of 32 elements
/// along the last axis is one block, an f16 scale `d` followed by 32 signed bytes `q`
/// (34 bytes, the value `d·q`) or 32 nibbles `n` (18 bytes, the value `d·(n − 8)`), packed
/// back to back as a GGUF file holds them (see [`crate::quant`]); `Q5_0` likewise holds 5-bit
/// values (22 bytes: the scale, 32 high bits in a word, 32 nibbles; the value `d·(q − 16)`),
/// and `Q4_1` and `Q5_1` a scale and a minimum (20 and 24 bytes, the value `d·q + m`).
/// `IQ4NL` (18 bytes) holds an f16 scale and 32 nibbles that index llama.cpp's table of 16
/// non-uniform levels (`kvalues_iq4nl`), the value `d·table[n]`. A tensor of these types has a
/// last dimension that is a multiple of 32. Its k-quant types are super-blocks of 256
/// elements (a last dimension a multiple of 256): `Q4K` (144 bytes) an f16 scale and min,
/// eight 6-bit sub-block scales and mins and 256 nibbles, the value `d·s·n − dmin·m`; `Q5K`
/// (176 bytes) the same with a fifth bit per value (32 bytes of them before the nibbles);
/// `Q6K` (210 bytes) 6-bit values split in low nibbles and high pairs, sixteen signed 8-bit
/// sub-block scales and an f16 scale, the value `d·s·(q − 32)`; `Q2K` (84 bytes) sixteen
/// 4-bit sub-block scales and mins, 2-bit values and an f16 scale and min, the value
/// `d·s·q − dmin·m`; `Q3K` (110 bytes) 3-bit values as a high-bit mask and low pairs, sixteen
/// 6-bit sub-block scales and an f16 scale, the value `d·(s − 32)·(q − 4)`; `IQ4XS` (136
/// bytes) an f16 scale, eight 6-bit sub-block scales and 256 nibbles indexing `IQ4NL`'s
/// table, the value `d·(s − 32)·table[n]`. `MXFP4` (17 bytes; the OCP microscaling format
/// gpt-oss's experts are stored in) holds an E8M0 scale byte `e` and 32 nibbles of FP4 (E2M1)
/// values, the value `2^(e − 128)·table[n]`, `table` llama.cpp's `kvalues_mxfp4` (E2M1
/// doubled: 0, 1, 2, 3, 4, 6, 8, 12 and their negatives). A kernel reads element `i` from its block as it
/// loads it, so a cast of a block tensor fused into a matmul's operand reads the packed
/// bytes only.
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
    /// Blocks of 32: an f16 scale and 32 signed bytes (storage only, see the type's docs).
    Q8_0,
    /// Blocks of 32: an f16 scale and 32 nibbles offset by 8 (storage only, see the type's
    /// docs).
    Q4_0,
    /// Blocks of 32: an f16 scale and 32 5-bit values offset by 16 (storage only, see the
    /// type's docs).
    Q5_0,
    /// Blocks of 32: an f16 scale and minimum and 32 nibbles (storage only, see the type's
    /// docs).
    Q4_1,
    /// Blocks of 32: an f16 scale and minimum and 32 5-bit values (storage only, see the
    /// type's docs).
    Q5_1,
    /// Super-blocks of 256: 4-bit values with 6-bit sub-block scales and mins (storage only,
    /// see the type's docs).
    Q4K,
    /// Super-blocks of 256: 5-bit values with 6-bit sub-block scales and mins (storage only,
    /// see the type's docs).
    Q5K,
    /// Super-blocks of 256: 6-bit values with 8-bit sub-block scales (storage only, see the
    /// type's docs).
    Q6K,
    /// Super-blocks of 256: 2-bit values with 4-bit sub-block scales and mins (storage only,
    /// see the type's docs).
    Q2K,
    /// Super-blocks of 256: 3-bit values with 6-bit sub-block scales (storage only, see the
    /// type's docs).
    Q3K,
    /// Blocks of 32: an f16 scale and 32 nibbles indexing 16 non-uniform levels (storage
    /// only, see the type's docs).
    IQ4NL,
    /// Super-blocks of 256: nibbles indexing [`DType::IQ4NL`]'s levels with 6-bit sub-block
    /// scales (storage only, see the type's docs).
    IQ4XS,
    /// Blocks of 32: a power-of-two scale byte and 32 FP4 (E2M1) nibbles (storage only, see
    /// the type's docs).
    MXFP4,
}

impl DType {
    /// Every dtype, in a fixed order.
    pub const ALL: [DType; 19] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::U32,
        DType::Bool,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q5_0,
        DType::Q4_1,
        DType::Q5_1,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
        DType::Q2K,
        DType::Q3K,
        DType::IQ4NL,
        DType::IQ4XS,
        DType::MXFP4,
    ];

    /// The dtypes ops compute in (every dtype but the storage-only bf16 and block types).
    pub const COMPUTED: [DType; 5] = [DType::F32, DType::F16, DType::I32, DType::U32, DType::Bool];

    /// The lower-case name used in the text form (`f32`, `f16`, `bf16`, `i32`, `u32`, `bool`,
    /// `q8_0`, `q4_0`, `q5_0`, `q4_1`, `q5_1`, `q4_k`, `q5_k`, `q6_k`, `q2_k`, `q3_k`, `iq4_nl`,
    /// `iq4_xs`, `mxfp4`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::Bool => "bool",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
            DType::Q5_0 => "q5_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_1 => "q5_1",
            DType::Q4K => "q4_k",
            DType::Q5K => "q5_k",
            DType::Q6K => "q6_k",
            DType::Q2K => "q2_k",
            DType::Q3K => "q3_k",
            DType::IQ4NL => "iq4_nl",
            DType::IQ4XS => "iq4_xs",
            DType::MXFP4 => "mxfp4",
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
        self == DType::BF16 || self.block().is_some()
    }

    /// Elements and bytes per block of a block type (llama.cpp's: [`DType::Q8_0`] and the
    /// others after [`DType::Bool`]); `None` for the element types.
    pub fn block(self) -> Option<(usize, usize)> {
        match self {
            DType::Q8_0 => Some((32, 34)),
            DType::Q4_0 => Some((32, 18)),
            DType::Q5_0 => Some((32, 22)),
            DType::Q4_1 => Some((32, 20)),
            DType::Q5_1 => Some((32, 24)),
            DType::Q4K => Some((256, 144)),
            DType::Q5K => Some((256, 176)),
            DType::Q6K => Some((256, 210)),
            DType::Q2K => Some((256, 84)),
            DType::Q3K => Some((256, 110)),
            DType::IQ4NL => Some((32, 18)),
            DType::IQ4XS => Some((256, 136)),
            DType::MXFP4 => Some((32, 17)),
            _ => None,
        }
    }

    /// Whether this is an integer type.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::U32)
    }

    /// Whether arithmetic (add, mul, reductions, matmul) is defined on this type.
    pub fn is_numeric(self) -> bool {
        !matches!(self, DType::Bool) && !self.is_storage_only()
    }

    /// Bytes `numel` elements occupy, packed (see the type's docs for the layouts; a block
    /// type's whole blocks).
    pub fn data_bytes(self, numel: usize) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2 * numel,
            DType::F32 | DType::I32 | DType::U32 | DType::Bool => 4 * numel,
            _ => {
                let (elems, bytes) = self.block().expect("a block type");
                numel.div_ceil(elems) * bytes
            }
        }
    }

    /// Bytes a tensor of `numel` elements occupies on the device, rounded up to whole 4-byte
    /// words (the granularity of WGSL storage and of buffer copies).
    pub fn buffer_bytes(self, numel: usize) -> usize {
        self.data_bytes(numel).div_ceil(4) * 4
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
        DType::ALL.into_iter().find(|d| d.name() == s).ok_or_else(|| {
            let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
            format!("unknown dtype `{s}` (expected one of {})", names.join(", "))
        })
    }
}
