//! Small whole-model builders: an MLP classifier, a CIFAR-sized ResNet and a GPT-2 style
//! transformer. Each records its input and layers into a [`GraphBuilder`], creates its
//! parameters in [`Params`], and returns `(input, output)`.

use crate::blocks::{ResidualBlock, TransformerBlock};
use crate::error::{config, Result};
use crate::init::Init;
use crate::layers::{BatchNorm2d, Conv2d, Embedding, LayerNorm, Linear};
use crate::params::Params;
use fusegraph_ir::{DType, GraphBuilder, Tensor};

/// An MLP classifier: input `"x"` f32 `[batch, dims[0]]`, linear layers `"fc{i}"`
/// `dims[i] → dims[i+1]` with ReLU between them, and a softmax over the last layer's
/// `dims[last]` outputs. Returns `(x, probabilities [batch, dims[last]])`.
/// `dims` needs at least two entries.
pub fn mlp(b: &GraphBuilder, p: &mut Params, batch: usize, dims: &[usize]) -> Result<(Tensor, Tensor)> {
    if dims.len() < 2 {
        return Err(config(format!("models::mlp: dims {dims:?} needs an input and an output width")));
    }
    let x = b.input("x", DType::F32, [batch, dims[0]])?;
    let mut h = x.clone();
    let layers = dims.len() - 1;
    for i in 0..layers {
        h = Linear::new(b, p, &format!("fc{i}"), dims[i], dims[i + 1], true)?.forward(&h)?;
        if i + 1 < layers {
            h = h.relu()?;
        }
    }
    Ok((x, h.softmax(1)?))
}

/// A small ResNet for 32×32 RGB images: input `"x"` f32 `[batch, 3, 32, 32]`; a stem
/// (`"stem.conv"` 3×3 `3 → channels[0]`, `"stem.bn"`, ReLU); three stages `"layer1"`…`"layer3"`
/// of one [`ResidualBlock`] each, to `channels[0..3]`, the last two with stride 2; global
/// average pooling; and a linear head `"fc"` to `classes` logits.
/// Returns `(x, logits [batch, classes])`.
pub fn resnet(
    b: &GraphBuilder,
    p: &mut Params,
    batch: usize,
    channels: [usize; 3],
    classes: usize,
) -> Result<(Tensor, Tensor)> {
    let x = b.input("x", DType::F32, [batch, 3, 32, 32])?;
    let stem = Conv2d::new(b, p, "stem.conv", 3, channels[0], [3, 3], [1, 1], [1, 1], 1, false)?;
    let mut h = BatchNorm2d::new(b, p, "stem.bn", channels[0])?.forward(&stem.forward(&x)?)?.relu()?;
    let mut in_ch = channels[0];
    for (i, &out_ch) in channels.iter().enumerate() {
        let stride = if i == 0 { 1 } else { 2 };
        h = ResidualBlock::new(b, p, &format!("layer{}", i + 1), in_ch, out_ch, stride)?.forward(&h)?;
        in_ch = out_ch;
    }
    let (hh, hw) = (h.dims()[2], h.dims()[3]);
    let pooled = h.avg_pool2d([hh, hw], [hh, hw], [0, 0])?.reshape([batch, in_ch])?;
    let logits = Linear::new(b, p, "fc", in_ch, classes, true)?.forward(&pooled)?;
    Ok((x, logits))
}

/// A GPT-2 style decoder: `layers` causal pre-norm [`TransformerBlock`]s `"h.{i}"` and a final
/// [`LayerNorm`] `"ln_f"`.
///
/// With `vocab: None` the input is `"x"` f32 `[batch, seq, d_model]` (already embedded) and the
/// output the final hidden states `[batch, seq, d_model]`. With `Some(vocab)` the input is
/// `"ids"` i32 `[batch, seq]`, embedded by `"wte"` ([`Embedding`], `N(0, 0.02²)` like GPT-2)
/// plus a learned positional table `"wpe.weight"` f32 `[seq, d_model]`, and the output is the
/// logits `[batch, seq, vocab]` from the hidden states times `wteᵀ` (tied weights).
#[allow(clippy::too_many_arguments)]
pub fn gpt(
    b: &GraphBuilder,
    p: &mut Params,
    batch: usize,
    seq: usize,
    d_model: usize,
    heads: usize,
    d_mlp: usize,
    layers: usize,
    vocab: Option<usize>,
) -> Result<(Tensor, Tensor)> {
    let (input, mut h, wte) = match vocab {
        None => {
            let x = b.input("x", DType::F32, [batch, seq, d_model])?;
            (x.clone(), x, None)
        }
        Some(vocab) => {
            let ids = b.input("ids", DType::I32, [batch, seq])?;
            let table = p.parameter(b, "wte.weight", DType::F32, &[vocab, d_model], Init::Normal(0.02))?;
            let wte = Embedding { table };
            let wpe = p.parameter(b, "wpe.weight", DType::F32, &[seq, d_model], Init::Normal(0.01))?;
            let h = wte.forward(&ids)?.add(&wpe)?;
            (ids, h, Some(wte))
        }
    };
    for i in 0..layers {
        h = TransformerBlock::new(b, p, &format!("h.{i}"), d_model, heads, d_mlp, true)?.forward(&h)?;
    }
    h = LayerNorm::new(b, p, "ln_f", d_model)?.forward(&h)?;
    let out = match (wte, vocab) {
        (Some(wte), Some(vocab)) => {
            h.reshape([batch * seq, d_model])?.matmul(&wte.table.t()?)?.reshape([batch, seq, vocab])?
        }
        _ => h,
    };
    Ok((input, out))
}
