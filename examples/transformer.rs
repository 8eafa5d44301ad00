//! The transformer example: GPT-2-small-shaped decoder blocks (d_model 768, 12 heads, MLP
//! 3072, causal attention, layer norms, GELU), sequence 256, batch 1, fused, checked against
//! the CPU reference. `cargo run --release --example transformer [-- --layers N] [--seq S] [--quick]
//! [--mixed-precision] [--fused-attention]` (`--mixed-precision`: activations and weights
//! stored as f16, accumulated in f32, checked within f16 tolerance; `--fused-attention`:
//! each attention's `softmax(q·kᵀ)·v` in one kernel that stores no scores, which the
//! compiler otherwise uses only to meet a memory limit).

use clap::Parser;

/// The transformer example: GPT-2-small-shaped decoder blocks, batch 1, fused, checked against
/// the CPU reference.
#[derive(Parser)]
struct Args {
    /// Decoder blocks.
    #[arg(long, value_name = "N", default_value_t = 1)]
    layers: usize,
    /// Sequence length [default: 256, 32 with --quick].
    #[arg(long, value_name = "S")]
    seq: Option<usize>,
    /// Small sizes (d_model 128, 4 heads, MLP 512).
    #[arg(long)]
    quick: bool,
    /// Activations and weights stored as f16, accumulated in f32, checked within f16 tolerance.
    #[arg(long)]
    mixed_precision: bool,
    /// Each attention's softmax(q·kᵀ)·v in one kernel that stores no scores.
    #[arg(long)]
    fused_attention: bool,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Args { layers, seq, quick, mixed_precision, fused_attention } = Args::parse();
    fusegraph::init_logging();
    let seq = seq.unwrap_or(if quick { 32 } else { 256 });
    let fused_attention = fused_attention.then_some(true);
    let w = fusegraph_workloads::transformer(seq, layers, quick)?;
    let device = fusegraph::Device::shared()?;
    let precision = if mixed_precision { "mixed precision (f16 storage)" } else { "f32" };
    let attention = if fused_attention.is_some() { ", fused attention" } else { "" };
    println!("transformer: {layers} layer(s), sequence {seq}, {precision}{attention} on {}", device.describe());
    let opts = fusegraph::CompileOptions { mixed_precision, fused_attention, ..Default::default() };
    let report = fusegraph_workloads::run_example_with(&device, &w, 3, &opts)?;
    println!("{report}");
    Ok(())
}
