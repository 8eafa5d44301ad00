//! Partitioning a graph into kernels: the unit the code generator lowers and the runtime
//! dispatches.
//!
//! With [`FusionMode::Off`] every non-leaf primitive op (and every `full`/`iota`) is its own
//! kernel: the baseline of fused-vs-unfused comparisons. Inputs, parameters and constants are
//! never kernels; they are values in memory.

use fusegraph_ir::{Graph, NodeId, Op};
use std::collections::{BTreeMap, BTreeSet};

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
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelKind {
    /// One invocation per output element (or per packed word of f16 output).
    Loop,
    /// One workgroup per row: every reduction in the kernel reduces `axes` of a value of
    /// `shape`; the workgroup reduces its row cooperatively in workgroup memory, keeps each
    /// result for the rest of the kernel, then writes the row's outputs.
    Row {
        /// The shape being reduced.
        shape: Vec<usize>,
        /// The reduced axes.
        axes: Vec<usize>,
    },
    /// Memory-efficient attention ([`crate::attention`]): the single output is `p·v` with
    /// `p = softmax(logits)` over the last axis; one invocation per output row walks that
    /// row's logits once (the online softmax), so neither the logits nor `p` are stored.
    Attention {
        /// The softmax's input, computed per element by the kernel's members.
        logits: NodeId,
    },
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
    let inputs = kernel_inputs(g, &members);
    let outputs = members
        .iter()
        .copied()
        .filter(|m| graph_outputs.contains(m) || g.users(*m).iter().any(|u| live.contains(u) && !set.contains(u)))
        .collect();
    Kernel { kind: KernelKind::Loop, members, outputs, inputs }
}

/// The values `members` read from memory: their operands that are not members, in order of
/// first use.
pub fn kernel_inputs(g: &Graph, members: &[NodeId]) -> Vec<NodeId> {
    let set: BTreeSet<NodeId> = members.iter().copied().collect();
    let mut inputs = Vec::new();
    for &m in members {
        for o in g.operands(m) {
            if !set.contains(&o) && !inputs.contains(&o) {
                inputs.push(o);
            }
        }
    }
    inputs
}

/// For each of `kernels`, its members that no other kernel computes (its own values, stored
/// or not). Code generation may keep such a value in more precision than its dtype (an f16
/// value in f32: XLA's excess precision) without two copies of one value ever disagreeing:
/// a value two kernels compute is computed from rounded operands and rounded in both, and
/// one a kernel stores is rounded before it is stored, so what another kernel loads or
/// recomputes is what this one rounded (a max-reduction's backward compares a recomputed
/// value with the stored maximum).
pub fn unshared_members(kernels: &[Kernel]) -> Vec<Vec<NodeId>> {
    let mut computed: BTreeMap<NodeId, usize> = BTreeMap::new();
    for k in kernels {
        for &m in &k.members {
            *computed.entry(m).or_default() += 1;
        }
    }
    kernels.iter().map(|k| k.members.iter().copied().filter(|m| computed[m] == 1).collect()).collect()
}

/// Operands that an op reads at the same linear index as the element it computes
/// (elementwise ops and reshapes). Chains of such edges from a kernel output form its
/// *region*: values computed once per output element and kept in registers.
pub fn same_index_operands(g: &Graph, id: NodeId) -> Vec<NodeId> {
    let node = g.node(id);
    if node.op.is_elementwise() || matches!(node.op, Op::Reshape { .. }) {
        g.operands(id)
    } else {
        Vec::new()
    }
}

/// The region of each output of a kernel: the members reachable from it through
/// same-index edges, in topological (member) order, the output last.
pub fn regions(g: &Graph, kernel: &Kernel) -> Vec<(NodeId, Vec<NodeId>)> {
    let members = MemberOrder::of(kernel);
    kernel.outputs.iter().map(|&o| (o, members.region(g, o))).collect()
}

/// The members of `kernel` reachable from `root` through same-index edges (`root` itself
/// when it is one), in member order: the values computed at `root`'s element index.
pub fn region_of(g: &Graph, kernel: &Kernel, root: NodeId) -> Vec<NodeId> {
    MemberOrder::of(kernel).region(g, root)
}

/// A kernel's members by node, with their places in member order: built once per kernel, so
/// that questions asked per output cost the output's region rather than the whole kernel (a
/// training step's merged optimizer kernel has thousands of members and hundreds of outputs).
pub(crate) struct MemberOrder(BTreeMap<NodeId, usize>);

impl MemberOrder {
    pub(crate) fn of(kernel: &Kernel) -> MemberOrder {
        MemberOrder(kernel.members.iter().enumerate().map(|(i, &m)| (m, i)).collect())
    }

    pub(crate) fn contains(&self, n: &NodeId) -> bool {
        self.0.contains_key(n)
    }

    /// [`region_of`] on this kernel.
    pub(crate) fn region(&self, g: &Graph, root: NodeId) -> Vec<NodeId> {
        if !self.contains(&root) {
            return Vec::new();
        }
        let mut set = BTreeSet::from([root]);
        let mut stack = vec![root];
        while let Some(n) = stack.pop() {
            for p in same_index_operands(g, n) {
                if self.contains(&p) && set.insert(p) {
                    stack.push(p);
                }
            }
        }
        let mut region: Vec<NodeId> = set.into_iter().collect();
        region.sort_by_key(|m| self.0[m]);
        region
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusegraph_ir::{DType, GraphBuilder};

    /// A member two kernels compute is nobody's own; a kernel's stored outputs are its own.
    #[test]
    fn unshared_members_leave_out_what_two_kernels_compute() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F16, [8]).unwrap();
        let e = x.exp().unwrap();
        let (y, z) = (e.add(&x).unwrap(), e.mul(&x).unwrap());
        let g = b.graph();
        let kernel = |members: Vec<NodeId>, out: NodeId| Kernel {
            kind: KernelKind::Loop,
            members,
            outputs: vec![out],
            inputs: vec![x.id()],
        };
        // `e` recomputed by both kernels, as fusion duplicates a cheap producer.
        let kernels = [kernel(vec![e.id(), y.id()], y.id()), kernel(vec![e.id(), z.id()], z.id())];
        assert_eq!(unshared_members(&kernels), vec![vec![y.id()], vec![z.id()]]);
        let one = [kernel(vec![e.id(), y.id(), z.id()], y.id())];
        assert_eq!(unshared_members(&one), vec![vec![e.id(), y.id(), z.id()]]);
        let _ = g;
    }
}
