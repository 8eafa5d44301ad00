//! Adapter choice and the device: Vulkan, Metal or DX12 first, GL (llvmpipe through EGL) as
//! the fallback; `FUSEGRAPH_BACKEND` overrides. Holds the pipeline cache.

use crate::{Cooperative, KernelForms, Result, RuntimeError};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

/// A wgpu backend fusegraph can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Vulkan (NVIDIA, AMD, Intel, lavapipe).
    Vulkan,
    /// OpenGL / GLES (llvmpipe through EGL on a bare Linux machine).
    Gl,
    /// Metal (macOS).
    Metal,
    /// Direct3D 12 (Windows).
    Dx12,
}

impl FromStr for Backend {
    type Err = RuntimeError;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "vulkan" | "vk" => Ok(Backend::Vulkan),
            "gl" | "gles" | "opengl" => Ok(Backend::Gl),
            "metal" => Ok(Backend::Metal),
            "dx12" | "d3d12" => Ok(Backend::Dx12),
            _ => Err(RuntimeError::UnknownBackend { name: s.to_string() }),
        }
    }
}

impl Backend {
    fn wgpu(self) -> wgpu::Backends {
        match self {
            Backend::Vulkan => wgpu::Backends::VULKAN,
            Backend::Gl => wgpu::Backends::GL,
            Backend::Metal => wgpu::Backends::METAL,
            Backend::Dx12 => wgpu::Backends::DX12,
        }
    }
}

/// How to choose and configure the device.
#[derive(Clone, Debug, Default)]
pub struct DeviceOptions {
    /// Force a backend; `None` takes `FUSEGRAPH_BACKEND` ([`crate::env`]), else tries
    /// Vulkan/Metal/DX12, then GL.
    pub backend: Option<Backend>,
    /// Force f16 storage: `Some(true)` native WGSL `f16` (needs `SHADER_F16`), `Some(false)`
    /// packed in u32; `None` uses native where the adapter has it.
    pub f16_native: Option<bool>,
    /// A hard cap on the device memory fusegraph allocates (parameters, arenas, staging of
    /// every executable, plus cached buffers), like TensorFlow's `memory_limit`. `None` is
    /// growth mode: allocate on demand.
    pub memory_limit: Option<u64>,
    /// Time the tiled matmul's candidate tilings per shape class and keep the fastest
    /// (cached on disk per adapter and driver). `None` takes `FUSEGRAPH_AUTOTUNE`; unset, it is on except on a CPU
    /// adapter through GL (llvmpipe), where compiling each candidate takes 7–31 s (against
    /// 0.3–4.5 s through Vulkan), minutes per shape class. Off, every kernel takes the
    /// default tiling for its shape, for reproducible runs. Turned off explicitly (here or by
    /// `FUSEGRAPH_AUTOTUNE=off`), nothing is measured: fusion uses the device-free cost model
    /// too.
    pub autotune: Option<bool>,
    /// Run f16 matmuls and convolutions on cooperative matrices (tensor cores) where the
    /// adapter has them (see [`Device::cooperative_matrix`]); `None` is on. `Some(false)`
    /// keeps the plain tiled kernel, for comparisons.
    pub cooperative_matrix: Option<bool>,
    /// For tests: run the cooperative-matrix matmul with its matrix operations emulated in
    /// plain WGSL by pretend subgroups of this many invocations
    /// ([`Cooperative::Emulated`]), on any adapter with native f16 — slow, but it checks the
    /// kernel's tiling, staging and epilogue where no cooperative matrices exist (lavapipe).
    /// Takes precedence over `cooperative_matrix`.
    pub cooperative_matrix_emulation: Option<u32>,
    /// How a fused attention kernel (`CompileOptions::fused_attention`) walks the keys:
    /// `Some(true)` in blocks staged in workgroup memory by the whole workgroup (the GPU
    /// form), `Some(false)` one key at a time read by each invocation. `None`: the device's
    /// [`Device::kernel_forms`] (measured where autotuning is on; unmeasured, tiled except on
    /// a CPU adapter, where the tiled form ran ~20% slower on lavapipe: BENCHMARKS.md).
    pub tiled_attention: Option<bool>,
    /// Whether the subgroup matmul may read its operands from textures, copied from their
    /// buffers before each such kernel (see `fusegraph_wgsl::LowerOptions::texture_operands`:
    /// faster loads on adapters whose storage loads are slow, for extra memory that an
    /// executable holds only where its memory limit leaves room), where [`Device::kernel_forms`] takes them. `None` is
    /// allowed; `Some(false)` never.
    pub texture_operands: Option<bool>,
    /// Whether wgpu adds its runtime checks to every kernel: `min` clamps on dynamic indices
    /// into arrays (workgroup tiles, vectors), a counter that bounds every loop, and, where
    /// the driver has no robust buffer access, clamps on buffer indices. `None` takes
    /// `FUSEGRAPH_SHADER_CHECKS`; unset, off: the kernels are created as trusted
    /// modules (see [`Device::shader_checks`] for why that is sound for fusegraph's kernels),
    /// since the checks are redundant work in every kernel's hottest loop (22 clamps in the
    /// tiled 4096³ matmul) and the loop counters can keep a driver from unrolling loops
    /// (wgpu issue gfx-rs/wgpu#7698: a pipeline went from 0.1 to 10 ms). `Some(true)` keeps
    /// them, to compare or to debug a kernel.
    pub shader_checks: Option<bool>,
    /// Lower every kernel in the forms a GPU gets by default, on any adapter, unmeasured:
    /// [`KernelForms::GPU`] (workgroup-per-row reductions, loop kernels without serial
    /// steps, tiled attention), the workgroup-tiled matmul, the split-reduction rule of a GPU
    /// ([`crate::ReduceFill::GPU`]). For tests on a CPU adapter (lavapipe), which otherwise
    /// may never run these forms. The loop budget of Mesa's CPU adapters
    /// (`fusegraph_wgsl::CPU_LOOP_BUDGET`) holds in these forms too. `FUSEGRAPH_GPU_KERNELS=on`
    /// sets it for every device of the process ([`crate::env`]).
    pub gpu_kernels: bool,
    /// Where measurements of the adapter (tuned tilings, the cost model) are cached between
    /// runs; `None`: `$XDG_CACHE_HOME/fusegraph`, else `$HOME/.cache/fusegraph`.
    pub cache_dir: Option<std::path::PathBuf>,
    /// Which of several adapters of the best kind found (discrete GPUs, say) to open, counted
    /// in the driver's order and wrapping around: a process per GPU passes its rank on the
    /// host (`fusegraph::distributed::Mpi::local_rank`). `None` opens the first.
    pub adapter: Option<usize>,
}

/// Whether `adapter` runs the cooperative-matrix matmul (see `fusegraph_wgsl::CoopPlan`):
/// `EXPERIMENTAL_COOPERATIVE_MATRIX` with a subgroup-scope 16×16×16 configuration of f16 A
/// and B and an f32 accumulator, native f16, a fixed subgroup size, and the kernel's
/// workgroup memory.
fn cooperative_matrix_usable(adapter: &wgpu::Adapter, f16_native: bool) -> bool {
    let fixed_subgroups = fixed_subgroup_size(&adapter.get_info()).is_some();
    let f16_f32 = adapter.cooperative_matrix_properties().iter().any(|p| {
        (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
            && p.ab_type == wgpu::CooperativeScalarType::F16
            && p.cr_type == wgpu::CooperativeScalarType::F32
    });
    adapter.features().contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SUBGROUP)
        && f16_native
        && fixed_subgroups
        && f16_f32
        && adapter.limits().max_compute_workgroup_storage_size as usize >= fusegraph_wgsl::CoopPlan::WORKGROUP_BYTES
}

/// The adapter's subgroup size where it is fixed (its minimum and maximum agree).
pub(crate) fn fixed_subgroup_size(info: &wgpu::AdapterInfo) -> Option<u32> {
    (info.subgroup_min_size == info.subgroup_max_size && info.subgroup_min_size > 0).then_some(info.subgroup_min_size)
}

type PipelineEntry = Arc<(wgpu::ComputePipeline, wgpu::BindGroupLayout)>;

/// A wgpu device and queue, with the adapter's facts and a pipeline cache keyed by shader text.
pub struct Device {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    limits: wgpu::Limits,
    features: wgpu::Features,
    f16_native: bool,
    cooperative_matrix: Option<Cooperative>,
    cooperative_configs: Vec<wgpu::CooperativeMatrixProperties>,
    pipelines: Mutex<HashMap<String, PipelineEntry>>,
    pub(crate) pool: crate::pool::Pool,
    pub(crate) cost: std::sync::OnceLock<fusegraph_passes::cost::CostModel>,
    pub(crate) autotune: bool,
    tiled_attention: Option<bool>,
    shader_checks: bool,
    texture_operands: bool,
    pub(crate) gpu_kernels: bool,
    pub(crate) measure_cost: bool,
    pub(crate) cache: crate::tuned::Cache,
    pub(crate) tuner: Mutex<crate::tuned::Tuner>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("adapter", &self.info.name).field("backend", &self.info.backend).finish()
    }
}

fn rank(info: &wgpu::AdapterInfo) -> u8 {
    match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

static SHARED: Mutex<Option<Arc<Device>>> = Mutex::new(None);

impl Device {
    /// Opens a device as `opts` says.
    pub fn new(opts: &DeviceOptions) -> Result<Device> {
        let forced = match opts.backend {
            Some(b) => Some(b),
            None => match &crate::env::env().backend {
                Some(s) => Some(s.parse()?),
                None => None,
            },
        };
        let attempts: Vec<wgpu::Backends> = match forced {
            Some(b) => vec![b.wgpu()],
            None => vec![wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12, wgpu::Backends::GL],
        };
        let mut tried = Vec::new();
        for backends in attempts {
            tried.push(format!("{backends:?}"));
            let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
            desc.backends = backends;
            let instance = wgpu::Instance::new(desc);
            let mut adapters = pollster::block_on(instance.enumerate_adapters(backends));
            adapters.sort_by_key(|a| rank(&a.get_info()));
            let best = adapters.iter().take_while(|a| rank(&a.get_info()) == rank(&adapters[0].get_info())).count();
            if best > 0 {
                let index = opts.adapter.unwrap_or(0) % best;
                return Self::open(adapters.swap_remove(index), opts);
            }
        }
        Err(RuntimeError::NoAdapter { tried: tried.join(", then ") })
    }

    fn open(adapter: wgpu::Adapter, opts: &DeviceOptions) -> Result<Device> {
        let info = adapter.get_info();
        let has_f16 = adapter.features().contains(wgpu::Features::SHADER_F16);
        let f16_native = opts.f16_native.unwrap_or(has_f16) && has_f16;
        let mut features = wgpu::Features::empty();
        if f16_native {
            features |= wgpu::Features::SHADER_F16;
        }
        // GPU timestamps around the compute pass, for benchmarks, where the adapter has them;
        // subgroup operations for row reductions.
        features |= adapter.features() & (wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::SUBGROUP);
        let wanted = opts.cooperative_matrix.unwrap_or(true);
        let cooperative_matrix = match opts.cooperative_matrix_emulation {
            Some(subgroup_size) => {
                let option = "cooperative_matrix_emulation".to_string();
                let invocations = fusegraph_wgsl::CoopPlan::INVOCATIONS;
                if subgroup_size == 0 || !invocations.is_multiple_of(subgroup_size as usize) {
                    let detail =
                        format!("{subgroup_size} invocations per subgroup do not divide the kernel's {invocations}");
                    return Err(RuntimeError::InvalidOption { option, detail });
                }
                if !f16_native {
                    let detail = format!("needs native f16, which {} is not using", info.name);
                    return Err(RuntimeError::InvalidOption { option, detail });
                }
                Some(Cooperative::Emulated { subgroup_size })
            }
            None => (wanted && cooperative_matrix_usable(&adapter, f16_native)).then_some(Cooperative::Native),
        };
        if cooperative_matrix == Some(Cooperative::Native) {
            features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        let limits = adapter.limits();
        let desc = wgpu::DeviceDescriptor {
            label: Some("fusegraph"),
            required_features: features,
            required_limits: limits.clone(),
            // SAFETY: the one experimental feature requested is cooperative matrices, used
            // only by the cooperative-matrix matmul, whose results the tests check against
            // the plain kernel and the reference on adapters that have it.
            experimental_features: if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            ..Default::default()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc))
            .map_err(|e| RuntimeError::RequestDevice { adapter: info.name.clone(), detail: e.to_string() })?;
        // Errors are caught with error scopes where they can occur; anything else is logged
        // rather than aborting the process (wgpu's default handler panics).
        device.on_uncaptured_error(Arc::new(|e| tracing::error!(target: "fusegraph", "uncaptured wgpu error: {e}")));
        let autotune = opts
            .autotune
            .or(crate::env::env().autotune)
            .unwrap_or_else(|| !(info.backend == wgpu::Backend::Gl && info.device_type == wgpu::DeviceType::Cpu));
        let tiled_attention = opts.tiled_attention;
        let texture_operands = opts.texture_operands.unwrap_or(true);
        let shader_checks = opts.shader_checks.or(crate::env::env().shader_checks).unwrap_or(false);
        // Turned off on purpose, not by the GL default: measure nothing.
        let measure_cost = opts.autotune.or(crate::env::env().autotune) != Some(false);
        let cache_dir =
            opts.cache_dir.clone().or_else(|| crate::env::env().cache_home.clone().map(|h| h.join("fusegraph")));
        let cache = crate::tuned::Cache::new(cache_dir, &info, shader_checks);
        Ok(Device {
            device,
            queue,
            info,
            limits,
            features,
            f16_native,
            cooperative_matrix,
            cooperative_configs: adapter.cooperative_matrix_properties(),
            pipelines: Mutex::new(HashMap::new()),
            pool: crate::pool::Pool::new(opts.memory_limit),
            cost: std::sync::OnceLock::new(),
            autotune,
            tiled_attention,
            shader_checks,
            texture_operands,
            gpu_kernels: opts.gpu_kernels || crate::env::env().gpu_kernels == Some(true),
            measure_cost,
            cache,
            tuner: Mutex::new(Default::default()),
        })
    }

    /// A device shared by everything in the process that does not need its own, opened
    /// with default options on first use.
    pub fn shared() -> Result<Arc<Device>> {
        let mut slot = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = slot.as_ref() {
            return Ok(d.clone());
        }
        let d = Arc::new(Device::new(&DeviceOptions::default())?);
        *slot = Some(d.clone());
        Ok(d)
    }

    /// Whether kernels carry wgpu's runtime checks ([`DeviceOptions::shader_checks`]; off
    /// unless asked for).
    ///
    /// Without them a kernel relies on its own indexing, which fusegraph's generator owns:
    /// every buffer access whose index can pass the end (ragged tiles, grid-stride tails) is
    /// behind the kernel's own bounds test or `min`, data-dependent indices (`gather`) are
    /// clamped as the op defines, workgroup tiles are indexed from invocation ids within
    /// their declared size, and loops run to bounds written into the kernel. The whole test
    /// suite runs without the checks, and `tests/shader_checks.rs` runs every kernel form both
    /// ways against the reference. Vulkan drivers keep their robust buffer access either way.
    pub fn shader_checks(&self) -> bool {
        self.shader_checks
    }

    /// The adapter's name, vendor, backend and driver.
    pub fn info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }

    /// The limits the device was opened with (the adapter's own).
    pub fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }

    /// The features enabled on the device.
    pub fn features(&self) -> wgpu::Features {
        self.features
    }

    /// Whether GPU timestamp queries are enabled (benchmarks then time the GPU work itself).
    pub(crate) fn has_timestamps(&self) -> bool {
        self.features.contains(wgpu::Features::TIMESTAMP_QUERY)
    }

    /// Whether f16 is stored as WGSL `f16` (else packed two per u32).
    pub fn f16_native(&self) -> bool {
        self.f16_native
    }

    /// Whether fused attention kernels stage blocks of keys in workgroup memory
    /// ([`DeviceOptions::tiled_attention`], else [`Device::kernel_forms`]).
    pub fn tiled_attention(self: &Arc<Self>) -> bool {
        self.kernel_forms().tiled_attention
    }

    /// Whether a CPU adapter's defaults hold where nothing is measured or forced (its kernel
    /// forms, its matmul family): the adapter is a CPU and [`DeviceOptions::gpu_kernels`] did
    /// not ask for a GPU's.
    pub(crate) fn cpu_kernels(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu && !self.gpu_kernels
    }

    /// The most rows a texture operand may have where the subgroup matmul reads its operands
    /// from textures where they may ([`DeviceOptions::texture_operands`] not off, subgroup
    /// operations with a fixed subgroup size, no [`DeviceOptions::gpu_kernels`]); `None`
    /// otherwise.
    pub(crate) fn texture_operand_rows(&self) -> Option<u32> {
        let subgroups = self.features.contains(wgpu::Features::SUBGROUP) && fixed_subgroup_size(&self.info).is_some();
        (self.texture_operands && subgroups && !self.gpu_kernels).then_some(self.limits.max_texture_dimension_2d)
    }

    /// The forms a compile lowers its kernels in where the form is a choice
    /// ([`KernelForms`]; [`crate::CompileOptions::kernel_forms`] forces them per compile):
    /// a GPU's with [`DeviceOptions::gpu_kernels`]; else where autotuning is on, each kind's
    /// family as measured on this adapter once and cached on disk (`forms-v1-<adapter>.txt`,
    /// [`Device::tuned`]); else the adapter's defaults ([`KernelForms::CPU`] on a CPU
    /// adapter, [`KernelForms::GPU`] elsewhere). [`DeviceOptions::tiled_attention`] and
    /// [`DeviceOptions::texture_operands`] override theirs.
    pub fn kernel_forms(self: &Arc<Self>) -> KernelForms {
        let forms = if self.gpu_kernels {
            KernelForms::GPU
        } else {
            self.measured_forms().unwrap_or_else(|| self.default_forms())
        };
        KernelForms {
            tiled_attention: self.tiled_attention.unwrap_or(forms.tiled_attention),
            texture_operands: forms.texture_operands && self.texture_operand_rows().is_some(),
            ..forms
        }
    }

    /// The adapter's forms where nothing is measured: a CPU adapter's or a GPU's.
    pub(crate) fn default_forms(&self) -> KernelForms {
        if self.cpu_kernels() {
            KernelForms::CPU
        } else {
            KernelForms::GPU
        }
    }

    /// How f16 matmuls and convolutions run on cooperative matrices, if they do:
    /// [`Cooperative::Native`] (tensor cores) where the adapter has
    /// `EXPERIMENTAL_COOPERATIVE_MATRIX` with 16×16×16 f16 products accumulated in f32 at
    /// subgroup scope, native f16 and a fixed subgroup size, and
    /// [`DeviceOptions::cooperative_matrix`] did not turn it off; [`Cooperative::Emulated`]
    /// where [`DeviceOptions::cooperative_matrix_emulation`] asked for it.
    pub fn cooperative_matrix(&self) -> Option<Cooperative> {
        self.cooperative_matrix
    }

    /// The cooperative-matrix configurations the adapter reports (subgroup scope, sides of 8
    /// or 16; empty without `EXPERIMENTAL_COOPERATIVE_MATRIX`), whether or not one is used.
    pub fn cooperative_matrix_configs(&self) -> &[wgpu::CooperativeMatrixProperties] {
        &self.cooperative_configs
    }

    /// A one-line description: `name (backend, device type, driver)`, with `, shader checks
    /// on` where [`Device::shader_checks`] is on.
    pub fn describe(&self) -> String {
        let i = &self.info;
        let checks = if self.shader_checks { ", shader checks on" } else { "" };
        format!("{} ({:?}, {:?}, {} {}){checks}", i.name, i.backend, i.device_type, i.driver, i.driver_info)
    }

    /// The pipeline for `wgsl` with `bindings` (read-write storage buffers, or unfilterable
    /// float 2-D textures where [`fusegraph_wgsl::Binding::texture`]), compiled once.
    pub(crate) fn pipeline(
        &self,
        wgsl: &str,
        bindings: &[fusegraph_wgsl::Binding],
        label: &str,
    ) -> Result<PipelineEntry> {
        if let Some(p) = self.pipelines.lock().unwrap_or_else(|p| p.into_inner()).get(wgsl) {
            return Ok(p.clone());
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let entries: Vec<wgpu::BindGroupLayoutEntry> = (0u32..)
            .zip(bindings)
            .map(|(b, binding)| wgpu::BindGroupLayoutEntry {
                binding: b,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: match binding.texture {
                    true => wgpu::BindingType::Texture {
                        sample_type: wgpu::TextureSampleType::Float { filterable: false },
                        view_dimension: wgpu::TextureViewDimension::D2,
                        multisampled: false,
                    },
                    false => wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage { read_only: false },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                },
                count: None,
            })
            .collect();
        let bgl = self
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(label), entries: &entries });
        let layout = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(label),
            bind_group_layouts: &[Some(&bgl)],
            immediate_size: 0,
        });
        let desc = wgpu::ShaderModuleDescriptor { label: Some(label), source: wgpu::ShaderSource::Wgsl(wgsl.into()) };
        let module = match self.shader_checks {
            true => self.device.create_shader_module(desc),
            // SAFETY: only fusegraph's generated kernels come here (see `shader_checks`):
            // every buffer access that can pass the end is guarded by the kernel's own bounds
            // test or clamp (gather's indices included), workgroup and vector indices are
            // derived from the invocation id within the tile's extent, and every loop runs to
            // a bound written into the kernel.
            false => unsafe { self.device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) },
        };
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: Some(&layout),
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(RuntimeError::Wgpu { during: format!("creating pipeline `{label}`"), detail: e.to_string() });
        }
        let entry = Arc::new((pipeline, bgl));
        self.pipelines.lock().unwrap_or_else(|p| p.into_inner()).insert(wgsl.to_string(), entry.clone());
        Ok(entry)
    }
}
