//! fusegraph's graph passes, one per file: partitioning a graph into kernels ([`partition()`]),
//! and planning device memory for them ([`memory_plan`]).
//!
//! Memory: [`schedule()`] reorders kernels for a low peak of live bytes, [`plan_memory`]
//! lets values whose live ranges do not overlap share arena bytes (and reuses an input's
//! bytes in place where that is safe), [`rematerialize`] recomputes cheap values to meet a
//! budget, and [`planner`] answers "how many bytes" and "which batch fits" without a device.
//!
//! Invariants: passes are pure functions of a verified graph; they never touch wgpu; their
//! output is deterministic (ordered maps, fixed tie-breaks).

#![warn(missing_docs)]

pub mod attention;
pub mod autodiff;
pub mod band;
pub mod checkpoint;
pub mod combine;
pub mod cost;
pub mod fuse;
pub mod hoist;
pub mod kernel;
pub mod liveness;
pub mod memory_plan;
pub mod mixed_precision;
pub mod partition;
pub mod pipeline;
pub mod planner;
pub mod remat;
pub mod rewrite;
pub mod schedule;
pub mod simplify;
pub mod split_k;
pub mod split_reduce;
#[doc(hidden)]
pub mod testing;
pub mod wide;
pub mod windows;

pub use autodiff::{grad, GradError};
pub use combine::{combine_products, combine_products_where, Combined, Joined};
pub use fuse::{
    compared_with_themselves, fuse, fuse_updating, self_comparisons, Decision, Fusion, FusionOptions, SiblingDecision,
    Veto,
};
pub use hoist::{hoist, Hoisted};
pub use kernel::{
    gemv_prologue_bytes, rhs_along_k, rhs_contiguous_k, row_prologue, FusionMode, Kernel, KernelKind, RowPrologue,
    GEMV_MAX_ROWS, GEMV_STAGE_BYTES,
};
pub use memory_plan::{check_plan, plan_memory_updating, plan_memory_with, MemoryOptions, PlanError};
pub use memory_plan::{plan_memory, Location, MemoryPlan, Region};
pub use partition::partition;
pub use pipeline::{held_bytes, largest_batch, Front, Stages};
pub use planner::{
    combine_sibling_products, plan_combined_within, plan_graph, plan_summary, plan_summary_within, plan_within,
    FusedAttention, LiveValue, PlanOptions, PlanSummary, Planned,
};
pub use remat::{rematerialize, rematerialize_with};
pub use schedule::{schedule, schedule_updating};
pub use simplify::{simplify, SimplifyStats};
pub use windows::{fold_windows, side_windows};
