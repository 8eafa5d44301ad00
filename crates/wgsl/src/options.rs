//! What the code generator is told and what it gives back: the adapter facts and
//! code-generation choices that change a kernel's text ([`LowerOptions`], [`Strategy`]) and
//! the lowered kernel ([`KernelSource`], its [`Binding`]s).

use crate::tiling::MatmulTiling;
use fusegraph_ir::NodeId;

/// Invocations per workgroup of every loop kernel.
pub const WORKGROUP_SIZE: u32 = 256;

/// Adapter facts that change the generated code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LowerOptions {
    /// Use WGSL `f16` storage (the adapter has `SHADER_F16`); otherwise f16 values are
    /// stored two to a `u32` and converted with `pack2x16float`/`unpack2x16float`.
    pub f16_native: bool,
    /// How loop and row kernels spread their work over invocations (a family per kind of
    /// kernel, which the runtime chooses: measured on the adapter where it autotunes).
    pub forms: Forms,
    /// The most loop iterations one invocation may run, where the adapter cuts loops short
    /// (Mesa's CPU adapters: see [`crate::CPU_LOOP_BUDGET`]): serial walks that would exceed it
    /// take fewer elements per invocation, or a workgroup per row. A correctness limit,
    /// whatever the forms; `None`: no limit.
    pub loop_budget: Option<u64>,
    /// The device has subgroup operations (`wgpu::Features::SUBGROUP`): a row kernel that
    /// shares a row among a workgroup reduces within each subgroup with `subgroupAdd` (…Max,
    /// …Min, …Mul) and combines one partial per subgroup, instead of a tree with a barrier
    /// per level. No subgroup size is assumed: the partials are indexed by `subgroup_id` and
    /// counted by `num_subgroups`.
    pub subgroups: bool,
    /// The adapter's subgroup size where it is fixed (its minimum and maximum agree, as on
    /// lavapipe: 8); `None` where it varies or is unknown. With `subgroups`, f32 and f16
    /// matmuls and convolutions can take the subgroup lowering (`matmul::subgroup_main`),
    /// which needs the size at compile time.
    pub subgroup_size: Option<u32>,
    /// How f16 matmuls and convolutions run on cooperative matrices, if they do (see
    /// [`crate::CoopPlan`]); `None` keeps the plain tiled kernel.
    pub cooperative_matrix: Option<Cooperative>,
    /// A fused attention kernel whose logits come from a scores matmul walks the keys in
    /// blocks its workgroup stages in workgroup memory (`attention::tiled_main`: the GPU
    /// form); otherwise each invocation reads its keys one at a time (`attention::row_main`).
    pub tiled_attention: bool,
    /// The subgroup matmul (`subgroups` and a fixed `subgroup_size`) reads its vec4
    /// operands from sampled textures instead of storage buffers: `Some(rows)`, the most
    /// rows a 2-D texture may have on the device (`max_texture_dimension_2d`). Each such
    /// binding ([`Binding::texture`]) is a `texture_2d<f32>` holding the value's vec4s in
    /// row-major order, [`TEXTURE_ROW`] per row (`rgba32float`, or `rgba16float` for f16),
    /// which the runtime copies from the value's buffer before the dispatch. On lavapipe a
    /// storage load whose address differs per lane is a loop over the lanes that inserts each
    /// lane's value through memory, while a texel fetch is a gather: the product runs about
    /// 3× faster (BENCHMARKS.md). Operands of more than `rows · TEXTURE_ROW` vec4s stay in
    /// their buffers.
    pub texture_operands: Option<u32>,
    /// The workgroup memory a kernel may use (`max_compute_workgroup_storage_size`; `None`:
    /// WebGPU's default, `fusegraph_passes::GEMV_STAGE_BYTES`), which bounds the rows a
    /// matrix–vector kernel's row prologue stages.
    pub workgroup_storage: Option<usize>,
}

/// How a kind of kernel spreads its work over invocations: one of two families.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Spread {
    /// Many invocations with little work each, as GPUs hide latency by running other
    /// invocations: a loop kernel takes one element per invocation (four adjacent ones,
    /// as `vec4`s, from [`crate::GPU_INTERLEAVE_MIN`] elements); a row kernel a workgroup per
    /// row with a tree in workgroup memory, an invocation per row only for many short rows.
    #[default]
    Parallel,
    /// Few invocations with more serial work each and no barriers, for adapters that run a
    /// workgroup's invocations as SIMD batches on a few cores, where every workgroup and
    /// barrier costs a switch (CPU adapters): a loop kernel's invocation computes four
    /// elements side by side over several grid-stride steps, moving f16 values as words; a
    /// row kernel gives each row an invocation wherever there are 16 rows and its walks fit
    /// the loop budget, four elements side by side.
    Serial,
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Spread::Parallel => "parallel",
            Spread::Serial => "serial",
        })
    }
}

/// The family of each kind of kernel whose form is a choice ([`Spread`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Forms {
    /// Elementwise (loop) kernels.
    pub loops: Spread,
    /// Reductions' row kernels.
    pub rows: Spread,
}

impl Forms {
    /// Both kinds [`Spread::Parallel`] (a GPU's forms; the default).
    pub const PARALLEL: Forms = Forms { loops: Spread::Parallel, rows: Spread::Parallel };
    /// Both kinds [`Spread::Serial`] (a CPU adapter's forms).
    pub const SERIAL: Forms = Forms { loops: Spread::Serial, rows: Spread::Serial };
}

/// Texels (vec4s) per row of a texture operand (see [`LowerOptions::texture_operands`]): a
/// power of two, so a vec4 index `q` is texel `(q % TEXTURE_ROW, q / TEXTURE_ROW)`, and rows
/// of whole 256-byte multiples, as buffer-to-texture copies need.
pub const TEXTURE_ROW: u32 = 1024;

/// How the cooperative-matrix matmul ([`crate::CoopPlan`]) runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cooperative {
    /// On the device's cooperative matrices (`wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX`,
    /// tensor cores): 16×16 f16 A and B with an f32 accumulator at subgroup scope, the
    /// workgroup memory holding [`crate::CoopPlan::WORKGROUP_BYTES`]. Needs `f16_native` and
    /// a fixed `subgroup_size`.
    Native,
    /// The same kernel with each cooperative-matrix operation emulated in plain WGSL by a
    /// pretend subgroup of this many consecutive invocations (an accumulator's elements
    /// spread over its lanes, as hardware spreads them): slow, for checking the kernel's
    /// tiling, staging and epilogue against the reference on adapters without cooperative
    /// matrices. Needs `f16_native`.
    Emulated {
        /// Invocations per pretend subgroup (it must divide [`crate::CoopPlan::INVOCATIONS`]).
        subgroup_size: u32,
    },
}

/// One storage binding of a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The value bound.
    pub node: NodeId,
    /// Whether the kernel writes it (an output) or only reads it (an input).
    pub output: bool,
    /// An input read from a sampled texture holding its contents (see
    /// [`LowerOptions::texture_operands`]), not from its storage buffer.
    pub texture: bool,
}

/// A lowered kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelSource {
    /// WGSL text; entry point `main`.
    pub wgsl: String,
    /// Binding `k` of group 0 is `bindings[k]`.
    pub bindings: Vec<Binding>,
    /// Workgroups to dispatch (a linear count; the runtime folds it into a 2-D grid).
    pub workgroups: u64,
    /// A short label naming the member ops, for debugging and profiles.
    pub label: String,
    /// How it was lowered: the kernel family and the choices within it.
    pub form: KernelForm,
    /// Its dynamic update slices write their windows alone (a window kernel's, or side
    /// windows written over their operands: [`fusegraph_passes::side_windows`]).
    pub windows: bool,
}

/// How a kernel was lowered (what tests and statistics ask of a kernel, rather than reading
/// its WGSL).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelForm {
    /// One invocation per output element, or per four adjacent ones (`quads`).
    Loop {
        /// Four elements per invocation, as vec4 loads and stores.
        quads: bool,
    },
    /// A reduction's rows: a workgroup per row with a tree in workgroup memory (`shared`,
    /// with `subgroups` arithmetic where the adapter has it), or an invocation per row.
    Row {
        /// A workgroup per row, combining in workgroup memory.
        shared: bool,
        /// Subgroup operations in the workgroup's tree.
        subgroups: bool,
        /// An invocation per row reading four elements per step (the serial row family).
        quads: bool,
    },
    /// The register-blocked, workgroup-tiled matrix product (a convolution as an implicit
    /// GEMM with `conv`), on cooperative matrices with `coop`.
    TiledMatmul {
        /// The product is a convolution's (patches gathered by `fg_im2col`).
        conv: bool,
        /// On cooperative matrices, natively or emulated.
        coop: Option<Cooperative>,
        /// The lhs loaded a vec4 at a time from its binding.
        vec4_lhs: bool,
        /// The rhs likewise.
        vec4_rhs: bool,
    },
    /// The matrix–vector product of a few rows (`crate::matmul_gemv`): `k` split over a
    /// workgroup's invocations, one accumulator per row each.
    Gemv {
        /// The rhs's elements adjacent along `k` (a weight read transposed).
        k_contiguous: bool,
        /// The rhs read by whole words from a packed binding (a quantized or bf16 weight).
        packed: bool,
        /// The lhs computed by a row prologue (a layer norm), reduced a row at a time.
        row_prologue: bool,
    },
    /// The subgroup matrix product (no barriers; adapters with a fixed subgroup size).
    SubgroupMatmul {
        /// A convolution's product.
        conv: bool,
        /// Operands read from workspace textures.
        textures: usize,
        /// The output written a vec4 at a time.
        vec4_store: bool,
    },
    /// Memory-efficient attention with the online softmax; `tiled`: keys and values staged
    /// in workgroup memory.
    Attention {
        /// Keys and values staged in workgroup memory.
        tiled: bool,
    },
    /// Dynamic update slices written over their operands' buffers: an invocation per
    /// element of the update, the window stored alone (`crate::window`).
    Window,
}

impl KernelSource {
    /// The WGSL headed by a comment line naming the kernel and its workgroup count, as the
    /// golden files and WGSL dumps hold it.
    pub fn annotated(&self) -> String {
        format!("// kernel {} ({} workgroups)\n{}", self.label, self.workgroups, self.wgsl)
    }
}

/// Code-generation choices that do not depend on the adapter; the default is the fast code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strategy {
    /// Lower loop kernels whose output region holds a matmul with the tiled, register-blocked
    /// kernel (workgroup tiles staged in workgroup memory); otherwise one invocation per output
    /// element loops over `k` (the naive lowering).
    pub tiled_matmul: bool,
    /// The tiling of a tiled matmul kernel (an autotuner's choice); `None` (or a tiling that
    /// is not [`MatmulTiling::is_valid`]) picks [`MatmulTiling::default_for`] its shape.
    pub matmul_tiling: Option<MatmulTiling>,
    /// With `tiled_matmul`, lower a matmul by `crate::matmul_subgroup::subgroup_main` where
    /// [`subgroup_matmul`](crate::subgroup_matmul) says it can (a fixed subgroup size); otherwise
    /// the workgroup-tiled kernel with `matmul_tiling`.
    pub subgroup_matmul: bool,
    /// With `tiled_matmul`, lower an f16 matmul on cooperative matrices where
    /// [`cooperative_matmul`](crate::cooperative_matmul) says it can (adapters with
    /// [`LowerOptions::cooperative_matrix`]); otherwise the plain tiled kernel.
    pub cooperative_matmul: bool,
    /// The tiled kernel (plain or cooperative) loads operands that are bindings or strided
    /// views of them a vec4 at a time, one `k` slice ahead, where their layout allows
    /// (`TiledPlan::vec4_lhs`); otherwise every operand value through its element function
    /// (for comparisons).
    pub vec4_operands: bool,
    /// The plain tiled kernel gives each invocation `bn` adjacent columns of its tile;
    /// otherwise its columns are
    /// `bn / 4` groups of four, `gx` groups apart, so that the invocations of a row read
    /// adjacent vec4s of the rhs tile in each step and store adjacent vec4s of the result
    /// (see `crate::matmul_tiled::tiled_main`).
    pub blocked_columns: bool,
    /// With `tiled_matmul` and no `matmul_tiling`, lower a product of at most
    /// [`crate::GEMV_MAX_ROWS`] rows on an adapter with a GPU's loop forms by the
    /// matrix–vector kernel (`crate::matmul_gemv::gemv_main`); otherwise as any other
    /// product.
    pub gemv: bool,
    /// The columns each workgroup of the matrix–vector kernel computes where its weight lies
    /// along `k` (a weight read transposed), its 256 invocations splitting `k` `256 / c`
    /// ways: one of [`crate::GEMV_COLUMNS`]; `None` (or another value) takes the split's own
    /// choice for the shape (`crate::matmul_gemv::Split::of`).
    pub gemv_columns: Option<usize>,
    /// The kernel's dynamic update slices are written over their operands' buffers (the
    /// memory plan says so): lower it by `crate::window::window_main`, which writes their
    /// windows alone (and its other outputs whole), where [`crate::window_outputs`] finds
    /// one window. Wrong for updates that have buffers of their own, so off by default.
    pub window_writes: bool,
}

impl Default for Strategy {
    fn default() -> Self {
        Strategy {
            tiled_matmul: true,
            matmul_tiling: None,
            subgroup_matmul: true,
            cooperative_matmul: true,
            vec4_operands: true,
            blocked_columns: false,
            gemv: true,
            gemv_columns: None,
            window_writes: false,
        }
    }
}

/// The subgroup builtins of a `main` whose reductions combine by subgroups.
pub(crate) const SUBGROUP_ARGS: &str = "@builtin(subgroup_id) sg_id: u32, @builtin(num_subgroups) sg_count: u32, \
     @builtin(subgroup_invocation_id) sg_lane: u32";

pub(crate) const MAIN_ARGS: &str =
    "@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32";
