//! Compilation of a graph into an [`Executable`]: `Device::compile` and `Device::plan`.

use crate::pool::{buffer_bytes, texel_bytes, Kind};
use crate::{Device, ParamStore, Result, RuntimeError};
use fusegraph_ir::{verify, Graph, HostTensor, NodeId, Op, TensorType};
use fusegraph_passes::kernel::unshared_members;
use fusegraph_passes::rewrite::{rewrite, Rewrites};
use fusegraph_passes::split_k::Gemm;
use fusegraph_passes::{
    plan_combined_within, plan_summary_within, plan_within, FusionMode, Joined, Location, MemoryPlan, PlanOptions,
    PlanSummary, Planned, Region,
};
use fusegraph_wgsl::{
    cooperative_matmul, gemm_shape, lower_planned, subgroup_matmul, KernelSource, LowerOptions, MatmulTiling, Strategy,
    TEXTURE_ROW,
};
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::executable::*;
use crate::options::*;
use crate::Executable;

/// The bytes kernel `k` moves through its binding of `node` (`size` bytes): all of them,
/// except for an input whose every use in the kernel is a slice, which reads the slices'
/// elements only (at most the whole binding).
pub(crate) fn binding_bytes(g: &Graph, k: &fusegraph_passes::Kernel, node: NodeId, size: u64) -> u64 {
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
pub(crate) fn planned_updates(opts: &CompileOptions, first: usize) -> Vec<(String, usize)> {
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
        let (limit, _) = self.limit_for(opts, 0);
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

    /// The rewrites `compile` and `plan` make before fusion ([`fusegraph_passes::rewrite`]):
    /// simplification (with `opts.simplify`), split-k ([`CompileOptions::split_k`]) and split
    /// reductions ([`CompileOptions::split_reductions`], with fusion on), each split kept only
    /// where its plan fits `limit` as it is (without rematerialization or fused attention).
    fn rewrite(
        self: &Arc<Self>,
        graph: &mut Graph,
        outputs: &mut Vec<NodeId>,
        opts: &CompileOptions,
        popts: &PlanOptions,
        limit: Option<u64>,
    ) -> Result<()> {
        let popts = PlanOptions { simplify: false, ..popts.clone() };
        let fits = |g: &Graph, outs: &[NodeId]| {
            limit.is_none_or(|l| plan_within(g, outs, &popts, None).is_ok_and(|p| p.summary.total_bytes <= l))
        };
        let splits = |gemm: &Gemm| opts.split_k.splits(self, gemm);
        let rewrites = Rewrites {
            simplify: opts.simplify,
            split_k: (opts.split_k != SplitK::Off).then_some(&splits as &dyn Fn(&Gemm) -> usize),
            split_reductions: opts
                .split_reductions
                .fill(self.forms_for(opts).rows)
                .filter(|_| opts.fusion == FusionMode::On),
        };
        Ok(rewrite(graph, outputs, &rewrites, &fits)?)
    }

    /// The largest batch in `1..=max_batch` whose plan fits `limit` bytes on this device,
    /// asking the planner only (no allocation, no dispatch); `None` if batch 1 does not fit.
    pub fn largest_batch<E: std::fmt::Display>(
        self: &Arc<Self>,
        build: impl Fn(usize) -> std::result::Result<(Graph, Vec<NodeId>), E>,
        limit: u64,
        opts: &CompileOptions,
        max_batch: usize,
    ) -> Result<Option<usize>> {
        // A model's own error (a layer's, say) reaches the planner as the op that failed.
        let build = |n: usize| {
            build(n).map_err(|e| fusegraph_ir::IrError::Type {
                op: "largest_batch".into(),
                detail: format!("recording batch {n}: {e}"),
            })
        };
        Ok(fusegraph_passes::largest_batch(build, limit, &self.plan_options(opts), max_batch)?)
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
        let subgroup: Vec<bool> = kernels
            .iter()
            .zip(&coop_able)
            .map(|(k, &able)| {
                let applies = !able
                    && strategy.tiled_matmul
                    && strategy.subgroup_matmul
                    && subgroup_matmul(graph, k, lower_opts).is_some();
                applies
                    && match opts.subgroup_matmul {
                        Some(forced) => forced,
                        // `gpu_kernels` asks for a GPU's default forms, unmeasured.
                        None if self.gpu_kernels => false,
                        None => gemm_shape(graph, k, lower_opts)
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
            .zip(subgroup.iter().zip(&coop_able))
            .map(|(k, (&subgroup, &able))| {
                let (shape, dtype) = gemm_shape(graph, k, lower_opts).filter(|_| strategy.tiled_matmul)?;
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
    /// (see [`ParamStore::compile`]).
    pub(crate) fn compile_with(
        self: &Arc<Self>,
        graph: &Graph,
        outputs: &[NodeId],
        opts: &CompileOptions,
        store: Option<&ParamStore>,
    ) -> Result<Executable> {
        let start = std::time::Instant::now();
        verify(graph)?;
        for &o in outputs {
            graph.check(o)?;
        }
        let (declared_inputs, declared_params) = declared(graph, opts)?;
        let user_output_nodes = outputs.to_vec();
        if let Some(store) = store {
            check_store(store, &declared_params)?;
        }
        // Update values are outputs of the plan (kept alive to the end) but not returned.
        let user_outputs = outputs.len();
        let mut outs_vec = outputs.to_vec();
        outs_vec.extend(opts.updates.iter().map(|(_, n)| *n));
        let mut simplified = graph.clone();
        if opts.mixed_precision {
            // A store's parameters stay f32 (other executables read them): cast where used.
            let masters = match store {
                Some(_) => declared_params.keys().cloned().collect(),
                None => opts.masters(),
            };
            (simplified, outs_vec) = opts.mixed_with(graph, &outs_vec, &masters)?;
        }
        let limits = self.limits();
        let mut popts = self.plan_options(opts);
        popts.external_parameters = store.is_some();
        // Bytes of the store's parameters this executable binds.
        let bound: u64 = match store {
            Some(_) => declared_params.values().map(|t| t.buffer_bytes() as u64).sum(),
            None => 0,
        };
        let (limit, counted) = self.limit_for(opts, bound);
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
        check_memory_limit(graph, outputs, &update_nodes, &mut planned, opts, limit, counted)?;
        let (kernels, plan, prepared) = (planned.kernels, planned.plan, planned.prepared);
        let lower_opts = self.lower_options(opts);
        let (tilings, subgroup, coop) = self.matmul_forms(graph, &kernels, opts, &lower_opts);
        let mut staging_bytes = 0;
        for &o in outputs {
            staging_bytes += plan.locations[&o].size;
        }
        let held: u64 = [plan.arena_bytes, plan.persistent_bytes, staging_bytes].map(buffer_bytes).iter().sum();
        let forms = KernelForms { kernels: &kernels, tilings: &tilings, subgroup: &subgroup, coop: &coop };
        let (sources, workspace_plan) = lower_kernels(graph, &forms, opts, lower_opts, &plan, held, limit);
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
        self.check_adapter_limits(graph, &sources, &plan)?;
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
        // The store's buffer of each parameter in the External region.
        let externals: Vec<wgpu::Buffer> = match store {
            Some(store) => plan.external.iter().map(|name| store_buffer(store, name)).collect::<Result<_>>()?,
            None => Vec::new(),
        };
        let region_buffer = |r: Region| match r {
            Region::Persistent => persistent,
            Region::Arena => arena,
            Region::External(i) => &externals[i as usize],
        };

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
                        // A store's parameter always holds a value.
                        let in_store = matches!(slot.loc.region, Region::External(_));
                        params.insert(name.clone(), (slot, in_store));
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
        for ((k, src), &matmul_tiling) in kernels.iter().zip(&sources).zip(&tilings) {
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
                                buffer: region_buffer(loc.region),
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
                form: src.form,
                matmul_tiling,
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
            store_bytes: bound,
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
            output_nodes: user_output_nodes,
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
            seen: std::sync::atomic::AtomicU64::new(store.map_or(0, |s| s.generation())),
            store: store.cloned(),
            externals,
        })
    }
}

/// The inputs and parameters of `graph` as the user wrote it, by name (each may be fed or
/// set even where simplification finds the outputs do not need it); checks that every one of
/// `opts.updates` names a declared parameter of its type.
#[allow(clippy::type_complexity)]
fn declared(
    graph: &Graph,
    opts: &CompileOptions,
) -> Result<(BTreeMap<String, TensorType>, BTreeMap<String, TensorType>)> {
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

/// The store's buffer of parameter `name` (checked present by [`check_store`]).
fn store_buffer(store: &ParamStore, name: &str) -> Result<wgpu::Buffer> {
    store.buffer(name).ok_or_else(|| RuntimeError::UnknownParameter { name: name.into() })
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
    let strategy = Strategy::default();
    let unshared = if opts.excess_precision { unshared_members(kernels) } else { vec![Vec::new(); kernels.len()] };
    let lower_all = |lower_opts: &LowerOptions| -> Vec<KernelSource> {
        kernels
            .iter()
            .zip(&unshared)
            .zip(tilings.iter().zip(coop).zip(subgroup))
            .map(|((k, unshared), ((&matmul_tiling, &cooperative_matmul), &subgroup_matmul))| {
                let strategy = Strategy { matmul_tiling, cooperative_matmul, subgroup_matmul, ..strategy };
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

/// Takes the update values (which stay on the device) out of the plan's staging bytes, then
/// fails with [`RuntimeError::ResourceExhausted`], naming the largest live values, where the
/// plan needs more than `limit` bytes.
fn check_memory_limit(
    graph: &Graph,
    outputs: &[NodeId],
    update_nodes: &[NodeId],
    planned: &mut Planned,
    opts: &CompileOptions,
    limit: Option<u64>,
    counted: u64,
) -> Result<()> {
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
            // Reported with the store parameters the limit counts (`counted`).
            return Err(RuntimeError::ResourceExhausted {
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
            });
        }
    }
    Ok(())
}
