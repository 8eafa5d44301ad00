//! What a training step keeps alive: each optimizer update runs as soon as its gradient is
//! ready and frees it, whatever the kernels' binding limit lets fusion merge.

use fusegraph::crates::passes::{plan_summary_within, PlanOptions};
use fusegraph_workloads::demo::{build, Config, Task};

/// The `train` example's MLP (batch 256, three hidden relu layers of 256: every activation
/// and every backward delta 256 KiB) needs its three activations and one delta at the peak.
/// Counting a weight's new value as an arena value alive to the end, the scheduler would run
/// the updates last, and every delta and weight gradient they read would stay alive
/// (1,392,896 arena bytes at 32 bindings); fusion's peak check, running them last too, would
/// merge the three bias updates (each with its gradient's reduction) into one kernel holding
/// all three deltas.
#[test]
fn optimizer_updates_free_their_gradients() {
    let step = build(&Config::new(Task::Mlp, false)).unwrap().step;
    const DELTA: u64 = 256 * 256 * 4;
    for bindings in [8, 32] {
        let opts = PlanOptions { max_bindings: bindings, ..step.plan_options() };
        let s = plan_summary_within(&step.graph, &step.plan_outputs(), &opts, None).unwrap();
        println!("{bindings} bindings: arena {} bytes, {} kernels", s.arena_bytes, s.kernels);
        assert!(s.arena_bytes < 4 * DELTA + DELTA / 2, "{bindings} bindings: {} arena bytes", s.arena_bytes);
    }
}
