//! Data-parallel training across processes, one per device: each rank runs forward and
//! backward on its part of the global batch, the gradients are summed across ranks
//! ([`Collective::all_reduce_sum`], in buckets), and every rank applies the same update — or,
//! with [`DistributedOptions::shard_optimizer`] (ZeRO stage 1), each rank keeps the optimizer
//! state of one `1/size` slice of the parameters, updates that slice and the new values are
//! gathered ([`Collective::all_gather`]).
//!
//! A [`DataParallel`] compiles two executables against one [`ParamStore`]:
//!
//! - **gradients**: the model's forward and backward pass (mixed precision, checkpointing
//!   as [`TrainOptions`] says); the gradients of every trained parameter, flattened in name
//!   order into one vector, are added to the parameter `"ddp.grad_acc"` (so accumulation
//!   over micro-batches stays on the device; input `"ddp.keep"` is 0 on a window's first
//!   micro-batch, which starts it afresh); its output is the micro-batch's loss.
//! - **update**: at the end of each accumulation window, the host reads the accumulated
//!   vector, all-reduces it with the window's loss appended, and feeds the mean as input
//!   `"ddp.grad"`: the finite check over the whole vector (so every rank takes the same
//!   decision on an overflow), unscaling, the optimizer and the loss-scale update, as a
//!   single-process [`crate::train::Trainer`] records them. Sharded, the vector is
//!   reduce-scattered instead (each rank receives the sum of its slice: half an
//!   all-reduce's traffic), the ranks agree on overflows by summing one flag
//!   (`"ddp.overflow"`, 0 or +inf) beside the loss, the optimizer runs on the rank's slice of
//!   the flattened weights (its state parameters are `"ddp.shard.{state}"`, `1/size` of the
//!   elements) and the new slices are all-gathered.
//!
//! The processes come from MPI (`Mpi`, cargo feature `mpi`: `mpirun -np N program`), or
//! [`Single`] for one. A rank that fails must end the group ([`Collective::abort`]) instead
//! of returning, since the others would wait for it in their next collective; the example
//! `examples/train.rs --distributed` does so.
//!
//! Checkpoints ([`DataParallel::save`]) hold what a single-process trainer's store holds, by
//! the same names: sharded state is gathered and split back per parameter
//! (`"{param}.adam_m"`, …), so a checkpoint resumes with any number of ranks, sharded or not,
//! or in a [`crate::train::Trainer`].
//!
//! ```no_run
//! use fusegraph::distributed::{shard_batch, Collective, DataParallel, DistributedOptions, Single};
//! use fusegraph::nn::{cross_entropy, Adam, Forward, Linear, Params, Scope};
//! use fusegraph::train::{Objective, TrainOptions};
//! use fusegraph::{DType, Device, GraphBuilder, HostTensor, ParamStore};
//!
//! # fn main() -> fusegraph::Result<()> {
//! // `Mpi::init()?` under `mpirun` (feature `mpi`); `Single` is one process.
//! let comm = Single;
//! let (rank, size) = (comm.rank(), comm.size());
//! let fc = Linear::new(&Scope::root().at("fc"), 4, 3, true)?;
//! let mut params = Params::of(&fc, 0)?; // the same seed on every rank: the same start
//! let b = GraphBuilder::new();
//! let x = b.input("x", DType::F32, [8 / size, 4])?; // this rank's rows of a batch of 8
//! let y = b.input("y", DType::I32, [8 / size])?;
//! let logits = fc.forward(&x)?;
//! let loss = cross_entropy(&logits, &y)?;
//! let objective = Objective { output: logits, loss, segments: vec![] };
//! let store = ParamStore::new(&Device::shared()?);
//! let sharded = DistributedOptions { shard_optimizer: true, ..Default::default() };
//! let adam = Adam::new(1e-2);
//! let mut dp =
//!     DataParallel::new(&store, &b, &mut params, &objective, &adam, &TrainOptions::default(), &sharded, &comm)?;
//! let xs = HostTensor::new([8, 4], vec![0.5f32; 32])?;
//! let ys = HostTensor::new([8], vec![1i32; 8])?;
//! let (x_mine, y_mine) = (shard_batch(&xs, rank, size)?, shard_batch(&ys, rank, size)?);
//! let out = dp.step(&[("x", &x_mine), ("y", &y_mine)])?;
//! println!("loss of the global batch {:?}", out.global_loss);
//! dp.save(std::path::Path::new("step1.safetensors"))?; // rank 0 writes; every rank calls it
//! # Ok(()) }
//! ```

mod collective;
#[cfg(feature = "mpi")]
mod mpi;
mod watchdog;

pub use collective::{shard_batch, Collective, Single};
#[cfg(feature = "mpi")]
pub use mpi::Mpi;

use crate::train::{self, scalar, Objective, Optimizer, TrainOptions, GOOD_STEPS, LOSS_SCALE, OVERFLOW_SEEN};
use crate::{CompileOptions, DType, Error, Executable, FeedName, GraphBuilder, HostTensor};
use crate::{ParamStore, Result, Tensor};
use collective::shard_range;
use fusegraph_nn::{Init, Params};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;
use watchdog::Watchdog;

/// The parameter accumulating the flattened gradients of a window's micro-batches.
pub const GRAD_ACC: &str = "ddp.grad_acc";
/// The gradient executable's input: 1 to add to the accumulator, 0 to start it afresh (a
/// window's first micro-batch).
pub const KEEP: &str = "ddp.keep";
/// The sharded update executable's input: 0, or +inf where some rank's summed shard held
/// a value that is not finite (summed over the ranks, so every rank skips the step alike).
pub const OVERFLOW: &str = "ddp.overflow";
/// The update executable's input: the gradient vector summed over the ranks.
pub const GRAD_INPUT: &str = "ddp.grad";
/// The name the optimizer sees for a rank's slice of the flattened weights; its state is
/// `"ddp.shard.{state}"`.
pub const SHARD: &str = "ddp.shard";

/// How [`DataParallel`] distributes a step.
#[derive(Clone, Debug, PartialEq)]
pub struct DistributedOptions {
    /// Keep the optimizer state of one `1/size` slice of the parameters on each rank (ZeRO
    /// stage 1); the new weights are gathered after each update.
    pub shard_optimizer: bool,
    /// Gradients are summed in all-reduces of at most this many bytes each (≥ 4).
    pub bucket_bytes: usize,
    /// After every update, compare a checksum of the trained parameters across ranks and
    /// fail with [`Error::Distributed`] if they differ (a debug check: it reads the
    /// weights back).
    pub check_replicas: bool,
    /// With more than one rank, the longest a collective may wait for the others: past it
    /// the rank ends its process (and so, under `mpirun`, the job), naming the collective
    /// (MPI's collectives cannot time out, and a rank that hangs would hold every other
    /// rank forever). `None`: no bound.
    pub collective_timeout: Option<Duration>,
}

impl Default for DistributedOptions {
    /// Unsharded, 25 MiB buckets (PyTorch DDP's default), no replica check, collectives
    /// bounded at 10 minutes (as PyTorch's process groups).
    fn default() -> Self {
        DistributedOptions {
            shard_optimizer: false,
            bucket_bytes: 25 << 20,
            check_replicas: false,
            collective_timeout: Some(Duration::from_secs(600)),
        }
    }
}

/// What one [`DataParallel::step`] did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParallelStep {
    /// This rank's micro-batch loss.
    pub loss: f32,
    /// At a window's end, the mean loss over every rank and every micro-batch of the window:
    /// the loss of the global batch.
    pub global_loss: Option<f32>,
    /// Whether this micro-batch ended an accumulation window.
    pub window_end: bool,
    /// Whether the update was applied (false inside a window and on an overflow).
    pub applied: bool,
}

/// One trained parameter's place in the flattened gradient and weight vectors.
#[derive(Clone, Debug)]
struct Slot {
    name: String,
    dims: Vec<usize>,
    offset: usize,
    len: usize,
}

/// A training step run data-parallel over the ranks of a [`Collective`] (see the module
/// docs).
pub struct DataParallel<'c> {
    comm: &'c dyn Collective,
    grads: Executable,
    update: Executable,
    store: ParamStore,
    slots: Vec<Slot>,
    total: usize,
    /// Sharded: this rank's element range and the common part length of the gathers.
    shard: Option<(Range<usize>, usize)>,
    /// The optimizer's state parameters in the store.
    state: Vec<String>,
    options: TrainOptions,
    dist: DistributedOptions,
    micro: usize,
    window_loss: f64,
    watchdog: Option<Watchdog>,
}

impl<'c> DataParallel<'c> {
    /// Records the two executables for `forward` (recorded in `b` at this rank's part of
    /// the batch) and compiles them against `store`, which gets every parameter it lacks
    /// from `params` (optimizer state zero, or, sharded, this rank's slice of per-parameter
    /// state that `params` holds from a checkpoint). With more than one rank, every rank then
    /// takes rank 0's weights, so all start from one model.
    ///
    /// Errors: those of [`train::build_step`], a `bucket_bytes` under 4, sharding that
    /// leaves a rank no elements, ranks that recorded different trained parameters.
    #[allow(clippy::too_many_arguments)] // The single-process step's inputs, and the group.
    pub fn new(
        store: &ParamStore,
        b: &GraphBuilder,
        params: &mut Params,
        forward: &Objective,
        optimizer: &dyn Optimizer,
        options: &TrainOptions,
        dist: &DistributedOptions,
        comm: &'c dyn Collective,
    ) -> Result<DataParallel<'c>> {
        let (rank, size) = (comm.rank(), comm.size());
        let r = record(b, params, forward, optimizer, options, dist, (rank, size))?;
        train::insert_missing(store, &[&r.grads.graph, &r.update.graph], params)?;
        let grads = store.compile(&r.grads.graph, &r.grads.outputs, &r.compile_options(options, true))?;
        let update = store.compile(&r.update.graph, &r.update.outputs, &r.compile_options(options, false))?;
        let Recording { slots, total, shard, state, .. } = r;
        let dp = DataParallel {
            comm,
            grads,
            update,
            store: store.clone(),
            slots,
            total,
            shard,
            state,
            options: options.clone(),
            dist: dist.clone(),
            micro: 0,
            window_loss: 0.0,
            watchdog: dist.collective_timeout.filter(|_| size > 1).map(|t| Watchdog::new(t, rank)),
        };
        if size > 1 {
            dp.start_together()?;
        }
        Ok(dp)
    }

    /// Checks that every rank recorded the same trained parameters (names and shapes) and
    /// gives every rank rank 0's weights, as PyTorch's DDP does when it starts: ranks that
    /// drew their initial weights from different seeds still train one model.
    fn start_together(&self) -> Result<()> {
        let layout = checksum(self.slots.iter().map(|s| format!("{}{:?};", s.name, s.dims).into_bytes()));
        let all = self.collective("the check of the ranks' models", || self.comm.all_gather_u64(layout))?;
        if all.iter().any(|&h| h != all[0]) {
            let differ: Vec<String> =
                all.iter().enumerate().filter(|(_, &h)| h != all[0]).map(|(r, _)| r.to_string()).collect();
            return Err(Error::Distributed(format!(
                "ranks {} recorded other trained parameters (names or shapes) than rank 0 ({} parameters, {} \
                 elements here)",
                differ.join(", "),
                self.slots.len(),
                self.total
            )));
        }
        let names: Vec<&str> = self.slots.iter().map(|s| s.name.as_str()).collect();
        let values = self.store.read(&names)?;
        let mut flat = Vec::with_capacity(self.total);
        for s in &self.slots {
            flat.extend(values[&s.name].as_slice::<f32>().expect("trained parameters are f32"));
        }
        self.collective("the broadcast of rank 0's weights", || self.comm.broadcast(&mut flat, 0))?;
        self.set_weights(&flat)
    }

    /// Writes the flattened trained weights `flat` into the store.
    fn set_weights(&self, flat: &[f32]) -> Result<()> {
        let values = self.split(flat, "")?;
        Ok(self.store.insert_all(values.iter().map(|(n, v)| (n.as_str(), v)))?)
    }

    /// A flattened vector `flat` split into one tensor per trained parameter, named
    /// `"{parameter}{suffix}"`.
    fn split(&self, flat: &[f32], suffix: &str) -> Result<Vec<(String, HostTensor)>> {
        self.slots
            .iter()
            .map(|s| {
                let value = HostTensor::new(s.dims.clone(), flat[s.offset..s.offset + s.len].to_vec())?;
                Ok((format!("{}{suffix}", s.name), value))
            })
            .collect()
    }

    /// Runs one micro-batch (this rank's part of it); at the end of an accumulation window
    /// (every micro-batch without accumulation) sums the gradients across the ranks and
    /// applies the update. Every rank must call it equally often.
    pub fn step<K: FeedName>(&mut self, feeds: &[(K, &HostTensor)]) -> Result<ParallelStep> {
        let keep = if self.micro == 0 { 0.0 } else { 1.0 };
        let loss = scalar(&train::run_with_flag(&self.grads, feeds, Some((KEEP, keep)))?[0]) as f32;
        self.window_loss += loss as f64;
        self.micro += 1;
        if self.micro < self.options.accumulate {
            return Ok(ParallelStep { loss, global_loss: None, window_end: false, applied: false });
        }
        self.micro = 0;
        let acc = self.store.get(GRAD_ACC)?;
        let acc = acc.as_slice::<f32>().expect("the accumulator is f32");
        let loss_sum = std::mem::take(&mut self.window_loss) as f32;
        let n = (self.comm.size() * self.options.accumulate) as f32;
        let (global_loss, applied) = match self.shard.clone() {
            None => {
                // The whole sum on every rank, the loss appended.
                let mut buf = acc.to_vec();
                buf.push(loss_sum);
                let bucket = self.dist.bucket_bytes / 4;
                self.collective("the gradient all-reduce", || {
                    buf.chunks_mut(bucket).try_for_each(|chunk| self.comm.all_reduce_sum(chunk))
                })?;
                let global_loss = buf.pop().map(|l| l / n);
                let out = self.update.run(&[(GRAD_INPUT, &HostTensor::new([self.total], buf)?)])?;
                (global_loss, scalar(&out[0]) > 0.5)
            }
            Some((range, part)) => {
                // Each rank receives the sum of its own shard; the loss and whether any
                // shard overflowed are summed apart.
                let mine = self.reduce_scatter(acc, part)?;
                let overflow = if mine[..range.len()].iter().all(|v| v.is_finite()) { 0.0 } else { f32::INFINITY };
                let mut small = [loss_sum, overflow];
                self.collective("the loss all-reduce", || self.comm.all_reduce_sum(&mut small))?;
                let sum = HostTensor::new([range.len()], mine[..range.len()].to_vec())?;
                let flag = HostTensor::new(Vec::<usize>::new(), vec![small[1]])?;
                let out = self.update.run(&[(GRAD_INPUT, &sum), (OVERFLOW, &flag)])?;
                let full = self.gather(out[0].as_slice::<f32>().expect("the shard is f32"))?;
                self.set_weights(&full)?;
                (Some(small[0] / n), scalar(&out[1]) > 0.5)
            }
        };
        if self.dist.check_replicas {
            self.check_replicas()?;
        }
        Ok(ParallelStep { loss, global_loss, window_end: true, applied })
    }

    /// Fails with [`Error::Distributed`] unless every rank holds the same trained
    /// parameters (a checksum of their bytes, compared across ranks).
    pub fn check_replicas(&self) -> Result<()> {
        let names: Vec<&str> = self.slots.iter().map(|s| s.name.as_str()).collect();
        let hash = checksum(self.store.read(&names)?.values().map(HostTensor::to_bytes));
        let all = self.collective("the replica check", || self.comm.all_gather_u64(hash))?;
        if all.iter().any(|&h| h != all[0]) {
            let sums: Vec<String> = all.iter().map(|h| format!("{h:016x}")).collect();
            return Err(Error::Distributed(format!(
                "the ranks' parameters differ after an update (checksums by rank: {})",
                sums.join(", ")
            )));
        }
        Ok(())
    }

    /// Writes a checkpoint of the weights and the training state (the optimizer's gathered
    /// per parameter when sharded) from rank 0, as a single-process trainer's store would
    /// hold them; every rank must call it, between windows. The file appears whole or not
    /// at all (written aside and renamed).
    pub fn save(&self, path: &Path) -> Result<()> {
        if self.micro != 0 {
            return Err(config("a checkpoint is saved between accumulation windows, not inside one"));
        }
        let shard_state: Vec<&String> =
            self.state.iter().filter(|n| self.shard.is_some() && n.starts_with(SHARD)).collect();
        let mut gathered = BTreeMap::new();
        for name in &shard_state {
            let mine = self.store.get(name)?;
            let full = self.gather(mine.as_slice::<f32>().expect("optimizer state is f32"))?;
            gathered.extend(self.split(&full, &name[SHARD.len()..])?);
        }
        if self.comm.rank() == 0 {
            let mut all = self.store.read_all()?;
            all.retain(|n, _| n != GRAD_ACC && !shard_state.contains(&n));
            all.extend(gathered);
            fusegraph_ir::safetensors::write(path, all.iter().map(|(n, t)| (n.as_str(), t)))
                .map_err(|e| Error::Distributed(format!("writing checkpoint {}: {e}", path.display())))?;
        }
        self.collective("the checkpoint's barrier", || self.comm.barrier())
    }

    /// Bytes of optimizer state this rank holds on the device (`1/size` of them sharded).
    pub fn optimizer_bytes(&self) -> u64 {
        self.state.iter().filter_map(|n| self.store.ty(n)).map(|t| t.buffer_bytes() as u64).sum()
    }

    /// The parameter store both executables bind.
    pub fn store(&self) -> &ParamStore {
        &self.store
    }

    /// The gradient executable (forward and backward) and the update executable.
    pub fn executables(&self) -> (&Executable, &Executable) {
        (&self.grads, &self.update)
    }

    /// The number of trained elements (the length of the summed gradient vector).
    pub fn trained_elements(&self) -> usize {
        self.total
    }

    /// Runs the collective `f` (named `what` for the watchdog's message) under the
    /// watchdog's deadline, if any.
    fn collective<R>(&self, what: &str, f: impl FnOnce() -> Result<R>) -> Result<R> {
        match &self.watchdog {
            Some(w) => w.guard(what, f),
            None => f(),
        }
    }

    /// This rank's `part` elements of the sum over the ranks of `data` (padded to
    /// `size · part`), in buckets of at most `bucket_bytes` sent per round.
    fn reduce_scatter(&self, data: &[f32], part: usize) -> Result<Vec<f32>> {
        let size = self.comm.size();
        let per_round = (self.dist.bucket_bytes / 4 / size).max(1);
        let mut mine = vec![0.0f32; part];
        self.collective("the gradient reduce-scatter", || {
            for lo in (0..part).step_by(per_round) {
                let hi = (lo + per_round).min(part);
                let mut send = Vec::with_capacity(size * (hi - lo));
                for r in 0..size {
                    let (start, end) = ((r * part + lo).min(data.len()), (r * part + hi).min(data.len()));
                    send.extend_from_slice(&data[start..end]);
                    send.resize(send.len() + (hi - lo) - (end - start), 0.0);
                }
                self.comm.reduce_scatter_sum(&send, &mut mine[lo..hi])?;
            }
            Ok(())
        })?;
        Ok(mine)
    }

    /// Every rank's shard (`mine` here), concatenated: a vector of the trained elements.
    fn gather(&self, mine: &[f32]) -> Result<Vec<f32>> {
        let (_, part) = self.shard.as_ref().expect("gathers are of shards");
        let mut padded = mine.to_vec();
        padded.resize(*part, 0.0);
        let mut full = vec![0.0f32; part * self.comm.size()];
        self.collective("an all-gather of the shards", || self.comm.all_gather(&padded, &mut full))?;
        full.truncate(self.total);
        Ok(full)
    }
}

/// FNV-1a over `parts`' bytes: the same on every rank and platform for the same bytes.
fn checksum(parts: impl IntoIterator<Item = Vec<u8>>) -> u64 {
    parts.into_iter().flatten().fold(0xcbf2_9ce4_8422_2325, |h, byte| (h ^ byte as u64).wrapping_mul(0x100_0000_01b3))
}

fn config(msg: impl std::fmt::Display) -> Error {
    Error::Config(format!("data parallel: {msg}"))
}

/// The two executables of a rank's step, recorded, and the layout of its vectors.
struct Recording {
    grads: crate::Recorded,
    update: crate::Recorded,
    slots: Vec<Slot>,
    total: usize,
    shard: Option<(Range<usize>, usize)>,
    state: Vec<String>,
}

impl Recording {
    /// The compile options of the gradient executable (`grads`) or the update's.
    fn compile_options(&self, options: &TrainOptions, grads: bool) -> CompileOptions {
        let (name, recorded) =
            if grads { ("data-parallel gradients", &self.grads) } else { ("data-parallel update", &self.update) };
        CompileOptions {
            fusion: options.fusion,
            memory_limit: options.memory_limit,
            name: Some(name.into()),
            updates: recorded.updates.clone(),
            ..Default::default()
        }
    }
}

/// Records rank `rank` of `size`'s two executables (no device): the gradients of `forward`,
/// recorded in `b`, added flattened to the accumulator, and the update.
fn record(
    b: &GraphBuilder,
    params: &mut Params,
    forward: &Objective,
    optimizer: &dyn Optimizer,
    options: &TrainOptions,
    dist: &DistributedOptions,
    (rank, size): (usize, usize),
) -> Result<Recording> {
    if dist.bucket_bytes < 4 {
        return Err(config(format!("bucket_bytes {} holds no f32", dist.bucket_bytes)));
    }
    if size == 0 || rank >= size {
        return Err(config(format!("rank {rank} of {size}")));
    }
    let g = train::record_gradients(b, params, forward, options)?;
    let mut slots = Vec::new();
    let mut total = 0;
    for (name, w) in &g.named {
        let len = w.ty().shape.numel();
        slots.push(Slot { name: name.clone(), dims: w.dims().to_vec(), offset: total, len });
        total += len;
    }
    if dist.shard_optimizer && shard_range(total, size - 1, size).0.is_empty() {
        return Err(config(format!("{total} trained elements leave some of {size} ranks no shard")));
    }
    let shard = dist.shard_optimizer.then(|| shard_range(total, rank, size));

    // Gradients: added, flattened, to the accumulator, which the first micro-batch of a
    // window (input `ddp.keep` 0) starts afresh.
    let flat = flatten(&g.grads)?;
    let acc = params.parameter(b, GRAD_ACC, DType::F32, &[total], Init::Zeros)?;
    let keep = b.input(KEEP, DType::F32, Vec::<usize>::new())?.gt(&b.scalar(DType::F32, 0.5)?)?;
    let kept = keep.select(&acc, &b.scalar(DType::F32, 0.0)?.broadcast_to([total])?)?;
    let updates = vec![(GRAD_ACC.to_string(), kept.add(&flat)?.id())];
    let grads = crate::Recorded { graph: b.graph(), outputs: vec![g.loss.id()], updates };
    let (update, state) =
        record_update_graph(params, &slots, total, shard.as_ref().map(|(r, _)| r), size, options, optimizer)?;
    Ok(Recording { grads, update, slots, total, shard, state })
}

/// The device bytes rank `rank` of `size` would hold for a data-parallel step (the store's
/// parameters — weights, the gradient accumulator, its optimizer state, `1/size` of it
/// sharded — plus both executables' arenas, constants and staging), asking the planner only:
/// nothing is allocated. `params` is not changed.
#[allow(clippy::too_many_arguments)] // DataParallel::new's inputs, the rank for the group.
pub fn planned_bytes(
    device: &std::sync::Arc<crate::Device>,
    b: &GraphBuilder,
    params: &Params,
    forward: &Objective,
    optimizer: &dyn Optimizer,
    options: &TrainOptions,
    dist: &DistributedOptions,
    rank_of: (usize, usize),
) -> Result<u64> {
    let mut params = params.clone();
    let r = record(b, &mut params, forward, optimizer, options, dist, rank_of)?;
    let grads = device.plan(&r.grads.graph, &r.grads.outputs, &r.compile_options(options, true))?;
    let update = device.plan(&r.update.graph, &r.update.outputs, &r.compile_options(options, false))?;
    // Parameters both executables bind are held once, in the store.
    let shared: u64 = train::parameter_names(&r.grads.graph)
        .intersection(&train::parameter_names(&r.update.graph))
        .filter_map(|n| params.get(n))
        .map(|t| t.ty().buffer_bytes() as u64)
        .sum();
    Ok(grads.total_bytes + update.total_bytes - shared)
}

/// The largest batch per rank in `1..=max_batch` whose data-parallel step on rank `rank` of
/// `size` holds at most `limit` bytes ([`planned_bytes`]; with the optimizer state
/// sharded, each rank's `1/size` of it); `None` if batch 1 does not fit. `build(batch)`
/// records the model's objective at that batch in a new builder.
#[allow(clippy::too_many_arguments)] // planned_bytes's inputs, the search's bounds.
pub fn largest_batch(
    device: &std::sync::Arc<crate::Device>,
    build: impl Fn(usize) -> Result<(GraphBuilder, Objective)>,
    params: &Params,
    optimizer: &dyn Optimizer,
    options: &TrainOptions,
    dist: &DistributedOptions,
    rank_of: (usize, usize),
    limit: u64,
    max_batch: usize,
) -> Result<Option<usize>> {
    fusegraph_passes::pipeline::largest_fitting(max_batch, |batch| {
        let (b, objective) = build(batch)?;
        Ok(planned_bytes(device, &b, params, &objective, optimizer, options, dist, rank_of)? <= limit)
    })
}

/// Records the update executable — its graph, outputs (the new shard, if sharded, then the
/// applied flag) and updates — and names the optimizer's state parameters. Its input is the window's
/// gradient summed over the ranks — the whole vector, or this rank's `shard` of it with the
/// input `ddp.overflow` (0, or +inf where some rank's shard was not finite) — scaled to the
/// mean.
fn record_update_graph(
    params: &mut Params,
    slots: &[Slot],
    total: usize,
    shard: Option<&Range<usize>>,
    size: usize,
    options: &TrainOptions,
    optimizer: &dyn Optimizer,
) -> Result<(crate::Recorded, Vec<String>)> {
    let ub = GraphBuilder::new();
    let len = shard.map_or(total, |r| r.len());
    let mean = ub.input(GRAD_INPUT, DType::F32, [len])?.mul_scalar(1.0 / (size * options.accumulate) as f64)?;
    let weights = slots
        .iter()
        .map(|s| params.parameter(&ub, &s.name, DType::F32, &s.dims, Init::Zeros))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let scale = match &options.mixed_precision {
        Some(s) => Some(train::state(&ub, params, LOSS_SCALE, s.init_scale)?),
        None => None,
    };
    let mut checked = vec![mean.clone()];
    let (named, grads) = match shard {
        None => {
            let named = slots.iter().zip(&weights).map(|(s, w)| (s.name.clone(), w.clone())).collect();
            let grads = slots
                .iter()
                .map(|s| Ok(mean.narrow(0, s.offset, s.len)?.reshape(s.dims.clone())?))
                .collect::<Result<Vec<_>>>()?;
            (named, grads)
        }
        Some(range) => {
            checked.push(ub.input(OVERFLOW, DType::F32, Vec::<usize>::new())?);
            let w = flatten(&weights)?.narrow(0, range.start, range.len())?;
            (vec![(SHARD.to_string(), w)], vec![mean])
        }
    };
    let once = TrainOptions { accumulate: 1, ..options.clone() };
    let scale = scale.as_ref().map(|s| (s, &checked[..]));
    let (mut updates, apply) = train::record_update(&ub, params, &named, grads, scale, optimizer, &once)?;
    let mut outputs = Vec::new();
    if shard.is_some() {
        let i = updates.iter().position(|(n, _)| n == SHARD).expect("the optimizer updates every parameter");
        outputs.push(updates.remove(i).1.id());
    }
    outputs.push(match apply {
        Some(a) => a.cast(DType::F32)?.id(),
        None => ub.scalar(DType::F32, 1.0)?.id(),
    });
    let fixed = [GRAD_ACC, LOSS_SCALE, GOOD_STEPS, OVERFLOW_SEEN];
    let state: Vec<String> = updates
        .iter()
        .map(|(n, _)| n.clone())
        .filter(|n| !fixed.contains(&n.as_str()) && !slots.iter().any(|s| &s.name == n))
        .collect();
    if let Some(range) = shard {
        resume_shards(params, slots, &state, range)?;
    }
    let updates = updates.into_iter().map(|(n, t)| (n, t.id())).collect();
    Ok((crate::Recorded { graph: ub.graph(), outputs, updates }, state))
}

/// The tensors flattened and concatenated in order.
fn flatten(parts: &[Tensor]) -> Result<Tensor> {
    let flat = parts.iter().map(|t| t.reshape([t.ty().shape.numel()])).collect::<std::result::Result<Vec<_>, _>>()?;
    match flat.as_slice() {
        [one] => Ok(one.clone()),
        _ => {
            let refs: Vec<&Tensor> = flat.iter().collect();
            Ok(flat[0].builder().concat(&refs, 0)?)
        }
    }
}

/// Sharded state from per-parameter values in `params` (a checkpoint's): for each
/// `"ddp.shard.{state}"`, this rank's `range` of the flattened `"{param}.{state}"` values,
/// where every parameter has one.
fn resume_shards(params: &mut Params, slots: &[Slot], state: &[String], range: &Range<usize>) -> Result<()> {
    for name in state.iter().filter(|n| n.starts_with(SHARD)) {
        let suffix = &name[SHARD.len()..];
        let per: Option<Vec<&HostTensor>> = slots.iter().map(|s| params.get(&format!("{}{suffix}", s.name))).collect();
        let Some(per) = per else { continue };
        let mut flat = Vec::with_capacity(range.end);
        for t in per {
            flat.extend(t.to_f64().into_iter().map(|v| v as f32));
        }
        params.insert(name, HostTensor::new([range.len()], flat[range.clone()].to_vec())?);
    }
    Ok(())
}
