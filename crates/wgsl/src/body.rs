//! The body of `fn vN(i: u32) -> T`: element `i` of node `N` in terms of its operands'
//! functions `vM(j)`. One arm per primitive op; fused kernels reuse these bodies unchanged.

use crate::writer::{literal, ravel, unravel, vty};
use fusegraph_ir::{BinaryOp, DType, Graph, NodeId, Op, PoolKind, ReduceKind, UnaryOp};
use std::fmt::Write;

fn v(id: NodeId) -> String {
    format!("v{}", id.index())
}

/// The start of a dynamic window clamped to `[0, last]`, as a u32 expression: `start` is a
/// rank-0 i32 or u32, or one per index of the leading axis, read at `lead` (that index's
/// coordinate expression).
pub(crate) fn clamped_start(g: &Graph, start: NodeId, last: usize, lead: &str) -> String {
    let at = if g.ty(start).shape.rank() == 0 { "0u" } else { lead };
    match g.ty(start).dtype {
        DType::I32 => format!("u32(clamp({}({at}), 0i, {last}i))", v(start)),
        _ => format!("min({}({at}), {last}u)", v(start)),
    }
}

/// Writes the statements of node `id`'s element function; the element index is `i`.
pub fn write_body(g: &Graph, id: NodeId, out: &mut String) {
    let node = g.node(id);
    let ops = g.operands(id);
    let ty = &node.ty;
    let dims = ty.shape.dims();
    let t = vty(ty.dtype);
    let a = ops.first().map(|&o| v(o)).unwrap_or_default();
    let w = |out: &mut String, s: String| {
        let _ = writeln!(out, "    {s}");
    };
    match &node.op {
        Op::Full { value } => w(out, format!("return {};", literal(ty.dtype, *value))),
        Op::Iota { axis } => {
            let c = unravel(out, dims, "i", "c");
            w(out, format!("return {};", rounded(g, id, format!("{t}({})", c[*axis]))));
        }
        Op::Input { .. } | Op::Parameter { .. } | Op::Constant { .. } => {
            unreachable!("memory leaves are loaded, never computed")
        }
        Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. } => {
            let args: Vec<String> = ops.iter().map(|&o| format!("{}(i)", v(o))).collect();
            w(out, format!("return {};", elementwise_expr(g, id, &args)));
        }
        Op::Reshape { .. } => w(out, format!("return {a}(i);")),
        Op::Broadcast { dims: map, .. } => {
            let c = unravel(out, dims, "i", "c");
            let od = g.ty(ops[0]).shape.dims();
            let oc: Vec<String> = map.iter().map(|&d| c[d].clone()).collect();
            w(out, format!("return {a}({});", ravel(&oc, od)));
        }
        Op::Transpose { perm } => {
            let c = unravel(out, dims, "i", "c");
            let od = g.ty(ops[0]).shape.dims();
            let mut oc = vec![String::from("0u"); od.len()];
            for (k, &p) in perm.iter().enumerate() {
                oc[p] = c[k].clone();
            }
            w(out, format!("return {a}({});", ravel(&oc, od)));
        }
        Op::Slice { start, stride, .. } => {
            let c = unravel(out, dims, "i", "c");
            let od = g.ty(ops[0]).shape.dims();
            let oc: Vec<String> =
                (0..od.len()).map(|k| format!("({}u + {} * {}u)", start[k], c[k], stride[k])).collect();
            w(out, format!("return {a}({});", ravel(&oc, od)));
        }
        Op::Concat { axis } => {
            let c = unravel(out, dims, "i", "c");
            let mut offset = 0;
            for (n, &o) in ops.iter().enumerate() {
                let od = g.ty(o).shape.dims();
                let mut oc = c.clone();
                oc[*axis] = format!("({} - {offset}u)", c[*axis]);
                let call = format!("return {}({});", v(o), ravel(&oc, od));
                offset += od[*axis];
                if n + 1 == ops.len() {
                    w(out, call);
                } else {
                    w(out, format!("if ({} < {offset}u) {{ {call} }}", c[*axis]));
                }
            }
        }
        Op::Pad { low, value, .. } => {
            let c = unravel(out, dims, "i", "c");
            let od = g.ty(ops[0]).shape.dims();
            let mut conds = Vec::new();
            let mut oc = Vec::new();
            for k in 0..od.len() {
                if low[k] > 0 {
                    conds.push(format!("{} < {}u", c[k], low[k]));
                }
                conds.push(format!("{} >= {}u", c[k], low[k] + od[k]));
                oc.push(format!("({} - {}u)", c[k], low[k]));
            }
            if !conds.is_empty() {
                w(out, format!("if ({}) {{ return {}; }}", conds.join(" || "), literal(ty.dtype, *value)));
            }
            w(out, format!("return {a}({});", ravel(&oc, od)));
        }
        Op::Gather { axis } => {
            let table = g.ty(ops[0]).shape.dims();
            let it = g.ty(ops[1]);
            let idims = it.shape.dims();
            let c = unravel(out, dims, "i", "c");
            let icoords = &c[*axis..*axis + idims.len()];
            let d = table[*axis];
            let j = format!("{}({})", v(ops[1]), ravel(icoords, idims));
            let clamped = if it.dtype == DType::I32 {
                format!("u32(clamp({j}, 0i, {}i))", d as i64 - 1)
            } else {
                format!("min({j}, {}u)", d - 1)
            };
            w(out, format!("let j = {clamped};"));
            let mut tc: Vec<String> = c[..*axis].to_vec();
            tc.push("j".into());
            tc.extend_from_slice(&c[*axis + idims.len()..]);
            w(out, format!("return {a}({});", ravel(&tc, table)));
        }
        Op::DynamicUpdateSlice { axis } => {
            // The update inside the window `[s, s + u)` along the axis, the operand elsewhere.
            let c = unravel(out, dims, "i", "c");
            let udims = g.ty(ops[1]).shape.dims();
            w(out, format!("let s = {};", clamped_start(g, ops[2], dims[*axis] - udims[*axis], &c[0])));
            let at = &c[*axis];
            w(out, format!("if ({at} >= s && {at} < s + {}u) {{", udims[*axis]));
            let mut uc = c.clone();
            uc[*axis] = format!("({at} - s)");
            w(out, format!("    return {}({});", v(ops[1]), ravel(&uc, udims)));
            w(out, "}".into());
            w(out, format!("return {a}(i);"));
        }
        Op::Reduce { kind, axes, keep_dims } => {
            let od = g.ty(ops[0]).shape.dims();
            let c = unravel(out, dims, "i", "c");
            // Map result coordinates back to the kept operand axes.
            let mut oc = vec![String::new(); od.len()];
            let mut r = 0;
            for (k, slot) in oc.iter_mut().enumerate() {
                if axes.contains(&k) {
                    if *keep_dims {
                        r += 1;
                    }
                } else {
                    *slot = c[r].clone();
                    r += 1;
                }
            }
            let rdims: Vec<usize> = axes.iter().map(|&k| od[k]).collect();
            let count: usize = rdims.iter().product();
            w(out, format!("var acc: {t} = {};", reduce_identity(*kind, ty.dtype)));
            w(out, format!("for (var q = 0u; q < {count}u; q = q + 1u) {{"));
            let rc = unravel(out, &rdims, "q", "k");
            for (n, &k) in axes.iter().enumerate() {
                oc[k] = rc[n].clone();
            }
            w(out, format!("    acc = {};", combine(*kind, "acc", &format!("{a}({})", ravel(&oc, od)))));
            w(out, "}".into());
            w(out, format!("return {};", rounded(g, id, "acc".into())));
        }
        Op::ArgMax { axis, keep_dims } => {
            let od = g.ty(ops[0]).shape.dims();
            let c = unravel(out, dims, "i", "c");
            let mut oc = Vec::new();
            let mut r = 0;
            for k in 0..od.len() {
                if k == *axis {
                    oc.push("q".to_string());
                    if *keep_dims {
                        r += 1;
                    }
                } else {
                    oc.push(c[r].clone());
                    r += 1;
                }
            }
            let mut first = oc.clone();
            first[*axis] = "0u".into();
            w(out, format!("var best = {a}({});", ravel(&first, od)));
            w(out, "var bi = 0u;".into());
            w(out, format!("for (var q = 1u; q < {}u; q = q + 1u) {{", od[*axis]));
            w(out, format!("    let x = {a}({});", ravel(&oc, od)));
            w(out, "    if (x > best) { best = x; bi = q; }".into());
            w(out, "}".into());
            w(out, "return i32(bi);".into());
        }
        Op::MatMul => write_matmul_body(g, id, None, None, out),
        Op::Conv2d { stride, padding, dilation, groups } => {
            let (xd, wd) = (g.ty(ops[0]).shape.dims(), g.ty(ops[1]).shape.dims());
            let c = unravel(out, dims, "i", "c");
            let (cpg, opg) = (wd[1], wd[0] / groups);
            w(out, format!("let cbase = ({} / {opg}u) * {cpg}u;", c[1]));
            w(out, format!("var acc: {t} = 0.0f;"));
            w(out, format!("for (var ci = 0u; ci < {cpg}u; ci = ci + 1u) {{"));
            w(out, format!("for (var ky = 0u; ky < {}u; ky = ky + 1u) {{", wd[2]));
            w(out, format!("    let iy = i32({} * {}u + ky * {}u) - {}i;", c[2], stride[0], dilation[0], padding[0]));
            w(out, format!("    if (iy < 0i || iy >= {}i) {{ continue; }}", xd[2]));
            w(out, format!("    for (var kx = 0u; kx < {}u; kx = kx + 1u) {{", wd[3]));
            w(
                out,
                format!("        let ix = i32({} * {}u + kx * {}u) - {}i;", c[3], stride[1], dilation[1], padding[1]),
            );
            w(out, format!("        if (ix < 0i || ix >= {}i) {{ continue; }}", xd[3]));
            let xi = ravel(&[c[0].clone(), "(cbase + ci)".into(), "u32(iy)".into(), "u32(ix)".into()], xd);
            let wi = ravel(&[c[1].clone(), "ci".into(), "ky".into(), "kx".into()], wd);
            w(out, format!("        acc = acc + {a}({xi}) * {}({wi});", v(ops[1])));
            w(out, "    }".into());
            w(out, "}".into());
            w(out, "}".into());
            w(out, format!("return {};", rounded(g, id, "acc".into())));
        }
        Op::Pool { kind, window, stride, padding } => {
            let xd = g.ty(ops[0]).shape.dims();
            let c = unravel(out, dims, "i", "c");
            let init = match kind {
                PoolKind::Max => reduce_identity(ReduceKind::Max, ty.dtype),
                PoolKind::Avg => "0.0f".into(),
            };
            w(out, format!("var acc: f32 = {init};"));
            w(out, format!("for (var ky = 0u; ky < {}u; ky = ky + 1u) {{", window[0]));
            w(out, format!("    let iy = i32({} * {}u + ky) - {}i;", c[2], stride[0], padding[0]));
            w(out, format!("    if (iy < 0i || iy >= {}i) {{ continue; }}", xd[2]));
            w(out, format!("    for (var kx = 0u; kx < {}u; kx = kx + 1u) {{", window[1]));
            w(out, format!("        let ix = i32({} * {}u + kx) - {}i;", c[3], stride[1], padding[1]));
            w(out, format!("        if (ix < 0i || ix >= {}i) {{ continue; }}", xd[3]));
            let xi = ravel(&[c[0].clone(), c[1].clone(), "u32(iy)".into(), "u32(ix)".into()], xd);
            let comb = match kind {
                PoolKind::Max => format!("max(acc, {a}({xi}))"),
                PoolKind::Avg => format!("acc + {a}({xi})"),
            };
            w(out, format!("        acc = {comb};"));
            w(out, "    }".into());
            w(out, "}".into());
            match kind {
                PoolKind::Max => w(out, "return acc;".into()),
                PoolKind::Avg => {
                    w(out, format!("return {};", rounded(g, id, format!("acc / {}.0f", window[0] * window[1]))))
                }
            }
        }
    }
}

/// The element function body of matmul `id`: a loop over `k` of lhs × rhs at the element's
/// row and column (size-1 batch axes of an operand broadcast). With `lhs_row`, the lhs
/// values come from that array, indexed by `k` (a row the caller loaded: the invocation's
/// query row in an attention kernel). With `rhs_tile` `(name, block)`, the rhs column comes
/// from that array holding `block` columns of `k` values each, column `c` at `c % block`
/// (a block of keys an attention kernel's workgroup staged).
pub(crate) fn write_matmul_body(
    g: &Graph,
    id: NodeId,
    lhs_row: Option<&str>,
    rhs_tile: Option<(&str, usize)>,
    out: &mut String,
) {
    let ops = g.operands(id);
    let ty = g.ty(id);
    let dims = ty.shape.dims();
    let (ld, rd) = (g.ty(ops[0]).shape.dims(), g.ty(ops[1]).shape.dims());
    let rank = dims.len();
    let c = unravel(out, dims, "i", "c");
    let k = ld[ld.len() - 1];
    let lhs = match lhs_row {
        Some(row) => format!("{row}[kk]"),
        None => {
            let mut lc = batch_coords(&c, rank, ld);
            lc.extend([c[rank - 2].clone(), "kk".into()]);
            format!("{}({})", v(ops[0]), ravel(&lc, ld))
        }
    };
    let rhs = match rhs_tile {
        Some((tile, block)) => format!("{tile}[({} % {block}u) * {k}u + kk]", c[rank - 1]),
        None => {
            let mut rc = batch_coords(&c, rank, rd);
            rc.extend(["kk".into(), c[rank - 1].clone()]);
            format!("{}({})", v(ops[1]), ravel(&rc, rd))
        }
    };
    let _ = writeln!(out, "    var acc: {} = {};", vty(ty.dtype), literal(ty.dtype, 0.0));
    let _ = writeln!(out, "    for (var kk = 0u; kk < {k}u; kk = kk + 1u) {{");
    let _ = writeln!(out, "        acc = acc + {lhs} * {rhs};");
    let _ = writeln!(out, "    }}");
    let _ = writeln!(out, "    return {};", rounded(g, id, "acc".into()));
}

/// Batch coordinates of a matmul operand of `dims` for the coordinates `c` of a result of
/// rank `rank` (size-1 operand axes broadcast).
pub(crate) fn batch_coords(c: &[String], rank: usize, dims: &[usize]) -> Vec<String> {
    let off = rank - dims.len();
    (0..dims.len() - 2).map(|a| if dims[a] == 1 { "0u".into() } else { c[a + off].clone() }).collect()
}

/// `expr`, the value of node `id` computed in f32, rounded to f16 where `id` is an f16 value:
/// every f16 value is the same wherever it is used, whether recomputed in a kernel's
/// registers or loaded from where another kernel stored it (as in the reference, which
/// rounds every result to its dtype). Without it a max-reduction's backward compared a
/// recomputed value with the stored f16 maximum, found no equal element and divided by
/// zero (tests/fuzz_device.rs, mixed-precision training).
pub(crate) fn rounded(g: &Graph, id: NodeId, expr: String) -> String {
    if g.ty(id).dtype == DType::F16 {
        format!("fg_round_f16({expr})")
    } else {
        expr
    }
}

/// The expression of elementwise node `id` given its operands' values as expressions.
pub fn elementwise_expr(g: &Graph, id: NodeId, args: &[String]) -> String {
    let node = g.node(id);
    let ops = g.operands(id);
    // Ops whose result is one of their f16 operands' values, or an integer or sign of one,
    // are f16 values already: no rounding.
    match &node.op {
        Op::Unary(u @ (UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Sign)) => {
            unary(*u, &args[0])
        }
        Op::Unary(u) => rounded(g, id, unary(*u, &args[0])),
        Op::Binary(b @ (BinaryOp::Max | BinaryOp::Min)) => binary(*b, g.ty(ops[0]).dtype, &args[0], &args[1]),
        Op::Binary(b) => rounded(g, id, binary(*b, g.ty(ops[0]).dtype, &args[0], &args[1])),
        Op::Select => format!("select({}, {}, {})", args[2], args[1], args[0]),
        Op::Cast { to } => cast(g.ty(ops[0]).dtype, *to, &args[0]),
        _ => unreachable!("only elementwise ops have an elementwise expression"),
    }
}

fn unary(u: UnaryOp, x: &str) -> String {
    match u {
        UnaryOp::Neg => format!("-({x})"),
        UnaryOp::Abs => format!("abs({x})"),
        UnaryOp::Exp => format!("exp({x})"),
        UnaryOp::Log => format!("log({x})"),
        UnaryOp::Sqrt => format!("sqrt({x})"),
        UnaryOp::Rsqrt => format!("inverseSqrt({x})"),
        UnaryOp::Recip => format!("(1.0f / {x})"),
        // Not the builtin: some drivers return NaN for large arguments, some lower it to two
        // exponentials and a division (see `fg_tanh` in shaders/helpers.wgsl).
        UnaryOp::Tanh => format!("fg_tanh({x})"),
        UnaryOp::Sigmoid => format!("(1.0f / (1.0f + exp(-({x}))))"),
        UnaryOp::Erf => format!("fg_erf({x})"),
        UnaryOp::Sin => format!("sin({x})"),
        UnaryOp::Cos => format!("cos({x})"),
        UnaryOp::Floor => format!("floor({x})"),
        UnaryOp::Ceil => format!("ceil({x})"),
        UnaryOp::Sign => format!("sign({x})"),
        UnaryOp::Not => format!("!({x})"),
    }
}

fn binary(b: BinaryOp, dtype: DType, x: &str, y: &str) -> String {
    match b {
        BinaryOp::Add => format!("({x} + {y})"),
        BinaryOp::Sub => format!("({x} - {y})"),
        BinaryOp::Mul => format!("({x} * {y})"),
        BinaryOp::Div => match dtype {
            DType::I32 => format!("fg_div_i32({x}, {y})"),
            DType::U32 => format!("fg_div_u32({x}, {y})"),
            _ => format!("({x} / {y})"),
        },
        BinaryOp::Pow => format!("pow({x}, {y})"),
        BinaryOp::Max => format!("max({x}, {y})"),
        BinaryOp::Min => format!("min({x}, {y})"),
        BinaryOp::Eq => format!("({x} == {y})"),
        BinaryOp::Ne => format!("({x} != {y})"),
        BinaryOp::Lt => format!("({x} < {y})"),
        BinaryOp::Le => format!("({x} <= {y})"),
        BinaryOp::Gt => format!("({x} > {y})"),
        BinaryOp::Ge => format!("({x} >= {y})"),
        BinaryOp::And => format!("({x} && {y})"),
        BinaryOp::Or => format!("({x} || {y})"),
    }
}

pub(crate) fn cast(from: DType, to: DType, x: &str) -> String {
    use DType::*;
    match (from, to) {
        _ if from == to => x.to_string(),
        (F32, F16) => format!("fg_round_f16({x})"),
        // A bf16 is loaded as the f32 it is exactly, a block's value as its f32 product.
        (F16, F32) => x.to_string(),
        _ if from.is_storage_only() && to == F32 => x.to_string(),
        _ if from.is_storage_only() && to == F16 => format!("fg_round_f16({x})"),
        (F32 | F16, I32) => format!("fg_f2i({x})"),
        (F32 | F16, U32) => format!("fg_f2u({x})"),
        (I32 | U32, F32) => format!("f32({x})"),
        (I32 | U32, F16) => format!("fg_round_f16(f32({x}))"),
        (I32, U32) => format!("bitcast<u32>({x})"),
        (U32, I32) => format!("bitcast<i32>({x})"),
        (_, Bool) => format!("({x} != {})", literal(from, 0.0)),
        (Bool, _) => format!("select({}, {}, {x})", literal(to, 0.0), literal(to, 1.0)),
        _ => unreachable!("every pair is listed"),
    }
}

/// The identity of a reduction in the compute type of `dtype`.
pub fn reduce_identity(kind: ReduceKind, dtype: DType) -> String {
    match (kind, dtype) {
        (ReduceKind::Sum, _) => literal(dtype, 0.0),
        (ReduceKind::Prod, _) => literal(dtype, 1.0),
        (ReduceKind::Max, DType::F32 | DType::F16) => literal(dtype, f64::NEG_INFINITY),
        (ReduceKind::Min, DType::F32 | DType::F16) => literal(dtype, f64::INFINITY),
        (ReduceKind::Max, DType::I32) => literal(dtype, i32::MIN as f64),
        (ReduceKind::Min, DType::I32) => literal(dtype, i32::MAX as f64),
        (ReduceKind::Max, _) => literal(dtype, 0.0),
        (ReduceKind::Min, _) => literal(dtype, u32::MAX as f64),
    }
}

/// `acc ⊕ x` for a reduction kind.
pub fn combine(kind: ReduceKind, acc: &str, x: &str) -> String {
    match kind {
        ReduceKind::Sum => format!("{acc} + {x}"),
        ReduceKind::Prod => format!("{acc} * {x}"),
        ReduceKind::Max => format!("max({acc}, {x})"),
        ReduceKind::Min => format!("min({acc}, {x})"),
    }
}
