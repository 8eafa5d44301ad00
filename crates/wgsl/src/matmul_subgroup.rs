//! The subgroup matmul of CPU adapters with a fixed subgroup size (`subgroup_main`): each
//! subgroup computes a block of the output from vec4 operands, read from textures where the
//! runtime copies them ([`SubgroupPlan`]).

use crate::matmul::*;
use crate::options::{Binding, LowerOptions};
use crate::region::write_region;
use crate::storage::{packed_halves, store_value};
use crate::view::{reshape_strides, split_last_axis_view, strided_view, StridedView};
use crate::writer::unravel;
use fusegraph_ir::{DType, Graph, NodeId, Op};
use fusegraph_passes::Kernel;
use std::fmt::Write;

/// How `kernel` is lowered by the subgroup matmul under `opts` (see `subgroup_plan`), or
/// `None` where it is not (no matmul, another adapter, operands that are not plain views).
pub fn subgroup_matmul(g: &Graph, kernel: &Kernel, opts: &LowerOptions) -> Option<SubgroupPlan> {
    if kernel.kind != fusegraph_passes::KernelKind::Loop {
        return None;
    }
    let regs = fusegraph_passes::kernel::regions(g, kernel);
    subgroup_plan(g, kernel, &plan(g, kernel, &regs, opts)?, opts)
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
    if !(opts.subgroups && (4..=64).contains(&lanes) && lanes.is_power_of_two()) {
        return None;
    }
    let mm = plan.matmul;
    let ops = g.operands(mm);
    // f32 or f16 storage (computed in f32: mixed precision's products).
    let floats = [mm, ops[0], ops[1]].iter().all(|&n| matches!(g.ty(n).dtype, DType::F32 | DType::F16));
    let ranks = ops.iter().all(|&o| g.ty(o).shape.rank() >= 2);
    let conv = matches!(g.node(mm).op, Op::Conv2d { groups: 1, .. });
    if !(conv || matches!(g.node(mm).op, Op::MatMul))
        || !floats
        || !ranks
        || packed_halves(g.ty(plan.output).dtype, opts)
    {
        return None;
    }
    let (batch, m, n, k) = gemm_dims(g, mm);
    // Contiguous along axis `unit`; every other stride and the offset in whole vec4s; a
    // binding of f32 or of native f16 (`vec4<f16>`, widened on load).
    let aligned = |v: &StridedView, unit: usize| {
        !packed_halves(g.ty(v.leaf).dtype, opts)
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
            && !packed_halves(g.ty(n).dtype, opts)
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
pub(crate) const MAX_TEXTURE_OPERANDS: usize = 16;

/// `op`, or the value below the float-to-float casts it is made of (mixed precision rounds
/// f32 weights to f16 on their way into a product), and whether those casts round to f16:
/// a product reads that value's view and rounds each vec4 (`fg_round_f16x4`), instead of
/// calling the cast's element function per element.
pub(crate) fn below_float_casts(g: &Graph, kernel: &Kernel, op: NodeId) -> (NodeId, bool) {
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
