//! Window writes: a loop kernel whose every output is a dynamic update slice written over
//! its operand's buffer (the memory plan's in-place update of a cache parameter, say) runs
//! one invocation per element of the update and stores it at its place in the window. The
//! rest of the operand is already in the buffer: nothing outside the window is read or
//! written, so a decode step's cache write moves the new position's bytes, not the cache's.

use crate::body::clamped_start;
use crate::loops::{grid_stride_main, loop_workgroups, CPU_PLAIN_STEPS};
use crate::options::{Binding, LowerOptions};
use crate::storage::{packed_halves, store_value};
use crate::writer::{ravel, unravel};
use fusegraph_ir::{Graph, NodeId, Op};
use fusegraph_passes::{Kernel, KernelKind};
use std::fmt::Write;

/// The window every output of `kernel` writes: each output a `dynamic_update_slice` member
/// along one axis, of one update shape and one start. `None` where any output is something
/// else or differs, or is stored as packed halves (a half-word store would race with its
/// neighbour's invocation).
pub fn window_outputs(g: &Graph, kernel: &Kernel, opts: &LowerOptions) -> Option<Window> {
    if kernel.kind != KernelKind::Loop {
        return None;
    }
    let mut window: Option<Window> = None;
    for &o in &kernel.outputs {
        let Op::DynamicUpdateSlice { axis } = g.node(o).op else { return None };
        let ops = g.operands(o);
        if packed_halves(g.ty(o).dtype, opts) {
            return None;
        }
        let this = Window { axis, update: g.ty(ops[1]).shape.dims().to_vec(), start: ops[2] };
        match &window {
            Some(w) if *w != this => return None,
            _ => window = Some(this),
        }
    }
    window
}

/// What the outputs of a window kernel share (see [`window_outputs`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// The axis the window lies along.
    pub axis: usize,
    /// The update's dims.
    pub update: Vec<usize>,
    /// The start's node (rank 0, clamped as the op clamps it).
    pub start: NodeId,
}

/// The window kernel's `main`: invocation `t` takes element `t` of each output's update
/// (its element function, with whatever the kernel fuses into it) and stores it at the
/// window's element of the output. Returns `main` and its workgroups.
pub(crate) fn window_main(
    g: &Graph,
    kernel: &Kernel,
    bindings: &[Binding],
    w: &Window,
    opts: &LowerOptions,
) -> (String, u64) {
    let n: usize = w.update.iter().product();
    let dims = g.ty(kernel.outputs[0]).shape.dims().to_vec();
    let mut main = grid_stride_main(n as u64, "stride");
    let mut coords = String::new();
    let mut c = unravel(&mut coords, &w.update, "t", "w");
    for line in coords.lines() {
        let _ = writeln!(main, "    {line}");
    }
    let _ = writeln!(main, "        let s = {};", clamped_start(g, w.start, dims[w.axis] - w.update[w.axis], &c[0]));
    c[w.axis] = format!("({} + s)", c[w.axis]);
    let _ = writeln!(main, "        let dest = {};", ravel(&c, &dims));
    for (k, b) in bindings.iter().enumerate().filter(|(_, b)| b.output) {
        let update: NodeId = g.operands(b.node)[1];
        let value = format!("v{}(t)", update.index());
        let _ = writeln!(main, "        b{k}[dest] = {};", store_value(g.ty(b.node).dtype, &value));
    }
    main.push_str("    }\n}\n");
    (main, loop_workgroups(opts, n as u64, CPU_PLAIN_STEPS))
}
