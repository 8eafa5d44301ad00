//! Rematerialization by folding: a cheap wide value read again at the end of the graph is
//! recomputed inside the kernel that reads it, instead of being kept in memory across the
//! narrow middle.

use fusegraph_ir::{DType, GraphBuilder};
use fusegraph_passes::{plan_graph, PlanOptions};

#[test]
fn a_residual_branch_is_recomputed_inside_its_late_consumer() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [64, 1024]).unwrap();
    let s = x.gelu().unwrap();
    let w = |n: &str, a: usize, c: usize| b.parameter(n, DType::F32, [a, c]).unwrap();
    // Narrow, wide again in the middle (where memory peaks), narrow, then back to the width
    // of the residual sum.
    let h = s.matmul(&w("w1", 1024, 64)).unwrap().relu().unwrap();
    let m = h.matmul(&w("w2", 64, 1024)).unwrap().relu().unwrap();
    let h2 = m.matmul(&w("w3", 1024, 64)).unwrap().relu().unwrap();
    let y = x.add(&s).unwrap().add(&h2.matmul(&w("w4", 64, 1024)).unwrap()).unwrap();
    let (g, outs) = (b.graph(), vec![y.id()]);
    let plain = plan_graph(&g, &outs, &PlanOptions::default()).unwrap();
    let budget = plain.plan.arena_bytes - 1;
    let remat = plan_graph(&g, &outs, &PlanOptions { remat_budget: Some(budget), ..Default::default() }).unwrap();
    eprintln!("arena {} -> {}", plain.plan.arena_bytes, remat.plan.arena_bytes);
    assert!(remat.plan.arena_bytes <= budget, "{} > {budget}", remat.plan.arena_bytes);
    // The gelu now also lives in the last kernel.
    let gelu_members = remat.kernels.iter().filter(|k| k.members.iter().any(|&m| g.node(m).op.name() == "erf")).count();
    assert_eq!(gelu_members, 2);
}
