//! `cargo bench --bench compile`: the graph passes alone (no device) on training steps of
//! growing size: simplify, fusion, scheduling and memory planning of a training step of the
//! `train` demo's language model with 2, 4 and 8 blocks (Adam). Fusion's cost in the node
//! count shows here.

use fusegraph::crates::nn::{optim::Adam, Params};
use fusegraph::train::{build_step, demo, TrainOptions, TrainStep};
use fusegraph::GraphBuilder;

fn main() {
    divan::main();
}

fn lm_step(layers: usize) -> TrainStep {
    let b = GraphBuilder::new();
    let mut params = Params::new(1);
    let fwd = demo::lm(&b, &mut params, 16, 32, 32, 64, 4, 256, layers).expect("records");
    build_step(&b, &mut params, &fwd, &Adam::new(1e-3), &TrainOptions::default()).expect("builds")
}

#[divan::bench(args = [2, 4, 8, 16, 32], sample_count = 3, sample_size = 1)]
fn plan_lm_training_step(bencher: divan::Bencher, layers: usize) {
    let step = lm_step(layers);
    bencher.bench(|| step.plan_summary().expect("plans"));
}
