//! Explicit gradient checkpointing: recompute a forward segment in the backward pass instead
//! of keeping its activations alive.
//!
//! After [`crate::grad`], backward nodes read forward values (a matmul's input for the weight
//! gradient, an activation's input for its derivative), so every such value stays live from
//! its forward computation until its backward use: that is what makes training memory grow
//! with depth. [`checkpoint`] takes the forward nodes of one segment (say one layer), clones
//! the inner ones the backward pass reads — together with the inner nodes they are computed
//! from — and rewires the backward uses to the clones. The originals then die inside the
//! forward pass; the clones depend only on the segment's inputs and outputs (which stay alive
//! as the checkpoints) and can be scheduled right before their backward users. The price is
//! recomputing the cloned part of the segment once.
//!
//! A backward comparison of a cloned value with a value computed from it (`eq(x, max(x))`,
//! a max's gradient) gets clones on both sides, recomputing the segment values between them
//! even where one is a checkpoint: a clone may round differently from its original, and the
//! tie must hold exactly.
//!
//! Clones carry the name `checkpoint:{original name or id}`. Common subexpression elimination
//! keys on the node name, so it does not merge a clone back into its original.
//!
//! Rewiring a use means rebuilding the user node (the IR has no per-edge replacement): each
//! backward user of a cloned value is re-added with the clone as its operand, every use of the
//! old user moves to the new one, and the old user is left without users for dead code
//! elimination. [`Checkpointed::replaced`] maps each old user to its replacement; callers
//! holding node ids (gradients, outputs) must map them through it.

use fusegraph_ir::{Graph, NodeId, Result};
use std::collections::{BTreeMap, BTreeSet};

/// What [`checkpoint`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checkpointed {
    /// `(original, clone)` for every cloned segment node, in topological order.
    pub clones: Vec<(NodeId, NodeId)>,
    /// `(old backward user, its replacement)`: nodes rebuilt to read the clones. Map any held
    /// node id through this (see [`Checkpointed::map`]).
    pub replaced: BTreeMap<NodeId, NodeId>,
}

impl Checkpointed {
    /// `id` after the rewrite: its replacement if it was rebuilt, else itself.
    pub fn map(&self, id: NodeId) -> NodeId {
        self.replaced.get(&id).copied().unwrap_or(id)
    }
}

/// Rewrites `g` so the backward pass recomputes the forward `segment` instead of reading its
/// values: see the module docs. `is_backward(user)` says whether a user node belongs to the
/// backward pass (in a graph built by `grad`, the nodes added by it).
///
/// The segment's *outputs* — its nodes that some forward node outside the segment reads — are
/// kept (they are the checkpoints the recomputation starts from, alive anyway as the next
/// segment's input), as are its leaves (inputs, parameters, constants). Every other segment
/// node that a backward node reads is cloned, with the inner nodes it is computed from; the
/// clones read the originals of everything outside that set. A segment whose inner values the
/// backward pass does not read is left unchanged. Errors only for ids not in `g`.
pub fn checkpoint(g: &mut Graph, segment: &[NodeId], is_backward: impl Fn(NodeId) -> bool) -> Result<Checkpointed> {
    for &id in segment {
        g.check(id)?;
    }
    let seg: BTreeSet<NodeId> = segment.iter().copied().filter(|&id| !g.node(id).op.is_leaf()).collect();
    // The segment's outputs (values forward nodes outside it read) stay alive anyway: they
    // are the checkpoints. Only the inner values are recomputed.
    let inner: BTreeSet<NodeId> = seg
        .iter()
        .copied()
        .filter(|&id| !g.users(id).into_iter().any(|u| !seg.contains(&u) && !is_backward(u)))
        .collect();
    // Inner values some backward node reads.
    let mut read: BTreeSet<NodeId> = inner
        .iter()
        .copied()
        .filter(|&id| g.users(id).into_iter().any(|u| !seg.contains(&u) && is_backward(u)))
        .collect();
    if read.is_empty() {
        return Ok(Checkpointed::default());
    }
    // A backward comparison of a cloned value with a value computed from it (a max's
    // gradient compares `x` with `max(x)`) holds for the maximum only if both sides see the
    // clone: a recomputed copy may round differently from the original. The segment values
    // between the two (the maximum, even where it is a checkpoint) are recomputed for the
    // backward pass too.
    let backward: Vec<NodeId> = g.node_ids().into_iter().filter(|&n| is_backward(n)).collect();
    for (x, other) in crate::fuse::self_comparisons(g, &backward) {
        if !read.contains(&x) {
            continue;
        }
        let mut stack = vec![other];
        let mut seen = BTreeSet::new();
        while let Some(m) = stack.pop() {
            if m == x || !seen.insert(m) || !crate::fuse::computed_from(g, m, x) {
                continue;
            }
            if seg.contains(&m) {
                read.insert(m);
            }
            stack.extend(g.operands(m));
        }
    }
    // Every inner value those are computed from.
    let mut needed = BTreeSet::new();
    let mut stack: Vec<NodeId> = read.iter().copied().collect();
    while let Some(id) = stack.pop() {
        if needed.insert(id) {
            stack.extend(g.operands(id).into_iter().filter(|o| inner.contains(o)));
        }
    }
    let order: Vec<NodeId> = g.topo_order()?.into_iter().filter(|id| needed.contains(id)).collect();
    let mut clone_of: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    let mut done = Checkpointed::default();
    for id in order {
        let operands: Vec<NodeId> =
            g.operands(id).into_iter().map(|o| clone_of.get(&o).copied().unwrap_or(o)).collect();
        let node = g.node(id).clone();
        let c = g.add_op(node.op, &operands)?;
        let label = node.name.unwrap_or_else(|| id.to_string());
        g.set_name(c, format!("checkpoint:{label}"));
        clone_of.insert(id, c);
        done.clones.push((id, c));
    }
    // Backward users of the cloned values, each rebuilt once with every cloned operand swapped.
    let mut users = BTreeSet::new();
    for &id in &read {
        users.extend(g.users(id).into_iter().filter(|u| !seg.contains(u) && is_backward(*u)));
    }
    for u in users {
        let operands: Vec<NodeId> = g
            .operands(u)
            .into_iter()
            .map(|o| if read.contains(&o) { clone_of.get(&o).copied().unwrap_or(o) } else { o })
            .collect();
        let node = g.node(u).clone();
        let nu = g.add_op(node.op, &operands)?;
        if let Some(name) = node.name {
            g.set_name(nu, name);
        }
        g.replace_uses(u, nu);
        done.replaced.insert(u, nu);
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusegraph_ir::{DType, GraphBuilder};

    #[test]
    fn backward_reads_move_to_clones_and_forward_values_are_unchanged() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [4]).unwrap();
        let h = x.exp().unwrap();
        let y = h.tanh().unwrap();
        let loss = y.sum(&[0], false).unwrap();
        let mut g = b.graph();
        let forward: BTreeSet<NodeId> = g.node_ids().into_iter().collect();
        let dx = crate::grad(&mut g, loss.id(), &[x.id()]).unwrap()[0];
        let before = g.clone();
        let done = checkpoint(&mut g, &[h.id(), y.id()], |u| !forward.contains(&u)).unwrap();
        assert!(!done.clones.is_empty());
        fusegraph_ir::verify(&g).unwrap();
        let dx2 = done.map(dx);
        // No live backward node reads the originals any more (the replaced users are dead).
        for (orig, clone) in &done.clones {
            let ok = |u: &NodeId| {
                forward.contains(u) || done.clones.iter().any(|(_, c)| c == u) || done.replaced.contains_key(u)
            };
            assert!(g.users(*orig).iter().all(ok));
            assert!(g.node(*clone).name.as_deref().unwrap().starts_with("checkpoint:"));
        }
        let feeds = BTreeMap::from([(
            "x".to_string(),
            fusegraph_ir::HostTensor::new([4], vec![0.1f32, -0.5, 0.3, 1.0]).unwrap(),
        )]);
        let want = fusegraph_reference::evaluate(&before, &[loss.id(), dx], &feeds, &BTreeMap::new()).unwrap();
        let got = fusegraph_reference::evaluate(&g, &[loss.id(), dx2], &feeds, &BTreeMap::new()).unwrap();
        assert_eq!(want, got);
        // Simplification (CSE) keeps the clones apart.
        let mut outs = vec![loss.id(), dx2];
        crate::simplify(&mut g, &mut outs).unwrap();
        assert!(g.node_ids().iter().any(|&id| g
            .node(id)
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("checkpoint:"))));
    }

    #[test]
    fn a_segment_the_backward_pass_does_not_read_is_left_alone() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [4]).unwrap();
        let y = x.add_scalar(1.0).unwrap();
        let loss = y.sum(&[0], false).unwrap();
        let mut g = b.graph();
        let forward: BTreeSet<NodeId> = g.node_ids().into_iter().collect();
        crate::grad(&mut g, loss.id(), &[x.id()]).unwrap();
        let n = g.len();
        let done = checkpoint(&mut g, &[y.id()], |u| !forward.contains(&u)).unwrap();
        assert_eq!(done, Checkpointed::default());
        assert_eq!(g.len(), n);
    }

    /// `m = max(x)` is a checkpoint (the forward pass reads it after the segment) and `x`
    /// is recomputed: the max's gradient compares the clone of `x` with a clone of `m`, not
    /// with the original `m` computed from bits the clone may not reproduce.
    #[test]
    fn a_max_gradient_compares_clones_on_both_sides() {
        let b = GraphBuilder::new();
        let a = b.input("a", DType::F32, [3, 4]).unwrap();
        let x = a.exp().unwrap();
        let m = x.max(&[0], true).unwrap();
        let loss = m.mul_scalar(2.0).unwrap().sum(&[0, 1], false).unwrap();
        let mut g = b.graph();
        let forward: BTreeSet<NodeId> = g.node_ids().into_iter().collect();
        let da = crate::grad(&mut g, loss.id(), &[a.id()]).unwrap()[0];
        let done = checkpoint(&mut g, &[x.id(), m.id()], |u| !forward.contains(&u)).unwrap();
        fusegraph_ir::verify(&g).unwrap();
        let da = done.map(da);
        let clone = |n: NodeId| done.clones.iter().find(|(o, _)| *o == n).map(|(_, c)| *c);
        let (x2, m2) = (clone(x.id()).expect("x recomputed"), clone(m.id()).expect("m recomputed"));
        let live = g.reachable(&[da]).unwrap();
        assert!(live.contains(&m2) && !live.contains(&m.id()));
        assert_eq!(crate::compared_with_themselves(&g, &live), BTreeSet::from([x2]));
    }
}
