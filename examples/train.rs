//! Trains a model with one executable per step (forward, backward, Adam update on the device):
//! an MLP on Gaussian blobs or a small GPT-style character LM on grammar text, both generated
//! in-process; then evaluates it at another batch size with a second executable bound to the
//! same parameter store. The models are `fusegraph::nn`'s (`MlpClassifier`, `Gpt`); their
//! objectives and the loop are in `fusegraph_workloads::demo`.
//!
//! `cargo run --release --example train -- [--model mlp|lm] [--steps N] [--quick]
//! [--accumulate N] [--mixed-precision] [--checkpoint] [--memory-limit BYTES] [--json PATH]`

use clap::{Parser, ValueEnum};
use fusegraph::train::LossScaling;
use fusegraph_workloads::demo::{run, Config, Task};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

/// Trains a model with one executable per step (forward, backward, Adam update on the device).
#[derive(Parser)]
struct Args {
    /// The model and task.
    #[arg(long, value_enum, default_value_t = Model::Mlp)]
    model: Model,
    /// Optimizer steps [default: the model's, fewer with --quick].
    #[arg(long, value_name = "N")]
    steps: Option<usize>,
    /// Small sizes (seconds on a CPU adapter).
    #[arg(long)]
    quick: bool,
    /// Micro-batches per optimizer step (gradient accumulation).
    #[arg(long, value_name = "N", default_value_t = NonZeroUsize::MIN)]
    accumulate: NonZeroUsize,
    /// Mixed precision (f16 storage) with dynamic loss scaling.
    #[arg(long)]
    mixed_precision: bool,
    /// Gradient checkpointing: recompute forward values in the backward pass.
    #[arg(long)]
    checkpoint: bool,
    /// Memory limit in bytes (checkpointing where needed to meet it).
    #[arg(long, value_name = "BYTES")]
    memory_limit: Option<u64>,
    /// Write the report as JSON to PATH.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Model {
    /// An MLP classifier on Gaussian blobs.
    Mlp,
    /// A GPT-style character language model on grammar text.
    Lm,
}

fn main() {
    let args = Args::parse();
    fusegraph::init_logging();
    let task = match args.model {
        Model::Mlp => Task::Mlp,
        Model::Lm => Task::Lm,
    };
    let mut cfg = Config::new(task, args.quick);
    if let Some(s) = args.steps {
        cfg.steps = s;
    }
    cfg.options.accumulate = args.accumulate.get();
    cfg.options.mixed_precision = args.mixed_precision.then(LossScaling::default);
    cfg.options.checkpoint = args.checkpoint;
    cfg.options.memory_limit = args.memory_limit;
    if let Err(e) = train(&cfg, args.json.as_deref()) {
        eprintln!("\nerror: {e}");
        std::process::exit(1);
    }
}

fn train(cfg: &Config, json: Option<&Path>) -> Result<(), Box<dyn std::error::Error>> {
    let device = fusegraph::Device::shared()?;
    println!(
        "train {}: {} steps × {} micro-batch(es){}{}{} on {}",
        cfg.task.name(),
        cfg.steps,
        cfg.options.accumulate,
        if cfg.options.mixed_precision.is_some() { ", mixed precision" } else { "" },
        if cfg.options.checkpoint { ", checkpointing" } else { "" },
        cfg.options.memory_limit.map(|l| format!(", memory limit {l} B")).unwrap_or_default(),
        device.describe()
    );
    // Drawn on a terminal only (indicatif hides itself elsewhere).
    let bar = indicatif::ProgressBar::new(cfg.steps as u64)
        .with_style(indicatif::ProgressStyle::with_template("step {pos}/{len} {msg}").expect("a valid template"));
    let mut progress = |step: usize, _steps: usize, loss: f32, rate: f64| {
        bar.set_position(step as u64);
        bar.set_message(format!("loss {loss:.4} {rate:.1} steps/s"));
    };
    let report = run(cfg, &device, &mut progress)?;
    bar.finish_and_clear();
    println!("first loss    {:.4}", report.first_loss);
    println!("last loss     {:.4}", report.last_loss);
    println!("steps         {} ({} skipped)", report.steps, report.skipped);
    println!("planned peak  {} B (arena {} B), {} kernels/run", report.peak_bytes, report.arena_bytes, report.kernels);
    println!("median step   {:.2} ms", report.median_step_ms);
    if report.recomputed > 0 {
        println!("checkpointing {} forward nodes recomputed", report.recomputed);
    }
    if let Some(s) = report.loss_scale {
        println!("loss scale    {s}");
    }
    println!(
        "evaluation    loss {:.4} at batch {} (another executable bound to the trainer's store: {} B of weights and \
         optimizer state, held once)",
        report.eval_loss, report.eval_batch, report.store_bytes
    );
    if let Some(path) = json {
        std::fs::write(path, report.to_json() + "\n")?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
