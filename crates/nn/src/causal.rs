//! What generation needs of a causal language model ([`CausalLm`]: GPT-2, the Llama family),
//! and the attention they share.

use crate::error::{config, Result};
use crate::layers::Embedding;
use crate::module::Module;
use fusegraph_ir::{DType, Tensor};

/// One layer's cached keys and values: `[batch, kv heads, positions, width]` each (the
/// widths are [`CacheShape`]'s).
pub type Kv = (Tensor, Tensor);

/// What a model caches per layer and position: `heads` key/value heads, each a key
/// `key_width` wide and a value `value_width` wide. Multi-head and grouped-query attention
/// cache each head's key and value (one width); multi-head latent attention caches one
/// head: the compressed latent in the key's place and the rotary key in the value's
/// ([`crate::latent`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheShape {
    /// Layers, a cache each.
    pub layers: usize,
    /// Heads per cache.
    pub heads: usize,
    /// The width of the first cache of a pair (keys).
    pub key_width: usize,
    /// The width of the second (values).
    pub value_width: usize,
}

impl CacheShape {
    /// Keys and values of one width.
    pub fn uniform(layers: usize, heads: usize, width: usize) -> Self {
        CacheShape { layers, heads, key_width: width, value_width: width }
    }

    /// A layer's key and value cache dimensions for `batch` sequences of `max` positions.
    pub fn dims(&self, batch: usize, max: usize) -> [[usize; 4]; 2] {
        [[batch, self.heads, max, self.key_width], [batch, self.heads, max, self.value_width]]
    }
}

/// A decoder that generates with a key/value cache: a prefill of whole prompts and a decode
/// step of one token per sequence at a run-time position.
pub trait CausalLm: Module + Send + Sync {
    /// A one-line description (class, layers, widths).
    fn name(&self) -> String;
    /// Token vocabulary.
    fn vocab_size(&self) -> usize;
    /// The longest sequence.
    fn max_positions(&self) -> usize;
    /// The cache's shape: layers, key/value heads, their widths.
    fn cache_shape(&self) -> CacheShape;
    /// The tokens that end a generation (none: it runs to its length).
    fn eos_token_ids(&self) -> Vec<i32> {
        Vec::new()
    }
    /// The logits `[batch, seq, vocab]` of a prompt `ids: i32 [batch, seq]` (positions
    /// `0..seq`) and every layer's keys and values `[batch, kv heads, seq, width]`.
    fn prefill(&self, ids: &Tensor) -> Result<(Tensor, Vec<Kv>)>;
    /// One decode step: the logits `[batch, 1, vocab]` of `ids: [batch, 1]` at position `pos`
    /// (an i32 known at run time: rank 0 for every sequence, or `[batch]`, each sequence at
    /// its own), attending to positions `0..=pos` of `cache` (per layer, `[batch, kv heads,
    /// max, width]`) after writing this token's keys and values there; returns the
    /// logits and the updated caches. The attention reads the cache's
    /// first `live` positions alone (`1 ≤ live ≤ max`; the step is right for `pos < live`):
    /// a generator compiles a step per bucket of `live`, so that a step at position 16 of a
    /// long cache reads 16-odd positions of it, not all.
    fn decode(&self, ids: &Tensor, pos: &Tensor, cache: &[Kv], live: usize) -> Result<(Tensor, Vec<Kv>)>;
}

/// Checks `ids` (an integer `[batch, seq]` with `1 ≤ seq ≤` the model's longest) for
/// `model`'s `what` (prefill, decode); returns `(batch, seq)`.
pub(crate) fn check_ids(model: &dyn CausalLm, ids: &Tensor, what: &str) -> Result<(usize, usize)> {
    match *ids.dims() {
        [batch, seq] if ids.dtype().is_int() && seq >= 1 && seq <= model.max_positions() => Ok((batch, seq)),
        _ => Err(config(format!(
            "{} {what}: ids {} must be i32 [batch, seq] with 1 ≤ seq ≤ {}",
            model.name(),
            ids.ty(),
            model.max_positions()
        ))),
    }
}

/// The logits `[batch, seq, vocab]` of hidden states `h: [batch, seq, d]` through a head
/// tied to the embedding `table` (`[vocab, d]`, read transposed).
pub(crate) fn tied_head(h: &Tensor, table: &Embedding) -> Result<Tensor> {
    let (batch, seq, d) = (h.dims()[0], h.dims()[1], h.dims()[2]);
    let t = table.table.read(h.builder(), DType::F32)?;
    let vocab = t.dims()[0];
    Ok(h.reshape([batch * seq, d])?.matmul(&t.t()?)?.reshape([batch, seq, vocab])?)
}

/// Checks a decode step's operands against `model`'s cache shape; returns the cache length.
pub(crate) fn check_cache(model: &dyn CausalLm, batch: usize, seq: usize, cache: &[Kv]) -> Result<usize> {
    let shape = model.cache_shape();
    if seq != 1 || cache.len() != shape.layers {
        return Err(config(format!(
            "{} decode: one token per sequence ({seq} given) and a cache per layer ({} for {})",
            model.name(),
            cache.len(),
            shape.layers
        )));
    }
    let max = cache[0].0.dims().get(2).copied().unwrap_or(0);
    let want = shape.dims(batch, max);
    for (k, v) in cache {
        for (t, want) in [(k, want[0]), (v, want[1])] {
            if t.dims() != want || max == 0 || max > model.max_positions() {
                return Err(config(format!(
                    "{} decode: cache {} must be [{batch}, {}, max ≤ {}, {}]",
                    model.name(),
                    t.ty(),
                    shape.heads,
                    model.max_positions(),
                    want[3]
                )));
            }
        }
    }
    Ok(max)
}

/// A decode step's positions as one i32 per sequence `[batch]` (a rank-0 `pos` broadcast),
/// or a typed error naming `pos`.
pub(crate) fn row_positions(model: &dyn CausalLm, pos: &Tensor, batch: usize) -> Result<Tensor> {
    match pos.dims() {
        _ if !pos.dtype().is_int() => {}
        [] => return Ok(pos.cast(DType::I32)?.broadcast_to([batch])?),
        [b] if *b == batch => return Ok(pos.cast(DType::I32)?),
        _ => {}
    }
    Err(config(format!("{} decode: pos {} must be an i32 of shape [] or [{batch}]", model.name(), pos.ty())))
}

/// Checks a decode step's `live` positions against the cache length `max`.
pub(crate) fn check_live(model: &dyn CausalLm, live: usize, max: usize) -> Result<usize> {
    match live {
        1.. if live <= max => Ok(live),
        _ => Err(config(format!("{} decode: live positions {live} must be in 1..={max} (the cache's)", model.name()))),
    }
}

/// A layer's keys or values after the step's write, cut to the `live` positions the step
/// attends to (a view: the attention's kernels read those alone).
pub(crate) fn live_part(cache: &Tensor, live: usize) -> Result<Tensor> {
    match cache.dims()[2] == live {
        true => Ok(cache.clone()),
        false => Ok(cache.narrow(2, 0, live)?),
    }
}

/// `cap · tanh(x / cap)`: Gemma 2's soft-capping of scores and logits.
pub(crate) fn soft_cap(x: &Tensor, cap: f64) -> Result<Tensor> {
    Ok(x.div(&x.builder().scalar(x.dtype(), cap)?)?.tanh()?.mul_scalar(cap)?)
}

/// `softmax(q·kᵀ·scale, masked)·v` (the scale most models' `1/√dh`; the scores soft-capped
/// at `cap` where given) with heads merged: `q: [b, heads, sq, dh]`, `k, v: [b, kv
/// heads, sk, dh]` and `[b, kv heads, sk, dv]` (kv heads dividing heads; query head `h` reads
/// key head `h / group`), `keep: bool [sq, sk]`, or `[b, sq, sk]` per sequence (false: masked
/// out) → `[b, sq, heads · dv]`.
/// With `sinks` (f32 `[heads]`: gpt-oss's), each head's softmax has one more logit, its
/// sink's, which takes its share of the probability and reads no value.
///
/// The query heads of a group are stacked as rows of one product with their key head, so
/// grouped-query attention reads each key and value once, as multi-head attention does.
pub(crate) fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    keep: &Tensor,
    (scale, cap): (f64, Option<f64>),
    sinks: Option<&Tensor>,
) -> Result<Tensor> {
    let &[b, heads, sq, dh] = q.dims() else { return Err(config(format!("attention: q {} must be rank 4", q.ty()))) };
    let (kv_heads, sk, dv) = (k.dims()[1], k.dims()[2], v.dims()[3]);
    let per_row = keep.rank() == 3;
    if kv_heads == 0 || heads % kv_heads != 0 || (keep.dims() != [sq, sk] && keep.dims() != [b, sq, sk]) {
        return Err(config(format!(
            "attention: q {}, k {} and mask {} do not fit (kv heads must divide heads)",
            q.ty(),
            k.ty(),
            keep.ty()
        )));
    }
    let group = heads / kv_heads;
    let (q, keep) = match (group, per_row) {
        (1, _) => (q.clone(), keep.clone()),
        (_, false) => (
            q.reshape([b, kv_heads, group * sq, dh])?,
            keep.broadcast_in_dim(vec![group, sq, sk], vec![1, 2])?.reshape([group * sq, sk])?,
        ),
        (_, true) => (
            q.reshape([b, kv_heads, group * sq, dh])?,
            keep.broadcast_in_dim(vec![b, group, sq, sk], vec![0, 2, 3])?.reshape([b, group * sq, sk])?,
        ),
    };
    let scores = q.matmul(&k.transpose(&[0, 1, 3, 2])?)?.mul_scalar(scale)?;
    let scores = match cap {
        Some(cap) => soft_cap(&scores, cap)?,
        None => scores,
    };
    let mask_dims = if per_row { vec![0, 2, 3] } else { vec![2, 3] };
    let masked = keep
        .broadcast_in_dim(scores.dims().to_vec(), mask_dims)?
        .select(&scores, &q.builder().scalar(DType::F32, -1e9)?)?;
    let probs = match sinks {
        // Each row's sink: `sinks[kv · group + g]` for the rows of query head `g` of key head `kv`.
        Some(sinks) if sinks.dims() == [heads] => {
            let rows = group * sq;
            let sink = sinks.reshape([kv_heads, group, 1])?.broadcast_to([kv_heads, group, sq])?;
            let sink =
                sink.reshape([kv_heads, rows, 1])?.broadcast_in_dim(vec![b, kv_heads, rows, 1], vec![1, 2, 3])?;
            q.builder().concat(&[&masked, &sink], 3)?.softmax(3)?.narrow(3, 0, sk)?
        }
        Some(sinks) => return Err(config(format!("attention: sinks {} for {heads} heads", sinks.ty()))),
        None => masked.softmax(3)?,
    };
    let ctx = probs.matmul(v)?;
    let ctx = if group == 1 { ctx } else { ctx.reshape([b, heads, sq, dv])? };
    Ok(ctx.transpose(&[0, 2, 1, 3])?.reshape([b, sq, heads * dv])?)
}
