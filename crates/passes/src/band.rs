//! Banded masks: which keys of an attention's logits a mask hides, so that a fused
//! attention kernel can stop walking a row's keys where every remaining logit is masked (as
//! FlashAttention skips the blocks above a causal diagonal).
//!
//! [`key_band`] proves, from the graph alone, that every logit `(…, i, j)` (query `i` along
//! the second-to-last axis, key `j` along the last) with `j > i + offset` equals one constant
//! `masked`: the logits are a `select` with a constant branch, and its condition implies
//! `j ≤ i + offset` wherever it picks the other branch. Conditions it reads, broadcast over
//! batch and head axes:
//! - comparisons (`<`, `≤`, `>`, `≥`, `==`, `!=`) of exact integer functions `a·i + b·j + c`
//!   built from `iota`s by sums, differences, integer multiples and casts (`row ≥ col`,
//!   `col < row + 1`, `col − row ≤ s_k − s_q`, `col < 4`);
//! - `not`, `and`, `or` of those (a causal mask `and` a sliding window: the causal part
//!   bounds it);
//! - constant masks (what constant folding makes of those at short sequences), whatever
//!   their pattern: the bound is the largest `j − i` they keep.
//!
//! Anything else has no band. The bound is an implication, not an equivalence: it may keep
//! masked keys before it, never drop an unmasked one.
//!
//! Whether skipping is exact depends on the values: a masked key adds `exp(masked − m)` to a
//! row's sum (`m` its running max), which is exactly zero in f32 only when `masked` lies far
//! enough below `m` (−10⁹ does for any sane logits; −∞ always does). The kernel checks that
//! at run time and walks the remaining keys when it does not hold.

use fusegraph_ir::{BinaryOp, DType, Graph, NodeId, Op, UnaryOp};

/// Every logit `(…, i, j)` with `j > i + offset` equals `masked` (already rounded to the
/// logits' dtype). A causal mask `j ≤ i` has offset 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KeyBand {
    /// No key past `i + offset` is unmasked for query `i`.
    pub offset: i64,
    /// The value of every masked logit.
    pub masked: f64,
}

/// The band of `logits` (rank ≥ 2: `[…, s_q, s_k]`), if it provably has one (module docs).
pub fn key_band(g: &Graph, logits: NodeId) -> Option<KeyBand> {
    let dims = g.ty(logits).shape.dims();
    let rank = dims.len();
    if rank < 2 || !matches!(g.node(logits).op, Op::Select) {
        return None;
    }
    let cx = Context { sq: dims[rank - 2] as i64, sk: dims[rank - 1] as i64 };
    let mut tags = vec![Tag::Other; rank];
    tags[rank - 2] = Tag::Query;
    tags[rank - 1] = Tag::Key;
    let ops = g.operands(logits);
    let b = cx.bounds(g, ops[0], &tags);
    // Past the bound of the condition being true it is false (the third operand), past the
    // bound of it being false it is true (the second); the tighter constant branch wins.
    let candidates = [(b.when_true, ops[2]), (b.when_false, ops[1])];
    let (offset, value) = candidates
        .into_iter()
        .filter_map(|(o, branch)| Some((o?, constant_value(g, branch)?)))
        .min_by_key(|&(o, _)| o)?;
    // A bound no key passes (every `j ≤ s_k − 1 ≤ i + offset`) is no band.
    (offset < cx.sk - 1).then(|| KeyBand { offset, masked: fusegraph_reference::round_to(g.ty(logits).dtype, value) })
}

/// What an axis of a value indexes, seen from the logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tag {
    /// The query index `i`.
    Query,
    /// The key index `j`.
    Key,
    /// Always 0 (an axis of size 1 broadcast).
    Zero,
    /// A batch or head index.
    Other,
}

/// What a boolean value implies about `(i, j)`: where it is true, `j ≤ i + when_true`; where
/// it is false, `j ≤ i + when_false` (`None`: nothing known).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
struct Bounds {
    when_true: Option<i64>,
    when_false: Option<i64>,
}

/// The tighter of two bounds that each hold (either suffices).
fn either(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    }
}

/// The looser of two bounds of which one holds (both are needed).
fn both(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    Some(a?.max(b?))
}

impl Bounds {
    fn not(self) -> Bounds {
        Bounds { when_true: self.when_false, when_false: self.when_true }
    }
    fn and(self, o: Bounds) -> Bounds {
        Bounds { when_true: either(self.when_true, o.when_true), when_false: both(self.when_false, o.when_false) }
    }
    fn or(self, o: Bounds) -> Bounds {
        Bounds { when_true: both(self.when_true, o.when_true), when_false: either(self.when_false, o.when_false) }
    }
}

/// An integer value `i·i + j·j + c` of the query and key indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Affine {
    i: i64,
    j: i64,
    c: i64,
}

impl Affine {
    fn scaled(self, k: i64) -> Option<Affine> {
        Some(Affine { i: self.i.checked_mul(k)?, j: self.j.checked_mul(k)?, c: self.c.checked_mul(k)? })
    }
    fn plus(self, o: Affine) -> Option<Affine> {
        Some(Affine { i: self.i.checked_add(o.i)?, j: self.j.checked_add(o.j)?, c: self.c.checked_add(o.c)? })
    }
    fn minus(self, o: Affine) -> Option<Affine> {
        self.plus(o.scaled(-1)?)
    }
}

/// The query and key counts.
struct Context {
    sq: i64,
    sk: i64,
}

impl Context {
    /// The tags of `n`'s single operand, a broadcast of it to `n` (tagged `tags`).
    fn operand_tags(g: &Graph, n: NodeId, tags: &[Tag]) -> Option<Vec<Tag>> {
        let Op::Broadcast { dims: map, .. } = &g.node(n).op else { return None };
        let from = g.ty(g.operands(n)[0]).shape.dims();
        let to = g.ty(n).shape.dims();
        Some(map.iter().zip(from).map(|(&r, &d)| if d == 1 && to[r] != 1 { Tag::Zero } else { tags[r] }).collect())
    }

    /// What `d ≥ 0` implies, for an integer `d = a·i + b·j + c`.
    fn at_least_zero(&self, d: Affine) -> Bounds {
        // j ≤ (a·i + c) ≤ i + o for every 0 ≤ i < s_q: o is the larger of the ends.
        let offset = |a: i64, c: i64| -> Option<i64> {
            let last = (a.checked_sub(1)?).checked_mul(self.sq - 1)?.checked_add(c)?;
            Some(c.max(last))
        };
        match d.j {
            // True: j ≤ a·i + c.
            -1 => Bounds { when_true: offset(d.i, d.c), when_false: None },
            // False: j < −a·i − c, so j ≤ −a·i − c − 1.
            1 => Bounds {
                when_true: None,
                when_false: d.i.checked_neg().and_then(|a| offset(a, d.c.checked_neg()?.checked_sub(1)?)),
            },
            _ => Bounds::default(),
        }
    }

    /// What boolean `n` (its axes tagged `tags`) implies about `(i, j)`.
    fn bounds(&self, g: &Graph, n: NodeId, tags: &[Tag]) -> Bounds {
        let ops = g.operands(n);
        let cmp = |a: NodeId, b: NodeId, strict: bool| -> Option<Bounds> {
            // a ≥ b (a > b: a − b − 1 ≥ 0 on integers).
            let d = self.affine(g, a, tags)?.minus(self.affine(g, b, tags)?)?;
            let one = Affine { i: 0, j: 0, c: strict as i64 };
            Some(self.at_least_zero(d.minus(one)?))
        };
        let found = match &g.node(n).op {
            Op::Broadcast { .. } => Self::operand_tags(g, n, tags).map(|t| self.bounds(g, ops[0], &t)),
            Op::Unary(UnaryOp::Not) => Some(self.bounds(g, ops[0], tags).not()),
            Op::Binary(BinaryOp::And) => Some(self.bounds(g, ops[0], tags).and(self.bounds(g, ops[1], tags))),
            Op::Binary(BinaryOp::Or) => Some(self.bounds(g, ops[0], tags).or(self.bounds(g, ops[1], tags))),
            Op::Binary(BinaryOp::Ge) => cmp(ops[0], ops[1], false),
            Op::Binary(BinaryOp::Gt) => cmp(ops[0], ops[1], true),
            Op::Binary(BinaryOp::Le) => cmp(ops[1], ops[0], false),
            Op::Binary(BinaryOp::Lt) => cmp(ops[1], ops[0], true),
            // a == b ⟺ a ≥ b and b ≥ a.
            Op::Binary(op @ (BinaryOp::Eq | BinaryOp::Ne)) => {
                let eq = cmp(ops[0], ops[1], false).and_then(|x| Some(x.and(cmp(ops[1], ops[0], false)?)));
                eq.map(|e| if *op == BinaryOp::Eq { e } else { e.not() })
            }
            Op::Constant { values } if g.ty(n).dtype == DType::Bool => Some(self.constant_bounds(g, n, values, tags)),
            _ => None,
        };
        found.unwrap_or_default()
    }

    /// A constant mask's bounds: the largest `j − i` of its true and of its false elements,
    /// taking the last key where it does not vary along keys and the first query where it
    /// does not vary along queries (so the bound holds for every key and query).
    fn constant_bounds(&self, g: &Graph, n: NodeId, values: &[f64], tags: &[Tag]) -> Bounds {
        let dims = g.ty(n).shape.dims();
        let axis = |t: Tag| tags.iter().position(|&x| x == t);
        let (qa, ka) = (axis(Tag::Query), axis(Tag::Key));
        let (mut when_true, mut when_false) = (None::<i64>, None::<i64>);
        let mut index = vec![0usize; dims.len()];
        for &v in values {
            let j = ka.map_or(self.sk - 1, |a| index[a] as i64);
            let i = qa.map_or(0, |a| index[a] as i64);
            let slot = if v != 0.0 { &mut when_true } else { &mut when_false };
            *slot = Some(slot.map_or(j - i, |o| o.max(j - i)));
            for a in (0..dims.len()).rev() {
                index[a] += 1;
                if index[a] < dims[a] {
                    break;
                }
                index[a] = 0;
            }
        }
        // Never true (or never false): any bound holds; the smallest the kernel can use.
        Bounds { when_true: when_true.or(Some(-self.sq)), when_false: when_false.or(Some(-self.sq)) }
    }

    /// `n` as an exact integer function of `(i, j)`, if it is one: every value it takes over
    /// the logits' indices representable in its dtype (no wrapping, no rounding).
    fn affine(&self, g: &Graph, n: NodeId, tags: &[Tag]) -> Option<Affine> {
        let ops = g.operands(n);
        let a = match &g.node(n).op {
            Op::Iota { axis } => match tags.get(*axis)? {
                Tag::Query => Affine { i: 1, j: 0, c: 0 },
                Tag::Key => Affine { i: 0, j: 1, c: 0 },
                Tag::Zero => Affine { i: 0, j: 0, c: 0 },
                Tag::Other => return None,
            },
            Op::Full { value } if value.fract() == 0.0 && value.abs() < 1e15 => Affine { i: 0, j: 0, c: *value as i64 },
            Op::Broadcast { .. } => self.affine(g, ops[0], &Self::operand_tags(g, n, tags)?)?,
            Op::Cast { .. } if g.ty(ops[0]).dtype != DType::Bool => self.affine(g, ops[0], tags)?,
            Op::Binary(BinaryOp::Add) => self.affine(g, ops[0], tags)?.plus(self.affine(g, ops[1], tags)?)?,
            Op::Binary(BinaryOp::Sub) => self.affine(g, ops[0], tags)?.minus(self.affine(g, ops[1], tags)?)?,
            Op::Binary(BinaryOp::Mul) => {
                let (x, y) = (self.affine(g, ops[0], tags)?, self.affine(g, ops[1], tags)?);
                match (x, y) {
                    (Affine { i: 0, j: 0, c }, o) | (o, Affine { i: 0, j: 0, c }) => o.scaled(c)?,
                    _ => return None,
                }
            }
            _ => return None,
        };
        self.exact_in(g.ty(n).dtype, a).then_some(a)
    }

    /// Whether every value of `a` over `0 ≤ i < s_q`, `0 ≤ j < s_k` is an integer `dtype`
    /// holds exactly.
    fn exact_in(&self, dtype: DType, a: Affine) -> bool {
        let span = |k: i64, n: i64| {
            let end = k.saturating_mul(n - 1);
            (end.min(0), end.max(0))
        };
        let ((il, ih), (jl, jh)) = (span(a.i, self.sq), span(a.j, self.sk));
        let lo = il.saturating_add(jl).saturating_add(a.c);
        let hi = ih.saturating_add(jh).saturating_add(a.c);
        let (min, max) = match dtype {
            DType::F16 => (-2048, 2048),
            DType::F32 => (-(1 << 24), 1 << 24),
            DType::I32 => (i32::MIN as i64, i32::MAX as i64),
            DType::U32 => (0, u32::MAX as i64),
            // Bool and the storage types.
            _ => return false,
        };
        min <= lo && hi <= max
    }
}

/// The value every element of `n` holds, if it is a constant fill.
fn constant_value(g: &Graph, n: NodeId) -> Option<f64> {
    match &g.node(n).op {
        Op::Full { value } => Some(*value),
        Op::Constant { values } => {
            let first = *values.first()?;
            values.iter().all(|v| v.to_bits() == first.to_bits()).then_some(first)
        }
        Op::Broadcast { .. } => constant_value(g, g.operands(n)[0]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusegraph_ir::{GraphBuilder, Tensor};

    /// `select(mask, s, masked)` over `[2, sq, sk]` logits, `mask` built from the row and
    /// column `iota`s by `f`; simplified when `fold` (constant folding makes a constant of
    /// a small mask).
    fn band_of(sq: usize, sk: usize, fold: bool, f: impl Fn(&Tensor, &Tensor) -> Tensor) -> Option<KeyBand> {
        let b = GraphBuilder::new();
        let s = b.input("s", DType::F32, vec![2, sq, sk]).unwrap();
        let row = b.iota(DType::I32, [sq, sk], 0).unwrap();
        let col = b.iota(DType::I32, [sq, sk], 1).unwrap();
        let masked = b.scalar(DType::F32, -1e9).unwrap();
        let x = f(&row, &col).select(&s, &masked).unwrap();
        let mut g = b.graph();
        let mut outs = vec![x.id()];
        if fold {
            crate::simplify(&mut g, &mut outs).unwrap();
        }
        key_band(&g, outs[0])
    }

    fn band(offset: i64) -> Option<KeyBand> {
        Some(KeyBand { offset, masked: -1e9 })
    }

    #[test]
    fn causal_masks_as_iota_comparisons_and_as_folded_constants() {
        for fold in [false, true] {
            // A mask of 9 × 9 folds to a constant; 70 × 70 stays a comparison of iotas.
            for n in [9, 70] {
                let what = format!("{n}×{n}, folded {fold}");
                assert_eq!(band_of(n, n, fold, |r, c| r.ge(c).unwrap()), band(0), "{what}");
                assert_eq!(band_of(n, n, fold, |r, c| c.le(r).unwrap()), band(0), "{what}");
                assert_eq!(band_of(n, n, fold, |r, c| r.gt(c).unwrap()), band(-1), "{what}");
                assert_eq!(band_of(n, n, fold, |r, c| c.lt(&r.add_scalar(3.0).unwrap()).unwrap()), band(2), "{what}");
                // A prefix of 4 keys every query sees (keys = queries + 4).
                assert_eq!(
                    band_of(n, n + 4, fold, |r, c| c.sub(r).unwrap().le(&c.full_like(4.0).unwrap()).unwrap()),
                    band(4),
                    "{what}"
                );
                // The diagonal alone; the first 4 keys (for every query, j ≤ 3 ≤ i + 3).
                assert_eq!(band_of(n, n, fold, |r, c| r.eq(c).unwrap()), band(0), "{what}");
                assert_eq!(band_of(n, n, fold, |_, c| c.lt(&c.full_like(4.0).unwrap()).unwrap()), band(3), "{what}");
            }
        }
    }

    #[test]
    fn conjunctions_disjunctions_and_negations_of_bands() {
        for fold in [false, true] {
            for n in [9, 70] {
                let what = format!("{n}×{n}, folded {fold}");
                // Causal and a sliding window of 3: the causal part bounds it.
                let window = |r: &Tensor, c: &Tensor| {
                    let near = c.ge(&r.add_scalar(-3.0).unwrap()).unwrap();
                    r.ge(c).unwrap().and(&near).unwrap()
                };
                assert_eq!(band_of(n, n, fold, window), band(0), "{what}");
                // Causal or one of the first two keys: the looser.
                let or =
                    |r: &Tensor, c: &Tensor| r.ge(c).unwrap().or(&c.lt(&c.full_like(2.0).unwrap()).unwrap()).unwrap();
                assert_eq!(band_of(n, n, fold, or), band(1), "{what}");
                assert_eq!(band_of(n, n, fold, |r, c| r.lt(c).unwrap().not().unwrap()), band(0), "{what}");
                assert_eq!(band_of(n, n, fold, |r, c| r.ne(c).unwrap().not().unwrap()), band(0), "{what}");
            }
        }
    }

    #[test]
    fn the_masked_branch_may_come_first() {
        for fold in [false, true] {
            let b = GraphBuilder::new();
            let s = b.input("s", DType::F16, vec![3, 5, 5]).unwrap();
            let row = b.iota(DType::F32, [5, 5], 0).unwrap();
            let col = b.iota(DType::F32, [5, 5], 1).unwrap();
            let masked = b.scalar(DType::F16, -1e9).unwrap();
            let hide = col.gt(&row.add_scalar(1.0).unwrap()).unwrap();
            let xs = [hide.select(&masked, &s).unwrap(), hide.not().unwrap().select(&s, &masked).unwrap()];
            let mut g = b.graph();
            let mut outs: Vec<NodeId> = xs.iter().map(|x| x.id()).collect();
            if fold {
                crate::simplify(&mut g, &mut outs).unwrap();
            }
            for x in outs {
                // −10⁹ is −∞ in f16.
                assert_eq!(key_band(&g, x), Some(KeyBand { offset: 1, masked: f64::NEG_INFINITY }), "folded {fold}");
            }
        }
    }

    #[test]
    fn masks_that_bound_no_key_have_none() {
        for fold in [false, true] {
            // Anti-causal, a window below the diagonal only, rows only.
            assert_eq!(band_of(9, 9, fold, |r, c| c.ge(r).unwrap()), None);
            assert_eq!(band_of(9, 9, fold, |r, c| r.sub(c).unwrap().le(&r.full_like(2.0).unwrap()).unwrap()), None);
            assert_eq!(band_of(9, 9, fold, |r, _| r.lt(&r.full_like(4.0).unwrap()).unwrap()), None);
        }
        // The other branch not a constant.
        let b = GraphBuilder::new();
        let s = b.input("s", DType::F32, vec![4, 4]).unwrap();
        let t = b.input("t", DType::F32, vec![4, 4]).unwrap();
        let (row, col) = (b.iota(DType::I32, [4, 4], 0).unwrap(), b.iota(DType::I32, [4, 4], 1).unwrap());
        let x = row.ge(&col).unwrap().select(&s, &t).unwrap();
        assert_eq!(key_band(&b.graph(), x.id()), None);
        // An additive mask is not a select.
        let x = s.add(&t).unwrap();
        assert_eq!(key_band(&b.graph(), x.id()), None);
    }

    #[test]
    fn iotas_past_their_dtypes_exact_range_have_none() {
        // f16 holds integers exactly up to 2048: 3000 keys do not compare exactly.
        let b = GraphBuilder::new();
        let s = b.input("s", DType::F32, vec![3000, 3000]).unwrap();
        let row = b.iota(DType::F16, [3000, 3000], 0).unwrap();
        let col = b.iota(DType::F16, [3000, 3000], 1).unwrap();
        let x = row.ge(&col).unwrap().select(&s, &b.scalar(DType::F32, -1e9).unwrap()).unwrap();
        assert_eq!(key_band(&b.graph(), x.id()), None);
        // Unsigned differences wrap.
        let b = GraphBuilder::new();
        let s = b.input("s", DType::F32, vec![8, 8]).unwrap();
        let row = b.iota(DType::U32, [8, 8], 0).unwrap();
        let col = b.iota(DType::U32, [8, 8], 1).unwrap();
        let x = row.sub(&col).unwrap().ge(&row.full_like(0.0).unwrap()).unwrap();
        let x = x.select(&s, &b.scalar(DType::F32, -1e9).unwrap()).unwrap();
        assert_eq!(key_band(&b.graph(), x.id()), None);
    }
}
