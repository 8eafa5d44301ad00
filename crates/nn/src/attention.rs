//! Multi-head scaled dot-product self-attention.

use crate::error::{config, Result};
use crate::layers::Linear;
use crate::module::{Forward, Scope};
use fusegraph_ir::{DType, Tensor};

/// Multi-head self-attention with separate query, key, value and output projections.
#[derive(Clone, Debug, PartialEq)]
pub struct MultiHeadAttention {
    /// Query projection `q`, `d_model → d_model`, with bias.
    pub q: Linear,
    /// Key projection `k`, `d_model → d_model`, with bias.
    pub k: Linear,
    /// Value projection `v`, `d_model → d_model`, with bias.
    pub v: Linear,
    /// Output projection `o`, `d_model → d_model`, with bias.
    pub o: Linear,
    /// Number of heads; divides `d_model`.
    pub heads: usize,
    /// Whether position `i` attends only to positions `≤ i`.
    pub causal: bool,
}

crate::module!(MultiHeadAttention { q, k, v, o });

impl MultiHeadAttention {
    /// Attention over `d_model`-wide tokens split into `heads` heads, under `s`.
    pub fn new(s: &Scope, d_model: usize, heads: usize, causal: bool) -> Result<Self> {
        if heads == 0 || d_model % heads != 0 {
            return Err(config(format!(
                "MultiHeadAttention `{}`: heads {heads} must be ≥ 1 and divide d_model {d_model}",
                s.path()
            )));
        }
        let proj = |part: &str| Linear::new(&s.at(part), d_model, d_model, true);
        Ok(MultiHeadAttention { q: proj("q")?, k: proj("k")?, v: proj("v")?, o: proj("o")?, heads, causal })
    }

    /// The model width.
    pub fn d_model(&self) -> usize {
        self.q.in_dim()
    }
}

impl Forward for MultiHeadAttention {
    /// `x: [batch, seq, d_model] → [batch, seq, d_model]`:
    /// `softmax(q·kᵀ/√d_head + mask)·v` per head, heads merged, then the output projection.
    /// With `causal`, scores of later positions are replaced by −10⁹ before the softmax.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let d = self.d_model();
        let &[batch, seq, width] = x.dims() else {
            return Err(config(format!("MultiHeadAttention: input {} must be [batch, seq, {d}]", x.ty())));
        };
        if width != d || self.heads == 0 || d % self.heads != 0 {
            return Err(config(format!(
                "MultiHeadAttention: input {} must be [batch, seq, {d}] with {} heads dividing {d}",
                x.ty(),
                self.heads
            )));
        }
        let (h, dh) = (self.heads, d / self.heads);
        // [b, s, d] → [b, s, h, dh] → [b, h, s, dh] (keys straight to [b, h, dh, s]).
        let split =
            |t: Tensor, perm: &[usize]| -> Result<Tensor> { Ok(t.reshape([batch, seq, h, dh])?.transpose(perm)?) };
        let q = split(self.q.forward(x)?, &[0, 2, 1, 3])?;
        let kt = split(self.k.forward(x)?, &[0, 2, 3, 1])?;
        let v = split(self.v.forward(x)?, &[0, 2, 1, 3])?;
        let mut scores = q.matmul(&kt)?.mul_scalar(1.0 / (dh as f64).sqrt())?;
        if self.causal {
            let b = x.builder();
            let row = b.iota(DType::I32, [seq, seq], 0)?;
            let col = b.iota(DType::I32, [seq, seq], 1)?;
            let masked = b.scalar(scores.dtype(), -1e9)?;
            scores = row.ge(&col)?.select(&scores, &masked)?;
        }
        let ctx = scores.softmax(3)?.matmul(&v)?.transpose(&[0, 2, 1, 3])?.reshape([batch, seq, d])?;
        self.o.forward(&ctx)
    }
}
