//! The device-free stages of a compile, in one order for every caller: the runtime's
//! `compile`, `plan` and `largest_batch`, and a training step's plan.
//!
//! 1. **verify** the graph and every output and update value;
//! 2. **mixed precision** ([`crate::mixed_precision`]) where asked for;
//! 3. **rewrites** ([`crate::rewrite`]): simplification, split-k and split reductions, each
//!    split kept only where the split graph's plan fits the limit as it is; then concats
//!    wider than a kernel's bindings split into trees ([`crate::wide`]);
//! 4. **fit to the limit** ([`plan_combined_within`]): sibling products combined, then fused,
//!    scheduled and planned; over the limit, hoisting dropped, attention fused and values
//!    rematerialized, in that order.
//!
//! What follows — choosing kernel forms, lowering to WGSL, allocating and binding — needs a
//! device and lives in the runtime. Callers differ only in what they do with the [`Front`]:
//! the runtime's `plan` reads its summary, `compile` lowers and allocates it.
//!
//! Updates are first-class: a parameter's new value is planned beside the outputs (alive to
//! the end of the run, written in place where safe) but is not read back, so the summary's
//! staging counts the outputs alone ([`PlanSummary::staging_bytes`]).

use crate::combine::Combined;
use crate::planner::{plan_combined_within, plan_within, PlanOptions, PlanSummary, Planned};
use crate::rewrite::{rewrite, Rewrites};
use crate::split_k::Gemm;
use crate::split_reduce::FillOptions as ReduceFill;
use crate::FusionMode;
use fusegraph_ir::{verify, Graph, NodeId, Result};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// The slice count split-k gives each product (1 leaves it alone).
pub type SplitCount<'a> = Box<dyn Fn(&Gemm) -> usize + 'a>;

/// What the device-free stages are asked for: the planner's options, the rewrites, mixed
/// precision and the memory limit. A runtime fills it from its compile options and its
/// adapter's facts; without a device, [`Stages::default`] plans for the default limits.
#[derive(Default)]
pub struct Stages<'a> {
    /// Fusion, binding limit, cost model, alignment and the fit-to-limit choices.
    /// [`PlanOptions::updates`] is filled by [`run`] from the updates it is given.
    pub plan: PlanOptions,
    /// Run the simplification passes first.
    pub simplify: bool,
    /// Store f32 values as f16 but for these f32 master parameters (their names) and those
    /// the updates write, which always stay f32 (a training step's weights and optimizer
    /// state need their f32 values between steps).
    pub mixed_precision: Option<BTreeSet<String>>,
    /// Split matmuls over `k`: the slice count for each product (1 leaves it alone).
    pub split_k: Option<SplitCount<'a>>,
    /// Split reductions with few outputs and long rows by this occupancy rule (fusion on
    /// only: the partial sums are meant to fuse with their producer).
    pub split_reductions: Option<ReduceFill>,
    /// The bytes the plan must fit (parameters, arena and staging), if any.
    pub limit: Option<u64>,
}

/// The result of the device-free stages: the graph as it will be lowered and its plan.
#[derive(Clone, Debug)]
pub struct Front {
    /// The graph after mixed precision and the rewrites (sibling products combined).
    pub graph: Graph,
    /// The outputs read back, in the caller's order, as nodes of `graph`.
    pub outputs: Vec<NodeId>,
    /// The update values, in the caller's order, as nodes of `graph`.
    pub updates: Vec<NodeId>,
    /// Kernels in run order and their memory plan (outputs then update values kept alive).
    pub planned: Planned,
    /// The sibling products combined, whose stacked weights are parameters of `graph`.
    pub combined: Vec<Combined>,
    /// Time spent in verification, mixed precision and the rewrites.
    pub rewrite_time: Duration,
    /// Time spent fusing, scheduling and planning.
    pub plan_time: Duration,
}

impl Front {
    /// The plan's bytes.
    pub fn summary(&self) -> &PlanSummary {
        &self.planned.summary
    }
}

/// The device memory a plan of `summary`'s regions takes: each region is one buffer of at
/// least 4 bytes (an empty one too). The figure both `compile` and `largest_batch` hold
/// against a limit.
pub fn held_bytes(summary: &PlanSummary) -> u64 {
    [summary.persistent_bytes, summary.arena_bytes, summary.staging_bytes].iter().map(|&b| b.max(4)).sum()
}

/// Runs the stages on `outputs` of `graph` with parameter `updates` (a parameter's name and
/// its new value). Errors: an invalid graph, an unknown output or update value, or a pass's
/// error. A plan over the limit is not an error here: the caller compares
/// [`held_bytes`] with the limit.
pub fn run(graph: &Graph, outputs: &[NodeId], updates: &[(String, NodeId)], stages: &Stages) -> Result<Front> {
    let start = Instant::now();
    verify(graph)?;
    let update_values: Vec<NodeId> = updates.iter().map(|(_, v)| *v).collect();
    for &o in outputs.iter().chain(&update_values) {
        graph.check(o)?;
    }
    // Update values follow the outputs in the planner's list; the planner knows them by index.
    let mut outs: Vec<NodeId> = outputs.iter().chain(&update_values).copied().collect();
    let mut g = match &stages.mixed_precision {
        Some(masters) => {
            let mut masters = masters.clone();
            masters.extend(updates.iter().map(|(name, _)| name.clone()));
            let (g, mixed) =
                crate::mixed_precision::to_mixed_precision_updating(graph, &outs, &masters, &update_values)?;
            outs = mixed;
            g
        }
        None => graph.clone(),
    };
    let mut popts = stages.plan.clone();
    popts.updates = updates.iter().enumerate().map(|(i, (name, _))| (name.clone(), outputs.len() + i)).collect();
    rewrite_within(&mut g, &mut outs, stages, &popts)?;
    let rewrite_time = start.elapsed();
    let (planned, combined) = plan_combined_within(&mut g, &outs, &popts, stages.limit)?;
    let plan_time = start.elapsed() - rewrite_time;
    let updates = outs.split_off(outputs.len());
    Ok(Front { graph: g, outputs: outs, updates, planned, combined, rewrite_time, plan_time })
}

/// The rewrite stage: each split kept only where the split graph's plan (without
/// rematerialization or fused attention) fits the limit.
fn rewrite_within(g: &mut Graph, outs: &mut Vec<NodeId>, stages: &Stages, popts: &PlanOptions) -> Result<()> {
    let fits = |g: &Graph, outs: &[NodeId]| {
        stages.limit.is_none_or(|l| plan_within(g, outs, popts, None).is_ok_and(|p| held_bytes(&p.summary) <= l))
    };
    let rewrites = Rewrites {
        simplify: stages.simplify,
        split_k: stages.split_k.as_deref(),
        split_reductions: stages.split_reductions.filter(|_| popts.fusion == FusionMode::On),
    };
    rewrite(g, outs, &rewrites, &fits)?;
    // A kernel binds its operands and its result.
    crate::wide::split_wide_concats(g, outs, popts.max_bindings.saturating_sub(1))?;
    Ok(())
}

/// The largest batch in `1..=max_batch` whose plan through [`run`] with `stages` holds at
/// most `stages.limit` bytes ([`held_bytes`]; every batch fits without a limit), found by
/// doubling then bisection (assuming memory grows with the batch); `None` if batch 1 does
/// not fit. `build(batch)` returns the graph, its outputs and its updates. Plans only; no
/// device.
pub fn largest_batch(
    build: impl Fn(usize) -> Result<(Graph, Vec<NodeId>, Vec<(String, NodeId)>)>,
    stages: &Stages,
    max_batch: usize,
) -> Result<Option<usize>> {
    let Some(limit) = stages.limit else { return Ok((max_batch > 0).then_some(max_batch)) };
    largest_fitting(max_batch, |batch| {
        let (g, outputs, updates) = build(batch)?;
        Ok(held_bytes(run(&g, &outputs, &updates, stages)?.summary()) <= limit)
    })
}

/// The largest batch in `1..=max_batch` that `fits`, found by doubling then bisection
/// (assuming what fits grows no larger with the batch); `None` if batch 1 does not fit.
pub fn largest_fitting<E>(
    max_batch: usize,
    mut fits: impl FnMut(usize) -> std::result::Result<bool, E>,
) -> std::result::Result<Option<usize>, E> {
    if max_batch == 0 || !fits(1)? {
        return Ok(None);
    }
    let (mut lo, mut hi) = (1, None);
    while lo < max_batch {
        let next = lo.saturating_mul(2).min(max_batch);
        if fits(next)? {
            lo = next;
        } else {
            hi = Some(next);
            break;
        }
    }
    let Some(mut hi) = hi else { return Ok(Some(lo)) };
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(Some(lo))
}
