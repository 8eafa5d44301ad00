//! Loop kernels: one invocation per output element (or per packed f16 word), and the serial
//! family's forms ([`Spread::Serial`]) that give an invocation several elements.

use crate::options::*;
use crate::region::*;
use crate::storage::*;
use crate::writer::vty;
use fusegraph_ir::{DType, Graph, NodeId};
use fusegraph_passes::Kernel;
use std::fmt::Write;

/// Grid-stride steps each invocation of a plain loop kernel (see `loop_main`: one element, or
/// one packed f16 word, per step) takes in the serial family (a CPU adapter's), where a workgroup costs a call
/// looping over its SIMD batches (see [`loop_workgroups`]).
///
/// On lavapipe (`time_wgsl`, the f16 chain's kernel, all counts in turn per round, medians): 196,608 elements (a transformer's `[256, 768]` activations) 5.27 ms with 1 step
/// per invocation, 3.47 / 3.33 / 3.36 / 3.28 / 3.13 with 4 / 8 / 16 / 32 / 96; 1 Mi elements
/// 27.4 / 20.8 / 17.8 / 17.0 / 15.9 / 15.7 ms with 1 / 2 / 4 / 8 / 16 / 32; 16 Mi elements
/// 394 / 254 / 231 / 217 / 206 ms with 1 / 4 / 8 / 16 / 32.
pub const CPU_PLAIN_STEPS: u64 = 32;

/// Grid-stride steps each invocation of an interleaved loop kernel (see `interleaved_main`:
/// four elements per step) takes in the serial family (see [`loop_workgroups`]).
///
/// On lavapipe (`time_wgsl`, the 20-op chain's kernel, all counts in turn per round, medians) what mattered was the steps per invocation,
/// not the workgroups, and unlike the plain form's, four was best: 16 Mi elements (4 Mi vec4
/// steps) took 112.6, 58.6, 52.5, 71.0 ms with 16, 8, 4, 1 steps per invocation (1024, 2048,
/// 4096, 16384 workgroups); 4 Mi elements 27.6, 13.7, 12.1, 14.6, 18.1 ms with 16, 8, 4, 2, 1
/// (256 to 4096 workgroups); 32 Mi elements 257, 160, 126, 140, 172 ms with 16, 8, 4, 2, 1
/// (2048 to 32768). The copy alike (16 Mi: 26.1 ms with 16 steps, 15.3 with 4). A constant
/// trip count of 4 instead of the loop's bound measured the same.
pub const CPU_LOOP_STEPS: u64 = 4;

/// The fewest workgroups a serial loop kernel dispatches where it has invocations
/// for them, so that it can spread over a CPU's threads (lavapipe runs one per core). A guard
/// for CPUs with more cores than the two this was measured on, where the counts above leave
/// small kernels a handful of workgroups; not measured.
pub const CPU_MIN_WORKGROUPS: u64 = 16;

/// Workgroups of 256 invocations for a loop kernel of `invocations` grid-stride steps, each
/// invocation taking `steps` of them in the serial family (else one), and there at least
/// [`CPU_MIN_WORKGROUPS`] where there are invocations for them.
pub(crate) fn loop_workgroups(opts: &LowerOptions, invocations: u64, steps: u64) -> u64 {
    let one_step = invocations.div_ceil(WORKGROUP_SIZE as u64);
    if opts.forms.loops == Spread::Serial {
        invocations.div_ceil(WORKGROUP_SIZE as u64 * steps).max(one_step.min(CPU_MIN_WORKGROUPS))
    } else {
        one_step
    }
}

/// One invocation per output element (per word for packed f16).
pub(crate) fn loop_main(
    g: &Graph,
    kernel: &Kernel,
    bindings: &[Binding],
    regions: &[(NodeId, Vec<NodeId>)],
    opts: &LowerOptions,
    vec4: Option<&[NodeId]>,
) -> (String, u64) {
    // Where the adapter has a loop budget, serial reductions inside the kernel count against that of
    // an invocation: fewer elements side by side and per invocation where they are long.
    let serial = serial_steps(g, kernel);
    let fits = |elements: u64| within_budget(opts, serial, elements);
    let ilp = loop_ilp(g, kernel, opts);
    let steps = |most: u64, per: u64| (1..=most).rev().find(|&s| fits(s * per)).unwrap_or(1);
    if let Some(r) =
        interleaved_main(g, kernel, bindings, regions, opts, (ilp, steps(CPU_LOOP_STEPS, ilp as u64)), vec4)
    {
        return r;
    }
    let mut invocations = 0u64;
    let mut body = String::new();
    let outputs: Vec<(usize, &Binding)> = bindings.iter().enumerate().filter(|(_, b)| b.output).collect();
    // Several plain outputs: every value of element `t` is computed before any is stored, so
    // an output written over an input it shares the element with (a parameter updated in
    // place) cannot change what another output reads.
    let plain: Vec<(usize, &Binding)> =
        outputs.iter().copied().filter(|(_, b)| !packed_halves(g.ty(b.node).dtype, opts)).collect();
    let two_phase = plain.len() > 1;
    if two_phase {
        // Outputs of one length (the interleaved form takes kernels whose outputs all have
        // one; sibling merges make ragged ones) share element `t`: what their regions share
        // is read or computed once (an optimizer's new moment, stored, and the new weight
        // computed from it), not once per output's element function.
        let mut lengths: Vec<usize> = plain.iter().map(|(_, b)| g.ty(b.node).shape.numel()).collect();
        lengths.sort_unstable();
        lengths.dedup();
        for n in lengths {
            let class: Vec<(usize, &Binding)> =
                plain.iter().copied().filter(|(_, b)| g.ty(b.node).shape.numel() == n).collect();
            for (k, b) in &class {
                let _ = writeln!(body, "        var r{k}: {};", vty(g.ty(b.node).dtype));
            }
            if let [(k, b)] = class.as_slice() {
                let _ = writeln!(body, "        if (t < {n}u) {{ r{k} = e{}(t); }}", b.node.index());
                continue;
            }
            let stmts: Vec<Vec<RegionStmt>> = class
                .iter()
                .map(|(_, b)| {
                    let region = regions.iter().find(|(o, _)| *o == b.node).map_or(&[][..], |(_, r)| r.as_slice());
                    region_stmts(g, region, None)
                })
                .collect();
            let _ = writeln!(body, "        if (t < {n}u) {{");
            let _ = writeln!(body, "            let i_0 = t;");
            emit_elements(&mut body, g, &merged_stmts(stmts.iter().map(Vec::as_slice)), 1, None, "            ", "");
            for (k, b) in &class {
                let _ = writeln!(body, "            r{k} = x{}_0;", b.node.index());
            }
            let _ = writeln!(body, "        }}");
        }
    }
    for (k, b) in outputs {
        let ty = g.ty(b.node);
        let n = ty.shape.numel() as u64;
        let f = format!("e{}", b.node.index());
        if packed_halves(ty.dtype, opts) {
            let words = n.div_ceil(2);
            invocations = invocations.max(words);
            let _ = writeln!(body, "        if (t < {words}u) {{");
            let _ = writeln!(body, "            let e = 2u * t;");
            let _ = writeln!(body, "            var hi = 0.0f;");
            let _ = writeln!(body, "            if (e + 1u < {n}u) {{ hi = {f}(e + 1u); }}");
            let _ = writeln!(body, "            b{k}[t] = pack2x16float(vec2<f32>({f}(e), hi));");
            let _ = writeln!(body, "        }}");
        } else {
            invocations = invocations.max(n);
            let value = if two_phase { format!("r{k}") } else { format!("{f}(t)") };
            let _ = writeln!(body, "        if (t < {n}u) {{ b{k}[t] = {}; }}", store_value(ty.dtype, &value));
        }
    }
    // A grid-stride loop: on a GPU one invocation per element, so it runs once. A CPU
    // adapter pays for every workgroup (lavapipe runs each as a call looping over its SIMD
    // batches), so there each invocation strides over CPU_PLAIN_STEPS elements (one element
    // per invocation against a stride: 0.57 vs 2.2 GB/s for a 16 Mi-element copy, 0.24 vs
    // 0.70 GB/s for the 20-op chain on lavapipe).
    let workgroups = loop_workgroups(opts, invocations, steps(CPU_PLAIN_STEPS, 1));
    let mut main = grid_stride_main(invocations, "stride");
    main.push_str(&body);
    main.push_str("    }\n}\n");
    (main, workgroups)
}

/// Elements a loop kernel computes side by side ([`CPU_INTERLEAVE`]), or one where the
/// adapter's loop budget cannot take the kernel's serial reductions for that many.
pub(crate) fn loop_ilp(g: &Graph, kernel: &Kernel, opts: &LowerOptions) -> usize {
    if within_budget(opts, serial_steps(g, kernel), CPU_INTERLEAVE as u64) {
        CPU_INTERLEAVE
    } else {
        1
    }
}

/// Whether `times` walks of `serial` iterations fit one invocation: within the adapter's
/// loop budget where it has one ([`LowerOptions::loop_budget`]).
pub(crate) fn within_budget(opts: &LowerOptions, serial: u64, times: u64) -> bool {
    opts.loop_budget.is_none_or(|budget| serial.saturating_mul(times) <= budget)
}

/// Serial loop iterations a loop kernel spends on one element: the lengths of the
/// reductions it computes inside (small ones, or of another shape than a row kernel could
/// take), each once per element.
pub(crate) fn serial_steps(g: &Graph, kernel: &Kernel) -> u64 {
    kernel
        .members
        .iter()
        .filter_map(|&m| {
            let axes = g.node(m).op.reduced_axes()?;
            let dims = g.ty(g.operands(m)[0]).shape.dims().to_vec();
            Some(axes.iter().map(|&a| dims[a] as u64).product::<u64>())
        })
        .sum()
}

/// Elements a loop kernel computes side by side per invocation in the serial family.
///
/// A CPU adapter runs an invocation batch as one SIMD instruction stream, so a region's
/// chain of dependent operations is bound by its latency (on lavapipe the 20-op chain's five
/// `tanh`s ran at a fraction of the FPU's throughput). Four independent elements, loaded
/// first and computed statement by statement in turn, fill the pipeline: the chain went from
/// 0.75 to 1.5–1.66 GB/s on lavapipe (36–42% to 59–69% of the copy in the same run; 8 was
/// slower than 4, 3 and 6 no better). A GPU hides latency by running other invocations; it
/// takes four elements per invocation (a vec4 where it can) for the bytes in flight, and only
/// where there are at least [`GPU_INTERLEAVE_MIN`] elements.
pub const CPU_INTERLEAVE: usize = 4;

/// The fewest output elements for which a loop kernel on a GPU computes four per invocation:
/// below it the kernel keeps one per invocation, since fewer invocations than the GPU has
/// lanes leave it idle, most of all where each element loops over a reduced axis (an unfused
/// transformer's row sums over 256×768 went from 0.21 to 0.36 ms on an H100 with four per
/// invocation). 2^20 is four per lane of an H100 (132 multiprocessors × 2048).
pub const GPU_INTERLEAVE_MIN: u64 = 1 << 20;

/// `vec4` steps each invocation of a GPU's vec4 loop kernel takes per grid-stride step
/// (quads `t`, `t + stride`, …, every load of them issued before the first store), where
/// the invocations stay at least [`GPU_INTERLEAVE_MIN`]` / 4` (one per lane of an H100).
///
/// On an H100 (Vulkan, `time_wgsl --reps 20`, 64 Mi elements, dispatches back to back): an
/// f32 copy took 0.218 ms with one `vec4` per invocation (2.46 TB/s counting reads and
/// writes), 0.181 / 0.183 / 0.185 ms with 2 / 4 / 8 (2.97 / 2.93 / 2.90 TB/s); the f16 copy
/// 0.134 against 0.092 / 0.093 ms; the 20-op chain 0.311 against 0.270 ms with 4 (f32,
/// 2.98 TB/s) and 0.308 against 0.248 (f16). A read-only input binding changed nothing.
pub const GPU_QUADS: u64 = 4;

/// Quads per grid-stride step of a vec4 loop kernel of `quads` quads (see [`GPU_QUADS`]):
/// one on a CPU adapter (whose serial form strides on its own) and for small kernels.
fn gpu_quads(opts: &LowerOptions, quads: u64) -> u64 {
    let lanes = GPU_INTERLEAVE_MIN / 4;
    if opts.forms.loops == Spread::Serial || quads / GPU_QUADS < lanes {
        1
    } else {
        GPU_QUADS
    }
}

pub(crate) fn loop_parts(
    g: &Graph,
    bindings: &[Binding],
    regions: &[(NodeId, Vec<NodeId>)],
    opts: &LowerOptions,
) -> Option<LoopParts> {
    let outs: Vec<(usize, &Binding)> = bindings.iter().enumerate().filter(|(_, b)| b.output).collect();
    let n = g.ty(outs.first()?.1.node).shape.numel() as u64;
    let serial = opts.forms.loops == Spread::Serial;
    if n == 0 || (!serial && n < GPU_INTERLEAVE_MIN) {
        return None;
    }
    // Every output unpacked and of the same length (the plain form guards each store by
    // its own length), each with its region; a packed output only as whole words, in quads
    // (see `f16_words`).
    let quads = serial && n.is_multiple_of(4) && CPU_INTERLEAVE == 4;
    let mut parts = Vec::new();
    for &(k, b) in &outs {
        let ty = g.ty(b.node);
        if (packed_halves(ty.dtype, opts) && !quads) || ty.shape.numel() as u64 != n {
            return None;
        }
        let region = &regions.iter().find(|(o, _)| *o == b.node)?.1;
        parts.push((k, b.node, ty.dtype, region_stmts(g, region, None)));
    }
    Some((n, parts))
}

/// The bindings a loop kernel reads and writes as `vec4`s, when its outputs
/// are of one length divisible by 4 (see [`interleaved_main`]): every output whose dtype
/// allows it and every input its regions load four adjacent elements of at a time (see
/// [`quad_view`]: at their own index, or broadcast along the rows). `None` where nothing
/// would be.
pub(crate) fn vec4_loop(
    g: &Graph,
    kernel: &Kernel,
    bindings: &[Binding],
    regions: &[(NodeId, Vec<NodeId>)],
    opts: &LowerOptions,
) -> Option<Vec<NodeId>> {
    let (n, parts) = loop_parts(g, bindings, regions, opts)?;
    // A vec4 is the four elements one step computes: only with four side by side (the
    // interleaved form falls back to scalar accesses otherwise, so the bindings must too;
    // one at a time where the kernel's serial reductions are long for the loop budget).
    if n % 4 != 0 || (opts.forms.loops == Spread::Serial && CPU_INTERLEAVE != 4) || loop_ilp(g, kernel, opts) != 4 {
        return None;
    }
    let mut nodes: Vec<NodeId> = Vec::new();
    for (_, node, dtype, stmts) in &parts {
        if quad_storage(*dtype, opts) {
            nodes.push(*node);
        }
        for leaf in quad_leaves(g, kernel, opts, stmts) {
            if !nodes.contains(&leaf) {
                nodes.push(leaf);
            }
        }
    }
    (!nodes.is_empty()).then_some(nodes)
}

/// A loop kernel whose outputs are unpacked and of one length (see [`loop_parts`]),
/// computing `ilp` elements of each per grid-stride step: every value the regions read from
/// outside is loaded first, then each region statement runs for the elements in turn, then
/// the elements are stored. In the serial family each invocation takes [`CPU_LOOP_STEPS`]
/// steps; in the parallel one an invocation per step, so the loop runs once, and the `ilp` loads
/// of each binding are in flight together: with one element per invocation an f32 copy of
/// 64 Mi elements moved 652 GB/s on an H100 (Vulkan), about a fifth of its bandwidth, each
/// invocation having a single 4-byte load outstanding.
///
/// With `vec4` (the length a multiple of 4, `ilp` 4) the elements are the four adjacent
/// ones `4t … 4t + 3`, and the bindings `vec4` names are read and written a `vec4` at a
/// time: on lavapipe every load or store is a loop over the SIMD lanes, so one per four
/// elements instead of four made a copy 3.2× and the 20-op chain 2.1× faster (hand-written
/// kernels, 16 Mi elements). On a GPU a large kernel's invocation takes [`GPU_QUADS`] such
/// quads a step, `t + j·stride` (names suffixed `s{j}`), all loaded before any is stored.
/// Otherwise the elements are `t, t + stride, …`; those past the
/// end are computed on the last element's index (every load in range) and not stored.
pub(crate) fn interleaved_main(
    g: &Graph,
    kernel: &Kernel,
    bindings: &[Binding],
    regions: &[(NodeId, Vec<NodeId>)],
    opts: &LowerOptions,
    (ilp, cpu_steps): (usize, u64),
    vec4: Option<&[NodeId]>,
) -> Option<(String, u64)> {
    let (n, parts) = loop_parts(g, bindings, regions, opts)?;
    let vec4 = vec4.filter(|_| ilp == 4 && n % 4 == 0);
    // A packed output is written in whole words, by quads only.
    if vec4.is_none() && parts.iter().any(|(_, _, dtype, _)| packed_halves(*dtype, opts)) {
        return None;
    }
    // All outputs have one length, so element `i` of a value is the same in every region:
    // a value read or a member shared by several regions is loaded or computed once.
    let stmts = merged_stmts(parts.iter().map(|(.., stmts)| stmts.as_slice()));
    let steps = if vec4.is_some() { n / 4 } else { n };
    let per_step = if vec4.is_some() { gpu_quads(opts, steps) } else { ilp as u64 };
    let workgroups = loop_workgroups(opts, steps.div_ceil(per_step), cpu_steps);
    let step = if per_step == 1 { "stride".to_string() } else { format!("{per_step}u * stride") };
    let mut main = grid_stride_main(steps, &step);
    // Sub-step `j` of a vec4 step (of `per_step`) is quad `t + j·stride`, its names suffixed
    // `s{j}`; past the end it is computed on the last quad and not stored.
    let subs: Vec<(String, String)> = if vec4.is_some() && per_step > 1 {
        (0..per_step).map(|j| (format!("s{j}"), format!("min(t + {j}u * stride, {}u)", steps - 1))).collect()
    } else {
        vec![(String::new(), "t".to_string())]
    };
    for (sub, at) in &subs {
        if !sub.is_empty() {
            let _ = writeln!(main, "        let t{sub} = {at};");
        }
        let t = if sub.is_empty() { "t".to_string() } else { format!("t{sub}") };
        for u in 0..ilp {
            let i =
                if vec4.is_some() { format!("4u * {t} + {u}u") } else { format!("min(t + {u}u * stride, {}u)", n - 1) };
            let _ = writeln!(main, "        let i_{u}{sub} = {i};");
        }
    }
    let quad = |node: NodeId| vec4.is_some_and(|v| v.contains(&node));
    let quads = vec4.map(|vec4| Quads { kernel, bindings, vec4, opts });
    // With several sub-steps, the loads of all of them (statements that read at the index
    // alone) come first, then the arithmetic: as timed on the H100.
    let phases: Vec<Vec<&RegionStmt>> = if subs.len() > 1 {
        let (loads, rest) = stmts.iter().partition(|s| s.is_call());
        vec![loads, rest]
    } else {
        vec![stmts]
    };
    for phase in &phases {
        for (sub, _) in &subs {
            emit_elements(&mut main, g, phase, ilp, quads, "        ", sub);
        }
    }
    // Every value is computed before any is stored, so an output written over an input it
    // shares the element with (a parameter updated in place) cannot change what another
    // output reads; and every load of the sub-steps is issued before the first store.
    for (k, node, dtype, _) in &parts {
        for (j, (sub, _)) in subs.iter().enumerate() {
            let t = if sub.is_empty() { "t".to_string() } else { format!("t{sub}") };
            let guard = |store: String| match j {
                0 => format!("        {store}"),
                _ => format!("        if (t + {j}u * stride < {steps}u) {{ {store} }}"),
            };
            let raw: Vec<String> = (0..ilp).map(|u| format!("x{}_{u}{sub}", node.index())).collect();
            if quad(*node) {
                let _ = writeln!(main, "{}", guard(format!("b{k}[{t}] = {};", quad_value(*dtype, opts, &raw))));
                continue;
            }
            let values: Vec<String> = raw.iter().map(|v| store_value(*dtype, v)).collect();
            for (u, v) in values.iter().enumerate() {
                if vec4.is_some() {
                    let _ = writeln!(main, "{}", guard(format!("b{k}[i_{u}{sub}] = {v};")));
                } else {
                    let _ = writeln!(main, "        if (t + {u}u * stride < {n}u) {{ b{k}[i_{u}] = {v}; }}");
                }
            }
        }
    }
    main.push_str("    }\n}\n");
    Some((main, workgroups))
}

/// The head of a loop kernel's `main`: a grid-stride loop over `t` below `end`, advancing by
/// `step` (an expression in `stride`, the invocations of the whole dispatch), left open.
pub(crate) fn grid_stride_main(end: u64, step: &str) -> String {
    let mut main = String::new();
    let _ = writeln!(main, "@compute @workgroup_size({WORKGROUP_SIZE})");
    let _ = writeln!(main, "fn main({MAIN_ARGS}) {{");
    let _ = writeln!(main, "    let stride = nwg.x * nwg.y * {WORKGROUP_SIZE}u;");
    let _ = writeln!(
        main,
        "    for (var t = (wid.y * nwg.x + wid.x) * {WORKGROUP_SIZE}u + lid; t < {end}u; t = t + {step}) {{"
    );
    main
}

/// Loop iterations one invocation of a kernel may take on a Mesa CPU adapter. Mesa's llvmpipe
/// and lavapipe end every loop of a shader invocation once they have run 65 535 iterations
/// between them (`LP_MAX_TGSI_LOOP_ITERATIONS`, a guard against infinite loops, shared by all
/// the loops of a shader), silently: 64 rows of 131 072 elements, one invocation per row,
/// summed about 99.7% of each row, and a softmax over them was wrong. Kept under it with a
/// margin for the kernel's other loops.
pub const CPU_LOOP_BUDGET: u64 = 60_000;

/// A loop kernel's outputs for the interleaved forms, where every output is unpacked and of
/// one length `n` (> 0): `n` and, per output, its binding index, node, dtype and region
/// statements.
pub(crate) type LoopParts = (u64, Vec<(usize, NodeId, DType, Vec<RegionStmt>)>);
