//! The data-parallel training demo behind `examples/train.rs --distributed` and the MPI
//! tests: the demo's models and data ([`crate::demo`]), each optimizer step's global batch
//! split by rows over the ranks of a [`Collective`].

use crate::demo::{build, Config};
use fusegraph::distributed::{shard_batch, Collective, DataParallel, DistributedOptions};
use fusegraph::train::{Adam, Result, TrainError};
use fusegraph::{Device, GraphBuilder, HostTensor, ParamStore};
use fusegraph_nn::Params;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// What a data-parallel run does besides training.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// Sharding, buckets, replica checks.
    pub dist: DistributedOptions,
    /// Write a checkpoint here at the end (and every `save_every` steps).
    pub save: Option<PathBuf>,
    /// Steps between checkpoints (0: only at the end).
    pub save_every: usize,
    /// Start from this checkpoint.
    pub resume: Option<PathBuf>,
    /// The index of the first step: where in the data a resumed run goes on.
    pub start_step: usize,
    /// A fault to inject, to check that the other ranks stop.
    pub fault: Option<Fault>,
    /// Each rank draws its initial weights from the seed plus its rank (the run is the same:
    /// every rank starts from rank 0's weights).
    pub rank_seeds: bool,
}

/// A rank that fails before a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Which rank.
    pub rank: usize,
    /// Before which step.
    pub step: usize,
    /// Ends abnormally (`abort`, as a crash would) if true, else stops answering (sleeps).
    pub crash: bool,
}

/// The figures of a data-parallel run.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ParallelReport {
    /// `"mlp"` or `"lm"`.
    pub model: String,
    /// Processes.
    pub ranks: usize,
    /// Optimizer state sharded over the ranks.
    pub shard_optimizer: bool,
    /// Rows of each step's global batch (per micro-batch).
    pub global_batch: usize,
    /// The first step's index.
    pub start_step: usize,
    /// The global batch's loss at each step (mean over ranks and micro-batches).
    pub losses: Vec<f32>,
    /// Steps skipped (loss-scale overflow).
    pub skipped: usize,
    /// Median wall time of a step (every micro-batch, the all-reduce, the update), in ms.
    pub median_step_ms: f64,
    /// Optimizer-state bytes on this rank's device.
    pub optimizer_bytes: u64,
    /// Trained elements (the all-reduced vector's length).
    pub trained_elements: usize,
}

impl ParallelReport {
    /// The report as one JSON object.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report of numbers and strings serializes")
    }
}

/// Trains `cfg` for `cfg.steps` steps data-parallel over `comm`'s ranks on `device`, each
/// rank on its rows of the demo's batches; `progress(step, loss)` after each step.
pub fn run_parallel(
    cfg: &Config,
    plan: &Plan,
    device: &Arc<Device>,
    comm: &dyn Collective,
    progress: &mut dyn FnMut(usize, f32),
) -> Result<ParallelReport> {
    let setup = build(cfg)?;
    let (rank, size) = (comm.rank(), comm.size());
    let global = setup.batch();
    if global % size != 0 {
        return Err(TrainError::Config(format!("a global batch of {global} rows does not split over {size} ranks")));
    }
    let seed = if plan.rank_seeds { cfg.seed + rank as u64 } else { cfg.seed };
    let mut params = Params::of(setup.model.module(), seed)?;
    if let Some(path) = &plan.resume {
        params.load_safetensors(path)?;
    }
    let b = GraphBuilder::new();
    let objective = setup.model.objective(&b, global / size)?;
    let store = ParamStore::new(device);
    let adam = Adam::new(cfg.lr);
    let mut dp = DataParallel::new(&store, &b, &mut params, &objective, &adam, &cfg.options, &plan.dist, comm)?;
    let n = cfg.options.accumulate;
    let (mut losses, mut times, mut skipped) = (Vec::new(), Vec::new(), 0);
    for step in plan.start_step..plan.start_step + cfg.steps {
        match plan.fault {
            Some(f) if f.rank == rank && f.step == step && f.crash => std::process::abort(),
            Some(f) if f.rank == rank && f.step == step => loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            },
            _ => {}
        }
        let t0 = Instant::now();
        for m in 0..n {
            let feeds = setup.feeds_at(step * n + m, global)?;
            let mine: Vec<(String, HostTensor)> =
                feeds.iter().map(|(k, v)| Ok((k.clone(), shard_batch(v, rank, size)?))).collect::<Result<_>>()?;
            let refs: Vec<(&str, &HostTensor)> = mine.iter().map(|(k, v)| (k.as_str(), v)).collect();
            let out = dp.step(&refs)?;
            if let Some(loss) = out.global_loss {
                losses.push(loss);
                skipped += usize::from(!out.applied);
                progress(step + 1, loss);
            }
        }
        times.push(t0.elapsed().as_secs_f64() * 1e3);
        let done = step + 1 - plan.start_step;
        if let Some(path) = &plan.save {
            if done.checked_rem(plan.save_every) == Some(0) && done < cfg.steps {
                dp.save(path)?;
            }
        }
    }
    if let Some(path) = &plan.save {
        dp.save(path)?;
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(ParallelReport {
        model: cfg.task.name().into(),
        ranks: size,
        shard_optimizer: plan.dist.shard_optimizer,
        global_batch: global,
        start_step: plan.start_step,
        losses,
        skipped,
        median_step_ms: times.get(times.len() / 2).copied().unwrap_or(f64::NAN),
        optimizer_bytes: dp.optimizer_bytes(),
        trained_elements: dp.trained_elements(),
    })
}
