//! Common subexpression elimination: a node with the same op, attributes, type, operands and
//! debug name (checkpoint clones are named apart so they are not merged back)
//! as an earlier node is replaced by it. Inputs and parameters with the same name and type
//! are the same value and merge too.

use super::replace;
use fusegraph_ir::{Graph, NodeId, Result};
use std::collections::BTreeMap;

/// Merges duplicate nodes; returns how many were merged.
pub fn cse(g: &mut Graph, outputs: &mut [NodeId]) -> Result<usize> {
    let mut seen: BTreeMap<String, NodeId> = BTreeMap::new();
    let mut merged = 0;
    for id in g.topo_order()? {
        let node = g.node(id);
        // The Debug form of an op spells every attribute exactly (f64 via `{:?}` round-trips).
        let key = format!("{:?}|{}|{:?}|{:?}", node.op, node.ty, g.operands(id), node.name);
        match seen.get(&key) {
            Some(&first) => {
                replace(g, outputs, id, first);
                merged += 1;
            }
            None => {
                seen.insert(key, id);
            }
        }
    }
    Ok(merged)
}
