//! Checkpoints written by other libraries, read into a model's parameters: safetensors files
//! (memory-mapped: a tensor is converted from the mapped file, never read whole into memory
//! first), a directory holding `model.safetensors`, or a sharded checkpoint's
//! `model.safetensors.index.json` with its shards.
//!
//! A [`KeyMap`] says how the file's keys relate to the model's paths: prefixes to strip
//! (`transformer.`), renames, keys to drop (buffers such as GPT-2's causal `attn.bias`, a
//! tied head), and parameters stored transposed (PyTorch's `Linear` is `[out, in]`).
//! [`Checkpoint::load`] checks everything before returning anything: every parameter found
//! once with its shape, every key used or dropped, every dtype convertible (f32, f16 and bf16
//! to what the model asks) — or a typed error naming the key. Loading into a device store
//! (`ParamStore::insert_all`) is then all or nothing too.
//!
//! FP8 checkpoints (DeepSeek-V3's, Kimi K2's, the `-FP8` releases of Qwen3 and GLM-4.5:
//! `transformers`' fine-grained `fp8`, and compressed-tensors' per-tensor or per-channel FP8)
//! read as the values they stand for: an F8_E4M3 `weight` times its `weight_scale_inv` per
//! block (or its `weight_scale` per tensor or output channel), one f32 tensor under the
//! weight's key; static activation scales (`input_scale`) are not used and dropped.

use crate::error::{NnError, Result};
use crate::module::{Module, Param};
use fusegraph_ir::safetensors::{decode, SafetensorsError};
use fusegraph_ir::{DType, HostTensor, TensorType};
use safetensors::SafeTensors;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// How a checkpoint's keys map to a model's parameter paths.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeyMap {
    /// Prefixes a key may carry before the model's path (the first that matches is removed).
    pub strip_prefixes: Vec<String>,
    /// Exact renames, checkpoint key (after stripping) → model path.
    pub renames: Vec<(String, String)>,
    /// Keys dropped: a key ending in one of these (after stripping).
    pub drop_suffixes: Vec<String>,
    /// Keys dropped: a key starting with one of these (after stripping; GLM-4.5's
    /// multi-token-prediction layers after the decoder's).
    pub drop_prefixes: Vec<String>,
    /// Parameters (by path suffix) whose 2-D tensor the file stores transposed.
    pub transposed_suffixes: Vec<String>,
    /// Parts of a key (`.experts.`) followed by an index into a stacked parameter: key
    /// `a.experts.3.b` (after renaming) is slot 3 of parameter `a.experts.b`, whose leading
    /// axis holds one part per index (each transposed and converted as a parameter of its own).
    pub stacked: Vec<String>,
    /// Parameters (by path suffix) the file stores `[…, in, out]`, as their f32 layout is:
    /// read as they are, but transposed into a block type's `[…, out, in]` (Llama 4's and
    /// gpt-oss's expert stacks, quantized on load).
    pub in_out_suffixes: Vec<String>,
}

impl KeyMap {
    /// Hugging Face GPT-2 (`GPT2Model`, `GPT2LMHeadModel`): `transformer.` stripped, the
    /// causal-mask buffers (`attn.bias`, `attn.masked_bias`) and the tied `lm_head.weight`
    /// dropped; `Conv1D` weights are `[in, out]` already.
    pub fn gpt2() -> Self {
        KeyMap {
            strip_prefixes: vec!["transformer.".into()],
            drop_suffixes: vec![".attn.bias".into(), ".attn.masked_bias".into(), "lm_head.weight".into()],
            ..Default::default()
        }
    }

    /// torchvision (`ResNet` and the like): `Linear` weights stored `[out, in]` (`fc`), batch
    /// norms' `num_batches_tracked` counters dropped.
    pub fn torchvision() -> Self {
        KeyMap {
            drop_suffixes: vec!["num_batches_tracked".into()],
            transposed_suffixes: vec!["fc.weight".into()],
            ..Default::default()
        }
    }

    /// Hugging Face Llama-family models (every [`crate::llama::Architecture`]:
    /// `LlamaForCausalLM`, `Qwen2ForCausalLM`, `Gemma3ForCausalLM` …): PyTorch `Linear` weights
    /// (`*_proj`, `lm_head`, a mixture's router `mlp.gate` or `mlp.router` and
    /// `shared_expert_gate`) stored `[out, in]` (gpt-oss's expert stacks are `[in, out]` already);
    /// rotary buffers (`rotary_emb.inv_freq`) dropped, and with `tied` heads `lm_head.weight`
    /// (when the file carries it); a mixture's experts (`mlp.experts.{e}.gate_proj.weight`)
    /// stacked into one parameter each.
    pub fn llama(tied: bool) -> Self {
        let mut drop_suffixes = vec!["rotary_emb.inv_freq".to_string()];
        if tied {
            drop_suffixes.push("lm_head.weight".into());
        }
        KeyMap {
            drop_suffixes,
            transposed_suffixes: [
                "_proj.weight",
                "_proj_with_mqa.weight",
                "lm_head.weight",
                ".mlp.gate.weight",
                ".shared_expert_gate.weight",
                ".mlp.router.weight",
            ]
            .map(String::from)
            .into(),
            stacked: vec![".experts.".into()],
            in_out_suffixes: vec![".experts.gate_up_proj".into(), ".experts.down_proj".into()],
            ..Default::default()
        }
    }

    /// The model path of checkpoint key `key`, or `None` for a dropped key.
    fn path_of(&self, key: &str) -> Option<String> {
        let mut k = key;
        if let Some(p) = self.strip_prefixes.iter().find(|p| key.starts_with(p.as_str())) {
            k = &key[p.len()..];
        }
        if self.drop_suffixes.iter().any(|s| k.ends_with(s.as_str()) || key.ends_with(s.as_str()))
            || self.drop_prefixes.iter().any(|p| k.starts_with(p.as_str()))
        {
            return None;
        }
        match self.renames.iter().find(|(from, _)| from == k) {
            Some((_, to)) => Some(to.clone()),
            None => Some(k.to_string()),
        }
    }

    fn transposed(&self, path: &str) -> bool {
        self.transposed_suffixes.iter().any(|s| path.ends_with(s.as_str()))
    }

    /// The path of part `slot` of stacked parameter `path` (`a.experts.b` → `a.experts.3.b`).
    fn part_path(&self, path: &str, slot: usize) -> String {
        match self.stacked.iter().find_map(|infix| Some((infix, path.split_once(infix.as_str())?))) {
            Some((infix, (before, rest))) => format!("{before}{infix}{slot}.{rest}"),
            None => format!("{path}[{slot}]"),
        }
    }

    /// A model path of a stacked parameter's part: the parameter's path and the slot.
    fn unstacked(&self, path: &str) -> Option<(String, usize)> {
        self.stacked.iter().find_map(|infix| {
            let (before, after) = path.split_once(infix.as_str())?;
            let (slot, rest) = after.split_once('.')?;
            let slot = slot.parse().ok().filter(|_| slot.bytes().all(|c| c.is_ascii_digit()))?;
            Some((format!("{before}{infix}{rest}"), slot))
        })
    }
}

/// An open checkpoint: its files mapped, and which file holds each key.
pub struct Checkpoint {
    source: PathBuf,
    files: Vec<(PathBuf, memmap2::Mmap)>,
    keys: BTreeMap<String, usize>,
    /// MXFP4 tensors stored as `transformers`' quantizer writes them: key → its `{key}_blocks`
    /// and `{key}_scales` and their files.
    mxfp4: BTreeMap<String, [(String, usize); 2]>,
    /// FP8 weights with scales: key → its scale's key and file.
    fp8: BTreeMap<String, (String, usize)>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint").field("source", &self.source).field("tensors", &self.keys.len()).finish()
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> NnError + '_ {
    move |source| NnError::Checkpoint(SafetensorsError::Io { path: path.to_path_buf(), source })
}

fn format(path: &Path, e: impl std::fmt::Display) -> NnError {
    NnError::Checkpoint(SafetensorsError::Format(format!("{}: {e}", path.display())))
}

impl Checkpoint {
    /// Opens a `.safetensors` file, a sharded checkpoint's `*.index.json`, or a directory
    /// holding either (`model.safetensors.index.json` first, then `model.safetensors`).
    /// Headers are read and checked here (a truncated file is an error naming it); tensor
    /// data is read when loaded.
    pub fn open(path: &Path) -> Result<Checkpoint> {
        let path = if path.is_dir() {
            let index = path.join("model.safetensors.index.json");
            if index.exists() {
                index
            } else {
                path.join("model.safetensors")
            }
        } else {
            path.to_path_buf()
        };
        let shards: Vec<PathBuf> = if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path).map_err(io(&path))?;
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format(&path, e))?;
            let map =
                v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| format(&path, "no `weight_map`"))?;
            let dir = path.parent().unwrap_or(Path::new("."));
            let mut files: Vec<PathBuf> = map.values().filter_map(|f| f.as_str()).map(|f| dir.join(f)).collect();
            files.sort();
            files.dedup();
            files
        } else {
            vec![path.clone()]
        };
        let mut files = Vec::new();
        let mut keys = BTreeMap::new();
        let mut fp8_keys = Vec::new();
        for shard in shards {
            let file = std::fs::File::open(&shard).map_err(io(&shard))?;
            // SAFETY: the map is read-only; a checkpoint changed by another process while it
            // is open is outside what this reader supports (as for every mmap reader).
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io(&shard))?;
            let st = SafeTensors::deserialize(&map).map_err(|e| format(&shard, e))?;
            for name in st.names() {
                if keys.insert(name.to_string(), files.len()).is_some() {
                    return Err(format(&shard, format!("tensor `{name}` is in two shards")));
                }
                if st.tensor(name).is_ok_and(|v| v.dtype() == safetensors::Dtype::F8_E4M3) {
                    fp8_keys.push(name.to_string());
                }
            }
            files.push((shard, map));
        }
        // `{key}_blocks` beside `{key}_scales`: one MXFP4 tensor `key`.
        let mut mxfp4 = BTreeMap::new();
        let bases: Vec<String> = keys
            .keys()
            .filter_map(|k| k.strip_suffix("_blocks"))
            .filter(|base| keys.contains_key(&format!("{base}_scales")))
            .map(String::from)
            .collect();
        for base in bases {
            let parts = ["_blocks", "_scales"].map(|part| {
                let key = format!("{base}{part}");
                let file = keys.remove(&key).expect("listed");
                (key, file)
            });
            keys.insert(base.clone(), parts[0].1);
            mxfp4.insert(base, parts);
        }
        // An FP8 `{key}` with its `{key}_scale_inv` or `{key}_scale`; its layer's activation
        // scale (`input_scale`) unused.
        let mut fp8 = BTreeMap::new();
        for key in fp8_keys {
            let scale =
                ["_scale_inv", "_scale"].map(|s| format!("{key}{s}")).into_iter().find(|s| keys.contains_key(s));
            if let Some(scale) = scale {
                let file = keys.remove(&scale).expect("listed");
                fp8.insert(key.clone(), (scale, file));
            }
            if let Some(input) = key.strip_suffix("weight").map(|layer| format!("{layer}input_scale")) {
                keys.remove(&input);
            }
        }
        Ok(Checkpoint { source: path, files, keys, mxfp4, fp8 })
    }

    /// Every key, sorted (an MXFP4 tensor's by its name without `_blocks` and `_scales`).
    pub fn keys(&self) -> Vec<String> {
        self.keys.keys().cloned().collect()
    }

    /// The model paths (through `map`) of the tensors the checkpoint holds in a block type:
    /// its MXFP4 tensors.
    pub fn stored_blocks(&self, map: &KeyMap) -> BTreeMap<String, DType> {
        self.mxfp4.keys().filter_map(|k| map.path_of(k)).map(|p| (p, DType::MXFP4)).collect()
    }

    /// The path it was opened from (the index file of a sharded checkpoint).
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The tensor `key` as stored (bf16 widened to f32).
    pub fn tensor(&self, key: &str) -> Result<HostTensor> {
        self.tensor_in(&self.headers()?, key)
    }

    /// Each file's parsed header (the data stays mapped), in file order.
    fn headers(&self) -> Result<Vec<SafeTensors<'_>>> {
        self.files.iter().map(|(path, map)| SafeTensors::deserialize(map).map_err(|e| format(path, e))).collect()
    }

    /// The tensor `key` through already parsed `headers`.
    fn tensor_in(&self, headers: &[SafeTensors<'_>], key: &str) -> Result<HostTensor> {
        let &file = self.keys.get(key).ok_or_else(|| NnError::MissingKey {
            key: key.to_string(),
            param: String::new(),
            expected: None,
            file: self.source.display().to_string(),
        })?;
        if let Some(parts) = self.mxfp4.get(key) {
            return self.mxfp4_in(headers, key, parts);
        }
        let view = headers[file].tensor(key).map_err(|e| format(&self.files[file].0, e))?;
        let t = decode(key, &view)?;
        match self.fp8.get(key) {
            Some((scale, at)) => {
                let scales = headers[*at].tensor(scale).map_err(|e| format(&self.files[*at].0, e))?;
                self.scaled(key, t, scale, &decode(scale, &scales)?)
            }
            None => Ok(t),
        }
    }

    /// FP8 weight `key`'s values `w` (`[out, in]`, or `[…, out, in]`) times its scales
    /// `scale_key`: one for the tensor (`[]`, `[1]`), one per output row (`[out]`, `[out,
    /// 1]`), or one per block of `b × b` values (`[⌈out / b⌉, ⌈in / b⌉]`, the last blocks
    /// partial; `b` the power of two those counts give, 128 in every release), as f32.
    fn scaled(&self, key: &str, w: HostTensor, scale_key: &str, scales: &HostTensor) -> Result<HostTensor> {
        let dims = w.shape().dims().to_vec();
        let (s, sd) = (scales.to_f64(), scales.shape().dims().to_vec());
        let [out, cols] = match dims[..] {
            [.., o, i] => [o, i],
            _ => [1, dims.first().copied().unwrap_or(1)],
        };
        let rows = w.shape().numel() / cols.max(1);
        // The block edge `b` where `sd` counts blocks of `[out, in]`.
        let block = |so: usize, si: usize| {
            let b = out.div_ceil(so.max(1)).next_power_of_two();
            (so > 0 && si > 0 && out.div_ceil(b) == so && cols.div_ceil(b) == si).then_some(b)
        };
        let at: Box<dyn Fn(usize, usize) -> usize> = match sd[..] {
            [] | [1] | [1, 1] => Box::new(|_, _| 0),
            [n] | [n, 1] if n == out => Box::new(|r, _| r % out),
            [so, si] => match block(so, si) {
                Some(b) => Box::new(move |r, c| (r % out) / b * si + c / b),
                None => return Err(self.bad_scale(key, &w, scale_key, scales)),
            },
            _ => return Err(self.bad_scale(key, &w, scale_key, scales)),
        };
        let v = w.to_f64();
        let values: Vec<f64> = (0..rows)
            .flat_map(|r| (0..cols).map(move |c| (r, c)))
            .map(|(r, c)| v[r * cols + c] * s[at(r, c)])
            .collect();
        Ok(HostTensor::from_f64(DType::F32, dims, &values)?)
    }

    fn bad_scale(&self, key: &str, w: &HostTensor, scale_key: &str, scales: &HostTensor) -> NnError {
        let detail = format!(
            "{scale_key} {} does not scale FP8 {key} {} (one scale, one per output row, or one per square block)",
            scales.ty(),
            w.ty()
        );
        format(&self.source, detail)
    }

    /// MXFP4 tensor `key` from its `_blocks` (u8 `[…, n, 16]`: 32 FP4 nibbles a block, value
    /// `2j` the low nibble of byte `j` and `2j + 1` the high one) and `_scales` (u8 `[…, n]`,
    /// E8M0) as [`DType::MXFP4`] `[…, 32 · n]`: each block its scale byte, then its values
    /// packed as llama.cpp packs them (value `j` the low nibble of byte `j mod 16`, the low
    /// half first).
    fn mxfp4_in(&self, headers: &[SafeTensors<'_>], key: &str, parts: &[(String, usize); 2]) -> Result<HostTensor> {
        let [blocks, scales] = parts
            .each_ref()
            .map(|(k, file)| headers[*file].tensor(k).map_err(|e| format(&self.files[*file].0, e)).map(|v| (k, v)));
        let ((bk, blocks), (sk, scales)) = (blocks?, scales?);
        let (bd, sd) = (blocks.shape(), scales.shape());
        let u8s = blocks.dtype() == safetensors::Dtype::U8 && scales.dtype() == safetensors::Dtype::U8;
        if !u8s || bd.len() < 2 || bd[bd.len() - 1] != 16 || bd[..bd.len() - 1] != *sd {
            let detail = format!(
                "{bk} {:?} {bd:?} and {sk} {:?} {sd:?} are not MXFP4 blocks and scales (u8 [.., n, 16] and [.., n])",
                blocks.dtype(),
                scales.dtype()
            );
            return Err(format(&self.source, detail));
        }
        let (b, sc) = (blocks.data(), scales.data());
        let mut bytes = Vec::with_capacity(sc.len() * 17);
        for (block, &e) in b.chunks_exact(16).zip(sc) {
            let value = |v: usize| (block[v / 2] >> (4 * (v % 2))) & 0x0f;
            bytes.push(e);
            bytes.extend((0..16).map(|j| value(j) | (value(j + 16) << 4)));
        }
        let mut dims = sd.to_vec();
        *dims.last_mut().expect("rank ≥ 1") *= 32;
        HostTensor::from_blocks(DType::MXFP4, dims, bytes).map_err(|e| format(&self.source, format!("{key}: {e}")))
    }

    /// The values of every parameter of `module`, by path, read through `map`: each
    /// converted to its parameter's dtype and checked against its shape (after a transpose
    /// where `map` says so). Errors, before anything is returned: a parameter no key gives
    /// ([`NnError::MissingKey`]), a key that names no parameter and is not dropped
    /// ([`NnError::UnknownKey`]), a shape that differs ([`NnError::KeyShape`]), a dtype
    /// fusegraph does not read (`SafetensorsError::Dtype`, naming the key).
    pub fn load(&self, module: &dyn Module, map: &KeyMap) -> Result<BTreeMap<String, HostTensor>> {
        let params: BTreeMap<String, Param> = module.params().into_iter().map(|p| (p.path().to_string(), p)).collect();
        let file = || self.source.display().to_string();
        // Each parameter's keys by slot (`None`: the whole parameter; `Some(e)`: part `e` of a
        // stacked one).
        let mut key_of: BTreeMap<&str, BTreeMap<Option<usize>, &str>> = BTreeMap::new();
        for key in self.keys.keys() {
            let Some(path) = map.path_of(key) else { continue };
            let (path, slot) = match params.contains_key(&path) {
                true => (path, None),
                false => match map.unstacked(&path) {
                    Some((stacked, slot)) => (stacked, Some(slot)),
                    None => (path, None),
                },
            };
            let Some((path, _)) = params.get_key_value(&path) else {
                return Err(NnError::UnknownKey { key: key.clone(), file: file() });
            };
            let slots = key_of.entry(path).or_default();
            if let Some(other) = slots.insert(slot, key) {
                return Err(NnError::UnknownKey {
                    key: format!("{key} (parameter `{path}` is given by `{other}` too)"),
                    file: file(),
                });
            }
            if slots.len() > 1 && slots.contains_key(&None) {
                return Err(NnError::UnknownKey {
                    key: format!("{key} (parameter `{path}` is given whole and in parts)"),
                    file: file(),
                });
            }
        }
        let headers = self.headers()?;
        let mut out = BTreeMap::new();
        for (path, p) in &params {
            let missing = |key: String, expected: TensorType| NnError::MissingKey {
                key,
                param: path.clone(),
                expected: Some(expected),
                file: file(),
            };
            let slots = key_of.get(path.as_str());
            let t = match slots.and_then(|s| s.get(&None)) {
                Some(&key) => self.param_from(&headers, key, path, p.ty(), map)?,
                None if slots.is_none() => return Err(missing(path.clone(), p.ty().clone())),
                // A stacked parameter: every part, in slot order.
                None => {
                    let slots = slots.expect("not none");
                    let want = p.ty();
                    let part = TensorType::new(want.dtype, want.shape.dims()[1..].to_vec());
                    let mut bytes = Vec::new();
                    for slot in 0..want.shape.dims()[0] {
                        let Some(&key) = slots.get(&Some(slot)) else {
                            return Err(missing(map.part_path(path, slot), part.clone()));
                        };
                        bytes.extend(self.param_from(&headers, key, path, &part, map)?.to_bytes());
                    }
                    if let Some((&Some(slot), &key)) =
                        slots.iter().find(|(s, _)| s.is_some_and(|s| s >= want.shape.dims()[0]))
                    {
                        let detail = format!("{key} (slot {slot} of `{path}`, which has {})", want.shape.dims()[0]);
                        return Err(NnError::UnknownKey { key: detail, file: file() });
                    }
                    HostTensor::from_bytes(want, &bytes)?
                }
            };
            out.insert(path.clone(), t);
        }
        Ok(out)
    }

    /// Tensor `key` as parameter `path` of type `want`: transposed where `map` says so,
    /// checked against the shape, converted to the dtype.
    fn param_from(
        &self,
        headers: &[SafeTensors<'_>],
        key: &str,
        path: &str,
        want: &TensorType,
        map: &KeyMap,
    ) -> Result<HostTensor> {
        let mut t = self.tensor_in(headers, key)?;
        // A matrix of a block type keeps the file's `[out, in]` (see `crate::Matrices`); an
        // MXFP4 stack read into another type takes the layout of its parameter's, `[in, out]`;
        // a stack the file holds `[…, in, out]` takes a block type's.
        let in_out = map.in_out_suffixes.iter().any(|s| path.ends_with(s.as_str()));
        let (rank, into_blocks) = (t.shape().rank(), want.dtype.block().is_some());
        let into_block_layout = in_out && into_blocks && t.dtype().block().is_none();
        if rank >= 2 && (into_block_layout || (map.transposed(path) && !into_blocks)) {
            t = transpose_matrices(&t)?;
        } else if t.dtype().block().is_some() && want.dtype.block().is_none() && t.shape().rank() >= 2 {
            t = transpose_matrices(&HostTensor::from_f64(DType::F32, t.shape().clone(), &t.to_f64())?)?;
        }
        if t.shape() != &want.shape {
            return Err(NnError::KeyShape {
                key: key.to_string(),
                param: path.to_string(),
                expected: Box::new(want.clone()),
                got: Box::new(t.ty()),
                file: self.source.display().to_string(),
            });
        }
        if t.dtype() != want.dtype {
            t = HostTensor::from_f64(want.dtype, want.shape.clone(), &t.to_f64())?;
        }
        Ok(t)
    }
}

/// Each matrix of `t` (its last two axes; rank ≥ 2) transposed.
pub(crate) fn transpose_matrices(t: &HostTensor) -> Result<HostTensor> {
    let dims = t.shape().dims();
    let (batch, (r, c)) = (dims[..dims.len() - 2].to_vec(), (dims[dims.len() - 2], dims[dims.len() - 1]));
    let v = t.to_f64();
    let mut out = vec![0.0; v.len()];
    for (from, to) in v.chunks(r * c).zip(out.chunks_mut(r * c)) {
        for i in 0..r {
            for j in 0..c {
                to[j * r + i] = from[i * c + j];
            }
        }
    }
    Ok(HostTensor::from_f64(t.dtype(), [batch, vec![c, r]].concat(), &out)?)
}

/// Which matrices ([`crate::Linear`] weights, [`crate::Embedding`] tables) a loaded model
/// holds in a block type ([`DType::Q8_0`], [`DType::Q4_0`]; see [`crate::Matrices`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Quantize {
    /// As the file stores them: a GGUF file's block-type matrices (any of
    /// [`crate::gguf::GGML_TYPES`]' block types) keep their blocks; nothing else is quantized.
    #[default]
    AsStored,
    /// None: a GGUF file's blocks are dequantized.
    None,
    /// Every matrix whose rows are whole blocks, quantized on load to a block type of 32 by
    /// llama.cpp's reference round-to-nearest (a GGUF matrix already of this type keeps its
    /// blocks; one of another block type is dequantized, then quantized).
    To(DType),
}

impl Quantize {
    /// The scope's matrix rule for a file with no block types of its own.
    pub(crate) fn matrices(self) -> Result<crate::module::Matrices> {
        match self {
            Quantize::AsStored | Quantize::None => Ok(crate::module::Matrices::AsScope),
            Quantize::To(d @ (DType::Q8_0 | DType::Q4_0 | DType::Q5_0 | DType::Q4_1 | DType::Q5_1)) => {
                Ok(crate::module::Matrices::All(d))
            }
            Quantize::To(d) => Err(NnError::ConfigField {
                field: "quantize".into(),
                value: d.to_string(),
                supported: "q8_0, q4_0, q5_0, q4_1 or q5_1".into(),
            }),
        }
    }
}

/// `dtype` if parameters can be stored in it: f32, f16 or bf16 (a block type is for matrices
/// only: [`Quantize`]).
pub(crate) fn parameter_dtype(dtype: DType) -> Result<DType> {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => Ok(dtype),
        other => Err(NnError::ConfigField {
            field: "dtype".into(),
            value: other.to_string(),
            supported: "f32, f16 or bf16 (q8_0 and q4_0 through quantize)".into(),
        }),
    }
}
