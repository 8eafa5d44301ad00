//! Composite blocks: the feed-forward MLP, the pre-norm transformer block and ResNet's basic
//! residual block.

use crate::attention::MultiHeadAttention;
use crate::error::Result;
use crate::layers::{Activation, BatchNorm2d, Conv2d, LayerNorm, Linear};
use crate::params::Params;
use fusegraph_ir::{GraphBuilder, Tensor};

/// Two linear layers with an activation between them: `fc2(act(fc1(x)))`.
#[derive(Clone, Debug)]
pub struct Mlp {
    /// `"{name}.fc1"`, `in_dim → hidden`, with bias.
    pub fc1: Linear,
    /// `"{name}.fc2"`, `hidden → out_dim`, with bias.
    pub fc2: Linear,
    /// The activation after `fc1`.
    pub act: Activation,
}

impl Mlp {
    /// An MLP `in_dim → hidden → out_dim` named `name`.
    pub fn new(
        b: &GraphBuilder,
        p: &mut Params,
        name: &str,
        in_dim: usize,
        hidden: usize,
        out_dim: usize,
        act: Activation,
    ) -> Result<Self> {
        let fc1 = Linear::new(b, p, &format!("{name}.fc1"), in_dim, hidden, true)?;
        let fc2 = Linear::new(b, p, &format!("{name}.fc2"), hidden, out_dim, true)?;
        Ok(Mlp { fc1, fc2, act })
    }

    /// `x: [..., in_dim] → [..., out_dim]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.fc2.forward(&self.act.apply(&self.fc1.forward(x)?)?)
    }
}

/// A pre-norm (GPT-2 style) transformer block:
/// `h = x + attn(ln1(x))`, `out = h + mlp(ln2(h))`.
#[derive(Clone, Debug)]
pub struct TransformerBlock {
    /// `"{name}.ln1"`, before attention.
    pub ln1: LayerNorm,
    /// `"{name}.attn"`.
    pub attn: MultiHeadAttention,
    /// `"{name}.ln2"`, before the MLP.
    pub ln2: LayerNorm,
    /// `"{name}.mlp"`, `d_model → d_mlp → d_model` with tanh-GELU.
    pub mlp: Mlp,
}

impl TransformerBlock {
    /// A block of width `d_model` with `heads` attention heads and an MLP of width `d_mlp`.
    pub fn new(
        b: &GraphBuilder,
        p: &mut Params,
        name: &str,
        d_model: usize,
        heads: usize,
        d_mlp: usize,
        causal: bool,
    ) -> Result<Self> {
        Ok(TransformerBlock {
            ln1: LayerNorm::new(b, p, &format!("{name}.ln1"), d_model)?,
            attn: MultiHeadAttention::new(b, p, &format!("{name}.attn"), d_model, heads, causal)?,
            ln2: LayerNorm::new(b, p, &format!("{name}.ln2"), d_model)?,
            mlp: Mlp::new(b, p, &format!("{name}.mlp"), d_model, d_mlp, d_model, Activation::GeluTanh)?,
        })
    }

    /// `x: [batch, seq, d_model] → [batch, seq, d_model]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
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
#[derive(Clone, Debug)]
pub struct ResidualBlock {
    /// `"{name}.conv1"`, 3×3, `in_ch → out_ch`, strided.
    pub conv1: Conv2d,
    /// `"{name}.bn1"`.
    pub bn1: BatchNorm2d,
    /// `"{name}.conv2"`, 3×3, `out_ch → out_ch`.
    pub conv2: Conv2d,
    /// `"{name}.bn2"`.
    pub bn2: BatchNorm2d,
    /// `"{name}.downsample.0"` and `".1"`, present when the channels or the stride change.
    pub shortcut: Option<(Conv2d, BatchNorm2d)>,
}

impl ResidualBlock {
    /// A block `in_ch → out_ch` whose first convolution (and shortcut) use `stride`.
    pub fn new(
        b: &GraphBuilder,
        p: &mut Params,
        name: &str,
        in_ch: usize,
        out_ch: usize,
        stride: usize,
    ) -> Result<Self> {
        let s = [stride, stride];
        let conv1 = Conv2d::new(b, p, &format!("{name}.conv1"), in_ch, out_ch, [3, 3], s, [1, 1], 1, false)?;
        let bn1 = BatchNorm2d::new(b, p, &format!("{name}.bn1"), out_ch)?;
        let conv2 = Conv2d::new(b, p, &format!("{name}.conv2"), out_ch, out_ch, [3, 3], [1, 1], [1, 1], 1, false)?;
        let bn2 = BatchNorm2d::new(b, p, &format!("{name}.bn2"), out_ch)?;
        let shortcut = if in_ch != out_ch || stride != 1 {
            let conv = Conv2d::new(b, p, &format!("{name}.downsample.0"), in_ch, out_ch, [1, 1], s, [0, 0], 1, false)?;
            Some((conv, BatchNorm2d::new(b, p, &format!("{name}.downsample.1"), out_ch)?))
        } else {
            None
        };
        Ok(ResidualBlock { conv1, bn1, conv2, bn2, shortcut })
    }

    /// `x: [n, in_ch, h, w] → [n, out_ch, ⌈h/stride⌉, ⌈w/stride⌉]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.bn1.forward(&self.conv1.forward(x)?)?.relu()?;
        let h = self.bn2.forward(&self.conv2.forward(&h)?)?;
        let skip = match &self.shortcut {
            Some((conv, bn)) => bn.forward(&conv.forward(x)?)?,
            None => x.clone(),
        };
        Ok(h.add(&skip)?.relu()?)
    }
}
