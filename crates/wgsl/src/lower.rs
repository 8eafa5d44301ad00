//! Assembles one kernel's shader: bindings, load functions, element functions, `main`.

use crate::body::{combine, elementwise_expr, reduce_identity, write_body};
use crate::matmul::MatmulTiling;
use crate::view::{strided_view, StridedView};
use crate::writer::{literal, ravel, unravel, vty};
use fusegraph_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceKind, UnaryOp};
use fusegraph_passes::kernel::{region_of, regions, same_index_operands};
use fusegraph_passes::{Kernel, KernelKind};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// Invocations per workgroup of every loop kernel.
pub const WORKGROUP_SIZE: u32 = 256;

const HELPERS: &str = include_str!("../../../shaders/helpers.wgsl");

/// Adapter facts that change the generated code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LowerOptions {
    /// Use WGSL `f16` storage (the adapter has `SHADER_F16`); otherwise f16 values are
    /// stored two to a `u32` and converted with `pack2x16float`/`unpack2x16float`.
    pub f16_native: bool,
    /// The adapter is a CPU (lavapipe, llvmpipe): workgroup barriers are expensive there
    /// (each one switches between the workgroup's SIMD batches), so row kernels prefer one
    /// invocation per row looping serially over a workgroup-wide tree.
    pub cpu: bool,
    /// The device has subgroup operations (`wgpu::Features::SUBGROUP`): a row kernel that
    /// shares a row among a workgroup reduces within each subgroup with `subgroupAdd` (…Max,
    /// …Min, …Mul) and combines one partial per subgroup, instead of a tree with a barrier
    /// per level. No subgroup size is assumed: the partials are indexed by `subgroup_id` and
    /// counted by `num_subgroups`.
    pub subgroups: bool,
    /// The adapter's subgroup size where it is fixed (its minimum and maximum agree, as on
    /// lavapipe: 8); `None` where it varies or is unknown. With `cpu` and `subgroups`, f32
    /// and f16 matmuls and convolutions take the subgroup lowering
    /// (`matmul::subgroup_main`), which needs the size at compile time.
    pub subgroup_size: Option<u32>,
    /// How f16 matmuls and convolutions run on cooperative matrices, if they do (see
    /// [`crate::CoopPlan`]); `None` keeps the plain tiled kernel.
    pub cooperative_matrix: Option<Cooperative>,
    /// A fused attention kernel whose logits come from a scores matmul walks the keys in
    /// blocks its workgroup stages in workgroup memory (`attention::tiled_main`: the GPU
    /// form); otherwise each invocation reads its keys one at a time (`attention::row_main`).
    pub tiled_attention: bool,
    /// The subgroup matmul (`cpu`, `subgroups` and a fixed `subgroup_size`) reads its vec4
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
}

impl KernelSource {
    /// The WGSL headed by a comment line naming the kernel and its workgroup count, as the
    /// golden files and WGSL dumps hold it.
    pub fn annotated(&self) -> String {
        format!("// kernel {} ({} workgroups)\n{}", self.label, self.workgroups, self.wgsl)
    }
}

pub(crate) fn storage_elem(dtype: DType, opts: &LowerOptions) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 if opts.f16_native => "f16",
        DType::I32 => "i32",
        _ => "u32",
    }
}

pub(crate) fn packed_f16(dtype: DType, opts: &LowerOptions) -> bool {
    dtype == DType::F16 && !opts.f16_native
}

/// Whether an f16 binding that a loop or row kernel reads or writes four adjacent elements
/// at a time (its quads: see [`quad_view`]) is declared as pairs of `u32` words and
/// converted by integer operations (`fg_f16x4_from_words`, `fg_f16x4_to_words` in
/// shaders/helpers.wgsl), native f16 or not: on a CPU adapter, whose own f16 conversions
/// are slower than the copy they convert (lavapipe, 16 Mi elements: an f16 copy through
/// `vec4<f16>` 32–37 ms, through words 20–24 ms, an f32 copy 23 ms).
pub(crate) fn f16_words(dtype: DType, opts: &LowerOptions) -> bool {
    dtype == DType::F16 && opts.cpu
}

/// Whether a binding of `dtype` can be read and written in quads: `vec4`s of its storage
/// type, or pairs of words for f16 on a CPU adapter (see [`f16_words`]).
fn quad_storage(dtype: DType, opts: &LowerOptions) -> bool {
    vec4_storage(dtype, opts) || f16_words(dtype, opts)
}

/// The element type of a binding read and written in quads: `vec4` of its storage type, or
/// a pair of words for f16 on a CPU adapter (see [`f16_words`]).
fn quad_elem(dtype: DType, opts: &LowerOptions) -> String {
    if f16_words(dtype, opts) {
        "vec2<u32>".to_string()
    } else {
        format!("vec4<{}>", storage_elem(dtype, opts))
    }
}

/// The quad of a binding of `dtype` that stores the four values `values` (WGSL expressions
/// of the values' computed type).
fn quad_value(dtype: DType, opts: &LowerOptions, values: &[String]) -> String {
    if f16_words(dtype, opts) {
        format!("fg_f16x4_to_words(vec4<f32>({}))", values.join(", "))
    } else {
        let stored: Vec<String> = values.iter().map(|v| store_value(dtype, v)).collect();
        format!("vec4<{}>({})", storage_elem(dtype, opts), stored.join(", "))
    }
}

/// Code-generation choices that do not depend on the adapter; the default is the fast code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strategy {
    /// Lower loop kernels whose output region holds a matmul with the tiled, register-blocked
    /// kernel (workgroup tiles staged in workgroup memory); otherwise one invocation per output
    /// element loops over `k` (the naive lowering, kept for comparisons).
    pub tiled_matmul: bool,
    /// The tiling of a tiled matmul kernel (an autotuner's choice); `None` (or a tiling that
    /// is not [`MatmulTiling::is_valid`]) picks [`MatmulTiling::default_for`] its shape.
    pub matmul_tiling: Option<MatmulTiling>,
    /// With `tiled_matmul`, lower a matmul by `crate::matmul::subgroup_main` where
    /// [`subgroup_matmul`](crate::subgroup_matmul) says it can (CPU adapters); otherwise
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
    /// The plain tiled kernel gives each invocation `bn` adjacent columns of its tile (the
    /// layout before the eighteenth session, kept for comparisons); otherwise its columns are
    /// `bn / 4` groups of four, `gx` groups apart, so that the invocations of a row read
    /// adjacent vec4s of the rhs tile in each step and store adjacent vec4s of the result
    /// (see `crate::matmul::tiled_main`).
    pub blocked_columns: bool,
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
        }
    }
}

/// Lowers `kernel` of `g` to WGSL with the default [`Strategy`].
pub fn lower(g: &Graph, kernel: &Kernel, opts: &LowerOptions) -> KernelSource {
    lower_with(g, kernel, opts, &Strategy::default())
}

/// Lowers `kernel` of `g` to WGSL with explicit code-generation choices.
///
/// The kernel is lowered as a copy in a graph of its own (see [`localize`]), so the text
/// names its values by their place in the kernel, not by their ids in `g`: kernels that
/// compute the same thing on the same types — a layer's kernels in every layer of a model,
/// the same op at the same shape anywhere — lower to the same text, and the runtime, which
/// caches pipelines by their text, compiles one pipeline for all of them.
pub fn lower_with(g: &Graph, kernel: &Kernel, opts: &LowerOptions, strategy: &Strategy) -> KernelSource {
    lower_planned(g, kernel, &[], opts, strategy)
}

/// Lowers `kernel` of `g` as [`lower_with`] does, but with the f16 elementwise results and
/// reductions among its `unshared` members computed from one another in f32, each rounded to
/// f16 only where it is stored or read by a member computed in f16 (excess precision, as
/// XLA's `xla_allow_excess_precision` allows within a fusion). `unshared` must hold only
/// members that no other kernel computes
/// ([`fusegraph_passes::kernel::unshared_members`]): a value two kernels compute is then
/// computed from rounded values in both, and what a kernel stores is rounded, so no two
/// copies of one value disagree. Rounding an f16 result to f16 costs about a dozen integer
/// operations (lavapipe: a 20-op f16 chain takes 1.9× the time of the same chain rounded
/// where it is stored). Kernels with a matrix product or convolution, and attention kernels,
/// are lowered as [`lower_with`] does.
pub fn lower_planned(
    g: &Graph,
    kernel: &Kernel,
    unshared: &[NodeId],
    opts: &LowerOptions,
    strategy: &Strategy,
) -> KernelSource {
    let row;
    let kernel = match row_instead(g, kernel, opts) {
        Some(k) => {
            row = k;
            &row
        }
        None => kernel,
    };
    match localize_with(g, kernel, unshared) {
        Some((local, k, ids)) => {
            let mut src = lower_here(&local, &k, opts, strategy);
            for b in &mut src.bindings {
                b.node = ids[b.node.index()];
            }
            src
        }
        None => lower_here(g, kernel, opts, strategy),
    }
}

/// A lone reduction in a loop kernel (an unfused kernel: fusion gives long reductions row
/// kernels) whose rows a CPU adapter's invocation cannot sum within [`CPU_LOOP_BUDGET`]
/// iterations, as a row kernel: a workgroup per row. In a loop kernel lavapipe summed the
/// first 65 535 elements of each row of 100 000 and stopped there.
fn row_instead(g: &Graph, kernel: &Kernel, opts: &LowerOptions) -> Option<Kernel> {
    let [m] = kernel.members.as_slice() else { return None };
    let Op::Reduce { axes, .. } = &g.node(*m).op else { return None };
    if kernel.kind != KernelKind::Loop || within_budget(opts, serial_steps(g, kernel), 1) {
        return None;
    }
    let shape = g.ty(g.operands(*m)[0]).shape.dims().to_vec();
    Some(Kernel { kind: KernelKind::Row { shape, axes: axes.clone() }, ..kernel.clone() })
}

/// `kernel` copied into a graph of its own, in an order that depends on what it computes
/// and not on `g`'s node ids: its members in post-order from its outputs (operands in
/// operand order; members no output reaches after them, in their order), its inputs — graph
/// inputs of their types — in order of first use by those members, first. Returns that
/// graph, the kernel over its nodes and, for each of its nodes (by index), the node of `g` it
/// copies. `None` where the copy would not be faithful (an operand that is neither an input
/// nor a member, or a type that comes out differently), which no kernel the passes make has:
/// the caller then lowers `kernel` in `g` itself.
pub fn localize(g: &Graph, kernel: &Kernel) -> Option<(Graph, Kernel, Vec<NodeId>)> {
    localize_with(g, kernel, &[])
}

/// [`localize`], with the members of `unshared` that [`widened`] names computed in f32: in
/// the copy each becomes the same op on f32 operands (the f32 copy of a widened operand, a
/// `cast` to f32 of any other f16 operand, which is exact), followed by a `cast` to f16
/// (rounding) where the kernel stores the member or a member that is not widened reads it.
/// Only widened members see unrounded values. `ids` maps each inserted node to the member
/// it computes or converts.
fn localize_with(g: &Graph, kernel: &Kernel, unshared: &[NodeId]) -> Option<(Graph, Kernel, Vec<NodeId>)> {
    let members = canonical_order(g, kernel);
    let inputs = fusegraph_passes::kernel::kernel_inputs(g, &members);
    if inputs.len() != kernel.inputs.len() || !kernel.inputs.iter().all(|i| inputs.contains(i)) {
        return None;
    }
    let mut local = Graph::new();
    let mut to_local: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    let mut ids = Vec::with_capacity(inputs.len() + members.len());
    for (k, &i) in inputs.iter().enumerate() {
        let id = local.add_leaf(Op::Input { name: format!("in{k}") }, g.ty(i).clone()).ok()?;
        to_local.insert(i, id);
        ids.push(i);
    }
    let wide = widened(g, kernel, &members, unshared);
    let member_set: BTreeSet<NodeId> = members.iter().copied().collect();
    let outputs: BTreeSet<NodeId> = kernel.outputs.iter().copied().collect();
    // A widened member is rounded where it is stored or a member computed in f16 reads it.
    let rounds =
        |m: NodeId| outputs.contains(&m) || g.users(m).iter().any(|u| member_set.contains(u) && !wide.contains(u));
    // The f32 copy of each widened member (before its rounding cast) and of each f16 value a
    // widened member reads.
    let mut wide_local: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    let mut local_members = Vec::with_capacity(members.len());
    for &m in &members {
        let node = g.node(m);
        let id = if node.op.is_leaf() {
            local.add_leaf(node.op.clone(), node.ty.clone()).ok()?
        } else if wide.contains(&m) {
            let mut operands = Vec::new();
            for o in g.operands(m) {
                operands.push(match wide_local.get(&o) {
                    Some(&w) => w,
                    None if g.ty(o).dtype == DType::F16 => {
                        let w = local.add_op(Op::Cast { to: DType::F32 }, &[*to_local.get(&o)?]).ok()?;
                        ids.push(o);
                        local_members.push(w);
                        wide_local.insert(o, w);
                        w
                    }
                    None => *to_local.get(&o)?,
                });
            }
            let w = local.add_op(node.op.clone(), &operands).ok()?;
            if local.ty(w).shape != node.ty.shape || local.ty(w).dtype != DType::F32 {
                return None;
            }
            wide_local.insert(m, w);
            if !rounds(m) {
                to_local.insert(m, w);
                ids.push(m);
                local_members.push(w);
                continue;
            }
            ids.push(m);
            local_members.push(w);
            local.add_op(Op::Cast { to: DType::F16 }, &[w]).ok()?
        } else {
            let operands: Option<Vec<NodeId>> = g.operands(m).iter().map(|o| to_local.get(o).copied()).collect();
            local.add_op(node.op.clone(), &operands?).ok()?
        };
        if local.ty(id) != &node.ty || to_local.insert(m, id).is_some() {
            return None;
        }
        ids.push(m);
        local_members.push(id);
    }
    let map = |ns: &[NodeId]| ns.iter().map(|n| to_local.get(n).copied()).collect::<Option<Vec<_>>>();
    let kind = match &kernel.kind {
        KernelKind::Attention { logits } => KernelKind::Attention { logits: *to_local.get(logits)? },
        other => other.clone(),
    };
    let k = Kernel { kind, members: local_members, outputs: map(&kernel.outputs)?, inputs: map(&inputs)? };
    Some((local, k, ids))
}

/// The members of `kernel` (`members`: a topological order) that [`localize_with`] computes
/// in f32: those of `unshared` that are f16 results of elementwise ops or reductions, and
/// data movement (broadcast, reshape, transpose, slice) of those (so that a row's sum, say,
/// reaches the elements it divides unrounded; data movement of anything else stays as it
/// is, so that loads through views of bindings keep their shape). None in kernels with a
/// matrix product, a convolution or attention, whose lowerings match their members'
/// structure.
fn widened(g: &Graph, kernel: &Kernel, members: &[NodeId], unshared: &[NodeId]) -> BTreeSet<NodeId> {
    let mut wide = BTreeSet::new();
    if unshared.is_empty()
        || matches!(kernel.kind, KernelKind::Attention { .. })
        || members.iter().any(|&m| matches!(g.node(m).op, Op::MatMul | Op::Conv2d { .. }))
    {
        return wide;
    }
    let unshared: BTreeSet<NodeId> = unshared.iter().copied().collect();
    for &m in members {
        if !unshared.contains(&m) || g.ty(m).dtype != DType::F16 {
            continue;
        }
        let widens = match g.node(m).op {
            Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Reduce { .. } => true,
            Op::Broadcast { .. } | Op::Reshape { .. } | Op::Transpose { .. } | Op::Slice { .. } => {
                wide.contains(&g.operands(m)[0])
            }
            _ => false,
        };
        if widens {
            wide.insert(m);
        }
    }
    wide
}

/// `kernel`'s members in post-order from its outputs (operands in operand order), then any
/// member no output reaches, with those it reaches, in member order: a topological order
/// that two kernels computing the same thing share whatever their node ids.
fn canonical_order(g: &Graph, kernel: &Kernel) -> Vec<NodeId> {
    let set: std::collections::BTreeSet<NodeId> = kernel.members.iter().copied().collect();
    let mut seen = std::collections::BTreeSet::new();
    let mut order = Vec::with_capacity(kernel.members.len());
    for &root in kernel.outputs.iter().chain(&kernel.members) {
        if !set.contains(&root) || !seen.insert(root) {
            continue;
        }
        let mut stack = vec![(root, g.operands(root), 0usize)];
        while let Some((node, operands, next)) = stack.last_mut() {
            if let Some(&o) = operands.get(*next) {
                *next += 1;
                if set.contains(&o) && seen.insert(o) {
                    let ops = g.operands(o);
                    stack.push((o, ops, 0));
                }
            } else {
                order.push(*node);
                stack.pop();
            }
        }
    }
    order
}

fn lower_here(g: &Graph, kernel: &Kernel, opts: &LowerOptions, strategy: &Strategy) -> KernelSource {
    let mut bindings: Vec<Binding> =
        kernel.inputs.iter().map(|&node| Binding { node, output: false, texture: false }).collect();
    bindings.extend(kernel.outputs.iter().map(|&node| Binding { node, output: true, texture: false }));

    let regs = regions(g, kernel);
    let tiled =
        match kernel.kind {
            KernelKind::Loop if strategy.tiled_matmul => crate::matmul::plan(g, kernel, &regs, opts),
            _ => None,
        }
        .map(|t| {
            if strategy.vec4_operands {
                t
            } else {
                crate::matmul::TiledPlan { vec4_lhs: None, vec4_rhs: None, ..t }
            }
        });
    let coop = tiled
        .filter(|_| strategy.cooperative_matmul)
        .and_then(|t| crate::matmul::coop_plan(g, &t, opts, strategy.matmul_tiling));
    let subgroup = tiled
        .filter(|_| strategy.subgroup_matmul && coop.is_none())
        .and_then(|t| crate::matmul::subgroup_plan(g, kernel, &t, opts));
    if let Some(p) = &subgroup {
        for b in bindings.iter_mut().filter(|b| !b.output && p.textures.contains(&b.node)) {
            b.texture = true;
        }
    }
    // A loop kernel walks four adjacent elements per step where it can, reading and writing
    // whole vec4s of the bindings `loop_vec4` names.
    let loop_vec4 = match kernel.kind {
        KernelKind::Loop if tiled.is_none() => vec4_loop(g, kernel, &bindings, &regs, opts),
        _ => None,
    };
    // So does a row kernel with one invocation per row on a CPU adapter, where it can.
    let row_vec4 = row_quads(g, kernel, &bindings, &regs, opts);
    // The subgroup matmul reads its operands' bindings as vec4s, and may write its output so.
    let quads = |node: NodeId| [&loop_vec4, &row_vec4].iter().any(|v| v.as_ref().is_some_and(|v| v.contains(&node)));
    let vec4 = |node: NodeId| {
        subgroup.as_ref().is_some_and(|p| [&p.lhs, &p.rhs].iter().any(|v| v.as_ref().is_some_and(|v| v.leaf == node)))
            || subgroup.is_none()
                && tiled.is_some_and(|t| [t.vec4_lhs, t.vec4_rhs].iter().flatten().any(|v| v.leaf == node))
            || kernel.outputs.contains(&node)
                && match (&tiled, &subgroup) {
                    (Some(_), Some(p)) => p.vec4_store,
                    (Some(t), None) => crate::matmul::tiled_vec4_store(g, t, opts),
                    (None, _) => false,
                }
            || quads(node)
    };
    // f16 quads on a CPU adapter: pairs of words (see `f16_words`).
    let words = |node: NodeId| quads(node) && f16_words(g.ty(node).dtype, opts);

    let mut body = String::new();
    // `fg_tK(q)`: vec4 `q` of texture binding K, after the declarations.
    let mut texture_loads = String::new();
    for (k, b) in bindings.iter().enumerate() {
        let dt = g.ty(b.node).dtype;
        if b.texture {
            // Read as vec4s of its storage type by `fg_tK`, whatever the texture's format.
            let _ = writeln!(body, "@group(0) @binding({k}) var b{k}: texture_2d<f32>;");
            let _ = writeln!(
                texture_loads,
                "\nfn fg_t{k}(q: u32) -> vec4<{elem}> {{\n    return vec4<{elem}>(textureLoad(b{k}, vec2<u32>(q & {}u, q >> {}u), 0));\n}}",
                TEXTURE_ROW - 1,
                TEXTURE_ROW.trailing_zeros(),
                elem = storage_elem(dt, opts),
            );
            continue;
        }
        let elem = if words(b.node) {
            &quad_elem(dt, opts)
        } else if b.output && packed_f16(dt, opts) && matches!(kernel.kind, KernelKind::Row { .. }) {
            // Rows write single halves of shared words from different workgroups.
            "atomic<u32>"
        } else if vec4(b.node) {
            &format!("vec4<{}>", storage_elem(dt, opts))
        } else {
            storage_elem(dt, opts)
        };
        let _ = writeln!(body, "@group(0) @binding({k}) var<storage, read_write> b{k}: array<{elem}>;");
    }
    body.push_str(&texture_loads);
    body.push('\n');
    for (k, b) in bindings.iter().enumerate().filter(|(_, b)| !b.output) {
        let dt = g.ty(b.node).dtype;
        let load = if words(b.node) {
            format!("unpack2x16float(b{k}[i >> 2u][(i >> 1u) & 1u])[i & 1u]")
        } else if packed_f16(dt, opts) {
            format!("select(unpack2x16float(b{k}[i >> 1u]).x, unpack2x16float(b{k}[i >> 1u]).y, (i & 1u) == 1u)")
        } else if b.texture {
            load_value(dt, &format!("fg_t{k}(i >> 2u)[i & 3u]"))
        } else if vec4(b.node) {
            load_value(dt, &format!("b{k}[i >> 2u][i & 3u]"))
        } else {
            load_value(dt, &format!("b{k}[i]"))
        };
        let _ =
            writeln!(body, "fn v{}(i: u32) -> {} {{\n    return {load};\n}}\n", b.node.index(), crate::writer::vty(dt));
    }
    let row_reduces: Vec<NodeId> = match kernel.kind {
        KernelKind::Row { .. } => {
            kernel.members.iter().copied().filter(|&m| matches!(g.node(m).op, Op::Reduce { .. })).collect()
        }
        KernelKind::Loop | KernelKind::Attention { .. } => Vec::new(),
    };
    let row_deps = reduction_deps(g, kernel, &row_reduces);
    let row_scalars = row_scalars(g, kernel, &row_reduces, &row_deps);
    let uniform = uniform_scalars(g, kernel);
    // An attention kernel calls the element functions of its logits and `v` only.
    let (needed, row_scores) = match kernel.kind {
        KernelKind::Attention { logits } => {
            (Some(crate::attention::needed_members(g, kernel, logits)), crate::attention::row_scores(g, kernel, logits))
        }
        _ => (None, None),
    };
    for &m in kernel.members.iter().filter(|m| needed.as_ref().is_none_or(|n| n.contains(m))) {
        let ty = g.ty(m);
        let _ = writeln!(body, "// {} : {}", g.node(m).op.name(), ty);
        let _ = writeln!(body, "fn v{}(i: u32) -> {} {{", m.index(), vty(ty.dtype));
        if let Some(k) = row_reduces.iter().position(|&r| r == m) {
            // The workgroup reduced this row already; every use inside the kernel is in it.
            let _ = writeln!(body, "    return {};", crate::body::rounded(g, m, format!("fg_red{k}[0]")));
        } else if let Some(j) = row_scalars.iter().position(|&(s, _)| s == m) {
            // A per-row value computed from the row's reductions: computed once per row (in
            // `main`, right after the reductions it needs) instead of once per element.
            let _ = writeln!(body, "    return fg_rs{j};\n}}\n");
            let _ = writeln!(body, "var<private> fg_rs{j}: {};", vty(ty.dtype));
            let _ = writeln!(body, "fn c{}(i: u32) -> {} {{", m.index(), vty(ty.dtype));
            write_body(g, m, &mut body);
        } else if let Some(j) = uniform.iter().position(|&u| u == m) {
            // One value for the whole dispatch (an optimizer's bias correction): computed
            // once per invocation, at the start of `main`, instead of once per use.
            let _ = writeln!(body, "    return fg_us{j};\n}}\n");
            let _ = writeln!(body, "var<private> fg_us{j}: {};", vty(ty.dtype));
            let _ = writeln!(body, "fn fg_u{}(i: u32) -> {} {{", m.index(), vty(ty.dtype));
            write_body(g, m, &mut body);
        } else if row_scores == Some(m) {
            crate::attention::write_row_scores(g, kernel, m, opts.tiled_attention, &mut body);
        } else {
            write_body(g, m, &mut body);
        }
        body.push_str("}\n\n");
    }

    // Each output's region (its same-index chain) is computed once per element, in
    // registers, by `eN`; values reached through index changes are function calls.
    // A tiled matmul kernel computes its output's region as `eO_acc` instead (matmul.rs).
    let attention = matches!(kernel.kind, KernelKind::Attention { .. });
    for (o, region) in regs.iter().filter(|(o, _)| !attention && tiled.is_none_or(|t| t.output != *o)) {
        write_region(g, *o, region, None, &[], &mut body);
    }
    let (main, workgroups) = match &kernel.kind {
        KernelKind::Loop => match (&tiled, &subgroup) {
            (Some(t), Some(p)) => {
                let inv = crate::matmul::Invariants::of(g, kernel, t, &regs);
                crate::matmul::subgroup_main(g, &bindings, t, p, &regs, &inv, &mut body)
            }
            (Some(t), None) => {
                let inv = crate::matmul::Invariants::of(g, kernel, t, &regs);
                crate::matmul::tiled_main(g, kernel, &bindings, t, &regs, opts, strategy, coop, &inv, &mut body)
            }
            (None, _) => loop_main(g, kernel, &bindings, &regs, opts, loop_vec4.as_deref()),
        },
        KernelKind::Row { shape, axes } => {
            let quads = row_vec4
                .as_deref()
                .map(|vec4| RowQuads { quads: Quads { kernel, bindings: &bindings, vec4, opts }, regions: &regs });
            let reduces = RowReduces { reduces: &row_reduces, scalars: &row_scalars, deps: &row_deps };
            row_main(g, &bindings, reduces, shape, axes, opts, quads, &mut body)
        }
        KernelKind::Attention { logits } => {
            crate::attention::attention_main(g, kernel, &bindings, *logits, row_scores, opts)
        }
    };
    let main = with_uniform_scalars(main, &uniform);
    let mut wgsl = String::new();
    let uses_f16 = opts.f16_native && bindings.iter().any(|b| g.ty(b.node).dtype == DType::F16);
    // A cooperative-matrix kernel stages f16 tiles even where no binding is f16.
    if uses_f16 || coop.is_some() {
        wgsl.push_str("enable f16;\n");
        if coop.is_some() && opts.cooperative_matrix == Some(Cooperative::Native) {
            wgsl.push_str("enable wgpu_cooperative_matrix;\n");
        }
        wgsl.push('\n');
    }
    wgsl.push_str(&body);
    wgsl.push_str(&helpers_called(&[&body, &main]));
    wgsl.push_str(&main);
    let label = kernel.members.iter().map(|&m| g.node(m).op.name()).collect::<Vec<_>>().join("+");
    KernelSource { wgsl, bindings, workgroups, label }
}

/// The helpers of shaders/helpers.wgsl (each after a `// fn NAME` line) that `texts` call,
/// and those the included helpers call in turn, in the file's order.
fn helpers_called(texts: &[&str]) -> String {
    let helpers: Vec<(&str, String)> = HELPERS
        .split("// fn ")
        .skip(1)
        .filter_map(|h| {
            let name = h.lines().next()?.trim();
            let text: String = h.lines().skip(1).collect::<Vec<_>>().join("\n");
            (!name.is_empty()).then(|| (name, text.trim().to_string()))
        })
        .collect();
    let mut called = vec![false; helpers.len()];
    loop {
        let mut more = false;
        for (i, (name, _)) in helpers.iter().enumerate() {
            let call = format!("{name}(");
            let by_helper = helpers.iter().zip(&called).any(|((_, text), &c)| c && text.contains(&call));
            if !called[i] && (by_helper || texts.iter().any(|t| t.contains(&call))) {
                called[i] = true;
                more = true;
            }
        }
        if !more {
            break;
        }
    }
    let mut out = String::new();
    for ((_, text), _) in helpers.iter().zip(&called).filter(|(_, &c)| c) {
        let _ = writeln!(out, "{text}\n");
    }
    out
}

/// Writes `fn eO(i) -> T`, output `o`'s region computed once per element. With
/// `acc = Some(m)` it writes `fn eO_acc(i, acc) -> T` instead, the same region with member
/// `m`'s value given as `acc` (the tiled matmul's accumulator).
///
/// `given` (with `acc` only) are values the region reads by element function that the caller
/// passes in instead, as parameters `hN` after `acc` (see `matmul::Invariants`).
pub(crate) fn write_region(
    g: &Graph,
    o: NodeId,
    region: &[NodeId],
    acc: Option<NodeId>,
    given: &[NodeId],
    body: &mut String,
) {
    let t = vty(g.ty(o).dtype);
    match acc {
        Some(m) => {
            let params: String = given.iter().map(|n| format!(", h{}: {}", n.index(), vty(g.ty(*n).dtype))).collect();
            let _ = writeln!(body, "fn e{}_acc(i: u32, acc: {}{params}) -> {t} {{", o.index(), vty(g.ty(m).dtype));
        }
        None => {
            let _ = writeln!(body, "fn e{}(i: u32) -> {t} {{", o.index());
        }
    }
    for stmt in region_stmts(g, region, acc) {
        let text = match stmt {
            RegionStmt::Read(p) if given.contains(&p) => format!("let y{0} = h{0};", p.index()),
            RegionStmt::Def(n, _) if given.contains(&n) => format!("let x{0} = h{0};", n.index()),
            _ => stmt.text(""),
        };
        let _ = writeln!(body, "    {text}");
    }
    let _ = writeln!(body, "    return x{};\n}}\n", o.index());
}

/// One statement of a region's computation of element `i` (see [`region_stmts`]).
enum RegionStmt {
    /// `let yP = vP(i);`: element `i` of a value from outside the region.
    Read(NodeId),
    /// `let xN = EXPR;`: region member `N`; `EXPR` names `xP`, `yP` and `i`.
    Def(NodeId, String),
}

impl RegionStmt {
    /// Whether the statement takes its value from an element function (`vN(i)`): a read
    /// from outside the region, or a member that is not elementwise (a broadcast, a view).
    fn is_call(&self) -> bool {
        match self {
            RegionStmt::Read(_) => true,
            RegionStmt::Def(n, expr) => *expr == format!("v{}(i)", n.index()),
        }
    }

    /// The node whose element the statement names (`yP` or `xN`).
    fn node(&self) -> NodeId {
        match self {
            RegionStmt::Read(p) => *p,
            RegionStmt::Def(n, _) => *n,
        }
    }

    /// The statement with every name it defines or uses (`xN`, `yP`, `i`) suffixed by `sfx`,
    /// so that several elements can be computed side by side.
    fn text(&self, sfx: &str) -> String {
        match self {
            RegionStmt::Read(p) => format!("let y{0}{sfx} = v{0}(i{sfx});", p.index()),
            RegionStmt::Def(n, expr) => {
                let expr = if sfx.is_empty() { expr.clone() } else { suffix_names(expr, sfx) };
                format!("let x{}{sfx} = {expr};", n.index())
            }
        }
    }
}

/// `expr` with `sfx` appended to each name `xN`, `yN` and `i` in it (the names a region
/// statement uses; everything else in it is a literal, an operator or a function call).
fn suffix_names(expr: &str, sfx: &str) -> String {
    let mut out = String::with_capacity(expr.len() + 16);
    let b = expr.as_bytes();
    let mut k = 0;
    while k < b.len() {
        let c = b[k];
        if c.is_ascii_alphanumeric() || c == b'_' {
            let start = k;
            while k < b.len() && (b[k].is_ascii_alphanumeric() || b[k] == b'_') {
                k += 1;
            }
            let word = &expr[start..k];
            out.push_str(word);
            // Digits belong to the word, so a literal (`1e-4f`, `0x80000000u`) is one word
            // and never a name.
            let named = word == "i"
                || (word.len() > 1
                    && (word.starts_with('x') || word.starts_with('y'))
                    && word[1..].bytes().all(|d| d.is_ascii_digit()));
            if named {
                out.push_str(sfx);
            }
        } else {
            out.push(c as char);
            k += 1;
        }
    }
    out
}

/// The statements computing element `i` of a region, in order. Element `i` of a value
/// outside the region (a loaded input, a broadcast, a reduction) is read once, just before
/// its first use, and named `y{p}`, however many members use it: each call is a load, and a
/// driver may not merge loads from a read-write buffer (lavapipe: 11 loads of the 20-op
/// chain's two inputs per element become 2). With `acc = Some(m)`, member `m` is `acc`.
/// The values a region reads through element functions (`vP(i)`): those it reads from
/// outside, and its members that are not elementwise (broadcasts, views, reductions).
pub(crate) fn region_calls(g: &Graph, region: &[NodeId], acc: Option<NodeId>) -> Vec<NodeId> {
    region_stmts(g, region, acc).into_iter().filter(RegionStmt::is_call).map(|s| s.node()).collect()
}

fn region_stmts(g: &Graph, region: &[NodeId], acc: Option<NodeId>) -> Vec<RegionStmt> {
    let mut stmts = Vec::new();
    let mut read: Vec<NodeId> = Vec::new();
    for &n in region {
        let node = g.node(n);
        let same = same_index_operands(g, n);
        let expr = if Some(n) == acc {
            crate::body::rounded(g, n, "acc".to_string())
        } else if node.op.is_elementwise() || matches!(node.op, Op::Reshape { .. }) {
            let args: Vec<String> = g
                .operands(n)
                .iter()
                .map(|&p| {
                    if same.contains(&p) && region.contains(&p) {
                        format!("x{}", p.index())
                    } else {
                        if !read.contains(&p) {
                            read.push(p);
                            stmts.push(RegionStmt::Read(p));
                        }
                        format!("y{}", p.index())
                    }
                })
                .collect();
            if node.op.is_elementwise() {
                elementwise_expr(g, n, &args)
            } else {
                args[0].clone()
            }
        } else {
            format!("v{}(i)", n.index())
        };
        stmts.push(RegionStmt::Def(n, expr));
    }
    stmts
}

/// Grid-stride steps each invocation of a plain loop kernel (see `loop_main`: one element, or
/// one packed f16 word, per step) takes on a CPU adapter, where a workgroup costs a call
/// looping over its SIMD batches (see [`loop_workgroups`]).
///
/// Since the eighteenth session; before it these kernels dispatched one invocation per step
/// up to 1024 workgroups and then strided, so a kernel below 2^18 steps took one step per
/// invocation. On lavapipe (`time_wgsl`, the f16 chain's kernel, all counts in turn per round,
/// medians): 196,608 elements (a transformer's `[256, 768]` activations) 5.27 ms with 1 step
/// per invocation, 3.47 / 3.33 / 3.36 / 3.28 / 3.13 with 4 / 8 / 16 / 32 / 96; 1 Mi elements
/// 27.4 / 20.8 / 17.8 / 17.0 / 15.9 / 15.7 ms with 1 / 2 / 4 / 8 / 16 / 32; 16 Mi elements
/// 394 / 254 / 231 / 217 / 206 ms with 1 / 4 / 8 / 16 / 32.
pub const CPU_PLAIN_STEPS: u64 = 32;

/// Grid-stride steps each invocation of an interleaved loop kernel (see `interleaved_main`:
/// four elements per step) takes on a CPU adapter (see [`loop_workgroups`]).
///
/// Since the eighteenth session; before it these kernels were capped at 1024 workgroups, so
/// the steps per invocation grew with the kernel. On lavapipe (`time_wgsl`, the 20-op chain's
/// kernel, all counts in turn per round, medians) what mattered was the steps per invocation,
/// not the workgroups, and unlike the plain form's, four was best: 16 Mi elements (4 Mi vec4
/// steps) took 112.6, 58.6, 52.5, 71.0 ms with 16, 8, 4, 1 steps per invocation (1024, 2048,
/// 4096, 16384 workgroups); 4 Mi elements 27.6, 13.7, 12.1, 14.6, 18.1 ms with 16, 8, 4, 2, 1
/// (256 to 4096 workgroups); 32 Mi elements 257, 160, 126, 140, 172 ms with 16, 8, 4, 2, 1
/// (2048 to 32768). The copy alike (16 Mi: 26.1 ms with 16 steps, 15.3 with 4). A constant
/// trip count of 4 instead of the loop's bound measured the same.
pub const CPU_LOOP_STEPS: u64 = 4;

/// The fewest workgroups a loop kernel dispatches on a CPU adapter where it has invocations
/// for them, so that it can spread over a CPU's threads (lavapipe runs one per core). A guard
/// for CPUs with more cores than the two this was measured on, where the counts above leave
/// small kernels a handful of workgroups; not measured.
pub const CPU_MIN_WORKGROUPS: u64 = 16;

/// Workgroups of 256 invocations for a loop kernel of `invocations` grid-stride steps, each
/// invocation taking `steps` of them on a CPU adapter (one on a GPU), and at least
/// [`CPU_MIN_WORKGROUPS`] where there are invocations for them.
fn loop_workgroups(opts: &LowerOptions, invocations: u64, steps: u64) -> u64 {
    let one_step = invocations.div_ceil(WORKGROUP_SIZE as u64);
    if opts.cpu {
        invocations.div_ceil(WORKGROUP_SIZE as u64 * steps).max(one_step.min(CPU_MIN_WORKGROUPS))
    } else {
        one_step
    }
}

pub(crate) const MAIN_ARGS: &str =
    "@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32";

/// One invocation per output element (per word for packed f16).
fn loop_main(
    g: &Graph,
    kernel: &Kernel,
    bindings: &[Binding],
    regions: &[(NodeId, Vec<NodeId>)],
    opts: &LowerOptions,
    vec4: Option<&[NodeId]>,
) -> (String, u64) {
    // On a CPU adapter, serial reductions inside the kernel count against the loop budget of
    // an invocation: fewer elements side by side and per invocation where they are long.
    let serial = serial_steps(g, kernel);
    let fits = |elements: u64| within_budget(opts, serial, elements);
    let ilp = loop_ilp(g, kernel, opts);
    let steps = |most: u64, per: u64| (1..=most).rev().find(|&s| fits(s * per)).unwrap_or(1);
    if let Some(r) =
        interleaved_main(g, kernel, bindings, regions, opts, (ilp, steps(CPU_LOOP_STEPS, ilp as u64)), vec4)
    {
        return r;
    }
    let mut invocations = 0u64;
    let mut body = String::new();
    let outputs: Vec<(usize, &Binding)> = bindings.iter().enumerate().filter(|(_, b)| b.output).collect();
    // Several plain outputs: every value of element `t` is computed before any is stored, so
    // an output written over an input it shares the element with (a parameter updated in
    // place) cannot change what another output reads.
    let plain: Vec<(usize, &Binding)> =
        outputs.iter().copied().filter(|(_, b)| !packed_f16(g.ty(b.node).dtype, opts)).collect();
    let two_phase = plain.len() > 1;
    if two_phase {
        // Outputs of one length (the interleaved form takes kernels whose outputs all have
        // one; sibling merges make ragged ones) share element `t`: what their regions share
        // is read or computed once (an optimizer's new moment, stored, and the new weight
        // computed from it), not once per output's element function.
        let mut lengths: Vec<usize> = plain.iter().map(|(_, b)| g.ty(b.node).shape.numel()).collect();
        lengths.sort_unstable();
        lengths.dedup();
        for n in lengths {
            let class: Vec<(usize, &Binding)> =
                plain.iter().copied().filter(|(_, b)| g.ty(b.node).shape.numel() == n).collect();
            for (k, b) in &class {
                let _ = writeln!(body, "        var r{k}: {};", vty(g.ty(b.node).dtype));
            }
            if let [(k, b)] = class.as_slice() {
                let _ = writeln!(body, "        if (t < {n}u) {{ r{k} = e{}(t); }}", b.node.index());
                continue;
            }
            let stmts: Vec<Vec<RegionStmt>> = class
                .iter()
                .map(|(_, b)| {
                    let region = regions.iter().find(|(o, _)| *o == b.node).map_or(&[][..], |(_, r)| r.as_slice());
                    region_stmts(g, region, None)
                })
                .collect();
            let _ = writeln!(body, "        if (t < {n}u) {{");
            let _ = writeln!(body, "            let i_0 = t;");
            emit_elements(&mut body, g, &merged_stmts(stmts.iter().map(Vec::as_slice)), 1, None, "            ");
            for (k, b) in &class {
                let _ = writeln!(body, "            r{k} = x{}_0;", b.node.index());
            }
            let _ = writeln!(body, "        }}");
        }
    }
    for (k, b) in outputs {
        let ty = g.ty(b.node);
        let n = ty.shape.numel() as u64;
        let f = format!("e{}", b.node.index());
        if packed_f16(ty.dtype, opts) {
            let words = n.div_ceil(2);
            invocations = invocations.max(words);
            let _ = writeln!(body, "        if (t < {words}u) {{");
            let _ = writeln!(body, "            let e = 2u * t;");
            let _ = writeln!(body, "            var hi = 0.0f;");
            let _ = writeln!(body, "            if (e + 1u < {n}u) {{ hi = {f}(e + 1u); }}");
            let _ = writeln!(body, "            b{k}[t] = pack2x16float(vec2<f32>({f}(e), hi));");
            let _ = writeln!(body, "        }}");
        } else {
            invocations = invocations.max(n);
            let value = if two_phase { format!("r{k}") } else { format!("{f}(t)") };
            let _ = writeln!(body, "        if (t < {n}u) {{ b{k}[t] = {}; }}", store_value(ty.dtype, &value));
        }
    }
    // A grid-stride loop: on a GPU one invocation per element, so it runs once. A CPU
    // adapter pays for every workgroup (lavapipe runs each as a call looping over its SIMD
    // batches), so there each invocation strides over CPU_PLAIN_STEPS elements (one element
    // per invocation against a stride: 0.57 vs 2.2 GB/s for a 16 Mi-element copy, 0.24 vs
    // 0.70 GB/s for the 20-op chain on lavapipe, sixth session).
    let workgroups = loop_workgroups(opts, invocations, steps(CPU_PLAIN_STEPS, 1));
    let mut main = grid_stride_main(invocations, "stride");
    main.push_str(&body);
    main.push_str("    }\n}\n");
    (main, workgroups)
}

/// Elements a loop kernel computes side by side ([`CPU_INTERLEAVE`]), or one where a CPU
/// adapter's loop budget cannot take the kernel's serial reductions for that many.
fn loop_ilp(g: &Graph, kernel: &Kernel, opts: &LowerOptions) -> usize {
    if within_budget(opts, serial_steps(g, kernel), CPU_INTERLEAVE as u64) {
        CPU_INTERLEAVE
    } else {
        1
    }
}

/// Whether `times` walks of `serial` iterations fit one invocation: always on a GPU, within
/// [`CPU_LOOP_BUDGET`] on a CPU adapter.
fn within_budget(opts: &LowerOptions, serial: u64, times: u64) -> bool {
    !opts.cpu || serial.saturating_mul(times) <= CPU_LOOP_BUDGET
}

/// Serial loop iterations a loop kernel spends on one element: the lengths of the
/// reductions it computes inside (small ones, or of another shape than a row kernel could
/// take), each once per element.
fn serial_steps(g: &Graph, kernel: &Kernel) -> u64 {
    kernel
        .members
        .iter()
        .filter_map(|&m| match &g.node(m).op {
            Op::Reduce { axes, .. } => {
                let dims = g.ty(g.operands(m)[0]).shape.dims().to_vec();
                Some(axes.iter().map(|&a| dims[a] as u64).product::<u64>())
            }
            _ => None,
        })
        .sum()
}

/// Elements a loop kernel computes side by side per invocation on a CPU adapter.
///
/// A CPU adapter runs an invocation batch as one SIMD instruction stream, so a region's
/// chain of dependent operations is bound by its latency (on lavapipe the 20-op chain's five
/// `tanh`s ran at a fraction of the FPU's throughput). Four independent elements, loaded
/// first and computed statement by statement in turn, fill the pipeline: the chain went from
/// 0.75 to 1.5–1.66 GB/s on lavapipe (36–42% to 59–69% of the copy in the same run; 8 was
/// slower than 4, 3 and 6 no better). A GPU hides latency by running other invocations; it
/// takes four elements per invocation (a vec4 where it can) for the bytes in flight, and only
/// where there are at least [`GPU_INTERLEAVE_MIN`] elements.
pub const CPU_INTERLEAVE: usize = 4;

/// The fewest output elements for which a loop kernel on a GPU computes four per invocation:
/// below it the kernel keeps one per invocation, since fewer invocations than the GPU has
/// lanes leave it idle, most of all where each element loops over a reduced axis (an unfused
/// transformer's row sums over 256×768 went from 0.21 to 0.36 ms on an H100 with four per
/// invocation). 2^20 is four per lane of an H100 (132 multiprocessors × 2048).
pub const GPU_INTERLEAVE_MIN: u64 = 1 << 20;

/// A loop kernel's outputs for the interleaved forms, where every output is unpacked and of
/// one length `n` (> 0): `n` and, per output, its binding index, node, dtype and region
/// statements.
type LoopParts = (u64, Vec<(usize, NodeId, DType, Vec<RegionStmt>)>);

fn loop_parts(
    g: &Graph,
    bindings: &[Binding],
    regions: &[(NodeId, Vec<NodeId>)],
    opts: &LowerOptions,
) -> Option<LoopParts> {
    let outs: Vec<(usize, &Binding)> = bindings.iter().enumerate().filter(|(_, b)| b.output).collect();
    let n = g.ty(outs.first()?.1.node).shape.numel() as u64;
    if n == 0 || (!opts.cpu && n < GPU_INTERLEAVE_MIN) {
        return None;
    }
    // Every output unpacked and of the same length (the plain form guards each store by
    // its own length), each with its region; a packed output only as whole words, in quads
    // (see `f16_words`).
    let quads = opts.cpu && n.is_multiple_of(4) && CPU_INTERLEAVE == 4;
    let mut parts = Vec::new();
    for &(k, b) in &outs {
        let ty = g.ty(b.node);
        if (packed_f16(ty.dtype, opts) && !quads) || ty.shape.numel() as u64 != n {
            return None;
        }
        let region = &regions.iter().find(|(o, _)| *o == b.node)?.1;
        parts.push((k, b.node, ty.dtype, region_stmts(g, region, None)));
    }
    Some((n, parts))
}

/// Whether a binding of `dtype` can be read and written as `vec4`s of its storage type.
pub(crate) fn vec4_storage(dtype: DType, opts: &LowerOptions) -> bool {
    matches!(dtype, DType::F32 | DType::I32 | DType::U32) || (dtype == DType::F16 && opts.f16_native)
}

/// The view of a value loaded at an element index by a region statement (a read from
/// outside the region, or a layout member such as a broadcast), where the four adjacent
/// elements `i … i+3` (`i` a multiple of 4) of `node` are the four adjacent elements of its
/// binding from a multiple of 4: the last axis contiguous and of a length divisible by 4,
/// every other stride and the offset multiples of 4, the binding's length too.
fn quad_view(g: &Graph, kernel: &Kernel, opts: &LowerOptions, stmt: &RegionStmt) -> Option<StridedView> {
    if !stmt.is_call() {
        return None;
    }
    let node = stmt.node();
    let last = *g.ty(node).shape.dims().last()?;
    let view = strided_view(g, kernel, node)?;
    let (&inner, outer) = view.strides.split_last()?;
    let leaf = g.ty(view.leaf);
    let aligned = inner == 1
        && last.is_multiple_of(4)
        && view.offset.is_multiple_of(4)
        && outer.iter().all(|s| s.is_multiple_of(4));
    (aligned && leaf.shape.numel().is_multiple_of(4) && quad_storage(leaf.dtype, opts)).then_some(view)
}

/// The binding index (a WGSL expression) of element `i` of a value of shape `dims` seen
/// through `view`.
fn view_index(view: &StridedView, dims: &[usize], i: &str) -> String {
    if view.is_identity(dims) {
        return i.to_string();
    }
    let mut terms = Vec::new();
    if view.offset > 0 {
        terms.push(format!("{}u", view.offset));
    }
    let mut inner = 1usize;
    for (d, &len) in dims.iter().enumerate().rev() {
        let s = view.strides[d];
        if s > 0 {
            let c = match (inner, d == 0) {
                (1, true) => i.to_string(),
                (1, false) => format!("({i} % {len}u)"),
                (_, true) => format!("({i} / {inner}u)"),
                _ => format!("(({i} / {inner}u) % {len}u)"),
            };
            terms.push(if s == 1 { c } else { format!("{c} * {s}u") });
        }
        inner *= len;
    }
    if terms.is_empty() {
        "0u".to_string()
    } else {
        terms.join(" + ")
    }
}

/// The input bindings whose `vec4`s a quad walk over `stmts` reads (see [`quad_view`]).
fn quad_leaves(g: &Graph, kernel: &Kernel, opts: &LowerOptions, stmts: &[RegionStmt]) -> Vec<NodeId> {
    let mut leaves = Vec::new();
    for stmt in stmts {
        if let Some(v) = quad_view(g, kernel, opts, stmt) {
            if !leaves.contains(&v.leaf) {
                leaves.push(v.leaf);
            }
        }
    }
    leaves
}

/// The bindings a CPU adapter's loop kernel reads and writes as `vec4`s, when its outputs
/// are of one length divisible by 4 (see [`interleaved_main`]): every output whose dtype
/// allows it and every input its regions load four adjacent elements of at a time (see
/// [`quad_view`]: at their own index, or broadcast along the rows). `None` where nothing
/// would be.
fn vec4_loop(
    g: &Graph,
    kernel: &Kernel,
    bindings: &[Binding],
    regions: &[(NodeId, Vec<NodeId>)],
    opts: &LowerOptions,
) -> Option<Vec<NodeId>> {
    let (n, parts) = loop_parts(g, bindings, regions, opts)?;
    // A vec4 is the four elements one step computes: only with four side by side (the
    // interleaved form falls back to scalar accesses otherwise, so the bindings must too;
    // a CPU adapter takes one at a time where the kernel's serial reductions are long).
    if n % 4 != 0 || (opts.cpu && CPU_INTERLEAVE != 4) || loop_ilp(g, kernel, opts) != 4 {
        return None;
    }
    let mut nodes: Vec<NodeId> = Vec::new();
    for (_, node, dtype, stmts) in &parts {
        if quad_storage(*dtype, opts) {
            nodes.push(*node);
        }
        for leaf in quad_leaves(g, kernel, opts, stmts) {
            if !nodes.contains(&leaf) {
                nodes.push(leaf);
            }
        }
    }
    (!nodes.is_empty()).then_some(nodes)
}

/// A loop kernel whose outputs are unpacked and of one length (see [`loop_parts`]),
/// computing `ilp` elements of each per grid-stride step: every value the regions read from
/// outside is loaded first, then each region statement runs for the elements in turn, then
/// the elements are stored. On a CPU adapter each invocation takes [`CPU_LOOP_STEPS`]
/// steps; on a GPU one invocation per step, so the loop runs once, and the `ilp` loads
/// of each binding are in flight together: with one element per invocation an f32 copy of
/// 64 Mi elements moved 652 GB/s on an H100 (Vulkan), about a fifth of its bandwidth, each
/// invocation having a single 4-byte load outstanding.
///
/// With `vec4` (the length a multiple of 4, `ilp` 4) the elements are the four adjacent
/// ones `4t … 4t + 3`, and the bindings `vec4` names are read and written a `vec4` at a
/// time: on lavapipe every load or store is a loop over the SIMD lanes, so one per four
/// elements instead of four made a copy 3.2× and the 20-op chain 2.1× faster (hand-written
/// kernels, 16 Mi elements). Otherwise the elements are `t, t + stride, …`; those past the
/// end are computed on the last element's index (every load in range) and not stored.
fn interleaved_main(
    g: &Graph,
    kernel: &Kernel,
    bindings: &[Binding],
    regions: &[(NodeId, Vec<NodeId>)],
    opts: &LowerOptions,
    (ilp, cpu_steps): (usize, u64),
    vec4: Option<&[NodeId]>,
) -> Option<(String, u64)> {
    let (n, parts) = loop_parts(g, bindings, regions, opts)?;
    let vec4 = vec4.filter(|_| ilp == 4 && n % 4 == 0);
    // A packed output is written in whole words, by quads only.
    if vec4.is_none() && parts.iter().any(|(_, _, dtype, _)| packed_f16(*dtype, opts)) {
        return None;
    }
    // All outputs have one length, so element `i` of a value is the same in every region:
    // a value read or a member shared by several regions is loaded or computed once.
    let stmts = merged_stmts(parts.iter().map(|(.., stmts)| stmts.as_slice()));
    let steps = if vec4.is_some() { n / 4 } else { n };
    let per_step = if vec4.is_some() { 1 } else { ilp as u64 };
    let workgroups = loop_workgroups(opts, steps.div_ceil(per_step), cpu_steps);
    let step = if vec4.is_some() { "stride".to_string() } else { format!("{ilp}u * stride") };
    let mut main = grid_stride_main(steps, &step);
    for u in 0..ilp {
        let i = if vec4.is_some() { format!("4u * t + {u}u") } else { format!("min(t + {u}u * stride, {}u)", n - 1) };
        let _ = writeln!(main, "        let i_{u} = {i};");
    }
    let quad = |node: NodeId| vec4.is_some_and(|v| v.contains(&node));
    let quads = vec4.map(|vec4| Quads { kernel, bindings, vec4, opts });
    emit_elements(&mut main, g, &stmts, ilp, quads, "        ");
    // Every value is computed before any is stored, so an output written over an input it
    // shares the element with (a parameter updated in place) cannot change what another
    // output reads.
    for (k, node, dtype, _) in &parts {
        let raw: Vec<String> = (0..ilp).map(|u| format!("x{}_{u}", node.index())).collect();
        if quad(*node) {
            let _ = writeln!(main, "        b{k}[t] = {};", quad_value(*dtype, opts, &raw));
            continue;
        }
        let values: Vec<String> = raw.iter().map(|v| store_value(*dtype, v)).collect();
        for (u, v) in values.iter().enumerate() {
            if vec4.is_some() {
                let _ = writeln!(main, "        b{k}[i_{u}] = {v};");
            } else {
                let _ = writeln!(main, "        if (t + {u}u * stride < {n}u) {{ b{k}[i_{u}] = {v}; }}");
            }
        }
    }
    main.push_str("    }\n}\n");
    Some((main, workgroups))
}

/// The statements of several regions computed at one element index, each read and each
/// member once: the reads first, then the members in region order.
fn merged_stmts<'s>(regions: impl Iterator<Item = &'s [RegionStmt]>) -> Vec<&'s RegionStmt> {
    let mut reads: Vec<&RegionStmt> = Vec::new();
    let mut defs: Vec<&RegionStmt> = Vec::new();
    for stmt in regions.flatten() {
        let list = if matches!(stmt, RegionStmt::Read(_)) { &mut reads } else { &mut defs };
        if !list.iter().any(|s| s.node() == stmt.node()) {
            list.push(stmt);
        }
    }
    reads.extend(defs);
    reads
}

/// Opens a loop over a row four adjacent elements at a time, `i_0 … i_3` their indices.
fn quad_row_step(main: &mut String, row_len: usize, indent: &str) {
    let _ = writeln!(main, "{indent}for (var e = 0u; e < {row_len}u; e = e + 4u) {{");
    let _ = writeln!(main, "{indent}    let i_0 = fg_elem(row, e);");
    for u in 1..4 {
        let _ = writeln!(main, "{indent}    let i_{u} = i_0 + {u}u;");
    }
}

/// What a walk over four adjacent elements needs to read `vec4`s: the kernel (for the views
/// of its values, see [`quad_view`]), its bindings and those declared `vec4`.
#[derive(Clone, Copy)]
struct Quads<'a> {
    kernel: &'a Kernel,
    bindings: &'a [Binding],
    vec4: &'a [NodeId],
    opts: &'a LowerOptions,
}

/// Emits region statements for `ilp` elements side by side (named `_0`, `_1`, …; the
/// caller defines `i_0`, `i_1`, …). With `quads` the elements are four adjacent ones from a
/// multiple of 4, and a load whose view is a `vec4` of a binding in `quads.vec4` (a read at
/// the element's own index, or a broadcast of a row vector along the rows) loads that `vec4`
/// once (`vqN`) and takes its components.
fn emit_elements(main: &mut String, g: &Graph, stmts: &[&RegionStmt], ilp: usize, quads: Option<Quads>, indent: &str) {
    for stmt in stmts {
        let node = stmt.node();
        let view = quads.and_then(|q| quad_view(g, q.kernel, q.opts, stmt).filter(|v| q.vec4.contains(&v.leaf)));
        if let (Some(q), Some(view)) = (quads, view) {
            let k = q.bindings.iter().position(|b| b.node == view.leaf).expect("a vec4 is read from a binding");
            let at = view_index(&view, g.ty(node).shape.dims(), "i_0");
            let at = if at.contains(" + ") { format!("({at})") } else { at };
            let dtype = g.ty(view.leaf).dtype;
            let quad = format!("b{k}[{at} >> 2u]");
            let quad = if f16_words(dtype, q.opts) { format!("fg_f16x4_from_words({quad})") } else { quad };
            let _ = writeln!(main, "{indent}let vq{} = {quad};", node.index());
            let name = if matches!(stmt, RegionStmt::Read(_)) { "y" } else { "x" };
            for u in 0..ilp {
                let v = format!("vq{}[{u}u]", node.index());
                let v = if f16_words(dtype, q.opts) { v } else { load_value(dtype, &v) };
                let _ = writeln!(main, "{indent}let {name}{}_{u} = {v};", node.index());
            }
            continue;
        }
        for u in 0..ilp {
            let _ = writeln!(main, "{indent}{}", stmt.text(&format!("_{u}")));
        }
    }
}

/// The head of a loop kernel's `main`: a grid-stride loop over `t` below `end`, advancing by
/// `step` (an expression in `stride`, the invocations of the whole dispatch), left open.
fn grid_stride_main(end: u64, step: &str) -> String {
    let mut main = String::new();
    let _ = writeln!(main, "@compute @workgroup_size({WORKGROUP_SIZE})");
    let _ = writeln!(main, "fn main({MAIN_ARGS}) {{");
    let _ = writeln!(main, "    let stride = nwg.x * nwg.y * {WORKGROUP_SIZE}u;");
    let _ = writeln!(
        main,
        "    for (var t = (wid.y * nwg.x + wid.x) * {WORKGROUP_SIZE}u + lid; t < {end}u; t = t + {step}) {{"
    );
    main
}

/// A stored element `v` as the value kernels compute with (bools are stored as `u32`, f16
/// values computed in f32).
fn load_value(dtype: DType, v: &str) -> String {
    match dtype {
        DType::Bool => format!("{v} != 0u"),
        DType::F16 => format!("f32({v})"),
        _ => v.to_string(),
    }
}

pub(crate) fn store_value(dtype: DType, v: &str) -> String {
    match dtype {
        DType::Bool => format!("select(0u, 1u, {v})"),
        DType::F16 => format!("f16({v})"),
        _ => v.to_string(),
    }
}

/// Writes element `idx` (an expression) of output binding `k` from a row kernel.
fn row_store(main: &mut String, k: usize, dtype: DType, idx: &str, value: &str, opts: &LowerOptions, indent: &str) {
    if packed_f16(dtype, opts) {
        let _ = writeln!(main, "{indent}{{");
        let _ = writeln!(main, "{indent}    let w = ({idx}) >> 1u;");
        let _ = writeln!(main, "{indent}    let sh = (({idx}) & 1u) * 16u;");
        let _ = writeln!(main, "{indent}    let bits = pack2x16float(vec2<f32>({value}, 0.0f)) & 0xffffu;");
        let _ = writeln!(main, "{indent}    atomicAnd(&b{k}[w], ~(0xffffu << sh));");
        let _ = writeln!(main, "{indent}    atomicOr(&b{k}[w], bits << sh);");
        let _ = writeln!(main, "{indent}}}");
    } else {
        let _ = writeln!(main, "{indent}b{k}[{idx}] = {};", store_value(dtype, value));
    }
}

/// One workgroup per row of `shape` reduced over `axes`: each reduction in turn is
/// accumulated by the workgroup's invocations and combined by a tree in workgroup memory;
/// then the row's outputs are written.
#[allow(clippy::too_many_arguments)]
fn row_main(
    g: &Graph,
    bindings: &[Binding],
    red: RowReduces,
    shape: &[usize],
    axes: &[usize],
    opts: &LowerOptions,
    quads: Option<RowQuads>,
    body: &mut String,
) -> (String, u64) {
    let row_len: usize = axes.iter().map(|&a| shape[a]).product();
    let full: usize = shape.iter().product();
    let rows = full.checked_div(row_len).unwrap_or(0);
    // Many rows (or a CPU adapter): one invocation per row, no barriers. Few long rows: a
    // workgroup per row with a tree in workgroup memory.
    let per_thread = rows_per_thread(opts, rows, row_len, red.reduces.len() + 1);
    let wg = row_len.next_power_of_two().clamp(32, WORKGROUP_SIZE as usize);
    let kept: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a)).collect();
    // fg_elem(row, e): the linear index in `shape` of element `e` of row `row`.
    let _ = writeln!(body, "fn fg_elem(row: u32, e: u32) -> u32 {{");
    let kept_dims: Vec<usize> = kept.iter().map(|&a| shape[a]).collect();
    let red_dims: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
    let rc = unravel(body, &kept_dims, "row", "r");
    let ec = unravel(body, &red_dims, "e", "q");
    let mut coords = vec![String::from("0u"); shape.len()];
    for (n, &a) in kept.iter().enumerate() {
        coords[a] = rc[n].clone();
    }
    for (n, &a) in axes.iter().enumerate() {
        coords[a] = ec[n].clone();
    }
    let _ = writeln!(body, "    return {};\n}}\n", ravel(&coords, shape));
    if per_thread {
        let shape = (rows, row_len, full);
        return row_main_per_thread(g, bindings, red, shape, opts, quads, body);
    }
    for (k, &r) in red.reduces.iter().enumerate() {
        let _ = writeln!(body, "var<workgroup> fg_red{k}: array<{}, {wg}>;", vty(g.ty(r).dtype));
    }

    let mut main = String::new();
    // Subgroup arithmetic exists for f32, f16, i32 and u32 (not bool).
    let subgroups = opts.subgroups && red.reduces.iter().all(|&r| g.ty(r).dtype != DType::Bool);
    let _ = writeln!(main, "@compute @workgroup_size({wg})");
    if subgroups {
        let _ = writeln!(
            main,
            "fn main({MAIN_ARGS}, @builtin(subgroup_id) sg_id: u32, @builtin(num_subgroups) sg_count: u32, \
             @builtin(subgroup_invocation_id) sg_lane: u32) {{"
        );
    } else {
        let _ = writeln!(main, "fn main({MAIN_ARGS}) {{");
    }
    let _ = writeln!(main, "    let row = wid.y * nwg.x + wid.x;");
    let _ = writeln!(main, "    if (row >= {rows}u) {{ return; }}");
    let walk = RowWalk { len: row_len, start: "lid", step: wg, ilp: 1, quads: None };
    row_reductions(&mut main, g, red, walk, Some(subgroups));
    write_row_outputs(&mut main, g, bindings, (rows, row_len, full), ("lid", &wg.to_string(), true), opts, None);
    main.push_str("}\n");
    (main, rows as u64)
}

/// The row kernel with one invocation per row: each reduction is a serial loop whose result
/// stays in a private variable; no workgroup memory, no barriers.
#[allow(clippy::too_many_arguments)]
fn row_main_per_thread(
    g: &Graph,
    bindings: &[Binding],
    red: RowReduces,
    (rows, row_len, full): (usize, usize, usize),
    opts: &LowerOptions,
    quads: Option<RowQuads>,
    body: &mut String,
) -> (String, u64) {
    for (k, &r) in red.reduces.iter().enumerate() {
        let _ = writeln!(body, "var<private> fg_red{k}: array<{}, 1>;", vty(g.ty(r).dtype));
    }
    // Small workgroups, so that even a few hundred rows spread over every thread of a CPU
    // adapter (at least 16 workgroups where there are rows for them).
    let wg = (rows / 16).clamp(8, WORKGROUP_SIZE as usize).next_power_of_two().min(WORKGROUP_SIZE as usize);
    let mut main = String::new();
    let _ = writeln!(main, "@compute @workgroup_size({wg})");
    let _ = writeln!(main, "fn main({MAIN_ARGS}) {{");
    let _ = writeln!(main, "    let row = (wid.y * nwg.x + wid.x) * {wg}u + lid;");
    let _ = writeln!(main, "    if (row >= {rows}u) {{ return; }}");
    let ilp = if opts.cpu { CPU_INTERLEAVE } else { 1 };
    let walk = RowWalk { len: row_len, start: "0u", step: 1, ilp, quads: quads.filter(|_| ilp == 4) };
    row_reductions(&mut main, g, red, walk, None);
    write_row_outputs(&mut main, g, bindings, (rows, row_len, full), ("0u", "1", false), opts, walk.quads);
    main.push_str("}\n");
    (main, (rows as u64).div_ceil(wg as u64))
}

/// A row kernel's reductions (in member order), its row scalars with the reduction each
/// follows (see [`row_scalars`]) and, per member, the last reduction it needs (see
/// [`reduction_deps`]).
#[derive(Clone, Copy)]
struct RowReduces<'a> {
    reduces: &'a [NodeId],
    scalars: &'a [(NodeId, usize)],
    deps: &'a BTreeMap<NodeId, usize>,
}

/// How an invocation of a row kernel walks its row: elements `start, start + step, …`,
/// `ilp` of them side by side (each into its own partial).
#[derive(Clone, Copy)]
struct RowWalk<'a> {
    /// The row's length.
    len: usize,
    start: &'a str,
    step: usize,
    ilp: usize,
    /// Four adjacent elements per step, read (and written) as `vec4`s where they can be.
    quads: Option<RowQuads<'a>>,
}

/// What a row kernel walking its rows four adjacent elements at a time needs (see
/// [`row_quads`]): the kernel (for the regions its reductions read), its bindings, its
/// outputs' regions and the bindings read and written as `vec4`s.
#[derive(Clone, Copy)]
struct RowQuads<'a> {
    quads: Quads<'a>,
    regions: &'a [(NodeId, Vec<NodeId>)],
}

/// Whether a row kernel gives each row one invocation (many rows; on a CPU adapter, from
/// 16 rows) rather than a workgroup.
///
/// On a CPU adapter only where one invocation's walks over its row (`passes` of them, one
/// per reduction and one for the outputs) stay within [`CPU_LOOP_BUDGET`] iterations.
fn rows_per_thread(opts: &LowerOptions, rows: usize, row_len: usize, passes: usize) -> bool {
    let within = within_budget(opts, row_len as u64, passes as u64);
    (opts.cpu && rows >= 16 && within) || (!opts.cpu && rows >= 8192 && row_len <= 256)
}

/// Loop iterations one invocation of a kernel for a CPU adapter may take. Mesa's llvmpipe
/// and lavapipe end every loop of a shader invocation once they have run 65 535 iterations
/// between them (`LP_MAX_TGSI_LOOP_ITERATIONS`, a guard against infinite loops, shared by all
/// the loops of a shader), silently: 64 rows of 131 072 elements, one invocation per row,
/// summed about 99.7% of each row, and a softmax over them was wrong. Kept under it with a
/// margin for the kernel's other loops.
pub const CPU_LOOP_BUDGET: u64 = 60_000;

/// The statements computing `root` at an element index (its region, or a read of it when it
/// is not a member) and the name of its value (`xN` or `yN`).
fn stmts_at(g: &Graph, kernel: &Kernel, root: NodeId) -> (Vec<RegionStmt>, String) {
    let region = region_of(g, kernel, root);
    if region.is_empty() {
        (vec![RegionStmt::Read(root)], format!("y{}", root.index()))
    } else {
        (region_stmts(g, &region, None), format!("x{}", root.index()))
    }
}

/// The bindings a row kernel reads and writes as `vec4`s, where a CPU adapter gives each
/// row one invocation and a row is contiguous (reduced over the trailing axes) with a length
/// divisible by 4: each pass over a row then takes four adjacent elements per step (see
/// [`interleaved_main`] for why). Inputs the reductions' or the full outputs' regions load
/// four adjacent elements of at a time (see [`quad_view`]), and full outputs whose dtype
/// allows it; `None` where nothing would be.
fn row_quads(
    g: &Graph,
    kernel: &Kernel,
    bindings: &[Binding],
    regs: &[(NodeId, Vec<NodeId>)],
    opts: &LowerOptions,
) -> Option<Vec<NodeId>> {
    let KernelKind::Row { shape, axes } = &kernel.kind else { return None };
    let row_len: usize = axes.iter().map(|&a| shape[a]).product();
    let full: usize = shape.iter().product();
    let rows = full.checked_div(row_len)?;
    let trailing = axes.iter().enumerate().all(|(j, &a)| a + axes.len() == shape.len() + j);
    let passes = kernel.members.iter().filter(|&&m| matches!(g.node(m).op, Op::Reduce { .. })).count() + 1;
    if !opts.cpu || !rows_per_thread(opts, rows, row_len, passes) || !trailing || !row_len.is_multiple_of(4) {
        return None;
    }
    let full_out = |node: NodeId| g.ty(node).shape.numel() == full && full != rows;
    let mut stmts: Vec<RegionStmt> = Vec::new();
    for &m in &kernel.members {
        if matches!(g.node(m).op, Op::Reduce { .. }) {
            stmts.extend(stmts_at(g, kernel, g.operands(m)[0]).0);
        }
    }
    for (_, region) in regs.iter().filter(|(o, _)| full_out(*o)) {
        stmts.extend(region_stmts(g, region, None));
    }
    let mut nodes = quad_leaves(g, kernel, opts, &stmts);
    for b in bindings.iter().filter(|b| b.output && full_out(b.node)) {
        if quad_storage(g.ty(b.node).dtype, opts) {
            nodes.push(b.node);
        }
    }
    (!nodes.is_empty()).then_some(nodes)
}

/// Computes a row kernel's reductions into `fg_red{k}[0]` in turn, each followed by the row
/// scalars that need it. `workgroup`: `None` where one invocation owns the row, otherwise
/// whether the invocations sharing it combine their results with subgroup operations.
///
/// Two shapes of reduction pair take one pass over the row instead of two: a softmax's max
/// and sum of `exp(x - max)` (running max, rescaled sum) and a variance's sum of `x` and sum
/// of `(x - t)²` (Welford's mean and squared deviations). Each invocation's partial state
/// becomes the reductions' values by two ordinary combines, so the workgroup form needs no
/// second pass either: the maxima, then the sums rescaled to the row's max; the sums of `x`,
/// then `ssd + n (mean - t)²` (which sums to `Σ (x - t)²` for any `t`).
fn row_reductions(main: &mut String, g: &Graph, red: RowReduces, walk: RowWalk, workgroup: Option<bool>) {
    let RowReduces { reduces, scalars, deps } = red;
    let finish = |main: &mut String, kind: ReduceKind, k: usize, value: &str| match workgroup {
        None => {
            let _ = writeln!(main, "        fg_red{k}[0] = {value};");
        }
        Some(subgroups) => workgroup_combine(main, kind, k, value, walk.step, subgroups),
    };
    // A pair's second reduction may come later in member order (other reductions between);
    // it is computed with the first, and its row scalars still come in order.
    let mut done = vec![false; reduces.len()];
    let neg_inf = literal(DType::F32, f64::NEG_INFINITY);
    for k in 0..reduces.len() {
        if done[k] {
            write_row_scalars(main, scalars, k);
            continue;
        }
        done[k] = true;
        let open = |done: &[bool]| (k + 1..reduces.len()).filter(|&j| !done[j]).collect::<Vec<_>>();
        let softmax = open(&done).into_iter().find_map(|j| Some((j, softmax_pair(g, reduces[k], reduces[j])?)));
        // `t` is read right after reduction `k`, so it may need no later one.
        let centered = open(&done).into_iter().find_map(|j| {
            let (x, t) = centered_pair(g, reduces[k], reduces[j])?;
            deps.get(&t).is_none_or(|&r| r <= k).then_some((j, x, t))
        });
        if let Some((j, x)) = softmax {
            online_softmax(main, g, x, walk);
            finish(main, ReduceKind::Max, k, "m");
            let _ = writeln!(main, "        let row_max = fg_red{k}[0];");
            finish(main, ReduceKind::Sum, j, &format!("select(s * exp(m - row_max), s, m == {neg_inf})"));
            let _ = writeln!(main, "    }}");
            done[j] = true;
            write_row_scalars(main, scalars, k);
        } else if let Some((j, x, t)) = centered {
            welford(main, g, x, walk);
            finish(main, ReduceKind::Sum, k, "n * mean");
            let mut inner = String::new();
            write_row_scalars(&mut inner, scalars, k);
            for line in inner.lines() {
                let _ = writeln!(main, "    {line}");
            }
            let _ = writeln!(main, "        let t = v{}(fg_elem(row, 0u));", t.index());
            finish(main, ReduceKind::Sum, j, "ssd + n * (mean - t) * (mean - t)");
            let _ = writeln!(main, "    }}");
            done[j] = true;
        } else {
            let kind = reduce_partials(main, g, reduces[k], walk);
            finish(main, kind, k, "acc");
            let _ = writeln!(main, "    }}");
            write_row_scalars(main, scalars, k);
        }
    }
}

/// Combines each invocation's `value` of reduction `k` over the `wg` invocations sharing a
/// row into `fg_red{k}[0]`, visible to all of them afterwards: by subgroup operations and
/// one partial per subgroup (two barriers), or by a tree in workgroup memory.
fn workgroup_combine(main: &mut String, kind: ReduceKind, k: usize, value: &str, wg: usize, subgroups: bool) {
    let mut lines = Vec::new();
    if subgroups {
        let op = match kind {
            ReduceKind::Sum => "subgroupAdd",
            ReduceKind::Prod => "subgroupMul",
            ReduceKind::Max => "subgroupMax",
            ReduceKind::Min => "subgroupMin",
        };
        lines.push(format!("let part = {op}(acc);"));
        lines.push(format!("if (sg_lane == 0u) {{ fg_red{k}[sg_id] = part; }}"));
        lines.push("workgroupBarrier();".into());
        lines.push("if (lid == 0u) {".into());
        lines.push(format!("    var total = fg_red{k}[0];"));
        lines.push("    for (var j = 1u; j < sg_count; j = j + 1u) {".into());
        lines.push(format!("        total = {};", combine(kind, "total", &format!("fg_red{k}[j]"))));
        lines.push("    }".into());
        lines.push(format!("    fg_red{k}[0] = total;"));
        lines.push("}".into());
        lines.push("workgroupBarrier();".into());
    } else {
        lines.push(format!("fg_red{k}[lid] = acc;"));
        lines.push("workgroupBarrier();".into());
        lines.push(format!("for (var w = {}u; w > 0u; w = w >> 1u) {{", wg / 2));
        let sum = combine(kind, &format!("fg_red{k}[lid]"), &format!("fg_red{k}[lid + w]"));
        lines.push(format!("    if (lid < w) {{ fg_red{k}[lid] = {sum}; }}"));
        lines.push("    workgroupBarrier();".into());
        lines.push("}".into());
    }
    // `acc` is the plain reduction's own name; other values get a block of their own.
    let indent = if value == "acc" { "        " } else { "            " };
    if value != "acc" {
        let _ = writeln!(main, "        {{\n            let acc = {value};");
    }
    for line in lines {
        let _ = writeln!(main, "{indent}{line}");
    }
    if value != "acc" {
        let _ = writeln!(main, "        }}");
    }
}

/// Members of a loop or row kernel that hold one value for the whole dispatch: single
/// elements computed by elementwise ops from single-element inputs, literals and each
/// other (Adam's bias corrections `lr / (1 − β₁ᵗ)`, `√(1 − β₂ᵗ)` from the step counter),
/// in member order. `main` computes each once per invocation ([`with_uniform_scalars`])
/// instead of once per use per element. Literals (full, constant, iota) stay literals.
fn uniform_scalars(g: &Graph, kernel: &Kernel) -> Vec<NodeId> {
    if matches!(kernel.kind, KernelKind::Attention { .. }) {
        return Vec::new();
    }
    let members: BTreeSet<NodeId> = kernel.members.iter().copied().collect();
    let literal = |n: NodeId| matches!(g.node(n).op, Op::Full { .. } | Op::Constant { .. } | Op::Iota { .. });
    let mut out: Vec<NodeId> = Vec::new();
    for &m in &kernel.members {
        let node = g.node(m);
        let elementwise = matches!(node.op, Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. });
        if !elementwise || g.ty(m).shape.numel() != 1 {
            continue;
        }
        let uniform_operand =
            |o: &NodeId| g.ty(*o).shape.numel() == 1 && (!members.contains(o) || literal(*o) || out.contains(o));
        if g.operands(m).iter().all(uniform_operand) {
            out.push(m);
        }
    }
    out
}

/// `main` with the uniform scalars `uniform` computed first thing (in member order, each
/// after those it reads).
fn with_uniform_scalars(main: String, uniform: &[NodeId]) -> String {
    let Some(start) = main.find("fn main(").and_then(|at| main[at..].find('\n').map(|nl| at + nl + 1)) else {
        return main;
    };
    let mut out = main[..start].to_string();
    for (j, m) in uniform.iter().enumerate() {
        let _ = writeln!(out, "    fg_us{j} = fg_u{}(0u);", m.index());
    }
    out.push_str(&main[start..]);
    out
}

/// Members of a row kernel that hold one value per row and depend on the kernel's
/// reductions (mean, `rsqrt(var + eps)`, …), each with the index of the last reduction it
/// needs, in member (topological) order.
fn row_scalars(g: &Graph, kernel: &Kernel, reduces: &[NodeId], deps: &BTreeMap<NodeId, usize>) -> Vec<(NodeId, usize)> {
    let KernelKind::Row { shape, axes } = &kernel.kind else { return Vec::new() };
    let row_len: usize = axes.iter().map(|&a| shape[a]).product();
    let rows = shape.iter().product::<usize>().checked_div(row_len).unwrap_or(0);
    if row_len <= 1 {
        return Vec::new();
    }
    let kept: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a) && shape[*a] != 1).map(|a| shape[a]).collect();
    let mut out = Vec::new();
    for &m in &kernel.members {
        let Some(&last) = deps.get(&m).filter(|_| !reduces.contains(&m)) else { continue };
        let dims: Vec<usize> = g.ty(m).shape.dims().iter().copied().filter(|&d| d != 1).collect();
        if g.ty(m).shape.numel() == rows && dims == kept {
            out.push((m, last));
        }
    }
    out
}

/// For every member of a kernel that depends on one of `reduces` inside it: the index of the
/// last such reduction (a reduction counts itself).
fn reduction_deps(g: &Graph, kernel: &Kernel, reduces: &[NodeId]) -> BTreeMap<NodeId, usize> {
    let mut last: BTreeMap<NodeId, usize> = BTreeMap::new();
    for &m in &kernel.members {
        let own = reduces.iter().position(|&r| r == m);
        let dep = g.operands(m).iter().filter_map(|o| last.get(o).copied()).max();
        if let Some(k) = own.into_iter().chain(dep).max() {
            last.insert(m, k);
        }
    }
    last
}

/// Computes, right after reduction `k`, the row scalars that need it last.
fn write_row_scalars(main: &mut String, scalars: &[(NodeId, usize)], k: usize) {
    for (j, &(m, after)) in scalars.iter().enumerate() {
        if after == k {
            let _ = writeln!(main, "    fg_rs{j} = c{}(row);", m.index());
        }
    }
}

/// The reduced axes where `a` and `b` are f32 reductions of the given kinds over the same
/// axes.
fn f32_pair(g: &Graph, (a, ka): (NodeId, ReduceKind), (b, kb): (NodeId, ReduceKind)) -> Option<&[usize]> {
    let (Op::Reduce { kind: x, axes: xa, .. }, Op::Reduce { kind: y, axes: xb, .. }) = (&g.node(a).op, &g.node(b).op)
    else {
        return None;
    };
    let f32s = g.ty(a).dtype == DType::F32 && g.ty(b).dtype == DType::F32;
    (*x == ka && *y == kb && xa == xb && f32s).then_some(xa.as_slice())
}

/// `Some(x)` where row reductions `a` then `b` are a softmax's: `a` the max of `x` and `b`
/// the sum of `exp(x - a)` (`a` broadcast back over the row), both f32 over the same axes.
fn softmax_pair(g: &Graph, a: NodeId, b: NodeId) -> Option<NodeId> {
    f32_pair(g, (a, ReduceKind::Max), (b, ReduceKind::Sum))?;
    let x = g.operands(a)[0];
    let e = g.operands(b)[0];
    let d = *g.operands(e).first()?;
    if !matches!(g.node(e).op, Op::Unary(UnaryOp::Exp))
        || !matches!(g.node(d).op, Op::Binary(BinaryOp::Sub))
        || g.operands(d)[0] != x
    {
        return None;
    }
    let mut m = g.operands(d)[1];
    while matches!(g.node(m).op, Op::Broadcast { .. } | Op::Reshape { .. }) {
        m = g.operands(m)[0];
    }
    (m == a).then_some(x)
}

/// `Some((x, t))` where row reductions `a` then `b` are the two sums of a variance: `a` the
/// sum of `x` and `b` the sum of `(x - t) * (x - t)`, `t` a broadcast constant along the
/// reduced axes (each operand axis longer than 1 lands on a kept axis), all f32 over the
/// same axes. `t` may depend on `a` (a mean); the caller checks that it needs no later
/// reduction.
fn centered_pair(g: &Graph, a: NodeId, b: NodeId) -> Option<(NodeId, NodeId)> {
    let xa = f32_pair(g, (a, ReduceKind::Sum), (b, ReduceKind::Sum))?;
    let x = g.operands(a)[0];
    let sq = g.operands(b)[0];
    let ops = g.operands(sq);
    if !matches!(g.node(sq).op, Op::Binary(BinaryOp::Mul)) || ops[0] != ops[1] {
        return None;
    }
    let d = ops[0];
    if !matches!(g.node(d).op, Op::Binary(BinaryOp::Sub)) || g.operands(d)[0] != x {
        return None;
    }
    let t = g.operands(d)[1];
    let Op::Broadcast { dims, .. } = &g.node(t).op else { return None };
    let from = &g.ty(g.operands(t)[0]).shape;
    let along_rows = dims.iter().zip(from.dims()).all(|(d, &len)| len == 1 || !xa.contains(d));
    along_rows.then_some((x, t))
}

/// Opens a block that computes this invocation's `n` (element count), `mean` and
/// `ssd = Σ (x - mean)²` of its elements in one pass (Welford's updates): each of the walk's
/// partials keeps its own, combined by Chan's rule. Unlike `Σx²` minus `n·mean²`, no
/// catastrophic cancellation when the mean is large against the spread.
fn welford(main: &mut String, g: &Graph, x: NodeId, walk: RowWalk) {
    let init = |u: usize| format!("var n{u} = 0.0f;\n        var m{u} = 0.0f;\n        var q{u} = 0.0f;");
    let update = |u: usize| {
        format!(
            "n{u} = n{u} + 1.0f;\n            \
             let d{u} = x{u} - m{u};\n            \
             m{u} = m{u} + d{u} / n{u};\n            \
             q{u} = q{u} + d{u} * (x{u} - m{u});"
        )
    };
    row_pass(main, g, x, walk, &init, &update);
    let _ = writeln!(main, "        var n = n0;\n        var mean = m0;\n        var ssd = q0;");
    for u in 1..walk.ilp {
        // A partial with no elements (rows shorter than `ilp`) adds nothing.
        let _ = writeln!(
            main,
            "        {{\n            let nn = n + n{u};\n            let d = m{u} - mean;\n            \
             let w = select(n{u} / nn, 0.0f, nn == 0.0f);\n            \
             mean = mean + d * w;\n            ssd = ssd + q{u} + d * d * n * w;\n            n = nn;\n        }}"
        );
    }
}

/// Opens a block that computes the max `m` of this invocation's elements and
/// `s = Σ exp(x - m)` in one pass (the online softmax): each of the walk's partials keeps its
/// running max and its sum relative to it, rescaled by `exp(old - new)` when the max grows;
/// the partials are combined the same way. A masked (−∞) element leaves the sum as it is (no
/// `exp(−∞ − −∞)`), so masked elements ahead of the first finite one cost nothing and an
/// all-masked row gives the reference's `0/0`; a +∞ or NaN gives NaN as in two passes. The
/// test is on the element, not on the new max: GPUs' `max` drops a NaN operand (NVIDIA's
/// returns `max(−∞, NaN) = −∞`), and a NaN must still reach the sum; a partial whose max is
/// −∞ passes its sum (0, or NaN) on unscaled for the same reason.
fn online_softmax(main: &mut String, g: &Graph, x: NodeId, walk: RowWalk) {
    let neg_inf = literal(DType::F32, f64::NEG_INFINITY);
    let init = |u: usize| format!("var m{u}: f32 = {neg_inf};\n        var s{u}: f32 = 0.0f;");
    let update = |u: usize| {
        format!(
            "let n{u} = max(m{u}, x{u});\n            \
             s{u} = select(s{u} * exp(m{u} - n{u}) + exp(x{u} - n{u}), s{u}, x{u} == {neg_inf});\n            \
             m{u} = n{u};"
        )
    };
    row_pass(main, g, x, walk, &init, &update);
    if walk.ilp == 1 {
        let _ = writeln!(main, "        let m = m0;\n        let s = s0;");
        return;
    }
    let ms: Vec<String> = (0..walk.ilp).map(|u| format!("m{u}")).collect();
    let m = ms[1..].iter().fold(ms[0].clone(), |acc, mu| format!("max({acc}, {mu})"));
    let _ = writeln!(main, "        let m = {m};");
    let terms: Vec<String> =
        (0..walk.ilp).map(|u| format!("select(s{u} * exp(m{u} - m), s{u}, m{u} == {neg_inf})")).collect();
    let _ = writeln!(main, "        let s = {};", terms.join(" + "));
}

/// Opens a block with the walk's partial states (`init(u)`) and passes over this
/// invocation's elements of the row: per step the values `xU` of `ilp` elements of `x` are
/// all computed before any `update(U)` runs; the remainder goes through partial 0. Left open
/// for the caller to combine the partials. With the walk's `quads` the `ilp` = 4 elements
/// are adjacent and `x`'s region is computed for them side by side, its `vec4` inputs read
/// whole (the row's length is a multiple of 4: no remainder).
fn row_pass(
    main: &mut String,
    g: &Graph,
    x: NodeId,
    walk: RowWalk,
    init: &dyn Fn(usize) -> String,
    update: &dyn Fn(usize) -> String,
) {
    let RowWalk { len: row_len, start, step, ilp, quads } = walk;
    let _ = writeln!(main, "    {{");
    for u in 0..ilp {
        let _ = writeln!(main, "        {}", init(u));
    }
    if let Some(q) = quads {
        quad_row_step(main, row_len, "        ");
        let (stmts, value) = stmts_at(g, q.quads.kernel, x);
        let refs: Vec<&RegionStmt> = stmts.iter().collect();
        emit_elements(main, g, &refs, 4, Some(q.quads), "            ");
        for u in 0..4 {
            let _ = writeln!(main, "            let x{u} = {value}_{u};");
        }
        for u in 0..4 {
            let _ = writeln!(main, "            {}", update(u));
        }
        let _ = writeln!(main, "        }}");
        return;
    }
    let input = format!("v{}", x.index());
    let _ = writeln!(main, "        var e = {start};");
    let last = if ilp > 1 { format!(" + {}u", (ilp - 1) * step) } else { String::new() };
    let _ = writeln!(main, "        for (; e{last} < {row_len}u; e = e + {}u) {{", ilp * step);
    for u in 0..ilp {
        let at = if u > 0 { format!("e + {}u", u * step) } else { "e".to_string() };
        let _ = writeln!(main, "            let x{u} = {input}(fg_elem(row, {at}));");
    }
    for u in 0..ilp {
        let _ = writeln!(main, "            {}", update(u));
    }
    let _ = writeln!(main, "        }}");
    if ilp > 1 {
        let _ = writeln!(main, "        for (; e < {row_len}u; e = e + {step}u) {{");
        let _ = writeln!(main, "            let x0 = {input}(fg_elem(row, e));");
        let _ = writeln!(main, "            {}", update(0));
        let _ = writeln!(main, "        }}");
    }
}

/// Opens a block that accumulates reduction `r` over this invocation's elements of the row
/// into `acc`, returning the reduction's kind. With `ilp` > 1 (a CPU adapter, where a serial
/// chain of combines is bound by its latency: see [`CPU_INTERLEAVE`]) the partials are
/// combined at the end, so float sums and products are rounded in another order than one
/// serial loop's.
fn reduce_partials(main: &mut String, g: &Graph, r: NodeId, walk: RowWalk) -> ReduceKind {
    let Op::Reduce { kind, .. } = g.node(r).op else { unreachable!("row reductions are reduces") };
    let dt = g.ty(r).dtype;
    let init = |u: usize| format!("var acc{u}: {} = {};", vty(dt), reduce_identity(kind, dt));
    let update = |u: usize| format!("acc{u} = {};", combine(kind, &format!("acc{u}"), &format!("x{u}")));
    row_pass(main, g, g.operands(r)[0], walk, &init, &update);
    let mut acc = "acc0".to_string();
    for u in 1..walk.ilp {
        acc = combine(kind, &format!("({acc})"), &format!("acc{u}"));
    }
    let _ = writeln!(main, "        let acc = {acc};");
    kind
}

/// Writes the row's outputs: full-shape outputs element by element (`e` from `start` in
/// steps of `step`), per-row outputs once (by invocation 0 when a workgroup shares the row).
fn write_row_outputs(
    main: &mut String,
    g: &Graph,
    bindings: &[Binding],
    (rows, row_len, full): (usize, usize, usize),
    (start, step, shared): (&str, &str, bool),
    opts: &LowerOptions,
    quads: Option<RowQuads>,
) {
    let outs: Vec<(usize, &Binding)> = bindings.iter().enumerate().filter(|(_, b)| b.output).collect();
    let (full_outs, row_outs): (Vec<_>, Vec<_>) =
        outs.into_iter().partition(|(_, b)| g.ty(b.node).shape.numel() == full && full != rows);
    if let (Some(q), false) = (quads, full_outs.is_empty()) {
        // Four adjacent elements per step, every output's region computed for them side by
        // side (a value shared by several regions once), then stored.
        quad_row_step(main, row_len, "    ");
        let per_output: Vec<Vec<RegionStmt>> = full_outs
            .iter()
            .map(|(_, b)| region_stmts(g, &q.regions.iter().find(|(o, _)| *o == b.node).expect("a region").1, None))
            .collect();
        let stmts = merged_stmts(per_output.iter().map(Vec::as_slice));
        emit_elements(main, g, &stmts, 4, Some(q.quads), "        ");
        for (k, b) in &full_outs {
            let dtype = g.ty(b.node).dtype;
            let values: Vec<String> = (0..4).map(|u| format!("x{}_{u}", b.node.index())).collect();
            if q.quads.vec4.contains(&b.node) {
                let _ = writeln!(main, "        b{k}[i_0 >> 2u] = {};", quad_value(dtype, opts, &values));
            } else {
                for (u, v) in values.iter().enumerate() {
                    row_store(main, *k, dtype, &format!("i_{u}"), v, opts, "        ");
                }
            }
        }
        let _ = writeln!(main, "    }}");
    } else if !full_outs.is_empty() {
        let _ = writeln!(main, "    for (var e = {start}; e < {row_len}u; e = e + {step}u) {{");
        let _ = writeln!(main, "        let idx = fg_elem(row, e);");
        for (k, b) in full_outs {
            row_store(main, k, g.ty(b.node).dtype, "idx", &format!("e{}(idx)", b.node.index()), opts, "        ");
        }
        let _ = writeln!(main, "    }}");
    }
    if !row_outs.is_empty() {
        let indent = if shared { "        " } else { "    " };
        if shared {
            let _ = writeln!(main, "    if (lid == 0u) {{");
        }
        for (k, b) in row_outs {
            row_store(main, k, g.ty(b.node).dtype, "row", &format!("e{}(row)", b.node.index()), opts, indent);
        }
        if shared {
            let _ = writeln!(main, "    }}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop kernel whose serial reduction is too long for four elements side by side on a
    /// CPU adapter computes one at a time, so its bindings are scalars too: it declared its
    /// four outputs as a vec4 while storing them one by one (naga rejected the module). A
    /// lone reduction that long becomes a row kernel.
    #[test]
    fn loop_kernels_with_long_serial_reductions_stay_valid_on_cpu_adapters() {
        let b = fusegraph_ir::GraphBuilder::new();
        let x = b.input("x", DType::F32, [4, 20_000]).unwrap();
        let s = x.sum(&[1], false).unwrap();
        let y = s.exp().unwrap();
        let g = b.graph();
        let opts = LowerOptions { cpu: true, ..Default::default() };
        let kernel = |members: Vec<NodeId>, out: NodeId| Kernel {
            kind: KernelKind::Loop,
            members,
            outputs: vec![out],
            inputs: vec![x.id()],
        };
        let fused = lower(&g, &kernel(vec![s.id(), y.id()], y.id()), &opts);
        crate::validate(&fused.wgsl).unwrap_or_else(|e| panic!("{e}\n{}", fused.wgsl));
        assert!(!fused.wgsl.contains("vec4"), "{}", fused.wgsl);
        let long = fusegraph_ir::GraphBuilder::new();
        let x = long.input("x", DType::F32, [4, 100_000]).unwrap();
        let s = x.sum(&[1], false).unwrap();
        let g = long.graph();
        let alone =
            Kernel { kind: KernelKind::Loop, members: vec![s.id()], outputs: vec![s.id()], inputs: vec![x.id()] };
        let src = lower(&g, &alone, &opts);
        crate::validate(&src.wgsl).unwrap_or_else(|e| panic!("{e}\n{}", src.wgsl));
        assert_eq!(src.workgroups, 4, "a workgroup per row: {}", src.wgsl);
    }

    /// With its members unshared, an f16 chain is computed in f32 and rounded once, where
    /// it is stored (excess precision); a member another kernel also computes, and one a
    /// member outside the widened ops reads, is rounded; with none unshared the text is
    /// `lower_with`'s.
    #[test]
    fn unshared_f16_members_round_only_where_stored_or_shared() {
        let b = fusegraph_ir::GraphBuilder::new();
        let x = b.input("x", DType::F16, [1000]).unwrap();
        let y = b.input("y", DType::F16, [1000]).unwrap();
        let mut v = x.clone();
        for _ in 0..5 {
            v = v.add(&y).unwrap().mul_scalar(0.5).unwrap().tanh().unwrap().sub(&y).unwrap();
        }
        let g = b.graph();
        let members = g.reachable(&[v.id()]).unwrap().into_iter().filter(|&n| n != x.id() && n != y.id()).collect();
        let k = Kernel { kind: KernelKind::Loop, members, outputs: vec![v.id()], inputs: vec![x.id(), y.id()] };
        for opts in [LowerOptions::default(), LowerOptions { cpu: true, ..Default::default() }] {
            let exact = lower_with(&g, &k, &opts, &Strategy::default());
            let none = lower_planned(&g, &k, &[], &opts, &Strategy::default());
            assert_eq!(exact.wgsl, none.wgsl);
            let wide = lower_planned(&g, &k, &k.members, &opts, &Strategy::default());
            crate::validate(&wide.wgsl).unwrap_or_else(|e| panic!("{e}\n{}", wide.wgsl));
            assert_eq!(wide.bindings, exact.bindings);
            // Calls to the rounding per rounded value: in its own function, in its output's
            // region function and, on a CPU adapter, in `main` for each of the four lanes a
            // step computes inline (elsewhere `main` calls the region function).
            let per_value = if opts.cpu { 2 + 4 } else { 2 };
            let rounds = |src: &KernelSource| src.wgsl.matches("fg_round_f16(").count() - 1;
            assert_eq!(rounds(&exact), 20 * per_value, "every op rounds:\n{}", exact.wgsl);
            assert_eq!(rounds(&wide), per_value, "only the stored value rounds:\n{}", wide.wgsl);
            // The third `tanh` computed by another kernel too: it and what reads it round.
            let tanh3 = k.members.iter().copied().filter(|&m| g.node(m).op == Op::Unary(UnaryOp::Tanh)).nth(2).unwrap();
            let unshared: Vec<NodeId> = k.members.iter().copied().filter(|&m| m != tanh3).collect();
            let part = lower_planned(&g, &k, &unshared, &opts, &Strategy::default());
            crate::validate(&part.wgsl).unwrap_or_else(|e| panic!("{e}\n{}", part.wgsl));
            assert_eq!(rounds(&part), 3 * per_value, "the tanh's operand, the tanh, the output:\n{}", part.wgsl);
        }
    }

    /// A loop kernel whose outputs have two lengths (a sibling merge of an optimizer's
    /// updates of a weight and of a bias) computes what the outputs of one length share once
    /// per element: the new moment `m`, stored, is not computed again for the new weight.
    #[test]
    fn ragged_loop_kernels_compute_shared_values_once() {
        let b = fusegraph_ir::GraphBuilder::new();
        let (g1, m) = (b.input("g", DType::F32, [300]).unwrap(), b.input("m", DType::F32, [300]).unwrap());
        let w = b.input("w", DType::F32, [300]).unwrap();
        let m1 = m.mul_scalar(0.9).unwrap().add(&g1.exp().unwrap()).unwrap();
        let w1 = w.sub(&m1.sqrt().unwrap()).unwrap();
        let bias = b.input("b", DType::F32, [7]).unwrap();
        let b1 = bias.neg().unwrap();
        let g = b.graph();
        let mut members: Vec<NodeId> =
            g.node_ids().into_iter().filter(|&n| !matches!(g.node(n).op, Op::Input { .. })).collect();
        members.sort();
        let kernel = Kernel {
            kind: KernelKind::Loop,
            members,
            outputs: vec![m1.id(), w1.id(), b1.id()],
            inputs: vec![g1.id(), m.id(), w.id(), bias.id()],
        };
        for cpu in [false, true] {
            let src = lower(&g, &kernel, &LowerOptions { cpu, ..Default::default() });
            crate::validate(&src.wgsl).unwrap_or_else(|e| panic!("{e}\n{}", src.wgsl));
            let main = &src.wgsl[src.wgsl.find("@compute").unwrap()..];
            assert_eq!(main.matches("exp(").count(), 1, "{main}");
            assert!(!main.contains(&format!("e{}(", w1.id().index())), "{main}");
            assert!(main.contains(&format!("e{}(", b1.id().index())), "{main}");
        }
    }

    #[test]
    fn suffixes_region_names_but_not_literals_or_functions() {
        assert_eq!(
            suffix_names("select(fg_tanh((x12 * y3)), v7(i), (x2 < 1e-4f))", "_3"),
            "select(fg_tanh((x12_3 * y3_3)), v7(i_3), (x2_3 < 1e-4f))"
        );
        // Hex and float literals, types and builtins keep their spelling.
        assert_eq!(
            suffix_names("bitcast<i32>(0x80000000u) + i32(x5) * 2.0f + vec4<f32>(y10).x", "_0"),
            "bitcast<i32>(0x80000000u) + i32(x5_0) * 2.0f + vec4<f32>(y10_0).x"
        );
    }
}
