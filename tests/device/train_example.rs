//! The training example's model and task (what `cargo run --example train -- --quick` runs),
//! the fusion of optimizer updates, and typed errors of the training API.

use fusegraph::crates::nn::{Init, Params};
use fusegraph::train::{build_step, Adam, LossScaling, Optimizer, Sgd, TrainError, TrainOptions};
use fusegraph::{CompileOptions, DType, Device, GraphBuilder};
use fusegraph_workloads::demo::{self, mlp, mlp_model, Config, Task};

#[test]
fn the_quick_mlp_example_halves_its_loss_from_a_fresh_start() {
    let cfg = Config::new(Task::Mlp, true);
    let mut calls = 0;
    let r = demo::run(&cfg, &Device::shared().unwrap(), &mut |_, _, _, _| calls += 1).unwrap();
    assert_eq!(calls, cfg.steps);
    assert_eq!(r.losses.len(), cfg.steps);
    assert!(r.first_loss > 1.0, "starts near ln 4: {}", r.first_loss);
    assert!(r.last_loss <= 0.5 * r.first_loss, "loss {} -> {}", r.first_loss, r.last_loss);
    assert!(r.peak_bytes > r.arena_bytes && r.arena_bytes > 0 && r.median_step_ms > 0.0);
    let json = r.to_json();
    for key in [
        "\"model\":\"mlp\"",
        "\"first_loss\":",
        "\"last_loss\":",
        "\"steps\":60",
        "\"peak_bytes\":",
        "\"median_step_ms\":",
        "\"accumulate\":1",
        "\"mixed_precision\":false",
        "\"checkpoint\":false",
    ] {
        assert!(json.contains(key), "{key} missing in {json}");
    }
}

/// Kernels of the update of `params` parameters `[256, 64]` with gradients fed as inputs.
fn update_kernels(opt: &dyn Optimizer, params: usize, masked: bool) -> usize {
    let b = GraphBuilder::new();
    let mut p = Params::new(0);
    let (mut named, mut grads) = (Vec::new(), Vec::new());
    for i in 0..params {
        let name = format!("w{i}");
        named.push((name.clone(), p.parameter(&b, &name, DType::F32, &[256, 64], Init::Ones).unwrap()));
        grads.push(b.input(&format!("g{i}"), DType::F32, [256, 64]).unwrap());
    }
    let apply = b.input("apply", DType::F32, Vec::<usize>::new()).unwrap();
    let up = opt.step(&b, &mut p, &named, &grads, masked.then_some(&apply)).unwrap();
    let updates = up.iter().map(|(n, t)| (n.clone(), t.id())).collect();
    let exe = Device::shared().unwrap().compile(&b.graph(), &[], &CompileOptions { updates, ..Default::default() });
    exe.unwrap().stats().kernels.len()
}

#[test]
fn each_parameter_update_fuses_into_few_kernels() {
    let momentum = Sgd { lr: 0.1, momentum: 0.9, weight_decay: 1e-4 };
    // SGD with momentum: one kernel stores both parameters' buffers and weights (each new
    // buffer, an output the new weight reads, joins the weight's kernel; the two parameters'
    // kernels merge as siblings).
    assert_eq!(update_kernels(&momentum, 2, false), 1);
    assert_eq!(update_kernels(&momentum, 2, true), 1);
    // Adam: the step counter's kernel, then one for every moment and weight (the weights'
    // kernels recompute the constant 1 that the counter's kernel computes too, which does
    // not make them depend on it).
    assert_eq!(update_kernels(&Adam::new(1e-3), 2, false), 2);
    assert_eq!(update_kernels(&Adam::adamw(1e-3, 0.01), 2, true), 1);
}

#[test]
fn bad_training_configurations_are_typed_errors() {
    let build = |opts: TrainOptions, drop: Option<&str>| {
        let b = GraphBuilder::new();
        let model = mlp_model(&[3, 2]).unwrap();
        let p = Params::of(&model, 0).unwrap();
        let fwd = mlp(&b, &model, 4).unwrap();
        let mut p2 = Params::new(0);
        for (name, v) in p.iter().filter(|(n, _)| Some(n.as_str()) != drop) {
            p2.insert(name, v.clone());
        }
        build_step(&b, &mut p2, &fwd, &Adam::new(1e-3), &opts).err()
    };
    let config = |e: Option<TrainError>| matches!(e, Some(TrainError::Config(_)));
    assert!(config(build(TrainOptions { accumulate: 0, ..Default::default() }, None)));
    let bad_scale = LossScaling { init_scale: f64::INFINITY, ..Default::default() };
    assert!(config(build(TrainOptions { mixed_precision: Some(bad_scale), ..Default::default() }, None)));
    let missing = build(TrainOptions::default(), Some("fc0.bias")).unwrap();
    assert_eq!(missing.to_string(), "training: parameter `fc0.bias` has no value in Params");
    assert!(build(TrainOptions::default(), None).is_none());

    // A loss that is not a rank-0 f32.
    let b = GraphBuilder::new();
    let model = mlp_model(&[3, 2]).unwrap();
    let mut p = Params::of(&model, 0).unwrap();
    let mut fwd = mlp(&b, &model, 4).unwrap();
    fwd.loss = fwd.output.clone();
    assert!(config(build_step(&b, &mut p, &fwd, &Adam::new(1e-3), &TrainOptions::default()).err()));
}
