//! The tests that need no device: fusion decisions, golden
//! WGSL, naga validation of every lowered op, planned memory. One test binary.

#[path = "../common/mod.rs"]
mod common;

mod example_memory;
mod fusion;
mod golden_wgsl;
mod naga_ops;
mod train_memory;
