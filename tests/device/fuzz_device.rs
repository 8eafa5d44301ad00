//! Differential fuzzing on the device: random graphs that mix elementwise ops, broadcasts,
//! reductions, softmax and layer norm over either axis, transposes, reshapes, slices,
//! selects, f16 round trips, matmuls and sibling matmuls of one operand, over ragged and vec4-friendly shapes, compiled fused, unfused and with mixed
//! precision, each run checked against the CPU reference. The catalog tests each op alone;
//! this checks what fusion puts together (row kernels, matmul prologues and epilogues,
//! multi-output kernels, the CPU adapters' vec4 and interleaved loops). Deterministic: a
//! failure names its seed, `FUSEGRAPH_FUZZ_SEED=S` runs that seed alone and
//! `FUSEGRAPH_FUZZ_CASES=N` runs more graphs.

use crate::common;

use fusegraph::crates::passes::mixed_precision::to_mixed_precision_updating;
use fusegraph::crates::reference::evaluate;
use fusegraph::{CompileOptions, DType, Device, Graph, GraphBuilder, HostTensor, NodeId, RuntimeError, SplitK, Tensor};
use std::collections::{BTreeMap, BTreeSet};

/// The fuzzer's draws on the tests' seeded generator.
struct Rng(crate::common::Rng);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(crate::common::Rng::new(seed))
    }
    fn below(&mut self, n: usize) -> usize {
        (self.0.next_u64() % n as u64) as usize
    }
    fn values(&mut self, n: usize, scale: f32) -> Vec<f32> {
        // Uniform in [-scale, scale], never exactly zero.
        (0..n).map(|_| self.0.uniform(-1.0, 1.0) as f32 * scale + 1e-3).collect()
    }
}

/// One random case: a graph, its outputs, its feeds and parameter values.
struct Case {
    graph: Graph,
    outputs: Vec<NodeId>,
    feeds: Vec<(String, HostTensor)>,
    params: Vec<(String, HostTensor)>,
    ops: Vec<&'static str>,
    /// The builder the graph came from, the computed values nothing reads (the last value
    /// and every dead end of the random walk) and its inputs and parameters (for appending
    /// a backward pass that reaches every op).
    builder: GraphBuilder,
    ends: Vec<Tensor>,
    leaves: Vec<Tensor>,
}

const DIMS: [usize; 8] = [1, 3, 4, 8, 17, 32, 40, 65];

/// A random case; `smooth` leaves out the ops whose result jumps under a tiny change of
/// their operands (`select` on a comparison, rounding to f16), so that f16 storage stays
/// within f16 tolerance of the f32 reference.
fn random_case(seed: u64, smooth: bool) -> Case {
    let mut rng = Rng::new(seed);
    let b = GraphBuilder::new();
    let (rows, cols) = (DIMS[1 + rng.below(DIMS.len() - 1)], DIMS[rng.below(DIMS.len())]);
    let mut feeds = Vec::new();
    let mut params = Vec::new();
    let mut pool: Vec<Tensor> = Vec::new();
    for i in 0..2 {
        let name = format!("x{i}");
        pool.push(b.input(&name, DType::F32, vec![rows, cols]).unwrap());
        feeds.push((name, HostTensor::new([rows, cols], rng.values(rows * cols, 2.0)).unwrap()));
    }
    let mut leaves = pool.clone();
    let mut param = |rng: &mut Rng, dims: Vec<usize>, scale: f32| {
        let name = format!("p{}", params.len());
        let n = dims.iter().product();
        let t = b.parameter(&name, DType::F32, dims.clone()).unwrap();
        params.push((name, HostTensor::new(dims, rng.values(n, scale)).unwrap()));
        leaves.push(t.clone());
        t
    };
    let mut ops = Vec::new();
    let steps = 6 + rng.below(9);
    for _ in 0..steps {
        let a = pool[rng.below(pool.len())].clone();
        let (r, c) = (a.dims()[0], a.dims()[1]);
        let same: Vec<Tensor> = pool.iter().filter(|t| t.dims() == a.dims()).cloned().collect();
        let other = same[rng.below(same.len())].clone();
        let (name, t) = match rng.below(20) {
            0 => ("tanh", a.tanh()),
            1 => ("sigmoid", a.sigmoid()),
            2 => ("relu", a.relu()),
            3 => ("exp(tanh)", a.tanh().and_then(|t| t.exp())),
            4 => ("add", a.add(&other)),
            5 => ("mul", a.mul(&other).and_then(|m| m.mul_scalar(0.5))),
            6 => ("max", a.maximum(&other)),
            7 => ("bias", a.add(&param(&mut rng, vec![c], 1.0))),
            8 => ("center rows", a.mean(&[1], true).and_then(|m| a.sub(&m))),
            9 => ("column max", a.max(&[0], true).and_then(|m| a.sub(&m))),
            10 => {
                let axis = rng.below(2);
                ("softmax", a.softmax(axis))
            }
            11 => ("layer norm", a.layer_norm(&[1], 1e-5)),
            12 => ("transpose", a.t()),
            13 => {
                let n = DIMS[1 + rng.below(DIMS.len() - 1)];
                let w = param(&mut rng, vec![c, n], 1.0 / (c as f32).sqrt());
                ("matmul", a.matmul(&w))
            }
            14 => ("reshape", a.reshape(vec![c, r])),
            15 if !smooth => ("f16 round trip", a.cast(DType::F16).and_then(|h| h.cast(DType::F32))),
            16 if !smooth => ("select", a.gt(&other).and_then(|m| m.select(&a, &other.neg().unwrap()))),
            15 | 16 => ("silu", a.silu()),
            17 => ("column sum", a.sum(&[0], true).and_then(|m| a.add(&m.mul_scalar(0.1).unwrap()))),
            18 => {
                // Products of one operand with weights of one shape (attention's projections),
                // with or without a bias epilogue: what `combine_products` stacks. The first
                // joins the pool, so it may be an output or another product's operand.
                let n = DIMS[1 + rng.below(DIMS.len() - 1)];
                let bias = rng.below(2) == 0;
                let mut product = |rng: &mut Rng| {
                    let w = param(rng, vec![c, n], 1.0 / (c as f32).sqrt());
                    let y = a.matmul(&w).unwrap();
                    if bias {
                        y.add(&param(rng, vec![n], 1.0)).unwrap()
                    } else {
                        y
                    }
                };
                let first = product(&mut rng);
                let second = product(&mut rng);
                pool.push(first.clone());
                ("sibling products", first.mul(&second))
            }
            _ if c > 1 => {
                let start = rng.below(c - 1);
                ("slice", a.narrow(1, start, 1 + rng.below(c - start)))
            }
            _ => ("gelu", a.gelu()),
        };
        ops.push(name);
        pool.push(t.unwrap_or_else(|e| panic!("seed {seed}: {name} on {:?}: {e}", a.dims())));
    }
    let mut outputs = vec![pool.last().unwrap().id()];
    for _ in 0..rng.below(3) {
        let o = pool[2 + rng.below(pool.len() - 2)].id();
        if !outputs.contains(&o) {
            outputs.push(o);
        }
    }
    let graph = b.graph();
    let ends = pool[2..].iter().filter(|t| graph.users(t.id()).is_empty()).cloned().collect();
    Case { graph, outputs, feeds, params, ops, builder: b, ends, leaves }
}

/// The seeds each test runs ([`common::fuzz_seeds`]): 40 graphs by default.
fn seeds() -> std::ops::RangeInclusive<u64> {
    common::fuzz_seeds(40)
}

/// The loss Σ end² over every end of `case` (each computed value nothing reads, so that
/// every op of the random walk is differentiated) and its gradients with respect to `wrt`,
/// appended to its builder.
fn loss_and_grads(case: &Case, wrt: &[Tensor]) -> (Tensor, Vec<Tensor>) {
    let squares: Vec<Tensor> =
        case.ends.iter().map(|t| t.mul(t).and_then(|sq| sq.sum(&[0, 1], false)).unwrap()).collect();
    let loss = squares[1..].iter().fold(squares[0].clone(), |sum, sq| sum.add(sq).unwrap());
    let grads = fusegraph::grad(&loss, &wrt.iter().collect::<Vec<_>>()).unwrap();
    (loss, grads)
}

/// Compiles and runs `case` under `opts` and compares its outputs with the reference
/// ([`common::Program::check`]); returns how many matrix products ran combined with others
/// of their operand.
fn check(
    device: &std::sync::Arc<Device>,
    case: &Case,
    opts: &CompileOptions,
    tol: f64,
    nudge_by: f64,
) -> Result<usize, String> {
    let program =
        common::Program { graph: &case.graph, outputs: &case.outputs, feeds: &case.feeds, params: &case.params };
    Ok(program.check(device, opts, tol, nudge_by)?.combined_products.0)
}

#[test]
fn random_graphs_match_the_reference_fused_unfused_and_in_mixed_precision() {
    let cases = seeds().count();
    let device = Device::shared().unwrap();
    let mixed = CompileOptions { mixed_precision: true, ..Default::default() };
    let mut failures = Vec::new();
    let (mut kernels, mut fitted, mut refused, mut combined) = (0, 0, 0, 0);
    for seed in seeds() {
        let case = random_case(seed, false);
        // A value rounded to f16 moves by an f16 step where the device's f32 and the
        // reference's f64 fall on either side of a rounding boundary.
        let tol = if case.ops.contains(&"f16 round trip") { 2e-3 } else { 2e-4 };
        for (mode, opts) in [("fused", CompileOptions::default()), ("unfused", CompileOptions::unfused())] {
            match check(&device, &case, &opts, tol, 1e-6) {
                Ok(n) => combined += n,
                Err(e) => failures.push(format!("seed {seed} ({mode}; {}): {e}", case.ops.join(", "))),
            }
        }
        let plan = device.plan(&case.graph, &case.outputs, &CompileOptions::default()).unwrap();
        kernels += plan.kernels;
        // Under a memory limit below the plan's peak: rematerialization meets it (the same
        // outputs, within the limit) or compiling fails with the typed out-of-memory error.
        let limit = plan.persistent_bytes + plan.staging_bytes + plan.lower_bound_bytes * 85 / 100;
        let limited = CompileOptions { memory_limit: Some(limit), ..Default::default() };
        match device.compile(&case.graph, &case.outputs, &limited) {
            Err(RuntimeError::ResourceExhausted { .. }) => refused += 1,
            Err(e) => failures.push(format!("seed {seed} (memory limit {limit}): {e}")),
            Ok(exe) if exe.stats().device_bytes > limit => {
                failures.push(format!("seed {seed}: {} bytes over the limit {limit}", exe.stats().device_bytes))
            }
            Ok(_) => match check(&device, &case, &limited, tol, 1e-6) {
                Ok(_) => fitted += 1,
                Err(e) => failures.push(format!("seed {seed} (memory limit; {}): {e}", case.ops.join(", "))),
            },
        }
        // f16 storage of every intermediate: within f16 tolerance of the f32 reference.
        let smooth = random_case(seed, true);
        if let Err(e) = check(&device, &smooth, &mixed, 3e-2, 1e-3) {
            failures.push(format!("seed {seed} (mixed precision; {}): {e}", smooth.ops.join(", ")));
        }
    }
    eprintln!(
        "{cases} graphs, {kernels} fused kernels, {combined} products combined; under 85% of \
         the peak {fitted} fitted by rematerialization, {refused} refused; {} failures",
        failures.len()
    );
    assert!(failures.is_empty(), "{} failed:\n{}", failures.len(), failures.join("\n"));
    // The sibling products are not vacuous: over the default 40 graphs some are combined
    // (CI's GL run takes 8, too few to assert on).
    assert!(cases < 10 || combined > 0, "no products of {cases} graphs were combined");
}

/// Whether every floating-point value of `graph` (all its nodes, as the reference computes
/// them) is finite and within f16's range, so that f16 storage can hold it.
fn fits_f16(graph: &Graph, feeds: &BTreeMap<String, HostTensor>, params: &BTreeMap<String, HostTensor>) -> bool {
    let nodes: Vec<NodeId> = graph.node_ids().into_iter().filter(|&n| graph.ty(n).dtype.is_float()).collect();
    evaluate(graph, &nodes, feeds, params)
        .is_ok_and(|values| values.iter().all(|v| v.to_f64().iter().all(|x| x.abs() <= 65504.0)))
}

/// Fused with every product whose `k` is a multiple of 8 split in two (`SplitK::Slices`):
/// the backward pass's products contract over the rows (`Aᵀ·dY`) and the columns
/// (`dY·Wᵀ`) of the random shapes, so most graphs with a matmul split some.
fn split_k() -> CompileOptions {
    CompileOptions { split_k: SplitK::Slices(2), ..Default::default() }
}

/// The same random graphs with a backward pass: the gradient of Σ end² with respect to every
/// input and parameter (`fusegraph::grad` appends it as ordinary ops, so fusion sees forward
/// and backward together), fused, unfused and fused with split-k, against the reference
/// evaluating the same graph. Smooth graphs only (a `select` or an f16 rounding has no
/// useful gradient).
#[test]
fn random_backward_graphs_match_the_reference_fused_and_unfused() {
    let cases = seeds().count();
    let device = Device::shared().unwrap();
    let mut failures = Vec::new();
    let (mut kernels, mut split) = (0, 0);
    for seed in seeds() {
        let mut case = random_case(seed, true);
        let (loss, grads) = loss_and_grads(&case, &case.leaves);
        case.graph = case.builder.graph();
        case.outputs = std::iter::once(loss.id()).chain(grads.iter().map(|t| t.id())).collect();
        let modes =
            [("fused", CompileOptions::default()), ("unfused", CompileOptions::unfused()), ("split-k", split_k())];
        for (mode, opts) in modes {
            if let Err(e) = check(&device, &case, &opts, 5e-4, 1e-6) {
                failures.push(format!("seed {seed} ({mode}; {}): {e}", case.ops.join(", ")));
            }
        }
        let fused = device.plan(&case.graph, &case.outputs, &CompileOptions::default()).map_or(0, |p| p.kernels);
        kernels += fused;
        // A split adds the sum's kernel.
        split += device.plan(&case.graph, &case.outputs, &split_k()).is_ok_and(|p| p.kernels > fused) as usize;
    }
    eprintln!(
        "{cases} graphs with gradients, {kernels} fused kernels, {split} with products split, {} failures",
        failures.len()
    );
    assert!(failures.is_empty(), "{} failed:\n{}", failures.len(), failures.join("\n"));
    // The split-k mode is not vacuous: over the default 40 graphs some products have a `k`
    // it splits (CI's GL run takes 8, too few to assert on).
    assert!(cases < 10 || split > 0, "no graph of {cases} had a product split");
}

/// Two SGD steps on the same random graphs: every parameter takes `p - 0.1·∂(Σ end²)/∂p`
/// as an update (`CompileOptions::updates`: applied on the device after the step, in place
/// where the planner finds it safe), fused, unfused, with split-k and in mixed precision (the updated
/// parameters keep f32 masters; f16 tolerance; only where every value fits f16's range);
/// after each step the loss and the parameters read back match the reference's step from
/// the parameters the device held before it (so the second step saw the updated weights),
/// within a tolerance widened where the step is ill-conditioned (see `nudge`).
#[test]
fn random_training_steps_update_parameters_like_the_reference() {
    let device = Device::shared().unwrap();
    let mut failures = Vec::new();
    let (mut trained, mut moved, mut in_f16) = (0, 0, 0);
    for seed in seeds() {
        let case = random_case(seed, true);
        if case.params.is_empty() {
            continue;
        }
        trained += 1;
        let params = &case.leaves[case.feeds.len()..];
        let (loss, grads) = loss_and_grads(&case, params);
        let steps: Vec<Tensor> =
            params.iter().zip(&grads).map(|(p, g)| p.sub(&g.mul_scalar(0.1).unwrap()).unwrap()).collect();
        let graph = case.builder.graph();
        let names: Vec<String> = case.params.iter().map(|(n, _)| n.clone()).collect();
        let updates: Vec<(String, NodeId)> = names.iter().cloned().zip(steps.iter().map(|t| t.id())).collect();
        let feeds: BTreeMap<String, HostTensor> = case.feeds.iter().cloned().collect();
        let refs: Vec<(&str, &HostTensor)> = case.feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
        // The loss and the new parameters of a step from parameters `at`, by the reference.
        let mut outs = vec![loss.id()];
        outs.extend(steps.iter().map(|t| t.id()));
        let reference = |at: &BTreeMap<String, HostTensor>| evaluate(&graph, &outs, &feeds, at);
        // The graph mixed precision runs (f16 values, the updated parameters f32 masters and
        // the updates' arithmetic f32), for its own reference: see `close_to_the_f16_model`
        // below.
        let masters: BTreeSet<String> = names.iter().cloned().collect();
        let step_ids: Vec<NodeId> = steps.iter().map(|t| t.id()).collect();
        let (f16_graph, f16_outs) = to_mixed_precision_updating(&graph, &outs, &masters, &step_ids).unwrap();
        let f16_reference = |at: &BTreeMap<String, HostTensor>| evaluate(&f16_graph, &f16_outs, &feeds, at);
        let mut modes = vec![
            ("fused", CompileOptions::default(), 5e-4, 1e-6),
            ("unfused", CompileOptions::unfused(), 5e-4, 1e-6),
            ("split-k", split_k(), 5e-4, 1e-6),
        ];
        // f16 storage only where every value of both of the reference's steps (forward,
        // backward and update) fits f16's range: beyond 65504 it is infinite, and so is what
        // is computed from it (what `fusegraph::train`'s loss scaling exists for).
        let initial: BTreeMap<String, HostTensor> = case.params.iter().cloned().collect();
        let second: BTreeMap<String, HostTensor> =
            names.iter().cloned().zip(reference(&initial).unwrap().into_iter().skip(1)).collect();
        // (The ends may not depend on any parameter: then no step changes one.)
        moved += names.iter().any(|n| initial[n].to_f64() != second[n].to_f64()) as usize;
        if [&initial, &second].iter().all(|at| fits_f16(&graph, &feeds, at)) {
            let mixed = CompileOptions { mixed_precision: true, ..Default::default() };
            modes.push(("mixed precision", mixed, 3e-2, 1e-3));
            in_f16 += 1;
        }
        for (mode, base, tol, nudge_by) in modes {
            let opts = CompileOptions { updates: updates.clone(), ..base };
            let result = (|| -> Result<(), String> {
                let mut exe = device.compile(&graph, &[loss.id()], &opts).map_err(|e| format!("compile: {e}"))?;
                for (n, v) in &case.params {
                    exe.set_parameter(n, v).map_err(|e| e.to_string())?;
                }
                for step in 0..2 {
                    // Each step against the reference's step from the parameters the device
                    // holds before it: differences of one step are not compounded by the
                    // next (a column max's tie may break the other way after a step).
                    let at: BTreeMap<String, HostTensor> = names
                        .iter()
                        .map(|n| exe.parameter(n).map(|v| (n.clone(), v)))
                        .collect::<Result<_, _>>()
                        .map_err(|e| e.to_string())?;
                    let want = reference(&at).map_err(|e| format!("reference: {e}"))?;
                    // The reference with the parameters nudged, for `close`.
                    let nudged = reference(&common::nudge(&at, nudge_by)).map_err(|e| format!("reference: {e}"))?;
                    let got = exe.run(&refs).map_err(|e| format!("run: {e}"))?;
                    // In mixed precision, f16 rounding can flip a comparison the reference
                    // makes in f32: `max(a, a + b)` with a bias `b` below half an f16 step
                    // of `a` is a tie in f16, and the gradient goes to `a` instead of `b`
                    // (seed 1155: 2.06 apart on a parameter, unfused too). No nudge of the
                    // f32 reference shows that, so a result that misses it must instead be
                    // within the same tolerance of the reference evaluating the f16 graph
                    // itself (every value rounded to f16 as the device rounds it).
                    let f16_want = if opts.mixed_precision {
                        Some((
                            f16_reference(&at).map_err(|e| format!("f16 reference: {e}"))?,
                            f16_reference(&common::nudge(&at, nudge_by)).map_err(|e| format!("f16 reference: {e}"))?,
                        ))
                    } else {
                        None
                    };
                    let step_close = |k: usize, g: &HostTensor, what: &str| {
                        common::close(g, &want[k], &nudged[k], tol)
                            .or_else(|e| match &f16_want {
                                Some((w, n)) => common::close(g, &w[k], &n[k], tol)
                                    .map_err(|f| format!("{e}\n  and against the f16 graph's reference: {f}")),
                                None => Err(e),
                            })
                            .map_err(|e| format!("step {step}, {what}: {e}"))
                    };
                    step_close(0, &got[0], "loss")?;
                    for (k, name) in names.iter().enumerate() {
                        step_close(k + 1, &exe.parameter(name).map_err(|e| e.to_string())?, name)?;
                    }
                }
                Ok(())
            })();
            if let Err(e) = result {
                failures.push(format!("seed {seed} ({mode}; {}): {e}", case.ops.join(", ")));
            }
        }
    }
    eprintln!(
        "{trained} graphs trained two steps ({moved} whose steps change parameters, {in_f16} in mixed precision), {} failures",
        failures.len()
    );
    assert!(failures.is_empty(), "{} failed:\n{}", failures.len(), failures.join("\n"));
    assert!(trained < 10 || moved > 0, "no step of {trained} graphs changed a parameter");
}
