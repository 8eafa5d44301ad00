//! Liveness of values over a kernel schedule: when each arena value is produced and last
//! used, and the peak of live bytes (the lower bound of any buffer assignment).

use crate::kernel::{is_memory_leaf, Kernel};
use fusegraph_ir::{Graph, NodeId, Op};
use std::collections::BTreeMap;

/// The live interval of one arena value, in kernel steps: produced at step `start` (0 for
/// inputs, which are written before the first kernel) and last read at step `end`
/// (inclusive; `usize::MAX`-free: graph outputs live to the last step).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    /// First step the value occupies memory.
    pub start: usize,
    /// Last step the value occupies memory.
    pub end: usize,
    /// Bytes (whole words).
    pub bytes: u64,
}

/// Live intervals of every arena value (inputs and kernel outputs; parameters and constants
/// live in the persistent region and are not included) for `kernels` run in order.
pub fn intervals(g: &Graph, kernels: &[Kernel], outputs: &[NodeId]) -> BTreeMap<NodeId, Interval> {
    let last = kernels.len().saturating_sub(1);
    let mut map: BTreeMap<NodeId, Interval> = BTreeMap::new();
    let bytes = |id: NodeId| (g.ty(id).buffer_bytes() as u64).max(4);
    let arena = |id: NodeId| !is_memory_leaf(&g.node(id).op) || matches!(g.node(id).op, Op::Input { .. });
    for (step, k) in kernels.iter().enumerate() {
        for &o in &k.outputs {
            map.entry(o).or_insert(Interval { start: step, end: step, bytes: bytes(o) });
        }
        for &i in &k.inputs {
            if arena(i) {
                let e = map.entry(i).or_insert(Interval { start: 0, end: step, bytes: bytes(i) });
                e.end = e.end.max(step);
            }
        }
    }
    for &o in outputs {
        if arena(o) {
            let e = map.entry(o).or_insert(Interval { start: 0, end: last, bytes: bytes(o) });
            e.end = last;
        }
    }
    map
}

/// The peak over steps of the bytes of values live at that step.
pub fn peak_live_bytes(intervals: &BTreeMap<NodeId, Interval>) -> u64 {
    let steps = intervals.values().map(|i| i.end + 1).max().unwrap_or(0);
    let mut delta = vec![0i64; steps + 1];
    for i in intervals.values() {
        delta[i.start] += i.bytes as i64;
        delta[i.end + 1] -= i.bytes as i64;
    }
    let (mut cur, mut peak) = (0i64, 0i64);
    for d in delta {
        cur += d;
        peak = peak.max(cur);
    }
    peak as u64
}
