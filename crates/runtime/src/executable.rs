//! Compilation of a graph into an [`Executable`] and its execution.

use crate::memory::{buffer_bytes, texel_bytes, Allocation, Kind, TextureAllocation};
use crate::{Device, Result, RuntimeError};
use fusegraph_ir::{verify, Graph, HostTensor, NodeId, Op, TensorType};
use fusegraph_passes::kernel::unshared_members;
use fusegraph_passes::split_k::{fill_splits, split_k, FillOptions, Gemm};
pub use fusegraph_passes::split_reduce::FillOptions as ReduceFill;
use fusegraph_passes::split_reduce::{fill_chunks, split_reduce};
use fusegraph_passes::{
    plan_combined_within, plan_summary_within, plan_within, FusionMode, Joined, Location, MemoryPlan, PlanOptions,
    PlanSummary, Region,
};
use fusegraph_wgsl::{
    cooperative_matmul, gemm_shape, lower_planned, subgroup_matmul, KernelSource, LowerOptions, MatmulTiling, Strategy,
    TEXTURE_ROW,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Options of one compilation.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Fusion on (default) or off (one kernel per primitive op).
    pub fusion: FusionMode,
    /// Run the simplification passes (folding, CSE, DCE, batch-norm folding) first (default).
    pub simplify: bool,
    /// The most device memory this executable may hold (parameters + arena + staging, and
    /// workspace textures only where they fit beside those). Combined with the device's own
    /// limit, if any.
    pub memory_limit: Option<u64>,
    /// Recompute cheap values where memory peaks to meet the limit (default on).
    pub remat: bool,
    /// A name for messages (`OOM when allocating the plan for <name>`).
    pub name: Option<String>,
    /// Store every f32 activation, weight and constant as f16, accumulating in f32; outputs
    /// keep their types. Halves activation and weight memory. Parameters keep their declared
    /// f32 type at the API: `set_parameter` rounds the value to f16 on upload and
    /// `parameter` reads it back widened. Parameters that `updates` writes (training) keep
    /// f32 storage and are rounded at their uses instead, and the elementwise arithmetic
    /// that computes their new values (an optimizer's) stays f32: in f16 Adam's `ε` is 0.
    /// For training, the `train` module's mixed precision (loss scaling) is the recipe.
    pub mixed_precision: bool,
    /// Set while measuring the cost model itself: plan with the default cost model.
    #[doc(hidden)]
    pub calibrating: bool,
    /// Parameter updates: after each run, parameter `name` takes the value node `NodeId`
    /// computed in that run (a training step's new weights and optimizer state). The copy
    /// happens on the device, after every kernel, in the same submit.
    pub updates: Vec<(String, NodeId)>,
    /// Force this tiling on every tiled matmul kernel (experiments, tests of each
    /// candidate); `None` takes the device's autotuned choice, or the default for the shape.
    /// One of [`MatmulTiling::COOP_CANDIDATES`] puts the f16 products that can run on
    /// cooperative matrices on them with that tiling (any other tiling keeps them on the
    /// plain kernel).
    pub matmul_tiling: Option<MatmulTiling>,
    /// Writes every kernel's WGSL into this folder as `k000.wgsl`, `k001.wgsl`, … in
    /// dispatch order, each headed by `// kernel LABEL (N workgroups)` (the environment
    /// variable `FUSEGRAPH_DUMP_WGSL=DIR` does the same for every compile; [`crate::env`]). Best effort: a
    /// folder that cannot be written is skipped.
    pub dump_wgsl: Option<std::path::PathBuf>,
    /// Memory-efficient attention: `Some(true)` computes every `softmax(x)·v` (attention's
    /// probabilities times the values) in one kernel that stores neither the scores nor the
    /// probabilities, `Some(false)` never; `None` (the default) only when the plan would
    /// otherwise exceed the memory limit (tried before rematerialization). It saves
    /// `2 · batch · heads · seq²` values per attention layer; the kernel suits GPUs, and is
    /// slower than the unfused attention on a CPU adapter (BENCHMARKS.md).
    pub fused_attention: Option<bool>,
    /// Split-k: matrix products too small to occupy the device become `s` products over
    /// slices of `k`, summed ([`fusegraph_passes::split_k`]). Off by default (`fusegraph
    /// bench --split-k` sets it). A split that would make the plan exceed the memory limit is
    /// not made.
    pub split_k: SplitK,
    /// With fusion on, reductions with few outputs and long rows (a loss, a norm, a bias
    /// gradient's column sums) become two reductions, the first over chunks of each row
    /// with many workgroups ([`fusegraph_passes::split_reduce`]). Default: by the adapter's
    /// occupancy rule; off in [`CompileOptions::unfused`]. A split that would make the plan
    /// exceed the memory limit is not made.
    pub split_reductions: SplitReductions,
    /// Run the kernels that compute from parameters and constants alone (batch-norm
    /// folding's scaled weights, a constant computed on its own) once after the parameters
    /// are set rather than on every run (default on): [`Executable::set_parameter`] marks
    /// them to run again on the next run. What they leave for later kernels stays in the
    /// arena for the executable's life, so this can cost arena bytes; it is dropped where the
    /// plan would otherwise not fit the memory limit. Kernels that read a parameter `updates`
    /// writes run every time. Off in [`CompileOptions::unfused`] (the naive baseline).
    pub hoist_parameters: bool,
    /// With fusion on, matrix products that share their left operand and whose weights are
    /// parameters of one shape that no update writes (attention's query, key and value
    /// projections) become one batched product over the weights stacked into one parameter
    /// ([`fusegraph_passes::combine`]): one kernel instead of one per product, no extra
    /// byte (each weight is a contiguous part of the stack, set and read by its own name).
    /// Default on; off in [`CompileOptions::unfused`].
    pub combine_products: bool,
    /// Within a kernel, compute the f16 results of elementwise ops and reductions that no
    /// other kernel computes from one another in f32, rounding each to f16 only where it is
    /// stored or read by an op computed in f16 (XLA's excess precision,
    /// `xla_allow_excess_precision`; see [`fusegraph_wgsl::lower_planned`]). Default on:
    /// results are at least as close to the exact ones, but differ in the last f16 bits from
    /// a run that rounds every op (the unfused one), and rounding costs about a dozen
    /// integer operations per f16 op (a 20-op f16 chain on lavapipe 1.9× faster with it).
    /// Off: every f16 op's result is rounded, as the reference evaluator does. f32 graphs
    /// are unaffected.
    pub excess_precision: bool,
}

/// Which matrix products [`CompileOptions::split_k`] splits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SplitK {
    /// None (the default).
    #[default]
    Off,
    /// Each product whose tiled kernel would have fewer than `workgroups` workgroups (one
    /// per output tile of its untuned tiling per batch entry), into the fewest
    /// power-of-two slices that bring it there, each slice at least 128 long and a
    /// multiple of 4 ([`fusegraph_passes::split_k::fill_splits`]).
    Fill {
        /// The workgroups a product should have (a few per multiprocessor of the GPU).
        workgroups: u64,
    },
    /// Every product whose `k` is a multiple of `4 · s`, into `s` slices (experiments and
    /// tests).
    Slices(usize),
    /// Each product into the slice count measured fastest on this device for its shape
    /// class (1, 2, 4, 8 or 16, each slice whole vec4s and at least 128 long; the product
    /// and its sum timed together, as matmul tilings are tuned, and cached on disk beside
    /// them). Products below the autotuner's size threshold, and every product where
    /// autotuning is off, are not split. Measuring happens in `compile` (and `plan`) the
    /// first time a class is seen.
    Tuned,
}

/// Which reductions [`CompileOptions::split_reductions`] splits
/// ([`fusegraph_passes::split_reduce`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SplitReductions {
    /// None.
    Off,
    /// By the occupancy rule for the adapter (the default):
    /// [`ReduceFill::GPU`] on a GPU, [`ReduceFill::CPU`] on a CPU adapter.
    #[default]
    Adapter,
    /// By this occupancy rule on any adapter (tests run a GPU's on a CPU adapter).
    Fill(ReduceFill),
}

impl SplitReductions {
    /// The occupancy rule in force on an adapter that is (`cpu`) or is not a CPU.
    fn fill(self, cpu: bool) -> Option<ReduceFill> {
        match self {
            SplitReductions::Off => None,
            SplitReductions::Adapter if cpu => Some(ReduceFill::CPU),
            SplitReductions::Adapter => Some(ReduceFill::GPU),
            SplitReductions::Fill(f) => Some(f),
        }
    }
}

impl SplitK {
    /// `off`, `tuned`, `fill:W` (W workgroups) or `S` (slices), as `fusegraph bench --split-k` takes
    /// them; `None` for anything else.
    pub fn parse(v: &str) -> Option<SplitK> {
        match v.trim() {
            "off" => Some(SplitK::Off),
            "tuned" => Some(SplitK::Tuned),
            v => match v.strip_prefix("fill:") {
                Some(w) => w.parse().ok().map(|workgroups| SplitK::Fill { workgroups }),
                None => v.parse().ok().map(SplitK::Slices),
            },
        }
    }

    /// Into how many slices this splits `gemm` on `device` (1: not at all).
    fn splits(&self, device: &Arc<Device>, gemm: &Gemm) -> usize {
        match *self {
            SplitK::Off => 1,
            SplitK::Tuned => device.tuned_split_count(gemm),
            SplitK::Fill { workgroups } => {
                let tile = MatmulTiling::default_for(gemm.m, gemm.n).tile();
                fill_splits(gemm, &FillOptions { workgroups, tile, ..Default::default() })
            }
            SplitK::Slices(s) if s >= 2 && gemm.k.is_multiple_of(4 * s) => s,
            SplitK::Slices(_) => 1,
        }
    }
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            fusion: FusionMode::On,
            simplify: true,
            memory_limit: None,
            remat: true,
            name: None,
            updates: vec![],
            mixed_precision: false,
            calibrating: false,
            matmul_tiling: None,
            dump_wgsl: None,
            fused_attention: None,
            split_k: SplitK::Off,
            split_reductions: SplitReductions::Adapter,
            hoist_parameters: true,
            combine_products: true,
            excess_precision: true,
        }
    }
}

impl CompileOptions {
    /// The parameters mixed precision keeps in f32: those `updates` writes (a training
    /// step's weights and optimizer state need their f32 values between steps).
    fn masters(&self) -> std::collections::BTreeSet<String> {
        self.updates.iter().map(|(name, _)| name.clone()).collect()
    }

    /// `graph` rewritten to mixed precision, and the new ids of `outputs` (which hold the
    /// update values): f16 storage but for the masters, the updates' arithmetic in f32
    /// ([`fusegraph_passes::mixed_precision::to_mixed_precision_updating`]).
    fn mixed(&self, graph: &Graph, outputs: &[NodeId]) -> fusegraph_ir::Result<(Graph, Vec<NodeId>)> {
        let updates: Vec<NodeId> = self.updates.iter().map(|(_, n)| *n).collect();
        fusegraph_passes::mixed_precision::to_mixed_precision_updating(graph, outputs, &self.masters(), &updates)
    }

    /// One kernel per primitive op, no simplification, no hoisting and no combined
    /// products: the baseline of comparisons.
    pub fn unfused() -> Self {
        CompileOptions {
            fusion: FusionMode::Off,
            simplify: false,
            hoist_parameters: false,
            combine_products: false,
            split_reductions: SplitReductions::Off,
            ..Default::default()
        }
    }
}

/// Times of repeated runs, in milliseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    /// One entry per timed run.
    pub ms: Vec<f64>,
    /// Whether the times are GPU timestamps (else wall time around submit and wait).
    pub gpu_timestamps: bool,
}

impl Timing {
    /// The `q`-quantile (0..=1) of the run times, by nearest rank.
    pub fn quantile(&self, q: f64) -> f64 {
        let mut v = self.ms.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        if v.is_empty() {
            return f64::NAN;
        }
        v[((v.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize]
    }

    /// The median run time.
    pub fn median(&self) -> f64 {
        self.quantile(0.5)
    }
}

/// What one kernel of an executable does.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelStats {
    /// Member ops joined by `+`.
    pub label: String,
    /// Nodes the kernel computes.
    pub members: Vec<NodeId>,
    /// Bytes it reads and writes in memory (each binding once; an input read only through
    /// slices, such as a combined product's views, counts the slices' bytes).
    pub bytes_moved: u64,
    /// Workgroups dispatched `(x, y, z)`.
    pub workgroups: [u32; 3],
    /// The tiling of a tiled matmul kernel, plain or on cooperative matrices (forced,
    /// autotuned or the default for its shape); `None` for every other kernel.
    pub matmul_tiling: Option<MatmulTiling>,
    /// A matmul kernel lowered by the subgroup matmul (CPU adapters with a fixed subgroup
    /// size; see `fusegraph_wgsl::subgroup_matmul`) rather than the workgroup-tiled one.
    pub subgroup_matmul: bool,
    /// Operands the kernel reads from workspace textures, copied there before it runs (the
    /// subgroup matmul on CPU adapters; see [`crate::DeviceOptions::texture_operands`]).
    pub texture_operands: usize,
    /// A matmul kernel on cooperative matrices (see [`Device::cooperative_matrix`] and
    /// `fusegraph_wgsl::CoopPlan`) rather than the plain workgroup-tiled one.
    pub cooperative_matmul: bool,
    /// A memory-efficient attention kernel (`softmax(x)·v` with the online softmax; see
    /// [`CompileOptions::fused_attention`]).
    pub attention: bool,
}

/// Introspection of a compiled executable.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecutableStats {
    /// One entry per kernel, in dispatch order.
    pub kernels: Vec<KernelStats>,
    /// Distinct pipelines among the kernels: kernels that lower to the same WGSL (the same
    /// computation on the same types, as a layer's kernels in every layer of a model) share
    /// one (see `fusegraph_wgsl::lower_with`).
    pub pipelines: usize,
    /// Total bytes moved by all kernels.
    pub bytes_moved: u64,
    /// Bytes of the arena (inputs and intermediates).
    pub arena_bytes: u64,
    /// Bytes of the persistent region (parameters and constants).
    pub persistent_bytes: u64,
    /// Bytes of the readback staging buffer.
    pub staging_bytes: u64,
    /// The peak of live arena bytes over the schedule, each in-place chain counted once: the
    /// arena cannot be smaller (see `fusegraph_passes::MemoryPlan::lower_bound_bytes`).
    pub lower_bound_bytes: u64,
    /// The arena if every value had its own buffer.
    pub naive_bytes: u64,
    /// Bytes of the textures the subgroup matmul reads its operands from (CPU adapters; see
    /// [`crate::DeviceOptions::texture_operands`]): one per operand position and format,
    /// shared by every kernel, sized to the largest. 0 where no kernel reads a texture.
    pub workspace_bytes: u64,
    /// How many of `kernels` (the first ones) compute from parameters and constants alone
    /// and run only on the first run after a parameter is set
    /// ([`CompileOptions::hoist_parameters`]); a run dispatches the others.
    pub prepared_kernels: usize,
    /// Matrix products that run combined with others of the same operand
    /// ([`CompileOptions::combine_products`]), and the batched products they became:
    /// `(products, combined)`; `(0, 0)` where none combined.
    pub combined_products: (usize, usize),
    /// Bytes of device memory the executable holds: its buffers (arena, persistent, staging,
    /// as allocated; a reused cached buffer may be up to 25% larger than planned) and its
    /// workspace textures.
    pub device_bytes: u64,
}

pub(crate) struct CompiledKernel {
    pub(crate) pipeline: Arc<(wgpu::ComputePipeline, wgpu::BindGroupLayout)>,
    pub(crate) bind_group: wgpu::BindGroup,
    pub(crate) workgroups: [u32; 3],
    /// Copies of its texture operands' values into the workspace, recorded before it runs.
    copies: Vec<TextureCopy>,
}

/// A value's bytes copied into a workspace texture, [`TEXTURE_ROW`] texels per row.
struct TextureCopy {
    loc: Location,
    texels: u64,
    texel_bytes: u64,
    texture: usize,
}

/// Where each kernel's texture operands go: workspace textures, one per operand position
/// and format, each as tall as its largest use needs.
struct WorkspacePlan {
    /// (operand position, format, rows) of each texture.
    textures: Vec<(usize, wgpu::TextureFormat, u32)>,
    /// Per kernel, per texture binding: (binding index, texture index, texels).
    uses: Vec<Vec<(usize, usize, u64)>>,
}

impl WorkspacePlan {
    fn of(graph: &Graph, sources: &[KernelSource]) -> WorkspacePlan {
        let mut plan = WorkspacePlan { textures: Vec::new(), uses: Vec::new() };
        for src in sources {
            let mut uses = Vec::new();
            for (pos, (b, binding)) in src.bindings.iter().enumerate().filter(|(_, b)| b.texture).enumerate() {
                let format = match graph.ty(binding.node).dtype {
                    fusegraph_ir::DType::F16 => wgpu::TextureFormat::Rgba16Float,
                    _ => wgpu::TextureFormat::Rgba32Float,
                };
                let texels = graph.ty(binding.node).shape.numel() as u64 / 4;
                let rows = texels.div_ceil(TEXTURE_ROW as u64) as u32;
                let t = match plan.textures.iter().position(|&(p, f, _)| (p, f) == (pos, format)) {
                    Some(t) => t,
                    None => {
                        plan.textures.push((pos, format, 0));
                        plan.textures.len() - 1
                    }
                };
                plan.textures[t].2 = plan.textures[t].2.max(rows);
                uses.push((b, t, texels));
            }
            plan.uses.push(uses);
        }
        plan
    }

    fn bytes(&self) -> u64 {
        self.textures.iter().map(|&(_, f, rows)| rows as u64 * TEXTURE_ROW as u64 * texel_bytes(f)).sum()
    }
}

struct Slot {
    ty: TensorType,
    loc: Location,
}

/// A compiled graph: kernels, pipelines, bind groups and buffers, ready to run many times.
pub struct Executable {
    pub(crate) device: Arc<Device>,
    pub(crate) kernels: Vec<CompiledKernel>,
    inputs: BTreeMap<String, Slot>,
    params: BTreeMap<String, (Slot, bool)>,
    declared_inputs: BTreeMap<String, TensorType>,
    declared_params: BTreeMap<String, TensorType>,
    outputs: Vec<(Slot, u64)>,
    /// Copies from an update value to its parameter after every run.
    updates: Vec<(Location, Location)>,
    arena: Allocation,
    persistent: Allocation,
    staging: Allocation,
    /// Textures the subgroup matmul reads its operands from (see [`WorkspacePlan`]).
    workspace: Vec<TextureAllocation>,
    stats: ExecutableStats,
    plan: MemoryPlan,
    graph: Graph,
    /// Held by each run (and timing, profiling) from writing the feeds to reading the
    /// outputs: runs share the arena and the staging buffer, so runs of one executable from
    /// several threads take turns.
    running: std::sync::Mutex<()>,
    /// The leading kernels that compute from parameters and constants alone
    /// ([`CompileOptions::hoist_parameters`]).
    prepared: usize,
    /// Whether those must run again: at first, and after a parameter is set.
    stale: std::sync::atomic::AtomicBool,
}

/// Unmaps a buffer when dropped.
struct Unmap<'a>(&'a wgpu::Buffer);

impl Drop for Unmap<'_> {
    fn drop(&mut self) {
        self.0.unmap();
    }
}

pub(crate) fn buffer(device: &Device, label: &str, size: u64, usage: wgpu::BufferUsages) -> wgpu::Buffer {
    device.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: buffer_bytes(size),
        usage,
        mapped_at_creation: false,
    })
}

/// The bytes kernel `k` moves through its binding of `node` (`size` bytes): all of them,
/// except for an input whose every use in the kernel is a slice, which reads the slices'
/// elements only (at most the whole binding).
fn binding_bytes(g: &Graph, k: &fusegraph_passes::Kernel, node: NodeId, size: u64) -> u64 {
    let users: Vec<NodeId> = g.users(node).into_iter().filter(|u| k.members.contains(u)).collect();
    let sliced = k.inputs.contains(&node)
        && !k.outputs.contains(&node)
        && !users.is_empty()
        && users.iter().all(|&u| matches!(g.node(u).op, Op::Slice { .. }));
    match sliced {
        true => users.iter().map(|&u| g.ty(u).buffer_bytes() as u64).sum::<u64>().min(size),
        false => size,
    }
}

/// `opts.updates` as the planner takes them: each parameter's name with the index of its new
/// value among the planned outputs, where the values follow the `first` user outputs.
fn planned_updates(opts: &CompileOptions, first: usize) -> Vec<(String, usize)> {
    opts.updates.iter().enumerate().map(|(i, (name, _))| (name.clone(), first + i)).collect()
}

impl Device {
    /// Planner options matching this device's limits, cost model and `opts`.
    fn plan_options(self: &Arc<Self>, opts: &CompileOptions) -> PlanOptions {
        let limits = self.limits();
        PlanOptions {
            fusion: opts.fusion,
            cost: if opts.fusion == FusionMode::On && !opts.calibrating {
                self.cost_model()
            } else {
                Default::default()
            },
            max_bindings: limits.max_storage_buffers_per_shader_stage as usize,
            alignment: (limits.min_storage_buffer_offset_alignment as u64).max(4),
            simplify: opts.simplify,
            remat: opts.remat,
            fused_attention: opts.fused_attention,
            hoist: opts.hoist_parameters,
            combine_products: opts.combine_products,
            ..Default::default()
        }
    }

    /// The limit in force for a compile: its own, and what the device limit leaves free.
    fn limit_for(&self, opts: &CompileOptions) -> Option<u64> {
        match (opts.memory_limit, self.pool.available()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The memory `compile` would plan for `outputs` of `graph` under `opts` (simplification,
    /// fusion, schedule, and toward the limit fused attention and rematerialization), without
    /// allocating anything.
    ///
    /// With `opts.updates`, their values are planned after `outputs` as `compile` plans them
    /// (in place where safe); the summary's staging then counts them too.
    ///
    /// The summary counts the buffers. A CPU adapter's executable may also hold workspace
    /// textures ([`ExecutableStats::workspace_bytes`]), only where the memory limit leaves
    /// room for them: a plan that fits the limit compiles within it.
    pub fn plan(self: &Arc<Self>, graph: &Graph, outputs: &[NodeId], opts: &CompileOptions) -> Result<PlanSummary> {
        let mut popts = self.plan_options(opts);
        popts.updates = planned_updates(opts, outputs.len());
        let mut outs = outputs.to_vec();
        outs.extend(opts.updates.iter().map(|(_, node)| *node));
        let limit = self.limit_for(opts);
        let mixed = if opts.mixed_precision {
            let (g, mixed_outs) = opts.mixed(graph, &outs)?;
            outs = mixed_outs;
            Some(g)
        } else {
            None
        };
        let g = mixed.as_ref().unwrap_or(graph);
        if opts.split_k == SplitK::Off && opts.split_reductions == SplitReductions::Off {
            return Ok(plan_summary_within(g, &outs, &popts, limit)?);
        }
        // As `compile`: simplified, then split where the split plan fits the limit.
        let mut rewritten = g.clone();
        self.rewrite(&mut rewritten, &mut outs, opts, &popts, limit)?;
        popts.simplify = false;
        Ok(plan_summary_within(&rewritten, &outs, &popts, limit)?)
    }

    /// The device-dependent rewrites `compile` and `plan` make before fusion, in order:
    /// simplification (with `opts.simplify`), split-k ([`CompileOptions::split_k`]), kept
    /// only where the split plan fits `limit` as it is (without rematerialization or fused
    /// attention: a split never costs a graph its fit or a recomputation), and split
    /// reductions ([`CompileOptions::split_reductions`]), likewise.
    fn rewrite(
        self: &Arc<Self>,
        graph: &mut Graph,
        outputs: &mut Vec<NodeId>,
        opts: &CompileOptions,
        popts: &PlanOptions,
        limit: Option<u64>,
    ) -> Result<()> {
        if opts.simplify {
            fusegraph_passes::simplify(graph, outputs)?;
        }
        let popts = PlanOptions { simplify: false, ..popts.clone() };
        let fits = |g: &Graph, outs: &[NodeId]| {
            limit.is_none_or(|l| plan_within(g, outs, &popts, None).is_ok_and(|p| p.summary.total_bytes <= l))
        };
        // Split-k after simplification (batch-norm folding looks for the unsplit product).
        let choice = opts.split_k;
        if choice != SplitK::Off {
            let (mut split, mut split_outs) = (graph.clone(), outputs.clone());
            if !split_k(&mut split, &mut split_outs, &|gemm| choice.splits(self, gemm))?.is_empty()
                && fits(&split, &split_outs)
            {
                (*graph, *outputs) = (split, split_outs);
            }
        }
        if let Some(fill) = opts.split_reductions.fill(self.cpu_kernels()).filter(|_| opts.fusion == FusionMode::On) {
            let (mut split, mut split_outs) = (graph.clone(), outputs.clone());
            if !split_reduce(&mut split, &mut split_outs, &|r| fill_chunks(r, &fill))?.is_empty()
                && fits(&split, &split_outs)
            {
                (*graph, *outputs) = (split, split_outs);
            }
        }
        Ok(())
    }

    /// The largest batch in `1..=max_batch` whose plan fits `limit` bytes on this device,
    /// asking the planner only (no allocation, no dispatch); `None` if batch 1 does not fit.
    pub fn largest_batch(
        self: &Arc<Self>,
        build: impl Fn(usize) -> fusegraph_ir::Result<(Graph, Vec<NodeId>)>,
        limit: u64,
        opts: &CompileOptions,
        max_batch: usize,
    ) -> Result<Option<usize>> {
        Ok(fusegraph_passes::largest_batch(build, limit, &self.plan_options(opts), max_batch)?)
    }

    /// Compiles `outputs` of `graph` into an executable on this device. Nothing is
    /// dispatched; a graph that does not fit the adapter's limits fails here.
    pub fn compile(self: &Arc<Self>, graph: &Graph, outputs: &[NodeId], opts: &CompileOptions) -> Result<Executable> {
        let start = std::time::Instant::now();
        verify(graph)?;
        for &o in outputs {
            graph.check(o)?;
        }
        // Every input and parameter of the graph as the user wrote it may be fed or set, even
        // if simplification finds the outputs do not need it.
        let mut declared_inputs = BTreeMap::new();
        let mut declared_params = BTreeMap::new();
        for id in graph.node_ids() {
            match &graph.node(id).op {
                Op::Input { name } => {
                    declared_inputs.insert(name.clone(), graph.ty(id).clone());
                }
                Op::Parameter { name } => {
                    declared_params.insert(name.clone(), graph.ty(id).clone());
                }
                _ => {}
            }
        }
        for (name, node) in &opts.updates {
            graph.check(*node)?;
            let declared =
                declared_params.get(name).ok_or_else(|| RuntimeError::UnknownParameter { name: name.clone() })?;
            if graph.ty(*node) != declared {
                return Err(RuntimeError::WrongType {
                    what: "parameter update",
                    name: name.clone(),
                    expected: declared.clone(),
                    got: graph.ty(*node).clone(),
                });
            }
        }
        // Update values are outputs of the plan (kept alive to the end) but not returned.
        let user_outputs = outputs.len();
        let mut outs_vec = outputs.to_vec();
        outs_vec.extend(opts.updates.iter().map(|(_, n)| *n));
        let mut simplified = graph.clone();
        if opts.mixed_precision {
            (simplified, outs_vec) = opts.mixed(graph, &outs_vec)?;
        }
        let limits = self.limits();
        let mut popts = self.plan_options(opts);
        let limit = self.limit_for(opts);
        popts.remat = opts.remat;
        // Updates are planned in place where safe (their values follow the user's outputs).
        popts.updates = planned_updates(opts, user_outputs);
        self.rewrite(&mut simplified, &mut outs_vec, opts, &popts, limit)?;
        let rewritten = start.elapsed();
        let update_nodes = outs_vec.split_off(user_outputs);
        let mut plan_outputs = outs_vec.clone();
        plan_outputs.extend(update_nodes.iter().copied());
        // Sibling products combined: their weights stack into parameters whose parts are the
        // user's parameters, each written and read where it lies in the stack.
        let (mut planned, groups) = plan_combined_within(&mut simplified, &plan_outputs, &popts, limit)?;
        let planned_at = start.elapsed();
        let combined_products = (groups.iter().map(|c| c.products.len()).sum(), groups.len());
        let stacked: BTreeMap<String, Joined> = groups
            .into_iter()
            .flat_map(|c| std::iter::once(c.weights).chain(c.biases))
            .map(|j| (j.name.clone(), j))
            .collect();
        let (graph, outputs) = (&simplified, outs_vec.as_slice());
        // The planner counts every output it was given as staging; update values stay on the
        // device and are never read back.
        let update_staging: u64 = update_nodes
            .iter()
            .filter(|u| !outputs.contains(u))
            .map(|u| planned.plan.locations.get(u).map_or(0, |l| l.size))
            .sum();
        planned.summary.staging_bytes -= update_staging.min(planned.summary.staging_bytes);
        planned.summary.total_bytes -= update_staging.min(planned.summary.total_bytes);
        if let Some(limit) = limit {
            let s = &planned.summary;
            // Every buffer is at least 4 bytes, an empty region's too.
            let needed: u64 = [s.persistent_bytes, s.arena_bytes, s.staging_bytes].map(buffer_bytes).iter().sum();
            if needed > limit {
                return Err(RuntimeError::ResourceExhausted {
                    graph: opts.name.clone().unwrap_or_else(|| format!("a graph of {} nodes", graph.len())),
                    needed,
                    persistent: s.persistent_bytes,
                    arena: s.arena_bytes,
                    staging: s.staging_bytes,
                    limit,
                    lower_bound: s.lower_bound_bytes,
                    largest: s
                        .peak_values
                        .iter()
                        .map(|v| (format!("{v_node} {} {}", v.op, graph.ty(v.node), v_node = v.node), v.bytes))
                        .collect(),
                });
            }
        }
        let (kernels, plan, prepared) = (planned.kernels, planned.plan, planned.prepared);
        let lower_opts = LowerOptions {
            f16_native: self.f16_native(),
            cpu: self.cpu_kernels(),
            subgroups: self.features().contains(wgpu::Features::SUBGROUP),
            subgroup_size: crate::device::fixed_subgroup_size(self.info()),
            cooperative_matrix: self.cooperative_matrix(),
            tiled_attention: self.tiled_attention(),
            texture_operands: self.texture_operand_rows(),
        };
        // A forced tiling asks for the workgroup-tiled kernel, not the subgroup one.
        let strategy = Strategy { subgroup_matmul: opts.matmul_tiling.is_none(), ..Default::default() };
        // Matmul kernels that can run on cooperative matrices (f16 products on adapters that
        // have them), and those that take the subgroup lowering (CPU adapters, not tuned).
        let coop_able: Vec<bool> =
            kernels.iter().map(|k| strategy.tiled_matmul && cooperative_matmul(graph, k, &lower_opts)).collect();
        let subgroup: Vec<bool> = kernels
            .iter()
            .zip(&coop_able)
            .map(|(k, &able)| {
                !able
                    && strategy.tiled_matmul
                    && strategy.subgroup_matmul
                    && subgroup_matmul(graph, k, &lower_opts).is_some()
            })
            .collect();
        // Each tiled matmul kernel takes the forced tiling, else the tuned one for its shape
        // class, else the default for its shape (the default cooperative one where it can
        // run on cooperative matrices). The tuner weighs the cooperative tilings against the
        // plain ones on an adapter's own cooperative matrices; emulated ones (a test vehicle,
        // seconds per product) keep the default. A cooperative tiling selects that kernel.
        let native_coop = self.cooperative_matrix() == Some(fusegraph_wgsl::Cooperative::Native);
        let tilings: Vec<Option<MatmulTiling>> = kernels
            .iter()
            .zip(subgroup.iter().zip(&coop_able))
            .map(|(k, (&subgroup, &able))| {
                let (shape, dtype) = gemm_shape(graph, k, &lower_opts).filter(|_| strategy.tiled_matmul)?;
                if subgroup {
                    return None;
                }
                let tuned = || if able && !native_coop { None } else { self.tuned_tiling(&shape, dtype, able) };
                let default =
                    if able { MatmulTiling::COOP_CANDIDATES[0] } else { MatmulTiling::default_for(shape.m, shape.n) };
                Some(opts.matmul_tiling.or_else(tuned).unwrap_or(default))
            })
            .collect();
        let coop: Vec<bool> =
            tilings.iter().zip(&coop_able).map(|(t, &able)| able && t.is_some_and(|t| t.is_cooperative())).collect();
        let unshared = if opts.excess_precision { unshared_members(&kernels) } else { vec![Vec::new(); kernels.len()] };
        let lower_all = |lower_opts: &LowerOptions| -> Vec<KernelSource> {
            kernels
                .iter()
                .zip(&unshared)
                .zip(tilings.iter().zip(&coop))
                .map(|((k, unshared), (&matmul_tiling, &cooperative_matmul))| {
                    let strategy = Strategy { matmul_tiling, cooperative_matmul, ..strategy };
                    lower_planned(graph, k, unshared, lower_opts, &strategy)
                })
                .collect()
        };
        let mut sources = lower_all(&lower_opts);
        let mut staging_bytes = 0;
        for &o in outputs {
            staging_bytes += plan.locations[&o].size;
        }
        // Texture operands take workspace memory: only where the limit leaves room for it
        // beside the buffers, and where every value copied starts on a whole texel.
        let held: u64 = [plan.arena_bytes, plan.persistent_bytes, staging_bytes].map(buffer_bytes).iter().sum();
        let mut workspace_plan = WorkspacePlan::of(graph, &sources);
        let aligned = sources.iter().zip(&workspace_plan.uses).all(|(src, uses)| {
            uses.iter().all(|&(b, t, _)| {
                plan.locations[&src.bindings[b].node].offset.is_multiple_of(texel_bytes(workspace_plan.textures[t].1))
            })
        });
        if workspace_plan.bytes() > 0 && (!aligned || limit.is_some_and(|l| held + workspace_plan.bytes() > l)) {
            sources = lower_all(&LowerOptions { texture_operands: None, ..lower_opts });
            workspace_plan = WorkspacePlan::of(graph, &sources);
        }
        let lowered = start.elapsed();
        for (k, s) in sources.iter().enumerate() {
            tracing::trace!(target: "fusegraph::wgsl", kernel = k, "{}", s.annotated());
        }
        let dump = opts.dump_wgsl.clone().or_else(|| crate::env::env().dump_wgsl.clone());
        if let Some(dir) = dump {
            if std::fs::create_dir_all(&dir).is_ok() {
                for (k, s) in sources.iter().enumerate() {
                    let _ = std::fs::write(dir.join(format!("k{k:03}.wgsl")), s.annotated());
                }
            }
        }
        for s in &sources {
            if s.bindings.len() > limits.max_storage_buffers_per_shader_stage as usize {
                return Err(RuntimeError::TooManyBindings {
                    kernel: s.label.clone(),
                    needed: s.bindings.len(),
                    limit: limits.max_storage_buffers_per_shader_stage,
                });
            }
        }
        let max_binding = limits.max_storage_buffer_binding_size;
        for (id, loc) in &plan.locations {
            if loc.size > max_binding {
                return Err(RuntimeError::TooLarge {
                    what: format!("value {id} ({})", graph.ty(*id)),
                    bytes: loc.size,
                    limit: max_binding,
                });
            }
        }
        for (what, bytes) in [("the arena", plan.arena_bytes), ("the persistent region", plan.persistent_bytes)] {
            if bytes > limits.max_buffer_size {
                return Err(RuntimeError::TooLarge { what: what.into(), bytes, limit: limits.max_buffer_size });
            }
        }
        // Reused buffers may be a little larger than planned, within the limit in force.
        let mut slack = limit.map_or(u64::MAX, |l| l.saturating_sub(held + workspace_plan.bytes()));
        let arena_alloc = self.allocate(Kind::Storage, plan.arena_bytes, &mut slack, "the arena")?;
        let persistent_alloc =
            self.allocate(Kind::Storage, plan.persistent_bytes, &mut slack, "the persistent region")?;
        let staging_alloc = self.allocate(Kind::Staging, staging_bytes, &mut slack, "the staging buffer")?;
        let workspace = workspace_plan
            .textures
            .iter()
            .map(|&(_, format, rows)| self.allocate_texture(format, TEXTURE_ROW, rows, "a matmul operand texture"))
            .collect::<Result<Vec<_>>>()?;
        let (arena, persistent) = (arena_alloc.buffer(), persistent_alloc.buffer());

        let mut inputs = BTreeMap::new();
        let mut params = BTreeMap::new();
        for (&id, &loc) in &plan.locations {
            let node = graph.node(id);
            let slot = Slot { ty: node.ty.clone(), loc };
            match &node.op {
                Op::Input { name } => {
                    inputs.insert(name.clone(), slot);
                }
                Op::Parameter { name } => match stacked.get(name) {
                    // Each part where it lies in the stack.
                    Some(joined) => {
                        let bytes = joined.part.buffer_bytes() as u64;
                        for (i, part) in joined.parts.iter().enumerate() {
                            let loc = Location { offset: loc.offset + i as u64 * bytes, size: bytes, ..loc };
                            params.insert(part.clone(), (Slot { ty: joined.part.clone(), loc }, false));
                        }
                    }
                    None => {
                        params.insert(name.clone(), (slot, false));
                    }
                },
                Op::Constant { values } => {
                    let host = HostTensor::from_f64(node.ty.dtype, node.ty.shape.clone(), values)?;
                    self.queue.write_buffer(persistent, loc.offset, &host.to_bytes());
                }
                _ => {}
            }
        }
        let mut outs = Vec::new();
        let mut staging_offset = 0;
        for &o in outputs {
            let loc = plan.locations[&o];
            outs.push((Slot { ty: graph.ty(o).clone(), loc }, staging_offset));
            staging_offset += loc.size;
        }
        let mut updates = Vec::new();
        for ((name, _), &node) in opts.updates.iter().zip(&update_nodes) {
            let from = plan.locations[&node];
            let to = params
                .get(name)
                .map(|(slot, _): &(Slot, bool)| slot.loc)
                .ok_or_else(|| RuntimeError::UnusedUpdate { name: name.clone() })?;
            if from != to {
                updates.push((from, to));
            }
        }

        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut compiled = Vec::new();
        let mut kstats = Vec::new();
        let paths = tilings.iter().zip(&subgroup).zip(&coop);
        for ((k, src), ((&matmul_tiling, &subgroup_matmul), &cooperative_matmul)) in
            kernels.iter().zip(&sources).zip(paths)
        {
            let pipeline = self.pipeline(&src.wgsl, &src.bindings, &src.label)?;
            let uses = &workspace_plan.uses[compiled.len()];
            let entries: Vec<wgpu::BindGroupEntry> = src
                .bindings
                .iter()
                .enumerate()
                .map(|(b, binding)| {
                    let resource = match uses.iter().find(|u| u.0 == b) {
                        Some(&(_, t, _)) => wgpu::BindingResource::TextureView(&workspace[t].view),
                        None => {
                            let loc = plan.locations[&binding.node];
                            wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                buffer: if loc.region == Region::Persistent { persistent } else { arena },
                                offset: loc.offset,
                                size: wgpu::BufferSize::new(loc.size),
                            })
                        }
                    };
                    wgpu::BindGroupEntry { binding: b as u32, resource }
                })
                .collect();
            let copies = uses
                .iter()
                .map(|&(b, t, texels)| TextureCopy {
                    loc: plan.locations[&src.bindings[b].node],
                    texels,
                    texel_bytes: texel_bytes(workspace_plan.textures[t].1),
                    texture: t,
                })
                .collect();
            let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&src.label),
                layout: &pipeline.1,
                entries: &entries,
            });
            let groups = src.workgroups;
            let max_dim = limits.max_compute_workgroups_per_dimension as u64;
            let x = groups.min(max_dim);
            let y = if x == 0 { 0 } else { groups.div_ceil(x) };
            if y > max_dim {
                return Err(RuntimeError::TooLarge {
                    what: format!("kernel `{}` workgroups", src.label),
                    bytes: groups,
                    limit: max_dim * max_dim,
                });
            }
            let workgroups = [x as u32, y as u32, 1];
            let bytes_moved =
                src.bindings.iter().map(|b| binding_bytes(graph, k, b.node, plan.locations[&b.node].size)).sum();
            kstats.push(KernelStats {
                label: src.label.clone(),
                members: k.members.clone(),
                bytes_moved,
                workgroups,
                matmul_tiling,
                subgroup_matmul,
                texture_operands: uses.len(),
                cooperative_matmul,
                attention: matches!(k.kind, fusegraph_passes::KernelKind::Attention { .. }),
            });
            compiled.push(CompiledKernel { pipeline, bind_group, workgroups, copies });
        }
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(RuntimeError::Wgpu { during: "creating bind groups".into(), detail: e.to_string() });
        }
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        tracing::debug!(
            target: "fusegraph::timing",
            graph = opts.name.as_deref().unwrap_or("-"),
            nodes = graph.len(),
            kernels = sources.len(),
            rewrite_ms = ms(rewritten),
            plan_ms = ms(planned_at - rewritten),
            lower_ms = ms(lowered - planned_at),
            pipelines_ms = ms(start.elapsed() - lowered),
            "compiled"
        );
        tracing::debug!(
            target: "fusegraph::plan",
            graph = opts.name.as_deref().unwrap_or("-"),
            arena_bytes = plan.arena_bytes,
            persistent_bytes = plan.persistent_bytes,
            staging_bytes,
            lower_bound_bytes = plan.lower_bound_bytes,
            "memory plan"
        );
        let stats = ExecutableStats {
            pipelines: sources.iter().map(|s| s.wgsl.as_str()).collect::<std::collections::BTreeSet<_>>().len(),
            bytes_moved: kstats.iter().map(|k| k.bytes_moved).sum(),
            kernels: kstats,
            arena_bytes: plan.arena_bytes,
            persistent_bytes: plan.persistent_bytes,
            staging_bytes,
            lower_bound_bytes: plan.lower_bound_bytes,
            naive_bytes: plan.naive_bytes,
            workspace_bytes: workspace.iter().map(|t| t.size).sum(),
            prepared_kernels: prepared,
            combined_products,
            device_bytes: arena_alloc.size
                + persistent_alloc.size
                + staging_alloc.size
                + workspace.iter().map(|t| t.size).sum::<u64>(),
        };
        Ok(Executable {
            device: self.clone(),
            kernels: compiled,
            inputs,
            params,
            declared_inputs,
            declared_params,
            outputs: outs,
            updates,
            arena: arena_alloc,
            persistent: persistent_alloc,
            staging: staging_alloc,
            workspace,
            stats,
            plan,
            graph: graph.clone(),
            running: std::sync::Mutex::new(()),
            prepared,
            stale: std::sync::atomic::AtomicBool::new(true),
        })
    }
}

impl Executable {
    /// Kernel count, members and bytes moved.
    pub fn stats(&self) -> &ExecutableStats {
        &self.stats
    }

    /// The graph after simplification, as compiled.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The compiled graph as Graphviz DOT, one cluster per kernel, so a user can see what
    /// fused.
    pub fn to_dot(&self) -> String {
        let clusters: Vec<Vec<NodeId>> = self.stats.kernels.iter().map(|k| k.members.clone()).collect();
        fusegraph_ir::dot::to_dot(&self.graph, &clusters)
    }

    /// The memory plan the executable runs with.
    pub fn memory_plan(&self) -> &MemoryPlan {
        &self.plan
    }

    /// The device it runs on.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Names and types of the inputs the graph declares (feeds for inputs the outputs do
    /// not need are accepted and ignored).
    pub fn inputs(&self) -> Vec<(String, TensorType)> {
        self.declared_inputs.iter().map(|(n, t)| (n.clone(), t.clone())).collect()
    }

    /// Names and types of the parameters the graph declares.
    pub fn parameters(&self) -> Vec<(String, TensorType)> {
        self.declared_params.iter().map(|(n, t)| (n.clone(), t.clone())).collect()
    }

    /// Uploads a parameter's value; it stays on the device for every later run. The kernels
    /// that compute from parameters alone ([`CompileOptions::hoist_parameters`]) run again on
    /// the next run.
    pub fn set_parameter(&mut self, name: &str, value: &HostTensor) -> Result<()> {
        let declared =
            self.declared_params.get(name).ok_or_else(|| RuntimeError::UnknownParameter { name: name.into() })?;
        if value.ty() != *declared {
            return Err(RuntimeError::WrongType {
                what: "parameter",
                name: name.into(),
                expected: declared.clone(),
                got: value.ty(),
            });
        }
        // A parameter the outputs do not need was removed by simplification: nothing to upload.
        if let Some((slot, loaded)) = self.params.get_mut(name) {
            // Stored in another dtype (mixed precision's f16 weights): rounded here.
            let stored = match slot.ty.dtype == value.dtype() {
                true => value.to_bytes(),
                false => HostTensor::from_f64(slot.ty.dtype, slot.ty.shape.clone(), &value.to_f64())?.to_bytes(),
            };
            self.device.queue.write_buffer(self.persistent.buffer(), slot.loc.offset, &stored);
            *loaded = true;
            // What the hoisted kernels computed from it is out of date.
            *self.stale.get_mut() = true;
        }
        Ok(())
    }

    fn region(&self, r: Region) -> &wgpu::Buffer {
        match r {
            Region::Persistent => self.persistent.buffer(),
            Region::Arena => self.arena.buffer(),
        }
    }

    /// Records the parameter updates: copies after every kernel has run.
    fn encode_updates(&self, encoder: &mut wgpu::CommandEncoder) {
        for (from, to) in &self.updates {
            encoder.copy_buffer_to_buffer(
                self.region(from.region),
                from.offset,
                self.region(to.region),
                to.offset,
                from.size,
            );
        }
    }

    /// Reads a parameter's current value back from the device (after updates, if any).
    pub fn parameter(&self, name: &str) -> Result<HostTensor> {
        let declared =
            self.declared_params.get(name).ok_or_else(|| RuntimeError::UnknownParameter { name: name.into() })?;
        let Some((slot, loaded)) = self.params.get(name) else {
            return Err(RuntimeError::UnusedUpdate { name: name.into() });
        };
        if !loaded {
            return Err(RuntimeError::MissingParameter { name: name.into(), ty: declared.clone() });
        }
        let d = &self.device;
        let read = d.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("fusegraph parameter readback"),
            size: slot.loc.size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = d
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("fusegraph read parameter") });
        encoder.copy_buffer_to_buffer(self.persistent.buffer(), slot.loc.offset, &read, 0, slot.loc.size);
        d.queue.submit([encoder.finish()]);
        read.map_async(wgpu::MapMode::Read, .., |_| {});
        d.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| RuntimeError::Wgpu { during: "reading a parameter".into(), detail: e.to_string() })?;
        let value = {
            let view = read
                .get_mapped_range(..)
                .map_err(|e| RuntimeError::Wgpu { during: "reading a parameter".into(), detail: e.to_string() })?;
            HostTensor::from_bytes(&slot.ty, &view)?
        };
        read.unmap();
        let value = match value.dtype() == declared.dtype {
            true => value,
            false => HostTensor::from_f64(declared.dtype, declared.shape.clone(), &value.to_f64())?,
        };
        Ok(value)
    }

    /// Records every dispatch of a run, with timestamps around them all if given: the
    /// hoisted kernels only while their values are stale. The caller submits it and then
    /// calls [`Executable::prepared_done`].
    pub(crate) fn encode(&self, encoder: &mut wgpu::CommandEncoder, timestamps: Option<&wgpu::QuerySet>) {
        self.encode_kernels(encoder, self.first_kernel()..self.kernels.len(), timestamps.map(|q| (q, 0)));
    }

    /// The first kernel a run dispatches: past the hoisted ones unless they are stale.
    pub(crate) fn first_kernel(&self) -> usize {
        if self.stale.load(std::sync::atomic::Ordering::Acquire) {
            0
        } else {
            self.prepared
        }
    }

    /// Marks the hoisted kernels' values current, after a submit that ran them.
    pub(crate) fn prepared_done(&self) {
        self.stale.store(false, std::sync::atomic::Ordering::Release);
    }

    /// Records the dispatches of `kernels` in order, in as few compute passes as their
    /// texture copies allow (a copy goes between passes, right before the kernel that reads
    /// it), with timestamps at `query` and `query + 1` of `ts` around all of it, copies
    /// included.
    pub(crate) fn encode_kernels(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        kernels: impl IntoIterator<Item = usize>,
        ts: Option<(&wgpu::QuerySet, u32)>,
    ) {
        let active: Vec<&CompiledKernel> =
            kernels.into_iter().map(|k| &self.kernels[k]).filter(|k| k.workgroups[0] > 0).collect();
        // Runs of kernels that share a pass: each starts where a kernel needs copies first.
        let mut passes: Vec<&[&CompiledKernel]> = Vec::new();
        let mut rest = active.as_slice();
        while !rest.is_empty() {
            let end = rest.iter().skip(1).position(|k| !k.copies.is_empty()).map_or(rest.len(), |p| p + 1);
            passes.push(&rest[..end]);
            rest = &rest[end..];
        }
        let writes = |begin: bool, end: bool| {
            ts.filter(|_| begin || end).map(|(q, i)| wgpu::ComputePassTimestampWrites {
                query_set: q,
                beginning_of_pass_write_index: begin.then_some(i),
                end_of_pass_write_index: end.then_some(i + 1),
            })
        };
        let label = Some("fusegraph kernels");
        // The first timestamp precedes any copy; an empty pass carries it where one does.
        let lead = passes.first().is_none_or(|p| !p[0].copies.is_empty());
        if lead && ts.is_some() {
            let timestamp_writes = writes(true, passes.is_empty());
            drop(encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label, timestamp_writes }));
        }
        for (i, run) in passes.iter().enumerate() {
            for c in &run[0].copies {
                self.encode_copy(encoder, c);
            }
            let timestamp_writes = writes(i == 0 && !lead, i + 1 == passes.len());
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label, timestamp_writes });
            for k in run.iter() {
                pass.set_pipeline(&k.pipeline.0);
                pass.set_bind_group(0, &k.bind_group, &[]);
                pass.dispatch_workgroups(k.workgroups[0], k.workgroups[1], k.workgroups[2]);
            }
        }
    }

    /// Records the copy of a value's bytes into its workspace texture: the whole rows of
    /// [`TEXTURE_ROW`] texels, then the partial last row.
    fn encode_copy(&self, encoder: &mut wgpu::CommandEncoder, c: &TextureCopy) {
        let row = TEXTURE_ROW as u64;
        let (full, rem) = (c.texels / row, c.texels % row);
        let texture = &self.workspace[c.texture].texture;
        let source = |first_row: u64| wgpu::TexelCopyBufferInfo {
            buffer: self.region(c.loc.region),
            layout: wgpu::TexelCopyBufferLayout {
                offset: c.loc.offset + first_row * row * c.texel_bytes,
                bytes_per_row: Some((row * c.texel_bytes) as u32),
                rows_per_image: None,
            },
        };
        let destination = |y: u64| wgpu::TexelCopyTextureInfo {
            texture,
            mip_level: 0,
            origin: wgpu::Origin3d { x: 0, y: y as u32, z: 0 },
            aspect: wgpu::TextureAspect::All,
        };
        for (y, width, height) in [(0, row, full), (full, rem, 1)] {
            if width > 0 && height > 0 {
                let size = wgpu::Extent3d { width: width as u32, height: height as u32, depth_or_array_layers: 1 };
                encoder.copy_buffer_to_texture(source(y), destination(y), size);
            }
        }
    }

    /// Uploads `feeds` once, then times `runs` executions of the kernels (after `warmup`
    /// untimed ones), each submitted and waited for on its own. With GPU timestamps the time
    /// is the compute pass on the GPU; otherwise wall time from submit to completion.
    pub fn time(&self, feeds: &[(&str, &HostTensor)], warmup: usize, runs: usize) -> Result<Timing> {
        let _running = self.take_turn();
        self.run_in_turn(feeds)?;
        let d = &self.device;
        let ts = d.has_timestamps().then(|| {
            let set = d.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("fusegraph timing"),
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            });
            let resolve =
                buffer(d, "fusegraph timestamps", 16, wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC);
            let read = buffer(
                d,
                "fusegraph timestamps readback",
                16,
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            );
            (set, resolve, read)
        });
        let wait = || {
            d.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| RuntimeError::Wgpu { during: "waiting for a timed run".into(), detail: e.to_string() })
        };
        let mut ms = Vec::with_capacity(runs);
        for i in 0..warmup + runs {
            let mut encoder =
                d.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("fusegraph timed run") });
            self.encode(&mut encoder, ts.as_ref().map(|t| &t.0));
            self.encode_updates(&mut encoder);
            if let Some((set, resolve, read)) = &ts {
                encoder.resolve_query_set(set, 0..2, resolve, 0);
                encoder.copy_buffer_to_buffer(resolve, 0, read, 0, 16);
            }
            let start = std::time::Instant::now();
            d.queue.submit([encoder.finish()]);
            self.prepared_done();
            wait()?;
            let wall = start.elapsed().as_secs_f64() * 1e3;
            let value = match &ts {
                Some((_, _, read)) => {
                    read.map_async(wgpu::MapMode::Read, .., |_| {});
                    wait()?;
                    let t = {
                        let view = read.get_mapped_range(..).map_err(|e| RuntimeError::Wgpu {
                            during: "reading timestamps".into(),
                            detail: e.to_string(),
                        })?;
                        let a = u64::from_le_bytes(view[0..8].try_into().expect("8 bytes"));
                        let b = u64::from_le_bytes(view[8..16].try_into().expect("8 bytes"));
                        b.saturating_sub(a) as f64 * d.queue.get_timestamp_period() as f64 / 1e6
                    };
                    read.unmap();
                    t
                }
                None => wall,
            };
            if i >= warmup {
                ms.push(value);
            }
        }
        Ok(Timing { ms, gpu_timestamps: ts.is_some() })
    }

    /// Runs once with `feeds` (one per input, by name) and returns the outputs in the order
    /// they were given to `compile`. All kernels go in one command buffer and one submit.
    /// Errors (missing, unknown or mis-typed feeds, unset parameters) come before anything is
    /// written or dispatched.
    pub fn run(&self, feeds: &[(&str, &HostTensor)]) -> Result<Vec<HostTensor>> {
        let _running = self.take_turn();
        self.run_in_turn(feeds)
    }

    /// Waits until no other thread runs this executable; runs hold the guard throughout.
    pub(crate) fn take_turn(&self) -> std::sync::MutexGuard<'_, ()> {
        self.running.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// [`Executable::run`], for a caller holding [`Executable::take_turn`]'s guard.
    pub(crate) fn run_in_turn(&self, feeds: &[(&str, &HostTensor)]) -> Result<Vec<HostTensor>> {
        // Any input the graph declares may be fed (checked against its declaration); feeds of
        // inputs the outputs do not need are ignored.
        let names = || self.declared_inputs.keys().cloned().collect::<Vec<_>>().join(", ");
        for (name, value) in feeds {
            let declared = self
                .declared_inputs
                .get(*name)
                .ok_or_else(|| RuntimeError::UnknownFeed { name: name.to_string(), inputs: names() })?;
            if value.ty() != *declared {
                return Err(RuntimeError::WrongType {
                    what: "feed",
                    name: name.to_string(),
                    expected: declared.clone(),
                    got: value.ty(),
                });
            }
        }
        for (name, slot) in &self.inputs {
            if !feeds.iter().any(|(n, _)| n == name) {
                return Err(RuntimeError::MissingFeed { name: name.clone(), expected: slot.ty.clone() });
            }
        }
        for (name, (_, loaded)) in &self.params {
            if !loaded {
                let ty = self.declared_params[name].clone();
                return Err(RuntimeError::MissingParameter { name: name.clone(), ty });
            }
        }
        let d = &self.device;
        for (name, value) in feeds {
            if let Some(slot) = self.inputs.get(*name) {
                d.queue.write_buffer(self.arena.buffer(), slot.loc.offset, &value.to_bytes());
            }
        }
        let scope = d.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut encoder =
            d.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("fusegraph run") });
        self.encode(&mut encoder, None);
        for (slot, staging_offset) in &self.outputs {
            let src =
                if slot.loc.region == Region::Persistent { self.persistent.buffer() } else { self.arena.buffer() };
            encoder.copy_buffer_to_buffer(src, slot.loc.offset, self.staging.buffer(), *staging_offset, slot.loc.size);
        }
        // Parameters change last, so outputs hold this run's values whatever they alias.
        self.encode_updates(&mut encoder);
        d.queue.submit([encoder.finish()]);
        self.prepared_done();
        let (tx, rx) = std::sync::mpsc::channel();
        self.staging.buffer().map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        d.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| RuntimeError::Wgpu { during: "waiting for the run".into(), detail: e.to_string() })?;
        let mapped = rx
            .recv()
            .map_err(|e| RuntimeError::Wgpu { during: "mapping the staging buffer".into(), detail: e.to_string() })
            .and_then(|r| {
                r.map_err(|e| RuntimeError::Wgpu { during: "mapping the staging buffer".into(), detail: e.to_string() })
            });
        // Once mapped, the staging buffer is unmapped on every way out, errors included: a
        // buffer left mapped would fail every later run of this executable.
        let _unmap = mapped.is_ok().then(|| Unmap(self.staging.buffer()));
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(RuntimeError::Wgpu { during: "encoding the run".into(), detail: e.to_string() });
        }
        mapped?;
        let result = {
            let view = self.staging.buffer().get_mapped_range(..).map_err(|e| RuntimeError::Wgpu {
                during: "reading the staging buffer".into(),
                detail: e.to_string(),
            })?;
            self.outputs
                .iter()
                .map(|(slot, off)| {
                    HostTensor::from_bytes(&slot.ty, &view[*off as usize..(*off + slot.loc.size) as usize])
                })
                .collect::<std::result::Result<Vec<_>, _>>()
        };
        Ok(result?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_k_choices_parse_and_apply() {
        assert_eq!(SplitK::parse("off"), Some(SplitK::Off));
        assert_eq!(SplitK::parse(" fill:264 "), Some(SplitK::Fill { workgroups: 264 }));
        assert_eq!(SplitK::parse("4"), Some(SplitK::Slices(4)));
        for bad in ["", "on", "fill:", "fill:x", "-2", "4.5"] {
            assert_eq!(SplitK::parse(bad), None, "{bad:?}");
        }
        assert_eq!(SplitK::parse("tuned"), Some(SplitK::Tuned));
        let device = Arc::new(Device::new(&crate::DeviceOptions::default()).expect("a device"));
        let splits =
            |s: SplitK, m, n, k| s.splits(&device, &Gemm { batch: 1, m, n, k, dtype: fusegraph_ir::DType::F32 });
        // Slices: only where every slice is whole vec4s.
        assert_eq!(splits(SplitK::Slices(4), 8, 8, 64), 4);
        assert_eq!(splits(SplitK::Slices(4), 8, 8, 40), 1);
        assert_eq!(splits(SplitK::Slices(1), 8, 8, 64), 1);
        assert_eq!(splits(SplitK::Off, 8, 8, 1 << 16), 1);
        // Fill counts the untuned tiling's tiles: 256×768 takes 128×128 tiles (12 of them).
        assert_eq!(splits(SplitK::Fill { workgroups: 48 }, 256, 768, 3072), 4);
        assert_eq!(splits(SplitK::Fill { workgroups: 12 }, 256, 768, 3072), 1);
        // Tuned: products below the tuning threshold, or whose k allows no slice of 128,
        // are not measured.
        assert_eq!(splits(SplitK::Tuned, 8, 8, 64), 1);
        assert_eq!(splits(SplitK::Tuned, 1024, 1024, 200), 1);
        assert!(device.tuned_splits().is_empty());
    }
}
