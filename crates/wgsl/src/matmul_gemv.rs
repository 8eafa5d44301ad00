//! The matrix–vector kernel (`gemv_main`): products of a few rows (a decoder's step, a small
//! batch through a weight), where a tiled kernel's tiles would be mostly padding and its
//! few workgroups would each walk all of `k` alone.
//!
//! Such a product is bound by how many of the weight's bytes are in flight at once: a step's
//! weights are read once, a few megabytes each, and each load waits the memory's whole
//! latency. So the kernel spreads a product over as many workgroups as keep its loads
//! coalesced ([`Split`]: [`TARGET_WORKGROUPS`] where the product has the columns), and each
//! invocation issues [`UNROLL`] steps' loads before the first multiply-add that needs them.
//!
//! A workgroup of [`WORKGROUP`] invocations computes `C` adjacent columns of every row, its
//! invocations split `k` `S` ways; each keeps an accumulator per row and column it owns, and
//! the workgroup sums the `S` partials of each output in a tree in workgroup memory. Where
//! the weight's elements are adjacent along `k` (stored `[out, in]`, as PyTorch and GGUF
//! store it, read transposed: [`KAlong`]) an invocation owns one column and reads four
//! adjacent `k` a step, the `S` invocations of a column adjacent; otherwise it owns `V`
//! adjacent columns (four for one or two rows) at one `k` a step, adjacent invocations
//! holding adjacent columns. Operands are read through their element functions, so a fused
//! prologue — a cast from bf16 or a block type, dequantizing as it loads — works unchanged;
//! a packed weight ([`PackedRhs`]) is read by whole words instead. The fused epilogue runs
//! per output as `eO_acc`, as in the tiled kernel.

use crate::matmul::*;
use crate::options::{Binding, LowerOptions, Spread, MAIN_ARGS, SUBGROUP_ARGS};
use crate::region::write_region;
use crate::rows::{row_reductions, write_elem_fn, RowReduces, RowWalk};
use crate::storage::{packed_halves, store_value};
use crate::writer::{unravel, vty};
use fusegraph_ir::{DType, Graph, NodeId, Op};
use fusegraph_passes::{Kernel, RowPrologue};

/// Invocations per workgroup.
pub(crate) const WORKGROUP: usize = 256;

pub use fusegraph_passes::GEMV_MAX_ROWS;

/// The workgroups a product is spread over where it has the columns for them (with its
/// loads still coalesced): a few per multiprocessor of a large GPU, so that its memory
/// system has enough of the weight in flight.
pub const TARGET_WORKGROUPS: usize = 256;

/// Steps along `k` whose loads an invocation issues together (two chunks of a packed
/// weight).
pub const UNROLL: usize = 4;

/// Workgroup memory the kernel may use: WebGPU's default `max_compute_workgroup_storage_size`,
/// which every adapter has.
const STAGE_BYTES: usize = fusegraph_passes::GEMV_STAGE_BYTES;

/// The fewest invocations along `k` of any split: an invocation's loop runs at most
/// `k / MIN_LANES` steps, which the loop budget of a CPU adapter bounds.
const MIN_LANES: usize = 32;

/// How a product's kernel splits its work: `c` adjacent columns per workgroup, `k` split
/// `s` ways among its invocations (`c / v · s` = [`WORKGROUP`]), `v` adjacent columns per
/// invocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Split {
    pub c: usize,
    pub s: usize,
    pub v: usize,
}

impl Split {
    /// The split of a product of `batch` entries of `m` rows, `n` columns, `k` deep, whose rhs
    /// lies `along` and is read `per_step` values of `k` at a time where contiguous (four, or a
    /// packed chunk). Strided: `v` = 4 columns for one or two rows, 2 for up to four, else 1
    /// (at most eight accumulators), and `c` the most of 32, 16 and 8 columns that still makes
    /// [`TARGET_WORKGROUPS`] (8: 32 bytes of f32 a row, a memory sector). Contiguous: `v` = 1,
    /// `c` from 8 halved toward [`TARGET_WORKGROUPS`] while every invocation of a column keeps
    /// a step along `k`.
    pub fn of(along: KAlong, per_step: usize, batch: usize, m: usize, n: usize, k: usize) -> Split {
        let enough = |c: usize| batch * n.div_ceil(c) >= TARGET_WORKGROUPS;
        match along {
            KAlong::Strided => {
                let v = match m {
                    1 | 2 => 4,
                    3 | 4 => 2,
                    _ => 1,
                };
                // At most eight invocations across, so `s` ≥ 32.
                let c = [32, 16, 8].into_iter().find(|&c| c <= 8 * v && enough(c)).unwrap_or(8);
                Split { c, s: WORKGROUP * v / c, v }
            }
            KAlong::Contiguous => {
                let mut c = 8;
                while c > 1 && !enough(c) && WORKGROUP / (c / 2) * per_step <= k {
                    c /= 2;
                }
                Split { c, s: WORKGROUP / c, v: 1 }
            }
        }
    }
}

/// How the rhs's elements lie along `k`, which decides how `k` is split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KAlong {
    /// Adjacent along `k` (the rhs is a transpose of its binding's rows).
    Contiguous,
    /// Adjacent along `n` (a row-major rhs), or unknown.
    Strided,
}

/// Whether `kernel` takes the matrix–vector kernel under `opts` (and the default strategy):
/// no tiling to choose for it.
pub fn gemv_kernel(g: &Graph, kernel: &Kernel, opts: &LowerOptions) -> bool {
    if kernel.kind != fusegraph_passes::KernelKind::Loop {
        return false;
    }
    let regs = fusegraph_passes::kernel::regions(g, kernel);
    plan(g, kernel, &regs, opts).is_some_and(|p| gemv_applies(g, kernel, &p, opts))
}

/// Whether the tiled plan `plan` of `kernel` takes the matrix–vector kernel instead: a
/// matmul (not a convolution) of at most [`GEMV_MAX_ROWS`] rows, on an adapter that spreads
/// loops over many invocations (a GPU's forms), with an output stored one element per word
/// or native f16, and lane loops within the adapter's loop budget; where the kernel reduces,
/// the reductions are a row prologue the kernel can stage ([`gemv_prologue`]).
pub(crate) fn gemv_applies(g: &Graph, kernel: &Kernel, plan: &TiledPlan, opts: &LowerOptions) -> bool {
    let (_, m, _, k) = gemm_dims(g, plan.matmul);
    let reduces = kernel.members.iter().any(|&n| matches!(g.node(n).op, Op::Reduce { .. }));
    matches!(g.node(plan.matmul).op, Op::MatMul)
        && m <= GEMV_MAX_ROWS
        && opts.forms.loops == Spread::Parallel
        && !packed_halves(g.ty(plan.output).dtype, opts)
        && opts.loop_budget.is_none_or(|b| k.div_ceil(MIN_LANES) as u64 <= b)
        && pairs_alike(g, &output_products(g, kernel, plan))
        && (!reduces || gemv_prologue(g, kernel, plan, opts).is_some())
}

/// The row prologue of `kernel` ([`fusegraph_passes::row_prologue`]: a layer norm computing
/// the lhs of `plan`'s product, or a softmax the probabilities of each head) where the kernel
/// can reduce and stage its rows: `k` the rows' length, each workgroup the `m` rows of its
/// batch entry, and the staged rows, the partials and a tree per reduction within its
/// workgroup memory (`opts.workgroup_storage`).
pub(crate) fn gemv_prologue(g: &Graph, kernel: &Kernel, plan: &TiledPlan, opts: &LowerOptions) -> Option<RowPrologue> {
    let budget = opts.workgroup_storage.unwrap_or(STAGE_BYTES);
    let p = fusegraph_passes::row_prologue(g, &kernel.members, &kernel.outputs, budget)?;
    let (_, m, _, k) = gemm_dims(g, plan.matmul);
    let (part, stage) = shared_lengths(g, plan, &output_products(g, kernel, plan), true);
    let trees = p.reduces.len() * WORKGROUP * 4;
    let fits = stage > 0 && stage * 16 + part * 4 + trees <= budget;
    let lhs = g.ty(g.operands(plan.matmul)[0]);
    let rows_read = lhs.shape.dims().len() >= 2 && lhs.shape.dims()[lhs.shape.rank() - 2] == m;
    (fits && rows_read && p.shape.last() == Some(&k) && p.shape.iter().product::<usize>() == lhs.shape.numel())
        .then_some(p)
}

/// A row prologue as the kernel computes it: its reductions, in the order a row kernel
/// computes them, the shape they reduce the last axis of, and whether the workgroup combines
/// them by subgroup operations (as a row kernel does where the adapter has them).
#[derive(Clone, Copy)]
pub(crate) struct Prologue<'a> {
    pub red: RowReduces<'a>,
    pub shape: &'a [usize],
    pub subgroups: bool,
}

impl Prologue<'_> {
    /// `main`'s arguments for a kernel with `prologue`.
    fn main_args(prologue: Option<Prologue>) -> String {
        match prologue {
            Some(p) if p.subgroups => format!("{MAIN_ARGS}, {SUBGROUP_ARGS}"),
            _ => MAIN_ARGS.to_string(),
        }
    }
}

/// The columns a workgroup may be given where the rhs lies along `k`
/// ([`Strategy::gemv_columns`](crate::Strategy::gemv_columns)): at least 8 invocations per
/// column.
pub const GEMV_COLUMNS: [usize; 6] = [1, 2, 4, 8, 16, 32];

/// How the kernel reads its rhs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct GemvRhs {
    /// How the rhs's elements lie along `k`.
    pub along: KAlong,
    /// The rhs is a packed binding read by whole words.
    pub packed: Option<PackedRhs>,
    /// Columns per workgroup asked for ([`crate::Strategy::gemv_columns`]).
    pub columns: Option<usize>,
}

impl GemvRhs {
    /// The split of product `mm` read so: `k` four values a step, or a packed chunk; along
    /// `k`, the columns asked for where they are one of [`GEMV_COLUMNS`].
    fn split(&self, g: &Graph, mm: NodeId) -> Split {
        let (batch, m, n, k) = gemm_dims(g, mm);
        match self.columns.filter(|c| GEMV_COLUMNS.contains(c) && self.along == KAlong::Contiguous) {
            Some(c) => Split { c, s: WORKGROUP / c, v: 1 },
            None => Split::of(self.along, self.packed.as_ref().map_or(4, PackedRhs::chunk), batch, m, n, k),
        }
    }
}

/// A rhs that is a binding of packed values ([`crate::packed`]: a block type, or bf16 two to
/// a word) stored `[n, k]` and read transposed, below casts only, `k` a multiple of its
/// chunk: each invocation reads a chunk of a column (a block of 32 with its scale, part of a
/// k-quant super-block, 8 bf16 values) as whole words and converts four values at a time,
/// instead of loading a word (and a block's scale) per value through the element function.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PackedRhs {
    /// The binding.
    leaf: NodeId,
    /// Its type.
    dtype: DType,
    /// The casts from it to the rhs, in order (from, to).
    casts: Vec<(DType, DType)>,
}

impl PackedRhs {
    /// Values per chunk an invocation reads at once.
    fn chunk(&self) -> usize {
        crate::packed::chunk(self.dtype).expect("a packed type")
    }
}

/// How the rhs of `mm` reads its binding: along `k` where, below its casts, it is an odd
/// number of swaps of its binding's last two axes ([`fusegraph_passes::rhs_along_k`]); by
/// words where that binding is packed ([`PackedRhs`]) and the product has no batch on that
/// side.
pub(crate) fn gemv_rhs(g: &Graph, kernel: &Kernel, mm: NodeId) -> GemvRhs {
    let rhs = g.operands(mm)[1];
    if !fusegraph_passes::rhs_contiguous_k(g, &kernel.members, mm) {
        return GemvRhs { along: KAlong::Strided, packed: None, columns: None };
    }
    let Some(leaf) = fusegraph_passes::rhs_along_k(g, &kernel.members, mm) else {
        return GemvRhs { along: KAlong::Contiguous, packed: None, columns: None };
    };
    let mut casts = Vec::new();
    let mut n = rhs;
    while n != leaf {
        if let Op::Cast { to } = g.node(n).op {
            casts.push((g.ty(g.operands(n)[0]).dtype, to));
        }
        n = g.operands(n)[0];
    }
    casts.reverse();
    let rd = g.ty(rhs).shape.dims();
    let unbatched = rd[..rd.len() - 2].iter().all(|&d| d == 1);
    let dtype = g.ty(leaf).dtype;
    let words = crate::packed::chunk(dtype).is_some_and(|c| rd[rd.len() - 2].is_multiple_of(c));
    let packed = (words && unbatched && kernel.inputs.contains(&leaf)).then_some(PackedRhs { leaf, dtype, casts });
    GemvRhs { along: KAlong::Contiguous, packed, columns: None }
}

/// The products output `plan.output` accumulates, each with how it reads its rhs: `plan`'s
/// matmul first, then the other matmuls of the output's region (paired products, fusion's
/// `paired_products`: a gate and an up projection under one epilogue).
pub(crate) fn output_products(g: &Graph, kernel: &Kernel, plan: &TiledPlan) -> Vec<(NodeId, GemvRhs)> {
    let region = fusegraph_passes::kernel::region_of(g, kernel, plan.output);
    let others = region.into_iter().filter(|&n| n != plan.matmul && matches!(g.node(n).op, Op::MatMul));
    std::iter::once(plan.matmul).chain(others).map(|p| (p, gemv_rhs(g, kernel, p))).collect()
}

/// `products` (each with how it reads its rhs) with `columns` asked for
/// ([`crate::Strategy::gemv_columns`]).
pub(crate) fn with_columns<P>(products: Vec<(P, GemvRhs)>, columns: Option<usize>) -> Vec<(P, GemvRhs)> {
    products.into_iter().map(|(p, r)| (p, GemvRhs { columns, ..r })).collect()
}

/// Whether paired products can share one kernel's loop: one lhs and one shape, rhs of one
/// shape read alike (one split; packed ones of one type).
fn pairs_alike(g: &Graph, products: &[(NodeId, GemvRhs)]) -> bool {
    let (first, read) = &products[0];
    let operand = |p: NodeId, i: usize| g.operands(p)[i];
    let dtype = |r: &GemvRhs| r.packed.as_ref().map(|x| x.dtype);
    products.iter().all(|(p, r)| {
        operand(*p, 0) == operand(*first, 0)
            && g.ty(*p) == g.ty(*first)
            && g.ty(operand(*p, 1)).shape == g.ty(operand(*first, 1)).shape
            && r.along == read.along
            && dtype(r) == dtype(read)
    })
}

/// Writes `eO_acc` and the workgroup arrays into `body` and returns `main` and the number of
/// workgroups (one per `C` columns per batch entry, [`Split`]); `products` are the output's
/// products and how each reads its rhs ([`output_products`]).
pub(crate) fn gemv_main(
    g: &Graph,
    bindings: &[Binding],
    (plan, products): (&TiledPlan, &[(NodeId, GemvRhs)]),
    regions: &[(NodeId, Vec<NodeId>)],
    prologue: Option<Prologue>,
    body: &mut String,
) -> (String, u64) {
    let (part, stage) = shared_lengths(g, plan, products, prologue.is_some());
    // A row prologue fits the adapter's workgroup memory (`gemv_prologue`).
    let staged = stage > 0 && (prologue.is_some() || stage * 16 + part * 4 <= STAGE_BYTES);
    declare_shared(g, body, vty(g.ty(plan.matmul).dtype), part, if staged { stage } else { 0 }, prologue);
    let (code, workgroups) = gemv_code(g, bindings, (plan, products), regions, (staged, prologue), body);
    let args = Prologue::main_args(prologue);
    let main = format!(
        "@compute @workgroup_size({WORKGROUP})\nfn main({args}) {{\n    let wg = wid.y * nwg.x + wid.x;\n    \
         if (wg >= {workgroups}u) {{ return; }}\n{code}}}\n"
    );
    (main, workgroups)
}

/// Sibling products of one kernel ([`fusegraph_passes::FusionOptions::gemv`]: a
/// step's q, k and v projections of one input), each its output's region's one matmul and
/// each taking this kernel ([`gemv_applies`]) with partials of one type: their plans and how
/// each reads its rhs. `None` for any other kernel.
pub(crate) fn sibling_plans(
    g: &Graph,
    kernel: &Kernel,
    regions: &[(NodeId, Vec<NodeId>)],
    opts: &LowerOptions,
) -> Option<Vec<(TiledPlan, GemvRhs)>> {
    if kernel.kind != fusegraph_passes::KernelKind::Loop || regions.len() < 2 || regions.len() != kernel.outputs.len() {
        return None;
    }
    let plans: Vec<(TiledPlan, GemvRhs)> = regions
        .iter()
        .map(|(o, region)| {
            let mut products = region.iter().copied().filter(|&m| matches!(g.node(m).op, Op::MatMul));
            let (Some(matmul), None) = (products.next(), products.next()) else { return None };
            let plan = TiledPlan { matmul, output: *o, vec4_lhs: None, vec4_rhs: None };
            (g.ty(matmul).shape.numel() == g.ty(*o).shape.numel() && gemv_applies(g, kernel, &plan, opts))
                .then(|| (plan, gemv_rhs(g, kernel, matmul)))
        })
        .collect::<Option<_>>()?;
    let t = vty(g.ty(plans[0].0.matmul).dtype);
    plans.iter().all(|(p, _)| vty(g.ty(p.matmul).dtype) == t).then_some(plans)
}

/// The kernel of sibling products ([`sibling_plans`]): workgroups `0..W₀` compute the first
/// product as [`gemv_main`] would (`fg_gemv0`), the next `W₁` the second, and so on, sharing
/// the workgroup arrays. Returns `main` and the total workgroups.
pub(crate) fn gemv_siblings_main(
    g: &Graph,
    bindings: &[Binding],
    products: &[(TiledPlan, GemvRhs)],
    regions: &[(NodeId, Vec<NodeId>)],
    prologue: Option<Prologue>,
    body: &mut String,
) -> (String, u64) {
    let lengths: Vec<(usize, usize)> =
        products.iter().map(|(p, r)| shared_lengths(g, p, &[(p.matmul, r.clone())], prologue.is_some())).collect();
    let part = lengths.iter().map(|l| l.0).max().unwrap_or(0);
    let stage = lengths.iter().map(|l| l.1).max().unwrap_or(0);
    let staged = prologue.is_some() || stage * 16 + part * 4 <= STAGE_BYTES;
    let t = vty(g.ty(products[0].0.matmul).dtype);
    declare_shared(g, body, t, part, if staged { stage } else { 0 }, prologue);
    let args = Prologue::main_args(prologue);
    let mut main =
        format!("@compute @workgroup_size({WORKGROUP})\nfn main({args}) {{\n    let wg = wid.y * nwg.x + wid.x;\n");
    let (params, passed) = match prologue {
        Some(p) if p.subgroups => (", sg_id: u32, sg_count: u32, sg_lane: u32", ", sg_id, sg_count, sg_lane"),
        _ => ("", ""),
    };
    let mut first = 0u64;
    for (j, ((plan, rhs), &(_, own_stage))) in products.iter().zip(&lengths).enumerate() {
        let (code, workgroups) = gemv_code(
            g,
            bindings,
            (plan, &[(plan.matmul, rhs.clone())]),
            regions,
            (staged && own_stage > 0, prologue),
            body,
        );
        let _ =
            std::fmt::Write::write_fmt(body, format_args!("fn fg_gemv{j}(wg: u32, lid: u32{params}) {{\n{code}}}\n\n"));
        let branch = if j == 0 { "if" } else { "} else if" };
        let end = first + workgroups;
        let _ = std::fmt::Write::write_fmt(
            &mut main,
            format_args!("    {branch} (wg < {end}u) {{\n        fg_gemv{j}(wg - {first}u, lid{passed});\n"),
        );
        first = end;
    }
    main.push_str("    }\n}\n");
    (main, first)
}

/// The partials' length (elements) of `plan`'s `products` ([`output_products`]) and their
/// lhs rows' length as staged vec4s: 0 where `k` is not a multiple of 4, or where the loop
/// does not read four `k` a step and no row prologue (`prologue`) must be staged.
fn shared_lengths(g: &Graph, plan: &TiledPlan, products: &[(NodeId, GemvRhs)], prologue: bool) -> (usize, usize) {
    let (_, m, _, k) = gemm_dims(g, plan.matmul);
    let rhs_read = &products[0].1;
    let split = rhs_read.split(g, plan.matmul);
    let quads =
        rhs_read.packed.is_some() || rhs_read.along == KAlong::Contiguous && vty(g.ty(plan.matmul).dtype) == "f32";
    (WORKGROUP * products.len() * m * split.v, if (quads || prologue) && k % 4 == 0 { m * k / 4 } else { 0 })
}

/// Declares the partials (`part` elements of `t`), where `stage` > 0 the staged lhs rows
/// (`stage` f32 vec4s), and a row prologue's trees and `fg_elem`.
fn declare_shared(g: &Graph, body: &mut String, t: &str, part: usize, stage: usize, prologue: Option<Prologue>) {
    let _ = std::fmt::Write::write_fmt(body, format_args!("var<workgroup> fg_part: array<{t}, {part}>;\n\n"));
    if stage > 0 {
        let _ = std::fmt::Write::write_fmt(body, format_args!("var<workgroup> fg_x: array<vec4<f32>, {stage}>;\n\n"));
    }
    if let Some(p) = prologue {
        for (k, &r) in p.red.reduces.iter().enumerate() {
            let t = vty(g.ty(r).dtype);
            let _ =
                std::fmt::Write::write_fmt(body, format_args!("var<workgroup> fg_red{k}: array<{t}, {WORKGROUP}>;\n"));
        }
        write_elem_fn(body, p.shape, &[p.shape.len() - 1]);
    }
}

/// One output's statements, for a function of the workgroup's index `wg` (among the
/// output's) and `lid`, with the lhs staged in `fg_x` where `staged` — a row at a time
/// after its reductions where a row `prologue` computes it; writes its `eO_acc` into `body`.
/// `products` are the output's products ([`output_products`]: `plan`'s first), accumulated
/// side by side. Returns them and the output's workgroups.
fn gemv_code(
    g: &Graph,
    bindings: &[Binding],
    (plan, products): (&TiledPlan, &[(NodeId, GemvRhs)]),
    regions: &[(NodeId, Vec<NodeId>)],
    (staged, prologue): (bool, Option<Prologue>),
    body: &mut String,
) -> (String, u64) {
    let TiledPlan { matmul: mm, output, .. } = *plan;
    let rhs_read = &products[0].1;
    let others: Vec<NodeId> = products[1..].iter().map(|(p, _)| *p).collect();
    let region = &regions.iter().find(|(o, _)| *o == output).expect("the output has a region").1;
    write_region(g, output, region, Some(mm), &others, body);
    let pn = products.len();
    let ops = g.operands(mm);
    let (lhs, rhs) = (ops[0], ops[1]);
    let (batch, m, n, k) = gemm_dims(g, mm);
    let dims = g.ty(mm).shape.dims();
    let rank = dims.len();
    let along = rhs_read.along;
    let Split { c, s: lanes, v } = rhs_read.split(g, mm);
    let across = c / v;
    let tiles_n = n.div_ceil(c);
    let workgroups = (batch * tiles_n) as u64;
    let t = vty(g.ty(mm).dtype);
    let k_out = bindings.iter().position(|b| b.output && b.node == output).expect("the output's binding");
    let out_dt = g.ty(output).dtype;
    let parts = pn * m * v;

    let mut s = format!("    let tile_col = wg % {tiles_n}u;\n    let bt = wg / {tiles_n}u;\n");
    let w = line;
    let bc = unravel(&mut s, &dims[..rank - 2], "bt", "bc");
    let (ld, rd) = (g.ty(lhs).shape.dims(), g.ty(rhs).shape.dims());
    w(&mut s, 1, format!("let a_base = {};", operand_base(&bc, ld, m * k)));
    w(&mut s, 1, format!("let b_base = {};", operand_base(&bc, rd, k * n)));
    w(&mut s, 1, format!("let o_base = bt * {}u;", m * n));
    // Lane `s` along `k` and the invocation's first column: adjacent invocations adjacent
    // along the rhs's contiguous axis; lanes `sstep` apart in the workgroup's partials.
    let (lane_s, lane_c, sstep) = match along {
        KAlong::Contiguous => (format!("lid % {lanes}u"), format!("lid / {lanes}u"), 1),
        KAlong::Strided => (format!("lid / {across}u"), format!("lid % {across}u * {v}u"), across),
    };
    w(&mut s, 1, format!("let s = {lane_s};"));
    w(&mut s, 1, format!("let col = tile_col * {c}u + {lane_c};"));
    for j in 0..v {
        let at = if j == 0 { "col".to_string() } else { format!("col + {j}u") };
        w(&mut s, 1, format!("let cl{j} = min({at}, {}u);", n - 1));
    }
    for p in 0..pn {
        for r in 0..m {
            for j in 0..v {
                w(&mut s, 1, format!("var acc{p}_{r}_{j} = {t}();"));
            }
        }
    }
    let lv = format!("v{}", lhs.index());
    let rvs: Vec<String> = products.iter().map(|(p, _)| format!("v{}", g.operands(*p)[1].index())).collect();
    // The lhs value of row `r` at `kk`.
    let a_at = |r: usize, kk: &str| match (staged, r) {
        (true, _) => format!("{t}(fg_x[{}u + ({kk}) / 4u][({kk}) % 4u])", r * k / 4),
        (false, 0) => format!("{lv}(a_base + {kk})"),
        (false, _) => format!("{lv}(a_base + {}u + {kk})", r * k),
    };
    if staged {
        // Staged as f32 (the lhs's own values: exact).
        let quad = |first: &str| {
            let a: Vec<String> = (0..4).map(|j| format!("{lv}(a_base + {first} + {j}u)")).collect();
            match t {
                "f32" => format!("vec4<f32>({})", a.join(", ")),
                _ => format!("vec4<f32>(vec4<{t}>({}))", a.join(", ")),
            }
        };
        match prologue {
            None => {
                w(&mut s, 1, format!("for (var e = lid; e < {}u; e = e + {WORKGROUP}u) {{", m * k / 4));
                w(&mut s, 2, format!("fg_x[e] = {};", quad("e * 4u")));
                w(&mut s, 1, "}".into());
                w(&mut s, 1, "workgroupBarrier();".into());
            }
            // Each row's reductions by the whole workgroup (a tree), then the row staged from
            // them; the trees are reused by the next row only after a barrier.
            Some(p) => {
                for r in 0..m {
                    w(&mut s, 1, "{".into());
                    // The batch entry's row `r` (its lhs rows start at `a_base`).
                    w(&mut s, 1, format!("let row = a_base / {k}u + {r}u;"));
                    let walk = RowWalk { len: k, start: "lid", step: WORKGROUP, ilp: 1, quads: None };
                    row_reductions(&mut s, g, p.red, walk, Some(p.subgroups));
                    w(&mut s, 1, format!("for (var e = lid; e < {}u; e = e + {WORKGROUP}u) {{", k / 4));
                    w(&mut s, 2, format!("fg_x[{}u + e] = {};", r * k / 4, quad(&format!("{}u + e * 4u", r * k))));
                    w(&mut s, 1, "}".into());
                    w(&mut s, 1, "workgroupBarrier();".into());
                    w(&mut s, 1, "}".into());
                }
            }
        }
    }
    // The lhs values of row `r` at `kk`, `kk` + 1, `kk` + 2 and `kk` + 3 (`kk` a multiple of 4).
    let a4 = |r: usize, kk: &str| match (staged, t) {
        (true, "f32") => format!("fg_x[{}u + ({kk}) / 4u]", r * k / 4),
        (true, _) => format!("vec4<{t}>(fg_x[{}u + ({kk}) / 4u])", r * k / 4),
        (false, _) => {
            format!("vec4<{t}>({})", (0..4).map(|e| a_at(r, &format!("{kk} + {e}u"))).collect::<Vec<_>>().join(", "))
        }
    };
    match (&rhs_read.packed, along) {
        (Some(_), _) => {
            let packed: Vec<(&PackedRhs, usize)> = products
                .iter()
                .map(|(_, read)| {
                    let packed = read.packed.as_ref().expect("paired products are read alike");
                    (
                        packed,
                        bindings.iter().position(|b| !b.output && b.node == packed.leaf).expect("the rhs's binding"),
                    )
                })
                .collect();
            packed_loop(&mut s, &packed, &a4, m, k, lanes);
        }
        // Four adjacent `k` of the invocation's column a step, as a vec4 against the rows'.
        (None, KAlong::Contiguous) => {
            let quads = k / 4;
            let step = |s: &mut String, ind: usize, u: usize, q: &str| {
                let kb = format!("kq{u}");
                w(s, ind, format!("let {kb} = ({q}) * 4u;"));
                for (p, rv) in rvs.iter().enumerate() {
                    let b: Vec<String> = (0..4).map(|e| format!("{rv}(b_base + ({kb} + {e}u) * {n}u + cl0)")).collect();
                    w(s, ind, format!("let b{p}_{u} = vec4<{t}>({});", b.join(", ")));
                }
            };
            let fma = |s: &mut String, ind: usize, u: usize| {
                for p in 0..pn {
                    for r in 0..m {
                        let a = a4(r, &format!("kq{u}"));
                        w(s, ind, format!("acc{p}_{r}_0 = acc{p}_{r}_0 + dot({a}, b{p}_{u});"));
                    }
                }
            };
            unrolled(&mut s, "q", quads, lanes, UNROLL, &step, &fma);
            if k % 4 != 0 {
                w(&mut s, 1, format!("for (var kk = {}u + s; kk < {k}u; kk = kk + {lanes}u) {{", quads * 4));
                for (p, rv) in rvs.iter().enumerate() {
                    w(&mut s, 2, format!("let b{p} = {rv}(b_base + kk * {n}u + cl0);"));
                    for r in 0..m {
                        w(&mut s, 2, format!("acc{p}_{r}_0 = acc{p}_{r}_0 + {} * b{p};", a_at(r, "kk")));
                    }
                }
                w(&mut s, 1, "}".into());
            }
        }
        // One `k` of the invocation's `v` columns a step.
        (None, KAlong::Strided) => {
            let step = |s: &mut String, ind: usize, u: usize, kk: &str| {
                w(s, ind, format!("let kk{u} = {kk};"));
                for (p, rv) in rvs.iter().enumerate() {
                    for j in 0..v {
                        w(s, ind, format!("let b{p}_{u}_{j} = {rv}(b_base + kk{u} * {n}u + cl{j});"));
                    }
                }
                for r in 0..m {
                    w(s, ind, format!("let a{u}_{r} = {};", a_at(r, &format!("kk{u}"))));
                }
            };
            let fma = |s: &mut String, ind: usize, u: usize| {
                for p in 0..pn {
                    for r in 0..m {
                        for j in 0..v {
                            w(s, ind, format!("acc{p}_{r}_{j} = acc{p}_{r}_{j} + a{u}_{r} * b{p}_{u}_{j};"));
                        }
                    }
                }
            };
            unrolled(&mut s, "kk", k, lanes, UNROLL, &step, &fma);
        }
    }
    // Partial `(p, r, j)` (product, row, column) at `((p · m + r) · v + j) · WORKGROUP`.
    let part = |p: usize, r: usize, j: usize| ((p * m + r) * v + j) * WORKGROUP;
    for p in 0..pn {
        for r in 0..m {
            for j in 0..v {
                let at = match part(p, r, j) {
                    0 => "lid".to_string(),
                    at => format!("{at}u + lid"),
                };
                w(&mut s, 1, format!("fg_part[{at}] = acc{p}_{r}_{j};"));
            }
        }
    }
    w(&mut s, 1, "workgroupBarrier();".into());
    let mut stride = lanes / 2;
    while stride >= 1 {
        w(&mut s, 1, format!("if (s < {stride}u) {{"));
        for p in 0..parts {
            let at = format!("{}u + lid", p * WORKGROUP);
            w(&mut s, 2, format!("fg_part[{at}] = fg_part[{at}] + fg_part[{at} + {}u];", stride * sstep));
        }
        w(&mut s, 1, "}".into());
        w(&mut s, 1, "workgroupBarrier();".into());
        stride /= 2;
    }
    let e = format!("e{}_acc", output.index());
    w(&mut s, 1, "if (s == 0u) {".into());
    for j in 0..v {
        let at = if j == 0 { "col".to_string() } else { format!("col + {j}u") };
        w(&mut s, 2, format!("if ({at} < {n}u) {{"));
        for r in 0..m {
            w(
                &mut s,
                3,
                format!(
                    "let i{r}_{j} = o_base + {}{at};",
                    if r == 0 { String::new() } else { format!("{}u + ", r * n) }
                ),
            );
            let accs: Vec<String> = (0..pn).map(|p| format!("fg_part[{}u + lid]", part(p, r, j))).collect();
            let value = store_value(out_dt, &format!("{e}(i{r}_{j}, {})", accs.join(", ")));
            w(&mut s, 3, format!("b{k_out}[i{r}_{j}] = {value};"));
        }
        w(&mut s, 2, "}".into());
    }
    w(&mut s, 1, "}".into());
    (s, workgroups)
}

/// A lane's loop over steps `s`, `s + lanes`, … below `count` of the variable `var`: `unroll`
/// steps at a time — every step's loads (`load(s, indent, u, step)`, naming its values with
/// `u`) before any of their multiply-adds (`fma(s, indent, u)`) — then one at a time.
fn unrolled(
    s: &mut String,
    var: &str,
    count: usize,
    lanes: usize,
    unroll: usize,
    load: &dyn Fn(&mut String, usize, usize, &str),
    fma: &dyn Fn(&mut String, usize, usize),
) {
    let w = line;
    w(s, 1, format!("var {var} = s;"));
    if count >= unroll * lanes {
        w(
            s,
            1,
            format!("for (; {var} + {}u < {count}u; {var} = {var} + {}u) {{", (unroll - 1) * lanes, unroll * lanes),
        );
        for u in 0..unroll {
            let at = if u == 0 { var.to_string() } else { format!("{var} + {}u", u * lanes) };
            load(s, 2, u, &at);
        }
        for u in 0..unroll {
            fma(s, 2, u);
        }
        w(s, 1, "}".into());
    }
    w(s, 1, format!("for (; {var} < {count}u; {var} = {var} + {lanes}u) {{"));
    load(s, 2, 0, var);
    fma(s, 2, 0);
    w(s, 1, "}".into());
}

/// The loop over `k` of a packed rhs ([`PackedRhs`]): invocation `s` of a column takes its
/// chunks `s`, `s + S`, …, two at a time ([`unrolled`]), reads each chunk's words whole and
/// converts its values four at a time ([`crate::packed`]) into `vec4`s that meet four of each
/// row's lhs values in a `dot`.
fn packed_loop(
    s: &mut String,
    packed: &[(&PackedRhs, usize)],
    a4: &dyn Fn(usize, &str) -> String,
    m: usize,
    k: usize,
    s_n: usize,
) {
    // Paired products' weights are of one type (`pairs_alike`): one chunk, one block layout.
    let dtype = packed[0].0.dtype;
    let chunk = packed[0].0.chunk();
    let slots: Vec<usize> = packed.iter().map(|(_, slot)| *slot).collect();
    let load = |s: &mut String, ind: usize, u: usize, blk: &str| crate::packed::load(s, ind, dtype, &slots, k, u, blk);
    let fma = |s: &mut String, ind: usize, u: usize| {
        let w = line;
        for (p, (rhs, _)) in packed.iter().enumerate() {
            for (e, value) in crate::packed::quads(s, ind, dtype, p, u) {
                w(s, ind, format!("let u{p}_{u}_{e} = {value};"));
                w(s, ind, format!("let w{p}_{u}_{e} = {};", cast_quad(&rhs.casts, &format!("u{p}_{u}_{e}"))));
                for r in 0..m {
                    let a = a4(r, &format!("kb{u} + {e}u"));
                    w(s, ind, format!("acc{p}_{r}_0 = acc{p}_{r}_0 + dot(vec4<f32>({a}), w{p}_{u}_{e});"));
                }
            }
        }
    };
    unrolled(s, "blk", k / chunk, s_n, UNROLL / 2, &load, &fma);
}

/// The `vec4<f32>` named `v` through `casts`, each component as the cast's element function
/// would take it.
fn cast_quad(casts: &[(DType, DType)], v: &str) -> String {
    let parts: Vec<String> = crate::matmul::XYZW
        .iter()
        .map(|c| casts.iter().fold(format!("{v}.{c}"), |x, &(from, to)| crate::body::cast(from, to, &x)))
        .collect();
    if parts.iter().zip(crate::matmul::XYZW).all(|(p, c)| *p == format!("{v}.{c}")) {
        v.to_string()
    } else {
        format!("vec4<f32>({})", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::KernelForm;
    use fusegraph_ir::{GraphBuilder, Tensor};
    use fusegraph_passes::{fuse, gemv_prologue_bytes, FusionOptions, GEMV_STAGE_BYTES};

    /// A norm of `rows` rows of `k` (a layer norm's two reductions, or an RMS norm's one)
    /// feeding a product with `n` columns (a row-major weight, or `[n, k]` read transposed),
    /// fused as a GPU's compile fuses it: the graph and its kernels.
    fn norm_product(rows: usize, k: usize, layer: bool, transposed: bool) -> (fusegraph_ir::Graph, Vec<Kernel>) {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [rows, k]).unwrap();
        let h: Tensor = if layer {
            x.layer_norm(&[1], 1e-5).unwrap()
        } else {
            x.mul(&x.mul(&x).unwrap().mean(&[1], true).unwrap().add_scalar(1e-6).unwrap().rsqrt().unwrap()).unwrap()
        };
        let y = if transposed {
            h.matmul(&b.input("w", DType::F32, [48, k]).unwrap().t().unwrap()).unwrap()
        } else {
            h.matmul(&b.input("w", DType::F32, [k, 48]).unwrap()).unwrap()
        };
        let g = b.graph();
        let kernels = fuse(&g, &[y.id()], &FusionOptions { gemv: true, ..Default::default() }).unwrap().kernels;
        (g, kernels)
    }

    /// Every norm fusion merges into a product's kernel (within `gemv_prologue_bytes`'s
    /// bound) the kernel can stage: the bound covers the staged rows, the partials of either
    /// weight layout and the trees. At the bound's edge and past it.
    #[test]
    fn every_prologue_fusion_merges_fits_the_kernel() {
        let mut merged = 0;
        for rows in 1..=GEMV_MAX_ROWS {
            for k in [64, 256, 768, 1024, 2048, 3072] {
                for (layer, transposed) in [(true, false), (true, true), (false, false), (false, true)] {
                    let (g, kernels) = norm_product(rows, k, layer, transposed);
                    let bytes = gemv_prologue_bytes(rows, k, if layer { 2 } else { 1 }, 1, transposed);
                    let within = bytes.unwrap() <= GEMV_STAGE_BYTES;
                    assert_eq!(kernels.len() == 1, within, "{rows}×{k}, layer {layer}: {kernels:?}");
                    if within {
                        let regs = fusegraph_passes::kernel::regions(&g, &kernels[0]);
                        let plan = plan(&g, &kernels[0], &regs, &LowerOptions::default()).expect("a product");
                        let opts = LowerOptions::default();
                        assert!(gemv_prologue(&g, &kernels[0], &plan, &opts).is_some(), "{rows}×{k}, layer {layer}");
                        merged += 1;
                    }
                }
            }
        }
        assert!(merged >= 20, "{merged} merged");
    }

    /// The kernel with a row prologue is valid WGSL with the reductions combined by a tree in
    /// workgroup memory and by subgroup operations, in its form for one product and for
    /// sibling products.
    #[test]
    fn row_prologue_kernels_validate_with_trees_and_subgroups() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [2, 256]).unwrap();
        let h = x.layer_norm(&[1], 1e-5).unwrap();
        let q = h.matmul(&b.input("wq", DType::F32, [256, 40]).unwrap()).unwrap();
        let k = h.matmul(&b.input("wk", DType::F32, [24, 256]).unwrap().t().unwrap()).unwrap();
        let g = b.graph();
        for outs in [vec![q.id()], vec![q.id(), k.id()]] {
            let kernels = fuse(&g, &outs, &FusionOptions { gemv: true, ..Default::default() }).unwrap().kernels;
            assert_eq!(kernels.len(), 1, "{kernels:?}");
            for subgroups in [false, true] {
                let src = crate::lower(&g, &kernels[0], &LowerOptions { subgroups, ..Default::default() });
                crate::validate(&src.wgsl).unwrap_or_else(|e| panic!("{e}\n{}", src.wgsl));
                assert!(matches!(src.form, KernelForm::Gemv { row_prologue: true, .. }), "{:?}", src.form);
                assert_eq!(src.wgsl.contains("subgroupAdd"), subgroups, "{}", src.wgsl);
            }
        }
    }
}
