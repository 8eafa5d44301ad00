//! The Llama-family decoders as Hugging Face `transformers` defines them —
//! `LlamaForCausalLM` (Llama 2, 3, 3.1, 3.2, SmolLM), `Qwen2ForCausalLM`,
//! `Qwen3ForCausalLM`, `MistralForCausalLM`, `Gemma2ForCausalLM`, `Gemma3ForCausalLM`,
//! `Phi3ForCausalLM`, `SmolLM3ForCausalLM`, `GraniteForCausalLM`, `Olmo2ForCausalLM`,
//! `Olmo3ForCausalLM`, `SeedOssForCausalLM`, `MinistralForCausalLM`, `Ernie4_5ForCausalLM`,
//! `Glm4ForCausalLM`, `Ministral3ForCausalLM`, and the mixtures of experts
//! `MixtralForCausalLM`, `Qwen2MoeForCausalLM`, `Qwen3MoeForCausalLM`, `OlmoeForCausalLM`,
//! `Glm4MoeForCausalLM`, `Ernie4_5_MoeForCausalLM`, `GraniteMoeForCausalLM`, `GptOssForCausalLM`,
//! `DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM` and `Glm4MoeLiteForCausalLM` (multi-head
//! latent attention, [`crate::latent`]), `MiniMaxM2ForCausalLM` and `Llama4ForCausalLM` — as
//! one model whose differences are fields of its [`LlamaConfig`]: q/k/v and MLP biases, fused
//! projections, RMS norms on q and k (per head or whole), norms before, around or after each
//! branch and their gains' offset, the MLP's activation, the embeddings', branches', scores'
//! and logits' scales, soft caps on scores and logits, grouped-query attention
//! (`num_key_value_heads`), rotary positions on all or part of each head (pairs half-split
//! or interleaved, on all layers or some) with their scaling (`linear`, `llama3`, `yarn`, `longrope`) and a base of their own for
//! sliding-window layers, a sliding attention window per layer, a head tied to the
//! embeddings or its own, and a mixture of experts in place of the MLP on some or all layers
//! ([`crate::feed_forward`]).
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
    attend, check_cache, check_ids, check_live, live_part, row_positions, soft_cap, tied_head, CacheShape, CausalLm, Kv,
};
use crate::error::{config, Result};
pub use crate::feed_forward::{FeedForward, LlamaMlp, SparseMoe};
use crate::init::Init;
use crate::latent::LatentAttention;
use crate::layers::{rms_normalized, Embedding, Linear, Projections, RmsNorm};
pub use crate::llama_config::{
    Activation, Architecture, LlamaConfig, MoeConfig, MoeStyle, Norms, QkNorm, Router, SharedExpert,
};
use crate::module::{Forward, Scope};
use crate::rope::scaled;
pub use crate::rope::{rotary_angles, rotate, rotate_interleaved, RopeScaling};
use fusegraph_ir::{DType, Tensor};

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
    /// `sinks`, `[heads]`: each head's extra softmax logit ([`LlamaConfig::attention_sinks`]).
    pub sinks: Option<crate::module::Param>,
}

crate::module!(LlamaAttention { qkv, o_proj, q_norm, k_norm, sinks });

/// A layer's attention: heads with their own keys and values (multi-head or grouped-query),
/// or DeepSeek's multi-head latent attention.
#[derive(Clone, Debug, PartialEq)]
pub enum SelfAttention {
    /// q, k and v per head ([`LlamaAttention`]).
    Heads(Box<LlamaAttention>),
    /// Keys and values through a shared latent ([`LatentAttention`]).
    Latent(Box<LatentAttention>),
}

impl crate::module::Module for SelfAttention {
    fn visit(&self, f: &mut dyn FnMut(&crate::module::Param)) {
        match self {
            SelfAttention::Heads(a) => a.visit(f),
            SelfAttention::Latent(a) => a.visit(f),
        }
    }
}

impl SelfAttention {
    /// `o_proj`.
    pub fn o_proj(&self) -> &Linear {
        match self {
            SelfAttention::Heads(a) => &a.o_proj,
            SelfAttention::Latent(a) => &a.o_proj,
        }
    }
}

/// A decoder layer: `h = x + attn(norm(x))`, `out = h + mlp(norm(h))`; with
/// [`Norms::Sandwich`], `h = x + norm(attn(norm(x)))`, `out = h + norm(mlp(norm(h)))`; with
/// [`Norms::Post`], `h = x + norm(attn(x))`, `out = h + norm(mlp(h))`.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaLayer {
    /// `input_layernorm`, but with post norms only.
    pub input_layernorm: Option<RmsNorm>,
    /// `self_attn`.
    pub self_attn: SelfAttention,
    /// `post_attention_layernorm`: the MLP's input norm, or with sandwich or post norms the
    /// attention output's.
    pub post_attention_layernorm: RmsNorm,
    /// `pre_feedforward_layernorm`, with sandwich norms: the MLP's input norm.
    pub pre_feedforward_layernorm: Option<RmsNorm>,
    /// `mlp`: the gated MLP, or a mixture of experts ([`LlamaConfig::moe`]).
    pub mlp: FeedForward,
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
        if c.sliding_windows.len() != c.num_hidden_layers || c.attention_chunks.len() != c.num_hidden_layers {
            return Err(config(format!(
                "Llama: {} sliding windows and {} attention chunks for {} layers",
                c.sliding_windows.len(),
                c.attention_chunks.len(),
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
            QkNorm::None | QkNorm::AfterRotation => Ok(None),
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
                    self_attn: match c.latent {
                        Some(latent) => SelfAttention::Latent(Box::new(LatentAttention::new(
                            &a,
                            d,
                            c.num_attention_heads,
                            latent,
                            c.o_bias,
                        )?)),
                        None => SelfAttention::Heads(Box::new(LlamaAttention {
                            qkv: Projections::new(
                                &a,
                                d,
                                &[("q_proj", c.num_attention_heads * dh), ("k_proj", kv), ("v_proj", kv)],
                                c.fused_qkv.then_some("qkv_proj"),
                                c.qkv_bias,
                            )?,
                            o_proj: linear(&a.at("o_proj"), c.num_attention_heads * dh, d, c.o_bias)?,
                            q_norm: qk_norm(&a.at("q_norm"), c.num_attention_heads)?,
                            k_norm: qk_norm(&a.at("k_norm"), c.num_key_value_heads)?,
                            sinks: c
                                .attention_sinks
                                .then(|| a.param("sinks", &[c.num_attention_heads], Init::Normal(0.02))),
                        })),
                    },
                    post_attention_layernorm: norm(&l.at("post_attention_layernorm"))?,
                    pre_feedforward_layernorm: when(c.norms == Norms::Sandwich, &l.at("pre_feedforward_layernorm"))?,
                    mlp: match &c.moe {
                        Some(moe) if moe.sparse_layers[i] => FeedForward::Sparse(Box::new(SparseMoe::new(&p, d, moe)?)),
                        _ => FeedForward::Dense(Box::new(LlamaMlp::new(
                            &p,
                            d,
                            c.intermediate_size,
                            c.fused_gate_up.then_some("gate_up_proj"),
                            c.mlp_bias,
                        )?)),
                    },
                    post_feedforward_layernorm: when(c.norms != Norms::Pre, &l.at("post_feedforward_layernorm"))?,
                })
            })
            .collect::<Result<_>>()?;
        let lm_head =
            if c.tie_word_embeddings { None } else { Some(linear(&s.at("lm_head"), d, c.vocab_size, c.head_bias)?) };
        Ok(Llama {
            embed_tokens: Embedding::with_init(&m.at("embed_tokens"), c.vocab_size, d, Init::Normal(0.02))?,
            layers,
            norm: norm(&m.at("norm"))?,
            lm_head,
            config: c,
        })
    }

    /// The checkpoint keys that name this model's parameters otherwise (checkpoint key →
    /// parameter path): GLM-4's norms around each branch (`post_self_attn_layernorm` after
    /// attention, `post_attention_layernorm` before the MLP, `post_mlp_layernorm` after it);
    /// Mixtral's mixture (`block_sparse_moe`, its experts' `w1`, `w3` and `w2` for gate, up and
    /// down; MiniMax-M2's too, its correction bias on the mixture); Granite MoE's
    /// (`block_sparse_moe.router.layer`, `input_linear`, `output_linear`).
    pub fn checkpoint_renames(&self) -> Vec<(String, String)> {
        let c = &self.config;
        let layer = |i: usize, from: &str, to: &str| {
            (format!("model.layers.{i}.{from}.weight"), format!("model.layers.{i}.{to}.weight"))
        };
        // Names renamed once per layer: GLM-4's norms, Granite MoE's mixture.
        let per_layer: &[(&str, &str)] = match (c.architecture, &c.moe) {
            (Architecture::Glm4, _) => &[
                ("post_self_attn_layernorm", "post_attention_layernorm"),
                ("post_attention_layernorm", "pre_feedforward_layernorm"),
                ("post_mlp_layernorm", "post_feedforward_layernorm"),
            ],
            // Llama 4's feed-forward branch, `feed_forward`: an MLP, or a mixture whose shared
            // expert is `shared_expert`.
            (Architecture::Llama4, _) => &[
                ("feed_forward.gate_proj", "mlp.gate_proj"),
                ("feed_forward.up_proj", "mlp.up_proj"),
                ("feed_forward.down_proj", "mlp.down_proj"),
                ("feed_forward.router", "mlp.router"),
                ("feed_forward.shared_expert.gate_proj", "mlp.shared_experts.gate_proj"),
                ("feed_forward.shared_expert.up_proj", "mlp.shared_experts.up_proj"),
                ("feed_forward.shared_expert.down_proj", "mlp.shared_experts.down_proj"),
            ],
            (Architecture::GraniteMoe, Some(_)) => &[
                ("block_sparse_moe.router.layer", "mlp.gate"),
                ("block_sparse_moe.input_linear", "mlp.experts.gate_up_proj"),
                ("block_sparse_moe.output_linear", "mlp.experts.down_proj"),
            ],
            _ => &[],
        };
        match (c.architecture, &c.moe) {
            (Architecture::Mixtral | Architecture::MiniMaxM2, Some(moe)) => (0..c.num_hidden_layers)
                .flat_map(|i| {
                    let experts = (0..moe.experts).flat_map(move |e| {
                        [("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")].map(|(from, to)| {
                            layer(i, &format!("block_sparse_moe.experts.{e}.{from}"), &format!("mlp.experts.{e}.{to}"))
                        })
                    });
                    // MiniMax-M2's correction bias sits on the mixture, not its router.
                    let bias = (
                        format!("model.layers.{i}.block_sparse_moe.e_score_correction_bias"),
                        format!("model.layers.{i}.mlp.gate.e_score_correction_bias"),
                    );
                    let bias = (c.architecture == Architecture::MiniMaxM2).then_some(bias);
                    std::iter::once(layer(i, "block_sparse_moe.gate", "mlp.gate")).chain(bias).chain(experts)
                })
                .collect(),
            _ => {
                let mut renames: Vec<_> = (0..c.num_hidden_layers)
                    .flat_map(|i| per_layer.iter().map(move |&(from, to)| layer(i, from, to)))
                    .collect();
                if c.architecture == Architecture::Llama4 {
                    // Its expert stacks, whole parameters without `.weight`.
                    renames.extend((0..c.num_hidden_layers).flat_map(|i| {
                        ["gate_up_proj", "down_proj"].map(|p| {
                            (
                                format!("model.layers.{i}.feed_forward.experts.{p}"),
                                format!("model.layers.{i}.mlp.experts.{p}"),
                            )
                        })
                    }));
                }
                renames
            }
        }
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
            let t = match angles {
                Some((cos, sin)) if c.rotary_interleaved => rotate_interleaved(&t, cos, sin)?,
                Some((cos, sin)) => rotate(&t, cos, sin)?,
                None => t,
            };
            match (c.qk_norm, angles) {
                // Llama 4's: each rotated head over its root mean square, no weights.
                (QkNorm::AfterRotation, Some(_)) => rms_normalized(&t, 3, c.rms_norm_eps),
                _ => Ok(t),
            }
        };
        let Ok([q, k, v]) = <[Tensor; 3]>::try_from(attn.qkv.forward(x)?) else { unreachable!("q, k and v") };
        let q = heads(q, c.num_attention_heads, attn.q_norm.as_ref())?;
        let k = heads(k, c.num_key_value_heads, attn.k_norm.as_ref())?;
        let v = v.reshape([b, s, c.num_key_value_heads, c.head_dim])?.transpose(&[0, 2, 1, 3])?;
        Ok([q, k, v])
    }

    /// The query scale at each of `positions: i32 [n]` (`1 + β ln(1 + ⌊(pos + shift) /
    /// length⌋)`, in f32 as `transformers` computes it), where the model has one.
    fn query_temperature(&self, positions: &Tensor) -> Result<Option<Tensor>> {
        let Some(t) = &self.config.query_temperature else { return Ok(None) };
        let positions = positions.cast(DType::F32)?.add_scalar(t.shift as f64)?;
        let steps = positions.div(&positions.builder().scalar(DType::F32, t.length as f64)?)?.floor()?;
        Ok(Some(steps.add_scalar(1.0)?.log()?.mul_scalar(t.beta)?.add_scalar(1.0)?))
    }

    /// Layer `i`'s query scale: the model's temperature where it applies to the layer.
    fn warmth<'a>(&self, i: usize, temperature: Option<&'a Tensor>) -> Option<&'a Tensor> {
        temperature.filter(|_| self.config.query_temperature.as_ref().is_some_and(|t| t.layers[i]))
    }

    /// The attention scores' scale and soft cap.
    fn scores(&self) -> (f64, Option<f64>) {
        (self.config.attention_scale, self.config.attn_softcap)
    }

    /// A layer's queries and the entries it adds to its caches, from `x: [b, s, hidden]`
    /// (rotated by `angles` where given): q, k and v per head ([`Llama::qkv`]), or latent
    /// attention's queries, latents and rotary keys ([`LatentAttention::project`]).
    fn project(&self, layer: &LlamaLayer, x: &Tensor, angles: Option<&(Tensor, Tensor)>) -> Result<[Tensor; 3]> {
        match (&layer.self_attn, angles) {
            (SelfAttention::Heads(a), _) => self.qkv(a, x, angles),
            (SelfAttention::Latent(a), Some(angles)) => a.project(x, angles, self.config.rotary_interleaved),
            (SelfAttention::Latent(_), None) => Err(config("latent attention without rotary positions")),
        }
    }

    /// A layer's attention of `q` over its cached `k` and `v` (as [`Llama::project`] gives
    /// them) under `keep` → `[b, sq, o_proj's input]`.
    fn attention(&self, layer: &LlamaLayer, q: &Tensor, k: &Tensor, v: &Tensor, keep: &Tensor) -> Result<Tensor> {
        match &layer.self_attn {
            SelfAttention::Heads(a) => {
                // gpt-oss's attention sinks, as f32.
                let sinks = a.sinks.as_ref().map(|p| p.read(q.builder(), DType::F32)).transpose()?;
                attend(q, k, v, keep, self.scores(), sinks.as_ref())
            }
            SelfAttention::Latent(a) => a.attend(q, k, v, keep, self.scores()),
        }
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
        let a = layer.self_attn.o_proj().forward(attended)?;
        let (a, pre_mlp) = match c.norms {
            Norms::Pre => (a, Some(&layer.post_attention_layernorm)),
            Norms::Sandwich => (layer.post_attention_layernorm.forward(&a)?, layer.pre_feedforward_layernorm.as_ref()),
            Norms::Post => (layer.post_attention_layernorm.forward(&a)?, None),
        };
        let h = x.add(&branch(a)?)?;
        let n = norm(pre_mlp, h.clone())?;
        let m = layer.mlp.forward(&n, c.hidden_act)?;
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
    /// keys at `k_pos: i32 [1, sk]`, causal and within the layer's window and chunk.
    fn keep(q_pos: &Tensor, k_pos: &Tensor, window: Option<usize>, chunk: Option<usize>) -> Result<Tensor> {
        let (sq, sk) = (q_pos.dims()[0], k_pos.dims()[1]);
        Self::keep_at(&q_pos.broadcast_to([sq, sk])?, &k_pos.broadcast_to([sq, sk])?, window, chunk)
    }

    /// [`Llama::keep`] of query and key positions of one shape (`[sq, sk]`, or
    /// `[batch, sq, sk]` per sequence).
    fn keep_at(q: &Tensor, k: &Tensor, window: Option<usize>, chunk: Option<usize>) -> Result<Tensor> {
        let causal = k.le(q)?;
        let keep = match window {
            Some(w) => causal.and(&k.gt(&q.add_scalar(-(w as f64))?)?)?,
            None => causal,
        };
        Ok(match chunk {
            // The same chunk: `⌊q / c⌋ = ⌊k / c⌋` (positions are exact in f32).
            Some(c) => {
                let chunk_of = |t: &Tensor| -> Result<Tensor> {
                    Ok(t.cast(DType::F32)?.div(&t.builder().scalar(DType::F32, c as f64)?)?.floor()?)
                };
                keep.and(&chunk_of(q)?.eq(&chunk_of(k)?)?)?
            }
            None => keep,
        })
    }
}

impl CausalLm for Llama {
    fn name(&self) -> String {
        let c = &self.config;
        let heads = match c.latent {
            Some(l) => format!(
                "{} heads over a latent of {} + {} rotary",
                c.num_attention_heads, l.kv_lora_rank, l.qk_rope_head_dim
            ),
            None => format!("{} heads ({} key/value) of {}", c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        };
        format!("{} {} layers × width {} × {heads}", c.architecture.class_name(), c.num_hidden_layers, c.hidden_size)
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn max_positions(&self) -> usize {
        self.config.max_position_embeddings
    }

    fn cache_shape(&self) -> CacheShape {
        let c = &self.config;
        match c.latent {
            // One head: the latent in the keys' place, the rotary key in the values'.
            Some(l) => CacheShape {
                layers: c.num_hidden_layers,
                heads: 1,
                key_width: l.kv_lora_rank,
                value_width: l.qk_rope_head_dim,
            },
            None => CacheShape::uniform(c.num_hidden_layers, c.num_key_value_heads, c.head_dim),
        }
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
        let sliding = sliding.map(|a| scaled(a, self.config.sliding_attention_factor())).transpose()?;
        let temperature = self.query_temperature(&pos)?;
        let mut h = self.embed(ids)?;
        let mut kvs = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let c = &self.config;
            let (window, chunk, rope) = (c.sliding_windows[i], c.attention_chunks[i], c.rope_layers[i]);
            let angles = sliding.as_ref().filter(|_| window.is_some()).unwrap_or(&angles);
            let [q, k, v] = self.project(layer, &Self::attention_input(layer, &h)?, rope.then_some(angles))?;
            let q = warmed(q, self.warmth(i, temperature.as_ref()), &[2])?;
            let keep = Self::keep(&q_pos, &k_pos, window, chunk)?;
            let a = self.attention(layer, &q, &k, &v, &keep)?;
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
        let sliding = sliding.map(|a| scaled(a, self.config.sliding_attention_factor())).transpose()?;
        let temperature = self.query_temperature(&p)?;
        let q_pos = p.broadcast_in_dim(vec![batch, 1, live], vec![0])?;
        let k_pos = b.iota(DType::I32, [batch, 1, live], 2)?;
        let mut h = self.embed(ids)?;
        let mut updated = Vec::new();
        for (i, (layer, (kc, vc))) in self.layers.iter().zip(cache).enumerate() {
            let c = &self.config;
            let (window, chunk, rope) = (c.sliding_windows[i], c.attention_chunks[i], c.rope_layers[i]);
            let angles = sliding.as_ref().filter(|_| window.is_some()).unwrap_or(&angles);
            let [q, k, v] = self.project(layer, &Self::attention_input(layer, &h)?, rope.then_some(angles))?;
            let q = warmed(q, self.warmth(i, temperature.as_ref()), &[0])?;
            let (kc, vc) = (kc.dynamic_update_slice(&k, &p, 2)?, vc.dynamic_update_slice(&v, &p, 2)?);
            let keep = Self::keep_at(&q_pos, &k_pos, window, chunk)?;
            let (k_live, v_live) = (live_part(&kc, live)?, live_part(&vc, live)?);
            let a = self.attention(layer, &q, &k_live, &v_live, &keep)?;
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

/// `q: [b, h, s, dh]` times a per-position `scale` (`[n]`, laid along `q`'s axes `map`), or
/// `q` where there is none.
fn warmed(q: Tensor, scale: Option<&Tensor>, map: &[usize]) -> Result<Tensor> {
    match scale {
        Some(s) => Ok(q.mul(&s.broadcast_in_dim(q.dims().to_vec(), map.to_vec())?)?),
        None => Ok(q),
    }
}
