//! The transformer example: GPT-2-small-shaped decoder blocks (d_model 768, 12 heads, MLP
//! 3072, causal attention, layer norms, GELU), sequence 256, batch 1, fused, checked against
//! the CPU reference. `cargo run --release --example transformer [-- --layers N] [--seq S] [--quick]
//! [--mixed-precision] [--fused-attention]` (`--mixed-precision`: activations and weights
//! stored as f16, accumulated in f32, checked within f16 tolerance; `--fused-attention`:
//! each attention's `softmax(q·kᵀ)·v` in one kernel that stores no scores, which the
//! compiler otherwise uses only to meet a memory limit).

use clap::Parser;
use fusegraph::nn::{module, Forward, LayerNorm, Scope, TransformerBlock};
use fusegraph::{FusedAttention, Tensor};

/// GPT-2's decoder stack without the embeddings: causal pre-norm blocks `h.{i}` (layer norm,
/// attention, residual; layer norm, MLP, residual) and a final layer norm `ln_f`.
struct Decoder {
    blocks: Vec<TransformerBlock>,
    ln_f: LayerNorm,
}

module!(Decoder { blocks, ln_f });

impl Decoder {
    fn new(s: &Scope, layers: usize, d_model: usize, heads: usize, d_mlp: usize) -> fusegraph::Result<Self> {
        let blocks = (0..layers).map(|i| TransformerBlock::new(&s.at("h").at(i), d_model, heads, d_mlp, true));
        Ok(Decoder { blocks: blocks.collect::<Result<_, _>>()?, ln_f: LayerNorm::new(&s.at("ln_f"), d_model)? })
    }
}

impl Forward for Decoder {
    /// `x: [batch, seq, d_model] → [batch, seq, d_model]`.
    fn forward(&self, x: &Tensor) -> fusegraph::nn::Result<Tensor> {
        let mut h = x.clone();
        for block in &self.blocks {
            h = block.forward(&h)?;
        }
        self.ln_f.forward(&h)
    }
}

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
    let fused_attention = if fused_attention { FusedAttention::Always } else { FusedAttention::OverLimit };
    let (d_model, heads, d_mlp) = if quick { (128, 4, 512) } else { (768, 12, 3072) };
    let model = Decoder::new(&Scope::root(), layers, d_model, heads, d_mlp)?;
    let name = format!("transformer_s{seq}_l{layers}");
    let w = fusegraph_workloads::Workload::of_model(name, &model, &[1, seq, d_model], 3)?;
    let device = fusegraph::Device::shared()?;
    let precision = if mixed_precision { "mixed precision (f16 storage)" } else { "f32" };
    let attention = if fused_attention == FusedAttention::Always { ", fused attention" } else { "" };
    println!("transformer: {layers} layer(s), sequence {seq}, {precision}{attention} on {}", device.describe());
    let opts = fusegraph::CompileOptions { mixed_precision, fused_attention, ..Default::default() };
    let report = fusegraph_workloads::run_example_with(&device, &w, 3, &opts)?;
    println!("{report}");
    Ok(())
}
