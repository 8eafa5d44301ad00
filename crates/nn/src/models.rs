//! Small whole models: an MLP classifier, a CIFAR-sized ResNet and a GPT-2 style
//! transformer. Each is a [`crate::Module`] built once under a [`Scope`]; `forward` records it into
//! the input's graph at whatever batch (and, for the transformer, sequence length) the input
//! has.

use crate::blocks::{ResidualBlock, TransformerBlock};
use crate::error::{config, Result};
use crate::init::Init;
use crate::layers::{BatchNorm2d, Conv2d, Conv2dConfig, Embedding, LayerNorm, Linear};
use crate::module::{Forward, Param, Scope};
use fusegraph_ir::{DType, Tensor};

/// An MLP classifier: linear layers `fc{i}` `dims[i] → dims[i+1]` with ReLU between them, and
/// a softmax over the last layer's `dims[last]` outputs.
#[derive(Clone, Debug, PartialEq)]
pub struct MlpClassifier {
    /// `fc0`, `fc1`, …
    pub layers: Vec<Linear>,
}

crate::module!(MlpClassifier { layers });

impl MlpClassifier {
    /// `dims` needs at least two entries (input and output widths).
    pub fn new(s: &Scope, dims: &[usize]) -> Result<Self> {
        if dims.len() < 2 {
            return Err(config(format!("MlpClassifier: dims {dims:?} needs an input and an output width")));
        }
        let layers = dims.windows(2).enumerate().map(|(i, w)| Linear::new(&s.at(format!("fc{i}")), w[0], w[1], true));
        Ok(MlpClassifier { layers: layers.collect::<Result<_>>()? })
    }

    /// The logits `[batch, classes]` of `x: [batch, dims[0]]`.
    pub fn logits(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, l) in self.layers.iter().enumerate() {
            h = l.forward(&h)?;
            if i + 1 < self.layers.len() {
                h = h.relu()?;
            }
        }
        Ok(h)
    }
}

impl Forward for MlpClassifier {
    /// The class probabilities `[batch, classes]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.logits(x)?.softmax(1)?)
    }
}

/// A small ResNet for 32×32 RGB images: a stem (`stem.conv` 3×3 `3 → channels[0]`,
/// `stem.bn`, ReLU); three stages `layer1`…`layer3` of one [`ResidualBlock`] each, to
/// `channels[0..3]`, the last two with stride 2; global average pooling; and a linear head
/// `fc` to `classes` logits.
#[derive(Clone, Debug, PartialEq)]
pub struct ResNet {
    /// `stem.conv`.
    pub conv: Conv2d,
    /// `stem.bn`.
    pub bn: BatchNorm2d,
    /// `layer1` … `layer3`.
    pub blocks: Vec<ResidualBlock>,
    /// `fc`.
    pub fc: Linear,
}

crate::module!(ResNet { conv, bn, blocks, fc });

impl ResNet {
    /// A ResNet with stage widths `channels` and `classes` outputs.
    pub fn new(s: &Scope, channels: [usize; 3], classes: usize) -> Result<Self> {
        let stem = s.at("stem");
        let conv = Conv2d::new(&stem.at("conv"), Conv2dConfig::new(3, channels[0], 3).padding(1))?;
        let bn = BatchNorm2d::new(&stem.at("bn"), channels[0])?;
        let mut blocks = Vec::new();
        let mut in_ch = channels[0];
        for (i, &out_ch) in channels.iter().enumerate() {
            let stride = if i == 0 { 1 } else { 2 };
            blocks.push(ResidualBlock::new(&s.at(format!("layer{}", i + 1)), in_ch, out_ch, stride)?);
            in_ch = out_ch;
        }
        Ok(ResNet { conv, bn, blocks, fc: Linear::new(&s.at("fc"), in_ch, classes, true)? })
    }
}

impl Forward for ResNet {
    /// `x: [batch, 3, 32, 32] → logits [batch, classes]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = self.bn.forward(&self.conv.forward(x)?)?.relu()?;
        for block in &self.blocks {
            h = block.forward(&h)?;
        }
        self.fc.forward(&global_average_pool(&h)?)
    }
}

/// The shape of a [`Gpt`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptConfig {
    /// Model width.
    pub d_model: usize,
    /// Attention heads (divides `d_model`).
    pub heads: usize,
    /// MLP width.
    pub d_mlp: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Token vocabulary; `None` for a model over already-embedded inputs.
    pub vocab: Option<usize>,
    /// The longest sequence (rows of the positional table).
    pub max_seq: usize,
}

/// A GPT-2 style decoder: `layers` causal pre-norm [`TransformerBlock`]s `h.{i}` and a final
/// [`LayerNorm`] `ln_f`.
///
/// With `vocab: None` the input is f32 `[batch, seq, d_model]` (already embedded) and the
/// output the final hidden states `[batch, seq, d_model]`. With `Some(vocab)` the input is
/// i32 ids `[batch, seq]`, embedded by `wte` ([`Embedding`], `N(0, 0.02²)` like GPT-2) plus
/// rows `0..seq` of a learned positional table `wpe.weight` f32 `[max_seq, d_model]`, and the
/// output is the logits `[batch, seq, vocab]` from the hidden states times `wteᵀ` (tied
/// weights).
#[derive(Clone, Debug, PartialEq)]
pub struct Gpt {
    /// `wte` (with a vocabulary).
    pub wte: Option<Embedding>,
    /// `wpe.weight` (with a vocabulary).
    pub wpe: Option<Param>,
    /// `h.0` … `h.{layers−1}`.
    pub blocks: Vec<TransformerBlock>,
    /// `ln_f`.
    pub ln_f: LayerNorm,
    /// Its shape.
    pub config: GptConfig,
}

crate::module!(Gpt { wte, wpe, blocks, ln_f });

impl Gpt {
    /// A model shaped by `c` under `s`.
    pub fn new(s: &Scope, c: GptConfig) -> Result<Self> {
        let (wte, wpe) = match c.vocab {
            Some(vocab) => (
                Some(Embedding::with_init(&s.at("wte"), vocab, c.d_model, Init::Normal(0.02))?),
                Some(s.at("wpe").param("weight", &[c.max_seq, c.d_model], Init::Normal(0.01))),
            ),
            None => (None, None),
        };
        let h = s.at("h");
        let blocks = (0..c.layers).map(|i| TransformerBlock::new(&h.at(i), c.d_model, c.heads, c.d_mlp, true));
        Ok(Gpt {
            wte,
            wpe,
            blocks: blocks.collect::<Result<_>>()?,
            ln_f: LayerNorm::new(&s.at("ln_f"), c.d_model)?,
            config: c,
        })
    }

    /// The input's dtype: i32 ids with a vocabulary, f32 embeddings without.
    pub fn input_dtype(&self) -> DType {
        if self.wte.is_some() {
            DType::I32
        } else {
            DType::F32
        }
    }
}

impl Gpt {
    /// The first hidden states: `ids: i32 [batch, seq]` embedded plus positions `0..seq`
    /// (with a vocabulary), or the input itself (without); `1 ≤ seq ≤ max_seq`.
    pub fn embed(&self, input: &Tensor) -> Result<Tensor> {
        let c = self.config;
        let seq = input.dims().get(1).copied().unwrap_or(0);
        if input.rank() < 2 || seq == 0 || seq > c.max_seq {
            return Err(config(format!(
                "Gpt: input {} must be [batch, seq, ...] with 1 ≤ seq ≤ {}",
                input.ty(),
                c.max_seq
            )));
        }
        match (&self.wte, &self.wpe) {
            (Some(wte), Some(wpe)) => {
                let mut pos = wpe.get(input.builder())?;
                if seq < c.max_seq {
                    pos = pos.slice(&[0, 0], &[seq, c.d_model], &[1, 1])?;
                }
                Ok(wte.forward(input)?.add(&pos)?)
            }
            _ => Ok(input.clone()),
        }
    }

    /// The output of the final hidden states `h: [batch, seq, d_model]`: `ln_f(h)`, times
    /// `wteᵀ` with a vocabulary (logits `[batch, seq, vocab]`).
    pub fn head(&self, h: &Tensor) -> Result<Tensor> {
        let h = self.ln_f.forward(h)?;
        match (&self.wte, self.config.vocab) {
            (Some(wte), Some(vocab)) => {
                let (batch, seq, d) = (h.dims()[0], h.dims()[1], self.config.d_model);
                let table = wte.table.get(h.builder())?;
                Ok(h.reshape([batch * seq, d])?.matmul(&table.t()?)?.reshape([batch, seq, vocab])?)
            }
            _ => Ok(h),
        }
    }
}

impl Forward for Gpt {
    /// `ids: i32 [batch, seq] → logits [batch, seq, vocab]` (with a vocabulary) or
    /// `x: f32 [batch, seq, d_model] → [batch, seq, d_model]`; `seq ≤ max_seq`:
    /// [`Gpt::embed`], the blocks, [`Gpt::head`].
    fn forward(&self, input: &Tensor) -> Result<Tensor> {
        let mut h = self.embed(input)?;
        for block in &self.blocks {
            h = block.forward(&h)?;
        }
        self.head(&h)
    }
}

/// ResNet as torchvision defines it (`torchvision.models.ResNet` with `BasicBlock`), with its
/// parameter names, so a torchvision checkpoint loads as it is (with
/// [`crate::KeyMap::torchvision`]): `conv1` (7×7, stride 2), `bn1`, a 3×3 max pool of stride
/// 2, `layer1`…`layer4` of [`ResidualBlock`]s (`layer{i}.{j}.conv1`, …, `downsample.0/1`),
/// global average pooling and `fc`.
#[derive(Clone, Debug, PartialEq)]
pub struct TorchvisionResNet {
    /// `conv1`.
    pub conv1: Conv2d,
    /// `bn1`.
    pub bn1: BatchNorm2d,
    /// `layer1` … `layer4`.
    pub layers: Vec<Vec<ResidualBlock>>,
    /// `fc`.
    pub fc: Linear,
}

crate::module!(TorchvisionResNet { conv1, bn1, layers, fc });

impl TorchvisionResNet {
    /// ResNet-18: widths 64, 128, 256, 512 and two blocks per stage.
    pub fn resnet18(s: &Scope, classes: usize) -> Result<Self> {
        TorchvisionResNet::new(s, [64, 128, 256, 512], [2, 2, 2, 2], classes)
    }

    /// Stages of `widths[i]` channels and `blocks[i]` basic blocks (the first stage's width is
    /// the stem's too), the later stages halving the resolution.
    pub fn new(s: &Scope, widths: [usize; 4], blocks: [usize; 4], classes: usize) -> Result<Self> {
        let conv1 = Conv2d::new(&s.at("conv1"), Conv2dConfig::new(3, widths[0], 7).stride(2).padding(3))?;
        let bn1 = BatchNorm2d::new(&s.at("bn1"), widths[0])?;
        let mut layers = Vec::new();
        let mut in_ch = widths[0];
        for (i, (&w, &n)) in widths.iter().zip(&blocks).enumerate() {
            let stage = s.at(format!("layer{}", i + 1));
            let stride = if i == 0 { 1 } else { 2 };
            let mut stage_blocks = Vec::new();
            for j in 0..n {
                stage_blocks.push(ResidualBlock::new(&stage.at(j), in_ch, w, if j == 0 { stride } else { 1 })?);
                in_ch = w;
            }
            layers.push(stage_blocks);
        }
        Ok(TorchvisionResNet { conv1, bn1, layers, fc: Linear::new(&s.at("fc"), in_ch, classes, true)? })
    }
}

impl Forward for TorchvisionResNet {
    /// `x: [n, 3, h, w] → logits [n, classes]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() != 4 || x.dims()[1] != 3 {
            return Err(config(format!("TorchvisionResNet: input {} must be [n, 3, h, w]", x.ty())));
        }
        let mut h = self.bn1.forward(&self.conv1.forward(x)?)?.relu()?.max_pool2d([3, 3], [2, 2], [1, 1])?;
        for block in self.layers.iter().flatten() {
            h = block.forward(&h)?;
        }
        self.fc.forward(&global_average_pool(&h)?)
    }
}

/// The mean of each channel of `h: [n, c, h, w]` over its image, `[n, c]`.
pub fn global_average_pool(h: &Tensor) -> Result<Tensor> {
    let &[n, c, hh, hw] = h.dims() else {
        return Err(config(format!("global_average_pool: input {} must be NCHW (rank 4)", h.ty())));
    };
    Ok(h.avg_pool2d([hh, hw], [hh, hw], [0, 0])?.reshape([n, c])?)
}
