//! Memory passes end to end, device-free: schedule → plan_memory (liveness-based reuse,
//! in-place) → check_plan, on an elementwise chain and model-shaped graphs; the planner query.

use fusegraph_ir::{Graph, NodeId};
use fusegraph_passes::liveness::{intervals, peak_live_bytes};
use fusegraph_passes::schedule::first_unready;
use fusegraph_passes::testing::{conv_net, elementwise_chain, mlp, remat_graph, transformer_block};
use fusegraph_passes::{
    check_plan, largest_batch, partition, plan_graph, plan_memory, plan_memory_with, plan_summary, schedule,
    FusionMode, MemoryOptions, PlanOptions, Stages,
};

const ALIGN: u64 = 256;

#[test]
fn elementwise_chain_reuses_two_buffers_or_one_in_place() {
    let n = 20;
    let (g, outs) = elementwise_chain(n, vec![64, 64]).unwrap();
    let t = 64 * 64 * 4;
    let kernels = partition(&g, &outs, FusionMode::Off).unwrap();
    assert_eq!(kernels.len(), n);
    let no_ip = plan_memory_with(
        &g,
        &kernels,
        &outs,
        &MemoryOptions { alignment: ALIGN, in_place: false, ..Default::default() },
    );
    let ip = plan_memory(&g, &kernels, &outs, ALIGN);
    eprintln!(
        "chain of {n}: naive {} / lower bound {} / arena {} (no in-place) / arena {} (in-place)",
        no_ip.naive_bytes, no_ip.lower_bound_bytes, no_ip.arena_bytes, ip.arena_bytes
    );
    assert_eq!(no_ip.naive_bytes, (n as u64 + 1) * t);
    assert!(no_ip.arena_bytes <= t + 2 * t);
    assert!(ip.arena_bytes <= t + t);
    assert_eq!(ip.in_place.len(), n);
    // Each kernel reads one tensor and writes the next: two live at every step, but written
    // in place they are one chain of shared bytes, and the lower bound says so.
    assert_eq!(no_ip.lower_bound_bytes, 2 * t);
    assert_eq!(ip.lower_bound_bytes, t);
    for plan in [&no_ip, &ip] {
        check_plan(plan, &plan.intervals).unwrap();
        assert!(plan.lower_bound_bytes <= plan.arena_bytes);
    }
}

fn figures(name: &str, g: &Graph, outs: &[NodeId]) {
    for mode in [FusionMode::On, FusionMode::Off] {
        let kernels = partition(g, outs, mode).unwrap();
        let given = peak_live_bytes(&intervals(g, &kernels, outs));
        let kernels = schedule(g, kernels, outs);
        let plan = plan_memory(g, &kernels, outs, ALIGN);
        check_plan(&plan, &plan.intervals).unwrap();
        eprintln!(
            "{name} fusion {mode:?}: {} kernels; naive {} / lower bound {} (given order {given}) / arena {} \
             ({} in-place)",
            kernels.len(),
            plan.naive_bytes,
            plan.lower_bound_bytes,
            plan.arena_bytes,
            plan.in_place.len()
        );
        assert!(plan.lower_bound_bytes <= given);
        assert!(plan.lower_bound_bytes <= plan.arena_bytes);
        assert!(
            plan.arena_bytes as f64 <= 1.05 * plan.lower_bound_bytes as f64,
            "{name} {mode:?}: arena {} > 1.05 × lower bound {}",
            plan.arena_bytes,
            plan.lower_bound_bytes
        );
        assert!(plan.arena_bytes <= plan.naive_bytes);
    }
}

#[test]
fn mlp_plan_is_near_its_lower_bound() {
    let (g, outs) = mlp(64).unwrap();
    figures("mlp 784-1024-1024-10 batch 64", &g, &outs);
}

#[test]
fn conv_net_plan_is_near_its_lower_bound() {
    let (g, outs) = conv_net(8).unwrap();
    figures("conv net batch 8", &g, &outs);
}

#[test]
fn transformer_plan_is_near_its_lower_bound() {
    let (g, outs) = transformer_block(128, 256, 4).unwrap();
    figures("transformer block seq 128 d 256 heads 4", &g, &outs);
}

#[test]
fn plan_summary_adds_up_and_names_the_peak() {
    let (g, outs) = mlp(64).unwrap();
    for fusion in [FusionMode::On, FusionMode::Off] {
        let s = plan_summary(&g, &outs, &PlanOptions { fusion, ..Default::default() }).unwrap();
        assert_eq!(s.total_bytes, s.persistent_bytes + s.arena_bytes + s.staging_bytes);
        assert_eq!(s.staging_bytes, 64 * 10 * 4);
        let weights = 4 * (784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10);
        assert!(s.persistent_bytes >= weights && s.persistent_bytes < weights + 6 * ALIGN);
        assert!(!s.peak_values.is_empty() && s.peak_values.len() <= 8);
        assert!(s.peak_values.windows(2).all(|w| w[0].bytes >= w[1].bytes));
        let live: u64 = s.peak_values.iter().map(|v| v.bytes).sum();
        assert!(live <= s.lower_bound_bytes);
        eprintln!("mlp summary {fusion:?}: {s:?}");
    }
    // Unknown outputs are an error, not a panic.
    let (_, other_outs) = mlp(1).unwrap();
    assert!(plan_summary(&Graph::new(), &other_outs, &PlanOptions::default()).is_err());
}

#[test]
fn planner_rematerializes_to_a_budget() {
    let (g, outs) = remat_graph();
    let opts = PlanOptions { fusion: FusionMode::Off, ..Default::default() };
    let plain = plan_graph(&g, &outs, &opts).unwrap();
    let budget = 14 * 1024;
    let remat = plan_graph(&g, &outs, &PlanOptions { remat_budget: Some(budget), ..opts }).unwrap();
    eprintln!(
        "remat via planner: arena {} -> {} (budget {budget}), kernels {} -> {}",
        plain.summary.arena_bytes, remat.summary.arena_bytes, plain.summary.kernels, remat.summary.kernels
    );
    assert_eq!(plain.summary.arena_bytes, 16 * 1024);
    assert!(remat.summary.arena_bytes <= budget);
    assert_eq!(first_unready(&g, &remat.kernels), None);
    check_plan(&remat.plan, &remat.plan.intervals).unwrap();
}

#[test]
fn largest_batch_fits_and_the_next_does_not() {
    let opts = PlanOptions::default();
    let total = |b: usize| {
        let (g, outs) = mlp(b).unwrap();
        plan_summary(&g, &outs, &opts).unwrap().total_bytes
    };
    let limit = total(1) + 40 * 1024 * 1024 / 10;
    let mlp = |b| mlp(b).map(|(g, outs)| (g, outs, vec![]));
    let stages = |limit| Stages { plan: opts.clone(), limit: Some(limit), ..Default::default() };
    let b = largest_batch(mlp, &stages(limit), 4096).unwrap().expect("batch 1 fits");
    eprintln!("largest mlp batch under {limit} bytes: {b} ({} bytes; {} at {})", total(b), total(b + 1), b + 1);
    assert!(total(b) <= limit);
    assert!(total(b + 1) > limit);
    assert_eq!(largest_batch(mlp, &stages(total(1) - 1), 4096).unwrap(), None);
    assert_eq!(largest_batch(mlp, &stages(u64::MAX), 5).unwrap(), Some(5));
}

/// Updates are planned once, beside the outputs: alive to the end and written in place, but
/// never staged for reading back — unless the same value is also an output.
#[test]
fn update_values_are_planned_but_not_staged() {
    use fusegraph_ir::{DType, GraphBuilder};
    use fusegraph_passes::pipeline::run;
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [1024]).unwrap();
    let w = b.parameter("w", DType::F32, [1024]).unwrap();
    let y = x.mul(&w).unwrap().sum(&[0], false).unwrap();
    let w_new = w.add(&x).unwrap();
    let g = b.graph();
    let stages = Stages { simplify: true, ..Default::default() };
    let updates = vec![("w".to_string(), w_new.id())];
    let planned = run(&g, &[y.id()], &updates, &stages).unwrap();
    let s = planned.summary();
    assert_eq!(s.staging_bytes, 4, "the loss alone is read back: {s:?}");
    assert_eq!(s.total_bytes, s.persistent_bytes + s.arena_bytes + s.staging_bytes);
    assert_eq!(planned.updates.len(), 1);
    // The new weights are written over the old ones: no arena bytes for them.
    assert!(planned.planned.plan.locations.contains_key(&planned.updates[0]));
    assert_eq!(
        planned.planned.plan.locations[&planned.updates[0]].region,
        fusegraph_passes::Region::Persistent,
        "written in place: {s:?}"
    );
    // Read back too: then it is staged once.
    let both = run(&g, &[y.id(), w_new.id()], &updates, &stages).unwrap();
    assert_eq!(both.summary().staging_bytes, 4 + 4096);
}
