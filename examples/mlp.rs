//! The MLP example: a model written as a struct of layers — 784-1024-1024-10 with ReLU and a
//! softmax — at batch 256, fused, checked against the CPU reference.
//! `cargo run --release --example mlp [-- --quick]`

use clap::Parser;
use fusegraph::nn::{module, Forward, Linear, Scope};
use fusegraph::Tensor;

/// Three linear layers with ReLU between them, then a softmax over the classes.
struct Mlp {
    fc0: Linear,
    fc1: Linear,
    fc2: Linear,
}

// The parameters of an `Mlp` are those of its fields, in this order: `fc0.weight`,
// `fc0.bias`, `fc1.weight`, …
module!(Mlp { fc0, fc1, fc2 });

impl Mlp {
    fn new(s: &Scope, [input, hidden, classes]: [usize; 3]) -> fusegraph::Result<Self> {
        Ok(Mlp {
            fc0: Linear::new(&s.at("fc0"), input, hidden, true)?,
            fc1: Linear::new(&s.at("fc1"), hidden, hidden, true)?,
            fc2: Linear::new(&s.at("fc2"), hidden, classes, true)?,
        })
    }
}

impl Forward for Mlp {
    fn forward(&self, x: &Tensor) -> fusegraph::nn::Result<Tensor> {
        let h = self.fc0.forward(x)?.relu()?;
        let h = self.fc1.forward(&h)?.relu()?;
        Ok(self.fc2.forward(&h)?.softmax(1)?)
    }
}

/// The MLP example (784-1024-1024-10, batch 256), fused, checked against the CPU reference.
#[derive(Parser)]
struct Args {
    /// Small sizes (784-256-256-10, batch 16, fewer runs).
    #[arg(long)]
    quick: bool,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let quick = Args::parse().quick;
    fusegraph::init_logging();
    let batch = if quick { 16 } else { 256 };
    let model = Mlp::new(&Scope::root(), if quick { [784, 256, 10] } else { [784, 1024, 10] })?;
    // The model at this batch with seeded parameters and a random input.
    let w = fusegraph_workloads::Workload::of_model(format!("mlp_b{batch}"), &model, &[batch, 784], 1)?;
    let device = fusegraph::Device::shared()?;
    println!("mlp: batch {batch} on {}", device.describe());
    let report = fusegraph_workloads::run_example(&device, &w, if quick { 3 } else { 10 })?;
    println!("{report}");
    Ok(())
}
