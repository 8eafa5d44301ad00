//! Optimizers as graph builders: SGD (with momentum and weight decay) and Adam / AdamW.
//!
//! An [`Optimizer`] does not run anything: [`Optimizer::step`] records, into the same graph
//! as the forward and backward pass, the ops that compute every parameter's new value and
//! the new value of every piece of optimizer state (momentum buffers, Adam moments, the step
//! counter). The state lives in [`Params`] as ordinary zero-initialized parameters, so a
//! runtime that applies parameter updates after each run (`CompileOptions::updates` in
//! `fusegraph-runtime`) keeps weights and state on the device across steps.
//!
//! Every update is elementwise, so the fusion pass turns each parameter's update into one or a
//! few kernels.
//!
//! Masking: with `apply` (a rank-0 f32 tensor holding 0 or 1, or a rank-0 bool), every
//! returned value is `apply ? updated : old`, which equals `apply·updated + (1 − apply)·old`
//! for 0/1 but is written as a `select`, so a non-finite `updated` (an overflowed
//! mixed-precision step) cannot leak into the kept value through `0·NaN`. Gradient
//! accumulation and loss scaling use it to skip steps without a host round trip.
//!
//! ```
//! use fusegraph_ir::{DType, GraphBuilder};
//! use fusegraph_nn::{Init, Optimizer, Params, Sgd};
//!
//! let b = GraphBuilder::new();
//! let mut p = Params::new(0);
//! let w = p.parameter(&b, "w", DType::F32, &[3], Init::Ones)?;
//! let g = b.input("g", DType::F32, [3])?;
//! let sgd = Sgd { lr: 0.1, momentum: 0.9, weight_decay: 0.0 };
//! let updates = sgd.step(&b, &mut p, &[("w".to_string(), w)], &[g], None)?;
//! let names: Vec<&str> = updates.iter().map(|(n, _)| n.as_str()).collect();
//! assert_eq!(names, ["w", "w.momentum"]);
//! assert!(p.get("w.momentum").is_some()); // zero-initialized state
//! # Ok::<(), fusegraph_nn::NnError>(())
//! ```

use crate::error::{config, Result};
use crate::init::Init;
use crate::params::Params;
use fusegraph_ir::{DType, GraphBuilder, Tensor};

/// Records the update of a set of parameters from their gradients.
pub trait Optimizer {
    /// Records one optimizer step into `b`.
    ///
    /// `params` are `(name, parameter node)` pairs and `grads` their gradients, in the same
    /// order and of the same types (f32). State the optimizer needs is created in `p`
    /// (zero-initialized, through [`Params::parameter`]) the first time and reused after.
    /// `apply`, if given, is a rank-0 f32 (0 or 1) or bool tensor that masks every update
    /// (see the module docs).
    ///
    /// Returns `(name, new value)` for every parameter and every piece of optimizer state,
    /// ready for `CompileOptions::updates`.
    ///
    /// Errors ([`crate::NnError::Config`]): mismatched lengths or types, non-f32 parameters,
    /// an `apply` that is not a rank-0 f32 or bool, or invalid hyperparameters.
    fn step(
        &self,
        b: &GraphBuilder,
        p: &mut Params,
        params: &[(String, Tensor)],
        grads: &[Tensor],
        apply: Option<&Tensor>,
    ) -> Result<Vec<(String, Tensor)>>;
}

/// Stochastic gradient descent with optional momentum and (L2) weight decay, as PyTorch's
/// `torch.optim.SGD` with `dampening = 0` and `nesterov = false`:
///
/// ```text
/// g ← g + weight_decay·w
/// buf ← momentum·buf + g          (state "{name}.momentum", only if momentum ≠ 0)
/// w ← w − lr·buf                  (w − lr·g without momentum)
/// ```
///
/// The buffer starts at zero, so the first step's buffer is `g`, as in PyTorch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sgd {
    /// Learning rate (finite, ≥ 0).
    pub lr: f64,
    /// Momentum factor in `[0, 1)`; 0 keeps no state.
    pub momentum: f64,
    /// L2 penalty added to the gradient (finite, ≥ 0).
    pub weight_decay: f64,
}

impl Sgd {
    /// Plain SGD: no momentum, no weight decay.
    pub fn new(lr: f64) -> Self {
        Sgd { lr, momentum: 0.0, weight_decay: 0.0 }
    }

    fn check(&self) -> Result<()> {
        check_nonneg("Sgd", "lr", self.lr)?;
        check_nonneg("Sgd", "weight_decay", self.weight_decay)?;
        check_unit("Sgd", "momentum", self.momentum)
    }
}

impl Optimizer for Sgd {
    fn step(
        &self,
        b: &GraphBuilder,
        p: &mut Params,
        params: &[(String, Tensor)],
        grads: &[Tensor],
        apply: Option<&Tensor>,
    ) -> Result<Vec<(String, Tensor)>> {
        self.check()?;
        let cond = check_step_inputs("Sgd", params, grads, apply)?;
        let mut out = Vec::new();
        for ((name, w), g) in params.iter().zip(grads) {
            let g = with_weight_decay(w, g, self.weight_decay)?;
            let mut state = None;
            let dir = if self.momentum != 0.0 {
                let buf_name = format!("{name}.momentum");
                let buf = p.parameter(b, &buf_name, DType::F32, w.dims(), Init::Zeros)?;
                let new_buf = buf.mul_scalar(self.momentum)?.add(&g)?;
                state = Some((buf_name, masked(cond.as_ref(), &new_buf, &buf)?));
                new_buf
            } else {
                g
            };
            let new_w = w.sub(&dir.mul_scalar(self.lr)?)?;
            out.push((name.clone(), masked(cond.as_ref(), &new_w, w)?));
            out.extend(state);
        }
        Ok(out)
    }
}

/// Adam (Kingma & Ba) and AdamW (Loshchilov & Hutter), as PyTorch's `torch.optim.Adam` /
/// `AdamW` with `amsgrad = false`:
///
/// ```text
/// t ← t + 1                                    (state "optim.step", f32 scalar)
/// g ← g + weight_decay·w                       (Adam, decoupled = false)
/// w ← w·(1 − lr·weight_decay)                  (AdamW, decoupled = true)
/// m ← β1·m + (1 − β1)·g                        (state "{name}.adam_m")
/// v ← β2·v + (1 − β2)·g²                       (state "{name}.adam_v")
/// w ← w − (lr / (1 − β1ᵗ)) · m / (√v / √(1 − β2ᵗ) + eps)
/// ```
///
/// The bias corrections `1 − βᵗ` are computed in the graph with `pow` from the step counter,
/// so one executable serves every step. Masked steps (`apply` = 0) leave the counter as is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adam {
    /// Learning rate (finite, ≥ 0).
    pub lr: f64,
    /// Decay of the first moment, in `[0, 1)`.
    pub beta1: f64,
    /// Decay of the second moment, in `[0, 1)`.
    pub beta2: f64,
    /// Added to the denominator (finite, > 0).
    pub eps: f64,
    /// Weight decay (finite, ≥ 0): an L2 term in the gradient, or decoupled (AdamW).
    pub weight_decay: f64,
    /// `true` = AdamW: the decay shrinks the weights directly instead of entering the moments.
    pub decoupled: bool,
}

impl Adam {
    /// Adam with PyTorch's defaults: β = (0.9, 0.999), eps = 1e-8, no weight decay.
    pub fn new(lr: f64) -> Self {
        Adam { lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, decoupled: false }
    }

    /// AdamW with PyTorch's defaults and decoupled `weight_decay`.
    pub fn adamw(lr: f64, weight_decay: f64) -> Self {
        Adam { weight_decay, decoupled: true, ..Adam::new(lr) }
    }

    fn check(&self) -> Result<()> {
        check_nonneg("Adam", "lr", self.lr)?;
        check_nonneg("Adam", "weight_decay", self.weight_decay)?;
        check_unit("Adam", "beta1", self.beta1)?;
        check_unit("Adam", "beta2", self.beta2)?;
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(config(format!("Adam: eps {} must be finite and > 0", self.eps)));
        }
        Ok(())
    }
}

/// The name of Adam's shared step counter parameter.
pub const ADAM_STEP: &str = "optim.step";

impl Optimizer for Adam {
    fn step(
        &self,
        b: &GraphBuilder,
        p: &mut Params,
        params: &[(String, Tensor)],
        grads: &[Tensor],
        apply: Option<&Tensor>,
    ) -> Result<Vec<(String, Tensor)>> {
        self.check()?;
        let cond = check_step_inputs("Adam", params, grads, apply)?;
        let mut out = Vec::new();
        let step = p.parameter(b, ADAM_STEP, DType::F32, &[], Init::Zeros)?;
        let t = step.add_scalar(1.0)?;
        out.push((ADAM_STEP.to_string(), masked(cond.as_ref(), &t, &step)?));
        // 1 − βᵗ, in the graph.
        let correction =
            |beta: f64| -> Result<Tensor> { Ok(b.scalar(DType::F32, beta)?.pow(&t)?.neg()?.add_scalar(1.0)?) };
        let step_size = b.scalar(DType::F32, self.lr)?.div(&correction(self.beta1)?)?;
        let sqrt_bc2 = correction(self.beta2)?.sqrt()?;
        for ((name, w), g) in params.iter().zip(grads) {
            let (g, w_decayed) = if self.decoupled {
                let w =
                    if self.weight_decay != 0.0 { w.mul_scalar(1.0 - self.lr * self.weight_decay)? } else { w.clone() };
                (g.clone(), w)
            } else {
                (with_weight_decay(w, g, self.weight_decay)?, w.clone())
            };
            let (m_name, v_name) = (format!("{name}.adam_m"), format!("{name}.adam_v"));
            let m = p.parameter(b, &m_name, DType::F32, w.dims(), Init::Zeros)?;
            let v = p.parameter(b, &v_name, DType::F32, w.dims(), Init::Zeros)?;
            let new_m = m.mul_scalar(self.beta1)?.add(&g.mul_scalar(1.0 - self.beta1)?)?;
            let new_v = v.mul_scalar(self.beta2)?.add(&g.mul(&g)?.mul_scalar(1.0 - self.beta2)?)?;
            let denom = new_v.sqrt()?.div(&sqrt_bc2)?.add_scalar(self.eps)?;
            let new_w = w_decayed.sub(&new_m.div(&denom)?.mul(&step_size)?)?;
            out.push((name.clone(), masked(cond.as_ref(), &new_w, w)?));
            out.push((m_name, masked(cond.as_ref(), &new_m, &m)?));
            out.push((v_name, masked(cond.as_ref(), &new_v, &v)?));
        }
        Ok(out)
    }
}

/// `apply ? updated : old`, or `updated` without a mask. `cond` is a rank-0 bool.
pub fn masked(cond: Option<&Tensor>, updated: &Tensor, old: &Tensor) -> Result<Tensor> {
    match cond {
        Some(c) => Ok(c.select(updated, old)?),
        None => Ok(updated.clone()),
    }
}

/// The rank-0 bool form of an `apply` mask: itself if bool, `apply > 0.5` if f32.
pub fn apply_condition(apply: &Tensor) -> Result<Tensor> {
    if apply.rank() != 0 {
        return Err(config(format!("optimizer: apply {} must be a rank-0 f32 or bool", apply.ty())));
    }
    match apply.dtype() {
        DType::Bool => Ok(apply.clone()),
        DType::F32 => Ok(apply.gt(&apply.builder().scalar(DType::F32, 0.5)?)?),
        _ => Err(config(format!("optimizer: apply {} must be a rank-0 f32 or bool", apply.ty()))),
    }
}

fn with_weight_decay(w: &Tensor, g: &Tensor, wd: f64) -> Result<Tensor> {
    if wd == 0.0 {
        return Ok(g.clone());
    }
    Ok(g.add(&w.mul_scalar(wd)?)?)
}

fn check_step_inputs(
    who: &str,
    params: &[(String, Tensor)],
    grads: &[Tensor],
    apply: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    if params.len() != grads.len() {
        return Err(config(format!("{who}: {} parameters but {} gradients", params.len(), grads.len())));
    }
    for ((name, w), g) in params.iter().zip(grads) {
        if w.dtype() != DType::F32 {
            return Err(config(format!("{who}: parameter `{name}` is {}; master weights must be f32", w.ty())));
        }
        if g.ty() != w.ty() {
            return Err(config(format!("{who}: gradient of `{name}` is {}, expected {}", g.ty(), w.ty())));
        }
    }
    apply.map(apply_condition).transpose()
}

fn check_nonneg(who: &str, what: &str, v: f64) -> Result<()> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(config(format!("{who}: {what} {v} must be finite and ≥ 0")))
    }
}

fn check_unit(who: &str, what: &str, v: f64) -> Result<()> {
    if (0.0..1.0).contains(&v) {
        Ok(())
    } else {
        Err(config(format!("{who}: {what} {v} must be in [0, 1)")))
    }
}
