//! The last stages of a compile: the plan's buffers allocated from the pool, every input,
//! parameter, output and update given its slot, constants written, and each lowered kernel
//! made a pipeline with its bind group.

use crate::compile::{binding_bytes, bound_bytes, Declared, Lowered};
use crate::executable::{CompiledKernel, ExecutableStats, KernelStats, Slot, TextureCopy};
use crate::memory::{Allocation, TextureAllocation};
use crate::pool::{texel_bytes, Kind};
use crate::{CompileOptions, Device, Executable, ParamStore, Result, RuntimeError};
use fusegraph_ir::{Graph, HostTensor, NodeId, Op};
use fusegraph_passes::{Front, Joined, Location, MemoryPlan, Region};
use fusegraph_wgsl::TEXTURE_ROW;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The buffers and textures of one executable.
struct Buffers {
    arena: Allocation,
    persistent: Allocation,
    staging: Allocation,
    workspace: Vec<TextureAllocation>,
    /// The store's buffer of each parameter in the `External` region.
    externals: Vec<wgpu::Buffer>,
}

impl Buffers {
    fn region(&self, r: Region) -> &wgpu::Buffer {
        match r {
            Region::Persistent => self.persistent.buffer(),
            Region::Arena => self.arena.buffer(),
            Region::External(i) => &self.externals[i as usize],
        }
    }
}

/// Every named value's slot: inputs by name, parameters by name (with whether a store holds
/// its value).
type Slots = (BTreeMap<String, Slot>, BTreeMap<String, (Slot, bool)>);

impl Device {
    /// Allocates, binds and assembles the executable of `front` as `lowered`, for the
    /// caller's `outputs` of the graph it gave (as `declared`), with `store`'s buffers for
    /// the parameters where one is given.
    pub(crate) fn bind(
        self: &Arc<Self>,
        outputs: &[NodeId],
        front: Front,
        lowered: Lowered,
        opts: &CompileOptions,
        store: Option<&ParamStore>,
        declared: Declared,
    ) -> Result<Executable> {
        let buffers = self.allocate_buffers(&front.planned.plan, &lowered, store)?;
        let stacked: BTreeMap<String, Joined> = front
            .combined
            .iter()
            .flat_map(|c| std::iter::once(c.weights.clone()).chain(c.biases.clone()))
            .map(|j| (j.name.clone(), j))
            .collect();
        let (graph, plan) = (&front.graph, &front.planned.plan);
        let (inputs, params) = self.slots(graph, plan, &stacked, buffers.persistent.buffer())?;
        let mut outs = Vec::new();
        let mut staging_offset = 0;
        for &o in &front.outputs {
            let loc = plan.locations[&o];
            outs.push((Slot { ty: graph.ty(o).clone(), loc }, staging_offset));
            staging_offset += loc.size;
        }
        let mut updates = Vec::new();
        for ((name, _), node) in opts.updates.iter().zip(&front.updates) {
            let from = plan.locations[node];
            let to = params
                .get(name)
                .map(|(slot, _)| slot.loc)
                .ok_or_else(|| RuntimeError::UnusedUpdate { name: name.clone() })?;
            if from != to {
                updates.push((from, to));
            }
        }
        let (kernels, kstats) = self.create_kernels(&front, &lowered, &buffers)?;
        let stats = stats(&front, &lowered, kstats, &buffers, store.map_or(0, |_| bound_bytes(&declared)));
        tracing::debug!(
            target: "fusegraph::plan",
            graph = opts.name.as_deref().unwrap_or("-"),
            arena_bytes = plan.arena_bytes,
            persistent_bytes = plan.persistent_bytes,
            staging_bytes = lowered.staging_bytes,
            lower_bound_bytes = plan.lower_bound_bytes,
            "memory plan"
        );
        let Buffers { arena, persistent, staging, workspace, externals } = buffers;
        let prepared = front.planned.prepared;
        Ok(Executable {
            device: self.clone(),
            kernels,
            inputs,
            params,
            declared_inputs: declared.0,
            declared_params: declared.1,
            outputs: outs,
            output_nodes: outputs.to_vec(),
            updates,
            arena,
            persistent,
            staging: std::sync::Mutex::new(vec![staging]),
            feed_buffer: std::sync::Mutex::new(None),
            runs: std::sync::atomic::AtomicU64::new(0),
            workspace,
            stats,
            plan: front.planned.plan,
            graph: front.graph,
            running: std::sync::Mutex::new(()),
            host_ns: std::sync::atomic::AtomicU64::new(0),
            prepared,
            stale: std::sync::atomic::AtomicBool::new(true),
            seen: std::sync::atomic::AtomicU64::new(store.map_or(0, |s| s.generation())),
            store: store.cloned(),
            externals,
        })
    }

    /// The plan's arena, persistent region and staging buffer from the pool, the workspace
    /// textures, and the store's buffers of the external parameters. A reused buffer may be
    /// a little larger than planned, within the limit in force.
    fn allocate_buffers(
        self: &Arc<Self>,
        plan: &MemoryPlan,
        lowered: &Lowered,
        store: Option<&ParamStore>,
    ) -> Result<Buffers> {
        let mut slack = lowered.limit.map_or(u64::MAX, |l| l.saturating_sub(lowered.held + lowered.workspace.bytes()));
        let arena = self.allocate(Kind::Storage, plan.arena_bytes, &mut slack, "the arena")?;
        let persistent = self.allocate(Kind::Storage, plan.persistent_bytes, &mut slack, "the persistent region")?;
        let staging = self.allocate(Kind::Staging, lowered.staging_bytes, &mut slack, "the staging buffer")?;
        let workspace = lowered
            .workspace
            .textures
            .iter()
            .map(|&(_, format, rows)| self.allocate_texture(format, TEXTURE_ROW, rows, "a matmul operand texture"))
            .collect::<Result<Vec<_>>>()?;
        let externals = match store {
            Some(store) => plan.external.iter().map(|name| store_buffer(store, name)).collect::<Result<_>>()?,
            None => Vec::new(),
        };
        Ok(Buffers { arena, persistent, staging, workspace, externals })
    }

    /// Each input's and parameter's slot (a stacked parameter's parts each where it lies in
    /// the stack), and each constant written into the `persistent` buffer.
    fn slots(
        &self,
        graph: &Graph,
        plan: &MemoryPlan,
        stacked: &BTreeMap<String, Joined>,
        persistent: &wgpu::Buffer,
    ) -> Result<Slots> {
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
        Ok((inputs, params))
    }

    /// Each lowered kernel's pipeline (from the cache where its WGSL was seen), bind group,
    /// workgroup grid and texture copies, and its statistics.
    fn create_kernels(
        self: &Arc<Self>,
        front: &Front,
        lowered: &Lowered,
        buffers: &Buffers,
    ) -> Result<(Vec<CompiledKernel>, Vec<KernelStats>)> {
        let (graph, plan) = (&front.graph, &front.planned.plan);
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut compiled = Vec::new();
        let mut kstats = Vec::new();
        for ((k, src), &matmul_tiling) in front.planned.kernels.iter().zip(&lowered.sources).zip(&lowered.tilings) {
            let pipeline = self.pipeline(&src.wgsl, &src.bindings, &src.label)?;
            let uses = &lowered.workspace.uses[compiled.len()];
            let entries: Vec<wgpu::BindGroupEntry> = src
                .bindings
                .iter()
                .enumerate()
                .map(|(b, binding)| {
                    let resource = match uses.iter().find(|u| u.0 == b) {
                        Some(&(_, t, _)) => wgpu::BindingResource::TextureView(&buffers.workspace[t].view),
                        None => {
                            let loc = plan.locations[&binding.node];
                            wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                buffer: buffers.region(loc.region),
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
                    texel_bytes: texel_bytes(lowered.workspace.textures[t].1),
                    texture: t,
                })
                .collect();
            let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&src.label),
                layout: &pipeline.1,
                entries: &entries,
            });
            let workgroups = self.grid(&src.label, src.workgroups)?;
            let bytes_moved = src
                .bindings
                .iter()
                .map(|b| binding_bytes(graph, k, b.node, plan.locations[&b.node].size, src.windows))
                .sum();
            kstats.push(KernelStats {
                label: src.label.clone(),
                members: k.members.clone(),
                bytes_moved,
                workgroups,
                form: src.form,
                matmul_tiling,
                windows: src.windows,
            });
            compiled.push(CompiledKernel { pipeline, bind_group, workgroups, copies });
        }
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(RuntimeError::Wgpu { during: "creating bind groups".into(), detail: e.to_string() });
        }
        Ok((compiled, kstats))
    }

    /// `groups` workgroups folded into an `x × y` grid within the adapter's limit per
    /// dimension.
    fn grid(&self, label: &str, groups: u64) -> Result<[u32; 3]> {
        let max_dim = self.limits().max_compute_workgroups_per_dimension as u64;
        let x = groups.min(max_dim);
        let y = if x == 0 { 0 } else { groups.div_ceil(x) };
        if y > max_dim {
            return Err(RuntimeError::TooLarge {
                what: format!("kernel `{label}` workgroups"),
                bytes: groups,
                limit: max_dim * max_dim,
            });
        }
        Ok([x as u32, y as u32, 1])
    }
}

/// The executable's statistics: its kernels, the plan's bytes and what it holds.
fn stats(
    front: &Front,
    lowered: &Lowered,
    kernels: Vec<KernelStats>,
    b: &Buffers,
    store_bytes: u64,
) -> ExecutableStats {
    let plan = &front.planned.plan;
    let workspace_bytes: u64 = b.workspace.iter().map(|t| t.size).sum();
    let pipelines = lowered.sources.iter().map(|s| s.wgsl.as_str()).collect::<std::collections::BTreeSet<_>>().len();
    ExecutableStats {
        pipelines,
        bytes_moved: kernels.iter().map(|k| k.bytes_moved).sum(),
        kernels,
        arena_bytes: plan.arena_bytes,
        persistent_bytes: plan.persistent_bytes,
        staging_bytes: lowered.staging_bytes,
        lower_bound_bytes: plan.lower_bound_bytes,
        naive_bytes: plan.naive_bytes,
        workspace_bytes,
        prepared_kernels: front.planned.prepared,
        combined_products: (front.combined.iter().map(|c| c.products.len()).sum(), front.combined.len()),
        store_bytes,
        device_bytes: b.arena.size + b.persistent.size + b.staging.size + workspace_bytes,
    }
}

/// The store's buffer of parameter `name` (checked present by the compile's store check).
fn store_buffer(store: &ParamStore, name: &str) -> Result<wgpu::Buffer> {
    store.buffer(name).ok_or_else(|| RuntimeError::UnknownParameter { name: name.into() })
}
