//! Training: one executable per training step — forward, backward ([`crate::grad`]) and the
//! optimizer update — with parameters and optimizer state kept on the device between runs
//! (`CompileOptions::updates`).
//!
//! [`build_step`] records the step into the model's builder and returns a [`TrainStep`] (a
//! graph, its loss output and its parameter updates; planning needs no device), and
//! [`Trainer`] compiles it and runs it, feeding the bookkeeping inputs. On top of a plain
//! step it offers, all in the graph and without host round trips:
//!
//! - **gradient accumulation** over `accumulate` micro-batches: accumulator parameters
//!   `"{param}.grad_acc"` collect each run's gradient; an input scalar `"apply"` (1 on the
//!   last micro-batch of a window, else 0) masks the optimizer update and resets the
//!   accumulators, and the update uses the mean `(acc + g)/N`. The effective batch is `N×`
//!   the micro-batch at the micro-batch's activation memory.
//! - **mixed precision** ([`LossScaling`]): f32 master weights; the forward pass up to the
//!   model output is rewritten to f16 by [`autocast`] (weights and f32 inputs cast at use),
//!   and the loss head runs in f32 on the output cast back. Dynamic loss scaling: gradients
//!   are taken of `loss · loss_scale` (a scalar parameter `"loss_scale"`) and unscaled in
//!   f32; if any gradient element is not finite the update is skipped (masked like
//!   `apply`) and the scale halved; after `growth_interval` good steps in a row (counter
//!   parameter `"good_steps"`) it doubles.
//! - **gradient checkpointing**: explicit, per forward segment recorded with
//!   [`record_segment`] (`fusegraph_passes::checkpoint::checkpoint` recomputes the segment's
//!   inner values in the backward pass), and automatic, with
//!   [`TrainOptions::memory_limit`] (the planner rematerializes toward the limit).
//!
//! The finite test is `|g| ≤ f32::MAX` (false for ±inf and NaN), not `(g − g) == 0`: Mesa's
//! lavapipe folds `g − g` to 0 in shaders (WGSL lets implementations assume finite floats),
//! which makes the latter always true there; the comparison form is checked on the device by
//! `tests/train_mixed_precision.rs`.
//!
//! ```no_run
//! use fusegraph::nn::{cross_entropy, Adam, Forward, Linear, Params, Scope};
//! use fusegraph::train::{build_step, Objective, Trainer, TrainOptions};
//! use fusegraph::{DType, Device, GraphBuilder, HostTensor};
//!
//! # fn main() -> fusegraph::Result<()> {
//! let fc = Linear::new(&Scope::root().at("fc"), 4, 3, true)?;
//! let mut params = Params::of(&fc, 0)?;
//! let b = GraphBuilder::new();
//! let x = b.input("x", DType::F32, [8, 4])?;
//! let y = b.input("y", DType::I32, [8])?;
//! let logits = fc.forward(&x)?;
//! let loss = cross_entropy(&logits, &y)?;
//! let objective = Objective { output: logits, loss, segments: vec![] };
//! let step = build_step(&b, &mut params, &objective, &Adam::new(1e-2), &TrainOptions::default())?;
//! let mut trainer = Trainer::new(&Device::shared()?, step, &params)?;
//! let xv = HostTensor::new([8, 4], vec![0.5f32; 32])?;
//! let yv = HostTensor::new([8], vec![1i32; 8])?;
//! let out = trainer.step(&[("x", &xv), ("y", &yv)])?;
//! println!("loss {}; the weights live in {:?}", out.loss, trainer.store());
//! # Ok(()) }
//! ```

use crate::{grad, CompileOptions, DType, Device, Executable, FusionMode, Graph, GraphBuilder, HostTensor, NodeId};
use crate::{FeedName, Op, ParamStore, Tensor, TensorType};
use fusegraph_nn::{Init, Params};
use fusegraph_passes::checkpoint::checkpoint;
use fusegraph_passes::{PlanOptions, PlanSummary, Stages};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

pub use fusegraph_nn::loss::{cross_entropy, mse};
pub use fusegraph_nn::optim::{Adam, Optimizer, Sgd};

/// The name of the micro-batch mask input (with `accumulate > 1`).
pub const APPLY: &str = "apply";
/// The name of the loss-scale parameter (mixed precision).
pub const LOSS_SCALE: &str = "loss_scale";
/// The name of the good-steps counter parameter (mixed precision).
pub const GOOD_STEPS: &str = "good_steps";
/// The name of the "some micro-batch of this window overflowed" flag parameter (mixed
/// precision with accumulation).
pub const OVERFLOW_SEEN: &str = "overflow_seen";

pub use crate::{Error as TrainError, Result};

fn config(msg: impl std::fmt::Display) -> TrainError {
    TrainError::Config(format!("training: {msg}"))
}

/// Dynamic loss scaling for mixed precision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScaling {
    /// The initial scale (finite, > 0), used when `"loss_scale"` has no value yet.
    pub init_scale: f64,
    /// Good steps in a row after which the scale doubles (≥ 1).
    pub growth_interval: u32,
    /// The scale never halves below this (finite, > 0).
    pub min_scale: f64,
}

impl Default for LossScaling {
    /// Scale 2¹², doubling after 100 good steps, never below 1.
    fn default() -> Self {
        LossScaling { init_scale: 4096.0, growth_interval: 100, min_scale: 1.0 }
    }
}

/// How [`build_step`] builds and [`Trainer`] compiles a step.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainOptions {
    /// Micro-batches per optimizer step (≥ 1; 1 = no accumulation).
    pub accumulate: usize,
    /// Mixed precision with dynamic loss scaling; `None` = f32 throughout.
    pub mixed_precision: Option<LossScaling>,
    /// Recompute the inner values of [`Objective::segments`] in the backward pass.
    pub checkpoint: bool,
    /// Device memory limit of the step executable: over it the planner rematerializes cheap
    /// values, then [`build_step`] checkpoints every forward segment (automatic
    /// checkpointing); a step that still does not fit fails to compile with
    /// `ResourceExhausted`.
    pub memory_limit: Option<u64>,
    /// Kernel fusion (default on).
    pub fusion: FusionMode,
    /// The parameters to train, by path (a module's: `module.params()`); the others the
    /// loss reads stay as they are (fine-tuning a head, freezing an encoder). `None`: every
    /// f32 parameter the loss reads.
    pub trainable: Option<Vec<String>>,
}

impl Default for TrainOptions {
    /// No accumulation, f32, no checkpointing, no limit, fusion on.
    fn default() -> Self {
        TrainOptions {
            accumulate: 1,
            mixed_precision: None,
            checkpoint: false,
            memory_limit: None,
            fusion: FusionMode::On,
            trainable: None,
        }
    }
}

/// The forward pass of a model to train, recorded in a builder.
#[derive(Clone, Debug)]
pub struct Objective {
    /// The model output (logits): with mixed precision everything it depends on runs in f16.
    pub output: Tensor,
    /// The scalar f32 loss, computed from `output` (and targets); with mixed precision the
    /// nodes between `output` and `loss` run in f32.
    pub loss: Tensor,
    /// Forward segments (e.g. one per layer, from [`record_segment`]) for explicit
    /// checkpointing.
    pub segments: Vec<Vec<NodeId>>,
}

/// Runs `f` and returns its result with the nodes it recorded in `b` (a forward segment for
/// [`Objective::segments`]).
pub fn record_segment<R>(b: &GraphBuilder, f: impl FnOnce() -> R) -> (R, Vec<NodeId>) {
    let before: BTreeSet<NodeId> = b.edit(|g| g.node_ids().into_iter().collect());
    let r = f();
    let seg = b.edit(|g| g.node_ids().into_iter().filter(|id| !before.contains(id)).collect());
    (r, seg)
}

/// Records a copy of everything `output` depends on computed in `dtype` (f16 for mixed
/// precision): f32 parameters, inputs and iotas are cast at use, f32 constants and fills
/// become `dtype` constants (finite values clamped to its range), casts to f32 become casts to
/// `dtype`, and every other op is re-recorded on the converted operands. Nodes whose
/// operands do not change are reused. Returns the converted output and the map from each
/// original node to its converted node. The originals stay in the graph (dead once unused).
pub fn autocast(output: &Tensor, dtype: DType) -> Result<(Tensor, BTreeMap<NodeId, NodeId>)> {
    if !dtype.is_float() {
        return Err(config(format!("autocast: {dtype} is not a float dtype")));
    }
    let b = output.builder();
    let limit = if dtype == DType::F16 { 65504.0 } else { f64::MAX };
    let clamp = |v: f64| if v.is_finite() { v.clamp(-limit, limit) } else { v };
    let map = b.edit(|g| -> Result<BTreeMap<NodeId, NodeId>> {
        let mut map = BTreeMap::new();
        for id in g.reachable(&[output.id()])? {
            let node = g.node(id).clone();
            let to_dtype = |ty: &TensorType| TensorType::new(dtype, ty.shape.clone());
            let new = if node.op.is_leaf() {
                if node.ty.dtype != DType::F32 {
                    id
                } else {
                    match &node.op {
                        Op::Constant { values } => {
                            let values = values.iter().map(|&v| clamp(v)).collect();
                            g.add_leaf(Op::Constant { values }, to_dtype(&node.ty))?
                        }
                        Op::Full { value } => g.add_leaf(Op::Full { value: clamp(*value) }, to_dtype(&node.ty))?,
                        _ => g.add_op(Op::Cast { to: dtype }, &[id])?,
                    }
                }
            } else {
                let old_operands = g.operands(id);
                let operands: Vec<NodeId> = old_operands.iter().map(|o| map.get(o).copied().unwrap_or(*o)).collect();
                match &node.op {
                    Op::Cast { to: DType::F32 } => {
                        if g.ty(operands[0]).dtype == dtype {
                            operands[0]
                        } else {
                            g.add_op(Op::Cast { to: dtype }, &operands)?
                        }
                    }
                    _ if operands == old_operands => id,
                    op => g.add_op(op.clone(), &operands)?,
                }
            };
            if new != id {
                if let Some(name) = &node.name {
                    g.set_name(new, name.clone());
                }
            }
            map.insert(id, new);
        }
        Ok(map)
    })?;
    let out = b.tensor(map[&output.id()])?;
    Ok((out, map))
}

/// Re-records the nodes between `from` and `to` (those that depend on `from` and that `to`
/// depends on) with `from` replaced by `with`; returns the copy of `to`.
fn replay(b: &GraphBuilder, from: &Tensor, with: &Tensor, to: &Tensor) -> Result<Tensor> {
    if from.id() == to.id() {
        return Ok(with.clone());
    }
    let id = b.edit(|g| -> Result<NodeId> {
        let mut map = BTreeMap::from([(from.id(), with.id())]);
        for id in g.reachable(&[to.id()])? {
            let operands = g.operands(id);
            if !operands.iter().any(|o| map.contains_key(o)) {
                continue;
            }
            let operands: Vec<NodeId> = operands.iter().map(|o| map.get(o).copied().unwrap_or(*o)).collect();
            let node = g.node(id).clone();
            let new = g.add_op(node.op, &operands)?;
            if let Some(name) = node.name {
                g.set_name(new, name);
            }
            map.insert(id, new);
        }
        map.get(&to.id()).copied().ok_or_else(|| config("the loss does not depend on the model output"))
    })?;
    Ok(b.tensor(id)?)
}

/// A training step recorded as a graph: run it with [`Trainer`], or ask the planner about it
/// with [`TrainStep::plan_summary`].
#[derive(Clone, Debug)]
pub struct TrainStep {
    /// The whole step: forward, backward, update.
    pub graph: Graph,
    /// The (unscaled) f32 loss of the micro-batch: the executable's first output.
    pub loss: NodeId,
    /// With masking (accumulation or mixed precision): an f32 scalar, 1 when this run applied
    /// an optimizer update; the second output.
    pub applied: Option<NodeId>,
    /// `(parameter name, new value)` for the weights, optimizer state, accumulators and
    /// loss-scaling state: `CompileOptions::updates`.
    pub updates: Vec<(String, NodeId)>,
    /// The names of the trained parameters, sorted.
    pub trained: Vec<String>,
    /// Forward nodes cloned for recomputation by explicit checkpointing.
    pub recomputed: usize,
    /// The options it was built with.
    pub options: TrainOptions,
}

impl TrainStep {
    /// The executable's outputs: the loss, then the `applied` flag if any.
    pub fn outputs(&self) -> Vec<NodeId> {
        std::iter::once(self.loss).chain(self.applied).collect()
    }

    /// The outputs plus every update value: what the planner must keep alive (the runtime
    /// plans these for a compile with updates).
    pub fn plan_outputs(&self) -> Vec<NodeId> {
        self.outputs().into_iter().chain(self.updates.iter().map(|(_, n)| *n)).collect()
    }

    /// The compile options of the step: fusion and memory limit from [`TrainStep::options`],
    /// the updates, and a name for messages.
    pub fn compile_options(&self) -> CompileOptions {
        CompileOptions {
            fusion: self.options.fusion,
            memory_limit: self.options.memory_limit,
            name: Some("training step".into()),
            updates: self.updates.clone(),
            ..Default::default()
        }
    }

    /// The planner's figures for this step without a device: the stages a compile runs
    /// ([`fusegraph_passes::pipeline`]: simplified, fused, planned, rematerialized toward the
    /// memory limit if one is set) for the default adapter limits.
    ///
    /// The update values are planned alive to the end of the run, as the runtime keeps them;
    /// the staging bytes count only the step's real outputs, since the runtime copies updates
    /// on the device instead of reading them back.
    pub fn plan_summary(&self) -> Result<PlanSummary> {
        let plan = PlanOptions { fusion: self.options.fusion, ..Default::default() };
        let stages = Stages { plan, simplify: true, limit: self.options.memory_limit, ..Default::default() };
        Ok(fusegraph_passes::pipeline::run(&self.graph, &self.outputs(), &self.updates, &stages)?.planned.summary)
    }

    /// The options of the planner alone ([`fusegraph_passes::plan_summary_within`]) for
    /// [`TrainStep::plan_outputs`], unsimplified: this step's fusion mode and its updates
    /// (each as its parameter's name and its value's index in `plan_outputs`), default
    /// adapter limits otherwise. To plan the step for another adapter without a device,
    /// change `max_bindings`.
    pub fn plan_options(&self) -> PlanOptions {
        let first = self.outputs().len();
        let updates = self.updates.iter().enumerate().map(|(i, (name, _))| (name.clone(), first + i)).collect();
        PlanOptions { fusion: self.options.fusion, updates, ..Default::default() }
    }

    /// The memory [`Device::compile`] plans for this step on `device`
    /// ([`Device::plan`] with [`TrainStep::compile_options`]).
    pub fn plan(&self, device: &Arc<Device>) -> Result<PlanSummary> {
        Ok(device.plan(&self.graph, &self.outputs(), &self.compile_options())?)
    }

    /// The step as [`Device::largest_batch`] takes it: its graph, outputs and updates.
    pub fn recorded(&self) -> crate::Recorded {
        crate::Recorded { graph: self.graph.clone(), outputs: self.outputs(), updates: self.updates.clone() }
    }
}

/// Records a training step for `forward` into `b` (the builder the model was recorded in):
/// mixed-precision rewrite, gradients of every f32 parameter the loss depends on, explicit
/// checkpointing, loss scaling, accumulation and `optimizer`'s update. Optimizer and training
/// state is created in `params` (zero-initialized; `"loss_scale"` at
/// [`LossScaling::init_scale`]) unless it is there already.
///
/// **Automatic checkpointing**: with a `memory_limit`, no explicit `checkpoint` and recorded
/// [`Objective::segments`], a step whose plan ([`TrainStep::plan_summary`], rematerialized
/// toward the limit) still exceeds the limit is recorded again with every segment
/// checkpointed; [`TrainStep::options`] then says `checkpoint: true` and
/// [`TrainStep::recomputed`] counts the cloned nodes. The first recording stays in the
/// builder, unreachable from the step's outputs (compilation drops it).
///
/// Errors: a loss that is not a rank-0 f32, `accumulate` of 0, bad loss-scaling values, a
/// parameter without a value in `params`, and any error recording the ops.
pub fn build_step(
    b: &GraphBuilder,
    params: &mut Params,
    forward: &Objective,
    optimizer: &dyn Optimizer,
    opts: &TrainOptions,
) -> Result<TrainStep> {
    let step = record_step(b, params, forward, optimizer, opts)?;
    let Some(limit) = opts.memory_limit else { return Ok(step) };
    if opts.checkpoint || forward.segments.iter().all(Vec::is_empty) || step.plan_summary()?.total_bytes <= limit {
        return Ok(step);
    }
    record_step(b, params, forward, optimizer, &TrainOptions { checkpoint: true, ..opts.clone() })
}

/// `(parameter name, new value)` pairs.
type Updates = Vec<(String, Tensor)>;

/// The backward half of a recorded step: the loss, the trained parameters and their
/// gradients (of the scaled loss under mixed precision).
pub(crate) struct Gradients {
    /// The unscaled f32 loss.
    pub loss: Tensor,
    /// The loss-scale parameter (mixed precision).
    pub scale: Option<Tensor>,
    /// `(name, parameter node)` of every trained parameter, sorted by name.
    pub named: Vec<(String, Tensor)>,
    /// Their gradients, in the same order: of `loss · scale` under mixed precision.
    pub grads: Vec<Tensor>,
    /// Forward nodes cloned for recomputation by explicit checkpointing.
    pub recomputed: usize,
}

/// Records the forward pass's gradients for `opts` (mixed precision, trainable set,
/// checkpointing, loss scale) into `b`: everything of a step before the finite check.
pub(crate) fn record_gradients(
    b: &GraphBuilder,
    params: &mut Params,
    forward: &Objective,
    opts: &TrainOptions,
) -> Result<Gradients> {
    if forward.loss.ty() != &TensorType::new(DType::F32, Vec::<usize>::new()) {
        return Err(config(format!("the loss is {}; it must be a rank-0 f32", forward.loss.ty())));
    }
    if opts.accumulate == 0 {
        return Err(config("accumulate must be ≥ 1"));
    }
    if let Some(s) = &opts.mixed_precision {
        let ok = |v: f64| v.is_finite() && v > 0.0;
        if !ok(s.init_scale) || !ok(s.min_scale) || s.growth_interval == 0 {
            return Err(config(format!(
                "loss scaling {s:?}: init_scale and min_scale must be finite and > 0, growth_interval ≥ 1"
            )));
        }
    }
    // Mixed precision: the model in f16, the loss head in f32 on the output cast back.
    let (loss, segments) = match opts.mixed_precision {
        Some(_) => {
            let (out16, map) = autocast(&forward.output, DType::F16)?;
            let out32 = out16.cast(forward.output.dtype())?;
            let loss = replay(b, &forward.output, &out32, &forward.loss)?;
            let segments = forward
                .segments
                .iter()
                .map(|s| s.iter().filter_map(|id| map.get(id).copied()).filter(|id| !s.contains(id)).collect())
                .collect();
            (loss, segments)
        }
        None => (forward.loss.clone(), forward.segments.clone()),
    };

    // The trained parameters: every f32 parameter the loss reads (of `trainable`, if
    // given), by name.
    let mut nodes_of: BTreeMap<String, Vec<NodeId>> = BTreeMap::new();
    b.edit(|g| -> Result<()> {
        for id in g.reachable(&[loss.id()])? {
            if let Op::Parameter { name } = &g.node(id).op {
                let chosen = opts.trainable.as_ref().is_none_or(|t| t.contains(name));
                if g.ty(id).dtype == DType::F32 && chosen {
                    nodes_of.entry(name.clone()).or_default().push(id);
                }
            }
        }
        Ok(())
    })?;
    if let Some(t) = &opts.trainable {
        if let Some(name) = t.iter().find(|n| !nodes_of.contains_key(n.as_str())) {
            return Err(config(format!("trainable parameter `{name}` is not an f32 parameter the loss reads")));
        }
    }
    if nodes_of.is_empty() {
        return Err(config("the loss depends on no f32 parameter"));
    }
    for name in nodes_of.keys() {
        if params.get(name).is_none() {
            return Err(config(format!("parameter `{name}` has no value in Params")));
        }
    }

    let scale = match &opts.mixed_precision {
        Some(s) => Some(state(b, params, LOSS_SCALE, s.init_scale)?),
        None => None,
    };
    let objective = match &scale {
        Some(s) => loss.mul(s)?,
        None => loss.clone(),
    };
    let wrt: Vec<Tensor> =
        nodes_of.values().flatten().map(|&id| b.tensor(id)).collect::<std::result::Result<_, _>>()?;
    let wrt_refs: Vec<&Tensor> = wrt.iter().collect();
    let mut grad_ids: Vec<NodeId> = grad(&objective, &wrt_refs)?.iter().map(|t| t.id()).collect();

    let mut recomputed = 0;
    if opts.checkpoint {
        // Forward = what the objective is computed from. Every other user of a segment value
        // may be rewired to the clones: the backward pass, and the dead backward nodes of an
        // earlier recording of this step (automatic checkpointing records a step twice),
        // which would otherwise pin the segment's values as outputs.
        let forward: BTreeSet<NodeId> = b.edit(|g| g.reachable(&[objective.id()]))?.into_iter().collect();
        let mut clones = BTreeSet::new();
        for seg in &segments {
            let done = b.edit(|g| checkpoint(g, seg, |u| !forward.contains(&u) && !clones.contains(&u)))?;
            recomputed += done.clones.len();
            clones.extend(done.clones.iter().map(|(_, c)| *c));
            for id in &mut grad_ids {
                *id = done.map(*id);
            }
        }
    }
    // One gradient per name (a name recorded as several nodes gets their sum).
    let mut grads = Vec::new();
    let mut k = 0;
    for ids in nodes_of.values() {
        let mut total = b.tensor(grad_ids[k])?;
        for &id in &grad_ids[k + 1..k + ids.len()] {
            total = total.add(&b.tensor(id)?)?;
        }
        k += ids.len();
        grads.push(total);
    }
    let named: Vec<(String, Tensor)> =
        nodes_of.iter().map(|(n, ids)| Ok((n.clone(), b.tensor(ids[0])?))).collect::<Result<_>>()?;
    Ok(Gradients { loss, scale, named, grads, recomputed })
}

/// The optimizer half of a step, from gradients recorded in `b`: the finite check and
/// unscaling (with a loss `scale`: the scale, and the values whose finiteness decides the
/// step — the gradients, or more than a shard of them holds), accumulation over
/// `opts.accumulate` micro-batches (an input `"apply"`) when that is over 1, the masked
/// optimizer update and the loss-scale update. Returns the updates and the rank-0 bool
/// "applied" condition (with masking).
pub(crate) fn record_update(
    b: &GraphBuilder,
    params: &mut Params,
    named: &[(String, Tensor)],
    mut grads: Vec<Tensor>,
    scale: Option<(&Tensor, &[Tensor])>,
    optimizer: &dyn Optimizer,
    opts: &TrainOptions,
) -> Result<(Updates, Option<Tensor>)> {
    let mut updates: Vec<(String, Tensor)> = Vec::new();
    // Loss scaling: finite check on the scaled gradients, then unscale in f32.
    let finite = match scale {
        Some((s, checked)) => {
            let max = b.scalar(DType::F32, f32::MAX as f64)?;
            let mut all: Option<Tensor> = None;
            for g in checked {
                let ok = g.abs()?.le(&max)?.cast(DType::F32)?;
                let axes: Vec<usize> = (0..g.rank()).collect();
                let ok = if axes.is_empty() { ok } else { ok.min(&axes, false)? };
                all = Some(match all {
                    Some(a) => a.minimum(&ok)?,
                    None => ok,
                });
            }
            let inv = s.recip()?;
            let finite = all.ok_or_else(|| config("no gradients"))?.gt(&b.scalar(DType::F32, 0.5)?)?;
            let zero = b.scalar(DType::F32, 0.0)?;
            grads = grads.iter().map(|g| finite.select(&g.mul(&inv)?, &zero)).collect::<std::result::Result<_, _>>()?;
            Some(finite)
        }
        None => None,
    };
    // Accumulation.
    let n = opts.accumulate;
    let window_end = if n > 1 {
        let apply = b.input(APPLY, DType::F32, Vec::<usize>::new())?;
        Some(apply.gt(&b.scalar(DType::F32, 0.5)?)?)
    } else {
        None
    };
    if let Some(end) = &window_end {
        let zero = b.scalar(DType::F32, 0.0)?;
        for ((name, w), g) in named.iter().zip(grads.iter_mut()) {
            let acc_name = format!("{name}.grad_acc");
            let acc = params.parameter(b, &acc_name, DType::F32, w.dims(), Init::Zeros)?;
            let total = acc.add(g)?;
            updates.push((acc_name, end.select(&zero, &total)?));
            *g = total.mul_scalar(1.0 / n as f64)?;
        }
    }
    // Whether this window's steps were all finite.
    let window_ok = match (&finite, &window_end) {
        (Some(f), Some(end)) => {
            let seen = state(b, params, OVERFLOW_SEEN, 0.0)?;
            let bad = f.select(&b.scalar(DType::F32, 0.0)?, &b.scalar(DType::F32, 1.0)?)?;
            let seen_now = seen.maximum(&bad)?;
            updates.push((OVERFLOW_SEEN.into(), end.select(&b.scalar(DType::F32, 0.0)?, &seen_now)?));
            Some(seen_now.lt(&b.scalar(DType::F32, 0.5)?)?)
        }
        (Some(f), None) => Some(f.clone()),
        _ => None,
    };
    let apply = match (&window_end, &window_ok) {
        (Some(e), Some(ok)) => Some(e.and(ok)?),
        (Some(e), None) => Some(e.clone()),
        (None, Some(ok)) => Some(ok.clone()),
        (None, None) => None,
    };
    updates.extend(optimizer.step(b, params, named, &grads, apply.as_ref())?);
    // Dynamic loss scale: on each window end, halve on overflow, double after K good steps.
    if let (Some((s, _)), Some(ok), Some(cfg)) = (scale, &window_ok, &opts.mixed_precision) {
        let good = state(b, params, GOOD_STEPS, 0.0)?;
        let zero = b.scalar(DType::F32, 0.0)?;
        let good_next = good.add_scalar(1.0)?;
        let grow = good_next.ge(&b.scalar(DType::F32, cfg.growth_interval as f64)?)?;
        let halved = s.mul_scalar(0.5)?.maximum(&b.scalar(DType::F32, cfg.min_scale)?)?;
        let new_scale = ok.select(&grow.select(&s.mul_scalar(2.0)?, s)?, &halved)?;
        let new_good = ok.select(&grow.select(&zero, &good_next)?, &zero)?;
        let (new_scale, new_good) = match &window_end {
            Some(end) => (end.select(&new_scale, s)?, end.select(&new_good, &good)?),
            None => (new_scale, new_good),
        };
        updates.push((LOSS_SCALE.into(), new_scale));
        updates.push((GOOD_STEPS.into(), new_good));
    }
    let mut seen = BTreeSet::new();
    for (name, _) in &updates {
        if !seen.insert(name.clone()) {
            return Err(config(format!("parameter `{name}` is updated twice (a name clash with training state)")));
        }
    }
    Ok((updates, apply))
}

/// [`build_step`] without the automatic choice: records exactly what `opts` says.
fn record_step(
    b: &GraphBuilder,
    params: &mut Params,
    forward: &Objective,
    optimizer: &dyn Optimizer,
    opts: &TrainOptions,
) -> Result<TrainStep> {
    let g = record_gradients(b, params, forward, opts)?;
    let checked = g.grads.clone();
    let scale = g.scale.as_ref().map(|s| (s, checked.as_slice()));
    let (updates, apply) = record_update(b, params, &g.named, g.grads, scale, optimizer, opts)?;
    let applied = match &apply {
        Some(a) => Some(a.cast(DType::F32)?.id()),
        None => None,
    };
    Ok(TrainStep {
        graph: b.graph(),
        loss: g.loss.id(),
        applied,
        updates: updates.into_iter().map(|(n, t)| (n, t.id())).collect(),
        trained: g.named.into_iter().map(|(n, _)| n).collect(),
        recomputed: g.recomputed,
        options: opts.clone(),
    })
}

/// A scalar f32 state parameter `name`, set to `init` if `params` has no value for it yet.
pub(crate) fn state(b: &GraphBuilder, params: &mut Params, name: &str, init: f64) -> Result<Tensor> {
    let fresh = params.get(name).is_none();
    let t = params.parameter(b, name, DType::F32, &[], Init::Zeros)?;
    if fresh {
        params.insert(name, HostTensor::from_f64(DType::F32, Vec::<usize>::new(), &[init])?);
    }
    Ok(t)
}

/// Inserts into `store` every parameter the graphs read that it lacks, from `params`, all
/// or nothing.
pub(crate) fn insert_missing(store: &ParamStore, graphs: &[&Graph], params: &Params) -> Result<()> {
    let mut missing: BTreeMap<String, &HostTensor> = BTreeMap::new();
    for name in graphs.iter().flat_map(|g| parameter_names(g)) {
        if store.ty(&name).is_none() {
            let value =
                params.get(&name).ok_or_else(|| config(format!("parameter `{name}` has no value in Params")))?;
            missing.insert(name, value);
        }
    }
    Ok(store.insert_all(missing.iter().map(|(n, v)| (n.as_str(), *v)))?)
}

/// The names of the parameters `graph` reads.
pub(crate) fn parameter_names(graph: &Graph) -> BTreeSet<String> {
    graph
        .node_ids()
        .into_iter()
        .filter_map(|id| match &graph.node(id).op {
            Op::Parameter { name } => Some(name.clone()),
            _ => None,
        })
        .collect()
}

/// Runs `exe` on `feeds` and, if given, a rank-0 f32 input `(name, value)`.
pub(crate) fn run_with_flag<K: FeedName>(
    exe: &Executable,
    feeds: &[(K, &HostTensor)],
    flag: Option<(&str, f32)>,
) -> Result<crate::Outputs> {
    let names = feeds.iter().map(|(k, _)| k.feed_name()).collect::<std::result::Result<Vec<_>, _>>()?;
    let mut all: Vec<(&str, &HostTensor)> = names.iter().map(|n| n.as_ref()).zip(feeds.iter().map(|f| f.1)).collect();
    let value = match flag {
        Some((_, v)) => Some(HostTensor::new(Vec::<usize>::new(), vec![v])?),
        None => None,
    };
    if let (Some((name, _)), Some(v)) = (flag, &value) {
        all.push((name, v));
    }
    Ok(exe.run(&all)?)
}

/// The first element of `t` as f64 (NaN if it has none).
pub(crate) fn scalar(t: &HostTensor) -> f64 {
    t.to_f64().first().copied().unwrap_or(f64::NAN)
}

/// What one [`Trainer::step`] did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepResult {
    /// The micro-batch's loss (unscaled, f32).
    pub loss: f32,
    /// Whether this run ended an accumulation window (always true without accumulation).
    pub window_end: bool,
    /// Whether the optimizer update was applied (false inside a window and on overflow).
    pub applied: bool,
}

/// A compiled training step: parameters and optimizer state live on the device, in a
/// [`ParamStore`] that other executables (evaluation at another batch size, generation) can
/// bind; each [`Trainer::step`] runs forward, backward and update in one submit and updates
/// the store in place.
pub struct Trainer {
    exe: Executable,
    step: TrainStep,
    micro: usize,
    store: ParamStore,
}

impl Trainer {
    /// Compiles `step` on `device` with a new parameter store holding every parameter the
    /// step reads, from `params` (which [`build_step`] filled with the optimizer and training
    /// state).
    pub fn new(device: &Arc<Device>, step: TrainStep, params: &Params) -> Result<Trainer> {
        Trainer::with_store(&ParamStore::new(device), step, params)
    }

    /// Compiles `step` against `store`: parameters the store holds keep their values (a
    /// store loaded from a checkpoint trains from it); those it lacks (a new model's weights,
    /// optimizer state) are inserted from `params` first, all or nothing.
    pub fn with_store(store: &ParamStore, step: TrainStep, params: &Params) -> Result<Trainer> {
        insert_missing(store, &[&step.graph], params)?;
        let exe = store.compile(&step.graph, &step.outputs(), &step.compile_options())?;
        Ok(Trainer { exe, step, micro: 0, store: store.clone() })
    }

    /// The parameter store the step trains.
    pub fn store(&self) -> &ParamStore {
        &self.store
    }

    /// Runs one micro-batch (one optimizer step without accumulation) with `feeds` (every
    /// model input, by name or handle; the `"apply"` input is fed here).
    pub fn step<K: FeedName>(&mut self, feeds: &[(K, &HostTensor)]) -> Result<StepResult> {
        let n = self.step.options.accumulate;
        let window_end = self.micro + 1 == n;
        let flag = (n > 1).then_some((APPLY, if window_end { 1.0 } else { 0.0 }));
        let out = run_with_flag(&self.exe, feeds, flag)?;
        self.micro = if window_end { 0 } else { self.micro + 1 };
        let loss = scalar(&out[0]) as f32;
        let applied = match out.get(1) {
            Some(t) => scalar(t) > 0.5,
            None => true,
        };
        Ok(StepResult { loss, window_end, applied })
    }

    /// The current value of a parameter (weights, optimizer or training state) on the device.
    pub fn parameter(&self, name: &str) -> Result<HostTensor> {
        Ok(self.exe.parameter(name)?)
    }

    /// Overwrites a parameter on the device.
    pub fn set_parameter(&mut self, name: &str, value: &HostTensor) -> Result<()> {
        Ok(self.exe.set_parameter(name, value)?)
    }

    /// The current loss scale (mixed precision), read from the device.
    pub fn loss_scale(&self) -> Result<Option<f32>> {
        if self.step.options.mixed_precision.is_none() {
            return Ok(None);
        }
        let t = self.exe.parameter(LOSS_SCALE)?;
        Ok(t.to_f64().first().map(|&v| v as f32))
    }

    /// Copies every parameter's device value into `params` (to save a checkpoint).
    pub fn read_params(&self, params: &mut Params) -> Result<()> {
        for (name, value) in self.store.read_all()? {
            params.insert(&name, value);
        }
        Ok(())
    }

    /// The step's planned device bytes: the store parameters it binds (weights, state) plus
    /// its constants, arena and staging, as compiled.
    pub fn planned_bytes(&self) -> u64 {
        let s = self.exe.stats();
        s.store_bytes + s.persistent_bytes + s.arena_bytes + s.staging_bytes
    }

    /// The compiled executable (stats, memory plan, DOT).
    pub fn executable(&self) -> &Executable {
        &self.exe
    }

    /// The step it runs.
    pub fn train_step(&self) -> &TrainStep {
        &self.step
    }
}
