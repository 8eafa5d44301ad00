//! Multi-head latent attention (MLA): DeepSeek-V2's and V3's attention, as `transformers`
//! defines it (`DeepseekV2Attention`, `DeepseekV3Attention`).
//!
//! Each position's keys and values are compressed into one latent vector
//! (`kv_a_proj_with_mqa`, then `kv_a_layernorm`: `kv_lora_rank` wide) beside one rotary key
//! shared by all heads (`qk_rope_head_dim` wide). `kv_b_proj` expands the latent into each
//! head's unrotated key part (`qk_nope_head_dim`) and its value (`v_head_dim`).
//!
//! The cache holds the latent and the rotary key, not the expanded keys and values — one
//! head of `kv_lora_rank + qk_rope_head_dim` per position (576 for DeepSeek-V3, against 128
//! heads × 320 expanded) — and attention never expands them: `kv_b_proj`'s key half is
//! absorbed into the queries (each head's `q_nope · W_UKᵀ`, a query over the latent), the
//! scores are those queries against the latents plus the rotary queries against the rotary
//! keys (one key head for all query heads: grouped-query attention with a single group), the
//! probabilities weigh the latents, and `kv_b_proj`'s value half maps each head's weighted
//! latent to its value width. The scores and outputs equal the expanded form's up to
//! rounding; a decode step reads `kv_lora_rank + qk_rope_head_dim` floats per cached position
//! and layer.

use crate::causal::attend;
use crate::error::{config, Result};
use crate::init::Init;
use crate::layers::{Linear, RmsNorm};
use crate::module::{Forward, Scope};
use crate::rope::{rotate, rotate_interleaved};
use fusegraph_ir::Tensor;

/// The widths of multi-head latent attention (`config.json`'s fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatentConfig {
    /// The queries' compression (`q_lora_rank`): `q_a_proj`, `q_a_layernorm`, `q_b_proj`;
    /// `None`: one `q_proj` (DeepSeek-V2-Lite's).
    pub q_lora_rank: Option<usize>,
    /// The latent's width (`kv_lora_rank`).
    pub kv_lora_rank: usize,
    /// Each head's unrotated query and key part (`qk_nope_head_dim`).
    pub qk_nope_head_dim: usize,
    /// The rotated part (`qk_rope_head_dim`), the rotary key's width.
    pub qk_rope_head_dim: usize,
    /// Each head's value width (`v_head_dim`).
    pub v_head_dim: usize,
}

impl LatentConfig {
    /// Each head's query and key width (`qk_nope_head_dim + qk_rope_head_dim`), whose
    /// `−½` power scales the scores.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }
}

/// The RMS norms' epsilon inside the attention (`transformers` builds `q_a_layernorm` and
/// `kv_a_layernorm` with its default, not `rms_norm_eps`).
const NORM_EPS: f64 = 1e-6;

/// Multi-head latent attention's parameters (names as `transformers`').
#[derive(Clone, Debug, PartialEq)]
pub struct LatentAttention {
    /// `q_proj` (`hidden → heads · qk_head_dim`) where the queries are not compressed.
    pub q_proj: Option<Linear>,
    /// `q_a_proj` (`hidden → q_lora_rank`).
    pub q_a_proj: Option<Linear>,
    /// `q_a_layernorm` over `q_lora_rank`.
    pub q_a_layernorm: Option<RmsNorm>,
    /// `q_b_proj` (`q_lora_rank → heads · qk_head_dim`).
    pub q_b_proj: Option<Linear>,
    /// `kv_a_proj_with_mqa` (`hidden → kv_lora_rank + qk_rope_head_dim`): the latent and the
    /// rotary key.
    pub kv_a_proj_with_mqa: Linear,
    /// `kv_a_layernorm` over the latent.
    pub kv_a_layernorm: RmsNorm,
    /// `kv_b_proj` (`kv_lora_rank → heads · (qk_nope_head_dim + v_head_dim)`), each head's
    /// key part then its value.
    pub kv_b_proj: Linear,
    /// `o_proj` (`heads · v_head_dim → hidden`).
    pub o_proj: Linear,
    /// Its widths.
    pub config: LatentConfig,
    /// Query heads.
    pub heads: usize,
}

crate::module!(LatentAttention {
    q_proj,
    q_a_proj,
    q_a_layernorm,
    q_b_proj,
    kv_a_proj_with_mqa,
    kv_a_layernorm,
    kv_b_proj,
    o_proj
});

impl LatentAttention {
    /// The attention of `heads` heads over width `hidden` under `s` (`self_attn`), biases on
    /// `q_a_proj`, `kv_a_proj_with_mqa` and `o_proj` where `bias` (`attention_bias`).
    pub fn new(s: &Scope, hidden: usize, heads: usize, c: LatentConfig, bias: bool) -> Result<Self> {
        if [c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim].contains(&0)
            || c.qk_rope_head_dim % 2 != 0
            || c.q_lora_rank == Some(0)
        {
            return Err(config(format!(
                "latent attention `{}`: widths {c:?} must be ≥ 1, the rotary one even",
                s.path()
            )));
        }
        let linear = |name: &str, i: usize, o: usize, bias: bool| {
            Linear::with_init(&s.at(name), i, o, Init::Normal(0.02), bias.then_some(Init::Zeros))
        };
        let norm = |name: &str, width: usize| -> Result<RmsNorm> {
            let mut n = RmsNorm::new(&s.at(name), width)?;
            n.eps = NORM_EPS;
            Ok(n)
        };
        let q_width = heads * c.qk_head_dim();
        let (q_proj, q_a_proj, q_a_layernorm, q_b_proj) = match c.q_lora_rank {
            None => (Some(linear("q_proj", hidden, q_width, false)?), None, None, None),
            Some(rank) => (
                None,
                Some(linear("q_a_proj", hidden, rank, bias)?),
                Some(norm("q_a_layernorm", rank)?),
                Some(linear("q_b_proj", rank, q_width, false)?),
            ),
        };
        Ok(LatentAttention {
            q_proj,
            q_a_proj,
            q_a_layernorm,
            q_b_proj,
            kv_a_proj_with_mqa: linear("kv_a_proj_with_mqa", hidden, c.kv_lora_rank + c.qk_rope_head_dim, bias)?,
            kv_a_layernorm: norm("kv_a_layernorm", c.kv_lora_rank)?,
            kv_b_proj: linear("kv_b_proj", c.kv_lora_rank, heads * (c.qk_nope_head_dim + c.v_head_dim), false)?,
            o_proj: linear("o_proj", heads * c.v_head_dim, hidden, bias)?,
            config: c,
            heads,
        })
    }

    /// `kv_b_proj` split per head: its key half `[heads, qk_nope, kv_lora_rank]` (read
    /// transposed: the queries' absorption) and its value half `[heads, kv_lora_rank, v]`.
    fn up_projections(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let c = &self.config;
        let w = self.kv_b_proj.matrix(x.builder(), x.dtype())?;
        let w = w.reshape([c.kv_lora_rank, self.heads, c.qk_nope_head_dim + c.v_head_dim])?;
        let keys = w.narrow(2, 0, c.qk_nope_head_dim)?.transpose(&[1, 2, 0])?;
        let values = w.narrow(2, c.qk_nope_head_dim, c.v_head_dim)?.transpose(&[1, 0, 2])?;
        Ok((keys, values))
    }

    /// `x: [b, s, hidden]` → the queries over latent and rotary key `[b, heads, s,
    /// kv_lora_rank + qk_rope]`, and the cache's entries for these positions: the latents `[b,
    /// 1, s, kv_lora_rank]` and the rotary keys `[b, 1, s, qk_rope]`. `angles`: the cosines and
    /// sines of the rotary positions; `interleaved`: rotary pairs `(2i, 2i + 1)`.
    pub fn project(&self, x: &Tensor, angles: &(Tensor, Tensor), interleaved: bool) -> Result<[Tensor; 3]> {
        let c = &self.config;
        let &[b, s, _] = x.dims() else {
            return Err(config(format!("latent attention: input {} must be [batch, seq, hidden]", x.ty())));
        };
        let (heads, nope, rope, rank) = (self.heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.kv_lora_rank);
        let q = match (&self.q_proj, &self.q_a_proj, &self.q_a_layernorm, &self.q_b_proj) {
            (Some(q), ..) => q.forward(x)?,
            (None, Some(a), Some(norm), Some(up)) => up.forward(&norm.forward(&a.forward(x)?)?)?,
            _ => return Err(config("latent attention: neither q_proj nor q_a_proj, q_a_layernorm and q_b_proj")),
        };
        let q = q.reshape([b, s, heads, nope + rope])?.transpose(&[0, 2, 1, 3])?;
        let compressed = self.kv_a_proj_with_mqa.forward(x)?;
        let latent = self.kv_a_layernorm.forward(&compressed.narrow(2, 0, rank)?)?.reshape([b, 1, s, rank])?;
        let k_rope = compressed.narrow(2, rank, rope)?.reshape([b, 1, s, rope])?;
        let rotated = |t: &Tensor| match interleaved {
            true => rotate_interleaved(t, &angles.0, &angles.1),
            false => rotate(t, &angles.0, &angles.1),
        };
        let (q_rope, k_rope) = (rotated(&q.narrow(3, nope, rope)?)?, rotated(&k_rope)?);
        // Each head's unrotated query through its key up-projection: a query over the latent.
        let (up_keys, _) = self.up_projections(x)?;
        let q_nope = q.narrow(3, 0, nope)?.transpose(&[1, 0, 2, 3])?.reshape([heads, b * s, nope])?;
        let q_latent = q_nope.matmul(&up_keys)?.reshape([heads, b, s, rank])?.transpose(&[1, 0, 2, 3])?;
        Ok([x.builder().concat(&[&q_latent, &q_rope], 3)?, latent, k_rope])
    }

    /// Attention of `q` (from [`LatentAttention::project`]) over cached `latents: [b, 1, sk,
    /// kv_lora_rank]` and rotary keys `[b, 1, sk, qk_rope]` under `keep` (as
    /// [`crate::causal`]'s `attend` takes it), scores scaled by `scale` and capped at `cap`
    /// where given → each head's value `[b, sq, heads · v_head_dim]`, for `o_proj`.
    pub fn attend(
        &self,
        q: &Tensor,
        latents: &Tensor,
        k_rope: &Tensor,
        keep: &Tensor,
        scores: (f64, Option<f64>),
    ) -> Result<Tensor> {
        let (heads, rank, v) = (self.heads, self.config.kv_lora_rank, self.config.v_head_dim);
        let keys = q.builder().concat(&[latents, k_rope], 3)?;
        let weighed = attend(q, &keys, latents, keep, scores, None)?;
        let (b, sq) = (weighed.dims()[0], weighed.dims()[1]);
        let (_, up_values) = self.up_projections(q)?;
        let weighed = weighed.reshape([b * sq, heads, rank])?.transpose(&[1, 0, 2])?;
        let values = weighed.matmul(&up_values)?;
        Ok(values.transpose(&[1, 0, 2])?.reshape([b, sq, heads * v])?)
    }
}

/// The scores' scale of multi-head latent attention: `qk_head_dim^-½`, times YaRN's
/// `mscale(factor, mscale_all_dim)²` where the rotary scaling is YaRN's with a
/// `mscale_all_dim` (`transformers`' `yarn_apply_mscale`).
pub fn latent_scale(c: &LatentConfig, yarn: Option<(f64, f64)>) -> f64 {
    let scale = 1.0 / (c.qk_head_dim() as f64).sqrt();
    match yarn {
        Some((factor, all_dim)) if all_dim != 0.0 => {
            let m = crate::rope::yarn_mscale(factor, all_dim);
            scale * m * m
        }
        _ => scale,
    }
}
