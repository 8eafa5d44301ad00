//! Choosing the next token on the device: the head a generation step ends with ([`Head`]).
//!
//! Greedy decoding is each row's first maximum (`argmax`). Sampling is graph ops on the last
//! logits `z: [batch, vocab]` with run-time inputs `sampling: f32[3]` (1 / temperature, top-k,
//! top-p) and `uniform: f32[batch]` (a draw in `[0, 1)` per sequence), so one executable
//! serves every temperature, `k` and `p`, and only the chosen ids are read back:
//!
//! - **top-k** keeps the values ≥ the `k`-th largest (ties with it kept, as `transformers`
//!   does). The threshold is found by halving `[min, max + 1)` [`HALVINGS`] times, keeping
//!   the invariant `count(z ≥ lo) ≥ k > count(z ≥ hi)`: it is exact wherever no other value
//!   lies within `(max − min + 1) · 2⁻³²` below the `k`-th (below an f32's resolution for
//!   logits far from 0).
//! - **top-p** keeps the most likely tokens whose probabilities reach `p` (the smallest such
//!   set; ties with its least likely token kept): the largest threshold `t` with
//!   `sum(e ≥ t) ≥ p · sum(e)` over `e = exp(z − max)` of the kept tokens, by halving too.
//! - Either threshold converges onto a token's own value, so keeping `z ≥ lo` would be an
//!   exact tie, and kernels that recompute `lo` (fusion recomputes cheap values where they
//!   are read) may round it an ulp apart: one kernel's sums would hold a token another
//!   drops, and a draw would land on another token. Each filter keeps the values
//!   ≥ `lo` less [`MARGIN`] of its search's width instead: the token on the threshold
//!   always, and a value within that margin below it too (a near-tie, kept as a tie is).
//! - **the draw** is the token `i` where the running sum of the kept `e`, in vocabulary
//!   order, first passes `uniform · sum(e)`: a halving of the index range (⌈log₂ vocab⌉
//!   sums of prefixes). The distribution is the renormalized softmax of the kept tokens.

use crate::{DType, HostTensor, Result, Tensor};

/// Halvings of the value ranges that find the top-k and top-p thresholds.
pub const HALVINGS: usize = 32;

/// What each filter keeps below its threshold, as a fraction of its search's width
/// (2⁻²⁰: a few ulps of a threshold near the width, far below the gaps between 3,000
/// logits).
pub const MARGIN: f64 = 1.0 / (1u64 << 20) as f64;

/// How the next token is chosen from the logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0 for greedy (the first maximum); otherwise the logits are divided by it.
    pub temperature: f64,
    /// Keep only the `k` most likely tokens (and those tied with the `k`-th).
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches `p` (at least
    /// one; ties with its least likely token kept).
    pub top_p: Option<f64>,
    /// Seed of the generator of the draws.
    pub seed: u64,
}

impl Sampling {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Sampling { temperature: 0.0, top_k: None, top_p: None, seed: 0 }
    }
}

/// What a generation step's executable returns from the last logits `[batch, vocab]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Head {
    /// The logits themselves.
    Logits,
    /// Each row's first maximum, `i32[batch]`.
    Greedy,
    /// A sampled id per row, `i32[batch]`, with the filters compiled in (see the module docs).
    Sampled {
        /// Whether top-k filters.
        top_k: bool,
        /// Whether top-p filters.
        top_p: bool,
    },
}

impl Head {
    /// The head that generates with `s`.
    pub fn of(s: &Sampling) -> Head {
        match s.temperature > 0.0 {
            false => Head::Greedy,
            true => Head::Sampled { top_k: s.top_k.is_some(), top_p: s.top_p.is_some() },
        }
    }

    /// The head's output from `logits: f32[batch, vocab]`, recording its inputs in
    /// `logits`'s graph.
    pub fn build(self, logits: &Tensor) -> Result<Tensor> {
        match self {
            Head::Logits => Ok(logits.clone()),
            Head::Greedy => Ok(logits.argmax(1, false)?),
            Head::Sampled { top_k, top_p } => sampled(logits, top_k, top_p),
        }
    }

    /// A sampled head's run-time inputs for `s` and one draw per row (none for the others).
    pub fn feeds(self, s: &Sampling, uniform: Vec<f32>) -> Result<Vec<(&'static str, HostTensor)>> {
        if !matches!(self, Head::Sampled { .. }) {
            return Ok(Vec::new());
        }
        let settings = vec![
            (1.0 / s.temperature) as f32,
            s.top_k.map_or(f32::MAX, |k| k.max(1) as f32),
            s.top_p.map_or(2.0, |p| p as f32),
        ];
        let n = uniform.len();
        Ok(vec![("sampling", HostTensor::new([3], settings)?), ("uniform", HostTensor::new([n], uniform)?)])
    }
}

/// The sampled ids of `logits: [batch, vocab]` (see the module docs).
fn sampled(logits: &Tensor, top_k: bool, top_p: bool) -> Result<Tensor> {
    let b = logits.builder();
    let (batch, vocab) = (logits.dims()[0], logits.dims()[1]);
    let settings = b.input("sampling", DType::F32, [3])?;
    let uniform = b.input("uniform", DType::F32, [batch])?.reshape([batch, 1])?;
    // Setting `i` as a column, and any column, across the row.
    let setting = |i: usize| -> Result<Tensor> {
        Ok(settings.slice(&[i], &[i + 1], &[1])?.reshape([1, 1])?.broadcast_to([batch, 1])?)
    };
    let wide = |c: &Tensor| -> Result<Tensor> { Ok(c.broadcast_to([batch, vocab])?) };
    let zero = b.full(DType::F32, [batch, vocab], 0.0)?;
    let z = logits.mul(&wide(&setting(0)?)?)?;
    let max = z.max(&[1], true)?;
    let mut keep = b.full(DType::Bool, [batch, vocab], 1.0)?;
    if top_k {
        let k = setting(1)?;
        let at_least = |t: &Tensor| -> Result<Tensor> {
            let count = z.ge(&wide(t)?)?.cast(DType::F32)?.sum(&[1], true)?;
            Ok(count.ge(&k)?)
        };
        let min = z.min(&[1], true)?;
        let width = max.add_scalar(1.0)?.sub(&min)?;
        let lo = halve(min.clone(), &width, HALVINGS, &at_least)?;
        keep = z.ge(&wide(&lo.sub(&width.mul_scalar(MARGIN)?)?)?)?;
    }
    let mut e = keep.select(&z.sub(&wide(&max)?)?.exp()?, &zero)?;
    if top_p {
        let target = e.sum(&[1], true)?.mul(&setting(2)?)?;
        let mass = |t: &Tensor| -> Result<Tensor> {
            let above = e.ge(&wide(t)?)?.select(&e, &zero)?.sum(&[1], true)?;
            Ok(above.ge(&target)?)
        };
        // Up to the most likely token's `e` (1): it is always kept.
        let one = b.full(DType::F32, [batch, 1], 1.0)?;
        let lo = halve(b.full(DType::F32, [batch, 1], 0.0)?, &one, HALVINGS, &mass)?;
        e = e.ge(&wide(&lo.add_scalar(-MARGIN)?)?)?.select(&e, &zero)?;
    }
    // The draw: the first index whose running sum passes `uniform · sum(e)`, keeping
    // `prefix(lo) ≤ target < prefix(hi)`.
    let target = e.sum(&[1], true)?.mul(&uniform)?;
    let index = b.iota(DType::F32, [batch, vocab], 1)?;
    let below = |t: &Tensor| -> Result<Tensor> {
        let prefix = index.lt(&wide(t)?)?.select(&e, &zero)?.sum(&[1], true)?;
        Ok(prefix.le(&target)?)
    };
    // Over `[0, 2^steps)` ⊇ the vocabulary: whole midpoints.
    let steps = (usize::BITS - (vocab - 1).leading_zeros()) as usize;
    let span = b.full(DType::F32, [batch, 1], (1u64 << steps) as f64)?;
    let lo = halve(b.full(DType::F32, [batch, 1], 0.0)?, &span, steps, &below)?;
    // Sums in another order could land the draw on a token of no weight: the most likely
    // one then.
    let weight = index.eq(&wide(&lo)?)?.select(&e, &zero)?.sum(&[1], true)?;
    let best = e.argmax(1, true)?.cast(DType::F32)?;
    let id = weight.gt(&b.full(DType::F32, [batch, 1], 0.0)?)?.select(&lo, &best)?;
    Ok(id.cast(DType::I32)?.reshape([batch])?)
}

/// `steps` halvings of `[lo, lo + width)` per row, keeping `enough(lo) && !enough(lo +
/// width)`; returns `lo`. The state is `lo` alone, each step adding its half-width where
/// `enough` holds, so the value of each step's `lo` refers to the last one once: a kernel
/// that recomputes it (elementwise values are recomputed where they are used) does work
/// linear in the steps, not a doubling per step.
fn halve(mut lo: Tensor, width: &Tensor, steps: usize, enough: &dyn Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    for i in 0..steps {
        let step = width.mul_scalar(0.5f64.powi(i as i32 + 1))?;
        let ok = enough(&lo.add(&step)?)?.cast(DType::F32)?;
        lo = lo.add(&ok.mul(&step)?)?;
    }
    Ok(lo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GraphBuilder;
    use std::collections::BTreeMap;

    /// The rules in f64, from their definitions (sorting, not halving): the kept tokens and
    /// the id a draw `u` picks.
    fn reference(row: &[f64], s: &Sampling, u: f64) -> (Vec<usize>, usize) {
        let z: Vec<f64> = row.iter().map(|x| x / s.temperature).collect();
        let mut sorted = z.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let kth = s.top_k.map_or(f64::NEG_INFINITY, |k| sorted[k.clamp(1, z.len()) - 1]);
        let max = sorted[0];
        let mut e: Vec<f64> = z.iter().map(|&x| if x >= kth { (x - max).exp() } else { 0.0 }).collect();
        if let Some(p) = s.top_p {
            let total: f64 = e.iter().sum();
            let mut by_weight = e.clone();
            by_weight.sort_by(|a, b| b.total_cmp(a));
            let (mut mass, mut t) = (0.0, by_weight[0]);
            for &w in &by_weight {
                if mass >= p * total {
                    break;
                }
                mass += w;
                t = w;
            }
            e.iter_mut().for_each(|w| *w = if *w >= t { *w } else { 0.0 });
        }
        let kept = (0..e.len()).filter(|&i| e[i] > 0.0).collect();
        let mut left = u * e.iter().sum::<f64>();
        let id = (0..e.len()).find(|&i| {
            e[i] > 0.0 && (left < e[i] || i == e.len() - 1) || {
                left -= e[i];
                false
            }
        });
        (kept, id.unwrap_or(0))
    }

    /// The head evaluated by the CPU reference on `rows` with a draw per row.
    fn ids(rows: &[Vec<f64>], s: &Sampling, draws: &[f32]) -> Vec<i32> {
        let (batch, vocab) = (rows.len(), rows[0].len());
        let b = GraphBuilder::new();
        let logits = b.input("logits", DType::F32, [batch, vocab]).unwrap();
        let out = Head::of(s).build(&logits).unwrap();
        let flat: Vec<f32> = rows.iter().flatten().map(|&x| x as f32).collect();
        let mut feeds: BTreeMap<String, HostTensor> =
            Head::of(s).feeds(s, draws.to_vec()).unwrap().into_iter().map(|(n, t)| (n.to_string(), t)).collect();
        feeds.insert("logits".into(), HostTensor::new([batch, vocab], flat).unwrap());
        let got = fusegraph_reference::evaluate(&b.graph(), &[out.id()], &feeds, &BTreeMap::new()).unwrap();
        got[0].as_slice::<i32>().unwrap().to_vec()
    }

    #[test]
    fn sampling_follows_its_rules() {
        let row = vec![0.0, 3.0, 1.0, 3.0, -2.0];
        let one = |s: &Sampling, u: f32| ids(std::slice::from_ref(&row), s, &[u])[0];
        assert_eq!(one(&Sampling::greedy(), 0.5), 1, "the first maximum");
        // top-1 keeps the tokens tied with the largest.
        let top1 = Sampling { temperature: 1.0, top_k: Some(1), top_p: None, seed: 0 };
        assert_eq!([0.1, 0.9].map(|u| one(&top1, u)), [1, 3]);
        let top3 = Sampling { top_k: Some(3), ..top1 };
        let drawn: std::collections::BTreeSet<i32> = (0..50).map(|i| one(&top3, i as f32 / 50.0)).collect();
        assert_eq!(drawn.into_iter().collect::<Vec<_>>(), [1, 2, 3]);
        // top-p 0.5: the two 3.0 logits hold 0.42 each, so two tokens are kept.
        let nucleus = Sampling { temperature: 1.0, top_k: None, top_p: Some(0.5), seed: 0 };
        let drawn: std::collections::BTreeSet<i32> = (0..50).map(|i| one(&nucleus, i as f32 / 50.0)).collect();
        assert_eq!(drawn.into_iter().collect::<Vec<_>>(), [1, 3]);
        // No filter: a draw's token is where the running softmax passes it.
        let all = Sampling { temperature: 1.0, top_k: None, top_p: None, seed: 0 };
        let z: f64 = row.iter().map(|x| x.exp()).sum();
        let cdf: Vec<f64> = row
            .iter()
            .scan(0.0, |c, x| {
                *c += x.exp() / z;
                Some(*c)
            })
            .collect();
        for (i, &c) in cdf.iter().enumerate().take(4) {
            assert_eq!(one(&all, (c - 1e-4) as f32), i as i32, "just below the running sum {c}");
            assert_eq!(one(&all, (c + 1e-4) as f32), i as i32 + 1, "just above {c}");
        }
    }

    /// Random rows (a vocabulary of 1000, wide logits), every filter mix, temperatures
    /// around 1: the ids are the f64 rules' (which sort instead of halving), and kept.
    #[test]
    fn random_rows_match_the_rules() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(3);
        let rows: Vec<Vec<f64>> =
            (0..4).map(|_| (0..1000).map(|_| rng.random_range(-8.0..8.0f32) as f64).collect()).collect();
        for (t, k, p) in [
            (1.0, None, None),
            (0.7, Some(40), None),
            (1.3, None, Some(0.9)),
            (1.0, Some(100), Some(0.5)),
            (0.5, Some(1), None),
        ] {
            let s = Sampling { temperature: t, top_k: k, top_p: p, seed: 0 };
            for round in 0..8 {
                let draws: Vec<f32> = (0..4).map(|_| rng.random::<f32>()).collect();
                let got = ids(&rows, &s, &draws);
                for (r, row) in rows.iter().enumerate() {
                    let (kept, want) = reference(row, &s, draws[r] as f64);
                    assert!(kept.contains(&(got[r] as usize)), "{s:?} round {round} row {r}: {} not kept", got[r]);
                    assert_eq!(got[r] as usize, want, "{s:?} round {round} row {r}, u {}", draws[r]);
                }
            }
        }
    }
}
