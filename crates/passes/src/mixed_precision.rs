//! Mixed precision: a graph computing in f32 rewritten to store every floating-point value
//! in f16, halving activation memory and bandwidth.
//!
//! What changes: every f32 value of the result is f16 — parameters and constants are stored
//! as f16 (the weights' memory halves too), except the parameters named as *masters*
//! (those a training step updates keep their f32 values and are cast at their uses, as
//! inputs are: the casts fuse into the consumers, e.g. a matmul prologue), `full`/`iota`/
//! `cast` produce f16, and each requested output is cast back to f32, so callers see the
//! same types. Storing a weight in f16 or casting it at every use computes the same values:
//! both round it to f16 once before any arithmetic. With parameter updates
//! ([`to_mixed_precision_updating`]), the elementwise arithmetic that computes the updates
//! (an optimizer's: Adam's moments, its `ε`, the new weights) stays f32, reading the f16
//! gradients widened: in f16, Adam's `ε` (1e-8) is 0 and the square of a gradient below
//! 2.4e-4 is 0, and the update divided by zero. What does not change: arithmetic inside a
//! kernel is f32 on every adapter, so reductions, softmax and norms accumulate in f32; each
//! f16 result is rounded to f16 where it is stored or another kernel computes it too (within
//! a kernel it may stay f32: the runtime's excess precision). Integer and bool values are
//! untouched.

use fusegraph_ir::{DType, Graph, NodeId, Op, Result, TensorType};
use std::collections::{BTreeMap, BTreeSet};

/// Rewrites `g` into a new graph that stores f32 values as f16; returns it and the new ids of
/// `outputs` (cast back to their original dtypes). The f32 parameters named in `masters`
/// keep their f32 storage; every other f32 parameter and constant becomes an f16 leaf (the
/// runtime rounds a parameter's f32 value when it is set).
pub fn to_mixed_precision(g: &Graph, outputs: &[NodeId], masters: &BTreeSet<String>) -> Result<(Graph, Vec<NodeId>)> {
    to_mixed_precision_updating(g, outputs, masters, &[])
}

/// [`to_mixed_precision`] of a training step whose parameter updates compute `updates` (f32
/// values among `outputs`, the new values of `masters`): the f32 elementwise ops and data
/// movement from which an update is reached through such ops alone stay f32 (the
/// optimizer's arithmetic), reading f16 operands widened and master parameters unrounded.
pub fn to_mixed_precision_updating(
    g: &Graph,
    outputs: &[NodeId],
    masters: &BTreeSet<String>,
    updates: &[NodeId],
) -> Result<(Graph, Vec<NodeId>)> {
    let wide = update_arithmetic(g, updates);
    let mut out = Graph::new();
    let mut map: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    // f32 leaves (inputs, master parameters) before their cast to f16, and f32 copies of f16
    // values that the update arithmetic reads.
    let mut raw: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    let mut widened: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    let half = |ty: &TensorType| {
        if ty.dtype == DType::F32 {
            TensorType::new(DType::F16, ty.shape.clone())
        } else {
            ty.clone()
        }
    };
    for id in g.topo_order()? {
        let node = g.node(id);
        let new = if wide.contains(&id) {
            let mut operands = Vec::new();
            for o in g.operands(id) {
                let m = map[&o];
                operands.push(if let Some(&r) = raw.get(&o) {
                    r
                } else if out.ty(m).dtype == DType::F16 && g.ty(o).dtype == DType::F32 {
                    match widened.get(&o) {
                        Some(&w) => w,
                        None => {
                            let w = out.add_op(Op::Cast { to: DType::F32 }, &[m])?;
                            widened.insert(o, w);
                            w
                        }
                    }
                } else {
                    m
                });
            }
            if node.op.is_leaf() {
                out.add_leaf(node.op.clone(), node.ty.clone())?
            } else {
                out.add_op(node.op.clone(), &operands)?
            }
        } else {
            match &node.op {
                Op::Parameter { name } if node.ty.dtype == DType::F32 && !masters.contains(name) => {
                    out.add_leaf(node.op.clone(), half(&node.ty))?
                }
                Op::Constant { .. } => out.add_leaf(node.op.clone(), half(&node.ty))?,
                Op::Input { .. } | Op::Parameter { .. } => {
                    let leaf = out.add_leaf(node.op.clone(), node.ty.clone())?;
                    if node.ty.dtype == DType::F32 {
                        raw.insert(id, leaf);
                        out.add_op(Op::Cast { to: DType::F16 }, &[leaf])?
                    } else {
                        leaf
                    }
                }
                Op::Full { .. } | Op::Iota { .. } => out.add_leaf(node.op.clone(), half(&node.ty))?,
                Op::Cast { to: DType::F32 } => {
                    let x = map[&g.operands(id)[0]];
                    if out.ty(x).dtype == DType::F16 {
                        x
                    } else {
                        out.add_op(Op::Cast { to: DType::F16 }, &[x])?
                    }
                }
                op => {
                    let operands: Vec<NodeId> = g.operands(id).iter().map(|o| map[o]).collect();
                    out.add_op(op.clone(), &operands)?
                }
            }
        };
        if let Some(name) = &node.name {
            out.set_name(new, name.clone());
        }
        if wide.contains(&id) {
            // Users outside the update arithmetic read it rounded, as every other value.
            raw.insert(id, new);
            map.insert(id, out.add_op(Op::Cast { to: DType::F16 }, &[new])?);
        } else {
            map.insert(id, new);
        }
    }
    let mut outs = Vec::with_capacity(outputs.len());
    for &o in outputs {
        let n = if wide.contains(&o) { raw[&o] } else { map[&o] };
        let want = g.ty(o).dtype;
        outs.push(if out.ty(n).dtype != want { out.add_op(Op::Cast { to: want }, &[n])? } else { n });
    }
    Ok((out, outs))
}

/// The f32 elementwise ops and data movement (and `full` constants) from which one of
/// `updates` is reached through such ops alone: an optimizer's arithmetic.
fn update_arithmetic(g: &Graph, updates: &[NodeId]) -> BTreeSet<NodeId> {
    let mut wide = BTreeSet::new();
    let mut stack: Vec<NodeId> = updates.to_vec();
    while let Some(n) = stack.pop() {
        let arithmetic = matches!(
            g.node(n).op,
            Op::Unary(_)
                | Op::Binary(_)
                | Op::Select
                | Op::Cast { to: DType::F32 }
                | Op::Broadcast { .. }
                | Op::Reshape { .. }
                | Op::Transpose { .. }
                | Op::Slice { .. }
                | Op::Full { .. }
        );
        if arithmetic && g.ty(n).dtype == DType::F32 && wide.insert(n) {
            stack.extend(g.operands(n));
        }
    }
    wide
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusegraph_ir::GraphBuilder;

    #[test]
    fn floats_become_f16_and_outputs_keep_their_type() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [4, 8]).unwrap();
        let w = b.parameter("w", DType::F32, [8, 8]).unwrap();
        let i = b.input("i", DType::I32, [4]).unwrap();
        let y = x.matmul(&w).unwrap().softmax(1).unwrap();
        let (g, outs) = to_mixed_precision(&b.graph(), &[y.id(), i.id()], &BTreeSet::new()).unwrap();
        fusegraph_ir::verify(&g).unwrap();
        assert_eq!(g.ty(outs[0]).dtype, DType::F32);
        assert_eq!(g.ty(outs[1]).dtype, DType::I32);
        let f16_values = g.node_ids().into_iter().filter(|&n| g.ty(n).dtype == DType::F16).count();
        let f32_values = g.node_ids().into_iter().filter(|&n| g.ty(n).dtype == DType::F32).count();
        // f32 remains only at the input and the output cast; the weight is an f16 leaf.
        assert_eq!(f32_values, 2, "{}", fusegraph_ir::text::print(&g));
        assert!(f16_values > 5);
        let leaf = |n: &str| {
            g.node_ids().into_iter().find(|&id| matches!(&g.node(id).op, Op::Parameter { name } if name == n))
        };
        assert_eq!(g.ty(leaf("w").unwrap()).dtype, DType::F16);
    }

    #[test]
    fn master_parameters_keep_f32_storage_and_are_cast_at_their_uses() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [4, 8]).unwrap();
        let w = b.parameter("w", DType::F32, [8, 8]).unwrap();
        let v = b.parameter("v", DType::F32, [8, 8]).unwrap();
        let y = x.matmul(&w).unwrap().matmul(&v).unwrap();
        let masters = BTreeSet::from(["w".to_string()]);
        let (g, _) = to_mixed_precision(&b.graph(), &[y.id()], &masters).unwrap();
        let leaf = |n: &str| {
            g.node_ids().into_iter().find(|&id| matches!(&g.node(id).op, Op::Parameter { name } if name == n)).unwrap()
        };
        assert_eq!(g.ty(leaf("w")).dtype, DType::F32);
        assert_eq!(g.ty(leaf("v")).dtype, DType::F16);
        let uses = g.users(leaf("w"));
        assert_eq!(uses.len(), 1);
        assert!(matches!(g.node(uses[0]).op, Op::Cast { to: DType::F16 }));
    }

    /// An Adam-like update: the gradient (a product) is f16, the update's arithmetic f32,
    /// reading the master weight and its state unrounded and `ε` as an f32 constant.
    #[test]
    fn the_update_arithmetic_stays_f32() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [4, 8]).unwrap();
        let w = b.parameter("w", DType::F32, [8, 8]).unwrap();
        let v = b.parameter("v", DType::F32, [8, 8]).unwrap();
        let y = x.matmul(&w).unwrap();
        let grad = x.t().unwrap().matmul(&y).unwrap();
        let v2 = v.mul_scalar(0.999).unwrap().add(&grad.mul(&grad).unwrap().mul_scalar(1e-3).unwrap()).unwrap();
        let w2 = w.sub(&grad.div(&v2.sqrt().unwrap().add_scalar(1e-8).unwrap()).unwrap()).unwrap();
        let masters = BTreeSet::from(["w".to_string(), "v".to_string()]);
        let outputs = [y.id(), v2.id(), w2.id()];
        let (g, outs) = to_mixed_precision_updating(&b.graph(), &outputs, &masters, &[v2.id(), w2.id()]).unwrap();
        let ops = |dtype: DType, name: &str| {
            g.node_ids().into_iter().filter(|&id| g.ty(id).dtype == dtype && g.node(id).op.name() == name).count()
        };
        assert_eq!(ops(DType::F16, "matmul"), 2, "the products stay f16");
        assert_eq!(ops(DType::F32, "matmul"), 0);
        for name in ["sqrt", "div", "sub", "add"] {
            assert!(ops(DType::F32, name) >= 1 && ops(DType::F16, name) == 0, "{name} is f32");
        }
        let eps = g.node_ids().into_iter().find(|&id| g.node(id).op == Op::Full { value: 1e-8 }).unwrap();
        assert_eq!(g.ty(eps).dtype, DType::F32, "ε is not rounded to 0");
        // Updates come out f32 with no rounding cast; the plain output is cast back.
        assert!(matches!(g.node(outs[0]).op, Op::Cast { to: DType::F32 }));
        assert_eq!(g.node(outs[2]).op.name(), "sub");
        assert_eq!(g.ty(outs[2]).dtype, DType::F32);
        // Without updates named, the same graph computes them in f16.
        let (plain, _) = to_mixed_precision(&b.graph(), &outputs, &masters).unwrap();
        assert!(plain
            .node_ids()
            .into_iter()
            .any(|id| plain.node(id).op.name() == "sqrt" && plain.ty(id).dtype == DType::F16));
    }
}
