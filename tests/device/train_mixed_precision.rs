//! Mixed precision: f16 forward/backward with f32 master weights and dynamic loss scaling.

use fusegraph::crates::nn::Params;
use fusegraph::train::{build_step, LossScaling, Sgd, TrainOptions, Trainer, GOOD_STEPS, LOSS_SCALE};
use fusegraph::{Device, GraphBuilder, HostTensor};
use fusegraph_workloads::demo::{self, blobs, mlp, mlp_model, Config, Task};

const BATCH: usize = 16;
const DIMS: [usize; 3] = [8, 16, 4];

fn trainer(accumulate: usize) -> Trainer {
    let b = GraphBuilder::new();
    let model = mlp_model(&DIMS).unwrap();
    let mut p = Params::of(&model, 4).unwrap();
    let fwd = mlp(&b, &model, BATCH).unwrap();
    let scaling = LossScaling { init_scale: 8.0, growth_interval: 2, min_scale: 1.0 };
    let opts = TrainOptions { accumulate, mixed_precision: Some(scaling), ..Default::default() };
    let s = build_step(&b, &mut p, &fwd, &Sgd::new(0.1), &opts).unwrap();
    Trainer::new(&Device::shared().unwrap(), s, &p).unwrap()
}

fn data(nan: bool) -> (HostTensor, HostTensor) {
    let (mut x, y) = blobs(9, BATCH, DIMS[0], DIMS[2]);
    if nan {
        x[3] = f32::NAN;
    }
    (HostTensor::new([BATCH, DIMS[0]], x).unwrap(), HostTensor::new([BATCH], y).unwrap())
}

fn scalar(t: &Trainer, name: &str) -> f32 {
    t.parameter(name).unwrap().as_slice::<f32>().unwrap()[0]
}

fn weights(t: &Trainer) -> Vec<f32> {
    t.parameter("fc0.weight").unwrap().as_slice::<f32>().unwrap().to_vec()
}

#[test]
fn mixed_precision_trains_to_within_5_percent_of_f32() {
    let device = Device::shared().unwrap();
    let f32_run = demo::run(&Config::new(Task::Mlp, true), &device, &mut |_, _, _, _| {}).unwrap();
    let mut cfg = Config::new(Task::Mlp, true);
    cfg.options.mixed_precision = Some(LossScaling::default());
    let mixed = demo::run(&cfg, &device, &mut |_, _, _, _| {}).unwrap();
    assert_eq!(mixed.skipped, 0);
    let (a, b) = (f32_run.last_loss, mixed.last_loss);
    assert!(b < mixed.first_loss * 0.5, "mixed precision trains: {} -> {b}", mixed.first_loss);
    assert!((a - b).abs() <= 0.05 * a, "f32 final loss {a}, mixed {b}");
}

#[test]
fn an_overflow_skips_the_step_and_halves_the_scale_then_good_steps_grow_it() {
    let mut t = trainer(1);
    let (x, y) = data(false);
    let feeds = [("x", &x), ("y", &y)];
    let w0 = weights(&t);
    // A huge scale overflows f16 in the backward pass: every gradient is infinite.
    t.set_parameter(LOSS_SCALE, &HostTensor::new(Vec::<usize>::new(), vec![1e30f32]).unwrap()).unwrap();
    let r = t.step(&feeds).unwrap();
    assert!(r.loss.is_finite() && !r.applied);
    assert_eq!(weights(&t), w0, "skipped step leaves the weights");
    assert_eq!(scalar(&t, LOSS_SCALE), 5e29);
    assert_eq!(scalar(&t, GOOD_STEPS), 0.0);

    // A NaN in the input is caught the same way.
    t.set_parameter(LOSS_SCALE, &HostTensor::new(Vec::<usize>::new(), vec![8.0f32]).unwrap()).unwrap();
    let (xn, yn) = data(true);
    assert!(!t.step(&[("x", &xn), ("y", &yn)]).unwrap().applied);
    assert_eq!(weights(&t), w0);
    assert_eq!(t.loss_scale().unwrap(), Some(4.0));

    // Good steps apply, and after `growth_interval` (2) of them the scale doubles.
    assert!(t.step(&feeds).unwrap().applied);
    assert_ne!(weights(&t), w0);
    assert_eq!((scalar(&t, LOSS_SCALE), scalar(&t, GOOD_STEPS)), (4.0, 1.0));
    assert!(t.step(&feeds).unwrap().applied);
    assert_eq!((scalar(&t, LOSS_SCALE), scalar(&t, GOOD_STEPS)), (8.0, 0.0));
}

#[test]
fn an_overflow_inside_an_accumulation_window_skips_the_whole_window() {
    let mut t = trainer(2);
    let (x, y) = data(false);
    let (xn, yn) = data(true);
    let w0 = weights(&t);
    // NaN in the first micro-batch, a good second one: the window's update is skipped.
    assert!(!t.step(&[("x", &xn), ("y", &yn)]).unwrap().window_end);
    let r = t.step(&[("x", &x), ("y", &y)]).unwrap();
    assert!(r.window_end && !r.applied);
    assert_eq!(weights(&t), w0);
    assert_eq!(t.loss_scale().unwrap(), Some(4.0));
    let acc = t.parameter("fc0.weight.grad_acc").unwrap();
    assert!(acc.as_slice::<f32>().unwrap().iter().all(|&v| v == 0.0));
    // The next window is clean and applies.
    assert!(!t.step(&[("x", &x), ("y", &y)]).unwrap().applied);
    assert!(t.step(&[("x", &x), ("y", &y)]).unwrap().applied);
    assert_ne!(weights(&t), w0);
    assert_eq!(scalar(&t, GOOD_STEPS), 1.0);
}

/// The LM demo trains in mixed precision, fused and unfused (where every f16 op rounds): no
/// step overflows at the default loss scale, and the loss falls as in f32. Its layer norms'
/// `1/σ` reaches ~58, so the gradient of `rsqrt` takes `gy` first: formed first, `y³` would
/// overflow f16 from `y` = 40, and every step would overflow (all skipped, the scale falling
/// to 1 and the loss never moving).
#[test]
fn mixed_precision_trains_the_lm_fused_and_unfused() {
    let device = Device::shared().unwrap();
    let mut cfg = Config::new(Task::Lm, true);
    cfg.steps = 20;
    let f32_run = demo::run(&cfg, &device, &mut |_, _, _, _| {}).unwrap();
    for fusion in [fusegraph::FusionMode::On, fusegraph::FusionMode::Off] {
        let mut cfg = cfg.clone();
        cfg.options.mixed_precision = Some(LossScaling::default());
        cfg.options.fusion = fusion;
        let mixed = demo::run(&cfg, &device, &mut |_, _, _, _| {}).unwrap();
        eprintln!(
            "{fusion:?}: loss {} -> {} in {} steps, {} skipped (f32: {} -> {})",
            mixed.first_loss, mixed.last_loss, mixed.steps, mixed.skipped, f32_run.first_loss, f32_run.last_loss
        );
        assert_eq!(mixed.skipped, 0, "{fusion:?}: no step overflows");
        let (a, b) = (f32_run.last_loss, mixed.last_loss);
        assert!((a - b).abs() <= 0.05 * a, "{fusion:?}: f32 loss after {} steps {a}, mixed {b}", cfg.steps);
    }
}
