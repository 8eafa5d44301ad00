//! Split-k: a matrix product whose output is too small to occupy a GPU becomes `s` products
//! over slices of `k`, summed.
//!
//! `C[.., m, n] = A[.., m, k] · B[.., k, n]` is rewritten to
//! `P[s, .., m, n] = A'[s, .., m, k/s] · B'[s, .., k/s, n]` and `C = Σ_s P`, where `A'` and
//! `B'` are a reshape and a transpose of `A` and `B` (views: the product's kernel reads them
//! in place, as it reads any transposed operand) and the sum is a reduction over the new
//! leading axis. The product then has `s` times as many output tiles, each over `k/s`: on a
//! device whose cores outnumber an output's tiles (a 256×768 output is 48 tiles of 64×64
//! on a GPU with 132 multiprocessors) it keeps `s` times as many busy, at the cost of
//! `s · m · n` partial sums written and read once more. The sum is a small reduction per
//! element, so whatever followed the product in its kernel (a bias, an activation — the
//! fused epilogue) follows the sum in the reduction's kernel instead.
//!
//! Numerics: each output is still the sum of the same `k` products, added in a different
//! order (`s` partial sums, each accumulated in the product's dtype's accumulator and stored
//! in its dtype), as a differently tiled kernel would; integer products are exact.
//!
//! Which products are split is the caller's choice ([`split_k`] takes a function of the
//! product's [`Gemm`] dims); [`fill_splits`] is the occupancy rule the runtime uses.

use fusegraph_ir::{DType, Graph, NodeId, Op, ReduceKind, Result};

/// The dims of a matrix product as the tiled kernel sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemm {
    /// The product of the output's batch dims (1 without any).
    pub batch: usize,
    /// Output rows.
    pub m: usize,
    /// Output columns.
    pub n: usize,
    /// The contracted length.
    pub k: usize,
    /// The operands' and result's dtype.
    pub dtype: DType,
}

impl Gemm {
    /// The dims of matmul node `id` of `g`; `None` for any other node.
    pub fn of(g: &Graph, id: NodeId) -> Option<Gemm> {
        if !matches!(g.node(id).op, Op::MatMul) {
            return None;
        }
        let out = g.ty(id);
        let d = out.shape.dims();
        let r = d.len();
        let lhs = g.ty(g.operands(id)[0]).shape.dims().to_vec();
        Some(Gemm {
            batch: d[..r - 2].iter().product(),
            m: d[r - 2],
            n: d[r - 1],
            k: lhs[lhs.len() - 1],
            dtype: out.dtype,
        })
    }
}

/// One product [`split_k`] split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    /// The product's dims before the split.
    pub gemm: Gemm,
    /// Into how many slices of `k`.
    pub splits: usize,
    /// The new product `P[s, .., m, n]`.
    pub partials: NodeId,
    /// The sum that replaced the original product (every use and output of it).
    pub sum: NodeId,
}

/// The occupancy rule of [`fill_splits`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FillOptions {
    /// Split a product whose kernel would have fewer workgroups than this, until it has at
    /// least this many (or another bound stops it).
    pub workgroups: u64,
    /// The output tile (rows, columns) of one workgroup, to count a product's workgroups.
    pub tile: (usize, usize),
    /// Every slice of `k` at least this long: shorter ones spend more on the partial sums'
    /// stores and loads than they gain.
    pub min_k: usize,
    /// At most this many slices.
    pub max_splits: usize,
}

impl Default for FillOptions {
    fn default() -> Self {
        FillOptions { workgroups: 256, tile: (64, 64), min_k: 128, max_splits: 16 }
    }
}

/// The smallest power of two `s` that brings `gemm`'s workgroups (one per output tile per
/// batch entry) to `opts.workgroups`, with `k` a multiple of `4·s` (each slice a whole number
/// of vec4s) and `k/s ≥ opts.min_k`; 1 (no split) if the product already has enough
/// workgroups or `k` allows no split.
pub fn fill_splits(gemm: &Gemm, opts: &FillOptions) -> usize {
    let (tm, tn) = (opts.tile.0.max(1), opts.tile.1.max(1));
    let groups = (gemm.batch * gemm.m.div_ceil(tm) * gemm.n.div_ceil(tn)) as u64;
    let mut s = 1;
    while groups * (s as u64) < opts.workgroups {
        let next = s * 2;
        if next > opts.max_splits || !gemm.k.is_multiple_of(4 * next) || gemm.k / next < opts.min_k {
            break;
        }
        s = next;
    }
    s
}

/// Splits every matmul of `g` for which `splits` returns `s ≥ 2` dividing its `k` (any other
/// answer leaves it alone), in place; every use of a split product, and every entry of
/// `outputs` naming one, then names its sum. Returns the splits made, in node order.
pub fn split_k(g: &mut Graph, outputs: &mut [NodeId], splits: &dyn Fn(&Gemm) -> usize) -> Result<Vec<Split>> {
    let mut done = Vec::new();
    for id in g.node_ids() {
        let Some(gemm) = Gemm::of(g, id) else { continue };
        let s = splits(&gemm);
        if s < 2 || !gemm.k.is_multiple_of(s) {
            continue;
        }
        let ops = g.operands(id);
        let rank = g.ty(id).shape.rank();
        let lhs = slices(g, ops[0], rank, s, true)?;
        let rhs = slices(g, ops[1], rank, s, false)?;
        let partials = g.add_op(Op::MatMul, &[lhs, rhs])?;
        let sum = g.add_op(Op::Reduce { kind: ReduceKind::Sum, axes: vec![0], keep_dims: false }, &[partials])?;
        debug_assert_eq!(g.ty(sum), g.ty(id));
        for o in outputs.iter_mut().filter(|o| **o == id) {
            *o = sum;
        }
        g.substitute(id, sum);
        done.push(Split { gemm, splits: s, partials, sum });
    }
    Ok(done)
}

/// Operand `x` of a product of rank `rank`, its `k` axis cut into `s` slices that become a
/// new leading batch axis: `[.., m, k] → [s, 1.., .., m, k/s]` for the lhs,
/// `[.., k, n] → [s, 1.., .., k/s, n]` for the rhs, with leading 1s so that both operands
/// have `rank - 2` batch axes after the new one (NumPy broadcasting aligns batch axes from
/// the right; without them the slice axis of one operand would meet a batch axis of the
/// other).
fn slices(g: &mut Graph, x: NodeId, rank: usize, s: usize, lhs: bool) -> Result<NodeId> {
    let d = g.ty(x).shape.dims().to_vec();
    let r = d.len();
    // Batch axes padded to the output's count, then the two matrix axes with `k` cut.
    let mut shape = vec![1; rank - r];
    shape.extend_from_slice(&d[..r - 2]);
    let (rows, cols) = (d[r - 2], d[r - 1]);
    if lhs {
        shape.extend([rows, s, cols / s]);
    } else {
        shape.extend([s, rows / s, cols]);
    }
    let reshaped = g.add_op(Op::Reshape { shape }, &[x])?;
    // The slice axis (at `rank - 1` for the lhs, `rank - 2` for the rhs) goes first.
    let at = if lhs { rank - 1 } else { rank - 2 };
    let mut perm = vec![at];
    perm.extend((0..=rank).filter(|&a| a != at));
    g.add_op(Op::Transpose { perm }, &[reshaped])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemm(batch: usize, m: usize, n: usize, k: usize) -> Gemm {
        Gemm { batch, m, n, k, dtype: DType::F32 }
    }

    #[test]
    fn fill_splits_until_the_workgroups_or_a_bound() {
        let opts = FillOptions { workgroups: 256, tile: (64, 64), min_k: 128, max_splits: 16 };
        // The transformer block's products at seq 256, d 768: 48 tiles of 64×64.
        assert_eq!(fill_splits(&gemm(1, 256, 768, 3072), &opts), 8); // 384 workgroups, k/s 384
        assert_eq!(fill_splits(&gemm(1, 256, 768, 768), &opts), 4); // k/s would be 96 at 8
        assert_eq!(fill_splits(&gemm(1, 256, 3072, 768), &opts), 2); // 192 → 384
                                                                     // Enough workgroups already; k not a multiple of 8 (no whole vec4 slices).
        assert_eq!(fill_splits(&gemm(1, 1024, 1024, 4096), &opts), 1);
        assert_eq!(fill_splits(&gemm(1, 64, 64, 1004), &opts), 1);
        // Batches count; the split bound holds.
        assert_eq!(fill_splits(&gemm(64, 64, 64, 4096), &opts), 4);
        assert_eq!(fill_splits(&gemm(1, 8, 8, 1 << 20), &opts), 16);
    }

    #[test]
    fn split_products_compute_the_same_values() {
        use fusegraph_ir::GraphBuilder;
        // (lhs dims, rhs dims, splits): plain, lhs batched over a shared rhs, rhs batched
        // under a shared lhs, broadcast batch axes, ragged m and n.
        let cases: [(&[usize], &[usize], usize); 5] = [
            (&[7, 64], &[64, 33], 4),
            (&[2, 5, 48], &[48, 9], 3),
            (&[12, 40], &[3, 40, 6], 2),
            (&[2, 1, 3, 32], &[4, 32, 5], 8),
            (&[1000, 16], &[16, 7], 16),
        ];
        for (i, &(ld, rd, s)) in cases.iter().enumerate() {
            let b = GraphBuilder::new();
            let x = b.input("x", DType::F32, ld.to_vec()).unwrap();
            let w = b.input("w", DType::F32, rd.to_vec()).unwrap();
            let y = x.matmul(&w).unwrap();
            // An epilogue, a second use of the product, and the product itself as an output.
            let z = y.tanh().unwrap().add(&y).unwrap();
            let g0 = b.graph();
            let outs0 = vec![z.id(), y.id()];
            let mut g = g0.clone();
            let mut outs = outs0.clone();
            let done = split_k(&mut g, &mut outs, &|_| s).unwrap();
            fusegraph_ir::verify(&g).unwrap();
            assert_eq!(done.len(), 1, "case {i}");
            assert_eq!((done[0].splits, outs[1]), (s, done[0].sum), "case {i}");
            assert!(!g.contains(y.id()), "case {i}: the product is gone");
            assert_eq!(g.ty(done[0].partials).shape.dims()[0], s, "case {i}");
            let f = crate::testing::random_feeds(&g0, 17 + i as u64);
            let none = std::collections::BTreeMap::new();
            let want = fusegraph_reference::evaluate(&g0, &outs0, &f, &none).unwrap();
            let got = fusegraph_reference::evaluate(&g, &outs, &f, &none).unwrap();
            for (a, w) in got.iter().zip(&want) {
                assert_eq!(a.ty(), w.ty(), "case {i}");
                fusegraph_reference::assert_close(a, w, 1e-5, 1e-5).unwrap_or_else(|e| panic!("case {i}: {e}"));
            }
        }
    }

    #[test]
    fn products_whose_k_the_answer_does_not_divide_are_left_alone() {
        use fusegraph_ir::GraphBuilder;
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, vec![4, 10]).unwrap();
        let w = b.input("w", DType::F32, vec![10, 4]).unwrap();
        let y = x.matmul(&w).unwrap();
        for s in [0, 1, 3, 4] {
            let mut g = b.graph();
            let mut outs = vec![y.id()];
            assert!(split_k(&mut g, &mut outs, &|_| s).unwrap().is_empty(), "{s} splits");
            assert_eq!(outs, vec![y.id()]);
        }
    }
}
