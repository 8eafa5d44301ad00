//! GPT-2 as Hugging Face `transformers` defines it, with its parameter names, so a
//! checkpoint of `GPT2Model` / `GPT2LMHeadModel` loads as it is ([`crate::checkpoint`]):
//! `wte`, `wpe`, `h.{i}.ln_1`, `h.{i}.attn.c_attn` (q, k and v fused), `h.{i}.attn.c_proj`,
//! `h.{i}.ln_2`, `h.{i}.mlp.c_fc`, `h.{i}.mlp.c_proj`, `ln_f`, the head tied to `wte`, and
//! `gelu_new` (GELU's tanh form). GPT-2's `Conv1D` stores weights `[in, out]`, as
//! [`Linear`] does.
//!
//! Three ways to run it: [`Gpt2::forward`] (logits of whole sequences), and for generation
//! with a KV cache, [`CausalLm::prefill`] (a prompt's logits and its keys and values, written
//! into the cache) and [`CausalLm::decode`] (one token per sequence at a run-time position,
//! attending to the cache it updates in place).

use crate::causal::{
    attend, check_cache, check_ids, check_live, live_part, row_positions, tied_head, CacheShape, CausalLm,
};
use crate::error::{config, Result};
use crate::init::Init;
use crate::layers::{Embedding, LayerNorm, Linear};
use crate::module::{Forward, Scope};
use fusegraph_ir::{DType, Tensor};

/// The fields of a Hugging Face `GPT2Config` that shape the model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gpt2Config {
    /// Token vocabulary (`vocab_size`).
    pub vocab_size: usize,
    /// The longest sequence (`n_positions`).
    pub n_positions: usize,
    /// Model width (`n_embd`).
    pub n_embd: usize,
    /// Blocks (`n_layer`).
    pub n_layer: usize,
    /// Attention heads (`n_head`).
    pub n_head: usize,
    /// Layer norms' epsilon (`layer_norm_epsilon`).
    pub layer_norm_epsilon: f64,
}

impl Gpt2Config {
    /// GPT-2 small (124M): 50257 tokens, 1024 positions, width 768, 12 blocks of 12 heads.
    pub fn gpt2() -> Self {
        Gpt2Config {
            vocab_size: 50257,
            n_positions: 1024,
            n_embd: 768,
            n_layer: 12,
            n_head: 12,
            layer_norm_epsilon: 1e-5,
        }
    }

    /// The shape of a `config.json` written by `transformers` (other fields ignored).
    pub fn from_json(text: &str) -> Result<Self> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| config(format!("GPT-2 config.json: {e}")))?;
        let int = |k: &str| -> Result<usize> {
            v.get(k)
                .and_then(|x| x.as_u64())
                .map(|x| x as usize)
                .ok_or_else(|| config(format!("GPT-2 config.json: `{k}` is missing or not an integer")))
        };
        let eps = v.get("layer_norm_epsilon").and_then(|x| x.as_f64()).unwrap_or(1e-5);
        if let Some(act) = v.get("activation_function").and_then(|x| x.as_str()) {
            if act != "gelu_new" {
                return Err(config(format!("GPT-2 config.json: activation `{act}`; only gelu_new is supported")));
            }
        }
        Ok(Gpt2Config {
            vocab_size: int("vocab_size")?,
            n_positions: int("n_positions")?,
            n_embd: int("n_embd")?,
            n_layer: int("n_layer")?,
            n_head: int("n_head")?,
            layer_norm_epsilon: eps,
        })
    }
}

/// Causal self-attention with fused q, k, v projections (`c_attn`) and `c_proj`.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpt2Attention {
    /// `c_attn`, `d → 3d`: q, k and v side by side.
    pub c_attn: Linear,
    /// `c_proj`, `d → d`.
    pub c_proj: Linear,
    /// Heads.
    pub heads: usize,
}

crate::module!(Gpt2Attention { c_attn, c_proj });

/// The MLP: `c_proj(gelu_new(c_fc(x)))`, `d → 4d → d`.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpt2Mlp {
    /// `c_fc`.
    pub c_fc: Linear,
    /// `c_proj`.
    pub c_proj: Linear,
}

crate::module!(Gpt2Mlp { c_fc, c_proj });

/// A block: `h = x + attn(ln_1(x))`, `out = h + mlp(ln_2(h))`.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpt2Block {
    /// `ln_1`.
    pub ln_1: LayerNorm,
    /// `attn`.
    pub attn: Gpt2Attention,
    /// `ln_2`.
    pub ln_2: LayerNorm,
    /// `mlp`.
    pub mlp: Gpt2Mlp,
}

crate::module!(Gpt2Block { ln_1, attn, ln_2, mlp });

/// GPT-2 with its language-model head (tied to `wte`).
#[derive(Clone, Debug, PartialEq)]
pub struct Gpt2 {
    /// `wte`: token embeddings `[vocab, d]`, also the head.
    pub wte: Embedding,
    /// `wpe`: position embeddings `[n_positions, d]`.
    pub wpe: Embedding,
    /// `h.0` … `h.{n_layer−1}`.
    pub h: Vec<Gpt2Block>,
    /// `ln_f`.
    pub ln_f: LayerNorm,
    /// Its shape.
    pub config: Gpt2Config,
}

crate::module!(Gpt2 { wte, wpe, h, ln_f });

pub use crate::causal::Kv;

impl Gpt2 {
    /// A model shaped by `c` under `s` (the root for a checkpoint's names), initialized as
    /// `transformers` does (`N(0, 0.02²)`, layer norms at one and zero).
    pub fn new(s: &Scope, c: Gpt2Config) -> Result<Self> {
        let d = c.n_embd;
        if c.n_head == 0 || d % c.n_head != 0 || c.vocab_size == 0 || c.n_positions == 0 {
            return Err(config(format!("GPT-2: {c:?} needs n_head dividing n_embd and a non-empty vocabulary")));
        }
        let linear = |s: &Scope, i: usize, o: usize| Linear::with_init(s, i, o, Init::Normal(0.02), Some(Init::Zeros));
        let ln = |s: &Scope| -> Result<LayerNorm> {
            let mut l = LayerNorm::new(s, d)?;
            l.eps = c.layer_norm_epsilon;
            Ok(l)
        };
        let h = (0..c.n_layer)
            .map(|i| {
                let b = s.at("h").at(i);
                Ok(Gpt2Block {
                    ln_1: ln(&b.at("ln_1"))?,
                    attn: Gpt2Attention {
                        c_attn: linear(&b.at("attn").at("c_attn"), d, 3 * d)?,
                        c_proj: linear(&b.at("attn").at("c_proj"), d, d)?,
                        heads: c.n_head,
                    },
                    ln_2: ln(&b.at("ln_2"))?,
                    mlp: Gpt2Mlp {
                        c_fc: linear(&b.at("mlp").at("c_fc"), d, 4 * d)?,
                        c_proj: linear(&b.at("mlp").at("c_proj"), 4 * d, d)?,
                    },
                })
            })
            .collect::<Result<_>>()?;
        Ok(Gpt2 {
            wte: Embedding::with_init(&s.at("wte"), c.vocab_size, d, Init::Normal(0.02))?,
            wpe: Embedding::with_init(&s.at("wpe"), c.n_positions, d, Init::Normal(0.01))?,
            h,
            ln_f: ln(&s.at("ln_f"))?,
            config: c,
        })
    }

    /// The head width.
    pub fn head_dim(&self) -> usize {
        self.config.n_embd / self.config.n_head
    }

    /// The attention scores' scale, `1/√head_dim`.
    fn attention_scale(&self) -> f64 {
        1.0 / (self.head_dim() as f64).sqrt()
    }

    /// The logits `[batch, seq, vocab]` of final hidden states `h: [batch, seq, d]`.
    fn logits(&self, h: &Tensor) -> Result<Tensor> {
        tied_head(&self.ln_f.forward(h)?, &self.wte)
    }

    /// `x: [b, s, d]` → q, k, v as `[b, heads, s, head width]`.
    fn qkv(&self, attn: &Gpt2Attention, x: &Tensor) -> Result<[Tensor; 3]> {
        let (b, s, d, nh, dh) = (x.dims()[0], x.dims()[1], self.config.n_embd, self.config.n_head, self.head_dim());
        let fused = attn.c_attn.forward(x)?;
        let part = |i: usize| -> Result<Tensor> {
            let t = fused.slice(&[0, 0, i * d], &[b, s, (i + 1) * d], &[1, 1, 1])?;
            Ok(t.reshape([b, s, nh, dh])?.transpose(&[0, 2, 1, 3])?)
        };
        Ok([part(0)?, part(1)?, part(2)?])
    }

    /// The rest of a block after attention: residual, `ln_2`, MLP, residual.
    fn finish_block(&self, block: &Gpt2Block, x: &Tensor, attended: &Tensor) -> Result<Tensor> {
        let h = x.add(attended)?;
        let m = block.mlp.c_fc.forward(&block.ln_2.forward(&h)?)?.gelu_tanh()?;
        Ok(h.add(&block.mlp.c_proj.forward(&m)?)?)
    }
}

impl CausalLm for Gpt2 {
    fn name(&self) -> String {
        let c = &self.config;
        format!("GPT-2 {} blocks × width {} × {} heads", c.n_layer, c.n_embd, c.n_head)
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn max_positions(&self) -> usize {
        self.config.n_positions
    }

    fn cache_shape(&self) -> CacheShape {
        CacheShape::uniform(self.config.n_layer, self.config.n_head, self.head_dim())
    }

    fn prefill(&self, ids: &Tensor) -> Result<(Tensor, Vec<Kv>)> {
        let (_, seq) = check_ids(self, ids, "prefill")?;
        let b = ids.builder();
        let pos = b.iota(DType::I32, [seq], 0)?;
        let mut h = self.wte.lookup(ids, DType::F32)?.add(&self.wpe.lookup(&pos, DType::F32)?)?;
        let causal = b.iota(DType::I32, [seq, seq], 0)?.ge(&b.iota(DType::I32, [seq, seq], 1)?)?;
        let mut kvs = Vec::new();
        for block in &self.h {
            let [q, k, v] = self.qkv(&block.attn, &block.ln_1.forward(&h)?)?;
            let a = block.attn.c_proj.forward(&attend(&q, &k, &v, &causal, (self.attention_scale(), None), None)?)?;
            h = self.finish_block(block, &h, &a)?;
            kvs.push((k, v));
        }
        Ok((self.logits(&h)?, kvs))
    }

    fn decode(&self, ids: &Tensor, pos: &Tensor, cache: &[Kv], live: usize) -> Result<(Tensor, Vec<Kv>)> {
        let (batch, seq) = check_ids(self, ids, "decode")?;
        let live = check_live(self, live, check_cache(self, batch, seq, cache)?)?;
        let b = ids.builder();
        let pos = row_positions(self, pos, batch)?;
        let table = self.wpe.table.read(b, DType::F32)?;
        let d = table.dims()[1];
        // Each sequence's position row (a gather clamps as the dynamic slice did).
        let mut h = self.wte.lookup(ids, DType::F32)?.add(&table.gather(&pos, 0)?.reshape([batch, 1, d])?)?;
        let keep = b.iota(DType::I32, [batch, 1, live], 2)?.le(&pos.broadcast_in_dim(vec![batch, 1, live], vec![0])?)?;
        let mut updated = Vec::new();
        for (block, (kc, vc)) in self.h.iter().zip(cache) {
            let [q, k, v] = self.qkv(&block.attn, &block.ln_1.forward(&h)?)?;
            let (kc, vc) = (kc.dynamic_update_slice(&k, &pos, 2)?, vc.dynamic_update_slice(&v, &pos, 2)?);
            let a = attend(
                &q,
                &live_part(&kc, live)?,
                &live_part(&vc, live)?,
                &keep,
                (self.attention_scale(), None),
                None,
            )?;
            let a = block.attn.c_proj.forward(&a)?;
            h = self.finish_block(block, &h, &a)?;
            updated.push((kc, vc));
        }
        Ok((self.logits(&h)?, updated))
    }
}

impl Forward for Gpt2 {
    /// The logits `[batch, seq, vocab]` of `ids: i32 [batch, seq]` (causal, positions `0..seq`).
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(self.prefill(ids)?.0)
    }
}
