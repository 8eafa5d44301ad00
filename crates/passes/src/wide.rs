//! Concatenations wider than a kernel can bind become a tree of concatenations.
//!
//! A kernel binds each distinct operand buffer and its result, and an adapter allows a fixed
//! number of storage bindings per kernel (8 to a few dozen). Fusion keeps a kernel of several
//! ops within the limit, but a single `concat` of more operands than the limit cannot be
//! lowered at all. This pass replaces it by a concat of concats, each part of at most
//! `max_operands` operands (consecutive runs, so the order is kept); each inner concat is an
//! ordinary op that fusion may merge with its producers. The cost is one extra pass over
//! the data for the inner results.

use fusegraph_ir::{Graph, NodeId, Op, Result};

/// Splits every concat of more than `max_operands` (≥ 2) operands in `g`, reachable or not,
/// into a tree whose concats have at most that many; entries of `outputs` naming a split
/// node name its replacement. Returns the number of concats split.
pub fn split_wide_concats(g: &mut Graph, outputs: &mut [NodeId], max_operands: usize) -> Result<usize> {
    let max = max_operands.max(2);
    let wide: Vec<NodeId> = g
        .node_ids()
        .into_iter()
        .filter(|&id| matches!(g.node(id).op, Op::Concat { .. }) && g.operands(id).len() > max)
        .collect();
    for &id in &wide {
        let Op::Concat { axis } = g.node(id).op else { unreachable!("filtered to concats") };
        let mut level = g.operands(id);
        while level.len() > max {
            level = level
                .chunks(max)
                .map(|part| match part {
                    [one] => Ok(*one),
                    _ => g.add_op(Op::Concat { axis }, part),
                })
                .collect::<Result<Vec<_>>>()?;
        }
        let top = g.add_op(Op::Concat { axis }, &level)?;
        g.substitute(id, top);
        for o in outputs.iter_mut().filter(|o| **o == id) {
            *o = top;
        }
    }
    Ok(wide.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusegraph_ir::{DType, GraphBuilder};
    use fusegraph_reference::evaluate;
    use std::collections::BTreeMap;

    #[test]
    fn a_wide_concat_becomes_a_tree_with_the_same_values() {
        let b = GraphBuilder::new();
        let parts: Vec<_> = (0..11).map(|i| b.input(&format!("x{i}"), DType::F32, [i % 3 + 1, 2]).unwrap()).collect();
        let refs: Vec<_> = parts.iter().collect();
        let cat = b.concat(&refs, 0).unwrap();
        let y = cat.mul_scalar(2.0).unwrap();
        let g0 = b.graph();
        let feeds: BTreeMap<String, fusegraph_ir::HostTensor> = (0..11)
            .map(|i| {
                let n = (i % 3 + 1) * 2;
                let v: Vec<f32> = (0..n).map(|j| (i * 10 + j) as f32 * 0.37 - 3.0).collect();
                (format!("x{i}"), fusegraph_ir::HostTensor::new([i % 3 + 1, 2], v).unwrap())
            })
            .collect();
        let want = evaluate(&g0, &[y.id(), cat.id()], &feeds, &BTreeMap::new()).unwrap();

        let mut g = g0.clone();
        let mut outs = vec![y.id(), cat.id()];
        assert_eq!(split_wide_concats(&mut g, &mut outs, 4).unwrap(), 1);
        assert_ne!(outs[1], cat.id(), "the output names the new top concat");
        let widest = g
            .node_ids()
            .into_iter()
            .filter(|&id| matches!(g.node(id).op, Op::Concat { .. }))
            .map(|id| g.operands(id).len())
            .max();
        assert_eq!(widest, Some(4));
        let got = evaluate(&g, &outs, &feeds, &BTreeMap::new()).unwrap();
        assert_eq!(got, want);
        // Nothing left to split.
        assert_eq!(split_wide_concats(&mut g, &mut outs, 4).unwrap(), 0);
    }
}
