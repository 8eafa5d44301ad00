//! Sibling products combined, device-free: which products join, that the rewritten graph
//! computes the same values as the original (the reference interpreter, random inputs, the
//! stacked parameters made of the same values), and that the fused plan has fewer kernels
//! and no more bytes.

use fusegraph_ir::{DType, Graph, GraphBuilder, HostTensor, NodeId, Op};
use fusegraph_passes::testing::TestRng;
use fusegraph_passes::{combine_products, plan_graph, simplify, Combined, PlanOptions};
use std::collections::{BTreeMap, BTreeSet};

type Tables = (BTreeMap<String, HostTensor>, BTreeMap<String, HostTensor>);

/// Random values in [-1, 1) for every input and parameter of `g`.
fn random_leaves(g: &Graph, seed: u64) -> Tables {
    let mut rng = TestRng::new(seed);
    let (mut feeds, mut params) = (BTreeMap::new(), BTreeMap::new());
    for id in g.node_ids() {
        let ty = g.ty(id);
        let values: Vec<f64> = (0..ty.shape.numel()).map(|_| (rng.below(1 << 16) as f64) / 32768.0 - 1.0).collect();
        let t = || HostTensor::from_f64(ty.dtype, ty.shape.clone(), &values).unwrap();
        match &g.node(id).op {
            Op::Input { name } => drop(feeds.insert(name.clone(), t())),
            Op::Parameter { name } => drop(params.insert(name.clone(), t())),
            _ => {}
        }
    }
    (feeds, params)
}

fn eval(g: &Graph, outs: &[NodeId], leaves: &Tables) -> Vec<HostTensor> {
    fusegraph_reference::evaluate(g, outs, &leaves.0, &leaves.1).unwrap()
}

/// `leaves` with each stacked parameter of `groups` made of its parts' values, in order.
fn stacked(leaves: &Tables, groups: &[Combined]) -> Tables {
    let mut params = leaves.1.clone();
    for j in groups.iter().flat_map(|c| std::iter::once(&c.weights).chain(&c.biases)) {
        let values: Vec<f64> = j.parts.iter().flat_map(|p| leaves.1[p].to_f64()).collect();
        let mut dims = vec![j.parts.len()];
        dims.extend_from_slice(j.part.shape.dims());
        params.insert(j.name.clone(), HostTensor::from_f64(j.part.dtype, dims, &values).unwrap());
    }
    (leaves.0.clone(), params)
}

fn matmuls(g: &Graph, outs: &[NodeId]) -> usize {
    g.reachable(outs).unwrap().into_iter().filter(|&id| matches!(g.node(id).op, Op::MatMul)).count()
}

/// Attention-style projections of one normalized input: three biased products, one with the
/// bias on the left (another group: alone, so left), one of another width, one of a weight a
/// training step updates, and one whose right operand is an input.
fn projections() -> (Graph, Vec<NodeId>) {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 5, 12]).unwrap();
    let h = x.tanh().unwrap().reshape([10, 12]).unwrap();
    let linear = |name: &str, n: usize| {
        let w = b.parameter(&format!("{name}.w"), DType::F32, [12, n]).unwrap();
        let bias = b.parameter(&format!("{name}.b"), DType::F32, [n]).unwrap();
        h.matmul(&w).unwrap().add(&bias.broadcast_to([10, n]).unwrap()).unwrap()
    };
    let (q, k, v) = (linear("q", 8), linear("k", 8), linear("v", 8));
    let narrow = linear("n", 4);
    let wl = b.parameter("l.w", DType::F32, [12, 4]).unwrap();
    let bl = b.parameter("l.b", DType::F32, [4]).unwrap();
    let left = bl.broadcast_to([10, 4]).unwrap().sub(&h.matmul(&wl).unwrap()).unwrap();
    let trained = h.matmul(&b.parameter("t.w", DType::F32, [12, 4]).unwrap()).unwrap();
    let fed = h.matmul(&b.input("m", DType::F32, [12, 4]).unwrap()).unwrap();
    let scores = q.matmul(&k.t().unwrap()).unwrap().exp().unwrap();
    let out = scores.matmul(&v).unwrap().sum(&[1], true).unwrap().broadcast_to([10, 4]).unwrap();
    let out = out.add(&left).unwrap().mul(&trained).unwrap().add(&fed).unwrap().add(&narrow).unwrap();
    (b.graph(), vec![out.id()])
}

fn updated(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn biased_projections_of_one_input_become_one_product() {
    let (g, outs) = projections();
    let leaves = random_leaves(&g, 7);
    let want = eval(&g, &outs, &leaves);
    let (mut c, couts) = (g.clone(), outs.clone());
    let groups = combine_products(&mut c, &couts, &updated(&["t.w"])).unwrap();
    fusegraph_ir::verify(&c).unwrap();
    assert_eq!(groups.len(), 1, "{groups:#?}");
    let group = &groups[0];
    assert_eq!(group.products.len(), 3);
    assert_eq!(group.weights.parts, ["q.w", "k.w", "v.w"]);
    assert_eq!(group.weights.name, "combined(q.w, k.w, v.w)");
    assert_eq!(group.biases.as_ref().unwrap().parts, ["q.b", "k.b", "v.b"]);
    assert_eq!(c.ty(group.product).shape.dims(), [3, 10, 8]);
    // The parts are gone from the graph; the stacks are parameters of their shapes.
    let params: BTreeMap<String, Vec<usize>> = c
        .node_ids()
        .into_iter()
        .filter_map(|id| match &c.node(id).op {
            Op::Parameter { name } => Some((name.clone(), c.ty(id).shape.dims().to_vec())),
            _ => None,
        })
        .collect();
    assert!(!params.contains_key("q.w") && !params.contains_key("v.b"));
    assert_eq!(params["combined(q.w, k.w, v.w)"], [3, 12, 8]);
    assert_eq!(params["combined(q.b, k.b, v.b)"], [3, 8]);
    // q·kᵀ and p·v, the combined product, the narrow, biased-left, updated and fed ones.
    assert_eq!(matmuls(&c, &couts), 7);
    assert_eq!(matmuls(&g, &outs), 9);
    // The same dot products, the same values, bit for bit.
    assert_eq!(eval(&c, &couts, &stacked(&leaves, &groups)), want);
}

#[test]
fn a_product_read_back_stays_apart() {
    // `k` as a graph output would be copied out of the stack by a kernel of its own: it
    // stays alone.
    let (mut g, mut outs) = projections();
    let k = g.node_ids().into_iter().find(|&id| {
        matches!(g.node(id).op, Op::Binary(_))
            && g.operands(id).iter().any(|&o| {
                matches!(g.node(o).op, Op::MatMul)
                    && matches!(&g.node(g.operands(o)[1]).op, Op::Parameter { name } if name == "k.w")
            })
    });
    outs.push(k.unwrap());
    let groups = combine_products(&mut g, &outs, &updated(&["t.w"])).unwrap();
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].weights.parts, ["q.w", "v.w"]);
}

#[test]
fn products_of_updated_weights_or_fed_operands_stay_apart() {
    let (g, outs) = projections();
    // Every projection's weight updated: nothing joins.
    let all = updated(&["q.w", "k.w", "v.w", "n.w", "l.w", "t.w"]);
    let (mut c, couts) = (g.clone(), outs.clone());
    assert!(combine_products(&mut c, &couts, &all).unwrap().is_empty());
    assert_eq!(c.len(), g.len());
    // Only a bias updated: `q`'s epilogue cannot stack, so `q` joins the plain products of
    // its width (`t`, whose weight is not updated here), and `k`, `v` join with their biases.
    let (mut c, couts) = (g.clone(), outs.clone());
    let groups = combine_products(&mut c, &couts, &updated(&["q.b"])).unwrap();
    let parts: Vec<Vec<String>> = groups.iter().map(|gr| gr.weights.parts.clone()).collect();
    assert_eq!(parts, [vec!["k.w", "v.w"]]);
    let leaves = random_leaves(&g, 11);
    assert_eq!(eval(&c, &couts, &stacked(&leaves, &groups)), eval(&g, &outs, &leaves));
}

#[test]
fn a_combined_view_can_lead_the_next_group_and_weights_keep_other_uses() {
    // h·A and h·B join; (h·A)·C and (h·A)·D join on the view that replaced h·A; B is also
    // added to the output, which then reads its part of the stack.
    let b = GraphBuilder::new();
    let h = b.input("h", DType::F32, [2, 3, 8]).unwrap();
    let w = |name: &str, k: usize, n: usize| b.parameter(name, DType::F32, [k, n]).unwrap();
    let wb = w("b", 8, 6);
    let a = h.matmul(&w("a", 8, 6)).unwrap();
    let bb = h.matmul(&wb).unwrap();
    let c = a.matmul(&w("c", 6, 4)).unwrap();
    let d = a.matmul(&w("d", 6, 4)).unwrap();
    let outs: Vec<NodeId> = vec![
        bb.exp().unwrap().sum(&[0, 1], false).unwrap().add(&wb.sum(&[0], false).unwrap()).unwrap().id(),
        c.exp().unwrap().id(),
        d.exp().unwrap().id(),
    ];
    let g = b.graph();
    let (mut cg, couts) = (g.clone(), outs.clone());
    let groups = combine_products(&mut cg, &couts, &BTreeSet::new()).unwrap();
    fusegraph_ir::verify(&cg).unwrap();
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[1].lhs, groups[0].slices[0]);
    assert_eq!(matmuls(&cg, &couts), 2);
    let leaves = random_leaves(&g, 3);
    assert_eq!(eval(&cg, &couts, &stacked(&leaves, &groups)), eval(&g, &outs, &leaves));
}

#[test]
fn a_stacked_weight_can_lead_the_next_group() {
    // h·A and h·B join, stacking A; A·C and A·D join on A's part of that stack.
    let b = GraphBuilder::new();
    let h = b.input("h", DType::F32, [5, 8]).unwrap();
    let w = |name: &str, n: usize| b.parameter(name, DType::F32, [8, n]).unwrap();
    let a = w("a", 8);
    let (ha, hb) = (h.matmul(&a).unwrap(), h.matmul(&w("b", 8)).unwrap());
    let (ac, ad) = (a.matmul(&w("c", 3)).unwrap(), a.matmul(&w("d", 3)).unwrap());
    let outs: Vec<NodeId> = [ha, hb, ac, ad].iter().map(|t| t.exp().unwrap().id()).collect();
    let g = b.graph();
    let mut cg = g.clone();
    let groups = combine_products(&mut cg, &outs, &BTreeSet::new()).unwrap();
    fusegraph_ir::verify(&cg).unwrap();
    assert_eq!(groups.len(), 2);
    assert_eq!(matmuls(&cg, &outs), 2);
    let leaves = random_leaves(&g, 5);
    assert_eq!(eval(&cg, &outs, &stacked(&leaves, &groups)), eval(&g, &outs, &leaves));
}

#[test]
fn the_fused_plan_has_fewer_kernels_and_no_more_bytes() {
    let (mut g, mut outs) = projections();
    simplify(&mut g, &mut outs).unwrap();
    let opts = PlanOptions::default();
    let plain = plan_graph(&g, &outs, &opts).unwrap();
    let (mut c, couts) = (g.clone(), outs.clone());
    let groups = combine_products(&mut c, &couts, &updated(&["t.w"])).unwrap();
    let combined = plan_graph(&c, &couts, &opts).unwrap();
    // Three product kernels became one, with the biases in its epilogue (and the bindings
    // that frees can let another fusion happen).
    assert!(combined.kernels.len() <= plain.kernels.len() - 2, "{:#?}", combined.kernels);
    let product = combined.kernels.iter().find(|k| k.members.contains(&groups[0].product)).unwrap();
    assert_eq!(product.members.iter().filter(|&&m| matches!(c.node(m).op, Op::Binary(_))).count(), 1);
    // The stacks hold the parts' bytes (with less alignment padding between them).
    assert!(combined.summary.persistent_bytes <= plain.summary.persistent_bytes);
    // The combined value lives until its last view is read: at most its bytes more.
    let held = c.ty(groups[0].product).buffer_bytes() as u64;
    assert!(combined.summary.arena_bytes <= plain.summary.arena_bytes + held);
    // The planner's summary combines as the runtime does.
    let with = PlanOptions { combine_products: true, ..Default::default() };
    assert_eq!(fusegraph_passes::plan_summary(&g, &outs, &with).unwrap().kernels, combined.kernels.len());
}

/// Three projections of `h: [rows, 16]`; `q` and `k` meet early, `v` is read at the end by
/// a kernel that also reads the large scores: the combined value, kept whole for `v`, is
/// live at the peak.
fn late_value(rows: usize) -> (Graph, Vec<NodeId>) {
    let b = GraphBuilder::new();
    let h = b.input("h", DType::F32, [rows, 16]).unwrap().tanh().unwrap();
    let p = |n: &str| h.matmul(&b.parameter(n, DType::F32, [16, 16]).unwrap()).unwrap();
    let (q, k, v) = (p("q"), p("k"), p("v"));
    let scores = q.matmul(&k.t().unwrap()).unwrap().exp().unwrap();
    let out = scores.matmul(&v).unwrap().add(&h).unwrap();
    (b.graph(), vec![out.id()])
}

#[test]
fn products_stay_apart_where_only_that_plan_fits_the_limit() {
    let (mut g, mut outs) = late_value(64);
    simplify(&mut g, &mut outs).unwrap();
    let opts = PlanOptions { combine_products: true, remat: false, ..Default::default() };
    let apart = plan_graph(&g, &outs, &PlanOptions { remat: false, ..Default::default() }).unwrap();
    let mut c = g.clone();
    let (combined, groups) = fusegraph_passes::plan_combined_within(&mut c, &outs, &opts, None).unwrap();
    assert_eq!(groups.len(), 1);
    // Here the combined value outlives the projections it replaced: its plan is larger.
    assert!(combined.summary.total_bytes > apart.summary.total_bytes);
    let limit = Some(apart.summary.total_bytes);
    let mut c = g.clone();
    let (within, groups) = fusegraph_passes::plan_combined_within(&mut c, &outs, &opts, limit).unwrap();
    assert!(groups.is_empty());
    assert_eq!(within.summary.total_bytes, apart.summary.total_bytes);
    assert_eq!(c.len(), g.len(), "the graph as it was");
    // A limit both fit keeps the combined graph.
    let limit = Some(combined.summary.total_bytes);
    let mut c = g.clone();
    assert_eq!(fusegraph_passes::plan_combined_within(&mut c, &outs, &opts, limit).unwrap().1.len(), 1);
}
