//! Hoisting the kernels that compute from parameters alone out of every run, device-free:
//! which kernels lead the schedule, and that the memory plan keeps what they leave for later
//! kernels out of every other value's bytes.

use fusegraph_ir::{DType, Graph, GraphBuilder, NodeId};
use fusegraph_passes::testing::scaled_matmul as scaled;
use fusegraph_passes::{plan_graph, plan_within, PlanOptions, Planned, Region};

fn scaled_matmul(n: usize) -> (Graph, Vec<NodeId>, NodeId) {
    scaled(n).unwrap()
}

fn plan(g: &Graph, outs: &[NodeId], hoist: bool) -> Planned {
    plan_graph(g, outs, &PlanOptions { hoist, ..Default::default() }).unwrap()
}

/// No other arena value shares a byte with `v`.
fn alone(p: &Planned, v: NodeId) -> bool {
    let a = p.plan.locations[&v];
    assert_eq!(a.region, Region::Arena);
    p.plan
        .locations
        .iter()
        .filter(|(&id, l)| id != v && l.region == Region::Arena)
        .all(|(_, l)| l.offset + l.size <= a.offset || a.offset + a.size <= l.offset)
}

#[test]
fn parameter_only_kernels_lead_and_keep_their_bytes() {
    let (g, outs, ws) = scaled_matmul(256);
    let plain = plan(&g, &outs, false);
    assert_eq!(plain.prepared, 0);
    let hoisted = plan(&g, &outs, true);
    assert_eq!(hoisted.prepared, 1, "{:#?}", hoisted.kernels);
    assert_eq!(hoisted.kernels[0].outputs, [ws]);
    assert_eq!(hoisted.kernels.len(), plain.kernels.len());
    // Live through the whole run, so no later kernel of this run or the next writes over it.
    let last = hoisted.kernels.len() - 1;
    assert!(hoisted.plan.intervals[&ws].iter().all(|iv| iv.end == last), "{:?}", hoisted.plan.intervals[&ws]);
    assert!(alone(&hoisted, ws));
    // Without hoisting the weight is dead once the first product has read it, and the peak
    // after it does not hold it.
    assert!(plain.plan.intervals[&ws].iter().all(|iv| iv.end == 1), "{:?}", plain.plan.intervals[&ws]);
    assert_eq!(hoisted.summary.arena_bytes, plain.summary.arena_bytes + 64 * 64 * 4);
    // Only the real outputs are read back.
    assert_eq!(hoisted.summary.staging_bytes, plain.summary.staging_bytes);
}

#[test]
fn kernels_reading_inputs_outputs_or_updated_parameters_stay_in_every_run() {
    let (g, outs, ws) = scaled_matmul(8);
    // The scaled weight as a graph output is read back every run: not hoisted.
    assert_eq!(plan(&g, &[outs[0], ws], true).prepared, 0);
    // A training step that updates `w` changes the scaled weight every run.
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [8, 64]).unwrap();
    let w = b.parameter("w", DType::F32, [64, 64]).unwrap();
    let s = b.parameter("s", DType::F32, [64]).unwrap();
    let ws = w.mul(&s.broadcast_to([64, 64]).unwrap()).unwrap();
    let y = x.matmul(&ws).unwrap().exp().unwrap();
    let w2 = w.mul_scalar(0.9).unwrap();
    let g = b.graph();
    let outs = [y.id(), w2.id()];
    assert_eq!(plan(&g, &outs, true).prepared, 1);
    let updating = PlanOptions { hoist: true, updates: vec![("w".into(), 1)], ..Default::default() };
    assert_eq!(plan_graph(&g, &outs, &updating).unwrap().prepared, 0);
    // Scaling the input instead of the weight reads an input: nothing to hoist.
    let xs = x.mul(&s.broadcast_to([8, 64]).unwrap()).unwrap().matmul(&w).unwrap().exp().unwrap();
    let g = b.graph();
    assert_eq!(plan(&g, &[xs.id()], true).prepared, 0);
}

#[test]
fn hoisting_never_costs_a_plan_its_fit() {
    let (g, outs, _) = scaled_matmul(256);
    let opts = PlanOptions { hoist: true, remat: false, ..Default::default() };
    let plain = plan(&g, &outs, false).summary.total_bytes;
    let hoisted = plan(&g, &outs, true).summary.total_bytes;
    assert!(hoisted > plain, "{hoisted} vs {plain}");
    // A limit between the two: the plan drops hoisting and fits.
    let fit = plan_within(&g, &outs, &opts, Some(plain)).unwrap();
    assert_eq!((fit.prepared, fit.summary.total_bytes), (0, plain));
    // Room for both: hoisted.
    assert_eq!(plan_within(&g, &outs, &opts, Some(hoisted)).unwrap().prepared, 1);
}
