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

/// Fine-tuning: with `trainable` naming the head's parameters, a step updates those and
/// leaves the rest (and creates no optimizer state for them); a name the loss does not read
/// is a typed error.
#[test]
fn only_the_trainable_parameters_change() {
    use fusegraph::nn::Module;
    let model = mlp_model(&[6, 8, 3]).unwrap();
    let head: Vec<String> = model.layers[1].params().iter().map(|p| p.path().to_string()).collect();
    let b = GraphBuilder::new();
    let mut p = Params::of(&model, 3).unwrap();
    let objective = mlp(&b, &model, 4).unwrap();
    let opts = TrainOptions { trainable: Some(head.clone()), ..Default::default() };
    let step = build_step(&b, &mut p, &objective, &Sgd::new(0.5), &opts).unwrap();
    assert_eq!(step.trained, {
        let mut h = head.clone();
        h.sort();
        h
    });
    let mut t = fusegraph::train::Trainer::new(&Device::shared().unwrap(), step, &p).unwrap();
    let before = t.store().read_all().unwrap();
    let x = fusegraph::HostTensor::new([4, 6], fusegraph_workloads::random_values(1, 24)).unwrap();
    let y = fusegraph::HostTensor::new([4], vec![0i32, 1, 2, 1]).unwrap();
    t.step(&[("x", &x), ("y", &y)]).unwrap();
    let after = t.store().read_all().unwrap();
    for (name, v) in &before {
        assert_eq!(after[name] != *v, head.contains(name), "{name}");
    }
    let b = GraphBuilder::new();
    let mut p = Params::of(&model, 3).unwrap();
    let objective = mlp(&b, &model, 4).unwrap();
    let bad = TrainOptions { trainable: Some(vec!["fc9.weight".into()]), ..Default::default() };
    let err = build_step(&b, &mut p, &objective, &Sgd::new(0.5), &bad).unwrap_err().to_string();
    assert!(err.contains("fc9.weight"), "{err}");
}
