//! fusegraph's graph passes, one per file: partitioning a graph into kernels ([`partition`]),
//! and planning device memory for them ([`memory_plan`]).
//!
//! Invariants: passes are pure functions of a verified graph; they never touch wgpu; their
//! output is deterministic (ordered maps, fixed tie-breaks).

#![warn(missing_docs)]

pub mod cost;
pub mod fuse;
pub mod kernel;
pub mod liveness;
pub mod memory_plan;
pub mod simplify;

pub use fuse::{fuse, Decision, Fusion, FusionOptions, Veto};
pub use kernel::{partition, FusionMode, Kernel, KernelKind};
pub use memory_plan::{plan_memory, Location, MemoryPlan, Region};
pub use simplify::{simplify, SimplifyStats};
