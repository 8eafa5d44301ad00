//! Sibling products combined: matrix products that share their left operand and whose right
//! operands are weights of one shape (parameters that no update writes) become one batched
//! product over the weights stacked into one parameter.
//!
//! Attention's query, key and value projections read one layer-norm output:
//! `q = x·Wq + bq`, `k = x·Wk + bk`, `v = x·Wv + bv` are three kernels, each loading `x`
//! again. Combined, `y = x·W + b` with `W = [Wq; Wk; Wv]` (`[3, d, d]`) and `b = [bq; bk; bv]`
//! (`[3, d]`) is one kernel with three times the workgroups (which a GPU that one `[s, d]`
//! output leaves idle can use), and `q`, `k`, `v` are `y[0]`, `y[1]`, `y[2]`, which the
//! kernels reading them read in place as they read any view. A gated MLP's gate and up
//! projections combine the same way (TVM's and TensorRT's "combine parallel dense").
//!
//! The stacked weight is a new parameter whose parts are the old ones, each a contiguous
//! range of its bytes: the runtime writes and reads each part where it lies
//! ([`Joined`] names them), so combining costs no copy and no byte of memory. That is why
//! the weights must be parameters no update writes (a training step's update would write the
//! part's name) and why they must have one shape (a stack along a new leading axis keeps
//! each part contiguous; joining columns of different widths would interleave them). Each
//! part must also fill whole 4-byte words (f16 parts an even count), since a part is written
//! and read back on its own.
//!
//! The epilogue stacks too: where every product's only use is the same elementwise op with
//! a bias parameter broadcast along the rows, in the same operand position, the biases
//! stack into a second parameter and the op applies once to the combined product, so the
//! bias stays in the product's kernel. Products with different epilogues form separate
//! groups. Numerics are unchanged: each output element is the same dot product over `k`,
//! accumulated by the same kernel family.

use fusegraph_ir::{DType, Graph, NodeId, Op, Result, TensorType};
use std::collections::{BTreeMap, BTreeSet};

/// A parameter [`combine_products`] made by stacking others along a new leading axis: part
/// `i` is elements `i · n .. (i + 1) · n` of it, where `n` is one part's element count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Joined {
    /// The stacked parameter's name (`combined(q.w, k.w, v.w)`), one no user parameter has.
    pub name: String,
    /// The parts' names, in stacking order.
    pub parts: Vec<String>,
    /// One part's type.
    pub part: TensorType,
}

/// One group of products [`combine_products`] combined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Combined {
    /// The shared left operand.
    pub lhs: NodeId,
    /// The products that were combined, in node order (removed from the graph).
    pub products: Vec<NodeId>,
    /// The stacked weights: a parameter `[g, k, n]`.
    pub weights: Joined,
    /// The stacked biases of the joined epilogue, a parameter `[g, n]`, if any.
    pub biases: Option<Joined>,
    /// The combined product `[g, m, n]` (before the joined epilogue, if any); a batched left
    /// operand `[b.., m', k]` is read as `[b·m', k]`, so `m` counts the rows of every batch
    /// entry.
    pub product: NodeId,
    /// The views that replaced each product (or its epilogue), in the order of `products`.
    pub slices: Vec<NodeId>,
}

/// The epilogue a product takes into the group: its only user, an elementwise binary op
/// whose other operand broadcasts a bias parameter along the product's last axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Epilogue {
    /// The op node.
    node: NodeId,
    /// The bias parameter (rank 1).
    bias: NodeId,
    /// Whether the product is the op's first operand.
    product_first: bool,
}

/// A parameter no update writes and no output names: its bytes may become part of a stack.
fn stackable(g: &Graph, id: NodeId, outputs: &[NodeId], updated: &BTreeSet<String>) -> bool {
    // Parts are written and read as whole 4-byte words, and addressed by element (so not
    // a block type's blocks).
    let dtype = g.ty(id).dtype;
    let whole_words = dtype.data_bytes(g.ty(id).shape.numel()).is_multiple_of(4) && dtype.block().is_none();
    matches!(&g.node(id).op, Op::Parameter { name } if !updated.contains(name)) && !outputs.contains(&id) && whole_words
}

fn epilogue(g: &Graph, product: NodeId, outputs: &[NodeId], updated: &BTreeSet<String>) -> Option<Epilogue> {
    let [user] = g.users(product)[..] else { return None };
    if outputs.contains(&product) || !matches!(g.node(user).op, Op::Binary(_)) {
        return None;
    }
    let ops = g.operands(user);
    let product_first = ops[0] == product;
    let other = ops[if product_first { 1 } else { 0 }];
    if other == product {
        return None;
    }
    let rank = g.ty(product).shape.rank();
    let Op::Broadcast { dims, .. } = &g.node(other).op else { return None };
    let bias = g.operands(other)[0];
    let columns = g.ty(product).shape.dims()[rank - 1];
    (dims[..] == [rank - 1] && g.ty(bias).shape.dims() == [columns] && stackable(g, bias, outputs, updated))
        .then_some(Epilogue { node: user, bias, product_first })
}

/// What products must share to combine: the left operand, the weight's type, and the
/// epilogue's op and operand position (if any).
type GroupKey = (NodeId, Vec<usize>, DType, Option<(&'static str, bool)>);

/// Combines every group of two or more matrix products of `g` that share their left operand
/// and whose right operands are 2-D parameters of one type that no name in `updated` writes,
/// in place: the weights (and the biases of a joined epilogue) become stacked parameters
/// ([`Joined`]), and every use of a product (or of its epilogue) names its view of the
/// combined product. A product that is (or whose epilogue is) a graph output stays alone: its
/// view would be copied out by a kernel of its own. Other uses of a stacked parameter read
/// its part of the stack. Returns the groups combined, in order of their first product.
pub fn combine_products(g: &mut Graph, outputs: &[NodeId], updated: &BTreeSet<String>) -> Result<Vec<Combined>> {
    combine_products_where(g, outputs, updated, &|_, _| true)
}

/// [`combine_products`] for the products `take` accepts only.
pub fn combine_products_where(
    g: &mut Graph,
    outputs: &[NodeId],
    updated: &BTreeSet<String>,
    take: &dyn Fn(&Graph, NodeId) -> bool,
) -> Result<Vec<Combined>> {
    let mut groups: BTreeMap<GroupKey, Vec<(NodeId, Option<Epilogue>)>> = BTreeMap::new();
    let mut taken: BTreeSet<NodeId> = BTreeSet::new();
    for id in g.node_ids() {
        if !matches!(g.node(id).op, Op::MatMul) || !take(g, id) {
            continue;
        }
        let [lhs, rhs] = g.operands(id)[..] else { continue };
        if lhs == rhs || g.ty(rhs).shape.rank() != 2 || !stackable(g, rhs, outputs, updated) {
            continue;
        }
        let ep = epilogue(g, id, outputs, updated);
        // A view read back would be copied out by a kernel of its own: nothing saved.
        if outputs.contains(&ep.map_or(id, |e| e.node)) {
            continue;
        }
        let key = (
            lhs,
            g.ty(rhs).shape.dims().to_vec(),
            g.ty(id).dtype,
            ep.map(|e| (g.node(e.node).op.name(), e.product_first)),
        );
        // A weight (or bias) is a part of one stack only.
        if !taken.insert(rhs) || ep.is_some_and(|e| !taken.insert(e.bias)) {
            continue;
        }
        groups.entry(key).or_default().push((id, ep));
    }
    let mut groups: Vec<_> = groups.into_iter().filter(|(_, members)| members.len() >= 2).collect();
    groups.sort_by_key(|(_, members)| members[0].0);
    let mut names: BTreeSet<String> = g
        .node_ids()
        .into_iter()
        .filter_map(|id| match &g.node(id).op {
            Op::Parameter { name } => Some(name.clone()),
            _ => None,
        })
        .collect();
    let mut done: Vec<Combined> = Vec::new();
    // A group's left operand may be a product (or epilogue) or a stacked weight that an
    // earlier group replaced by a view.
    let mut replaced: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    for ((lhs, ..), members) in groups {
        let lhs = replaced.get(&lhs).copied().unwrap_or(lhs);
        let group = combine_group(g, outputs, lhs, &members, &mut names, &mut replaced)?;
        for (&(p, ep), &slice) in members.iter().zip(&group.slices) {
            replaced.insert(ep.map_or(p, |e| e.node), slice);
        }
        done.push(group);
    }
    Ok(done)
}

/// Entry `i` of `stacked` along its leading axis, as a value of `shape`: a view.
fn part_view(g: &mut Graph, stacked: NodeId, i: usize, shape: &[usize]) -> Result<NodeId> {
    let dims = g.ty(stacked).shape.dims().to_vec();
    let mut start = vec![0; dims.len()];
    let mut limit = dims.clone();
    start[0] = i;
    limit[0] = i + 1;
    let slice = g.add_op(Op::Slice { start, limit, stride: vec![1; dims.len()] }, &[stacked])?;
    g.add_op(Op::Reshape { shape: shape.to_vec() }, &[slice])
}

/// Stacks parameters `parts` (one type) into a new parameter `[g, ..]` and points every other
/// use of each at its part of the stack (recorded in `replaced`).
fn stack(
    g: &mut Graph,
    parts: &[NodeId],
    names: &mut BTreeSet<String>,
    replaced: &mut BTreeMap<NodeId, NodeId>,
) -> Result<(NodeId, Joined)> {
    let part_names: Vec<String> = parts
        .iter()
        .map(|&p| match &g.node(p).op {
            Op::Parameter { name } => name.clone(),
            _ => unreachable!("only parameters are stacked"),
        })
        .collect();
    let mut name = format!("combined({})", part_names.join(", "));
    while !names.insert(name.clone()) {
        name.push('\'');
    }
    let part = g.ty(parts[0]).clone();
    let mut dims = vec![parts.len()];
    dims.extend_from_slice(part.shape.dims());
    let stacked = g.add_leaf(Op::Parameter { name: name.clone() }, TensorType::new(part.dtype, dims))?;
    for (i, &p) in parts.iter().enumerate() {
        if !g.users(p).is_empty() {
            let view = part_view(g, stacked, i, part.shape.dims())?;
            g.replace_uses(p, view);
            replaced.insert(p, view);
        }
        g.remove(p);
    }
    Ok((stacked, Joined { name, parts: part_names, part }))
}

fn combine_group(
    g: &mut Graph,
    outputs: &[NodeId],
    lhs: NodeId,
    members: &[(NodeId, Option<Epilogue>)],
    names: &mut BTreeSet<String>,
    replaced: &mut BTreeMap<NodeId, NodeId>,
) -> Result<Combined> {
    let products: Vec<NodeId> = members.iter().map(|&(p, _)| p).collect();
    let rhs: Vec<NodeId> = products.iter().map(|&p| g.operands(p)[1]).collect();
    let shape = g.ty(products[0]).shape.dims().to_vec();
    let (rank, count) = (shape.len(), members.len());
    // A batched left operand joins its batch into the rows: `[b.., m, k]` as `[b·m, k]`.
    let rows: usize = shape[..rank - 1].iter().product();
    let columns = shape[rank - 1];
    let lhs_dims = g.ty(lhs).shape.dims().to_vec();
    let flat = match lhs_dims[..] {
        [_, _] => lhs,
        _ => g.add_op(Op::Reshape { shape: vec![rows, lhs_dims[lhs_dims.len() - 1]] }, &[lhs])?,
    };
    let (weights, wj) = stack(g, &rhs, names, replaced)?;
    let product = g.add_op(Op::MatMul, &[flat, weights])?;
    let wide = vec![count, rows, columns];
    let mut combined = product;
    let mut biases = None;
    if let Some(first) = members[0].1 {
        let eps: Vec<Epilogue> = members.iter().filter_map(|&(_, e)| e).collect();
        let broadcasts: Vec<NodeId> =
            eps.iter().map(|e| g.operands(e.node)[if e.product_first { 1 } else { 0 }]).collect();
        let op = g.node(first.node).op.clone();
        // The old epilogues' broadcasts go (their ops go below); the biases are stacked.
        for &b in &broadcasts {
            if g.users(b).len() == 1 && !outputs.contains(&b) {
                g.remove(b);
            }
        }
        let (stacked, bj) = stack(g, &eps.iter().map(|e| e.bias).collect::<Vec<_>>(), names, replaced)?;
        let b = g.add_op(Op::Broadcast { shape: wide.clone(), dims: vec![0, 2] }, &[stacked])?;
        let operands = if first.product_first { [product, b] } else { [b, product] };
        combined = g.add_op(op, &operands)?;
        biases = Some(bj);
    }
    let mut slices = Vec::with_capacity(count);
    for (i, &(p, ep)) in members.iter().enumerate() {
        let end = ep.map_or(p, |e| e.node);
        let view = part_view(g, combined, i, &shape)?;
        if let Some(name) = g.node(end).name.clone() {
            g.set_name(view, name);
        }
        g.replace_uses(end, view);
        if let Some(e) = ep {
            g.remove(e.node);
        }
        g.remove(p);
        slices.push(view);
    }
    Ok(Combined { lhs, products, weights: wj, biases, product, slices })
}
