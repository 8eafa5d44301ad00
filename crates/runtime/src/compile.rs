//! Compilation of a graph into an [`Executable`]: `Device::compile`, `Device::plan` and
//! `Device::largest_batch`, which run the same device-free stages
//! ([`fusegraph_passes::pipeline`]); `compile` then lowers the kernels here and allocates and
//! binds them in [`crate::bind`].

use crate::pool::texel_bytes;
use crate::{Device, MatmulFamily, ParamStore, Result, RuntimeError};
use fusegraph_ir::{verify, Graph, NodeId, Op, TensorType};
use fusegraph_passes::kernel::unshared_members;
use fusegraph_passes::pipeline::{self, held_bytes, Front, Stages};
use fusegraph_passes::split_k::Gemm;
use fusegraph_passes::{FusionMode, MemoryPlan, PlanOptions, PlanSummary};
use fusegraph_wgsl::{
    cooperative_matmul, gemm_shape, gemv_kernel, lower_planned, subgroup_matmul, KernelSource, LowerOptions,
    MatmulTiling, Strategy,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::executable::*;
use crate::options::*;
use crate::Executable;

/// The bytes kernel `k` moves through its binding of `node` (`size` bytes): all of them,
/// except for an input the kernel reads only in part ([`elements_read`]: slices of it,
/// gathered rows, through casts), which counts the elements read (at most the whole
/// binding), and, where the kernel writes windows alone (`window`: a
/// [`fusegraph_wgsl::KernelForm::Window`] kernel, or side windows), a dynamic update slice's
/// output, of which the update is stored, and the operand whose buffer it is, read only where
/// the kernel's other members read the result outside the window.
pub(crate) fn binding_bytes(g: &Graph, k: &fusegraph_passes::Kernel, node: NodeId, size: u64, window: bool) -> u64 {
    let update = |o: NodeId| matches!(g.node(o).op, Op::DynamicUpdateSlice { .. }) && k.outputs.contains(&o);
    if window && update(node) {
        return g.ty(g.operands(node)[1]).buffer_bytes() as u64;
    }
    let written_over = k.outputs.iter().copied().find(|&o| update(o) && g.operands(o)[0] == node);
    let read = match written_over {
        Some(o) if window => match g.users(o).iter().any(|u| k.members.contains(u)) {
            true => elements_read(g, k, o),
            false => Some(0),
        },
        _ if !k.inputs.contains(&node) || k.outputs.contains(&node) => None,
        _ => elements_read(g, k, node),
    };
    let numel = g.ty(node).shape.numel().max(1) as u128;
    read.map_or(size, |e| ((size as u128 * e as u128 / numel) as u64).min(size))
}

/// The elements of `node` that kernel `k` reads where its members read it only in part:
/// slices of it, rows gathered from it, either through casts. `None` where some member reads
/// it whole (or none reads it).
fn elements_read(g: &Graph, k: &fusegraph_passes::Kernel, node: NodeId) -> Option<usize> {
    let users: Vec<NodeId> = g.users(node).into_iter().filter(|u| k.members.contains(u)).collect();
    if users.is_empty() {
        return None;
    }
    users.iter().try_fold(0usize, |sum, &u| {
        let e = match g.node(u).op {
            Op::Slice { .. } => g.ty(u).shape.numel(),
            Op::Gather { .. } if g.operands(u)[0] == node => g.ty(u).shape.numel(),
            Op::Cast { .. } => elements_read(g, k, u)?,
            _ => return None,
        };
        Some(sum + e)
    })
}

/// A recorded graph for [`Device::largest_batch`]: the graph, the outputs read back, and
/// the parameter updates (a training step's), if any.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// The graph.
    pub graph: Graph,
    /// The outputs read back.
    pub outputs: Vec<NodeId>,
    /// `(parameter name, new value)` written after each run, as [`CompileOptions::updates`].
    pub updates: Vec<(String, NodeId)>,
}

impl From<(Graph, Vec<NodeId>)> for Recorded {
    fn from((graph, outputs): (Graph, Vec<NodeId>)) -> Self {
        Recorded { graph, outputs, updates: Vec::new() }
    }
}

impl Device {
    /// Planner options matching this device's limits, cost model and `opts`.
    fn plan_options(self: &Arc<Self>, opts: &CompileOptions, external_parameters: bool) -> PlanOptions {
        let limits = self.limits();
        PlanOptions {
            fusion: opts.fusion,
            cost: if opts.fusion == FusionMode::On { self.cost_model() } else { Default::default() },
            max_bindings: limits.max_storage_buffers_per_shader_stage as usize,
            alignment: (limits.min_storage_buffer_offset_alignment as u64).max(4),
            remat: opts.remat,
            fused_attention: opts.fused_attention,
            hoist: opts.hoist_parameters,
            combine_products: opts.combine_products,
            external_parameters,
            // Products of a few rows take the matrix–vector kernel in a GPU's loop forms
            // unless a tiling is forced (`Device::matmul_forms`), which takes siblings too —
            // where f16 results are not packed halves, which it does not store.
            gemv: self.forms_for(opts).loops == crate::Spread::Parallel
                && opts.matmul_tiling.is_none()
                && self.f16_native(),
            gemv_stage_bytes: limits.max_compute_workgroup_storage_size as usize,
            ..Default::default()
        }
    }

    /// The device-free stages ([`fusegraph_passes::pipeline`]) as a compile with `opts` runs
    /// them on this adapter, with `masters` kept f32 under mixed precision (besides the
    /// updated parameters), parameters in a store's buffers where `external`, and `limit` in
    /// force.
    fn stages<'a>(
        self: &'a Arc<Self>,
        opts: &'a CompileOptions,
        masters: BTreeSet<String>,
        external: bool,
        limit: Option<u64>,
    ) -> Stages<'a> {
        let splits = move |gemm: &Gemm| opts.split_k.splits(self, gemm);
        Stages {
            plan: self.plan_options(opts, external),
            simplify: opts.simplify,
            mixed_precision: opts.mixed_precision.then_some(masters),
            split_k: (opts.split_k != SplitK::Off).then(|| Box::new(splits) as pipeline::SplitCount),
            split_reductions: opts.split_reductions.fill(self.forms_for(opts).rows),
            limit,
        }
    }

    /// The limit in force for a compile's own buffers — its `memory_limit` less the `bound`
    /// bytes of store parameters it binds (that limit covers those too), or what the device
    /// limit leaves free (the store is allocated already), whichever is tighter — and the
    /// store bytes that limit counts (`bound` where it is the compile's own, else 0).
    fn limit_for(&self, opts: &CompileOptions, bound: u64) -> (Option<u64>, u64) {
        match (opts.memory_limit.map(|l| l.saturating_sub(bound)), self.pool.available()) {
            (Some(own), Some(device)) if device < own => (Some(device), 0),
            (Some(own), _) => (Some(own), bound),
            (None, device) => (device, 0),
        }
    }

    /// The memory `compile` would plan for `outputs` of `graph` under `opts`, without
    /// allocating anything: the same stages ([`fusegraph_passes::pipeline`]: mixed
    /// precision, simplification, splits that fit, fusion, schedule, and toward the limit
    /// hoisting dropped, fused attention and rematerialization). Updates (`opts.updates`) are
    /// planned as `compile` plans them and not counted as staging.
    ///
    /// The summary counts the buffers. A CPU adapter's executable may also hold workspace
    /// textures ([`ExecutableStats::workspace_bytes`]), only where the memory limit leaves
    /// room for them: a plan that fits the limit compiles within it.
    pub fn plan(self: &Arc<Self>, graph: &Graph, outputs: &[NodeId], opts: &CompileOptions) -> Result<PlanSummary> {
        let (limit, _) = self.limit_for(opts, 0);
        let stages = self.stages(opts, BTreeSet::new(), false, limit);
        Ok(pipeline::run(graph, outputs, &opts.updates, &stages)?.planned.summary)
    }

    /// The largest batch in `1..=max_batch` whose compile with `opts` fits `limit` bytes on
    /// this device, asking the planner only (the stages `compile` runs, no allocation, no
    /// dispatch); `None` if batch 1 does not fit. `build(batch)` records the graph at that
    /// batch: its outputs, or a [`Recorded`] with its updates (a training step's; the
    /// updates of `opts` are not used, since they name nodes of one graph).
    pub fn largest_batch<R: Into<Recorded>, E: std::fmt::Display>(
        self: &Arc<Self>,
        build: impl Fn(usize) -> std::result::Result<R, E>,
        limit: u64,
        opts: &CompileOptions,
        max_batch: usize,
    ) -> Result<Option<usize>> {
        // A model's own error (a layer's, say) reaches the planner as the op that failed.
        let build = |n: usize| {
            let r: Recorded = build(n)
                .map_err(|e| fusegraph_ir::IrError::Type {
                    op: "largest_batch".into(),
                    detail: format!("recording batch {n}: {e}"),
                })?
                .into();
            Ok((r.graph, r.outputs, r.updates))
        };
        let opts = CompileOptions { memory_limit: Some(limit), ..opts.clone() };
        let (limit, _) = self.limit_for(&opts, 0);
        let stages = self.stages(&opts, BTreeSet::new(), false, limit);
        Ok(pipeline::largest_batch(build, &stages, max_batch)?)
    }

    /// The kernel forms a compile with `opts` lowers in: forced, or the device's.
    fn forms_for(self: &Arc<Self>, opts: &CompileOptions) -> crate::KernelForms {
        opts.kernel_forms.unwrap_or_else(|| self.kernel_forms())
    }

    /// The code generator's facts about this adapter, and the forms `opts` asks for.
    fn lower_options(self: &Arc<Self>, opts: &CompileOptions) -> LowerOptions {
        let forms = self.forms_for(opts);
        let cpu = self.info().device_type == wgpu::DeviceType::Cpu;
        LowerOptions {
            f16_native: self.f16_native(),
            forms: forms.forms(),
            loop_budget: cpu.then_some(fusegraph_wgsl::CPU_LOOP_BUDGET),
            subgroups: self.features().contains(wgpu::Features::SUBGROUP),
            subgroup_size: crate::device::fixed_subgroup_size(self.info()),
            cooperative_matrix: self.cooperative_matrix(),
            tiled_attention: forms.tiled_attention,
            texture_operands: self.texture_operand_rows().filter(|_| forms.texture_operands),
            workgroup_storage: Some(self.limits().max_compute_workgroup_storage_size as usize),
        }
    }

    /// Per kernel, the tiling of its tiled matmul (`None`: not a tiled matmul), whether it
    /// takes the subgroup matmul, and whether it runs on cooperative matrices.
    fn matmul_forms(
        self: &Arc<Self>,
        graph: &Graph,
        kernels: &[fusegraph_passes::Kernel],
        opts: &CompileOptions,
        lower_opts: &LowerOptions,
    ) -> (Vec<Option<MatmulTiling>>, Vec<bool>, Vec<bool>) {
        // A forced tiling asks for the workgroup-tiled kernel, not the subgroup one.
        let strategy = Strategy { subgroup_matmul: opts.matmul_tiling.is_none(), ..Default::default() };
        // Matmul kernels that can run on cooperative matrices (f16 products on adapters that
        // have them), and those that take the subgroup lowering: where it applies, the family
        // forced, else measured per shape class, else the adapter's (a CPU's forms: subgroup).
        let coop_able: Vec<bool> =
            kernels.iter().map(|k| strategy.tiled_matmul && cooperative_matmul(graph, k, lower_opts)).collect();
        // Products of a few rows take the matrix–vector kernel unless a tiling is forced:
        // nothing to choose or measure for them.
        let gemv: Vec<bool> =
            kernels.iter().map(|k| opts.matmul_tiling.is_none() && gemv_kernel(graph, k, lower_opts)).collect();
        let subgroup: Vec<bool> = kernels
            .iter()
            .zip(&coop_able)
            .zip(&gemv)
            .map(|((k, &able), &gemv)| {
                let applies = !able
                    && !gemv
                    && strategy.tiled_matmul
                    && strategy.subgroup_matmul
                    && subgroup_matmul(graph, k, lower_opts).is_some();
                applies
                    && match opts.matmul_family {
                        MatmulFamily::Subgroup => true,
                        MatmulFamily::Tiled => false,
                        // `gpu_kernels` asks for a GPU's default forms, unmeasured.
                        MatmulFamily::Measured if self.gpu_kernels => false,
                        MatmulFamily::Measured => gemm_shape(graph, k, lower_opts)
                            .and_then(|(shape, dtype)| self.tuned_family(&shape, dtype))
                            .unwrap_or(self.cpu_kernels()),
                    }
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
            .zip(subgroup.iter().zip(&coop_able).zip(&gemv))
            .map(|(k, ((&subgroup, &able), &gemv))| {
                let (shape, dtype) = gemm_shape(graph, k, lower_opts).filter(|_| strategy.tiled_matmul)?;
                if subgroup || gemv {
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
        (tilings, subgroup, coop)
    }

    /// Checks the lowered kernels against the adapter's limits: bindings per kernel, bytes per
    /// binding, bytes per buffer.
    fn check_adapter_limits(&self, graph: &Graph, sources: &[KernelSource], plan: &MemoryPlan) -> Result<()> {
        let limits = self.limits();
        for s in sources {
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
                let value = match &graph.node(*id).op {
                    Op::Parameter { name } => format!("parameter `{name}`"),
                    Op::Input { name } => format!("input `{name}`"),
                    op => format!("value {id} ({})", op.name()),
                };
                return Err(RuntimeError::TooLarge {
                    what: format!("{value} ({}) in one storage binding", graph.ty(*id)),
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
        Ok(())
    }

    /// Compiles `outputs` of `graph` into an executable on this device. Nothing is
    /// dispatched; a graph that does not fit the adapter's limits fails here.
    pub fn compile(self: &Arc<Self>, graph: &Graph, outputs: &[NodeId], opts: &CompileOptions) -> Result<Executable> {
        self.compile_with(graph, outputs, opts, None)
    }

    /// [`Device::compile`], with the parameters bound to `store`'s buffers where one is given
    /// (see [`ParamStore::compile`]). The stages: the device-free front
    /// ([`fusegraph_passes::pipeline`]), the limit check, kernel forms and lowering
    /// ([`Device::lower`]), then allocation, binding and pipelines ([`crate::bind`]).
    pub(crate) fn compile_with(
        self: &Arc<Self>,
        graph: &Graph,
        outputs: &[NodeId],
        opts: &CompileOptions,
        store: Option<&ParamStore>,
    ) -> Result<Executable> {
        let start = std::time::Instant::now();
        if let Some(c) = opts.gemv_columns.filter(|c| !fusegraph_wgsl::GEMV_COLUMNS.contains(c)) {
            let detail = format!("{c} columns per workgroup; one of {:?}", fusegraph_wgsl::GEMV_COLUMNS);
            return Err(RuntimeError::InvalidOption { option: "gemv_columns".into(), detail });
        }
        verify(graph)?;
        for &o in outputs {
            graph.check(o)?;
        }
        let declared = declared(graph, opts)?;
        if let Some(store) = store {
            check_store(store, &declared.1)?;
        }
        // Bytes of the store's parameters this executable binds, which the limit covers.
        let bound = store.map_or(0, |_| bound_bytes(&declared));
        let (limit, counted) = self.limit_for(opts, bound);
        // A store's parameters stay f32 under mixed precision (other executables read them):
        // each is cast where used.
        let masters = match store {
            Some(_) => declared.1.keys().cloned().collect(),
            None => BTreeSet::new(),
        };
        let stages = self.stages(opts, masters, store.is_some(), limit);
        let front = pipeline::run(graph, outputs, &opts.updates, &stages)?;
        check_memory_limit(&front, opts, limit, counted)?;
        let (rewrite_time, plan_time) = (front.rewrite_time, front.plan_time);
        let lowered = self.lower(&front, opts, limit)?;
        let lowered_at = start.elapsed();
        let exe = self.bind(outputs, front, lowered, opts, store, declared)?;
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        tracing::debug!(
            target: "fusegraph::timing",
            graph = opts.name.as_deref().unwrap_or("-"),
            kernels = exe.kernels.len(),
            rewrite_ms = ms(rewrite_time),
            plan_ms = ms(plan_time),
            lower_ms = ms(lowered_at.saturating_sub(rewrite_time + plan_time)),
            bind_ms = ms(start.elapsed() - lowered_at),
            "compiled"
        );
        Ok(exe)
    }

    /// The lowering stage: the matmul forms of each kernel ([`Device::matmul_forms`]), every
    /// kernel lowered to WGSL (texture operands only where the limit leaves room), the WGSL
    /// traced and dumped where asked for, and checked against the adapter's limits.
    fn lower(self: &Arc<Self>, front: &Front, opts: &CompileOptions, limit: Option<u64>) -> Result<Lowered> {
        let (graph, plan, kernels) = (&front.graph, &front.planned.plan, &front.planned.kernels);
        let lower_opts = self.lower_options(opts);
        let (tilings, subgroup, coop) = self.matmul_forms(graph, kernels, opts, &lower_opts);
        let (staging_bytes, held) = (front.summary().staging_bytes, held_bytes(front.summary()));
        let forms = KernelForms { kernels, tilings: &tilings, subgroup: &subgroup, coop: &coop };
        let (sources, workspace) = lower_kernels(graph, &forms, opts, lower_opts, plan, held, limit);
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
        self.check_adapter_limits(graph, &sources, plan)?;
        Ok(Lowered { sources, workspace, tilings, staging_bytes, held, limit })
    }
}

/// The lowering stage's result: each kernel's WGSL, the workspace its texture operands
/// take, each kernel's matmul tiling, and the bytes of the plan's buffers.
pub(crate) struct Lowered {
    pub(crate) sources: Vec<KernelSource>,
    pub(crate) workspace: WorkspacePlan,
    pub(crate) tilings: Vec<Option<MatmulTiling>>,
    /// The outputs' bytes: the staging buffer.
    pub(crate) staging_bytes: u64,
    /// The arena, persistent and staging buffers' bytes together.
    pub(crate) held: u64,
    /// The limit in force for the executable's own buffers.
    pub(crate) limit: Option<u64>,
}

/// The inputs and parameters a graph declares, by name.
pub(crate) type Declared = (BTreeMap<String, TensorType>, BTreeMap<String, TensorType>);

/// Bytes of the declared parameters: those a store holds for an executable bound to it.
pub(crate) fn bound_bytes(declared: &Declared) -> u64 {
    declared.1.values().map(|t| t.buffer_bytes() as u64).sum()
}

/// The inputs and parameters of `graph` as the user wrote it, by name (each may be fed or
/// set even where simplification finds the outputs do not need it); checks that every one of
/// `opts.updates` names a declared parameter of its type.
fn declared(graph: &Graph, opts: &CompileOptions) -> Result<Declared> {
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
    Ok((declared_inputs, declared_params))
}

impl ParamStore {
    /// Compiles `outputs` of `graph` on the store's device with every parameter bound to the
    /// store's buffer of its name: the graph's parameters must all be in the store, of the
    /// types the graph declares ([`RuntimeError::NotInStore`], [`RuntimeError::WrongType`]).
    ///
    /// Differences from [`Device::compile`]: parameter updates (`opts.updates`) write the
    /// store; [`crate::Executable::set_parameter`] writes the store (every executable bound to
    /// it sees the value); with `mixed_precision` the parameters stay f32 and are cast where
    /// used; products do not combine (`combine_products`: their weights would have to be
    /// stacked into one buffer).
    pub fn compile(
        &self,
        graph: &fusegraph_ir::Graph,
        outputs: &[fusegraph_ir::NodeId],
        opts: &crate::CompileOptions,
    ) -> Result<crate::Executable> {
        self.device().compile_with(graph, outputs, opts, Some(self))
    }
}

/// Checks that `store` holds every parameter of the graph, each of its declared type.
fn check_store(store: &ParamStore, declared_params: &BTreeMap<String, TensorType>) -> Result<()> {
    for (name, ty) in declared_params {
        match store.ty(name) {
            None => return Err(RuntimeError::NotInStore { name: name.clone(), ty: ty.clone(), held: store.len() }),
            Some(held) if held != *ty => {
                return Err(RuntimeError::WrongType {
                    what: "store parameter",
                    name: name.clone(),
                    expected: ty.clone(),
                    got: held,
                })
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The kernels of a compile and the matmul forms chosen for them ([`Device::matmul_forms`]).
struct KernelForms<'a> {
    kernels: &'a [fusegraph_passes::Kernel],
    tilings: &'a [Option<MatmulTiling>],
    subgroup: &'a [bool],
    coop: &'a [bool],
}

/// Every kernel lowered to WGSL, and the workspace its texture operands take. Texture operands
/// take workspace memory: only where the limit leaves room for it beside the `held` bytes of
/// the buffers, and where every value copied starts on a whole texel; otherwise the kernels
/// read their buffers.
fn lower_kernels(
    graph: &Graph,
    forms: &KernelForms,
    opts: &CompileOptions,
    lower_opts: LowerOptions,
    plan: &MemoryPlan,
    held: u64,
    limit: Option<u64>,
) -> (Vec<KernelSource>, WorkspacePlan) {
    let KernelForms { kernels, tilings, subgroup, coop } = *forms;
    let strategy = Strategy { gemv_columns: opts.gemv_columns, ..Strategy::default() };
    let unshared = if opts.excess_precision { unshared_members(kernels) } else { vec![Vec::new(); kernels.len()] };
    let lower_all = |lower_opts: &LowerOptions| -> Vec<KernelSource> {
        kernels
            .iter()
            .zip(&unshared)
            .zip(tilings.iter().zip(coop).zip(subgroup))
            .map(|((k, unshared), ((&matmul_tiling, &cooperative_matmul), &subgroup_matmul))| {
                let window_writes = writes_over_operands(graph, k, plan);
                let strategy =
                    Strategy { matmul_tiling, cooperative_matmul, subgroup_matmul, window_writes, ..strategy };
                lower_planned(graph, k, unshared, lower_opts, &strategy)
            })
            .collect()
    };
    let mut sources = lower_all(&lower_opts);
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
    (sources, workspace_plan)
}

/// Whether `k` has a dynamic update slice among its outputs and `plan` writes each over its
/// operand (a parameter updated in place, or an arena value whose bytes it takes over): the
/// kernel may then write their windows alone ([`Strategy::window_writes`]).
fn writes_over_operands(graph: &Graph, k: &fusegraph_passes::Kernel, plan: &MemoryPlan) -> bool {
    let mut updates = k.outputs.iter().filter(|o| matches!(graph.node(**o).op, Op::DynamicUpdateSlice { .. }));
    updates.clone().next().is_some()
        && updates.all(|o| {
            let operand = graph.operands(*o)[0];
            plan.updated_in_place.get(o) == Some(&operand) || plan.in_place.get(o) == Some(&operand)
        })
}

/// Fails with [`RuntimeError::ResourceExhausted`], naming the largest live values, where the
/// plan needs more than `limit` bytes ([`held_bytes`]); the error counts the `counted` store
/// bytes the limit covers.
fn check_memory_limit(front: &Front, opts: &CompileOptions, limit: Option<u64>, counted: u64) -> Result<()> {
    let (graph, s) = (&front.graph, front.summary());
    let needed = held_bytes(s);
    match limit {
        Some(limit) if needed > limit => Err(RuntimeError::ResourceExhausted {
            graph: opts.name.clone().unwrap_or_else(|| format!("a graph of {} nodes", graph.len())),
            needed: needed + counted,
            persistent: s.persistent_bytes + counted,
            arena: s.arena_bytes,
            staging: s.staging_bytes,
            limit: limit + counted,
            lower_bound: s.lower_bound_bytes,
            largest: s
                .peak_values
                .iter()
                .map(|v| (format!("{v_node} {} {}", v.op, graph.ty(v.node), v_node = v.node), v.bytes))
                .collect(),
        }),
        _ => Ok(()),
    }
}
