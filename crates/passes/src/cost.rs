//! The cost model: bytes moved, FLOPs and a per-dispatch cost, from which the fusion pass
//! estimates time saved. Defaults suit a device-free test; the runtime can pass figures
//! measured on the adapter.

use fusegraph_ir::{Graph, NodeId, Op};

/// Device figures the cost model needs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    /// Seconds one dispatch costs beyond its work (launch, barrier).
    pub dispatch_s: f64,
    /// Memory bandwidth, bytes per second.
    pub bandwidth: f64,
    /// Arithmetic throughput, FLOP per second.
    pub flops: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        // Round figures of a mid-range GPU; only ratios matter to the fusion decisions.
        CostModel { dispatch_s: 5e-6, bandwidth: 200e9, flops: 5e12 }
    }
}

/// Arithmetic per element of a node's result, in FLOPs (loads and index math excluded).
pub fn flops_per_element(g: &Graph, id: NodeId) -> f64 {
    let node = g.node(id);
    let ops = g.operands(id);
    match &node.op {
        Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. } => 1.0,
        Op::Reduce { .. } | Op::ArgMax { .. } => {
            let inp = g.ty(ops[0]).shape.numel() as f64;
            inp / node.ty.shape.numel().max(1) as f64
        }
        Op::MatMul => {
            let l = g.ty(ops[0]).shape.dims();
            2.0 * l[l.len() - 1] as f64
        }
        Op::Conv2d { .. } => {
            let w = g.ty(ops[1]).shape.dims();
            2.0 * (w[1] * w[2] * w[3]) as f64
        }
        Op::Pool { window, .. } => (window[0] * window[1]) as f64,
        _ => 0.0,
    }
}

/// The smaller output tile edge of the tiled matmul lowering (fusegraph-wgsl's `matmul.rs`;
/// it uses twice this when both result dimensions allow).
pub const MATMUL_TILE: usize = 64;

/// How many times, per element of the result, an op reads each element of operand `pos`
/// (on average). Elementwise and layout ops read at most once; broadcasts and contractions
/// read an operand element many times.
pub fn reads_per_operand_element(g: &Graph, id: NodeId, pos: usize) -> f64 {
    let node = g.node(id);
    let ops = g.operands(id);
    let out = node.ty.shape.numel() as f64;
    let inp = g.ty(ops[pos]).shape.numel().max(1) as f64;
    match &node.op {
        Op::MatMul => {
            // The tiled lowering loads each operand element once per 64-wide tile of the
            // other dimension: lhs elements once per 64 columns of the result, rhs elements
            // once per 64 rows (batch broadcasting multiplies that).
            let d = node.ty.shape.dims();
            let (m, n) = (d[d.len() - 2], d[d.len() - 1]);
            let other = if pos == 0 { n } else { m };
            // 128-wide tiles when both result dims are at least 128 (see the lowering).
            let tile = if m >= 2 * MATMUL_TILE && n >= 2 * MATMUL_TILE { 2 * MATMUL_TILE } else { MATMUL_TILE };
            let batch_out: usize = d[..d.len() - 2].iter().product();
            let od = g.ty(ops[pos]).shape.dims();
            let batch_in: usize = od[..od.len() - 2].iter().product();
            (other.div_ceil(tile) * batch_out / batch_in.max(1)) as f64
        }
        Op::Conv2d { .. } => {
            let w = g.ty(ops[1]).shape.dims();
            out * (w[1] * w[2] * w[3]) as f64 / inp
        }
        Op::Pool { window, .. } => out * (window[0] * window[1]) as f64 / inp,
        Op::Reduce { .. } | Op::ArgMax { .. } => 1.0,
        // The operand once per element. The update counts as read `out / update` times, as
        // a gather of it would be: fusion then keeps a product that computes the update out
        // of the kernel (a loop kernel would compute it as a naive element function).
        Op::DynamicUpdateSlice { .. } if pos == 0 => 1.0,
        _ => out / inp,
    }
}

/// Whether recomputing the op is expensive enough that fusion must never duplicate it.
pub fn is_expensive(op: &Op) -> bool {
    matches!(op, Op::Reduce { .. } | Op::ArgMax { .. } | Op::MatMul | Op::Conv2d { .. } | Op::Pool { .. })
}

/// Whether the op only moves or relabels data (no arithmetic), so recomputing it is as cheap
/// as loading it.
pub fn is_data_movement(op: &Op) -> bool {
    matches!(
        op,
        Op::Broadcast { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::Concat { .. }
            | Op::Pad { .. }
            | Op::Gather { .. }
            | Op::DynamicUpdateSlice { .. }
            | Op::Cast { .. }
            | Op::Full { .. }
            | Op::Iota { .. }
    )
}
