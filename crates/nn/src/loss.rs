//! Losses, recorded into the graph as ordinary ops (so they fuse and differentiate like the
//! model).

use crate::error::{config, Result};
use fusegraph_ir::{DType, Tensor};

/// Mean cross-entropy of `logits: f[..., C]` against class indices `targets: i32[...]`
/// (`log_softmax` over the last axis, the target's log-probability picked with a one-hot
/// mask built in the graph). Returns a rank-0 tensor of the logits' dtype.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let rank = logits.rank();
    if rank == 0 || targets.dims() != &logits.dims()[..rank - 1] || !matches!(targets.dtype(), DType::I32) {
        return Err(config(format!(
            "cross_entropy: targets {} must be i32 with the logits' {} leading dims",
            targets.ty(),
            logits.ty()
        )));
    }
    let b = logits.builder();
    let axis = rank - 1;
    let logp = logits.log_softmax(axis)?;
    let classes = b.iota(DType::I32, logits.dims().to_vec(), axis)?;
    let t = targets.broadcast_in_dim(logits.dims().to_vec(), (0..axis).collect())?;
    let onehot = t.eq(&classes)?.cast(logits.dtype())?;
    let count: usize = logits.dims()[..axis].iter().product();
    let all: Vec<usize> = (0..rank).collect();
    Ok(logp.mul(&onehot)?.sum(&all, false)?.mul_scalar(-1.0 / count.max(1) as f64)?)
}

/// Mean squared error of `pred` against `target` (same type, float): a rank-0 tensor of
/// their dtype.
pub fn mse(pred: &Tensor, target: &Tensor) -> Result<Tensor> {
    if pred.ty() != target.ty() || !pred.dtype().is_float() {
        return Err(config(format!("mse: prediction {} and target {} must be one float type", pred.ty(), target.ty())));
    }
    let d = pred.sub(target)?;
    let all: Vec<usize> = (0..d.rank()).collect();
    Ok(d.mul(&d)?.mean(&all, false)?)
}
