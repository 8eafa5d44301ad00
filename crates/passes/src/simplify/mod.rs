//! Graph simplification, one pass per file, run to a fixed point: constant folding and
//! algebraic identities ([`fold`]), batch-norm folding ([`bn_fold`]), common subexpression
//! elimination ([`cse`]) and dead code elimination ([`dce`]).
//!
//! Every pass rewrites the graph in place and updates the caller's output list; after each
//! pass the graph still verifies (checked in debug builds) and computes the same values (the
//! tests compare with the reference interpreter).

pub mod bn_fold;
pub mod cse;
pub mod dce;
pub mod fold;

use fusegraph_ir::{Graph, NodeId, Result};

/// What simplification changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimplifyStats {
    /// Nodes replaced by constants or `full`.
    pub folded: usize,
    /// Nodes removed by algebraic identities.
    pub identities: usize,
    /// Batch norms folded into a convolution or matmul.
    pub bn_folded: usize,
    /// Nodes merged with an identical earlier node.
    pub cse: usize,
    /// Unreachable nodes removed.
    pub dce: usize,
}

/// Redirects every use of `old` (and any output naming it) to `new`.
pub(crate) fn replace(g: &mut Graph, outputs: &mut [NodeId], old: NodeId, new: NodeId) {
    g.replace_uses(old, new);
    for o in outputs.iter_mut() {
        if *o == old {
            *o = new;
        }
    }
}

/// Runs every simplification to a fixed point.
pub fn simplify(g: &mut Graph, outputs: &mut [NodeId]) -> Result<SimplifyStats> {
    let mut stats = SimplifyStats::default();
    for _ in 0..16 {
        let before = stats.clone();
        stats.bn_folded += bn_fold::fold_batch_norms(g, outputs)?;
        let (folded, identities) = fold::fold(g, outputs)?;
        stats.folded += folded;
        stats.identities += identities;
        stats.cse += cse::cse(g, outputs)?;
        stats.dce += dce::dce(g, outputs)?;
        #[cfg(debug_assertions)]
        fusegraph_ir::verify(g)?;
        if stats == before {
            break;
        }
    }
    Ok(stats)
}
