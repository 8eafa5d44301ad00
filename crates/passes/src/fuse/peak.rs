//! The fusion pass's peak of live bytes, kept up to date as kernels change instead of swept
//! from scratch per decision (a training step's fusion asks thousands of times).
//!
//! Kernels are placed at their *root* (the graph position of their last member). While that
//! order is a valid execution order — every value a kernel reads is stored by a kernel with
//! an earlier root, or is a memory leaf — and no two kernels share a root, the kernels run in
//! root order ([`super::Ctx::order`] picks it then), and each value's live range is an
//! interval of positions: from its first producer (position 0 for a leaf) to its last
//! reader (the end for a graph output). The peak over kernel steps is then the largest sum
//! of live bytes over all positions: a position without a kernel holds a subset of what
//! the next kernel's position holds. Those sums sit in a segment tree (range add, global
//! max), so a change costs its values' ranges, not the plan. When the order is not root
//! order, [`LivePeak::peak`] says so and the caller sweeps.

use super::Summary;
use fusegraph_ir::NodeId;

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
}

/// Kernels as liveness sees them, with each value's live range in a segment tree.
pub(super) struct LivePeak {
    /// The summary each group has in the tree.
    applied: Vec<Option<Summary>>,
    /// The kernels storing each value, as sorted `(root, group)`.
    producers: Vec<Vec<(usize, usize)>>,
    /// The kernels reading each value, as sorted `(root, group)`.
    readers: Vec<Vec<(usize, usize)>>,
    /// Each value's range and bytes as added to the tree.
    range: Vec<Option<(usize, usize, u64)>>,
    /// Values read before any kernel stores them in root order, and their count.
    early: Vec<bool>,
    early_count: usize,
    /// Kernels per root position, and the positions holding more than one.
    per_root: Vec<u32>,
    shared_roots: usize,
    /// Values whose range may have changed since the last [`LivePeak::peak`].
    touched: Vec<NodeId>,
    is_touched: Vec<bool>,
    tree: MaxTree,
}

impl LivePeak {
    /// An empty plan over `positions` graph positions, `values` node indices and `groups`.
    pub fn new(positions: usize, values: usize, groups: usize) -> LivePeak {
        LivePeak {
            applied: vec![None; groups],
            producers: vec![Vec::new(); values],
            readers: vec![Vec::new(); values],
            range: vec![None; values],
            early: vec![false; values],
            early_count: 0,
            per_root: vec![0; positions],
            shared_roots: 0,
            touched: Vec::new(),
            is_touched: vec![false; values],
            tree: MaxTree::new(positions),
        }
    }

    /// Makes group `gi`'s kernel `new` (`None`: the group is empty).
    pub fn set(&mut self, gi: usize, new: Option<&Summary>) {
        if self.applied[gi].as_ref() == new {
            return;
        }
        if let Some(old) = self.applied[gi].take() {
            self.place(gi, &old, false);
        }
        if let Some(new) = new {
            self.place(gi, new, true);
            self.applied[gi] = Some(new.clone());
        }
    }

    /// Adds (or with `add` false, removes) kernel `s` of group `gi`.
    fn place(&mut self, gi: usize, s: &Summary, add: bool) {
        let key = (s.root, gi);
        let count = &mut self.per_root[s.root];
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
                if !self.is_touched[v.index()] {
                    self.is_touched[v.index()] = true;
                    self.touched.push(*v);
                }
            }
        }
    }

    /// The peak of live bytes of the kernels set, run in root order; `None` when root order
    /// is not a valid execution order or two kernels share a root.
    pub fn peak(&mut self, info: &[ValueInfo]) -> Option<u64> {
        let last = self.per_root.len().saturating_sub(1);
        for v in std::mem::take(&mut self.touched) {
            let i = v.index();
            self.is_touched[i] = false;
            let (ps, rs, x) = (&self.producers[i], &self.readers[i], info[i]);
            let early = !x.leaf && rs.first().is_some_and(|r| ps.first().is_none_or(|p| p >= r));
            if early != self.early[i] {
                self.early[i] = early;
                if early {
                    self.early_count += 1;
                } else {
                    self.early_count -= 1;
                }
            }
            let read = x.arena && !rs.is_empty();
            let kept = x.arena && x.output;
            let range = (x.counted && (!ps.is_empty() || read || kept)).then(|| {
                let start = ps.first().map_or(0, |p| p.0);
                let mut end = start;
                if read {
                    end = end.max(rs.last().expect("read").0);
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
        (self.early_count == 0 && self.shared_roots == 0).then(|| self.tree.max().max(0) as u64)
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
