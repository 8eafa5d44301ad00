//! Sibling (multi-output) fusion: kernels that read a common value merge into one.

use super::*;

/// Sibling (multi-output) fusion: kernels that read a common value, or recompute a common
/// producer, and do not depend on each other merge into one kernel when the result is still
/// a valid kernel (for example two reductions of one input become one row kernel).
pub(super) fn merge_siblings(ctx: &Ctx, groups: &mut Groups, peak: &mut u64) -> Vec<SiblingDecision> {
    let mut decisions = Vec::new();
    let g = ctx.g;
    // Whether `b` reads (through any path) a value that only `a` computes: then it waits for
    // `a`. A member other kernels compute too (a constant or broadcast every kernel
    // recomputes) proves nothing, as they compute it themselves: two Adam updates recompute
    // `1.0` as the step counter's update does, whose value both read, and would be kept
    // apart otherwise.
    // Such pairs go to the kernel-level walk below.
    let depends = |groups: &Groups, a: usize, b: usize| -> bool {
        let own: BTreeSet<NodeId> = groups.sets[a].iter().copied().filter(|&m| groups.of(m).nth(1).is_none()).collect();
        // `b`'s inputs (repeats do no harm).
        let inputs: Vec<NodeId> = ctx.inputs(&groups.sets[b]).collect();
        inputs.iter().any(|x| own.contains(x)) || ctx.reaches_any(inputs, &own)
    };
    // Whether group `gi` is free of the step's order: it stores graph outputs alone (an
    // optimizer update, a new moment: alive to the end wherever computed), or single
    // elements alone (mixed precision's finite checks of the gradients: nothing to hold), or
    // reads no value the step computes or is fed (only parameters and constants: batch-norm
    // folding's scaled weights, which the runtime computes once after the parameters are
    // set). Kernels sharing nothing but constants merge only when both are (the updates of
    // two weights, one dispatch for both): elsewhere the merged kernel runs when the first
    // of its values is needed, holding the others until they are read — a training step's
    // checkpointed recomputations, one per segment and all computing gelu's constants,
    // would merge into kernels that recompute four segments at once at the start of the
    // backward pass. (The peak check does not see it: its order runs a merged kernel at its
    // last member's turn, where the scheduler must run it at the first's.)
    let free = |groups: &Groups, gi: usize| {
        let set = &groups.sets[gi];
        let stored = ctx.group_outputs(set, groups);
        stored.iter().all(|o| ctx.output_set.contains(o))
            || stored.iter().all(|&o| ctx.g.ty(o).shape.numel() == 1)
            || ctx.inputs(set).all(|x| !ctx.info[x.index()].arena)
    };
    // Contraction kernels lower to a tiled kernel with one output; merging two (q, k, v
    // projections of one input) would lose that — except products of a few rows of one
    // left operand, which the matrix–vector kernel takes together (`gemv`).
    let contraction =
        |gr: &BTreeSet<NodeId>| gr.iter().any(|&m| matches!(g.node(m).op, Op::MatMul | Op::Conv2d { .. }));
    let sibling_products = |groups: &Groups, a: usize, b: usize| {
        ctx.opts.gemv && {
            let union: BTreeSet<NodeId> = groups.sets[a].union(&groups.sets[b]).copied().collect();
            ctx.sibling_products(&union, &ctx.group_outputs(&union, groups))
        }
    };
    // Pairs found dependent stay so: within this phase a group only grows, or empties when
    // merged into another (a later pass skips them; the decision is logged again).
    let mut dependent: BTreeSet<(usize, usize)> = BTreeSet::new();
    // Per group, what it binds wherever it goes ([`BindingFloor`]), kept until the group
    // grows.
    let mut floors: Vec<Option<BindingFloor>> = vec![None; groups.sets.len()];
    let mut changed = true;
    while changed {
        changed = false;
        for i in 0..groups.sets.len() {
            let mut j = i;
            // Group `i`'s inputs and the groups that compute a member of `i` or read one of
            // its inputs (the only candidates for sharing something with it), in index order:
            // kept until `i` grows, since a merge changes no other group after `j` (so the
            // candidates after `j` and what they compute and read stay the same).
            let mut near: Option<(BTreeSet<NodeId>, Vec<usize>)> = None;
            // The groups group `i` reads from, directly or not ([`walk_feeding`]): kept until
            // `i` grows, as `near` (a merge into `i` is the only change while `i` is being
            // matched).
            let mut feeding_i: Option<Vec<bool>> = None;
            loop {
                if groups.sets[i].is_empty() || contraction(&groups.sets[i]) && !ctx.opts.gemv {
                    break;
                }
                let (ii, cands) = near.get_or_insert_with(|| {
                    let ii: BTreeSet<NodeId> = ctx.inputs(&groups.sets[i]).collect();
                    let mut cands: Vec<usize> = groups.sets[i]
                        .iter()
                        .flat_map(|&m| groups.of(m))
                        .chain(ii.iter().flat_map(|&x| ctx.users[x.index()].iter()).flat_map(|&u| groups.of(u)))
                        .filter(|&k| k > i)
                        .collect();
                    cands.sort_unstable();
                    cands.dedup();
                    (ii, cands)
                });
                let after = cands.partition_point(|&k| k <= j);
                let Some(&next) = cands[after..].iter().find(|&&k| {
                    let gk = &groups.sets[k];
                    if gk.is_empty()
                        || (contraction(&groups.sets[i]) || contraction(gk)) && !sibling_products(groups, i, k)
                    {
                        return false;
                    }
                    let mut shared = groups.sets[i].iter().filter(|m| gk.contains(m));
                    // A shared constant (computed from `full`/`iota` alone) saves nothing: it
                    // joins only kernels free of the step's order (see `free`).
                    shared.clone().any(|m| !ctx.const_like.contains(m))
                        || ctx.inputs(gk).any(|x| ii.contains(&x))
                        || (shared.next().is_some() && free(groups, i) && free(groups, k))
                }) else {
                    break;
                };
                j = next;
                // Named by their roots: a first member is often a broadcast both recompute.
                let root = |gi: usize| ctx.root(&groups.sets[gi]).expect("non-empty");
                let (a, b) = (root(i), root(j));
                let mut decide = |veto: Option<Veto>| decisions.push(SiblingDecision { a, b, veto });
                // Most merges fail on the binding limit: checked first, from the two groups'
                // inputs and graph outputs alone (a training step's optimizer updates all read
                // one scalar, so every pair of them is asked, and at 8 bindings refused).
                for gi in [i, j] {
                    if floors[gi].is_none() {
                        floors[gi] = Some(BindingFloor::of(ctx, &groups.sets[gi]));
                    }
                }
                let (fi, fj) = (floors[i].as_ref().expect("set"), floors[j].as_ref().expect("set"));
                let least = fi.joined(fj, groups, i, j);
                if least > ctx.opts.max_bindings {
                    decide(Some(Veto::TooManyBindings { needed: least, limit: ctx.opts.max_bindings }));
                    continue;
                }
                if dependent.contains(&(i, j)) || depends(groups, i, j) || depends(groups, j, i) {
                    dependent.insert((i, j));
                    decide(Some(Veto::Cycle));
                    continue;
                }
                // The exact binding count, on the union before anything moves (a member's
                // users outside both groups are computed by neither, so what the union stores
                // is what it would store after the move), so a refusal leaves every kernel
                // summary valid.
                let union: BTreeSet<NodeId> = groups.sets[i].union(&groups.sets[j]).copied().collect();
                let needed = ctx.bindings(&union, &ctx.group_outputs(&union, groups));
                debug_assert!(least <= needed, "binding floor {least} above the union's {needed} bindings");
                if needed > ctx.opts.max_bindings {
                    decide(Some(Veto::TooManyBindings { needed, limit: ctx.opts.max_bindings }));
                    continue;
                }
                // No node path joins the two, but a chain of kernels may: a kernel that
                // earlier merges made of unrelated nodes can read from one and feed the
                // other. Walked only here, for the few pairs that would otherwise merge.
                let feeds_i = feeding_i.get_or_insert_with(|| walk_feeding(ctx, groups, i, None).0);
                if feeds_i[j] || walk_feeding(ctx, groups, j, Some(i)).1 {
                    dependent.insert((i, j));
                    decide(Some(Veto::Cycle));
                    continue;
                }
                let veto = merge_into(ctx, groups, (j, i), peak);
                if veto.is_none() {
                    changed = true;
                    near = None;
                    feeding_i = None;
                    (floors[i], floors[j]) = (None, None);
                }
                decide(veto);
            }
        }
    }
    decisions
}

/// What a group binds wherever it goes, for a cheap count of what a merge with another
/// group binds ([`BindingFloor::joined`]): the values its members read from memory (sorted),
/// and its members that are graph outputs (sorted), which any kernel computing them stores.
#[derive(Clone)]
struct BindingFloor {
    inputs: Vec<NodeId>,
    outputs: Vec<NodeId>,
}

impl BindingFloor {
    fn of(ctx: &Ctx, members: &BTreeSet<NodeId>) -> BindingFloor {
        let mut inputs: Vec<NodeId> = ctx.inputs(members).collect();
        inputs.sort_unstable();
        inputs.dedup();
        let outputs = members.iter().copied().filter(|m| ctx.output_set.contains(m)).collect();
        BindingFloor { inputs, outputs }
    }

    /// The bindings of one kernel of groups `i` (this floor) and `j` (`other`), at least: its
    /// inputs exactly (each group's inputs the other does not compute), and the graph outputs
    /// among its members (it may store more: members read by other kernels).
    fn joined(&self, other: &BindingFloor, groups: &Groups, i: usize, j: usize) -> usize {
        let from_i = self.inputs.iter().filter(|&&x| !groups.computes(j, x)).count();
        let from_j =
            other.inputs.iter().filter(|&&x| !groups.computes(i, x) && self.inputs.binary_search(&x).is_err()).count();
        let outputs =
            self.outputs.len() + other.outputs.iter().filter(|x| self.outputs.binary_search(x).is_err()).count();
        from_i + from_j + outputs
    }
}

/// The groups that group `to` reads from, through a chain of one or more kernels (by index;
/// `to` itself marked too), and whether the walk met `stop` (it ends there): back from
/// `to`'s inputs over the groups computing them (every group computing a duplicated value
/// counts). Node paths ([`Ctx::reaches_any`]) miss a chain through a group that sibling
/// merging made of unrelated nodes: once `{r = reduce(y), m = max(c, y)}` is one kernel, a
/// kernel reading `r` waits for the kernel storing `c`, though no node path leads from `c`
/// to `r`; merging those two would make a cycle of kernels (a gradient read before it is
/// written: `tests/data/kernel_cycle.ir`).
fn walk_feeding(ctx: &Ctx, groups: &Groups, to: usize, stop: Option<usize>) -> (Vec<bool>, bool) {
    let mut seen = vec![false; groups.sets.len()];
    seen[to] = true;
    let mut stack = vec![to];
    while let Some(k) = stack.pop() {
        for x in ctx.inputs(&groups.sets[k]) {
            for p in groups.of(x) {
                if Some(p) == stop {
                    return (seen, true);
                }
                if !std::mem::replace(&mut seen[p], true) {
                    stack.push(p);
                }
            }
        }
    }
    (seen, false)
}

/// Moves group `from`'s members into group `into` (the caller has checked the binding limit
/// on the union) and judges the result ([`judge_merge`]); on a veto puts them back.
pub(super) fn merge_into(ctx: &Ctx, groups: &mut Groups, (from, into): (usize, usize), peak: &mut u64) -> Option<Veto> {
    if ctx.opts.memory_aware && *peak == u64::MAX {
        *peak = ctx.peak(groups);
    }
    let moved: Vec<NodeId> = groups.sets[from].iter().copied().collect();
    let added: Vec<NodeId> = moved.iter().copied().filter(|m| !groups.sets[into].contains(m)).collect();
    for &m in &moved {
        groups.remove(from, m, ctx.operands(m));
    }
    for &m in &added {
        groups.insert(into, m, ctx.operands(m));
    }
    let veto = judge_merge(ctx, groups, into, peak);
    if veto.is_some() {
        for &m in &added {
            groups.remove(into, m, ctx.operands(m));
        }
        for &m in &moved {
            groups.insert(from, m, ctx.operands(m));
        }
    }
    veto
}

/// The verdict on group `i` just grown by a sibling or a row prologue (the caller has
/// checked the binding limit on the union): one valid kernel, and no rise of the plan's
/// peak. Updates `peak` on acceptance.
fn judge_merge(ctx: &Ctx, groups: &Groups, i: usize, peak: &mut u64) -> Option<Veto> {
    let members = &groups.sets[i];
    let outs = ctx.group_outputs(members, groups);
    if let Err(v) = ctx.analyze(members, &outs) {
        return Some(v);
    }
    if ctx.opts.memory_aware {
        let after = ctx.peak(groups);
        if after > *peak + *peak / 64 {
            return Some(Veto::PeakMemory { before: *peak, after });
        }
        *peak = after.max(*peak);
    }
    None
}
