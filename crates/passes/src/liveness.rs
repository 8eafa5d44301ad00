//! Liveness of values over a kernel schedule: when each arena value is produced and last
//! used, and the peak of live bytes (the lower bound of any buffer assignment).
//!
//! A value is normally produced by one kernel. After rematerialization a copy of a kernel may
//! write the same value again later; [`intervals_multi`] then gives the value one live range
//! per production, and [`intervals`] their hull.

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
///
/// One interval per value: where a value is produced more than once (rematerialization) this
/// is the hull of its live ranges; [`intervals_multi`] gives each range.
pub fn intervals(g: &Graph, kernels: &[Kernel], outputs: &[NodeId]) -> BTreeMap<NodeId, Interval> {
    let last = kernels.len().saturating_sub(1);
    let mut map: BTreeMap<NodeId, Interval> = BTreeMap::new();
    let bytes = |id: NodeId| value_bytes(g, id);
    let arena = |id: NodeId| is_arena(g, id);
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

/// Live intervals of every arena value when a value may be produced more than once (a
/// rematerialized value is written again by a copy of its kernel): one interval per
/// production, from the producing step to the last use before the next production (the
/// production step itself when nothing reads it in between). An input's first interval
/// starts at 0; a graph output's last interval ends at the last step. Intervals of one value
/// are in step order and disjoint. With one production per value this is [`intervals`] with
/// one-element lists.
pub fn intervals_multi(g: &Graph, kernels: &[Kernel], outputs: &[NodeId]) -> BTreeMap<NodeId, Vec<Interval>> {
    let last = kernels.len().saturating_sub(1);
    let mut map: BTreeMap<NodeId, Vec<Interval>> = BTreeMap::new();
    for (step, k) in kernels.iter().enumerate() {
        // A kernel reads its inputs before it writes its outputs.
        for &i in &k.inputs {
            if is_arena(g, i) {
                let list = map.entry(i).or_default();
                match list.last_mut() {
                    Some(iv) => iv.end = iv.end.max(step),
                    None => list.push(Interval { start: 0, end: step, bytes: value_bytes(g, i) }),
                }
            }
        }
        for &o in &k.outputs {
            map.entry(o).or_default().push(Interval { start: step, end: step, bytes: value_bytes(g, o) });
        }
    }
    for &o in outputs {
        if is_arena(g, o) {
            let list = map.entry(o).or_default();
            match list.last_mut() {
                Some(iv) => iv.end = last,
                None => list.push(Interval { start: 0, end: last, bytes: value_bytes(g, o) }),
            }
        }
    }
    map
}

/// Bytes live at each step (index = step) for intervals from [`intervals_multi`].
pub fn live_bytes_per_step(intervals: &BTreeMap<NodeId, Vec<Interval>>) -> Vec<u64> {
    let steps = intervals.values().flatten().map(|i| i.end + 1).max().unwrap_or(0);
    let mut delta = vec![0i64; steps + 1];
    for i in intervals.values().flatten() {
        delta[i.start] += i.bytes as i64;
        delta[i.end + 1] -= i.bytes as i64;
    }
    let mut cur = 0i64;
    let mut out = Vec::with_capacity(steps);
    for d in &delta[..steps] {
        cur += d;
        out.push(cur.max(0) as u64);
    }
    out
}

/// The peak of live bytes for intervals from [`intervals_multi`], and the first step where it
/// occurs (`(0, 0)` when nothing is live).
pub fn peak_live_multi(intervals: &BTreeMap<NodeId, Vec<Interval>>) -> (u64, usize) {
    let per_step = live_bytes_per_step(intervals);
    let mut best = (0u64, 0usize);
    for (step, &b) in per_step.iter().enumerate() {
        if b > best.0 {
            best = (b, step);
        }
    }
    best
}

/// Whether a value lives in the arena: inputs and everything kernels compute (parameters and
/// constants live in the persistent region).
pub fn is_arena(g: &Graph, id: NodeId) -> bool {
    let op = &g.node(id).op;
    !is_memory_leaf(op) || matches!(op, Op::Input { .. })
}

/// Bytes a value occupies in memory: whole 4-byte words, at least one.
pub fn value_bytes(g: &Graph, id: NodeId) -> u64 {
    (g.ty(id).buffer_bytes() as u64).max(4)
}
