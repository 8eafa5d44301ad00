//! The verifier: checks every graph invariant once, so later passes need no fallbacks.

use crate::op::{check_leaf, infer_type};
use crate::{Graph, IrError, Result};

/// Checks that the graph is acyclic, that every node's operand positions are `0..arity`, and
/// that every node's recorded type is what its typing rule gives.
///
/// `verify(g).is_ok()` ⇒ lowering and interpretation of `g` never fail on types.
pub fn verify(g: &Graph) -> Result<()> {
    g.topo_order()?;
    for id in g.node_ids() {
        let node = g.node(id);
        let operands = g.operands(id);
        let positions: Vec<usize> = {
            let mut p: Vec<usize> = g
                .petgraph()
                .edges_directed(petgraph::stable_graph::NodeIndex::new(id.index()), petgraph::Direction::Incoming)
                .map(|e| *e.weight())
                .collect();
            p.sort();
            p
        };
        if positions != (0..operands.len()).collect::<Vec<_>>() {
            return Err(IrError::Verify {
                node: id.index(),
                detail: format!("operand positions {positions:?} are not 0..{}", operands.len()),
            });
        }
        if node.op.is_leaf() {
            check_leaf(&node.op, &node.ty).map_err(|e| IrError::Verify { node: id.index(), detail: e.to_string() })?;
            continue;
        }
        let tys: Vec<_> = operands.iter().map(|&o| g.ty(o)).collect();
        let ty = infer_type(&node.op, &tys).map_err(|e| IrError::Verify { node: id.index(), detail: e.to_string() })?;
        if ty != node.ty {
            return Err(IrError::Verify {
                node: id.index(),
                detail: format!("recorded type {} but {} gives {ty}", node.ty, node.op.name()),
            });
        }
    }
    Ok(())
}
