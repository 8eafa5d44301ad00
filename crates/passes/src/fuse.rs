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
use crate::kernel::{
    is_memory_leaf, row_prologue, same_index_operands, Kernel, KernelKind, GEMV_MAX_ROWS, GEMV_STAGE_BYTES,
};
use crate::liveness;
use fusegraph_ir::{Graph, IrError, NodeId, Op, Result};
use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

mod ctx;
mod peak;
mod prologue;
mod siblings;
use peak::{LivePeak, ValueInfo};
use prologue::merge_row_prologues;
use siblings::merge_siblings;

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
    /// Products of at most [`GEMV_MAX_ROWS`] rows lower to the matrix–vector kernel (a GPU's
    /// loop forms), which takes several products of one left operand in one dispatch and
    /// reduces its left operand's rows itself: such sibling products (a decode step's q, k
    /// and v projections) merge, and a row kernel that only feeds their left operand (the
    /// layer norm before them) joins them as their prologue ([`row_prologue`]).
    pub gemv: bool,
    /// Fused attention (`fuse_attention`) follows fusion: a softmax feeding its weighted sum
    /// stays a row kernel for it rather than become a row prologue ([`FusionOptions::gemv`]).
    pub fused_attention: bool,
    /// The workgroup memory the matrix–vector kernel may use (the adapter's
    /// `max_compute_workgroup_storage_size`; [`GEMV_STAGE_BYTES`] by default), which bounds
    /// the rows a row prologue stages ([`row_prologue`]).
    pub gemv_stage_bytes: usize,
}

impl Default for FusionOptions {
    fn default() -> Self {
        FusionOptions {
            max_bindings: 8,
            min_row_len: 64,
            cost: CostModel::default(),
            memory_aware: true,
            gemv: false,
            fused_attention: false,
            gemv_stage_bytes: GEMV_STAGE_BYTES,
        }
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
    /// An argmax over long rows (`FusionOptions::min_row_len`) stores its indices from its
    /// own kernel, never computed inside a consumer's: there its operand's whole row, and
    /// what produces it (a sampling head's masked weights, chains of per-row thresholds),
    /// would join a kernel that also needs those values elsewhere, which keeps the
    /// reductions behind them apart (a sampling head's halvings each a kernel), for the
    /// dispatch of a few indices. (A short one — a split argmax's pick among its chunks'
    /// maxima — joins its consumer.)
    IndicesApart,
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
            Veto::IndicesApart => write!(f, "an argmax over long rows stores its indices from a kernel of its own"),
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
    /// Row prologues are being merged ([`merge_row_prologues`]): only then is a kernel of
    /// products with a row prologue valid ([`Ctx::gemv_row_prologue`]), so producer fusion
    /// never builds one a piece at a time.
    prologues: std::cell::Cell<bool>,
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
            prologues: std::cell::Cell::new(false),
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
    if opts.gemv {
        ctx.prologues.set(true);
        log.extend(merge_row_prologues(&ctx, &mut groups, &mut peak));
    }
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
    if matches!(g.node(p).op, Op::ArgMax { .. }) && ctx.long_rows(p) {
        return Some(Veto::IndicesApart);
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
            KernelKind::Row { .. } if g.node(p).op.reduced_axes().is_some() => 1.0,
            // Per-row values (mean, rsqrt(var + eps)) are computed once per row.
            KernelKind::Row { ref shape, .. } if g.ty(p).shape.numel() < shape.iter().product::<usize>() => 1.0,
            KernelKind::Row { .. } => {
                1.0 + members.iter().filter(|&&n| g.node(n).op.reduced_axes().is_some()).count() as f64
            }
            // Fusion forms loop and row kernels only (attention kernels come after it).
            KernelKind::Attention { .. } => 1.0,
        };
    }
    // Benefit: one dispatch fewer, and the producer is neither written (unless a graph
    // output) nor read back; cost: its arithmetic repeated where it is recomputed, and what
    // it reads of its operands read once per copy (a gather's rows, a slice's window: not
    // the whole table).
    let c = &ctx.opts.cost;
    let bytes = g.ty(p).buffer_bytes() as f64;
    let operand_bytes: f64 = ctx
        .operands(p)
        .iter()
        .enumerate()
        .map(|(i, &o)| reads_per_operand_element(g, p, i).min(1.0) * g.ty(o).buffer_bytes() as f64)
        .sum();
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
        if op.reduced_axes().is_some() {
            return n != p && g.ty(p).shape.numel() <= g.ty(n).shape.numel();
        }
        if op.is_elementwise() || matches!(op, Op::Reshape { .. } | Op::Broadcast { .. }) {
            stack.extend(g.operands(n));
        }
    }
    false
}

#[cfg(test)]
mod tests;
