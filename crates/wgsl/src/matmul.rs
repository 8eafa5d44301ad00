//! The tiled, register-blocked matmul lowering.
//!
//! A loop kernel with one output whose region (see [`regions`]) holds a matmul `M` of the
//! output's element count is lowered as a classic GEMM instead of one invocation per
//! element: each workgroup of 16×16 invocations computes one output tile of one batch entry
//! of `M` (64×64, each invocation a 4×4 block, or 128×128 and 8×8 blocks when `m` and `n`
//! are both at least 128), stepping over `k` in slices staged in workgroup memory (16 KiB,
//! WebGPU's default limit). Tiles are loaded through `M`'s operand functions `vL(i)` and
//! `vR(i)`, so fused prologues (transposes, casts, broadcasts) work unchanged; after the
//! accumulation the fused epilogue runs per output element as `eO_acc(i, acc)`, the output's
//! region with `M`'s value replaced by the accumulator, and is stored like a loop kernel
//! stores. Out-of-range tile elements are zero (ragged `m`, `n`, `k`); only in-range outputs
//! are stored. Every invocation runs the same loops, so the barriers are in uniform control
//! flow. Values are accumulated in the compute type (f32 for f16; i32/u32 wrap).
//!
//! Packed f16 outputs (two halves per `u32` word) are written a whole word at a time: an
//! invocation's columns start at a multiple of 4, so with `n` even both halves of every word
//! belong to it. With `n` odd a word can straddle two rows; such kernels keep the naive
//! lowering.
//!
//! On adapters with cooperative matrices (tensor cores) an f16 product takes the same kernel
//! with its compute phase on 16×16 matrix fragments ([`CoopPlan`]); adapters with a fixed
//! subgroup size may take the subgroup matmul ([`subgroup_main`]), as the runtime measures.
//!
//! [`regions`]: fusegraph_passes::kernel::regions

use crate::options::{LowerOptions, MAIN_ARGS};
use crate::region::region_calls;
use crate::storage::{packed_halves, vec4_storage};
use crate::view::strided_view;
use crate::writer::{ravel, vty};
use fusegraph_ir::{DType, Graph, NodeId, Op};
use fusegraph_passes::Kernel;
use std::fmt::Write;

/// The problem a tiled kernel solves: `batch` products of `m`×`k` by `k`×`n` (a convolution
/// as its implicit GEMM per image).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GemmShape {
    /// Independent products (batch entries, images).
    pub batch: usize,
    /// Rows of the result.
    pub m: usize,
    /// Columns of the result.
    pub n: usize,
    /// The contracted length.
    pub k: usize,
}

/// The GEMM that `kernel` computes if it takes the tiled lowering under `opts`, with its
/// element type; `None` for every other kernel. (A product of a few rows on a GPU takes the
/// matrix–vector kernel unless a tiling is forced: `gemv_kernel`.)
pub fn gemm_shape(g: &Graph, kernel: &Kernel, opts: &LowerOptions) -> Option<(GemmShape, fusegraph_ir::DType)> {
    if kernel.kind != fusegraph_passes::KernelKind::Loop {
        return None;
    }
    let regs = fusegraph_passes::kernel::regions(g, kernel);
    let p = plan(g, kernel, &regs, opts)?;
    let (batch, m, n, k) = gemm_dims(g, p.matmul);
    Some((GemmShape { batch, m, n, k }, g.ty(p.matmul).dtype))
}

/// What the tiled lowering of a kernel needs: the matmul and the output it feeds, and which
/// operands the tiled kernel (plain or cooperative) reads straight from their bindings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TiledPlan {
    /// The matmul member whose value the accumulators hold.
    pub matmul: NodeId,
    /// The kernel's single output, whose region contains `matmul`.
    pub output: NodeId,
    /// How the lhs of a matmul (not a convolution) is read from its binding as vec4s, if it
    /// is: the lhs is one of the kernel's bindings or a strided view of one
    /// (`view::strided_view`: a reshape, a transpose, attention's heads split out of
    /// `[s, h·d]`, a slice, batch axes broadcast; not a prologue with arithmetic) with one of
    /// its two matrix axes contiguous and a multiple of 4 long and every other stride and
    /// its offset multiples of 4, stored as vec4s (f32, i32, u32 or native f16). The
    /// binding is declared as `vec4`s and the tiled kernel loads four adjacent elements
    /// (along that axis) per load, into registers one `k` slice ahead.
    pub vec4_lhs: Option<Vec4Operand>,
    /// The rhs likewise.
    pub vec4_rhs: Option<Vec4Operand>,
}

/// How the tiled kernel reads an operand straight from its binding ([`TiledPlan::vec4_lhs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vec4Operand {
    /// The kernel input whose binding holds the operand's elements.
    pub leaf: NodeId,
    /// The four elements of a load are adjacent along `k` (a row-major lhs, a transposed
    /// rhs); otherwise along the operand's other axis (a transposed lhs's rows, a row-major
    /// rhs's columns).
    pub along_k: bool,
}

/// Whether `kernel` (a loop kernel) takes the tiled lowering, and with which matmul.
pub fn plan(g: &Graph, kernel: &Kernel, regions: &[(NodeId, Vec<NodeId>)], opts: &LowerOptions) -> Option<TiledPlan> {
    let [(output, region)] = regions else { return None };
    let out_ty = g.ty(*output);
    let numel = out_ty.shape.numel();
    if numel == 0 || kernel.outputs.len() != 1 {
        return None;
    }
    // Among several candidates, the one with the longest `k` saves the most.
    let matmul = region
        .iter()
        .copied()
        .filter(|&m| matches!(g.node(m).op, Op::MatMul | Op::Conv2d { groups: 1, .. }))
        .filter(|&m| g.ty(m).shape.numel() == numel && g.ty(m).shape.rank() >= 2)
        .max_by_key(|&m| gemm_dims(g, m).3)?;
    let n = gemm_dims(g, matmul).2;
    if packed_halves(out_ty.dtype, opts) && n % 2 == 1 {
        return None;
    }
    // An operand `[.., rows, cols]` that is a strided view of a binding, one of its two
    // matrix axes contiguous (stride 1) and a multiple of 4 long, every other stride and the
    // offset multiples of 4, so that four adjacent elements from a multiple of 4 along it are
    // one aligned vec4 of the binding.
    let direct = |node: NodeId, lhs: bool| {
        if !matches!(g.node(matmul).op, Op::MatMul) {
            return None;
        }
        let view = strided_view(g, kernel, node)?;
        let dims = g.ty(node).shape.dims();
        let r = dims.len();
        if r < 2 {
            return None;
        }
        let contiguous = [r - 1, r - 2].into_iter().find(|&a| view.strides[a] == 1 && dims[a].is_multiple_of(4))?;
        let aligned =
            view.offset.is_multiple_of(4) && (0..r).all(|a| a == contiguous || view.strides[a].is_multiple_of(4));
        let leaf = g.ty(view.leaf);
        let storage =
            leaf.dtype == g.ty(node).dtype && vec4_storage(leaf.dtype, opts) && leaf.shape.numel().is_multiple_of(4);
        // `k` is the lhs's last axis and the rhs's one before.
        (aligned && storage).then_some(Vec4Operand { leaf: view.leaf, along_k: (contiguous == r - 1) == lhs })
    };
    let ops = g.operands(matmul);
    Some(TiledPlan { matmul, output: *output, vec4_lhs: direct(ops[0], true), vec4_rhs: direct(ops[1], false) })
}

/// A vec4 of an f32 or (native) f16 output binding from four stored values.
pub(crate) fn vec4_value(dtype: DType, v: [String; 4]) -> String {
    let elem = if dtype == DType::F16 { "f16" } else { "f32" };
    format!("vec4<{elem}>({}, {}, {}, {})", v[0], v[1], v[2], v[3])
}

/// Whether the tiled kernel of `plan` writes its output a vec4 at a time: rows a multiple of
/// 4 long (every invocation's columns start at a multiple of 4 and are 4, 8 … long) and
/// storage of f32 or native f16.
pub fn tiled_vec4_store(g: &Graph, plan: &TiledPlan, opts: &LowerOptions) -> bool {
    let dt = g.ty(plan.output).dtype;
    gemm_dims(g, plan.matmul).2.is_multiple_of(4)
        && (dt == DType::F32 || (dt == DType::F16 && !packed_halves(dt, opts)))
}

pub(crate) const XYZW: [&str; 4] = ["x", "y", "z", "w"];

/// Appends `text` as a line indented by `indent` levels.
pub(crate) fn line(s: &mut String, indent: usize, text: String) {
    let _ = writeln!(s, "{:indent$}{text}", "", indent = indent * 4);
}

/// Where an invocation's columns lie in its workgroup's tile: `per` (= `bn / 4`) groups of four
/// adjacent columns, group `p` the `at(p)`-th four of the tile.
///
/// Strided (the default): group `p` of invocation `tx` is `p·gx + tx`, so in each step of the
/// compute phase the invocations along a row (adjacent `tx`) read adjacent vec4s of the rhs
/// tile, and the epilogue's vec4 stores of adjacent invocations are adjacent. Blocked
/// ([`Strategy::blocked_columns`]): groups `tx·per ..`, the invocation's `bn` columns side by
/// side, which puts adjacent invocations' loads `bn · 4` bytes apart: with `bn` = 8 two vec4s
/// apart, so of eight lanes reading 16 bytes each at a 32-byte stride, two fall on each group
/// of four of a GPU's 32 four-byte banks (two passes where one would do, on every rhs load of
/// the 128×128 tiling's inner loop).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ColumnGroups {
    pub(crate) gx: usize,
    pub(crate) per: usize,
    pub(crate) blocked: bool,
}

impl ColumnGroups {
    /// WGSL for the index (in fours of columns, from the tile's first column) of group `p`.
    pub(crate) fn at(&self, p: usize) -> String {
        match (self.blocked, p) {
            (true, _) if self.per == 1 => "tx".into(),
            (true, _) => format!("tx * {}u + {p}u", self.per),
            (false, 0) => "tx".into(),
            (false, _) => format!("{}u + tx", p * self.gx),
        }
    }

    /// WGSL for the tile column of group `p`'s first column.
    pub(crate) fn column(&self, p: usize) -> String {
        match self.at(p).as_str() {
            "tx" => "tx * 4u".into(),
            at => format!("({at}) * 4u"),
        }
    }
}

/// The element offset of an operand's batch entry at the result's batch coordinates `bc`,
/// for an operand with dims `od` (`[.., rows, cols]`, `size` = rows·cols elements per entry):
/// its batch dims are the result's last ones, broadcast where 1.
pub(crate) fn operand_base(bc: &[String], od: &[usize], size: usize) -> String {
    let off = bc.len() + 2 - od.len();
    let coords: Vec<String> =
        (0..od.len() - 2).map(|q| if od[q] == 1 { "0u".into() } else { bc[q + off].clone() }).collect();
    match ravel(&coords, &od[..od.len() - 2]).as_str() {
        "0u" => "0u".to_string(),
        b => format!("({b}) * {size}u"),
    }
}

/// The head of a matmul kernel's `main` (workgroups of `wg_size`, `extra_args` after the
/// usual builtins): one output tile per workgroup, `tile_col` fastest, then `tile_row`, then
/// the batch entry `bt`. The 2-D grid may round the count up; the early return is uniform
/// across the workgroup.
pub(crate) fn tile_head(wg_size: usize, extra_args: &str, workgroups: u64, tiles_m: usize, tiles_n: usize) -> String {
    format!(
        "@compute @workgroup_size({wg_size})\nfn main({MAIN_ARGS}{extra_args}) {{\n    \
         let wg = wid.y * nwg.x + wid.x;\n    if (wg >= {workgroups}u) {{ return; }}\n    \
         let tile_col = wg % {tiles_n}u;\n    let tile_row = (wg / {tiles_n}u) % {tiles_m}u;\n    \
         let bt = wg / {}u;\n",
        tiles_m * tiles_n
    )
}

/// The values the epilogue of `plan` reads by element function (a broadcast, a view of an
/// input, a value from outside the region) that are the same along each row of the product
/// (a bias per output channel of a convolution, a scale per row of a matmul) or along each
/// column (a bias per output feature of a matmul). The store loop reads each once per row, or
/// once per column before the rows, and hands it to `eO_acc` as `hN`, instead of a load (a
/// loop over the lanes on lavapipe) and its index arithmetic per element: the CNN's first
/// convolution (`k` = 27) took longer fused with its bias and ReLU (30.8 ms) than alone
/// (21.1 ms).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Invariants {
    /// Values constant along each row: a strided view of a binding whose trailing axes,
    /// spanning exactly the product's `n` columns, all have stride 0.
    pub per_row: Vec<NodeId>,
    /// Values constant along each column within a batch entry: the axes spanning the `m`
    /// rows (just before those of the columns) all have stride 0.
    pub per_col: Vec<NodeId>,
}

impl Invariants {
    /// Finds them in the epilogue of `plan`.
    pub fn of(g: &Graph, kernel: &Kernel, plan: &TiledPlan, regions: &[(NodeId, Vec<NodeId>)]) -> Invariants {
        let region = &regions.iter().find(|(o, _)| *o == plan.output).expect("the output has a region").1;
        let (_, m, n, _) = gemm_dims(g, plan.matmul);
        let mut out = Invariants::default();
        for v in region_calls(g, region, Some(plan.matmul)) {
            let dims = g.ty(v).shape.dims();
            // A binding's view, or a computed value broadcast (a batch norm's shift per channel).
            // (A constant fill costs nothing per element: left where it is.)
            let Some(view) = crate::view::index_view(g, kernel, v) else { continue };
            if matches!(g.node(view.leaf).op, Op::Full { .. }) {
                continue;
            }
            if g.ty(v).shape.numel() != g.ty(plan.output).shape.numel() {
                continue;
            }
            // The axes before `end` whose lengths multiply to `len`, from the innermost.
            let span = |end: usize, len: usize| {
                let (mut j, mut p) = (end, 1);
                while j > 0 && p < len {
                    j -= 1;
                    p *= dims[j];
                }
                (p == len).then_some(j)
            };
            let Some(jn) = span(dims.len(), n) else { continue };
            let zero = |axes: std::ops::Range<usize>| view.strides[axes].iter().all(|&s| s == 0);
            if zero(jn..dims.len()) {
                out.per_row.push(v);
            } else if span(jn, m).is_some_and(|jm| zero(jm..jn)) {
                out.per_col.push(v);
            }
        }
        out
    }

    /// All of them, in `eO_acc`'s parameter order.
    pub(crate) fn params(&self) -> Vec<NodeId> {
        self.per_row.iter().chain(&self.per_col).copied().collect()
    }

    /// Reads the per-column values of columns `cols[c]` of row `row0` of batch entry `o_base`
    /// (`let hN_c = vN(…);`, each column clamped to the last, so a ragged tile reads in range).
    pub(crate) fn read_columns(&self, s: &mut String, o_base: &str, row0: &str, cols: &[String], n: usize) {
        for v in &self.per_col {
            for (c, col) in cols.iter().enumerate() {
                let (i, last) = (v.index(), n - 1);
                let _ = writeln!(s, "    let h{i}_{c} = v{i}({o_base} + {row0} * {n}u + min({col}, {last}u));");
            }
        }
    }

    /// Reads the per-row values at element `at` of the current row (`let hN = vN(at);`) and
    /// returns, for column `c` of the invocation, the arguments that pass both kinds to
    /// `eO_acc` after the accumulator (`, hN, …, hM_c, …`).
    pub(crate) fn read_row(&self, s: &mut String, at: &str) -> impl Fn(usize) -> String + '_ {
        for v in &self.per_row {
            let _ = writeln!(s, "        let h{0} = v{0}({at});", v.index());
        }
        move |c| {
            let row = self.per_row.iter().map(|v| format!(", h{}", v.index()));
            row.chain(self.per_col.iter().map(|v| format!(", h{}_{c}", v.index()))).collect()
        }
    }
}

/// (batch, m, n, k) of a matmul, or of a convolution seen as an implicit GEMM per image
/// (m = output channels, n = output pixels, k = input channels × kernel pixels).
pub(crate) fn gemm_dims(g: &Graph, mm: NodeId) -> (usize, usize, usize, usize) {
    let dims = g.ty(mm).shape.dims();
    let rank = dims.len();
    match g.node(mm).op {
        Op::Conv2d { .. } => {
            let wd = g.ty(g.operands(mm)[1]).shape.dims();
            (dims[0], dims[1], dims[2] * dims[3], wd[1] * wd[2] * wd[3])
        }
        _ => {
            let ld = g.ty(g.operands(mm)[0]).shape.dims();
            (dims[..rank - 2].iter().product(), dims[rank - 2], dims[rank - 1], ld[ld.len() - 1])
        }
    }
}

/// `fg_im2col(bt, gk, col)`: element (gk, col) of image `bt`'s patch matrix — input channel
/// and kernel offset from `gk`, output pixel from `col` — or zero in the padding.
pub(crate) fn write_im2col(g: &Graph, conv: NodeId, body: &mut String) {
    let Op::Conv2d { stride, padding, dilation, .. } = g.node(conv).op else { unreachable!("a convolution") };
    let ops = g.operands(conv);
    let (x, xd, wd) = (ops[0], g.ty(ops[0]).shape.dims(), g.ty(ops[1]).shape.dims());
    let od = g.ty(conv).shape.dims();
    let (c, h, wi) = (xd[1], xd[2], xd[3]);
    let (kh, kw, ow) = (wd[2], wd[3], od[3]);
    let t = vty(g.ty(conv).dtype);
    let _ = writeln!(body, "fn fg_im2col(bt: u32, gk: u32, col: u32) -> {t} {{");
    let _ = writeln!(body, "    let ci = gk / {}u;", kh * kw);
    let _ = writeln!(body, "    let ky = (gk / {kw}u) % {kh}u;");
    let _ = writeln!(body, "    let kx = gk % {kw}u;");
    let _ =
        writeln!(body, "    let iy = i32((col / {ow}u) * {}u + ky * {}u) - {}i;", stride[0], dilation[0], padding[0]);
    let _ =
        writeln!(body, "    let ix = i32((col % {ow}u) * {}u + kx * {}u) - {}i;", stride[1], dilation[1], padding[1]);
    // Branch-free: the load reads a clamped (in-range) pixel and the padding selects zero; a
    // divergent early return costs more on a CPU adapter (lavapipe: the conv kernel 4% faster).
    let _ = writeln!(body, "    let inside = iy >= 0i && iy < {h}i && ix >= 0i && ix < {wi}i;");
    let _ = writeln!(
        body,
        "    let v = v{}(bt * {}u + ci * {}u + u32(clamp(iy, 0i, {}i)) * {wi}u + u32(clamp(ix, 0i, {}i)));",
        x.index(),
        c * h * wi,
        h * wi,
        h - 1,
        wi - 1
    );
    let _ = writeln!(body, "    return select({t}(), v, inside);");
    let _ = writeln!(body, "}}\n");
}
