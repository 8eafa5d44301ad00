//! The fusion pass's peak of live bytes, kept up to date as kernels change instead of swept
//! from scratch per decision (a training step's fusion asks thousands of times).
//!
//! [`super::Ctx::order`] runs kernels by Kahn's algorithm, the ready kernel with the
//! earliest *root* (`Summary::root`: its last member's position in graph order, the
//! updates' arithmetic moved up) first. Mostly that is root order: each kernel's inputs are
//! stored by kernels with earlier roots. A kernel that reads a value first stored by a
//! kernel with a later root (sibling merges make these) *waits*: it runs right after the
//! kernel that releases it, before any later root, in a *block* with the other kernels that
//! one releases. So every kernel has a *slot*: `root · SLOTS` if it runs in root order,
//! `t · SLOTS + j` if it waits for the block of the kernel with root `t`, as the `j`th of that
//! block. Each value's live range is an interval of slots, from its first producer (0 for a
//! leaf) to its last reader (the end for a graph output), and the peak over kernel steps is
//! the largest sum of live bytes over all slots (a slot without a kernel holds a subset of
//! what the next kernel's slot holds). Those sums sit in a segment tree (range add, global
//! max): a change costs the ranges of the values it touches, and the waiting kernels are
//! found from the values read before they are stored. Where two kernels share a root, a
//! block outgrows its slots, or kernels wait on each other (no valid grouping does),
//! [`LivePeak::peak`] says so and the caller sweeps.

use super::Summary;
use fusegraph_ir::NodeId;
use std::collections::{BTreeMap, BTreeSet};

/// Slots per graph position: a kernel in root order and up to `SLOTS - 1` kernels waiting
/// for it (a training step's largest block holds 13).
const SLOTS: usize = 16;

/// What liveness needs of one value, by node index.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ValueInfo {
    /// Bytes it occupies while live.
    pub bytes: u64,
    /// An arena value (its readers keep it alive).
    pub arena: bool,
    /// Counted toward the peak (not a constant-like value, or a graph output).
    pub counted: bool,
    /// A graph output (live to the end when it is an arena value).
    pub output: bool,
    /// A memory leaf (parameter, input, constant): never produced by a kernel.
    pub leaf: bool,
    /// A parameter update ([`super::fuse_updating`]): written over its parameter, so not
    /// `counted`, unless the kernel storing it reduces (a row kernel writes no update in
    /// place: the memory planner gives it arena bytes then).
    pub update: bool,
}

/// Kernels as liveness sees them, with each value's live range in a segment tree.
pub(super) struct LivePeak {
    /// The summary each group has in the tree.
    applied: Vec<Option<Summary>>,
    /// The kernels storing each value, as sorted `(root, group)`.
    producers: Vec<Vec<(usize, usize)>>,
    /// The kernels reading each value, as sorted `(root, group)`.
    readers: Vec<Vec<(usize, usize)>>,
    /// The waiting kernels reading each value, as `(slot, group)`.
    waiting_readers: Vec<Vec<(usize, usize)>>,
    /// Each value's range (slots) and bytes as added to the tree.
    range: Vec<Option<(usize, usize, u64)>>,
    /// Values read, in root order, before any kernel stores them.
    early: Vec<bool>,
    early_values: BTreeSet<NodeId>,
    /// Kernels per root position, the exclusive or of their groups (so the group where
    /// there is one), and the positions holding more than one.
    per_root: Vec<u32>,
    at_root: Vec<usize>,
    shared_roots: usize,
    /// The waiting kernels and their slots.
    waiting: BTreeMap<usize, usize>,
    /// Values whose range may have changed since the last [`LivePeak::peak`].
    touched: Vec<NodeId>,
    is_touched: Vec<bool>,
    tree: MaxTree,
}

impl LivePeak {
    /// An empty plan over `positions` graph positions, `values` node indices and `groups`,
    /// whose graph `outputs` are live to the end whether or not a kernel touches them (an
    /// input returned as it is).
    pub fn new(positions: usize, values: usize, groups: usize, outputs: &[NodeId]) -> LivePeak {
        let mut live = LivePeak {
            applied: vec![None; groups],
            producers: vec![Vec::new(); values],
            readers: vec![Vec::new(); values],
            waiting_readers: vec![Vec::new(); values],
            range: vec![None; values],
            early: vec![false; values],
            early_values: BTreeSet::new(),
            per_root: vec![0; positions],
            at_root: vec![0; positions],
            shared_roots: 0,
            waiting: BTreeMap::new(),
            touched: Vec::new(),
            is_touched: vec![false; values],
            tree: MaxTree::new(positions * SLOTS),
        };
        for &o in outputs {
            live.touch(o);
        }
        live
    }

    /// Makes group `gi`'s kernel `new` (`None`: the group is empty).
    pub fn set(&mut self, gi: usize, new: Option<&Summary>) {
        if self.applied[gi].as_ref() == new {
            return;
        }
        if let Some(old) = self.applied[gi].take() {
            self.set_slot(gi, &old, None);
            self.place(gi, &old, false);
        }
        if let Some(new) = new {
            self.place(gi, new, true);
            self.applied[gi] = Some(new.clone());
        }
    }

    fn touch(&mut self, v: NodeId) {
        if !self.is_touched[v.index()] {
            self.is_touched[v.index()] = true;
            self.touched.push(v);
        }
    }

    /// Adds (or with `add` false, removes) kernel `s` of group `gi`, in root order.
    fn place(&mut self, gi: usize, s: &Summary, add: bool) {
        let key = (s.root, gi);
        let count = &mut self.per_root[s.root];
        self.at_root[s.root] ^= gi;
        if add {
            *count += 1;
            self.shared_roots += usize::from(*count == 2);
        } else {
            self.shared_roots -= usize::from(*count == 2);
            *count -= 1;
        }
        for (list, vs) in [(&mut self.producers, &s.outputs), (&mut self.readers, &s.inputs)] {
            for v in vs {
                let l = &mut list[v.index()];
                match (l.binary_search(&key), add) {
                    (Err(at), true) => l.insert(at, key),
                    (Ok(at), false) => {
                        l.remove(at);
                    }
                    _ => unreachable!("kernel {gi} placed twice or removed unplaced"),
                }
            }
        }
        for v in s.outputs.iter().chain(&s.inputs) {
            self.touch(*v);
        }
    }

    /// Moves kernel `s` of group `gi` to waiting slot `slot` (`None`: back to root order).
    fn set_slot(&mut self, gi: usize, s: &Summary, slot: Option<usize>) {
        if let Some(old) = self.waiting.remove(&gi) {
            for v in &s.inputs {
                self.waiting_readers[v.index()].retain(|&e| e != (old, gi));
            }
        }
        if let Some(slot) = slot {
            self.waiting.insert(gi, slot);
            for v in &s.inputs {
                self.waiting_readers[v.index()].push((slot, gi));
            }
        }
        for v in s.outputs.iter().chain(&s.inputs) {
            self.touch(*v);
        }
    }

    /// The slot of group `gi`, with root `root`.
    fn slot(&self, gi: usize, root: usize) -> usize {
        self.waiting.get(&gi).copied().unwrap_or(root * SLOTS)
    }

    /// The peak of live bytes of the kernels set, run in [`super::Ctx::order`]; `None` when
    /// two kernels share a root, a block outgrows its slots, or kernels wait on each other.
    pub fn peak(&mut self, info: &[ValueInfo]) -> Option<u64> {
        for &v in &self.touched {
            let i = v.index();
            let (ps, rs) = (&self.producers[i], &self.readers[i]);
            let early = !info[i].leaf && rs.first().is_some_and(|r| ps.first().is_none_or(|p| p >= r));
            if early != self.early[i] {
                self.early[i] = early;
                if early {
                    self.early_values.insert(v);
                } else {
                    self.early_values.remove(&v);
                }
            }
        }
        let placed = (self.shared_roots == 0).then(|| self.waiting_slots(info)).flatten();
        if let Some(new) = &placed {
            let moved: Vec<usize> = self
                .waiting
                .iter()
                .filter(|&(gi, s)| new.get(gi) != Some(s))
                .map(|(&gi, _)| gi)
                .chain(new.iter().filter(|&(gi, s)| self.waiting.get(gi) != Some(s)).map(|(&gi, _)| gi))
                .collect();
            for gi in moved {
                let s = self.applied[gi].take().expect("a waiting kernel is placed");
                self.set_slot(gi, &s, new.get(&gi).copied());
                self.applied[gi] = Some(s);
            }
        }
        let last = (self.per_root.len() * SLOTS).saturating_sub(1);
        for v in std::mem::take(&mut self.touched) {
            let i = v.index();
            self.is_touched[i] = false;
            let x = info[i];
            let (ps, rs) = (&self.producers[i], &self.readers[i]);
            let read = x.arena && !rs.is_empty();
            let kept = x.arena && x.output;
            let counted =
                x.counted || (x.update && ps.iter().any(|&(_, p)| self.applied[p].as_ref().is_some_and(|s| s.reduces)));
            let range = (counted && (!ps.is_empty() || read || kept)).then(|| {
                let start = ps.iter().map(|&(r, p)| self.slot(p, r)).min().unwrap_or(0);
                let mut end = start;
                if read {
                    let &(r, k) = rs.last().expect("read");
                    end = end.max(self.slot(k, r));
                    end = end.max(self.waiting_readers[i].iter().map(|e| e.0).max().unwrap_or(0));
                }
                if kept {
                    end = last;
                }
                (start, end, x.bytes)
            });
            if range != self.range[i] {
                if let Some((s, e, b)) = self.range[i] {
                    self.tree.add(s, e, -(b as i64));
                }
                if let Some((s, e, b)) = range {
                    self.tree.add(s, e, b as i64);
                }
                self.range[i] = range;
            }
        }
        placed.map(|_| self.tree.max().max(0) as u64)
    }

    /// The waiting kernels' slots: which kernels wait, for which block (from the values read
    /// before they are stored in root order, then the readers of what waiting kernels
    /// store), and their order within each block (Kahn's, the earliest root first among the
    /// ready). `None` where the slots cannot say it (see [`LivePeak::peak`]).
    fn waiting_slots(&self, info: &[ValueInfo]) -> Option<BTreeMap<usize, usize>> {
        let root = |gi: usize| self.applied[gi].as_ref().expect("placed").root;
        // The block each waiting kernel runs in (the root of the kernel releasing it).
        let mut block: BTreeMap<usize, usize> = BTreeMap::new();
        let t_of = |block: &BTreeMap<usize, usize>, gi: usize| block.get(&gi).copied().unwrap_or_else(|| root(gi));
        // The block of the first kernel storing `v` (none stores it: it can never be read).
        let first = |block: &BTreeMap<usize, usize>, v: NodeId| -> Option<usize> {
            self.producers[v.index()].iter().map(|&(_, p)| t_of(block, p)).min()
        };
        let mut work: Vec<usize> = Vec::new();
        for &v in &self.early_values {
            let p = first(&block, v)?;
            work.extend(self.readers[v.index()].iter().take_while(|e| e.0 <= p).map(|e| e.1));
        }
        while let Some(k) = work.pop() {
            let s = self.applied[k].as_ref().expect("placed");
            let mut need = 0;
            for &u in s.inputs.iter().filter(|u| !info[u.index()].leaf) {
                need = need.max(first(&block, u)?);
            }
            let t = t_of(&block, k);
            // A kernel in root order reading what its own block stores waits on itself.
            if need == s.root && t == s.root {
                return None;
            }
            if need <= t {
                continue;
            }
            block.insert(k, need);
            for &o in &s.outputs {
                let p = first(&block, o)?;
                for &(r, j) in self.readers[o.index()].iter().take_while(|e| e.0 <= p) {
                    if t_of(&block, j) < p || r == p {
                        work.push(j);
                    }
                }
            }
        }
        // Within each block: its releasing kernel first, then Kahn's order.
        let mut members: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (&k, &t) in &block {
            members.entry(t).or_default().push(k);
        }
        let mut slots = BTreeMap::new();
        for (t, mut left) in members {
            let head = self.at_root[t];
            if self.per_root[t] != 1 || block.contains_key(&head) || left.len() >= SLOTS {
                return None;
            }
            left.sort_by_key(|&k| root(k));
            let mut taken = BTreeSet::from([head]);
            for j in 1..=left.len() {
                // An input is there once a kernel storing it ran: in an earlier block, or in
                // this one already.
                let ready = |k: usize| {
                    let s = self.applied[k].as_ref().expect("placed");
                    s.inputs.iter().filter(|u| !info[u.index()].leaf).all(|u| {
                        self.producers[u.index()].iter().any(|&(_, p)| t_of(&block, p) < t || taken.contains(&p))
                    })
                };
                let at = left.iter().position(|&k| ready(k))?;
                let k = left.remove(at);
                taken.insert(k);
                slots.insert(k, t * SLOTS + j);
            }
        }
        Some(slots)
    }
}

/// Range add and global maximum over `0..n` (each node holds what was added to all of its
/// range, plus the largest sum below it).
struct MaxTree {
    size: usize,
    add: Vec<i64>,
    max: Vec<i64>,
}

impl MaxTree {
    fn new(n: usize) -> MaxTree {
        let size = n.max(1).next_power_of_two();
        MaxTree { size, add: vec![0; 2 * size], max: vec![0; 2 * size] }
    }

    /// Adds `d` at positions `lo..=hi`.
    fn add(&mut self, lo: usize, hi: usize, d: i64) {
        self.add_at(1, 0, self.size - 1, lo, hi, d);
    }

    fn add_at(&mut self, node: usize, l: usize, r: usize, lo: usize, hi: usize, d: i64) {
        if hi < l || r < lo {
            return;
        }
        if lo <= l && r <= hi {
            self.add[node] += d;
            self.max[node] += d;
            return;
        }
        let mid = (l + r) / 2;
        self.add_at(2 * node, l, mid, lo, hi, d);
        self.add_at(2 * node + 1, mid + 1, r, lo, hi, d);
        self.max[node] = self.add[node] + self.max[2 * node].max(self.max[2 * node + 1]);
    }

    fn max(&self) -> i64 {
        self.max[1]
    }
}

#[cfg(test)]
mod tests {
    use super::MaxTree;

    #[test]
    fn max_tree_agrees_with_an_array() {
        // A fixed pseudo-random sequence of range adds, checked against a plain array.
        let n = 37;
        let mut t = MaxTree::new(n);
        let mut a = vec![0i64; n];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (l, r) = ((x % n as u64) as usize, ((x >> 20) % n as u64) as usize);
            let (lo, hi) = (l.min(r), l.max(r));
            let d = ((x >> 40) % 200) as i64 - 90;
            t.add(lo, hi, d);
            for v in &mut a[lo..=hi] {
                *v += d;
            }
            // The padding past `n` holds 0, so compare against the array's max with 0.
            assert_eq!(t.max(), a.iter().copied().max().unwrap().max(0));
        }
    }
}
