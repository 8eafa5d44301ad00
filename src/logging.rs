//! Logging for programs built on fusegraph: the library emits `tracing` events (targets
//! `fusegraph::timing` for each compile's steps, `fusegraph::plan` for memory plans,
//! `fusegraph::wgsl` for every kernel's WGSL, `fusegraph::autotune` for measurements), and
//! [`init_logging`] prints those a `FUSEGRAPH_LOG` filter selects to stderr.

/// Installs a `tracing` subscriber that prints to stderr the events the `FUSEGRAPH_LOG`
/// filter selects, in `tracing_subscriber`'s `EnvFilter` syntax: `FUSEGRAPH_LOG=debug` for
/// compile timings and plans, `FUSEGRAPH_LOG=fusegraph::wgsl=trace` for the kernels' WGSL.
/// Unset, nothing is printed but warnings and errors. Does nothing if the program already
/// installed a subscriber.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FUSEGRAPH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}
