//! The CNN example: a ResNet-style network (conv-BN-ReLU blocks with residual adds, three
//! stages, pooling, a linear head) on 3×32×32 inputs, batch 32, fused (batch norms folded
//! into the convolutions), checked against the CPU reference.
//! `cargo run --release --example cnn [-- --quick]`

use clap::Parser;

/// The CNN example (ResNet-style, 3×32×32 inputs, batch 32), fused, checked against the CPU
/// reference.
#[derive(Parser)]
struct Args {
    /// Small sizes (batch 2, a smaller network, fewer runs).
    #[arg(long)]
    quick: bool,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let quick = Args::parse().quick;
    fusegraph::init_logging();
    let batch = if quick { 2 } else { 32 };
    let w = fusegraph_workloads::cnn(batch, quick)?;
    let device = fusegraph::Device::shared()?;
    println!("cnn: batch {batch} on {}", device.describe());
    let report = fusegraph_workloads::run_example(&device, &w, if quick { 3 } else { 5 })?;
    println!("{report}");
    Ok(())
}
