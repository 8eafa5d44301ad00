//! `cargo bench --bench compile`: the graph passes alone (no device) on training steps of
//! growing size: simplify, fusion, scheduling and memory planning of a training step of the
//! `train` demo's language model with 2 to 32 blocks (Adam), at three binding limits: the
//! WebGPU default of 8 (`TrainStep::plan_summary`'s), lavapipe's 32, and 1024 for a GPU
//! whose limit is in the thousands or more (NVIDIA's Vulkan driver), where sibling merging
//! builds optimizer kernels of thousands of members. Fusion's cost in the node count shows
//! here.

use fusegraph::crates::nn::{optim::Adam, Params};
use fusegraph::crates::passes::{plan_summary_within, PlanOptions};
use fusegraph::train::{build_step, TrainOptions, TrainStep};
use fusegraph::GraphBuilder;
use fusegraph_workloads::demo;

fn main() {
    divan::main();
}

fn lm_step(layers: usize) -> TrainStep {
    let b = GraphBuilder::new();
    let model = demo::lm_model(32, 32, 64, 4, 256, layers).expect("a valid model");
    let mut params = Params::of(&model, 1).expect("initializes");
    let fwd = demo::lm(&b, &model, 16, 32).expect("records");
    build_step(&b, &mut params, &fwd, &Adam::new(1e-3), &TrainOptions::default()).expect("builds")
}

#[divan::bench(consts = [8, 32, 1024], args = [2, 4, 8, 16, 32], sample_count = 3, sample_size = 1)]
fn plan_lm_training_step<const BINDINGS: usize>(bencher: divan::Bencher, layers: usize) {
    let step = lm_step(layers);
    let opts = PlanOptions { max_bindings: BINDINGS, ..step.plan_options() };
    let outputs = step.plan_outputs();
    bencher.bench(|| plan_summary_within(&step.graph, &outputs, &opts, None).expect("plans"));
}
