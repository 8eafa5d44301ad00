//! Banded masks: which keys of an attention's logits a mask hides, so that a fused
//! attention kernel can stop walking a row's keys where every remaining logit is masked (as
//! FlashAttention skips the blocks above a causal diagonal).
//!
//! [`key_band`] proves, from the graph alone, that every logit `(…, i, j)` (query `i` along
//! the second-to-last axis, key `j` along the last) with `j > i + offset` equals one constant
//! `masked`. It recognizes a `select` whose condition is a band and whose other branch is a
//! constant, the condition given either as comparisons of `iota`s (and sums, differences,
//! integer multiples and casts of them: `row ≥ col`, `col < row + 1`, `col ≤ row + (s_k −
//! s_q)`), or as a constant mask (what constant folding makes of those at short sequences),
//! broadcast over batch and head axes. Anything else has no band.
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
    /// The last unmasked key of query `i` is `i + offset`.
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
    let (masked, offset) = match cx.half(g, ops[0], &tags)? {
        Half::Keep(offset) => (ops[2], offset),
        Half::Hide(offset) => (ops[1], offset),
    };
    let value = constant_value(g, masked)?;
    Some(KeyBand { offset, masked: fusegraph_reference::round_to(g.ty(logits).dtype, value) })
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

/// A boolean value as a function of `(i, j)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Half {
    /// True exactly where `j ≤ i + offset`.
    Keep(i64),
    /// True exactly where `j > i + offset`.
    Hide(i64),
}

impl Half {
    fn not(self) -> Half {
        match self {
            Half::Keep(o) => Half::Hide(o),
            Half::Hide(o) => Half::Keep(o),
        }
    }

    /// `d ≥ 0` for `d = a·i + b·j + c`, if that is a band.
    fn at_least_zero(d: Affine) -> Option<Half> {
        match (d.i, d.j) {
            // i − j + c ≥ 0 ⟺ j ≤ i + c.
            (1, -1) => Some(Half::Keep(d.c)),
            // j − i + c ≥ 0 ⟺ j > i − c − 1.
            (-1, 1) => Some(Half::Hide(-d.c - 1)),
            _ => None,
        }
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

    /// `n` (boolean, its axes tagged `tags`) as a band, if it is one.
    fn half(&self, g: &Graph, n: NodeId, tags: &[Tag]) -> Option<Half> {
        let ops = g.operands(n);
        match &g.node(n).op {
            Op::Broadcast { .. } => self.half(g, ops[0], &Self::operand_tags(g, n, tags)?),
            Op::Unary(UnaryOp::Not) => Some(self.half(g, ops[0], tags)?.not()),
            Op::Binary(cmp @ (BinaryOp::Ge | BinaryOp::Gt | BinaryOp::Le | BinaryOp::Lt)) => {
                let a = self.affine(g, ops[0], tags)?;
                let b = self.affine(g, ops[1], tags)?;
                let (d, strict) = match cmp {
                    BinaryOp::Ge => (a.plus(b.scaled(-1)?)?, false),
                    BinaryOp::Gt => (a.plus(b.scaled(-1)?)?, true),
                    BinaryOp::Le => (b.plus(a.scaled(-1)?)?, false),
                    _ => (b.plus(a.scaled(-1)?)?, true),
                };
                // Integers: d > 0 ⟺ d − 1 ≥ 0.
                Half::at_least_zero(if strict { d.plus(Affine { i: 0, j: 0, c: -1 })? } else { d })
            }
            Op::Constant { values } if g.ty(n).dtype == DType::Bool => self.constant_half(g, n, values, tags),
            _ => None,
        }
    }

    /// A constant boolean mask as a band: every element checked.
    fn constant_half(&self, g: &Graph, n: NodeId, values: &[f64], tags: &[Tag]) -> Option<Half> {
        let dims = g.ty(n).shape.dims();
        let axis = |t: Tag| tags.iter().position(|&x| x == t);
        // A mask that does not vary along queries (or keys) of more than one is no band.
        let (qa, ka) = (axis(Tag::Query), axis(Tag::Key));
        if (qa.is_none() && self.sq > 1) || (ka.is_none() && self.sk > 1) {
            return None;
        }
        // Per element: d = j − i, and whether it is kept.
        let (mut keep_max, mut drop_min) = (i64::MIN, i64::MAX);
        let (mut hide_min, mut show_max) = (i64::MAX, i64::MIN);
        let mut index = vec![0usize; dims.len()];
        for &v in values {
            let at = |a: Option<usize>| a.map_or(0, |a| index[a] as i64);
            let d = at(ka) - at(qa);
            if v != 0.0 {
                keep_max = keep_max.max(d);
                hide_min = hide_min.min(d);
            } else {
                drop_min = drop_min.min(d);
                show_max = show_max.max(d);
            }
            for a in (0..dims.len()).rev() {
                index[a] += 1;
                if index[a] < dims[a] {
                    break;
                }
                index[a] = 0;
            }
        }
        // True exactly where d ≤ offset (or exactly where d > offset); an all-false mask
        // hides everything, which is no band worth a kernel's attention.
        if keep_max != i64::MIN && keep_max < drop_min {
            Some(Half::Keep(keep_max))
        } else if hide_min != i64::MAX && show_max < hide_min {
            Some(Half::Hide(hide_min - 1))
        } else {
            None
        }
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
            Op::Binary(BinaryOp::Sub) => {
                self.affine(g, ops[0], tags)?.plus(self.affine(g, ops[1], tags)?.scaled(-1)?)?
            }
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
            DType::Bool => return false,
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
    fn masks_that_are_not_bands_have_none() {
        for fold in [false, true] {
            // Anti-causal, a window, equality, a mask along keys only, by a batch axis.
            assert_eq!(band_of(9, 9, fold, |r, c| c.ge(r).unwrap()), None);
            assert_eq!(band_of(9, 9, fold, |r, c| r.sub(c).unwrap().le(&r.full_like(2.0).unwrap()).unwrap()), None);
            assert_eq!(band_of(9, 9, fold, |r, c| r.eq(c).unwrap()), None);
            assert_eq!(band_of(9, 9, fold, |_, c| c.lt(&c.full_like(4.0).unwrap()).unwrap()), None);
            assert_eq!(band_of(9, 9, fold, |r, c| r.mul(c).unwrap().ge(&c.full_like(4.0).unwrap()).unwrap()), None);
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
