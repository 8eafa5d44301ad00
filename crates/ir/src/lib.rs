//! fusegraph's graph IR.
//!
//! Model code records primitive ops through a [`GraphBuilder`] and [`Tensor`] handles into a
//! [`Graph`] on petgraph. Each [`Op`] documents its typing rule, which [`op::infer_type`]
//! implements once for the builder and the [`verify()`] function alike. Graphs print to a
//! deterministic text form that parses back ([`text`]) and draw as DOT ([`dot`]).
//!
//! Invariants: this crate never touches wgpu or naga; every graph a builder produces passes
//! [`verify()`].

#![warn(missing_docs)]

mod builder;
pub mod dot;
mod dtype;
mod dynamic;
mod error;
mod graph;
mod host;
pub mod op;
mod ops;
pub mod quant;
pub mod safetensors;
mod shape;
pub mod text;
mod verify;

pub use builder::{GraphBuilder, Tensor};
pub use dtype::DType;
pub use error::{IrError, Result};
pub use graph::{Graph, Node, NodeId};
pub use half::{bf16, f16};
pub use host::{bf16_nearest, Element, HostData, HostTensor};
pub use op::{BinaryOp, Op, PoolKind, ReduceKind, UnaryOp};
pub use shape::{Shape, TensorType};
pub use verify::verify;
