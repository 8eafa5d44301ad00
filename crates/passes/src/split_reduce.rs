//! Split reductions: a reduction with few outputs and long rows becomes two reductions, so
//! that the long one spreads over many workgroups.
//!
//! A row kernel gives each output (row) a workgroup, or an invocation. A reduction of 4 Mi
//! elements to one value is then one workgroup: one of a GPU's 132 multiprocessors, one of a
//! CPU adapter's threads. As XLA's tree-reduction rewriter does, the reduced extent `R` is
//! cut into `s` chunks of `c = ⌈R/s⌉`:
//!
//! `y[pre, post] = ⊕_r x[pre, r, post]` becomes
//! `p[pre, i, post] = ⊕_j x'[pre, i, j, post]` and `y = ⊕_i p[pre, i, post]`,
//!
//! where `x'` is `x` with its reduced axes merged into one, padded with the reduction's
//! identity to `s · c` where `s` does not divide `R`, and reshaped to `[.., s, c, ..]`. The
//! reduced axes must be adjacent (the merge is a reshape); a reduction over axes that are
//! not is left alone. Both reshapes and the pad are views that fusion folds into the first
//! reduction's kernel, which also keeps whatever produced `x` (an elementwise chain, a
//! loss): the first kernel reads `x`'s producers once, as the unsplit one does, with `s`
//! times as many rows; the second reduces `s` partials per output and takes the ops that
//! followed the reduction (a mean's division, a loss's scale).
//!
//! Numerics: each output is the same elements combined in another order (`s` partials,
//! each rounded to the dtype once), as a differently shaped workgroup would; max and min
//! are exact, integer sums exact modulo 2³².
//!
//! Which reductions split, and into how many chunks, is the caller's choice ([`split_reduce`]
//! takes a function of the reduction's [`Reduction`] dims); [`fill_chunks`] is the occupancy
//! rule the runtime uses.
//!
//! Argmax splits the same way: the first stage finds each chunk's maximum and its index
//! within the chunk (sibling reductions, one kernel), the second the first chunk holding the
//! overall maximum, whose index it offsets by the chunk's start. Chunks are in order and
//! each keeps its first maximum, so the first maximum overall wins, as unsplit.

use fusegraph_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceKind, Result, TensorType};

/// The dims of a reduction as a row kernel sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reduction {
    /// Output elements (rows).
    pub outputs: usize,
    /// Elements combined into each output (the row length, `R`).
    pub len: usize,
    /// Whether a row's elements are adjacent in memory (the reduced axes end the shape); a
    /// column reduction (a bias gradient's sum over the batch) reads them `stride` apart.
    pub contiguous: bool,
    /// The combining function (`Max` for an argmax).
    pub kind: ReduceKind,
    /// An argmax (the index of the first maximum) rather than a reduction.
    pub argmax: bool,
    /// The operand's dtype.
    pub dtype: DType,
}

impl Reduction {
    /// The dims of reduce node `id` of `g` when its reduced axes are adjacent; `None` for
    /// any other node.
    pub fn of(g: &Graph, id: NodeId) -> Option<Reduction> {
        let (kind, axes, argmax) = match &g.node(id).op {
            Op::Reduce { kind, axes, .. } => (*kind, axes.clone(), false),
            Op::ArgMax { axis, .. } => (ReduceKind::Max, vec![*axis], true),
            _ => return None,
        };
        let (&first, &last) = (axes.first()?, axes.last()?);
        if last - first + 1 != axes.len() {
            return None;
        }
        let x = g.ty(g.operands(id)[0]);
        let d = x.shape.dims();
        let len: usize = d[first..=last].iter().product();
        Some(Reduction {
            outputs: x.shape.numel().checked_div(len).unwrap_or(0),
            len,
            contiguous: last + 1 == d.len() || d[last + 1..].iter().all(|&n| n == 1),
            kind,
            argmax,
            dtype: x.dtype,
        })
    }
}

/// The occupancy rule of [`fill_chunks`], for rows of adjacent elements and for columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FillOptions {
    /// A reduction of adjacent elements with fewer outputs than this is split until
    /// `outputs · s` reaches it (a workgroup per partial: a few per multiprocessor).
    pub rows: usize,
    /// Each chunk of such a reduction at least this long.
    pub min_row_chunk: usize,
    /// A column reduction with fewer outputs than this is split until `outputs · s`
    /// reaches it (an invocation per partial, adjacent invocations adjacent columns).
    pub columns: usize,
    /// Each chunk of a column reduction at least this long.
    pub min_column_chunk: usize,
}

impl FillOptions {
    /// For a GPU: 1024 workgroups of partial rows (about eight per multiprocessor of a
    /// 132-SM device), each at least 2048 long; 16 Ki partial columns, each at least 128.
    pub const GPU: FillOptions = FillOptions { rows: 1024, min_row_chunk: 2048, columns: 16384, min_column_chunk: 128 };

    /// For a CPU adapter: as many partials as a GPU's, each at least 4096 long (within a
    /// CPU invocation's loop budget as quads), which a row kernel there gives one invocation
    /// each. Measured on lavapipe (`fusegraph roofline`, 16 Mi f32 summed to one value): 8
    /// partials in the workgroup-per-row form ran at 8% of the copy's bandwidth, 1024
    /// one-invocation partials at 78%.
    pub const CPU: FillOptions = FillOptions { rows: 1024, min_row_chunk: 4096, columns: 4096, min_column_chunk: 256 };
}

/// The number of chunks `s` (a power of two) that brings `r`'s partials to the target of
/// `opts` for its layout, each chunk at least the minimum long; 1 (no split) for a
/// reduction with enough outputs already or too short a row.
pub fn fill_chunks(r: &Reduction, opts: &FillOptions) -> usize {
    let (target, min_chunk) =
        if r.contiguous { (opts.rows, opts.min_row_chunk) } else { (opts.columns, opts.min_column_chunk) };
    let mut s = 1;
    while r.outputs.saturating_mul(s) < target && r.len / (2 * s) >= min_chunk.max(1) {
        s *= 2;
    }
    s
}

/// One reduction [`split_reduce`] split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    /// The reduction's dims before the split.
    pub reduction: Reduction,
    /// Into how many chunks.
    pub chunks: usize,
    /// The first reduction, `p[pre, s, post]`: `chunks` partials per output.
    pub partials: NodeId,
    /// The value that replaced the original reduction (every use and output of it).
    pub result: NodeId,
}

/// Splits every reduction of `g` over adjacent axes for which `chunks` returns `s ≥ 2`
/// (with `s` below the row length), in place; every use of a split reduction, and every
/// entry of `outputs` naming one, then names its replacement. Returns the splits made, in
/// node order.
pub fn split_reduce(g: &mut Graph, outputs: &mut [NodeId], chunks: &dyn Fn(&Reduction) -> usize) -> Result<Vec<Split>> {
    let mut done = Vec::new();
    for id in g.node_ids() {
        let Some(reduction) = Reduction::of(g, id) else { continue };
        let s = chunks(&reduction);
        if s < 2 || s >= reduction.len {
            continue;
        }
        let (kind, axes, keep_dims) = match g.node(id).op.clone() {
            Op::Reduce { kind, axes, keep_dims } => (kind, axes, keep_dims),
            Op::ArgMax { axis, keep_dims } => (ReduceKind::Max, vec![axis], keep_dims),
            _ => continue,
        };
        let x = g.operands(id)[0];
        let dims = g.ty(x).shape.dims().to_vec();
        let (first, last) = (axes[0], axes[axes.len() - 1]);
        let (pre, post) = (&dims[..first], &dims[last + 1..]);
        let len = reduction.len;
        let chunk = len.div_ceil(s);
        let shaped = |mid: &[usize]| -> Vec<usize> { pre.iter().chain(mid).chain(post).copied().collect() };
        let mut v = x;
        if chunk * s != len {
            let merged = shaped(&[len]);
            if merged != dims {
                v = g.add_op(Op::Reshape { shape: merged.clone() }, &[v])?;
            }
            let mut high = vec![0; merged.len()];
            high[first] = chunk * s - len;
            v = g.add_op(Op::Pad { low: vec![0; merged.len()], high, value: kind.identity(reduction.dtype) }, &[v])?;
        }
        v = g.add_op(Op::Reshape { shape: shaped(&[s, chunk]) }, &[v])?;
        let partials = g.add_op(Op::Reduce { kind, axes: vec![first + 1], keep_dims: false }, &[v])?;
        let mut result = if reduction.argmax {
            argmax_of_chunks(g, v, partials, first, chunk)?
        } else {
            g.add_op(Op::Reduce { kind, axes: vec![first], keep_dims: false }, &[partials])?
        };
        if keep_dims {
            result = g.add_op(Op::Reshape { shape: g.ty(id).shape.dims().to_vec() }, &[result])?;
        }
        debug_assert_eq!(g.ty(result), g.ty(id));
        for o in outputs.iter_mut().filter(|o| **o == id) {
            *o = result;
        }
        g.substitute(id, result);
        done.push(Split { reduction, chunks: s, partials, result });
    }
    Ok(done)
}

/// The argmax over axis `a` of `x`, a value cut into chunks of `chunk` along it (`x` is
/// `[pre.., s, chunk, post..]`) whose chunk maxima are `maxima` (`[pre.., s, post..]`): the
/// index of the first maximum within the first chunk holding the overall maximum, plus that
/// chunk's start. `[pre.., post..]`, i32.
fn argmax_of_chunks(g: &mut Graph, x: NodeId, maxima: NodeId, a: usize, chunk: usize) -> Result<NodeId> {
    let within = g.add_op(Op::ArgMax { axis: a + 1, keep_dims: false }, &[x])?;
    let best = g.add_op(Op::ArgMax { axis: a, keep_dims: true }, &[maxima])?;
    let parts = g.ty(within).shape.dims().to_vec();
    let i32_of = |dims: &[usize]| TensorType::new(DType::I32, dims.to_vec());
    let rank = parts.len();
    let best_each = g.add_op(Op::Broadcast { shape: parts.clone(), dims: (0..rank).collect() }, &[best])?;
    let index = g.add_leaf(Op::Iota { axis: a }, i32_of(&parts))?;
    let chosen = g.add_op(Op::Binary(BinaryOp::Eq), &[index, best_each])?;
    let zero = g.add_leaf(Op::Full { value: 0.0 }, i32_of(&parts))?;
    let picked = g.add_op(Op::Select, &[chosen, within, zero])?;
    let local = g.add_op(Op::Reduce { kind: ReduceKind::Sum, axes: vec![a], keep_dims: false }, &[picked])?;
    let out = g.ty(local).shape.dims().to_vec();
    let best_flat = g.add_op(Op::Reshape { shape: out.clone() }, &[best])?;
    let width = g.add_leaf(Op::Full { value: chunk as f64 }, i32_of(&out))?;
    let start = g.add_op(Op::Binary(BinaryOp::Mul), &[best_flat, width])?;
    g.add_op(Op::Binary(BinaryOp::Add), &[local, start])
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusegraph_ir::GraphBuilder;

    fn red(outputs: usize, len: usize, contiguous: bool) -> Reduction {
        Reduction { outputs, len, contiguous, kind: ReduceKind::Sum, argmax: false, dtype: DType::F32 }
    }

    #[test]
    fn fill_chunks_until_the_partials_or_the_chunk_bound() {
        let gpu = FillOptions::GPU;
        assert_eq!(fill_chunks(&red(1, 1 << 22, true), &gpu), 1024); // chunks of 4096
        assert_eq!(fill_chunks(&red(64, 1 << 20, true), &gpu), 16); // 1024 partials
        assert_eq!(fill_chunks(&red(1, 5000, true), &gpu), 2); // a chunk would be 1250 at 4
        assert_eq!(fill_chunks(&red(4096, 1 << 20, true), &gpu), 1); // enough rows already
        assert_eq!(fill_chunks(&red(768, 8192, false), &gpu), 32); // a bias gradient: 24 Ki
        assert_eq!(fill_chunks(&red(1, 3000, true), &gpu), 1);
        assert_eq!(fill_chunks(&red(1, 1 << 22, true), &FillOptions::CPU), 1024);
        assert_eq!(fill_chunks(&red(1, 1 << 14, true), &FillOptions::CPU), 4);
    }

    #[test]
    fn split_reductions_compute_the_same_values() {
        // (input dims, reduced axes, keep dims, chunks): a full sum, ragged (padded) rows, a
        // leading-axis (column) reduction, a middle block of two axes, kept dims.
        let cases: [(&[usize], &[usize], bool, usize); 6] = [
            (&[4096], &[0], false, 16),
            (&[3, 1001], &[1], false, 8),
            (&[999, 5], &[0], false, 4),
            (&[2, 6, 7, 3], &[1, 2], true, 5),
            (&[17, 33], &[0, 1], false, 32),
            (&[2, 130], &[1], true, 3),
        ];
        for (i, &(dims, axes, keep, s)) in cases.iter().enumerate() {
            for kind in ReduceKind::ALL {
                let b = GraphBuilder::new();
                let x = b.input("x", DType::F32, dims.to_vec()).unwrap();
                // A producer, and a use of the reduction after it.
                let e = x.mul_scalar(0.5).unwrap().exp().unwrap();
                let y = e.reduce(kind, axes, keep).unwrap();
                let z = y.neg().unwrap();
                let g0 = b.graph();
                let outs0 = vec![z.id(), y.id()];
                let mut g = g0.clone();
                let mut outs = outs0.clone();
                let done = split_reduce(&mut g, &mut outs, &|_| s).unwrap();
                fusegraph_ir::verify(&g).unwrap();
                assert_eq!(done.len(), 1, "case {i} {kind:?}");
                assert_eq!(outs[1], done[0].result, "case {i}");
                assert!(!g.contains(y.id()), "case {i}: the reduction is gone");
                let f = crate::testing::random_feeds(&g0, 5 + i as u64);
                let none = std::collections::BTreeMap::new();
                let want = fusegraph_reference::evaluate(&g0, &outs0, &f, &none).unwrap();
                let got = fusegraph_reference::evaluate(&g, &outs, &f, &none).unwrap();
                for (a, w) in got.iter().zip(&want) {
                    assert_eq!(a.ty(), w.ty(), "case {i}");
                    fusegraph_reference::assert_close(a, w, 1e-5, 1e-5)
                        .unwrap_or_else(|e| panic!("case {i} {kind:?}: {e}"));
                }
            }
        }
    }

    #[test]
    fn split_argmax_finds_the_first_maximum() {
        // (dims, axis, keep dims, chunks): ragged, leading axis, a middle axis, and repeated
        // values (ties between and within chunks: integers in a small range).
        let cases: [(&[usize], usize, bool, usize); 5] = [
            (&[1000], 0, false, 8),
            (&[3, 1001], 1, true, 7),
            (&[999, 5], 0, false, 4),
            (&[2, 130, 3], 1, false, 3),
            (&[64], 0, false, 5),
        ];
        for (i, &(dims, axis, keep, s)) in cases.iter().enumerate() {
            for dtype in [DType::F32, DType::I32] {
                let b = GraphBuilder::new();
                let x = b.input("x", dtype, dims.to_vec()).unwrap();
                let y = x.argmax(axis, keep).unwrap();
                let g0 = b.graph();
                let mut g = g0.clone();
                let mut outs = vec![y.id()];
                let done = split_reduce(&mut g, &mut outs, &|_| s).unwrap();
                fusegraph_ir::verify(&g).unwrap();
                assert_eq!(done.len(), 1, "case {i}");
                let mut rng = crate::testing::TestRng::new(40 + i as u64);
                let n: usize = dims.iter().product();
                // Few distinct values, so that the maximum repeats.
                let v: Vec<f64> = (0..n).map(|_| rng.below(9) as f64 - 4.0).collect();
                let f = std::collections::BTreeMap::from([(
                    "x".to_string(),
                    fusegraph_ir::HostTensor::from_f64(dtype, dims.to_vec(), &v).unwrap(),
                )]);
                let none = std::collections::BTreeMap::new();
                let want = fusegraph_reference::evaluate(&g0, &[y.id()], &f, &none).unwrap();
                let got = fusegraph_reference::evaluate(&g, &outs, &f, &none).unwrap();
                assert_eq!(got[0].ty(), want[0].ty(), "case {i}");
                assert_eq!(got[0].to_f64(), want[0].to_f64(), "case {i} {dtype}");
            }
        }
    }

    #[test]
    fn reductions_over_axes_apart_or_answered_one_are_left_alone() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, vec![8, 4, 8]).unwrap();
        let apart = x.reduce(ReduceKind::Sum, &[0, 2], false).unwrap();
        let row = x.reduce(ReduceKind::Max, &[2], false).unwrap();
        assert_eq!(Reduction::of(&b.graph(), apart.id()), None);
        for s in [0, 1, 8, 9] {
            let mut g = b.graph();
            let mut outs = vec![apart.id(), row.id()];
            assert!(split_reduce(&mut g, &mut outs, &|_| s).unwrap().is_empty(), "{s} chunks");
        }
    }
}
