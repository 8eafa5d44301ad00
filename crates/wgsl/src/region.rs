//! A kernel region's element-wise computation as WGSL statements: the element functions
//! shared by every kernel form (loop, row, tiled matmul, attention), and the helpers of
//! shaders/helpers.wgsl that a kernel calls.

use crate::body::*;
use crate::options::*;
use crate::storage::*;
use crate::view::{strided_view, StridedView};
use crate::writer::vty;
use fusegraph_ir::{Graph, NodeId, Op};
use fusegraph_passes::kernel::same_index_operands;
use fusegraph_passes::{Kernel, KernelKind};
use std::collections::BTreeSet;
use std::fmt::Write;

pub(crate) const HELPERS: &str = include_str!("../../../shaders/helpers.wgsl");

/// The helpers of shaders/helpers.wgsl (each after a `// fn NAME` line) that `texts` call,
/// and those the included helpers call in turn, in the file's order.
pub(crate) fn helpers_called(texts: &[&str]) -> String {
    let helpers: Vec<(&str, String)> = HELPERS
        .split("// fn ")
        .skip(1)
        .filter_map(|h| {
            let name = h.lines().next()?.trim();
            let text: String = h.lines().skip(1).collect::<Vec<_>>().join("\n");
            (!name.is_empty()).then(|| (name, text.trim().to_string()))
        })
        .collect();
    let mut called = vec![false; helpers.len()];
    loop {
        let mut more = false;
        for (i, (name, _)) in helpers.iter().enumerate() {
            let call = format!("{name}(");
            let by_helper = helpers.iter().zip(&called).any(|((_, text), &c)| c && text.contains(&call));
            if !called[i] && (by_helper || texts.iter().any(|t| t.contains(&call))) {
                called[i] = true;
                more = true;
            }
        }
        if !more {
            break;
        }
    }
    let mut out = String::new();
    for ((_, text), _) in helpers.iter().zip(&called).filter(|(_, &c)| c) {
        let _ = writeln!(out, "{text}\n");
    }
    out
}

/// Writes `fn eO(i) -> T`, output `o`'s region computed once per element. With
/// `acc = Some(m)` it writes `fn eO_acc(i, acc) -> T` instead, the same region with member
/// `m`'s value given as `acc` (the tiled matmul's accumulator).
///
/// `given` (with `acc` only) are values the region reads by element function that the caller
/// passes in instead, as parameters `hN` after `acc` (see `matmul::Invariants`).
pub(crate) fn write_region(
    g: &Graph,
    o: NodeId,
    region: &[NodeId],
    acc: Option<NodeId>,
    given: &[NodeId],
    body: &mut String,
) {
    let t = vty(g.ty(o).dtype);
    match acc {
        Some(m) => {
            let params: String = given.iter().map(|n| format!(", h{}: {}", n.index(), vty(g.ty(*n).dtype))).collect();
            let _ = writeln!(body, "fn e{}_acc(i: u32, acc: {}{params}) -> {t} {{", o.index(), vty(g.ty(m).dtype));
        }
        None => {
            let _ = writeln!(body, "fn e{}(i: u32) -> {t} {{", o.index());
        }
    }
    for stmt in region_stmts(g, region, acc) {
        let text = match stmt {
            RegionStmt::Read(p) if given.contains(&p) => format!("let y{0} = h{0};", p.index()),
            RegionStmt::Def(n, _) if given.contains(&n) => format!("let x{0} = h{0};", n.index()),
            _ => stmt.text(""),
        };
        let _ = writeln!(body, "    {text}");
    }
    let _ = writeln!(body, "    return x{};\n}}\n", o.index());
}

/// One statement of a region's computation of element `i` (see [`region_stmts`]).
pub(crate) enum RegionStmt {
    /// `let yP = vP(i);`: element `i` of a value from outside the region.
    Read(NodeId),
    /// `let xN = EXPR;`: region member `N`; `EXPR` names `xP`, `yP` and `i`.
    Def(NodeId, String),
}

impl RegionStmt {
    /// Whether the statement takes its value from an element function (`vN(i)`): a read
    /// from outside the region, or a member that is not elementwise (a broadcast, a view).
    pub(crate) fn is_call(&self) -> bool {
        match self {
            RegionStmt::Read(_) => true,
            RegionStmt::Def(n, expr) => *expr == format!("v{}(i)", n.index()),
        }
    }

    /// The node whose element the statement names (`yP` or `xN`).
    fn node(&self) -> NodeId {
        match self {
            RegionStmt::Read(p) => *p,
            RegionStmt::Def(n, _) => *n,
        }
    }

    /// The statement with every name it defines or uses (`xN`, `yP`, `i`) suffixed by `sfx`,
    /// so that several elements can be computed side by side.
    fn text(&self, sfx: &str) -> String {
        match self {
            RegionStmt::Read(p) => format!("let y{0}{sfx} = v{0}(i{sfx});", p.index()),
            RegionStmt::Def(n, expr) => {
                let expr = if sfx.is_empty() { expr.clone() } else { suffix_names(expr, sfx) };
                format!("let x{}{sfx} = {expr};", n.index())
            }
        }
    }
}

/// `expr` with `sfx` appended to each name `xN`, `yN` and `i` in it (the names a region
/// statement uses; everything else in it is a literal, an operator or a function call).
pub(crate) fn suffix_names(expr: &str, sfx: &str) -> String {
    let mut out = String::with_capacity(expr.len() + 16);
    let b = expr.as_bytes();
    let mut k = 0;
    while k < b.len() {
        let c = b[k];
        if c.is_ascii_alphanumeric() || c == b'_' {
            let start = k;
            while k < b.len() && (b[k].is_ascii_alphanumeric() || b[k] == b'_') {
                k += 1;
            }
            let word = &expr[start..k];
            out.push_str(word);
            // Digits belong to the word, so a literal (`1e-4f`, `0x80000000u`) is one word
            // and never a name.
            let named = word == "i"
                || (word.len() > 1
                    && (word.starts_with('x') || word.starts_with('y'))
                    && word[1..].bytes().all(|d| d.is_ascii_digit()));
            if named {
                out.push_str(sfx);
            }
        } else {
            out.push(c as char);
            k += 1;
        }
    }
    out
}

/// The statements computing element `i` of a region, in order. Element `i` of a value
/// outside the region (a loaded input, a broadcast, a reduction) is read once, just before
/// its first use, and named `y{p}`, however many members use it: each call is a load, and a
/// driver may not merge loads from a read-write buffer (lavapipe: 11 loads of the 20-op
/// chain's two inputs per element become 2). With `acc = Some(m)`, member `m` is `acc`.
/// The values a region reads through element functions (`vP(i)`): those it reads from
/// outside, and its members that are not elementwise (broadcasts, views, reductions).
pub(crate) fn region_calls(g: &Graph, region: &[NodeId], acc: Option<NodeId>) -> Vec<NodeId> {
    region_stmts(g, region, acc).into_iter().filter(RegionStmt::is_call).map(|s| s.node()).collect()
}

pub(crate) fn region_stmts(g: &Graph, region: &[NodeId], acc: Option<NodeId>) -> Vec<RegionStmt> {
    let mut stmts = Vec::new();
    let mut read: Vec<NodeId> = Vec::new();
    for &n in region {
        let node = g.node(n);
        let same = same_index_operands(g, n);
        let expr = if Some(n) == acc {
            crate::body::rounded(g, n, "acc".to_string())
        } else if node.op.is_elementwise() || matches!(node.op, Op::Reshape { .. }) {
            let args: Vec<String> = g
                .operands(n)
                .iter()
                .map(|&p| {
                    if same.contains(&p) && region.contains(&p) {
                        format!("x{}", p.index())
                    } else {
                        if !read.contains(&p) {
                            read.push(p);
                            stmts.push(RegionStmt::Read(p));
                        }
                        format!("y{}", p.index())
                    }
                })
                .collect();
            if node.op.is_elementwise() {
                elementwise_expr(g, n, &args)
            } else {
                args[0].clone()
            }
        } else {
            format!("v{}(i)", n.index())
        };
        stmts.push(RegionStmt::Def(n, expr));
    }
    stmts
}

/// The view of a value loaded at an element index by a region statement (a read from
/// outside the region, or a layout member such as a broadcast), where the four adjacent
/// elements `i … i+3` (`i` a multiple of 4) of `node` are the four adjacent elements of its
/// binding from a multiple of 4: the last axis contiguous and of a length divisible by 4,
/// every other stride and the offset multiples of 4, the binding's length too.
pub(crate) fn quad_view(g: &Graph, kernel: &Kernel, opts: &LowerOptions, stmt: &RegionStmt) -> Option<StridedView> {
    if !stmt.is_call() {
        return None;
    }
    let node = stmt.node();
    let last = *g.ty(node).shape.dims().last()?;
    let view = strided_view(g, kernel, node)?;
    let (&inner, outer) = view.strides.split_last()?;
    let leaf = g.ty(view.leaf);
    let aligned = inner == 1
        && last.is_multiple_of(4)
        && view.offset.is_multiple_of(4)
        && outer.iter().all(|s| s.is_multiple_of(4));
    (aligned && leaf.shape.numel().is_multiple_of(4) && quad_storage(leaf.dtype, opts)).then_some(view)
}

/// The binding index (a WGSL expression) of element `i` of a value of shape `dims` seen
/// through `view`.
pub(crate) fn view_index(view: &StridedView, dims: &[usize], i: &str) -> String {
    if view.is_identity(dims) {
        return i.to_string();
    }
    let mut terms = Vec::new();
    if view.offset > 0 {
        terms.push(format!("{}u", view.offset));
    }
    let mut inner = 1usize;
    for (d, &len) in dims.iter().enumerate().rev() {
        let s = view.strides[d];
        if s > 0 {
            let c = match (inner, d == 0) {
                (1, true) => i.to_string(),
                (1, false) => format!("({i} % {len}u)"),
                (_, true) => format!("({i} / {inner}u)"),
                _ => format!("(({i} / {inner}u) % {len}u)"),
            };
            terms.push(if s == 1 { c } else { format!("{c} * {s}u") });
        }
        inner *= len;
    }
    if terms.is_empty() {
        "0u".to_string()
    } else {
        terms.join(" + ")
    }
}

/// The input bindings whose `vec4`s a quad walk over `stmts` reads (see [`quad_view`]).
pub(crate) fn quad_leaves(g: &Graph, kernel: &Kernel, opts: &LowerOptions, stmts: &[RegionStmt]) -> Vec<NodeId> {
    let mut leaves = Vec::new();
    for stmt in stmts {
        if let Some(v) = quad_view(g, kernel, opts, stmt) {
            if !leaves.contains(&v.leaf) {
                leaves.push(v.leaf);
            }
        }
    }
    leaves
}

/// The statements of several regions computed at one element index, each read and each
/// member once: the reads first, then the members in region order.
pub(crate) fn merged_stmts<'s>(regions: impl Iterator<Item = &'s [RegionStmt]>) -> Vec<&'s RegionStmt> {
    let mut reads: Vec<&RegionStmt> = Vec::new();
    let mut defs: Vec<&RegionStmt> = Vec::new();
    for stmt in regions.flatten() {
        let list = if matches!(stmt, RegionStmt::Read(_)) { &mut reads } else { &mut defs };
        if !list.iter().any(|s| s.node() == stmt.node()) {
            list.push(stmt);
        }
    }
    reads.extend(defs);
    reads
}

/// Opens a loop over a row four adjacent elements at a time, `i_0 … i_3` their indices.
pub(crate) fn quad_row_step(main: &mut String, row_len: usize, indent: &str) {
    let _ = writeln!(main, "{indent}for (var e = 0u; e < {row_len}u; e = e + 4u) {{");
    let _ = writeln!(main, "{indent}    let i_0 = fg_elem(row, e);");
    for u in 1..4 {
        let _ = writeln!(main, "{indent}    let i_{u} = i_0 + {u}u;");
    }
}

/// What a walk over four adjacent elements needs to read `vec4`s: the kernel (for the views
/// of its values, see [`quad_view`]), its bindings and those declared `vec4`.
#[derive(Clone, Copy)]
pub(crate) struct Quads<'a> {
    pub(crate) kernel: &'a Kernel,
    pub(crate) bindings: &'a [Binding],
    pub(crate) vec4: &'a [NodeId],
    pub(crate) opts: &'a LowerOptions,
}

/// Emits region statements for `ilp` elements side by side (named `_0`, `_1`, …, each
/// followed by `sub`, the sub-step's suffix or empty; the caller defines `i_0{sub}`, …). With `quads` the elements are four adjacent ones from a
/// multiple of 4, and a load whose view is a `vec4` of a binding in `quads.vec4` (a read at
/// the element's own index, or a broadcast of a row vector along the rows) loads that `vec4`
/// once (`vqN`) and takes its components.
pub(crate) fn emit_elements(
    main: &mut String,
    g: &Graph,
    stmts: &[&RegionStmt],
    ilp: usize,
    quads: Option<Quads>,
    indent: &str,
    sub: &str,
) {
    for stmt in stmts {
        let node = stmt.node();
        let view = quads.and_then(|q| quad_view(g, q.kernel, q.opts, stmt).filter(|v| q.vec4.contains(&v.leaf)));
        if let (Some(q), Some(view)) = (quads, view) {
            let k = q.bindings.iter().position(|b| b.node == view.leaf).expect("a vec4 is read from a binding");
            let at = view_index(&view, g.ty(node).shape.dims(), &format!("i_0{sub}"));
            let at = if at.contains(" + ") { format!("({at})") } else { at };
            let dtype = g.ty(view.leaf).dtype;
            let quad = format!("b{k}[{at} >> 2u]");
            let quad = if f16_words(dtype, q.opts) { format!("fg_f16x4_from_words({quad})") } else { quad };
            let _ = writeln!(main, "{indent}let vq{}{sub} = {quad};", node.index());
            let name = if matches!(stmt, RegionStmt::Read(_)) { "y" } else { "x" };
            for u in 0..ilp {
                let v = format!("vq{}{sub}[{u}u]", node.index());
                let v = if f16_words(dtype, q.opts) { v } else { load_value(dtype, &v) };
                let _ = writeln!(main, "{indent}let {name}{}_{u}{sub} = {v};", node.index());
            }
            continue;
        }
        for u in 0..ilp {
            let _ = writeln!(main, "{indent}{}", stmt.text(&format!("_{u}{sub}")));
        }
    }
}

/// Members of a loop or row kernel that hold one value for the whole dispatch: single
/// elements computed by elementwise ops from single-element inputs, literals and each
/// other (Adam's bias corrections `lr / (1 − β₁ᵗ)`, `√(1 − β₂ᵗ)` from the step counter),
/// in member order. `main` computes each once per invocation ([`with_uniform_scalars`])
/// instead of once per use per element. Literals (full, constant, iota) stay literals.
pub(crate) fn uniform_scalars(g: &Graph, kernel: &Kernel) -> Vec<NodeId> {
    if matches!(kernel.kind, KernelKind::Attention { .. }) {
        return Vec::new();
    }
    let members: BTreeSet<NodeId> = kernel.members.iter().copied().collect();
    let literal = |n: NodeId| matches!(g.node(n).op, Op::Full { .. } | Op::Constant { .. } | Op::Iota { .. });
    let mut out: Vec<NodeId> = Vec::new();
    for &m in &kernel.members {
        let node = g.node(m);
        let elementwise = matches!(node.op, Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. });
        if !elementwise || g.ty(m).shape.numel() != 1 {
            continue;
        }
        let uniform_operand =
            |o: &NodeId| g.ty(*o).shape.numel() == 1 && (!members.contains(o) || literal(*o) || out.contains(o));
        if g.operands(m).iter().all(uniform_operand) {
            out.push(m);
        }
    }
    out
}

/// `main` with the uniform scalars `uniform` computed first thing (in member order, each
/// after those it reads).
pub(crate) fn with_uniform_scalars(main: String, uniform: &[NodeId]) -> String {
    let Some(start) = main.find("fn main(").and_then(|at| main[at..].find('\n').map(|nl| at + nl + 1)) else {
        return main;
    };
    let mut out = main[..start].to_string();
    for (j, m) in uniform.iter().enumerate() {
        let _ = writeln!(out, "    fg_us{j} = fg_u{}(0u);", m.index());
    }
    out.push_str(&main[start..]);
    out
}
