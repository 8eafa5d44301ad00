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
use fusegraph_ir::{DType, Graph, NodeId, Op};
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

/// How the kernel reads its rhs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct GemvRhs {
    /// How the rhs's elements lie along `k`.
    pub along: KAlong,
    /// The rhs is a packed binding read by whole words.
    pub packed: Option<PackedRhs>,
}

/// A rhs that is a binding of packed values — a block type, or bf16 (two to a word) with `k`
/// a multiple of 8 — stored `[n, k]` and read transposed, below casts only: each invocation
/// reads a chunk of a column (a block's scale and 32 values; 8 bf16 values) as whole words
/// and converts four values at a time, instead of loading a word (and a block's scale) per
/// value through the element function.
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
        self.dtype.block().map_or(8, |(values, _)| values)
    }
}

/// How the rhs of `mm` reads its binding: along `k` where, below its casts, it is an odd
/// number of swaps of its binding's last two axes; by words where that binding is packed
/// ([`PackedRhs`]) and the product has no batch on that side.
pub(crate) fn gemv_rhs(g: &Graph, kernel: &Kernel, mm: NodeId) -> GemvRhs {
    let strided = GemvRhs { along: KAlong::Strided, packed: None };
    let rhs = g.operands(mm)[1];
    let (mut n, mut swapped, mut casts) = (rhs, false, Vec::new());
    while kernel.members.contains(&n) {
        match &g.node(n).op {
            Op::Cast { to } => casts.push((g.ty(g.operands(n)[0]).dtype, *to)),
            Op::Transpose { perm } => {
                let r = perm.len();
                let last_two = r >= 2 && perm[r - 2] == r - 1 && perm[r - 1] == r - 2;
                if !last_two || perm[..r - 2].iter().enumerate().any(|(a, &p)| a != p) {
                    return strided;
                }
                swapped = !swapped;
            }
            _ => return strided,
        }
        n = g.operands(n)[0];
    }
    if !swapped {
        return strided;
    }
    let rd = g.ty(rhs).shape.dims();
    let unbatched = rd[..rd.len() - 2].iter().all(|&d| d == 1);
    let dtype = g.ty(n).dtype;
    let words = dtype.block().is_some() || dtype == DType::BF16 && rd[rd.len() - 2] & 7 == 0;
    let packed = (words && unbatched && kernel.inputs.contains(&n)).then(|| {
        casts.reverse();
        PackedRhs { leaf: n, dtype, casts }
    });
    GemvRhs { along: KAlong::Contiguous, packed }
}

/// Writes `eO_acc` and the partials' workgroup array into `body` and returns `main` and the
/// number of workgroups (one per `C` columns per batch entry); `rhs_read` is how the rhs is
/// read ([`gemv_rhs`]).
pub(crate) fn gemv_main(
    g: &Graph,
    bindings: &[Binding],
    plan: &TiledPlan,
    rhs_read: &GemvRhs,
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
    let along = rhs_read.along;
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
    match &rhs_read.packed {
        Some(packed) => {
            let slot = bindings.iter().position(|b| !b.output && b.node == packed.leaf).expect("the rhs's binding");
            packed_loop(&mut s, packed, slot, &lv, m, k, s_n);
        }
        None => {
            w(&mut s, 1, format!("for (var kk = s; kk < {k}u; kk = kk + {s_n}u) {{"));
            w(&mut s, 2, format!("let b = {rv}(b_base + kk * {n}u + cl);"));
            for r in 0..m {
                let row = if r == 0 { String::new() } else { format!("{}u + ", r * k) };
                w(&mut s, 2, format!("acc{r} = acc{r} + {lv}(a_base + {row}kk) * b;"));
            }
            w(&mut s, 1, "}".into());
        }
    }
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

/// The loop over `k` of a packed rhs ([`PackedRhs`]): invocation `s` of a column takes its
/// chunks `s`, `s + S`, …, reads each chunk's words whole and converts its values four at a
/// time into `vec4`s that meet four of each row's lhs values in a `dot`. A block's bytes
/// start at an even offset: its values' words are the block's words shifted by half a word,
/// or not.
fn packed_loop(s: &mut String, packed: &PackedRhs, slot: usize, lv: &str, m: usize, k: usize, s_n: usize) {
    let w = line;
    let chunk = packed.chunk();
    w(s, 1, format!("for (var blk = s; blk < {}u; blk = blk + {s_n}u) {{", k / chunk));
    w(s, 2, format!("let kb = blk * {chunk}u;"));
    // (the first of four values' place in the chunk, their f32 values)
    let mut quads: Vec<(usize, String)> = Vec::new();
    match packed.dtype.block() {
        Some((_, bytes)) => {
            let value_words = (bytes - 2) / 4;
            w(s, 2, format!("let base = (cl * {}u + blk) * {bytes}u;", k / chunk));
            w(s, 2, "let wb = base >> 2u;".into());
            w(s, 2, "let aligned = (base & 3u) == 0u;".into());
            for j in 0..=value_words {
                w(s, 2, format!("let x{j} = b{slot}[wb + {j}u];"));
            }
            w(s, 2, "let d = unpack2x16float(x0)[(base >> 1u) & 1u];".into());
            for t in 0..value_words {
                w(s, 2, format!("let q{t} = select(x{0}, (x{t} >> 16u) | (x{0} << 16u), aligned);", t + 1));
                if packed.dtype == DType::Q8_0 {
                    let bytes =
                        format!("(vec4<i32>(bitcast<i32>(q{t})) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u)");
                    quads.push((4 * t, format!("vec4<f32>({bytes}) * d")));
                } else {
                    for (half, shifts) in [(0, "0u, 8u, 16u, 24u"), (16, "4u, 12u, 20u, 28u")] {
                        let nibbles = format!("(vec4<u32>(q{t}) >> vec4<u32>({shifts})) & vec4<u32>(15u)");
                        quads.push((half + 4 * t, format!("(vec4<f32>({nibbles}) - 8.0) * d")));
                    }
                }
            }
        }
        // bf16: two to a word, each the top half of its f32.
        None => {
            w(s, 2, format!("let wb = (cl * {k}u + kb) >> 1u;"));
            for j in 0..chunk / 2 {
                w(s, 2, format!("let x{j} = b{slot}[wb + {j}u];"));
            }
            for e in (0..chunk).step_by(4) {
                let (a, b) = (e / 2, e / 2 + 1);
                let halves = format!("x{a} << 16u, x{a} & 0xffff0000u, x{b} << 16u, x{b} & 0xffff0000u");
                quads.push((e, format!("bitcast<vec4<f32>>(vec4<u32>({halves}))")));
            }
        }
    }
    for (e, value) in quads {
        w(s, 2, format!("let u{e} = {value};"));
        w(s, 2, format!("let w{e} = {};", cast_quad(&packed.casts, &format!("u{e}"))));
        for r in 0..m {
            let a: Vec<String> = (0..4).map(|i| format!("{lv}(a_base + {}u + kb + {}u)", r * k, e + i)).collect();
            w(s, 2, format!("acc{r} = acc{r} + dot(vec4<f32>({}), w{e});", a.join(", ")));
        }
    }
    w(s, 1, "}".into());
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
