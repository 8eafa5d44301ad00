//! DOT export: draws a graph for Graphviz, optionally grouping nodes into clusters (for
//! example the member nodes of each fused kernel).

use crate::{Graph, NodeId, Op};
use std::collections::HashMap;
use std::fmt::Write;

/// Renders `g` as a Graphviz `digraph`, deterministically.
///
/// Nodes are numbered as in [`crate::text::print`] (topological order) and named `nN` in the
/// DOT source; each is labelled `%N op`, its type and, if it has one, its name (an input's or
/// parameter's feed name when it has no debug name). Edges run operand → user and are
/// labelled with the operand position when the user has more than one operand.
///
/// Entry `K` of `clusters` becomes `subgraph cluster_K { label="kernel K"; … }` holding those
/// nodes. A node listed in several clusters is drawn in the first; ids not in the graph are
/// skipped; nodes in no cluster stay at top level.
pub fn to_dot(g: &Graph, clusters: &[Vec<NodeId>]) -> String {
    let order = g.topo_order().unwrap_or_else(|_| g.node_ids());
    let num: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let mut cluster_of: HashMap<NodeId, usize> = HashMap::new();
    for (k, members) in clusters.iter().enumerate() {
        for id in members.iter().filter(|id| num.contains_key(id)) {
            cluster_of.entry(*id).or_insert(k);
        }
    }
    let node_line = |id: NodeId| {
        let node = g.node(id);
        let mut label = format!("%{} {}\\n{}", num[&id], node.op.name(), node.ty);
        let name = match (&node.name, &node.op) {
            (Some(n), _) | (None, Op::Input { name: n } | Op::Parameter { name: n }) => Some(n),
            _ => None,
        };
        if let Some(name) = name {
            let _ = write!(label, "\\n{}", escape(name));
        }
        format!("n{} [label=\"{label}\"];", num[&id])
    };

    let mut out = String::from("digraph fusegraph {\n  node [shape=box, fontname=\"monospace\"];\n");
    for k in 0..clusters.len() {
        let _ = writeln!(out, "  subgraph cluster_{k} {{\n    label=\"kernel {k}\";\n    style=rounded;");
        for &id in order.iter().filter(|id| cluster_of.get(id) == Some(&k)) {
            let _ = writeln!(out, "    {}", node_line(id));
        }
        out.push_str("  }\n");
    }
    for &id in order.iter().filter(|id| !cluster_of.contains_key(id)) {
        let _ = writeln!(out, "  {}", node_line(id));
    }
    for &id in &order {
        let operands = g.operands(id);
        for (pos, o) in operands.iter().enumerate() {
            let _ = write!(out, "  n{} -> n{}", num[o], num[&id]);
            if operands.len() > 1 {
                let _ = write!(out, " [label=\"{pos}\"]");
            }
            out.push_str(";\n");
        }
    }
    out.push_str("}\n");
    out
}

/// Escapes a string for a double-quoted DOT label: `"` and `\` are escaped, line breaks become
/// `\n`, other control characters become spaces.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, GraphBuilder};

    #[test]
    fn draws_nodes_clusters_and_edges() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [2, 3]).unwrap();
        let e = x.exp().unwrap().named("say \"hi\"");
        let m = e.mul(&x).unwrap();
        let s = m.sum(&[1], false).unwrap();
        x.mul(&x).unwrap();
        let g = b.graph();
        let dot = to_dot(&g, &[vec![e.id(), m.id(), s.id()]]);
        assert_eq!(dot, to_dot(&g, &[vec![e.id(), m.id(), s.id()]]), "deterministic");
        assert!(dot.starts_with("digraph fusegraph {\n"), "{dot}");
        assert!(dot.ends_with("}\n"), "{dot}");
        assert!(dot.contains("subgraph cluster_0 {\n    label=\"kernel 0\";"), "{dot}");

        // Cluster members are inside the cluster block, the rest at top level.
        let start = dot.find("subgraph cluster_0").unwrap();
        let end = start + dot[start..].find("\n  }\n").unwrap();
        let cluster = &dot[start..end];
        assert!(cluster.contains("    n1 [label=\"%1 exp\\nf32[2,3]\\nsay \\\"hi\\\"\"];"), "{dot}");
        assert!(cluster.contains("%2 mul") && cluster.contains("%3 reduce"), "{dot}");
        assert!(!cluster.contains("%0 input") && !cluster.contains("%4 mul"), "{dot}");
        assert!(dot.contains("\n  n0 [label=\"%0 input\\nf32[2,3]\\nx\"];\n"), "{dot}");
        assert!(dot.contains("\n  n4 [label=\"%4 mul\\nf32[2,3]\"];\n"), "{dot}");

        // One line per edge, positions labelled only for multi-operand users.
        let edges: usize = g.node_ids().iter().map(|&id| g.operands(id).len()).sum();
        assert_eq!(edges, 6);
        assert_eq!(dot.lines().filter(|l| l.contains("->")).count(), edges, "{dot}");
        for line in ["n0 -> n1;", "n1 -> n2 [label=\"0\"];", "n0 -> n2 [label=\"1\"];", "n2 -> n3;"] {
            assert!(dot.lines().any(|l| l.trim() == line), "missing {line} in\n{dot}");
        }
        assert!(dot.contains("n0 -> n4 [label=\"0\"];\n  n0 -> n4 [label=\"1\"];"), "{dot}");
    }

    #[test]
    fn no_clusters_and_empty_graph() {
        let dot = to_dot(&Graph::new(), &[]);
        assert_eq!(dot, "digraph fusegraph {\n  node [shape=box, fontname=\"monospace\"];\n}\n");
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [2]).unwrap();
        let dot = to_dot(&b.graph(), &[vec![], vec![x.id(), x.id()], vec![x.id()]]);
        assert_eq!(dot.matches("subgraph cluster_").count(), 3);
        assert_eq!(dot.matches("n0 [label=").count(), 1, "{dot}");
        assert!(dot.contains("label=\"kernel 1\";\n    style=rounded;\n    n0 [label="), "{dot}");
    }
}
