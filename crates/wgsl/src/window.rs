//! Window writes: a loop kernel whose dynamic update slices are written over their operands'
//! buffers (the memory plan's in-place update of a cache parameter, say) runs one invocation
//! per element of the update and stores it at its place in the window. The rest of the
//! operand is already in the buffer: nothing outside the window is read or written, so a
//! decode step's cache write moves the new position's bytes, not the cache's. The kernel's
//! other outputs (a rotated query beside the rotated key it writes) are stored whole, an
//! element per invocation, over a grid as long as the longest of them.

use crate::body::clamped_start;
use crate::loops::{grid_stride_main, loop_workgroups, CPU_PLAIN_STEPS};
use crate::options::{Binding, LowerOptions};
use crate::storage::{packed_halves, store_value};
use crate::writer::{ravel, unravel};
use fusegraph_ir::{Graph, NodeId, Op};
use fusegraph_passes::{Kernel, KernelKind};
use std::fmt::Write;

/// The window the `dynamic_update_slice` outputs of `kernel` write: each along one axis, of
/// one update shape and one start. `None` where there is none, or they differ, or an output
/// is stored as packed halves (a half-word store would race with its neighbour's
/// invocation), or a member reads an update's result or operand other than the update
/// itself (it would read elements another invocation writes).
pub fn window_outputs(g: &Graph, kernel: &Kernel, opts: &LowerOptions) -> Option<Window> {
    if kernel.kind != KernelKind::Loop {
        return None;
    }
    let mut window: Option<Window> = None;
    let mut touched: Vec<NodeId> = Vec::new();
    for &o in &kernel.outputs {
        if packed_halves(g.ty(o).dtype, opts) {
            return None;
        }
        let Op::DynamicUpdateSlice { axis } = g.node(o).op else { continue };
        let ops = g.operands(o);
        touched.extend([o, ops[0]]);
        let this = Window { axis, update: g.ty(ops[1]).shape.dims().to_vec(), start: ops[2] };
        match &window {
            Some(w) if *w != this => return None,
            _ => window = Some(this),
        }
    }
    let updates = |m: NodeId| matches!(g.node(m).op, Op::DynamicUpdateSlice { .. }) && kernel.outputs.contains(&m);
    let reads_touched =
        kernel.members.iter().filter(|&&m| !updates(m)).any(|&m| g.operands(m).iter().any(|x| touched.contains(x)));
    window.filter(|_| !reads_touched)
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

/// The window kernel's `main`: invocation `t` takes element `t` of each update (its element
/// function, with whatever the kernel fuses into it) and stores it at the window's element of
/// its output, and element `t` of each other output. Returns `main` and its workgroups.
pub(crate) fn window_main(g: &Graph, bindings: &[Binding], w: &Window, opts: &LowerOptions) -> (String, u64) {
    let n: usize = w.update.iter().product();
    let outputs: Vec<(usize, NodeId)> =
        bindings.iter().enumerate().filter(|(_, b)| b.output).map(|(k, b)| (k, b.node)).collect();
    let is_update = |o: NodeId| matches!(g.node(o).op, Op::DynamicUpdateSlice { .. });
    let grid = outputs.iter().filter(|(_, o)| !is_update(*o)).map(|(_, o)| g.ty(*o).shape.numel()).fold(n, usize::max);
    let first = outputs.iter().find(|(_, o)| is_update(*o)).expect("a window has an update").1;
    let dims = g.ty(first).shape.dims().to_vec();
    let mut main = grid_stride_main(grid as u64, "stride");
    let guard = grid > n;
    let ind = if guard { "            " } else { "        " };
    if guard {
        let _ = writeln!(main, "        if (t < {n}u) {{");
    }
    for line in window_dest(g, w, &dims, "t").lines() {
        let _ = writeln!(main, "{}{line}", &ind[4..]);
    }
    for &(k, o) in outputs.iter().filter(|(_, o)| is_update(*o)) {
        let update: NodeId = g.operands(o)[1];
        let value = format!("v{}(t)", update.index());
        let _ = writeln!(main, "{ind}b{k}[dest] = {};", store_value(g.ty(o).dtype, &value));
    }
    if guard {
        let _ = writeln!(main, "        }}");
    }
    for &(k, o) in outputs.iter().filter(|(_, o)| !is_update(*o)) {
        let value = store_value(g.ty(o).dtype, &format!("v{}(t)", o.index()));
        match g.ty(o).shape.numel() {
            e if e == grid => {
                let _ = writeln!(main, "        b{k}[t] = {value};");
            }
            e => {
                let _ = writeln!(main, "        if (t < {e}u) {{ b{k}[t] = {value}; }}");
            }
        }
    }
    main.push_str("    }\n}\n");
    (main, loop_workgroups(opts, grid as u64, CPU_PLAIN_STEPS))
}

/// Statements computing `dest`, the index in an update's result (of `dims`) where element
/// `t` of the update lies in window `w`; indented one level.
fn window_dest(g: &Graph, w: &Window, dims: &[usize], t: &str) -> String {
    let mut out = String::new();
    let mut c = unravel(&mut out, &w.update, t, "w");
    let _ = writeln!(out, "    let s = {};", clamped_start(g, w.start, dims[w.axis] - w.update[w.axis], &c[0]));
    c[w.axis] = format!("({} + s)", c[w.axis]);
    let _ = writeln!(out, "    let dest = {};", ravel(&c, dims));
    out
}

/// `main` storing the side windows `sides` (`(binding, update's result)`,
/// [`fusegraph_passes::side_windows`]) first thing, each in a grid-stride loop over every
/// invocation the dispatch has: the update's elements at their places where `windows` (the
/// results are written over their operands), else every element of the result. The kernel's
/// own form computes its outputs after; its members read the results through their element
/// functions, never through the bindings.
pub(crate) fn with_side_windows(g: &Graph, main: String, sides: &[(usize, NodeId)], windows: bool) -> String {
    let size = |m: &str| -> Option<u64> {
        let at = m.find("@workgroup_size(")? + "@workgroup_size(".len();
        let dims = &m[at..at + m[at..].find(')')?];
        dims.split(',').map(|d| d.trim().parse::<u64>().ok()).product()
    };
    if sides.is_empty() {
        return main;
    }
    // Every form's `main` declares its workgroup size and takes `MAIN_ARGS`.
    let start = main.find("fn main(").and_then(|at| main[at..].find('\n').map(|nl| at + nl + 1));
    let (start, wg) = start.zip(size(&main)).expect("a kernel form's main with its workgroup size");
    let mut out = main[..start].to_string();
    let _ = writeln!(out, "    let fg_stride = nwg.x * nwg.y * {wg}u;");
    let _ = writeln!(out, "    let fg_first = (wid.y * nwg.x + wid.x) * {wg}u + lid;");
    for &(k, o) in sides {
        let ops = g.operands(o);
        let Op::DynamicUpdateSlice { axis } = g.node(o).op else { continue };
        let dims = g.ty(o).shape.dims();
        let w = Window { axis, update: g.ty(ops[1]).shape.dims().to_vec(), start: ops[2] };
        let (n, value) = match windows {
            true => (w.update.iter().product::<usize>(), format!("v{}(t)", ops[1].index())),
            false => (dims.iter().product(), format!("v{}(t)", o.index())),
        };
        let _ = writeln!(out, "    for (var t = fg_first; t < {n}u; t = t + fg_stride) {{");
        match windows {
            true => {
                for line in window_dest(g, &w, dims, "t").lines() {
                    let _ = writeln!(out, "    {line}");
                }
                let _ = writeln!(out, "        b{k}[dest] = {};", store_value(g.ty(o).dtype, &value));
            }
            false => {
                let _ = writeln!(out, "        b{k}[t] = {};", store_value(g.ty(o).dtype, &value));
            }
        }
        let _ = writeln!(out, "    }}");
    }
    out.push_str(&main[start..]);
    out
}
