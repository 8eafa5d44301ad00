//! fusegraph: record tensor operations into a graph, optimize the whole graph, run it as WGSL
//! compute kernels through wgpu on any vendor's GPU (or Mesa's lavapipe/llvmpipe on a CPU).
//!
//! ```no_run
//! use fusegraph::{compile, CompileOptions, DType, GraphBuilder, HostTensor};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let b = GraphBuilder::new();
//! let x = b.input("x", DType::F32, [2, 3])?;
//! let w = b.input("w", DType::F32, [3, 4])?;
//! let y = x.matmul(&w)?.relu()?.softmax(1)?;
//! let exe = compile(&b.graph(), &[y.id()], &CompileOptions::default())?;
//! let xv = HostTensor::new([2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])?;
//! let wv = HostTensor::new([3, 4], vec![0.5f32; 12])?;
//! let out = exe.run(&[("x", &xv), ("w", &wv)])?;
//! println!("{:?}", out[0].as_slice::<f32>());
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod distributed;
mod error;
pub mod generate;
mod jit;
mod logging;
pub mod sampling;
pub mod train;

pub use fusegraph_ir::{
    dot, f16, op, quant, text, verify, BinaryOp, DType, Element, Graph, GraphBuilder, HostData, HostTensor, IrError,
    Node, NodeId, Op, PoolKind, ReduceKind, Shape, Tensor, TensorType, UnaryOp,
};
pub use fusegraph_runtime::{
    Backend, CompileOptions, Device, DeviceOptions, Executable, ExecutableStats, Feed, FeedName, FusedAttention,
    FusionMode, GemmShape, KernelForm, KernelForms, KernelStats, KernelTime, MatmulFamily, MatmulTiling, Outputs,
    ParamStore, Profile, Recorded, ReduceFill, RuntimeError, SplitK, SplitReductions, Spread, Submitted, TunedFamily,
    TunedForm, TunedSplit, TunedTiling,
};

pub use error::{Error, Result};
pub use jit::{Jit, Signature};

pub use logging::init_logging;

/// The README's Rust example, compiled as a doc test so it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// Layers, losses, optimizers and parameter initialization (the `fusegraph-nn` crate).
pub use fusegraph_nn as nn;
/// ONNX models into graphs ([`onnx::OnnxModel`]).
pub use fusegraph_onnx as onnx;

/// The crates behind the facade, for users who need their full APIs.
pub mod crates {
    pub use fusegraph_ir as ir;
    pub use fusegraph_nn as nn;
    pub use fusegraph_onnx as onnx;
    pub use fusegraph_passes as passes;
    pub use fusegraph_reference as reference;
    pub use fusegraph_runtime as runtime;
    pub use fusegraph_wgsl as wgsl;
}

/// Reverse-mode gradients of the scalar `loss` with respect to each of `wrt`, appended to
/// their graph as ordinary ops (so fusion and memory planning see forward and backward
/// together). Each gradient has its `wrt` tensor's type.
pub fn grad(loss: &Tensor, wrt: &[&Tensor]) -> Result<Vec<Tensor>, fusegraph_passes::GradError> {
    let ids: Vec<NodeId> = wrt.iter().map(|t| t.id()).collect();
    let b = loss.builder();
    let grads = b.edit(|g| fusegraph_passes::grad(g, loss.id(), &ids))?;
    Ok(grads.into_iter().map(|id| b.tensor(id).expect("grad returns nodes of this graph")).collect())
}

/// Compiles `outputs` of `graph` on the process-wide shared device ([`Device::shared`]).
pub fn compile(graph: &Graph, outputs: &[NodeId], opts: &CompileOptions) -> Result<Executable, RuntimeError> {
    Device::shared()?.compile(graph, outputs, opts)
}
