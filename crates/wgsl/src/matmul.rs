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
//! with its compute phase on 16×16 matrix fragments ([`CoopPlan`]); CPU adapters take the
//! subgroup matmul ([`subgroup_main`]).
//!
//! [`regions`]: fusegraph_passes::kernel::regions

use crate::lower::{
    packed_f16, region_calls, storage_elem, store_value, vec4_storage, write_region, Binding, Cooperative,
    LowerOptions, Strategy, MAIN_ARGS,
};
use crate::view::{reshape_strides, split_last_axis_view, strided_view, StridedView};
use crate::writer::{ravel, unravel, vty};
use fusegraph_ir::{DType, Graph, NodeId, Op};
use fusegraph_passes::Kernel;
use std::fmt::Write;

/// The shape of a tiling: a `gx`×`gy` grid of invocations, each computing a `bm`×`bn` block
/// (multiples of 4) of the workgroup's `gy·bm`×`gx·bn` output tile, stepping over `k` by `tk`.
/// [`MatmulTiling::CANDIDATES`] are the tilings an autotuner chooses among;
/// [`MatmulTiling::default_for`] is the choice without measuring.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MatmulTiling {
    /// Invocations along the output's columns.
    pub gx: usize,
    /// Invocations along the output's rows.
    pub gy: usize,
    /// Rows of each invocation's block.
    pub bm: usize,
    /// Columns of each invocation's block.
    pub bn: usize,
    /// The `k` slice staged in workgroup memory per step.
    pub tk: usize,
}

/// 64×64 tiles, 4×4 per invocation: 2 × 64 × 32 × 4 bytes = 16 KiB of workgroup storage,
/// WebGPU's default limit.
const SMALL: MatmulTiling = MatmulTiling { gx: 16, gy: 16, bm: 4, bn: 4, tk: 32 };
/// 128×128 tiles, 8×8 per invocation (2 × 128 × 16 × 4 bytes = 16 KiB): half the workgroup
/// loads per multiply-add of [`SMALL`]; about 1.5× faster on lavapipe at 1024³, where every
/// workgroup-memory load is a loop over the SIMD lanes.
const LARGE: MatmulTiling = MatmulTiling { gx: 16, gy: 16, bm: 8, bn: 8, tk: 16 };
/// 128×128 tiles, 16×16 per invocation by 64 invocations: twice [`LARGE`]'s multiply-adds
/// per workgroup-memory load. 256 accumulators would spill on a GPU; on a CPU adapter, where
/// an accumulator is a SIMD register or a stack slot and each workgroup-memory load a loop
/// over the lanes, it measured 1.1–1.6× [`LARGE`] on lavapipe (1024³ and the transformer's
/// 256×768×3072). Not a default: lavapipe takes about 2 s to compile it (0.4 s for
/// [`LARGE`]), which only a long run pays back; the autotuner decides.
const CPU_LARGE: MatmulTiling = MatmulTiling { gx: 8, gy: 8, bm: 16, bn: 16, tk: 16 };
/// 16×64 tiles, 4×4 per invocation by 64 invocations: for products of at most 16 rows (a
/// batch of a few vectors through a layer), where [`SMALL`]'s 64 rows would be mostly
/// padding. On lavapipe through the tiled kernel, `[8, 768]·[768, 3072]` and
/// `[1, 768]·[768, 3072]`: 27 ms against 75 ms for [`SMALL`] (medians of 7, in turn).
const FEW_ROWS: MatmulTiling = MatmulTiling { gx: 16, gy: 4, bm: 4, bn: 4, tk: 32 };
/// The default tiling of the cooperative-matrix kernel: 64×64 tiles by 128 invocations, 32
/// deep (see [`CoopPlan`]).
const COOP: MatmulTiling = MatmulTiling { gx: 16, gy: 8, bm: 8, bn: 4, tk: 32 };
/// 128×128 tiles by 256 invocations, 32 deep: with 32-lane subgroups each owns 4×2
/// fragments (6 fragment loads per 8 multiply-adds, against 4 per 4 for [`COOP`]), and the
/// operands are loaded from device memory half as often per multiply-add. Its operand tiles
/// (16 KiB of f16) exceed the plain kernel's 16 KiB of f32 staging, so it is a cooperative
/// tiling only.
const COOP_LARGE: MatmulTiling = MatmulTiling { gx: 16, gy: 16, bm: 8, bn: 8, tk: 32 };
/// [`COOP`] and [`COOP_LARGE`] 64 deep: half the barriers and staging rounds per
/// multiply-add, for twice the operand tiles (24 and 48 KiB in all with 32-lane subgroups).
const COOP_DEEP: MatmulTiling = MatmulTiling { tk: 64, ..COOP };
const COOP_LARGE_DEEP: MatmulTiling = MatmulTiling { tk: 64, ..COOP_LARGE };
/// The side of a cooperative matrix the kernel uses (`coop_mat16x16`).
const COOP_SIDE: usize = 16;

impl MatmulTiling {
    /// The tilings an autotuner times: `SMALL` and `LARGE`; 64×64 tiles of 8×8 blocks
    /// by 64 invocations; 64×128 tiles by 128 invocations; 32×32 tiles of 4×4 blocks with a
    /// 64-deep `k` slice (small matrices, batched attention); 16×64 tiles (few rows); and
    /// for CPU adapters, blocks of 256 and 512 outputs per invocation: `CPU_LARGE`, 64×128
    /// tiles of 16×32 blocks, 128×128 tiles of 32×16 blocks 8 deep (on lavapipe these won 21
    /// of the 27 shape classes the test suite and benchmarks tuned, but take 2–4.5 s each to
    /// compile).
    pub const CANDIDATES: [MatmulTiling; 10] = [
        SMALL,
        LARGE,
        MatmulTiling { gx: 8, gy: 8, bm: 8, bn: 8, tk: 32 },
        MatmulTiling { gx: 16, gy: 8, bm: 8, bn: 8, tk: 16 },
        MatmulTiling { gx: 8, gy: 8, bm: 4, bn: 4, tk: 64 },
        FEW_ROWS,
        CPU_LARGE,
        MatmulTiling { gx: 4, gy: 4, bm: 16, bn: 32, tk: 16 },
        MatmulTiling { gx: 8, gy: 4, bm: 32, bn: 16, tk: 8 },
        // 32×32 tiles by 64 invocations: for products whose output is small beside a GPU
        // (a transformer's 256×768 projections are 12 tiles of 128×128 on an H100's 132
        // multiprocessors; 192 of these).
        MatmulTiling { gx: 8, gy: 8, bm: 4, bn: 4, tk: 32 },
    ];

    /// The tilings of the cooperative-matrix kernel ([`CoopPlan`]), the default first. A
    /// tiling from this list, forced or tuned, selects that kernel for an f16 product that can
    /// run on cooperative matrices (and the plain kernel with its default tiling for any
    /// other product when the tiling is not [`is_valid`](Self::is_valid) for it); no
    /// plain-kernel candidate is in the list, so a tuned choice says which kernel won.
    pub const COOP_CANDIDATES: [MatmulTiling; 4] = [COOP, COOP_LARGE, COOP_DEEP, COOP_LARGE_DEEP];

    /// Whether this is one of [`COOP_CANDIDATES`](Self::COOP_CANDIDATES).
    pub fn is_cooperative(&self) -> bool {
        Self::COOP_CANDIDATES.contains(self)
    }

    /// The untuned choice: `LARGE` where both `m` and `n` fill its tiles, `FEW_ROWS`
    /// for at most 16 rows, else `SMALL` (less padding).
    pub fn default_for(m: usize, n: usize) -> MatmulTiling {
        if m >= 128 && n >= 128 {
            LARGE
        } else if m <= 16 {
            FEW_ROWS
        } else {
            SMALL
        }
    }

    /// Rows × columns of the workgroup's output tile.
    pub fn tile(&self) -> (usize, usize) {
        (self.gy * self.bm, self.gx * self.bn)
    }

    /// Whether the lowering can use it: vec4 blocks, at most 256 invocations, every
    /// invocation loading the same number of vec4s of each tile, and both tiles within
    /// WebGPU's default 16 KiB of workgroup storage.
    pub fn is_valid(&self) -> bool {
        let (tm, tn) = self.tile();
        let wgs = self.gx * self.gy;
        self.bm.is_multiple_of(4)
            && self.bn.is_multiple_of(4)
            && self.bm > 0
            && self.bn > 0
            && self.tk > 0
            && (1..=256).contains(&wgs)
            && (tm * self.tk / 4).is_multiple_of(wgs)
            && (self.tk * tn / 4).is_multiple_of(wgs)
            && (tm + tn) * self.tk * 4 <= 16384
    }
}

impl std::fmt::Display for MatmulTiling {
    /// `gx×gy/bm×bn/tk`, e.g. `16x16/8x8/16`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}/{}x{}/{}", self.gx, self.gy, self.bm, self.bn, self.tk)
    }
}

impl std::str::FromStr for MatmulTiling {
    type Err = String;

    /// Parses the [`Display`](std::fmt::Display) form; rejects tilings that are not
    /// [`MatmulTiling::is_valid`].
    fn from_str(s: &str) -> Result<Self, String> {
        let v: Vec<usize> =
            s.split(['x', '/']).map(|t| t.trim().parse::<usize>()).collect::<Result<_, _>>().map_err(|e| {
                format!("matmul tiling `{s}`: {e} (expected gx x gy / bm x bn / tk, such as 16x16/8x8/16)")
            })?;
        let [gx, gy, bm, bn, tk] = v[..] else {
            return Err(format!("matmul tiling `{s}`: expected five numbers gx x gy / bm x bn / tk"));
        };
        let t = MatmulTiling { gx, gy, bm, bn, tk };
        if !t.is_valid() && !t.is_cooperative() {
            return Err(format!("matmul tiling `{s}` is not usable (vec4 blocks, ≤ 256 invocations, ≤ 16 KiB)"));
        }
        Ok(t)
    }
}

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
/// element type; `None` for every other kernel.
pub fn gemm_shape(g: &Graph, kernel: &Kernel, opts: &LowerOptions) -> Option<(GemmShape, fusegraph_ir::DType)> {
    if kernel.kind != fusegraph_passes::KernelKind::Loop {
        return None;
    }
    let regs = fusegraph_passes::kernel::regions(g, kernel);
    let p = plan(g, kernel, &regs, opts)?;
    let (batch, m, n, k) = gemm_dims(g, p.matmul);
    Some((GemmShape { batch, m, n, k }, g.ty(p.matmul).dtype))
}

/// How `kernel` is lowered by the subgroup matmul under `opts` (see `subgroup_plan`), or
/// `None` where it is not (no matmul, another adapter, operands that are not plain views).
pub fn subgroup_matmul(g: &Graph, kernel: &Kernel, opts: &LowerOptions) -> Option<SubgroupPlan> {
    if kernel.kind != fusegraph_passes::KernelKind::Loop {
        return None;
    }
    let regs = fusegraph_passes::kernel::regions(g, kernel);
    subgroup_plan(g, kernel, &plan(g, kernel, &regs, opts)?, opts)
}

/// How the tiled kernel computes an f16 product on cooperative matrices (tensor cores): the
/// workgroup's subgroups as a `rows`×`cols` grid over its output tile (64×64 by 128
/// invocations by default, or another of [`MatmulTiling::COOP_CANDIDATES`]), each subgroup
/// owning a block of 16×16 accumulators (`coop_mat16x16<f32, C>`).
///
/// The kernel is `tiled_main` with that tiling: the operand tiles are staged in
/// workgroup memory through the operand functions as for the plain kernel (so prologues,
/// ragged edges, batches and convolutions work unchanged), as f16, both tiles row-major —
/// except an operand read from its binding as vec4s (`TiledPlan::vec4_lhs`,
/// `TiledPlan::vec4_rhs`), loaded a `vec4<f16>` at a time into registers one `k` slice
/// ahead, as in the plain kernel;
/// per 16 steps of `k` each subgroup loads its A and B fragments with `coopLoadT` and
/// updates its accumulators with `coopMultiplyAdd` (f16 products, f32 sums). After the last
/// step the results reach the invocations in one pass per fragment row of a subgroup: in
/// pass `i` every subgroup stores its fragments of row `i` into an f32 band of workgroup
/// memory (`rows`×16 rows of the tile), and each invocation whose `bm`×`bn` block lies in
/// those rows reads it; then each runs the fused epilogue and the store of the plain
/// kernel. The band, not the whole f32 tile, is what keeps 128×128 tiles within 48 KiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopPlan {
    /// The tiling: the tile, the invocations and their epilogue blocks, and `tk`.
    pub tiling: MatmulTiling,
    /// Subgroups along the tile's rows.
    pub rows: usize,
    /// Subgroups along the tile's columns.
    pub cols: usize,
    /// The pretend subgroup size where the cooperative-matrix operations are emulated
    /// ([`Cooperative::Emulated`]); `None` on the device's own.
    pub emulated: Option<usize>,
}

impl CoopPlan {
    /// Invocations per workgroup of the default tiling; a subgroup size must divide it (and
    /// then divides every cooperative tiling's).
    pub const INVOCATIONS: usize = COOP.gx * COOP.gy;

    /// Workgroup memory the default tiling declares at most (its f16 operand tiles and, with
    /// one subgroup per fragment row, the whole f32 tile as the band).
    pub const WORKGROUP_BYTES: usize = {
        let (tm, tn) = (COOP.gy * COOP.bm, COOP.gx * COOP.bn);
        (tm + tn) * COOP.tk * 2 + tm * tn * 4
    };

    /// Rows of the f32 band an epilogue pass goes through: one fragment row per subgroup row.
    fn band_rows(&self) -> usize {
        self.rows * COOP_SIDE
    }

    /// Accumulator blocks (16×16 each) per subgroup along the rows and the columns.
    fn blocks(&self) -> (usize, usize) {
        let (tm, tn) = self.tiling.tile();
        (tm / COOP_SIDE / self.rows, tn / COOP_SIDE / self.cols)
    }

    /// A zero accumulator.
    fn zero(&self) -> String {
        match self.emulated {
            None => "coop_mat16x16<f32, C>()".into(),
            Some(size) => format!("array<f32, {}>()", 256 / size),
        }
    }

    /// The A fragment at element `at` of the (row-major) lhs tile.
    fn load_a(&self, at: &str, stride: usize) -> String {
        match self.emulated {
            None => format!("coopLoadT<coop_mat16x16<f16, A>>(&fg_tile_a[{at}], {stride}u)"),
            Some(_) => format!("vec2<u32>({at}, {stride}u)"),
        }
    }

    /// The B fragment at element `at` of the (row-major) rhs tile.
    fn load_b(&self, at: &str, stride: usize) -> String {
        match self.emulated {
            None => format!("coopLoadT<coop_mat16x16<f16, B>>(&fg_tile_b[{at}], {stride}u)"),
            Some(_) => format!("vec2<u32>({at}, {stride}u)"),
        }
    }

    /// `a · b + c`.
    fn multiply_add(&self, a: &str, b: &str, c: &str) -> String {
        match self.emulated {
            None => format!("coopMultiplyAdd({a}, {b}, {c})"),
            Some(_) => format!("fg_emu_mad({a}, {b}, {c}, sg_lane)"),
        }
    }

    /// Stores accumulator `c` row-major at element `at` of the result tile.
    fn store(&self, c: &str, at: &str, stride: usize) -> String {
        match self.emulated {
            None => format!("coopStoreT({c}, &fg_tile_c[{at}], {stride}u);"),
            Some(_) => format!("fg_emu_store_c({c}, {at}, {stride}u, sg_lane);"),
        }
    }

    /// The emulation's functions, for pretend subgroups of `size` lanes. As on hardware, the
    /// 256 elements of an accumulator are spread over the lanes (lane `l` holds elements
    /// `l`, `l + size`, …, row-major); an A or B fragment is its place in the staged tile
    /// (element and stride), read when it is multiplied (the tiles do not change between
    /// the barriers).
    fn emulation(size: usize) -> String {
        let per_lane = 256 / size;
        format!(
            "fn fg_emu_mad(a: vec2<u32>, b: vec2<u32>, c: array<f32, {per_lane}>, lane: u32) -> array<f32, {per_lane}> {{
    var m = c;
    for (var p = 0u; p < {per_lane}u; p = p + 1u) {{
        let e = p * {size}u + lane;
        var acc = m[p];
        for (var q = 0u; q < 16u; q = q + 1u) {{
            acc = acc + f32(fg_tile_a[a.x + (e / 16u) * a.y + q]) * f32(fg_tile_b[b.x + q * b.y + e % 16u]);
        }}
        m[p] = acc;
    }}
    return m;
}}

fn fg_emu_store_c(m: array<f32, {per_lane}>, at: u32, stride: u32, lane: u32) {{
    for (var p = 0u; p < {per_lane}u; p = p + 1u) {{
        let e = p * {size}u + lane;
        fg_tile_c[at + (e / 16u) * stride + e % 16u] = m[p];
    }}
}}

"
        )
    }
}

/// Whether the tiled kernel of `plan` runs on cooperative matrices under `opts`: an f16
/// product (a matmul or convolution) with [`LowerOptions::cooperative_matrix`] and native
/// f16, where the subgroup size (the adapter's fixed one, or the emulated one) splits the
/// invocations of `tiling` (one of [`MatmulTiling::COOP_CANDIDATES`]; any other takes the
/// default) into a grid that divides the tile's blocks of 16×16.
pub fn coop_plan(g: &Graph, plan: &TiledPlan, opts: &LowerOptions, tiling: Option<MatmulTiling>) -> Option<CoopPlan> {
    if !opts.f16_native || g.ty(plan.matmul).dtype != DType::F16 {
        return None;
    }
    let (size, emulated) = match opts.cooperative_matrix? {
        Cooperative::Native => (opts.subgroup_size? as usize, false),
        Cooperative::Emulated { subgroup_size } => (subgroup_size as usize, true),
    };
    let tiling = tiling.filter(MatmulTiling::is_cooperative).unwrap_or(COOP);
    let invocations = tiling.gx * tiling.gy;
    if size == 0 || !invocations.is_multiple_of(size) {
        return None;
    }
    let subgroups = invocations / size;
    let (tm, tn) = tiling.tile();
    let (br, bc) = (tm / COOP_SIDE, tn / COOP_SIDE);
    // The squarest grid (fewest fragment loads per multiply-add), of those the one with the
    // fewest subgroup rows (the smallest f32 band).
    (1..=subgroups)
        .filter(|r| subgroups.is_multiple_of(*r))
        .map(|rows| CoopPlan { tiling, rows, cols: subgroups / rows, emulated: emulated.then_some(size) })
        .filter(|p| br.is_multiple_of(p.rows) && bc.is_multiple_of(p.cols))
        .min_by_key(|p| {
            let (r, c) = p.blocks();
            (r + c, p.rows)
        })
}

/// Whether `kernel` is lowered as a matmul on cooperative matrices under `opts` (see
/// [`CoopPlan`]).
pub fn cooperative_matmul(g: &Graph, kernel: &Kernel, opts: &LowerOptions) -> bool {
    if kernel.kind != fusegraph_passes::KernelKind::Loop {
        return false;
    }
    let regs = fusegraph_passes::kernel::regions(g, kernel);
    plan(g, kernel, &regs, opts).and_then(|p| coop_plan(g, &p, opts, None)).is_some()
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
    if packed_f16(out_ty.dtype, opts) && n % 2 == 1 {
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
fn vec4_value(dtype: DType, v: [String; 4]) -> String {
    let elem = if dtype == DType::F16 { "f16" } else { "f32" };
    format!("vec4<{elem}>({}, {}, {}, {})", v[0], v[1], v[2], v[3])
}

/// Whether the tiled kernel of `plan` writes its output a vec4 at a time: rows a multiple of
/// 4 long (every invocation's columns start at a multiple of 4 and are 4, 8 … long) and
/// storage of f32 or native f16.
pub fn tiled_vec4_store(g: &Graph, plan: &TiledPlan, opts: &LowerOptions) -> bool {
    let dt = g.ty(plan.output).dtype;
    gemm_dims(g, plan.matmul).2.is_multiple_of(4) && (dt == DType::F32 || (dt == DType::F16 && !packed_f16(dt, opts)))
}

/// Writes `eO_acc` and the workgroup tiles into `body` and returns `main` and the number of
/// workgroups (one per output tile per batch entry).
#[allow(clippy::too_many_arguments)]
pub fn tiled_main(
    g: &Graph,
    kernel: &Kernel,
    bindings: &[Binding],
    plan: &TiledPlan,
    regions: &[(NodeId, Vec<NodeId>)],
    opts: &LowerOptions,
    strategy: &Strategy,
    coop: Option<CoopPlan>,
    inv: &Invariants,
    body: &mut String,
) -> (String, u64) {
    let TiledPlan { matmul: mm, output, vec4_lhs, vec4_rhs } = *plan;
    let binding = |node: NodeId| bindings.iter().position(|b| b.node == node && !b.output).expect("a bound operand");
    let region = &regions.iter().find(|(o, _)| *o == output).expect("the output has a region").1;
    write_region(g, output, region, Some(mm), &inv.params(), body);

    let ops = g.operands(mm);
    let conv = matches!(g.node(mm).op, Op::Conv2d { .. });
    // A convolution is an implicit GEMM: the weights [o, c·kh·kw] times the image patches
    // [c·kh·kw, oh·ow] of each image, patches gathered on the fly by `fg_im2col`.
    let (lhs, rhs) = if conv { (ops[1], ops[0]) } else { (ops[0], ops[1]) };
    let (batch, m, n, k) = gemm_dims(g, mm);
    let (ld, rd) = (g.ty(lhs).shape.dims(), g.ty(rhs).shape.dims());
    let dims = g.ty(mm).shape.dims();
    let rank = dims.len();
    let MatmulTiling { gx, gy, bm, bn, tk } = match coop {
        Some(cp) => cp.tiling,
        None => strategy.matmul_tiling.filter(MatmulTiling::is_valid).unwrap_or(MatmulTiling::default_for(m, n)),
    };
    let (tm, tn, wgs) = (gy * bm, gx * bn, gx * gy);
    let groups = ColumnGroups { gx, per: bn / 4, blocked: strategy.blocked_columns };
    let (tiles_m, tiles_n) = (m.div_ceil(tm), n.div_ceil(tn));
    let workgroups = (batch * tiles_m * tiles_n) as u64;
    let t = vty(g.ty(mm).dtype);
    let (k_out, out_b) = bindings.iter().enumerate().find(|(_, b)| b.output).expect("one output");
    let out_dt = g.ty(out_b.node).dtype;
    let vec4_store = tiled_vec4_store(g, plan, opts);

    // Tiles of vec4s: fg_tile_a[kk * tm/4 + q] holds rows 4q..4q+3 of the lhs tile at `kk`,
    // fg_tile_b[kk * tn/4 + q] columns 4q..4q+3 of the rhs tile (one load per 4 values).
    // Cooperative matrices load from scalar f16 arrays, both tiles row-major: the lhs tile
    // (stride tk) so that the invocations of a subgroup, which load adjacent `k` of one
    // row, store adjacent halves (column-major put their stores tm halves apart, all in one
    // bank; row-major made the kernel 1.3× faster at 1024³ on an H100), the rhs tile
    // (stride tn).
    if let Some(cp) = coop {
        let _ = writeln!(body, "var<workgroup> fg_tile_a: array<f16, {}>;", tk * tm);
        let _ = writeln!(body, "var<workgroup> fg_tile_b: array<f16, {}>;", tk * tn);
        let _ = writeln!(body, "var<workgroup> fg_tile_c: array<f32, {}>;\n", cp.band_rows() * tn);
        if let Some(size) = cp.emulated {
            body.push_str(&CoopPlan::emulation(size));
        }
    } else {
        let _ = writeln!(body, "var<workgroup> fg_tile_a: array<vec4<{t}>, {}>;", tk * tm / 4);
        let _ = writeln!(body, "var<workgroup> fg_tile_b: array<vec4<{t}>, {}>;\n", tk * tn / 4);
    }

    let mut s = String::new();
    let w = line;
    let extra_args = match coop {
        Some(CoopPlan { emulated: None, .. }) => ", @builtin(subgroup_id) sg_id: u32",
        _ => "",
    };
    s.push_str(&tile_head(wgs, extra_args, workgroups, tiles_m, tiles_n));
    let bc = if conv {
        write_im2col(g, mm, body);
        w(&mut s, 1, "let a_base = 0u;".into());
        Vec::new()
    } else {
        let bc = unravel(&mut s, &dims[..rank - 2], "bt", "bc");
        for (name, od, size) in [("a_base", ld, m * k), ("b_base", rd, k * n)] {
            w(&mut s, 1, format!("let {name} = {};", operand_base(&bc, od, size)));
        }
        bc
    };
    w(&mut s, 1, format!("let o_base = bt * {}u;", m * n));
    w(&mut s, 1, format!("let row0 = tile_row * {tm}u;"));
    w(&mut s, 1, format!("let col0 = tile_col * {tn}u;"));
    w(&mut s, 1, format!("let tx = lid % {gx}u;"));
    w(&mut s, 1, format!("let ty = lid / {gx}u;"));
    if let Some(cp) = coop {
        let (br, bc) = cp.blocks();
        if let Some(size) = cp.emulated {
            w(&mut s, 1, format!("let sg_id = lid / {size}u;"));
            w(&mut s, 1, format!("let sg_lane = lid % {size}u;"));
        }
        w(&mut s, 1, format!("let sg_row = (sg_id / {}u) * {}u;", cp.cols, br * COOP_SIDE));
        w(&mut s, 1, format!("let sg_col = (sg_id % {}u) * {}u;", cp.cols, bc * COOP_SIDE));
        for i in 0..br {
            for j in 0..bc {
                w(&mut s, 1, format!("var fg_c{i}_{j} = {};", cp.zero()));
            }
        }
    } else {
        for r in 0..bm {
            for p in 0..bn / 4 {
                w(&mut s, 1, format!("var acc{r}_{p} = vec4<{t}>();"));
            }
        }
    }
    // Operands read from their bindings as vec4s (`vec4_lhs`, `vec4_rhs`) are loaded into
    // registers one `k` slice ahead: the loads of the next slice are in flight
    // while this one is multiplied.
    let prefetch = ((vec4_lhs.is_some() || vec4_rhs.is_some()) && tk.is_multiple_of(4)).then(|| Prefetch {
        lhs: vec4_lhs.map(|v| Staged::of(g, kernel, lhs, v, true, &bc, binding(v.leaf))),
        rhs: vec4_rhs.map(|v| Staged::of(g, kernel, rhs, v, false, &bc, binding(v.leaf))),
        dims: (m, n, k),
        tile: (tm, tn, tk),
        wgs,
        elem: storage_elem(g.ty(lhs).dtype, opts),
        tile_elem: if coop.is_some() { "f16" } else { t },
        coop: coop.is_some(),
    });
    if let Some(p) = &prefetch {
        p.load(&mut s, "0u", true);
    }
    w(&mut s, 1, format!("for (var k0 = 0u; k0 < {k}u; k0 = k0 + {tk}u) {{"));
    // Load phase: prefetched operands store their registers; any other operand is loaded
    // four values of a column of the lhs tile (or a row of the rhs tile) per invocation
    // through its operand function, and stored as one vec4 (as f16 halves for cooperative
    // matrices).
    let (lv, rv) = (format!("v{}", lhs.index()), format!("v{}", rhs.index()));
    if let Some(p) = prefetch.as_ref().filter(|p| p.lhs.is_some()) {
        p.store(&mut s, true);
    } else {
        w(&mut s, 2, format!("for (var l = 0u; l < {}u; l = l + 1u) {{", tm * tk / 4 / wgs));
        w(&mut s, 3, format!("let e = l * {wgs}u + lid;"));
        w(&mut s, 3, format!("let r = row0 + (e / {tk}u) * 4u;"));
        w(&mut s, 3, format!("let kk = e % {tk}u;"));
        w(&mut s, 3, "let gk = k0 + kk;".into());
        w(&mut s, 3, format!("var x = vec4<{t}>();"));
        w(&mut s, 3, format!("if (gk < {k}u) {{"));
        for (q, comp) in XYZW.iter().enumerate() {
            w(&mut s, 4, format!("if (r + {q}u < {m}u) {{ x.{comp} = {lv}(a_base + (r + {q}u) * {k}u + gk); }}"));
        }
        w(&mut s, 3, "}".into());
        if coop.is_some() {
            w(&mut s, 3, format!("let ia = (e / {tk}u) * {}u + kk;", 4 * tk));
            for (q, comp) in XYZW.iter().enumerate() {
                w(&mut s, 3, format!("fg_tile_a[ia + {}u] = f16(x.{comp});", q * tk));
            }
        } else {
            w(&mut s, 3, format!("fg_tile_a[kk * {}u + e / {tk}u] = x;", tm / 4));
        }
        w(&mut s, 2, "}".into());
    }
    if let Some(p) = prefetch.as_ref().filter(|p| p.rhs.is_some()) {
        p.store(&mut s, false);
    } else {
        w(&mut s, 2, format!("for (var l = 0u; l < {}u; l = l + 1u) {{", tk * tn / 4 / wgs));
        w(&mut s, 3, format!("let e = l * {wgs}u + lid;"));
        w(&mut s, 3, format!("let gk = k0 + e / {}u;", tn / 4));
        w(&mut s, 3, format!("let c = col0 + (e % {}u) * 4u;", tn / 4));
        w(&mut s, 3, format!("var x = vec4<{t}>();"));
        w(&mut s, 3, format!("if (gk < {k}u) {{"));
        for (q, comp) in XYZW.iter().enumerate() {
            let load = if conv {
                format!("fg_im2col(bt, gk, c + {q}u)")
            } else {
                format!("{rv}(b_base + gk * {n}u + c + {q}u)")
            };
            w(&mut s, 4, format!("if (c + {q}u < {n}u) {{ x.{comp} = {load}; }}"));
        }
        w(&mut s, 3, "}".into());
        if coop.is_some() {
            for (q, comp) in XYZW.iter().enumerate() {
                w(&mut s, 3, format!("fg_tile_b[e * 4u + {q}u] = f16(x.{comp});"));
            }
        } else {
            w(&mut s, 3, "fg_tile_b[e] = x;".into());
        }
        w(&mut s, 2, "}".into());
    }
    w(&mut s, 2, "workgroupBarrier();".into());
    if let Some(p) = &prefetch {
        p.load(&mut s, &format!("k0 + {tk}u"), false);
    }
    match coop {
        Some(cp) => coop_compute(&mut s, &cp, (tm, tn), (bm, bn), tk, &groups),
        None => tiled_compute(&mut s, (tm, tn), (bm, bn), tk, &groups),
    }

    // Epilogue and store, in-range outputs only: column `c` of the invocation's block is
    // `gcP + c % 4` (P = c / 4), element `idx + gcP + c % 4` of the output.
    let e = format!("e{}_acc", output.index());
    for p in 0..bn / 4 {
        w(&mut s, 1, format!("let gc{p} = col0 + {};", groups.column(p)));
    }
    let col = |c: usize| format!("gc{} + {}u", c / 4, c % 4);
    let cols: Vec<String> = (0..bn).map(col).collect();
    inv.read_columns(&mut s, "o_base", &format!("min(row0 + ty * {bm}u, {}u)", m - 1), &cols, n);
    for r in 0..bm {
        w(&mut s, 1, format!("if (row0 + ty * {bm}u + {r}u < {m}u) {{"));
        w(&mut s, 2, format!("let idx = o_base + (row0 + ty * {bm}u + {r}u) * {n}u;"));
        let given = inv.read_row(&mut s, "idx");
        for c in 0..bn {
            // `eO_acc`'s arguments after the index: the accumulator, then the invariants.
            let acc = |c: usize| format!("acc{r}_{}.{}{}", c / 4, XYZW[c % 4], given(c));
            if packed_f16(out_dt, opts) {
                // `n` is even and `gcP` a multiple of 4: both halves of each word are ours.
                if c % 2 == 0 {
                    w(
                        &mut s,
                        2,
                        format!(
                            "if ({} < {n}u) {{ b{k_out}[(idx + {}) >> 1u] = \
                             pack2x16float(vec2<f32>({e}(idx + {}, {}), {e}(idx + {}, {}))); }}",
                            col(c),
                            col(c),
                            col(c),
                            acc(c),
                            col(c + 1),
                            acc(c + 1)
                        ),
                    );
                }
            } else if vec4_store {
                // `n` is a multiple of 4 and so are `idx` and `gcP`: whole aligned vec4s.
                if c % 4 == 0 {
                    let value = |c: usize| store_value(out_dt, &format!("{e}(idx + {}, {})", col(c), acc(c)));
                    let quad = vec4_value(out_dt, [value(c), value(c + 1), value(c + 2), value(c + 3)]);
                    let at = col(c);
                    w(&mut s, 2, format!("if ({at} < {n}u) {{ b{k_out}[(idx + {at}) >> 2u] = {quad}; }}"));
                }
            } else {
                let value = store_value(out_dt, &format!("{e}(idx + {}, {})", col(c), acc(c)));
                w(&mut s, 2, format!("if ({} < {n}u) {{ b{k_out}[idx + {}] = {value}; }}", col(c), col(c)));
            }
        }
        w(&mut s, 1, "}".into());
    }
    w(&mut s, 0, "}".into());
    (s, workgroups)
}

const XYZW: [&str; 4] = ["x", "y", "z", "w"];

/// Appends `text` as a line indented by `indent` levels.
fn line(s: &mut String, indent: usize, text: String) {
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
struct ColumnGroups {
    gx: usize,
    per: usize,
    blocked: bool,
}

impl ColumnGroups {
    /// WGSL for the index (in fours of columns, from the tile's first column) of group `p`.
    fn at(&self, p: usize) -> String {
        match (self.blocked, p) {
            (true, _) if self.per == 1 => "tx".into(),
            (true, _) => format!("tx * {}u + {p}u", self.per),
            (false, 0) => "tx".into(),
            (false, _) => format!("{}u + tx", p * self.gx),
        }
    }

    /// WGSL for the tile column of group `p`'s first column.
    fn column(&self, p: usize) -> String {
        match self.at(p).as_str() {
            "tx" => "tx * 4u".into(),
            at => format!("({at}) * 4u"),
        }
    }
}

/// The compute phase of the plain tiled kernel: rows ty*bm.., column groups `groups` of the
/// tile; (bm + bn) / 4 vec4 loads per bm × bn multiply-adds.
fn tiled_compute(s: &mut String, (tm, tn): (usize, usize), (bm, bn): (usize, usize), tk: usize, groups: &ColumnGroups) {
    let w = line;
    w(s, 2, format!("for (var kk = 0u; kk < {tk}u; kk = kk + 1u) {{"));
    for q in 0..bm / 4 {
        w(s, 3, format!("let a{q} = fg_tile_a[kk * {}u + ty * {}u + {q}u];", tm / 4, bm / 4));
    }
    for p in 0..bn / 4 {
        w(s, 3, format!("let b{p} = fg_tile_b[kk * {}u + {}];", tn / 4, groups.at(p)));
    }
    for r in 0..bm {
        for p in 0..bn / 4 {
            w(s, 3, format!("acc{r}_{p} = acc{r}_{p} + a{}.{} * b{p};", r / 4, XYZW[r % 4]));
        }
    }
    w(s, 2, "}".into());
    w(s, 2, "workgroupBarrier();".into());
    w(s, 1, "}".into());
}

/// How the tiled kernel stages the operands it reads straight from their bindings
/// ([`TiledPlan::vec4_lhs`], [`TiledPlan::vec4_rhs`]): each invocation holds its share of the
/// next `k` slice in registers (`pa{l}`, `pb{l}`: a vec4 of the storage type per load, one
/// bounds check each, where the operand functions take a load and a check per value), loaded
/// right after the slice before is in workgroup memory, so those loads are in flight during
/// the multiply-adds; at the top of the next step they are stored to the tiles.
///
/// Both operands are handled alike, as `outer × k` (the lhs's `m` rows, the rhs's `n`
/// columns): a load holds four elements adjacent along `k` or along `outer`, element `(o, kk)`
/// of the tile is `o` from the tile's origin (`row0`, `col0`) and `kk` from `k0`.
struct Prefetch {
    lhs: Option<Staged>,
    rhs: Option<Staged>,
    /// `m`, `n`, `k` of the product.
    dims: (usize, usize, usize),
    /// `tm`, `tn`, `tk` of the tiling.
    tile: (usize, usize, usize),
    /// Invocations per workgroup.
    wgs: usize,
    /// The operands' storage element (`f32`, `f16`, `i32`, `u32`).
    elem: &'static str,
    /// The tiles' element: `f16` on cooperative matrices, else the compute type.
    tile_elem: &'static str,
    /// The cooperative kernel's tile layouts (scalars, row-major: the lhs `tm × tk`, the rhs
    /// `tk × tn`) instead of the plain kernel's (vec4s of four adjacent `outer` at one `k`,
    /// the vec4s of each `k` together).
    coop: bool,
}

/// One prefetched operand: its binding index, whether its vec4s run along `k`, and where
/// element `(o, kk)` of the operand's batch entry lies in the binding: `base + o·outer +
/// kk·k_stride` (`base` a WGSL expression of the batch coordinates).
struct Staged {
    binding: usize,
    along_k: bool,
    base: String,
    outer: usize,
    k_stride: usize,
}

impl Staged {
    /// The staging of operand `op` (the lhs where `lhs`) read as `v` from binding `binding`,
    /// at the result's batch coordinates `bc` (its batch dims are the result's last ones,
    /// broadcast where 1).
    fn of(g: &Graph, kernel: &Kernel, op: NodeId, v: Vec4Operand, lhs: bool, bc: &[String], binding: usize) -> Staged {
        let view = strided_view(g, kernel, op).expect("the plan's strided view");
        let (od, st) = (g.ty(op).shape.dims(), &view.strides);
        let r = od.len();
        let mut terms: Vec<String> = (view.offset > 0).then(|| format!("{}u", view.offset)).into_iter().collect();
        for q in 0..r - 2 {
            if od[q] > 1 && st[q] > 0 {
                terms.push(format!("{} * {}u", bc[q + bc.len() + 2 - r], st[q]));
            }
        }
        let base = if terms.is_empty() { "0u".to_string() } else { terms.join(" + ") };
        let (outer, k_stride) = if lhs { (st[r - 2], st[r - 1]) } else { (st[r - 1], st[r - 2]) };
        Staged { binding, along_k: v.along_k, base, outer, k_stride }
    }
}

/// `expr · stride` in WGSL (`None` for stride 0).
fn scaled(expr: &str, stride: usize) -> Option<String> {
    match stride {
        0 => None,
        1 => Some(expr.to_string()),
        s => Some(format!("({expr}) * {s}u")),
    }
}

impl Prefetch {
    /// The lhs's or the rhs's staging, with its tile side (`tm`, `tn`), extent (`m`, `n`),
    /// origin and register and tile names.
    fn side(&self, lhs: bool) -> (Option<&Staged>, usize, usize, &'static str, &'static str) {
        let ((m, n, _), (tm, tn, _)) = (self.dims, self.tile);
        if lhs {
            (self.lhs.as_ref(), tm, m, "row0", "a")
        } else {
            (self.rhs.as_ref(), tn, n, "col0", "b")
        }
    }

    /// vec4 loads per invocation per slice of the operand.
    fn count(&self, lhs: bool) -> usize {
        let (_, side, ..) = self.side(lhs);
        side * self.tile.2 / 4 / self.wgs
    }

    /// WGSL defining `o` and `kq`, the tile coordinates of the first of the four elements of
    /// load `l` of the operand.
    fn coords(&self, lhs: bool, l: usize) -> String {
        let (staged, side, ..) = self.side(lhs);
        let (tk, e) = (self.tile.2, format!("({}u + lid)", l * self.wgs));
        match staged {
            Some(Staged { along_k: true, .. }) => {
                format!("let o = {e} / {q}u; let kq = ({e} % {q}u) * 4u;", q = tk / 4)
            }
            _ => format!("let kq = {e} / {q}u; let o = ({e} % {q}u) * 4u;", q = side / 4),
        }
    }

    /// Loads (declaring the registers where `declare`) the slice starting at `k0`.
    fn load(&self, s: &mut String, k0: &str, declare: bool) {
        let (k, indent, elem) = (self.dims.2, if declare { 1 } else { 2 }, self.elem);
        for lhs in [true, false] {
            let (Some(st), _, extent, origin, name) = self.side(lhs) else { continue };
            let index: Vec<String> = [
                (st.base != "0u").then(|| st.base.clone()),
                scaled(&format!("{origin} + o"), st.outer),
                scaled(&format!("{k0} + kq"), st.k_stride),
            ]
            .into_iter()
            .flatten()
            .collect();
            let index = index.join(" + ");
            for l in 0..self.count(lhs) {
                let decl = if declare { "var " } else { "" };
                line(s, indent, format!("{decl}p{name}{l} = vec4<{elem}>();"));
                line(
                    s,
                    indent,
                    format!(
                        "{{ {} if ({origin} + o < {extent}u && {k0} + kq < {k}u) {{ p{name}{l} = b{}[({index}) >> 2u]; }} }}",
                        self.coords(lhs, l),
                        st.binding
                    ),
                );
            }
        }
    }

    /// Stores the operand's registers to its tile: element `(o, kk)` to the cooperative
    /// kernel's row-major tile, or to component `o % 4` of the plain tile's vec4 — the
    /// whole vec4 at once where the load ran along `outer` and the types agree.
    fn store(&self, s: &mut String, lhs: bool) {
        let (Some(st), side, _, _, name) = self.side(lhs) else { return };
        let (tk, t) = (self.tile.2, self.tile_elem);
        let cast = |v: String| if self.elem == t { v } else { format!("{t}({v})") };
        for l in 0..self.count(lhs) {
            line(s, 2, format!("{{ {}", self.coords(lhs, l)));
            if !self.coop && !st.along_k {
                let v = if self.elem == t { format!("p{name}{l}") } else { format!("vec4<{t}>(p{name}{l})") };
                line(s, 3, format!("fg_tile_{name}[kq * {}u + o / 4u] = {v};", side / 4));
            } else {
                for (q, comp) in XYZW.iter().enumerate() {
                    let (o, kk) = if st.along_k {
                        ("o".to_string(), format!("kq + {q}u"))
                    } else {
                        (format!("o + {q}u"), "kq".to_string())
                    };
                    let at = match (self.coop, lhs) {
                        (false, _) => format!("[({kk}) * {}u + ({o}) / 4u][({o}) % 4u]", side / 4),
                        (true, true) => format!("[({o}) * {tk}u + {kk}]"),
                        (true, false) => format!("[({kk}) * {side}u + {o}]"),
                    };
                    line(s, 3, format!("fg_tile_{name}{at} = {};", cast(format!("p{name}{l}.{comp}"))));
                }
            }
            line(s, 2, "}".into());
        }
    }
}

/// The compute phase on cooperative matrices: per 16 steps of `k`, the subgroup's A
/// fragments (rows sg_row..) and B fragments (columns sg_col..) and every product; after the
/// last step the accumulators go through workgroup memory to each invocation's `bm`×`bn`
/// block (`accR_P`, as the plain kernel leaves them).
fn coop_compute(
    s: &mut String,
    cp: &CoopPlan,
    (_, tn): (usize, usize),
    (bm, bn): (usize, usize),
    tk: usize,
    groups: &ColumnGroups,
) {
    let w = line;
    let (br, bc) = cp.blocks();
    w(s, 2, format!("for (var kk = 0u; kk < {tk}u; kk = kk + {COOP_SIDE}u) {{"));
    for i in 0..br {
        let at = format!("(sg_row + {}u) * {tk}u + kk", i * COOP_SIDE);
        w(s, 3, format!("let fa{i} = {};", cp.load_a(&at, tk)));
    }
    for j in 0..bc {
        let at = format!("kk * {tn}u + sg_col + {}u", j * COOP_SIDE);
        w(s, 3, format!("let fb{j} = {};", cp.load_b(&at, tn)));
    }
    for i in 0..br {
        for j in 0..bc {
            let mad = cp.multiply_add(&format!("fa{i}"), &format!("fb{j}"), &format!("fg_c{i}_{j}"));
            w(s, 3, format!("fg_c{i}_{j} = {mad};"));
        }
    }
    w(s, 2, "}".into());
    w(s, 2, "workgroupBarrier();".into());
    w(s, 1, "}".into());
    // The accumulators through the f32 band to the invocations' blocks, one pass per
    // fragment row of a subgroup: tile row `R` of pass `R % (br·16) / 16` is band row
    // `R / (br·16) · 16 + R % 16`. A block of `bm` ≤ 16 rows from a multiple of `bm` lies in
    // one fragment row, so each invocation reads in one pass.
    let strip = br * COOP_SIDE;
    debug_assert!(COOP_SIDE.is_multiple_of(bm), "a block of {bm} rows within one fragment row");
    for r in 0..bm {
        for p in 0..bn / 4 {
            w(s, 1, format!("var acc{r}_{p} = vec4<f32>();"));
        }
    }
    w(s, 1, format!("let my_pass = ((ty * {bm}u) % {strip}u) / {COOP_SIDE}u;"));
    w(s, 1, format!("let band_row = ((ty * {bm}u) / {strip}u) * {COOP_SIDE}u + (ty * {bm}u) % {COOP_SIDE}u;"));
    for i in 0..br {
        for j in 0..bc {
            let at = format!("(sg_row / {br}u) * {tn}u + sg_col + {}u", j * COOP_SIDE);
            w(s, 1, cp.store(&format!("fg_c{i}_{j}"), &at, tn));
        }
        w(s, 1, "workgroupBarrier();".into());
        w(s, 1, format!("if (my_pass == {i}u) {{"));
        for r in 0..bm {
            for p in 0..bn / 4 {
                let at = format!("(band_row + {r}u) * {tn}u + {}", groups.column(p));
                let v: Vec<String> = (0..4).map(|c| format!("fg_tile_c[{at} + {c}u]")).collect();
                w(s, 2, format!("acc{r}_{p} = vec4<f32>({});", v.join(", ")));
            }
        }
        w(s, 1, "}".into());
        if i + 1 < br {
            w(s, 1, "workgroupBarrier();".into());
        }
    }
}

/// How a subgroup matmul (see `subgroup_main`) reads its operands: an operand that is a
/// strided view of an f32 binding ([`StridedView`]) is loaded as vec4s straight from the
/// binding, which the kernel declares as `array<vec4<f32>>` (the lhs along `k`, the rhs
/// along `n`, or along `k` where `rhs_transposed`); any other operand (a fused prologue, a
/// view that merges axes) through its element function, four calls per vec4.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubgroupPlan {
    /// The lhs `[.., m, k]` as a view of its binding (`k` contiguous), if it is one.
    pub lhs: Option<StridedView>,
    /// The axes of the lhs binding that make up `k`, (length, stride) outermost first: one
    /// for a plain view, several where a reshape merged them (see
    /// [`split_last_axis_view`]); the innermost is contiguous and a multiple of 4 long.
    pub lhs_k_axes: Vec<(usize, usize)>,
    /// The rhs `[.., k, n]` as a view of its binding, if it is one.
    pub rhs: Option<StridedView>,
    /// The rhs view is contiguous along `k` (a transposed operand, `Q·Kᵀ`), not along `n`.
    pub rhs_transposed: bool,
    /// Whether the lhs and rhs views are of values below casts that round to f16 (see
    /// `below_float_casts`): each vec4 loaded is rounded.
    pub round: [bool; 2],
    /// The output is written a vec4 at a time (its rows' length is a multiple of 4, its
    /// storage f32 or native f16), from each lane's 4 adjacent columns.
    pub vec4_store: bool,
    /// The adapter's (fixed) subgroup size: the invocations of a workgroup.
    pub lanes: usize,
    /// Output rows per workgroup (a multiple of `lanes`: lane `l` loads rows `l`, `l + lanes`…).
    pub rows: usize,
    /// The bindings read from textures rather than storage buffers (see
    /// [`crate::LowerOptions::texture_operands`]): the leaves of `lhs` and `rhs`, then the
    /// inputs that an operand without a view reads inside the `k` loop (a convolution's
    /// image, a fused prologue's inputs), each where it fits a texture and the kernel loads
    /// its elements more than once (not the rhs of a product of at most `rows` rows).
    pub textures: Vec<NodeId>,
}

impl SubgroupPlan {
    /// Output columns per workgroup: each lane owns 4.
    pub fn cols(&self) -> usize {
        4 * self.lanes
    }
}

/// Whether the tiled matmul `plan` of `kernel` can take the subgroup lowering under `opts`:
/// a CPU adapter with subgroup operations of a fixed size, a matmul or ungrouped
/// convolution in f32 or f16 (accumulated in f32) with an output that is not packed f16.
/// Operands that are strided views of f32 or native f16 bindings (`vec4<f16>`, widened on
/// load), contiguous along `k` (lhs) or along `n` or `k` (rhs, `n` a multiple of 4 for the
/// former), with every other stride and the offset multiples of 4, are read as aligned
/// vec4s — along `k` only where `k` is a multiple of 4; others through their element
/// functions (a convolution's patches through `fg_im2col`). A ragged `k` ends with a step
/// over its last 1–3 (the first convolution of an RGB network: `k` = 27).
pub fn subgroup_plan(g: &Graph, kernel: &Kernel, plan: &TiledPlan, opts: &LowerOptions) -> Option<SubgroupPlan> {
    let lanes = opts.subgroup_size? as usize;
    if !(opts.cpu && opts.subgroups && (4..=64).contains(&lanes) && lanes.is_power_of_two()) {
        return None;
    }
    let mm = plan.matmul;
    let ops = g.operands(mm);
    // f32 or f16 storage (computed in f32: mixed precision's products).
    let floats = [mm, ops[0], ops[1]].iter().all(|&n| matches!(g.ty(n).dtype, DType::F32 | DType::F16));
    let ranks = ops.iter().all(|&o| g.ty(o).shape.rank() >= 2);
    let conv = matches!(g.node(mm).op, Op::Conv2d { groups: 1, .. });
    if !(conv || matches!(g.node(mm).op, Op::MatMul)) || !floats || !ranks || packed_f16(g.ty(plan.output).dtype, opts)
    {
        return None;
    }
    let (batch, m, n, k) = gemm_dims(g, mm);
    // Contiguous along axis `unit`; every other stride and the offset in whole vec4s; a
    // binding of f32 or of native f16 (`vec4<f16>`, widened on load).
    let aligned = |v: &StridedView, unit: usize| {
        !packed_f16(g.ty(v.leaf).dtype, opts)
            && v.offset.is_multiple_of(4)
            && v.strides.iter().enumerate().all(|(a, &s)| a == unit || s.is_multiple_of(4))
            && v.strides[unit] == 1
            && g.ty(v.leaf).shape.numel().is_multiple_of(4)
    };
    // A convolution's lhs is its weights [o, c, kh, kw] as [o, c·kh·kw], shared by every
    // image; its rhs the image patches, gathered by `fg_im2col`.
    // Each operand is read below its float casts, rounded per vec4 where they round.
    let (lhs_src, lhs_round) = below_float_casts(g, kernel, if conv { ops[1] } else { ops[0] });
    let (rhs_src, rhs_round) = below_float_casts(g, kernel, ops[1]);
    let lhs_view = if conv {
        strided_view(g, kernel, lhs_src).and_then(|v| {
            let strides = reshape_strides(g.ty(lhs_src).shape.dims(), &v.strides, &[m, k])?;
            Some((StridedView { strides, ..v }, vec![(k, 1)]))
        })
    } else {
        split_last_axis_view(g, kernel, lhs_src)
    };
    // Views along `k` need whole vec4s of it; with a ragged `k` those operands are read
    // through their element functions (the last step takes the remaining 1–3).
    let whole_k = k.is_multiple_of(4);
    let (lhs, lhs_k_axes) = match lhs_view {
        Some((v, axes))
            if whole_k
                && aligned(&v, v.strides.len() - 1)
                && axes.last().is_some_and(|&(d, _)| d.is_multiple_of(4))
                && axes.iter().rev().skip(1).all(|&(_, s)| s.is_multiple_of(4)) =>
        {
            (Some(v), axes)
        }
        _ => (None, Vec::new()),
    };
    let (rhs, rhs_transposed) = match strided_view(g, kernel, rhs_src).filter(|_| !conv) {
        Some(v) if n.is_multiple_of(4) && aligned(&v, v.strides.len() - 1) => (Some(v), false),
        Some(v) if whole_k && aligned(&v, v.strides.len() - 2) => (Some(v), true),
        _ => (None, false),
    };
    let rows = if m >= 64 { 64 } else { m.div_ceil(lanes) * lanes };
    // Read from textures where their vec4s fit one: the operand views, and the bindings that
    // operands without a view read through element functions inside the `k` loop (a
    // convolution's image, a prologue's inputs), f32 or native f16 of whole vec4s.
    let fits = |n: NodeId| {
        let numel = g.ty(n).shape.numel();
        opts.texture_operands.is_some_and(|rows| (numel / 4) as u64 <= rows as u64 * crate::TEXTURE_ROW as u64)
            && numel > 0
            && numel.is_multiple_of(4)
            && matches!(g.ty(n).dtype, DType::F32 | DType::F16)
            && !packed_f16(g.ty(n).dtype, opts)
    };
    // A texture pays for its copy only where the kernel loads each element of the operand
    // more than once: every workgroup computes `rows` rows by `4·lanes` columns of one
    // product, so it loads each lhs element once per tile of columns and each rhs element
    // once per tile of rows, and a binding smaller than its operand (broadcast along the
    // batch, a weight shared by every product) is loaded by every product reading it. A
    // skinny product (`m` ≤ `rows`: a decoder's step, a small batch through a large weight)
    // loads its own rhs once, and copying it into a texture first only added a copy of it:
    // 8×2048×2048 f32 took 16.5–18.1 ms that way, 10.7–14.4 from the buffer (lavapipe,
    // BENCHMARKS.md). A convolution reads its weights for every image and its image's
    // elements in several patches.
    let reused = |side: usize, node: NodeId| {
        let numel = g.ty(node).shape.numel();
        conv || if side == 0 { n > 4 * lanes || numel < batch * m * k } else { m > rows || numel < batch * k * n }
    };
    let mut textures: Vec<NodeId> = [&lhs, &rhs]
        .into_iter()
        .enumerate()
        .filter_map(|(side, v)| v.as_ref().filter(|v| reused(side, v.leaf)))
        .map(|v| v.leaf)
        .filter(|&n| fits(n))
        .collect();
    let unviewed =
        [(lhs.is_none(), if conv { ops[1] } else { ops[0] }), (rhs.is_none(), if conv { ops[0] } else { ops[1] })];
    for (side, (_, op)) in unviewed.into_iter().enumerate().filter(|(_, (none, _))| *none) {
        let mut stack = vec![op];
        while let Some(n) = stack.pop() {
            if kernel.members.contains(&n) {
                stack.extend(g.operands(n).iter().copied());
            } else if kernel.inputs.contains(&n) && fits(n) && reused(side, n) && !textures.contains(&n) {
                textures.push(n);
            }
        }
    }
    // Within the sampled textures every adapter allows a shader stage (WebGPU's minimum).
    textures.truncate(MAX_TEXTURE_OPERANDS);
    let round = [lhs.is_some() && lhs_round, rhs.is_some() && rhs_round];
    let vec4_store = n.is_multiple_of(4) && matches!(g.ty(plan.output).dtype, DType::F32 | DType::F16);
    Some(SubgroupPlan { lhs, lhs_k_axes, rhs, rhs_transposed, round, vec4_store, lanes, rows, textures })
}

/// The most texture operands of one kernel: WebGPU's minimum of
/// `max_sampled_textures_per_shader_stage`, so every adapter binds them.
const MAX_TEXTURE_OPERANDS: usize = 16;

/// `op`, or the value below the float-to-float casts it is made of (mixed precision rounds
/// f32 weights to f16 on their way into a product), and whether those casts round to f16:
/// a product reads that value's view and rounds each vec4 (`fg_round_f16x4`), instead of
/// calling the cast's element function per element.
fn below_float_casts(g: &Graph, kernel: &Kernel, op: NodeId) -> (NodeId, bool) {
    let float = |n: NodeId| matches!(g.ty(n).dtype, DType::F32 | DType::F16);
    let (mut n, mut round) = (op, false);
    while kernel.members.contains(&n) && matches!(g.node(n).op, Op::Cast { .. }) && float(n) && float(g.operands(n)[0])
    {
        round |= g.ty(n).dtype == DType::F16;
        n = g.operands(n)[0];
    }
    (n, round)
}

/// `main` of a subgroup matmul, and its workgroup count: one subgroup per workgroup computes
/// a `rows`×`4·lanes` output tile. Per step of 4 along `k`, lane `l` loads one vec4 of each
/// lhs row `l + lanes·q` it is responsible for and the vec4 of the rhs that holds its 4
/// columns at each of the 4 `k`; `subgroupBroadcast` hands every lane each row's value, and
/// each lane updates its `rows` vec4 accumulators, one row at a time (each accumulator's
/// four updates back to back, so that a CPU compiler keeps few of them in registers at once).
///
/// This is the matmul for CPU adapters: there every storage or workgroup load a lane makes
/// is a loop over the SIMD lanes (lavapipe), so the kernel loads each operand element once,
/// as part of a vec4, from its binding, and never stages it in workgroup memory; a
/// broadcast within the subgroup is a register shuffle. Out-of-range rows and columns are
/// clamped on load and skipped on store (ragged `m` and `n`).
pub fn subgroup_main(
    g: &Graph,
    bindings: &[Binding],
    plan: &TiledPlan,
    sg: &SubgroupPlan,
    regions: &[(NodeId, Vec<NodeId>)],
    inv: &Invariants,
    body: &mut String,
) -> (String, u64) {
    let TiledPlan { matmul: mm, output, .. } = *plan;
    let region = &regions.iter().find(|(o, _)| *o == output).expect("the output has a region").1;
    write_region(g, output, region, Some(mm), &inv.params(), body);
    let (batch, m, n, k) = gemm_dims(g, mm);
    let dims = g.ty(mm).shape.dims();
    let rank = dims.len();
    let SubgroupPlan { lanes, rows, rhs_transposed, .. } = *sg;
    let cols = sg.cols();
    let (tiles_m, tiles_n) = (m.div_ceil(rows), n.div_ceil(cols));
    let workgroups = (batch * tiles_m * tiles_n) as u64;
    let (k_out, out_b) = bindings.iter().enumerate().find(|(_, b)| b.output).expect("one output");
    let out_dt = g.ty(out_b.node).dtype;

    let mut s = String::new();
    let w = line;
    s.push_str(&tile_head(lanes, ", @builtin(subgroup_invocation_id) lane: u32", workgroups, tiles_m, tiles_n));
    // Batch coordinates of the result, then each operand's base: in vec4s of its binding
    // for a view, else in elements of the operand. A convolution's batch is its images: the
    // weights are shared, the patches gathered per image.
    let conv = matches!(g.node(mm).op, Op::Conv2d { .. });
    let ops = g.operands(mm);
    let (lhs_op, rhs_op) = if conv { (ops[1], ops[0]) } else { (ops[0], ops[1]) };
    if conv {
        write_im2col(g, mm, body);
    }
    let bc = if conv { Vec::new() } else { unravel(&mut s, &dims[..rank - 2], "bt", "bc") };
    for (name, view, op, size) in [("a_base", &sg.lhs, lhs_op, m * k), ("b_base", &sg.rhs, rhs_op, k * n)] {
        let base = match view {
            Some(v) if conv => format!("{}u", v.offset / 4),
            None if conv => "0u".to_string(),
            Some(v) => {
                let r = v.strides.len();
                let mut terms = vec![format!("{}u", v.offset / 4)];
                for (q, &st) in v.strides[..r - 2].iter().enumerate().filter(|(_, &st)| st != 0) {
                    terms.push(format!("{} * {}u", bc[q + rank - r], st / 4));
                }
                terms.join(" + ")
            }
            None => operand_base(&bc, g.ty(op).shape.dims(), size),
        };
        w(&mut s, 1, format!("let {name} = {base};"));
    }
    w(&mut s, 1, format!("let row0 = tile_row * {rows}u;"));
    w(&mut s, 1, format!("let col0 = tile_col * {cols}u;"));
    // The lhs rows this lane loads, clamped to the last row.
    let row_stride = sg.lhs.as_ref().map_or(format!("{k}u"), |v| format!("{}u", v.strides[v.strides.len() - 2] / 4));
    for q in 0..rows / lanes {
        w(&mut s, 1, format!("let ar{q} = a_base + min(row0 + {}u + lane, {}u) * {row_stride};", q * lanes, m - 1));
    }
    match &sg.rhs {
        Some(v) if rhs_transposed => {
            // Column `col0 + 4·lane + c` of component c: its vec4s along k start here.
            let sb_n = v.strides[v.strides.len() - 1] / 4;
            for c in 0..4 {
                w(&mut s, 1, format!("let bn{c} = b_base + min(col0 + lane * 4u + {c}u, {}u) * {sb_n}u;", n - 1));
            }
        }
        Some(_) => {
            // The vec4 of columns col0 + 4·lane ...
            w(&mut s, 1, format!("let bcol = b_base + min(col0 / 4u + lane, {}u);", n / 4 - 1));
        }
        None => {
            for c in 0..4 {
                w(&mut s, 1, format!("let bn{c} = min(col0 + lane * 4u + {c}u, {}u);", n - 1));
            }
        }
    }
    for r in 0..rows {
        w(&mut s, 1, format!("var acc{r} = vec4<f32>();"));
    }
    let vec4_of = |f: &dyn Fn(usize) -> String| format!("vec4<f32>({}, {}, {}, {})", f(0), f(1), f(2), f(3));
    if sg.lhs_k_axes.len() > 1 {
        // k spans several axes of the lhs binding: the vec4 offset of k = 4·k4 along them.
        let (kd, ks): (Vec<usize>, Vec<usize>) = sg.lhs_k_axes.iter().copied().unzip();
        let _ = writeln!(body, "fn fg_lhs_k(k: u32) -> u32 {{");
        let kc = unravel(body, &kd, "k", "kc");
        let terms: Vec<String> = kc.iter().zip(&ks).map(|(c, s)| format!("{c} * {s}u")).collect();
        let _ = writeln!(body, "    return ({}) >> 2u;\n}}\n", terms.join(" + "));
    }
    let ka = if sg.lhs_k_axes.len() > 1 { "ka" } else { "k4" };
    // A vec4 of a view's binding, in f32 (an f16 binding's are widened), rounded to f16
    // where the operand's casts round (`side`: 0 lhs, 1 rhs).
    let load = |view: &StridedView, side: usize, at: String| {
        let b = bindings.iter().position(|b| b.node == view.leaf && !b.output).expect("an input binding");
        let read = match bindings[b].texture {
            true => format!("fg_t{b}({at})"),
            false => format!("b{b}[{at}]"),
        };
        let v = match g.ty(view.leaf).dtype {
            DType::F16 => format!("vec4<f32>({read})"),
            _ => read,
        };
        if sg.round[side] {
            format!("fg_round_f16x4({v})")
        } else {
            v
        }
    };
    // One step of 4 along `k` (`kks` = 4) from `k4`, or the last `kks` < 4 of a `k` that is
    // not a multiple of 4: then no operand is a view along `k` (see `subgroup_plan`), the
    // lhs components past the end read as 0 and the rhs rows past it are skipped.
    let step = |s: &mut String, kks: usize| {
        if sg.lhs_k_axes.len() > 1 {
            w(s, 2, "let ka = fg_lhs_k(k4 * 4u);".into());
        }
        for q in 0..rows / lanes {
            let a = match &sg.lhs {
                Some(v) => load(v, 0, format!("ar{q} + {ka}")),
                None => vec4_of(&|c| match c < kks {
                    true => format!("v{}(ar{q} + k4 * 4u + {c}u)", lhs_op.index()),
                    false => "0.0f".into(),
                }),
            };
            w(s, 2, format!("let a{q} = {a};"));
        }
        match &sg.rhs {
            Some(v) if rhs_transposed => {
                for c in 0..4 {
                    w(s, 2, format!("let t{c} = {};", load(v, 1, format!("bn{c} + k4"))));
                }
                for (kk, comp) in XYZW.iter().enumerate() {
                    w(s, 2, format!("let w{kk} = vec4<f32>(t0.{comp}, t1.{comp}, t2.{comp}, t3.{comp});"));
                }
            }
            Some(v) => {
                let sb_k = v.strides[v.strides.len() - 2] / 4;
                for kk in 0..kks {
                    w(s, 2, format!("let w{kk} = {};", load(v, 1, format!("bcol + (k4 * 4u + {kk}u) * {sb_k}u"))));
                }
            }
            None => {
                for kk in 0..kks {
                    let wv = if conv {
                        vec4_of(&|c| format!("fg_im2col(bt, k4 * 4u + {kk}u, bn{c})"))
                    } else {
                        let row = format!("b_base + (k4 * 4u + {kk}u) * {n}u");
                        vec4_of(&|c| format!("v{}({row} + bn{c})", rhs_op.index()))
                    };
                    w(s, 2, format!("let w{kk} = {wv};"));
                }
            }
        }
        for r in 0..rows {
            let (q, l) = (r / lanes, r % lanes);
            for (kk, comp) in XYZW.iter().enumerate().take(kks) {
                w(s, 2, format!("acc{r} = fma(vec4<f32>(subgroupBroadcast(a{q}.{comp}, {l}u)), w{kk}, acc{r});"));
            }
        }
    };
    w(&mut s, 1, format!("for (var k4 = 0u; k4 < {}u; k4 = k4 + 1u) {{", k / 4));
    step(&mut s, 4);
    w(&mut s, 1, "}".into());
    if !k.is_multiple_of(4) {
        w(&mut s, 1, "{".into());
        w(&mut s, 2, format!("let k4 = {}u;", k / 4));
        step(&mut s, k % 4);
        w(&mut s, 1, "}".into());
    }

    // Epilogue and store, in-range outputs only.
    // Each lane owns 4 adjacent columns; with rows of a length divisible by 4 they are one
    // aligned vec4 of the output (`vec4_store`), all in range or none.
    let e = format!("e{}_acc", output.index());
    for c in 0..4 {
        w(&mut s, 1, format!("let gc{c} = col0 + lane * 4u + {c}u;"));
    }
    let cols: Vec<String> = (0..4).map(|c| format!("gc{c}")).collect();
    inv.read_columns(&mut s, &format!("bt * {}u", m * n), "row0", &cols, n);
    for r in 0..rows {
        w(&mut s, 1, format!("if (row0 + {r}u < {m}u) {{"));
        w(&mut s, 2, format!("let idx = bt * {}u + (row0 + {r}u) * {n}u;", m * n));
        let given = inv.read_row(&mut s, "idx");
        let value = |c: usize| store_value(out_dt, &format!("{e}(idx + gc{c}, acc{r}.{}{})", XYZW[c], given(c)));
        if sg.vec4_store {
            let quad = vec4_value(out_dt, [value(0), value(1), value(2), value(3)]);
            w(&mut s, 2, format!("if (gc0 < {n}u) {{ b{k_out}[(idx + gc0) >> 2u] = {quad}; }}"));
        } else {
            for c in 0..4 {
                w(&mut s, 2, format!("if (gc{c} < {n}u) {{ b{k_out}[idx + gc{c}] = {}; }}", value(c)));
            }
        }
        w(&mut s, 1, "}".into());
    }
    w(&mut s, 0, "}".into());
    (s, workgroups)
}

/// The element offset of an operand's batch entry at the result's batch coordinates `bc`,
/// for an operand with dims `od` (`[.., rows, cols]`, `size` = rows·cols elements per entry):
/// its batch dims are the result's last ones, broadcast where 1.
fn operand_base(bc: &[String], od: &[usize], size: usize) -> String {
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
fn tile_head(wg_size: usize, extra_args: &str, workgroups: u64, tiles_m: usize, tiles_n: usize) -> String {
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
    fn params(&self) -> Vec<NodeId> {
        self.per_row.iter().chain(&self.per_col).copied().collect()
    }

    /// Reads the per-column values of columns `cols[c]` of row `row0` of batch entry `o_base`
    /// (`let hN_c = vN(…);`, each column clamped to the last, so a ragged tile reads in range).
    fn read_columns(&self, s: &mut String, o_base: &str, row0: &str, cols: &[String], n: usize) {
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
    fn read_row(&self, s: &mut String, at: &str) -> impl Fn(usize) -> String + '_ {
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
fn gemm_dims(g: &Graph, mm: NodeId) -> (usize, usize, usize, usize) {
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
fn write_im2col(g: &Graph, conv: NodeId, body: &mut String) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidate_tilings_fit_the_loops_and_webgpu_limits() {
        for t in MatmulTiling::CANDIDATES {
            assert!(t.is_valid(), "{t}");
            assert_eq!(t.to_string().parse::<MatmulTiling>(), Ok(t));
        }
        assert_eq!(MatmulTiling::default_for(128, 128), LARGE);
        assert_eq!(MatmulTiling::default_for(127, 1000), SMALL);
        assert_eq!(MatmulTiling::default_for(16, 1000), FEW_ROWS);
        assert_eq!(MatmulTiling::default_for(1, 3072), FEW_ROWS);
        assert!(FEW_ROWS.is_valid() && FEW_ROWS.tile() == (16, 64));
        // 6 × 4 blocks are not whole vec4s; 32 × 32 invocations are too many; 128×128 tiles
        // 128 deep need 128 KiB.
        for bad in ["16x16/6x4/16", "32x32/4x4/16", "16x16/8x8/128", "16x16/8x8", "a"] {
            assert!(bad.parse::<MatmulTiling>().is_err(), "{bad}");
        }
        // The cooperative tilings: none is a plain candidate (a tuned choice says which
        // kernel won), each parses back, its staging loops divide evenly, its `k` steps are
        // whole fragments, and an invocation's epilogue block lies within one fragment row.
        for t in MatmulTiling::COOP_CANDIDATES {
            assert!(t.is_cooperative() && !MatmulTiling::CANDIDATES.contains(&t), "{t}");
            assert_eq!(t.to_string().parse::<MatmulTiling>(), Ok(t));
            let (tm, tn) = t.tile();
            let wgs = t.gx * t.gy;
            assert!((tm * t.tk / 4).is_multiple_of(wgs) && (t.tk * tn / 4).is_multiple_of(wgs), "{t}");
            assert!(t.tk.is_multiple_of(COOP_SIDE) && COOP_SIDE.is_multiple_of(t.bm), "{t}");
            assert!(tm.is_multiple_of(COOP_SIDE) && tn.is_multiple_of(COOP_SIDE) && t.bn.is_multiple_of(4), "{t}");
        }
        assert_eq!(MatmulTiling::COOP_CANDIDATES[0], COOP, "the default first");
    }
}
