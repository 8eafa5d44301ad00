//! Memory planning: where each value that lives in memory is stored.
//!
//! Values fall in two regions: `Persistent` (parameters and constants, kept across runs) and
//! `Arena` (inputs and kernel outputs, reused across runs). Every offset is a multiple of the
//! alignment the device requires for storage bindings.

use crate::kernel::{is_memory_leaf, Kernel};
use fusegraph_ir::{Graph, NodeId, Op};
use std::collections::BTreeMap;

/// The region a value lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Region {
    /// Parameters and constants: written once, kept across runs.
    Persistent,
    /// Inputs and intermediate values of one run.
    Arena,
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
    /// Bytes if every arena value had its own buffer.
    pub naive_bytes: u64,
    /// Offset alignment used.
    pub alignment: u64,
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// Plans memory for `kernels` (from [`crate::partition`]): every kernel input and output, and
/// every graph output, gets a location. This version gives each arena value its own slot.
pub fn plan_memory(g: &Graph, kernels: &[Kernel], outputs: &[NodeId], alignment: u64) -> MemoryPlan {
    let alignment = alignment.max(4);
    let mut values: Vec<NodeId> = Vec::new();
    for k in kernels {
        values.extend(k.inputs.iter().copied());
        values.extend(k.outputs.iter().copied());
    }
    values.extend(outputs.iter().copied());
    values.sort();
    values.dedup();
    let mut locations = BTreeMap::new();
    let (mut persistent, mut arena) = (0u64, 0u64);
    for id in values {
        let node = g.node(id);
        let size = (node.ty.buffer_bytes() as u64).max(4);
        let persistent_value = is_memory_leaf(&node.op) && !matches!(node.op, Op::Input { .. });
        let cursor = if persistent_value { &mut persistent } else { &mut arena };
        let offset = align_up(*cursor, alignment);
        *cursor = offset + size;
        let region = if persistent_value { Region::Persistent } else { Region::Arena };
        locations.insert(id, Location { region, offset, size });
    }
    MemoryPlan {
        locations,
        persistent_bytes: align_up(persistent, alignment),
        arena_bytes: align_up(arena, alignment),
        naive_bytes: align_up(arena, alignment),
        alignment,
    }
}
