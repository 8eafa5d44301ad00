//! Memory-aware scheduling: the order kernels run in.
//!
//! Kernels form a DAG: a kernel depends on another when one of its `inputs` is among the
//! other's `outputs`. [`schedule`] builds several topological orders and keeps the one whose
//! peak of live arena bytes ([`crate::liveness::peak_live_bytes`]) is lowest:
//!
//! - the given order (when valid);
//! - depth-first from the graph outputs, visiting a kernel's producers in input order, and
//!   again in reverse input order;
//! - greedy list scheduling that runs, among ready kernels, the one that frees the most bytes
//!   (inputs it reads last), then the one that allocates least;
//! - greedy list scheduling by smallest growth of live bytes (allocated − freed).
//!
//! Each candidate is then *sunk*: a kernel moves down to just before its
//! first user wherever every value it reads stays alive until then anyway, so its outputs
//! are born later and nothing lives longer. The list schedulers run a kernel as soon as it is
//! ready and cheap; a checkpointed segment's recomputation is ready from the start of the
//! backward pass but read only when the gradients reach its segment, and without sinking it
//! would run early and hold its values through the gradients of every later segment.
//!
//! In a training step ([`schedule_updating`]) a parameter's new value that the memory plan
//! writes into the parameter's own slot takes no arena bytes, and the objective says so: an
//! optimizer update then runs as soon as its gradient is ready, freeing it. Every candidate
//! is also built with write-after-read edges (an update after its parameter's other
//! readers, which in-place writing needs); the objective picks among both sets, as an
//! update run early is stored apart but may free a large gradient sooner.
//!
//! Ties keep the earlier candidate in that list, and every choice inside a candidate breaks
//! ties by the kernel's position in the given order, so the result is deterministic.
//!
//! What it does not do: change kernels (members, inputs, outputs), search exhaustively (the
//! optimal order is NP-hard in general), or account for alignment or fragmentation: the
//! objective is the lower bound of the memory plan, not its final size. A value produced by
//! more than one kernel (after rematerialization) makes the dependency relation ambiguous; the
//! given order is then returned unchanged.

use crate::kernel::Kernel;
use crate::liveness::{intervals, is_arena, peak_live_bytes, value_bytes};
use fusegraph_ir::{Graph, NodeId};
use std::collections::{BTreeMap, BTreeSet};

/// The first step of `kernels` that reads a computed value (not an input, parameter or
/// constant) that no earlier kernel produced, with that value; `None` when the order is valid.
pub fn first_unready(g: &Graph, kernels: &[Kernel]) -> Option<(usize, NodeId)> {
    let mut done: BTreeSet<NodeId> = BTreeSet::new();
    for (step, k) in kernels.iter().enumerate() {
        for &i in &k.inputs {
            let leaf = crate::kernel::is_memory_leaf(&g.node(i).op);
            if !leaf && !done.contains(&i) {
                return Some((step, i));
            }
        }
        done.extend(k.outputs.iter().copied());
    }
    None
}

/// Whether kernel `to` depends on kernel `from` (through `users`, the kernels depending on each).
fn reaches(users: &[Vec<usize>], from: usize, to: usize) -> bool {
    let mut seen = vec![false; users.len()];
    let mut stack = vec![from];
    while let Some(k) = stack.pop() {
        if k == to {
            return true;
        }
        for &u in &users[k] {
            if !std::mem::replace(&mut seen[u], true) {
                stack.push(u);
            }
        }
    }
    false
}

/// The kernel DAG: producers of each kernel, and what the list schedulers need.
struct Dag<'a> {
    g: &'a Graph,
    kernels: &'a [Kernel],
    outputs: &'a [NodeId],
    deps: Vec<Vec<usize>>,
    users: Vec<Vec<usize>>,
    producer: BTreeMap<NodeId, usize>,
    /// The kernels reading each arena value that is not a graph output (graph outputs live
    /// to the end whoever reads them).
    readers: BTreeMap<NodeId, Vec<usize>>,
    /// Parameter updates' new values: written into their parameter's slot, no arena bytes.
    updated: BTreeSet<NodeId>,
}

impl<'a> Dag<'a> {
    fn new(
        g: &'a Graph,
        kernels: &'a [Kernel],
        outputs: &'a [NodeId],
        updates: &[(NodeId, NodeId)],
        war: bool,
    ) -> Option<Self> {
        let mut producer = BTreeMap::new();
        for (k, kernel) in kernels.iter().enumerate() {
            for &o in &kernel.outputs {
                if producer.insert(o, k).is_some() {
                    return None;
                }
            }
        }
        let mut deps = vec![Vec::new(); kernels.len()];
        let mut users = vec![Vec::new(); kernels.len()];
        let mut readers: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
        for (k, kernel) in kernels.iter().enumerate() {
            for i in &kernel.inputs {
                if is_arena(g, *i) && !outputs.contains(i) {
                    readers.entry(*i).or_default().push(k);
                }
                if let Some(&p) = producer.get(i) {
                    if p != k && !deps[k].contains(&p) {
                        deps[k].push(p);
                        users[p].push(k);
                    }
                }
            }
        }
        // With `war`, write after read: a new value the plan writes into its parameter's slot
        // waits for the parameter's other readers (else it is stored apart, in the arena),
        // where they do not wait for it.
        for &(p, u) in updates.iter().filter(|_| war) {
            let Some(&w) = producer.get(&u) else { continue };
            for r in (0..kernels.len()).filter(|&r| r != w && kernels[r].inputs.contains(&p)) {
                if !deps[w].contains(&r) && !reaches(&users, w, r) {
                    deps[w].push(r);
                    users[r].push(w);
                }
            }
        }
        let updated = updates.iter().map(|&(_, u)| u).collect();
        Some(Dag { g, kernels, outputs, deps, users, producer, readers, updated })
    }

    /// Depth-first post-order from the graph outputs' producers, then from every other kernel
    /// in the given order. `None` on a cycle.
    fn depth_first(&self, reverse: bool) -> Option<Vec<usize>> {
        let n = self.kernels.len();
        let mut state = vec![0u8; n]; // 0 new, 1 on the stack, 2 done
        let mut order = Vec::with_capacity(n);
        let roots: Vec<usize> = self.outputs.iter().filter_map(|o| self.producer.get(o).copied()).chain(0..n).collect();
        for root in roots {
            if state[root] != 0 {
                continue;
            }
            // Iterative DFS: (kernel, next dependency index).
            let mut stack = vec![(root, 0usize)];
            state[root] = 1;
            while let Some(top) = stack.last_mut() {
                let (k, next) = *top;
                let deps = &self.deps[k];
                if next < deps.len() {
                    let d = if reverse { deps[deps.len() - 1 - next] } else { deps[next] };
                    top.1 += 1;
                    match state[d] {
                        0 => {
                            state[d] = 1;
                            stack.push((d, 0));
                        }
                        1 => return None,
                        _ => {}
                    }
                } else {
                    state[k] = 2;
                    order.push(k);
                    stack.pop();
                }
            }
        }
        Some(order)
    }

    /// List scheduling: among ready kernels pick the smallest `key(allocated, freed)`, ties by
    /// position. `None` on a cycle.
    fn greedy(&self, key: impl Fn(i64, i64) -> (i64, i64)) -> Option<Vec<usize>> {
        let n = self.kernels.len();
        let mut pending: Vec<usize> = self.deps.iter().map(Vec::len).collect();
        // Remaining readers of each arena value that is not a graph output.
        let mut readers: BTreeMap<NodeId, usize> = self.readers.iter().map(|(&v, rs)| (v, rs.len())).collect();
        let mut ready: BTreeSet<usize> = (0..n).filter(|&k| pending[k] == 0).collect();
        let mut order = Vec::with_capacity(n);
        while !ready.is_empty() {
            let pick = *ready.iter().min_by_key(|&&k| {
                let kernel = &self.kernels[k];
                let alloc: i64 = kernel
                    .outputs
                    .iter()
                    .filter(|o| !self.updated.contains(o))
                    .map(|&o| value_bytes(self.g, o) as i64)
                    .sum();
                let freed: i64 = kernel
                    .inputs
                    .iter()
                    .filter(|i| readers.get(i) == Some(&1))
                    .map(|&i| value_bytes(self.g, i) as i64)
                    .sum();
                (key(alloc, freed), k)
            })?;
            ready.remove(&pick);
            order.push(pick);
            for i in &self.kernels[pick].inputs {
                if let Some(r) = readers.get_mut(i) {
                    *r = r.saturating_sub(1);
                }
            }
            for &u in &self.users[pick] {
                pending[u] -= 1;
                if pending[u] == 0 {
                    ready.insert(u);
                }
            }
        }
        (order.len() == n).then_some(order)
    }

    /// `order` with each kernel, last first, moved down to just before its first user where
    /// every arena value it reads is read again at or after that point (or is a graph
    /// output, alive to the end): live bytes then fall or stay at every step. Kernels no
    /// other kernel reads stay where they are.
    fn sink(&self, mut order: Vec<usize>) -> Vec<usize> {
        let n = order.len();
        let mut pos = vec![0; n];
        for (p, &k) in order.iter().enumerate() {
            pos[k] = p;
        }
        for p in (0..n).rev() {
            let k = order[p];
            let Some(first) = self.users[k].iter().map(|&u| pos[u]).min() else { continue };
            // Users come after `k` in a valid order; next to it, there is nowhere to go.
            if first <= p + 1 {
                continue;
            }
            let to = first - 1;
            let alive = self.kernels[k]
                .inputs
                .iter()
                .all(|i| self.readers.get(i).is_none_or(|rs| rs.iter().any(|&r| r != k && pos[r] >= first)));
            if !alive {
                continue;
            }
            order[p..=to].rotate_left(1);
            for (q, &m) in order.iter().enumerate().take(to + 1).skip(p) {
                pos[m] = q;
            }
        }
        order
    }
}

/// Reorders `kernels` (a valid order from [`crate::partition()`] or [`crate::fuse()`]) into the
/// candidate topological order with the lowest peak of live bytes; see the module docs.
pub fn schedule(g: &Graph, kernels: Vec<Kernel>, outputs: &[NodeId]) -> Vec<Kernel> {
    schedule_updating(g, kernels, outputs, &[])
}

/// [`schedule`] for a step that updates parameters: `updates` pairs a parameter with its new
/// value (as [`crate::memory_plan::plan_memory_updating`] takes them). A new value the memory
/// plan will write into its parameter's slot takes no arena bytes in a candidate's peak, and
/// the list schedulers count none for any new value: an optimizer update then runs as soon
/// as its gradient is ready and frees it, instead of late to keep its outputs short-lived.
pub fn schedule_updating(
    g: &Graph,
    kernels: Vec<Kernel>,
    outputs: &[NodeId],
    updates: &[(NodeId, NodeId)],
) -> Vec<Kernel> {
    if kernels.len() < 2 {
        return kernels;
    }
    // Each candidate of the kernel DAG, and again with the write-after-read edges of the
    // updates (an update run before its parameter's last reader is stored apart, in the
    // arena, which may still pay where it frees a large gradient early).
    let war = if updates.is_empty() { vec![false] } else { vec![false, true] };
    let n = kernels.len();
    // The updates the plan may write in place, and the kernels reading each one's parameter:
    // in place in an order where the others all come before the update's kernel.
    let in_place = crate::memory_plan::in_place_candidates(g, &kernels, outputs, updates);
    let mut param_readers: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
    for c in &in_place {
        param_readers
            .entry(c.param)
            .or_insert_with(|| (0..n).filter(|&r| kernels[r].inputs.contains(&c.param)).collect());
    }
    let mut best: Option<(u64, Vec<Kernel>)> = None;
    for war in war {
        let Some(dag) = Dag::new(g, &kernels, outputs, updates, war) else { return kernels };
        let mut candidates: Vec<Vec<usize>> = Vec::new();
        if first_unready(g, &kernels).is_none() {
            candidates.push((0..n).collect());
        }
        candidates.extend(dag.depth_first(false));
        candidates.extend(dag.depth_first(true));
        candidates.extend(dag.greedy(|alloc, freed| (-freed, alloc)));
        candidates.extend(dag.greedy(|alloc, freed| (alloc - freed, -freed)));
        for order in candidates {
            let order = dag.sink(order);
            let ks: Vec<Kernel> = order.iter().map(|&k| kernels[k].clone()).collect();
            if first_unready(g, &ks).is_some() {
                continue;
            }
            let mut live = intervals(g, &ks, outputs);
            let mut at = vec![0; n];
            for (step, &k) in order.iter().enumerate() {
                at[k] = step;
            }
            for c in crate::memory_plan::written_in_place(&in_place, |c| {
                param_readers[&c.param].iter().all(|&r| r == c.step || at[r] < at[c.step])
            }) {
                live.remove(&c.value);
            }
            let peak = peak_live_bytes(&live);
            if best.as_ref().is_none_or(|(p, _)| peak < *p) {
                best = Some((peak, ks));
            }
        }
    }
    match best {
        Some((_, ks)) => ks,
        None => kernels,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::FusionMode;
    use crate::partition::partition;
    use crate::testing::{random_graph, TestRng};

    #[test]
    fn schedules_are_valid_permutations_and_never_worse() {
        let mut rng = TestRng::new(0x9e37_79b9_7f4a_7c15);
        for case in 0..40 {
            let (g, outs) = random_graph(&mut rng, 6 + case % 20);
            for mode in [FusionMode::Off, FusionMode::On] {
                let kernels = partition(&g, &outs, mode).unwrap();
                let before = peak_live_bytes(&intervals(&g, &kernels, &outs));
                let scheduled = schedule(&g, kernels.clone(), &outs);
                assert_eq!(first_unready(&g, &scheduled), None, "case {case} {mode:?}");
                assert_eq!(scheduled.len(), kernels.len());
                for k in &kernels {
                    assert!(scheduled.contains(k));
                }
                let after = peak_live_bytes(&intervals(&g, &scheduled, &outs));
                assert!(after <= before, "case {case} {mode:?}: {after} > {before}");
                assert_eq!(schedule(&g, kernels.clone(), &outs), scheduled, "deterministic");
            }
        }
    }

    #[test]
    fn runs_a_branch_to_its_end_before_starting_the_next() {
        // Id order computes both wide branches before reducing either: 3 wide values live.
        let b = fusegraph_ir::GraphBuilder::new();
        let x = b.input("x", fusegraph_ir::DType::F32, vec![64, 64]).unwrap();
        let (a1, b1) = (x.exp().unwrap(), x.tanh().unwrap());
        let y = a1.sum(&[1], true).unwrap().add(&b1.sum(&[1], true).unwrap()).unwrap();
        let (g, outs) = (b.graph(), vec![y.id()]);
        let kernels = partition(&g, &outs, FusionMode::Off).unwrap();
        let before = peak_live_bytes(&intervals(&g, &kernels, &outs));
        let after = peak_live_bytes(&intervals(&g, &schedule(&g, kernels, &outs), &outs));
        assert_eq!((before, after), (3 * 16384, 2 * 16384 + 256));
    }

    /// A kernel ready at the start but read only at the end (a checkpointed recomputation)
    /// moves down to just before its reader, unless that would keep a value it reads alive
    /// longer.
    #[test]
    fn sinks_a_kernel_to_its_first_user_where_nothing_lives_longer() {
        let b = fusegraph_ir::GraphBuilder::new();
        let x = b.input("x", fusegraph_ir::DType::F32, vec![64, 64]).unwrap();
        // `late = exp(x)` first in id order, read only after the chain, beside `x`.
        let late = x.exp().unwrap();
        let mut c = x.tanh().unwrap();
        for _ in 0..3 {
            c = c.sin().unwrap();
        }
        let s = c.sum(&[1], true).unwrap();
        let y = s.add(&late.add(&x).unwrap().sum(&[1], true).unwrap()).unwrap();
        let (g, outs) = (b.graph(), vec![y.id()]);
        let kernels = partition(&g, &outs, FusionMode::Off).unwrap();
        let dag = Dag::new(&g, &kernels, &outs, &[], false).unwrap();
        let at = |order: &[usize], v: NodeId| order.iter().position(|&k| kernels[k].outputs.contains(&v)).unwrap();
        let given: Vec<usize> = (0..kernels.len()).collect();
        assert_eq!(at(&given, late.id()), 0);
        let sunk = dag.sink(given.clone());
        // Right before the kernel that reads it (the first `add`).
        let reader = kernels.iter().position(|k| k.inputs.contains(&late.id())).unwrap();
        assert_eq!(at(&sunk, late.id()) + 1, sunk.iter().position(|&k| k == reader).unwrap());
        let ks = |order: &[usize]| order.iter().map(|&k| kernels[k].clone()).collect::<Vec<_>>();
        assert_eq!(first_unready(&g, &ks(&sunk)), None);
        let peak = |order: &[usize]| peak_live_bytes(&intervals(&g, &ks(order), &outs));
        assert!(peak(&sunk) < peak(&given), "{} -> {}", peak(&given), peak(&sunk));
        // The same value computed from `t = tanh(x)`, which nothing else reads: sinking it would
        // keep `t` alive, so it stays.
        let b = fusegraph_ir::GraphBuilder::new();
        let x = b.input("x", fusegraph_ir::DType::F32, vec![64, 64]).unwrap();
        let t = x.tanh().unwrap();
        let late = t.exp().unwrap();
        let mut c = x.sin().unwrap();
        for _ in 0..3 {
            c = c.sin().unwrap();
        }
        let y = c.add(&late).unwrap();
        let (g, outs) = (b.graph(), vec![y.id()]);
        let kernels = partition(&g, &outs, FusionMode::Off).unwrap();
        let dag = Dag::new(&g, &kernels, &outs, &[], false).unwrap();
        let given: Vec<usize> = (0..kernels.len()).collect();
        assert_eq!(dag.sink(given.clone())[..2], given[..2], "tanh and exp stay first");
    }

    /// A parameter update written in place costs no arena: it runs as soon as its gradient
    /// is ready and frees it, rather than last (counting its new value as an arena value
    /// alive to the end would make running it late look cheaper, and keep the gradient alive).
    #[test]
    fn runs_an_update_as_soon_as_its_gradient_is_ready() {
        use fusegraph_ir::DType;
        let b = fusegraph_ir::GraphBuilder::new();
        let x = b.input("x", DType::F32, vec![64, 64]).unwrap();
        let w = b.parameter("w", DType::F32, vec![64, 64]).unwrap();
        let grad = x.exp().unwrap();
        let c = x.sin().unwrap();
        let s = c.mul(&c).unwrap().sum(&[0, 1], false).unwrap();
        let new_w = w.sub(&grad).unwrap();
        let (g, outs) = (b.graph(), vec![s.id(), new_w.id()]);
        let kernels = partition(&g, &outs, FusionMode::Off).unwrap();
        let step = |ks: &[Kernel], v: NodeId| ks.iter().position(|k| k.outputs.contains(&v)).unwrap();
        assert_eq!(step(&kernels, new_w.id()), kernels.len() - 1, "recorded last");
        let scheduled = schedule_updating(&g, kernels.clone(), &outs, &[(w.id(), new_w.id())]);
        assert_eq!(step(&scheduled, new_w.id()), step(&scheduled, grad.id()) + 1);
        let plan = |ks: &[Kernel]| {
            let opts = crate::memory_plan::MemoryOptions::default();
            crate::memory_plan::plan_memory_updating(&g, ks, &outs, &opts, &[(w.id(), new_w.id())]).arena_bytes
        };
        assert!(plan(&scheduled) < plan(&schedule(&g, kernels, &outs)));
    }

    #[test]
    fn first_unready_finds_a_kernel_before_its_producer() {
        let mut rng = TestRng::new(7);
        let (g, outs) = random_graph(&mut rng, 10);
        let mut kernels = partition(&g, &outs, FusionMode::Off).unwrap();
        assert_eq!(first_unready(&g, &kernels), None);
        let last = kernels.pop().unwrap();
        kernels.insert(0, last);
        assert!(first_unready(&g, &kernels).is_some());
    }
}
