//! Constant folding and algebraic identities.
//!
//! Folding: an elementwise op or layout op whose operands are all `full` becomes a `full` (of
//! any size: it stays free). The root of any other subtree computable from constants alone
//! becomes a `constant`, its values computed by the reference interpreter (so folding cannot
//! change a result), when it holds no more elements than the constants it came from or at
//! most [`MAX_FOLD_ELEMENTS`]: folding never blows a broadcast up into memory.
//!
//! Identities: `x·1`, `1·x`, `x+0`, `0+x`, `x−0`, `x/1` → `x`; `neg(neg(x))` → `x`;
//! transpose of transpose → one transpose (or `x`); reshape of reshape → one reshape;
//! reshape or broadcast to the operand's own shape → `x`. Identities on floats keep results
//! bit-exact except for the sign of a zero (`-0 + 0`).

use super::replace;
use fusegraph_ir::{BinaryOp, Graph, NodeId, Op, Result, UnaryOp};
use std::collections::{BTreeMap, BTreeSet};

/// The largest constant folding materializes.
pub const MAX_FOLD_ELEMENTS: usize = 4096;

fn full_value(g: &Graph, id: NodeId) -> Option<f64> {
    match g.node(id).op {
        Op::Full { value } => Some(fusegraph_reference::round_to(g.ty(id).dtype, value)),
        _ => None,
    }
}

/// Evaluates node `id` (all of whose operands are constant) with the reference interpreter,
/// on a copy of the subtree it is computed from: the interpreter verifies and orders the
/// whole graph it is given, which on the model's graph costs a sweep of every node per
/// folded constant (a 32-block training step folds hundreds).
fn evaluate(g: &Graph, id: NodeId) -> Option<Vec<f64>> {
    let mut t = Graph::new();
    let mut copied: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    // Depth first, each node copied once its operands are (pushed after it, popped before).
    let mut stack = vec![(id, false)];
    while let Some((n, operands_done)) = stack.pop() {
        if copied.contains_key(&n) {
            continue;
        }
        let ops = g.operands(n);
        if !operands_done {
            stack.push((n, true));
            stack.extend(ops.iter().filter(|o| !copied.contains_key(o)).map(|&o| (o, false)));
            continue;
        }
        let node = g.node(n);
        let new = if node.op.is_leaf() {
            t.add_leaf(node.op.clone(), node.ty.clone())
        } else {
            t.add_op(node.op.clone(), &ops.iter().map(|o| copied[o]).collect::<Vec<_>>())
        };
        let new = new.ok()?;
        debug_assert_eq!(t.ty(new), &node.ty, "a copied node infers its own type");
        copied.insert(n, new);
    }
    let out = fusegraph_reference::evaluate(&t, &[copied[&id]], &BTreeMap::new(), &BTreeMap::new()).ok()?;
    Some(out[0].to_f64())
}

/// The value of elementwise or layout `op` applied to `full` operands, computed on scalars.
fn scalar_value(g: &Graph, op: &Op, ops: &[NodeId]) -> Option<f64> {
    if !op.is_elementwise() {
        return full_value(g, ops[0]);
    }
    let mut t = Graph::new();
    let leaves: Vec<NodeId> = ops
        .iter()
        .map(|&o| {
            t.add_leaf(Op::Full { value: full_value(g, o)? }, fusegraph_ir::TensorType::new(g.ty(o).dtype, [])).ok()
        })
        .collect::<Option<_>>()?;
    let id = t.add_op(op.clone(), &leaves).ok()?;
    evaluate(&t, id).and_then(|v| v.first().copied())
}

/// Folds constants and applies identities; returns (folded, identities).
pub fn fold(g: &mut Graph, outputs: &mut [NodeId]) -> Result<(usize, usize)> {
    let (mut folded, mut identities) = (0, 0);
    let order = g.topo_order()?;
    // Values computable without feeds or parameters, and the constant elements behind each.
    let mut constant: BTreeMap<NodeId, usize> = BTreeMap::new();
    for &id in &order {
        let node = g.node(id);
        let ops = g.operands(id);
        let leaf_elems = match &node.op {
            Op::Constant { values } => Some(values.len()),
            Op::Full { .. } | Op::Iota { .. } => Some(0),
            Op::Input { .. } | Op::Parameter { .. } => None,
            _ => ops.iter().map(|o| constant.get(o).copied()).sum::<Option<usize>>(),
        };
        if let Some(n) = leaf_elems {
            constant.insert(id, n);
        }
    }
    // Roots of constant subtrees: used by something that is not constant. A broadcast is
    // never materialized, so the value it spreads becomes the root instead.
    let mut roots: BTreeSet<NodeId> = BTreeSet::new();
    for &id in order.iter().rev() {
        if !constant.contains_key(&id) {
            continue;
        }
        let root = outputs.contains(&id) || g.users(id).iter().any(|u| !constant.contains_key(u) || roots.contains(u));
        if root {
            if matches!(g.node(id).op, Op::Broadcast { .. }) {
                roots.extend(g.operands(id));
            } else {
                roots.insert(id);
            }
        }
    }
    for id in order {
        let node = g.node(id).clone();
        let ops = g.operands(id);
        if node.op.is_leaf() {
            continue;
        }
        // Identities first: they remove nodes without creating any.
        if let Some(x) = identity(g, id, &node.op, &ops) {
            replace(g, outputs, id, x);
            identities += 1;
            continue;
        }
        let Some(&elems) = constant.get(&id) else { continue };
        let all_full = ops.iter().all(|&o| full_value(g, o).is_some());
        let spreads = node.op.is_elementwise()
            || matches!(node.op, Op::Broadcast { .. } | Op::Reshape { .. } | Op::Transpose { .. });
        let new = if all_full && spreads {
            // Every element of the result is equal: compute one on scalars, never
            // materializing a broadcast.
            scalar_value(g, &node.op, &ops).map(|value| Op::Full { value })
        } else {
            // Fold the root of a constant subtree, unless that would materialize more
            // elements than the constants it was computed from (a broadcast, say).
            let n = node.ty.shape.numel();
            if roots.contains(&id) && n <= MAX_FOLD_ELEMENTS.max(elems) {
                evaluate(g, id).map(|values| Op::Constant { values })
            } else {
                None
            }
        };
        if let Some(op) = new {
            let c = g.add_leaf(op, node.ty.clone())?;
            replace(g, outputs, id, c);
            folded += 1;
        }
    }
    Ok((folded, identities))
}

/// The node `id` simplifies to, if an identity applies.
fn identity(g: &mut Graph, id: NodeId, op: &Op, ops: &[NodeId]) -> Option<NodeId> {
    let ty = g.ty(id).clone();
    let same_type = |g: &Graph, x: NodeId| *g.ty(x) == ty;
    match op {
        Op::Binary(b) => {
            let (l, r) = (ops[0], ops[1]);
            let (lv, rv) = (full_value(g, l), full_value(g, r));
            let pick = match b {
                BinaryOp::Mul if rv == Some(1.0) => Some(l),
                BinaryOp::Mul if lv == Some(1.0) => Some(r),
                BinaryOp::Add if rv == Some(0.0) => Some(l),
                BinaryOp::Add if lv == Some(0.0) => Some(r),
                BinaryOp::Sub if rv == Some(0.0) => Some(l),
                BinaryOp::Div if rv == Some(1.0) => Some(l),
                _ => None,
            };
            pick.filter(|&x| same_type(g, x))
        }
        Op::Unary(UnaryOp::Neg) => match g.node(ops[0]).op {
            Op::Unary(UnaryOp::Neg) => Some(g.operands(ops[0])[0]),
            _ => None,
        },
        Op::Reshape { shape } => {
            let x = ops[0];
            if g.ty(x).shape.dims() == shape.as_slice() {
                return Some(x);
            }
            if let Op::Reshape { .. } = g.node(x).op {
                let inner = g.operands(x)[0];
                if g.ty(inner).shape.dims() == shape.as_slice() {
                    return Some(inner);
                }
                return g.add_op(Op::Reshape { shape: shape.clone() }, &[inner]).ok();
            }
            None
        }
        Op::Broadcast { shape, .. } if g.ty(ops[0]).shape.dims() == shape.as_slice() => Some(ops[0]),
        Op::Transpose { perm } => {
            let x = ops[0];
            if perm.iter().enumerate().all(|(i, &p)| i == p) {
                return Some(x);
            }
            if let Op::Transpose { perm: inner_perm } = &g.node(x).op {
                let inner = g.operands(x)[0];
                // result axis i = x axis perm[i] = inner axis inner_perm[perm[i]].
                let composed: Vec<usize> = perm.iter().map(|&p| inner_perm[p]).collect();
                if composed.iter().enumerate().all(|(i, &p)| i == p) {
                    return Some(inner);
                }
                return g.add_op(Op::Transpose { perm: composed }, &[inner]).ok();
            }
            None
        }
        _ => None,
    }
}
