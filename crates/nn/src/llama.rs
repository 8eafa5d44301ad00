//! The Llama-family decoders as Hugging Face `transformers` defines them —
//! `LlamaForCausalLM` (Llama 2, 3, 3.1, 3.2, SmolLM), `Qwen2ForCausalLM`,
//! `Qwen3ForCausalLM`, `MistralForCausalLM`, `Gemma2ForCausalLM`, `Gemma3ForCausalLM`,
//! `Phi3ForCausalLM`, `SmolLM3ForCausalLM`, `GraniteForCausalLM` and `Olmo2ForCausalLM` — as
//! one model whose differences are fields of its [`LlamaConfig`]: q/k/v and MLP biases, fused
//! projections, RMS norms on q and k (per head or whole), norms before, around or after each
//! branch and their gains' offset, the MLP's activation, the embeddings', branches', scores'
//! and logits' scales, soft caps on scores and logits, grouped-query attention
//! (`num_key_value_heads`), rotary positions on all or part of each head (and on all layers
//! or some) with their scaling (`linear`, `llama3`, `longrope`) and a base of their own for
//! sliding-window layers, a sliding attention window per layer and a head tied to the
//! embeddings or its own.
//!
//! Parameter names are `transformers`' (`model.embed_tokens`, `model.layers.{i}.self_attn.
//! q_proj`, `….mlp.gate_proj`, `model.norm`, `lm_head`), so a checkpoint directory loads with
//! [`crate::KeyMap::llama`]. PyTorch's `Linear` stores `[out, in]`; [`Linear`] is `[in, out]`,
//! so the key map loads projections transposed.
//!
//! Rotary positions are recorded as graph ops on the positions (fed at run time in a decode
//! step): angles `pos · inv_freq`, their cosines and sines, and the rotation of q and k —
//! elementwise work that fuses with its neighbours. Grouped-query attention reads each key
//! and value head once: the query heads sharing a key head are stacked as rows of one
//! product, so nothing repeats the cache.

use crate::causal::{
    attend, check_cache, check_ids, check_live, live_part, row_positions, soft_cap, tied_head, CausalLm, Kv,
};
use crate::error::{config, unsupported, Result};
use crate::init::Init;
use crate::layers::{Embedding, Linear, Projections, RmsNorm};
use crate::module::{Forward, Scope};
use crate::rope::scaled;
pub use crate::rope::{rotary_angles, rotate, RopeScaling};
use fusegraph_ir::{DType, Tensor};
use serde::Deserialize;
use serde_json::Value;

/// The model classes a `config.json`'s `architectures` may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM`.
    Llama,
    /// `Qwen2ForCausalLM`: biases on q, k and v.
    Qwen2,
    /// `MistralForCausalLM`: a sliding window on every layer when `sliding_window` is set.
    Mistral,
    /// `Qwen3ForCausalLM`: RMS norms on each head's q and k before the rotation.
    Qwen3,
    /// `Gemma3ForCausalLM` (`gemma3_text`): Qwen3's q and k norms, norms before and after
    /// each branch with gains `1 + w`, embeddings scaled by `√hidden_size`, a tanh GELU, the
    /// scores scaled by `query_pre_attn_scalar`, sliding-window layers with a rotary base of
    /// their own.
    Gemma3,
    /// `Gemma2ForCausalLM`: Gemma 3's layers without the q and k norms, every other layer a
    /// sliding window, the scores and the logits soft-capped (`cap · tanh(x / cap)`).
    Gemma2,
    /// `Phi3ForCausalLM` (Phi-3, Phi-4-mini): q, k and v one projection (`qkv_proj`), gate
    /// and up one (`gate_up_proj`), rotary positions on part of each head
    /// (`partial_rotary_factor`), a sliding window on every layer where `sliding_window` is set.
    Phi3,
    /// `SmolLM3ForCausalLM`: no rotary positions on every `no_rope_layer_interval`-th (4th)
    /// layer (`no_rope_layers`).
    SmolLM3,
    /// `GraniteForCausalLM` (IBM Granite 3): the embeddings, each branch's output, the scores
    /// and the logits scaled by the config's multipliers.
    Granite,
    /// `Olmo2ForCausalLM` (OLMo 2): each branch's output normed (no norm before it), RMS norms
    /// over the whole q and k projections.
    Olmo2,
}

/// Where a layer's RMS norms sit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Norms {
    /// Before each branch (`input_layernorm`, then `post_attention_layernorm` before the
    /// MLP): Llama's.
    Pre,
    /// Before and after each branch (`input_layernorm`, `post_attention_layernorm` on the
    /// attention's output, `pre_feedforward_layernorm` and `post_feedforward_layernorm`
    /// around the MLP): Gemma's.
    Sandwich,
    /// After each branch only (`post_attention_layernorm`, `post_feedforward_layernorm`):
    /// OLMo 2's.
    Post,
}

/// RMS norms on the queries and keys before the rotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    /// None.
    None,
    /// Over each head (`head_dim` wide): Qwen3's, Gemma 3's.
    PerHead,
    /// Over the whole projection (all heads): OLMo 2's.
    Whole,
}

/// The gate's activation in the MLP (`hidden_act`, or Gemma's `hidden_activation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `silu`.
    Silu,
    /// `gelu_pytorch_tanh`: GELU's tanh form.
    GeluTanh,
}

impl Architecture {
    /// The `transformers` class name.
    pub fn class_name(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Mistral => "MistralForCausalLM",
            Architecture::Qwen3 => "Qwen3ForCausalLM",
            Architecture::Gemma3 => "Gemma3ForCausalLM",
            Architecture::Phi3 => "Phi3ForCausalLM",
            Architecture::Gemma2 => "Gemma2ForCausalLM",
            Architecture::SmolLM3 => "SmolLM3ForCausalLM",
            Architecture::Granite => "GraniteForCausalLM",
            Architecture::Olmo2 => "Olmo2ForCausalLM",
        }
    }
}

/// The fields of a Llama-family `config.json` that shape the model.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// The model class.
    pub architecture: Architecture,
    /// Token vocabulary (`vocab_size`).
    pub vocab_size: usize,
    /// Model width (`hidden_size`).
    pub hidden_size: usize,
    /// The MLP's inner width (`intermediate_size`).
    pub intermediate_size: usize,
    /// Decoder layers (`num_hidden_layers`).
    pub num_hidden_layers: usize,
    /// Query heads (`num_attention_heads`).
    pub num_attention_heads: usize,
    /// Key and value heads (`num_key_value_heads`; dividing the query heads).
    pub num_key_value_heads: usize,
    /// Width of one head (`head_dim`, else `hidden_size / num_attention_heads`).
    pub head_dim: usize,
    /// The width of each head's leading part that rotary positions rotate
    /// (`head_dim · partial_rotary_factor`; the rest passes unrotated).
    pub rotary_dim: usize,
    /// q, k and v as one projection and gate and up as one (Phi-3's `qkv_proj` and
    /// `gate_up_proj`).
    pub fused_projections: bool,
    /// The longest sequence (`max_position_embeddings`).
    pub max_position_embeddings: usize,
    /// RMS norms' epsilon (`rms_norm_eps`).
    pub rms_norm_eps: f64,
    /// Rotary base θ (`rope_theta`).
    pub rope_theta: f64,
    /// Rotary scaling (`rope_scaling`, or `rope_parameters` in `transformers` 5).
    pub rope_scaling: RopeScaling,
    /// A divisor per rotary frequency, in place of `rope_scaling` (GGUF files store
    /// `llama3` scaling so, as `rope_freqs`).
    pub rope_factors: Option<Vec<f64>>,
    /// Whether the head is the embedding table (`tie_word_embeddings`).
    pub tie_word_embeddings: bool,
    /// Biases on the q, k and v projections (Qwen2; Llama's `attention_bias`).
    pub qkv_bias: bool,
    /// RMS norms over q and k (`q_norm`, `k_norm`) before the rotation.
    pub qk_norm: QkNorm,
    /// Added to each RMS norm's weight for its gain (Gemma: 1, its weights centered at zero).
    pub norm_offset: f64,
    /// Where each layer's norms sit.
    pub norms: Norms,
    /// The MLP gate's activation.
    pub hidden_act: Activation,
    /// The attention scores' scale (`query_pre_attn_scalar^-½`, else `head_dim^-½`).
    pub attention_scale: f64,
    /// The embeddings' scale (Gemma: `√hidden_size`, rounded to the table's storage type as
    /// `transformers` rounds it; Granite: `embedding_multiplier`).
    pub embed_scale: Option<f64>,
    /// Each branch's output scaled before its residual add (Granite's `residual_multiplier`; 1).
    pub residual_scale: f64,
    /// The logits divided by it (Granite's `logits_scaling`; 1).
    pub logits_scaling: f64,
    /// Per layer, whether rotary positions apply (SmolLM3's `no_rope_layers`; all others').
    pub rope_layers: Vec<bool>,
    /// The rotary base and scaling of the sliding-window layers where they have their own
    /// (Gemma 3's local layers).
    pub sliding_rope: Option<(f64, RopeScaling)>,
    /// The attention scores' soft cap (`attn_logit_softcapping`: Gemma 2).
    pub attn_softcap: Option<f64>,
    /// The logits' soft cap (`final_logit_softcapping`: Gemma 2 and 3).
    pub final_softcap: Option<f64>,
    /// A bias on the output projection (Llama's `attention_bias`).
    pub o_bias: bool,
    /// Biases on the MLP's projections (`mlp_bias`).
    pub mlp_bias: bool,
    /// Per layer, the sliding attention window (`sliding_window`) or `None` for full
    /// attention: a query at `i` reads keys `j` with `i − window < j ≤ i`.
    pub sliding_windows: Vec<Option<usize>>,
    /// The tokens that end a generation (`eos_token_id`, one or a list).
    pub eos_token_ids: Vec<i32>,
    /// The token that starts a sequence (`bos_token_id`).
    pub bos_token_id: Option<i32>,
}

/// The `config.json` as written, before its fields are checked.
#[derive(Deserialize)]
struct RawConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    max_position_embeddings: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    partial_rotary_factor: Option<f64>,
    original_max_position_embeddings: Option<usize>,
    hidden_act: Option<String>,
    hidden_activation: Option<String>,
    query_pre_attn_scalar: Option<f64>,
    rope_local_base_freq: Option<f64>,
    sliding_window_pattern: Option<usize>,
    final_logit_softcapping: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    use_bidirectional_attention: Option<bool>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    max_window_layers: Option<usize>,
    layer_types: Option<Vec<String>>,
    no_rope_layers: Option<Vec<u8>>,
    no_rope_layer_interval: Option<usize>,
    embedding_multiplier: Option<f64>,
    residual_multiplier: Option<f64>,
    attention_multiplier: Option<f64>,
    logits_scaling: Option<f64>,
    eos_token_id: Option<Value>,
    bos_token_id: Option<Value>,
}

fn token_ids(field: &str, v: &Option<Value>) -> Result<Vec<i32>> {
    let one =
        |x: &Value| x.as_i64().map(|i| i as i32).ok_or_else(|| unsupported(field, x, "a token id or a list of them"));
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(xs)) => xs.iter().map(one).collect(),
        Some(x) => Ok(vec![one(x)?]),
    }
}

impl LlamaConfig {
    /// The shape of a `config.json` written by `transformers` 4 or 5 for one of the
    /// [`Architecture`]s. An architecture, activation or rotary type it does not support is an
    /// [`NnError::ConfigField`](crate::NnError::ConfigField) naming the field and its value.
    pub fn from_json(text: &str) -> Result<Self> {
        let raw: RawConfig = serde_json::from_str(text).map_err(|e| config(format!("config.json: {e}")))?;
        let archs = raw.architectures.clone().unwrap_or_default();
        let architecture = match archs.first().map(String::as_str).or(raw.model_type.as_deref()) {
            Some("LlamaForCausalLM" | "llama") => Architecture::Llama,
            Some("Qwen2ForCausalLM" | "qwen2") => Architecture::Qwen2,
            Some("MistralForCausalLM" | "mistral") => Architecture::Mistral,
            Some("Qwen3ForCausalLM" | "qwen3") => Architecture::Qwen3,
            Some("Gemma3ForCausalLM" | "gemma3_text") => Architecture::Gemma3,
            Some("Phi3ForCausalLM" | "phi3") => Architecture::Phi3,
            Some("Gemma2ForCausalLM" | "gemma2") => Architecture::Gemma2,
            Some("SmolLM3ForCausalLM" | "smollm3") => Architecture::SmolLM3,
            Some("GraniteForCausalLM" | "granite") => Architecture::Granite,
            Some("Olmo2ForCausalLM" | "olmo2") => Architecture::Olmo2,
            Some(other) => {
                return Err(unsupported(
                    "architectures",
                    other,
                    "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, Gemma3ForCausalLM, \
                     Gemma2ForCausalLM, Phi3ForCausalLM, SmolLM3ForCausalLM, GraniteForCausalLM or Olmo2ForCausalLM",
                ))
            }
            None => return Err(unsupported("architectures", "(missing)", "one of the Llama-family classes")),
        };
        let need = |k: &str, v: Option<usize>| -> Result<usize> {
            v.filter(|&x| x > 0).ok_or_else(|| unsupported(k, "(missing or 0)", "a positive integer"))
        };
        let hidden_size = need("hidden_size", raw.hidden_size)?;
        let heads = need("num_attention_heads", raw.num_attention_heads)?;
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(unsupported(
                "num_key_value_heads",
                kv_heads,
                &format!("a divisor of num_attention_heads {heads}"),
            ));
        }
        let head_dim = match raw.head_dim {
            Some(d) => d,
            None if hidden_size % heads == 0 => hidden_size / heads,
            None => {
                return Err(unsupported(
                    "num_attention_heads",
                    heads,
                    &format!("a divisor of hidden_size {hidden_size}"),
                ))
            }
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(unsupported("head_dim", head_dim, "an even width ≥ 2 (rotary pairs)"));
        }
        let gemma = matches!(architecture, Architecture::Gemma2 | Architecture::Gemma3);
        // Gemma's defaults where its config.json leaves a field out (`Gemma2Config`,
        // `Gemma3TextConfig`).
        let hidden_act = match raw.hidden_act.as_deref().or(raw.hidden_activation.as_deref()) {
            None if gemma => Activation::GeluTanh,
            None | Some("silu") => Activation::Silu,
            Some("gelu_pytorch_tanh") => Activation::GeluTanh,
            Some(other) => return Err(unsupported("hidden_act", other, "silu or gelu_pytorch_tanh")),
        };
        // Soft caps: Gemma 2 caps scores and logits, Gemma 3 logits only (`transformers`' Gemma 3
        // leaves its scores uncapped: a cap asked for there is an error, not ignored).
        let gemma2 = architecture == Architecture::Gemma2;
        let attn_softcap = raw.attn_logit_softcapping.or(gemma2.then_some(50.0));
        let final_softcap = raw.final_logit_softcapping.or(gemma2.then_some(30.0));
        for (field, cap, read) in
            [("final_logit_softcapping", final_softcap, gemma), ("attn_logit_softcapping", attn_softcap, gemma2)]
        {
            match cap {
                Some(cap) if !(read && cap.is_finite() && cap > 0.0) => {
                    return Err(unsupported(field, cap, "null (no soft-capping), or a positive cap for Gemma 2"));
                }
                _ => {}
            }
        }
        if raw.use_bidirectional_attention == Some(true) {
            return Err(unsupported("use_bidirectional_attention", true, "false (causal attention)"));
        }
        // The rotated part of each head: `partial_rotary_factor` at the top level or, in
        // `transformers` 5, among the rotary parameters.
        let partial = raw.partial_rotary_factor.or_else(|| {
            raw.rope_parameters.as_ref().and_then(|p| p.get("partial_rotary_factor")).and_then(Value::as_f64)
        });
        // `int(head_dim · factor)` as `transformers` takes it (a factor from a GGUF file's
        // rotary width may land a hair below that width).
        let rotary = partial.map(|p| (p, (head_dim as f64 * p + 1e-9) as usize));
        let rotary_dim = match rotary {
            None => head_dim,
            Some((p, r)) if p > 0.0 && p <= 1.0 && r % 2 == 0 && r >= 2 => r,
            Some((p, _)) => {
                return Err(unsupported("partial_rotary_factor", p, "a fraction of head_dim giving an even width ≥ 2"))
            }
        };
        // `rope_parameters` per layer type (Gemma 3 in `transformers` 5), or one for all.
        let per_type = raw.rope_parameters.as_ref().and_then(|p| p.get("full_attention")).is_some();
        let ((rope_scaling, theta_5), sliding) = match (&raw.rope_parameters, &raw.rope_scaling) {
            (Some(p), _) if per_type => {
                let local = p.get("sliding_attention");
                let local = local
                    .map(|l| {
                        RopeScaling::parse(
                            "rope_parameters.sliding_attention",
                            Some(l),
                            raw.max_position_embeddings,
                            raw.original_max_position_embeddings,
                        )
                    })
                    .transpose()?;
                (
                    RopeScaling::parse(
                        "rope_parameters.full_attention",
                        p.get("full_attention"),
                        raw.max_position_embeddings,
                        raw.original_max_position_embeddings,
                    )?,
                    local,
                )
            }
            (Some(p), _) if !p.is_null() => (
                RopeScaling::parse(
                    "rope_parameters",
                    Some(p),
                    raw.max_position_embeddings,
                    raw.original_max_position_embeddings,
                )?,
                None,
            ),
            (_, s) => (
                RopeScaling::parse(
                    "rope_scaling",
                    s.as_ref(),
                    raw.max_position_embeddings,
                    raw.original_max_position_embeddings,
                )?,
                None,
            ),
        };
        let gemma3 = architecture == Architecture::Gemma3;
        let rope_theta = raw.rope_theta.or(theta_5).unwrap_or(if gemma3 { 1e6 } else { 10000.0 });
        // `transformers` 4's Gemma 3: its local layers' base apart, unscaled.
        let sliding_rope = match sliding {
            Some((scaling, theta)) => Some((theta.unwrap_or(10000.0), scaling)),
            None if gemma3 => Some((raw.rope_local_base_freq.unwrap_or(10000.0), RopeScaling::Default)),
            None => None,
        };
        if let RopeScaling::LongRope { short_factor, long_factor, .. } = &rope_scaling {
            for (k, f) in [("short_factor", short_factor), ("long_factor", long_factor)] {
                if f.len() != rotary_dim / 2 {
                    let want = format!("{} (one per rotary frequency)", rotary_dim / 2);
                    return Err(unsupported(&format!("rope_scaling.{k}"), format!("{} factors", f.len()), &want));
                }
            }
        }
        let layers = need("num_hidden_layers", raw.num_hidden_layers)?;
        let sliding_windows = Self::windows(architecture, &raw, layers)?;
        let attention_bias = raw.attention_bias.unwrap_or(false);
        // SmolLM3: `no_rope_layers` (1 where rotary positions apply), else none on every
        // `no_rope_layer_interval`-th layer.
        let rope_layers = match (architecture, &raw.no_rope_layers) {
            (Architecture::SmolLM3, Some(l)) if l.len() == layers => l.iter().map(|&r| r != 0).collect(),
            (Architecture::SmolLM3, Some(l)) => {
                let want = format!("{layers} entries (num_hidden_layers)");
                return Err(unsupported("no_rope_layers", format!("{} entries", l.len()), &want));
            }
            (Architecture::SmolLM3, None) => {
                let every = raw.no_rope_layer_interval.unwrap_or(4).max(1);
                (0..layers).map(|i| (i + 1) % every != 0).collect()
            }
            _ => vec![true; layers],
        };
        let granite = architecture == Architecture::Granite;
        let multiplier = |field: &str, v: Option<f64>| -> Result<f64> {
            match v.unwrap_or(1.0) {
                m if m.is_finite() && m > 0.0 => Ok(m),
                m => Err(unsupported(field, m, "a positive number")),
            }
        };
        let attention_scale = match (granite, raw.attention_multiplier) {
            (true, m) => multiplier("attention_multiplier", m)?,
            _ => 1.0 / raw.query_pre_attn_scalar.unwrap_or(head_dim as f64).sqrt(),
        };
        let embed_scale = match granite {
            true => Some(multiplier("embedding_multiplier", raw.embedding_multiplier)?).filter(|&m| m != 1.0),
            false => gemma.then(|| (hidden_size as f64).sqrt()),
        };
        let (residual_scale, logits_scaling) = match granite {
            true => (
                multiplier("residual_multiplier", raw.residual_multiplier)?,
                multiplier("logits_scaling", raw.logits_scaling)?,
            ),
            false => (1.0, 1.0),
        };
        Ok(LlamaConfig {
            architecture,
            vocab_size: need("vocab_size", raw.vocab_size)?,
            hidden_size,
            intermediate_size: need("intermediate_size", raw.intermediate_size)?,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rotary_dim,
            fused_projections: architecture == Architecture::Phi3,
            max_position_embeddings: need("max_position_embeddings", raw.max_position_embeddings)?,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            rope_factors: None,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(gemma),
            qkv_bias: architecture == Architecture::Qwen2 || attention_bias,
            qk_norm: match architecture {
                Architecture::Qwen3 | Architecture::Gemma3 => QkNorm::PerHead,
                Architecture::Olmo2 => QkNorm::Whole,
                _ => QkNorm::None,
            },
            norm_offset: if gemma { 1.0 } else { 0.0 },
            norms: match architecture {
                _ if gemma => Norms::Sandwich,
                Architecture::Olmo2 => Norms::Post,
                _ => Norms::Pre,
            },
            hidden_act,
            attention_scale,
            embed_scale,
            residual_scale,
            logits_scaling,
            rope_layers,
            sliding_rope,
            attn_softcap,
            final_softcap,
            o_bias: architecture != Architecture::Qwen2 && attention_bias,
            mlp_bias: raw.mlp_bias.unwrap_or(false),
            sliding_windows,
            eos_token_ids: token_ids("eos_token_id", &raw.eos_token_id)?,
            bos_token_id: token_ids("bos_token_id", &raw.bos_token_id)?.first().copied(),
        })
    }

    /// Per layer, its window: `layer_types` where given; Mistral's and Phi-3's `sliding_window`
    /// on every layer; Qwen2's and Qwen3's on layers from `max_window_layers` when `use_sliding_window`;
    /// Gemma 3's on all but every `sliding_window_pattern`-th (6) layer; Gemma 2's on the even
    /// layers.
    fn windows(arch: Architecture, raw: &RawConfig, layers: usize) -> Result<Vec<Option<usize>>> {
        let window = raw.sliding_window.filter(|&w| w > 0);
        if arch == Architecture::SmolLM3 && raw.use_sliding_window != Some(true) {
            return Ok(vec![None; layers]);
        }
        if let Some(types) = &raw.layer_types {
            if types.len() != layers {
                return Err(unsupported("layer_types", types.len(), &format!("{layers} entries (num_hidden_layers)")));
            }
            return types
                .iter()
                .map(|t| match (t.as_str(), window) {
                    ("full_attention", _) => Ok(None),
                    ("sliding_attention", Some(w)) => Ok(Some(w)),
                    (other, _) => Err(unsupported(
                        "layer_types",
                        other,
                        "full_attention, or sliding_attention with a sliding_window",
                    )),
                })
                .collect();
        }
        Ok((0..layers)
            .map(|i| match arch {
                Architecture::Mistral | Architecture::Phi3 => window,
                Architecture::Qwen2 | Architecture::Qwen3 if raw.use_sliding_window == Some(true) => {
                    window.filter(|_| i >= raw.max_window_layers.unwrap_or(0))
                }
                Architecture::Gemma3 => {
                    window.filter(|_| (i + 1) % raw.sliding_window_pattern.unwrap_or(6).max(1) != 0)
                }
                Architecture::Gemma2 => window.filter(|_| i % 2 == 0),
                _ => None,
            })
            .collect())
    }

    /// The rotary frequencies of one head.
    pub fn inv_freq(&self) -> Vec<f64> {
        let scaled = self.rope_scaling.inv_freq(self.rope_theta, self.rotary_dim);
        match &self.rope_factors {
            Some(f) => scaled.iter().zip(f).map(|(v, d)| (*v as f32 / *d as f32) as f64).collect(),
            None => scaled,
        }
    }

    /// The rotary frequencies of the sliding-window layers, where they have their own
    /// ([`LlamaConfig::sliding_rope`]).
    pub fn sliding_inv_freq(&self) -> Option<Vec<f64>> {
        self.sliding_rope.as_ref().map(|(theta, scaling)| scaling.inv_freq(*theta, self.rotary_dim))
    }

    /// Longrope's frequencies beyond the trained context, and that context's length in
    /// positions: a sequence whose last position is at or past it rotates by these.
    pub fn long_inv_freq(&self) -> Option<(Vec<f64>, usize)> {
        self.rope_scaling.long_inv_freq(self.rope_theta, self.rotary_dim)
    }

    /// The scale of the rotary angles' cos and sin (longrope's attention factor, else 1).
    pub fn rope_attention_factor(&self) -> f64 {
        self.rope_scaling.attention_factor()
    }
}

/// Attention with rotary q and k and grouped key/value heads.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaAttention {
    /// q, k and v: `q_proj` (`hidden → heads · head_dim`), `k_proj` and `v_proj`
    /// (`hidden → kv_heads · head_dim`), or Phi-3's `qkv_proj` of all three.
    pub qkv: Projections,
    /// `o_proj`, `heads · head_dim → hidden`.
    pub o_proj: Linear,
    /// `q_norm` over each query head (`head_dim`) or all of them, as [`LlamaConfig::qk_norm`]
    /// says.
    pub q_norm: Option<RmsNorm>,
    /// `k_norm` over each key head or all of them.
    pub k_norm: Option<RmsNorm>,
}

crate::module!(LlamaAttention { qkv, o_proj, q_norm, k_norm });

/// The gated MLP: `down_proj(silu(gate_proj(x)) · up_proj(x))`.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaMlp {
    /// `gate_proj` and `up_proj`, or Phi-3's `gate_up_proj` of both.
    pub gate_up: Projections,
    /// `down_proj`.
    pub down_proj: Linear,
}

crate::module!(LlamaMlp { gate_up, down_proj });

/// A decoder layer: `h = x + attn(norm(x))`, `out = h + mlp(norm(h))`; with
/// [`Norms::Sandwich`], `h = x + norm(attn(norm(x)))`, `out = h + norm(mlp(norm(h)))`; with
/// [`Norms::Post`], `h = x + norm(attn(x))`, `out = h + norm(mlp(h))`.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaLayer {
    /// `input_layernorm`, but with post norms only.
    pub input_layernorm: Option<RmsNorm>,
    /// `self_attn`.
    pub self_attn: LlamaAttention,
    /// `post_attention_layernorm`: the MLP's input norm, or with sandwich or post norms the
    /// attention output's.
    pub post_attention_layernorm: RmsNorm,
    /// `pre_feedforward_layernorm`, with sandwich norms: the MLP's input norm.
    pub pre_feedforward_layernorm: Option<RmsNorm>,
    /// `mlp`.
    pub mlp: LlamaMlp,
    /// `post_feedforward_layernorm`, with sandwich or post norms: the MLP output's norm.
    pub post_feedforward_layernorm: Option<RmsNorm>,
}

crate::module!(LlamaLayer {
    input_layernorm,
    self_attn,
    post_attention_layernorm,
    pre_feedforward_layernorm,
    mlp,
    post_feedforward_layernorm
});

/// A Llama-family causal language model.
#[derive(Clone, Debug, PartialEq)]
pub struct Llama {
    /// `model.embed_tokens`: `[vocab, hidden]`.
    pub embed_tokens: Embedding,
    /// `model.layers.{i}`.
    pub layers: Vec<LlamaLayer>,
    /// `model.norm`.
    pub norm: RmsNorm,
    /// `lm_head`, or `None` when tied to the embeddings.
    pub lm_head: Option<Linear>,
    /// Its shape.
    pub config: LlamaConfig,
}

crate::module!(Llama { embed_tokens, layers, norm, lm_head });

impl Llama {
    /// A model shaped by `c` under `s` (the root for a checkpoint's names), initialized as
    /// `transformers` does (`N(0, 0.02²)`, zero biases, norms at one).
    pub fn new(s: &Scope, c: LlamaConfig) -> Result<Self> {
        let (d, dh, kv) = (c.hidden_size, c.head_dim, c.num_key_value_heads * c.head_dim);
        if c.sliding_windows.len() != c.num_hidden_layers {
            return Err(config(format!(
                "Llama: {} sliding windows for {} layers",
                c.sliding_windows.len(),
                c.num_hidden_layers
            )));
        }
        let linear = |s: &Scope, i: usize, o: usize, bias: bool| {
            Linear::with_init(s, i, o, Init::Normal(0.02), bias.then_some(Init::Zeros))
        };
        let norm_of = |s: &Scope, width: usize| -> Result<RmsNorm> {
            let mut n = RmsNorm::new(s, width)?;
            (n.eps, n.offset) = (c.rms_norm_eps, c.norm_offset);
            Ok(n)
        };
        let norm = |s: &Scope| norm_of(s, d);
        let qk_norm = |s: &Scope, heads: usize| match c.qk_norm {
            QkNorm::None => Ok(None),
            QkNorm::PerHead => norm_of(s, dh).map(Some),
            QkNorm::Whole => norm_of(s, heads * dh).map(Some),
        };
        let when = |on: bool, s: &Scope| on.then(|| norm(s)).transpose();
        let m = s.at("model");
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let l = m.at("layers").at(i);
                let (a, p) = (l.at("self_attn"), l.at("mlp"));
                Ok(LlamaLayer {
                    input_layernorm: when(c.norms != Norms::Post, &l.at("input_layernorm"))?,
                    self_attn: LlamaAttention {
                        qkv: Projections::new(
                            &a,
                            d,
                            &[("q_proj", c.num_attention_heads * dh), ("k_proj", kv), ("v_proj", kv)],
                            c.fused_projections.then_some("qkv_proj"),
                            c.qkv_bias,
                        )?,
                        o_proj: linear(&a.at("o_proj"), c.num_attention_heads * dh, d, c.o_bias)?,
                        q_norm: qk_norm(&a.at("q_norm"), c.num_attention_heads)?,
                        k_norm: qk_norm(&a.at("k_norm"), c.num_key_value_heads)?,
                    },
                    post_attention_layernorm: norm(&l.at("post_attention_layernorm"))?,
                    pre_feedforward_layernorm: when(c.norms == Norms::Sandwich, &l.at("pre_feedforward_layernorm"))?,
                    mlp: LlamaMlp {
                        gate_up: Projections::new(
                            &p,
                            d,
                            &[("gate_proj", c.intermediate_size), ("up_proj", c.intermediate_size)],
                            c.fused_projections.then_some("gate_up_proj"),
                            c.mlp_bias,
                        )?,
                        down_proj: linear(&p.at("down_proj"), c.intermediate_size, d, c.mlp_bias)?,
                    },
                    post_feedforward_layernorm: when(c.norms != Norms::Pre, &l.at("post_feedforward_layernorm"))?,
                })
            })
            .collect::<Result<_>>()?;
        let lm_head =
            if c.tie_word_embeddings { None } else { Some(linear(&s.at("lm_head"), d, c.vocab_size, false)?) };
        Ok(Llama {
            embed_tokens: Embedding::with_init(&m.at("embed_tokens"), c.vocab_size, d, Init::Normal(0.02))?,
            layers,
            norm: norm(&m.at("norm"))?,
            lm_head,
            config: c,
        })
    }

    /// `x: [b, s, hidden]` → q `[b, heads, s, dh]`, k and v `[b, kv_heads, s, dh]`, q and k
    /// normed (where the model has `q_norm` and `k_norm`: per head, or over the whole
    /// projection) and rotated by `angles` (the cosines and sines of [`rotary_angles`], one
    /// graph's for all layers; `None` on a layer without rotary positions).
    fn qkv(&self, attn: &LlamaAttention, x: &Tensor, angles: Option<&(Tensor, Tensor)>) -> Result<[Tensor; 3]> {
        let c = &self.config;
        let (b, s) = (x.dims()[0], x.dims()[1]);
        let heads = |t: Tensor, n: usize, norm: Option<&RmsNorm>| -> Result<Tensor> {
            let t = match (norm, c.qk_norm) {
                (Some(norm), QkNorm::Whole) => norm.forward(&t)?,
                _ => t,
            };
            let t = t.reshape([b, s, n, c.head_dim])?;
            let t = match (norm, c.qk_norm) {
                (Some(norm), QkNorm::PerHead) => norm.forward(&t)?,
                _ => t,
            };
            let t = t.transpose(&[0, 2, 1, 3])?;
            match angles {
                Some((cos, sin)) => rotate(&t, cos, sin),
                None => Ok(t),
            }
        };
        let Ok([q, k, v]) = <[Tensor; 3]>::try_from(attn.qkv.forward(x)?) else { unreachable!("q, k and v") };
        let q = heads(q, c.num_attention_heads, attn.q_norm.as_ref())?;
        let k = heads(k, c.num_key_value_heads, attn.k_norm.as_ref())?;
        let v = v.reshape([b, s, c.num_key_value_heads, c.head_dim])?.transpose(&[0, 2, 1, 3])?;
        Ok([q, k, v])
    }

    /// The attention's input: `x` normed where norms come before each branch.
    fn attention_input(layer: &LlamaLayer, x: &Tensor) -> Result<Tensor> {
        match &layer.input_layernorm {
            Some(norm) => norm.forward(x),
            None => Ok(x.clone()),
        }
    }

    /// The rest of a layer after attention: residual, norm, gated MLP, residual (with
    /// sandwich or post norms, each branch's output normed before its residual add; each
    /// branch's output scaled where the model scales it).
    fn finish_layer(&self, layer: &LlamaLayer, x: &Tensor, attended: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        let norm = |n: Option<&RmsNorm>, t: Tensor| -> Result<Tensor> {
            match n {
                Some(n) => n.forward(&t),
                None => Ok(t),
            }
        };
        let branch = |t: Tensor| -> Result<Tensor> {
            match c.residual_scale {
                1.0 => Ok(t),
                scale => Ok(t.mul_scalar(scale)?),
            }
        };
        let a = layer.self_attn.o_proj.forward(attended)?;
        let (a, pre_mlp) = match c.norms {
            Norms::Pre => (a, Some(&layer.post_attention_layernorm)),
            Norms::Sandwich => (layer.post_attention_layernorm.forward(&a)?, layer.pre_feedforward_layernorm.as_ref()),
            Norms::Post => (layer.post_attention_layernorm.forward(&a)?, None),
        };
        let h = x.add(&branch(a)?)?;
        let n = norm(pre_mlp, h.clone())?;
        let Ok([gate, up]) = <[Tensor; 2]>::try_from(layer.mlp.gate_up.forward(&n)?) else {
            unreachable!("gate and up")
        };
        let gate = match self.config.hidden_act {
            Activation::Silu => gate.silu()?,
            Activation::GeluTanh => gate.gelu_tanh()?,
        };
        let m = layer.mlp.down_proj.forward(&gate.mul(&up)?)?;
        Ok(h.add(&branch(norm(layer.post_feedforward_layernorm.as_ref(), m)?)?)?)
    }

    /// The rows of `ids` in the embedding table, scaled where the model scales them.
    fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        let rows = self.embed_tokens.lookup(ids, DType::F32)?;
        match self.config.embed_scale {
            // `transformers` rounds Gemma's scale to f32, then to the table's dtype; Granite's
            // multiplies in f32.
            Some(scale) => {
                let gemma = matches!(self.config.architecture, Architecture::Gemma2 | Architecture::Gemma3);
                let scale = match self.embed_tokens.table.ty().dtype {
                    DType::BF16 if gemma => fusegraph_ir::bf16_nearest(scale).to_f64(),
                    DType::F16 if gemma => half::f16::from_f32(scale as f32).to_f64(),
                    _ => scale as f32 as f64,
                };
                Ok(rows.mul_scalar(scale)?)
            }
            None => Ok(rows),
        }
    }

    /// Which keys each query reads: `bool [sq, sk]` for queries at `q_pos: i32 [sq, 1]` and
    /// keys at `k_pos: i32 [1, sk]`, causal and within the layer's window.
    fn keep(q_pos: &Tensor, k_pos: &Tensor, window: Option<usize>) -> Result<Tensor> {
        let (sq, sk) = (q_pos.dims()[0], k_pos.dims()[1]);
        Self::keep_at(&q_pos.broadcast_to([sq, sk])?, &k_pos.broadcast_to([sq, sk])?, window)
    }

    /// [`Llama::keep`] of query and key positions of one shape (`[sq, sk]`, or
    /// `[batch, sq, sk]` per sequence).
    fn keep_at(q: &Tensor, k: &Tensor, window: Option<usize>) -> Result<Tensor> {
        let causal = k.le(q)?;
        Ok(match window {
            Some(w) => causal.and(&k.gt(&q.add_scalar(-(w as f64))?)?)?,
            None => causal,
        })
    }
}

impl CausalLm for Llama {
    fn name(&self) -> String {
        let c = &self.config;
        format!(
            "{} {} layers × width {} × {} heads ({} key/value) of {}",
            c.architecture.class_name(),
            c.num_hidden_layers,
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim
        )
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn max_positions(&self) -> usize {
        self.config.max_position_embeddings
    }

    fn cache_shape(&self) -> (usize, usize, usize) {
        (self.config.num_hidden_layers, self.config.num_key_value_heads, self.config.head_dim)
    }

    fn eos_token_ids(&self) -> Vec<i32> {
        self.config.eos_token_ids.clone()
    }

    fn prefill(&self, ids: &Tensor) -> Result<(Tensor, Vec<Kv>)> {
        let (_, seq) = check_ids(self, ids, "prefill")?;
        let b = ids.builder();
        let pos = b.iota(DType::I32, [seq], 0)?;
        let (q_pos, k_pos) = (pos.reshape([seq, 1])?, pos.reshape([1, seq])?);
        // Longrope: one set of frequencies for the whole prompt, by its length, as `transformers`
        // chooses.
        let freq = match self.config.long_inv_freq() {
            Some((long, original)) if seq > original => long,
            _ => self.config.inv_freq(),
        };
        let angles = scaled(rotary_angles(&pos, &freq)?, self.config.rope_attention_factor())?;
        let sliding = self.config.sliding_inv_freq().map(|f| rotary_angles(&pos, &f)).transpose()?;
        let mut h = self.embed(ids)?;
        let mut kvs = Vec::new();
        for ((layer, window), rope) in
            self.layers.iter().zip(&self.config.sliding_windows).zip(&self.config.rope_layers)
        {
            let angles = sliding.as_ref().filter(|_| window.is_some()).unwrap_or(&angles);
            let [q, k, v] = self.qkv(&layer.self_attn, &Self::attention_input(layer, &h)?, rope.then_some(angles))?;
            let a = attend(
                &q,
                &k,
                &v,
                &Self::keep(&q_pos, &k_pos, *window)?,
                self.config.attention_scale,
                self.config.attn_softcap,
            )?;
            h = self.finish_layer(layer, &h, &a)?;
            kvs.push((k, v));
        }
        Ok((self.logits(&h)?, kvs))
    }

    fn decode(&self, ids: &Tensor, pos: &Tensor, cache: &[Kv], live: usize) -> Result<(Tensor, Vec<Kv>)> {
        let (batch, seq) = check_ids(self, ids, "decode")?;
        let live = check_live(self, live, check_cache(self, batch, seq, cache)?)?;
        let b = ids.builder();
        // Each sequence at its own position: angles `[batch, 1, dh/2]`, masks `[batch, 1, live]`.
        let p = row_positions(self, pos, batch)?;
        let per_row = |freq: &[f64]| -> Result<(Tensor, Tensor)> {
            let (cos, sin) = rotary_angles(&p, freq)?;
            let half = cos.dims()[1];
            Ok((cos.reshape([batch, 1, half])?, sin.reshape([batch, 1, half])?))
        };
        let mut angles = per_row(&self.config.inv_freq())?;
        if let Some((long, original)) = self.config.long_inv_freq() {
            // Longrope: each row's long frequencies once its sequence passes the trained context.
            let (cos, sin) = per_row(&long)?;
            let past = p.ge(&b.full(DType::I32, [batch], original as f64)?)?;
            let past = past.broadcast_in_dim(cos.dims().to_vec(), vec![0])?;
            angles = (past.select(&cos, &angles.0)?, past.select(&sin, &angles.1)?);
        }
        let angles = scaled(angles, self.config.rope_attention_factor())?;
        let sliding = self.config.sliding_inv_freq().map(|f| per_row(&f)).transpose()?;
        let q_pos = p.broadcast_in_dim(vec![batch, 1, live], vec![0])?;
        let k_pos = b.iota(DType::I32, [batch, 1, live], 2)?;
        let mut h = self.embed(ids)?;
        let mut updated = Vec::new();
        let layers = self.layers.iter().zip(&self.config.sliding_windows).zip(&self.config.rope_layers);
        for (((layer, window), rope), (kc, vc)) in layers.zip(cache) {
            let angles = sliding.as_ref().filter(|_| window.is_some()).unwrap_or(&angles);
            let [q, k, v] = self.qkv(&layer.self_attn, &Self::attention_input(layer, &h)?, rope.then_some(angles))?;
            let (kc, vc) = (kc.dynamic_update_slice(&k, &p, 2)?, vc.dynamic_update_slice(&v, &p, 2)?);
            let keep = Self::keep_at(&q_pos, &k_pos, *window)?;
            let (k_live, v_live) = (live_part(&kc, live)?, live_part(&vc, live)?);
            let a = attend(&q, &k_live, &v_live, &keep, self.config.attention_scale, self.config.attn_softcap)?;
            h = self.finish_layer(layer, &h, &a)?;
            updated.push((kc, vc));
        }
        Ok((self.logits(&h)?, updated))
    }
}

impl Llama {
    /// The logits `[batch, seq, vocab]` of final hidden states `h: [batch, seq, hidden]`.
    fn logits(&self, h: &Tensor) -> Result<Tensor> {
        let h = self.norm.forward(h)?;
        let logits = match &self.lm_head {
            Some(head) => head.forward(&h)?,
            None => tied_head(&h, &self.embed_tokens)?,
        };
        let logits = match self.config.logits_scaling {
            1.0 => logits,
            by => logits.div(&logits.builder().scalar(logits.dtype(), by)?)?,
        };
        match self.config.final_softcap {
            Some(cap) => soft_cap(&logits, cap),
            None => Ok(logits),
        }
    }
}

impl Forward for Llama {
    /// The logits `[batch, seq, vocab]` of `ids: i32 [batch, seq]` (causal, positions `0..seq`).
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(self.prefill(ids)?.0)
    }
}
