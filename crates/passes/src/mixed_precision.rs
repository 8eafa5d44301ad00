//! Mixed precision: a graph computing in f32 rewritten to store every floating-point value
//! in f16, halving activation memory and bandwidth.
//!
//! What changes: every f32 value of the result is f16 — parameters and constants are stored
//! as f16 (the weights' memory halves too), except the parameters named as *masters*
//! (those a training step updates keep their f32 values and are cast at their uses, as
//! inputs are: the casts fuse into the consumers, e.g. a matmul prologue), `full`/`iota`/
//! `cast` produce f16, and each requested output is cast back to f32, so callers see the
//! same types. Storing a weight in f16 or casting it at every use computes the same values:
//! both round it to f16 once before any arithmetic. What does not change:
//! arithmetic inside a kernel is f32 on every adapter, so reductions, softmax and norms
//! accumulate in f32; each f16 result is rounded to f16 as it is computed (in registers
//! too, so a value is the same whether recomputed in a fused kernel or loaded from where
//! another kernel stored it). Integer and bool values are untouched.

use fusegraph_ir::{DType, Graph, NodeId, Op, Result, TensorType};
use std::collections::{BTreeMap, BTreeSet};

/// Rewrites `g` into a new graph that stores f32 values as f16; returns it and the new ids of
/// `outputs` (cast back to their original dtypes). The f32 parameters named in `masters`
/// keep their f32 storage; every other f32 parameter and constant becomes an f16 leaf (the
/// runtime rounds a parameter's f32 value when it is set).
pub fn to_mixed_precision(g: &Graph, outputs: &[NodeId], masters: &BTreeSet<String>) -> Result<(Graph, Vec<NodeId>)> {
    let mut out = Graph::new();
    let mut map: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    let half = |ty: &TensorType| {
        if ty.dtype == DType::F32 {
            TensorType::new(DType::F16, ty.shape.clone())
        } else {
            ty.clone()
        }
    };
    for id in g.topo_order()? {
        let node = g.node(id);
        let new = match &node.op {
            Op::Parameter { name } if node.ty.dtype == DType::F32 && !masters.contains(name) => {
                out.add_leaf(node.op.clone(), half(&node.ty))?
            }
            Op::Constant { .. } => out.add_leaf(node.op.clone(), half(&node.ty))?,
            Op::Input { .. } | Op::Parameter { .. } => {
                let leaf = out.add_leaf(node.op.clone(), node.ty.clone())?;
                if node.ty.dtype == DType::F32 {
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
        };
        if let Some(name) = &node.name {
            out.set_name(new, name.clone());
        }
        map.insert(id, new);
    }
    let mut outs = Vec::with_capacity(outputs.len());
    for &o in outputs {
        let n = map[&o];
        let want = g.ty(o).dtype;
        outs.push(if out.ty(n).dtype != want { out.add_op(Op::Cast { to: want }, &[n])? } else { n });
    }
    Ok((out, outs))
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
}
