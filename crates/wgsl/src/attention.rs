//! Lowering of a [`KernelKind::Attention`] kernel: `softmax(logits)·v` with the online
//! softmax, one invocation per output row (see `fusegraph_passes::attention`).
//!
//! Invocation `r` walks the `s_k` logits of its row once, each computed by the kernel's
//! element functions (`v{logits}(r·s_k + j)`: the scores' dot product, scale and mask),
//! keeping the running max `m`, the running sum `l` of `exp(x − m)` and the row of
//! `Σ exp(x − m)·v` in a private array; when the max grows, `l` and the array are rescaled
//! by `exp(m_old − m_new)`. The row is stored divided by `l`. While the max is still −∞ (a
//! fully masked prefix) nothing accumulates, and an all-masked row gives `0/0` as the
//! reference's softmax does.
//!
//! Where the logits are computed at the same index from a matmul of their shape (the scores
//! `q·kᵀ`, [`row_scores`]), every logit of the row reads the same row of its left operand:
//! the invocation loads that row once into `fg_q` and the scores' element function reads it
//! from there (same products in the same order as the plain element function).

use crate::body::{batch_coords, write_matmul_body};
use crate::lower::{packed_f16, store_value, Binding, MAIN_ARGS};
use crate::writer::{literal, ravel, unravel};
use fusegraph_ir::{DType, Graph, NodeId, Op};
use fusegraph_passes::kernel::region_of;
use fusegraph_passes::Kernel;
use std::collections::BTreeSet;
use std::fmt::Write;

/// Invocations per workgroup of an attention kernel.
const WORKGROUP: u64 = 64;

/// The members whose element functions the kernel calls: those computing the logits and the
/// right operand `v` (not the softmax's reductions, the probabilities or the product).
pub fn needed_members(g: &Graph, kernel: &Kernel, logits: NodeId) -> BTreeSet<NodeId> {
    let out = kernel.outputs[0];
    let members: BTreeSet<NodeId> = kernel.members.iter().copied().collect();
    let mut needed = BTreeSet::new();
    let mut stack = vec![logits, g.operands(out)[1]];
    while let Some(n) = stack.pop() {
        if members.contains(&n) && needed.insert(n) {
            stack.extend(g.operands(n));
        }
    }
    needed
}

/// The scores matmul whose rows are the logits' rows: a matmul member of the logits' shape
/// in their same-index region, every use of it inside the kernel in that region, in f32 or
/// f16, with a left operand row of at most [`fusegraph_passes::attention::MAX_HEAD_DIM`] values.
pub fn row_scores(g: &Graph, kernel: &Kernel, logits: NodeId) -> Option<NodeId> {
    let region = region_of(g, kernel, logits);
    let s = *region.iter().find(|&&n| matches!(g.node(n).op, Op::MatMul) && g.ty(n).shape == g.ty(logits).shape)?;
    let inside = |u: &NodeId| kernel.members.contains(u);
    let k = *g.ty(g.operands(s)[0]).shape.dims().last()?;
    let row_only = g.users(s).iter().filter(|u| inside(u)).all(|u| region.contains(u));
    let float = matches!(g.ty(s).dtype, DType::F32 | DType::F16);
    (row_only && float && k <= fusegraph_passes::attention::MAX_HEAD_DIM).then_some(s)
}

/// The element function of the scores `s` ([`row_scores`]) reading its left operand's row
/// from `fg_q`.
pub fn write_row_scores(g: &Graph, s: NodeId, out: &mut String) {
    write_matmul_body(g, s, Some("fg_q"), out);
}

/// The kernel's `main` and its workgroup count.
pub fn attention_main(
    g: &Graph,
    kernel: &Kernel,
    bindings: &[Binding],
    logits: NodeId,
    opts: &crate::LowerOptions,
) -> (String, u64) {
    let out = kernel.outputs[0];
    let v = g.operands(out)[1];
    let od = g.ty(out).shape.dims();
    let vd = g.ty(v).shape.dims();
    let rank = od.len();
    let head = od[rank - 1];
    let keys = g.ty(logits).shape.dims()[rank - 1];
    let rows: usize = od[..rank - 1].iter().product();
    let k = bindings.iter().position(|b| b.output && b.node == out).expect("the output is bound");
    let dtype = g.ty(out).dtype;
    let neg_inf = literal(DType::F32, f64::NEG_INFINITY);

    let scores = row_scores(g, kernel, logits);
    let mut main = String::new();
    if let Some(s) = scores {
        let k = g.ty(g.operands(s)[0]).shape.dims().last().copied().unwrap_or(0);
        let _ = writeln!(main, "var<private> fg_q: array<f32, {k}>;\n");
    }
    let _ = writeln!(main, "@compute @workgroup_size({WORKGROUP})");
    let _ = writeln!(main, "fn main({MAIN_ARGS}) {{");
    let _ = writeln!(main, "    let r = (wid.y * nwg.x + wid.x) * {WORKGROUP}u + lid;");
    let _ = writeln!(main, "    if (r >= {rows}u) {{\n        return;\n    }}");
    // The row's coordinates in the output's leading axes give `v`'s batch coordinates (an
    // axis of size 1 in `v` broadcasts).
    let c = unravel(&mut main, &od[..rank - 1], "r", "c");
    let mut vc = batch_coords(&c, rank, vd);
    vc.extend(["j".into(), "d".into()]);
    if let Some(s) = scores {
        // The row of the scores' left operand this invocation's logits all read.
        let lhs = g.operands(s)[0];
        let ld = g.ty(lhs).shape.dims();
        let mut lc = batch_coords(&c, rank, ld);
        lc.extend([c[rank - 2].clone(), "kk".into()]);
        let _ = writeln!(main, "    for (var kk = 0u; kk < {}u; kk = kk + 1u) {{", ld[ld.len() - 1]);
        let _ = writeln!(main, "        fg_q[kk] = v{}({});", lhs.index(), ravel(&lc, ld));
        let _ = writeln!(main, "    }}");
    }
    let _ = writeln!(main, "    var m: f32 = {neg_inf};");
    let _ = writeln!(main, "    var l = 0.0f;");
    let _ = writeln!(main, "    var acc: array<f32, {head}>;");
    let _ = writeln!(main, "    for (var j = 0u; j < {keys}u; j = j + 1u) {{");
    let _ = writeln!(main, "        let x = f32(v{}(r * {keys}u + j));", logits.index());
    let _ = writeln!(main, "        let n = max(m, x);");
    let _ = writeln!(main, "        if (n == {neg_inf}) {{\n            continue;\n        }}");
    let _ = writeln!(main, "        let scale = exp(m - n);");
    let _ = writeln!(main, "        let p = exp(x - n);");
    let _ = writeln!(main, "        l = l * scale + p;");
    let _ = writeln!(main, "        for (var d = 0u; d < {head}u; d = d + 1u) {{");
    let _ = writeln!(main, "            acc[d] = acc[d] * scale + p * f32(v{}({}));", v.index(), ravel(&vc, vd));
    let _ = writeln!(main, "        }}");
    let _ = writeln!(main, "        m = n;");
    let _ = writeln!(main, "    }}");
    if packed_f16(dtype, opts) {
        // The row starts on a word (the head dimension is even): two halves per store.
        let _ = writeln!(main, "    for (var d = 0u; d < {head}u; d = d + 2u) {{");
        let _ = writeln!(
            main,
            "        b{k}[(r * {head}u + d) >> 1u] = pack2x16float(vec2<f32>(acc[d] / l, acc[d + 1u] / l));"
        );
    } else {
        let _ = writeln!(main, "    for (var d = 0u; d < {head}u; d = d + 1u) {{");
        let _ = writeln!(main, "        b{k}[r * {head}u + d] = {};", store_value(dtype, "acc[d] / l"));
    }
    let _ = writeln!(main, "    }}\n}}");
    (main, (rows as u64).div_ceil(WORKGROUP))
}
