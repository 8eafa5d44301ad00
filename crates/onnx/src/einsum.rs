//! `Einsum` as transposes, reductions and batched products: operands contracted two at a
//! time (each keeping the indices the output or a later operand needs), an index only one
//! operand has summed away first, ellipses as indices of their own (broadcast as numpy
//! broadcasts). A repeated index within one operand takes that operand's diagonal first.

use crate::node::node_err;
use crate::proto::NodeProto;
use crate::Result;
use fusegraph_ir::{IrError, Tensor};

/// An operand and the index letter of each of its axes.
struct Term {
    t: Tensor,
    idx: Vec<char>,
}

/// `equation` applied to `operands`.
pub(crate) fn einsum(node: &NodeProto, equation: &str, operands: Vec<Tensor>) -> Result<Tensor> {
    let ir = |e: IrError| node_err(node, e.to_string());
    let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, out) = match eq.split_once("->") {
        Some((l, o)) => (l.to_string(), Some(o.to_string())),
        None => (eq.clone(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != operands.len() {
        return Err(node_err(node, format!("{} terms in `{equation}` for {} inputs", terms.len(), operands.len())));
    }
    // Ellipses: the broadcast dimensions, as upper-case letters aligned from the right.
    let pool: Vec<char> = ('A'..='Z').filter(|c| !eq.contains(*c)).collect();
    let explicit = |t: &str| t.chars().filter(|c| c.is_ascii_alphabetic()).count();
    let widest = terms.iter().zip(&operands).map(|(t, o)| o.rank().saturating_sub(explicit(t))).max().unwrap_or(0);
    let ellipsis: Vec<char> = pool.iter().take(widest).copied().collect();
    let expand = |t: &str, rank: usize| -> Vec<char> {
        match t.split_once("...") {
            Some((a, b)) => {
                let n = rank.saturating_sub(explicit(t));
                a.chars().chain(ellipsis[widest - n..].iter().copied()).chain(b.chars()).collect()
            }
            None => t.chars().collect(),
        }
    };
    let (mut list, mut raw) = (Vec::new(), Vec::new());
    for (term, t) in terms.iter().zip(operands) {
        let idx = expand(term, t.rank());
        if idx.len() != t.rank() {
            return Err(node_err(node, format!("term `{term}` for an operand of rank {}", t.rank())));
        }
        raw.extend(idx.iter().copied());
        list.push(diagonal(node, Term { t, idx })?);
    }
    let out: Vec<char> = match out {
        Some(o) => expand(&o, widest + explicit(&o)),
        None => {
            // Implicit: the ellipsis, then the indices that occur once in the terms, in
            // order.
            let mut once: Vec<char> = raw
                .iter()
                .copied()
                .filter(|c| c.is_ascii_lowercase() && raw.iter().filter(|d| *d == c).count() == 1)
                .collect();
            once.sort_unstable();
            ellipsis.iter().copied().chain(once).collect()
        }
    };
    let mut acc = list.remove(0);
    let needed_later = |rest: &[Term], c: char| out.contains(&c) || rest.iter().any(|t| t.idx.contains(&c));
    acc = sum_unneeded(acc, &|c| needed_later(&list, c)).map_err(ir)?;
    while !list.is_empty() {
        let next = list.remove(0);
        let next = sum_unneeded(next, &|c| needed_later(&list, c) || acc.idx.contains(&c)).map_err(ir)?;
        acc = contract(node, acc, next, &|c| needed_later(&list, c))?;
    }
    // Whatever the output does not keep is summed; the rest is put in the output's order.
    acc = sum_unneeded(acc, &|c| out.contains(&c)).map_err(ir)?;
    let perm: Vec<usize> = out
        .iter()
        .map(|c| {
            acc.idx
                .iter()
                .position(|d| d == c)
                .ok_or_else(|| node_err(node, format!("output index `{c}` is in no term")))
        })
        .collect::<Result<_>>()?;
    acc.t.transpose(&perm).map_err(ir)
}

/// `term` with the axes whose index `keep` does not keep summed away.
fn sum_unneeded(term: Term, keep: &dyn Fn(char) -> bool) -> std::result::Result<Term, IrError> {
    let gone: Vec<usize> = (0..term.idx.len()).filter(|&i| !keep(term.idx[i])).collect();
    if gone.is_empty() {
        return Ok(term);
    }
    let idx = term.idx.iter().enumerate().filter(|(i, _)| !gone.contains(i)).map(|(_, &c)| c).collect();
    Ok(Term { t: term.t.sum(&gone, false)?, idx })
}

/// `a · b` over their shared indices: those `keep` keeps are batch axes, the others
/// contracted; each operand's own indices stay.
fn contract(node: &NodeProto, a: Term, b: Term, keep: &dyn Fn(char) -> bool) -> Result<Term> {
    let ir = |e: IrError| node_err(node, e.to_string());
    let size = |t: &Term, c: char| t.idx.iter().position(|&d| d == c).map(|i| t.t.dims()[i]);
    let shared: Vec<char> = a.idx.iter().copied().filter(|c| b.idx.contains(c)).collect();
    let batch: Vec<char> = shared.iter().copied().filter(|&c| keep(c)).collect();
    let summed: Vec<char> = shared.iter().copied().filter(|&c| !keep(c)).collect();
    let own_a: Vec<char> = a.idx.iter().copied().filter(|c| !shared.contains(c)).collect();
    let own_b: Vec<char> = b.idx.iter().copied().filter(|c| !shared.contains(c)).collect();
    // A shared index of size 1 on one side broadcasts to the other's.
    let dim = |c: char| size(&a, c).unwrap_or(1).max(size(&b, c).unwrap_or(1));
    for &c in &shared {
        let (x, y) = (size(&a, c).unwrap_or(1), size(&b, c).unwrap_or(1));
        if x != y && x != 1 && y != 1 {
            return Err(node_err(node, format!("index `{c}` has sizes {x} and {y}")));
        }
    }
    let arrange = |t: &Term, order: &[char], shape: [usize; 3]| -> Result<Tensor> {
        let perm: Vec<usize> =
            order.iter().map(|c| t.idx.iter().position(|d| d == c).expect("an index of t")).collect();
        let full: Vec<usize> = order.iter().map(|&c| dim(c)).collect();
        t.t.transpose(&perm).and_then(|v| v.broadcast_to(full)).and_then(|v| v.reshape(shape)).map_err(ir)
    };
    let prod = |cs: &[char]| cs.iter().map(|&c| dim(c)).product::<usize>();
    let (nb, na, nk, nn) = (prod(&batch), prod(&own_a), prod(&summed), prod(&own_b));
    let order_a: Vec<char> = batch.iter().chain(&own_a).chain(&summed).copied().collect();
    let order_b: Vec<char> = batch.iter().chain(&summed).chain(&own_b).copied().collect();
    let y = arrange(&a, &order_a, [nb, na, nk])?.matmul(&arrange(&b, &order_b, [nb, nk, nn])?).map_err(ir)?;
    let idx: Vec<char> = batch.iter().chain(&own_a).chain(&own_b).copied().collect();
    let dims: Vec<usize> = idx.iter().map(|&c| dim(c)).collect();
    Ok(Term { t: y.reshape(dims).map_err(ir)?, idx })
}

/// `term` with each index it repeats taken once: the diagonal of those axes (moved last,
/// merged, every `n + 1`-th element), the index then last.
fn diagonal(node: &NodeProto, mut term: Term) -> Result<Term> {
    let ir = |e: IrError| node_err(node, e.to_string());
    while let Some((i, j)) =
        (0..term.idx.len()).find_map(|j| term.idx[..j].iter().position(|c| *c == term.idx[j]).map(|i| (i, j)))
    {
        let dims = term.t.dims().to_vec();
        let n = dims[i];
        if dims[j] != n {
            return Err(node_err(node, format!("index `{}` of sizes {n} and {}", term.idx[i], dims[j])));
        }
        let rest: Vec<usize> = (0..dims.len()).filter(|&q| q != i && q != j).collect();
        let perm: Vec<usize> = rest.iter().copied().chain([i, j]).collect();
        let mut shape: Vec<usize> = rest.iter().map(|&q| dims[q]).collect();
        let r = shape.len();
        shape.push(n * n);
        let merged = term.t.transpose(&perm).and_then(|t| t.reshape(shape.clone())).map_err(ir)?;
        let (start, stride) = (vec![0; r + 1], [vec![1; r], vec![n + 1]].concat());
        let t = merged.slice(&start, &shape, &stride).map_err(ir)?;
        let c = term.idx[i];
        term = Term { t, idx: rest.iter().map(|&q| term.idx[q]).chain([c]).collect() };
    }
    Ok(term)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusegraph_ir::{DType, GraphBuilder, HostTensor};
    use std::collections::BTreeMap;

    /// `equation` on one operand of `dims` holding 0, 1, 2, …, by the CPU reference.
    fn run(equation: &str, dims: &[usize]) -> Vec<f32> {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, dims.to_vec()).unwrap();
        let y = einsum(&NodeProto::default(), equation, vec![x]).unwrap();
        let values: Vec<f32> = (0..dims.iter().product::<usize>()).map(|v| v as f32).collect();
        let feeds = BTreeMap::from([("x".to_string(), HostTensor::new(dims.to_vec(), values).unwrap())]);
        let got = fusegraph_reference::evaluate(&b.graph(), &[y.id()], &feeds, &BTreeMap::new()).unwrap();
        got[0].as_slice::<f32>().unwrap().to_vec()
    }

    #[test]
    fn repeated_indices_take_diagonals() {
        assert_eq!(run("ii->i", &[3, 3]), [0.0, 4.0, 8.0]);
        assert_eq!(run("ii", &[3, 3]), [12.0], "implicit: the trace");
        assert_eq!(run("iii->i", &[2, 2, 2]), [0.0, 7.0]);
        assert_eq!(run("bii->bi", &[2, 2, 2]), [0.0, 3.0, 4.0, 7.0]);
        assert_eq!(run("iji->j", &[2, 3, 2]), [7.0, 11.0, 15.0]);
        let err =
            einsum(&NodeProto::default(), "ii", vec![GraphBuilder::new().input("x", DType::F32, [2, 3]).unwrap()]);
        assert!(err.unwrap_err().to_string().contains("index `i` of sizes 2 and 3"));
    }
}
