//! Assembles one kernel's shader: bindings, load functions, element functions, `main`.

use crate::body::write_body;
use crate::loops::*;
use crate::options::*;
use crate::region::*;
use crate::rows::*;
use crate::storage::*;
use crate::writer::vty;
use fusegraph_ir::{DType, Graph, NodeId, Op};
use fusegraph_passes::kernel::regions;
use fusegraph_passes::{Kernel, KernelKind};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// Lowers `kernel` of `g` to WGSL with the default [`Strategy`].
pub fn lower(g: &Graph, kernel: &Kernel, opts: &LowerOptions) -> KernelSource {
    lower_with(g, kernel, opts, &Strategy::default())
}

/// Lowers `kernel` of `g` to WGSL with explicit code-generation choices.
///
/// The kernel is lowered as a copy in a graph of its own (see [`localize`]), so the text
/// names its values by their place in the kernel, not by their ids in `g`: kernels that
/// compute the same thing on the same types — a layer's kernels in every layer of a model,
/// the same op at the same shape anywhere — lower to the same text, and the runtime, which
/// caches pipelines by their text, compiles one pipeline for all of them.
pub fn lower_with(g: &Graph, kernel: &Kernel, opts: &LowerOptions, strategy: &Strategy) -> KernelSource {
    lower_planned(g, kernel, &[], opts, strategy)
}

/// Lowers `kernel` of `g` as [`lower_with`] does, but with the f16 elementwise results and
/// reductions among its `unshared` members computed from one another in f32, each rounded to
/// f16 only where it is stored or read by a member computed in f16 (excess precision, as
/// XLA's `xla_allow_excess_precision` allows within a fusion). `unshared` must hold only
/// members that no other kernel computes
/// ([`fusegraph_passes::kernel::unshared_members`]): a value two kernels compute is then
/// computed from rounded values in both, and what a kernel stores is rounded, so no two
/// copies of one value disagree. Rounding an f16 result to f16 costs about a dozen integer
/// operations (lavapipe: a 20-op f16 chain takes 1.9× the time of the same chain rounded
/// where it is stored). Kernels with a matrix product or convolution, and attention kernels,
/// are lowered as [`lower_with`] does.
pub fn lower_planned(
    g: &Graph,
    kernel: &Kernel,
    unshared: &[NodeId],
    opts: &LowerOptions,
    strategy: &Strategy,
) -> KernelSource {
    let row;
    let kernel = match row_instead(g, kernel, opts) {
        Some(k) => {
            row = k;
            &row
        }
        None => kernel,
    };
    match localize_with(g, kernel, unshared) {
        Some((local, k, ids)) => {
            let mut src = lower_here(&local, &k, opts, strategy);
            for b in &mut src.bindings {
                b.node = ids[b.node.index()];
            }
            src
        }
        None => lower_here(g, kernel, opts, strategy),
    }
}

/// A lone reduction in a loop kernel (an unfused kernel: fusion gives long reductions row
/// kernels) whose rows a CPU adapter's invocation cannot sum within [`CPU_LOOP_BUDGET`]
/// iterations, as a row kernel: a workgroup per row. In a loop kernel lavapipe summed the
/// first 65 535 elements of each row of 100 000 and stopped there.
fn row_instead(g: &Graph, kernel: &Kernel, opts: &LowerOptions) -> Option<Kernel> {
    let [m] = kernel.members.as_slice() else { return None };
    let axes = g.node(*m).op.reduced_axes()?;
    if kernel.kind != KernelKind::Loop || within_budget(opts, serial_steps(g, kernel), 1) {
        return None;
    }
    let shape = g.ty(g.operands(*m)[0]).shape.dims().to_vec();
    Some(Kernel { kind: KernelKind::Row { shape, axes }, ..kernel.clone() })
}

/// `kernel` copied into a graph of its own, in an order that depends on what it computes
/// and not on `g`'s node ids: its members in post-order from its outputs (operands in
/// operand order; members no output reaches after them, in their order), its inputs — graph
/// inputs of their types — in order of first use by those members, first. Returns that
/// graph, the kernel over its nodes and, for each of its nodes (by index), the node of `g` it
/// copies. `None` where the copy would not be faithful (an operand that is neither an input
/// nor a member, or a type that comes out differently), which no kernel the passes make has:
/// the caller then lowers `kernel` in `g` itself.
pub fn localize(g: &Graph, kernel: &Kernel) -> Option<(Graph, Kernel, Vec<NodeId>)> {
    localize_with(g, kernel, &[])
}

/// [`localize`], with the members of `unshared` that [`widened`] names computed in f32: in
/// the copy each becomes the same op on f32 operands (the f32 copy of a widened operand, a
/// `cast` to f32 of any other f16 operand, which is exact), followed by a `cast` to f16
/// (rounding) where the kernel stores the member or a member that is not widened reads it.
/// Only widened members see unrounded values. `ids` maps each inserted node to the member
/// it computes or converts.
fn localize_with(g: &Graph, kernel: &Kernel, unshared: &[NodeId]) -> Option<(Graph, Kernel, Vec<NodeId>)> {
    let members = canonical_order(g, kernel);
    let inputs = fusegraph_passes::kernel::kernel_inputs(g, &members);
    if inputs.len() != kernel.inputs.len() || !kernel.inputs.iter().all(|i| inputs.contains(i)) {
        return None;
    }
    let mut local = Graph::new();
    let mut to_local: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    let mut ids = Vec::with_capacity(inputs.len() + members.len());
    for (k, &i) in inputs.iter().enumerate() {
        let id = local.add_leaf(Op::Input { name: format!("in{k}") }, g.ty(i).clone()).ok()?;
        to_local.insert(i, id);
        ids.push(i);
    }
    let wide = widened(g, kernel, &members, unshared);
    let member_set: BTreeSet<NodeId> = members.iter().copied().collect();
    let outputs: BTreeSet<NodeId> = kernel.outputs.iter().copied().collect();
    // A widened member is rounded where it is stored or a member computed in f16 reads it.
    let rounds =
        |m: NodeId| outputs.contains(&m) || g.users(m).iter().any(|u| member_set.contains(u) && !wide.contains(u));
    // The f32 copy of each widened member (before its rounding cast) and of each f16 value a
    // widened member reads.
    let mut wide_local: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    let mut local_members = Vec::with_capacity(members.len());
    for &m in &members {
        let node = g.node(m);
        let id = if node.op.is_leaf() {
            local.add_leaf(node.op.clone(), node.ty.clone()).ok()?
        } else if wide.contains(&m) {
            let mut operands = Vec::new();
            for o in g.operands(m) {
                operands.push(match wide_local.get(&o) {
                    Some(&w) => w,
                    None if g.ty(o).dtype == DType::F16 => {
                        let w = local.add_op(Op::Cast { to: DType::F32 }, &[*to_local.get(&o)?]).ok()?;
                        ids.push(o);
                        local_members.push(w);
                        wide_local.insert(o, w);
                        w
                    }
                    None => *to_local.get(&o)?,
                });
            }
            let w = local.add_op(node.op.clone(), &operands).ok()?;
            if local.ty(w).shape != node.ty.shape || local.ty(w).dtype != DType::F32 {
                return None;
            }
            wide_local.insert(m, w);
            if !rounds(m) {
                to_local.insert(m, w);
                ids.push(m);
                local_members.push(w);
                continue;
            }
            ids.push(m);
            local_members.push(w);
            local.add_op(Op::Cast { to: DType::F16 }, &[w]).ok()?
        } else {
            let operands: Option<Vec<NodeId>> = g.operands(m).iter().map(|o| to_local.get(o).copied()).collect();
            local.add_op(node.op.clone(), &operands?).ok()?
        };
        if local.ty(id) != &node.ty || to_local.insert(m, id).is_some() {
            return None;
        }
        ids.push(m);
        local_members.push(id);
    }
    let map = |ns: &[NodeId]| ns.iter().map(|n| to_local.get(n).copied()).collect::<Option<Vec<_>>>();
    let kind = match &kernel.kind {
        KernelKind::Attention { logits } => KernelKind::Attention { logits: *to_local.get(logits)? },
        other => other.clone(),
    };
    let k = Kernel { kind, members: local_members, outputs: map(&kernel.outputs)?, inputs: map(&inputs)? };
    Some((local, k, ids))
}

/// The members of `kernel` (`members`: a topological order) that [`localize_with`] computes
/// in f32: those of `unshared` that are f16 results of elementwise ops or reductions, and
/// data movement (broadcast, reshape, transpose, slice) of those (so that a row's sum, say,
/// reaches the elements it divides unrounded; data movement of anything else stays as it
/// is, so that loads through views of bindings keep their shape). None in kernels with a
/// matrix product, a convolution or attention, whose lowerings match their members'
/// structure.
fn widened(g: &Graph, kernel: &Kernel, members: &[NodeId], unshared: &[NodeId]) -> BTreeSet<NodeId> {
    let mut wide = BTreeSet::new();
    if unshared.is_empty()
        || matches!(kernel.kind, KernelKind::Attention { .. })
        || members.iter().any(|&m| matches!(g.node(m).op, Op::MatMul | Op::Conv2d { .. }))
    {
        return wide;
    }
    let unshared: BTreeSet<NodeId> = unshared.iter().copied().collect();
    for &m in members {
        if !unshared.contains(&m) || g.ty(m).dtype != DType::F16 {
            continue;
        }
        let widens = match g.node(m).op {
            Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Reduce { .. } => true,
            Op::Broadcast { .. } | Op::Reshape { .. } | Op::Transpose { .. } | Op::Slice { .. } => {
                wide.contains(&g.operands(m)[0])
            }
            _ => false,
        };
        if widens {
            wide.insert(m);
        }
    }
    wide
}

/// `kernel`'s members in post-order from its outputs (operands in operand order), then any
/// member no output reaches, with those it reaches, in member order: a topological order
/// that two kernels computing the same thing share whatever their node ids.
fn canonical_order(g: &Graph, kernel: &Kernel) -> Vec<NodeId> {
    let set: std::collections::BTreeSet<NodeId> = kernel.members.iter().copied().collect();
    let mut seen = std::collections::BTreeSet::new();
    let mut order = Vec::with_capacity(kernel.members.len());
    for &root in kernel.outputs.iter().chain(&kernel.members) {
        if !set.contains(&root) || !seen.insert(root) {
            continue;
        }
        let mut stack = vec![(root, g.operands(root), 0usize)];
        while let Some((node, operands, next)) = stack.last_mut() {
            if let Some(&o) = operands.get(*next) {
                *next += 1;
                if set.contains(&o) && seen.insert(o) {
                    let ops = g.operands(o);
                    stack.push((o, ops, 0));
                }
            } else {
                order.push(*node);
                stack.pop();
            }
        }
    }
    order
}

fn lower_here(g: &Graph, kernel: &Kernel, opts: &LowerOptions, strategy: &Strategy) -> KernelSource {
    // Side windows are stored before the kernel's form runs, which sees the other outputs
    // only; their bindings come last.
    let sides = fusegraph_passes::side_windows(g, kernel);
    let own;
    let kernel = match sides.is_empty() {
        true => kernel,
        false => {
            own = Kernel {
                outputs: kernel.outputs.iter().copied().filter(|o| !sides.contains(o)).collect(),
                ..kernel.clone()
            };
            &own
        }
    };
    let mut bindings: Vec<Binding> =
        kernel.inputs.iter().map(|&node| Binding { node, output: false, texture: false }).collect();
    bindings.extend(kernel.outputs.iter().map(|&node| Binding { node, output: true, texture: false }));
    let form_bindings = bindings.len();
    bindings.extend(sides.iter().map(|&node| Binding { node, output: true, texture: false }));

    let regs = regions(g, kernel);
    let tiled =
        match kernel.kind {
            KernelKind::Loop if strategy.tiled_matmul => crate::matmul::plan(g, kernel, &regs, opts),
            _ => None,
        }
        .map(|t| {
            if strategy.vec4_operands {
                t
            } else {
                crate::matmul::TiledPlan { vec4_lhs: None, vec4_rhs: None, ..t }
            }
        });
    // A product of a few rows takes the matrix–vector kernel (a tiling given asks for the
    // tiled kernel), which reads its operands through their element functions.
    let gemv = tiled
        .filter(|t| {
            strategy.gemv && strategy.matmul_tiling.is_none() && crate::matmul_gemv::gemv_applies(g, kernel, t, opts)
        })
        .map(|t| crate::matmul_gemv::output_products(g, kernel, &t))
        .map(|products| crate::matmul_gemv::with_columns(products, strategy.gemv_columns));
    let tiled = tiled.map(|t| match &gemv {
        Some(_) => crate::matmul::TiledPlan { vec4_lhs: None, vec4_rhs: None, ..t },
        None => t,
    });
    // Sibling products of one lhs (fusion's `gemv`) take the matrix–vector kernel
    // together, a range of its workgroups each.
    let siblings = match kernel.kind {
        KernelKind::Loop if tiled.is_none() && strategy.gemv && strategy.matmul_tiling.is_none() => {
            crate::matmul_gemv::sibling_plans(g, kernel, &regs, opts)
                .map(|plans| crate::matmul_gemv::with_columns(plans, strategy.gemv_columns))
        }
        _ => None,
    };
    // A row prologue (a layer norm computing the products' lhs) is reduced a row at a time
    // by the matrix–vector kernel.
    let prologue = match (&tiled, &gemv, &siblings) {
        (Some(t), Some(_), _) => crate::matmul_gemv::gemv_prologue(g, kernel, t, opts),
        (None, _, Some(products)) => crate::matmul_gemv::gemv_prologue(g, kernel, &products[0].0, opts),
        _ => None,
    };
    let coop = tiled
        .filter(|_| strategy.cooperative_matmul && gemv.is_none())
        .and_then(|t| crate::matmul_coop::coop_plan(g, &t, opts, strategy.matmul_tiling));
    let subgroup = tiled
        .filter(|_| strategy.subgroup_matmul && coop.is_none() && gemv.is_none())
        .and_then(|t| crate::matmul_subgroup::subgroup_plan(g, kernel, &t, opts));
    if let Some(p) = &subgroup {
        for b in bindings.iter_mut().filter(|b| !b.output && p.textures.contains(&b.node)) {
            b.texture = true;
        }
    }
    let all_bindings = bindings;
    let bindings = &all_bindings[..form_bindings];
    // A loop kernel walks four adjacent elements per step where it can, reading and writing
    // whole vec4s of the bindings `loop_vec4` names.
    // Dynamic update slices written over their operands write their windows alone.
    let window = match kernel.kind {
        KernelKind::Loop if tiled.is_none() && siblings.is_none() && strategy.window_writes => {
            crate::window::window_outputs(g, kernel, opts)
        }
        _ => None,
    };
    let loop_vec4 = match kernel.kind {
        KernelKind::Loop if tiled.is_none() && siblings.is_none() && window.is_none() => {
            vec4_loop(g, kernel, bindings, &regs, opts)
        }
        _ => None,
    };
    // So does a row kernel with one invocation per row in the serial family, where it can.
    let row_vec4 = row_quads(g, kernel, bindings, &regs, opts);
    // The subgroup matmul reads its operands' bindings as vec4s, and may write its output so.
    let quads = |node: NodeId| [&loop_vec4, &row_vec4].iter().any(|v| v.as_ref().is_some_and(|v| v.contains(&node)));
    let vec4 = |node: NodeId| {
        subgroup.as_ref().is_some_and(|p| [&p.lhs, &p.rhs].iter().any(|v| v.as_ref().is_some_and(|v| v.leaf == node)))
            || subgroup.is_none()
                && tiled.is_some_and(|t| [t.vec4_lhs, t.vec4_rhs].iter().flatten().any(|v| v.leaf == node))
            || kernel.outputs.contains(&node)
                && match (&tiled, &subgroup) {
                    (Some(_), Some(p)) => p.vec4_store,
                    (Some(t), None) => gemv.is_none() && crate::matmul::tiled_vec4_store(g, t, opts),
                    (None, _) => false,
                }
            || quads(node)
    };
    // f16 quads in the serial loop family: pairs of words (see `f16_words`).
    let words = |node: NodeId| quads(node) && f16_words(g.ty(node).dtype, opts);

    let mut body = String::new();
    // `fg_tK(q)`: vec4 `q` of texture binding K, after the declarations.
    let mut texture_loads = String::new();
    for (k, b) in all_bindings.iter().enumerate() {
        let dt = g.ty(b.node).dtype;
        if b.texture {
            // Read as vec4s of its storage type by `fg_tK`, whatever the texture's format.
            let _ = writeln!(body, "@group(0) @binding({k}) var b{k}: texture_2d<f32>;");
            let _ = writeln!(
                texture_loads,
                "\nfn fg_t{k}(q: u32) -> vec4<{elem}> {{\n    return vec4<{elem}>(textureLoad(b{k}, vec2<u32>(q & {}u, q >> {}u), 0));\n}}",
                TEXTURE_ROW - 1,
                TEXTURE_ROW.trailing_zeros(),
                elem = storage_elem(dt, opts),
            );
            continue;
        }
        let elem = if words(b.node) {
            &quad_elem(dt, opts)
        } else if b.output && packed_halves(dt, opts) && matches!(kernel.kind, KernelKind::Row { .. }) {
            // Rows write single halves of shared words from different workgroups.
            "atomic<u32>"
        } else if vec4(b.node) {
            &format!("vec4<{}>", storage_elem(dt, opts))
        } else {
            storage_elem(dt, opts)
        };
        let _ = writeln!(body, "@group(0) @binding({k}) var<storage, read_write> b{k}: array<{elem}>;");
    }
    body.push_str(&texture_loads);
    body.push('\n');
    for (k, b) in bindings.iter().enumerate().filter(|(_, b)| !b.output) {
        let dt = g.ty(b.node).dtype;
        let load = if words(b.node) {
            format!("unpack2x16float(b{k}[i >> 2u][(i >> 1u) & 1u])[i & 1u]")
        } else if dt == DType::BF16 {
            crate::storage::bf16_load(&format!("b{k}"), "i")
        } else if packed_halves(dt, opts) {
            format!("select(unpack2x16float(b{k}[i >> 1u]).x, unpack2x16float(b{k}[i >> 1u]).y, (i & 1u) == 1u)")
        } else if b.texture {
            load_value(dt, &format!("fg_t{k}(i >> 2u)[i & 3u]"))
        } else if vec4(b.node) {
            load_value(dt, &format!("b{k}[i >> 2u][i & 3u]"))
        } else {
            load_value(dt, &format!("b{k}[i]"))
        };
        let load = match dt.block() {
            Some(_) => crate::packed::block_load(dt, &format!("b{k}")),
            None => format!("return {load};"),
        };
        let _ = writeln!(body, "fn v{}(i: u32) -> {} {{\n    {load}\n}}\n", b.node.index(), crate::writer::vty(dt));
    }
    // The shape whose rows the kernel's reductions reduce, a row at a time.
    let prologue_axes = prologue.as_ref().map(|p| p.axes());
    let row_space: Option<(&[usize], &[usize])> = match (&kernel.kind, &prologue, &prologue_axes) {
        (KernelKind::Row { shape, axes }, ..) => Some((shape, axes)),
        (KernelKind::Loop, Some(p), Some(axes)) => Some((&p.shape, axes)),
        _ => None,
    };
    let row_reduces: Vec<NodeId> = match row_space {
        Some(_) => kernel.members.iter().copied().filter(|&m| g.node(m).op.reduced_axes().is_some()).collect(),
        None => Vec::new(),
    };
    let row_deps = reduction_deps(g, kernel, &row_reduces);
    let row_scalars = match row_space {
        Some(space) => row_scalars(g, kernel, space, &row_reduces, &row_deps),
        None => Vec::new(),
    };
    let gemv_prologue = prologue.as_ref().map(|p| crate::matmul_gemv::Prologue {
        red: RowReduces { reduces: &row_reduces, scalars: &row_scalars, deps: &row_deps },
        shape: &p.shape,
        subgroups: opts.subgroups && row_reduces.iter().all(|&r| g.ty(r).dtype != DType::Bool),
    });
    let uniform = uniform_scalars(g, kernel);
    // An attention kernel calls the element functions of its logits and `v` only.
    let (needed, row_scores) = match kernel.kind {
        KernelKind::Attention { logits } => {
            (Some(crate::attention::needed_members(g, kernel, logits)), crate::attention::row_scores(g, kernel, logits))
        }
        _ => (None, None),
    };
    for &m in kernel.members.iter().filter(|m| needed.as_ref().is_none_or(|n| n.contains(m))) {
        let ty = g.ty(m);
        let _ = writeln!(body, "// {} : {}", g.node(m).op.name(), ty);
        let _ = writeln!(body, "fn v{}(i: u32) -> {} {{", m.index(), vty(ty.dtype));
        if let Some(k) = row_reduces.iter().position(|&r| r == m) {
            // The workgroup reduced this row already; every use inside the kernel is in it.
            let _ = writeln!(body, "    return {};", crate::body::rounded(g, m, format!("fg_red{k}[0]")));
        } else if let Some(j) = row_scalars.iter().position(|&(s, _)| s == m) {
            // A per-row value computed from the row's reductions: computed once per row (in
            // `main`, right after the reductions it needs) instead of once per element.
            let _ = writeln!(body, "    return fg_rs{j};\n}}\n");
            let _ = writeln!(body, "var<private> fg_rs{j}: {};", vty(ty.dtype));
            let _ = writeln!(body, "fn c{}(i: u32) -> {} {{", m.index(), vty(ty.dtype));
            write_body(g, m, &mut body);
        } else if let Some(j) = uniform.iter().position(|&u| u == m) {
            // One value for the whole dispatch (an optimizer's bias correction): computed
            // once per invocation, at the start of `main`, instead of once per use.
            let _ = writeln!(body, "    return fg_us{j};\n}}\n");
            let _ = writeln!(body, "var<private> fg_us{j}: {};", vty(ty.dtype));
            let _ = writeln!(body, "fn fg_u{}(i: u32) -> {} {{", m.index(), vty(ty.dtype));
            write_body(g, m, &mut body);
        } else if row_scores == Some(m) {
            crate::attention::write_row_scores(g, kernel, m, opts.tiled_attention, &mut body);
        } else {
            write_body(g, m, &mut body);
        }
        body.push_str("}\n\n");
    }

    // Each output's region (its same-index chain) is computed once per element, in
    // registers, by `eN`; values reached through index changes are function calls.
    // A tiled matmul kernel computes its output's region as `eO_acc` instead (matmul.rs).
    let attention = matches!(kernel.kind, KernelKind::Attention { .. });
    for (o, region) in
        regs.iter().filter(|(o, _)| !attention && tiled.is_none_or(|t| t.output != *o) && siblings.is_none())
    {
        write_region(g, *o, region, None, &[], &mut body);
    }
    let (main, workgroups) = match &kernel.kind {
        KernelKind::Loop => match (&tiled, &subgroup, &gemv) {
            (Some(t), _, Some(products)) => {
                crate::matmul_gemv::gemv_main(g, bindings, (t, products), &regs, gemv_prologue, &mut body)
            }
            (Some(t), Some(p), None) => {
                let inv = crate::matmul::Invariants::of(g, kernel, t, &regs);
                crate::matmul_subgroup::subgroup_main(g, bindings, t, p, &regs, &inv, &mut body)
            }
            (Some(t), None, None) => {
                let inv = crate::matmul::Invariants::of(g, kernel, t, &regs);
                crate::matmul_tiled::tiled_main(g, kernel, bindings, t, &regs, opts, strategy, coop, &inv, &mut body)
            }
            (None, ..) => match (&window, &siblings) {
                (Some(w), _) => crate::window::window_main(g, bindings, w, opts),
                (None, Some(p)) => {
                    crate::matmul_gemv::gemv_siblings_main(g, bindings, p, &regs, gemv_prologue, &mut body)
                }
                (None, None) => loop_main(g, kernel, bindings, &regs, opts, loop_vec4.as_deref()),
            },
        },
        KernelKind::Row { shape, axes } => {
            let quads = row_vec4
                .as_deref()
                .map(|vec4| RowQuads { quads: Quads { kernel, bindings, vec4, opts }, regions: &regs });
            let reduces = RowReduces { reduces: &row_reduces, scalars: &row_scalars, deps: &row_deps };
            row_main(g, bindings, reduces, shape, axes, opts, quads, &mut body)
        }
        KernelKind::Attention { logits } => {
            crate::attention::attention_main(g, kernel, bindings, *logits, row_scores, opts)
        }
    };
    let side: Vec<(usize, NodeId)> = sides.iter().enumerate().map(|(j, &o)| (form_bindings + j, o)).collect();
    let main = crate::window::with_side_windows(g, main, &side, strategy.window_writes);
    let main = with_uniform_scalars(main, &uniform);
    let mut wgsl = String::new();
    let uses_f16 = opts.f16_native && bindings.iter().any(|b| g.ty(b.node).dtype == DType::F16);
    // A cooperative-matrix kernel stages f16 tiles even where no binding is f16.
    if uses_f16 || coop.is_some() {
        wgsl.push_str("enable f16;\n");
        if coop.is_some() && opts.cooperative_matrix == Some(Cooperative::Native) {
            wgsl.push_str("enable wgpu_cooperative_matrix;\n");
        }
        wgsl.push('\n');
    }
    wgsl.push_str(&body);
    wgsl.push_str(&helpers_called(&[&body, &main]));
    wgsl.push_str(&main);
    let label = kernel.members.iter().map(|&m| g.node(m).op.name()).collect::<Vec<_>>().join("+");
    let conv = |t: &crate::matmul::TiledPlan| matches!(g.node(t.matmul).op, Op::Conv2d { .. });
    let form = match &kernel.kind {
        KernelKind::Loop => match (&tiled, &subgroup, &gemv) {
            (Some(_), _, Some(products)) => KernelForm::Gemv {
                k_contiguous: products[0].1.along == crate::matmul_gemv::KAlong::Contiguous,
                packed: products[0].1.packed.is_some(),
                row_prologue: prologue.is_some(),
            },
            (Some(t), Some(p), None) => KernelForm::SubgroupMatmul {
                conv: conv(t),
                textures: bindings.iter().filter(|b| b.texture).count(),
                vec4_store: p.vec4_store,
            },
            (Some(t), None, None) => KernelForm::TiledMatmul {
                conv: conv(t),
                coop: coop.and(opts.cooperative_matrix),
                vec4_lhs: t.vec4_lhs.is_some(),
                vec4_rhs: t.vec4_rhs.is_some(),
            },
            (None, ..) => match (&window, &siblings) {
                (Some(_), _) => KernelForm::Window,
                (None, Some(products)) => KernelForm::Gemv {
                    k_contiguous: products.iter().all(|(_, r)| r.along == crate::matmul_gemv::KAlong::Contiguous),
                    packed: products.iter().any(|(_, r)| r.packed.is_some()),
                    row_prologue: prologue.is_some(),
                },
                (None, None) => KernelForm::Loop { quads: loop_vec4.is_some() },
            },
        },
        KernelKind::Row { shape, axes } => {
            let (per_thread, subgroups) = row_layout(g, &row_reduces, shape, axes, opts);
            KernelForm::Row { shared: !per_thread, subgroups: !per_thread && subgroups, quads: row_vec4.is_some() }
        }
        KernelKind::Attention { .. } => KernelForm::Attention { tiled: opts.tiled_attention },
    };
    let windows = window.is_some() || (!sides.is_empty() && strategy.window_writes);
    KernelSource { wgsl, bindings: all_bindings, workgroups, label, form, windows }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusegraph_ir::UnaryOp;

    /// A Mesa CPU adapter's lowering: the serial forms within its loop budget.
    fn cpu_adapter() -> LowerOptions {
        LowerOptions { forms: Forms::SERIAL, loop_budget: Some(CPU_LOOP_BUDGET), ..Default::default() }
    }

    /// A loop kernel whose serial reduction is too long for four elements side by side on a
    /// CPU adapter computes one at a time, so its bindings are scalars too: it declared its
    /// four outputs as a vec4 while storing them one by one (naga rejected the module). A
    /// lone reduction that long becomes a row kernel.
    #[test]
    fn loop_kernels_with_long_serial_reductions_stay_valid_on_cpu_adapters() {
        let b = fusegraph_ir::GraphBuilder::new();
        let x = b.input("x", DType::F32, [4, 20_000]).unwrap();
        let s = x.sum(&[1], false).unwrap();
        let y = s.exp().unwrap();
        let g = b.graph();
        let opts = cpu_adapter();
        let kernel = |members: Vec<NodeId>, out: NodeId| Kernel {
            kind: KernelKind::Loop,
            members,
            outputs: vec![out],
            inputs: vec![x.id()],
        };
        let fused = lower(&g, &kernel(vec![s.id(), y.id()], y.id()), &opts);
        crate::validate(&fused.wgsl).unwrap_or_else(|e| panic!("{e}\n{}", fused.wgsl));
        assert!(!fused.wgsl.contains("vec4"), "{}", fused.wgsl);
        let long = fusegraph_ir::GraphBuilder::new();
        let x = long.input("x", DType::F32, [4, 100_000]).unwrap();
        let s = x.sum(&[1], false).unwrap();
        let g = long.graph();
        let alone =
            Kernel { kind: KernelKind::Loop, members: vec![s.id()], outputs: vec![s.id()], inputs: vec![x.id()] };
        let src = lower(&g, &alone, &opts);
        crate::validate(&src.wgsl).unwrap_or_else(|e| panic!("{e}\n{}", src.wgsl));
        assert_eq!(src.workgroups, 4, "a workgroup per row: {}", src.wgsl);
    }

    /// With its members unshared, an f16 chain is computed in f32 and rounded once, where
    /// it is stored (excess precision); a member another kernel also computes, and one a
    /// member outside the widened ops reads, is rounded; with none unshared the text is
    /// `lower_with`'s.
    #[test]
    fn unshared_f16_members_round_only_where_stored_or_shared() {
        let b = fusegraph_ir::GraphBuilder::new();
        let x = b.input("x", DType::F16, [1000]).unwrap();
        let y = b.input("y", DType::F16, [1000]).unwrap();
        let mut v = x.clone();
        for _ in 0..5 {
            v = v.add(&y).unwrap().mul_scalar(0.5).unwrap().tanh().unwrap().sub(&y).unwrap();
        }
        let g = b.graph();
        let members = g.reachable(&[v.id()]).unwrap().into_iter().filter(|&n| n != x.id() && n != y.id()).collect();
        let k = Kernel { kind: KernelKind::Loop, members, outputs: vec![v.id()], inputs: vec![x.id(), y.id()] };
        for opts in [LowerOptions::default(), cpu_adapter()] {
            let exact = lower_with(&g, &k, &opts, &Strategy::default());
            let none = lower_planned(&g, &k, &[], &opts, &Strategy::default());
            assert_eq!(exact.wgsl, none.wgsl);
            let wide = lower_planned(&g, &k, &k.members, &opts, &Strategy::default());
            crate::validate(&wide.wgsl).unwrap_or_else(|e| panic!("{e}\n{}", wide.wgsl));
            assert_eq!(wide.bindings, exact.bindings);
            // Calls to the rounding per rounded value: in its own function, in its output's
            // region function and, on a CPU adapter, in `main` for each of the four lanes a
            // step computes inline (elsewhere `main` calls the region function).
            let per_value = if opts.forms.loops == Spread::Serial { 2 + 4 } else { 2 };
            let rounds = |src: &KernelSource| src.wgsl.matches("fg_round_f16(").count() - 1;
            assert_eq!(rounds(&exact), 20 * per_value, "every op rounds:\n{}", exact.wgsl);
            assert_eq!(rounds(&wide), per_value, "only the stored value rounds:\n{}", wide.wgsl);
            // The third `tanh` computed by another kernel too: it and what reads it round.
            let tanh3 = k.members.iter().copied().filter(|&m| g.node(m).op == Op::Unary(UnaryOp::Tanh)).nth(2).unwrap();
            let unshared: Vec<NodeId> = k.members.iter().copied().filter(|&m| m != tanh3).collect();
            let part = lower_planned(&g, &k, &unshared, &opts, &Strategy::default());
            crate::validate(&part.wgsl).unwrap_or_else(|e| panic!("{e}\n{}", part.wgsl));
            assert_eq!(rounds(&part), 3 * per_value, "the tanh's operand, the tanh, the output:\n{}", part.wgsl);
        }
    }

    /// A loop kernel whose outputs have two lengths (a sibling merge of an optimizer's
    /// updates of a weight and of a bias) computes what the outputs of one length share once
    /// per element: the new moment `m`, stored, is not computed again for the new weight.
    #[test]
    fn ragged_loop_kernels_compute_shared_values_once() {
        let b = fusegraph_ir::GraphBuilder::new();
        let (g1, m) = (b.input("g", DType::F32, [300]).unwrap(), b.input("m", DType::F32, [300]).unwrap());
        let w = b.input("w", DType::F32, [300]).unwrap();
        let m1 = m.mul_scalar(0.9).unwrap().add(&g1.exp().unwrap()).unwrap();
        let w1 = w.sub(&m1.sqrt().unwrap()).unwrap();
        let bias = b.input("b", DType::F32, [7]).unwrap();
        let b1 = bias.neg().unwrap();
        let g = b.graph();
        let mut members: Vec<NodeId> =
            g.node_ids().into_iter().filter(|&n| !matches!(g.node(n).op, Op::Input { .. })).collect();
        members.sort();
        let kernel = Kernel {
            kind: KernelKind::Loop,
            members,
            outputs: vec![m1.id(), w1.id(), b1.id()],
            inputs: vec![g1.id(), m.id(), w.id(), bias.id()],
        };
        for cpu in [false, true] {
            let src = lower(&g, &kernel, &if cpu { cpu_adapter() } else { LowerOptions::default() });
            crate::validate(&src.wgsl).unwrap_or_else(|e| panic!("{e}\n{}", src.wgsl));
            let main = &src.wgsl[src.wgsl.find("@compute").unwrap()..];
            assert_eq!(main.matches("exp(").count(), 1, "{main}");
            assert!(!main.contains(&format!("e{}(", w1.id().index())), "{main}");
            assert!(main.contains(&format!("e{}(", b1.id().index())), "{main}");
        }
    }

    #[test]
    fn suffixes_region_names_but_not_literals_or_functions() {
        assert_eq!(
            suffix_names("select(fg_tanh((x12 * y3)), v7(i), (x2 < 1e-4f))", "_3"),
            "select(fg_tanh((x12_3 * y3_3)), v7(i_3), (x2_3 < 1e-4f))"
        );
        // Hex and float literals, types and builtins keep their spelling.
        assert_eq!(
            suffix_names("bitcast<i32>(0x80000000u) + i32(x5) * 2.0f + vec4<f32>(y10).x", "_0"),
            "bitcast<i32>(0x80000000u) + i32(x5_0) * 2.0f + vec4<f32>(y10_0).x"
        );
    }
}
