//! Window folding: a kernel that writes cache windows (`dynamic_update_slice` updates of
//! parameters) and does nothing expensive dissolves into the kernels that read what it
//! computes. A decode step's cache write is such a kernel: the new key and value, viewed or
//! rotated from the q/k/v product, written into each layer's caches, read by the attention
//! kernels next. Each update joins the one kernel reading it as a *side window* of that
//! kernel ([`side_windows`]), which stores the update's window beside its own outputs; each
//! value the window kernel computed for another kernel (a rotated query) is recomputed
//! there. A layer's step loses a dispatch.
//!
//! The kernel reading a side window reads it through its element function: inside the
//! window the update, outside it the operand — whose buffer the update is written over (the
//! parameter updated in place), at elements no invocation writes. So the kernel may read the
//! cache at any index while it writes the window ([`crate::memory_plan`] counts such reads as
//! safe).

use crate::cost::is_expensive;
use crate::kernel::{kernel_inputs, Kernel, KernelKind, GEMV_MAX_ROWS};
use fusegraph_ir::{DType, Graph, NodeId, Op};
use std::collections::{BTreeMap, BTreeSet};

/// Dissolves each window kernel of `kernels` (in order) into the kernels reading its
/// outputs, where every output is either an update of `updates` (`(parameter, value)`)
/// written over a parameter only it reads, in a 32-bit type, or a value no graph output
/// names; each read by exactly one other kernel, which reads its operands through element
/// functions (no contraction, an attention kernel, or with `gemv` products of at most
/// [`GEMV_MAX_ROWS`] rows); and the
/// kernels it joins stay within `max_bindings`. Other kernels are returned as they are, in
/// order.
pub fn fold_windows(
    g: &Graph,
    mut kernels: Vec<Kernel>,
    outputs: &[NodeId],
    updates: &[(NodeId, NodeId)],
    (max_bindings, gemv): (usize, bool),
) -> Vec<Kernel> {
    let position: BTreeMap<NodeId, usize> =
        g.topo_order().unwrap_or_default().into_iter().enumerate().map(|(i, n)| (n, i)).collect();
    let mut w = 0;
    while w < kernels.len() {
        match fold(g, &kernels, w, (outputs, updates), (max_bindings, gemv), &position) {
            Some(joined) => {
                for (c, k) in joined {
                    kernels[c] = k;
                }
                kernels.remove(w);
            }
            None => w += 1,
        }
    }
    kernels
}

/// The kernels that kernel `w` joins, rebuilt with its outputs' members, where it dissolves
/// (see [`fold_windows`]).
fn fold(
    g: &Graph,
    kernels: &[Kernel],
    w: usize,
    (outputs, updates): (&[NodeId], &[(NodeId, NodeId)]),
    (max_bindings, gemv): (usize, bool),
    position: &BTreeMap<NodeId, usize>,
) -> Option<Vec<(usize, Kernel)>> {
    let k = &kernels[w];
    let windows = k.outputs.iter().any(|&o| matches!(g.node(o).op, Op::DynamicUpdateSlice { .. }));
    if !windows || k.members.iter().any(|&m| is_expensive(&g.node(m).op)) {
        return None;
    }
    let readers =
        |v: NodeId| -> Vec<usize> { (0..kernels.len()).filter(|&i| kernels[i].inputs.contains(&v)).collect() };
    // Each output's one reader, and what it brings there.
    let mut joined: BTreeMap<usize, (BTreeSet<NodeId>, Vec<NodeId>)> = BTreeMap::new();
    for &o in &k.outputs {
        let [c] = readers(o)[..] else { return None };
        if c == w || !reads_by_elements(g, &kernels[c], gemv) {
            return None;
        }
        let stored = match g.node(o).op {
            Op::DynamicUpdateSlice { .. } => {
                let p = g.operands(o)[0];
                let updated = updates.contains(&(p, o)) && matches!(g.node(p).op, Op::Parameter { .. });
                let only_here = readers(p) == [w];
                let word = matches!(g.ty(o).dtype, DType::F32 | DType::I32 | DType::U32);
                if !(updated && only_here && word) {
                    return None;
                }
                true
            }
            _ if outputs.contains(&o) => return None,
            _ => false,
        };
        let entry = joined.entry(c).or_default();
        entry.0.extend(computed_in(g, k, o));
        if stored {
            entry.1.push(o);
        }
    }
    joined
        .into_iter()
        .map(|(c, (moved, stored))| {
            let into = &kernels[c];
            let mut members: Vec<NodeId> = moved.union(&into.members.iter().copied().collect()).copied().collect();
            members.sort_by_key(|m| position.get(m).copied().unwrap_or(usize::MAX));
            let mut outs = into.outputs.clone();
            outs.extend(stored);
            let inputs = kernel_inputs(g, &members);
            (inputs.len() + outs.len() <= max_bindings)
                .then(|| (c, Kernel { kind: into.kind.clone(), members, outputs: outs, inputs }))
        })
        .collect()
}

/// Whether kernel `k` reads its operands through their element functions in every form, so
/// that a side window's element function costs it a comparison per element: an attention
/// kernel, one with no contraction, or (with `gemv`, the matrix–vector kernel's forms)
/// products of at most [`GEMV_MAX_ROWS`] rows. A tiled or subgroup product reads its operands' bindings as
/// vectors or textures where it can, which a window's operand would prevent.
fn reads_by_elements(g: &Graph, k: &Kernel, gemv: bool) -> bool {
    matches!(k.kind, KernelKind::Attention { .. })
        || k.members.iter().all(|&m| match g.node(m).op {
            Op::MatMul => gemv && g.ty(m).shape.dims().iter().rev().nth(1).is_some_and(|&rows| rows <= GEMV_MAX_ROWS),
            Op::Conv2d { .. } => false,
            _ => true,
        })
}

/// The members of `k` that `o` is computed from (`o` among them).
fn computed_in(g: &Graph, k: &Kernel, o: NodeId) -> BTreeSet<NodeId> {
    let mut set = BTreeSet::new();
    let mut stack = vec![o];
    while let Some(n) = stack.pop() {
        if k.members.contains(&n) && set.insert(n) {
            stack.extend(g.operands(n));
        }
    }
    set
}

/// The side windows of `kernel`: its `dynamic_update_slice` outputs that other members read
/// (through the update's element function). The kernel's own form computes and stores its
/// other outputs; it stores each side window besides, a grid-stride loop over the window's
/// elements where the update is written over its operand, over all of them otherwise. None
/// where every output would be one.
pub fn side_windows(g: &Graph, kernel: &Kernel) -> Vec<NodeId> {
    let sides: Vec<NodeId> = kernel
        .outputs
        .iter()
        .copied()
        .filter(|&o| matches!(g.node(o).op, Op::DynamicUpdateSlice { .. }))
        .filter(|&o| g.users(o).iter().any(|u| kernel.members.contains(u)))
        .collect();
    // (A kernel whose every output is one keeps its loop form.)
    match sides.len() < kernel.outputs.len() {
        true => sides,
        false => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuse::{fuse_updating, FusionOptions};
    use fusegraph_ir::GraphBuilder;

    /// A decode step's attention over a cache written at a run-time position: the write's
    /// kernel dissolves into the product reading the cache, which stores the window; it
    /// stays where the cache is not an update, the bindings would pass the limit, or the
    /// product is not the matrix–vector kernel's.
    #[test]
    fn a_cache_write_joins_the_product_that_reads_the_cache() {
        let b = GraphBuilder::new();
        let cache = b.parameter("cache", DType::F32, [4, 64, 16]).unwrap();
        let x = b.input("x", DType::F32, [1, 64]).unwrap();
        let q = b.input("q", DType::F32, [4, 1, 16]).unwrap();
        let pos = b.input("pos", DType::I32, Vec::<usize>::new()).unwrap();
        let k = x.reshape([4, 1, 16]).unwrap();
        let new = cache.dynamic_update_slice(&k, &pos, 1).unwrap();
        let scores = q.matmul(&new.transpose(&[0, 2, 1]).unwrap()).unwrap();
        let g = b.graph();
        let outs = [scores.id(), new.id()];
        let fused = fuse_updating(&g, &outs, &[new.id()], &FusionOptions::default()).unwrap().kernels;
        let before = fused.len();
        let update = [(cache.id(), new.id())];
        let folded = fold_windows(&g, fused.clone(), &outs, &update, (8, true));
        assert_eq!(folded.len(), before - 1, "{folded:?}");
        let reader = folded.iter().find(|k| k.members.contains(&scores.id())).unwrap();
        assert_eq!(side_windows(&g, reader), vec![new.id()]);
        assert!(reader.inputs.contains(&cache.id()) && !reader.inputs.contains(&new.id()));
        // Not an update, too few bindings, a product not read by the matrix–vector kernel:
        // the window kernel stays.
        assert_eq!(fold_windows(&g, fused.clone(), &outs, &[], (8, true)), fused);
        assert_eq!(fold_windows(&g, fused.clone(), &outs, &update, (4, true)), fused);
        assert_eq!(fold_windows(&g, fused.clone(), &outs, &update, (8, false)), fused);
    }
}
