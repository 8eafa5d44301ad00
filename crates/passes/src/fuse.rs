//! The fusion pass, in the spirit of XLA's priority fusion, made memory-aware.
//!
//! Producers are visited from the outputs back to the inputs. A producer fuses into *all* of
//! its consumers' kernels or into none: cheap producers (elementwise, layout) may be
//! duplicated into several kernels; expensive ones (reductions, matmul, conv, pooling) only
//! join a single consumer kernel and only where each of their elements is computed once.
//! Every refusal has a named [`Veto`] that tests assert. What it does not do: reorder the
//! graph, or fuse graph outputs into their consumers (they must be stored anyway).
//!
//! After the pass every kernel is one of two kinds (see [`KernelKind`]): a loop kernel (one
//! invocation per output element; matmul/conv/reductions with fused prologues and epilogues
//! included) or a row kernel (one workgroup per row of a reduction; row patterns such as
//! softmax and layer norm, and large plain reductions).

use crate::cost::{flops_per_element, is_data_movement, is_expensive, reads_per_operand_element, CostModel};
use crate::kernel::{is_memory_leaf, make_kernel, regions, same_index_operands, Kernel, KernelKind};
use crate::liveness::{intervals, peak_live_bytes};
use fusegraph_ir::{Graph, NodeId, Op, Result};
use std::collections::{BTreeMap, BTreeSet};

/// Knobs of the fusion pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FusionOptions {
    /// Storage bindings a kernel may use (the adapter's `max_storage_buffers_per_shader_stage`).
    pub max_bindings: usize,
    /// Reductions at least this long use a row kernel (a workgroup per row).
    pub min_row_len: usize,
    /// Device figures for the benefit estimate.
    pub cost: CostModel,
    /// Refuse fusions that raise the plan's peak of live bytes.
    pub memory_aware: bool,
}

impl Default for FusionOptions {
    fn default() -> Self {
        FusionOptions { max_bindings: 8, min_row_len: 64, cost: CostModel::default(), memory_aware: true }
    }
}

/// Why a producer was not fused into its consumers.
#[derive(Clone, Debug, PartialEq)]
pub enum Veto {
    /// The producer is a graph output and must be stored anyway.
    GraphOutput,
    /// A reduction would consume another reduction (or a contraction) inside one loop kernel.
    ReductionIntoReduction,
    /// An expensive producer would be computed more than once per element.
    DuplicatesExpensive,
    /// The kernel would need more storage bindings than the adapter allows.
    TooManyBindings {
        /// Bindings needed.
        needed: usize,
        /// The limit.
        limit: usize,
    },
    /// The fused kernel would depend on itself through another kernel.
    Cycle,
    /// The plan's peak of live bytes would rise.
    PeakMemory {
        /// Peak before, bytes.
        before: u64,
        /// Peak after, bytes.
        after: u64,
    },
    /// A reduction's result is used in a way a row kernel cannot express.
    RowShape,
    /// A second matmul or convolution would join a kernel that already has one: the tiled
    /// lowering computes one contraction per kernel, so the other would run naively.
    SecondContraction,
    /// Arithmetic would be recomputed in the prologue of a matmul, conv or pooling, which
    /// reads each operand element many times; only data movement fuses there.
    Prologue,
    /// The cost model estimates no gain.
    NoBenefit,
}

/// One decision of the pass, for tests and `FUSEGRAPH_LOG`.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The producer considered.
    pub producer: NodeId,
    /// `None` if it fused, else why not.
    pub veto: Option<Veto>,
}

/// The result of fusion: kernels in execution order and every decision taken.
#[derive(Clone, Debug, PartialEq)]
pub struct Fusion {
    /// Kernels in a valid execution order.
    pub kernels: Vec<Kernel>,
    /// Decisions, in the order they were taken.
    pub log: Vec<Decision>,
    /// Sibling-merge decisions between kernels that share an input.
    pub siblings: Vec<SiblingDecision>,
}

/// One sibling-merge decision: kernels `a` and `b` (named by their first members) share an
/// input; `veto` says why they were not merged.
#[derive(Clone, Debug, PartialEq)]
pub struct SiblingDecision {
    /// First member of one kernel.
    pub a: NodeId,
    /// First member of the other.
    pub b: NodeId,
    /// `None` if merged.
    pub veto: Option<Veto>,
}

struct Ctx<'a> {
    /// Cheap values computed from `full`/`iota` alone: inlined wherever used, never stored
    /// once fusion is done, so they do not count toward peak memory.
    const_like: BTreeSet<NodeId>,
    g: &'a Graph,
    outputs: &'a [NodeId],
    live: BTreeSet<NodeId>,
    pos: BTreeMap<NodeId, usize>,
    opts: &'a FusionOptions,
}

impl Ctx<'_> {
    fn peak(&self, groups: &[BTreeSet<NodeId>]) -> u64 {
        let mut live = intervals(self.g, &self.kernels(groups), self.outputs);
        live.retain(|n, _| !self.const_like.contains(n) || self.outputs.contains(n));
        peak_live_bytes(&live)
    }

    fn users(&self, id: NodeId) -> Vec<NodeId> {
        self.g.users(id).into_iter().filter(|u| self.live.contains(u)).collect()
    }

    fn group_outputs(&self, members: &BTreeSet<NodeId>, all: &[BTreeSet<NodeId>]) -> Vec<NodeId> {
        // A member is stored if it is a graph output or some user outside this group (in a
        // kernel that does not compute it itself) needs it.
        members
            .iter()
            .copied()
            .filter(|&m| {
                self.outputs.contains(&m)
                    || self
                        .users(m)
                        .iter()
                        .any(|u| !members.contains(u) && all.iter().any(|gr| gr.contains(u) && !gr.contains(&m)))
            })
            .collect()
    }

    /// Evaluations per element of each member in a loop kernel whose stored members are
    /// `outs`, matching the code generator: each output's region (same-index chain) is
    /// computed once per element into registers; everything else is a function call per use.
    fn multiplicity(&self, members: &BTreeSet<NodeId>, outs: &[NodeId]) -> BTreeMap<NodeId, f64> {
        let kernel = Kernel {
            kind: KernelKind::Loop,
            members: members.iter().copied().collect(),
            outputs: outs.to_vec(),
            inputs: vec![],
        };
        let mut lets: BTreeMap<NodeId, f64> = BTreeMap::new();
        let mut in_region: BTreeMap<NodeId, BTreeSet<NodeId>> = BTreeMap::new();
        for (o, region) in regions(self.g, &kernel) {
            for &n in &region {
                *lets.entry(n).or_default() += 1.0;
            }
            in_region.insert(o, region.into_iter().collect());
        }
        let mut order: Vec<NodeId> = members.iter().copied().collect();
        order.sort_by_key(|n| std::cmp::Reverse(self.pos[n]));
        let mut calls: BTreeMap<NodeId, f64> = BTreeMap::new();
        for &n in &order {
            let mut total = 0.0;
            for u in self.users(n).into_iter().filter(|u| members.contains(u)) {
                let same = same_index_operands(self.g, u).contains(&n);
                for (p, o) in self.g.operands(u).into_iter().enumerate() {
                    if o != n {
                        continue;
                    }
                    // A let of `u` reads `n` from registers when both share a region.
                    let let_reads: f64 =
                        in_region.values().filter(|r| r.contains(&u) && !(same && r.contains(&n))).count() as f64;
                    total +=
                        (let_reads + calls.get(&u).copied().unwrap_or(0.0)) * reads_per_operand_element(self.g, u, p);
                }
            }
            calls.insert(n, total);
        }
        order.iter().map(|&n| (n, lets.get(&n).copied().unwrap_or(0.0) + calls[&n])).collect()
    }

    /// Whether a contraction (matmul, conv, pooling) in the group has arithmetic in its
    /// prologue: its operands are read many times per element, so only data movement (cast,
    /// transpose, broadcast, …) may be recomputed there.
    fn arithmetic_prologue(&self, members: &BTreeSet<NodeId>) -> bool {
        members.iter().any(|&c| {
            matches!(self.g.node(c).op, Op::MatMul | Op::Conv2d { .. } | Op::Pool { .. })
                && self
                    .g
                    .operands(c)
                    .iter()
                    .any(|&o| self.upstream_or_self(members, o, &|n| !is_data_movement(&self.g.node(n).op)))
        })
    }

    fn upstream_or_self(&self, members: &BTreeSet<NodeId>, from: NodeId, pred: &dyn Fn(NodeId) -> bool) -> bool {
        let mut stack = vec![from];
        let mut seen = BTreeSet::new();
        while let Some(n) = stack.pop() {
            if !members.contains(&n) || !seen.insert(n) {
                continue;
            }
            if pred(n) {
                return true;
            }
            stack.extend(self.g.operands(n));
        }
        false
    }

    /// Members that depend, inside the group, on `roots`.
    fn dependents(&self, members: &BTreeSet<NodeId>, roots: &BTreeSet<NodeId>) -> BTreeSet<NodeId> {
        let mut order: Vec<NodeId> = members.iter().copied().collect();
        order.sort_by_key(|n| self.pos[n]);
        let mut dep: BTreeSet<NodeId> = BTreeSet::new();
        for n in order {
            if self.g.operands(n).iter().any(|o| roots.contains(o) || dep.contains(o)) {
                dep.insert(n);
            }
        }
        dep
    }

    /// Decides the kernel kind of a candidate group, or why it cannot be one kernel.
    fn analyze(&self, members: &BTreeSet<NodeId>, outs: &[NodeId]) -> Result<KernelKind, Veto> {
        let g = self.g;
        let reduces: BTreeSet<NodeId> =
            members.iter().copied().filter(|&n| matches!(g.node(n).op, Op::Reduce { .. })).collect();
        let expensive: BTreeSet<NodeId> = members.iter().copied().filter(|&n| is_expensive(&g.node(n).op)).collect();
        let m = self.multiplicity(members, outs);
        let loop_ok = expensive.iter().all(|e| m[e] <= 1.0 + 1e-9);
        // A reduction that consumes an expensive member serializes its work in one thread.
        let reduce_after_expensive = reduces
            .iter()
            .any(|r| self.dependents(members, &expensive).contains(r) || self.upstream(members, *r, &expensive));
        let contractions = members.iter().filter(|&&n| matches!(g.node(n).op, Op::MatMul | Op::Conv2d { .. })).count();
        let loop_kind = if self.arithmetic_prologue(members) {
            Err(Veto::Prologue)
        } else if contractions > 1 {
            Err(Veto::SecondContraction)
        } else if !loop_ok {
            Err(Veto::DuplicatesExpensive)
        } else if reduce_after_expensive {
            Err(Veto::ReductionIntoReduction)
        } else {
            Ok(KernelKind::Loop)
        };
        if reduces.is_empty() {
            return loop_kind;
        }
        let row = self.row_kind(members, outs, &reduces);
        let long = reduces.iter().any(|&r| {
            let Op::Reduce { axes, .. } = &g.node(r).op else { return false };
            let d = g.ty(g.operands(r)[0]).shape.dims().to_vec();
            axes.iter().map(|&a| d[a]).product::<usize>() >= self.opts.min_row_len
        });
        match (loop_kind, row) {
            (Ok(l), Ok(r)) => Ok(if long { r } else { l }),
            (Ok(l), Err(_)) => Ok(l),
            (Err(_), Ok(r)) => Ok(r),
            (Err(e), Err(re)) => Err(if e == Veto::DuplicatesExpensive && reduces.len() > 1 { re } else { e }),
        }
    }

    fn upstream(&self, members: &BTreeSet<NodeId>, from: NodeId, targets: &BTreeSet<NodeId>) -> bool {
        let mut stack = self.g.operands(from);
        let mut seen = BTreeSet::new();
        while let Some(n) = stack.pop() {
            if !members.contains(&n) || !seen.insert(n) {
                continue;
            }
            if targets.contains(&n) {
                return true;
            }
            stack.extend(self.g.operands(n));
        }
        false
    }

    /// Checks the row-kernel rules: every reduction reduces the same axes of the same shape;
    /// whatever depends on a reduction stays in that row (elementwise on the full or reduced
    /// shape, reshapes of the reduced shape, broadcasts back along the reduced axes).
    fn row_kind(
        &self,
        members: &BTreeSet<NodeId>,
        outs: &[NodeId],
        reduces: &BTreeSet<NodeId>,
    ) -> Result<KernelKind, Veto> {
        let g = self.g;
        let mut space: Option<(Vec<usize>, Vec<usize>)> = None;
        for &r in reduces {
            let Op::Reduce { axes, .. } = &g.node(r).op else { unreachable!("filtered to reduces") };
            let s = (g.ty(g.operands(r)[0]).shape.dims().to_vec(), axes.clone());
            match &space {
                None => space = Some(s),
                Some(prev) if *prev == s => {}
                Some(_) => return Err(Veto::ReductionIntoReduction),
            }
        }
        let (shape, axes) = space.expect("at least one reduction");
        let full: usize = shape.iter().product();
        let kept: Vec<usize> =
            (0..shape.len()).filter(|a| !axes.contains(a) && shape[*a] != 1).map(|a| shape[a]).collect();
        let rows: usize = kept.iter().product();
        let reduced_like = |dims: &[usize]| dims.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>() == kept;
        if members.iter().any(|&n| is_expensive(&g.node(n).op) && !reduces.contains(&n)) {
            return Err(Veto::DuplicatesExpensive);
        }
        let dep = self.dependents(members, reduces);
        for &n in &dep {
            let node = g.node(n);
            let dims = node.ty.shape.dims();
            let ok = match &node.op {
                Op::Reduce { .. } => true,
                op if op.is_elementwise() => dims == shape.as_slice() || reduced_like(dims),
                Op::Reshape { .. } => reduced_like(dims) && reduced_like(g.ty(g.operands(n)[0]).shape.dims()),
                Op::Broadcast { dims: map, .. } => {
                    let od = g.ty(g.operands(n)[0]).shape.dims();
                    dims == shape.as_slice()
                        && reduced_like(od)
                        && map.iter().zip(od).all(|(&ra, &d)| d == 1 || !axes.contains(&ra))
                }
                _ => false,
            };
            if !ok {
                return Err(Veto::RowShape);
            }
        }
        for &o in outs {
            let n = g.ty(o).shape.numel();
            if n != full
                && !(n == rows && (reduces.contains(&o) || dep.contains(&o) || reduced_like(g.ty(o).shape.dims())))
            {
                return Err(Veto::RowShape);
            }
        }
        Ok(KernelKind::Row { shape, axes })
    }

    /// Whether putting `p` into `group` would make the group depend on itself: some operand
    /// of `p` outside the group is reachable from a member of the group.
    fn creates_cycle(&self, group: &BTreeSet<NodeId>, p: NodeId) -> bool {
        let min = group.iter().map(|n| self.pos[n]).min().unwrap_or(0);
        let mut stack: Vec<NodeId> = self.g.operands(p).into_iter().filter(|o| !group.contains(o)).collect();
        let mut seen = BTreeSet::new();
        while let Some(n) = stack.pop() {
            if self.pos.get(&n).is_none_or(|&q| q < min) || !seen.insert(n) {
                continue;
            }
            if group.contains(&n) {
                return true;
            }
            stack.extend(self.g.operands(n));
        }
        false
    }

    fn kernels(&self, groups: &[BTreeSet<NodeId>]) -> Vec<Kernel> {
        let groups: Vec<&BTreeSet<NodeId>> = groups.iter().filter(|g| !g.is_empty()).collect();
        let owned: Vec<BTreeSet<NodeId>> = groups.iter().map(|g| (*g).clone()).collect();
        let mut ks: Vec<(usize, Kernel)> = groups
            .iter()
            .map(|gr| {
                let mut members: Vec<NodeId> = gr.iter().copied().collect();
                members.sort_by_key(|n| self.pos[n]);
                let outs = self.group_outputs(gr, &owned);
                let kind = self.analyze(gr, &outs).unwrap_or(KernelKind::Loop);
                let mut k = make_kernel(self.g, members, self.outputs, &self.live);
                k.outputs = outs;
                k.kind = kind;
                let root = k.members.iter().map(|n| self.pos[n]).max().unwrap_or(0);
                (root, k)
            })
            .collect();
        // Kahn's algorithm over kernel dependencies, earliest root first.
        ks.sort_by_key(|(r, _)| *r);
        let mut done: BTreeSet<NodeId> = BTreeSet::new();
        let mut order = Vec::with_capacity(ks.len());
        while !ks.is_empty() {
            let ready = ks
                .iter()
                .position(|(_, k)| k.inputs.iter().all(|i| is_memory_leaf(&self.g.node(*i).op) || done.contains(i)))
                .unwrap_or(0);
            let (_, k) = ks.remove(ready);
            done.extend(k.outputs.iter().copied());
            order.push(k);
        }
        order
    }
}

/// Fuses the nodes `outputs` depend on into kernels.
pub fn fuse(g: &Graph, outputs: &[NodeId], opts: &FusionOptions) -> Result<Fusion> {
    let order = g.reachable(outputs)?;
    let mut const_like = BTreeSet::new();
    for &n in &order {
        let op = &g.node(n).op;
        if !is_memory_leaf(op) && !is_expensive(op) && g.operands(n).iter().all(|o| const_like.contains(o)) {
            const_like.insert(n);
        }
    }
    let ctx = Ctx {
        const_like,
        g,
        outputs,
        live: order.iter().copied().collect(),
        pos: order.iter().enumerate().map(|(i, &n)| (n, i)).collect(),
        opts,
    };
    let compute: Vec<NodeId> = order.iter().copied().filter(|&n| !is_memory_leaf(&g.node(n).op)).collect();
    let mut groups: Vec<BTreeSet<NodeId>> = compute.iter().map(|&n| BTreeSet::from([n])).collect();
    let own: BTreeMap<NodeId, usize> = compute.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut log = Vec::new();
    let mut peak = if opts.memory_aware { ctx.peak(&groups) } else { 0 };

    for &p in compute.iter().rev() {
        let veto = try_fuse(&ctx, &mut groups, &own, p, &mut peak);
        log.push(Decision { producer: p, veto });
    }
    let siblings = merge_siblings(&ctx, &mut groups, &mut peak);
    Ok(Fusion { kernels: ctx.kernels(&groups), log, siblings })
}

fn try_fuse(
    ctx: &Ctx,
    groups: &mut [BTreeSet<NodeId>],
    own: &BTreeMap<NodeId, usize>,
    p: NodeId,
    peak: &mut u64,
) -> Option<Veto> {
    let g = ctx.g;
    if ctx.outputs.contains(&p) {
        return Some(Veto::GraphOutput);
    }
    let users = ctx.users(p);
    let targets: Vec<usize> =
        (0..groups.len()).filter(|&i| i != own[&p] && users.iter().any(|u| groups[i].contains(u))).collect();
    if targets.is_empty() {
        return Some(Veto::NoBenefit);
    }
    if is_expensive(&g.node(p).op) && targets.len() > 1 {
        return Some(Veto::DuplicatesExpensive);
    }
    let mut candidate: Vec<BTreeSet<NodeId>> = groups.to_vec();
    candidate[own[&p]].remove(&p);
    for &t in &targets {
        if ctx.creates_cycle(&groups[t], p) {
            return Some(Veto::Cycle);
        }
        candidate[t].insert(p);
    }
    let mut recompute = 0.0;
    for &t in &targets {
        let outs = ctx.group_outputs(&candidate[t], &candidate);
        let kind = match ctx.analyze(&candidate[t], &outs) {
            Ok(kind) => kind,
            Err(v) => return Some(v),
        };
        let k = make_kernel(g, candidate[t].iter().copied().collect(), ctx.outputs, &ctx.live);
        let needed = k.inputs.len() + outs.len();
        if needed > ctx.opts.max_bindings {
            return Some(Veto::TooManyBindings { needed, limit: ctx.opts.max_bindings });
        }
        recompute += match kind {
            // A per-row value computed from a reduction (layer norm's rsqrt(var + eps)) is
            // recomputed per element only until its reduction joins the kernel, which then
            // becomes a row kernel computing it once per row: judge it as that.
            KernelKind::Loop if per_row_of_reduction(g, p) => 1.0,
            KernelKind::Loop => ctx.multiplicity(&candidate[t], &outs).get(&p).copied().unwrap_or(1.0),
            // A row kernel computes each reduction once per row and evaluates everything else
            // once per pass over the row: one pass per reduction plus the output pass.
            KernelKind::Row { .. } if matches!(g.node(p).op, Op::Reduce { .. }) => 1.0,
            // Per-row values (mean, rsqrt(var + eps)) are computed once per row.
            KernelKind::Row { ref shape, .. } if g.ty(p).shape.numel() < shape.iter().product::<usize>() => 1.0,
            KernelKind::Row { .. } => {
                1.0 + candidate[t].iter().filter(|&&n| matches!(g.node(n).op, Op::Reduce { .. })).count() as f64
            }
        };
    }
    // Benefit: one dispatch fewer, and the producer is neither written nor read back; cost:
    // its arithmetic repeated where it is recomputed, and its operands read once per copy.
    let c = &ctx.opts.cost;
    let bytes = g.ty(p).buffer_bytes() as f64;
    let operand_bytes: f64 = g.operands(p).iter().map(|&o| g.ty(o).buffer_bytes() as f64).sum();
    let saved = c.dispatch_s + bytes * (1.0 + targets.len() as f64) / c.bandwidth;
    let extra_flops = (recompute - 1.0).max(0.0) * flops_per_element(g, p) * g.ty(p).shape.numel() as f64;
    let cached = if is_data_movement(&g.node(p).op) { 0.25 } else { 1.0 };
    let extra = extra_flops / c.flops + (targets.len() as f64 - 1.0) * operand_bytes * cached / c.bandwidth;
    if saved <= extra {
        return Some(Veto::NoBenefit);
    }
    // Fusing `p` frees its buffer and keeps its operands alive until the consumers instead;
    // when the operands held in memory are no larger than `p`, no step can rise, so the
    // (whole-plan) peak need not be recomputed.
    let held: u64 =
        g.operands(p).iter().filter(|&&o| !ctx.const_like.contains(&o)).map(|&o| g.ty(o).buffer_bytes() as u64).sum();
    if !(ctx.opts.memory_aware && held > g.ty(p).buffer_bytes() as u64) {
        // The accepted fusion may lower the peak: recompute the baseline when next needed.
        *peak = u64::MAX;
    } else {
        if *peak == u64::MAX {
            *peak = ctx.peak(groups);
        }
        let after = ctx.peak(&candidate);
        // Rises within 1/64 of the peak are noise from tiny values (per-channel scales)
        // changing their live ranges; the veto is for real rises, such as a cast fused
        // into a late consumer that keeps the wide input alive.
        if after > *peak + *peak / 64 {
            return Some(Veto::PeakMemory { before: *peak, after });
        }
        *peak = after;
    }
    groups.clone_from_slice(&candidate);
    None
}

/// Sibling (multi-output) fusion: kernels that read a common value, or recompute a common
/// producer, and do not depend on each other merge into one kernel when the result is still
/// a valid kernel (for example two reductions of one input become one row kernel).
fn merge_siblings(ctx: &Ctx, groups: &mut [BTreeSet<NodeId>], peak: &mut u64) -> Vec<SiblingDecision> {
    let mut decisions = Vec::new();
    let g = ctx.g;
    let inputs_of = |gr: &BTreeSet<NodeId>| -> BTreeSet<NodeId> {
        gr.iter().flat_map(|&m| g.operands(m)).filter(|o| !gr.contains(o)).collect()
    };
    let depends = |a: &BTreeSet<NodeId>, b: &BTreeSet<NodeId>| -> bool {
        let mut stack: Vec<NodeId> = inputs_of(b).into_iter().collect();
        let mut seen = BTreeSet::new();
        while let Some(n) = stack.pop() {
            if !seen.insert(n) {
                continue;
            }
            if a.contains(&n) {
                return true;
            }
            stack.extend(g.operands(n));
        }
        false
    };
    let mut changed = true;
    while changed {
        changed = false;
        for i in 0..groups.len() {
            for j in i + 1..groups.len() {
                if groups[i].is_empty() || groups[j].is_empty() {
                    continue;
                }
                let (ii, ij) = (inputs_of(&groups[i]), inputs_of(&groups[j]));
                let shared = groups[i].iter().any(|m| groups[j].contains(m)) || ii.iter().any(|x| ij.contains(x));
                // Contraction kernels lower to a tiled kernel with one output; merging two
                // (q, k, v projections of one input) would lose that.
                let contraction =
                    |gr: &BTreeSet<NodeId>| gr.iter().any(|&m| matches!(g.node(m).op, Op::MatMul | Op::Conv2d { .. }));
                if !shared || contraction(&groups[i]) || contraction(&groups[j]) {
                    continue;
                }
                let (a, b) = (*groups[i].first().expect("non-empty"), *groups[j].first().expect("non-empty"));
                let mut decide = |veto: Option<Veto>| decisions.push(SiblingDecision { a, b, veto });
                if depends(&groups[i], &groups[j]) || depends(&groups[j], &groups[i]) {
                    decide(Some(Veto::Cycle));
                    continue;
                }
                let mut candidate = groups.to_vec();
                let moved = std::mem::take(&mut candidate[j]);
                candidate[i].extend(moved);
                let outs = ctx.group_outputs(&candidate[i], &candidate);
                if let Err(v) = ctx.analyze(&candidate[i], &outs) {
                    decide(Some(v));
                    continue;
                }
                let k = make_kernel(g, candidate[i].iter().copied().collect(), ctx.outputs, &ctx.live);
                let needed = k.inputs.len() + outs.len();
                if needed > ctx.opts.max_bindings {
                    decide(Some(Veto::TooManyBindings { needed, limit: ctx.opts.max_bindings }));
                    continue;
                }
                if ctx.opts.memory_aware {
                    if *peak == u64::MAX {
                        *peak = ctx.peak(groups);
                    }
                    let after = ctx.peak(&candidate);
                    if after > *peak + *peak / 64 {
                        decide(Some(Veto::PeakMemory { before: *peak, after }));
                        continue;
                    }
                    *peak = after.max(*peak);
                }
                decide(None);
                groups.clone_from_slice(&candidate);
                changed = true;
            }
        }
    }
    decisions
}

/// Whether `p` is a cheap value computed (through elementwise ops, reshapes and broadcasts)
/// from a reduction's result: a per-row statistic that a row kernel computes once per row.
fn per_row_of_reduction(g: &Graph, p: NodeId) -> bool {
    let mut stack = vec![p];
    let mut seen = BTreeSet::new();
    while let Some(n) = stack.pop() {
        if !seen.insert(n) || seen.len() > 32 {
            continue;
        }
        let op = &g.node(n).op;
        if matches!(op, Op::Reduce { .. }) {
            return n != p && g.ty(p).shape.numel() <= g.ty(n).shape.numel();
        }
        if op.is_elementwise() || matches!(op, Op::Reshape { .. } | Op::Broadcast { .. }) {
            stack.extend(g.operands(n));
        }
    }
    false
}
