//! Hoisting the work on parameters out of every run.
//!
//! Some kernels compute from parameters and constants alone: batch-norm folding's scaled
//! weights (`w · γ / √(σ² + ε)`), a causal mask, a constant the fusion pass left on its own.
//! Their results are the same on every run until a parameter changes, so the runtime runs
//! them once after the parameters are set and skips them afterwards (the way an inference
//! engine folds weights when it loads them). [`hoist`] finds them, moves them to the front of
//! the schedule (they depend on nothing that runs after them, so the order stays valid) and
//! names the values later kernels read from them: the memory plan keeps those alive from the
//! moment they are written to the end of the run, so no later kernel (of this run or the
//! next) writes over them. A parameter a training step updates is not constant: kernels that
//! read one stay in every run.

use crate::kernel::Kernel;
use fusegraph_ir::{Graph, NodeId, Op};
use std::collections::BTreeSet;

/// The kernels of a schedule with the hoisted ones first.
#[derive(Clone, Debug, PartialEq)]
pub struct Hoisted {
    /// Every kernel: the first `prepared` compute from parameters and constants alone, then
    /// the rest in their previous order.
    pub kernels: Vec<Kernel>,
    /// How many kernels lead the schedule and need to run only after a parameter changes.
    pub prepared: usize,
    /// Values of the prepared kernels that other kernels read: they must stay untouched
    /// between runs (the memory plan treats them as live to the end).
    pub pinned: Vec<NodeId>,
}

/// Moves the kernels whose every input is a parameter not in `updated`, a constant, or a
/// value of another such kernel, to the front of `kernels`. A kernel that stores a graph
/// output stays where it is (its value is read back every run anyway), and so does every
/// kernel that needs its values.
pub fn hoist(g: &Graph, kernels: Vec<Kernel>, outputs: &[NodeId], updated: &BTreeSet<NodeId>) -> Hoisted {
    let outputs: BTreeSet<NodeId> = outputs.iter().copied().collect();
    // Values the hoisted kernels produce, so far.
    let mut derived: BTreeSet<NodeId> = BTreeSet::new();
    let constant = |v: &NodeId, derived: &BTreeSet<NodeId>| {
        derived.contains(v)
            || (matches!(g.node(*v).op, Op::Parameter { .. } | Op::Constant { .. }) && !updated.contains(v))
    };
    let mut is_prepared = vec![false; kernels.len()];
    // Kernels are in a valid order: a kernel's inputs come from earlier kernels.
    for (i, k) in kernels.iter().enumerate() {
        if k.inputs.iter().all(|v| constant(v, &derived)) && !k.outputs.iter().any(|o| outputs.contains(o)) {
            is_prepared[i] = true;
            derived.extend(k.outputs.iter().copied());
        }
    }
    let read_later: BTreeSet<NodeId> = kernels
        .iter()
        .zip(&is_prepared)
        .filter(|(_, &p)| !p)
        .flat_map(|(k, _)| k.inputs.iter().copied())
        .filter(|v| derived.contains(v))
        .collect();
    let (front, back): (Vec<_>, Vec<_>) = kernels.into_iter().zip(is_prepared).partition(|(_, p)| *p);
    let prepared = front.len();
    let kernels = front.into_iter().chain(back).map(|(k, _)| k).collect();
    Hoisted { kernels, prepared, pinned: read_later.into_iter().collect() }
}
