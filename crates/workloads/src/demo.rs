//! The training demo behind `examples/train.rs` and the training tests: an MLP classifier on
//! Gaussian blobs and a small GPT-style character language model on text from a tiny
//! grammar, both generated in-process from a seed (no downloads), trained with Adam.

use fusegraph::train::{
    build_step, cross_entropy, record_segment, Adam, Objective, Result, TrainOptions, TrainStep, Trainer,
};
use fusegraph::{CompileOptions, DType, Device, GraphBuilder, HostTensor, ParamStore};
use fusegraph_nn::{Forward, Gpt, GptConfig, MlpClassifier, Module, Params, Scope};
use std::sync::Arc;
use std::time::Instant;

/// Which model to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    /// An MLP classifier on Gaussian blobs.
    Mlp,
    /// A GPT-style character language model on grammar text.
    Lm,
}

impl Task {
    /// `"mlp"` or `"lm"`.
    pub fn name(self) -> &'static str {
        match self {
            Task::Mlp => "mlp",
            Task::Lm => "lm",
        }
    }
}

/// A demo run's configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The model and task.
    pub task: Task,
    /// Optimizer steps (each `options.accumulate` micro-batches).
    pub steps: usize,
    /// Small sizes (seconds on a CPU adapter).
    pub quick: bool,
    /// Accumulation, mixed precision, checkpointing, memory limit.
    pub options: TrainOptions,
    /// Adam's learning rate.
    pub lr: f64,
    /// Seed of the data and the initial parameters.
    pub seed: u64,
}

impl Config {
    /// Defaults for `task`: 60 (quick) or 300 steps for the MLP, 80 or 300 for the LM, Adam
    /// at 1e-2 (MLP) or 3e-3 (LM), seed 1.
    pub fn new(task: Task, quick: bool) -> Self {
        let (steps, lr) = match (task, quick) {
            (Task::Mlp, true) => (60, 1e-2),
            (Task::Mlp, false) => (300, 1e-2),
            (Task::Lm, true) => (80, 3e-3),
            (Task::Lm, false) => (300, 3e-3),
        };
        Config { task, steps, quick, options: TrainOptions::default(), lr, seed: 1 }
    }
}

/// A built (not yet compiled) demo: the step, the parameters and the data.
pub struct Setup {
    /// The training step.
    pub step: TrainStep,
    /// Initial parameters and state.
    pub params: Params,
    /// The model.
    pub model: Model,
    data: Data,
}

enum Data {
    Blobs { x: Vec<f32>, y: Vec<i32>, dim: usize, batch: usize },
    Text { tokens: Vec<i32>, seq: usize, batch: usize, seed: u64 },
}

/// The data's generator: the workspace's seeded PCG, with the draws the data uses.
struct Rng(rand_pcg::Pcg64Mcg);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(rand::SeedableRng::seed_from_u64(seed))
    }
    fn below(&mut self, n: usize) -> usize {
        rand::Rng::random_range(&mut self.0, 0..n.max(1))
    }
    fn normal(&mut self) -> f64 {
        rand::Rng::sample(&mut self.0, rand_distr::StandardNormal)
    }
}

/// Sizes of the MLP task: `(input dim, hidden, hidden layers, classes, batch)`.
fn mlp_sizes(quick: bool) -> (usize, usize, usize, usize, usize) {
    if quick {
        (16, 64, 2, 4, 64)
    } else {
        (32, 256, 3, 8, 256)
    }
}

/// Sizes of the LM: `(vocab, seq, d_model, heads, d_mlp, layers, batch)`.
fn lm_sizes(quick: bool) -> (usize, usize, usize, usize, usize, usize, usize) {
    if quick {
        (32, 16, 32, 2, 64, 2, 8)
    } else {
        (32, 32, 64, 4, 256, 4, 16)
    }
}

/// The blobs: `n` samples of `classes` Gaussian clusters (centers `N(0, 0.6²)` per
/// coordinate, unit noise), overlapping enough that the loss levels off above zero.
/// Returns the row-major `[n, dim]` points and their classes.
pub fn blobs(seed: u64, n: usize, dim: usize, classes: usize) -> (Vec<f32>, Vec<i32>) {
    let mut r = Rng::new(seed);
    let centers: Vec<f64> = (0..classes * dim).map(|_| 0.6 * r.normal()).collect();
    let (mut x, mut y) = (Vec::with_capacity(n * dim), Vec::with_capacity(n));
    for _ in 0..n {
        let c = r.below(classes);
        y.push(c as i32);
        x.extend((0..dim).map(|d| (centers[c * dim + d] + r.normal()) as f32));
    }
    (x, y)
}

/// Sentences from a tiny grammar ("the cat sees a fish. ..."), as characters.
fn grammar_text(seed: u64, chars: usize) -> String {
    let subjects = ["the cat", "a dog", "my bird", "the fox"];
    let verbs = ["sees", "eats", "likes", "hides"];
    let objects = ["a fish", "the seeds", "some milk", "an egg"];
    let mut r = Rng::new(seed);
    let mut s = String::new();
    while s.len() < chars {
        s.push_str(subjects[r.below(4)]);
        s.push(' ');
        s.push_str(verbs[r.below(4)]);
        s.push(' ');
        s.push_str(objects[r.below(4)]);
        s.push_str(". ");
    }
    s
}

/// Token ids of `text`: letters a–z as 0–25, space 26, '.' 27, anything else 28.
fn tokenize(text: &str) -> Vec<i32> {
    text.bytes()
        .map(|c| match c {
            b'a'..=b'z' => (c - b'a') as i32,
            b' ' => 26,
            b'.' => 27,
            _ => 28,
        })
        .collect()
}

/// The MLP classifier of the task: linear layers `fc{i}` of widths `dims`, ReLU between
/// them.
pub fn mlp_model(dims: &[usize]) -> Result<MlpClassifier> {
    Ok(MlpClassifier::new(&Scope::root(), dims)?)
}

/// The MLP's objective at `batch`: inputs `"x"` f32 `[batch, dims[0]]` and `"y"` i32
/// `[batch]` (class indices), the model's logits (each hidden layer one checkpoint segment)
/// and their cross-entropy.
pub fn mlp(b: &GraphBuilder, model: &MlpClassifier, batch: usize) -> Result<Objective> {
    let x = b.input("x", DType::F32, [batch, model.layers[0].in_dim()])?;
    let y = b.input("y", DType::I32, [batch])?;
    let (hidden, last) = model.layers.split_at(model.layers.len() - 1);
    let mut h = x;
    let mut segments = Vec::new();
    for layer in hidden {
        let (r, seg) = record_segment(b, || -> Result<_> { Ok(layer.forward(&h)?.relu()?) });
        h = r?;
        segments.push(seg);
    }
    let logits = last[0].forward(&h)?;
    let loss = cross_entropy(&logits, &y)?;
    Ok(Objective { output: logits, loss, segments })
}

/// The GPT-2 style character LM of the task: a [`Gpt`] with a vocabulary, `layers` causal
/// blocks, tied output weights, positions up to `max_seq`.
pub fn lm_model(
    vocab: usize,
    max_seq: usize,
    d_model: usize,
    heads: usize,
    d_mlp: usize,
    layers: usize,
) -> Result<Gpt> {
    Ok(Gpt::new(&Scope::root(), GptConfig { d_model, heads, d_mlp, layers, vocab: Some(vocab), max_seq })?)
}

/// The LM's objective at `[batch, seq]`: inputs `"ids"` and `"targets"` i32 `[batch, seq]`,
/// the logits (each transformer block one checkpoint segment) and their cross-entropy over
/// the vocabulary.
pub fn lm(b: &GraphBuilder, model: &Gpt, batch: usize, seq: usize) -> Result<Objective> {
    let ids = b.input("ids", DType::I32, [batch, seq])?;
    let targets = b.input("targets", DType::I32, [batch, seq])?;
    let mut h = model.embed(&ids)?;
    let mut segments = Vec::new();
    for block in &model.blocks {
        let (r, seg) = record_segment(b, || block.forward(&h));
        h = r?;
        segments.push(seg);
    }
    let logits = model.head(&h)?;
    let loss = cross_entropy(&logits, &targets)?;
    Ok(Objective { output: logits, loss, segments })
}

/// The model of a demo.
pub enum Model {
    /// [`mlp_model`].
    Mlp(MlpClassifier),
    /// [`lm_model`].
    Lm(Box<Gpt>),
}

impl Model {
    /// The model as a module (its parameters).
    pub fn module(&self) -> &dyn Module {
        match self {
            Model::Mlp(m) => m,
            Model::Lm(m) => m.as_ref(),
        }
    }

    /// The model's objective at `batch` (the LM at its training length).
    pub fn objective(&self, b: &GraphBuilder, batch: usize) -> Result<Objective> {
        match self {
            Model::Mlp(m) => mlp(b, m, batch),
            Model::Lm(m) => lm(b, m, batch, m.config.max_seq),
        }
    }
}

/// Records the model, loss and step for `cfg` (no device needed).
pub fn build(cfg: &Config) -> Result<Setup> {
    let (model, data, batch) = match cfg.task {
        Task::Mlp => {
            let (dim, hidden, layers, classes, batch) = mlp_sizes(cfg.quick);
            let mut dims = vec![dim];
            dims.extend(std::iter::repeat_n(hidden, layers));
            dims.push(classes);
            let (x, y) = blobs(cfg.seed, 4096, dim, classes);
            (Model::Mlp(mlp_model(&dims)?), Data::Blobs { x, y, dim, batch }, batch)
        }
        Task::Lm => {
            let (vocab, seq, d, heads, d_mlp, layers, batch) = lm_sizes(cfg.quick);
            let tokens = tokenize(&grammar_text(cfg.seed, 8192));
            (
                Model::Lm(Box::new(lm_model(vocab, seq, d, heads, d_mlp, layers)?)),
                Data::Text { tokens, seq, batch, seed: cfg.seed },
                batch,
            )
        }
    };
    let mut params = Params::of(model.module(), cfg.seed)?;
    let b = GraphBuilder::new();
    let objective = model.objective(&b, batch)?;
    let step = build_step(&b, &mut params, &objective, &Adam::new(cfg.lr), &cfg.options)?;
    Ok(Setup { step, params, model, data })
}

impl Setup {
    /// The training batch size.
    pub fn batch(&self) -> usize {
        match &self.data {
            Data::Blobs { batch, .. } | Data::Text { batch, .. } => *batch,
        }
    }

    /// The feeds of micro-batch `i` (deterministic in `i`).
    pub fn feeds(&self, i: usize) -> Result<Vec<(String, HostTensor)>> {
        self.feeds_at(i, self.batch())
    }

    /// The feeds of micro-batch `i` at another `batch` size (an evaluation's, say).
    pub fn feeds_at(&self, i: usize, batch: usize) -> Result<Vec<(String, HostTensor)>> {
        let batch = &batch;
        match &self.data {
            Data::Blobs { x, y, dim, .. } => {
                let n = y.len();
                let rows: Vec<usize> = (0..*batch).map(|r| (i * batch + r) % n).collect();
                let xs: Vec<f32> = rows.iter().flat_map(|&r| x[r * dim..(r + 1) * dim].iter().copied()).collect();
                let ys: Vec<i32> = rows.iter().map(|&r| y[r]).collect();
                Ok(vec![
                    ("x".into(), HostTensor::new([*batch, *dim], xs)?),
                    ("y".into(), HostTensor::new([*batch], ys)?),
                ])
            }
            Data::Text { tokens, seq, seed, .. } => {
                let mut r = Rng::new(seed.wrapping_add(1 + i as u64));
                let (mut ids, mut targets) = (Vec::new(), Vec::new());
                for _ in 0..*batch {
                    let start = r.below(tokens.len() - seq - 1);
                    ids.extend_from_slice(&tokens[start..start + seq]);
                    targets.extend_from_slice(&tokens[start + 1..start + seq + 1]);
                }
                Ok(vec![
                    ("ids".into(), HostTensor::new([*batch, *seq], ids)?),
                    ("targets".into(), HostTensor::new([*batch, *seq], targets)?),
                ])
            }
        }
    }
}

/// The figures of a demo run.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Report {
    /// `"mlp"` or `"lm"`.
    pub model: String,
    /// Mean loss over the first optimizer step's micro-batches.
    pub first_loss: f64,
    /// Mean loss over the last tenth of the optimizer steps (at least one), which smooths
    /// the micro-batch noise.
    pub last_loss: f64,
    /// Every micro-batch's loss.
    pub losses: Vec<f32>,
    /// Optimizer steps run.
    pub steps: usize,
    /// Optimizer steps skipped (loss-scale overflow).
    pub skipped: usize,
    /// Planned device bytes of the step executable (parameters and state + arena +
    /// staging).
    pub peak_bytes: u64,
    /// The arena part of it (activations, gradients, update values).
    pub arena_bytes: u64,
    /// Kernels per run.
    pub kernels: usize,
    /// Median wall time of one optimizer step (all its micro-batches: upload, run,
    /// readback), in ms.
    pub median_step_ms: f64,
    /// Micro-batches per step.
    pub accumulate: usize,
    /// Mixed precision on.
    pub mixed_precision: bool,
    /// Checkpointing on (asked for, or chosen automatically under the memory limit).
    pub checkpoint: bool,
    /// Forward nodes recomputed by checkpointing.
    pub recomputed: usize,
    /// The final loss scale (mixed precision).
    pub loss_scale: Option<f32>,
    /// The batch size of the evaluation after training (another graph, bound to the
    /// trainer's parameter store).
    pub eval_batch: usize,
    /// The evaluation's mean loss over its micro-batches ([`evaluate`]).
    pub eval_loss: f64,
    /// Bytes of the parameter store (weights and optimizer state), held once on the device
    /// for the training step and the evaluation.
    pub store_bytes: u64,
}

impl Report {
    /// The report as one JSON object, a key per field (a non-finite loss or time is
    /// `null`).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report of numbers and strings serializes")
    }
}

/// Progress of a run: `(step, steps, last loss, steps per second)` after each optimizer
/// step.
pub type Progress<'a> = &'a mut dyn FnMut(usize, usize, f32, f64);

/// Builds, compiles and trains `cfg` on `device`, calling `progress` after each optimizer
/// step.
pub fn run(cfg: &Config, device: &Arc<Device>, progress: Progress<'_>) -> Result<Report> {
    let setup = build(cfg)?;
    let mut trainer = Trainer::new(device, setup.step.clone(), &setup.params)?;
    let n = cfg.options.accumulate;
    let (mut losses, mut times, mut skipped) = (Vec::new(), Vec::new(), 0);
    let start = Instant::now();
    for step in 0..cfg.steps {
        let t0 = Instant::now();
        for m in 0..n {
            let feeds = setup.feeds(step * n + m)?;
            let refs: Vec<(&str, &HostTensor)> = feeds.iter().map(|(k, v)| (k.as_str(), v)).collect();
            let out = trainer.step(&refs)?;
            losses.push(out.loss);
            if out.window_end && !out.applied {
                skipped += 1;
            }
        }
        times.push(t0.elapsed().as_secs_f64() * 1e3);
        let rate = (step + 1) as f64 / start.elapsed().as_secs_f64().max(1e-9);
        progress(step + 1, cfg.steps, losses.last().copied().unwrap_or(f32::NAN), rate);
    }
    let window_mean = |w: &[f32]| w.iter().map(|&v| v as f64).sum::<f64>() / w.len().max(1) as f64;
    let first = window_mean(&losses[..n.min(losses.len())]);
    let tail = n * (cfg.steps / 10).max(1);
    let last = window_mean(&losses[losses.len().saturating_sub(tail)..]);
    times.sort_by(|a, b| a.total_cmp(b));
    let median = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
    let eval_batch = setup.batch() * 2 + 1;
    let eval_loss = evaluate(&setup, trainer.store(), eval_batch, 4)?;
    let stats = trainer.executable().stats();
    Ok(Report {
        model: cfg.task.name().into(),
        first_loss: first,
        last_loss: last,
        losses,
        steps: cfg.steps,
        skipped,
        peak_bytes: trainer.planned_bytes(),
        arena_bytes: stats.arena_bytes,
        kernels: stats.kernels.len(),
        median_step_ms: median,
        accumulate: n,
        mixed_precision: cfg.options.mixed_precision.is_some(),
        checkpoint: setup.step.options.checkpoint,
        recomputed: setup.step.recomputed,
        loss_scale: trainer.loss_scale()?,
        eval_batch,
        eval_loss,
        store_bytes: trainer.store().bytes(),
    })
}

/// The mean loss of the model over `batches` micro-batches of `batch` rows not drawn in
/// training,
/// compiled at that batch against `store` (the trainer's: the weights as trained, no copy).
pub fn evaluate(setup: &Setup, store: &ParamStore, batch: usize, batches: usize) -> Result<f64> {
    let b = GraphBuilder::new();
    let objective = setup.model.objective(&b, batch)?;
    let opts = CompileOptions { name: Some("evaluation".into()), ..Default::default() };
    let exe = store.compile(&b.graph(), &[objective.loss.id()], &opts)?;
    let mut total = 0.0;
    for i in 0..batches {
        // Micro-batch indices no run of the demo trains on (the blobs repeat their 4096
        // samples, so for the MLP these are training samples again).
        let feeds = setup.feeds_at(1_000_000 + i, batch)?;
        let refs: Vec<(&str, &HostTensor)> = feeds.iter().map(|(k, v)| (k.as_str(), v)).collect();
        total += exe.run(&refs)?[0].to_f64()[0];
    }
    Ok(total / batches.max(1) as f64)
}
