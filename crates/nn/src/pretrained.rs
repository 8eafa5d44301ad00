//! Hugging Face model directories: `config.json` names the class (`architectures`), which
//! picks the model ([`crate::Gpt2`] or [`crate::Llama`]) and its key map, and the directory's
//! safetensors (one file or shards) give the weights.

use crate::causal::CausalLm;
use crate::checkpoint::{Checkpoint, KeyMap, Quantize};
use crate::error::{NnError, Result};
use crate::gpt2::{Gpt2, Gpt2Config};
use crate::init::Rng;
use crate::llama::{Llama, LlamaConfig};
use crate::module::{Matrices, Module, Scope};
use fusegraph_ir::{DType, HostTensor};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// A model read from a directory or built from a config, with its parameters' values.
pub struct Pretrained {
    /// The model.
    pub model: Arc<dyn CausalLm>,
    /// Its parameters' values by path.
    pub params: BTreeMap<String, HostTensor>,
}

/// One of the models a `config.json` can name.
enum Any {
    Gpt2(Box<Gpt2>),
    Llama(Box<Llama>),
}

impl Any {
    /// The model `config.json`'s text describes: `GPT2LMHeadModel` (or `model_type: gpt2`),
    /// else a Llama-family class; any other class is [`NnError::ConfigField`].
    /// Its parameters are stored as `dtype`, else as the config's `dtype` (`torch_dtype` in
    /// `transformers` 4): the checkpoint's own.
    fn from_config(text: &str, dtype: Option<DType>, quantize: Quantize, stored: Option<Matrices>) -> Result<Any> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| NnError::Config(format!("config.json: {e}")))?;
        let arch = v.get("architectures").and_then(|a| a.get(0)).and_then(|a| a.as_str());
        let gpt2 = arch == Some("GPT2LMHeadModel") || (arch.is_none() && v.get("model_type") == Some(&"gpt2".into()));
        let scope = Scope::root()
            .storing(match dtype {
                Some(d) => crate::checkpoint::parameter_dtype(d)?,
                None => config_dtype(&v)?,
            })
            .storing_matrices(match stored {
                Some(m) => m,
                None => quantize.matrices()?,
            });
        Ok(if gpt2 {
            Any::Gpt2(Box::new(Gpt2::new(&scope, Gpt2Config::from_json(text)?)?))
        } else {
            Any::Llama(Box::new(Llama::new(&scope, LlamaConfig::from_json(text)?)?))
        })
    }

    fn module(&self) -> &dyn Module {
        match self {
            Any::Gpt2(m) => m.as_ref(),
            Any::Llama(m) => m.as_ref(),
        }
    }

    fn key_map(&self) -> KeyMap {
        match self {
            Any::Gpt2(_) => KeyMap::gpt2(),
            Any::Llama(m) => {
                let mut map = KeyMap::llama(m.config.tie_word_embeddings);
                map.renames = m.checkpoint_renames();
                let layers = m.config.num_hidden_layers;
                map.drop_prefixes =
                    (layers..layers + m.config.mtp_layers).map(|i| format!("model.layers.{i}.")).collect();
                if m.config.multimodal {
                    // A multimodal checkpoint: the decoder under `language_model.`, the vision
                    // tower and its projector beside it (not read).
                    map.strip_prefixes.push("language_model.".into());
                    let vision = ["vision_tower.", "vision_model.", "multi_modal_projector."];
                    map.drop_prefixes.extend(vision.map(String::from));
                }
                map
            }
        }
    }

    fn shared(self) -> Arc<dyn CausalLm> {
        match self {
            Any::Gpt2(m) => Arc::new(*m),
            Any::Llama(m) => Arc::new(*m),
        }
    }
}

impl Pretrained {
    /// The model of `dir/config.json` with the weights of `dir`'s safetensors, every
    /// parameter checked before anything is returned (a missing shard names its file, a
    /// missing or misshapen tensor its key).
    ///
    /// Parameters are stored as `dtype` (f32, f16 or bf16; converted from the file's where
    /// they differ), or with `None` as the checkpoint's config says (`dtype`, `torch_dtype`);
    /// matrices as `quantize` says ([`Quantize::AsStored`]: the checkpoint's MXFP4 stacks,
    /// `{name}_blocks` with `{name}_scales` as gpt-oss is released, keep their blocks).
    ///
    /// A `.gguf` file (llama.cpp's format; the architectures [`crate::gguf::Gguf::llama`] lists) loads through
    /// [`crate::gguf::Gguf::llama`]: its block-type matrices kept as blocks (with
    /// [`Quantize::AsStored`]), everything else stored as `dtype` (f32 by default).
    pub fn load(dir: &Path, dtype: Option<DType>, quantize: Quantize) -> Result<Pretrained> {
        if dir.extension().is_some_and(|e| e == "gguf") {
            let (model, params) = crate::gguf::Gguf::open(dir)?.llama(dtype, quantize)?;
            return Ok(Pretrained { model: Arc::new(model), params });
        }
        let text = read_config(dir)?;
        let mut model = Any::from_config(&text, dtype, quantize, None)?;
        let checkpoint = Checkpoint::open(dir)?;
        // The checkpoint's own block-type matrices (gpt-oss's MXFP4 experts) stay blocks.
        let stored = checkpoint.stored_blocks(&model.key_map());
        if quantize == Quantize::AsStored && !stored.is_empty() {
            model = Any::from_config(&text, dtype, quantize, Some(Matrices::ByPath(Arc::new(stored))))?;
        }
        let params = checkpoint.load(model.module(), &model.key_map())?;
        Ok(Pretrained { model: model.shared(), params })
    }

    /// The model `config.json`'s text describes with seeded random weights (each drawn by its
    /// parameter's initializer, as `transformers` initializes them) stored as
    /// [`Pretrained::load`] stores them, for measuring models whose weights are elsewhere.
    /// A billion values take seconds: chunks of a million values are drawn on every core, each
    /// from its own stream seeded by `seed`, the parameter and the chunk (the values do not
    /// depend on the number of threads, and are not those of [`crate::Params::of`]).
    pub fn random(config_json: &str, dtype: Option<DType>, quantize: Quantize, seed: u64) -> Result<Pretrained> {
        let model = Any::from_config(config_json, dtype, quantize, None)?;
        let params = draw(model.module(), seed)?;
        Ok(Pretrained { model: model.shared(), params })
    }
}

/// The text of `dir/config.json`.
pub fn read_config(dir: &Path) -> Result<String> {
    let path = dir.join("config.json");
    std::fs::read_to_string(&path).map_err(|source| {
        NnError::Checkpoint(fusegraph_ir::safetensors::SafetensorsError::Io { path: path.clone(), source })
    })
}

/// The storage dtype a config names (`dtype`, or `torch_dtype` in `transformers` 4): f32
/// where it names none.
fn config_dtype(v: &serde_json::Value) -> Result<DType> {
    let named = v.get("dtype").or_else(|| v.get("torch_dtype")).and_then(|d| d.as_str());
    match named {
        None | Some("float32") => Ok(DType::F32),
        Some("bfloat16") => Ok(DType::BF16),
        Some("float16") => Ok(DType::F16),
        Some(other) => Err(NnError::ConfigField {
            field: "dtype".into(),
            value: other.into(),
            supported: "float32, bfloat16 or float16".into(),
        }),
    }
}

/// Every parameter of `module` drawn by its initializer, one parameter at a time (converted
/// to its dtype as soon as it is drawn, so that a model's f64 values are never all held at
/// once), a chunk of `CHUNK` values per work item on every core (see [`Pretrained::random`]).
fn draw(module: &dyn Module, seed: u64) -> Result<BTreeMap<String, HostTensor>> {
    const CHUNK: usize = 1 << 20;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut out = BTreeMap::new();
    for (i, p) in module.params().iter().enumerate() {
        let mut values = vec![0.0; p.ty().shape.numel()];
        let work: Vec<(usize, &mut [f64])> = values.chunks_mut(CHUNK).enumerate().collect();
        let workers = threads.min(work.len()).max(1);
        let work = std::sync::Mutex::new(work);
        let failed: std::sync::Mutex<Option<NnError>> = std::sync::Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| loop {
                    let Some((c, chunk)) = work.lock().expect("no thread panics holding it").pop() else { break };
                    // One stream per (seed, parameter, chunk): SplitMix64's constant spreads them.
                    let stream = seed ^ ((i as u64) << 32 | c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    match p.init().sample(&mut Rng::new(stream), chunk.len()) {
                        Ok(v) => chunk.copy_from_slice(&v),
                        Err(e) => _ = failed.lock().expect("no thread panics holding it").get_or_insert(e),
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().expect("no thread panicked") {
            return Err(e);
        }
        out.insert(p.path().to_string(), HostTensor::from_f64(p.ty().dtype, p.ty().shape.clone(), &values)?);
    }
    Ok(out)
}
