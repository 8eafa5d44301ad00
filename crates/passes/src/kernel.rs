//! Partitioning a graph into kernels: the unit the code generator lowers and the runtime
//! dispatches.
//!
//! With [`FusionMode::Off`] every non-leaf primitive op (and every `full`/`iota`) is its own
//! kernel: the baseline of fused-vs-unfused comparisons. Inputs, parameters and constants are
//! never kernels; they are values in memory.

use fusegraph_ir::{Graph, NodeId, Op};
use std::collections::{BTreeMap, BTreeSet};

/// How aggressively ops are grouped into kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FusionMode {
    /// One kernel per primitive op.
    Off,
    /// Group ops into fused kernels (see the fusion pass).
    #[default]
    On,
}

/// What a kernel's main loop iterates over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelKind {
    /// One invocation per output element (or per packed word of f16 output).
    Loop,
    /// One workgroup per row: every reduction in the kernel reduces `axes` of a value of
    /// `shape`; the workgroup reduces its row cooperatively in workgroup memory, keeps each
    /// result for the rest of the kernel, then writes the row's outputs.
    Row {
        /// The shape being reduced.
        shape: Vec<usize>,
        /// The reduced axes.
        axes: Vec<usize>,
    },
    /// Memory-efficient attention ([`crate::attention`]): the single output is `p·v` with
    /// `p = softmax(logits)` over the last axis; one invocation per output row walks that
    /// row's logits once (the online softmax), so neither the logits nor `p` are stored.
    Attention {
        /// The softmax's input, computed per element by the kernel's members.
        logits: NodeId,
    },
}

/// A group of nodes lowered to one compute shader.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// How the kernel iterates.
    pub kind: KernelKind,
    /// Nodes computed inside the kernel, in topological order.
    pub members: Vec<NodeId>,
    /// Members whose values are written to memory (used outside the kernel or graph outputs).
    pub outputs: Vec<NodeId>,
    /// Values read from memory: operands of members that are not members themselves.
    pub inputs: Vec<NodeId>,
}

/// Whether a node is a value in memory rather than something a kernel computes.
pub fn is_memory_leaf(op: &Op) -> bool {
    matches!(op, Op::Input { .. } | Op::Parameter { .. } | Op::Constant { .. })
}

/// Builds a kernel from its members, deriving inputs and outputs against the graph.
pub fn make_kernel(g: &Graph, members: Vec<NodeId>, graph_outputs: &[NodeId], live: &BTreeSet<NodeId>) -> Kernel {
    let set: BTreeSet<NodeId> = members.iter().copied().collect();
    let inputs = kernel_inputs(g, &members);
    let outputs = members
        .iter()
        .copied()
        .filter(|m| graph_outputs.contains(m) || g.users(*m).iter().any(|u| live.contains(u) && !set.contains(u)))
        .collect();
    Kernel { kind: KernelKind::Loop, members, outputs, inputs }
}

/// The values `members` read from memory: their operands that are not members, in order of
/// first use.
pub fn kernel_inputs(g: &Graph, members: &[NodeId]) -> Vec<NodeId> {
    let set: BTreeSet<NodeId> = members.iter().copied().collect();
    let mut inputs = Vec::new();
    for &m in members {
        for o in g.operands(m) {
            if !set.contains(&o) && !inputs.contains(&o) {
                inputs.push(o);
            }
        }
    }
    inputs
}

/// For each of `kernels`, its members that no other kernel computes (its own values, stored
/// or not). Code generation may keep such a value in more precision than its dtype (an f16
/// value in f32: XLA's excess precision) without two copies of one value ever disagreeing:
/// a value two kernels compute is computed from rounded operands and rounded in both, and
/// one a kernel stores is rounded before it is stored, so what another kernel loads or
/// recomputes is what this one rounded (a max-reduction's backward compares a recomputed
/// value with the stored maximum).
pub fn unshared_members(kernels: &[Kernel]) -> Vec<Vec<NodeId>> {
    let mut computed: BTreeMap<NodeId, usize> = BTreeMap::new();
    for k in kernels {
        for &m in &k.members {
            *computed.entry(m).or_default() += 1;
        }
    }
    kernels.iter().map(|k| k.members.iter().copied().filter(|m| computed[m] == 1).collect()).collect()
}

/// Operands that an op reads at the same linear index as the element it computes
/// (elementwise ops and reshapes). Chains of such edges from a kernel output form its
/// *region*: values computed once per output element and kept in registers.
pub fn same_index_operands(g: &Graph, id: NodeId) -> Vec<NodeId> {
    let node = g.node(id);
    if node.op.is_elementwise() || matches!(node.op, Op::Reshape { .. }) {
        g.operands(id)
    } else {
        Vec::new()
    }
}

/// The region of each output of a kernel: the members reachable from it through
/// same-index edges, in topological (member) order, the output last.
pub fn regions(g: &Graph, kernel: &Kernel) -> Vec<(NodeId, Vec<NodeId>)> {
    let members = MemberOrder::of(kernel);
    kernel.outputs.iter().map(|&o| (o, members.region(g, o))).collect()
}

/// The members of `kernel` reachable from `root` through same-index edges (`root` itself
/// when it is one), in member order: the values computed at `root`'s element index.
pub fn region_of(g: &Graph, kernel: &Kernel, root: NodeId) -> Vec<NodeId> {
    MemberOrder::of(kernel).region(g, root)
}

/// A kernel's members by node, with their places in member order: built once per kernel, so
/// that questions asked per output cost the output's region rather than the whole kernel (a
/// training step's merged optimizer kernel has thousands of members and hundreds of outputs).
pub(crate) struct MemberOrder(BTreeMap<NodeId, usize>);

impl MemberOrder {
    pub(crate) fn of(kernel: &Kernel) -> MemberOrder {
        MemberOrder(kernel.members.iter().enumerate().map(|(i, &m)| (m, i)).collect())
    }

    pub(crate) fn contains(&self, n: &NodeId) -> bool {
        self.0.contains_key(n)
    }

    /// [`region_of`] on this kernel.
    pub(crate) fn region(&self, g: &Graph, root: NodeId) -> Vec<NodeId> {
        if !self.contains(&root) {
            return Vec::new();
        }
        let mut set = BTreeSet::from([root]);
        let mut stack = vec![root];
        while let Some(n) = stack.pop() {
            for p in same_index_operands(g, n) {
                if self.contains(&p) && set.insert(p) {
                    stack.push(p);
                }
            }
        }
        let mut region: Vec<NodeId> = set.into_iter().collect();
        region.sort_by_key(|m| self.0[m]);
        region
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusegraph_ir::{DType, GraphBuilder};

    /// A member two kernels compute is nobody's own; a kernel's stored outputs are its own.
    #[test]
    fn unshared_members_leave_out_what_two_kernels_compute() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F16, [8]).unwrap();
        let e = x.exp().unwrap();
        let (y, z) = (e.add(&x).unwrap(), e.mul(&x).unwrap());
        let g = b.graph();
        let kernel = |members: Vec<NodeId>, out: NodeId| Kernel {
            kind: KernelKind::Loop,
            members,
            outputs: vec![out],
            inputs: vec![x.id()],
        };
        // `e` recomputed by both kernels, as fusion duplicates a cheap producer.
        let kernels = [kernel(vec![e.id(), y.id()], y.id()), kernel(vec![e.id(), z.id()], z.id())];
        assert_eq!(unshared_members(&kernels), vec![vec![y.id()], vec![z.id()]]);
        let one = [kernel(vec![e.id(), y.id(), z.id()], y.id())];
        assert_eq!(unshared_members(&one), vec![vec![e.id(), y.id(), z.id()]]);
        let _ = g;
    }
}

/// The most rows a product may have to take the matrix–vector kernel (each of its
/// invocations holds an accumulator per row).
pub const GEMV_MAX_ROWS: usize = 8;

/// Workgroup memory the matrix–vector kernel uses at most where the adapter's limit is not
/// known: WebGPU's default `max_compute_workgroup_storage_size`, which every adapter has.
pub const GEMV_STAGE_BYTES: usize = 16384;

/// The workgroup memory, at most, of a matrix–vector kernel whose left operand of `rows` rows
/// of `k` is computed in its prologue with `reductions` row reductions (a layer norm's two),
/// for `products` products of that operand per output (two for a gate and an up projection
/// under one epilogue) whose weights are read along `k` or not (`k_contiguous`): the operand staged
/// as f32 (`rows · k`), a partial sum per invocation, product, row and column (one column
/// along `k`; else at most four for two rows, two for four, one beyond), and a tree of 256
/// values per reduction. `None` where `k` is not a multiple of 4 (the operand is staged as
/// `vec4`s). Fusion merges such a prologue only within the adapter's limit
/// (`FusionOptions::gemv_stage_bytes`), so the kernel can always stage it.
pub fn gemv_prologue_bytes(
    rows: usize,
    k: usize,
    reductions: usize,
    products: usize,
    k_contiguous: bool,
) -> Option<usize> {
    const INVOCATIONS: usize = 256;
    let columns = match (k_contiguous, rows) {
        (true, _) => 1,
        (false, 0..=2) => 4,
        (false, 3 | 4) => 2,
        (false, _) => 1,
    };
    let partials = INVOCATIONS * products * rows * columns;
    k.is_multiple_of(4).then(|| 4 * (rows * k + partials + INVOCATIONS * reductions))
}

/// The binding a matmul's right operand reads along `k`: below casts, an odd number of swaps
/// of the last two axes of a value the kernel reads (`members` does not hold it) — a weight
/// stored `[out, in]` and read transposed, as PyTorch and GGUF store them. `None` for any
/// other right operand.
pub fn rhs_along_k(g: &Graph, members: &[NodeId], mm: NodeId) -> Option<NodeId> {
    rhs_below_swaps(g, members, mm, false)
}

/// Whether a matmul's right operand lies along `k` in memory: as [`rhs_along_k`], also
/// through slices that step by one along that axis (a cache's live positions), dynamic
/// update slices' operands (a cache written in the kernel: outside the window, its elements
/// where they lie) and gathers along an axis before the last two (matrices chosen from a
/// stack). The matrix–vector kernel then reads four adjacent `k` a step;
/// [`rhs_along_k`] names the binding where nothing lies between.
pub fn rhs_contiguous_k(g: &Graph, members: &[NodeId], mm: NodeId) -> bool {
    rhs_below_swaps(g, members, mm, true).is_some()
}

/// The value below `mm`'s right operand, an odd number of swaps of its last two axes away
/// through casts (and, where `views`, unit-step slices along the axis that becomes `k`,
/// dynamic update slices' operands and gathers of whole matrices); `None` past anything else.
fn rhs_below_swaps(g: &Graph, members: &[NodeId], mm: NodeId, views: bool) -> Option<NodeId> {
    let (mut n, mut swapped) = (g.operands(mm)[1], false);
    while members.contains(&n) {
        match &g.node(n).op {
            Op::Cast { .. } => {}
            Op::DynamicUpdateSlice { .. } if views => {}
            // Adjacent along the axis that becomes `k` (the last below an odd number of swaps).
            Op::Slice { stride, .. }
                if views && stride.len() >= 2 && stride[stride.len() - 2 + usize::from(swapped)] == 1 => {}
            // Matrices gathered from a stack by a leading index (a mixture's chosen experts):
            // each keeps its layout.
            Op::Gather { axis } if views && axis + 2 < g.ty(g.operands(n)[0]).shape.rank() => {}
            Op::Transpose { perm } if swaps_last_two(perm) => swapped = !swapped,
            _ => return None,
        }
        n = g.operands(n)[0];
    }
    swapped.then_some(n)
}

/// Whether `perm` swaps the last two axes and keeps the others.
fn swaps_last_two(perm: &[usize]) -> bool {
    let r = perm.len();
    r >= 2 && perm[r - 2] == r - 1 && perm[r - 1] == r - 2 && perm[..r - 2].iter().enumerate().all(|(a, &p)| a == p)
}

/// The row prologue of a kernel of products of at most [`GEMV_MAX_ROWS`] rows (fusion's
/// `FusionOptions::gemv`): the members their left operand is computed from, reductions over
/// the last axis of one `[.., k]` value among them (a layer norm). The matrix–vector kernel
/// reduces and stages the operand one row at a time, so nothing else reads the prologue.
#[derive(Clone, Debug, PartialEq)]
pub struct RowPrologue {
    /// The members the products' left operand is computed from, reductions included.
    pub members: BTreeSet<NodeId>,
    /// The value (below reshapes and casts) whose rows every product reads as its left
    /// operand.
    pub rows_of: NodeId,
    /// The reductions, in member order.
    pub reduces: Vec<NodeId>,
    /// The shape each reduction reduces, over its last axis.
    pub shape: Vec<usize>,
}

impl RowPrologue {
    /// The reduced axes (the last).
    pub fn axes(&self) -> Vec<usize> {
        vec![self.shape.len() - 1]
    }
}

/// The row prologue of a kernel of `members` (in topological order) storing `outputs`:
/// `Some` where its matrix products' left operands come from one value `rows_of` computed
/// from the kernel's reductions, all over the last axis of one shape whose rows of `k` each
/// product reads as its `[.., m, k]` left operand, `m` at most [`GEMV_MAX_ROWS`], with room in
/// `stage_bytes` of workgroup memory ([`gemv_prologue_bytes`]); no output, and nothing but
/// those products' left operands, reads the prologue. The rest of the kernel is not checked.
pub fn row_prologue(g: &Graph, members: &[NodeId], outputs: &[NodeId], stage_bytes: usize) -> Option<RowPrologue> {
    let is = |n: NodeId, f: fn(&Op) -> bool| f(&g.node(n).op);
    let reduces: Vec<NodeId> =
        members.iter().copied().filter(|&n| is(n, |op| matches!(op, Op::Reduce { .. }))).collect();
    let products: Vec<NodeId> = members.iter().copied().filter(|&n| is(n, |op| matches!(op, Op::MatMul))).collect();
    let (&first, &reduce) = (products.first()?, reduces.first()?);
    let set: BTreeSet<NodeId> = members.iter().copied().collect();
    let mut prologue = BTreeSet::new();
    let mut stack: Vec<NodeId> = products.iter().map(|&p| g.operands(p)[0]).collect();
    while let Some(n) = stack.pop() {
        if set.contains(&n) && prologue.insert(n) {
            stack.extend(g.operands(n));
        }
    }
    let read_outside = members.iter().filter(|m| !prologue.contains(m)).any(|&m| {
        let lhs_of_product = |i: usize| i == 0 && products.contains(&m);
        g.operands(m).iter().enumerate().any(|(i, o)| prologue.contains(o) && !lhs_of_product(i))
    });
    if read_outside || outputs.iter().any(|o| prologue.contains(o)) || reduces.iter().any(|r| !prologue.contains(r)) {
        return None;
    }
    let source = |mut n: NodeId| {
        while prologue.contains(&n) && matches!(g.node(n).op, Op::Reshape { .. } | Op::Cast { .. }) {
            n = g.operands(n)[0];
        }
        n
    };
    let rows_of = source(g.operands(first)[0]);
    if !prologue.contains(&rows_of) || products.iter().any(|&p| source(g.operands(p)[0]) != rows_of) {
        return None;
    }
    let shape = g.ty(g.operands(reduce)[0]).shape.dims().to_vec();
    let last = vec![shape.len().checked_sub(1)?];
    let same = |r: &NodeId| {
        matches!(&g.node(*r).op, Op::Reduce { axes, .. } if *axes == last)
            && g.ty(g.operands(*r)[0]).shape.dims() == shape.as_slice()
    };
    let (full, k) = (shape.iter().product::<usize>(), shape[shape.len() - 1]);
    // Each product reads all the rows as its `[.., m, k]` left operand, `m` rows a batch entry
    // (a softmax's probabilities, a row per head): a workgroup stages the `m` rows of its
    // entry.
    let lhs_rows = |p: NodeId| {
        let d = g.ty(g.operands(p)[0]).shape.dims();
        (d.len() >= 2 && d[d.len() - 1] == k && g.ty(g.operands(p)[0]).shape.numel() == full).then(|| d[d.len() - 2])
    };
    let rows = products.iter().map(|&p| lhs_rows(p)).collect::<Option<Vec<usize>>>()?.into_iter().max()?;
    let contiguous = products.iter().all(|&p| rhs_contiguous_k(g, members, p));
    // Sibling products (one an output) take one product's partials at a time; paired ones
    // (one output) all of theirs.
    let per_output = products.len().div_ceil(outputs.len().max(1));
    let bytes = gemv_prologue_bytes(rows, k, reduces.len(), per_output, contiguous);
    let fits = rows <= GEMV_MAX_ROWS && bytes.is_some_and(|b| b <= stage_bytes);
    (reduces.iter().all(same) && fits && g.ty(rows_of).shape.numel() == full).then_some(RowPrologue {
        members: prologue,
        rows_of,
        reduces,
        shape,
    })
}
