//! Lowers fusegraph kernels to WGSL compute shaders and validates them with naga.
//!
//! Every kernel becomes one shader: one storage binding per value it reads or writes, one
//! WGSL function `vN(i)` per node that computes element `i` of node `N` (members compute,
//! inputs load), and a `main` that runs one invocation per output element (per packed word
//! for f16 without `SHADER_F16`). Fused kernels are the same thing with more members.
//! Loop kernels computing a matmul (with its fused prologue and epilogue) instead use a tiled,
//! register-blocked `main` (see `matmul.rs`) that reuses the same element functions.
//!
//! Invariants: this crate never touches wgpu; `lower` of a kernel of a verified graph never
//! fails on types, and every shader it produces passes naga validation (tested).

#![warn(missing_docs)]

mod attention;
mod body;
mod loops;
mod lower;
mod matmul;
mod matmul_coop;
mod matmul_gemv;
mod matmul_subgroup;
mod matmul_tiled;
mod options;
mod packed;
mod region;
mod rows;
mod storage;
mod tiling;
mod validate;
mod view;
mod window;
mod writer;

pub use loops::{CPU_LOOP_BUDGET, GPU_INTERLEAVE_MIN, GPU_QUADS};
pub use lower::{localize, lower, lower_planned, lower_with};
pub use matmul::{gemm_shape, GemmShape};
pub use matmul_coop::{cooperative_matmul, CoopPlan};
pub use matmul_gemv::{gemv_kernel, GEMV_COLUMNS, GEMV_MAX_ROWS};
pub use matmul_subgroup::{subgroup_matmul, SubgroupPlan};
pub use options::{
    Binding, Cooperative, Forms, KernelForm, KernelSource, LowerOptions, Spread, Strategy, TEXTURE_ROW, WORKGROUP_SIZE,
};
pub use tiling::MatmulTiling;
pub use validate::{validate, ValidateError};
pub use view::{reshape_strides, split_last_axis_view, strided_view, StridedView};
pub use window::{window_outputs, Window};
