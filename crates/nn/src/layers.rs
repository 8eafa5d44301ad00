//! The basic layers: linear, 2-D convolution, normalizations, embedding and activations.
//!
//! Every layer's `new` declares its parameters under a [`Scope`] (`"{scope}.weight"`,
//! `"{scope}.bias"`, … like PyTorch's state dicts) and `forward` records the ops that apply
//! it into the input's graph.

use crate::error::{config, Result};
use crate::init::Init;
use crate::module::{Forward, Module, Param, Scope};
use fusegraph_ir::{DType, GraphBuilder, Tensor};

/// `y = x·W + b` over the last axis.
#[derive(Clone, Debug, PartialEq)]
pub struct Linear {
    /// `weight`, f32 `[in, out]` (the transpose of PyTorch's layout), Kaiming uniform; a
    /// block type's (see [`crate::Matrices`]) `[out, in]`, its blocks along `in`.
    pub weight: Param,
    /// `bias`, f32 `[out]`, uniform in `±1/√in`; `None` without bias.
    pub bias: Option<Param>,
}

crate::module!(Linear { weight, bias });

impl Linear {
    /// A linear layer `in_dim → out_dim` under `s`, initialized as PyTorch's `nn.Linear`.
    pub fn new(s: &Scope, in_dim: usize, out_dim: usize, bias: bool) -> Result<Self> {
        let init = Init::KaimingUniform { fan_in: in_dim };
        Linear::with_init(s, in_dim, out_dim, init, bias.then_some(init))
    }

    /// [`Linear::new`] with other initializers (GPT-2 draws its weights from `N(0, 0.02²)`,
    /// its biases zero); `bias: None` for no bias.
    pub fn with_init(s: &Scope, in_dim: usize, out_dim: usize, weight: Init, bias: Option<Init>) -> Result<Self> {
        if in_dim == 0 || out_dim == 0 {
            return Err(config(format!("Linear `{}`: widths {in_dim} → {out_dim} must be ≥ 1", s.path())));
        }
        let dtype = s.matrix_dtype("weight", in_dim);
        let shape = if dtype.block().is_some() { [out_dim, in_dim] } else { [in_dim, out_dim] };
        let weight = s.param("weight", &shape, weight).stored_as(dtype);
        let bias = bias.map(|init| s.param("bias", &[out_dim], init));
        Ok(Linear { weight, bias })
    }

    /// Whether the weight is stored `[out, in]` (a block type's layout).
    fn rows_out(&self) -> bool {
        self.weight.ty().dtype.block().is_some()
    }

    /// The input width.
    pub fn in_dim(&self) -> usize {
        self.weight.dims()[usize::from(self.rows_out())]
    }

    /// The output width.
    pub fn out_dim(&self) -> usize {
        self.weight.dims()[usize::from(!self.rows_out())]
    }

    /// The weight as `[in, out]` in `b`, in `dtype` (a block type's read transposed).
    pub fn matrix(&self, b: &GraphBuilder, dtype: DType) -> Result<Tensor> {
        let w = self.weight.read(b, dtype)?;
        Ok(if self.rows_out() { w.t()? } else { w })
    }
}

impl Forward for Linear {
    /// `x: [..., in] → [..., out]`. Inputs of rank ≠ 2 are reshaped to `[rows, in]` for the
    /// matmul and back afterwards.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        if dims.last() != Some(&self.in_dim()) {
            return Err(config(format!(
                "Linear `{}`: input {} must end in {} (the layer's in_dim)",
                self.weight.path(),
                x.ty(),
                self.in_dim()
            )));
        }
        let b = x.builder();
        let rows: usize = dims[..dims.len() - 1].iter().product();
        let x2 = if dims.len() == 2 { x.clone() } else { x.reshape([rows, self.in_dim()])? };
        let mut y = x2.matmul(&self.matrix(b, x.dtype())?)?;
        if let Some(bias) = &self.bias {
            y = y.add(&bias.read(b, x.dtype())?)?;
        }
        if dims.len() == 2 {
            return Ok(y);
        }
        let mut out = dims;
        *out.last_mut().expect("rank ≥ 1") = self.out_dim();
        Ok(y.reshape(out)?)
    }
}

/// A 2-D convolution over NCHW inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct Conv2d {
    /// `weight`, f32 `[out, in/groups, kh, kw]` (OIHW), Kaiming uniform.
    pub weight: Param,
    /// `bias`, f32 `[out]`, added along axis 1; `None` without bias.
    pub bias: Option<Param>,
    /// Stride (h, w).
    pub stride: [usize; 2],
    /// Symmetric zero padding (h, w).
    pub padding: [usize; 2],
    /// Dilation (h, w); `new` sets `[1, 1]`.
    pub dilation: [usize; 2],
    /// Group count (1 is a dense convolution, `in_ch` a depthwise one).
    pub groups: usize,
}

crate::module!(Conv2d { weight, bias });

/// The shape of a [`Conv2d`]: channels, window, stride, padding, groups and bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dConfig {
    /// Input channels.
    pub in_ch: usize,
    /// Output channels.
    pub out_ch: usize,
    /// Window (h, w).
    pub kernel: [usize; 2],
    /// Stride (h, w).
    pub stride: [usize; 2],
    /// Symmetric zero padding (h, w).
    pub padding: [usize; 2],
    /// Groups; divides both channel counts.
    pub groups: usize,
    /// Whether it adds a bias.
    pub bias: bool,
}

impl Conv2dConfig {
    /// A dense `k`×`k` convolution `in_ch → out_ch`, stride 1, no padding, no bias.
    pub fn new(in_ch: usize, out_ch: usize, k: usize) -> Self {
        Conv2dConfig { in_ch, out_ch, kernel: [k, k], stride: [1, 1], padding: [0, 0], groups: 1, bias: false }
    }

    /// With stride `s` in both directions.
    pub fn stride(self, s: usize) -> Self {
        Conv2dConfig { stride: [s, s], ..self }
    }

    /// With padding `p` on every side.
    pub fn padding(self, p: usize) -> Self {
        Conv2dConfig { padding: [p, p], ..self }
    }

    /// With `groups` groups.
    pub fn groups(self, groups: usize) -> Self {
        Conv2dConfig { groups, ..self }
    }

    /// With a bias.
    pub fn bias(self) -> Self {
        Conv2dConfig { bias: true, ..self }
    }
}

impl Conv2d {
    /// A convolution shaped by `c` under `s`.
    pub fn new(s: &Scope, c: Conv2dConfig) -> Result<Self> {
        let Conv2dConfig { in_ch, out_ch, kernel, stride, padding, groups, bias } = c;
        if groups == 0 || in_ch % groups != 0 || out_ch % groups != 0 || in_ch == 0 || out_ch == 0 {
            return Err(config(format!(
                "Conv2d `{}`: groups {groups} must be ≥ 1 and divide in_ch {in_ch} and out_ch {out_ch} (both ≥ 1)",
                s.path()
            )));
        }
        let fan_in = in_ch / groups * kernel[0] * kernel[1];
        let init = Init::KaimingUniform { fan_in };
        let weight = s.param("weight", &[out_ch, in_ch / groups, kernel[0], kernel[1]], init);
        let bias = bias.then(|| s.param("bias", &[out_ch], init));
        Ok(Conv2d { weight, bias, stride, padding, dilation: [1, 1], groups })
    }
}

impl Forward for Conv2d {
    /// `x: [n, in, h, w] → [n, out, oh, ow]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let b = x.builder();
        let y = x.conv2d(&self.weight.get(b)?, self.stride, self.padding, self.dilation, self.groups)?;
        match &self.bias {
            Some(bias) => Ok(y.add(&bias.get(b)?.broadcast_in_dim(y.dims().to_vec(), vec![1])?)?),
            None => Ok(y),
        }
    }
}

/// Batch normalization in inference form over axis 1 of NCHW inputs, with running statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchNorm2d {
    /// `running_mean`, f32 `[c]`, initialized near 0 (`N(0, 0.1²)`).
    pub mean: Param,
    /// `running_var`, f32 `[c]`, initialized in `[1, 1.5)`.
    pub var: Param,
    /// `weight`, f32 `[c]`, ones.
    pub gamma: Param,
    /// `bias`, f32 `[c]`, zeros.
    pub beta: Param,
    /// Added to the variance; `new` sets `1e-5`.
    pub eps: f64,
}

crate::module!(BatchNorm2d { mean, var, gamma, beta });

impl BatchNorm2d {
    /// Batch norm over `channels` channels under `s`. The running statistics get a small
    /// seeded jitter so that a folded and an unfolded batch norm differ visibly if one is wrong.
    pub fn new(s: &Scope, channels: usize) -> Result<Self> {
        let c = [channels];
        Ok(BatchNorm2d {
            mean: s.param("running_mean", &c, Init::Normal(0.1)),
            var: s.param("running_var", &c, Init::Between(1.0, 1.5)),
            gamma: s.param("weight", &c, Init::Ones),
            beta: s.param("bias", &c, Init::Zeros),
            eps: 1e-5,
        })
    }
}

impl Forward for BatchNorm2d {
    /// `(x − mean)·gamma/√(var + eps) + beta` along axis 1 of `x: [n, c, h, w]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() != 4 {
            return Err(config(format!("BatchNorm2d `{}`: input {} must be NCHW (rank 4)", self.gamma.path(), x.ty())));
        }
        let b = x.builder();
        let [m, v, g, be] = [&self.mean, &self.var, &self.gamma, &self.beta].map(|p| p.get(b));
        Ok(x.batch_norm(&m?, &v?, &g?, &be?, self.eps, 1)?)
    }
}

/// Layer normalization over the last axis with a learned scale and shift.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNorm {
    /// `weight`, f32 `[dim]`, ones.
    pub gamma: Param,
    /// `bias`, f32 `[dim]`, zeros.
    pub beta: Param,
    /// Added to the variance; `new` sets `1e-5`.
    pub eps: f64,
}

crate::module!(LayerNorm { gamma, beta });

impl LayerNorm {
    /// Layer norm over a last axis of `dim` elements under `s`.
    pub fn new(s: &Scope, dim: usize) -> Result<Self> {
        Ok(LayerNorm {
            gamma: s.param("weight", &[dim], Init::Ones),
            beta: s.param("bias", &[dim], Init::Zeros),
            eps: 1e-5,
        })
    }
}

impl Forward for LayerNorm {
    /// `(x − mean)/√(var + eps)·gamma + beta` over the last axis of `x: [..., dim]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let last = last_axis(x, "LayerNorm")?;
        let b = x.builder();
        Ok(x.layer_norm(&[last], self.eps)?
            .mul(&self.gamma.read(b, x.dtype())?)?
            .add(&self.beta.read(b, x.dtype())?)?)
    }
}

/// Root-mean-square normalization over the last axis (LLaMA style), with a learned scale.
#[derive(Clone, Debug, PartialEq)]
pub struct RmsNorm {
    /// `weight`, f32 `[dim]`, ones.
    pub gamma: Param,
    /// Added to the mean square; `new` sets `1e-6`.
    pub eps: f64,
    /// Added to `gamma` for the gain: 0 (`new`), or 1 for Gemma's norms, whose weights are
    /// centered at zero.
    pub offset: f64,
}

crate::module!(RmsNorm { gamma });

impl RmsNorm {
    /// RMS norm over a last axis of `dim` elements under `s`.
    pub fn new(s: &Scope, dim: usize) -> Result<Self> {
        Ok(RmsNorm { gamma: s.param("weight", &[dim], Init::Ones), eps: 1e-6, offset: 0.0 })
    }
}

impl Forward for RmsNorm {
    /// `x / √(mean(x², last) + eps) · (offset + gamma)` for `x: [..., dim]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let last = last_axis(x, "RmsNorm")?;
        let gain = self.gamma.read(x.builder(), x.dtype())?;
        let gain = if self.offset == 0.0 { gain } else { gain.add_scalar(self.offset)? };
        Ok(rms_normalized(x, last, self.eps)?.mul(&gain)?)
    }
}

/// `x / √(mean(x², axis) + eps)`: an RMS norm without gains (Llama 4's q/k norms).
pub(crate) fn rms_normalized(x: &Tensor, axis: usize, eps: f64) -> Result<Tensor> {
    Ok(x.mul(&x.mul(x)?.mean(&[axis], true)?.add_scalar(eps)?.rsqrt()?)?)
}

/// Projections of one input: a [`Linear`] each (`q_proj`, `k_proj`, `v_proj`), or one whose
/// output holds them side by side (Phi-3's `qkv_proj` and `gate_up_proj`), split after its
/// product — one product where a checkpoint fuses them.
#[derive(Clone, Debug, PartialEq)]
pub enum Projections {
    /// A layer each.
    Separate(Vec<Linear>),
    /// One layer, and each projection's width in its output, in order.
    Fused(Linear, Vec<usize>),
}

impl Module for Projections {
    fn visit(&self, f: &mut dyn FnMut(&Param)) {
        match self {
            Projections::Separate(layers) => layers.visit(f),
            Projections::Fused(layer, _) => layer.visit(f),
        }
    }
}

impl Projections {
    /// `parts` (each a name and a width) of an input `in_dim` wide under `s`, each its own
    /// layer, or one layer named `fused`; weights `N(0, 0.02²)`, zero biases where `bias`.
    pub fn new(s: &Scope, in_dim: usize, parts: &[(&str, usize)], fused: Option<&str>, bias: bool) -> Result<Self> {
        let layer = |name: &str, out: usize| {
            Linear::with_init(&s.at(name), in_dim, out, Init::Normal(0.02), bias.then_some(Init::Zeros))
        };
        let widths: Vec<usize> = parts.iter().map(|&(_, w)| w).collect();
        Ok(match fused {
            Some(name) => Projections::Fused(layer(name, widths.iter().sum())?, widths),
            None => Projections::Separate(parts.iter().map(|&(name, w)| layer(name, w)).collect::<Result<_>>()?),
        })
    }

    /// Each projection of `x: [..., in]`, in order.
    pub fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        match self {
            Projections::Separate(layers) => layers.iter().map(|l| l.forward(x)).collect(),
            Projections::Fused(layer, widths) => {
                let y = layer.forward(x)?;
                let last = y.rank() - 1;
                let starts = widths.iter().scan(0, |at, &w| Some(std::mem::replace(at, *at + w)));
                starts.zip(widths).map(|(at, &w)| Ok(y.narrow(last, at, w)?)).collect()
            }
        }
    }
}

/// A lookup table of learned vectors, one row per token id.
#[derive(Clone, Debug, PartialEq)]
pub struct Embedding {
    /// `weight`, f32 `[vocab, dim]`, `N(0, 1)` like PyTorch (or as the scope's
    /// [`crate::Matrices`] say).
    pub table: Param,
}

crate::module!(Embedding { table });

impl Embedding {
    /// A table of `vocab` vectors of `dim` elements under `s`.
    pub fn new(s: &Scope, vocab: usize, dim: usize) -> Result<Self> {
        Embedding::with_init(s, vocab, dim, Init::Normal(1.0))
    }

    /// [`Embedding::new`] with another initializer (GPT-2 draws `N(0, 0.02²)`).
    pub fn with_init(s: &Scope, vocab: usize, dim: usize, init: Init) -> Result<Self> {
        if vocab == 0 || dim == 0 {
            return Err(config(format!("Embedding `{}`: vocab {vocab} and dim {dim} must be ≥ 1", s.path())));
        }
        Ok(Embedding { table: s.param("weight", &[vocab, dim], init).stored_as(s.matrix_dtype("weight", dim)) })
    }

    /// The rows of `ids` as `compute` values (the table read through a cast where it is
    /// stored in another dtype).
    pub fn lookup(&self, ids: &Tensor, compute: DType) -> Result<Tensor> {
        Ok(self.table.read(ids.builder(), compute)?.gather(ids, 0)?)
    }
}

impl Forward for Embedding {
    /// `ids: i32|u32 [...] → [..., dim]`, row `ids[i]` of the table for each id (out-of-range
    /// ids clamp, as [`fusegraph_ir::Op::Gather`] defines); a bf16 table gives f32 rows.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let stored = self.table.ty().dtype;
        self.lookup(ids, if stored.is_storage_only() { DType::F32 } else { stored })
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

impl Module for Activation {
    fn visit(&self, _: &mut dyn FnMut(&Param)) {}
}

impl Forward for Activation {
    /// Records the activation of `x`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
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
