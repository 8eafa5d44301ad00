//! Batch-norm folding for inference graphs: the classic conv+BN fusion.
//!
//! Matches `(y − mean)·scale + beta`, each statistic a per-channel vector broadcast along the
//! channel axis, where `y = conv2d(x, w)` (channel axis 1) or `y = matmul(x, w)` with a 2-D
//! `w` (channel axis last), and `y` and the intermediate values have no other users. Rewrites
//! it to `op(x, w·scale) + (beta − mean·scale)`: the scale moves into the weights and the
//! shift becomes a bias, so the epilogue is a single add. The scale (typically
//! `gamma·rsqrt(var + eps)`, see `Tensor::batch_norm`) is computed from whatever values
//! the graph has; with constant statistics, constant folding then folds the new weights.

use super::replace;
use fusegraph_ir::{BinaryOp, Graph, NodeId, Op, Result};

/// The per-channel vector broadcast by `b` along `axis`, if `b` is such a broadcast.
fn channel_vector(g: &Graph, b: NodeId, axis: usize) -> Option<NodeId> {
    let Op::Broadcast { dims, .. } = &g.node(b).op else { return None };
    let x = g.operands(b)[0];
    let xd = g.ty(x).shape.dims();
    let big: Vec<usize> = (0..xd.len()).filter(|&i| xd[i] != 1).collect();
    (big.len() == 1 && dims[big[0]] == axis).then_some(x)
}

fn binary(g: &Graph, id: NodeId, op: BinaryOp) -> Option<(NodeId, NodeId)> {
    match g.node(id).op {
        Op::Binary(b) if b == op => {
            let o = g.operands(id);
            Some((o[0], o[1]))
        }
        _ => None,
    }
}

fn sole_user(g: &Graph, id: NodeId, outputs: &[NodeId]) -> bool {
    g.users(id).len() == 1 && !outputs.contains(&id)
}

/// Folds every matching batch norm; returns how many.
pub fn fold_batch_norms(g: &mut Graph, outputs: &mut [NodeId]) -> Result<usize> {
    let mut count = 0;
    for add in g.topo_order()? {
        if !g.contains(add) {
            continue;
        }
        let Some((scaled, beta_b)) = binary(g, add, BinaryOp::Add) else { continue };
        let Some((centered, scale_b)) = binary(g, scaled, BinaryOp::Mul) else { continue };
        let Some((y, mean_b)) = binary(g, centered, BinaryOp::Sub) else { continue };
        let (axis, is_conv) = match g.node(y).op {
            Op::Conv2d { .. } => (1, true),
            Op::MatMul if g.ty(g.operands(y)[1]).shape.rank() == 2 => (g.ty(y).shape.rank() - 1, false),
            _ => continue,
        };
        if !(sole_user(g, y, outputs) && sole_user(g, centered, outputs) && sole_user(g, scaled, outputs)) {
            continue;
        }
        let (Some(mean), Some(scale), Some(beta)) =
            (channel_vector(g, mean_b, axis), channel_vector(g, scale_b, axis), channel_vector(g, beta_b, axis))
        else {
            continue;
        };
        let channels = g.ty(y).shape.dims()[axis];
        let ops = g.operands(y);
        let (x, w) = (ops[0], ops[1]);
        let wdims = g.ty(w).shape.dims().to_vec();
        let flat = |g: &mut Graph, v: NodeId| g.add_op(Op::Reshape { shape: vec![channels] }, &[v]);
        let (mean, scale, beta) = (flat(g, mean)?, flat(g, scale)?, flat(g, beta)?);
        let w_axis = if is_conv { 0 } else { 1 };
        let scale_w = g.add_op(Op::Broadcast { shape: wdims, dims: vec![w_axis] }, &[scale])?;
        let new_w = g.add_op(Op::Binary(BinaryOp::Mul), &[w, scale_w])?;
        let new_y = g.add_op(g.node(y).op.clone(), &[x, new_w])?;
        let shift = g.add_op(Op::Binary(BinaryOp::Mul), &[mean, scale])?;
        let bias = g.add_op(Op::Binary(BinaryOp::Sub), &[beta, shift])?;
        let ydims = g.ty(y).shape.dims().to_vec();
        let bias_b = g.add_op(Op::Broadcast { shape: ydims, dims: vec![axis] }, &[bias])?;
        let out = g.add_op(Op::Binary(BinaryOp::Add), &[new_y, bias_b])?;
        replace(g, outputs, add, out);
        count += 1;
    }
    Ok(count)
}
