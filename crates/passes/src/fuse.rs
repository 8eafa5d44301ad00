//! The fusion pass, in the spirit of XLA's priority fusion, made memory-aware.
//!
//! Producers are visited from the outputs back to the inputs. A producer fuses into *all* of
//! its consumers' kernels or into none: cheap producers (elementwise, layout) may be
//! duplicated into several kernels; expensive ones (reductions, matmul, conv, pooling) only
//! join a single consumer kernel and only where each of their elements is computed once.
//! Every refusal has a named [`Veto`] that tests assert. A graph output, stored anyway, joins
//! its consumers' kernel only where one kernel reads it (which then stores it: multi-output
//! fusion), never by recomputation. What it does not do: reorder the graph.
//!
//! After the pass every kernel is one of two kinds (see [`KernelKind`]): a loop kernel (one
//! invocation per output element; matmul/conv/reductions with fused prologues and epilogues
//! included) or a row kernel (one workgroup per row of a reduction; row patterns such as
//! softmax and layer norm, and large plain reductions).

use crate::cost::{flops_per_element, is_data_movement, is_expensive, reads_per_operand_element, CostModel};
use crate::kernel::{is_memory_leaf, same_index_operands, Kernel, KernelKind};
use crate::liveness;
use fusegraph_ir::{Graph, IrError, NodeId, Op, Result};
use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

mod peak;
use peak::{LivePeak, ValueInfo};

/// Knobs of the fusion pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FusionOptions {
    /// Storage bindings a kernel may use (the adapter's `max_storage_buffers_per_shader_stage`).
    pub max_bindings: usize,
    /// Reductions at least this long use a row kernel (a workgroup per row).
    pub min_row_len: usize,
    /// Device figures for the benefit estimate.
    pub cost: CostModel,
    /// Refuse fusions that raise the plan's peak of live bytes.
    pub memory_aware: bool,
}

impl Default for FusionOptions {
    fn default() -> Self {
        FusionOptions { max_bindings: 8, min_row_len: 64, cost: CostModel::default(), memory_aware: true }
    }
}

/// Why a producer was not fused into its consumers.
#[derive(Clone, Debug, PartialEq)]
pub enum Veto {
    /// The producer is a graph output, stored anyway, that no kernel or more than one reads:
    /// it is not recomputed in each. (An output read by one other kernel joins it and is
    /// stored from there.)
    GraphOutput,
    /// A reduction would consume another reduction (or a contraction) inside one loop kernel.
    ReductionIntoReduction,
    /// An expensive producer would be computed more than once per element.
    DuplicatesExpensive,
    /// The kernel would need more storage bindings than the adapter allows.
    TooManyBindings {
        /// Bindings needed (for a sibling merge refused on its inputs and graph outputs
        /// alone, those: a lower bound).
        needed: usize,
        /// The limit.
        limit: usize,
    },
    /// The fused kernel would depend on itself through another kernel.
    Cycle,
    /// The plan's peak of live bytes would rise.
    PeakMemory {
        /// Peak before, bytes.
        before: u64,
        /// Peak after, bytes.
        after: u64,
    },
    /// A reduction's result is used in a way a row kernel cannot express.
    RowShape,
    /// A second matmul or convolution would join a kernel that already has one: the tiled
    /// lowering computes one contraction per kernel, so the other would run naively.
    SecondContraction,
    /// A matmul or convolution's kernel would store a second value (an intermediate of its
    /// epilogue, or the contraction itself, that a graph output or another kernel needs): the
    /// tiled lowering stores one value per kernel, so the kernel would run naively.
    SecondOutput,
    /// Arithmetic would be recomputed in the prologue of a matmul, conv or pooling, which
    /// reads each operand element many times; only data movement fuses there.
    Prologue,
    /// A cheap producer would be recomputed in several kernels though it can instead be the
    /// epilogue of the matmul or convolution it is computed from, stored once: recomputing
    /// it would save no dispatch and read its other operands once per kernel. (A graph
    /// output so computed is that epilogue rather than join its one consumer's kernel,
    /// which would store the contraction's value as well.)
    EpilogueInstead {
        /// The kernels that would recompute (or compute) it.
        kernels: usize,
    },
    /// The producer is compared with a value computed from it (a max reduction's gradient
    /// compares `x` with `max(x)`): the comparison relies on an exact tie, and a copy of `x`
    /// recomputed in another kernel may round differently (the driver compiles each copy in
    /// its own context; lavapipe lost 20 of 256 column maxima so), so it is computed once
    /// and stored.
    ComparedWithItself,
    /// The cost model estimates no gain.
    NoBenefit,
}

impl std::fmt::Display for Veto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Veto::GraphOutput => write!(f, "a graph output (stored anyway) not read by exactly one other kernel"),
            Veto::ReductionIntoReduction => {
                write!(f, "a reduction would consume another reduction or a contraction in one loop kernel")
            }
            Veto::DuplicatesExpensive => write!(f, "an expensive op would be computed in more than one kernel"),
            Veto::TooManyBindings { needed, limit } => {
                write!(f, "the kernel would need {needed} storage bindings (the limit is {limit})")
            }
            Veto::Cycle => write!(f, "the kernel would depend on itself through another kernel"),
            Veto::PeakMemory { before, after } => {
                write!(f, "the plan's peak of live bytes would rise from {before} to {after}")
            }
            Veto::RowShape => write!(f, "a reduction's result would be used in a way a row kernel cannot express"),
            Veto::SecondContraction => write!(f, "a second matmul or convolution would join the kernel"),
            Veto::SecondOutput => write!(f, "a matmul or convolution's kernel would store a second value"),
            Veto::Prologue => write!(f, "arithmetic would be recomputed in a matmul, conv or pooling prologue"),
            Veto::EpilogueInstead { kernels: 1 } => write!(
                f,
                "a graph output stored from the epilogue of the matmul or convolution it is computed from"
            ),
            Veto::EpilogueInstead { kernels } => write!(
                f,
                "recomputing it in {kernels} kernels costs more than storing it from the epilogue of the matmul or convolution it is computed from"
            ),
            Veto::ComparedWithItself => write!(
                f,
                "compared with a value computed from it: stored once, as a recomputed copy may round differently"
            ),
            Veto::NoBenefit => write!(f, "the cost model estimates no gain"),
        }
    }
}

/// One decision of the pass, for tests and `fusegraph explain`.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The producer considered.
    pub producer: NodeId,
    /// `None` if it fused, else why not.
    pub veto: Option<Veto>,
}

/// The result of fusion: kernels in execution order and every decision taken.
#[derive(Clone, Debug, PartialEq)]
pub struct Fusion {
    /// Kernels in a valid execution order.
    pub kernels: Vec<Kernel>,
    /// Decisions, in the order they were taken.
    pub log: Vec<Decision>,
    /// Sibling-merge decisions between kernels that share an input.
    pub siblings: Vec<SiblingDecision>,
}

/// One sibling-merge decision: kernels `a` and `b` (named by their roots, the member last in
/// graph order) share an input; `veto` says why they were not merged.
#[derive(Clone, Debug, PartialEq)]
pub struct SiblingDecision {
    /// Root of one kernel.
    pub a: NodeId,
    /// Root of the other.
    pub b: NodeId,
    /// `None` if merged.
    pub veto: Option<Veto>,
}

/// The groups being formed, and for each node the groups that compute it (a cheap producer
/// may be duplicated into several). Changes are made in place and undone on a veto, so a
/// decision costs what it touches rather than a copy of every group.
struct Groups {
    sets: Vec<BTreeSet<NodeId>>,
    /// The groups computing each node, by node index, in ascending order.
    owner: Vec<Vec<usize>>,
    /// Each group's kernel as liveness sees it, kept until a change could alter it.
    summaries: RefCell<Vec<Option<Summary>>>,
    /// Nodes that the groups computing them may now store where their summaries say they do
    /// not, or the reverse (a user of the node moved), each listed once (`is_stale`); the
    /// summaries are patched when next read, without recomputing the rest of them.
    /// Marked per node, not per (group, node): a constant every optimizer update recomputes
    /// has hundreds of groups, and per pair a move of each of its users would mark them all
    /// (a 32-block training step's sibling merging would push 23 million pairs, 1.9 million
    /// distinct, and spend 0.7 s sorting them).
    stale: RefCell<Vec<NodeId>>,
    is_stale: RefCell<Vec<bool>>,
    /// Groups changed (or patched) since the live ranges were last brought up to date.
    changed: RefCell<Vec<usize>>,
    /// The live ranges of the kernels as last summarized.
    live: RefCell<LivePeak>,
    /// Each node's users that read it from memory ([`Ctx::users_needing_stored`]), by
    /// index, kept until the groups computing the node or one of its users change.
    needing: RefCell<Vec<Option<Vec<NodeId>>>>,
}

/// What liveness needs of a kernel: where it runs in the peak check's order (`root`, its
/// last member's position there: graph order with the updates' arithmetic moved up, see
/// [`update_positions`]), what it stores and reads, and whether it reduces (then it may be
/// a row kernel, which stores no parameter update in place: see [`ValueInfo::update`]).
#[derive(Clone, PartialEq)]
struct Summary {
    root: usize,
    outputs: Vec<NodeId>,
    inputs: Vec<NodeId>,
    reduces: bool,
}

impl Groups {
    /// One group per op (not memory leaf) of `order` (graph order), and those ops.
    fn of_each_op(ctx: &Ctx, order: &[NodeId]) -> (Vec<NodeId>, Groups) {
        let compute: Vec<NodeId> = order.iter().copied().filter(|&n| !ctx.info[n.index()].leaf).collect();
        let groups = Groups::singletons(&compute, ctx.index_bound, order.len(), ctx.outputs);
        (compute, groups)
    }

    /// One group per node of `nodes`, among `positions` graph positions, with graph `outputs`.
    fn singletons(nodes: &[NodeId], index_bound: usize, positions: usize, outputs: &[NodeId]) -> Groups {
        let sets = nodes.iter().map(|&n| BTreeSet::from([n])).collect();
        let mut owner = vec![Vec::new(); index_bound];
        for (i, &n) in nodes.iter().enumerate() {
            owner[n.index()].push(i);
        }
        Groups {
            sets,
            owner,
            summaries: RefCell::new(vec![None; nodes.len()]),
            stale: RefCell::new(Vec::new()),
            is_stale: RefCell::new(vec![false; index_bound]),
            changed: RefCell::new((0..nodes.len()).collect()),
            live: RefCell::new(LivePeak::new(positions, index_bound, nodes.len(), outputs)),
            needing: RefCell::new(vec![None; index_bound]),
        }
    }

    /// Accounts for moving `n` (with `operands`) in or out of group `gi`: forgets `gi`'s
    /// summary, and marks stale whether the other groups computing `n` store it and whether
    /// the groups computing an operand of `n` store that operand (each depends on where its
    /// users are computed; nothing else in their summaries does).
    fn invalidate(&mut self, gi: usize, n: NodeId, operands: &[NodeId]) {
        let s = self.summaries.get_mut();
        s[gi] = None;
        self.changed.get_mut().push(gi);
        let stale = self.stale.get_mut();
        let needing = self.needing.get_mut();
        for o in std::iter::once(&n).chain(operands) {
            // Whether `n`'s users read it, and whether `n` reads its operands, from memory.
            if let Some(x) = needing.get_mut(o.index()) {
                *x = None;
            }
            if let Some(mark) = self.is_stale.get_mut().get_mut(o.index()) {
                if !std::mem::replace(mark, true) {
                    stale.push(*o);
                }
            }
        }
    }

    fn insert(&mut self, gi: usize, n: NodeId, operands: &[NodeId]) {
        self.invalidate(gi, n, operands);
        self.sets[gi].insert(n);
        let owners = &mut self.owner[n.index()];
        if let Err(at) = owners.binary_search(&gi) {
            owners.insert(at, gi);
        }
    }

    fn remove(&mut self, gi: usize, n: NodeId, operands: &[NodeId]) {
        self.invalidate(gi, n, operands);
        self.sets[gi].remove(&n);
        if let Some(owners) = self.owner.get_mut(n.index()) {
            if let Ok(at) = owners.binary_search(&gi) {
                owners.remove(at);
            }
        }
    }

    /// Whether group `gi` computes `n` (as `sets[gi].contains(&n)`, from the short list of
    /// the groups computing `n`).
    fn computes(&self, gi: usize, n: NodeId) -> bool {
        self.owner.get(n.index()).is_some_and(|o| o.binary_search(&gi).is_ok())
    }

    /// The groups that compute `n`.
    fn of(&self, n: NodeId) -> impl Iterator<Item = usize> + '_ {
        self.owner.get(n.index()).into_iter().flatten().copied()
    }
}

/// Reachability for cycle checks, one bit set per node (indexed by position in graph order)
/// holding its strict ancestors: a cycle check costs a few bit tests instead of a walk up
/// the graph. Ancestors come earlier in graph order, so row `i` holds `i` bits (half a
/// square). Kept up to [`Ancestors::MAX_NODES`] nodes (100 MB); above that the checks walk
/// the graph, which is far slower (XLA's reachability map is bit sets per instruction too).
struct Ancestors {
    /// Where each row starts in `bits`; row `i` has `ceil(i / 64)` words.
    start: Vec<usize>,
    bits: Vec<u64>,
}

impl Ancestors {
    /// A 36-block training step of the `train` demo's LM has 17 442 nodes after simplify:
    /// with the bits it fuses in seconds; walking the graph instead takes 198 s.
    const MAX_NODES: usize = 40_000;

    fn new(order: &[NodeId], pos: &[usize], operands: &[Vec<NodeId>]) -> Option<Ancestors> {
        let n = order.len();
        if n > Self::MAX_NODES {
            return None;
        }
        let mut start = Vec::with_capacity(n + 1);
        let mut total = 0;
        for i in 0..=n {
            start.push(total);
            total += i.div_ceil(64);
        }
        let mut bits = vec![0u64; total];
        for (i, node) in order.iter().enumerate() {
            for o in &operands[node.index()] {
                let j = pos[o.index()];
                // Operands come earlier in graph order: row `j` is complete, before row `i`,
                // and no longer than it.
                let (done, rest) = bits.split_at_mut(start[i]);
                let (src, dst) = (&done[start[j]..start[j + 1]], &mut rest[..start[i + 1] - start[i]]);
                for (d, s) in dst.iter_mut().zip(src) {
                    *d |= s;
                }
                dst[j / 64] |= 1 << (j % 64);
            }
        }
        Some(Ancestors { start, bits })
    }

    /// Whether the node at position `to` is a strict ancestor of the one at `from`.
    fn contains(&self, from: usize, to: usize) -> bool {
        to < from && self.bits[self.start[from] + to / 64] & (1 << (to % 64)) != 0
    }
}

struct Ctx<'a> {
    /// Values compared with a value computed from them ([`Veto::ComparedWithItself`]):
    /// never fused into their consumers, so every kernel reads the same stored bits.
    compared: BTreeSet<NodeId>,
    /// Cheap values computed from `full`/`iota` alone: inlined wherever used, never stored
    /// once fusion is done, so they do not count toward peak memory.
    const_like: BTreeSet<NodeId>,
    g: &'a Graph,
    outputs: &'a [NodeId],
    output_set: BTreeSet<NodeId>,
    /// Each node's position in graph order, by index ([`usize::MAX`]: not reachable).
    pos: Vec<usize>,
    /// Each node's position in the order the peak check runs kernels in, by index: graph
    /// order with parameter updates' arithmetic moved up ([`update_positions`]).
    model_pos: Vec<usize>,
    /// One past the largest node index (arrays indexed by node).
    index_bound: usize,
    /// What liveness needs of each node, by index.
    info: Vec<ValueInfo>,
    /// Strict ancestors of every reachable node, where the graph is small enough to hold them.
    ancestors: Option<Ancestors>,
    /// Operands and live users of every reachable node (the graph sorts edges on each call).
    /// By node index (empty for nodes not reachable).
    operands: Vec<Vec<NodeId>>,
    users: Vec<Vec<NodeId>>,
    opts: &'a FusionOptions,
    /// Scratch by node index, `u32::MAX` between uses ([`Ctx::multiplicity`]).
    scratch: RefCell<Vec<u32>>,
}

impl<'a> Ctx<'a> {
    /// The context of fusing what `outputs` need, and those nodes in graph order; the
    /// outputs in `updates` are written in place ([`fuse_updating`]).
    fn new(
        g: &'a Graph,
        outputs: &'a [NodeId],
        updates: &[NodeId],
        opts: &'a FusionOptions,
    ) -> Result<(Ctx<'a>, Vec<NodeId>)> {
        let order = g.reachable(outputs)?;
        let index_bound = order.iter().map(|n| n.index() + 1).max().unwrap_or(0);
        let mut operands = vec![Vec::new(); index_bound];
        for &n in &order {
            operands[n.index()] = g.operands(n);
        }
        let mut users: Vec<Vec<NodeId>> = vec![Vec::new(); index_bound];
        // Users in node order (each node's operands, in node order).
        let mut by_index = order.clone();
        by_index.sort_unstable();
        for &n in &by_index {
            for &o in &operands[n.index()] {
                let us = &mut users[o.index()];
                if us.last() != Some(&n) {
                    us.push(n);
                }
            }
        }
        let mut const_like = BTreeSet::new();
        for &n in &order {
            let op = &g.node(n).op;
            if !is_memory_leaf(op) && !is_expensive(op) && operands[n.index()].iter().all(|o| const_like.contains(o)) {
                const_like.insert(n);
            }
        }
        let output_set: BTreeSet<NodeId> = outputs.iter().copied().collect();
        let mut info = vec![ValueInfo::default(); index_bound];
        for &n in &order {
            let output = output_set.contains(&n);
            info[n.index()] = ValueInfo {
                bytes: liveness::value_bytes(g, n),
                arena: liveness::is_arena(g, n),
                counted: (output || !const_like.contains(&n)) && !updates.contains(&n),
                update: updates.contains(&n),
                output,
                leaf: is_memory_leaf(&g.node(n).op),
            };
        }
        let mut pos = vec![usize::MAX; index_bound];
        for (i, &n) in order.iter().enumerate() {
            pos[n.index()] = i;
        }
        let model_pos = update_positions(g, &order, &pos, &operands, &users, &info);
        let mut ctx = Ctx {
            model_pos,
            compared: BTreeSet::new(),
            const_like,
            g,
            outputs,
            output_set,
            ancestors: Ancestors::new(&order, &pos, &operands),
            pos,
            index_bound,
            info,
            operands,
            users,
            opts,
            scratch: RefCell::new(vec![u32::MAX; index_bound]),
        };
        ctx.compared = compared_with_themselves(g, &order);
        ctx.compared.retain(|n| !ctx.const_like.contains(n));
        Ok((ctx, order))
    }
}

/// Each node's position, by index, in `order` (graph order; `pos` its positions) with the
/// arithmetic of parameter updates moved up: a node all of whose uses lead only to new
/// parameter values (an optimizer's update of one weight) comes right after the last of its
/// operands. A training step records its optimizer after the whole backward pass, but the
/// scheduler runs each update as soon as its gradient is ready (it writes into the
/// parameter's slot and frees the gradient); the peak check's order must do so too, or
/// kernels that hold gradients until the end (a bias gradient's reduction fused into its
/// update, the updates of several layers merged into one kernel) look free.
fn update_positions(
    g: &Graph,
    order: &[NodeId],
    pos: &[usize],
    operands: &[Vec<NodeId>],
    users: &[Vec<NodeId>],
    info: &[ValueInfo],
) -> Vec<usize> {
    let mut cone = vec![false; pos.len()];
    for &n in order.iter().rev() {
        let (v, us) = (&info[n.index()], &users[n.index()]);
        // Elementwise arithmetic only: a gradient's matrix product or reduction stays where
        // the backward pass computes it (everything in it leads only to updates).
        let elementwise = matches!(
            g.node(n).op,
            Op::Unary(_)
                | Op::Binary(_)
                | Op::Select
                | Op::Cast { .. }
                | Op::Broadcast { .. }
                | Op::Reshape { .. }
                | Op::Full { .. }
                | Op::Iota { .. }
        );
        cone[n.index()] =
            elementwise && (v.update || (!v.output && !us.is_empty())) && us.iter().all(|u| cone[u.index()]);
    }
    // A node of the cone sits right after its latest operand outside the cone (its anchor),
    // after the nodes outside the cone at that position; those of one anchor in graph order.
    let mut anchor = pos.to_vec();
    let mut key: Vec<(usize, bool, usize)> = Vec::with_capacity(order.len());
    for &n in order {
        let i = n.index();
        if cone[i] {
            // After its operands, and after the last reader outside the cone of a parameter
            // it reads: the update written over a weight waits for the weight's last use.
            let war = |o: &NodeId| match g.node(*o).op {
                Op::Parameter { .. } => {
                    users[o.index()].iter().filter(|u| !cone[u.index()]).map(|u| pos[u.index()]).max().unwrap_or(0)
                }
                _ => 0,
            };
            anchor[i] = operands[i].iter().map(|o| anchor[o.index()].max(war(o))).max().unwrap_or(0);
        }
        key.push((anchor[i], cone[i], pos[i]));
    }
    let mut ranked: Vec<usize> = (0..order.len()).collect();
    ranked.sort_unstable_by_key(|&k| key[k]);
    let mut at = vec![usize::MAX; pos.len()];
    for (p, &k) in ranked.iter().enumerate() {
        at[order[k].index()] = p;
    }
    at
}

/// The cheap computed values of `nodes` that a comparison reads (through data movement,
/// which copies bits) on one side while its other side is computed from them: `eq(x,
/// max(x))` holds for the maximum only where both sides see the same bits of `x`, so such a
/// value must be computed once and stored, never recomputed (fusion's
/// [`Veto::ComparedWithItself`]; rematerialization skips them too). Expensive producers are
/// left out: they are computed once per element wherever they fuse.
pub fn compared_with_themselves(g: &Graph, nodes: &[NodeId]) -> BTreeSet<NodeId> {
    self_comparisons(g, nodes).into_iter().map(|(x, _)| x).collect()
}

/// `(x, other)` for every comparison among `nodes` that reads the cheap computed value `x`
/// on one side (through data movement) and `other`, computed from `x`, on the other (see
/// [`compared_with_themselves`]).
pub fn self_comparisons(g: &Graph, nodes: &[NodeId]) -> Vec<(NodeId, NodeId)> {
    // The cheap values `n` copies its bits from: itself unless it is data movement.
    let sources = |n: NodeId| -> Vec<NodeId> {
        let mut stack = vec![n];
        let mut found = Vec::new();
        while let Some(m) = stack.pop() {
            let op = &g.node(m).op;
            if is_memory_leaf(op) || is_expensive(op) {
                continue;
            }
            if is_data_movement(op) {
                stack.extend(g.operands(m));
            } else {
                found.push(m);
            }
        }
        found
    };
    let mut pairs = Vec::new();
    for &n in nodes {
        let Op::Binary(b) = g.node(n).op else { continue };
        let operands = g.operands(n);
        let [lhs, rhs] = operands.as_slice() else { continue };
        if !b.is_comparison() {
            continue;
        }
        for (side, other) in [(*lhs, *rhs), (*rhs, *lhs)] {
            for x in sources(side) {
                if computed_from(g, other, x) {
                    pairs.push((x, other));
                }
            }
        }
    }
    pairs
}

/// Whether `x` is `from` or one of its operands, direct or not.
pub(crate) fn computed_from(g: &Graph, from: NodeId, x: NodeId) -> bool {
    let mut stack = vec![from];
    let mut seen = BTreeSet::new();
    while let Some(m) = stack.pop() {
        if m == x {
            return true;
        }
        if seen.insert(m) {
            stack.extend(g.operands(m));
        }
    }
    false
}

impl Ctx<'_> {
    /// The peak of live bytes of the kernels `groups` form, run in [`Ctx::order`]: what
    /// [`liveness::intervals`] and [`liveness::peak_live_bytes`] give for those kernels. This
    /// runs once per memory-relevant decision: the summaries of changed groups are brought up
    /// to date and their live ranges moved in [`LivePeak`]; only where that cannot place the
    /// kernels (two share a root, or the grouping is not valid) is the plan swept
    /// ([`Ctx::swept_peak`]).
    fn peak(&self, groups: &Groups) -> u64 {
        let mut cache = groups.summaries.borrow_mut();
        let mut changed = std::mem::take(&mut *groups.changed.borrow_mut());
        let stale = std::mem::take(&mut *groups.stale.borrow_mut());
        let mut is_stale = groups.is_stale.borrow_mut();
        for x in stale {
            is_stale[x.index()] = false;
            // The groups computing `x` now; one without a summary (forgotten since it
            // changed) needs nothing.
            for k in groups.of(x) {
                let Some(sum) = cache[k].as_mut() else { continue };
                match (sum.outputs.binary_search(&x), self.stored(x, groups)) {
                    (Ok(at), false) => {
                        sum.outputs.remove(at);
                        changed.push(k);
                    }
                    (Err(at), true) => {
                        sum.outputs.insert(at, x);
                        changed.push(k);
                    }
                    _ => {}
                }
            }
        }
        changed.sort_unstable();
        changed.dedup();
        let mut live = groups.live.borrow_mut();
        for gi in changed {
            let gr = &groups.sets[gi];
            if !gr.is_empty() && cache[gi].is_none() {
                cache[gi] = Some(self.summary(gr, groups));
            }
            live.set(gi, cache[gi].as_ref().filter(|_| !gr.is_empty()));
        }
        match live.peak(&self.info) {
            Some(peak) => {
                debug_assert_eq!(peak, self.swept_peak(&cache), "incremental and swept peaks differ");
                peak
            }
            None => self.swept_peak(&cache),
        }
    }

    /// The peak of live bytes of kernels `cache` (`None`: an empty group), run in
    /// [`Ctx::order`], by a sweep over the whole plan.
    fn swept_peak(&self, cache: &[Option<Summary>]) -> u64 {
        let ks: Vec<&Summary> = cache.iter().flatten().collect();
        let order = self.order(&ks);
        let last = order.len().saturating_sub(1);
        const UNSEEN: usize = usize::MAX;
        let mut start = vec![UNSEEN; self.index_bound];
        let mut end = vec![0; self.index_bound];
        let mut values = Vec::new();
        // Parameter updates stored by a kernel that reduces (see `ValueInfo::update`).
        let mut out_of_place = BTreeSet::new();
        for (step, &k) in order.iter().enumerate() {
            for o in &ks[k].outputs {
                if start[o.index()] == UNSEEN {
                    (start[o.index()], end[o.index()]) = (step, step);
                    values.push(*o);
                }
                if ks[k].reduces && self.info[o.index()].update {
                    out_of_place.insert(*o);
                }
            }
            for i in ks[k].inputs.iter().filter(|i| self.info[i.index()].arena) {
                if start[i.index()] == UNSEEN {
                    (start[i.index()], end[i.index()]) = (0, step);
                    values.push(*i);
                }
                end[i.index()] = end[i.index()].max(step);
            }
        }
        for o in self.outputs.iter().filter(|o| self.info[o.index()].arena) {
            if start[o.index()] == UNSEEN {
                start[o.index()] = 0;
                values.push(*o);
            }
            end[o.index()] = last;
        }
        let mut delta = vec![0i64; order.len() + 2];
        for v in values.into_iter().filter(|v| self.info[v.index()].counted || out_of_place.contains(v)) {
            let bytes = self.info[v.index()].bytes as i64;
            delta[start[v.index()]] += bytes;
            delta[end[v.index()] + 1] -= bytes;
        }
        let (mut cur, mut peak) = (0i64, 0i64);
        for d in delta {
            cur += d;
            peak = peak.max(cur);
        }
        peak as u64
    }

    fn summary(&self, gr: &BTreeSet<NodeId>, groups: &Groups) -> Summary {
        let root = gr.iter().map(|m| self.model_pos[m.index()]).max().unwrap_or(0);
        let mut members: Vec<NodeId> = gr.iter().copied().collect();
        members.sort_by_key(|n| self.pos(*n));
        let mut inputs = Vec::new();
        let mut seen = BTreeSet::new();
        for &m in &members {
            for &o in self.operands(m) {
                if !gr.contains(&o) && seen.insert(o) {
                    inputs.push(o);
                }
            }
        }
        let reduces = members.iter().any(|&m| matches!(self.g.node(m).op, Op::Reduce { .. }));
        Summary { root, outputs: self.group_outputs(gr, groups), inputs, reduces }
    }

    /// `n`'s position in graph order ([`usize::MAX`] if it is not reachable).
    fn pos(&self, n: NodeId) -> usize {
        self.pos.get(n.index()).copied().unwrap_or(usize::MAX)
    }

    fn users(&self, id: NodeId) -> Vec<NodeId> {
        self.users.get(id.index()).cloned().unwrap_or_default()
    }

    /// Storage bindings of a kernel of `members` storing `outs`: its inputs plus outputs.
    fn bindings(&self, members: &BTreeSet<NodeId>, outs: &[NodeId]) -> usize {
        self.inputs(members).collect::<BTreeSet<_>>().len() + outs.len()
    }

    /// What a kernel of `members` reads: the operands of members that are not members, in
    /// member order, repeats included.
    fn inputs<'s>(&'s self, members: &'s BTreeSet<NodeId>) -> impl Iterator<Item = NodeId> + 's {
        members.iter().flat_map(|&m| self.operands(m).iter().copied()).filter(|o| !members.contains(o))
    }

    /// The root of a kernel of `members`: the member last in graph order.
    fn root(&self, members: &BTreeSet<NodeId>) -> Option<NodeId> {
        members.iter().copied().max_by_key(|&m| self.pos(m))
    }

    fn operands(&self, id: NodeId) -> &[NodeId] {
        self.operands.get(id.index()).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The members a kernel of `members` stores, in node order.
    fn group_outputs(&self, members: &BTreeSet<NodeId>, groups: &Groups) -> Vec<NodeId> {
        members.iter().copied().filter(|&m| self.stored(m, groups)).collect()
    }

    /// Whether a kernel computing `m` stores it: `m` is a graph output, or some user of it is
    /// computed by a kernel that does not compute `m` (see [`Ctx::reads_stored`]). That user
    /// may be a member too, duplicated into the other kernel (where a producer fuses into all
    /// its consumers' kernels this does not happen, but `pull_exclusive_operands` can make it
    /// happen: a kernel computing `exp(t)` and `exp(t) + a` stores `exp(t)` when another
    /// kernel computing `exp(t) + a` reads it from memory).
    fn stored(&self, m: NodeId, groups: &Groups) -> bool {
        self.output_set.contains(&m) || !self.users_needing_stored(m, groups).is_empty()
    }

    /// Whether user `u` of `m` is computed in some kernel that does not compute `m` itself
    /// (and so reads it from memory).
    fn reads_stored(&self, u: NodeId, m: NodeId, groups: &Groups) -> bool {
        groups.of(u).any(|gi| !groups.computes(gi, m))
    }

    /// The users of `m` that read it from memory ([`Ctx::reads_stored`]): a kernel computing
    /// `m` stores it where one of them is outside it. Cached in [`Groups::needing`] (a value
    /// duplicated into hundreds of kernels, such as a step size every optimizer update
    /// computes, would otherwise have all its users checked per question).
    fn users_needing_stored<'g>(&self, m: NodeId, groups: &'g Groups) -> std::cell::RefMut<'g, [NodeId]> {
        let cache = groups.needing.borrow_mut();
        std::cell::RefMut::map(cache, |c| {
            c[m.index()]
                .get_or_insert_with(|| {
                    let users = self.users.get(m.index()).into_iter().flatten();
                    users.copied().filter(|&u| self.reads_stored(u, m, groups)).collect()
                })
                .as_mut_slice()
        })
    }

    /// Evaluations per element of each member in a loop kernel whose stored members are
    /// `outs`, matching the code generator: each output's region (same-index chain) is
    /// computed once per element into registers; everything else is a function call per use.
    fn multiplicity(&self, members: &BTreeSet<NodeId>, outs: &[NodeId]) -> BTreeMap<NodeId, f64> {
        // Members by dense index (their place in `list`), through a scratch array by node
        // index: a merged optimizer kernel has thousands of members, asked about per merge.
        let list: Vec<NodeId> = members.iter().copied().collect();
        let mut local = self.scratch.borrow_mut();
        for (i, &m) in list.iter().enumerate() {
            local[m.index()] = i as u32;
        }
        let at = |n: NodeId| -> Option<usize> { Some(local[n.index()]).filter(|&i| i != u32::MAX).map(|i| i as usize) };
        // Lets: the regions (same-index chains from each output, see `kernel::regions`) each
        // member is in; a region computes each of its members once per element.
        let mut lets = vec![0.0f64; list.len()];
        let mut seen = vec![usize::MAX; list.len()];
        for (r, &o) in outs.iter().enumerate() {
            let Some(oi) = at(o) else { continue };
            seen[oi] = r;
            let mut stack = vec![o];
            while let Some(n) = stack.pop() {
                lets[at(n).expect("a member")] += 1.0;
                for q in same_index_operands(self.g, n) {
                    if let Some(qi) = at(q) {
                        if seen[qi] != r {
                            seen[qi] = r;
                            stack.push(q);
                        }
                    }
                }
            }
        }
        // Calls: everything else is a function call per use, users before their operands.
        let mut order: Vec<usize> = (0..list.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(self.pos(list[i])));
        let mut calls = vec![0.0f64; list.len()];
        for &ni in &order {
            let n = list[ni];
            let mut total = 0.0;
            for &u in &self.users[n.index()] {
                let Some(ui) = at(u) else { continue };
                // A let of `u` reads `n` from registers when both share a region, which they
                // do wherever `u` reads it at the same index (a region holds the same-index
                // operands of its members); otherwise each let of `u` reads it by a call.
                let same = same_index_operands(self.g, u).contains(&n);
                let let_reads = if same { 0.0 } else { lets[ui] };
                for (p, &o) in self.operands(u).iter().enumerate() {
                    if o == n {
                        total += (let_reads + calls[ui]) * reads_per_operand_element(self.g, u, p);
                    }
                }
            }
            calls[ni] = total;
        }
        for &m in &list {
            local[m.index()] = u32::MAX;
        }
        list.iter().enumerate().map(|(i, &n)| (n, lets[i] + calls[i])).collect()
    }

    /// Whether a contraction (matmul, conv, pooling) in the group has arithmetic in its
    /// prologue: its operands are read many times per element, so only data movement (cast,
    /// transpose, broadcast, …) may be recomputed there.
    fn arithmetic_prologue(&self, members: &BTreeSet<NodeId>) -> bool {
        members.iter().any(|&c| {
            matches!(self.g.node(c).op, Op::MatMul | Op::Conv2d { .. } | Op::Pool { .. })
                && self
                    .g
                    .operands(c)
                    .iter()
                    .any(|&o| self.upstream_or_self(members, o, &|n| !is_data_movement(&self.g.node(n).op)))
        })
    }

    fn upstream_or_self(&self, members: &BTreeSet<NodeId>, from: NodeId, pred: &dyn Fn(NodeId) -> bool) -> bool {
        let mut stack = vec![from];
        let mut seen = BTreeSet::new();
        while let Some(n) = stack.pop() {
            if !members.contains(&n) || !seen.insert(n) {
                continue;
            }
            if pred(n) {
                return true;
            }
            stack.extend_from_slice(self.operands(n));
        }
        false
    }

    /// Members that depend, inside the group, on `roots`.
    fn dependents(&self, members: &BTreeSet<NodeId>, roots: &BTreeSet<NodeId>) -> BTreeSet<NodeId> {
        let mut order: Vec<NodeId> = members.iter().copied().collect();
        order.sort_by_key(|n| self.pos(*n));
        let mut dep: BTreeSet<NodeId> = BTreeSet::new();
        for n in order {
            if self.operands(n).iter().any(|o| roots.contains(o) || dep.contains(o)) {
                dep.insert(n);
            }
        }
        dep
    }

    /// Decides the kernel kind of a candidate group, or why it cannot be one kernel.
    fn analyze(&self, members: &BTreeSet<NodeId>, outs: &[NodeId]) -> Result<KernelKind, Veto> {
        let g = self.g;
        let reduces: BTreeSet<NodeId> =
            members.iter().copied().filter(|&n| matches!(g.node(n).op, Op::Reduce { .. })).collect();
        let expensive: BTreeSet<NodeId> = members.iter().copied().filter(|&n| is_expensive(&g.node(n).op)).collect();
        // (Only expensive members' multiplicities matter: none, nothing to count.)
        let loop_ok = expensive.is_empty() || {
            let m = self.multiplicity(members, outs);
            expensive.iter().all(|e| m[e] <= 1.0 + 1e-9)
        };
        // A reduction that consumes an expensive member serializes its work in one thread.
        let reduce_after_expensive = !reduces.is_empty() && !expensive.is_empty() && {
            let after = self.dependents(members, &expensive);
            reduces.iter().any(|r| after.contains(r) || self.upstream(members, *r, &expensive))
        };
        let contractions = members.iter().filter(|&&n| matches!(g.node(n).op, Op::MatMul | Op::Conv2d { .. })).count();
        let loop_kind = if self.arithmetic_prologue(members) {
            Err(Veto::Prologue)
        } else if contractions > 1 {
            Err(Veto::SecondContraction)
        } else if contractions == 1 && outs.len() > 1 {
            Err(Veto::SecondOutput)
        } else if !loop_ok {
            Err(Veto::DuplicatesExpensive)
        } else if reduce_after_expensive {
            Err(Veto::ReductionIntoReduction)
        } else {
            Ok(KernelKind::Loop)
        };
        if reduces.is_empty() {
            return loop_kind;
        }
        let row = self.row_kind(members, outs, &reduces);
        let long = reduces.iter().any(|&r| {
            let Op::Reduce { axes, .. } = &g.node(r).op else { return false };
            let d = g.ty(g.operands(r)[0]).shape.dims().to_vec();
            axes.iter().map(|&a| d[a]).product::<usize>() >= self.opts.min_row_len
        });
        match (loop_kind, row) {
            (Ok(l), Ok(r)) => Ok(if long { r } else { l }),
            // A loop kernel reduces each output's row serially in one invocation: fine for
            // short rows, but a long one (reductions over different rows merged as
            // siblings) starves a GPU of threads and passes a CPU adapter's loop limit.
            (Ok(_), Err(re)) if long => Err(re),
            (Ok(l), Err(_)) => Ok(l),
            (Err(_), Ok(r)) => Ok(r),
            (Err(e), Err(re)) => Err(if e == Veto::DuplicatesExpensive && reduces.len() > 1 { re } else { e }),
        }
    }

    fn upstream(&self, members: &BTreeSet<NodeId>, from: NodeId, targets: &BTreeSet<NodeId>) -> bool {
        let mut stack = self.operands(from).to_vec();
        let mut seen = BTreeSet::new();
        while let Some(n) = stack.pop() {
            if !members.contains(&n) || !seen.insert(n) {
                continue;
            }
            if targets.contains(&n) {
                return true;
            }
            stack.extend_from_slice(self.operands(n));
        }
        false
    }

    /// Checks the row-kernel rules: every reduction reduces the same axes of the same shape;
    /// whatever depends on a reduction stays in that row (elementwise on the full or reduced
    /// shape, reshapes of the reduced shape, broadcasts back along the reduced axes).
    fn row_kind(
        &self,
        members: &BTreeSet<NodeId>,
        outs: &[NodeId],
        reduces: &BTreeSet<NodeId>,
    ) -> Result<KernelKind, Veto> {
        let g = self.g;
        let mut space: Option<(Vec<usize>, Vec<usize>)> = None;
        for &r in reduces {
            let Op::Reduce { axes, .. } = &g.node(r).op else { unreachable!("filtered to reduces") };
            let s = (g.ty(g.operands(r)[0]).shape.dims().to_vec(), axes.clone());
            match &space {
                None => space = Some(s),
                Some(prev) if *prev == s => {}
                Some(_) => return Err(Veto::ReductionIntoReduction),
            }
        }
        let (shape, axes) = space.expect("at least one reduction");
        let full: usize = shape.iter().product();
        let kept: Vec<usize> =
            (0..shape.len()).filter(|a| !axes.contains(a) && shape[*a] != 1).map(|a| shape[a]).collect();
        let rows: usize = kept.iter().product();
        let reduced_like = |dims: &[usize]| dims.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>() == kept;
        if members.iter().any(|&n| is_expensive(&g.node(n).op) && !reduces.contains(&n)) {
            return Err(Veto::DuplicatesExpensive);
        }
        let dep = self.dependents(members, reduces);
        for &n in &dep {
            let node = g.node(n);
            let dims = node.ty.shape.dims();
            let ok = match &node.op {
                Op::Reduce { .. } => true,
                op if op.is_elementwise() => dims == shape.as_slice() || reduced_like(dims),
                Op::Reshape { .. } => reduced_like(dims) && reduced_like(g.ty(g.operands(n)[0]).shape.dims()),
                Op::Broadcast { dims: map, .. } => {
                    let od = g.ty(g.operands(n)[0]).shape.dims();
                    dims == shape.as_slice()
                        && reduced_like(od)
                        && map.iter().zip(od).all(|(&ra, &d)| d == 1 || !axes.contains(&ra))
                }
                _ => false,
            };
            if !ok {
                return Err(Veto::RowShape);
            }
        }
        for &o in outs {
            let n = g.ty(o).shape.numel();
            if n != full
                && !(n == rows && (reduces.contains(&o) || dep.contains(&o) || reduced_like(g.ty(o).shape.dims())))
            {
                return Err(Veto::RowShape);
            }
        }
        Ok(KernelKind::Row { shape, axes })
    }

    /// Whether putting `p` into `group` would make the group depend on itself: some operand
    /// of `p` outside the group is reachable from a member of the group.
    fn creates_cycle(&self, group: &BTreeSet<NodeId>, p: NodeId) -> bool {
        let outside: Vec<NodeId> = self.operands(p).iter().copied().filter(|o| !group.contains(o)).collect();
        self.reaches_any(outside, group)
    }

    /// Whether some member of `targets` is an operand, direct or not, of a node in `from`.
    fn reaches_any(&self, from: Vec<NodeId>, targets: &BTreeSet<NodeId>) -> bool {
        if let Some(anc) = &self.ancestors {
            let to: Vec<usize> = targets.iter().map(|&t| self.pos(t)).collect();
            return from.iter().any(|&f| to.iter().any(|&t| anc.contains(self.pos(f), t)));
        }
        let min = targets.iter().map(|n| self.pos(*n)).min().unwrap_or(0);
        let mut stack: Vec<NodeId> = from.iter().flat_map(|&f| self.operands(f).iter().copied()).collect();
        let mut seen = BTreeSet::new();
        while let Some(n) = stack.pop() {
            if self.pos(n) == usize::MAX || self.pos(n) < min || !seen.insert(n) {
                continue;
            }
            if targets.contains(&n) {
                return true;
            }
            stack.extend_from_slice(self.operands(n));
        }
        false
    }

    /// An execution order of kernels: Kahn's algorithm over their dependencies, the ready
    /// kernel with the earliest root (`Summary::root`) first.
    fn order(&self, ks: &[&Summary]) -> Vec<usize> {
        let mut by_root: Vec<usize> = (0..ks.len()).collect();
        // Unique keys (root, then index): an unstable sort gives the stable order.
        by_root.sort_unstable_by_key(|&i| (ks[i].root, i));
        // Kahn's algorithm, taking kernels in root order as they come: usually each one's
        // inputs are stored by then. One that is not waits until they are, and is then taken
        // before any later root (it has the smallest rank of all ready kernels), as are the
        // kernels its outputs release in turn.
        let mut rank = vec![0; ks.len()];
        for (r, &i) in by_root.iter().enumerate() {
            rank[i] = r;
        }
        struct Kahn<'k> {
            ks: &'k [&'k Summary],
            by_root: Vec<usize>,
            rank: Vec<usize>,
            stored: Vec<bool>,
            /// Kernels waiting for a value, and how many values each still waits for.
            waiting: BTreeMap<NodeId, Vec<usize>>,
            missing: Vec<usize>,
            /// Waiting kernels whose inputs are all stored now, by rank.
            released: BinaryHeap<Reverse<usize>>,
            taken: Vec<bool>,
            order: Vec<usize>,
        }
        impl Kahn<'_> {
            /// Takes kernel `i`, then every kernel that releases.
            fn take(&mut self, i: usize) {
                let mut next = Some(i);
                while let Some(i) = next {
                    if std::mem::replace(&mut self.taken[i], true) {
                        // Taken while still waiting (see below), released since.
                        next = self.released.pop().map(|Reverse(r)| self.by_root[r]);
                        continue;
                    }
                    self.order.push(i);
                    for o in &self.ks[i].outputs {
                        if !std::mem::replace(&mut self.stored[o.index()], true) {
                            for w in self.waiting.remove(o).unwrap_or_default() {
                                self.missing[w] -= 1;
                                if self.missing[w] == 0 {
                                    self.released.push(Reverse(self.rank[w]));
                                }
                            }
                        }
                    }
                    next = self.released.pop().map(|Reverse(r)| self.by_root[r]);
                }
            }
        }
        let mut k = Kahn {
            ks,
            by_root,
            rank,
            stored: vec![false; self.index_bound],
            waiting: BTreeMap::new(),
            missing: vec![0; ks.len()],
            released: BinaryHeap::new(),
            taken: vec![false; ks.len()],
            order: Vec::with_capacity(ks.len()),
        };
        let mut deferred = Vec::new();
        for r in 0..ks.len() {
            let i = k.by_root[r];
            let absent: Vec<NodeId> =
                ks[i].inputs.iter().copied().filter(|v| !self.info[v.index()].leaf && !k.stored[v.index()]).collect();
            if absent.is_empty() {
                k.take(i);
            } else {
                k.missing[i] = absent.len();
                for v in absent {
                    k.waiting.entry(v).or_default().push(i);
                }
                deferred.push(i);
            }
        }
        // A kernel whose inputs no kernel stores cannot happen in a valid grouping; take the
        // earliest one left rather than drop it (`Ctx::kernels` refuses such an order).
        while k.order.len() < ks.len() {
            let i = *deferred.iter().find(|&&i| !k.taken[i]).expect("a kernel remains");
            k.take(i);
        }
        k.order
    }

    /// The kernels of `groups` in execution order ([`Ctx::order`]); an error if some kernel
    /// would read a value no earlier kernel stores (kernels that depend on each other: a
    /// bug of this pass, refused rather than run on stale memory).
    fn kernels(&self, groups: &Groups) -> Result<Vec<Kernel>> {
        let sets: Vec<&BTreeSet<NodeId>> = groups.sets.iter().filter(|gr| !gr.is_empty()).collect();
        // In graph order of their roots (the peak check's order, which runs updates early,
        // is for judging; the scheduler makes the final order).
        let summaries: Vec<Summary> = sets
            .iter()
            .map(|gr| Summary { root: self.root(gr).map_or(0, |r| self.pos(r)), ..self.summary(gr, groups) })
            .collect();
        let order = self.order(&summaries.iter().collect::<Vec<_>>());
        let mut stored = vec![false; self.index_bound];
        for &i in &order {
            if let Some(v) = summaries[i].inputs.iter().find(|v| !self.info[v.index()].leaf && !stored[v.index()]) {
                return Err(IrError::Verify {
                    node: v.index(),
                    detail: "fusion grouped kernels that depend on each other: one reads this value before \
                             the other stores it (a fusegraph bug; `FusionMode::Off` compiles around it)"
                        .into(),
                });
            }
            for o in &summaries[i].outputs {
                stored[o.index()] = true;
            }
        }
        Ok(order
            .into_iter()
            .map(|i| {
                let mut members: Vec<NodeId> = sets[i].iter().copied().collect();
                members.sort_by_key(|n| self.pos(*n));
                let Summary { outputs, inputs, .. } = summaries[i].clone();
                let kind = self.analyze(sets[i], &outputs).unwrap_or(KernelKind::Loop);
                Kernel { kind, members, outputs, inputs }
            })
            .collect())
    }
}

/// Fuses the nodes `outputs` depend on into kernels.
pub fn fuse(g: &Graph, outputs: &[NodeId], opts: &FusionOptions) -> Result<Fusion> {
    fuse_updating(g, outputs, &[], opts)
}

/// [`fuse`], where the outputs in `updates` are a training step's parameter updates, written
/// over their parameters' buffers where the memory planner can (by a loop kernel): the
/// peak-memory check counts them only where the kernel storing them reduces (it may be a
/// row kernel). (Counted everywhere, the new momentum of one weight joined to the kernel of
/// its new weight would look like a rise: the gradient it reads lives to that kernel, beside
/// update values that take no arena. Counted nowhere, a weight's update merged into the row
/// kernel of a bias gradient would raise `train_mlp`'s arena by a third.)
pub fn fuse_updating(g: &Graph, outputs: &[NodeId], updates: &[NodeId], opts: &FusionOptions) -> Result<Fusion> {
    let (ctx, order) = Ctx::new(g, outputs, updates, opts)?;
    let (compute, mut groups) = Groups::of_each_op(&ctx, &order);
    let own: BTreeMap<NodeId, usize> = compute.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut log = Vec::new();
    let mut peak = if opts.memory_aware { ctx.peak(&groups) } else { 0 };

    for &p in compute.iter().rev() {
        // A producer pulled into a consumer's kernel along with a later one (see
        // `pull_exclusive_operands`) has been decided already.
        let veto = if groups.sets[own[&p]].contains(&p) {
            try_fuse(&ctx, &mut groups, own[&p], p, &mut peak, true)
        } else {
            None
        };
        log.push(Decision { producer: p, veto });
    }
    // A producer left for a contraction's epilogue that the contraction did not take (its
    // own fusion was refused) is judged again as a plain duplication.
    for d in log.iter_mut().filter(|d| matches!(d.veto, Some(Veto::EpilogueInstead { .. }))) {
        let home = own[&d.producer];
        let set = &groups.sets[home];
        if set.contains(&d.producer) && !set.iter().any(|&m| matches!(g.node(m).op, Op::MatMul | Op::Conv2d { .. })) {
            d.veto = try_fuse(&ctx, &mut groups, home, d.producer, &mut peak, false);
        }
    }
    let siblings = merge_siblings(&ctx, &mut groups, &mut peak);
    Ok(Fusion { kernels: ctx.kernels(&groups)?, log, siblings })
}

/// Tries to move producer `p` out of its own group `home` into every group that uses it;
/// leaves `groups` unchanged and names the reason on a veto. With `epilogues`, a duplication
/// that a contraction's epilogue would do better is refused ([`epilogue_is_cheaper`]).
fn try_fuse(ctx: &Ctx, groups: &mut Groups, home: usize, p: NodeId, peak: &mut u64, epilogues: bool) -> Option<Veto> {
    let g = ctx.g;
    let targets: BTreeSet<usize> = ctx.users(p).into_iter().flat_map(|u| groups.of(u)).filter(|&i| i != home).collect();
    // A graph output is stored anyway: it may join the one kernel that reads it, which then
    // stores it too (an optimizer's new moments, stored and read by the new weights), but
    // is never recomputed in several.
    if ctx.output_set.contains(&p) && targets.len() != 1 {
        return Some(Veto::GraphOutput);
    }
    if ctx.compared.contains(&p) {
        return Some(Veto::ComparedWithItself);
    }
    if targets.is_empty() {
        return Some(Veto::NoBenefit);
    }
    if is_expensive(&g.node(p).op) && targets.len() > 1 {
        return Some(Veto::DuplicatesExpensive);
    }
    if targets.iter().any(|&t| ctx.creates_cycle(&groups.sets[t], p)) {
        return Some(Veto::Cycle);
    }
    let output = ctx.output_set.contains(&p);
    if epilogues && (targets.len() > 1 || output) && epilogue_is_cheaper(ctx, p, targets.len()) {
        return Some(Veto::EpilogueInstead { kernels: targets.len() });
    }
    // Fusing `p` frees its buffer and keeps its operands alive until the consumers instead;
    // when the operands held in memory are no larger than `p`, no step can rise, so the
    // (whole-plan) peak need not be recomputed.
    let held: u64 =
        ctx.operands(p).iter().filter(|o| !ctx.const_like.contains(o)).map(|&o| g.ty(o).buffer_bytes() as u64).sum();
    let check_peak = ctx.opts.memory_aware && held > g.ty(p).buffer_bytes() as u64;
    if check_peak && *peak == u64::MAX {
        *peak = ctx.peak(groups);
    }
    groups.remove(home, p, ctx.operands(p));
    for &t in &targets {
        groups.insert(t, p, ctx.operands(p));
    }
    let mut veto = judge_fusion(ctx, groups, &targets, p, check_peak, peak);
    if let (Some(v @ Veto::PeakMemory { .. }), [t]) = (&veto, Vec::from_iter(targets.iter().copied()).as_slice()) {
        veto = pull_exclusive_operands(ctx, groups, *t, p, v.clone(), peak);
    }
    if veto.is_some() {
        for &t in &targets {
            groups.remove(t, p, ctx.operands(p));
        }
        groups.insert(home, p, ctx.operands(p));
    }
    veto
}

/// Whether elementwise `p`, about to be recomputed in `copies` kernels (or, a graph output,
/// to join its one consumer's kernel), costs less stored once by the epilogue of a
/// contraction it is computed from. Visiting from the outputs back,
/// the pass judges "fuse `p` into its consumers" against "`p` alone", which saves a dispatch;
/// but where an operand of `p` is (through elementwise ops and reshapes of as many
/// elements, each used only by the next) a matmul or convolution used only by that chain,
/// `p` would join the contraction's kernel at the chain's turn, with no dispatch of its own.
/// Against that alternative, recomputing moves `(1 + copies)·(operand − p)` bytes more for
/// the chain's value (read once per copy instead of `p`), and `p`'s other operands once more
/// per extra copy. A residual add after an attention or MLP projection is the usual case: recomputed,
/// each layer norm re-adds the whole residual stream, its kernels grow by a layer's adds per
/// layer and every layer's projections stay alive to the last one.
fn epilogue_is_cheaper(ctx: &Ctx, p: NodeId, copies: usize) -> bool {
    let g = ctx.g;
    let numel = g.ty(p).shape.numel();
    let elementwise = |n: NodeId| {
        matches!(g.node(n).op, Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. })
            && g.ty(n).shape.numel() == numel
    };
    if !elementwise(p) {
        return false;
    }
    // Whether `n`, used by `user` alone, is such a chain down to a contraction.
    fn reaches(ctx: &Ctx, n: NodeId, user: NodeId, depth: usize, elementwise: &dyn Fn(NodeId) -> bool) -> bool {
        if depth == 0 || ctx.output_set.contains(&n) || ctx.users(n) != [user] {
            return false;
        }
        match ctx.g.node(n).op {
            Op::MatMul | Op::Conv2d { .. } => true,
            // A reshape keeps the order of the elements: an epilogue stores through it.
            Op::Reshape { .. } => reaches(ctx, ctx.operands(n)[0], n, depth - 1, elementwise),
            _ => elementwise(n) && ctx.operands(n).iter().any(|&o| reaches(ctx, o, n, depth - 1, elementwise)),
        }
    }
    let from_contraction = |o: NodeId| reaches(ctx, o, p, 8, &elementwise);
    let ops = ctx.operands(p);
    let Some(q) = ops.iter().copied().find(|&o| from_contraction(o)) else { return false };
    // A graph output is stored either way: as the epilogue the contraction's value is never
    // stored, joined to its consumer that value is written and read back.
    if ctx.output_set.contains(&p) {
        return true;
    }
    let bytes = |n: NodeId| g.ty(n).buffer_bytes() as f64;
    let others: f64 = ops.iter().filter(|&&o| o != q).map(|&o| bytes(o)).sum();
    let t = copies as f64;
    (1.0 + t) * (bytes(q) - bytes(p)) + (t - 1.0) * others >= 0.0
}

/// Retries fusing `p` into group `t` (where it has just been moved) after a peak-memory
/// veto, together with the cheap producers of its operands that nothing outside `t` uses:
/// the rise is often only that such an operand, consumed early by `p` in its own group,
/// stays alive until `t` runs, while the operand itself would join `t` at its own turn
/// (visited after `p`, which goes from the outputs back). The variance's `(x - mean)²` is the
/// usual case: without this, a layer norm whose input has another user would split into four
/// kernels.
/// Every node moved must be a fusion the pass would accept by itself (a valid kernel within
/// the binding limit, a gain by the cost model), and the peak with all of them moved must
/// not rise above the `vetoed` fusion's baseline; otherwise the pulled nodes go back and a
/// veto stands.
fn pull_exclusive_operands(
    ctx: &Ctx,
    groups: &mut Groups,
    t: usize,
    p: NodeId,
    vetoed: Veto,
    peak: &mut u64,
) -> Option<Veto> {
    let g = ctx.g;
    let Veto::PeakMemory { before, .. } = vetoed else { return Some(vetoed) };
    // Cheap, not yet fused (alone in their own group), every user computed only in `t` or
    // pulled: a user that another kernel computes too (a duplicate) reads the value from
    // memory there, and that kernel may feed `t` (a cycle of kernels no node path shows:
    // `tests/fuzz_device.rs` training seed 285).
    let mut inside = groups.sets[t].clone();
    let mut pulled: Vec<(NodeId, usize)> = Vec::new();
    let mut stack = ctx.operands(p).to_vec();
    while let Some(c) = stack.pop() {
        let op = &g.node(c).op;
        let home: Vec<usize> = groups.of(c).collect();
        let only_in_t =
            |u: &NodeId| inside.contains(u) && groups.of(*u).all(|gi| gi == t || pulled.contains(&(*u, gi)));
        let candidate = !inside.contains(&c)
            && !is_memory_leaf(op)
            && !is_expensive(op)
            && !ctx.output_set.contains(&c)
            && !ctx.const_like.contains(&c)
            && !ctx.compared.contains(&c)
            && home.len() == 1
            && groups.sets[home[0]].len() == 1
            && ctx.users(c).iter().all(only_in_t)
            && !ctx.creates_cycle(&inside, c);
        if candidate && pulled.len() < 16 {
            inside.insert(c);
            pulled.push((c, home[0]));
            stack.extend_from_slice(ctx.operands(c));
        }
    }
    if pulled.is_empty() {
        return Some(vetoed);
    }
    for &(c, home) in &pulled {
        groups.remove(home, c, ctx.operands(c));
        groups.insert(t, c, ctx.operands(c));
    }
    let one = BTreeSet::from([t]);
    let each_gains = std::iter::once(p)
        .chain(pulled.iter().map(|&(c, _)| c))
        .all(|c| judge_fusion(ctx, groups, &one, c, false, peak).is_none());
    // The first veto stands where a pulled fusion is refused on its own; a new peak where
    // the peak still rises.
    let veto = match each_gains.then(|| ctx.peak(groups)) {
        Some(after) if after <= before + before / 64 => {
            *peak = after;
            return None;
        }
        Some(after) => Veto::PeakMemory { before, after },
        None => vetoed,
    };
    for &(c, home) in &pulled {
        groups.remove(t, c, ctx.operands(c));
        groups.insert(home, c, ctx.operands(c));
    }
    *peak = before;
    Some(veto)
}

/// The verdict on `groups` with `p` just moved into `targets`: each target must still be one
/// valid kernel within the binding limit, the cost model must see a gain, and (with
/// `check_peak`) the plan's peak must not rise. Updates `peak` on acceptance.
fn judge_fusion(
    ctx: &Ctx,
    groups: &Groups,
    targets: &BTreeSet<usize>,
    p: NodeId,
    check_peak: bool,
    peak: &mut u64,
) -> Option<Veto> {
    let g = ctx.g;
    let mut recompute = 0.0;
    for &t in targets {
        let members = &groups.sets[t];
        let outs = ctx.group_outputs(members, groups);
        let kind = match ctx.analyze(members, &outs) {
            Ok(kind) => kind,
            Err(v) => return Some(v),
        };
        let needed = ctx.bindings(members, &outs);
        if needed > ctx.opts.max_bindings {
            return Some(Veto::TooManyBindings { needed, limit: ctx.opts.max_bindings });
        }
        recompute += match kind {
            // A per-row value computed from a reduction (layer norm's rsqrt(var + eps)) is
            // recomputed per element only until its reduction joins the kernel, which then
            // becomes a row kernel computing it once per row: judge it as that.
            KernelKind::Loop if per_row_of_reduction(g, p) => 1.0,
            KernelKind::Loop => ctx.multiplicity(members, &outs).get(&p).copied().unwrap_or(1.0),
            // A row kernel computes each reduction once per row and evaluates everything else
            // once per pass over the row: one pass per reduction plus the output pass.
            KernelKind::Row { .. } if matches!(g.node(p).op, Op::Reduce { .. }) => 1.0,
            // Per-row values (mean, rsqrt(var + eps)) are computed once per row.
            KernelKind::Row { ref shape, .. } if g.ty(p).shape.numel() < shape.iter().product::<usize>() => 1.0,
            KernelKind::Row { .. } => {
                1.0 + members.iter().filter(|&&n| matches!(g.node(n).op, Op::Reduce { .. })).count() as f64
            }
            // Fusion forms loop and row kernels only (attention kernels come after it).
            KernelKind::Attention { .. } => 1.0,
        };
    }
    // Benefit: one dispatch fewer, and the producer is neither written (unless a graph
    // output) nor read back; cost: its arithmetic repeated where it is recomputed, and its
    // operands read once per copy.
    let c = &ctx.opts.cost;
    let bytes = g.ty(p).buffer_bytes() as f64;
    let operand_bytes: f64 = ctx.operands(p).iter().map(|&o| g.ty(o).buffer_bytes() as f64).sum();
    let written = if ctx.output_set.contains(&p) { 0.0 } else { 1.0 };
    let saved = c.dispatch_s + bytes * (written + targets.len() as f64) / c.bandwidth;
    let extra_flops = (recompute - 1.0).max(0.0) * flops_per_element(g, p) * g.ty(p).shape.numel() as f64;
    let cached = if is_data_movement(&g.node(p).op) { 0.25 } else { 1.0 };
    let extra = extra_flops / c.flops + (targets.len() as f64 - 1.0) * operand_bytes * cached / c.bandwidth;
    if saved <= extra {
        return Some(Veto::NoBenefit);
    }
    if !check_peak {
        // The accepted fusion may lower the peak: recompute the baseline when next needed.
        *peak = u64::MAX;
        return None;
    }
    let after = ctx.peak(groups);
    // Rises within 1/64 of the peak are noise from tiny values (per-channel scales) changing
    // their live ranges; the veto is for real rises, such as a cast fused into a late
    // consumer that keeps the wide input alive.
    if after > *peak + *peak / 64 {
        return Some(Veto::PeakMemory { before: *peak, after });
    }
    *peak = after;
    None
}

/// Sibling (multi-output) fusion: kernels that read a common value, or recompute a common
/// producer, and do not depend on each other merge into one kernel when the result is still
/// a valid kernel (for example two reductions of one input become one row kernel).
fn merge_siblings(ctx: &Ctx, groups: &mut Groups, peak: &mut u64) -> Vec<SiblingDecision> {
    let mut decisions = Vec::new();
    let g = ctx.g;
    // Whether `b` reads (through any path) a value that only `a` computes: then it waits for
    // `a`. A member other kernels compute too (a constant or broadcast every kernel
    // recomputes) proves nothing, as they compute it themselves: two Adam updates recompute
    // `1.0` as the step counter's update does, whose value both read, and would be kept
    // apart otherwise.
    // Such pairs go to the kernel-level walk below.
    let depends = |groups: &Groups, a: usize, b: usize| -> bool {
        let own: BTreeSet<NodeId> = groups.sets[a].iter().copied().filter(|&m| groups.of(m).nth(1).is_none()).collect();
        // `b`'s inputs (repeats do no harm).
        let inputs: Vec<NodeId> = ctx.inputs(&groups.sets[b]).collect();
        inputs.iter().any(|x| own.contains(x)) || ctx.reaches_any(inputs, &own)
    };
    // Whether group `gi` is free of the step's order: it stores graph outputs alone (an
    // optimizer update, a new moment: alive to the end wherever computed), or single
    // elements alone (mixed precision's finite checks of the gradients: nothing to hold), or
    // reads no value the step computes or is fed (only parameters and constants: batch-norm
    // folding's scaled weights, which the runtime computes once after the parameters are
    // set). Kernels sharing nothing but constants merge only when both are (the updates of
    // two weights, one dispatch for both): elsewhere the merged kernel runs when the first
    // of its values is needed, holding the others until they are read — a training step's
    // checkpointed recomputations, one per segment and all computing gelu's constants,
    // would merge into kernels that recompute four segments at once at the start of the
    // backward pass. (The peak check does not see it: its order runs a merged kernel at its
    // last member's turn, where the scheduler must run it at the first's.)
    let free = |groups: &Groups, gi: usize| {
        let set = &groups.sets[gi];
        let stored = ctx.group_outputs(set, groups);
        stored.iter().all(|o| ctx.output_set.contains(o))
            || stored.iter().all(|&o| ctx.g.ty(o).shape.numel() == 1)
            || ctx.inputs(set).all(|x| !ctx.info[x.index()].arena)
    };
    // Contraction kernels lower to a tiled kernel with one output; merging two (q, k, v
    // projections of one input) would lose that.
    let contraction =
        |gr: &BTreeSet<NodeId>| gr.iter().any(|&m| matches!(g.node(m).op, Op::MatMul | Op::Conv2d { .. }));
    // Pairs found dependent stay so: within this phase a group only grows, or empties when
    // merged into another (a later pass skips them; the decision is logged again).
    let mut dependent: BTreeSet<(usize, usize)> = BTreeSet::new();
    // Per group, what it binds wherever it goes ([`BindingFloor`]), kept until the group
    // grows.
    let mut floors: Vec<Option<BindingFloor>> = vec![None; groups.sets.len()];
    let mut changed = true;
    while changed {
        changed = false;
        for i in 0..groups.sets.len() {
            let mut j = i;
            // Group `i`'s inputs and the groups that compute a member of `i` or read one of
            // its inputs (the only candidates for sharing something with it), in index order:
            // kept until `i` grows, since a merge changes no other group after `j` (so the
            // candidates after `j` and what they compute and read stay the same).
            let mut near: Option<(BTreeSet<NodeId>, Vec<usize>)> = None;
            // The groups group `i` reads from, directly or not ([`walk_feeding`]): kept until
            // `i` grows, as `near` (a merge into `i` is the only change while `i` is being
            // matched).
            let mut feeding_i: Option<Vec<bool>> = None;
            loop {
                if groups.sets[i].is_empty() || contraction(&groups.sets[i]) {
                    break;
                }
                let (ii, cands) = near.get_or_insert_with(|| {
                    let ii: BTreeSet<NodeId> = ctx.inputs(&groups.sets[i]).collect();
                    let mut cands: Vec<usize> = groups.sets[i]
                        .iter()
                        .flat_map(|&m| groups.of(m))
                        .chain(ii.iter().flat_map(|&x| ctx.users[x.index()].iter()).flat_map(|&u| groups.of(u)))
                        .filter(|&k| k > i)
                        .collect();
                    cands.sort_unstable();
                    cands.dedup();
                    (ii, cands)
                });
                let after = cands.partition_point(|&k| k <= j);
                let Some(&next) = cands[after..].iter().find(|&&k| {
                    let gk = &groups.sets[k];
                    if gk.is_empty() || contraction(gk) {
                        return false;
                    }
                    let mut shared = groups.sets[i].iter().filter(|m| gk.contains(m));
                    // A shared constant (computed from `full`/`iota` alone) saves nothing: it
                    // joins only kernels free of the step's order (see `free`).
                    shared.clone().any(|m| !ctx.const_like.contains(m))
                        || ctx.inputs(gk).any(|x| ii.contains(&x))
                        || (shared.next().is_some() && free(groups, i) && free(groups, k))
                }) else {
                    break;
                };
                j = next;
                // Named by their roots: a first member is often a broadcast both recompute.
                let root = |gi: usize| ctx.root(&groups.sets[gi]).expect("non-empty");
                let (a, b) = (root(i), root(j));
                let mut decide = |veto: Option<Veto>| decisions.push(SiblingDecision { a, b, veto });
                // Most merges fail on the binding limit: checked first, from the two groups'
                // inputs and graph outputs alone (a training step's optimizer updates all read
                // one scalar, so every pair of them is asked, and at 8 bindings refused).
                for gi in [i, j] {
                    if floors[gi].is_none() {
                        floors[gi] = Some(BindingFloor::of(ctx, &groups.sets[gi]));
                    }
                }
                let (fi, fj) = (floors[i].as_ref().expect("set"), floors[j].as_ref().expect("set"));
                let least = fi.joined(fj, groups, i, j);
                if least > ctx.opts.max_bindings {
                    decide(Some(Veto::TooManyBindings { needed: least, limit: ctx.opts.max_bindings }));
                    continue;
                }
                if dependent.contains(&(i, j)) || depends(groups, i, j) || depends(groups, j, i) {
                    dependent.insert((i, j));
                    decide(Some(Veto::Cycle));
                    continue;
                }
                // The exact binding count, on the union before anything moves (a member's
                // users outside both groups are computed by neither, so what the union stores
                // is what it would store after the move), so a refusal leaves every kernel
                // summary valid.
                let union: BTreeSet<NodeId> = groups.sets[i].union(&groups.sets[j]).copied().collect();
                let needed = ctx.bindings(&union, &ctx.group_outputs(&union, groups));
                debug_assert!(least <= needed, "binding floor {least} above the union's {needed} bindings");
                if needed > ctx.opts.max_bindings {
                    decide(Some(Veto::TooManyBindings { needed, limit: ctx.opts.max_bindings }));
                    continue;
                }
                // No node path joins the two, but a chain of kernels may: a kernel that
                // earlier merges made of unrelated nodes can read from one and feed the
                // other. Walked only here, for the few pairs that would otherwise merge.
                let feeds_i = feeding_i.get_or_insert_with(|| walk_feeding(ctx, groups, i, None).0);
                if feeds_i[j] || walk_feeding(ctx, groups, j, Some(i)).1 {
                    dependent.insert((i, j));
                    decide(Some(Veto::Cycle));
                    continue;
                }
                if ctx.opts.memory_aware && *peak == u64::MAX {
                    *peak = ctx.peak(groups);
                }
                let moved: Vec<NodeId> = groups.sets[j].iter().copied().collect();
                let added: Vec<NodeId> = moved.iter().copied().filter(|m| !groups.sets[i].contains(m)).collect();
                for &m in &moved {
                    groups.remove(j, m, ctx.operands(m));
                }
                for &m in &added {
                    groups.insert(i, m, ctx.operands(m));
                }
                let veto = judge_merge(ctx, groups, i, peak);
                if veto.is_some() {
                    for &m in &added {
                        groups.remove(i, m, ctx.operands(m));
                    }
                    for &m in &moved {
                        groups.insert(j, m, ctx.operands(m));
                    }
                } else {
                    changed = true;
                    near = None;
                    feeding_i = None;
                    (floors[i], floors[j]) = (None, None);
                }
                decide(veto);
            }
        }
    }
    decisions
}

/// What a group binds wherever it goes, for a cheap count of what a merge with another
/// group binds ([`BindingFloor::joined`]): the values its members read from memory (sorted),
/// and its members that are graph outputs (sorted), which any kernel computing them stores.
#[derive(Clone)]
struct BindingFloor {
    inputs: Vec<NodeId>,
    outputs: Vec<NodeId>,
}

impl BindingFloor {
    fn of(ctx: &Ctx, members: &BTreeSet<NodeId>) -> BindingFloor {
        let mut inputs: Vec<NodeId> = ctx.inputs(members).collect();
        inputs.sort_unstable();
        inputs.dedup();
        let outputs = members.iter().copied().filter(|m| ctx.output_set.contains(m)).collect();
        BindingFloor { inputs, outputs }
    }

    /// The bindings of one kernel of groups `i` (this floor) and `j` (`other`), at least: its
    /// inputs exactly (each group's inputs the other does not compute), and the graph outputs
    /// among its members (it may store more: members read by other kernels).
    fn joined(&self, other: &BindingFloor, groups: &Groups, i: usize, j: usize) -> usize {
        let from_i = self.inputs.iter().filter(|&&x| !groups.computes(j, x)).count();
        let from_j =
            other.inputs.iter().filter(|&&x| !groups.computes(i, x) && self.inputs.binary_search(&x).is_err()).count();
        let outputs =
            self.outputs.len() + other.outputs.iter().filter(|x| self.outputs.binary_search(x).is_err()).count();
        from_i + from_j + outputs
    }
}

/// The groups that group `to` reads from, through a chain of one or more kernels (by index;
/// `to` itself marked too), and whether the walk met `stop` (it ends there): back from
/// `to`'s inputs over the groups computing them (every group computing a duplicated value
/// counts). Node paths ([`Ctx::reaches_any`]) miss a chain through a group that sibling
/// merging made of unrelated nodes: once `{r = reduce(y), m = max(c, y)}` is one kernel, a
/// kernel reading `r` waits for the kernel storing `c`, though no node path leads from `c`
/// to `r`; merging those two would make a cycle of kernels (a gradient read before it is
/// written: `tests/data/kernel_cycle.ir`).
fn walk_feeding(ctx: &Ctx, groups: &Groups, to: usize, stop: Option<usize>) -> (Vec<bool>, bool) {
    let mut seen = vec![false; groups.sets.len()];
    seen[to] = true;
    let mut stack = vec![to];
    while let Some(k) = stack.pop() {
        for x in ctx.inputs(&groups.sets[k]) {
            for p in groups.of(x) {
                if Some(p) == stop {
                    return (seen, true);
                }
                if !std::mem::replace(&mut seen[p], true) {
                    stack.push(p);
                }
            }
        }
    }
    (seen, false)
}

/// The verdict on group `i` just grown by a sibling (the caller has checked the binding
/// limit on the union): one valid kernel, and no rise of the plan's peak. Updates `peak` on
/// acceptance.
fn judge_merge(ctx: &Ctx, groups: &Groups, i: usize, peak: &mut u64) -> Option<Veto> {
    let members = &groups.sets[i];
    let outs = ctx.group_outputs(members, groups);
    if let Err(v) = ctx.analyze(members, &outs) {
        return Some(v);
    }
    if ctx.opts.memory_aware {
        let after = ctx.peak(groups);
        if after > *peak + *peak / 64 {
            return Some(Veto::PeakMemory { before: *peak, after });
        }
        *peak = after.max(*peak);
    }
    None
}

/// Whether `p` is a cheap value computed (through elementwise ops, reshapes and broadcasts)
/// from a reduction's result: a per-row statistic that a row kernel computes once per row.
fn per_row_of_reduction(g: &Graph, p: NodeId) -> bool {
    let mut stack = vec![p];
    let mut seen = BTreeSet::new();
    while let Some(n) = stack.pop() {
        if !seen.insert(n) || seen.len() > 32 {
            continue;
        }
        let op = &g.node(n).op;
        if matches!(op, Op::Reduce { .. }) {
            return n != p && g.ty(p).shape.numel() <= g.ty(n).shape.numel();
        }
        if op.is_elementwise() || matches!(op, Op::Reshape { .. } | Op::Broadcast { .. }) {
            stack.extend(g.operands(n));
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{random_graph, XorShift};

    #[test]
    fn ancestor_bits_agree_with_walking_the_graph() {
        let mut rng = XorShift::new(3);
        let opts = FusionOptions::default();
        let (mut reached, mut checks) = (0, 0);
        // Graphs past 64 and 128 nodes too: rows of several words, of different lengths.
        for k in 0..20 {
            let (g, outs) = random_graph(&mut rng, if k % 2 == 0 { 60 } else { 200 });
            let (with, order) = Ctx::new(&g, &outs, &[], &opts).expect("valid graph");
            let (mut walking, _) = Ctx::new(&g, &outs, &[], &opts).expect("valid graph");
            assert!(with.ancestors.is_some());
            walking.ancestors = None;
            for _ in 0..200 {
                let from = vec![order[rng.below(order.len())]];
                let targets: BTreeSet<NodeId> = (0..2).map(|_| order[rng.below(order.len())]).collect();
                let r = with.reaches_any(from.clone(), &targets);
                assert_eq!(r, walking.reaches_any(from, &targets));
                reached += r as usize;
                checks += 1;
            }
        }
        // Both answers occur, so the agreement means something.
        assert!(reached > checks / 10 && reached < checks * 9 / 10, "{reached} of {checks}");
    }

    /// Kahn's algorithm in its plain form, the reference for the root-order walk: every
    /// kernel in a heap by rank once all its inputs are stored; the earliest kernel left when
    /// none is ready.
    fn heap_order(ctx: &Ctx, ks: &[&Summary]) -> Vec<usize> {
        let mut by_root: Vec<usize> = (0..ks.len()).collect();
        by_root.sort_unstable_by_key(|&i| (ks[i].root, i));
        let mut rank = vec![0; ks.len()];
        for (r, &i) in by_root.iter().enumerate() {
            rank[i] = r;
        }
        let mut waiting: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
        let mut missing = vec![0; ks.len()];
        for (i, k) in ks.iter().enumerate() {
            for &v in k.inputs.iter().filter(|v| !ctx.info[v.index()].leaf) {
                waiting.entry(v).or_default().push(i);
                missing[i] += 1;
            }
        }
        let mut ready: BinaryHeap<Reverse<usize>> =
            (0..ks.len()).filter(|&i| missing[i] == 0).map(|i| Reverse(rank[i])).collect();
        let mut taken = vec![false; ks.len()];
        let mut order = Vec::new();
        while order.len() < ks.len() {
            let i = match ready.pop() {
                Some(Reverse(r)) if !taken[by_root[r]] => by_root[r],
                Some(_) => continue,
                None => *by_root.iter().find(|&&i| !taken[i]).expect("a kernel remains"),
            };
            taken[i] = true;
            for o in &ks[i].outputs {
                for w in waiting.remove(o).unwrap_or_default() {
                    missing[w] -= 1;
                    if missing[w] == 0 {
                        ready.push(Reverse(rank[w]));
                    }
                }
            }
            order.push(i);
        }
        order
    }

    #[test]
    fn nothing_to_fuse_is_no_kernels() {
        let (g, _) = random_graph(&mut XorShift::new(1), 10);
        let f = fuse(&g, &[], &FusionOptions::default()).expect("no outputs is valid");
        assert!(f.kernels.is_empty() && f.log.is_empty() && f.siblings.is_empty());
    }

    #[test]
    fn kernel_order_is_kahns() {
        // Random kernels over a random graph's values: roots anywhere (shared too), inputs
        // stored by kernels with later roots, by none, or by a kernel waiting for this one.
        let mut rng = XorShift::new(5);
        let opts = FusionOptions::default();
        let mut out_of_root_order = 0;
        for k in 0..200 {
            let (g, outs) = random_graph(&mut rng, 30 + k % 40);
            let (ctx, order) = Ctx::new(&g, &outs, &[], &opts).expect("valid graph");
            let n = 2 + rng.below(12);
            let ks: Vec<Summary> = (0..n)
                .map(|_| {
                    let pick = |rng: &mut XorShift, count: usize| {
                        let mut v: Vec<NodeId> = (0..count).map(|_| order[rng.below(order.len())]).collect();
                        v.sort();
                        v.dedup();
                        v
                    };
                    let (o, i) = (1 + rng.below(3), rng.below(4));
                    let (outputs, inputs) = (pick(&mut rng, o), pick(&mut rng, i));
                    let inputs = inputs.into_iter().filter(|i| !outputs.contains(i)).collect();
                    Summary { root: rng.below(order.len()), outputs, inputs, reduces: false }
                })
                .collect();
            let refs: Vec<&Summary> = ks.iter().collect();
            let got = ctx.order(&refs);
            let mut by_root: Vec<usize> = (0..n).collect();
            by_root.sort_by_key(|&i| (ks[i].root, i));
            out_of_root_order += usize::from(got != by_root);
            assert_eq!(got, heap_order(&ctx, &refs), "case {k}");
        }
        assert!(out_of_root_order > 50, "{out_of_root_order} of 200 cases leave root order");
    }

    #[test]
    fn incremental_peak_agrees_with_the_sweep() {
        // Random groupings reached by the pass's own kinds of move (a producer into every
        // group of one user, duplicated or not; two groups merged, which makes kernels wait
        // for later roots, or for each other) on random graphs: after each, the peak kept up
        // to date must equal a sweep over freshly taken summaries.
        let mut rng = XorShift::new(11);
        let opts = FusionOptions::default();
        let (mut answered, mut swept) = (0, 0);
        for k in 0..24 {
            let (g, outs) = random_graph(&mut rng, if k % 2 == 0 { 40 } else { 120 });
            let (ctx, order) = Ctx::new(&g, &outs, &[], &opts).expect("valid graph");
            let (compute, mut groups) = Groups::of_each_op(&ctx, &order);
            for _ in 0..60 {
                let p = compute[rng.below(compute.len())];
                let users = ctx.users(p);
                if rng.below(12) == 0 {
                    let (i, j) = (rng.below(groups.sets.len()), rng.below(groups.sets.len()));
                    let moved: Vec<NodeId> = groups.sets[j].iter().copied().collect();
                    if i != j && !groups.sets[i].is_empty() {
                        for m in moved {
                            groups.remove(j, m, ctx.operands(m));
                            groups.insert(i, m, ctx.operands(m));
                        }
                    }
                } else if let Some(&u) = users.get(rng.below(users.len().max(1))) {
                    let targets: Vec<usize> = groups.of(u).collect();
                    let homes: Vec<usize> = groups.of(p).collect();
                    if rng.below(2) == 0 {
                        for h in homes {
                            groups.remove(h, p, ctx.operands(p));
                        }
                    }
                    for t in targets {
                        groups.insert(t, p, ctx.operands(p));
                    }
                }
                let peak = ctx.peak(&groups);
                let fresh: Vec<Option<Summary>> =
                    groups.sets.iter().map(|gr| (!gr.is_empty()).then(|| ctx.summary(gr, &groups))).collect();
                assert_eq!(peak, ctx.swept_peak(&fresh), "graph {k}");
                match groups.live.borrow_mut().peak(&ctx.info) {
                    Some(p) => {
                        assert_eq!(p, peak);
                        answered += 1;
                    }
                    None => swept += 1,
                }
            }
        }
        // Graph outputs no kernel touches (an input returned as it is) are live all along.
        let b = fusegraph_ir::GraphBuilder::new();
        let x = b.input("x", fusegraph_ir::DType::F32, vec![8, 8]).expect("valid input");
        let y = x.exp().expect("valid op");
        let g = b.graph();
        for outs in [vec![x.id()], vec![x.id(), y.id()]] {
            let (ctx, order) = Ctx::new(&g, &outs, &[], &opts).expect("valid graph");
            let (_, groups) = Groups::of_each_op(&ctx, &order);
            let peak = ctx.peak(&groups);
            assert_eq!(groups.live.borrow_mut().peak(&ctx.info), Some(peak));
            assert_eq!(peak, 256 * outs.len() as u64, "{outs:?}");
        }
        // Both paths are taken, the kept-up-to-date one often.
        assert!(answered > 400 && swept > 100, "{answered} answered, {swept} swept");
    }
}
