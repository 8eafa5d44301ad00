//! The tests that run on a device (wgpu's adapter: lavapipe or llvmpipe here, a GPU where
//! there is one), one module per subject, in one test binary: one link of wgpu and naga
//! instead of one per file. `cargo test --test device -- MODULE::` runs one subject.

/// Without an adapter (no GPU driver, no lavapipe) the device tests cannot run: they are
/// skipped with a message, the binary exiting before the harness starts. In CI (`CI` set)
/// they run and fail instead, so that a machine that lost its driver cannot pass.
// SAFETY: runs before `main`; it reads the environment and opens a wgpu instance, neither of
// which needs anything `main` sets up.
#[ctor::ctor(unsafe)]
fn skip_without_an_adapter() {
    if std::env::var_os("CI").is_some() {
        return;
    }
    if let Err(e) = fusegraph::Device::new(&fusegraph::DeviceOptions::default()) {
        eprintln!("skipping the device tests: {e}");
        std::process::exit(0);
    }
}

#[path = "../common/mod.rs"]
mod common;

mod attention;
mod autotune;
mod checkpoints;
mod combine;
mod conv_implicit_gemm;
mod cpu_loop_budget;
mod decode;
mod device_ops;
mod distributed;
mod dynamic;
mod errors;
mod excess_precision;
mod forms;
mod fuzz_device;
mod fuzz_images;
mod gemv;
mod gemv_columns;
mod gradients_device;
mod hoist;
mod introspection;
mod largest_batch;
mod llama;
mod matmul_subgroup;
mod matmul_tiled;
mod memory;
mod mixed_precision;
mod module;
mod onnx;
mod shader_checks;
mod split_k;
mod split_reduce;
mod store;
mod submit;
mod threads;
mod train_accumulate;
mod train_checkpoint;
mod train_example;
mod train_mixed_precision;
mod training;
