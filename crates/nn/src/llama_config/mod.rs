//! A Llama-family model's shape: `LlamaConfig`, read from the `config.json` that
//! `transformers` 4 or 5 writes for one of the [`Architecture`]s, every difference between
//! them a field.

use crate::error::{config, unsupported, Result};
pub use crate::feed_forward::{Activation, MoeConfig, MoeStyle, Router, SharedExpert};
pub use crate::latent::LatentConfig;
use crate::rope::RopeScaling;
use serde::Deserialize;
use serde_json::Value;

mod mixture;

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
    /// `Olmo3ForCausalLM` (OLMo 3): OLMo 2's layers, three sliding-window layers before each
    /// full one (`layer_types`), the sliding layers' rotary positions unscaled.
    Olmo3,
    /// `SeedOssForCausalLM` (ByteDance Seed-OSS): biases on q, k and v (`attention_bias`,
    /// on by default) and on the output projection apart (`attention_out_bias`).
    SeedOss,
    /// `MinistralForCausalLM` (Ministral 8B): Mistral's layers with a window per layer type
    /// (`layer_types`).
    Ministral,
    /// `Ernie4_5ForCausalLM` (Baidu ERNIE 4.5 dense): rotary pairs interleaved (GPT-J's
    /// pairing), biases on every projection where `use_bias`.
    Ernie45,
    /// `Glm4ForCausalLM` (GLM-4-0414, GLM-Z1): norms before and after each branch (its own
    /// names for them), gate and up one projection, q/k/v biases (`attention_bias`, on by
    /// default), rotary pairs interleaved on half of each head.
    Glm4,
    /// `Ministral3ForCausalLM` (Ministral 3, Mistral Small/Medium 3's text): YaRN, and each
    /// query scaled by `1 + β ln(1 + ⌊pos / original⌋)` (Llama 4's attention temperature).
    Ministral3,
    /// `MixtralForCausalLM`: Mistral's layers with a mixture of experts for each MLP
    /// (`num_local_experts`, the chosen ones' weights normalized), named `block_sparse_moe`.
    Mixtral,
    /// `Qwen2MoeForCausalLM` (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's layers with a mixture of
    /// experts beside a shared expert behind a sigmoid gate.
    Qwen2Moe,
    /// `Qwen3MoeForCausalLM` (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder): Qwen3's layers with a
    /// mixture of experts.
    Qwen3Moe,
    /// `OlmoeForCausalLM` (OLMoE): norms before each branch, RMS norms over the whole q and k
    /// projections, a mixture of experts.
    Olmoe,
    /// `Glm4MoeForCausalLM` (GLM-4.5, GLM-4.5-Air, GLM-4.6): q/k/v biases (`attention_bias`),
    /// rotary positions on half of each head (half-split pairs), per-head q/k norms where
    /// `use_qk_norm`, dense first layers (`first_k_dense_replace`), then mixtures with
    /// DeepSeek-V3's router ([`Router::Sigmoid`]) beside shared experts.
    Glm4Moe,
    /// `GraniteMoeForCausalLM` (IBM Granite 3 MoE): Granite's multipliers, mixtures whose gate
    /// and up are one stack (`block_sparse_moe.input_linear`, [`MoeStyle::Halves`]).
    GraniteMoe,
    /// `Ernie4_5_MoeForCausalLM` (ERNIE 4.5 21B-A3B, 300B-A47B): ERNIE 4.5's layers with
    /// mixtures from `moe_layer_start_index` to `moe_layer_end_index` every
    /// `moe_layer_interval`-th layer, chosen by probability plus a correction bias, beside
    /// shared experts.
    Ernie45Moe,
    /// `GptOssForCausalLM` (OpenAI's gpt-oss): biases on q, k, v and the output, a sink logit
    /// per head, sliding-window layers between full ones, YaRN, and a mixture of experts in
    /// gpt-oss's form ([`MoeStyle::GptOss`]).
    GptOss,
    /// `DeepseekV2ForCausalLM` (DeepSeek-V2, V2-Lite, V2.5): multi-head latent attention
    /// ([`LatentConfig`]), rotary pairs interleaved, dense first layers
    /// (`first_k_dense_replace`), then mixtures with shared experts, chosen by softmax
    /// probability within the best groups ([`Router::SoftmaxGroups`]).
    DeepseekV2,
    /// `DeepseekV3ForCausalLM` (DeepSeek-V3, R1, V3.1; Kimi K2; Moonlight): DeepSeek-V2's
    /// layers with V3's router ([`Router::Sigmoid`]); rotary pairs interleaved where
    /// `rope_interleave` (the default).
    DeepseekV3,
    /// `MiniMaxM2ForCausalLM` (MiniMax-M2, M2.1): RMS norms over the whole q and k projections,
    /// rotary positions on each head's first `rotary_dim`, a mixture on every layer chosen by
    /// sigmoid score plus a correction bias (`block_sparse_moe`, Mixtral's names), the chosen
    /// scores normalized.
    MiniMaxM2,
    /// `Glm4MoeLiteForCausalLM` (GLM-4.7-Flash): DeepSeek-V3's layers — latent attention, a
    /// sigmoid router with a correction bias, shared experts — with GLM's widths, the dense and
    /// sparse layers listed (`mlp_layer_types`).
    Glm4MoeLite,
    /// `Llama4ForCausalLM` (`llama4_text`; Llama 4 Scout and Maverick, whose
    /// `Llama4ForConditionalGeneration` configs hold it as `text_config`): rotary pairs
    /// interleaved on all but every fourth layer, weightless RMS norms on each head's q and k
    /// after the rotation ([`QkNorm::AfterRotation`]), chunked attention on the rotated layers,
    /// a query temperature on the others, and mixtures ([`MoeStyle::Llama4`]) on every
    /// `interleave_moe_layer_step`-th layer.
    Llama4,
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
    /// Llama 4's: over each head, without weights, after the rotation, on the layers with
    /// rotary positions.
    AfterRotation,
}

/// A query temperature: on the layers it names, each query at position `pos` scaled by
/// `1 + β ln(1 + ⌊(pos + shift) / length⌋)` — Llama 4's (`attn_scale` over `floor_scale`,
/// `shift` 1, its layers without rotary positions) and Ministral 3's (`llama_4_scaling_beta`
/// over `original_max_position_embeddings`, `shift` 0, every layer).
#[derive(Clone, Debug, PartialEq)]
pub struct QueryTemperature {
    /// `β`.
    pub beta: f64,
    /// The positions a step of the logarithm spans.
    pub length: usize,
    /// Added to each position first.
    pub shift: usize,
    /// Per layer, whether its queries are scaled.
    pub layers: Vec<bool>,
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
            Architecture::Olmo3 => "Olmo3ForCausalLM",
            Architecture::SeedOss => "SeedOssForCausalLM",
            Architecture::Ministral => "MinistralForCausalLM",
            Architecture::Ernie45 => "Ernie4_5ForCausalLM",
            Architecture::Glm4 => "Glm4ForCausalLM",
            Architecture::Ministral3 => "Ministral3ForCausalLM",
            Architecture::Mixtral => "MixtralForCausalLM",
            Architecture::Qwen2Moe => "Qwen2MoeForCausalLM",
            Architecture::Qwen3Moe => "Qwen3MoeForCausalLM",
            Architecture::Olmoe => "OlmoeForCausalLM",
            Architecture::Glm4Moe => "Glm4MoeForCausalLM",
            Architecture::Ernie45Moe => "Ernie4_5_MoeForCausalLM",
            Architecture::GraniteMoe => "GraniteMoeForCausalLM",
            Architecture::GptOss => "GptOssForCausalLM",
            Architecture::DeepseekV2 => "DeepseekV2ForCausalLM",
            Architecture::DeepseekV3 => "DeepseekV3ForCausalLM",
            Architecture::MiniMaxM2 => "MiniMaxM2ForCausalLM",
            Architecture::Glm4MoeLite => "Glm4MoeLiteForCausalLM",
            Architecture::Llama4 => "Llama4ForCausalLM",
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
    /// Rotary pairs `(2i, 2i + 1)` (GPT-J's, Ernie 4.5's) rather than `(i, i + r/2)`.
    pub rotary_interleaved: bool,
    /// q, k and v as one projection (Phi-3's `qkv_proj`).
    pub fused_qkv: bool,
    /// Gate and up as one projection (Phi-3's and GLM-4's `gate_up_proj`).
    pub fused_gate_up: bool,
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
    /// A query temperature (Llama 4's, Ministral 3's).
    pub query_temperature: Option<QueryTemperature>,
    /// Per layer, the chunk its attention stays within (`attention_chunk_size` on Llama 4's
    /// `chunked_attention` layers): a query at `i` reads keys `j ≤ i` with `⌊j / c⌋ = ⌊i / c⌋`.
    pub attention_chunks: Vec<Option<usize>>,
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
    /// A mixture of experts in place of the MLP on some or all layers.
    pub moe: Option<MoeConfig>,
    /// A sink logit per head in each attention softmax (gpt-oss's `sinks`).
    pub attention_sinks: bool,
    /// A bias on the head (`lm_head.bias`: ERNIE 4.5's where `use_bias`).
    pub head_bias: bool,
    /// Multi-token-prediction layers a checkpoint holds after the decoder's
    /// (`num_nextn_predict_layers`: GLM-4.5's, DeepSeek-V3's), which generation does not use.
    pub mtp_layers: usize,
    /// Multi-head latent attention's widths in place of q, k and v per head (DeepSeek-V2's
    /// and V3's); [`LlamaConfig::head_dim`] is then its rotary part's.
    pub latent: Option<LatentConfig>,
    /// The decoder of a multimodal model (read from its config's `text_config`): its
    /// checkpoints hold it under `language_model.` beside a vision tower, which is not read.
    pub multimodal: bool,
}

/// The `config.json` as written, before its fields are checked.
#[derive(Deserialize)]
pub(super) struct RawConfig {
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
    attention_out_bias: Option<bool>,
    use_bias: Option<bool>,
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
    num_experts: Option<usize>,
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    shared_expert_intermediate_size: Option<usize>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    clip_qkv: Option<f64>,
    swiglu_alpha: Option<f64>,
    swiglu_limit: Option<f64>,
    n_routed_experts: Option<usize>,
    n_shared_experts: Option<usize>,
    n_group: Option<usize>,
    topk_group: Option<usize>,
    routed_scaling_factor: Option<f64>,
    first_k_dense_replace: Option<usize>,
    use_qk_norm: Option<bool>,
    num_nextn_predict_layers: Option<usize>,
    moe_num_experts: Option<usize>,
    moe_k: Option<usize>,
    moe_num_shared_experts: Option<usize>,
    moe_layer_start_index: Option<usize>,
    moe_layer_end_index: Option<i64>,
    moe_layer_interval: Option<usize>,
    #[serde(default, deserialize_with = "present")]
    q_lora_rank: Option<Value>,
    kv_lora_rank: Option<usize>,
    qk_nope_head_dim: Option<usize>,
    qk_rope_head_dim: Option<usize>,
    v_head_dim: Option<usize>,
    topk_method: Option<String>,
    rope_interleave: Option<bool>,
    rotary_dim: Option<usize>,
    mlp_layer_types: Option<Vec<String>>,
    intermediate_size_mlp: Option<usize>,
    attention_chunk_size: Option<usize>,
    attn_temperature_tuning: Option<Value>,
    floor_scale: Option<usize>,
    attn_scale: Option<f64>,
    interleave_moe_layer_step: Option<usize>,
    moe_layers: Option<Vec<usize>>,
}

/// A field as written, `null` included (`Some(Value::Null)`; a missing field is `None`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
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
        // A multimodal model's config (Gemma 3's, Llama 4's, Mistral Small 3's
        // `…ForConditionalGeneration`) holds its decoder's as `text_config`, named by its
        // `model_type`: that decoder, its token ids taken from the outer config where it has none,
        // its head tied as the outer config says.
        let v: Value = serde_json::from_str(text).map_err(|e| config(format!("config.json: {e}")))?;
        let class = v.pointer("/architectures/0").and_then(Value::as_str).unwrap_or_default();
        if let (true, Some(Value::Object(inner))) = (class.ends_with("ForConditionalGeneration"), v.get("text_config"))
        {
            let mut inner = inner.clone();
            inner.remove("architectures");
            for key in ["eos_token_id", "bos_token_id", "dtype", "torch_dtype"] {
                if let (false, Some(outer)) = (inner.contains_key(key), v.get(key)) {
                    inner.insert(key.into(), outer.clone());
                }
            }
            // The outer model ties its head (`transformers` reads the outer config's flag).
            if let Some(tied) = v.get("tie_word_embeddings") {
                inner.insert("tie_word_embeddings".into(), tied.clone());
            }
            let mut c = Self::from_json(&Value::Object(inner).to_string())?;
            c.multimodal = true;
            return Ok(c);
        }
        let raw: RawConfig = serde_json::from_value(v).map_err(|e| config(format!("config.json: {e}")))?;
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
            Some("Olmo3ForCausalLM" | "olmo3") => Architecture::Olmo3,
            Some("SeedOssForCausalLM" | "seed_oss") => Architecture::SeedOss,
            Some("MinistralForCausalLM" | "ministral") => Architecture::Ministral,
            Some("Ernie4_5ForCausalLM" | "ernie4_5") => Architecture::Ernie45,
            Some("Glm4ForCausalLM" | "glm4") => Architecture::Glm4,
            Some("Ministral3ForCausalLM" | "ministral3") => Architecture::Ministral3,
            Some("MixtralForCausalLM" | "mixtral") => Architecture::Mixtral,
            Some("Qwen2MoeForCausalLM" | "qwen2_moe") => Architecture::Qwen2Moe,
            Some("Qwen3MoeForCausalLM" | "qwen3_moe") => Architecture::Qwen3Moe,
            Some("OlmoeForCausalLM" | "olmoe") => Architecture::Olmoe,
            Some("GptOssForCausalLM" | "gpt_oss") => Architecture::GptOss,
            Some("Glm4MoeForCausalLM" | "glm4_moe") => Architecture::Glm4Moe,
            Some("Ernie4_5_MoeForCausalLM" | "ernie4_5_moe") => Architecture::Ernie45Moe,
            Some("GraniteMoeForCausalLM" | "granitemoe") => Architecture::GraniteMoe,
            Some("DeepseekV2ForCausalLM" | "deepseek_v2") => Architecture::DeepseekV2,
            Some("DeepseekV3ForCausalLM" | "deepseek_v3") => Architecture::DeepseekV3,
            Some("MiniMaxM2ForCausalLM" | "minimax_m2") => Architecture::MiniMaxM2,
            Some("Glm4MoeLiteForCausalLM" | "glm4_moe_lite") => Architecture::Glm4MoeLite,
            Some("Llama4ForCausalLM" | "llama4_text") => Architecture::Llama4,
            Some(other) => {
                return Err(unsupported(
                    "architectures",
                    other,
                    "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, Gemma3ForCausalLM, \
                     Gemma2ForCausalLM, Phi3ForCausalLM, SmolLM3ForCausalLM, GraniteForCausalLM, Olmo2ForCausalLM, Olmo3ForCausalLM, SeedOssForCausalLM, \
                     MinistralForCausalLM, Ernie4_5ForCausalLM, Glm4ForCausalLM, Ministral3ForCausalLM, \
                     MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM, Glm4MoeForCausalLM, Ernie4_5_MoeForCausalLM, GraniteMoeForCausalLM, GptOssForCausalLM, \
                     DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, MiniMaxM2ForCausalLM, Glm4MoeLiteForCausalLM, \
                     Llama4ForCausalLM or Llama4ForConditionalGeneration",
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
        let latent = Self::latent(architecture, &raw)?;
        let head_dim = match (latent, raw.head_dim) {
            // Latent attention's rotary part, as `transformers` sets `head_dim`.
            (Some(l), _) => l.qk_rope_head_dim,
            (None, Some(d)) => d,
            (None, None) if hidden_size % heads == 0 => hidden_size / heads,
            (None, None) => {
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
        if let Some(clip) = raw.clip_qkv {
            return Err(unsupported("clip_qkv", clip, "null (q, k and v unclipped)"));
        }
        if raw.use_bidirectional_attention == Some(true) {
            return Err(unsupported("use_bidirectional_attention", true, "false (causal attention)"));
        }
        // The rotated part of each head: `partial_rotary_factor` at the top level or, in
        // `transformers` 5, among the rotary parameters.
        let partial = raw
            .partial_rotary_factor
            .or_else(|| {
                raw.rope_parameters.as_ref().and_then(|p| p.get("partial_rotary_factor")).and_then(Value::as_f64)
            })
            .or(matches!(architecture, Architecture::Glm4 | Architecture::Glm4Moe).then_some(0.5))
            // MiniMax-M2's released configs give the rotated width itself.
            .or(raw.rotary_dim.filter(|_| architecture == Architecture::MiniMaxM2).map(|r| r as f64 / head_dim as f64));
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
        let bias_by_default = matches!(architecture, Architecture::SeedOss | Architecture::Glm4 | Architecture::GptOss);
        let ernie = matches!(architecture, Architecture::Ernie45 | Architecture::Ernie45Moe);
        let attention_bias = match ernie {
            true => raw.use_bias.unwrap_or(false),
            false => raw.attention_bias.unwrap_or(bias_by_default),
        };
        // SmolLM3: `no_rope_layers` (1 where rotary positions apply), else none on every
        // `no_rope_layer_interval`-th layer.
        let no_rope = matches!(architecture, Architecture::SmolLM3 | Architecture::Llama4);
        let rope_layers: Vec<bool> = match (no_rope, &raw.no_rope_layers) {
            (true, Some(l)) if l.len() == layers => l.iter().map(|&r| r != 0).collect(),
            (true, Some(l)) => {
                let want = format!("{layers} entries (num_hidden_layers)");
                return Err(unsupported("no_rope_layers", format!("{} entries", l.len()), &want));
            }
            (true, None) => {
                let every = raw.no_rope_layer_interval.unwrap_or(4).max(1);
                (0..layers).map(|i| (i + 1) % every != 0).collect()
            }
            _ => vec![true; layers],
        };
        // Ministral 3: Llama 4's temperature, from the rotary parameters.
        let query_temperature = match architecture {
            Architecture::Ministral3 => {
                let params = raw.rope_parameters.as_ref().or(raw.rope_scaling.as_ref());
                let get = |k: &str| params.and_then(|p| p.get(k)).and_then(Value::as_f64);
                match (get("llama_4_scaling_beta"), get("original_max_position_embeddings")) {
                    (Some(beta), Some(length)) if length >= 1.0 => {
                        Some(QueryTemperature { beta, length: length as usize, shift: 0, layers: vec![true; layers] })
                    }
                    (Some(beta), _) => {
                        let msg = "a positive rope_parameters.original_max_position_embeddings beside it";
                        return Err(unsupported("rope_parameters.llama_4_scaling_beta", beta, msg));
                    }
                    _ => None,
                }
            }
            // Llama 4: on its layers without rotary positions, where tuned.
            // (`attn_temperature_tuning` a flag, or in the released configs a number: on unless 0.)
            Architecture::Llama4
                if !matches!(&raw.attn_temperature_tuning, Some(Value::Bool(false)))
                    && raw.attn_temperature_tuning.as_ref().and_then(Value::as_f64) != Some(0.0) =>
            {
                let length = raw.floor_scale.unwrap_or(8192);
                if length == 0 {
                    return Err(unsupported("floor_scale", 0, "a positive number of positions"));
                }
                let layers = rope_layers.iter().map(|r| !r).collect();
                Some(QueryTemperature { beta: raw.attn_scale.unwrap_or(0.1), length, shift: 1, layers })
            }
            _ => None,
        };
        // Llama 4's chunked attention, by `layer_types` (its default: the rotated layers).
        let attention_chunks = match (architecture, raw.attention_chunk_size.filter(|&c| c > 0)) {
            (Architecture::Llama4, Some(chunk)) => match &raw.layer_types {
                Some(types) => types.iter().map(|t| (t == "chunked_attention").then_some(chunk)).collect(),
                None => rope_layers.iter().map(|&r| r.then_some(chunk)).collect(),
            },
            _ => vec![None; layers],
        };
        let granite = matches!(architecture, Architecture::Granite | Architecture::GraniteMoe);
        let multiplier = |field: &str, v: Option<f64>| -> Result<f64> {
            match v.unwrap_or(1.0) {
                m if m.is_finite() && m > 0.0 => Ok(m),
                m => Err(unsupported(field, m, "a positive number")),
            }
        };
        let attention_scale = match (granite, raw.attention_multiplier, latent) {
            (true, m, _) => multiplier("attention_multiplier", m)?,
            (_, _, Some(l)) => crate::latent::latent_scale(&l, Self::yarn_all_dim(&raw)),
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
            // Llama 4's dense layers are `intermediate_size_mlp` wide (its experts the other).
            intermediate_size: match architecture {
                Architecture::Llama4 => need("intermediate_size_mlp", raw.intermediate_size_mlp.or(Some(16384)))?,
                _ => need("intermediate_size", raw.intermediate_size)?,
            },
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rotary_dim,
            rotary_interleaved: match architecture {
                Architecture::DeepseekV2 | Architecture::Llama4 => true,
                Architecture::DeepseekV3 | Architecture::Glm4MoeLite => raw.rope_interleave.unwrap_or(true),
                _ => ernie || architecture == Architecture::Glm4,
            },
            fused_qkv: architecture == Architecture::Phi3,
            fused_gate_up: matches!(architecture, Architecture::Phi3 | Architecture::Glm4),
            max_position_embeddings: need("max_position_embeddings", raw.max_position_embeddings)?,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            rope_factors: None,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(gemma),
            qkv_bias: matches!(architecture, Architecture::Qwen2 | Architecture::Qwen2Moe) || attention_bias,
            qk_norm: match architecture {
                Architecture::Qwen3 | Architecture::Qwen3Moe | Architecture::Gemma3 => QkNorm::PerHead,
                Architecture::Glm4Moe if raw.use_qk_norm == Some(true) => QkNorm::PerHead,
                Architecture::Olmo2 | Architecture::Olmo3 | Architecture::Olmoe => QkNorm::Whole,
                Architecture::MiniMaxM2 if raw.use_qk_norm != Some(false) => QkNorm::Whole,
                Architecture::Llama4 if raw.use_qk_norm != Some(false) => QkNorm::AfterRotation,
                _ => QkNorm::None,
            },
            norm_offset: if gemma { 1.0 } else { 0.0 },
            norms: match architecture {
                _ if gemma => Norms::Sandwich,
                Architecture::Glm4 => Norms::Sandwich,
                Architecture::Olmo2 | Architecture::Olmo3 => Norms::Post,
                _ => Norms::Pre,
            },
            hidden_act,
            attention_scale,
            embed_scale,
            residual_scale,
            logits_scaling,
            rope_layers,
            query_temperature,
            attention_chunks,
            sliding_rope,
            attn_softcap,
            final_softcap,
            o_bias: match architecture {
                Architecture::Qwen2 | Architecture::Qwen2Moe | Architecture::Glm4Moe => false,
                Architecture::SeedOss => raw.attention_out_bias.unwrap_or(false),
                Architecture::Glm4 => false,
                _ => attention_bias,
            },
            mlp_bias: if ernie { attention_bias } else { raw.mlp_bias.unwrap_or(false) },
            sliding_windows,
            eos_token_ids: token_ids("eos_token_id", &raw.eos_token_id)?,
            bos_token_id: token_ids("bos_token_id", &raw.bos_token_id)?.first().copied(),
            moe: mixture::mixture(architecture, &raw, layers)?,
            attention_sinks: architecture == Architecture::GptOss,
            mtp_layers: raw.num_nextn_predict_layers.unwrap_or(0),
            head_bias: architecture == Architecture::Ernie45Moe && attention_bias,
            latent,
            multimodal: false,
        })
    }

    /// DeepSeek's multi-head latent attention widths (`transformers`' defaults where a field
    /// is left out; `q_lora_rank: null` for an uncompressed `q_proj`), `None` for the other
    /// classes.
    fn latent(arch: Architecture, raw: &RawConfig) -> Result<Option<LatentConfig>> {
        // (q_lora_rank, qk_nope_head_dim, v_head_dim) by class.
        let (q_rank, nope, v) = match arch {
            Architecture::DeepseekV2 | Architecture::DeepseekV3 => (1536, 128, 128),
            Architecture::Glm4MoeLite => (768, 192, 256),
            _ => return Ok(None),
        };
        let q_lora_rank = match &raw.q_lora_rank {
            None => Some(q_rank),
            Some(Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .filter(|&r| r > 0)
                    .ok_or_else(|| unsupported("q_lora_rank", v, "null (one q_proj) or a positive width"))?
                    as usize,
            ),
        };
        let c = LatentConfig {
            q_lora_rank,
            kv_lora_rank: raw.kv_lora_rank.unwrap_or(512),
            qk_nope_head_dim: raw.qk_nope_head_dim.unwrap_or(nope),
            qk_rope_head_dim: raw.qk_rope_head_dim.unwrap_or(64),
            v_head_dim: raw.v_head_dim.unwrap_or(v),
        };
        for (field, width) in [
            ("kv_lora_rank", c.kv_lora_rank),
            ("qk_nope_head_dim", c.qk_nope_head_dim),
            ("v_head_dim", c.v_head_dim),
            ("qk_rope_head_dim", c.qk_rope_head_dim),
        ] {
            if width == 0 || (field == "qk_rope_head_dim" && width % 2 != 0) {
                return Err(unsupported(field, width, "a positive width (the rotary one even)"));
            }
        }
        Ok(Some(c))
    }

    /// YaRN's `(factor, mscale_all_dim)` where the rotary scaling is not the default and
    /// gives both: latent attention's scores take `mscale(factor, mscale_all_dim)²`.
    fn yarn_all_dim(raw: &RawConfig) -> Option<(f64, f64)> {
        let p = raw.rope_parameters.as_ref().filter(|p| !p.is_null()).or(raw.rope_scaling.as_ref())?;
        let kind = p.get("rope_type").or_else(|| p.get("type")).and_then(Value::as_str).unwrap_or("default");
        let get = |k: &str| p.get(k).and_then(Value::as_f64);
        (kind != "default").then(|| get("factor").zip(get("mscale_all_dim"))).flatten()
    }

    /// Per layer, its window: `layer_types` where given; Mistral's and Phi-3's `sliding_window`
    /// on every layer; Qwen2's and Qwen3's on layers from `max_window_layers` when `use_sliding_window`;
    /// Gemma 3's on all but every `sliding_window_pattern`-th (6) layer; OLMo 3's on all but
    /// every fourth; Gemma 2's and gpt-oss's on the even layers.
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
                    // Llama 4's chunks (`LlamaConfig::attention_chunks`).
                    ("chunked_attention", _) if arch == Architecture::Llama4 => Ok(None),
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
                Architecture::Mistral | Architecture::Phi3 | Architecture::Ministral | Architecture::Mixtral => window,
                Architecture::Qwen2 | Architecture::Qwen3 | Architecture::Qwen2Moe | Architecture::Qwen3Moe
                    if raw.use_sliding_window == Some(true) =>
                {
                    window.filter(|_| i >= raw.max_window_layers.unwrap_or(0))
                }
                Architecture::Gemma3 => {
                    window.filter(|_| (i + 1) % raw.sliding_window_pattern.unwrap_or(6).max(1) != 0)
                }
                Architecture::Gemma2 | Architecture::GptOss => window.filter(|_| i % 2 == 0),
                Architecture::Olmo3 => window.filter(|_| (i + 1) % 4 != 0),
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

    /// The scale of the sliding-window layers' own rotary cos and sin (1 where they have
    /// none of their own).
    pub fn sliding_attention_factor(&self) -> f64 {
        self.sliding_rope.as_ref().map_or(1.0, |(_, scaling)| scaling.attention_factor())
    }

    /// The scale of the rotary angles' cos and sin (longrope's and YaRN's attention factor,
    /// else 1).
    pub fn rope_attention_factor(&self) -> f64 {
        self.rope_scaling.attention_factor()
    }
}
