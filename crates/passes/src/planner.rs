//! The planner query: how much device memory a graph needs, without a device.
//!
//! [`plan_graph`] runs the memory pipeline the runtime uses: partition or fuse → [`schedule`](crate::schedule::schedule_updating)
//! → [`plan_memory_updating`] → [`rematerialize_with`] when a budget is given. [`plan_summary`]
//! reports its bytes (persistent, arena, staging, total, lower bound, naive) and the largest
//! values live at the peak step, for out-of-memory messages. [`crate::pipeline`] runs the
//! rewrites before it, as a compile does, and searches the largest batch that fits.

use crate::attention::fuse_attention;
use crate::combine::{combine_products_where, Combined};
use crate::fuse::{fuse_updating, FusionOptions};
use crate::hoist::hoist;
use crate::kernel::{FusionMode, Kernel};
use crate::liveness::value_bytes;
use crate::memory_plan::{plan_memory_updating, MemoryOptions, MemoryPlan};
use crate::partition::partition;
use crate::remat::rematerialize_with;
use crate::schedule::schedule_updating;
use crate::windows::fold_windows;
use fusegraph_ir::{verify, Graph, NodeId, Result};
use std::collections::{BTreeMap, BTreeSet};

/// Knobs of the planner.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanOptions {
    /// Fusion on or off.
    pub fusion: FusionMode,
    /// Storage bindings a kernel may use (the adapter's `max_storage_buffers_per_shader_stage`).
    pub max_bindings: usize,
    /// Device figures for fusion's benefit estimate (measured by the runtime on a device).
    pub cost: crate::cost::CostModel,
    /// Offset alignment (the adapter's `min_storage_buffer_offset_alignment`).
    pub alignment: u64,
    /// Allow in-place reuse in the memory plan.
    pub in_place: bool,
    /// Reorder kernels with [`schedule`](crate::schedule::schedule_updating) to lower peak memory.
    pub schedule: bool,
    /// Rematerialize until the arena fits this many bytes (or nothing helps).
    pub remat_budget: Option<u64>,
    /// How many of the largest values live at the peak to report.
    pub top_values: usize,
    /// In [`plan_within`], rematerialize when the plan exceeds the
    /// limit.
    pub remat: bool,
    /// Parameter updates, as (parameter name, index into the outputs of its new value): the
    /// plan writes each in place where [`plan_memory_updating`] finds it safe, and keeps it
    /// alive to the end of the run, but it is not read back: the summary's staging counts
    /// the other outputs only. Indices rather than nodes, so they survive rewrites of a copy
    /// of the graph ([`crate::pipeline::run`] fills them).
    pub updates: Vec<(String, usize)>,
    /// Memory-efficient attention ([`crate::attention`]): when every `softmax(x)·v` merges
    /// into one kernel that stores neither the scores nor the probabilities.
    pub fused_attention: FusedAttention,
    /// Move the kernels that compute from parameters and constants alone to the front of
    /// the schedule and keep the values they leave for later kernels ([`mod@crate::hoist`]), so a
    /// runtime can run them only after a parameter changes. Off with a `remat_budget`; in
    /// [`plan_within`], dropped where the plan would not fit its limit otherwise.
    pub hoist: bool,
    /// With fusion on, combine the matrix products that share their left operand and whose
    /// weights (parameters of one shape that no update writes) stack into one parameter
    /// ([`mod@crate::combine`]), in the copy of the graph [`plan_summary_within`] plans, as
    /// the runtime's compile does; [`plan_graph`] plans the graph it is given.
    pub combine_products: bool,
    /// Parameters live outside the plan, in buffers of their own
    /// ([`MemoryOptions::external_parameters`]); products then do not combine (their weights
    /// would have to be stacked into one buffer).
    pub external_parameters: bool,
    /// [`FusionOptions::gemv`]: the device lowers products of a few rows by the
    /// matrix–vector kernel, so sibling products of one left operand merge.
    pub gemv: bool,
    /// [`FusionOptions::gemv_stage_bytes`]: the adapter's workgroup memory.
    pub gemv_stage_bytes: usize,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            fusion: FusionMode::On,
            max_bindings: FusionOptions::default().max_bindings,
            cost: crate::cost::CostModel::default(),
            alignment: 256,
            in_place: true,
            schedule: true,
            remat_budget: None,
            top_values: 8,
            remat: true,
            updates: Vec::new(),
            fused_attention: FusedAttention::OverLimit,
            hoist: false,
            combine_products: false,
            external_parameters: false,
            gemv: false,
            gemv_stage_bytes: crate::GEMV_STAGE_BYTES,
        }
    }
}

/// When attention's `softmax(x)·v` (its probabilities times the values) runs as one
/// memory-efficient kernel that stores neither the scores nor the probabilities
/// ([`crate::attention`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FusedAttention {
    /// Only where the plan would otherwise exceed the memory limit (tried before
    /// rematerialization): the default.
    #[default]
    OverLimit,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// A value live at the peak step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveValue {
    /// The node.
    pub node: NodeId,
    /// Its bytes.
    pub bytes: u64,
    /// Its op's mnemonic.
    pub op: &'static str,
    /// Its debug name, if any.
    pub name: Option<String>,
}

/// Device memory a graph needs, in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanSummary {
    /// Parameters and constants.
    pub persistent_bytes: u64,
    /// Inputs and intermediates (the arena of the plan).
    pub arena_bytes: u64,
    /// The readback buffer: the sum of the outputs' buffer sizes (update values, which stay
    /// on the device, not counted).
    pub staging_bytes: u64,
    /// `persistent + arena + staging`.
    pub total_bytes: u64,
    /// The peak of live arena bytes over the schedule, each in-place chain counted once
    /// (see [`MemoryPlan::lower_bound_bytes`]).
    pub lower_bound_bytes: u64,
    /// The arena if every value had its own slot.
    pub naive_bytes: u64,
    /// Kernels in the final schedule (rematerialized copies included).
    pub kernels: usize,
    /// The first step where live bytes peak.
    pub peak_step: usize,
    /// The largest values live at the peak step, largest first (at most `top_values`), one
    /// per in-place chain (an output written over its input is named, not both).
    pub peak_values: Vec<LiveValue>,
}

/// The result of [`plan_graph`]: kernels in run order, their memory plan, and the summary.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    /// Kernels in the order to run them.
    pub kernels: Vec<Kernel>,
    /// The memory plan for that order.
    pub plan: MemoryPlan,
    /// Its bytes.
    pub summary: PlanSummary,
    /// How many leading kernels compute from parameters and constants alone
    /// ([`PlanOptions::hoist`]; 0 without it): they need to run only after a parameter
    /// changes, and the plan keeps what they leave for later kernels.
    pub prepared: usize,
}

/// Verifies `g`, then fuses (or partitions), schedules, plans memory and, with a budget,
/// rematerializes. Errors on an invalid graph or unknown outputs.
pub fn plan_graph(g: &Graph, outputs: &[NodeId], opts: &PlanOptions) -> Result<Planned> {
    verify(g)?;
    for &o in outputs {
        g.check(o)?;
    }
    let updates = update_pairs(g, outputs, &opts.updates)?;
    let mut kernels = match opts.fusion {
        FusionMode::Off => partition(g, outputs, FusionMode::Off)?,
        FusionMode::On => {
            let fopts = FusionOptions {
                max_bindings: opts.max_bindings,
                cost: opts.cost,
                gemv: opts.gemv,
                fused_attention: opts.fused_attention == FusedAttention::Always,
                gemv_stage_bytes: opts.gemv_stage_bytes,
                ..Default::default()
            };
            let values: Vec<NodeId> = updates.iter().map(|&(_, v)| v).collect();
            let mut kernels = fuse_updating(g, outputs, &values, &fopts)?.kernels;
            if opts.fused_attention == FusedAttention::Always {
                kernels = fuse_attention(g, kernels, outputs, opts.max_bindings);
            }
            fold_windows(g, kernels, outputs, &updates, (opts.max_bindings, opts.gemv))
        }
    };
    if opts.schedule {
        kernels = schedule_updating(g, kernels, outputs, &updates);
    }
    let mopts = MemoryOptions {
        alignment: opts.alignment,
        in_place: opts.in_place,
        external_parameters: opts.external_parameters,
    };
    if let Some(budget) = opts.remat_budget {
        kernels = rematerialize_with(g, kernels, outputs, budget, &mopts);
    }
    // Hoisted kernels' values that later kernels read live to the end, as outputs do (but
    // are not read back: the summary counts the real outputs).
    let (mut prepared, mut kept) = (0, outputs.to_vec());
    if opts.hoist && opts.remat_budget.is_none() {
        // Every parameter node of an updated name (not only those updated in place).
        let names: std::collections::BTreeSet<&str> = opts.updates.iter().map(|(n, _)| n.as_str()).collect();
        let updated = g
            .node_ids()
            .into_iter()
            .filter(
                |&id| matches!(&g.node(id).op, fusegraph_ir::Op::Parameter { name } if names.contains(name.as_str())),
            )
            .collect();
        let hoisted = hoist(g, kernels, outputs, &updated);
        (kernels, prepared) = (hoisted.kernels, hoisted.prepared);
        kept.extend(hoisted.pinned.into_iter().filter(|v| !outputs.contains(v)));
    }
    let plan = plan_memory_updating(g, &kernels, &kept, &mopts, &updates);
    let summary = summarize(g, outputs, &opts.updates, &kernels, &plan, opts.top_values);
    Ok(Planned { kernels, plan, summary, prepared })
}

/// `(parameter node, value node)` of each update (a parameter's name and an index into
/// `outputs`) whose parameter name is one reachable parameter node and whose index names an
/// output.
pub fn update_pairs(g: &Graph, outputs: &[NodeId], updates: &[(String, usize)]) -> Result<Vec<(NodeId, NodeId)>> {
    if updates.is_empty() {
        return Ok(Vec::new());
    }
    let mut by_name: BTreeMap<&str, Vec<NodeId>> = Default::default();
    for id in g.reachable(outputs)? {
        if let fusegraph_ir::Op::Parameter { name } = &g.node(id).op {
            by_name.entry(name.as_str()).or_default().push(id);
        }
    }
    Ok(updates
        .iter()
        .filter_map(|(name, i)| match (by_name.get(name.as_str()).map(Vec::as_slice), outputs.get(*i)) {
            (Some([p]), Some(&u)) => Some((*p, u)),
            _ => None,
        })
        .collect())
}

/// Plans as [`plan_graph`]; if the total exceeds `limit`, plans again without hoisting,
/// then with memory-efficient attention (where `opts.fused_attention` leaves it to the limit) and then,
/// if `opts.remat` is set and it still does not fit, with rematerialization toward an arena
/// budget of what the limit leaves after the persistent and staging bytes. The caller compares the result's total
/// with the limit.
pub fn plan_within(g: &Graph, outputs: &[NodeId], opts: &PlanOptions, limit: Option<u64>) -> Result<Planned> {
    let mut planned = plan_graph(g, outputs, opts)?;
    let Some(limit) = limit else { return Ok(planned) };
    let mut opts = opts.clone();
    // Hoisting keeps values alive through the run: it never costs a plan its fit.
    if planned.summary.total_bytes > limit && planned.prepared > 0 {
        opts.hoist = false;
        planned = plan_graph(g, outputs, &opts)?;
    }
    if planned.summary.total_bytes > limit
        && opts.fused_attention == FusedAttention::OverLimit
        && opts.fusion == FusionMode::On
    {
        opts.fused_attention = FusedAttention::Always;
        let attention = plan_graph(g, outputs, &opts)?;
        if attention.summary.total_bytes < planned.summary.total_bytes {
            planned = attention;
        } else {
            opts.fused_attention = FusedAttention::Never;
        }
    }
    let fixed = planned.summary.persistent_bytes + planned.summary.staging_bytes;
    if planned.summary.total_bytes <= limit || !opts.remat || limit <= fixed || opts.remat_budget.is_some() {
        return Ok(planned);
    }
    let with_budget = PlanOptions { remat_budget: Some(limit - fixed), ..opts };
    plan_graph(g, outputs, &with_budget)
}

/// [`plan_within`] after combining the sibling products of `g` in place where
/// `opts.combine_products` is set and fusion is on ([`crate::combine::combine_products`]; the
/// parameters named in `opts.updates` are not stacked; with `opts.gemv`, products of at most
/// [`crate::GEMV_MAX_ROWS`] rows are not combined). A combined product's value lives until its
/// last view is read, which can raise the peak; where the combined plan exceeds `limit` and
/// the plan of `g` as it was is smaller, `g` is restored and that plan returned with no
/// groups.
pub fn plan_combined_within(
    g: &mut Graph,
    outputs: &[NodeId],
    opts: &PlanOptions,
    limit: Option<u64>,
) -> Result<(Planned, Vec<Combined>)> {
    if !opts.combine_products || opts.external_parameters || opts.fusion != FusionMode::On {
        return Ok((plan_within(g, outputs, opts, limit)?, Vec::new()));
    }
    let original = g.clone();
    let updated: BTreeSet<String> = opts.updates.iter().map(|(name, _)| name.clone()).collect();
    let groups = combine_sibling_products(g, outputs, &updated, opts.gemv)?;
    let planned = plan_within(g, outputs, opts, limit)?;
    if groups.is_empty() || limit.is_none_or(|l| planned.summary.total_bytes <= l) {
        return Ok((planned, groups));
    }
    let apart = plan_within(&original, outputs, opts, limit)?;
    if apart.summary.total_bytes < planned.summary.total_bytes {
        *g = original;
        return Ok((apart, Vec::new()));
    }
    Ok((planned, groups))
}

/// Combines the sibling products of `g` in place as a compile does
/// ([`crate::combine::combine_products`]; the parameters named in `updated` are not
/// stacked): with `gemv` ([`PlanOptions::gemv`]), products of at most
/// [`crate::GEMV_MAX_ROWS`] rows stay apart, since the matrix–vector kernel runs those of one
/// left operand in one dispatch as they are and computes their operand's norm in its
/// prologue, which a stacked product's broadcast operand would not allow.
pub fn combine_sibling_products(
    g: &mut Graph,
    outputs: &[NodeId],
    updated: &BTreeSet<String>,
    gemv: bool,
) -> Result<Vec<Combined>> {
    let few_rows = |g: &Graph, p: NodeId| {
        let d = g.ty(p).shape.dims();
        d.len() >= 2 && d[d.len() - 2] <= crate::GEMV_MAX_ROWS
    };
    combine_products_where(g, outputs, updated, &|g, p| !(gemv && few_rows(g, p)))
}

/// The bytes of the plan of `outputs` as the graph stands (sibling products combined if
/// `opts.combine_products`), with rematerialization toward `limit` if given; see
/// [`PlanSummary`]. [`crate::pipeline::run`] plans as a compile does (simplified and split
/// first).
pub fn plan_summary_within(
    g: &Graph,
    outputs: &[NodeId],
    opts: &PlanOptions,
    limit: Option<u64>,
) -> Result<PlanSummary> {
    let mut g2 = g.clone();
    Ok(plan_combined_within(&mut g2, outputs, opts, limit)?.0.summary)
}

/// The bytes of the plan of `outputs` as the graph stands; see [`PlanSummary`].
pub fn plan_summary(g: &Graph, outputs: &[NodeId], opts: &PlanOptions) -> Result<PlanSummary> {
    plan_summary_within(g, outputs, opts, None)
}

fn summarize(
    g: &Graph,
    outputs: &[NodeId],
    updates: &[(String, usize)],
    kernels: &[Kernel],
    plan: &MemoryPlan,
    top: usize,
) -> PlanSummary {
    // Update values stay on the device; one that is also an output in its own right is read
    // back (and counted) as that output.
    let update_index: BTreeSet<usize> = updates.iter().map(|&(_, i)| i).collect();
    let read_back = outputs.iter().enumerate().filter(|(i, _)| !update_index.contains(i));
    let staging_bytes: u64 =
        read_back.map(|(_, o)| plan.locations.get(o).map_or_else(|| value_bytes(g, *o), |l| l.size)).sum();
    let per_step = plan.live_bytes_per_step();
    let peak_step = per_step.iter().enumerate().fold(0, |best, (s, &b)| if b > per_step[best] { s } else { best });
    // One value per in-place chain: at the step where an output takes over its input's bytes
    // both are live, and the output (the later range) is named.
    let mut at_peak: BTreeMap<NodeId, (usize, NodeId, u64)> = BTreeMap::new();
    for (&node, ivs) in &plan.intervals {
        if let Some(iv) = ivs.iter().find(|iv| iv.start <= peak_step && peak_step <= iv.end) {
            let entry = at_peak.entry(plan.chain_root(node)).or_insert((iv.start, node, iv.bytes));
            if iv.start > entry.0 {
                *entry = (iv.start, node, iv.bytes);
            }
        }
    }
    let mut peak_values: Vec<LiveValue> = at_peak
        .into_values()
        .map(|(_, node, bytes)| {
            let n = g.node(node);
            LiveValue { node, bytes, op: n.op.name(), name: n.name.clone() }
        })
        .collect();
    peak_values.sort_by_key(|v| (std::cmp::Reverse(v.bytes), v.node));
    peak_values.truncate(top);
    PlanSummary {
        persistent_bytes: plan.persistent_bytes,
        arena_bytes: plan.arena_bytes,
        staging_bytes,
        total_bytes: plan.persistent_bytes + plan.arena_bytes + staging_bytes,
        lower_bound_bytes: plan.lower_bound_bytes,
        naive_bytes: plan.naive_bytes,
        kernels: kernels.len(),
        peak_step,
        peak_values,
    }
}
