//! The CNN example: a ResNet-style network written as a struct of layers (a conv-BN-ReLU
//! stem, three residual stages, global pooling, a linear head) on 3×32×32 inputs, batch 32,
//! fused (batch norms folded into the convolutions), checked against the CPU reference.
//! `cargo run --release --example cnn [-- --quick]`

use clap::Parser;
use fusegraph::nn::models::global_average_pool;
use fusegraph::nn::{module, BatchNorm2d, Conv2d, Conv2dConfig, Forward, Linear, ResidualBlock, Scope};
use fusegraph::Tensor;

/// Stem, residual stages (the second and third halve the resolution), pooling and head.
struct Cnn {
    stem: Conv2d,
    bn: BatchNorm2d,
    stages: Vec<ResidualBlock>,
    fc: Linear,
}

module!(Cnn { stem, bn, stages, fc });

impl Cnn {
    fn new(s: &Scope, channels: [usize; 3], classes: usize) -> fusegraph::Result<Self> {
        let stem = Conv2d::new(&s.at("stem.conv"), Conv2dConfig::new(3, channels[0], 3).padding(1))?;
        let bn = BatchNorm2d::new(&s.at("stem.bn"), channels[0])?;
        let mut stages = Vec::new();
        let mut in_ch = channels[0];
        for (i, &out_ch) in channels.iter().enumerate() {
            let stride = if i == 0 { 1 } else { 2 };
            stages.push(ResidualBlock::new(&s.at(format!("layer{}", i + 1)), in_ch, out_ch, stride)?);
            in_ch = out_ch;
        }
        Ok(Cnn { stem, bn, stages, fc: Linear::new(&s.at("fc"), in_ch, classes, true)? })
    }
}

impl Forward for Cnn {
    fn forward(&self, x: &Tensor) -> fusegraph::nn::Result<Tensor> {
        let mut h = self.bn.forward(&self.stem.forward(x)?)?.relu()?;
        for stage in &self.stages {
            h = stage.forward(&h)?;
        }
        self.fc.forward(&global_average_pool(&h)?)
    }
}

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
    let model = Cnn::new(&Scope::root(), if quick { [8, 16, 32] } else { [16, 32, 64] }, 10)?;
    let w = fusegraph_workloads::Workload::of_model(format!("cnn_b{batch}"), &model, &[batch, 3, 32, 32], 2)?;
    let device = fusegraph::Device::shared()?;
    println!("cnn: batch {batch} on {}", device.describe());
    let report = fusegraph_workloads::run_example(&device, &w, if quick { 3 } else { 5 })?;
    println!("{report}");
    Ok(())
}
