//! The Llama family's feed-forward branches: the gated MLP, and the sparse mixture of experts
//! (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, GLM-4.5, ERNIE 4.5 MoE, Granite MoE, gpt-oss,
//! DeepSeek-V2 and V3) that replaces it on some or all layers, and their shapes ([`MoeConfig`]).
//!
//! A mixture is recorded with the ops every model uses. The router's top `k` are `k` rounds of
//! arg-max over the softmax probabilities, each round masking its winner. Each expert weight
//! is one parameter `[experts, …]` ([`StackedLinear`]): a token's chosen experts are *gathered*
//! from it by index and multiplied as a batch of products, one per token and choice. Fusion
//! puts the gather inside the product's operand load, so a kernel reads only the chosen
//! experts' rows, dequantizing as it loads (a decode step reads `k` experts' bytes of each
//! weight, not all of them), and no gathered weight is ever stored.

use crate::error::{config, Result};
use crate::init::Init;
use crate::layers::{Linear, Projections};
use crate::module::{Forward, Module, Param, Scope};
use fusegraph_ir::{DType, Tensor};

/// The gate's activation in the MLP (`hidden_act`, or Gemma's `hidden_activation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `silu`.
    Silu,
    /// `gelu_pytorch_tanh`: GELU's tanh form.
    GeluTanh,
}

/// The gated MLP: `down_proj(act(gate_proj(x)) · up_proj(x))`.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaMlp {
    /// `gate_proj` and `up_proj`, or Phi-3's `gate_up_proj` of both.
    pub gate_up: Projections,
    /// `down_proj`.
    pub down_proj: Linear,
}

crate::module!(LlamaMlp { gate_up, down_proj });

impl LlamaMlp {
    /// An MLP `hidden → inner → hidden` under `s` (`fused`: gate and up one projection, named
    /// so), weights `N(0, 0.02²)`, zero biases where `bias`.
    pub fn new(s: &Scope, hidden: usize, inner: usize, fused: Option<&str>, bias: bool) -> Result<Self> {
        Ok(LlamaMlp {
            gate_up: Projections::new(s, hidden, &[("gate_proj", inner), ("up_proj", inner)], fused, bias)?,
            down_proj: Linear::with_init(
                &s.at("down_proj"),
                inner,
                hidden,
                Init::Normal(0.02),
                bias.then_some(Init::Zeros),
            )?,
        })
    }

    /// `x: [..., hidden] → [..., hidden]` with the gate's activation `act`.
    pub fn forward(&self, x: &Tensor, act: Activation) -> Result<Tensor> {
        let Ok([gate, up]) = <[Tensor; 2]>::try_from(self.gate_up.forward(x)?) else { unreachable!("gate and up") };
        self.down_proj.forward(&activate(&gate, act)?.mul(&up)?)
    }
}

fn activate(x: &Tensor, act: Activation) -> Result<Tensor> {
    Ok(match act {
        Activation::Silu => x.silu()?,
        Activation::GeluTanh => x.gelu_tanh()?,
    })
}

/// `n` linear layers of one shape as one parameter, `weight`: f32 `[n, in, out]` (each a
/// [`Linear`]'s layout), or a block type's `[n, out, in]` (PyTorch's and GGUF's, its blocks
/// along `in`); their biases, where they have them, one more, `[n, out]`.
#[derive(Clone, Debug, PartialEq)]
pub struct StackedLinear {
    /// The stacked weights.
    pub weight: Param,
    /// The stacked biases.
    pub bias: Option<Param>,
}

crate::module!(StackedLinear { weight, bias });

impl StackedLinear {
    /// `n` layers `in_dim → out_dim` without bias as the parameter `{s}.weight` (a checkpoint's
    /// `….experts.{e}.gate_proj.weight` load into slot `e` of `….experts.gate_proj.weight`),
    /// drawn from `N(0, 0.02²)`.
    pub fn new(s: &Scope, n: usize, in_dim: usize, out_dim: usize) -> Result<Self> {
        Self::named(s, "weight", n, in_dim, out_dim, None)
    }

    /// `n` layers as the parameter `{s}.{name}`, with biases `{s}.{bias}` where named (gpt-oss's
    /// `gate_up_proj` and `gate_up_proj_bias`), biases zero.
    pub fn named(s: &Scope, name: &str, n: usize, in_dim: usize, out_dim: usize, bias: Option<&str>) -> Result<Self> {
        if n == 0 || in_dim == 0 || out_dim == 0 {
            return Err(config(format!("StackedLinear `{}`: {n} layers {in_dim} → {out_dim} must be ≥ 1", s.path())));
        }
        let dtype = s.matrix_dtype(name, in_dim);
        let shape = if dtype.block().is_some() { [n, out_dim, in_dim] } else { [n, in_dim, out_dim] };
        Ok(StackedLinear {
            weight: s.param(name, &shape, Init::Normal(0.02)).stored_as(dtype),
            bias: bias.map(|b| s.param(b, &[n, out_dim], Init::Zeros)),
        })
    }

    fn rows_out(&self) -> bool {
        self.weight.ty().dtype.block().is_some()
    }

    /// The input width.
    pub fn in_dim(&self) -> usize {
        self.weight.dims()[1 + usize::from(self.rows_out())]
    }

    /// The output width.
    pub fn out_dim(&self) -> usize {
        self.weight.dims()[1 + usize::from(!self.rows_out())]
    }

    /// Row `t` of `x` through the layers `chosen[t, ·]`: `x: f32 [t, j, in]` (`j` = 1: every
    /// choice reads the row; or `j` = `k`: a row per choice), `chosen: i32 [t, k]` →
    /// `[t, k, out]`. An index past the last layer reads the last (as [`fusegraph_ir::Op::Gather`]
    /// clamps).
    pub fn forward_chosen(&self, x: &Tensor, chosen: &Tensor) -> Result<Tensor> {
        let (&[t, j, width], &[t2, k]) = (x.dims(), chosen.dims()) else {
            return Err(config(format!(
                "StackedLinear `{}`: input {} and choices {} must be [tokens, 1 or k, in] and [tokens, k]",
                self.weight.path(),
                x.ty(),
                chosen.ty()
            )));
        };
        if t != t2 || width != self.in_dim() || (j != 1 && j != k) {
            return Err(config(format!(
                "StackedLinear `{}`: input {} and choices {} do not fit layers {} → {}",
                self.weight.path(),
                x.ty(),
                chosen.ty(),
                self.in_dim(),
                self.out_dim()
            )));
        }
        let w = self.weight.read(x.builder(), x.dtype())?.gather(chosen, 0)?;
        let w = if self.rows_out() { w.transpose(&[0, 1, 3, 2])? } else { w };
        let x = x.reshape([t, j, 1, width])?.broadcast_to([t, k, 1, width])?;
        let y = x.matmul(&w)?.reshape([t, k, self.out_dim()])?;
        match &self.bias {
            Some(bias) => Ok(y.add(&bias.read(x.builder(), x.dtype())?.gather(chosen, 0)?)?),
            None => Ok(y),
        }
    }
}

/// A mixture's experts: gated MLPs whose weights are stacked by expert.
#[derive(Clone, Debug, PartialEq)]
pub struct Experts {
    /// `gate_proj` and `up_proj`, `[experts]` layers `hidden → expert_size` each; or gpt-oss's
    /// one `gate_up_proj` of both, their columns interleaved.
    pub gate_up: Vec<StackedLinear>,
    /// `down_proj`, `[experts]` layers `expert_size → hidden`.
    pub down_proj: StackedLinear,
}

crate::module!(Experts { gate_up, down_proj });

/// How a mixture's router scores and weighs its experts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Router {
    /// Softmax probabilities: the top `k` chosen (where `corrected`, by each probability plus
    /// its expert's correction bias, ERNIE 4.5's `moe_statics.e_score_correction_bias`), their
    /// probabilities the weights ([`MoeConfig::normalize`]: divided by their sum).
    Softmax {
        /// Whether a correction bias takes part in the choice.
        corrected: bool,
    },
    /// DeepSeek-V2's: softmax probabilities; the top `k` within the `top_groups` best of
    /// `groups` groups (a group's mark: its best probability), their probabilities times
    /// `scale` the weights, never normalized (as `transformers` weighs them).
    SoftmaxGroups {
        /// The groups the experts split into (`n_group`; 1 for `topk_method` `greedy`).
        groups: usize,
        /// The groups each token chooses in (`topk_group`).
        top_groups: usize,
        /// The weights' scale (`routed_scaling_factor`).
        scale: f64,
    },
    /// Llama 4's: the top `k` by router logit, each chosen expert's input scaled by its
    /// logit's sigmoid ([`MoeStyle::Llama4`]).
    TopLogits,
    /// DeepSeek-V3's: sigmoid scores; each expert's score plus its correction bias
    /// (`e_score_correction_bias`) chooses, within the `top_groups` best of `groups` groups
    /// (a group's mark: its two best), and the chosen scores without the bias, normalized
    /// (plus 1e-20) where [`MoeConfig::normalize`], times `scale` are the weights.
    Sigmoid {
        /// The groups the experts split into (`n_group`).
        groups: usize,
        /// The groups each token chooses in (`topk_group`).
        top_groups: usize,
        /// The weights' scale (`routed_scaling_factor`).
        scale: f64,
    },
}

/// Experts every token goes through, beside the routed ones.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SharedExpert {
    /// Its inner width (Qwen2-MoE's `shared_expert_intermediate_size`; GLM's
    /// `moe_intermediate_size · n_shared_experts`).
    pub width: usize,
    /// Whether a sigmoid gate (`shared_expert_gate`) scales it (Qwen2-MoE's, named
    /// `shared_expert`; else `shared_experts`, added as it is).
    pub gated: bool,
    /// Biases on its projections (ERNIE 4.5's, where `use_bias`).
    pub bias: bool,
}

/// How a mixture's experts are laid out and gated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MoeStyle {
    /// Llama 4's: a router `router` without bias; gate and up one stack `gate_up_proj`
    /// `[experts, hidden, 2 · inner]` (the gate its first half of each expert's outputs),
    /// `down_proj` `[experts, inner, hidden]`; each chosen expert's input scaled by its weight
    /// (not its output); a shared expert beside them.
    Llama4,
    /// A router `gate` without bias; each expert a gated MLP (`gate_proj`, `up_proj`,
    /// `down_proj`, no biases) with the model's activation.
    Standard,
    /// Granite MoE's: gate and up one stack `gate_up_proj` (its checkpoints' `input_linear`),
    /// the gate its first half of each expert's outputs, the up its second.
    Halves,
    /// gpt-oss's: a router `router` with a bias; gate and up one stack `gate_up_proj`
    /// `[experts, hidden, 2 · inner]` whose columns interleave them (gate at even, up at odd),
    /// biases on both stacks (`gate_up_proj_bias`, `down_proj_bias`); the gate clamped above
    /// at `limit`, up to `±limit`, and `(up + 1) · gate · sigmoid(alpha · gate)` the inner value.
    GptOss {
        /// The sigmoid's gain (`swiglu_alpha`, 1.702).
        alpha: f64,
        /// The clamp (`swiglu_limit`, 7).
        limit: f64,
    },
}

/// A sparse mixture of experts in place of a layer's MLP: a router (`gate`) scores every
/// expert for each token, the `top_k` best (by softmax probability) each apply their own
/// gated MLP, and their outputs are summed weighted by those probabilities.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Experts per mixture (`num_experts`, or `num_local_experts`).
    pub experts: usize,
    /// Experts each token goes through (`num_experts_per_tok`).
    pub top_k: usize,
    /// Each expert's inner width (`moe_intermediate_size`; Mixtral's and OLMoE's
    /// `intermediate_size`).
    pub expert_size: usize,
    /// The chosen experts' probabilities divided by their sum (`norm_topk_prob`; always for
    /// Mixtral).
    pub normalize: bool,
    /// Experts every token goes through too.
    pub shared_expert: Option<SharedExpert>,
    /// How the router scores and weighs the experts.
    pub router: Router,
    /// Per layer, whether its MLP is the mixture (else a dense MLP `intermediate_size` wide):
    /// every `decoder_sparse_step`-th layer not in `mlp_only_layers`.
    pub sparse_layers: Vec<bool>,
    /// The experts' layout and gating.
    pub style: MoeStyle,
}

/// A sparse mixture of experts ([`MoeConfig`]).
#[derive(Clone, Debug, PartialEq)]
pub struct SparseMoe {
    /// The router, `gate` (gpt-oss's `router`, with a bias): `hidden → experts`.
    pub gate: Linear,
    /// `experts`.
    pub experts: Experts,
    /// The shared expert every token goes through: Qwen2-MoE's `shared_expert`, GLM's
    /// `shared_experts`.
    pub shared_expert: Option<LlamaMlp>,
    /// Its gate, `shared_expert_gate` (Qwen2-MoE's): `hidden → 1`, through a sigmoid.
    pub shared_expert_gate: Option<Linear>,
    /// The router's correction bias: `gate.e_score_correction_bias` `[experts]`
    /// ([`Router::Sigmoid`]), or ERNIE 4.5's `moe_statics.e_score_correction_bias` `[1, experts]`.
    pub correction: Option<Param>,
    /// Experts per token.
    pub top_k: usize,
    /// Whether the chosen probabilities are divided by their sum.
    pub normalize: bool,
    /// The experts' layout and gating.
    pub style: MoeStyle,
    /// How the router scores and weighs the experts.
    pub router: Router,
}

crate::module!(SparseMoe { gate, experts, shared_expert, shared_expert_gate, correction });

impl SparseMoe {
    /// The mixture `c` describes for width `hidden` under `s` (`mlp`).
    pub fn new(s: &Scope, hidden: usize, c: &MoeConfig) -> Result<Self> {
        let (n, inner) = (c.experts, c.expert_size);
        let e = s.at("experts");
        let linear = |s: &Scope, i: usize, o: usize| Linear::with_init(s, i, o, Init::Normal(0.02), None);
        let shared = c.shared_expert.map(|e| {
            let name = if e.gated { "shared_expert" } else { "shared_experts" };
            LlamaMlp::new(&s.at(name), hidden, e.width, None, e.bias)
        });
        let gated = c.shared_expert.is_some_and(|e| e.gated);
        let (gate, experts) = match c.style {
            MoeStyle::Standard => (
                linear(&s.at("gate"), hidden, n)?,
                Experts {
                    gate_up: vec![
                        StackedLinear::new(&e.at("gate_proj"), n, hidden, inner)?,
                        StackedLinear::new(&e.at("up_proj"), n, hidden, inner)?,
                    ],
                    down_proj: StackedLinear::new(&e.at("down_proj"), n, inner, hidden)?,
                },
            ),
            MoeStyle::Halves => (
                linear(&s.at("gate"), hidden, n)?,
                Experts {
                    gate_up: vec![StackedLinear::new(&e.at("gate_up_proj"), n, hidden, 2 * inner)?],
                    down_proj: StackedLinear::new(&e.at("down_proj"), n, inner, hidden)?,
                },
            ),
            MoeStyle::Llama4 => (
                linear(&s.at("router"), hidden, n)?,
                Experts {
                    gate_up: vec![StackedLinear::named(&e, "gate_up_proj", n, hidden, 2 * inner, None)?],
                    down_proj: StackedLinear::named(&e, "down_proj", n, inner, hidden, None)?,
                },
            ),
            MoeStyle::GptOss { .. } => (
                Linear::with_init(&s.at("router"), hidden, n, Init::Normal(0.02), Some(Init::Zeros))?,
                Experts {
                    gate_up: vec![StackedLinear::named(
                        &e,
                        "gate_up_proj",
                        n,
                        hidden,
                        2 * inner,
                        Some("gate_up_proj_bias"),
                    )?],
                    down_proj: StackedLinear::named(&e, "down_proj", n, inner, hidden, Some("down_proj_bias"))?,
                },
            ),
        };
        Ok(SparseMoe {
            gate,
            experts,
            shared_expert: shared.transpose()?,
            shared_expert_gate: gated.then(|| linear(&s.at("shared_expert_gate"), hidden, 1)).transpose()?,
            correction: match c.router {
                Router::Sigmoid { .. } => Some(s.at("gate").param("e_score_correction_bias", &[n], Init::Zeros)),
                Router::Softmax { corrected: true } => {
                    Some(s.at("moe_statics").param("e_score_correction_bias", &[1, n], Init::Zeros))
                }
                Router::Softmax { corrected: false } | Router::SoftmaxGroups { .. } | Router::TopLogits => None,
            }
            .map(|p| p.stored_as(DType::F32)),
            top_k: c.top_k,
            normalize: c.normalize,
            style: c.style,
            router: c.router,
        })
    }

    /// `x: [..., hidden] → [..., hidden]`, the experts' gates through `act`.
    pub fn forward(&self, x: &Tensor, act: Activation) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let hidden = *dims.last().ok_or_else(|| config(format!("SparseMoe: input {} has no width", x.ty())))?;
        let tokens = dims[..dims.len() - 1].iter().product::<usize>();
        let x2 = x.reshape([tokens, hidden])?;
        let (weights, chosen) = self.route(&x2)?;
        let e = &self.experts;
        let rows = x2.reshape([tokens, 1, hidden])?;
        let weights = weights.cast(x.dtype())?.reshape([tokens, self.top_k, 1])?;
        // Llama 4's experts read their input scaled by their weight; the others' outputs are.
        let scaled_in = self.style == MoeStyle::Llama4;
        let rows = if scaled_in { rows.mul(&weights)? } else { rows };
        let parts: Vec<Tensor> = e.gate_up.iter().map(|l| l.forward_chosen(&rows, &chosen)).collect::<Result<_>>()?;
        let inner = match (self.style, &parts[..]) {
            (MoeStyle::Standard, [gate, up]) => activate(gate, act)?.mul(up)?,
            (MoeStyle::Halves | MoeStyle::Llama4, [gate_up]) => {
                let width = gate_up.dims()[2] / 2;
                activate(&gate_up.narrow(2, 0, width)?, act)?.mul(&gate_up.narrow(2, width, width)?)?
            }
            (MoeStyle::GptOss { alpha, limit }, [gate_up]) => {
                // Gate and up interleaved: pairs along a last axis of two.
                let width = gate_up.dims()[2] / 2;
                let pairs = gate_up.reshape([tokens, self.top_k, width, 2])?;
                let half =
                    |i: usize| -> Result<Tensor> { Ok(pairs.narrow(3, i, 1)?.reshape([tokens, self.top_k, width])?) };
                let b = x.builder();
                let (top, bottom) = (b.scalar(DType::F32, limit)?, b.scalar(DType::F32, -limit)?);
                let gate = half(0)?.minimum(&top)?;
                let up = half(1)?.minimum(&top)?.maximum(&bottom)?;
                up.add_scalar(1.0)?.mul(&gate.mul(&gate.mul_scalar(alpha)?.sigmoid()?)?)?
            }
            _ => return Err(config(format!("SparseMoe: {} gate/up stacks for {:?}", parts.len(), self.style))),
        };
        let out = e.down_proj.forward_chosen(&inner, &chosen)?;
        let out = if scaled_in { out } else { out.mul(&weights)? };
        let mut y = out.sum(&[1], false)?;
        match (&self.shared_expert, &self.shared_expert_gate) {
            (Some(shared), Some(gate)) => y = y.add(&gate.forward(&x2)?.sigmoid()?.mul(&shared.forward(&x2, act)?)?)?,
            (Some(shared), None) => y = y.add(&shared.forward(&x2, act)?)?,
            _ => {}
        }
        Ok(y.reshape(dims)?)
    }

    /// Each token's experts and their weights, `x: [t, hidden]` → `(f32 [t, k], i32 [t, k])`, the
    /// router's arithmetic in f32 as `transformers` does it.
    fn route(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let logits = self.gate.forward(x)?.cast(DType::F32)?;
        match self.router {
            Router::Softmax { .. } => {
                let probs = logits.softmax(1)?;
                let (weights, chosen) = match &self.correction {
                    // ERNIE 4.5's: the probabilities plus the bias choose; the probabilities weigh.
                    Some(bias) => {
                        let bias = bias.read(x.builder(), DType::F32)?.reshape([probs.dims()[1]])?;
                        let (_, chosen) = top_k(&probs.add(&bias)?, self.top_k)?;
                        (take(&probs, &chosen)?, chosen)
                    }
                    None => top_k(&probs, self.top_k)?,
                };
                match self.normalize {
                    true => Ok((weights.div(&weights.sum(&[1], true)?)?, chosen)),
                    false => Ok((weights, chosen)),
                }
            }
            Router::TopLogits => {
                let (top, chosen) = top_k(&logits, self.top_k)?;
                Ok((top.sigmoid()?, chosen))
            }
            Router::SoftmaxGroups { groups, top_groups, scale } => {
                let probs = logits.softmax(1)?;
                // A group's mark: its best probability.
                let (_, chosen) = top_k(&within_groups(&probs, groups, top_groups, 1)?, self.top_k)?;
                let weights = take(&probs, &chosen)?;
                Ok((if scale == 1.0 { weights } else { weights.mul_scalar(scale)? }, chosen))
            }
            Router::Sigmoid { groups, top_groups, scale } => {
                let scores = logits.sigmoid()?;
                let choice = match &self.correction {
                    Some(bias) => scores.add(&bias.read(x.builder(), DType::F32)?.reshape([scores.dims()[1]])?)?,
                    None => scores.clone(),
                };
                // A group's mark: the sum of its two best.
                let (_, chosen) = top_k(&within_groups(&choice, groups, top_groups, 2)?, self.top_k)?;
                let mut weights = take(&scores, &chosen)?;
                if self.normalize {
                    weights = weights.div(&weights.sum(&[1], true)?.add_scalar(1e-20)?)?;
                }
                Ok((if scale == 1.0 { weights } else { weights.mul_scalar(scale)? }, chosen))
            }
        }
    }
}

/// `choice: f32 [t, n]` with the experts outside each row's `top_groups` best of `groups`
/// groups masked out, a group's mark the sum of its `best` largest scores (`choice` itself
/// where every group is kept).
fn within_groups(choice: &Tensor, groups: usize, top_groups: usize, best: usize) -> Result<Tensor> {
    if top_groups >= groups {
        return Ok(choice.clone());
    }
    let [t, n] = [choice.dims()[0], choice.dims()[1]];
    let (b, per) = (choice.builder(), n / groups);
    let (tops, _) = top_k(&choice.reshape([t * groups, per])?, best.min(per))?;
    let marks = tops.sum(&[1], false)?.reshape([t, groups])?;
    let (_, kept) = top_k(&marks, top_groups)?;
    let group = b.iota(DType::I32, [t, top_groups, groups], 2)?;
    let kept = group.eq(&kept.reshape([t, top_groups, 1])?.broadcast_to([t, top_groups, groups])?)?;
    let kept = kept.cast(DType::F32)?.sum(&[1], false)?.gt(&b.full(DType::F32, [t, groups], 0.5)?)?;
    let kept = kept.broadcast_in_dim(vec![t, groups, per], vec![0, 1])?.reshape([t, n])?;
    Ok(kept.select(choice, &b.full(DType::F32, [t, n], MASKED)?)?)
}

/// What [`top_k`] puts in place of an entry it took (and the router in place of an expert
/// outside its groups): below every score a router gives.
const MASKED: f64 = -1e30;

/// `p[t, idx[t, j]]` of `p: f32 [t, n]` and `idx: i32 [t, k]` → `[t, k]` (a one-hot sum,
/// exact: one term is nonzero).
pub fn take(p: &Tensor, idx: &Tensor) -> Result<Tensor> {
    let (&[t, n], &[_, k]) = (p.dims(), idx.dims()) else {
        return Err(config(format!("take: {} and {} must be [rows, n] and [rows, k]", p.ty(), idx.ty())));
    };
    let b = p.builder();
    let hit = b.iota(DType::I32, [t, k, n], 2)?.eq(&idx.reshape([t, k, 1])?.broadcast_to([t, k, n])?)?;
    let row = p.reshape([t, 1, n])?.broadcast_to([t, k, n])?;
    Ok(hit.select(&row, &b.full(p.dtype(), [t, k, n], 0.0)?)?.sum(&[2], false)?)
}

/// The `k` largest of each row of `p: f32 [t, n]` and their indices, largest first, the first
/// index on ties: `(f32 [t, k], i32 [t, k])`.
pub fn top_k(p: &Tensor, k: usize) -> Result<(Tensor, Tensor)> {
    let &[t, n] = p.dims() else { return Err(config(format!("top_k: {} must be [rows, n]", p.ty()))) };
    if k == 0 || k > n {
        return Err(config(format!("top_k: {k} of {n}")));
    }
    let b = p.builder();
    let column = b.iota(DType::I32, [t, n], 1)?;
    let below = b.full(p.dtype(), [t, n], MASKED)?;
    let (mut values, mut indices, mut left) = (Vec::new(), Vec::new(), p.clone());
    for _ in 0..k {
        let at = left.argmax(1, true)?;
        values.push(left.max(&[1], true)?);
        left = column.eq(&at.broadcast_to([t, n])?)?.select(&below, &left)?;
        indices.push(at);
    }
    let cat = |parts: &[Tensor]| b.concat(&parts.iter().collect::<Vec<_>>(), 1);
    Ok((cat(&values)?, cat(&indices)?))
}

/// A layer's feed-forward branch.
#[derive(Clone, Debug, PartialEq)]
pub enum FeedForward {
    /// The gated MLP.
    Dense(Box<LlamaMlp>),
    /// A mixture of experts.
    Sparse(Box<SparseMoe>),
}

impl Module for FeedForward {
    fn visit(&self, f: &mut dyn FnMut(&Param)) {
        match self {
            FeedForward::Dense(m) => m.visit(f),
            FeedForward::Sparse(m) => m.visit(f),
        }
    }
}

impl FeedForward {
    /// `x: [..., hidden] → [..., hidden]`.
    pub fn forward(&self, x: &Tensor, act: Activation) -> Result<Tensor> {
        match self {
            FeedForward::Dense(m) => m.forward(x, act),
            FeedForward::Sparse(m) => m.forward(x, act),
        }
    }
}
