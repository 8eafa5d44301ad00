//! A training step as one executable: forward, backward (autodiff) and the update, with the
//! parameters updated on the device after every run.

use fusegraph::crates::reference::{assert_close, evaluate};
use fusegraph::{grad, CompileOptions, DType, Device, GraphBuilder, HostTensor};
use std::collections::BTreeMap;

#[test]
fn sgd_on_linear_regression_lowers_the_loss_and_matches_the_reference_step() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [32, 4]).unwrap();
    let t = b.input("t", DType::F32, [32, 1]).unwrap();
    let w = b.parameter("w", DType::F32, [4, 1]).unwrap();
    let diff = x.matmul(&w).unwrap().sub(&t).unwrap();
    let loss = diff.mul(&diff).unwrap().mean(&[0, 1], false).unwrap();
    let gw = &grad(&loss, &[&w]).unwrap()[0];
    let new_w = w.sub(&gw.mul_scalar(0.1).unwrap()).unwrap();
    let g = b.graph();

    let xs: Vec<f32> = fusegraph_workloads::random_values(1, 128);
    let true_w = [0.5f32, -1.0, 2.0, 0.25];
    let ts: Vec<f32> = (0..32).map(|r| (0..4).map(|c| xs[r * 4 + c] * true_w[c]).sum()).collect();
    let xv = HostTensor::new([32, 4], xs).unwrap();
    let tv = HostTensor::new([32, 1], ts).unwrap();
    let w0 = HostTensor::new([4, 1], vec![0.0f32; 4]).unwrap();

    let device = Device::shared().unwrap();
    let opts = CompileOptions { updates: vec![("w".into(), new_w.id())], ..Default::default() };
    let mut exe = device.compile(&g, &[loss.id()], &opts).unwrap();
    exe.set_parameter("w", &w0).unwrap();
    let feeds = [("x", &xv), ("t", &tv)];
    let first = exe.run(&feeds).unwrap()[0].as_slice::<f32>().unwrap()[0];

    // The first update equals the reference's w − 0.1·∇w.
    let f = BTreeMap::from([("x".to_string(), xv.clone()), ("t".to_string(), tv.clone())]);
    let p = BTreeMap::from([("w".to_string(), w0.clone())]);
    let want = evaluate(&g, &[new_w.id()], &f, &p).unwrap();
    assert_close(&exe.parameter("w").unwrap(), &want[0], 1e-5, 1e-6).unwrap();

    let mut last = first;
    for _ in 0..50 {
        last = exe.run(&feeds).unwrap()[0].as_slice::<f32>().unwrap()[0];
    }
    assert!(last < first * 0.05, "loss {first} -> {last}");
}

#[test]
fn bad_updates_are_typed_errors() {
    let b = GraphBuilder::new();
    let w = b.parameter("w", DType::F32, [2]).unwrap();
    let y = w.sum(&[0], false).unwrap();
    let device = Device::shared().unwrap();
    let bad_name = CompileOptions { updates: vec![("nope".into(), w.id())], ..Default::default() };
    assert!(matches!(
        device.compile(&b.graph(), &[y.id()], &bad_name),
        Err(fusegraph::RuntimeError::UnknownParameter { .. })
    ));
    let bad_type = CompileOptions { updates: vec![("w".into(), y.id())], ..Default::default() };
    let e = device.compile(&b.graph(), &[y.id()], &bad_type).err().unwrap();
    assert_eq!(e.to_string(), "parameter update `w`: expected f32[2], got f32[]");
}

/// Runs `steps` of an executable whose updates feed back into its parameters, and the same
/// steps on the reference interpreter; the parameters agree after every step.
fn run_against_reference(
    g: &fusegraph::Graph,
    loss: fusegraph::NodeId,
    updates: &[(&str, fusegraph::NodeId)],
    feeds: &[(&str, &HostTensor)],
    init: &[(&str, HostTensor)],
    steps: usize,
) -> fusegraph::Executable {
    let device = Device::shared().unwrap();
    let opts =
        CompileOptions { updates: updates.iter().map(|(n, u)| (n.to_string(), *u)).collect(), ..Default::default() };
    let mut exe = device.compile(g, &[loss], &opts).unwrap();
    let mut params: BTreeMap<String, HostTensor> = init.iter().map(|(n, v)| (n.to_string(), v.clone())).collect();
    for (n, v) in &params {
        exe.set_parameter(n, v).unwrap();
    }
    let f: BTreeMap<String, HostTensor> = feeds.iter().map(|(n, v)| (n.to_string(), (*v).clone())).collect();
    for step in 0..steps {
        exe.run(feeds).unwrap();
        let ids: Vec<_> = updates.iter().map(|(_, u)| *u).collect();
        let want = evaluate(g, &ids, &f, &params).unwrap();
        for ((name, _), w) in updates.iter().zip(want) {
            assert_close(&exe.parameter(name).unwrap(), &w, 1e-5, 1e-6)
                .map_err(|e| format!("step {step} {name}: {e}"))
                .unwrap();
            params.insert(name.to_string(), w);
        }
    }
    exe
}

#[test]
fn weights_and_moments_updated_in_place_match_the_reference_over_steps() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [16, 8]).unwrap();
    let t = b.input("t", DType::F32, [16, 1]).unwrap();
    let w = b.parameter("w", DType::F32, [8, 1]).unwrap();
    let m = b.parameter("m", DType::F32, [8, 1]).unwrap();
    let diff = x.matmul(&w).unwrap().sub(&t).unwrap();
    let loss = diff.mul(&diff).unwrap().mean(&[0, 1], false).unwrap();
    let gw = &grad(&loss, &[&w]).unwrap()[0];
    let new_m = m.mul_scalar(0.9).unwrap().add(&gw.mul_scalar(0.1).unwrap()).unwrap();
    let new_w = w.sub(&new_m.mul_scalar(0.05).unwrap()).unwrap();
    let xv = HostTensor::new([16, 8], fusegraph_workloads::random_values(3, 128)).unwrap();
    let tv = HostTensor::new([16, 1], fusegraph_workloads::random_values(4, 16)).unwrap();
    let init = [
        ("w", HostTensor::new([8, 1], fusegraph_workloads::random_values(5, 8)).unwrap()),
        ("m", HostTensor::new([8, 1], fusegraph_workloads::random_values(6, 8)).unwrap()),
    ];
    let updates = [("w", new_w.id()), ("m", new_m.id())];
    let exe = run_against_reference(&b.graph(), loss.id(), &updates, &[("x", &xv), ("t", &tv)], &init, 4);
    // Both new values are written into their parameters' slots: no copies, no arena bytes.
    assert_eq!(exe.memory_plan().updated_in_place.len(), 2, "{:?}", exe.memory_plan().updated_in_place);
}

/// Two updates computed by one kernel, each reading both parameters at the same element:
/// every output of an element is computed before any is stored, or the second would read
/// the first's new value.
#[test]
fn one_kernel_updating_two_parameters_that_read_each_other() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [256]).unwrap();
    let p = b.parameter("p", DType::F32, [256]).unwrap();
    let q = b.parameter("q", DType::F32, [256]).unwrap();
    let loss = p.mul(&x).unwrap().add(&q).unwrap().sum(&[0], false).unwrap();
    let new_p = p
        .mul_scalar(0.5)
        .unwrap()
        .add(&q)
        .unwrap()
        .add(&loss.broadcast_to([256]).unwrap().mul_scalar(1e-3).unwrap())
        .unwrap();
    let new_q = q.sub(&p).unwrap().sub(&loss.broadcast_to([256]).unwrap().mul_scalar(2e-3).unwrap()).unwrap();
    let xv = HostTensor::new([256], fusegraph_workloads::random_values(7, 256)).unwrap();
    let init = [
        ("p", HostTensor::new([256], fusegraph_workloads::random_values(8, 256)).unwrap()),
        ("q", HostTensor::new([256], fusegraph_workloads::random_values(9, 256)).unwrap()),
    ];
    let updates = [("p", new_p.id()), ("q", new_q.id())];
    let exe = run_against_reference(&b.graph(), loss.id(), &updates, &[("x", &xv)], &init, 3);
    let labels: Vec<&String> = exe.stats().kernels.iter().map(|k| &k.label).collect();
    assert_eq!(exe.memory_plan().updated_in_place.len(), 2, "{labels:?}");
    let both = exe.stats().kernels.iter().any(|k| k.members.contains(&new_p.id()) && k.members.contains(&new_q.id()));
    assert!(
        both,
        "the two updates share a kernel: {:?}",
        exe.stats().kernels.iter().map(|k| &k.label).collect::<Vec<_>>()
    );
}

/// The bench's training-step workloads (`workloads::train_step`): compiled with their
/// updates, one run moves every updated parameter, and fused and unfused agree on the loss
/// and on every new value; compiled without the updates, the backward pass and the update
/// are dead code.
#[test]
fn training_step_workload_updates_every_parameter_fused_as_unfused() {
    use fusegraph_workloads::demo::Task;
    let w = fusegraph_workloads::train_step(Task::Mlp, true).unwrap();
    assert!(!w.updates.is_empty());
    let device = Device::shared().unwrap();
    let compile = |opts: CompileOptions| {
        let mut e = device.compile(&w.graph, &w.outputs, &opts).unwrap();
        for (n, v) in &w.params {
            e.set_parameter(n, v).unwrap();
        }
        e
    };
    let fused = compile(w.options(CompileOptions::default()));
    let unfused = compile(w.options(CompileOptions::unfused()));
    let (a, b) = (fused.run(&w.feed_refs()).unwrap(), unfused.run(&w.feed_refs()).unwrap());
    let tol = fusegraph_workloads::tolerance(&CompileOptions::default());
    assert_close(&a[0], &b[0], tol, tol).unwrap();
    let before: BTreeMap<&str, &HostTensor> = w.params.iter().map(|(n, v)| (n.as_str(), v)).collect();
    for (name, _) in &w.updates {
        let (x, y) = (fused.parameter(name).unwrap(), unfused.parameter(name).unwrap());
        assert_close(&x, &y, tol, tol).unwrap_or_else(|e| panic!("update of `{name}`: {e}"));
        assert_ne!(x.to_f64(), before[name.as_str()].to_f64(), "`{name}` did not move");
    }
    let forward_only = compile(CompileOptions::default());
    assert!(forward_only.stats().kernels.len() < fused.stats().kernels.len());
}
