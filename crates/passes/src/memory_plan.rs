//! Memory planning: where each value that lives in memory is stored.
//!
//! Values fall in three regions: `Persistent` (parameters and constants, kept across runs, one
//! slot each), `External` (parameters that live outside the plan, in a runtime's parameter
//! store, with [`MemoryOptions::external_parameters`]) and `Arena` (inputs and kernel outputs,
//! reused across runs). Arena values share
//! bytes when their live ranges ([`crate::liveness::intervals_multi`]) do not overlap:
//! offsets are assigned best-fit in a few orders (by size, by lifetime, by size × lifetime) and
//! the smallest arena wins. Every offset is a multiple of the alignment the device requires
//! for storage bindings.
//!
//! **In-place reuse.** A kernel's output may take over the bytes of an input that dies at that
//! kernel when each invocation provably reads element `i` of the input before writing element
//! `i` of the output, and no invocation reads another element of it: the kernel is a
//! [`KernelKind::Loop`] with a single output, every path from the output to the input is made
//! of same-index edges ([`crate::kernel::same_index_operands`]), both values have the same
//! byte size and neither is f16 (packed f16 writes two elements per word). The plan records
//! such pairs in [`MemoryPlan::in_place`]; in-place is used only where it makes the arena
//! strictly smaller. Note that an in-place kernel binds two overlapping ranges of the arena.
//!
//! [`check_plan`] proves the result: no two arena values that are live at the same step share
//! a byte, except a recorded in-place pair at the one step where the input dies and the output
//! is born. `plan_memory` runs it in debug builds.

use crate::kernel::{same_index_operands, Kernel, KernelKind, MemberOrder};
use crate::liveness::{intervals_multi, is_arena, value_bytes, Interval};
use fusegraph_ir::{DType, Graph, NodeId};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

/// The region a value lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Region {
    /// Parameters and constants: written once, kept across runs.
    Persistent,
    /// Inputs and intermediate values of one run.
    Arena,
    /// A parameter held outside the plan ([`MemoryOptions::external_parameters`]): its own
    /// buffer, offset 0, named by [`MemoryPlan::external`]`[i]`.
    External(u32),
}

/// Where a value lives: region, byte offset, byte size (whole 4-byte words).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// The region.
    pub region: Region,
    /// Byte offset in the region, a multiple of the plan's alignment.
    pub offset: u64,
    /// Bytes, a multiple of 4 and at least 4.
    pub size: u64,
}

/// The memory plan of a compiled graph.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryPlan {
    /// Location of every value that lives in memory.
    pub locations: BTreeMap<NodeId, Location>,
    /// Bytes of the persistent region.
    pub persistent_bytes: u64,
    /// Bytes of the arena.
    pub arena_bytes: u64,
    /// Bytes if every arena value had its own aligned slot.
    pub naive_bytes: u64,
    /// The peak over steps of live arena bytes, each in-place chain counted once (see
    /// [`MemoryPlan::live_bytes_per_step`]): no placement of these values with this plan's
    /// in-place reuse fits a smaller arena (alignment padding aside).
    pub lower_bound_bytes: u64,
    /// Offset alignment used.
    pub alignment: u64,
    /// In-place pairs: output → the input whose bytes it takes over (same offset) at the
    /// kernel that reads the input for the last time and writes the output.
    pub in_place: BTreeMap<NodeId, NodeId>,
    /// The live ranges of every arena value the plan was made for.
    pub intervals: BTreeMap<NodeId, Vec<Interval>>,
    /// Parameter updates done in place: new value → the parameter whose persistent slot it
    /// is written into (see [`plan_memory_updating`]). Such a value takes no arena bytes and
    /// needs no copy after the run.
    pub updated_in_place: BTreeMap<NodeId, NodeId>,
    /// The parameter names of the `External` region: `Region::External(i)` is `external[i]`.
    pub external: Vec<String>,
}

/// Knobs of [`plan_memory_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryOptions {
    /// Offset alignment in bytes (raised to at least 4).
    pub alignment: u64,
    /// Allow in-place reuse (see the module docs).
    pub in_place: bool,
    /// Place parameters in the `External` region (a buffer each, held by the caller, such as
    /// a runtime's parameter store) instead of the persistent region.
    pub external_parameters: bool,
}

impl Default for MemoryOptions {
    fn default() -> Self {
        MemoryOptions { alignment: 256, in_place: true, external_parameters: false }
    }
}

/// Why a memory plan is unsound.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// Two values live at a common step share bytes.
    #[error(
        "{a} (bytes {a_bytes:?}, steps {a_steps:?}) and {b} (bytes {b_bytes:?}, steps {b_steps:?}) are live at a \
         common step and share bytes"
    )]
    Overlap {
        /// The first value.
        a: NodeId,
        /// Its byte range in the arena.
        a_bytes: Range<u64>,
        /// Its live steps (inclusive).
        a_steps: (usize, usize),
        /// The second value.
        b: NodeId,
        /// Its byte range in the arena.
        b_bytes: Range<u64>,
        /// Its live steps (inclusive).
        b_steps: (usize, usize),
    },
    /// An offset is not a multiple of the alignment.
    #[error("{node} at offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned {
        /// The value.
        node: NodeId,
        /// Its offset.
        offset: u64,
        /// The plan's alignment.
        alignment: u64,
    },
    /// A value lies (partly) outside its region.
    #[error("{node} (bytes {bytes:?}) lies outside the {region:?} region of {region_bytes} bytes")]
    OutOfBounds {
        /// The value.
        node: NodeId,
        /// Its byte range.
        bytes: Range<u64>,
        /// Its region.
        region: Region,
        /// The region's size.
        region_bytes: u64,
    },
    /// A live value has no arena location, or one too small for it.
    #[error("{node} is live ({bytes} bytes) but has no arena location large enough")]
    Missing {
        /// The value.
        node: NodeId,
        /// Bytes it needs.
        bytes: u64,
    },
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// Plans memory for `kernels` run in order (from [`crate::partition()`], possibly reordered by
/// [`crate::schedule()`] or [`crate::rematerialize`]): every kernel input and output, and every
/// graph output, gets a location. In-place reuse is on; see [`plan_memory_with`].
pub fn plan_memory(g: &Graph, kernels: &[Kernel], outputs: &[NodeId], alignment: u64) -> MemoryPlan {
    plan_memory_with(g, kernels, outputs, &MemoryOptions { alignment, ..Default::default() })
}

/// An allocation unit: values sharing one offset (an in-place chain, or one value).
struct Item {
    size: u64,
    intervals: Vec<Interval>,
    first: NodeId,
}

impl Item {
    fn span(&self) -> u64 {
        self.intervals.iter().map(|i| (i.end - i.start + 1) as u64).sum()
    }
    fn start(&self) -> usize {
        self.intervals.iter().map(|i| i.start).min().unwrap_or(0)
    }
    fn conflicts(&self, other: &Item) -> bool {
        self.intervals.iter().any(|a| other.intervals.iter().any(|b| a.start <= b.end && b.start <= a.end))
    }
}

/// Plans memory with explicit options: see [`plan_memory`] and the module docs.
pub fn plan_memory_with(g: &Graph, kernels: &[Kernel], outputs: &[NodeId], opts: &MemoryOptions) -> MemoryPlan {
    plan_memory_updating(g, kernels, outputs, opts, &[])
}

/// Plans memory as [`plan_memory_with`], writing parameter updates in place where that is
/// safe. `updates` pairs a parameter node with the node of its new value (a training step's
/// weights and optimizer state); such a value is stored straight into the parameter's
/// persistent slot when
///
/// - one kernel produces it, a loop kernel, and the value is not f16 (packed halves);
/// - no later kernel reads the parameter, and the parameter is not a graph output;
/// - inside that kernel, the parameter is read only on same-index paths from the value and
///   from any other (non-f16) output that reads it: invocation `t` reads element `t` of the
///   parameter, computes every output of element `t`, then stores them.
///
/// Otherwise the value stays in the arena and the runtime copies it after the run.
pub fn plan_memory_updating(
    g: &Graph,
    kernels: &[Kernel],
    outputs: &[NodeId],
    opts: &MemoryOptions,
    updates: &[(NodeId, NodeId)],
) -> MemoryPlan {
    let alignment = opts.alignment.max(4);
    let mut values: Vec<NodeId> = Vec::new();
    for k in kernels {
        values.extend(k.inputs.iter().copied());
        values.extend(k.outputs.iter().copied());
    }
    values.extend(outputs.iter().copied());
    values.sort();
    values.dedup();

    let mut live = intervals_multi(g, kernels, outputs);
    let last = kernels.len().saturating_sub(1);
    let mut locations = BTreeMap::new();
    let mut persistent = 0u64;
    let mut arena_values = Vec::new();
    let mut external: Vec<String> = Vec::new();
    for &id in &values {
        let size = value_bytes(g, id);
        let parameter = match &g.node(id).op {
            fusegraph_ir::Op::Parameter { name } if opts.external_parameters => Some(name),
            _ => None,
        };
        if let Some(name) = parameter {
            let i = external.iter().position(|n| n == name).unwrap_or_else(|| {
                external.push(name.clone());
                external.len() - 1
            });
            locations.insert(id, Location { region: Region::External(i as u32), offset: 0, size });
        } else if is_arena(g, id) {
            // Every arena value has intervals; a stray one lives throughout (defensive).
            live.entry(id).or_insert_with(|| vec![Interval { start: 0, end: last, bytes: size }]);
            arena_values.push(id);
        } else {
            let offset = align_up(persistent, alignment);
            persistent = offset + size;
            locations.insert(id, Location { region: Region::Persistent, offset, size });
        }
    }
    let updated_in_place: BTreeMap<NodeId, NodeId> =
        in_place_updates(g, kernels, outputs, updates).into_iter().filter(|(_, p)| locations.contains_key(p)).collect();
    for (&u, p) in &updated_in_place {
        locations.insert(u, locations[p]);
        live.remove(&u);
    }
    arena_values.retain(|v| !updated_in_place.contains_key(v));
    let naive: u64 = arena_values.iter().map(|&id| align_up(value_bytes(g, id), alignment)).sum();

    // Candidates: without in-place first (ties keep it: no aliasing unless it pays), then with.
    let mut variants = vec![BTreeMap::new()];
    if opts.in_place {
        let pairs = in_place_pairs(g, kernels, outputs, &live);
        if !pairs.is_empty() {
            variants.push(pairs);
        }
    }
    type Offsets = BTreeMap<NodeId, u64>;
    let mut best: Option<(u64, Offsets, BTreeMap<NodeId, NodeId>)> = None;
    for pairs in variants {
        let (items, owner) = build_items(g, &arena_values, &live, &pairs);
        let (arena, item_offsets) = best_of_orders(&items, alignment);
        if best.as_ref().is_none_or(|b| arena < b.0) {
            let offsets = arena_values.iter().map(|&id| (id, item_offsets[owner[&id]])).collect();
            best = Some((arena, offsets, pairs));
        }
    }
    let (arena_bytes, offsets, in_place) = best.unwrap_or_default();
    for (id, offset) in offsets {
        locations.insert(id, Location { region: Region::Arena, offset, size: value_bytes(g, id) });
    }
    let mut plan = MemoryPlan {
        locations,
        persistent_bytes: align_up(persistent, alignment),
        arena_bytes,
        naive_bytes: naive,
        lower_bound_bytes: 0,
        alignment,
        in_place,
        intervals: live,
        updated_in_place,
        external,
    };
    plan.lower_bound_bytes = plan.live_bytes_per_step().into_iter().max().unwrap_or(0);
    debug_assert!(plan.lower_bound_bytes <= plan.arena_bytes, "the lower bound is above the arena");
    #[cfg(debug_assertions)]
    if let Err(e) = check_plan(&plan, &plan.intervals) {
        panic!("internal error: the memory plan is unsound: {e}");
    }
    plan
}

impl MemoryPlan {
    /// Live arena bytes at each step (kernel), each in-place chain counted once: an output
    /// written over the input it takes over shares that input's bytes at the step where both
    /// are live. A chain counts its largest value's bytes wherever one of its values is live.
    pub fn live_bytes_per_step(&self) -> Vec<u64> {
        let mut chains: BTreeMap<NodeId, (u64, Vec<(usize, usize)>)> = BTreeMap::new();
        for (&id, ivs) in &self.intervals {
            let chain = chains.entry(chain_root(&self.in_place, id)).or_default();
            for iv in ivs {
                chain.0 = chain.0.max(iv.bytes);
                chain.1.push((iv.start, iv.end));
            }
        }
        let steps = self.intervals.values().flatten().map(|i| i.end + 1).max().unwrap_or(0);
        let mut delta = vec![0i64; steps + 1];
        for (bytes, mut spans) in chains.into_values() {
            // The union of the chain's ranges: each step counted once.
            spans.sort_unstable();
            let mut merged: Vec<(usize, usize)> = Vec::with_capacity(spans.len());
            for (start, end) in spans {
                match merged.last_mut() {
                    Some(last) if start <= last.1 + 1 => last.1 = last.1.max(end),
                    _ => merged.push((start, end)),
                }
            }
            for (start, end) in merged {
                delta[start] += bytes as i64;
                delta[end + 1] -= bytes as i64;
            }
        }
        let mut cur = 0i64;
        delta[..steps]
            .iter()
            .map(|d| {
                cur += d;
                cur.max(0) as u64
            })
            .collect()
    }

    /// The first value of the in-place chain `v` belongs to (`v` itself when it takes over
    /// no input's bytes): values live at one step share bytes exactly when they share it.
    pub fn chain_root(&self, v: NodeId) -> NodeId {
        chain_root(&self.in_place, v)
    }
}

/// Follows in-place pairs (output → the input whose bytes it takes over) back to the chain's
/// first value.
fn chain_root(pairs: &BTreeMap<NodeId, NodeId>, mut v: NodeId) -> NodeId {
    while let Some(&i) = pairs.get(&v) {
        v = i;
    }
    v
}

/// Groups arena values into allocation items: in-place chains become one item.
fn build_items(
    g: &Graph,
    values: &[NodeId],
    live: &BTreeMap<NodeId, Vec<Interval>>,
    pairs: &BTreeMap<NodeId, NodeId>,
) -> (Vec<Item>, BTreeMap<NodeId, usize>) {
    let root = |v: NodeId| chain_root(pairs, v);
    let mut items: Vec<Item> = Vec::new();
    let mut by_root: BTreeMap<NodeId, usize> = BTreeMap::new();
    let mut owner = BTreeMap::new();
    for &id in values {
        let r = root(id);
        let idx = *by_root.entry(r).or_insert_with(|| {
            items.push(Item { size: 0, intervals: Vec::new(), first: r });
            items.len() - 1
        });
        let item = &mut items[idx];
        item.size = item.size.max(value_bytes(g, id));
        item.intervals.extend(live[&id].iter().copied());
        owner.insert(id, idx);
    }
    (items, owner)
}

/// Best-fit placement in three orders; returns the smallest arena and each item's offset.
fn best_of_orders(items: &[Item], alignment: u64) -> (u64, Vec<u64>) {
    type Key = (std::cmp::Reverse<u64>, std::cmp::Reverse<u64>, usize, NodeId);
    let keys: [&dyn Fn(&Item) -> Key; 3] = [
        &|it| (std::cmp::Reverse(it.size), std::cmp::Reverse(it.span()), it.start(), it.first),
        &|it| (std::cmp::Reverse(it.span()), std::cmp::Reverse(it.size), it.start(), it.first),
        &|it| (std::cmp::Reverse(it.size.saturating_mul(it.span())), std::cmp::Reverse(it.size), it.start(), it.first),
    ];
    let mut best: Option<(u64, Vec<u64>)> = None;
    for key in keys {
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_by_key(|&i| key(&items[i]));
        let (arena, offsets) = best_fit(items, &order, alignment);
        if best.as_ref().is_none_or(|b| arena < b.0) {
            best = Some((arena, offsets));
        }
    }
    best.unwrap_or_default()
}

/// Places items in `order`, each in the smallest gap between conflicting items that fits,
/// or above all of them.
fn best_fit(items: &[Item], order: &[usize], alignment: u64) -> (u64, Vec<u64>) {
    let mut offsets = vec![0u64; items.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(items.len());
    let mut top = 0u64;
    for &i in order {
        let size = items[i].size;
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&j| items[i].conflicts(&items[j]))
            .map(|&j| (offsets[j], offsets[j] + items[j].size))
            .collect();
        busy.sort_unstable();
        let (mut cursor, mut fit): (u64, Option<(u64, u64)>) = (0, None);
        for (s, e) in busy {
            let off = align_up(cursor, alignment);
            if s >= off && s - off >= size && fit.is_none_or(|(gap, _)| s - off < gap) {
                fit = Some((s - off, off));
            }
            cursor = cursor.max(e);
        }
        let off = fit.map_or_else(|| align_up(cursor, alignment), |(_, o)| o);
        offsets[i] = off;
        top = top.max(off + size);
        placed.push(i);
    }
    (align_up(top, alignment), offsets)
}

/// The `(parameter, value)` updates that may write the value into the parameter's slot, as
/// value → parameter (the rules are on [`plan_memory_updating`]).
fn in_place_updates(
    g: &Graph,
    kernels: &[Kernel],
    outputs: &[NodeId],
    updates: &[(NodeId, NodeId)],
) -> BTreeMap<NodeId, NodeId> {
    let candidates = in_place_candidates(g, kernels, outputs, updates);
    written_in_place(&candidates, |c| !kernels[c.step + 1..].iter().any(|k| k.inputs.contains(&c.param)))
        .map(|c| (c.value, c.param))
        .collect()
}

/// An update [`in_place_updates`] writes into its parameter's slot where no kernel after
/// `step` (the one storing it) reads the parameter.
pub(crate) struct InPlaceCandidate {
    pub param: NodeId,
    pub value: NodeId,
    pub step: usize,
}

/// The `candidates` written in place: those whose kernel `last_reader` says is their
/// parameter's last reader, the first such update of each parameter.
pub(crate) fn written_in_place(
    candidates: &[InPlaceCandidate],
    last_reader: impl Fn(&InPlaceCandidate) -> bool,
) -> impl Iterator<Item = &InPlaceCandidate> {
    let mut written = BTreeSet::new();
    candidates.iter().filter(move |c| last_reader(c) && written.insert(c.param))
}

/// The updates of `kernels` that could be written in place in an order where their kernel
/// is the parameter's last reader: every condition of [`plan_memory_updating`] but that one.
pub(crate) fn in_place_candidates(
    g: &Graph,
    kernels: &[Kernel],
    outputs: &[NodeId],
    updates: &[(NodeId, NodeId)],
) -> Vec<InPlaceCandidate> {
    // Per kernel (by step), built when one of its outputs is first asked about: its members,
    // and the parameters each output reads through them (an optimizer kernel merged of
    // hundreds of updates asked this per update and output).
    let mut per_kernel: BTreeMap<usize, (MemberOrder, BTreeMap<NodeId, BTreeSet<NodeId>>)> = BTreeMap::new();
    let mut out = Vec::new();
    for &(p, u) in updates {
        if !matches!(g.node(p).op, fusegraph_ir::Op::Parameter { .. })
            || g.ty(p) != g.ty(u)
            || g.ty(u).dtype == DType::F16
            || outputs.contains(&p)
        {
            continue;
        }
        let producers: Vec<usize> = (0..kernels.len()).filter(|&s| kernels[s].outputs.contains(&u)).collect();
        let [step] = producers[..] else { continue };
        let k = &kernels[step];
        let sides = crate::windows::side_windows(g, k);
        if k.kind != KernelKind::Loop && !sides.contains(&u) {
            continue;
        }
        let (members, params_read) = per_kernel.entry(step).or_insert_with(|| {
            let members = MemberOrder::of(k);
            let params_read = k.outputs.iter().map(|&o| (o, parameters_read(g, &members, o))).collect();
            (members, params_read)
        });
        // The code generator computes every output of element `t` before storing any (see
        // `loop_main` in fusegraph-wgsl); with packed f16 outputs that order is not kept.
        let others_ok = k.outputs.iter().all(|&o| {
            o == u
                || !params_read[&o].contains(&p)
                || (g.ty(o).dtype != DType::F16 && reads_only_same_index(g, members, o, p))
                || reads_only_outside_windows(g, members, o, p, &sides)
        });
        let safe_inside = !k.inputs.contains(&p) || (reads_only_same_index(g, members, u, p) && others_ok);
        if safe_inside {
            out.push(InPlaceCandidate { param: p, value: u, step });
        }
    }
    out
}

/// Whether member `o` of a kernel reads `p` only as the operand of one of the kernel's side
/// windows (`sides`, [`crate::windows::side_windows`]): outside the window, which the kernel
/// writes alone, so never an element it writes.
fn reads_only_outside_windows(g: &Graph, members: &MemberOrder, o: NodeId, p: NodeId, sides: &[NodeId]) -> bool {
    let mut stack = vec![o];
    let mut seen = BTreeSet::new();
    while let Some(n) = stack.pop() {
        for (i, q) in g.operands(n).into_iter().enumerate() {
            if i == 0 && sides.contains(&n) {
                continue;
            }
            if q == p {
                return false;
            }
            if members.contains(&q) && seen.insert(q) {
                stack.push(q);
            }
        }
    }
    true
}

/// The parameters member `o` of a kernel reads, directly or through other members.
fn parameters_read(g: &Graph, members: &MemberOrder, o: NodeId) -> BTreeSet<NodeId> {
    let mut read = BTreeSet::new();
    let mut stack = vec![o];
    let mut seen = BTreeSet::new();
    while let Some(n) = stack.pop() {
        for q in g.operands(n) {
            if matches!(g.node(q).op, fusegraph_ir::Op::Parameter { .. }) {
                read.insert(q);
            }
            if members.contains(&q) && seen.insert(q) {
                stack.push(q);
            }
        }
    }
    read
}

/// Output → input pairs that may share bytes (see the module docs).
fn in_place_pairs(
    g: &Graph,
    kernels: &[Kernel],
    outputs: &[NodeId],
    live: &BTreeMap<NodeId, Vec<Interval>>,
) -> BTreeMap<NodeId, NodeId> {
    let mut pairs = BTreeMap::new();
    for (step, k) in kernels.iter().enumerate() {
        let [o] = k.outputs[..] else { continue };
        if k.kind != KernelKind::Loop || g.ty(o).dtype == DType::F16 {
            continue;
        }
        let Some([oi]) = live.get(&o).map(Vec::as_slice) else { continue };
        if oi.start != step {
            continue;
        }
        let members = MemberOrder::of(k);
        let host = k.inputs.iter().copied().find(|&i| {
            is_arena(g, i)
                && !outputs.contains(&i)
                && g.ty(i).dtype != DType::F16
                && matches!(live.get(&i).map(Vec::as_slice), Some([ii]) if ii.end == step && ii.bytes == oi.bytes)
                && reads_only_same_index(g, &members, o, i)
        });
        if let Some(i) = host {
            pairs.insert(o, i);
        }
    }
    pairs
}

/// Whether `input` is reached from `output` inside `kernel`, and only through same-index
/// edges: then invocation `t` reads element `t` of `input` and no other.
fn reads_only_same_index(g: &Graph, members: &MemberOrder, output: NodeId, input: NodeId) -> bool {
    // Everything reachable from the output, and the operands reached through an index change.
    let (mut reachable, mut stack, mut crossed) = (BTreeSet::from([output]), vec![output], Vec::new());
    let mut same_path = false;
    while let Some(n) = stack.pop() {
        let mut same = same_index_operands(g, n);
        // A dynamic update slice reads its operand at the element's own index (outside the
        // window; inside, not at all).
        if matches!(g.node(n).op, fusegraph_ir::Op::DynamicUpdateSlice { .. }) {
            same.push(g.operands(n)[0]);
        }
        for p in g.operands(n) {
            if !same.contains(&p) {
                crossed.push(p);
            } else if p == input {
                same_path = true;
            }
            if members.contains(&p) && reachable.insert(p) {
                stack.push(p);
            }
        }
    }
    // Whatever is upstream of an index change must not include the input.
    let mut seen = BTreeSet::new();
    while let Some(n) = crossed.pop() {
        if n == input {
            return false;
        }
        if members.contains(&n) && seen.insert(n) {
            crossed.extend(g.operands(n));
        }
    }
    same_path
}

/// Proves `plan` sound for values live over `intervals` (from
/// [`crate::liveness::intervals_multi`] for the schedule the plan is for): every offset is
/// aligned and inside its region, every live value has an arena location large enough, and
/// no two arena values live at a common step share a byte, except an in-place pair recorded
/// in [`MemoryPlan::in_place`] whose live ranges meet at exactly the step where the input
/// dies and the output is born.
pub fn check_plan(plan: &MemoryPlan, intervals: &BTreeMap<NodeId, Vec<Interval>>) -> Result<(), PlanError> {
    let alignment = plan.alignment.max(1);
    for (&node, loc) in &plan.locations {
        if loc.offset % alignment != 0 {
            return Err(PlanError::Misaligned { node, offset: loc.offset, alignment });
        }
        let region_bytes = match loc.region {
            Region::Arena => plan.arena_bytes,
            Region::Persistent => plan.persistent_bytes,
            // A buffer of its own, as large as the value.
            Region::External(_) => loc.size,
        };
        if loc.offset.checked_add(loc.size).is_none_or(|end| end > region_bytes) {
            return Err(PlanError::OutOfBounds {
                node,
                bytes: loc.offset..loc.offset.saturating_add(loc.size),
                region: loc.region,
                region_bytes,
            });
        }
    }
    for (&node, ivs) in intervals {
        let bytes = ivs.iter().map(|i| i.bytes).max().unwrap_or(0);
        match plan.locations.get(&node) {
            Some(loc) if loc.region == Region::Arena && loc.size >= bytes => {}
            _ => return Err(PlanError::Missing { node, bytes }),
        }
    }
    let mut arena: Vec<(u64, u64, NodeId)> = plan
        .locations
        .iter()
        .filter(|(id, l)| l.region == Region::Arena && intervals.contains_key(id))
        .map(|(&id, l)| (l.offset, l.offset + l.size, id))
        .collect();
    arena.sort_unstable();
    for (x, &(a_off, a_end, a)) in arena.iter().enumerate() {
        for &(b_off, b_end, b) in arena[x + 1..].iter().take_while(|(off, _, _)| *off < a_end) {
            for ia in &intervals[&a] {
                for ib in &intervals[&b] {
                    if ia.start > ib.end || ib.start > ia.end {
                        continue;
                    }
                    let handed_over = (plan.in_place.get(&b) == Some(&a) && ia.end == ib.start)
                        || (plan.in_place.get(&a) == Some(&b) && ib.end == ia.start);
                    if !handed_over {
                        return Err(PlanError::Overlap {
                            a,
                            a_bytes: a_off..a_end,
                            a_steps: (ia.start, ia.end),
                            b,
                            b_bytes: b_off..b_end,
                            b_steps: (ib.start, ib.end),
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::FusionMode;
    use crate::partition::partition;
    use fusegraph_ir::GraphBuilder;

    fn chain() -> (Graph, Vec<NodeId>) {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, vec![16, 16]).unwrap();
        let y = x.exp().unwrap().tanh().unwrap().t().unwrap().neg().unwrap();
        (b.graph(), vec![y.id()])
    }

    #[test]
    fn rejects_a_hand_made_overlap() {
        let (g, outs) = chain();
        let kernels = partition(&g, &outs, FusionMode::Off).unwrap();
        let plan = plan_memory_with(
            &g,
            &kernels,
            &outs,
            &MemoryOptions { alignment: 256, in_place: false, ..Default::default() },
        );
        assert_eq!(check_plan(&plan, &plan.intervals), Ok(()));
        // Put the exp result where the input lives: both are live at step 0.
        let (x, e) = (kernels[0].inputs[0], kernels[0].outputs[0]);
        let mut bad = plan.clone();
        bad.locations.get_mut(&e).unwrap().offset = plan.locations[&x].offset;
        match check_plan(&bad, &bad.intervals) {
            Err(PlanError::Overlap { a, b, a_bytes, b_bytes, .. }) => {
                assert!(a == e || b == e);
                assert!(a_bytes.start < b_bytes.end && b_bytes.start < a_bytes.end);
            }
            other => panic!("expected an overlap, got {other:?}"),
        }
        // Misaligned and out-of-bounds offsets are rejected too.
        let mut mis = plan.clone();
        mis.locations.get_mut(&e).unwrap().offset += 4;
        assert!(matches!(check_plan(&mis, &mis.intervals), Err(PlanError::Misaligned { .. })));
        let mut oob = plan.clone();
        oob.locations.get_mut(&e).unwrap().offset = plan.arena_bytes;
        assert!(matches!(check_plan(&oob, &oob.intervals), Err(PlanError::OutOfBounds { .. })));
        let mut missing = plan.clone();
        missing.locations.remove(&e);
        assert!(matches!(check_plan(&missing, &missing.intervals), Err(PlanError::Missing { .. })));
    }

    #[test]
    fn in_place_overlap_is_legal_only_when_recorded() {
        let (g, outs) = crate::testing::elementwise_chain(6, vec![16, 16]).unwrap();
        let kernels = partition(&g, &outs, FusionMode::Off).unwrap();
        let plan = plan_memory(&g, &kernels, &outs, 256);
        assert_eq!(plan.arena_bytes, 1024);
        assert_eq!(plan.in_place.len(), 6);
        assert_eq!(check_plan(&plan, &plan.intervals), Ok(()));
        let mut unrecorded = plan.clone();
        unrecorded.in_place.remove(&kernels[2].outputs[0]);
        assert!(matches!(check_plan(&unrecorded, &unrecorded.intervals), Err(PlanError::Overlap { .. })));
    }

    #[test]
    fn in_place_only_through_same_index_edges() {
        let (g, outs) = chain();
        let kernels = partition(&g, &outs, FusionMode::Off).unwrap();
        let live = intervals_multi(&g, &kernels, &outs);
        let pairs = in_place_pairs(&g, &kernels, &outs, &live);
        // exp on the input, tanh on exp, neg on the transpose: in place; the transpose reads
        // other elements than it writes: not.
        let out = |i: usize| kernels[i].outputs[0];
        let expected = BTreeMap::from([(out(0), kernels[0].inputs[0]), (out(1), out(0)), (out(3), out(2))]);
        assert_eq!(pairs, expected);
    }

    #[test]
    fn no_in_place_for_f16() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F16, vec![64]).unwrap();
        let y = x.exp().unwrap().tanh().unwrap();
        let (g, outs) = (b.graph(), vec![y.id()]);
        let kernels = partition(&g, &outs, FusionMode::Off).unwrap();
        let plan = plan_memory(&g, &kernels, &outs, 4);
        assert!(plan.in_place.is_empty());
        assert_eq!(plan.arena_bytes, 2 * 128);
    }

    #[test]
    fn parameter_updates_go_in_place_only_when_nothing_later_reads_the_old_value() {
        let b = GraphBuilder::new();
        let p = b.parameter("p", DType::F32, [64]).unwrap();
        let g = b.input("g", DType::F32, [64]).unwrap();
        let u = p.sub(&g.mul_scalar(0.1).unwrap()).unwrap();
        let z = p.add(&u).unwrap();
        let graph = b.graph();
        let opts = MemoryOptions::default();
        // Alone: `u` is written into `p`'s slot and takes no arena bytes.
        let outs = [u.id()];
        let ks = partition(&graph, &outs, FusionMode::Off).unwrap();
        let plan = plan_memory_updating(&graph, &ks, &outs, &opts, &[(p.id(), u.id())]);
        assert_eq!(plan.updated_in_place, BTreeMap::from([(u.id(), p.id())]));
        assert_eq!(plan.locations[&u.id()], plan.locations[&p.id()]);
        assert!(!plan.intervals.contains_key(&u.id()));
        let copy = plan_memory_with(&graph, &ks, &outs, &opts);
        assert_eq!(plan.naive_bytes + 256, copy.naive_bytes, "one arena value fewer");
        assert!(plan.arena_bytes <= copy.arena_bytes);
        // A later kernel reads the old `p`: the update stays in the arena (copied after the run).
        let outs = [u.id(), z.id()];
        let ks = partition(&graph, &outs, FusionMode::Off).unwrap();
        let plan = plan_memory_updating(&graph, &ks, &outs, &opts, &[(p.id(), u.id())]);
        assert!(plan.updated_in_place.is_empty());
        assert_eq!(plan.locations[&u.id()].region, Region::Arena);
        // A parameter that is itself an output keeps its value for the readback.
        let outs = [u.id(), p.id()];
        let ks = partition(&graph, &outs, FusionMode::Off).unwrap();
        assert!(plan_memory_updating(&graph, &ks, &outs, &opts, &[(p.id(), u.id())]).updated_in_place.is_empty());
    }
}
