//! fusegraph's wgpu runtime: adapter choice ([`Device`]), compilation of a graph into an
//! [`Executable`] (kernels lowered to WGSL, a memory plan, cached pipelines, bind groups at
//! aligned offsets), and execution with one command buffer and one submit per run.
//!
//! Invariants: this is the only crate that touches wgpu and the only one that allocates GPU
//! memory; nothing is dispatched for a graph that failed to compile.

#![warn(missing_docs)]

mod bind;
mod compile;
mod device;
pub mod env;
mod error;
mod executable;
mod feeds;
mod measure;
mod memory;
mod options;
mod pool;
mod profile;
mod store;
mod submit;
mod tuned;

pub use compile::Recorded;
pub use device::{Backend, Device, DeviceOptions};
pub use error::{Result, RuntimeError};
pub use executable::{Executable, ExecutableStats, KernelStats, Timing};
pub use feeds::{FeedName, Outputs};
pub use fusegraph_passes::FusionMode;
pub use fusegraph_wgsl::{Cooperative, Forms, GemmShape, KernelForm, MatmulTiling, Spread};
pub use measure::autotune::{MAX_TIMED_MACS, MAX_TIMED_MACS_GPU, MIN_TUNED_MACS, TIMED_TILINGS};
pub use memory::MemoryStats;
pub use options::{CompileOptions, FusedAttention, MatmulFamily, ReduceFill, SplitK, SplitReductions};
pub use profile::{KernelTime, Profile};
pub use store::ParamStore;
pub use submit::{Feed, Submitted};
pub use tuned::{KernelForms, Tuned, TunedFamily, TunedForm, TunedSplit, TunedTiling};
/// wgpu's backend enum, as reported in [`Device::info`].
pub use wgpu::Backend as WgpuBackend;
/// wgpu's adapter type, as reported in [`Device::info`].
pub use wgpu::DeviceType as WgpuDeviceType;
/// wgpu's feature flags, as reported by [`Device::features`].
pub use wgpu::Features as WgpuFeatures;
