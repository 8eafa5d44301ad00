//! The MLP example: 784-1024-1024-10 with ReLU and softmax, batch 256, fused, checked
//! against the CPU reference. `cargo run --release --example mlp [-- --quick]`

use clap::Parser;

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
    let w = fusegraph_workloads::mlp(batch, quick)?;
    let device = fusegraph::Device::shared()?;
    println!("mlp: batch {batch} on {}", device.describe());
    let report = fusegraph_workloads::run_example(&device, &w, if quick { 3 } else { 10 })?;
    println!("{report}");
    Ok(())
}
