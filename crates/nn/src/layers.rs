//! The basic layers: linear, 2-D convolution, normalizations, embedding and activations.
//!
//! Every layer's `new` records its `Parameter` nodes in the builder (through
//! [`Params::parameter`], which also initializes their values) and `forward` records the ops
//! that apply it. Parameters are f32 and named `"{name}.weight"`, `"{name}.bias"`, … after the
//! layer's `name`, like PyTorch's state dicts.

use crate::error::{config, Result};
use crate::init::Init;
use crate::params::Params;
use fusegraph_ir::{DType, GraphBuilder, Tensor};

/// `y = x·W + b` over the last axis.
#[derive(Clone, Debug)]
pub struct Linear {
    /// `"{name}.weight"`, f32 `[in, out]` (the transpose of PyTorch's layout), Kaiming uniform.
    pub weight: Tensor,
    /// `"{name}.bias"`, f32 `[out]`, uniform in `±1/√in`; `None` without bias.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A linear layer `in_dim → out_dim` named `name`.
    pub fn new(
        b: &GraphBuilder,
        p: &mut Params,
        name: &str,
        in_dim: usize,
        out_dim: usize,
        bias: bool,
    ) -> Result<Self> {
        let init = Init::KaimingUniform { fan_in: in_dim };
        let weight = p.parameter(b, &format!("{name}.weight"), DType::F32, &[in_dim, out_dim], init)?;
        let bias =
            if bias { Some(p.parameter(b, &format!("{name}.bias"), DType::F32, &[out_dim], init)?) } else { None };
        Ok(Linear { weight, bias })
    }

    /// The input width.
    pub fn in_dim(&self) -> usize {
        self.weight.dims().first().copied().unwrap_or(0)
    }

    /// The output width.
    pub fn out_dim(&self) -> usize {
        self.weight.dims().get(1).copied().unwrap_or(0)
    }

    /// `x: [..., in] → [..., out]`. Inputs of rank ≠ 2 are reshaped to `[rows, in]` for the
    /// matmul and back afterwards.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let Some(&last) = dims.last() else {
            return Err(config(format!("Linear: input {} must have rank ≥ 1", x.ty())));
        };
        if self.weight.rank() != 2 {
            return Err(config(format!("Linear: weight {} must be [in, out]", self.weight.ty())));
        }
        if last != self.in_dim() {
            return Err(config(format!("Linear: input {} must end in {} (the layer's in_dim)", x.ty(), self.in_dim())));
        }
        let rows: usize = dims[..dims.len() - 1].iter().product();
        let x2 = if dims.len() == 2 { x.clone() } else { x.reshape([rows, last])? };
        let mut y = x2.matmul(&self.weight)?;
        if let Some(bias) = &self.bias {
            y = y.add(bias)?;
        }
        if dims.len() == 2 {
            return Ok(y);
        }
        let mut out = dims;
        if let Some(d) = out.last_mut() {
            *d = self.out_dim();
        }
        Ok(y.reshape(out)?)
    }
}

/// A 2-D convolution over NCHW inputs.
#[derive(Clone, Debug)]
pub struct Conv2d {
    /// `"{name}.weight"`, f32 `[out, in/groups, kh, kw]` (OIHW), Kaiming uniform.
    pub weight: Tensor,
    /// `"{name}.bias"`, f32 `[out]`, added along axis 1; `None` without bias.
    pub bias: Option<Tensor>,
    /// Stride (h, w).
    pub stride: [usize; 2],
    /// Symmetric zero padding (h, w).
    pub padding: [usize; 2],
    /// Dilation (h, w); `new` sets `[1, 1]`.
    pub dilation: [usize; 2],
    /// Group count (1 is a dense convolution, `in_ch` a depthwise one).
    pub groups: usize,
}

impl Conv2d {
    /// A convolution `in_ch → out_ch` with a `kernel` window, named `name`. `groups` must
    /// divide both channel counts.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        b: &GraphBuilder,
        p: &mut Params,
        name: &str,
        in_ch: usize,
        out_ch: usize,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        groups: usize,
        bias: bool,
    ) -> Result<Self> {
        if groups == 0 || in_ch % groups != 0 || out_ch % groups != 0 {
            return Err(config(format!(
                "Conv2d `{name}`: groups {groups} must be ≥ 1 and divide in_ch {in_ch} and out_ch {out_ch}"
            )));
        }
        let fan_in = in_ch / groups * kernel[0] * kernel[1];
        let init = Init::KaimingUniform { fan_in };
        let shape = [out_ch, in_ch / groups, kernel[0], kernel[1]];
        let weight = p.parameter(b, &format!("{name}.weight"), DType::F32, &shape, init)?;
        let bias =
            if bias { Some(p.parameter(b, &format!("{name}.bias"), DType::F32, &[out_ch], init)?) } else { None };
        Ok(Conv2d { weight, bias, stride, padding, dilation: [1, 1], groups })
    }

    /// `x: [n, in, h, w] → [n, out, oh, ow]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.conv2d(&self.weight, self.stride, self.padding, self.dilation, self.groups)?;
        match &self.bias {
            Some(bias) => Ok(y.add(&bias.broadcast_in_dim(y.dims().to_vec(), vec![1])?)?),
            None => Ok(y),
        }
    }
}

/// Batch normalization in inference form over axis 1 of NCHW inputs, with running statistics.
#[derive(Clone, Debug)]
pub struct BatchNorm2d {
    /// `"{name}.running_mean"`, f32 `[c]`, initialized near 0 (`N(0, 0.1²)`).
    pub mean: Tensor,
    /// `"{name}.running_var"`, f32 `[c]`, initialized in `[1, 1.5)`.
    pub var: Tensor,
    /// `"{name}.weight"`, f32 `[c]`, ones.
    pub gamma: Tensor,
    /// `"{name}.bias"`, f32 `[c]`, zeros.
    pub beta: Tensor,
    /// Added to the variance; `new` sets `1e-5`.
    pub eps: f64,
}

impl BatchNorm2d {
    /// Batch norm over `channels` channels, named `name`. The running statistics get a small
    /// seeded jitter so that a folded and an unfolded batch norm differ visibly if one is wrong.
    pub fn new(b: &GraphBuilder, p: &mut Params, name: &str, channels: usize) -> Result<Self> {
        let c = [channels];
        let mean = p.parameter(b, &format!("{name}.running_mean"), DType::F32, &c, Init::Normal(0.1))?;
        let var = p.parameter_with(b, &format!("{name}.running_var"), DType::F32, &c, |rng, n| {
            Ok((0..n).map(|_| 1.0 + 0.5 * rng.next_f64()).collect())
        })?;
        let gamma = p.parameter(b, &format!("{name}.weight"), DType::F32, &c, Init::Ones)?;
        let beta = p.parameter(b, &format!("{name}.bias"), DType::F32, &c, Init::Zeros)?;
        Ok(BatchNorm2d { mean, var, gamma, beta, eps: 1e-5 })
    }

    /// `(x − mean)·gamma/√(var + eps) + beta` along axis 1 of `x: [n, c, h, w]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() != 4 {
            return Err(config(format!("BatchNorm2d: input {} must be NCHW (rank 4)", x.ty())));
        }
        Ok(x.batch_norm(&self.mean, &self.var, &self.gamma, &self.beta, self.eps, 1)?)
    }
}

/// Layer normalization over the last axis with a learned scale and shift.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    /// `"{name}.weight"`, f32 `[dim]`, ones.
    pub gamma: Tensor,
    /// `"{name}.bias"`, f32 `[dim]`, zeros.
    pub beta: Tensor,
    /// Added to the variance; `new` sets `1e-5`.
    pub eps: f64,
}

impl LayerNorm {
    /// Layer norm over a last axis of `dim` elements, named `name`.
    pub fn new(b: &GraphBuilder, p: &mut Params, name: &str, dim: usize) -> Result<Self> {
        let gamma = p.parameter(b, &format!("{name}.weight"), DType::F32, &[dim], Init::Ones)?;
        let beta = p.parameter(b, &format!("{name}.bias"), DType::F32, &[dim], Init::Zeros)?;
        Ok(LayerNorm { gamma, beta, eps: 1e-5 })
    }

    /// `(x − mean)/√(var + eps)·gamma + beta` over the last axis of `x: [..., dim]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let last = last_axis(x, "LayerNorm")?;
        Ok(x.layer_norm(&[last], self.eps)?.mul(&self.gamma)?.add(&self.beta)?)
    }
}

/// Root-mean-square normalization over the last axis (LLaMA style), with a learned scale.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    /// `"{name}.weight"`, f32 `[dim]`, ones.
    pub gamma: Tensor,
    /// Added to the mean square; `new` sets `1e-6`.
    pub eps: f64,
}

impl RmsNorm {
    /// RMS norm over a last axis of `dim` elements, named `name`.
    pub fn new(b: &GraphBuilder, p: &mut Params, name: &str, dim: usize) -> Result<Self> {
        let gamma = p.parameter(b, &format!("{name}.weight"), DType::F32, &[dim], Init::Ones)?;
        Ok(RmsNorm { gamma, eps: 1e-6 })
    }

    /// `x / √(mean(x², last) + eps) · gamma` for `x: [..., dim]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let last = last_axis(x, "RmsNorm")?;
        let scale = x.mul(x)?.mean(&[last], true)?.add_scalar(self.eps)?.rsqrt()?;
        Ok(x.mul(&scale)?.mul(&self.gamma)?)
    }
}

/// A lookup table of learned vectors, one row per token id.
#[derive(Clone, Debug)]
pub struct Embedding {
    /// `"{name}.weight"`, f32 `[vocab, dim]`, `N(0, 1)` like PyTorch.
    pub table: Tensor,
}

impl Embedding {
    /// A table of `vocab` vectors of `dim` elements, named `name`.
    pub fn new(b: &GraphBuilder, p: &mut Params, name: &str, vocab: usize, dim: usize) -> Result<Self> {
        let table = p.parameter(b, &format!("{name}.weight"), DType::F32, &[vocab, dim], Init::Normal(1.0))?;
        Ok(Embedding { table })
    }

    /// `ids: i32|u32 [...] → [..., dim]`, row `ids[i]` of the table for each id (out-of-range
    /// ids clamp, as [`fusegraph_ir::Op::Gather`] defines).
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(self.table.gather(ids, 0)?)
    }
}

/// An elementwise nonlinearity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `max(x, 0)`.
    Relu,
    /// Exact GELU, `x·(1 + erf(x/√2))/2`.
    Gelu,
    /// GELU's tanh approximation (GPT-2's).
    GeluTanh,
    /// `x·sigmoid(x)` (a.k.a. swish).
    Silu,
}

impl Activation {
    /// Records the activation of `x`.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Activation::Relu => x.relu()?,
            Activation::Gelu => x.gelu()?,
            Activation::GeluTanh => x.gelu_tanh()?,
            Activation::Silu => x.silu()?,
        })
    }
}

/// The index of `x`'s last axis, or an error for a scalar.
fn last_axis(x: &Tensor, layer: &str) -> Result<usize> {
    x.rank().checked_sub(1).ok_or_else(|| config(format!("{layer}: input {} must have rank ≥ 1", x.ty())))
}
