//! Row kernels: every reduction of the kernel reduces the same axes of one shape; a row is
//! reduced by a workgroup (a tree in workgroup memory, or subgroups), or by one invocation
//! where rows are many, then the row's outputs are written.

use crate::body::*;
use crate::loops::*;
use crate::options::*;
use crate::region::*;
use crate::storage::*;
use crate::writer::{literal, ravel, unravel, vty};
use fusegraph_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceKind, UnaryOp};
use fusegraph_passes::kernel::region_of;
use fusegraph_passes::{Kernel, KernelKind};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Writes element `idx` (an expression) of output binding `k` from a row kernel.
pub(crate) fn row_store(
    main: &mut String,
    k: usize,
    dtype: DType,
    idx: &str,
    value: &str,
    opts: &LowerOptions,
    indent: &str,
) {
    if packed_halves(dtype, opts) {
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
pub(crate) fn row_main(
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
    let (per_thread, subgroups) = row_layout(g, red.reduces, shape, axes, opts);
    let wg = row_len.next_power_of_two().clamp(32, WORKGROUP_SIZE as usize);
    write_elem_fn(body, shape, axes);
    if per_thread {
        let shape = (rows, row_len, full);
        return row_main_per_thread(g, bindings, red, shape, opts, quads, body);
    }
    for (k, &r) in red.reduces.iter().enumerate() {
        let _ = writeln!(body, "var<workgroup> fg_red{k}: array<{}, {wg}>;", vty(g.ty(r).dtype));
        if matches!(g.node(r).op, Op::ArgMax { .. }) {
            // An argmax's partial maxima and their indices (see [`workgroup_argmax`]).
            let _ = writeln!(body, "var<workgroup> fg_arg{k}: array<{}, {wg}>;", vty(g.ty(g.operands(r)[0]).dtype));
            let _ = writeln!(body, "var<workgroup> fg_argi{k}: array<u32, {wg}>;");
        }
    }

    let mut main = String::new();
    let _ = writeln!(main, "@compute @workgroup_size({wg})");
    if subgroups {
        let _ = writeln!(main, "fn main({MAIN_ARGS}, {SUBGROUP_ARGS}) {{");
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

/// Writes `fg_elem(row, e)`: the linear index in `shape` of element `e` of row `row`, the
/// rows those of `shape` reduced over `axes`.
pub(crate) fn write_elem_fn(body: &mut String, shape: &[usize], axes: &[usize]) {
    let kept: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a)).collect();
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
}

/// The row kernel with one invocation per row: each reduction is a serial loop whose result
/// stays in a private variable; no workgroup memory, no barriers.
#[allow(clippy::too_many_arguments)]
pub(crate) fn row_main_per_thread(
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
    let ilp = if opts.forms.rows == Spread::Serial { CPU_INTERLEAVE } else { 1 };
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
pub(crate) struct RowReduces<'a> {
    pub(crate) reduces: &'a [NodeId],
    pub(crate) scalars: &'a [(NodeId, usize)],
    pub(crate) deps: &'a BTreeMap<NodeId, usize>,
}

/// How an invocation of a row kernel walks its row: elements `start, start + step, …`,
/// `ilp` of them side by side (each into its own partial).
#[derive(Clone, Copy)]
pub(crate) struct RowWalk<'a> {
    /// The row's length.
    pub(crate) len: usize,
    pub(crate) start: &'a str,
    pub(crate) step: usize,
    pub(crate) ilp: usize,
    /// Four adjacent elements per step, read (and written) as `vec4`s where they can be.
    pub(crate) quads: Option<RowQuads<'a>>,
}

/// What a row kernel walking its rows four adjacent elements at a time needs (see
/// [`row_quads`]): the kernel (for the regions its reductions read), its bindings, its
/// outputs' regions and the bindings read and written as `vec4`s.
#[derive(Clone, Copy)]
pub(crate) struct RowQuads<'a> {
    pub(crate) quads: Quads<'a>,
    pub(crate) regions: &'a [(NodeId, Vec<NodeId>)],
}

/// How a row kernel runs: `(per thread, subgroups)`. Many rows (or the serial family): one
/// invocation per row, no barriers. Few long rows: a workgroup per row with a tree in
/// workgroup memory, with subgroup arithmetic where the adapter has it (f32, f16, i32 and
/// u32 reductions; not bool).
pub(crate) fn row_layout(
    g: &Graph,
    reduces: &[NodeId],
    shape: &[usize],
    axes: &[usize],
    opts: &LowerOptions,
) -> (bool, bool) {
    let row_len: usize = axes.iter().map(|&a| shape[a]).product();
    let rows = shape.iter().product::<usize>().checked_div(row_len).unwrap_or(0);
    let per_thread = rows_per_thread(opts, rows, row_len, reduces.len() + 1);
    (per_thread, opts.subgroups && reduces.iter().all(|&r| g.ty(r).dtype != DType::Bool))
}

/// Whether a row kernel gives each row one invocation rather than a workgroup: in the
/// serial family ([`Spread::Serial`]) from 16 rows, in the parallel one from 8192 rows of at
/// most 256; in both only where one invocation's walks over its row (`passes` of them, one
/// per reduction and one for the outputs) fit the adapter's loop budget.
pub(crate) fn rows_per_thread(opts: &LowerOptions, rows: usize, row_len: usize, passes: usize) -> bool {
    let within = within_budget(opts, row_len as u64, passes as u64);
    within
        && match opts.forms.rows {
            Spread::Serial => rows >= 16,
            Spread::Parallel => rows >= 8192 && row_len <= 256,
        }
}

/// The statements computing `root` at an element index (its region, or a read of it when it
/// is not a member) and the name of its value (`xN` or `yN`).
pub(crate) fn stmts_at(g: &Graph, kernel: &Kernel, root: NodeId) -> (Vec<RegionStmt>, String) {
    let region = region_of(g, kernel, root);
    if region.is_empty() {
        (vec![RegionStmt::Read(root)], format!("y{}", root.index()))
    } else {
        (region_stmts(g, &region, None), format!("x{}", root.index()))
    }
}

/// The bindings a row kernel reads and writes as `vec4`s, where the serial family gives each
/// row one invocation and a row is contiguous (reduced over the trailing axes) with a length
/// divisible by 4: each pass over a row then takes four adjacent elements per step (see
/// [`interleaved_main`] for why). Inputs the reductions' or the full outputs' regions load
/// four adjacent elements of at a time (see [`quad_view`]), and full outputs whose dtype
/// allows it; `None` where nothing would be.
pub(crate) fn row_quads(
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
    let passes = kernel.members.iter().filter(|&&m| g.node(m).op.reduced_axes().is_some()).count() + 1;
    // An argmax keeps each element's index with its value: its walk is one element a step.
    let argmax = kernel.members.iter().any(|&m| matches!(g.node(m).op, Op::ArgMax { .. }));
    if opts.forms.rows != Spread::Serial
        || argmax
        || !rows_per_thread(opts, rows, row_len, passes)
        || !trailing
        || !row_len.is_multiple_of(4)
    {
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
pub(crate) fn row_reductions(main: &mut String, g: &Graph, red: RowReduces, walk: RowWalk, workgroup: Option<bool>) {
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
        } else if matches!(g.node(reduces[k]).op, Op::ArgMax { .. }) {
            let x = g.operands(reduces[k])[0];
            argmax_partials(main, g, x, walk);
            match workgroup {
                None => {
                    let _ = writeln!(main, "        fg_red{k}[0] = {};", argmax_result(g, x, "bi"));
                }
                Some(subgroups) => workgroup_argmax(main, g, (x, k), walk.step, subgroups),
            }
            let _ = writeln!(main, "    }}");
            write_row_scalars(main, scalars, k);
        } else {
            let kind = reduce_partials(main, g, reduces[k], walk);
            finish(main, kind, k, "acc");
            let _ = writeln!(main, "    }}");
            write_row_scalars(main, scalars, k);
        }
    }
}

/// Whether the candidate `(v, i)` replaces the best `(bv, bi)` so far in an argmax: a
/// greater value, or an equal one earlier in the row. A NaN never replaces anything (the
/// reference's scan compares with `>`); the one NaN that wins, at element 0, is
/// [`argmax_result`]'s.
fn argmax_better(v: &str, i: &str, bv: &str, bi: &str) -> String {
    format!("{v} > {bv} || ({v} == {bv} && {i} < {bi})")
}

/// The i32 an argmax of `x` over the row gives with `best` the index of its first maximum
/// among the non-NaN elements: 0 where element 0 is NaN, as the reference's scan (which
/// starts there, and which nothing then replaces) gives.
/// (NaN is found by its bits: compilers may fold `x != x` to false.)
fn argmax_result(g: &Graph, x: NodeId, best: &str) -> String {
    if !g.ty(x).dtype.is_float() {
        return format!("i32({best})");
    }
    let first = format!("bitcast<u32>(f32(v{}(fg_elem(row, 0u))))", x.index());
    format!("i32(select({best}, 0u, ({first} & 0x7fffffffu) > 0x7f800000u))")
}

/// Opens a block that finds this invocation's first maximum of `x` among its elements of
/// the row (the walk's), as the value `bv` and the element's index in the row `bi`
/// (`0xffffffff` where it has no element that is not NaN).
fn argmax_partials(main: &mut String, g: &Graph, x: NodeId, walk: RowWalk) {
    let dt = g.ty(x).dtype;
    let init = |u: usize| {
        let identity = reduce_identity(ReduceKind::Max, dt);
        format!("var bv{u}: {} = {identity};\n        var bi{u}: u32 = 0xffffffffu;", vty(dt))
    };
    // Element `e + u · step` of the row (the remainder's elements are `x0` at `e`).
    let index = |u: usize| if u == 0 { "e".to_string() } else { format!("(e + {}u)", u * walk.step) };
    let update = |u: usize| {
        let better = argmax_better(&format!("x{u}"), &index(u), &format!("bv{u}"), &format!("bi{u}"));
        format!("if ({better}) {{ bv{u} = x{u}; bi{u} = {}; }}", index(u))
    };
    row_pass(main, g, x, walk, &init, &update);
    let _ = writeln!(main, "        var bv = bv0;\n        var bi = bi0;");
    for u in 1..walk.ilp {
        let better = argmax_better(&format!("bv{u}"), &format!("bi{u}"), "bv", "bi");
        let _ = writeln!(main, "        if ({better}) {{ bv = bv{u}; bi = bi{u}; }}");
    }
}

/// Combines each invocation's argmax partial (`bv`, `bi`: [`argmax_partials`]) of `x` over
/// the `wg` invocations sharing a row into `fg_red{k}[0]` (the i32 result), visible to all
/// of them afterwards: the subgroup's maximum and the least index holding it, then one
/// partial per subgroup; or a tree of pairs in workgroup memory.
fn workgroup_argmax(main: &mut String, g: &Graph, (x, k): (NodeId, usize), wg: usize, subgroups: bool) {
    let mut lines = Vec::new();
    let better = |v: &str, i: &str| argmax_better(v, i, &format!("fg_arg{k}[lid]"), &format!("fg_argi{k}[lid]"));
    if subgroups {
        lines.push("let top = subgroupMax(bv);".to_string());
        lines.push("let at = subgroupMin(select(0xffffffffu, bi, bv == top));".into());
        lines.push(format!("if (sg_lane == 0u) {{ fg_arg{k}[sg_id] = top; fg_argi{k}[sg_id] = at; }}"));
        lines.push("workgroupBarrier();".into());
        lines.push("if (lid == 0u) {".into());
        lines.push("    for (var j = 1u; j < sg_count; j = j + 1u) {".into());
        lines.push(format!("        if ({}) {{", better(&format!("fg_arg{k}[j]"), &format!("fg_argi{k}[j]"))));
        lines.push(format!("            fg_arg{k}[0] = fg_arg{k}[j];"));
        lines.push(format!("            fg_argi{k}[0] = fg_argi{k}[j];"));
        lines.push("        }".into());
        lines.push("    }".into());
    } else {
        lines.push(format!("fg_arg{k}[lid] = bv;"));
        lines.push(format!("fg_argi{k}[lid] = bi;"));
        lines.push("workgroupBarrier();".into());
        lines.push(format!("for (var w = {}u; w > 0u; w = w >> 1u) {{", wg / 2));
        let (v, i) = (format!("fg_arg{k}[lid + w]"), format!("fg_argi{k}[lid + w]"));
        lines.push(format!(
            "    if (lid < w && ({})) {{ fg_arg{k}[lid] = {v}; fg_argi{k}[lid] = {i}; }}",
            better(&v, &i)
        ));
        lines.push("    workgroupBarrier();".into());
        lines.push("}".into());
        lines.push("if (lid == 0u) {".into());
    }
    lines.push(format!("    fg_red{k}[0] = {};", argmax_result(g, x, &format!("fg_argi{k}[0]"))));
    lines.push("}".into());
    lines.push("workgroupBarrier();".into());
    for line in lines {
        let _ = writeln!(main, "        {line}");
    }
}

/// Combines each invocation's `value` of reduction `k` over the `wg` invocations sharing a
/// row into `fg_red{k}[0]`, visible to all of them afterwards: by subgroup operations and
/// one partial per subgroup (two barriers), or by a tree in workgroup memory.
pub(crate) fn workgroup_combine(
    main: &mut String,
    kind: ReduceKind,
    k: usize,
    value: &str,
    wg: usize,
    subgroups: bool,
) {
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

/// Members of a kernel whose reductions all reduce `axes` of `shape` (a row kernel, or a
/// matrix–vector kernel's row prologue) that hold one value per row and depend on the
/// reductions (mean, `rsqrt(var + eps)`, …), each with the index of the last reduction it
/// needs, in member (topological) order.
pub(crate) fn row_scalars(
    g: &Graph,
    kernel: &Kernel,
    (shape, axes): (&[usize], &[usize]),
    reduces: &[NodeId],
    deps: &BTreeMap<NodeId, usize>,
) -> Vec<(NodeId, usize)> {
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
pub(crate) fn reduction_deps(g: &Graph, kernel: &Kernel, reduces: &[NodeId]) -> BTreeMap<NodeId, usize> {
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
pub(crate) fn write_row_scalars(main: &mut String, scalars: &[(NodeId, usize)], k: usize) {
    for (j, &(m, after)) in scalars.iter().enumerate() {
        if after == k {
            let _ = writeln!(main, "    fg_rs{j} = c{}(row);", m.index());
        }
    }
}

/// The reduced axes where `a` and `b` are f32 reductions of the given kinds over the same
/// axes.
pub(crate) fn f32_pair(g: &Graph, (a, ka): (NodeId, ReduceKind), (b, kb): (NodeId, ReduceKind)) -> Option<&[usize]> {
    let (Op::Reduce { kind: x, axes: xa, .. }, Op::Reduce { kind: y, axes: xb, .. }) = (&g.node(a).op, &g.node(b).op)
    else {
        return None;
    };
    let f32s = g.ty(a).dtype == DType::F32 && g.ty(b).dtype == DType::F32;
    (*x == ka && *y == kb && xa == xb && f32s).then_some(xa.as_slice())
}

/// `Some(x)` where row reductions `a` then `b` are a softmax's: `a` the max of `x` and `b`
/// the sum of `exp(x - a)` (`a` broadcast back over the row), both f32 over the same axes.
pub(crate) fn softmax_pair(g: &Graph, a: NodeId, b: NodeId) -> Option<NodeId> {
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
pub(crate) fn centered_pair(g: &Graph, a: NodeId, b: NodeId) -> Option<(NodeId, NodeId)> {
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
pub(crate) fn welford(main: &mut String, g: &Graph, x: NodeId, walk: RowWalk) {
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
pub(crate) fn online_softmax(main: &mut String, g: &Graph, x: NodeId, walk: RowWalk) {
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
pub(crate) fn row_pass(
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
        emit_elements(main, g, &refs, 4, Some(q.quads), "            ", "");
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
/// into `acc`, returning the reduction's kind. With `ilp` > 1 (the serial family, where a serial
/// chain of combines is bound by its latency: see [`CPU_INTERLEAVE`]) the partials are
/// combined at the end, so float sums and products are rounded in another order than one
/// serial loop's.
pub(crate) fn reduce_partials(main: &mut String, g: &Graph, r: NodeId, walk: RowWalk) -> ReduceKind {
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
pub(crate) fn write_row_outputs(
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
        emit_elements(main, g, &stmts, 4, Some(q.quads), "        ", "");
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
