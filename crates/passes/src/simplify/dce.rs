//! Dead code elimination: removes every node the outputs do not depend on. Inputs and
//! parameters that become unused are removed too (the runtime still accepts feeds for them).

use fusegraph_ir::{Graph, NodeId, Result};
use std::collections::BTreeSet;

/// Removes nodes unreachable from `outputs`; returns how many.
pub fn dce(g: &mut Graph, outputs: &mut [NodeId]) -> Result<usize> {
    let live: BTreeSet<NodeId> = g.reachable(outputs)?.into_iter().collect();
    let dead: Vec<NodeId> = g.node_ids().into_iter().filter(|n| !live.contains(n)).collect();
    for &n in &dead {
        g.remove(n);
    }
    Ok(dead.len())
}
