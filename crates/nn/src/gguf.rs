//! GGUF files, llama.cpp's format (version 3, and 2 which differs only in nothing read
//! here): the header, the metadata, the tensor infos and the aligned data section,
//! memory-mapped. Tensors of type F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, IQ4_NL, Q2_K,
//! Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS and MXFP4 are read ([`GGML_TYPES`]), each as the IR's type of the
//! same layout (blocks as the file holds them); dequantized, they
//! are exactly what the `gguf` package's reference code gives (each scale product rounded
//! to f32 before it meets a value).
//!
//! Every tensor's type, offset (aligned, within the file) and byte size are checked when the
//! file is opened, so a bad file is a typed error ([`NnError::Gguf`]) naming the tensor
//! before anything is read.

use crate::checkpoint::Quantize;
use crate::error::{NnError, Result};
use crate::llama::{Architecture, Llama, LlamaConfig, Norms};
use crate::module::{Matrices, Module, Scope};
use fusegraph_ir::{bf16, f16, DType, HostTensor};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// Unsigned integers (`uint8` … `uint64`).
    Uint(u64),
    /// Signed integers (`int8` … `int64`).
    Int(i64),
    /// `float32` and `float64`.
    Float(f64),
    /// `bool`.
    Bool(bool),
    /// `string`.
    String(String),
    /// `array`.
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::Uint(v) => Some(v),
            GgufValue::Int(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::Uint(v) => Some(v as f64),
            GgufValue::Int(v) => Some(v as f64),
            GgufValue::Float(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }
}

/// GGML's type ids of the tensor types read, each with the IR's dtype of the same layout
/// (blocks as the file holds them).
pub const GGML_TYPES: [(u32, DType); 16] = [
    (0, DType::F32),
    (1, DType::F16),
    (2, DType::Q4_0),
    (3, DType::Q4_1),
    (6, DType::Q5_0),
    (7, DType::Q5_1),
    (8, DType::Q8_0),
    (10, DType::Q2K),
    (11, DType::Q3K),
    (12, DType::Q4K),
    (13, DType::Q5K),
    (14, DType::Q6K),
    (20, DType::IQ4NL),
    (39, DType::MXFP4),
    (23, DType::IQ4XS),
    (30, DType::BF16),
];

/// The dtype of GGML's type `id`, if it is read ([`GGML_TYPES`]).
pub fn ggml_type(id: u32) -> Option<DType> {
    GGML_TYPES.iter().find(|(i, _)| *i == id).map(|(_, d)| *d)
}

/// Elements and bytes of `dtype`'s unit in a file: a block, or one element.
fn unit(dtype: DType) -> (usize, usize) {
    dtype.block().unwrap_or((1, dtype.data_bytes(1)))
}

/// A tensor's entry in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// Its name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Its dims, outermost first (the file lists them innermost first).
    pub dims: Vec<usize>,
    /// Its type.
    pub ty: DType,
    /// Its data's offset from the data section's start.
    pub offset: usize,
}

impl TensorInfo {
    /// Its element count.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    /// Its data's size in bytes.
    pub fn bytes(&self) -> usize {
        let (block, bytes) = unit(self.ty);
        self.numel() / block * bytes
    }
}

/// An open GGUF file: its metadata and tensor infos read and checked, the data mapped.
pub struct Gguf {
    path: PathBuf,
    map: memmap2::Mmap,
    /// The format version (2 or 3).
    pub version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<TensorInfo>,
    data: usize,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf").field("path", &self.path).field("tensors", &self.tensors.len()).finish()
    }
}

/// A little-endian reader over the header, naming the file in its errors.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    file: &'a Path,
}

impl Reader<'_> {
    fn err(&self, tensor: Option<&str>, detail: impl Into<String>) -> NnError {
        NnError::Gguf {
            file: self.file.display().to_string(),
            tensor: tensor.map(str::to_string),
            detail: detail.into(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| self.err(None, format!("the header ends early (at byte {})", self.at)))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    fn len(&mut self) -> Result<usize> {
        let n = self.u64()?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.bytes.len())
            .ok_or_else(|| self.err(None, format!("a length of {n}")))
    }

    fn string(&mut self) -> Result<String> {
        let n = self.len()?;
        let s = self.take(n)?;
        String::from_utf8(s.to_vec()).map_err(|_| self.err(None, "a string that is not UTF-8"))
    }

    fn value(&mut self, ty: u32) -> Result<GgufValue> {
        let word16 = |r: &mut Self| -> Result<u16> { Ok(u16::from_le_bytes(r.take(2)?.try_into().expect("2 bytes"))) };
        Ok(match ty {
            0 => GgufValue::Uint(self.take(1)?[0] as u64),
            1 => GgufValue::Int(self.take(1)?[0] as i8 as i64),
            2 => GgufValue::Uint(word16(self)? as u64),
            3 => GgufValue::Int(word16(self)? as i16 as i64),
            4 => GgufValue::Uint(self.u32()? as u64),
            5 => GgufValue::Int(self.u32()? as i32 as i64),
            6 => GgufValue::Float(f32::from_bits(self.u32()?) as f64),
            7 => GgufValue::Bool(self.take(1)?[0] != 0),
            8 => GgufValue::String(self.string()?),
            9 => {
                let elem = self.u32()?;
                let n = self.len()?;
                GgufValue::Array((0..n).map(|_| self.value(elem)).collect::<Result<_>>()?)
            }
            10 => GgufValue::Uint(self.u64()?),
            11 => GgufValue::Int(self.u64()? as i64),
            12 => GgufValue::Float(f64::from_bits(self.u64()?)),
            other => return Err(self.err(None, format!("metadata value type {other}"))),
        })
    }
}

impl Gguf {
    /// Opens `path` and checks its header: the magic `GGUF`, version 2 or 3, every tensor's
    /// type known, its offset aligned (`general.alignment`, 32 by default) and its data
    /// within the file.
    pub fn open(path: &Path) -> Result<Gguf> {
        let file = std::fs::File::open(path).map_err(|source| {
            NnError::Checkpoint(fusegraph_ir::safetensors::SafetensorsError::Io { path: path.to_path_buf(), source })
        })?;
        // SAFETY: read-only map; a file changed by another process while open is outside
        // what this reader supports (as for every mmap reader).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| {
            NnError::Checkpoint(fusegraph_ir::safetensors::SafetensorsError::Io { path: path.to_path_buf(), source })
        })?;
        let mut r = Reader { bytes: &map, at: 0, file: path };
        if r.take(4).ok() != Some(b"GGUF".as_slice()) {
            return Err(r.err(None, "not a GGUF file (its magic is not `GGUF`)"));
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(r.err(None, format!("version {version}; versions 2 and 3 are read")));
        }
        let (tensor_count, kv_count) = (r.len()?, r.len()?);
        let mut metadata = BTreeMap::new();
        for _ in 0..kv_count {
            let key = r.string()?;
            let ty = r.u32()?;
            metadata.insert(key, r.value(ty)?);
        }
        let mut tensors = Vec::with_capacity(tensor_count);
        for _ in 0..tensor_count {
            let name = r.string()?;
            let n_dims = r.u32()? as usize;
            let mut dims = (0..n_dims).map(|_| r.len()).collect::<Result<Vec<_>>>()?;
            dims.reverse();
            let id = r.u32()?;
            let offset = r.len()?;
            let ty = ggml_type(id).ok_or_else(|| {
                let read: Vec<String> = GGML_TYPES.iter().map(|(_, d)| d.name().to_uppercase()).collect();
                r.err(Some(&name), format!("type id {id}; {} are read", read.join(", ")))
            })?;
            tensors.push(TensorInfo { name, dims, ty, offset });
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => {
                v.as_u64().filter(|&a| a > 0).ok_or_else(|| r.err(None, format!("general.alignment {v:?}")))? as usize
            }
        };
        let data = r.at.div_ceil(alignment) * alignment;
        for t in &tensors {
            let (block, _) = unit(t.ty);
            if t.numel() % block != 0 {
                return Err(
                    r.err(Some(&t.name), format!("{} elements are not whole {} blocks of {block}", t.numel(), t.ty))
                );
            }
            if t.offset % alignment != 0 {
                return Err(r.err(
                    Some(&t.name),
                    format!("offset {} is not a multiple of the alignment {alignment}", t.offset),
                ));
            }
            let end = data.checked_add(t.offset).and_then(|s| s.checked_add(t.bytes()));
            if end.is_none_or(|e| e > map.len()) {
                return Err(r.err(
                    Some(&t.name),
                    format!("{} bytes at offset {} run past the file's end ({} bytes)", t.bytes(), t.offset, map.len()),
                ));
            }
        }
        Ok(Gguf { path: path.to_path_buf(), version, metadata, tensors, data, map })
    }

    /// The metadata, by key.
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    /// The tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor `name` in its own type (a block type's blocks as the file holds them).
    pub fn tensor(&self, name: &str) -> Result<HostTensor> {
        let t = self.tensors.iter().find(|t| t.name == name).ok_or_else(|| NnError::Gguf {
            file: self.path.display().to_string(),
            tensor: Some(name.to_string()),
            detail: "no such tensor".into(),
        })?;
        let raw = &self.map[self.data + t.offset..self.data + t.offset + t.bytes()];
        let dims = t.dims.clone();
        let pairs = || raw.chunks_exact(2).map(|c| [c[0], c[1]]);
        Ok(match t.ty {
            DType::F32 => HostTensor::new(
                dims,
                raw.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4"))).collect::<Vec<_>>(),
            ),
            DType::F16 => HostTensor::new(dims, pairs().map(f16::from_le_bytes).collect::<Vec<_>>()),
            DType::BF16 => HostTensor::new(dims, pairs().map(bf16::from_le_bytes).collect::<Vec<_>>()),
            blocks => HostTensor::from_blocks(blocks, dims, raw.to_vec()),
        }?)
    }
}

/// `transformers`' name of each part of a Llama layer, and llama.cpp's.
const LAYER_PARTS: [(&str, &str); 32] = [
    ("input_layernorm", "attn_norm"),
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("self_attn.qkv_proj", "attn_qkv"),
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
    ("post_attention_layernorm", "ffn_norm"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.gate_up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
    ("mlp.gate", "ffn_gate_inp"),
    ("mlp.experts.gate_proj", "ffn_gate_exps"),
    ("mlp.experts.up_proj", "ffn_up_exps"),
    ("mlp.experts.down_proj", "ffn_down_exps"),
    ("mlp.shared_expert.gate_proj", "ffn_gate_shexp"),
    ("mlp.shared_expert.up_proj", "ffn_up_shexp"),
    ("mlp.shared_expert.down_proj", "ffn_down_shexp"),
    ("mlp.shared_expert_gate", "ffn_gate_inp_shexp"),
    ("mlp.router", "ffn_gate_inp"),
    ("mlp.experts.gate_up_proj", "ffn_gate_exps"),
    ("mlp.shared_experts.gate_proj", "ffn_gate_shexp"),
    ("mlp.shared_experts.up_proj", "ffn_up_shexp"),
    ("mlp.shared_experts.down_proj", "ffn_down_shexp"),
    // DeepSeek's latent attention (`attn_kv_b` split in newer files: see `latent_up`).
    ("self_attn.q_a_proj", "attn_q_a"),
    ("self_attn.q_a_layernorm", "attn_q_a_norm"),
    ("self_attn.q_b_proj", "attn_q_b"),
    ("self_attn.kv_a_proj_with_mqa", "attn_kv_a_mqa"),
    ("self_attn.kv_a_layernorm", "attn_kv_a_norm"),
    ("self_attn.kv_b_proj", "attn_kv_b"),
];

/// The norms after each branch (Gemma's and OLMo 2's, [`Norms`]), whose
/// `post_attention_layernorm` is the attention output's norm, not the MLP input's.
const SANDWICH_NORMS: [(&str, &str); 3] = [
    ("post_attention_layernorm", "post_attention_norm"),
    ("pre_feedforward_layernorm", "ffn_norm"),
    ("post_feedforward_layernorm", "post_ffw_norm"),
];

/// Whether a model's norms take the names of norms after a branch ([`SANDWICH_NORMS`]):
/// Gemma's and OLMo's, and Seed-OSS's and gpt-oss's MLP input norm, which llama.cpp names
/// `post_attention_norm` too.
fn post_norm_names(c: &LlamaConfig) -> bool {
    c.norms != Norms::Pre
        || matches!(c.architecture, Architecture::SeedOss | Architecture::GptOss | Architecture::Glm4Moe)
}

/// llama.cpp's name of the parameter `transformers` calls `path` (in a model with norms after
/// each branch where `sandwich`).
fn gguf_name(path: &str, sandwich: bool) -> Option<String> {
    match path {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = path.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    // gpt-oss's sinks and expert stacks (its gate and up one stack here, two in the file:
    // this names the gate's, [`interleaved_up`] the up's).
    let own = match rest {
        "self_attn.sinks" => Some("attn_sinks.weight"),
        "mlp.experts.gate_up_proj" => Some("ffn_gate_exps.weight"),
        "mlp.experts.gate_up_proj_bias" => Some("ffn_gate_exps.bias"),
        "mlp.experts.down_proj" => Some("ffn_down_exps.weight"),
        "mlp.experts.down_proj_bias" => Some("ffn_down_exps.bias"),
        "mlp.gate.e_score_correction_bias" | "mlp.moe_statics.e_score_correction_bias" => Some("exp_probs_b.bias"),
        _ => None,
    };
    if let Some(own) = own {
        return Some(format!("blk.{layer}.{own}"));
    }
    let (part, kind) = rest.rsplit_once('.')?;
    let sandwiched = SANDWICH_NORMS.iter().filter(|_| sandwich);
    let (_, gg) = sandwiched.chain(LAYER_PARTS.iter()).find(|(hf, _)| *hf == part)?;
    Some(format!("blk.{layer}.{gg}.{kind}"))
}

/// The up stack's name beside the gate stack `name` where a parameter holds both, and
/// whether it interleaves their rows (gpt-oss's `gate_up_proj`: the gate's even, the up's odd)
/// or stacks them (Granite MoE's `gate_up_proj.weight` and Llama 4's `gate_up_proj`: the
/// gate's first); `c` the model.
fn joined_up(path: &str, name: &str, c: &LlamaConfig) -> Option<(String, bool)> {
    let up = || name.replace("ffn_gate_exps", "ffn_up_exps");
    match path {
        _ if path.ends_with("mlp.experts.gate_up_proj") || path.ends_with("mlp.experts.gate_up_proj_bias") => {
            Some((up(), c.architecture != Architecture::Llama4))
        }
        _ if path.ends_with("mlp.experts.gate_up_proj.weight") => Some((up(), false)),
        _ => None,
    }
}

/// `a` and `b` (of one type and shape `[.., n, ..]`) joined along `axis`, `[.., 2n, ..]`:
/// interleaved (`a`'s entry `i` at `2i`, `b`'s at `2i + 1`) or, not, `a`'s entries before
/// `b`'s. Whole entries move as their bytes (a block type's rows where `axis` is not the last).
fn join(a: &HostTensor, b: &HostTensor, axis: usize, interleaved: bool) -> Result<HostTensor> {
    let dims = a.shape().dims();
    if a.ty() != b.ty() || axis >= dims.len() {
        return Err(NnError::Config(format!("GGUF: cannot interleave {} with {} along axis {axis}", a.ty(), b.ty())));
    }
    let unit = a.dtype().data_bytes(dims[axis + 1..].iter().product()) * if interleaved { 1 } else { dims[axis] };
    let (ab, bb) = (a.to_bytes(), b.to_bytes());
    let mut out = Vec::with_capacity(2 * ab.len());
    for (x, y) in ab.chunks_exact(unit).zip(bb.chunks_exact(unit)) {
        out.extend_from_slice(x);
        out.extend_from_slice(y);
    }
    let mut doubled = dims.to_vec();
    doubled[axis] *= 2;
    Ok(HostTensor::from_bytes(&fusegraph_ir::TensorType::new(a.dtype(), doubled), &out)?)
}

/// The rows of a q or k projection `[n · 2 · h, cols]` back in `transformers`' order from the
/// order llama.cpp's converter writes (`permute`: within each of the `n` heads, the two
/// rotary halves interleaved). Rows move as their bytes (a block type's rows are whole
/// blocks).
fn unpermute(t: &HostTensor, n: usize) -> Result<HostTensor> {
    let (rows, cols) = (t.shape().dims()[0], t.shape().dims()[1]);
    if n == 0 || rows % (2 * n) != 0 {
        return Err(NnError::Config(format!("GGUF: {rows} rows of a q/k projection do not split into {n} heads")));
    }
    let h = rows / n / 2;
    let (bytes, row) = (t.to_bytes(), t.dtype().data_bytes(cols));
    let mut out = vec![0; bytes.len()];
    for a in 0..n {
        for b in 0..2 {
            for j in 0..h {
                let (to, from) = (a * 2 * h + b * h + j, a * 2 * h + j * 2 + b);
                out[to * row..(to + 1) * row].copy_from_slice(&bytes[from * row..(from + 1) * row]);
            }
        }
    }
    Ok(HostTensor::from_bytes(&t.ty(), &out)?)
}

/// `fields` (an object) added to the object `json`, replacing its entries of the same names.
fn merge(json: &mut serde_json::Value, fields: serde_json::Value) {
    if let (Some(object), serde_json::Value::Object(fields)) = (json.as_object_mut(), fields) {
        object.extend(fields);
    }
}

impl Gguf {
    fn error(&self, tensor: Option<&str>, detail: impl Into<String>) -> NnError {
        NnError::Gguf {
            file: self.path.display().to_string(),
            tensor: tensor.map(str::to_string),
            detail: detail.into(),
        }
    }

    /// The Llama-family model of a `llama`-, `qwen2`-, `qwen3`-, `gemma2`-, `gemma3`-,
    /// `phi3`-, `smollm3`-, `granite`-, `olmo2`-, `seed_oss`-, `ernie4_5`-, `glm4`-,
    /// `mistral3`-, `qwen2moe`-, `qwen3moe`-, `olmoe`-, `gpt-oss`-, `glm4moe`-, `ernie4_5-moe`-, `granitemoe`-, `deepseek2`-, `minimax-m2`- or `llama4`-architecture file (a `llama`
    /// file with `expert_count` is Mixtral's; a mixture's expert stacks `ffn_{gate,up,down}_exps`
    /// load as [`crate::feed_forward::StackedLinear`]s, as llama.cpp reads them: see
    /// `moe_fields`; gpt-oss's gate and up stacks interleave into its one `gate_up_proj`)
    /// (`general.architecture`:
    /// a `LlamaForCausalLM` — SmolLM3's and Granite's are converted as Llama's —, a
    /// `Qwen2ForCausalLM`, whose q, k and v biases the file holds, a `Qwen3ForCausalLM`, whose
    /// q and k norms it holds, a `Gemma2ForCausalLM` or `Gemma3ForCausalLM`, its norms' gains
    /// as the weights, or a
    /// `Phi3ForCausalLM`, its projections fused as `attn_qkv` and `ffn_up`), its shape from the
    /// `{architecture}.*` metadata, and its
    /// parameters' values under `transformers`' names: a `llama` file's q and k rows back in
    /// `transformers`' order, projections transposed to [`crate::Linear`]'s
    /// layout. Parameters are stored as `dtype` (f32 by default, which holds every
    /// dequantized value exactly) and matrices as `quantize` says: by default a block-type
    /// matrix keeps its blocks as the file holds them (`[out, in]`, see [`crate::Matrices`]).
    /// Every parameter is checked before anything is returned: a missing tensor, a misshapen
    /// one, or one the model has no place for is an error naming it.
    pub fn llama(&self, dtype: Option<DType>, quantize: Quantize) -> Result<(Llama, BTreeMap<String, HostTensor>)> {
        let config = self.llama_config()?;
        let matrices = match quantize {
            Quantize::AsStored => {
                let by_path = Llama::new(&Scope::root(), config.clone())?
                    .params()
                    .iter()
                    .filter_map(|p| {
                        let name = gguf_name(p.path(), post_norm_names(&config));
                        let info = self.tensors.iter().find(|t| Some(&t.name) == name.as_ref())?;
                        let d = Some(info.ty).filter(|d| d.block().is_some())?;
                        Some((p.path().to_string(), d))
                    })
                    .collect();
                Matrices::ByPath(std::sync::Arc::new(by_path))
            }
            other => other.matrices()?,
        };
        let dtype = crate::checkpoint::parameter_dtype(dtype.unwrap_or(DType::F32))?;
        let scope = Scope::root().storing(dtype).storing_matrices(matrices);
        let model = Llama::new(&scope, config)?;
        let c = &model.config;
        let file = self.path.display().to_string();
        // llama.cpp's converter interleaves q and k rows for the rotary layout of the
        // architectures it converts as Llama's.
        let permuted = matches!(self.architecture(), "llama" | "smollm3" | "granite" | "granitemoe" | "mistral3");
        let mut used: std::collections::BTreeSet<String> =
            ["rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"].map(String::from).into();
        let mut out = BTreeMap::new();
        for p in model.params() {
            let name = gguf_name(p.path(), post_norm_names(c))
                .ok_or_else(|| NnError::Config(format!("GGUF: no name for `{}`", p.path())))?;
            let want = p.ty();
            let split = name.ends_with("attn_kv_b.weight") && !self.tensors.iter().any(|t| t.name == name);
            let mut t = match split {
                // A latent up-projection stored as llama.cpp's converter splits it.
                true => self.latent_up(&name, c, &mut used)?,
                false if !self.tensors.iter().any(|t| t.name == name) => {
                    let expected = Some(p.ty().clone());
                    return Err(NnError::MissingKey { key: name, param: p.path().into(), expected, file });
                }
                false => self.tensor(&name)?,
            };
            if let Some((up, interleaved)) = joined_up(p.path(), &name, c) {
                if !self.tensors.iter().any(|t| t.name == up) {
                    let expected = Some(p.ty().clone());
                    return Err(NnError::MissingKey { key: up, param: p.path().into(), expected, file });
                }
                t = join(&t, &self.tensor(&up)?, 1, interleaved)?;
                used.insert(up);
            }
            if permuted && name.ends_with("attn_q.weight") {
                t = unpermute(&t, c.num_attention_heads)?;
            } else if permuted && name.ends_with("attn_k.weight") {
                t = unpermute(&t, c.num_key_value_heads)?;
            }
            if t.dtype().block().is_some() && t.dtype() != want.dtype {
                t = HostTensor::from_f64(DType::F32, t.shape().clone(), &t.to_f64())?;
            }
            // Linear weights (and each expert's of a stack) are `[in, out]` unless of a block
            // type; a shared expert's gate may be stored as a vector.
            let path = p.path();
            let projection = path.ends_with("_proj.weight")
                || path.ends_with("_proj_with_mqa.weight")
                || path.ends_with("_proj")
                || path == "lm_head.weight"
                || path.ends_with("mlp.gate.weight")
                || path.ends_with("mlp.router.weight")
                || path.ends_with("shared_expert_gate.weight");
            // A vector read as a one-row matrix (a shared expert's gate; ERNIE's correction bias).
            if t.shape().rank() == 1 && want.shape.rank() == 2 && want.shape.numel() == t.shape().numel() {
                t = HostTensor::from_bytes(
                    &fusegraph_ir::TensorType::new(t.dtype(), [1, t.shape().numel()]),
                    &t.to_bytes(),
                )?;
            }
            if projection && t.shape().rank() >= 2 && want.dtype.block().is_none() {
                t = crate::checkpoint::transpose_matrices(&t)?;
            }
            if t.shape() != &want.shape {
                let (expected, got) = (Box::new(want.clone()), Box::new(t.ty()));
                return Err(NnError::KeyShape { key: name, param: p.path().into(), expected, got, file });
            }
            if t.dtype() != want.dtype {
                t = HostTensor::from_f64(want.dtype, want.shape.clone(), &t.to_f64())?;
            }
            used.insert(name);
            out.insert(p.path().to_string(), t);
        }
        // Multi-token-prediction layers after the decoder's (GLM-4.5's) are not read.
        let layers = c.num_hidden_layers;
        let mtp = |name: &str| (layers..layers + c.mtp_layers).any(|i| name.starts_with(&format!("blk.{i}.")));
        if let Some(t) = self.tensors.iter().find(|t| !used.contains(&t.name) && !mtp(&t.name)) {
            return Err(NnError::UnknownKey { key: t.name.clone(), file });
        }
        Ok((model, out))
    }

    /// A latent attention's `kv_b_proj` (`[heads · (nope + v), kv_lora_rank]`, f32) from the
    /// two tensors llama.cpp's converter splits it into: `attn_k_b` (`[heads, kv_lora_rank,
    /// nope]`, each head's key part transposed) and `attn_v_b` (`[heads, v, kv_lora_rank]`),
    /// dequantized (the key part's blocks run along the other axis); both marked `used`.
    fn latent_up(
        &self,
        name: &str,
        c: &LlamaConfig,
        used: &mut std::collections::BTreeSet<String>,
    ) -> Result<HostTensor> {
        let l = c.latent.ok_or_else(|| self.error(Some(name), "no latent attention in this model"))?;
        let (heads, rank, nope, v) = (c.num_attention_heads, l.kv_lora_rank, l.qk_nope_head_dim, l.v_head_dim);
        let mut part = |suffix: &str, dims: [usize; 3]| -> Result<Vec<f64>> {
            let key = name.replace("attn_kv_b", suffix);
            if !self.tensors.iter().any(|t| t.name == key) {
                let detail = format!("missing: neither `{name}` nor `{key}` (with its pair) is in the file");
                return Err(self.error(Some(&key), detail));
            }
            let t = self.tensor(&key)?;
            if t.shape().dims() != dims {
                return Err(self.error(Some(&key), format!("{} where the model needs {dims:?}", t.ty())));
            }
            used.insert(key);
            Ok(t.to_f64())
        };
        let (k, vb) = (part("attn_k_b", [heads, rank, nope])?, part("attn_v_b", [heads, v, rank])?);
        let mut out = Vec::with_capacity(heads * (nope + v) * rank);
        for h in 0..heads {
            for j in 0..nope {
                out.extend((0..rank).map(|r| k[(h * rank + r) * nope + j]));
            }
            out.extend_from_slice(&vb[h * v * rank..(h + 1) * v * rank]);
        }
        Ok(HostTensor::from_f64(DType::F32, [heads * (nope + v), rank], &out)?)
    }

    /// `general.architecture`, or `(missing)`.
    fn architecture(&self) -> &str {
        self.metadata.get("general.architecture").and_then(GgufValue::as_str).unwrap_or("(missing)")
    }

    /// The model's shape from the `{architecture}.*` metadata, as a `transformers` config
    /// would give it; `rope_freqs` (llama3 scaling as the converter stores it) as the
    /// frequencies' divisors.
    fn llama_config(&self) -> Result<LlamaConfig> {
        let m = &self.metadata;
        let arch = self.architecture();
        let architecture = match arch {
            "llama" => "LlamaForCausalLM",
            "qwen2" => "Qwen2ForCausalLM",
            "qwen3" => "Qwen3ForCausalLM",
            "gemma3" => "Gemma3ForCausalLM",
            "gemma2" => "Gemma2ForCausalLM",
            "phi3" => "Phi3ForCausalLM",
            "smollm3" => "SmolLM3ForCausalLM",
            "granite" => "GraniteForCausalLM",
            "granitemoe" => "GraniteMoeForCausalLM",
            "olmo2" => "Olmo2ForCausalLM",
            "seed_oss" => "SeedOssForCausalLM",
            "ernie4_5" => "Ernie4_5ForCausalLM",
            "glm4" => "Glm4ForCausalLM",
            "mistral3" => "Ministral3ForCausalLM",
            "qwen2moe" => "Qwen2MoeForCausalLM",
            "qwen3moe" => "Qwen3MoeForCausalLM",
            "olmoe" => "OlmoeForCausalLM",
            "gpt-oss" => "GptOssForCausalLM",
            "glm4moe" => "Glm4MoeForCausalLM",
            "ernie4_5-moe" => "Ernie4_5_MoeForCausalLM",
            // DeepSeek-V3's sigmoid gating (2), else V2's softmax.
            "deepseek2" if m.get("deepseek2.expert_gating_func").and_then(GgufValue::as_u64) == Some(2) => {
                "DeepseekV3ForCausalLM"
            }
            "deepseek2" => "DeepseekV2ForCausalLM",
            "minimax-m2" => "MiniMaxM2ForCausalLM",
            "llama4" => "Llama4ForCausalLM",
            _ => {
                return Err(NnError::ConfigField {
                    field: "general.architecture".into(),
                    value: arch.into(),
                    supported:
                        "llama, qwen2, qwen3, gemma2, gemma3, phi3, smollm3, granite, olmo2, seed_oss, ernie4_5, \
                            glm4, mistral3, qwen2moe, qwen3moe, olmoe, gpt-oss, glm4moe, ernie4_5-moe, granitemoe, \
                            deepseek2, minimax-m2 or llama4"
                            .into(),
                })
            }
        };
        let get = |k: &str| m.get(&format!("{arch}.{k}"));
        let int = |k: &str| get(k).and_then(GgufValue::as_u64);
        // A `llama` file with experts is Mixtral's.
        let experts = int("expert_count").filter(|&n| n > 0);
        let architecture = if arch == "llama" && experts.is_some() { "MixtralForCausalLM" } else { architecture };
        let moe = self.moe_fields(arch)?;
        let need = |k: &str| int(k).ok_or_else(|| self.error(None, format!("metadata `{arch}.{k}` is missing")));
        let (heads, hidden) = (need("attention.head_count")?, need("embedding_length")?);
        let tied = !self.tensors.iter().any(|t| t.name == "output.weight");
        let vocab = int("vocab_size").or_else(|| {
            self.tensors.iter().find(|t| t.name == "token_embd.weight").and_then(|t| t.dims.first()).map(|&d| d as u64)
        });
        let scaling = match get("rope.scaling.type").and_then(GgufValue::as_str) {
            None | Some("none") => serde_json::Value::Null,
            Some("linear") => {
                let factor = get("rope.scaling.factor").and_then(GgufValue::as_f64).unwrap_or(1.0);
                serde_json::json!({ "rope_type": "linear", "factor": factor })
            }
            // As llama.cpp reads YaRN: its cos and sin scale is `yarn_attn_factor` (1 where
            // absent) times YaRN's own `0.1 ln(factor) + 1`.
            Some("yarn") => {
                let factor = get("rope.scaling.factor").and_then(GgufValue::as_f64).unwrap_or(1.0);
                let ext = get("rope.scaling.yarn_ext_factor").and_then(GgufValue::as_f64);
                if ext.is_some_and(|e| e != 1.0) {
                    return Err(NnError::ConfigField {
                        field: format!("{arch}.rope.scaling.yarn_ext_factor"),
                        value: format!("{}", ext.unwrap_or_default()),
                        supported: "1 (YaRN's ramp as it is)".into(),
                    });
                }
                let attn = get("rope.scaling.yarn_attn_factor").and_then(GgufValue::as_f64).unwrap_or(1.0);
                let mscale = |m: f64| if factor > 1.0 { 0.1 * m * factor.ln() + 1.0 } else { 1.0 };
                let log_mul = get("rope.scaling.yarn_log_multiplier").and_then(GgufValue::as_f64);
                // A log multiplier (Ministral 3's `mscale_all_dim`) divides it out; DeepSeek's
                // (`0.1 · mscale_all_dim` there) leaves cos and sin unscaled, as llama.cpp
                // runs it, and scales the scores by its `mscale²`.
                let (mscale, all_dim) = match (log_mul, arch) {
                    (Some(mul), "deepseek2") => (1.0, Some(mul / 0.1)),
                    (Some(all), _) => (mscale(1.0) / mscale(all), None),
                    (None, _) => (mscale(1.0), None),
                };
                serde_json::json!({
                    "rope_type": "yarn",
                    "factor": factor,
                    "original_max_position_embeddings": need("rope.scaling.original_context_length")?,
                    "attention_factor": attn * mscale,
                    "mscale_all_dim": all_dim,
                    "beta_fast": get("rope.scaling.yarn_beta_fast").and_then(GgufValue::as_f64),
                    "beta_slow": get("rope.scaling.yarn_beta_slow").and_then(GgufValue::as_f64),
                    "llama_4_scaling_beta": get("attention.temperature_scale").and_then(GgufValue::as_f64),
                })
            }
            Some(other) => {
                return Err(NnError::ConfigField {
                    field: format!("{arch}.rope.scaling.type"),
                    value: other.into(),
                    supported: "none, linear or yarn (llama3 scaling comes as rope_freqs)".into(),
                })
            }
        };
        let token = |k: &str| m.get(&format!("tokenizer.ggml.{k}")).and_then(GgufValue::as_u64);
        let blocks = need("block_count")?;
        let phi3 = arch == "phi3";
        // A `phi3` file's rotary width is part of each head (`partial_rotary_factor`).
        let head_dim = match phi3 {
            true => int("attention.key_length").unwrap_or(hidden / heads.max(1)),
            false => int("attention.key_length").or(int("rope.dimension_count")).unwrap_or(hidden / heads.max(1)),
        };
        // The rotated part of each head where the architecture rotates only part (Phi-3, GLM-4).
        let partial = int("rope.dimension_count")
            .filter(|_| phi3 || matches!(arch, "glm4" | "glm4moe" | "minimax-m2"))
            .map(|r| r as f64 / head_dim.max(1) as f64);
        // Phi-3.5's longrope, as the converter writes it: the factors as two tensors, the
        // trained context and the attention factor as metadata.
        let has = |name: &str| self.tensors.iter().any(|t| t.name == name);
        let scaling = match has("rope_factors_long.weight") || has("rope_factors_short.weight") {
            true => {
                let factors = |name: &str| match has(name) {
                    true => Ok(self.tensor(name)?.to_f64()),
                    false => Err(self.error(Some(name), "missing beside its long or short counterpart")),
                };
                let original = need("rope.scaling.original_context_length")?;
                serde_json::json!({
                    "rope_type": "longrope",
                    "long_factor": factors("rope_factors_long.weight")?,
                    "short_factor": factors("rope_factors_short.weight")?,
                    "original_max_position_embeddings": original,
                    "attention_factor": get("rope.scaling.attn_factor").and_then(GgufValue::as_f64),
                })
            }
            false => scaling,
        };
        // What llama.cpp assumes of a `gemma3` file: every sixth layer global, the others a
        // window (where the file gives one) with a rotary base of 10,000 (Gemma 3's
        // defaults here too); of a `gemma2` file: every other layer a window, the caps from
        // the metadata; of both: the scores scaled by the head width — the width over the
        // heads for the 27B models (46 layers in Gemma 2, 62 in Gemma 3).
        let gemma = arch == "gemma3" || arch == "gemma2";
        let largest = if arch == "gemma2" { 46 } else { 62 };
        let query_scalar = if blocks == largest { hidden / heads.max(1) } else { head_dim };
        let float = |k: &str| get(k).and_then(GgufValue::as_f64);
        // OLMo 3 as the converter writes it, an `olmo2` file with a window pattern: the
        // sliding layers' rotary positions unscaled (as llama.cpp runs them).
        let pattern: Option<Vec<bool>> = match get("attention.sliding_window_pattern").filter(|_| arch == "olmo2") {
            Some(GgufValue::Array(v)) => Some(v.iter().map(|b| matches!(b, GgufValue::Bool(true))).collect()),
            _ => None,
        };
        let theta = get("rope.freq_base").and_then(GgufValue::as_f64).unwrap_or(10000.0);
        let (architecture, layer_types, rope_parameters) = match &pattern {
            Some(p) => {
                let types: Vec<&str> =
                    p.iter().map(|&s| if s { "sliding_attention" } else { "full_attention" }).collect();
                let mut full =
                    if scaling.is_null() { serde_json::json!({ "rope_type": "default" }) } else { scaling.clone() };
                full["rope_theta"] = theta.into();
                let sliding = serde_json::json!({ "rope_type": "default", "rope_theta": theta });
                (
                    "Olmo3ForCausalLM",
                    Some(types),
                    Some(serde_json::json!({ "full_attention": full, "sliding_attention": sliding })),
                )
            }
            None => (architecture, None, None),
        };
        let json = serde_json::json!({
            "architectures": [architecture],
            "layer_types": layer_types,
            "rope_parameters": rope_parameters,
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": need("feed_forward_length")?,
            // Less GLM-4.5's multi-token-prediction layers, which follow the decoder's.
            "num_hidden_layers": blocks - int("nextn_predict_layers").unwrap_or(0),
            "num_nextn_predict_layers": int("nextn_predict_layers"),
            "num_attention_heads": heads,
            "num_key_value_heads": int("attention.head_count_kv").unwrap_or(heads),
            "head_dim": head_dim,
            "max_position_embeddings": need("context_length")?,
            "rms_norm_eps": get("attention.layer_norm_rms_epsilon").and_then(GgufValue::as_f64).unwrap_or(1e-5),
            "rope_theta": theta,
            "rope_scaling": scaling,
            "tie_word_embeddings": tied,
            "eos_token_id": token("eos_token_id"),
            "bos_token_id": token("bos_token_id"),
            "sliding_window": int("attention.sliding_window").filter(|&w| w > 0),
            "query_pre_attn_scalar": gemma.then_some(query_scalar),
            "attn_logit_softcapping": float("attn_logit_softcapping").filter(|_| arch == "gemma2"),
            "final_logit_softcapping": float("final_logit_softcapping").filter(|_| gemma),
            "partial_rotary_factor": partial,
            // Granite's multipliers (a SmolLM3 file's layers without rotary positions are
            // every fourth, as llama.cpp assumes and as the config's default is).
            "embedding_multiplier": float("embedding_scale").filter(|_| arch.starts_with("granite")),
            "residual_multiplier": float("residual_scale").filter(|_| arch.starts_with("granite")),
            "attention_multiplier": float("attention.scale").filter(|_| arch.starts_with("granite")),
            "logits_scaling": float("logit_scale").filter(|_| arch.starts_with("granite")),
            // Seed-OSS's, GLM-4's and ERNIE 4.5's biases, by the tensors the file holds.
            "use_qk_norm": matches!(arch, "glm4moe" | "minimax-m2").then(|| has("blk.0.attn_q_norm.weight")),
            "attention_bias": matches!(arch, "seed_oss" | "glm4" | "gpt-oss" | "glm4moe").then(|| has("blk.0.attn_q.bias")),
            "attention_out_bias": (arch == "seed_oss").then(|| has("blk.0.attn_output.bias")),
            "use_bias": matches!(arch, "ernie4_5" | "ernie4_5-moe").then(|| has("blk.0.attn_q.bias")),
        });
        let mut json = json;
        if arch == "llama4" {
            // What llama.cpp assumes of a `llama4` file: chunks of 8,192 and no rotary positions on
            // every fourth layer (none, and rotary positions on all, where its window is 0), the
            // query temperature 0.1 over 8,192 positions there, q/k norms unless it has 128
            // experts; its dense layers `feed_forward_length` wide, its experts
            // `expert_feed_forward_length`.
            let flat = get("attention.sliding_window").and_then(GgufValue::as_u64) == Some(0);
            let layers = (blocks - int("nextn_predict_layers").unwrap_or(0)) as usize;
            let rope: Vec<u8> = (0..layers).map(|i| u8::from(flat || (i + 1) % 4 != 0)).collect();
            let fields = serde_json::json!({
                "intermediate_size_mlp": need("feed_forward_length")?,
                "intermediate_size": need("expert_feed_forward_length")?,
                "interleave_moe_layer_step": int("interleave_moe_layer_step").unwrap_or(1),
                "no_rope_layers": rope,
                "attention_chunk_size": (!flat).then_some(8192),
                "floor_scale": 8192,
                "attn_scale": 0.1,
                "use_qk_norm": experts != Some(128),
                "sliding_window": null,
            });
            merge(&mut json, fields);
        }
        if arch == "deepseek2" {
            // Latent attention's widths: the cache's key (`key_length`: latent and rotary key)
            // and value (the latent), each head's (`key_length_mla`, `value_length_mla`; older
            // files give those as `key_length` and `value_length`).
            let rope = need("rope.dimension_count")?;
            let mla = int("attention.key_length_mla").is_some();
            let key = if mla { need("attention.key_length_mla")? } else { need("attention.key_length")? };
            let value = if mla { need("attention.value_length_mla")? } else { need("attention.value_length")? };
            if key <= rope {
                return Err(self.error(None, format!("`{arch}.attention.key_length_mla` {key} ≤ the rotary {rope}")));
            }
            let latent = serde_json::json!({
                "q_lora_rank": int("attention.q_lora_rank"),
                "kv_lora_rank": need("attention.kv_lora_rank")?,
                "qk_rope_head_dim": rope,
                "qk_nope_head_dim": key - rope,
                "v_head_dim": value,
                "rope_interleave": true,
            });
            merge(&mut json, latent);
        }
        if let Some(fields) = moe {
            merge(&mut json, serde_json::Value::Object(fields));
        }
        let mut c = LlamaConfig::from_json(&json.to_string())?;
        if c.moe.is_none() && experts.is_some() {
            return Err(self.error(None, format!("`{arch}` files have no experts ({arch}.expert_count)")));
        }
        // llama.cpp's converter stores Gemma's norm gains `1 + w` as the weights.
        c.norm_offset = 0.0;
        if self.tensors.iter().any(|t| t.name == "rope_freqs.weight") {
            let f = self.tensor("rope_freqs.weight")?.to_f64();
            if f.len() != c.rotary_dim / 2 {
                let detail = format!("{} factors for {} frequencies", f.len(), c.rotary_dim / 2);
                return Err(self.error(Some("rope_freqs.weight"), detail));
            }
            c.rope_factors = Some(f);
        }
        Ok(c)
    }

    /// The `config.json` fields of a file's mixture of experts, as llama.cpp reads it: every
    /// layer a mixture; the chosen experts' weights normalized in `qwen3moe` and `llama`
    /// (Mixtral) files, not in `qwen2moe` and `olmoe` ones; each expert `expert_feed_forward_length`
    /// wide (`feed_forward_length` in `llama` and `olmoe` files, where the experts are the
    /// only MLPs), a `qwen2moe` shared expert `expert_shared_feed_forward_length` wide. A
    /// scale on the weights or a gating function other than softmax is an error naming the key.
    fn moe_fields(&self, arch: &str) -> Result<Option<serde_json::Map<String, serde_json::Value>>> {
        let key = |k: &str| format!("{arch}.{k}");
        let int = |k: &str| self.metadata.get(&key(k)).and_then(GgufValue::as_u64);
        let Some(experts) = int("expert_count").filter(|&n| n > 0) else { return Ok(None) };
        let bad = |k: &str, v: String, supported: &str| NnError::ConfigField {
            field: key(k),
            value: v,
            supported: supported.into(),
        };
        let scale = self.metadata.get(&key("expert_weights_scale")).and_then(GgufValue::as_f64);
        let deepseek = arch == "deepseek2";
        if let Some(scale) = scale.filter(|&s| s != 0.0 && s != 1.0 && arch != "glm4moe" && !deepseek) {
            return Err(bad("expert_weights_scale", format!("{scale}"), "1 (the weights unscaled)"));
        }
        // Softmax over every expert (1), or over the chosen ones (3: the same as their
        // probabilities normalized).
        // GLM-4.5's: sigmoid scores (2).
        // DeepSeek's: softmax (V2) or sigmoid (V3).
        // MiniMax-M2's: sigmoid, the only gating its files take.
        let default = match arch {
            "gpt-oss" => 3,
            "glm4moe" | "minimax-m2" => 2,
            _ => 1,
        };
        let gating = int("expert_gating_func").unwrap_or(default);
        let sigmoid = matches!(arch, "glm4moe" | "deepseek2" | "minimax-m2");
        let ok = match gating {
            1 => arch != "minimax-m2",
            2 => sigmoid,
            3 => !sigmoid,
            _ => false,
        };
        if !ok {
            let supported = "1 (softmax), 3 (softmax of the chosen), or 2 (sigmoid) in glm4moe, deepseek2 and \
                             minimax-m2 files (minimax-m2: only 2)";
            return Err(bad("expert_gating_func", format!("{gating}"), supported));
        }
        let used = int("expert_used_count")
            .filter(|&k| k > 0)
            .ok_or_else(|| self.error(None, format!("metadata `{}` is missing", key("expert_used_count"))))?;
        let ff = int("feed_forward_length").unwrap_or(0);
        let mut fields = serde_json::Map::new();
        fields.insert("num_experts".into(), experts.into());
        fields.insert("num_experts_per_tok".into(), used.into());
        fields.insert("moe_intermediate_size".into(), int("expert_feed_forward_length").unwrap_or(ff / used).into());
        fields.insert("norm_topk_prob".into(), (matches!(arch, "qwen3moe" | "llama") || gating == 3).into());
        if arch == "glm4moe" || deepseek {
            let norm =
                self.metadata.get(&key("expert_weights_norm")).is_some_and(|v| matches!(v, GgufValue::Bool(true)));
            if deepseek && gating == 1 && norm {
                // DeepSeek-V2's router never normalizes its weights (as `transformers` runs it).
                let supported = "false with softmax gating (DeepSeek-V2's weights are not normalized)";
                return Err(bad("expert_weights_norm", "true".into(), supported));
            }
            fields.insert("norm_topk_prob".into(), norm.into());
            fields.insert("routed_scaling_factor".into(), scale.filter(|&s| s != 0.0).unwrap_or(1.0).into());
            fields.insert("n_shared_experts".into(), int("expert_shared_count").unwrap_or(0).into());
            fields.insert("first_k_dense_replace".into(), int("leading_dense_block_count").unwrap_or(0).into());
            fields.insert("n_group".into(), int("expert_group_count").unwrap_or(1).max(1).into());
            fields.insert("topk_group".into(), int("expert_group_used_count").unwrap_or(1).max(1).into());
            let limited = int("expert_group_count").is_some_and(|g| g > 1);
            fields.insert("topk_method".into(), (if limited { "group_limited_greedy" } else { "greedy" }).into());
        }
        if arch == "ernie4_5-moe" {
            // Mixtures after the leading dense layers, every `interleave_moe_layer_step`-th; the
            // shared experts' width in experts.
            let width = int("expert_feed_forward_length").unwrap_or(ff / used).max(1);
            let shared = int("expert_shared_feed_forward_length").unwrap_or(0);
            if shared % width != 0 {
                let supported = format!("a multiple of expert_feed_forward_length {width}");
                return Err(bad("expert_shared_feed_forward_length", format!("{shared}"), &supported));
            }
            fields.insert("moe_num_shared_experts".into(), (shared / width).into());
            fields.insert("moe_layer_start_index".into(), int("leading_dense_block_count").unwrap_or(0).into());
            fields.insert("moe_layer_interval".into(), int("interleave_moe_layer_step").unwrap_or(1).into());
        }
        if arch == "gpt-oss" || arch == "granitemoe" {
            // Its experts' width is the config's `intermediate_size`.
            fields.insert("intermediate_size".into(), int("expert_feed_forward_length").unwrap_or(ff).into());
        }
        if arch == "qwen2moe" {
            fields.insert(
                "shared_expert_intermediate_size".into(),
                int("expert_shared_feed_forward_length").unwrap_or(ff).into(),
            );
        }
        Ok(Some(fields))
    }
}
