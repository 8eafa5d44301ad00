//! The example networks' activation memory, device-free (the same plans the examples and
//! `fusegraph bench` print): buffer reuse keeps the mlp's, the cnn's and the transformer
//! block's activations at least 2× below a runtime with neither fusion nor buffer reuse
//! (every primitive op's result in its own buffer). Parameters are left out: no plan can
//! shrink them, and the MLP's 7.1 MiB of weights would hide its 2 MiB of activations.

use fusegraph::crates::passes::{plan_summary, FusionMode, PlanOptions};
use fusegraph_workloads as workloads;

#[test]
fn buffer_reuse_keeps_the_example_networks_activations_at_least_2x_below_naive() {
    let unfused = PlanOptions { fusion: FusionMode::Off, ..Default::default() };
    for w in [workloads::mlp(256, false), workloads::cnn(32, false), workloads::transformer(256, 1, false)] {
        let w = w.expect("builds");
        let fused = plan_summary(&w.graph, &w.outputs, &PlanOptions::default()).expect("plans");
        let plain = plan_summary(&w.graph, &w.outputs, &unfused).expect("plans");
        println!(
            "{}: arena {} fused, {} unfused; every value its own buffer {} unfused ({:.2}x the fused arena)",
            w.name,
            fused.arena_bytes,
            plain.arena_bytes,
            plain.naive_bytes,
            plain.naive_bytes as f64 / fused.arena_bytes as f64
        );
        assert!(2 * fused.arena_bytes <= plain.naive_bytes, "{}: {fused:?} against {plain:?}", w.name);
        // Reuse alone, without fusion's help, halves them too.
        assert!(2 * plain.arena_bytes <= plain.naive_bytes, "{}: {plain:?}", w.name);
        // And fusion never makes the arena larger than unfused with reuse.
        assert!(fused.arena_bytes <= plain.arena_bytes, "{}: {fused:?} against {plain:?}", w.name);
    }
}
