//! Trains a model with one executable per step (forward, backward, Adam update on the device):
//! an MLP on Gaussian blobs or a small GPT-style character LM on grammar text, both generated
//! in-process; then evaluates it at another batch size with a second executable bound to the
//! same parameter store. The models are `fusegraph::nn`'s (`MlpClassifier`, `Gpt`); their
//! objectives and the loop are in `fusegraph_workloads::demo`.
//!
//! `cargo run --release --example train -- [--model mlp|lm] [--steps N] [--quick]
//! [--accumulate N] [--mixed-precision] [--checkpoint] [--memory-limit BYTES] [--json PATH]`
//!
//! Data-parallel over MPI, one process per GPU (build with `--features mpi`):
//! `mpirun -np 2 target/release/examples/train --distributed [--shard-optimizer]
//! [--save PATH [--save-every N]] [--resume PATH --start-step K] …`; across hosts,
//! `mpirun -H host1:4,host2:4 -np 8 …` (each host's ranks take its GPUs in turn). Each step's
//! global batch is split by rows over the ranks; rank 0 prints and writes the report.

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
    /// With --mixed-precision: the initial loss scale.
    #[arg(long, value_name = "S", default_value_t = LossScaling::default().init_scale)]
    init_loss_scale: f64,
    /// Gradient checkpointing: recompute forward values in the backward pass.
    #[arg(long)]
    checkpoint: bool,
    /// Memory limit in bytes (checkpointing where needed to meet it).
    #[arg(long, value_name = "BYTES")]
    memory_limit: Option<u64>,
    /// Write the report as JSON to PATH.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Data-parallel over the processes `mpirun` started (needs the `mpi` feature).
    #[arg(long)]
    distributed: bool,
    /// With --distributed: shard the optimizer state over the ranks (ZeRO stage 1).
    #[arg(long)]
    shard_optimizer: bool,
    /// With --distributed: bytes per gradient all-reduce.
    #[arg(long, value_name = "BYTES", default_value_t = 25 << 20)]
    bucket_bytes: usize,
    /// With --distributed: compare the ranks' parameters after every step.
    #[arg(long)]
    check_replicas: bool,
    /// With --distributed: write a checkpoint to PATH at the end (rank 0).
    #[arg(long, value_name = "PATH")]
    save: Option<PathBuf>,
    /// With --save: also every N steps.
    #[arg(long, value_name = "N", default_value_t = 0)]
    save_every: usize,
    /// With --distributed: start from the checkpoint at PATH.
    #[arg(long, value_name = "PATH")]
    resume: Option<PathBuf>,
    /// With --distributed: the first step's index (where a resumed run goes on in the data).
    #[arg(long, value_name = "K", default_value_t = 0)]
    start_step: usize,
    /// With --distributed: the longest a collective waits for the other ranks, in seconds
    /// (0: no bound).
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    collective_timeout: u64,
    /// Fault test: rank R aborts before step S ("R:S").
    #[arg(long, value_name = "R:S", hide = true)]
    crash: Option<String>,
    /// Fault test: rank R stops answering before step S ("R:S").
    #[arg(long, value_name = "R:S", hide = true)]
    hang: Option<String>,
    /// Test: each rank draws its initial weights from another seed (all start from rank 0's).
    #[arg(long, hide = true)]
    rank_seeds: bool,
    /// Test: rank R records the other size of the model (`--quick` flipped), which the ranks'
    /// start-up check must refuse.
    #[arg(long, value_name = "R", hide = true)]
    mismatch: Option<usize>,
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
    cfg.options.mixed_precision =
        args.mixed_precision.then(|| LossScaling { init_scale: args.init_loss_scale, ..LossScaling::default() });
    cfg.options.checkpoint = args.checkpoint;
    cfg.options.memory_limit = args.memory_limit;
    if args.distributed {
        distributed(&cfg, &args);
    }
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

/// Trains data-parallel over MPI; on any error on a rank, ends every rank.
#[cfg(feature = "mpi")]
fn distributed(cfg: &fusegraph_workloads::demo::Config, args: &Args) -> ! {
    use fusegraph::distributed::{Collective, DistributedOptions, Mpi};
    use fusegraph_workloads::data_parallel::{run_parallel, Fault, Plan};
    let comm = match Mpi::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        let fault = match (&args.crash, &args.hang) {
            (Some(at), _) | (None, Some(at)) => {
                let (r, s) = at.split_once(':').ok_or("--crash and --hang take R:S")?;
                Some(Fault { rank: r.parse()?, step: s.parse()?, crash: args.crash.is_some() })
            }
            (None, None) => None,
        };
        let plan = Plan {
            dist: DistributedOptions {
                shard_optimizer: args.shard_optimizer,
                check_replicas: args.check_replicas,
                bucket_bytes: args.bucket_bytes,
                collective_timeout: (args.collective_timeout > 0)
                    .then(|| std::time::Duration::from_secs(args.collective_timeout)),
            },
            save: args.save.clone(),
            save_every: args.save_every,
            resume: args.resume.clone(),
            start_step: args.start_step,
            fault,
            rank_seeds: args.rank_seeds,
        };
        let device_opts = fusegraph::DeviceOptions { adapter: Some(comm.local_rank()), ..Default::default() };
        let device = std::sync::Arc::new(fusegraph::Device::new(&device_opts)?);
        let lead = comm.rank() == 0;
        if lead {
            println!(
                "train {} data-parallel: {} ranks, {} steps{} on {}",
                cfg.task.name(),
                comm.size(),
                cfg.steps,
                if args.shard_optimizer { ", optimizer state sharded" } else { "" },
                device.describe()
            );
        }
        let mut progress = |step: usize, loss: f32| {
            if lead && (step.is_multiple_of(10) || step == args.start_step + cfg.steps) {
                println!("step {step:4}  loss {loss:.4}");
            }
        };
        let mut cfg = cfg.clone();
        if args.mismatch == Some(comm.rank()) {
            cfg.quick = !cfg.quick;
        }
        let report = run_parallel(&cfg, &plan, &device, &comm, &mut progress)?;
        if lead {
            println!(
                "median step   {:.2} ms ({} ranks, global batch {})",
                report.median_step_ms, report.ranks, report.global_batch
            );
            println!("optimizer     {} B of state on each rank", report.optimizer_bytes);
            if let Some(path) = &args.json {
                std::fs::write(path, report.to_json() + "\n")?;
                println!("wrote {}", path.display());
            }
        }
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("\nerror on rank {}: {e}", comm.rank());
        comm.abort(1);
    }
    drop(comm);
    std::process::exit(0)
}

/// Without MPI there is nothing to distribute over.
#[cfg(not(feature = "mpi"))]
fn distributed(_: &fusegraph_workloads::demo::Config, _: &Args) -> ! {
    eprintln!("error: --distributed needs MPI: build with `cargo build --release --features mpi --example train`");
    std::process::exit(2)
}
