//! Memory-efficient attention: `softmax(x)·v` in one kernel that never stores the
//! `[…, s_q, s_k]` scores or probabilities.
//!
//! Fusion leaves attention as three kernels: the scores (`q·kᵀ`, a matmul), a row kernel for
//! the scale, the mask and the softmax over the last axis, and the `p·v` matmul. Between
//! them the scores and the probabilities live in memory: `batch · heads · s_q · s_k` values
//! each, which grows with the square of the sequence and dominates a transformer's
//! activations at long sequences (12 heads of 2048 × 2048 f32 scores are 192 MiB per layer).
//!
//! [`fuse_attention`] merges such a triple into one kernel of kind
//! [`KernelKind::Attention`]: each invocation owns one row of the output, walks the row's
//! logits `x` once with the online softmax (a running max `m` and sum `l`, the accumulated
//! row of `p·v` rescaled by `exp(m_old − m_new)` whenever the max grows, as FlashAttention
//! does) and divides by `l` at the end. The logits are computed where they are used, through
//! the element functions of the merged kernels (the scores' dot product, the scale, the
//! mask), so nothing of size `s_q · s_k` is ever stored. Under a causal (or any banded) mask
//! the kernel stops walking a row's keys past its band ([`crate::band::key_band`]).
//!
//! It is a memory tool: the planner applies it when a plan exceeds its memory limit (before
//! rematerialization), or always when asked ([`crate::PlanOptions::fused_attention`]).
//! The kernel computes each logit by a dot product over the head dimension and rescales its
//! accumulator per key, which a GPU runs well and a CPU adapter does not (ARCHITECTURE.md).
//!
//! The pattern, exactly (anything else is left as it is):
//! - a row kernel with one output `p = e / broadcast(s)` over the last axis of `x`, where
//!   `s = reduce_sum(e)`, `e = exp(x − broadcast(m))`, `m = reduce_max(x)` (the builder's
//!   `softmax(last axis)`, with or without `keep_dims`), every other member computing `x`;
//! - `p` used by one node only, the left operand of a matmul `o = p·v` that is the single
//!   output of a loop kernel whose other members compute `v`; `p` and `o` agree on every
//!   axis but the last; `o`'s last axis (the head dimension) at most [`MAX_HEAD_DIM`], even
//!   for f16;
//! - the kernels producing the row kernel's inputs are merged too where each is a loop
//!   kernel whose single output only the row kernel reads (the scores).

use crate::kernel::{kernel_inputs, Kernel, KernelKind};
use fusegraph_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceKind, UnaryOp};
use std::collections::{BTreeMap, BTreeSet};

/// The longest row of `p·v` one invocation accumulates (its private array).
pub const MAX_HEAD_DIM: usize = 256;

/// The nodes of one matched `softmax(x)·v`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionMatch {
    /// The softmax's input: the logits.
    pub logits: NodeId,
    /// The probabilities `softmax(logits)`.
    pub probs: NodeId,
    /// The product `probs · v`.
    pub out: NodeId,
}

/// Merges every `softmax(x)·v` of `kernels` (in execution order) into one
/// [`KernelKind::Attention`] kernel, with the kernels computing its scores where they
/// qualify (module docs), keeping each merged kernel within `max_bindings` storage bindings.
/// Returns the kernels in a valid execution order; unchanged where nothing matches.
pub fn fuse_attention(g: &Graph, kernels: Vec<Kernel>, outputs: &[NodeId], max_bindings: usize) -> Vec<Kernel> {
    let pos: BTreeMap<NodeId, usize> = match g.reachable(outputs) {
        Ok(order) => order.into_iter().enumerate().map(|(i, n)| (n, i)).collect(),
        Err(_) => return kernels,
    };
    let mut kernels: Vec<Option<Kernel>> = kernels.into_iter().map(Some).collect();
    for b in 0..kernels.len() {
        let Some(kb) = kernels[b].as_ref() else { continue };
        let Some(m) = softmax_rows(g, kb) else { continue };
        if outputs.contains(&m.probs) {
            continue;
        }
        let Some(c) = consumer(g, &kernels, &pos, m) else { continue };
        // Producers of the row kernel's inputs that only it reads (the scores).
        let producers: Vec<usize> = kb
            .inputs
            .iter()
            .filter_map(|&i| {
                let a = kernels.iter().position(|k| k.as_ref().is_some_and(|k| k.outputs == [i]))?;
                let ka = kernels[a].as_ref()?;
                let only_b = !outputs.contains(&i)
                    && kernels
                        .iter()
                        .enumerate()
                        .all(|(j, k)| j == b || k.as_ref().is_none_or(|k| !k.inputs.contains(&i)));
                (ka.kind == KernelKind::Loop && only_b).then_some(a)
            })
            .collect();
        let merge = |parts: &[usize]| -> Kernel {
            let mut members: Vec<NodeId> = parts
                .iter()
                .flat_map(|&k| kernels[k].as_ref().map(|k| k.members.clone()).unwrap_or_default())
                .collect();
            members.sort_by_key(|n| pos.get(n).copied().unwrap_or(usize::MAX));
            members.dedup();
            let inputs = kernel_inputs(g, &members);
            Kernel { kind: KernelKind::Attention { logits: m.logits }, members, outputs: vec![m.out], inputs }
        };
        let mut with_scores = producers;
        with_scores.extend([b, c]);
        let Some((fused, merged)) = [with_scores, vec![b, c]]
            .into_iter()
            .map(|parts| (merge(&parts), parts))
            .find(|(k, _)| k.inputs.len() < max_bindings)
        else {
            continue;
        };
        for &k in &merged {
            kernels[k] = None;
        }
        // The consumer runs last of the merged kernels; everything they read is ready there.
        kernels[c] = Some(fused);
    }
    kernels.into_iter().flatten().collect()
}

/// The `softmax(x)` over the last axis that row kernel `k` computes as its single output,
/// with the matmul that is its probabilities' only user.
pub fn softmax_rows(g: &Graph, k: &Kernel) -> Option<AttentionMatch> {
    let KernelKind::Row { axes, .. } = &k.kind else { return None };
    let [p] = k.outputs[..] else { return None };
    let Op::Binary(BinaryOp::Div) = g.node(p).op else { return None };
    let (e, q) = (g.operands(p)[0], g.operands(p)[1]);
    let Op::Unary(UnaryOp::Exp) = g.node(e).op else { return None };
    let d = g.operands(e)[0];
    let Op::Binary(BinaryOp::Sub) = g.node(d).op else { return None };
    let x = g.operands(d)[0];
    let x_dims = g.ty(x).shape.dims();
    let rank = x_dims.len();
    if rank < 2 || axes != &[rank - 1] || g.ty(p).shape.dims() != x_dims {
        return None;
    }
    let (mx, mut chain) = row_value(g, g.operands(d)[1], x_dims)?;
    let (sm, sum_chain) = row_value(g, q, x_dims)?;
    chain.extend(sum_chain);
    let last_axis = |r: NodeId, kind: ReduceKind, of: NodeId| {
        matches!(&g.node(r).op, Op::Reduce { kind: k, axes, .. } if *k == kind && axes == &[rank - 1])
            && g.operands(r)[0] == of
    };
    if !last_axis(mx, ReduceKind::Max, x) || !last_axis(sm, ReduceKind::Sum, e) {
        return None;
    }
    // Every other member computes `x`.
    let members: BTreeSet<NodeId> = k.members.iter().copied().collect();
    let mut allowed: BTreeSet<NodeId> = [p, e, d, mx, sm].into_iter().chain(chain).collect();
    let mut stack = vec![x];
    while let Some(n) = stack.pop() {
        if members.contains(&n) && allowed.insert(n) {
            // A reduction computing `x` would be recomputed for every logit.
            if matches!(g.node(n).op, Op::Reduce { .. }) {
                return None;
            }
            stack.extend(g.operands(n));
        }
    }
    if !members.iter().all(|m| allowed.contains(m)) {
        return None;
    }
    let [o] = g.users(p)[..] else { return None };
    let out_ty = g.ty(o);
    let dims = out_ty.shape.dims();
    let head = *dims.last()?;
    let ok = matches!(g.node(o).op, Op::MatMul)
        && g.operands(o)[0] == p
        && g.operands(o)[1] != p
        && dims.len() == rank
        && dims[..rank - 1] == x_dims[..rank - 1]
        && head > 0
        && head <= MAX_HEAD_DIM
        && (out_ty.dtype != DType::F16 || head % 2 == 0)
        && matches!(out_ty.dtype, DType::F32 | DType::F16);
    ok.then_some(AttentionMatch { logits: x, probs: p, out: o })
}

/// The per-row value `v` broadcast along the last axis of a value of `dims` by `n` (through
/// reshapes that add or drop a trailing 1 and a broadcast that keeps every leading axis in
/// place), with the nodes in between; `None` for any other broadcast.
fn row_value(g: &Graph, mut n: NodeId, dims: &[usize]) -> Option<(NodeId, Vec<NodeId>)> {
    let rank = dims.len();
    let rows = &dims[..rank - 1];
    let is_row = |d: &[usize]| d == rows || (d.len() == rank && d[..rank - 1] == *rows && d[rank - 1] == 1);
    let mut chain = Vec::new();
    loop {
        match &g.node(n).op {
            Op::Broadcast { dims: map, .. } => {
                let from = g.ty(g.operands(n)[0]).shape.dims();
                if !is_row(from) || *map != (0..from.len()).collect::<Vec<_>>() {
                    return None;
                }
            }
            Op::Reshape { .. } => {
                if !is_row(g.ty(g.operands(n)[0]).shape.dims()) || !is_row(g.ty(n).shape.dims()) {
                    return None;
                }
            }
            _ => return is_row(g.ty(n).shape.dims()).then_some((n, chain)),
        }
        chain.push(n);
        n = g.operands(n)[0];
    }
}

/// The loop kernel of `kernels` whose single output is `m.out`, whose other members compute
/// the right operand only, and which alone reads `m.probs`.
fn consumer(g: &Graph, kernels: &[Option<Kernel>], pos: &BTreeMap<NodeId, usize>, m: AttentionMatch) -> Option<usize> {
    let c = kernels.iter().position(|k| k.as_ref().is_some_and(|k| k.outputs == [m.out]))?;
    let kc = kernels[c].as_ref()?;
    if kc.kind != KernelKind::Loop || !pos.contains_key(&m.out) {
        return None;
    }
    let readers = kernels.iter().filter(|k| k.as_ref().is_some_and(|k| k.inputs.contains(&m.probs))).count();
    let uses_probs = kc.members.iter().any(|&n| n != m.out && g.operands(n).contains(&m.probs));
    (readers == 1 && kc.inputs.contains(&m.probs) && !uses_probs && !kc.members.contains(&m.probs)).then_some(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuse::{fuse, FusionOptions};
    use fusegraph_ir::GraphBuilder;

    /// `softmax(q·kᵀ/√d + causal mask)·v` as `fusegraph-nn` writes it, simplified as the
    /// runtime compiles it; returns the graph, its output and the fused kernels.
    fn attention(causal: bool) -> (Graph, Vec<NodeId>, Vec<Kernel>) {
        attention_with(causal, false)
    }

    /// With `probs_too`, the probabilities are a graph output as well.
    fn attention_with(causal: bool, probs_too: bool) -> (Graph, Vec<NodeId>, Vec<Kernel>) {
        let b = GraphBuilder::new();
        let q = b.input("q", DType::F32, vec![2, 3, 9, 8]).unwrap();
        let k = b.input("k", DType::F32, vec![2, 3, 9, 8]).unwrap();
        let v = b.input("v", DType::F32, vec![2, 3, 9, 8]).unwrap();
        let mut s = q.matmul(&k.transpose(&[0, 1, 3, 2]).unwrap()).unwrap().mul_scalar(0.35).unwrap();
        if causal {
            let row = b.iota(DType::I32, [9, 9], 0).unwrap();
            let col = b.iota(DType::I32, [9, 9], 1).unwrap();
            s = row.ge(&col).unwrap().select(&s, &b.scalar(DType::F32, -1e9).unwrap()).unwrap();
        }
        let p = s.softmax(3).unwrap();
        let out = p.matmul(&v).unwrap();
        let mut outs = vec![out.id()];
        if probs_too {
            outs.push(p.id());
        }
        let mut g = b.graph();
        crate::simplify(&mut g, &mut outs).unwrap();
        let kernels = fuse(&g, &outs, &FusionOptions::default()).unwrap().kernels;
        (g, outs, kernels)
    }

    #[test]
    fn the_scores_softmax_and_product_become_one_kernel() {
        for causal in [false, true] {
            let (g, outs, kernels) = attention(causal);
            assert_eq!(kernels.len(), 3, "{kernels:?}");
            let fused = fuse_attention(&g, kernels, &outs, 8);
            assert_eq!(fused.len(), 1, "causal {causal}: {fused:?}");
            assert!(matches!(fused[0].kind, KernelKind::Attention { .. }));
            assert_eq!(fused[0].outputs, outs);
        }
    }

    #[test]
    fn probabilities_stored_anyway_or_too_few_bindings_keep_the_three_kernels() {
        let (g, outs, kernels) = attention_with(true, true);
        let n = kernels.len();
        let fused = fuse_attention(&g, kernels, &outs, 8);
        assert_eq!(fused.len(), n);
        assert!(fused.iter().all(|k| !matches!(k.kind, KernelKind::Attention { .. })));
        // With the scores: q, k, v and the output, four bindings; without them: the scores,
        // v and the output, three (the scores kernel stays).
        let (g, outs, kernels) = attention(false);
        let fused = fuse_attention(&g, kernels.clone(), &outs, 3);
        assert_eq!(fused.len(), 2);
        assert_eq!(fused[0], kernels[0]);
        assert_eq!(fused[1].inputs.len(), 2, "{:?}", fused[1]);
        assert!(matches!(fused[1].kind, KernelKind::Attention { .. }));
        assert_eq!(fuse_attention(&g, kernels.clone(), &outs, 2), kernels);
    }
}
