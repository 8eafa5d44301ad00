//! Lowering of a [`KernelKind::Attention`] kernel: `softmax(logits)·v` with the online
//! softmax, one invocation per output row (see `fusegraph_passes::attention`), in two forms.
//!
//! Where the logits are computed at the same index from a matmul of their shape (the scores
//! `q·kᵀ`, [`row_scores`]), every logit of a row reads the same row of the scores' left
//! operand: the invocation loads that row once into `fg_q` and the scores' element function
//! reads it from there (same products in the same order as the plain element function).
//!
//! - **Tiled** ([`crate::LowerOptions::tiled_attention`], the GPU form; needs
//!   [`row_scores`]): a workgroup takes 64 query rows of one batch and head and walks the
//!   keys in blocks of [`key_block`]: it stages the block's keys and values in workgroup
//!   memory (`fg_kt`, `fg_vt`, each value loaded once per workgroup instead of once per
//!   row), then each invocation computes the block's logits from `fg_q` and `fg_kt`, and
//!   updates its running max `m`, its running sum `l` of `exp(x − m)` and its row of
//!   `Σ exp(x − m)·v` (a private array) once per block, rescaling by `exp(m_old − m_new)`.
//! - **One key at a time** (without `tiled_attention`, and logits of any other form): invocation `r`
//!   walks the `s_k` logits of its row, each computed by the kernel's element functions
//!   (`v{logits}(r·s_k + j)`: the scores' dot product, scale and mask), rescaling per key.
//!   On lavapipe a barrier inside a loop costs more than the staging saves (BENCHMARKS.md).
//!
//! Both store the row divided by `l`. While the max is still −∞ (a fully masked prefix)
//! nothing accumulates, and an all-masked row gives `0/0` as the reference's softmax does.
//!
//! **Banded masks** ([`key_band`]: a causal mask, say): the keys past a row's band hold the
//! masked constant `c`, and each adds `exp(c − m)` to the row's sum and that times its value
//! to the row. Where that is exactly zero (`m > c` and `exp(c − m) == 0`: always for −∞,
//! and for −10⁹ against logits of any sane size) the keys past the band change nothing,
//! and the row stops walking its keys there: the one-key form at its own band's end, the
//! tiled form at the first block past the band of every row of the workgroup, once every
//! row agrees (a vote in workgroup memory). Otherwise the row walks every key as without a
//! band. Skipped keys' values are not read, so a non-finite value there does not reach a
//! row that masks it (the three kernels would give `0 · ∞ = NaN`).

use crate::body::{batch_coords, write_matmul_body};
use crate::options::{Binding, MAIN_ARGS};
use crate::storage::{packed_halves, store_value};
use crate::writer::{literal, ravel, unravel};
use fusegraph_ir::{DType, Graph, NodeId, Op};
use fusegraph_passes::band::{key_band, KeyBand};
use fusegraph_passes::kernel::region_of;
use fusegraph_passes::{Kernel, KernelKind};
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

/// Values in a row of the scores' left operand (the query row `fg_q` holds).
fn query_len(g: &Graph, s: NodeId) -> usize {
    g.ty(g.operands(s)[0]).shape.dims().last().copied().unwrap_or(1)
}

/// Bytes of workgroup memory the key and value tiles of a tiled attention kernel take at
/// most: WebGPU's default `max_compute_workgroup_storage_size`, which every adapter has.
const TILE_BYTES: usize = 16384;

/// At most this many keys per block (each invocation keeps a block's logits, `fg_x`).
const MAX_BLOCK: usize = 32;

/// Bytes of workgroup memory the vote on skipping the keys past a band takes (`fg_more`,
/// `fg_tail`).
const VOTE_BYTES: usize = 8;

/// The band of attention `kernel`'s logits, if they have one.
fn band(g: &Graph, kernel: &Kernel) -> Option<KeyBand> {
    match kernel.kind {
        KernelKind::Attention { logits } => key_band(g, logits),
        _ => None,
    }
}

/// Keys per block of the tiled kernel of attention `kernel` whose scores are `s`: as many as
/// fit [`TILE_BYTES`] (less the vote's bytes where the logits have a band) with a key
/// (`head_k` f32s) and a value row (`head` f32s) each, at most [`MAX_BLOCK`] and at most the
/// keys there are.
pub fn key_block(g: &Graph, kernel: &Kernel, s: NodeId) -> usize {
    let head_k = query_len(g, s);
    let head = g.ty(kernel.outputs[0]).shape.dims().last().copied().unwrap_or(1);
    let keys = g.ty(s).shape.dims().last().copied().unwrap_or(1);
    let bytes = TILE_BYTES - if band(g, kernel).is_some() { VOTE_BYTES } else { 0 };
    (bytes / 4 / (head_k + head).max(1)).clamp(1, MAX_BLOCK).min(keys.max(1))
}

/// `u32(clamp(i32(q) + offset + 1, 0, keys))`: the end of query `q`'s keys under `b`
/// (the offset clamped where that changes nothing, so that it fits an `i32`).
fn band_end(b: KeyBand, q: &str, seq_q: usize, keys: usize) -> String {
    let add = (b.offset.saturating_add(1)).clamp(-(seq_q as i64), keys as i64);
    format!("u32(clamp(i32({q}) + ({add}i), 0i, {keys}i))")
}

/// Whether keys holding the masked logit `c` would add exactly nothing to a row whose
/// running max is `m`.
fn adds_nothing(b: KeyBand) -> String {
    let c = literal(DType::F32, b.masked);
    format!("m > {c} && exp({c} - m) == 0.0f")
}

/// The element function of the scores `s` ([`row_scores`]): the query row from `fg_q`;
/// the key from the workgroup's tile `fg_kt` of [`key_block`] keys where `tiled`, else
/// through the key operand's element function.
pub fn write_row_scores(g: &Graph, kernel: &Kernel, s: NodeId, tiled: bool, out: &mut String) {
    let tile = tiled.then(|| ("fg_kt", key_block(g, kernel, s)));
    write_matmul_body(g, s, Some("fg_q"), tile, out);
}

/// Loads the invocation's row of the scores' left operand into `fg_q` (`c`: the output
/// row's coordinates).
fn write_query_row(main: &mut String, g: &Graph, s: NodeId, c: &[String], rank: usize) {
    let lhs = g.operands(s)[0];
    let ld = g.ty(lhs).shape.dims();
    let mut lc = batch_coords(c, rank, ld);
    lc.extend([c[rank - 2].clone(), "kk".into()]);
    let _ = writeln!(main, "    for (var kk = 0u; kk < {}u; kk = kk + 1u) {{", query_len(g, s));
    let _ = writeln!(main, "        fg_q[kk] = v{}({});", lhs.index(), ravel(&lc, ld));
    let _ = writeln!(main, "    }}");
}

/// The kernel's `main` and its workgroup count; `scores` is [`row_scores`]'s answer.
pub fn attention_main(
    g: &Graph,
    kernel: &Kernel,
    bindings: &[Binding],
    logits: NodeId,
    scores: Option<NodeId>,
    opts: &crate::LowerOptions,
) -> (String, u64) {
    match scores {
        Some(s) if opts.tiled_attention => tiled_main(g, kernel, bindings, logits, s, opts),
        s => row_main(g, kernel, bindings, logits, s, opts),
    }
}

/// The shapes both forms work with.
struct Parts<'g> {
    /// The kernel's output, `p·v`, and `v`.
    out: NodeId,
    v: NodeId,
    /// Their dims; the output's rank.
    od: &'g [usize],
    vd: &'g [usize],
    rank: usize,
    /// Values per output row (the head dimension), logits per row (keys), output rows.
    head: usize,
    keys: usize,
    rows: usize,
    /// The output's binding.
    k: usize,
}

impl<'g> Parts<'g> {
    fn of(g: &'g Graph, kernel: &Kernel, bindings: &[Binding], logits: NodeId) -> Self {
        let out = kernel.outputs[0];
        let v = g.operands(out)[1];
        let (od, vd) = (g.ty(out).shape.dims(), g.ty(v).shape.dims());
        let rank = od.len();
        Parts {
            out,
            v,
            od,
            vd,
            rank,
            head: od[rank - 1],
            keys: g.ty(logits).shape.dims()[rank - 1],
            rows: od[..rank - 1].iter().product(),
            k: bindings.iter().position(|b| b.output && b.node == out).expect("the output is bound"),
        }
    }
}

/// The store of the finished row `acc / l` (`r`: the row; `head` values).
fn write_store(
    main: &mut String,
    g: &Graph,
    out: NodeId,
    k: usize,
    head: usize,
    indent: &str,
    opts: &crate::LowerOptions,
) {
    let dtype = g.ty(out).dtype;
    if packed_halves(dtype, opts) {
        // The row starts on a word (the head dimension is even): two halves per store.
        let _ = writeln!(main, "{indent}for (var d = 0u; d < {head}u; d = d + 2u) {{");
        let _ = writeln!(
            main,
            "{indent}    b{k}[(r * {head}u + d) >> 1u] = pack2x16float(vec2<f32>(acc[d] / l, acc[d + 1u] / l));"
        );
    } else {
        let _ = writeln!(main, "{indent}for (var d = 0u; d < {head}u; d = d + 1u) {{");
        let _ = writeln!(main, "{indent}    b{k}[r * {head}u + d] = {};", store_value(dtype, "acc[d] / l"));
    }
    let _ = writeln!(main, "{indent}}}");
}

/// The tiled form (see the module doc), the logits from the scores matmul `s`: a workgroup
/// of [`WORKGROUP`] query rows of one batch and head, one per invocation; the workgroup
/// stages each block of keys (`s`'s right operand) and values, every invocation updates its
/// row once per block.
fn tiled_main(
    g: &Graph,
    kernel: &Kernel,
    bindings: &[Binding],
    logits: NodeId,
    s: NodeId,
    opts: &crate::LowerOptions,
) -> (String, u64) {
    let Parts { out, v, od, vd, rank, head, keys, rows, k } = Parts::of(g, kernel, bindings, logits);
    let seq_q = od[rank - 2];
    let heads = rows / seq_q.max(1);
    let q_blocks = seq_q.div_ceil(WORKGROUP as usize);
    let neg_inf = literal(DType::F32, f64::NEG_INFINITY);
    let rhs = g.operands(s)[1];
    let rd = g.ty(rhs).shape.dims();
    let head_k = query_len(g, s);
    let block = key_block(g, kernel, s);
    let band = band(g, kernel);

    let mut main = String::new();
    let _ = writeln!(main, "var<private> fg_q: array<f32, {head_k}>;");
    let _ = writeln!(main, "var<private> fg_x: array<f32, {block}>;");
    let _ = writeln!(main, "var<workgroup> fg_kt: array<f32, {}>;", block * head_k);
    let _ = writeln!(main, "var<workgroup> fg_vt: array<f32, {}>;", block * head);
    if band.is_some() {
        let _ = writeln!(main, "var<workgroup> fg_more: atomic<u32>;");
        let _ = writeln!(main, "var<workgroup> fg_tail: u32;");
    }
    let _ = writeln!(main);
    let _ = writeln!(main, "@compute @workgroup_size({WORKGROUP})");
    let _ = writeln!(main, "fn main({MAIN_ARGS}) {{");
    let _ = writeln!(main, "    let wg = wid.y * nwg.x + wid.x;");
    // A grid of more workgroups than one dimension holds is padded: whole workgroups leave.
    let _ = writeln!(main, "    if (wg >= {}u) {{\n        return;\n    }}", heads * q_blocks);
    // Rows past the head's last take part in staging the tiles (every invocation reaches
    // every barrier) and compute a copy of the last row, but store nothing.
    let _ = writeln!(main, "    let qi = (wg % {q_blocks}u) * {WORKGROUP}u + lid;");
    let _ = writeln!(main, "    let r = (wg / {q_blocks}u) * {seq_q}u + min(qi, {}u);", seq_q.saturating_sub(1));
    let c = unravel(&mut main, &od[..rank - 1], "r", "c");
    write_query_row(&mut main, g, s, &c, rank);
    let _ = writeln!(main, "    var m: f32 = {neg_inf};");
    let _ = writeln!(main, "    var l = 0.0f;");
    let _ = writeln!(main, "    var acc: array<f32, {head}>;");
    if let Some(b) = band {
        // Past `fg_end` every row of the workgroup is masked; `fg_skip` starts the first
        // block there.
        let last = format!("min((wg % {q_blocks}u) * {WORKGROUP}u + {}u, {}u)", WORKGROUP - 1, seq_q.saturating_sub(1));
        let _ = writeln!(main, "    let fg_end = {};", band_end(b, &last, seq_q, keys));
        let _ = writeln!(main, "    let fg_skip = (fg_end + {}u) / {block}u * {block}u;", block - 1);
    }
    let _ = writeln!(main, "    for (var j0 = 0u; j0 < {keys}u; j0 = j0 + {block}u) {{");
    if let Some(b) = band {
        // The workgroup stops there unless a row would still gain from the masked keys.
        let _ = writeln!(main, "        if (j0 == fg_skip) {{");
        let _ = writeln!(
            main,
            "            if (!({})) {{\n                atomicOr(&fg_more, 1u);\n            }}",
            adds_nothing(b)
        );
        let _ = writeln!(main, "            workgroupBarrier();");
        let _ = writeln!(
            main,
            "            if (lid == 0u) {{\n                fg_tail = atomicLoad(&fg_more);\n            }}"
        );
        let _ = writeln!(
            main,
            "            if (workgroupUniformLoad(&fg_tail) == 0u) {{\n                break;\n            }}"
        );
        let _ = writeln!(main, "        }}");
    }
    // Stage the block's keys (key `jj` at `jj·head_k`) and values (at `jj·head`); keys past
    // the last are copies of it, their logits set to −∞ below.
    let mut rc = batch_coords(&c, rank, rd);
    rc.extend([format!("t % {head_k}u"), "j".into()]);
    let mut vc = batch_coords(&c, rank, vd);
    vc.extend(["j".into(), format!("t % {head}u")]);
    for (tile, width, node, coords, dims) in [("fg_kt", head_k, rhs, &rc, rd), ("fg_vt", head, v, &vc, vd)] {
        let _ = writeln!(main, "        for (var t = lid; t < {}u; t = t + {WORKGROUP}u) {{", block * width);
        let _ = writeln!(main, "            let j = min(j0 + t / {width}u, {}u);", keys.saturating_sub(1));
        let _ = writeln!(main, "            {tile}[t] = f32(v{}({}));", node.index(), ravel(coords, dims));
        let _ = writeln!(main, "        }}");
    }
    let _ = writeln!(main, "        workgroupBarrier();");
    // The block's logits, keys past the last at −∞.
    let _ = writeln!(main, "        var bm: f32 = {neg_inf};");
    let _ = writeln!(main, "        for (var jj = 0u; jj < {block}u; jj = jj + 1u) {{");
    let _ = writeln!(main, "            let j = j0 + jj;");
    let _ = writeln!(
        main,
        "            let x = select({neg_inf}, f32(v{}(r * {keys}u + min(j, {}u))), j < {keys}u);",
        logits.index(),
        keys.saturating_sub(1)
    );
    let _ = writeln!(main, "            fg_x[jj] = x;");
    let _ = writeln!(main, "            bm = max(bm, x);");
    let _ = writeln!(main, "        }}");
    let _ = writeln!(main, "        let n = max(m, bm);");
    // While every logit so far is −∞ (a masked prefix) nothing accumulates.
    let _ = writeln!(main, "        if (n != {neg_inf}) {{");
    let _ = writeln!(main, "            let scale = exp(m - n);");
    let _ = writeln!(main, "            var ps = 0.0f;");
    let _ = writeln!(main, "            for (var jj = 0u; jj < {block}u; jj = jj + 1u) {{");
    let _ = writeln!(main, "                let p = exp(fg_x[jj] - n);");
    let _ = writeln!(main, "                fg_x[jj] = p;");
    let _ = writeln!(main, "                ps = ps + p;");
    let _ = writeln!(main, "            }}");
    let _ = writeln!(main, "            l = l * scale + ps;");
    let _ = writeln!(main, "            for (var d = 0u; d < {head}u; d = d + 1u) {{");
    let _ = writeln!(main, "                var a = acc[d] * scale;");
    let _ = writeln!(main, "                for (var jj = 0u; jj < {block}u; jj = jj + 1u) {{");
    let _ = writeln!(main, "                    a = a + fg_x[jj] * fg_vt[jj * {head}u + d];");
    let _ = writeln!(main, "                }}");
    let _ = writeln!(main, "                acc[d] = a;");
    let _ = writeln!(main, "            }}");
    let _ = writeln!(main, "            m = n;");
    let _ = writeln!(main, "        }}");
    let _ = writeln!(main, "        workgroupBarrier();");
    let _ = writeln!(main, "    }}");
    let _ = writeln!(main, "    if (qi < {seq_q}u) {{");
    write_store(&mut main, g, out, k, head, "        ", opts);
    let _ = writeln!(main, "    }}\n}}");
    (main, (heads * q_blocks) as u64)
}

/// One invocation per output row walks its row's logits one at a time, each computed by
/// the kernel's element functions; with the scores `scores` ([`row_scores`]), from the
/// query row loaded once into `fg_q`.
fn row_main(
    g: &Graph,
    kernel: &Kernel,
    bindings: &[Binding],
    logits: NodeId,
    scores: Option<NodeId>,
    opts: &crate::LowerOptions,
) -> (String, u64) {
    let Parts { out, v, od, vd, rank, head, keys, rows, k } = Parts::of(g, kernel, bindings, logits);
    let neg_inf = literal(DType::F32, f64::NEG_INFINITY);

    let mut main = String::new();
    if let Some(s) = scores {
        let _ = writeln!(main, "var<private> fg_q: array<f32, {}>;\n", query_len(g, s));
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
        write_query_row(&mut main, g, s, &c, rank);
    }
    let _ = writeln!(main, "    var m: f32 = {neg_inf};");
    let _ = writeln!(main, "    var l = 0.0f;");
    let _ = writeln!(main, "    var acc: array<f32, {head}>;");
    let band = band(g, kernel);
    if let Some(b) = band {
        let _ = writeln!(main, "    let fg_end = {};", band_end(b, &c[rank - 2], od[rank - 2], keys));
    }
    let _ = writeln!(main, "    for (var j = 0u; j < {keys}u; j = j + 1u) {{");
    if let Some(b) = band {
        // Past the band's end, stop where the masked keys would add nothing.
        let _ = writeln!(main, "        if (j == fg_end && {}) {{\n            break;\n        }}", adds_nothing(b));
    }
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
    write_store(&mut main, g, out, k, head, "    ", opts);
    let _ = writeln!(main, "}}");
    (main, (rows as u64).div_ceil(WORKGROUP))
}
