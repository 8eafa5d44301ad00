//! The tiled matmul's compute phase on cooperative matrices (tensor cores): 16×16 f16
//! fragments accumulated in f32 per subgroup ([`CoopPlan`]), native or emulated in plain WGSL.

use crate::matmul::*;
use crate::options::{Cooperative, LowerOptions};
use crate::tiling::*;
use fusegraph_ir::{DType, Graph};
use fusegraph_passes::Kernel;

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
    pub(crate) fn band_rows(&self) -> usize {
        self.rows * COOP_SIDE
    }

    /// Accumulator blocks (16×16 each) per subgroup along the rows and the columns.
    pub(crate) fn blocks(&self) -> (usize, usize) {
        let (tm, tn) = self.tiling.tile();
        (tm / COOP_SIDE / self.rows, tn / COOP_SIDE / self.cols)
    }

    /// A zero accumulator.
    pub(crate) fn zero(&self) -> String {
        match self.emulated {
            None => "coop_mat16x16<f32, C>()".into(),
            Some(size) => format!("array<f32, {}>()", 256 / size),
        }
    }

    /// The A fragment at element `at` of the (row-major) lhs tile.
    pub(crate) fn load_a(&self, at: &str, stride: usize) -> String {
        match self.emulated {
            None => format!("coopLoadT<coop_mat16x16<f16, A>>(&fg_tile_a[{at}], {stride}u)"),
            Some(_) => format!("vec2<u32>({at}, {stride}u)"),
        }
    }

    /// The B fragment at element `at` of the (row-major) rhs tile.
    pub(crate) fn load_b(&self, at: &str, stride: usize) -> String {
        match self.emulated {
            None => format!("coopLoadT<coop_mat16x16<f16, B>>(&fg_tile_b[{at}], {stride}u)"),
            Some(_) => format!("vec2<u32>({at}, {stride}u)"),
        }
    }

    /// `a · b + c`.
    pub(crate) fn multiply_add(&self, a: &str, b: &str, c: &str) -> String {
        match self.emulated {
            None => format!("coopMultiplyAdd({a}, {b}, {c})"),
            Some(_) => format!("fg_emu_mad({a}, {b}, {c}, sg_lane)"),
        }
    }

    /// Stores accumulator `c` row-major at element `at` of the result tile.
    pub(crate) fn store(&self, c: &str, at: &str, stride: usize) -> String {
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
    pub(crate) fn emulation(size: usize) -> String {
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

/// The compute phase on cooperative matrices: per 16 steps of `k`, the subgroup's A
/// fragments (rows sg_row..) and B fragments (columns sg_col..) and every product; after the
/// last step the accumulators go through workgroup memory to each invocation's `bm`×`bn`
/// block (`accR_P`, as the plain kernel leaves them).
pub(crate) fn coop_compute(
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
