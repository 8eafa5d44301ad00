//! The rewrites that run before planning, in one order for every caller: the runtime's
//! compile and plan, and the programs that show a graph as the runtime compiles it
//! (`fusegraph dot`, `explain`, `wgsl`).
//!
//! 1. simplification ([`crate::simplify()`]);
//! 2. split-k ([`crate::split_k`]), after simplification, since batch-norm folding looks for
//!    the unsplit product;
//! 3. split reductions ([`crate::split_reduce`]).
//!
//! Each split is kept only where `fits` accepts the split graph (the runtime: its plan fits
//! the memory limit as it is), so a split never costs a graph its fit.

use crate::split_k::{split_k, Gemm};
use crate::split_reduce::{fill_chunks, split_reduce, FillOptions};
use fusegraph_ir::{Graph, NodeId, Result};

/// Which rewrites [`rewrite`] makes.
#[derive(Clone, Copy, Default)]
pub struct Rewrites<'a> {
    /// Run the simplification passes.
    pub simplify: bool,
    /// Split matmuls over `k`: the slice count for each product (1 leaves it alone).
    pub split_k: Option<&'a dyn Fn(&Gemm) -> usize>,
    /// Split reductions with few outputs and long rows by this occupancy rule.
    pub split_reductions: Option<FillOptions>,
}

/// Rewrites `g` in place by `r`; every entry of `outputs` naming a replaced node then names
/// its replacement.
pub fn rewrite(
    g: &mut Graph,
    outputs: &mut Vec<NodeId>,
    r: &Rewrites,
    fits: &dyn Fn(&Graph, &[NodeId]) -> bool,
) -> Result<()> {
    if r.simplify {
        crate::simplify(g, outputs)?;
    }
    if let Some(splits) = r.split_k {
        let (mut split, mut split_outs) = (g.clone(), outputs.clone());
        if !split_k(&mut split, &mut split_outs, splits)?.is_empty() && fits(&split, &split_outs) {
            (*g, *outputs) = (split, split_outs);
        }
    }
    if let Some(fill) = r.split_reductions {
        let (mut split, mut split_outs) = (g.clone(), outputs.clone());
        if !split_reduce(&mut split, &mut split_outs, &|red| fill_chunks(red, &fill))?.is_empty()
            && fits(&split, &split_outs)
        {
            (*g, *outputs) = (split, split_outs);
        }
    }
    Ok(())
}
