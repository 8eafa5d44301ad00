//! Strided views: a kernel member reached from one of the kernel's bindings through layout
//! ops only (reshape, transpose, slice, broadcast) reads element `c` of its shape at
//! `offset + Σ c[d]·strides[d]` of the binding. Lowerings that load straight from memory
//! (the subgroup matmul, see `matmul.rs`) use this to turn an operand's element function
//! into address arithmetic, and to know which axis is contiguous.

use fusegraph_ir::{Graph, NodeId, Op};
use fusegraph_passes::Kernel;

/// Where the elements of a value lie in one of a kernel's input bindings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StridedView {
    /// The kernel input (a binding) whose memory holds the elements.
    pub leaf: NodeId,
    /// Element offset of coordinate zero.
    pub offset: usize,
    /// Element stride of each axis of the value (0 for axes of length 1 and broadcast axes).
    pub strides: Vec<usize>,
}

impl StridedView {
    /// Whether a value of shape `dims` seen through this view is its binding's elements in
    /// the same order from the start: element `i` of the value is element `i` of the binding.
    pub fn is_identity(&self, dims: &[usize]) -> bool {
        let dense = fusegraph_ir::Shape::new(dims.to_vec()).strides();
        self.offset == 0 && dims.iter().zip(&dense).zip(&self.strides).all(|((&d, &r), &s)| s == r || d == 1)
    }
}

/// The strided view `node` is of one of `kernel`'s inputs, or `None` where something other
/// than a layout op lies between (arithmetic, a cast, a gather, a reshape of a view whose
/// axes cannot be merged or split without a copy).
pub fn strided_view(g: &Graph, kernel: &Kernel, node: NodeId) -> Option<StridedView> {
    view_of(g, kernel, node, false)
}

/// The strided view `node` is of the value its layout ops start from, a kernel input or a
/// computed member (`leaf`, which may then be a member): how `node`'s elements index that
/// value's. `None` only for a node outside the kernel. Which strides are 0 says along which
/// axes `node` is constant (a per-channel value broadcast over a product's columns).
pub fn index_view(g: &Graph, kernel: &Kernel, node: NodeId) -> Option<StridedView> {
    view_of(g, kernel, node, true)
}

/// [`strided_view`], or with `computed` [`index_view`].
fn view_of(g: &Graph, kernel: &Kernel, node: NodeId, computed: bool) -> Option<StridedView> {
    let dims = g.ty(node).shape.dims();
    let zero_unit = |strides: Vec<usize>| -> Vec<usize> {
        strides.into_iter().zip(dims).map(|(s, &d)| if d == 1 { 0 } else { s }).collect()
    };
    let identity =
        || StridedView { leaf: node, offset: 0, strides: zero_unit(fusegraph_ir::Shape::new(dims.to_vec()).strides()) };
    if kernel.inputs.contains(&node) {
        return Some(identity());
    }
    if !kernel.members.contains(&node) {
        return None;
    }
    let op = &g.node(node).op;
    let layout = matches!(op, Op::Reshape { .. } | Op::Transpose { .. } | Op::Slice { .. } | Op::Broadcast { .. });
    let inner = match g.operands(node).first() {
        Some(&operand) if layout => view_of(g, kernel, operand, computed),
        _ => None,
    };
    let Some(inner) = inner else { return computed.then(identity) };
    let od = g.ty(g.operands(node)[0]).shape.dims();
    let (offset, strides) = match op {
        Op::Reshape { .. } => match reshape_strides(od, &inner.strides, dims) {
            Some(strides) => (inner.offset, strides),
            None => return computed.then(identity),
        },
        Op::Transpose { perm } => (inner.offset, perm.iter().map(|&p| inner.strides[p]).collect()),
        Op::Slice { start, stride, .. } => {
            let offset = inner.offset + start.iter().zip(&inner.strides).map(|(a, s)| a * s).sum::<usize>();
            (offset, inner.strides.iter().zip(stride).map(|(s, t)| s * t).collect())
        }
        Op::Broadcast { dims: map, .. } => {
            let mut strides = vec![0; dims.len()];
            for (j, &d) in map.iter().enumerate() {
                if od[j] != 1 {
                    strides[d] += inner.strides[j];
                }
            }
            (inner.offset, strides)
        }
        _ => return computed.then(identity),
    };
    Some(StridedView { leaf: inner.leaf, offset, strides: zero_unit(strides) })
}

/// `node` as a view whose last axis is one or more axes of its binding: `(view, axes)` with
/// `axes` the (length, stride) of each, outermost first; the view's last stride is the
/// innermost axis's. Where `node` is a [`strided_view`] that is its one axis; else `node`
/// may be a reshape that merges axes which are not evenly spaced in memory into its last
/// axis, such as attention's heads merged back (`[t, h, d] → [t, h·d]` after a transpose).
pub fn split_last_axis_view(g: &Graph, kernel: &Kernel, node: NodeId) -> Option<(StridedView, Vec<(usize, usize)>)> {
    let dims = g.ty(node).shape.dims();
    let last = *dims.last()?;
    if let Some(v) = strided_view(g, kernel, node) {
        let s = *v.strides.last()?;
        return Some((v, vec![(last, s)]));
    }
    if !kernel.members.contains(&node) || !matches!(g.node(node).op, Op::Reshape { .. }) {
        return None;
    }
    let input = g.operands(node)[0];
    let inner = strided_view(g, kernel, input)?;
    let din = g.ty(input).shape.dims();
    // The shortest suffix of the input's axes that makes up the last axis.
    let (mut p, mut prod) = (din.len(), 1);
    while prod < last && p > 0 {
        p -= 1;
        prod *= din[p];
    }
    if prod != last {
        return None;
    }
    let mut strides = reshape_strides(&din[..p], &inner.strides[..p], &dims[..dims.len() - 1])?;
    let axes: Vec<(usize, usize)> =
        din[p..].iter().copied().zip(inner.strides[p..].iter().copied()).filter(|&(d, _)| d != 1).collect();
    strides.push(axes.last()?.1);
    Some((StridedView { leaf: inner.leaf, offset: inner.offset, strides }, axes))
}

/// The strides of `to_dims` viewing the elements that `dims` with `strides` view, in
/// row-major order, or `None` where that needs a copy (merging axes that are not contiguous
/// with each other). Axes of length 1 take stride 0.
pub fn reshape_strides(dims: &[usize], strides: &[usize], to_dims: &[usize]) -> Option<Vec<usize>> {
    if dims.iter().product::<usize>() != to_dims.iter().product::<usize>() || to_dims.contains(&0) {
        return None;
    }
    let from: Vec<(usize, usize)> =
        dims.iter().copied().zip(strides.iter().copied()).filter(|&(d, _)| d != 1).collect();
    let mut out = vec![0; to_dims.len()];
    let (mut i, mut j) = (0, 0);
    while j < to_dims.len() {
        if to_dims[j] == 1 {
            j += 1;
            continue;
        }
        // The smallest groups from[i0..=i] and to_dims[j0..=j] with equal products.
        let (i0, j0) = (i, j);
        let (mut pi, mut pj) = (from.get(i)?.0, to_dims[j]);
        while pi != pj {
            if pi < pj {
                i += 1;
                pi *= from.get(i)?.0;
            } else {
                j += 1;
                pj *= *to_dims.get(j)?;
            }
        }
        if (i0..i).any(|t| from[t].1 != from[t + 1].1 * from[t + 1].0) {
            return None;
        }
        let mut s = from[i].1;
        for t in (j0..=j).rev() {
            out[t] = if to_dims[t] == 1 { 0 } else { s };
            s *= to_dims[t];
        }
        i += 1;
        j += 1;
    }
    (i == from.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshape_splits_and_merges_contiguous_axes_only() {
        // Row-major [2, 3, 4] → [6, 4] → [2, 12] and with unit axes anywhere.
        assert_eq!(reshape_strides(&[2, 3, 4], &[12, 4, 1], &[6, 4]), Some(vec![4, 1]));
        assert_eq!(reshape_strides(&[2, 3, 4], &[12, 4, 1], &[2, 12]), Some(vec![12, 1]));
        assert_eq!(reshape_strides(&[6, 4], &[4, 1], &[1, 2, 1, 3, 4]), Some(vec![0, 12, 0, 4, 1]));
        // A transposed [4, 6] (strides [1, 4]) splits its axes but cannot merge them.
        assert_eq!(reshape_strides(&[4, 6], &[1, 4], &[2, 2, 2, 3]), Some(vec![2, 1, 12, 4]));
        assert_eq!(reshape_strides(&[4, 6], &[1, 4], &[24]), None);
        // Every other column of a [4, 8] matrix is every other element: it merges. Every
        // other one of its first 6 columns is not evenly spaced across rows.
        assert_eq!(reshape_strides(&[4, 4], &[8, 2], &[16]), Some(vec![2]));
        assert_eq!(reshape_strides(&[4, 3], &[8, 2], &[12]), None);
        assert_eq!(reshape_strides(&[4, 4], &[8, 2], &[2, 2, 4]), Some(vec![16, 8, 2]));
        // Broadcast axes (stride 0) merge with each other.
        assert_eq!(reshape_strides(&[3, 5, 2], &[0, 0, 1], &[15, 2]), Some(vec![0, 1]));
        assert_eq!(reshape_strides(&[2, 3], &[3, 1], &[7]), None);
    }
}
