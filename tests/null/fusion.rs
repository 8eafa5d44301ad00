//! Fusion tests: kernel counts and vetoes, asserted without a device. The numbers of the
//! same composite graphs are checked against the reference on the device by
//! `device_ops::every_op_matches_the_reference_fused`.

use crate::common::{composite_builders, CaseBuilder, Domain};
use fusegraph::crates::passes::{
    combine_products, cost::CostModel, fuse, fuse_updating, mixed_precision::to_mixed_precision, simplify,
    FusionOptions, Kernel, KernelKind, Veto,
};
use fusegraph::{DType, Graph, NodeId};
use std::collections::BTreeSet;

fn options() -> FusionOptions {
    FusionOptions { max_bindings: 32, ..Default::default() }
}

fn composite(name: &str) -> (Graph, Vec<NodeId>) {
    let (_, build) = composite_builders().into_iter().find(|(n, _)| *n == name).expect("a composite of that name");
    let mut c = CaseBuilder::new(1);
    let outs = build(&mut c, DType::F32);
    let case = c.finish(name, &outs.iter().collect::<Vec<_>>());
    (case.graph, case.outputs)
}

fn kernels(g: &Graph, outs: &[NodeId]) -> Vec<Kernel> {
    fuse(g, outs, &options()).unwrap().kernels
}

fn is_row(k: &Kernel) -> bool {
    matches!(k.kind, KernelKind::Row { .. })
}

#[test]
fn kernel_counts_of_the_classic_patterns() {
    for (name, want) in [
        ("chain20", 1),
        ("softmax_last", 1),
        ("softmax_axis0", 1),
        ("softmax_short_rows", 1),
        ("log_softmax", 1),
        ("layer_norm", 1),
        ("layer_norm_gelu", 1),
        // The variance's (h - mean)² joins the row kernel with the variance (see
        // `pull_exclusive_operands`) rather than leaving four kernels.
        ("residual_layer_norm", 1),
        ("matmul_bias_relu", 1),
        ("gelu_relu_matmul_bias", 1),
        ("conv_bn_relu", 1),
        ("sibling_reductions", 1),
        ("reduce_all", 1),
        ("variance_keepdims_false", 1),
        // q·kᵀ (transpose prologue), softmax with its scale, then ·v.
        ("attention_scores", 3),
        ("shared_producer_two_consumers", 1),
    ] {
        let (g, outs) = composite(name);
        let ks = kernels(&g, &outs);
        assert_eq!(ks.len(), want, "{name}: {:#?}", ks);
    }
}

#[test]
fn row_patterns_use_row_kernels_over_any_axis() {
    for (name, axes) in [
        ("softmax_last", vec![1]),
        ("softmax_axis0", vec![0]),
        ("layer_norm", vec![1]),
        ("residual_layer_norm", vec![1]),
    ] {
        let (g, outs) = composite(name);
        let ks = kernels(&g, &outs);
        match &ks[0].kind {
            KernelKind::Row { axes: a, .. } => assert_eq!(a, &axes, "{name}"),
            other => panic!("{name} is not a row kernel: {other:?}"),
        }
    }
}

#[test]
fn matmul_epilogue_is_a_loop_kernel_with_the_matmul_inside() {
    let (g, outs) = composite("gelu_relu_matmul_bias");
    let ks = kernels(&g, &outs);
    assert!(!is_row(&ks[0]));
    assert!(ks[0].members.iter().any(|&m| g.node(m).op == fusegraph::Op::MatMul));
}

#[test]
fn conv_with_folded_batch_norm_and_relu_is_one_kernel_per_run() {
    // Constant statistics and weights, as in an exported inference model: folding moves the
    // normalization into the weights and a bias, leaving conv + bias + relu.
    let mut c = CaseBuilder::new(3);
    let x = c.input(DType::F32, &[1, 3, 8, 8], Domain::Any);
    let b = c.b.clone();
    let w = b
        .constant(DType::F32, [4, 3, 3, 3], &(0..108).map(|i| (i % 7) as f64 * 0.1 - 0.3).collect::<Vec<_>>())
        .unwrap();
    let v = |vals: [f64; 4]| b.constant(DType::F32, [4], &vals).unwrap();
    let (mean, var, gamma, beta) =
        (v([0.1, 0.2, -0.1, 0.0]), v([1.0, 2.0, 0.5, 1.5]), v([1.0, 0.5, 2.0, 1.0]), v([0.0, 0.1, 0.2, 0.3]));
    let y = x
        .conv2d(&w, [1, 1], [1, 1], [1, 1], 1)
        .unwrap()
        .batch_norm(&mean, &var, &gamma, &beta, 1e-5, 1)
        .unwrap()
        .relu()
        .unwrap();
    let mut g = c.b.graph();
    let mut outs = vec![y.id()];
    let stats = simplify(&mut g, &mut outs).unwrap();
    assert_eq!(stats.bn_folded, 1);
    let ks = kernels(&g, &outs);
    assert_eq!(ks.len(), 1, "{ks:#?}");
}

fn veto_of(g: &Graph, outs: &[NodeId], producer: NodeId, opts: &FusionOptions) -> Option<Veto> {
    let f = fuse(g, outs, opts).unwrap();
    f.log.iter().find(|d| d.producer == producer).and_then(|d| d.veto.clone())
}

/// A graph output read by one other kernel joins it, which stores both (multi-output
/// fusion: an optimizer's new moments, stored and read by the new weights); one read by two
/// kernels stays in its own kernel (stored once, never recomputed). A product's kernel stores
/// one value, and an output computed from a product is stored by its epilogue.
#[test]
fn veto_graph_output() {
    let mut c = CaseBuilder::new(1);
    let x = c.input(DType::F32, &[16, 16], Domain::Any);
    let w = c.input(DType::F32, &[16, 16], Domain::Any);
    let e = x.exp().unwrap();
    let y = e.neg().unwrap();
    let g = c.b.graph();
    assert_eq!(veto_of(&g, &[e.id(), y.id()], e.id(), &options()), None);
    let ks = kernels(&g, &[e.id(), y.id()]);
    assert_eq!(ks.len(), 1, "{ks:#?}");
    assert_eq!(ks[0].outputs.iter().collect::<BTreeSet<_>>(), BTreeSet::from([&e.id(), &y.id()]));
    // Read by two kernels: `y`'s and a reduction's over columns.
    let s = e.sum(&[0], false).unwrap();
    let g = c.b.graph();
    assert_eq!(veto_of(&g, &[e.id(), y.id(), s.id()], e.id(), &options()), Some(Veto::GraphOutput));
    // A product that is an output, read by one kernel: that kernel would store two values.
    let m = x.matmul(&w).unwrap();
    let t = m.tanh().unwrap();
    let g = c.b.graph();
    assert_eq!(veto_of(&g, &[m.id(), t.id()], m.id(), &options()), Some(Veto::SecondOutput));
    // An output computed from a product (which nothing else reads) is its epilogue, not a
    // member of its consumer's kernel: the product's value is never stored.
    let u = t.neg().unwrap();
    let g = c.b.graph();
    assert_eq!(veto_of(&g, &[t.id(), u.id()], t.id(), &options()), Some(Veto::EpilogueInstead { kernels: 1 }));
    let ks = kernels(&g, &[t.id(), u.id()]);
    assert_eq!(ks.len(), 2, "{ks:#?}");
    assert!(ks.iter().all(|k| k.outputs.len() == 1), "{ks:#?}");
}

#[test]
fn veto_reduction_into_reduction() {
    let mut c = CaseBuilder::new(1);
    let x = c.input(DType::F32, &[50, 60], Domain::Any);
    let s1 = x.sum(&[1], false).unwrap();
    let s2 = s1.sum(&[0], false).unwrap();
    let g = c.b.graph();
    assert_eq!(veto_of(&g, &[s2.id()], s1.id(), &options()), Some(Veto::ReductionIntoReduction));
    assert_eq!(kernels(&g, &[s2.id()]).len(), 2);
}

#[test]
fn veto_duplicating_an_expensive_producer() {
    let mut c = CaseBuilder::new(1);
    let a = c.input(DType::F32, &[8, 8], Domain::Any);
    let m = a.matmul(&a).unwrap();
    let y1 = m.sum(&[0], false).unwrap();
    let y2 = m.sum(&[1], false).unwrap();
    let g = c.b.graph();
    assert_eq!(veto_of(&g, &[y1.id(), y2.id()], m.id(), &options()), Some(Veto::DuplicatesExpensive));
}

/// `eq(x, max(x))` (a max reduction's gradient) holds for the maximum only where both
/// sides see the same bits of `x`: `x` is stored once rather than recomputed in the kernels
/// of the maximum and of the comparison (a transpose between them copies bits and still
/// fuses). A comparison with an unrelated value (relu's gradient) leaves its operand free.
#[test]
fn veto_recomputing_a_value_compared_with_itself() {
    let mut c = CaseBuilder::new(1);
    let a = c.input(DType::F32, &[8, 8], Domain::Any);
    let x = a.exp().unwrap();
    let t = x.t().unwrap();
    let m = t.max(&[0], true).unwrap();
    let hit = t.eq(&m.broadcast_to(vec![8, 8]).unwrap()).unwrap();
    let relu_mask = x.gt(&c.b.scalar(DType::F32, 0.0).unwrap().broadcast_to(vec![8, 8]).unwrap()).unwrap();
    let g = c.b.graph();
    let outs = [hit.id(), relu_mask.id()];
    assert_eq!(veto_of(&g, &outs, x.id(), &options()), Some(Veto::ComparedWithItself));
    assert_eq!(veto_of(&g, &outs, t.id(), &options()), None);
    let e = x.exp().unwrap();
    let only_relu = e.gt(&c.b.scalar(DType::F32, 0.0).unwrap().broadcast_to(vec![8, 8]).unwrap()).unwrap();
    let g = c.b.graph();
    assert_eq!(veto_of(&g, &[only_relu.id()], e.id(), &options()), None);
}

#[test]
fn veto_arithmetic_in_a_matmul_prologue() {
    let mut c = CaseBuilder::new(1);
    let a = c.input(DType::F32, &[8, 8], Domain::Any);
    let e = a.exp().unwrap();
    let m = e.matmul(&a).unwrap();
    let g = c.b.graph();
    assert_eq!(veto_of(&g, &[m.id()], e.id(), &options()), Some(Veto::Prologue));
    // Data movement (a transpose) does fuse into the prologue.
    let t = a.t().unwrap();
    let m2 = t.matmul(&a).unwrap();
    let g = c.b.graph();
    assert_eq!(veto_of(&g, &[m2.id()], t.id(), &options()), None);
}

#[test]
fn veto_too_many_bindings() {
    let mut c = CaseBuilder::new(1);
    let mut y = c.input(DType::F32, &[10], Domain::Any);
    for _ in 0..6 {
        y = y.add(&c.input(DType::F32, &[10], Domain::Any)).unwrap();
    }
    let g = c.b.graph();
    let opts = FusionOptions { max_bindings: 4, ..Default::default() };
    let f = fuse(&g, &[y.id()], &opts).unwrap();
    assert!(f.log.iter().any(|d| matches!(d.veto, Some(Veto::TooManyBindings { limit: 4, .. }))), "{:?}", f.log);
    for k in &f.kernels {
        assert!(k.inputs.len() + k.outputs.len() <= 4);
    }
}

#[test]
fn veto_peak_memory_rise() {
    // A cast to f16 fused into a late consumer would keep its f32 input alive across the
    // middle of the graph instead of the half-size f16 value.
    let n = 4096;
    let mut c = CaseBuilder::new(1);
    let x = c.input(DType::F32, &[n], Domain::Any);
    let z = c.input(DType::F32, &[n], Domain::Any);
    let h = x.cast(DType::F16).unwrap();
    let mid = z.exp().unwrap();
    let out = h.add(&mid.neg().unwrap().cast(DType::F16).unwrap()).unwrap();
    let g = c.b.graph();
    match veto_of(&g, &[mid.id(), out.id()], h.id(), &options()) {
        Some(Veto::PeakMemory { before, after }) => assert!(after > before),
        other => panic!("expected a peak-memory veto, got {other:?}"),
    }
    // Without the memory veto the cast fuses.
    let unaware = FusionOptions { memory_aware: false, ..options() };
    assert_eq!(veto_of(&g, &[mid.id(), out.id()], h.id(), &unaware), None);
}

#[test]
fn veto_no_benefit_under_a_cost_model_that_makes_dispatch_free() {
    let mut c = CaseBuilder::new(1);
    let x = c.input(DType::F32, &[1000], Domain::Any);
    let e = x.exp().unwrap();
    let y = e.broadcast_to([1000, 1000]).unwrap().add_scalar(1.0).unwrap();
    let g = c.b.graph();
    let free = FusionOptions { cost: CostModel { dispatch_s: 0.0, bandwidth: 1e30, flops: 1e9 }, ..options() };
    assert_eq!(veto_of(&g, &[y.id()], e.id(), &free), Some(Veto::NoBenefit));
    assert_eq!(veto_of(&g, &[y.id()], e.id(), &options()), None);
}

#[test]
fn veto_cycle_between_siblings() {
    // a = exp(x) and b = x·a share the input x, but b reads a: merging them would make the
    // kernel depend on itself. (`a`, an output read by `b` and by a product, is stored by a
    // kernel of its own.)
    let mut c = CaseBuilder::new(1);
    let x = c.input(DType::F32, &[8, 8], Domain::Any);
    let w = c.input(DType::F32, &[8, 8], Domain::Any);
    let a = x.exp().unwrap();
    let b = x.mul(&a).unwrap();
    let p = a.matmul(&w).unwrap();
    let g = c.b.graph();
    let f = fuse(&g, &[a.id(), b.id(), p.id()], &options()).unwrap();
    assert_eq!(f.kernels.len(), 3);
    assert!(f.siblings.iter().any(|d| d.veto == Some(Veto::Cycle)), "{:?}", f.siblings);
}

/// Sibling kernels that both recompute a constant which the kernel storing a value they
/// read computes too do not depend on each other through it: each computes the constant
/// itself. (An Adam step's weight updates recompute `1.0` as the step counter's `t + 1`
/// does; taken as a dependency, it would keep them in separate kernels, one per weight.)
#[test]
fn siblings_recomputing_a_shared_constant_merge() {
    let mut c = CaseBuilder::new(1);
    let t = c.input(DType::F32, &[], Domain::Any);
    let x = c.input(DType::F32, &[64], Domain::Any);
    let y = c.input(DType::F32, &[64], Domain::Any);
    let one = c.b.scalar(DType::F32, 1.0).unwrap();
    let t1 = t.add(&one).unwrap();
    let scale = t1.mul(&one).unwrap().broadcast_to([64]).unwrap();
    let u = x.mul(&scale).unwrap().add(&one.broadcast_to([64]).unwrap()).unwrap();
    let v = y.mul(&scale).unwrap().sub(&one.broadcast_to([64]).unwrap()).unwrap();
    let g = c.b.graph();
    // (Merged, `x` and `y` would live together: no peak check in a graph this small.)
    let opts = FusionOptions { memory_aware: false, ..options() };
    let f = fuse(&g, &[t1.id(), u.id(), v.id()], &opts).unwrap();
    assert_eq!(f.kernels.len(), 2, "{:#?}\n{:?}", f.kernels, f.siblings);
    assert!(f.siblings.iter().any(|d| (d.a, d.b) == (u.id(), v.id()) && d.veto.is_none()), "{:?}", f.siblings);
}

/// Parameter updates are written over their parameters by loop kernels, so the peak check
/// does not count them there; a row kernel cannot write them in place, so an update merged
/// into one (a weight's momentum step beside a bias gradient's column sum) is counted, and
/// that merge, which would give both new values arena bytes, is refused. (Counted nowhere,
/// `train_mlp`'s weight updates would join its bias gradients' row kernel: arena +32%.)
#[test]
fn updates_stay_in_place_out_of_row_kernels() {
    let mut c = CaseBuilder::new(1);
    let w = c.input(DType::F32, &[256, 256], Domain::Any);
    let mw = c.input(DType::F32, &[256, 256], Domain::Any);
    let gw = c.input(DType::F32, &[256, 256], Domain::Any);
    let b = c.input(DType::F32, &[256], Domain::Any);
    let mb = c.input(DType::F32, &[256], Domain::Any);
    let dy = c.input(DType::F32, &[256, 256], Domain::Any);
    // One momentum and one step size for both (a shared constant makes them siblings).
    let (nine, tenth) = (c.b.scalar(DType::F32, 0.9).unwrap(), c.b.scalar(DType::F32, 0.1).unwrap());
    let scaled = |t: &fusegraph::Tensor, k: &fusegraph::Tensor| t.mul(&k.broadcast_to(t.dims()).unwrap()).unwrap();
    let mw1 = scaled(&mw, &nine).add(&gw).unwrap();
    let w1 = w.sub(&scaled(&mw1, &tenth)).unwrap();
    let mb1 = scaled(&mb, &nine).add(&dy.sum(&[0], false).unwrap()).unwrap();
    let b1 = b.sub(&scaled(&mb1, &tenth)).unwrap();
    let g = c.b.graph();
    let outs = [w1.id(), mw1.id(), b1.id(), mb1.id()];
    let f = fuse_updating(&g, &outs, &outs, &options()).unwrap();
    let storing = |v: NodeId| f.kernels.iter().find(|k| k.outputs.contains(&v)).unwrap();
    assert!(matches!(storing(w1.id()).kind, KernelKind::Loop), "{:#?}", f.kernels);
    assert!(storing(w1.id()).outputs.contains(&mw1.id()), "{:#?}", f.kernels);
    assert!(matches!(storing(b1.id()).kind, KernelKind::Row { .. }), "{:#?}", f.kernels);
    assert!(f.siblings.iter().any(|d| matches!(d.veto, Some(Veto::PeakMemory { .. }))), "{:?}", f.siblings);
}

/// Two reductions of one input over different rows cannot share a row kernel; a loop
/// kernel could hold both, each output element summing its row serially in one invocation.
/// That is kept for short rows, refused for long ones: one thread per output of a long
/// reduction starves a GPU, and CPU adapters cut loops short (`CPU_LOOP_BUDGET`).
#[test]
fn long_reductions_of_different_rows_stay_row_kernels() {
    for (rows, long) in [(256, true), (16, false)] {
        let mut c = CaseBuilder::new(1);
        let x = c.input(DType::F32, &[rows, 8], Domain::Any);
        let down = x.exp().unwrap().sum(&[0], false).unwrap();
        let across = x.tanh().unwrap().sum(&[1], false).unwrap();
        let g = c.b.graph();
        let f = fuse(&g, &[down.id(), across.id()], &options()).unwrap();
        let merged = f.siblings.iter().any(|d| d.veto.is_none());
        assert_eq!(merged, !long, "{rows} rows: {:?}", f.siblings);
        if long {
            assert_eq!(f.kernels.len(), 2);
            assert!(f.kernels.iter().filter(|k| k.members.contains(&down.id())).all(is_row), "{:#?}", f.kernels);
        }
    }
}

#[test]
fn fusion_off_is_one_kernel_per_op() {
    let (g, outs) = composite("chain20");
    let ks = fusegraph::crates::passes::partition(&g, &outs, fusegraph::FusionMode::Off).unwrap();
    let ops = g
        .reachable(&outs)
        .unwrap()
        .into_iter()
        .filter(|&n| !matches!(g.node(n).op, fusegraph::Op::Input { .. }))
        .count();
    assert_eq!(ks.len(), ops);
}

#[test]
fn veto_a_second_contraction_in_one_kernel() {
    // A residual block's shortcut: conv(x) + conv1x1(x). Each convolution keeps its own
    // tiled kernel; the add joins one of them.
    let mut c = CaseBuilder::new(1);
    let x = c.input(DType::F32, &[1, 4, 8, 8], Domain::Any);
    let w1 = c.input(DType::F32, &[8, 4, 3, 3], Domain::Any);
    let w2 = c.input(DType::F32, &[8, 4, 1, 1], Domain::Any);
    let a = x.conv2d(&w1, [1, 1], [1, 1], [1, 1], 1).unwrap();
    let s = x.conv2d(&w2, [1, 1], [0, 0], [1, 1], 1).unwrap();
    let y = a.add(&s).unwrap();
    let g = c.b.graph();
    let f = fuse(&g, &[y.id()], &options()).unwrap();
    assert_eq!(f.kernels.len(), 2);
    assert!(f.log.iter().any(|d| d.veto == Some(Veto::SecondContraction)), "{:?}", f.log);
}

/// A residual add after a projection, `x + (a·w + b)`, read by two kernels (a layer norm and
/// the next residual add): it is stored once by the projection's epilogue rather than
/// recomputed in both, which would read `x` twice and save no dispatch. Fed by anything but
/// a contraction, the same add is still recomputed.
#[test]
fn veto_recomputing_what_a_contraction_epilogue_can_store() {
    let mut c = CaseBuilder::new(1);
    let x = c.input(DType::F32, &[8, 16], Domain::Any);
    let a = c.input(DType::F32, &[8, 16], Domain::Any);
    let w = c.input(DType::F32, &[16, 16], Domain::Any);
    let b = c.input(DType::F32, &[16], Domain::Any);
    let z = c.input(DType::F32, &[8, 16], Domain::Any);
    let projected = a.matmul(&w).unwrap().add(&b.broadcast_to([8, 16]).unwrap()).unwrap();
    let h = x.add(&projected).unwrap();
    let normed = h.layer_norm(&[1], 1e-5).unwrap();
    let next = h.add(&z).unwrap().exp().unwrap();
    let g = c.b.graph();
    let outs = [normed.id(), next.id()];
    assert_eq!(veto_of(&g, &outs, h.id(), &options()), Some(Veto::EpilogueInstead { kernels: 2 }));
    let ks = kernels(&g, &outs);
    let mm = ks.iter().find(|k| k.members.iter().any(|&m| matches!(g.node(m).op, fusegraph::Op::MatMul))).unwrap();
    assert_eq!(mm.outputs, [h.id()], "the projection's kernel stores the residual sum: {ks:#?}");
    // The layer norm and `exp(h + z)` read `h` and merge as siblings into one row kernel.
    assert_eq!(ks.len(), 2, "{ks:#?}");
    // Where the projection cannot take the epilogue (here: too few bindings for `a`, `w`,
    // `b`, `x` and the result), the add is judged again and recomputed after all.
    let narrow = FusionOptions { max_bindings: 4, memory_aware: false, ..options() };
    let f = fuse(&g, &outs, &narrow).unwrap();
    assert!(f.log.iter().all(|d| !matches!(d.veto, Some(Veto::EpilogueInstead { .. }))), "{:?}", f.log);
    assert!(f.kernels.iter().all(|k| !k.outputs.contains(&h.id())), "{:#?}", f.kernels);
    // The same add of an elementwise value is recomputed in both kernels (memory veto off:
    // at these sizes the longer-lived `x` and `exp(a)` raise the peak).
    let unaware = FusionOptions { memory_aware: false, ..options() };
    assert_eq!(veto_of(&g, &outs, h.id(), &unaware), Some(Veto::EpilogueInstead { kernels: 2 }));
    let e = a.exp().unwrap();
    let h2 = x.add(&e).unwrap();
    let normed2 = h2.layer_norm(&[1], 1e-5).unwrap();
    let next2 = h2.add(&z).unwrap().exp().unwrap();
    let g = c.b.graph();
    assert_eq!(veto_of(&g, &[normed2.id(), next2.id()], h2.id(), &unaware), None);
}

/// Under a cost model where a dispatch costs as much as moving ~90 KB (lavapipe's measured
/// one), recomputing the residual sums would have each layer norm of a deep transformer
/// re-add the whole residual stream from the embedding on: its kernel would grow by a
/// layer's adds per layer and every projection would stay alive to the last layer. Stored by
/// the projections' epilogues, no kernel grows with depth.
#[test]
fn no_kernel_grows_with_the_model_depth() {
    let lavapipe_like =
        FusionOptions { cost: CostModel { dispatch_s: 17e-6, bandwidth: 5.3e9, flops: 53e9 }, ..options() };
    for opts in [options(), lavapipe_like] {
        let largest = |layers: usize| {
            let w = fusegraph_workloads::transformer(16, layers, true).unwrap();
            let (mut g, mut outs) = (w.graph.clone(), w.outputs.clone());
            simplify(&mut g, &mut outs).unwrap();
            let ks = fuse(&g, &outs, &opts).unwrap().kernels;
            (ks.iter().map(|k| k.members.len()).max().unwrap(), ks.len())
        };
        let (two, k2) = largest(2);
        let (six, k6) = largest(6);
        assert!(k6 > k2);
        assert_eq!(six, two, "{:?}: largest kernel at 2 and 6 layers", opts.cost);
    }
}

#[test]
fn kernels_never_wait_on_each_other_through_a_merged_kernel() {
    // Cut down from the gradient graph of `fuzz_device`'s seed 24 (the combined products'
    // stacks left in): `Σ x1` and `max(x0 − mean, x1)` share `x1` and merge into one kernel;
    // the kernel centring `x0` and one reducing rows of `x1` share the broadcast 1/8.
    // Merging those two as well would make a cycle through the first merge, though no node
    // path joins them: on the device a gradient would be read before it is written (wrong
    // values that change from run to run).
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/kernel_cycle.ir")).unwrap();
    let mut g = fusegraph::text::parse(&text).unwrap();
    let mut outs: Vec<NodeId> = g.node_ids().into_iter().filter(|&n| g.users(n).is_empty()).collect();
    simplify(&mut g, &mut outs).unwrap();
    let f = fuse(&g, &outs, &options()).unwrap();
    assert_inputs_stored_first(&g, &f.kernels, "kernel_cycle.ir");
    assert!(f.siblings.iter().any(|d| d.veto == Some(Veto::Cycle)));
}

/// Two training steps from `tests/fuzz_device.rs` (seeds 379 and 285, in the text form with
/// their updates) whose fusion can make kernels wait on each other, both through a value a
/// duplicated user reads: fused as the runtime fuses them, every kernel's inputs are stored
/// before it runs.
///
/// - `duplicated_user.ir`: `exp(tanh(·))` and its user `+` are computed in one kernel and
///   the `+` again in another, which reads `exp(…)` from memory; the first kernel must store
///   it, though its only user is inside it.
/// - `pulled_operand.ir` (in mixed precision): a centred value is pulled into a kernel after
///   a peak veto (`pull_exclusive_operands`) only where that kernel alone computes its users;
///   a user also computed in a kernel that the first reads from would read it from memory.
#[test]
fn duplicated_users_never_make_kernels_wait_on_each_other() {
    for (file, mixed) in [("duplicated_user.ir", false), ("pulled_operand.ir", true)] {
        let path = format!("{}/tests/data/{file}", env!("CARGO_MANIFEST_DIR"));
        let p = fusegraph::text::parse_program(&std::fs::read_to_string(path).unwrap()).unwrap();
        let updated: BTreeSet<String> = p.updates.iter().map(|(n, _)| n.clone()).collect();
        let (mut g, mut kept) = (p.graph.clone(), p.kept());
        if mixed {
            (g, kept) = to_mixed_precision(&p.graph, &kept, &updated).unwrap();
        }
        simplify(&mut g, &mut kept).unwrap();
        combine_products(&mut g, &kept, &updated).unwrap();
        let values = kept[p.outputs.len()..].to_vec();
        let f = fuse_updating(&g, &kept, &values, &options()).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_inputs_stored_first(&g, &f.kernels, file);
    }
}

/// Every kernel's inputs, in run order, are leaves or stored by an earlier kernel.
fn assert_inputs_stored_first(g: &Graph, kernels: &[Kernel], what: &str) {
    let mut stored = BTreeSet::new();
    for (i, k) in kernels.iter().enumerate() {
        for v in &k.inputs {
            let leaf = matches!(g.node(*v).op, fusegraph::Op::Input { .. } | fusegraph::Op::Parameter { .. });
            assert!(leaf || stored.contains(v), "{what}: kernel {i} reads %{} before any kernel stores it", v.index());
        }
        stored.extend(k.outputs.iter().copied());
    }
}

/// With `gemv` (a GPU's matrix–vector kernel), products of one input of at most
/// `GEMV_MAX_ROWS` rows merge into one kernel storing each, their epilogues with them; a
/// product of more rows, one of another input, and a product reading another's result do
/// not; without it every product keeps a kernel of its own.
#[test]
fn sibling_products_of_few_rows_merge_for_the_matrix_vector_kernel() {
    use fusegraph::crates::passes::GEMV_MAX_ROWS;
    let build = |rows: usize| {
        let mut c = CaseBuilder::new(3);
        let x = c.input(DType::F32, &[rows, 64], Domain::Any);
        let other = c.input(DType::F32, &[rows, 64], Domain::Any);
        let w = |c: &mut CaseBuilder, n: usize| c.input(DType::F32, &[64, n], Domain::Any);
        let (wq, wk, wv, wo, wz) = (w(&mut c, 64), w(&mut c, 32), w(&mut c, 32), w(&mut c, 16), w(&mut c, 8));
        let bias = c.input(DType::F32, &[64], Domain::Any);
        let q = x.matmul(&wq).unwrap().add(&bias).unwrap();
        let k = x.matmul(&wk).unwrap();
        let v = x.matmul(&wv).unwrap().relu().unwrap();
        let o = other.matmul(&wo).unwrap();
        // Reads q's product: after it, never beside it.
        let z = q.matmul(&wz.reshape([64, 8]).unwrap()).unwrap();
        let case = c.finish("siblings", &[&q, &k, &v, &o, &z]);
        (case.graph, case.outputs)
    };
    let count = |k: &Kernel, g: &Graph| k.members.iter().filter(|&&m| g.node(m).op.name() == "matmul").count();
    let gemv = FusionOptions { gemv: true, ..options() };
    let (g, outs) = build(2);
    let merged = fuse(&g, &outs, &gemv).unwrap().kernels;
    let products: Vec<usize> = merged.iter().map(|k| count(k, &g)).filter(|&c| c > 0).collect();
    assert_eq!(merged.len(), 3, "{merged:?}");
    assert!(products.contains(&3) && products.iter().filter(|&&c| c == 1).count() == 2, "{products:?}");
    let three = merged.iter().find(|k| count(k, &g) == 3).unwrap();
    assert_eq!(three.outputs.len(), 3);
    assert_eq!(fuse(&g, &outs, &options()).unwrap().kernels.len(), 5);
    let (g, outs) = build(GEMV_MAX_ROWS + 1);
    assert_eq!(fuse(&g, &outs, &gemv).unwrap().kernels.len(), 5);
}

/// With `gemv`, a layer norm whose output only feeds products of a few rows (q, k and v of
/// one input, merged as siblings) joins their kernel as its prologue: one kernel, storing
/// the three products and not the normalized rows; so does a softmax feeding each head's
/// weighted sum. Not where the rows would not fit the kernel's stage, not where another
/// kernel reads the norm's output, not without `gemv`; into a head whose argmax follows.
#[test]
fn a_layer_norm_feeding_products_of_few_rows_joins_their_matrix_vector_kernel() {
    use fusegraph::crates::passes::{gemv_prologue_bytes, GEMV_STAGE_BYTES};
    let build = |rows: usize, k: usize, read_elsewhere: bool| {
        let mut c = CaseBuilder::new(5);
        let x = c.input(DType::F32, &[rows, k], Domain::Any);
        let gamma = c.input(DType::F32, &[k], Domain::Any);
        let beta = c.input(DType::F32, &[k], Domain::Any);
        let w = |c: &mut CaseBuilder, n: usize| c.input(DType::F32, &[k, n], Domain::Any);
        let (wq, wk, wv) = (w(&mut c, 64), w(&mut c, 32), w(&mut c, 32));
        // Normalized as `[rows, 1, k]` and read as `[rows, k]`, as GPT-2's blocks do.
        let x = x.reshape([rows, 1, k]).unwrap();
        let h = x.layer_norm(&[2], 1e-5).unwrap().mul(&gamma).unwrap().add(&beta).unwrap();
        let h = h.reshape([rows, k]).unwrap();
        let q = h.matmul(&wq).unwrap().add(&c.input(DType::F32, &[64], Domain::Any)).unwrap();
        let kk = h.matmul(&wk).unwrap();
        let v = h.matmul(&wv).unwrap();
        let other = h.exp().unwrap().sum(&[1], false).unwrap();
        let outs: Vec<&fusegraph::Tensor> = if read_elsewhere { vec![&q, &kk, &v, &other] } else { vec![&q, &kk, &v] };
        let case = c.finish("prologue", &outs);
        (case.graph, case.outputs)
    };
    let has = |g: &Graph, k: &Kernel, name: &str| k.members.iter().any(|&m| g.node(m).op.name() == name);
    let prologue_kernels =
        |g: &Graph, ks: &[Kernel]| ks.iter().filter(|k| has(g, k, "reduce") && has(g, k, "matmul")).count();
    let gemv = FusionOptions { gemv: true, ..options() };
    for (rows, k) in [(1, 64), (2, 768)] {
        let (g, outs) = build(rows, k, false);
        let f = fuse(&g, &outs, &gemv).unwrap();
        assert_eq!(f.kernels.len(), 1, "{rows}×{k}: {:?}", f.kernels);
        assert_eq!(f.kernels[0].outputs, outs, "{rows}×{k}: only the products are stored");
        assert!(f.log.iter().any(|d| d.veto.is_none() && g.node(d.producer).op.name() == "add"), "{:?}", f.log);
        let unfused = fuse(&g, &outs, &options()).unwrap().kernels;
        assert_eq!(prologue_kernels(&g, &unfused), 0, "{unfused:?}");
        assert_eq!(unfused.len(), 4, "a row kernel and a kernel per product: {unfused:?}");
    }
    // Three rows of 768 with a layer norm's two reductions pass the stage.
    assert!(gemv_prologue_bytes(3, 768, 2, 1, false).unwrap() > GEMV_STAGE_BYTES);
    let (g, outs) = build(3, 768, false);
    assert_eq!(prologue_kernels(&g, &fuse(&g, &outs, &gemv).unwrap().kernels), 0);
    // An adapter with more workgroup memory (lavapipe's 32 KiB, an NVIDIA GPU's 48 KiB) holds them.
    let roomy = FusionOptions { gemv_stage_bytes: 32768, ..gemv };
    assert_eq!(prologue_kernels(&g, &fuse(&g, &outs, &roomy).unwrap().kernels), 1);
    let (g, outs) = build(1, 64, true);
    assert_eq!(prologue_kernels(&g, &fuse(&g, &outs, &gemv).unwrap().kernels), 0);
    // A head and its argmax: the argmax is a row kernel of its own (it never joins the
    // product's kernel), so the norm joins the head's.
    let mut c = CaseBuilder::new(7);
    let x = c.input(DType::F32, &[1, 64], Domain::Any);
    let w = c.input(DType::F32, &[64, 300], Domain::Any);
    let ids = x.layer_norm(&[1], 1e-5).unwrap().matmul(&w).unwrap().argmax(1, false).unwrap();
    let case = c.finish("head", &[&ids]);
    let kernels = fuse(&case.graph, &case.outputs, &gemv).unwrap().kernels;
    assert_eq!((kernels.len(), prologue_kernels(&case.graph, &kernels)), (2, 1), "{kernels:?}");
    // Four heads' softmax feeding their weighted sums, a batched product of one row per head:
    // each workgroup stages its head's row, so the softmax joins too.
    let mut c = CaseBuilder::new(6);
    let scores = c.input(DType::F32, &[4, 1, 64], Domain::Any);
    let v = c.input(DType::F32, &[4, 64, 16], Domain::Any);
    let out = scores.softmax(2).unwrap().matmul(&v).unwrap();
    let case = c.finish("heads", &[&out]);
    let kernels = fuse(&case.graph, &case.outputs, &gemv).unwrap().kernels;
    assert_eq!((kernels.len(), prologue_kernels(&case.graph, &kernels)), (1, 1), "{kernels:?}");
}

/// With `gemv`, a gate and an up projection of one input under one epilogue
/// (`silu(x·Wg) · (x·Wu)`, a Llama MLP's) join one kernel storing only the product of the two,
/// and the RMS norm before them joins it as its prologue: one kernel for the norm and both
/// projections. Without `gemv`, or at more rows than the kernel takes, the gate keeps a kernel
/// of its own.
#[test]
fn a_gate_and_up_projection_pair_in_one_matrix_vector_kernel() {
    use fusegraph::crates::passes::GEMV_MAX_ROWS;
    let build = |rows: usize| {
        let mut c = CaseBuilder::new(8);
        let x = c.input(DType::F32, &[rows, 64], Domain::Any);
        let scale = x.mul(&x).unwrap().mean(&[1], true).unwrap().add_scalar(1e-6).unwrap().rsqrt().unwrap();
        let h = x.mul(&scale).unwrap();
        let wg = c.input(DType::F32, &[96, 64], Domain::Any);
        let wu = c.input(DType::F32, &[96, 64], Domain::Any);
        let gate = h.matmul(&wg.t().unwrap()).unwrap();
        let up = h.matmul(&wu.t().unwrap()).unwrap();
        let y = gate.mul(&gate.sigmoid().unwrap()).unwrap().mul(&up).unwrap();
        let case = c.finish("mlp", &[&y]);
        (case.graph, case.outputs)
    };
    let products = |g: &Graph, k: &Kernel| k.members.iter().filter(|&&m| g.node(m).op.name() == "matmul").count();
    let gemv = FusionOptions { gemv: true, ..options() };
    let (g, outs) = build(1);
    let kernels = fuse(&g, &outs, &gemv).unwrap().kernels;
    assert_eq!(kernels.len(), 1, "{kernels:?}");
    assert_eq!(products(&g, &kernels[0]), 2);
    assert_eq!(kernels[0].outputs, outs);
    let apart = fuse(&g, &outs, &options()).unwrap().kernels;
    assert!(apart.iter().all(|k| products(&g, k) <= 1), "{apart:?}");
    let (g, outs) = build(GEMV_MAX_ROWS + 1);
    let kernels = fuse(&g, &outs, &gemv).unwrap().kernels;
    assert!(kernels.iter().all(|k| products(&g, k) <= 1), "{kernels:?}");
}

/// Products of a few rows are not stacked into one product where the matrix–vector kernel
/// takes them (`PlanOptions::gemv`): it runs them in one dispatch as siblings, with the norm
/// before them as its prologue. Products of more rows still combine.
#[test]
fn few_row_products_stay_apart_for_the_matrix_vector_kernel() {
    use fusegraph::crates::passes::{plan_combined_within, PlanOptions};
    use fusegraph::GraphBuilder;
    for (rows, gemv, combined) in [(1, true, 0), (1, false, 1), (16, true, 1)] {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [rows, 32]).unwrap();
        let h = x.layer_norm(&[1], 1e-5).unwrap();
        let proj = |name: &str| h.matmul(&b.parameter(name, DType::F32, [32, 32]).unwrap()).unwrap();
        let (q, k, v) = (proj("q"), proj("k"), proj("v"));
        let y = q.add(&k).unwrap().mul(&v).unwrap();
        let mut g = b.graph();
        let opts = PlanOptions { combine_products: true, gemv, ..Default::default() };
        let (planned, groups) = plan_combined_within(&mut g, &[y.id()], &opts, None).unwrap();
        assert_eq!(groups.len(), combined, "{rows} rows, gemv {gemv}");
        if gemv && rows == 1 {
            // The norm and the three products: one kernel; the sum and product after them another.
            assert!(planned.kernels.len() <= 2, "{:?}", planned.kernels);
        }
    }
}

/// An argmax is a reduction: over a product's rows (a model's head over a small vocabulary)
/// it never joins the product's loop kernel, where one invocation would compute every
/// product of the row in turn (the whole head in one thread); it takes a row kernel of its
/// own, with or without the matrix–vector kernel's fusions. Short rows (below
/// `min_row_len`) reduce in a loop kernel, also apart from the product. A long one's indices
/// are stored: it never joins its consumers' kernel either.
#[test]
fn an_argmax_never_joins_the_loop_kernel_of_the_product_it_reads() {
    for (n, row_kernel) in [(300, true), (40, false)] {
        let mut c = CaseBuilder::new(9);
        let x = c.input(DType::F32, &[2, 64], Domain::Any);
        let w = c.input(DType::F32, &[64, n], Domain::Any);
        let ids = x.matmul(&w).unwrap().argmax(1, false).unwrap();
        let case = c.finish("head", &[&ids]);
        for opts in [options(), FusionOptions { gemv: true, ..options() }] {
            let f = fuse(&case.graph, &case.outputs, &opts).unwrap();
            assert_eq!(f.kernels.len(), 2, "n = {n}, gemv {}: {:?}", opts.gemv, f.kernels);
            let argmax = f.kernels.iter().find(|k| k.outputs == case.outputs).expect("the argmax's kernel");
            assert!(argmax.members.iter().all(|&m| case.graph.node(m).op.name() != "matmul"), "{argmax:?}");
            assert_eq!(matches!(argmax.kind, KernelKind::Row { .. }), row_kernel, "n = {n}: {:?}", argmax.kind);
            let veto =
                f.log.iter().find(|d| case.graph.node(d.producer).op.name() == "matmul").and_then(|d| d.veto.clone());
            assert!(veto.is_some(), "n = {n}: the product was fused: {:?}", f.log);
        }
    }
    // Nor does a long one join its consumers' kernel: its indices are stored
    // (`Veto::IndicesApart`); a short one (a split argmax's pick among 16 chunks) does.
    for (len, veto) in [(300, Some(Veto::IndicesApart)), (16, None)] {
        let mut c = CaseBuilder::new(10);
        let x = c.input(DType::F32, &[2, len], Domain::Any);
        let scores = x.exp().unwrap().mul(&x).unwrap();
        let total = scores.sum(&[1], true).unwrap();
        let picked = scores.argmax(1, true).unwrap().cast(DType::F32).unwrap().mul(&total).unwrap();
        let case = c.finish("picked", &[&picked]);
        let f = fuse(&case.graph, &case.outputs, &options()).unwrap();
        let argmax = f.log.iter().find(|d| case.graph.node(d.producer).op.name() == "argmax").expect("judged");
        assert_eq!(argmax.veto, veto, "{len}: {:?}", f.log);
    }
}
