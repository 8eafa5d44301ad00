//! Explicit gradient checkpointing: the same losses and updates as without it, and a lower
//! planned peak.

use fusegraph::nn::{Forward, Linear, Params, Scope};
use fusegraph::train::{build_step, cross_entropy, record_segment, Objective, Sgd, TrainOptions, TrainStep, Trainer};
use fusegraph::{DType, Device, GraphBuilder, HostTensor};
use fusegraph_workloads::demo::{blobs, mlp, mlp_model};

const BATCH: usize = 256;
/// Narrow and deep, so activations (not weights) dominate the step's memory.
const DIMS: [usize; 6] = [8, 32, 32, 32, 32, 4];

/// An MLP of blocks of two ReLU layers, each block one checkpoint segment: the backward
/// pass reads each block's inner activation (its second layer's weight gradient), which
/// only checkpointing drops, recomputing it (a matrix product, which rematerialization never
/// recomputes). (Single-layer segments, as the demo MLP's, leave checkpointing nothing to
/// drop: see `relu_layers_keep_only_their_outputs`.)
fn block_mlp(b: &GraphBuilder, p: &mut Params) -> Objective {
    let x = b.input("x", DType::F32, [BATCH, DIMS[0]]).unwrap();
    let y = b.input("y", DType::I32, [BATCH]).unwrap();
    let (mut h, mut segments) = (x, Vec::new());
    let last = DIMS.len() - 2;
    let s = Scope::root();
    for i in 0..last {
        let a = Linear::new(&s.at(format!("fc{i}a")), DIMS[i], DIMS[i + 1], true).unwrap();
        let c = Linear::new(&s.at(format!("fc{i}b")), DIMS[i + 1], DIMS[i + 1], true).unwrap();
        p.init(&(a.clone(), c.clone())).unwrap();
        let (r, seg) = record_segment(b, || c.forward(&a.forward(&h).unwrap().relu().unwrap()).unwrap().relu());
        h = r.unwrap();
        segments.push(seg);
    }
    let head = Linear::new(&s.at(format!("fc{last}")), DIMS[last], DIMS[last + 1], true).unwrap();
    p.init(&head).unwrap();
    let logits = head.forward(&h).unwrap();
    let loss = cross_entropy(&logits, &y).unwrap();
    Objective { output: logits, loss, segments }
}

fn step(checkpoint: bool) -> (TrainStep, Params) {
    let b = GraphBuilder::new();
    let mut p = Params::new(3);
    let fwd = block_mlp(&b, &mut p);
    let opts = TrainOptions { checkpoint, ..Default::default() };
    let s = build_step(&b, &mut p, &fwd, &Sgd { lr: 0.1, momentum: 0.9, weight_decay: 0.0 }, &opts).unwrap();
    (s, p)
}

/// Losses of `steps` training steps on the blobs, and the final first-layer weight.
fn train(checkpoint: bool, steps: usize) -> (Vec<f32>, HostTensor, u64) {
    let (s, p) = step(checkpoint);
    let mut t = Trainer::new(&Device::shared().unwrap(), s, &p).unwrap();
    let (x, y) = blobs(5, BATCH * steps, DIMS[0], DIMS[5]);
    let mut losses = Vec::new();
    for i in 0..steps {
        let xv = HostTensor::new([BATCH, DIMS[0]], x[i * BATCH * DIMS[0]..(i + 1) * BATCH * DIMS[0]].to_vec()).unwrap();
        let yv = HostTensor::new([BATCH], y[i * BATCH..(i + 1) * BATCH].to_vec()).unwrap();
        losses.push(t.step(&[("x", &xv), ("y", &yv)]).unwrap().loss);
    }
    (losses, t.parameter("fc0a.weight").unwrap(), t.planned_bytes())
}

#[test]
fn checkpointing_lowers_the_planned_peak_and_keeps_the_losses() {
    let (plain, _) = step(false);
    let (ck, _) = step(true);
    assert_eq!(plain.recomputed, 0);
    assert!(ck.recomputed > 0);
    let (a, b) = (plain.plan_summary().unwrap(), ck.plan_summary().unwrap());
    // Each block's inner activation is recomputed in the backward pass instead of kept:
    // at least three of the four (32 KiB each) leave the peak. (The scheduler sinks each
    // recomputation to just before its segment's gradients; run at the start of the
    // backward pass, all four would be live together.)
    let hidden = (BATCH * DIMS[1] * 4) as u64;
    assert!(b.arena_bytes + 3 * hidden <= a.arena_bytes, "arena {} -> {}", a.arena_bytes, b.arena_bytes);
    assert!(b.total_bytes < a.total_bytes);
    let device = Device::shared().unwrap();
    let (da, db) = (plain.plan(&device).unwrap(), ck.plan(&device).unwrap());
    assert!(db.arena_bytes < da.arena_bytes, "on the device: arena {} -> {}", da.arena_bytes, db.arena_bytes);

    let (la, wa, bytes_a) = train(false, 4);
    let (lb, wb, bytes_b) = train(true, 4);
    assert!(bytes_b < bytes_a, "compiled {bytes_a} -> {bytes_b}");
    for (x, y) in la.iter().zip(&lb) {
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1e-3), "losses {la:?} vs {lb:?}");
    }
    let (wa, wb) = (wa.as_slice::<f32>().unwrap(), wb.as_slice::<f32>().unwrap());
    for (x, y) in wa.iter().zip(wb) {
        assert!((x - y).abs() <= 1e-5 * (1.0 + x.abs()), "weights differ: {x} vs {y}");
    }
    assert!(la[3] < la[0], "the loss falls: {la:?}");
}

fn step_with(opts: &TrainOptions) -> TrainStep {
    let b = GraphBuilder::new();
    let mut p = Params::new(3);
    let fwd = block_mlp(&b, &mut p);
    build_step(&b, &mut p, &fwd, &Sgd { lr: 0.1, momentum: 0.9, weight_decay: 0.0 }, opts).unwrap()
}

#[test]
fn a_memory_limit_the_plain_step_misses_turns_checkpointing_on() {
    let plain = step_with(&TrainOptions::default()).plan_summary().unwrap().total_bytes;
    let ck = step_with(&TrainOptions { checkpoint: true, ..Default::default() }).plan_summary().unwrap().total_bytes;
    assert!(ck < plain);
    // Room for the checkpointed step only: the plain one (rematerialized toward the limit
    // too) does not fit, so every segment is checkpointed.
    let tight = step_with(&TrainOptions { memory_limit: Some(ck), ..Default::default() });
    assert!(tight.options.checkpoint, "checkpointing chosen");
    assert!(tight.recomputed > 0);
    let s = tight.plan_summary().unwrap();
    assert!(s.total_bytes <= ck, "{} within {ck}", s.total_bytes);
    // Room for the plain step: nothing is recomputed.
    let roomy = step_with(&TrainOptions { memory_limit: Some(plain), ..Default::default() });
    assert!(!roomy.options.checkpoint);
    assert_eq!(roomy.recomputed, 0);
    eprintln!("plain {plain} B, checkpointed {ck} B");
}

/// ReLU's gradient is written with its output (`y > 0`), not its input: a hidden layer
/// `relu(x·W + b)` stores only its result, read by the next layer and by its weight
/// gradient, and the product, bias and relu are one kernel. Written with the input
/// (`x ≥ 0`), every pre-activation would stay alive until the backward pass (the plain
/// step's arena 281,856 bytes in 32 kernels, against 150,784 in 28), and checkpointing would
/// have those pre-activations to recompute; as it is, checkpointing finds nothing left to
/// drop.
#[test]
fn relu_layers_keep_only_their_outputs() {
    let b = GraphBuilder::new();
    let model = mlp_model(&DIMS).unwrap();
    let mut p = Params::of(&model, 3).unwrap();
    let fwd = mlp(&b, &model, BATCH).unwrap();
    let sgd = Sgd { lr: 0.1, momentum: 0.9, weight_decay: 0.0 };
    let plain = build_step(&b, &mut p, &fwd, &sgd, &TrainOptions::default()).unwrap();
    let s = plain.plan_summary().unwrap();
    eprintln!("relu MLP step: arena {} bytes, {} kernels", s.arena_bytes, s.kernels);
    // The live activations at the peak: the four hidden outputs (32 KiB each, batch 256 by
    // 32 f32) and smaller values, not eight.
    let hidden = (BATCH * 32 * 4) as u64;
    assert!(s.arena_bytes < 5 * hidden, "arena {} bytes: pre-activations kept", s.arena_bytes);
    let ck = build_step(&b, &mut p, &fwd, &sgd, &TrainOptions { checkpoint: true, ..Default::default() }).unwrap();
    assert_eq!(ck.plan_summary().unwrap().arena_bytes, s.arena_bytes, "checkpointing drops nothing more");
}

/// The `train` demo's LM (four blocks, each a checkpoint segment): checkpointed, the planned
/// arena is well under the plain step's, as it holds one block's recomputed activations at a
/// time. Two things would make it hold several: the scheduler running each recomputation as
/// soon as it is ready (at the start of the backward pass), and sibling fusion merging the
/// blocks' recomputations into shared kernels because they all compute gelu's constants.
#[test]
fn checkpointing_the_lm_recomputes_one_block_at_a_time() {
    use fusegraph_workloads::demo::{build, Config, Task};
    let arena = |checkpoint: bool| {
        let mut cfg = Config::new(Task::Lm, false);
        cfg.options.checkpoint = checkpoint;
        build(&cfg).unwrap().step.plan_summary().unwrap().arena_bytes
    };
    let (plain, ck) = (arena(false), arena(true));
    assert!(ck * 4 <= plain * 3, "checkpointed arena {ck} bytes against {plain} plain");
}
