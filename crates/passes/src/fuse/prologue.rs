//! Row prologues of matrix–vector products: a row kernel whose one stored value only feeds
//! products of a few rows as their left operand (a decode step's layer norm before its q, k
//! and v projections) joins their kernel, which reduces the rows itself
//! ([`Ctx::gemv_row_prologue`]): one dispatch fewer, and the normalized rows never stored.

use super::*;

/// Merges each row kernel into the product kernel it alone feeds where the result is a
/// matrix–vector kernel with a row prologue, within the binding limit and without raising
/// the plan's peak. Returns a decision per row kernel so fed (its producer: the value it
/// stored).
pub(super) fn merge_row_prologues(ctx: &Ctx, groups: &mut Groups, peak: &mut u64) -> Vec<Decision> {
    let g = ctx.g;
    let mut decisions = Vec::new();
    for mi in 0..groups.sets.len() {
        let Some((ri, x)) = row_feeding(ctx, groups, mi) else { continue };
        if ctx.opts.fused_attention && softmax_for_attention(ctx, &groups.sets[ri], x) {
            continue;
        }
        let union: BTreeSet<NodeId> = groups.sets[mi].union(&groups.sets[ri]).copied().collect();
        let outs: Vec<NodeId> = ctx.group_outputs(&groups.sets[mi], groups);
        if !ctx.gemv_row_prologue(&union, &outs) {
            continue;
        }
        let needed = ctx.bindings(&union, &outs);
        if needed > ctx.opts.max_bindings {
            decisions.push(Decision {
                producer: x,
                veto: Some(Veto::TooManyBindings { needed, limit: ctx.opts.max_bindings }),
            });
            continue;
        }
        let veto = super::siblings::merge_into(ctx, groups, (ri, mi), peak);
        debug_assert!(veto.is_some() || !ctx.stored(x, groups), "{:?} is still stored", g.node(x).op);
        decisions.push(Decision { producer: x, veto });
    }
    decisions
}

/// The row kernel feeding product kernel `mi` and the value it stores: `mi` holds products
/// and no reduction; their left operands come (below reshapes and casts in `mi`) from one
/// value `x`, not a graph output, that one other group alone computes — a group with a
/// reduction that stores `x` and nothing else, every user of `x` computed in `mi` alone.
fn row_feeding(ctx: &Ctx, groups: &Groups, mi: usize) -> Option<(usize, NodeId)> {
    let g = ctx.g;
    let set = &groups.sets[mi];
    let is = |n: &NodeId, f: &dyn Fn(&Op) -> bool| f(&g.node(*n).op);
    if !set.iter().any(|n| is(n, &|op| matches!(op, Op::MatMul)))
        || set.iter().any(|n| is(n, &|op| matches!(op, Op::Reduce { .. })))
    {
        return None;
    }
    let mut sources = set.iter().filter(|n| is(n, &|op| matches!(op, Op::MatMul))).map(|&p| {
        let mut n = ctx.operands(p)[0];
        while set.contains(&n) && matches!(g.node(n).op, Op::Reshape { .. } | Op::Cast { .. }) {
            n = ctx.operands(n)[0];
        }
        n
    });
    let x = sources.next()?;
    if sources.any(|s| s != x) || set.contains(&x) || ctx.output_set.contains(&x) {
        return None;
    }
    let [ri] = groups.of(x).collect::<Vec<_>>()[..] else { return None };
    let row = &groups.sets[ri];
    let only_here = ctx.users(x).iter().all(|&u| groups.of(u).all(|k| k == mi));
    let reduces = row.iter().any(|n| is(n, &|op| matches!(op, Op::Reduce { .. })));
    (reduces && only_here && ctx.group_outputs(row, groups) == [x]).then_some((ri, x))
}

/// Whether the row kernel of `members` storing `x` is a softmax whose probabilities feed their
/// weighted sum ([`crate::attention::softmax_rows`]): fused attention takes it.
fn softmax_for_attention(ctx: &Ctx, members: &BTreeSet<NodeId>, x: NodeId) -> bool {
    let Ok(kind @ KernelKind::Row { .. }) = ctx.analyze(members, &[x]) else { return false };
    let mut list: Vec<NodeId> = members.iter().copied().collect();
    list.sort_by_key(|&n| ctx.pos(n));
    let kernel = Kernel { kind, members: list, outputs: vec![x], inputs: Vec::new() };
    crate::attention::softmax_rows(ctx.g, &kernel).is_some()
}
