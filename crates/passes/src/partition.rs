//! Partitioning a graph into kernels as a whole: one per op, or fused.

use crate::fuse::{fuse, FusionOptions};
use crate::kernel::{is_memory_leaf, make_kernel, FusionMode, Kernel};
use fusegraph_ir::{Graph, NodeId, Result};
use std::collections::BTreeSet;

/// Partitions the nodes that `outputs` depend on into kernels, in a valid execution order:
/// one per op with [`FusionMode::Off`], fused by [`crate::fuse()`] with default options
/// otherwise.
pub fn partition(g: &Graph, outputs: &[NodeId], mode: FusionMode) -> Result<Vec<Kernel>> {
    if mode == FusionMode::On {
        return Ok(fuse(g, outputs, &FusionOptions::default())?.kernels);
    }
    let order = g.reachable(outputs)?;
    let live: BTreeSet<NodeId> = order.iter().copied().collect();
    Ok(order
        .iter()
        .copied()
        .filter(|&id| !is_memory_leaf(&g.node(id).op))
        .map(|id| make_kernel(g, vec![id], outputs, &live))
        .collect())
}
