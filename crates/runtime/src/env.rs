//! The environment variables the library reads: all of them, here, once per process (on
//! first use). Options set in code ([`crate::DeviceOptions`], [`crate::CompileOptions`])
//! take precedence; no `Default` reads the environment.
//!
//! | variable | values | effect |
//! | --- | --- | --- |
//! | `FUSEGRAPH_BACKEND` | `vulkan`, `gl`, `metal`, `dx12` | the backend of a device whose options name none |
//! | `FUSEGRAPH_AUTOTUNE` | `off` / `on` | `off` measures nothing on the adapter: default matmul tilings, no tuned split-k, fusion's device-free cost model (reproducible runs); `on` tunes where it is off by default (llvmpipe through GL) |
//! | `FUSEGRAPH_SHADER_CHECKS` | `on` / `off` | wgpu's runtime checks in every kernel (off by default) |
//! | `FUSEGRAPH_DUMP_WGSL` | a folder | each compile writes its kernels' WGSL there (`k000.wgsl`, …) |
//! | `FUSEGRAPH_GPU_KERNELS` | `on` / `off` | `on`: every device lowers the forms a GPU gets ([`crate::DeviceOptions::gpu_kernels`]), to run them on a CPU adapter |
//!
//! Measurements are cached under `$XDG_CACHE_HOME/fusegraph`, else `$HOME/.cache/fusegraph`
//! ([`crate::DeviceOptions::cache_dir`] overrides both). `FUSEGRAPH_LOG`, a `tracing` filter,
//! is read by the programs that install a subscriber (the `fusegraph` CLI), not here.

use std::path::PathBuf;
use std::sync::OnceLock;

/// What the environment says, read once.
#[derive(Debug, Default)]
pub(crate) struct Env {
    /// `FUSEGRAPH_BACKEND`, trimmed; `None` when unset or empty.
    pub backend: Option<String>,
    /// `FUSEGRAPH_AUTOTUNE` as a switch.
    pub autotune: Option<bool>,
    /// `FUSEGRAPH_SHADER_CHECKS` as a switch.
    pub shader_checks: Option<bool>,
    /// `FUSEGRAPH_DUMP_WGSL`.
    pub dump_wgsl: Option<PathBuf>,
    /// `FUSEGRAPH_GPU_KERNELS` as a switch.
    pub gpu_kernels: Option<bool>,
    /// `$XDG_CACHE_HOME`, else `$HOME/.cache`.
    pub cache_home: Option<PathBuf>,
}

/// The process's environment as the library reads it.
pub(crate) fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| Env {
        backend: std::env::var("FUSEGRAPH_BACKEND").ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()),
        autotune: switch("FUSEGRAPH_AUTOTUNE"),
        shader_checks: switch("FUSEGRAPH_SHADER_CHECKS"),
        dump_wgsl: std::env::var_os("FUSEGRAPH_DUMP_WGSL").map(Into::into),
        gpu_kernels: switch("FUSEGRAPH_GPU_KERNELS"),
        cache_home: std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache"))),
    })
}

/// An on/off switch: `off`, `0`, `false` → `Some(false)`; `on`, `1`, `true` → `Some(true)`;
/// unset or anything else → `None`.
fn switch(name: &str) -> Option<bool> {
    match std::env::var(name).as_deref().map(str::trim) {
        Ok("off" | "0" | "false") => Some(false),
        Ok("on" | "1" | "true") => Some(true),
        _ => None,
    }
}
