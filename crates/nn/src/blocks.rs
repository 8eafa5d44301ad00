//! Composite blocks: the feed-forward MLP, the pre-norm transformer block and ResNet's basic
//! residual block.

use crate::attention::MultiHeadAttention;
use crate::error::Result;
use crate::layers::{Activation, BatchNorm2d, Conv2d, Conv2dConfig, LayerNorm, Linear};
use crate::module::{Forward, Scope};
use fusegraph_ir::Tensor;

/// Two linear layers with an activation between them: `fc2(act(fc1(x)))`.
#[derive(Clone, Debug, PartialEq)]
pub struct Mlp {
    /// `fc1`, `in_dim → hidden`, with bias.
    pub fc1: Linear,
    /// `fc2`, `hidden → out_dim`, with bias.
    pub fc2: Linear,
    /// The activation after `fc1`.
    pub act: Activation,
}

crate::module!(Mlp { fc1, fc2 });

impl Mlp {
    /// An MLP `in_dim → hidden → out_dim` under `s`.
    pub fn new(s: &Scope, in_dim: usize, hidden: usize, out_dim: usize, act: Activation) -> Result<Self> {
        Ok(Mlp {
            fc1: Linear::new(&s.at("fc1"), in_dim, hidden, true)?,
            fc2: Linear::new(&s.at("fc2"), hidden, out_dim, true)?,
            act,
        })
    }
}

impl Forward for Mlp {
    /// `x: [..., in_dim] → [..., out_dim]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.fc2.forward(&self.act.forward(&self.fc1.forward(x)?)?)
    }
}

/// A pre-norm (GPT-2 style) transformer block:
/// `h = x + attn(ln1(x))`, `out = h + mlp(ln2(h))`.
#[derive(Clone, Debug, PartialEq)]
pub struct TransformerBlock {
    /// `ln1`, before attention.
    pub ln1: LayerNorm,
    /// `attn`.
    pub attn: MultiHeadAttention,
    /// `ln2`, before the MLP.
    pub ln2: LayerNorm,
    /// `mlp`, `d_model → d_mlp → d_model` with tanh-GELU.
    pub mlp: Mlp,
}

crate::module!(TransformerBlock { ln1, attn, ln2, mlp });

impl TransformerBlock {
    /// A block of width `d_model` with `heads` attention heads and an MLP of width `d_mlp`.
    pub fn new(s: &Scope, d_model: usize, heads: usize, d_mlp: usize, causal: bool) -> Result<Self> {
        Ok(TransformerBlock {
            ln1: LayerNorm::new(&s.at("ln1"), d_model)?,
            attn: MultiHeadAttention::new(&s.at("attn"), d_model, heads, causal)?,
            ln2: LayerNorm::new(&s.at("ln2"), d_model)?,
            mlp: Mlp::new(&s.at("mlp"), d_model, d_mlp, d_model, Activation::GeluTanh)?,
        })
    }
}

impl Forward for TransformerBlock {
    /// `x: [batch, seq, d_model] → [batch, seq, d_model]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = x.add(&self.attn.forward(&self.ln1.forward(x)?)?)?;
        Ok(h.add(&self.mlp.forward(&self.ln2.forward(&h)?)?)?)
    }
}

/// ResNet's basic block: `relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))`.
///
/// Both convolutions are 3×3 with padding 1 and no bias; `conv1` carries the stride. The
/// shortcut is the identity, or a strided 1×1 convolution plus batch norm when the channel
/// count or the stride changes. Names follow torchvision: `conv1`, `bn1`, `conv2`, `bn2`,
/// `downsample.0` (conv) and `downsample.1` (batch norm).
#[derive(Clone, Debug, PartialEq)]
pub struct ResidualBlock {
    /// `conv1`, 3×3, `in_ch → out_ch`, strided.
    pub conv1: Conv2d,
    /// `bn1`.
    pub bn1: BatchNorm2d,
    /// `conv2`, 3×3, `out_ch → out_ch`.
    pub conv2: Conv2d,
    /// `bn2`.
    pub bn2: BatchNorm2d,
    /// `downsample.0` and `.1`, present when the channels or the stride change.
    pub shortcut: Option<(Conv2d, BatchNorm2d)>,
}

crate::module!(ResidualBlock { conv1, bn1, conv2, bn2, shortcut });

impl ResidualBlock {
    /// A block `in_ch → out_ch` whose first convolution (and shortcut) use `stride`.
    pub fn new(s: &Scope, in_ch: usize, out_ch: usize, stride: usize) -> Result<Self> {
        let conv1 = Conv2d::new(&s.at("conv1"), Conv2dConfig::new(in_ch, out_ch, 3).stride(stride).padding(1))?;
        let bn1 = BatchNorm2d::new(&s.at("bn1"), out_ch)?;
        let conv2 = Conv2d::new(&s.at("conv2"), Conv2dConfig::new(out_ch, out_ch, 3).padding(1))?;
        let bn2 = BatchNorm2d::new(&s.at("bn2"), out_ch)?;
        let shortcut = if in_ch != out_ch || stride != 1 {
            let d = s.at("downsample");
            let conv = Conv2d::new(&d.at(0), Conv2dConfig::new(in_ch, out_ch, 1).stride(stride))?;
            Some((conv, BatchNorm2d::new(&d.at(1), out_ch)?))
        } else {
            None
        };
        Ok(ResidualBlock { conv1, bn1, conv2, bn2, shortcut })
    }
}

impl Forward for ResidualBlock {
    /// `x: [n, in_ch, h, w] → [n, out_ch, ⌈h/stride⌉, ⌈w/stride⌉]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.bn1.forward(&self.conv1.forward(x)?)?.relu()?;
        let h = self.bn2.forward(&self.conv2.forward(&h)?)?;
        let skip = match &self.shortcut {
            Some((conv, bn)) => bn.forward(&conv.forward(x)?)?,
            None => x.clone(),
        };
        Ok(h.add(&skip)?.relu()?)
    }
}
