//! The matrix–vector kernel (`gemv_main`): products of a few rows (a decoder's step, a small
//! batch through a weight), where a tiled kernel's tiles would be mostly padding and its
//! few workgroups would each walk all of `k` alone.
//!
//! A workgroup of [`WORKGROUP`] invocations computes `C` adjacent columns of every row, its
//! invocations split `k` `S` ways (`C · S` = [`WORKGROUP`]); each keeps one accumulator per
//! row, and the workgroup sums the `S` partials of each output in a tree in workgroup
//! memory. The weight is read once, by invocations that touch adjacent elements in each
//! step: where its elements are adjacent along `k` (a weight stored `[out, in]`, as PyTorch
//! and GGUF store it, read transposed: [`KAlong`]) `S` = 32 adjacent invocations read 32
//! adjacent elements of one column, `C` = 8; otherwise `C` = 16 adjacent invocations read
//! 16 adjacent columns at one `k`, `S` = 16. Operands are read through their element
//! functions, so a fused prologue — a cast from bf16 or a block type, dequantizing as it
//! loads — works unchanged; the fused epilogue runs per output as `eO_acc`, as in the tiled
//! kernel.

use crate::matmul::*;
use crate::options::{Binding, LowerOptions, Spread};
use crate::region::write_region;
use crate::storage::{packed_halves, store_value};
use crate::writer::{unravel, vty};
use fusegraph_ir::{Graph, NodeId, Op};
use fusegraph_passes::Kernel;

/// Invocations per workgroup.
pub(crate) const WORKGROUP: usize = 256;

/// The most rows a product may have to take this kernel: each invocation holds an
/// accumulator per row.
pub const GEMV_MAX_ROWS: usize = 8;

/// How the rhs's elements lie along `k`, which decides how `k` is split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KAlong {
    /// Adjacent along `k` (the rhs is a transpose of its binding's rows).
    Contiguous,
    /// Adjacent along `n` (a row-major rhs), or unknown.
    Strided,
}

impl KAlong {
    /// (`C` columns, `S` ways along `k`) per workgroup.
    fn split(self) -> (usize, usize) {
        match self {
            KAlong::Contiguous => (8, 32),
            KAlong::Strided => (16, 16),
        }
    }
}

/// Whether `kernel` takes the matrix–vector kernel under `opts` (and the default strategy):
/// no tiling to choose for it.
pub fn gemv_kernel(g: &Graph, kernel: &Kernel, opts: &LowerOptions) -> bool {
    if kernel.kind != fusegraph_passes::KernelKind::Loop {
        return false;
    }
    let regs = fusegraph_passes::kernel::regions(g, kernel);
    plan(g, kernel, &regs, opts).is_some_and(|p| gemv_applies(g, &p, opts))
}

/// Whether the tiled plan `plan` takes the matrix–vector kernel instead: a matmul (not a
/// convolution) of at most [`GEMV_MAX_ROWS`] rows, on an adapter that spreads loops over
/// many invocations (a GPU's forms), with an output stored one element per word or native
/// f16, and lane loops within the adapter's loop budget.
pub(crate) fn gemv_applies(g: &Graph, plan: &TiledPlan, opts: &LowerOptions) -> bool {
    let (_, m, _, k) = gemm_dims(g, plan.matmul);
    matches!(g.node(plan.matmul).op, Op::MatMul)
        && m <= GEMV_MAX_ROWS
        && opts.forms.loops == Spread::Parallel
        && !packed_halves(g.ty(plan.output).dtype, opts)
        && opts.loop_budget.is_none_or(|b| k.div_ceil(KAlong::Strided.split().1) as u64 <= b)
}

/// Whether the rhs of `mm` reads its binding along `k`: below its casts, an odd number of
/// swaps of its last two axes.
pub(crate) fn k_along(g: &Graph, kernel: &Kernel, mm: NodeId) -> KAlong {
    let (mut n, mut swapped) = (g.operands(mm)[1], false);
    while kernel.members.contains(&n) {
        match &g.node(n).op {
            Op::Cast { .. } => {}
            Op::Transpose { perm } => {
                let r = perm.len();
                let last_two = r >= 2 && perm[r - 2] == r - 1 && perm[r - 1] == r - 2;
                if !last_two || perm[..r - 2].iter().enumerate().any(|(a, &p)| a != p) {
                    return KAlong::Strided;
                }
                swapped = !swapped;
            }
            _ => return KAlong::Strided,
        }
        n = g.operands(n)[0];
    }
    if swapped {
        KAlong::Contiguous
    } else {
        KAlong::Strided
    }
}

/// Writes `eO_acc` and the partials' workgroup array into `body` and returns `main` and the
/// number of workgroups (one per `C` columns per batch entry); `along` is the rhs's layout
/// ([`k_along`]).
pub(crate) fn gemv_main(
    g: &Graph,
    bindings: &[Binding],
    plan: &TiledPlan,
    along: KAlong,
    regions: &[(NodeId, Vec<NodeId>)],
    body: &mut String,
) -> (String, u64) {
    let TiledPlan { matmul: mm, output, .. } = *plan;
    let region = &regions.iter().find(|(o, _)| *o == output).expect("the output has a region").1;
    write_region(g, output, region, Some(mm), &[], body);
    let ops = g.operands(mm);
    let (lhs, rhs) = (ops[0], ops[1]);
    let (batch, m, n, k) = gemm_dims(g, mm);
    let dims = g.ty(mm).shape.dims();
    let rank = dims.len();
    let (c_n, s_n) = along.split();
    let tiles_n = n.div_ceil(c_n);
    let workgroups = (batch * tiles_n) as u64;
    let t = vty(g.ty(mm).dtype);
    let (k_out, out_b) = bindings.iter().enumerate().find(|(_, b)| b.output).expect("one output");
    let out_dt = g.ty(out_b.node).dtype;
    let _ =
        std::fmt::Write::write_fmt(body, format_args!("var<workgroup> fg_part: array<{t}, {}>;\n\n", WORKGROUP * m));

    let mut s = tile_head(WORKGROUP, "", workgroups, 1, tiles_n);
    let w = line;
    let bc = unravel(&mut s, &dims[..rank - 2], "bt", "bc");
    let (ld, rd) = (g.ty(lhs).shape.dims(), g.ty(rhs).shape.dims());
    w(&mut s, 1, format!("let a_base = {};", operand_base(&bc, ld, m * k)));
    w(&mut s, 1, format!("let b_base = {};", operand_base(&bc, rd, k * n)));
    w(&mut s, 1, format!("let o_base = bt * {}u;", m * n));
    // Lane `s` of `k` and column `c` of the workgroup's: adjacent invocations adjacent along
    // the rhs's contiguous axis; `sstep` apart along `k` in the workgroup's partials.
    let (lane_s, lane_c, sstep) = match along {
        KAlong::Contiguous => (format!("lid % {s_n}u"), format!("lid / {s_n}u"), 1),
        KAlong::Strided => (format!("lid / {c_n}u"), format!("lid % {c_n}u"), c_n),
    };
    w(&mut s, 1, format!("let s = {lane_s};"));
    w(&mut s, 1, format!("let col = tile_col * {c_n}u + {lane_c};"));
    w(&mut s, 1, format!("let cl = min(col, {}u);", n - 1));
    for r in 0..m {
        w(&mut s, 1, format!("var acc{r} = {t}();"));
    }
    let (lv, rv) = (format!("v{}", lhs.index()), format!("v{}", rhs.index()));
    w(&mut s, 1, format!("for (var kk = s; kk < {k}u; kk = kk + {s_n}u) {{"));
    w(&mut s, 2, format!("let b = {rv}(b_base + kk * {n}u + cl);"));
    for r in 0..m {
        w(
            &mut s,
            2,
            format!(
                "acc{r} = acc{r} + {lv}(a_base + {}kk) * b;",
                if r == 0 { String::new() } else { format!("{}u + ", r * k) }
            ),
        );
    }
    w(&mut s, 1, "}".into());
    for r in 0..m {
        w(
            &mut s,
            1,
            format!("fg_part[{}lid] = acc{r};", if r == 0 { String::new() } else { format!("{}u + ", r * WORKGROUP) }),
        );
    }
    w(&mut s, 1, "workgroupBarrier();".into());
    let mut stride = s_n / 2;
    while stride >= 1 {
        w(&mut s, 1, format!("if (s < {stride}u) {{"));
        for r in 0..m {
            let at = format!("{}u + lid", r * WORKGROUP);
            w(&mut s, 2, format!("fg_part[{at}] = fg_part[{at}] + fg_part[{at} + {}u];", stride * sstep));
        }
        w(&mut s, 1, "}".into());
        w(&mut s, 1, "workgroupBarrier();".into());
        stride /= 2;
    }
    let e = format!("e{}_acc", output.index());
    w(&mut s, 1, format!("if (s == 0u && col < {n}u) {{"));
    for r in 0..m {
        w(
            &mut s,
            2,
            format!("let i{r} = o_base + {}col;", if r == 0 { String::new() } else { format!("{}u + ", r * n) }),
        );
        let value = store_value(out_dt, &format!("{e}(i{r}, fg_part[{}u + lid])", r * WORKGROUP));
        w(&mut s, 2, format!("b{k_out}[i{r}] = {value};"));
    }
    w(&mut s, 1, "}".into());
    w(&mut s, 0, "}".into());
    (s, workgroups)
}
