//! The fusion pass's tests: kernel counts first, then the decisions behind them.

use super::*;
use crate::testing::{random_graph, TestRng};

#[test]
fn ancestor_bits_agree_with_walking_the_graph() {
    let mut rng = TestRng::new(3);
    let opts = FusionOptions::default();
    let (mut reached, mut checks) = (0, 0);
    // Graphs past 64 and 128 nodes too: rows of several words, of different lengths.
    for k in 0..20 {
        let (g, outs) = random_graph(&mut rng, if k % 2 == 0 { 60 } else { 200 });
        let (with, order) = Ctx::new(&g, &outs, &[], &opts).expect("valid graph");
        let (mut walking, _) = Ctx::new(&g, &outs, &[], &opts).expect("valid graph");
        assert!(with.ancestors.is_some());
        walking.ancestors = None;
        for _ in 0..200 {
            let from = vec![order[rng.below(order.len())]];
            let targets: BTreeSet<NodeId> = (0..2).map(|_| order[rng.below(order.len())]).collect();
            let r = with.reaches_any(from.clone(), &targets);
            assert_eq!(r, walking.reaches_any(from, &targets));
            reached += r as usize;
            checks += 1;
        }
    }
    // Both answers occur, so the agreement means something.
    assert!(reached > checks / 10 && reached < checks * 9 / 10, "{reached} of {checks}");
}

/// Kahn's algorithm in its plain form, the reference for the root-order walk: every
/// kernel in a heap by rank once all its inputs are stored; the earliest kernel left when
/// none is ready.
fn heap_order(ctx: &Ctx, ks: &[&Summary]) -> Vec<usize> {
    let mut by_root: Vec<usize> = (0..ks.len()).collect();
    by_root.sort_unstable_by_key(|&i| (ks[i].root, i));
    let mut rank = vec![0; ks.len()];
    for (r, &i) in by_root.iter().enumerate() {
        rank[i] = r;
    }
    let mut waiting: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
    let mut missing = vec![0; ks.len()];
    for (i, k) in ks.iter().enumerate() {
        for &v in k.inputs.iter().filter(|v| !ctx.info[v.index()].leaf) {
            waiting.entry(v).or_default().push(i);
            missing[i] += 1;
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> =
        (0..ks.len()).filter(|&i| missing[i] == 0).map(|i| Reverse(rank[i])).collect();
    let mut taken = vec![false; ks.len()];
    let mut order = Vec::new();
    while order.len() < ks.len() {
        let i = match ready.pop() {
            Some(Reverse(r)) if !taken[by_root[r]] => by_root[r],
            Some(_) => continue,
            None => *by_root.iter().find(|&&i| !taken[i]).expect("a kernel remains"),
        };
        taken[i] = true;
        for o in &ks[i].outputs {
            for w in waiting.remove(o).unwrap_or_default() {
                missing[w] -= 1;
                if missing[w] == 0 {
                    ready.push(Reverse(rank[w]));
                }
            }
        }
        order.push(i);
    }
    order
}

#[test]
fn nothing_to_fuse_is_no_kernels() {
    let (g, _) = random_graph(&mut TestRng::new(1), 10);
    let f = fuse(&g, &[], &FusionOptions::default()).expect("no outputs is valid");
    assert!(f.kernels.is_empty() && f.log.is_empty() && f.siblings.is_empty());
}

#[test]
fn kernel_order_is_kahns() {
    // Random kernels over a random graph's values: roots anywhere (shared too), inputs
    // stored by kernels with later roots, by none, or by a kernel waiting for this one.
    let mut rng = TestRng::new(5);
    let opts = FusionOptions::default();
    let mut out_of_root_order = 0;
    for k in 0..200 {
        let (g, outs) = random_graph(&mut rng, 30 + k % 40);
        let (ctx, order) = Ctx::new(&g, &outs, &[], &opts).expect("valid graph");
        let n = 2 + rng.below(12);
        let ks: Vec<Summary> = (0..n)
            .map(|_| {
                let pick = |rng: &mut TestRng, count: usize| {
                    let mut v: Vec<NodeId> = (0..count).map(|_| order[rng.below(order.len())]).collect();
                    v.sort();
                    v.dedup();
                    v
                };
                let (o, i) = (1 + rng.below(3), rng.below(4));
                let (outputs, inputs) = (pick(&mut rng, o), pick(&mut rng, i));
                let inputs = inputs.into_iter().filter(|i| !outputs.contains(i)).collect();
                Summary { root: rng.below(order.len()), outputs, inputs, reduces: false }
            })
            .collect();
        let refs: Vec<&Summary> = ks.iter().collect();
        let got = ctx.order(&refs);
        let mut by_root: Vec<usize> = (0..n).collect();
        by_root.sort_by_key(|&i| (ks[i].root, i));
        out_of_root_order += usize::from(got != by_root);
        assert_eq!(got, heap_order(&ctx, &refs), "case {k}");
    }
    assert!(out_of_root_order > 50, "{out_of_root_order} of 200 cases leave root order");
}

#[test]
fn incremental_peak_agrees_with_the_sweep() {
    // Random groupings reached by the pass's own kinds of move (a producer into every
    // group of one user, duplicated or not; two groups merged, which makes kernels wait
    // for later roots, or for each other) on random graphs: after each, the peak kept up
    // to date must equal a sweep over freshly taken summaries.
    let mut rng = TestRng::new(11);
    let opts = FusionOptions::default();
    let (mut answered, mut swept) = (0, 0);
    for k in 0..24 {
        let (g, outs) = random_graph(&mut rng, if k % 2 == 0 { 40 } else { 120 });
        let (ctx, order) = Ctx::new(&g, &outs, &[], &opts).expect("valid graph");
        let (compute, mut groups) = Groups::of_each_op(&ctx, &order);
        for _ in 0..60 {
            let p = compute[rng.below(compute.len())];
            let users = ctx.users(p);
            if rng.below(12) == 0 {
                let (i, j) = (rng.below(groups.sets.len()), rng.below(groups.sets.len()));
                let moved: Vec<NodeId> = groups.sets[j].iter().copied().collect();
                if i != j && !groups.sets[i].is_empty() {
                    for m in moved {
                        groups.remove(j, m, ctx.operands(m));
                        groups.insert(i, m, ctx.operands(m));
                    }
                }
            } else if let Some(&u) = users.get(rng.below(users.len().max(1))) {
                let targets: Vec<usize> = groups.of(u).collect();
                let homes: Vec<usize> = groups.of(p).collect();
                if rng.below(2) == 0 {
                    for h in homes {
                        groups.remove(h, p, ctx.operands(p));
                    }
                }
                for t in targets {
                    groups.insert(t, p, ctx.operands(p));
                }
            }
            let peak = ctx.peak(&groups);
            let fresh: Vec<Option<Summary>> =
                groups.sets.iter().map(|gr| (!gr.is_empty()).then(|| ctx.summary(gr, &groups))).collect();
            assert_eq!(peak, ctx.swept_peak(&fresh), "graph {k}");
            match groups.live.borrow_mut().peak(&ctx.info) {
                Some(p) => {
                    assert_eq!(p, peak);
                    answered += 1;
                }
                None => swept += 1,
            }
        }
    }
    // Graph outputs no kernel touches (an input returned as it is) are live all along.
    let b = fusegraph_ir::GraphBuilder::new();
    let x = b.input("x", fusegraph_ir::DType::F32, vec![8, 8]).expect("valid input");
    let y = x.exp().expect("valid op");
    let g = b.graph();
    for outs in [vec![x.id()], vec![x.id(), y.id()]] {
        let (ctx, order) = Ctx::new(&g, &outs, &[], &opts).expect("valid graph");
        let (_, groups) = Groups::of_each_op(&ctx, &order);
        let peak = ctx.peak(&groups);
        assert_eq!(groups.live.borrow_mut().peak(&ctx.info), Some(peak));
        assert_eq!(peak, 256 * outs.len() as u64, "{outs:?}");
    }
    // Both paths are taken, the kept-up-to-date one often.
    assert!(answered > 400 && swept > 100, "{answered} answered, {swept} swept");
}
