//! An [`crate::Executable`]: a compiled graph on the device, and its runs.

use crate::memory::{buffer, Allocation, TextureAllocation};
use crate::pool::texel_bytes;
use crate::{Device, Result, RuntimeError};
use fusegraph_ir::{Graph, HostTensor, NodeId, TensorType};
use fusegraph_passes::{Location, MemoryPlan, Region};
use fusegraph_wgsl::{KernelForm, KernelSource, MatmulTiling, TEXTURE_ROW};
use std::collections::BTreeMap;
use std::sync::Arc;

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
    /// How the kernel was lowered: its family (loop, row, tiled or subgroup matmul,
    /// attention) and the choices within it.
    pub form: fusegraph_wgsl::KernelForm,
    /// The tiling of a tiled matmul kernel, plain or on cooperative matrices (forced,
    /// autotuned or the default for its shape); `None` for every other kernel.
    pub matmul_tiling: Option<MatmulTiling>,
    /// Its dynamic update slices write their windows alone: a window kernel's, or the side
    /// windows of another form (a decode step's cache writes in the kernel reading the cache).
    pub windows: bool,
}

impl KernelStats {
    /// A matmul kernel lowered by the subgroup matmul (adapters with a fixed subgroup size;
    /// see `fusegraph_wgsl::subgroup_matmul`) rather than the workgroup-tiled one.
    pub fn subgroup_matmul(&self) -> bool {
        matches!(self.form, KernelForm::SubgroupMatmul { .. })
    }

    /// Operands the kernel reads from workspace textures, copied there before it runs (the
    /// subgroup matmul where it reads textures; see [`crate::DeviceOptions::texture_operands`]).
    pub fn texture_operands(&self) -> usize {
        match self.form {
            KernelForm::SubgroupMatmul { textures, .. } => textures,
            _ => 0,
        }
    }

    /// A matmul kernel on cooperative matrices (see [`crate::Device::cooperative_matrix`] and
    /// `fusegraph_wgsl::CoopPlan`) rather than the plain workgroup-tiled one.
    pub fn cooperative_matmul(&self) -> bool {
        matches!(self.form, KernelForm::TiledMatmul { coop: Some(_), .. })
    }

    /// A memory-efficient attention kernel (`softmax(x)·v` with the online softmax; see
    /// [`crate::CompileOptions::fused_attention`]).
    pub fn attention(&self) -> bool {
        matches!(self.form, KernelForm::Attention { .. })
    }
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
    /// Bytes of the textures the subgroup matmul reads its operands from (see
    /// [`crate::DeviceOptions::texture_operands`]): one per operand position and format,
    /// shared by every kernel, sized to the largest. 0 where no kernel reads a texture.
    pub workspace_bytes: u64,
    /// How many of `kernels` (the first ones) compute from parameters and constants alone
    /// and run only on the first run after a parameter is set
    /// ([`crate::CompileOptions::hoist_parameters`]); a run dispatches the others.
    pub prepared_kernels: usize,
    /// Matrix products that run combined with others of the same operand
    /// ([`crate::CompileOptions::combine_products`]), and the batched products they became:
    /// `(products, combined)`; `(0, 0)` where none combined.
    pub combined_products: (usize, usize),
    /// Bytes of the parameter store's parameters the executable binds
    /// ([`crate::ParamStore::compile`]; 0 without a store). The store holds them, once
    /// however many executables bind them; they are not part of `device_bytes`.
    pub store_bytes: u64,
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
    pub(crate) copies: Vec<TextureCopy>,
}

/// A value's bytes copied into a workspace texture, [`TEXTURE_ROW`] texels per row.
pub(crate) struct TextureCopy {
    pub(crate) loc: Location,
    pub(crate) texels: u64,
    pub(crate) texel_bytes: u64,
    pub(crate) texture: usize,
}

/// Where each kernel's texture operands go: workspace textures, one per operand position
/// and format, each as tall as its largest use needs.
pub(crate) struct WorkspacePlan {
    /// (operand position, format, rows) of each texture.
    pub(crate) textures: Vec<(usize, wgpu::TextureFormat, u32)>,
    /// Per kernel, per texture binding: (binding index, texture index, texels).
    pub(crate) uses: Vec<Vec<(usize, usize, u64)>>,
}

impl WorkspacePlan {
    pub(crate) fn of(graph: &Graph, sources: &[KernelSource]) -> WorkspacePlan {
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

    pub(crate) fn bytes(&self) -> u64 {
        self.textures.iter().map(|&(_, f, rows)| rows as u64 * TEXTURE_ROW as u64 * texel_bytes(f)).sum()
    }
}

pub(crate) struct Slot {
    pub(crate) ty: TensorType,
    pub(crate) loc: Location,
}

/// A compiled graph: kernels, pipelines, bind groups and buffers, ready to run many times.
pub struct Executable {
    pub(crate) device: Arc<Device>,
    pub(crate) kernels: Vec<CompiledKernel>,
    pub(crate) inputs: BTreeMap<String, Slot>,
    pub(crate) params: BTreeMap<String, (Slot, bool)>,
    pub(crate) declared_inputs: BTreeMap<String, TensorType>,
    pub(crate) declared_params: BTreeMap<String, TensorType>,
    pub(crate) outputs: Vec<(Slot, u64)>,
    /// The outputs' nodes in the graph given to `compile`.
    pub(crate) output_nodes: Vec<NodeId>,
    /// Copies from an update value to its parameter after every run.
    pub(crate) updates: Vec<(Location, Location)>,
    pub(crate) arena: Allocation,
    pub(crate) persistent: Allocation,
    /// Free staging buffers: one per run in flight (`submit.rs`), the first
    /// allocated with the executable.
    pub(crate) staging: std::sync::Mutex<Vec<Allocation>>,
    /// Where a run's feeds wait while a chained feed leaves this executable's own arena
    /// (see `submit.rs`), once needed: each input's bytes at its place in input order.
    pub(crate) feed_buffer: std::sync::Mutex<Option<Allocation>>,
    /// Runs submitted so far.
    pub(crate) runs: std::sync::atomic::AtomicU64,
    /// Textures the subgroup matmul reads its operands from (see [`WorkspacePlan`]).
    pub(crate) workspace: Vec<TextureAllocation>,
    pub(crate) stats: ExecutableStats,
    pub(crate) plan: MemoryPlan,
    pub(crate) graph: Graph,
    /// Held by each run (and timing, profiling) from writing the feeds to reading the
    /// outputs, and by each submit from writing the feeds to submitting: runs share the
    /// arena, so runs of one executable from several threads take turns.
    pub(crate) running: std::sync::Mutex<()>,
    /// The last run's host time in ns (see [`Executable::last_run_host_ms`]).
    pub(crate) host_ns: std::sync::atomic::AtomicU64,
    /// The leading kernels that compute from parameters and constants alone
    /// ([`crate::CompileOptions::hoist_parameters`]).
    pub(crate) prepared: usize,
    /// Whether those must run again: at first, and after a parameter is set.
    pub(crate) stale: std::sync::atomic::AtomicBool,
    /// The store generation the hoisted kernels' values were computed at.
    pub(crate) seen: std::sync::atomic::AtomicU64,
    /// The parameter store whose buffers the kernels bind, if compiled against one.
    pub(crate) store: Option<crate::ParamStore>,
    /// The store's buffer of each `Region::External(i)`.
    pub(crate) externals: Vec<wgpu::Buffer>,
}

/// Unmaps a buffer when dropped.
pub(crate) struct Unmap<'a>(pub(crate) &'a wgpu::Buffer);

impl Drop for Unmap<'_> {
    fn drop(&mut self) {
        self.0.unmap();
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
    /// that compute from parameters alone ([`crate::CompileOptions::hoist_parameters`]) run again on
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
        if let Some(store) = &self.store {
            return store.insert(name, value);
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

    pub(crate) fn region(&self, r: Region) -> &wgpu::Buffer {
        match r {
            Region::Persistent => self.persistent.buffer(),
            Region::Arena => self.arena.buffer(),
            Region::External(i) => &self.externals[i as usize],
        }
    }

    /// The parameter store the executable is bound to, if any ([`crate::ParamStore::compile`]).
    pub fn store(&self) -> Option<&crate::ParamStore> {
        self.store.as_ref()
    }

    /// Records the parameter updates: copies after every kernel has run.
    pub(crate) fn encode_updates(&self, encoder: &mut wgpu::CommandEncoder) {
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
        if let Some(store) = &self.store {
            return store.get(name);
        }
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
    /// calls [`crate::Executable::prepared_done`].
    pub(crate) fn encode(&self, encoder: &mut wgpu::CommandEncoder, timestamps: Option<&wgpu::QuerySet>) {
        self.encode_kernels(encoder, self.first_kernel()..self.kernels.len(), timestamps.map(|q| (q, 0)));
    }

    /// The first kernel a run dispatches: past the hoisted ones unless they are stale.
    pub(crate) fn first_kernel(&self) -> usize {
        use std::sync::atomic::Ordering;
        let changed = self.store.as_ref().is_some_and(|s| s.generation() != self.seen.load(Ordering::Acquire));
        if self.stale.load(Ordering::Acquire) || changed {
            0
        } else {
            self.prepared
        }
    }

    /// The store generation before a run is encoded (0 without a store), for
    /// [`Executable::prepared_done`].
    pub(crate) fn generation(&self) -> u64 {
        self.store.as_ref().map_or(0, |s| s.generation())
    }

    /// Marks the hoisted kernels' values current, after a submit that ran them (encoded at
    /// store generation `before`). A run that updated the store's parameters records the
    /// write; its own hoisted values read no updated parameter, so they stay current unless
    /// another write came in between.
    pub(crate) fn prepared_done(&self, before: u64) {
        use std::sync::atomic::Ordering;
        self.stale.store(false, Ordering::Release);
        let Some(store) = &self.store else { return };
        let mut seen = before;
        if !self.updates.is_empty() || !self.plan.updated_in_place.is_empty() {
            let now = store.bump();
            if now == before + 1 {
                seen = now;
            }
        }
        self.seen.store(seen, Ordering::Release);
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
        self.time_with(feeds, warmup, runs, 1)
    }

    /// [`Executable::time`] with `per_sample` executions back to back in each submission (at
    /// least one): each of the `samples` times is the submission's (the first kernel's start
    /// to the last's end with GPU timestamps) over `per_sample`. A kernel's speed in a
    /// stream of work, as a model's step runs it: on an H100 a copy timed alone after a wait
    /// took 0.514 ms and 0.218 ms among 20 back to back (`benchmarks/h100/notes.md`).
    pub fn time_back_to_back(
        &self,
        feeds: &[(&str, &HostTensor)],
        warmup: usize,
        samples: usize,
        per_sample: usize,
    ) -> Result<Timing> {
        self.time_with(feeds, warmup, samples, per_sample.max(1))
    }

    fn time_with(
        &self,
        feeds: &[(&str, &HostTensor)],
        warmup: usize,
        runs: usize,
        per_sample: usize,
    ) -> Result<Timing> {
        let _running = self.take_turn();
        self.run_in_turn(feeds)?;
        let d = &self.device;
        // Execution `j` of a submission writes timestamps `2j` (start) and `2j + 1` (end).
        let count = 2 * per_sample as u32;
        let bytes = 8 * count as u64;
        let ts = d.has_timestamps().then(|| {
            let set = d.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("fusegraph timing"),
                ty: wgpu::QueryType::Timestamp,
                count,
            });
            let resolve = buffer(
                d,
                "fusegraph timestamps",
                bytes,
                wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            );
            let read = buffer(
                d,
                "fusegraph timestamps readback",
                bytes,
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
            let before = self.generation();
            for j in 0..per_sample as u32 {
                let range = self.first_kernel()..self.kernels.len();
                self.encode_kernels(&mut encoder, range, ts.as_ref().map(|t| (&t.0, 2 * j)));
                self.encode_updates(&mut encoder);
            }
            if let Some((set, resolve, read)) = &ts {
                encoder.resolve_query_set(set, 0..count, resolve, 0);
                encoder.copy_buffer_to_buffer(resolve, 0, read, 0, bytes);
            }
            let start = std::time::Instant::now();
            d.queue.submit([encoder.finish()]);
            self.prepared_done(before);
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
                        let tick = |k: u32| {
                            let at = 8 * k as usize;
                            u64::from_le_bytes(view[at..at + 8].try_into().expect("8 bytes"))
                        };
                        tick(count - 1).saturating_sub(tick(0)) as f64 * d.queue.get_timestamp_period() as f64 / 1e6
                    };
                    read.unmap();
                    t
                }
                None => wall,
            };
            if i >= warmup {
                ms.push(value / per_sample as f64);
            }
        }
        Ok(Timing { ms, gpu_timestamps: ts.is_some() })
    }

    /// Runs once with `feeds` (one per input, by name) and returns the outputs in the order
    /// they were given to `compile`. All kernels go in one command buffer and one submit.
    /// Errors (missing, unknown or mis-typed feeds, unset parameters) come before anything is
    /// written or dispatched.
    ///
    /// Feeds are named by input name (`("x", &xv)`) or by the input's tensor handle
    /// (`(&x, &xv)`); the outputs are also found by handle ([`crate::Outputs::value`]).
    pub fn run<K: crate::FeedName>(&self, feeds: &[(K, &HostTensor)]) -> Result<crate::Outputs> {
        let names = feeds.iter().map(|(k, _)| k.feed_name()).collect::<Result<Vec<_>>>()?;
        let feeds: Vec<(&str, &HostTensor)> = names.iter().map(|n| n.as_ref()).zip(feeds.iter().map(|f| f.1)).collect();
        let _running = self.take_turn();
        Ok(crate::Outputs::new(self.run_in_turn(&feeds)?, self.output_nodes.clone()))
    }

    /// Waits until no other thread runs this executable; runs hold the guard throughout.
    pub(crate) fn take_turn(&self) -> std::sync::MutexGuard<'_, ()> {
        self.running.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The host's share of the last [`Executable::run`], in ms: checking and writing the
    /// feeds, encoding every kernel's dispatch and submitting them, then reading the outputs
    /// once the device is done — the run's wall time less its wait for the device. A decode
    /// step of small kernels can be bound by this rather than by the device. 0 before the
    /// first run.
    pub fn last_run_host_ms(&self) -> f64 {
        self.host_ns.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e6
    }
}
