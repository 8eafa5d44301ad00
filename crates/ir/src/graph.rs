//! The graph: nodes (ops with their result types) and operand edges on petgraph.

use crate::op::{check_leaf, infer_type};
use crate::{IrError, Op, Result, TensorType};
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use std::collections::BTreeSet;
use std::fmt;

/// Identifies a node of a [`Graph`]. Printed as `%N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub(crate) u32);

impl NodeId {
    /// The raw index (stable for the node's lifetime; may be reused after removal).
    pub fn index(self) -> usize {
        self.0 as usize
    }

    fn nx(self) -> NodeIndex {
        NodeIndex::new(self.index())
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// A node: an op, the type of the value it produces, and an optional debug name.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The operation.
    pub op: Op,
    /// The result type, checked against the op's typing rule when the node was added.
    pub ty: TensorType,
    /// A name for humans (DOT, text form); inputs and parameters are named by their op.
    pub name: Option<String>,
}

/// A dataflow graph of primitive ops. Edges run from operand to user and carry the operand
/// position.
///
/// Invariants (checked by [`crate::verify()`]): every node's type is what [`infer_type`] gives
/// for its operands; each node's operand positions are exactly `0..arity`; there are no
/// cycles.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    g: StableDiGraph<Node, usize>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a leaf (input, parameter, constant, full, iota) of type `ty`.
    pub fn add_leaf(&mut self, op: Op, ty: TensorType) -> Result<NodeId> {
        check_leaf(&op, &ty)?;
        Ok(self.push(Node { op, ty, name: None }, &[]))
    }

    /// Adds `op(operands...)`, inferring and checking its type.
    pub fn add_op(&mut self, op: Op, operands: &[NodeId]) -> Result<NodeId> {
        for &o in operands {
            self.check(o)?;
        }
        let tys: Vec<&TensorType> = operands.iter().map(|&o| &self.g[o.nx()].ty).collect();
        let ty = infer_type(&op, &tys)?;
        Ok(self.push(Node { op, ty, name: None }, operands))
    }

    fn push(&mut self, node: Node, operands: &[NodeId]) -> NodeId {
        let id = self.g.add_node(node);
        for (pos, &o) in operands.iter().enumerate() {
            self.g.add_edge(o.nx(), id, pos);
        }
        NodeId(id.index() as u32)
    }

    /// Errors unless `id` names a node of this graph.
    pub fn check(&self, id: NodeId) -> Result<()> {
        if self.g.contains_node(id.nx()) {
            Ok(())
        } else {
            Err(IrError::UnknownNode(id.index()))
        }
    }

    /// Whether `id` names a node.
    pub fn contains(&self, id: NodeId) -> bool {
        self.g.contains_node(id.nx())
    }

    /// The node `id`. Panics if `id` is not in the graph (ids come from this graph).
    pub fn node(&self, id: NodeId) -> &Node {
        &self.g[id.nx()]
    }

    /// Mutable access to a node's op and name. Changing the op must keep its type valid.
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.g[id.nx()]
    }

    /// The type of node `id`.
    pub fn ty(&self, id: NodeId) -> &TensorType {
        &self.g[id.nx()].ty
    }

    /// Sets a node's debug name.
    pub fn set_name(&mut self, id: NodeId, name: impl Into<String>) {
        self.g[id.nx()].name = Some(name.into());
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.g.node_count()
    }

    /// Whether the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.g.node_count() == 0
    }

    /// Every node id, in increasing index order.
    pub fn node_ids(&self) -> Vec<NodeId> {
        let mut ids: Vec<NodeId> = self.g.node_indices().map(|i| NodeId(i.index() as u32)).collect();
        ids.sort();
        ids
    }

    /// The operands of `id`, in operand order.
    pub fn operands(&self, id: NodeId) -> Vec<NodeId> {
        let mut edges: Vec<(usize, NodeId)> = self
            .g
            .edges_directed(id.nx(), Direction::Incoming)
            .map(|e| (*e.weight(), NodeId(e.source().index() as u32)))
            .collect();
        edges.sort();
        edges.into_iter().map(|(_, n)| n).collect()
    }

    /// The distinct users of `id`, sorted by id.
    pub fn users(&self, id: NodeId) -> Vec<NodeId> {
        let set: BTreeSet<NodeId> =
            self.g.edges_directed(id.nx(), Direction::Outgoing).map(|e| NodeId(e.target().index() as u32)).collect();
        set.into_iter().collect()
    }

    /// Replaces every use of `old` as an operand by `new` (which must have the same type).
    pub fn replace_uses(&mut self, old: NodeId, new: NodeId) {
        let uses: Vec<(NodeIndex, usize, petgraph::stable_graph::EdgeIndex)> =
            self.g.edges_directed(old.nx(), Direction::Outgoing).map(|e| (e.target(), *e.weight(), e.id())).collect();
        for (target, pos, edge) in uses {
            self.g.remove_edge(edge);
            self.g.add_edge(new.nx(), target, pos);
        }
    }

    /// Replaces node `old` by `new` (of the same type) everywhere in the graph: `new` takes
    /// `old`'s name and every use of it, and `old` is removed.
    pub fn substitute(&mut self, old: NodeId, new: NodeId) {
        if let Some(name) = self.node(old).name.clone() {
            self.set_name(new, name);
        }
        self.replace_uses(old, new);
        self.remove(old);
    }

    /// Removes a node and its edges.
    pub fn remove(&mut self, id: NodeId) {
        self.g.remove_node(id.nx());
    }

    /// A topological order, deterministic: among ready nodes the smallest id goes first.
    /// Errors with [`IrError::Verify`] on a cycle.
    pub fn topo_order(&self) -> Result<Vec<NodeId>> {
        let ids = self.node_ids();
        let mut pending: std::collections::HashMap<NodeId, usize> =
            ids.iter().map(|&id| (id, self.g.edges_directed(id.nx(), Direction::Incoming).count())).collect();
        let mut ready: BTreeSet<NodeId> = ids.iter().copied().filter(|id| pending[id] == 0).collect();
        let mut order = Vec::with_capacity(ids.len());
        while let Some(id) = ready.pop_first() {
            order.push(id);
            for e in self.g.edges_directed(id.nx(), Direction::Outgoing) {
                let t = NodeId(e.target().index() as u32);
                let c = pending.get_mut(&t).expect("edge targets are nodes");
                *c -= 1;
                if *c == 0 {
                    ready.insert(t);
                }
            }
        }
        if order.len() != ids.len() {
            let stuck = ids.iter().find(|id| !order.contains(id)).map_or(0, |id| id.index());
            return Err(IrError::Verify { node: stuck, detail: "the graph has a cycle".into() });
        }
        Ok(order)
    }

    /// Nodes that `outputs` depend on (including themselves), in topological order.
    pub fn reachable(&self, outputs: &[NodeId]) -> Result<Vec<NodeId>> {
        let mut live = BTreeSet::new();
        let mut stack: Vec<NodeId> = outputs.to_vec();
        while let Some(id) = stack.pop() {
            self.check(id)?;
            if live.insert(id) {
                stack.extend(self.operands(id));
            }
        }
        Ok(self.topo_order()?.into_iter().filter(|id| live.contains(id)).collect())
    }

    /// Raw petgraph access for read-only algorithms inside this crate's passes.
    pub fn petgraph(&self) -> &StableDiGraph<Node, usize> {
        &self.g
    }
}
