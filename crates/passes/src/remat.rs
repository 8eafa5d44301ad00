//! Rematerialization: trading recomputation for memory when a plan exceeds a budget.
//!
//! While the arena of the memory plan exceeds the budget, [`rematerialize`] looks at the steps
//! where live bytes peak (highest first) for a value that is live across such a step without
//! being read there, whose producing kernel is cheap to rerun (no reduction, argmax, matmul,
//! conv or pooling among the members that compute it, see [`crate::cost::is_expensive`]) and
//! whose kernel inputs are parameters, constants, or arena values live at the later use
//! anyway. It inserts a copy of the producing kernel (the members the value needs, writing
//! only that value) right before the value's next use after the peak. The copy writes the
//! *same* `NodeId` again, so later kernels read the copy without any renaming; liveness gives
//! the value one live range per production ([`crate::liveness::intervals_multi`]) and the
//! memory plan keeps both ranges at one offset, free in between for other values.
//!
//! Every candidate is judged by planning memory with it; the one that lowers (arena bytes,
//! peak of live bytes, steps at that peak) the most is kept, ties to the smaller value id, so
//! a copy that clears one of several equal peaks counts as progress. It stops when the budget
//! is met or no candidate helps, and returns the first schedule that reached the smallest
//! arena (copies that never paid off are dropped). Deterministic. What it does not do:
//! recompute expensive kernels, recompute a chain of values (one kernel per copy), extend an
//! input's live range to make a copy possible, reorder kernels, or recompute a value that a
//! comparison checks against a value computed from it ([`crate::compared_with_themselves`]:
//! the copy could round differently and break the tie).

use crate::cost::is_expensive;
use crate::kernel::{Kernel, KernelKind};
use crate::liveness::{intervals_multi, is_arena, live_bytes_per_step, Interval};
use crate::memory_plan::{plan_memory_with, MemoryOptions};
use fusegraph_ir::{Graph, NodeId};
use std::collections::{BTreeMap, BTreeSet};

/// Peak steps examined per round, highest live bytes first.
const PEAK_STEPS: usize = 4;

/// Inserts recomputations until the arena of `plan_memory(g, kernels, outputs, alignment)`
/// fits `budget` bytes or nothing helps; see the module docs. `kernels` must be in a valid
/// order; the result is too.
pub fn rematerialize(g: &Graph, kernels: Vec<Kernel>, outputs: &[NodeId], budget: u64, alignment: u64) -> Vec<Kernel> {
    rematerialize_with(g, kernels, outputs, budget, &MemoryOptions { alignment, ..Default::default() })
}

/// [`rematerialize`] with explicit memory-planning options.
pub fn rematerialize_with(
    g: &Graph,
    mut kernels: Vec<Kernel>,
    outputs: &[NodeId],
    budget: u64,
    opts: &MemoryOptions,
) -> Vec<Kernel> {
    let score = |ks: &[Kernel]| {
        let plan = plan_memory_with(g, ks, outputs, opts);
        let per_step = live_bytes_per_step(&plan.intervals);
        let peak = per_step.iter().copied().max().unwrap_or(0);
        let at_peak = per_step.iter().filter(|&&b| b == peak).count();
        (plan.arena_bytes, peak, at_peak)
    };
    // Candidates must lower (arena, peak of live bytes, steps at that peak) lexicographically:
    // a copy that clears one of several equal peaks counts as progress. The result is the
    // first schedule that reached the smallest arena, so copies that did not pay are dropped.
    // A value compared with a value computed from it must keep the bits it was stored with:
    // a copy computed by another kernel may round differently.
    let members: Vec<NodeId> = kernels.iter().flat_map(|k| k.members.iter().copied()).collect();
    let compared = crate::fuse::compared_with_themselves(g, &members);
    let mut key = score(&kernels);
    let mut best = (key.0, kernels.clone());
    let max_rounds = 2 * kernels.len() + 8;
    for _ in 0..max_rounds {
        if key.0 <= budget {
            break;
        }
        let live = intervals_multi(g, &kernels, outputs);
        let per_step = live_bytes_per_step(&live);
        let mut steps: Vec<usize> = (0..per_step.len().min(kernels.len())).collect();
        steps.sort_by_key(|&s| (std::cmp::Reverse(per_step[s]), s));
        type Score = (u64, u64, usize);
        let mut chosen: Option<(Score, NodeId, Vec<Kernel>)> = None;
        for &peak in steps.iter().take(PEAK_STEPS) {
            let inserts = candidates(g, &kernels, outputs, &live, peak).into_iter().map(|(v, at, k)| (v, at, k, false));
            let folds = fold_candidates(g, &kernels, &live, peak).into_iter().map(|(v, at, k)| (v, at, k, true));
            for (value, at, copy, replace) in inserts.chain(folds).filter(|(v, ..)| !compared.contains(v)) {
                let mut trial = kernels.clone();
                if replace {
                    trial[at] = copy;
                } else {
                    trial.insert(at, copy);
                }
                let k = score(&trial);
                if k < key && chosen.as_ref().is_none_or(|(b, v, _)| (k, value) < (*b, *v)) {
                    chosen = Some((k, value, trial));
                }
            }
            if chosen.is_some() {
                break;
            }
        }
        let Some((k, _, trial)) = chosen else { break };
        kernels = trial;
        key = k;
        if key.0 < best.0 {
            best = (key.0, kernels.clone());
        }
    }
    best.1
}

/// Values live across step `peak` that may be recomputed: (value, insertion step, the copy).
fn candidates(
    g: &Graph,
    kernels: &[Kernel],
    outputs: &[NodeId],
    live: &BTreeMap<NodeId, Vec<Interval>>,
    peak: usize,
) -> Vec<(NodeId, usize, Kernel)> {
    let last = kernels.len().saturating_sub(1);
    let alive_at = |v: NodeId, at: usize| {
        live.get(&v).is_some_and(|ivs| ivs.iter().any(|iv| iv.start < at && (iv.end >= at || iv.end == last)))
    };
    let mut out = Vec::new();
    for (&v, ivs) in live {
        for iv in ivs {
            if !(iv.start < peak && peak < iv.end) || kernels[peak].inputs.contains(&v) {
                continue;
            }
            let producer = &kernels[iv.start];
            if !producer.outputs.contains(&v) {
                continue; // an input: nothing computes it
            }
            let Some(copy) = recompute_kernel(g, producer, v) else { continue };
            let at = match (peak + 1..=iv.end).find(|&s| kernels[s].inputs.contains(&v)) {
                Some(s) => s,
                None if outputs.contains(&v) && iv.end == last => kernels.len(),
                None => continue,
            };
            if copy.inputs.iter().all(|&i| !is_arena(g, i) || alive_at(i, at)) {
                out.push((v, at, copy));
            }
        }
    }
    out
}

/// Values read at step `peak` (or live across it) that a later loop kernel reading them could
/// recompute itself: the kernel absorbs the cheap members that compute the value, so the
/// value need not stay in memory until then. Returns (value, consumer step, the new
/// consumer). Only where every reader inside the consumer reads the value at the same index
/// (no recomputation per element), and the consumer needs no new bindings (the producer's
/// inputs are already its inputs).
fn fold_candidates(
    g: &Graph,
    kernels: &[Kernel],
    live: &BTreeMap<NodeId, Vec<Interval>>,
    peak: usize,
) -> Vec<(NodeId, usize, Kernel)> {
    let mut out = Vec::new();
    for (&v, ivs) in live {
        for iv in ivs {
            if !(iv.start < peak && peak <= iv.end) {
                continue;
            }
            let producer = &kernels[iv.start];
            if !producer.outputs.contains(&v) {
                continue;
            }
            let Some(copy) = recompute_kernel(g, producer, v) else { continue };
            for (c, k) in kernels.iter().enumerate().take(iv.end + 1).skip(peak) {
                if k.kind != KernelKind::Loop || !k.inputs.contains(&v) || k.outputs.contains(&v) {
                    continue;
                }
                let same_index_only = k
                    .members
                    .iter()
                    .filter(|&&m| g.operands(m).contains(&v))
                    .all(|&m| crate::kernel::same_index_operands(g, m).contains(&v));
                if !same_index_only || !copy.inputs.iter().all(|i| k.inputs.contains(i)) {
                    continue;
                }
                let mut members = copy.members.clone();
                members.extend(k.members.iter().copied().filter(|m| !copy.members.contains(m)));
                let inputs: Vec<NodeId> = k.inputs.iter().copied().filter(|&i| i != v).collect();
                out.push((v, c, Kernel { kind: KernelKind::Loop, members, outputs: k.outputs.clone(), inputs }));
            }
        }
    }
    out
}

/// A kernel that recomputes `value` with the members of `producer` it needs, or `None` when
/// one of them is expensive.
fn recompute_kernel(g: &Graph, producer: &Kernel, value: NodeId) -> Option<Kernel> {
    let all: BTreeSet<NodeId> = producer.members.iter().copied().collect();
    let mut needed = BTreeSet::from([value]);
    let mut stack = vec![value];
    while let Some(n) = stack.pop() {
        for p in g.operands(n) {
            if all.contains(&p) && needed.insert(p) {
                stack.push(p);
            }
        }
    }
    let members: Vec<NodeId> = producer.members.iter().copied().filter(|m| needed.contains(m)).collect();
    if members.iter().any(|&m| is_expensive(&g.node(m).op)) {
        return None;
    }
    let mut inputs = Vec::new();
    for &m in &members {
        for o in g.operands(m) {
            if !needed.contains(&o) && !inputs.contains(&o) {
                inputs.push(o);
            }
        }
    }
    Some(Kernel { kind: KernelKind::Loop, members, outputs: vec![value], inputs })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::FusionMode;
    use crate::memory_plan::{check_plan, plan_memory};
    use crate::partition::partition;
    use crate::schedule::first_unready;
    use crate::testing::remat_graph;

    const KIB: u64 = 1024;

    #[test]
    fn remat_brings_the_example_under_budget() {
        let (g, outs) = remat_graph();
        let kernels = partition(&g, &outs, FusionMode::Off).unwrap();
        let before = plan_memory(&g, &kernels, &outs, 256);
        let remat = rematerialize(&g, kernels.clone(), &outs, 14 * KIB, 256);
        let after = plan_memory(&g, &remat, &outs, 256);
        eprintln!(
            "remat example: arena {} B before ({} kernels), {} B after ({} kernels); lower bound {} -> {}",
            before.arena_bytes,
            kernels.len(),
            after.arena_bytes,
            remat.len(),
            before.lower_bound_bytes,
            after.lower_bound_bytes
        );
        assert_eq!(before.arena_bytes, 16 * KIB);
        assert!(after.arena_bytes < 14 * KIB);
        assert_eq!(after.arena_bytes, 12 * KIB);
        assert_eq!(remat.len(), kernels.len() + 1);
        assert_eq!(first_unready(&g, &remat), None);
        assert_eq!(check_plan(&after, &after.intervals), Ok(()));
        // The copy writes the same value twice: two live ranges, one location.
        assert!(after.intervals.values().any(|ivs| ivs.len() == 2));
        // Deterministic, and a budget already met changes nothing.
        assert_eq!(rematerialize(&g, kernels.clone(), &outs, 14 * KIB, 256), remat);
        assert_eq!(rematerialize(&g, kernels.clone(), &outs, 16 * KIB, 256), kernels);
    }

    #[test]
    fn random_graphs_stay_valid_and_never_grow() {
        let mut rng = crate::testing::TestRng::new(0xdead_beef);
        let mut copies = 0;
        for case in 0..60 {
            let (g, outs) = crate::testing::random_graph_with(&mut rng, 8 + case % 16, case % 2 == 0);
            for mode in [FusionMode::Off, FusionMode::On] {
                let kernels = partition(&g, &outs, mode).unwrap();
                let before = plan_memory(&g, &kernels, &outs, 256);
                let remat = rematerialize(&g, kernels.clone(), &outs, 0, 256);
                copies += remat.len() - kernels.len();
                assert_eq!(first_unready(&g, &remat), None, "case {case} {mode:?}");
                let after = plan_memory(&g, &remat, &outs, 256);
                assert!(after.arena_bytes <= before.arena_bytes, "case {case} {mode:?}");
                assert_eq!(check_plan(&after, &after.intervals), Ok(()));
                for (i, k) in remat.iter().enumerate() {
                    if remat[..i].iter().any(|p| p.outputs.iter().any(|o| k.outputs.contains(o))) {
                        assert!(k.members.iter().all(|&m| !is_expensive(&g.node(m).op)));
                    }
                }
            }
        }
        eprintln!("random graphs: {copies} recomputations inserted");
        assert!(copies > 0);
    }

    #[test]
    fn never_recomputes_expensive_kernels() {
        let b = fusegraph_ir::GraphBuilder::new();
        let x = b.input("x", fusegraph_ir::DType::F32, vec![32, 32]).unwrap();
        let w = b.parameter("w", fusegraph_ir::DType::F32, vec![32, 32]).unwrap();
        let a = x.matmul(&w).unwrap();
        let y = a.tanh().unwrap().t().unwrap().t().unwrap().add(&a).unwrap().add(&x).unwrap();
        let (g, outs) = (b.graph(), vec![y.id()]);
        let kernels = partition(&g, &outs, FusionMode::Off).unwrap();
        let remat = rematerialize(&g, kernels.clone(), &outs, 0, 256);
        for k in &remat[..] {
            let copies = remat.iter().filter(|o| o.outputs == k.outputs).count();
            if k.members.iter().any(|&m| is_expensive(&g.node(m).op)) {
                assert_eq!(copies, 1);
            }
        }
        assert_eq!(first_unready(&g, &remat), None);
    }

    /// `remat_graph` recomputes `a = exp(x)` for its late use; where that use compares `a`
    /// with a maximum computed from it, the copy could round differently and miss the
    /// maximum, so `a` is not recomputed.
    #[test]
    fn never_recomputes_a_value_compared_with_itself() {
        let b = fusegraph_ir::GraphBuilder::new();
        let x = b.input("x", fusegraph_ir::DType::F32, vec![32, 32]).unwrap();
        let a = x.exp().unwrap();
        let d = a.tanh().unwrap().t().unwrap().t().unwrap();
        let top = d.max(&[0, 1], true).unwrap().broadcast_to(vec![32, 32]).unwrap();
        let y = a.eq(&top).unwrap().cast(fusegraph_ir::DType::F32).unwrap().add(&x).unwrap();
        let (g, outs) = (b.graph(), vec![y.id()]);
        let kernels = partition(&g, &outs, FusionMode::Off).unwrap();
        let writes_a = |ks: &[Kernel]| ks.iter().filter(|k| k.outputs.contains(&a.id())).count();
        assert_eq!(writes_a(&kernels), 1);
        let remat = rematerialize(&g, kernels.clone(), &outs, 0, 256);
        assert_eq!(writes_a(&remat), 1);
        assert_eq!(first_unready(&g, &remat), None);
        // Without the comparison the same value is recomputed (the test is not vacuous).
        let y = a.add(&top).unwrap().add(&x).unwrap();
        let (g, outs) = (b.graph(), vec![y.id()]);
        let kernels = partition(&g, &outs, FusionMode::Off).unwrap();
        assert_eq!(writes_a(&rematerialize(&g, kernels, &outs, 0, 256)), 2);
    }
}
