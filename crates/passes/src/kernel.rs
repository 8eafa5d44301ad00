//! Partitioning a graph into kernels: the unit the code generator lowers and the runtime
//! dispatches.
//!
//! With [`FusionMode::Off`] every non-leaf primitive op (and every `full`/`iota`) is its own
//! kernel: the baseline of fused-vs-unfused comparisons. Inputs, parameters and constants are
//! never kernels; they are values in memory.

use fusegraph_ir::{Graph, NodeId, Op, Result};
use std::collections::BTreeSet;

/// How aggressively ops are grouped into kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FusionMode {
    /// One kernel per primitive op.
    Off,
    /// Group ops into fused kernels (see the fusion pass).
    #[default]
    On,
}

/// What a kernel's main loop iterates over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelKind {
    /// One invocation per output element (or per packed word of f16 output).
    Loop,
}

/// A group of nodes lowered to one compute shader.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// How the kernel iterates.
    pub kind: KernelKind,
    /// Nodes computed inside the kernel, in topological order.
    pub members: Vec<NodeId>,
    /// Members whose values are written to memory (used outside the kernel or graph outputs).
    pub outputs: Vec<NodeId>,
    /// Values read from memory: operands of members that are not members themselves.
    pub inputs: Vec<NodeId>,
}

/// Whether a node is a value in memory rather than something a kernel computes.
pub fn is_memory_leaf(op: &Op) -> bool {
    matches!(op, Op::Input { .. } | Op::Parameter { .. } | Op::Constant { .. })
}

/// Builds a kernel from its members, deriving inputs and outputs against the graph.
pub fn make_kernel(g: &Graph, members: Vec<NodeId>, graph_outputs: &[NodeId], live: &BTreeSet<NodeId>) -> Kernel {
    let set: BTreeSet<NodeId> = members.iter().copied().collect();
    let mut inputs = Vec::new();
    for &m in &members {
        for o in g.operands(m) {
            if !set.contains(&o) && !inputs.contains(&o) {
                inputs.push(o);
            }
        }
    }
    let outputs = members
        .iter()
        .copied()
        .filter(|m| graph_outputs.contains(m) || g.users(*m).iter().any(|u| live.contains(u) && !set.contains(u)))
        .collect();
    Kernel { kind: KernelKind::Loop, members, outputs, inputs }
}

/// Partitions the nodes that `outputs` depend on into kernels, in a valid execution order.
pub fn partition(g: &Graph, outputs: &[NodeId], mode: FusionMode) -> Result<Vec<Kernel>> {
    let order = g.reachable(outputs)?;
    let live: BTreeSet<NodeId> = order.iter().copied().collect();
    let _ = mode; // Fusion arrives with the fusion pass; until then both modes partition alike.
    Ok(order
        .iter()
        .copied()
        .filter(|&id| !is_memory_leaf(&g.node(id).op))
        .map(|id| make_kernel(g, vec![id], outputs, &live))
        .collect())
}
