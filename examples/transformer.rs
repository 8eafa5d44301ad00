//! The transformer example: GPT-2-small-shaped decoder blocks (d_model 768, 12 heads, MLP
//! 3072, causal attention, layer norms, GELU), sequence 256, batch 1, fused, checked against
//! the CPU reference. `cargo run --release --example transformer [-- --layers N] [--seq S] [--quick]
//! [--mixed-precision] [--fused-attention]` (`--mixed-precision`: activations and weights
//! stored as f16, accumulated in f32, checked within f16 tolerance; `--fused-attention`:
//! each attention's `softmax(q·kᵀ)·v` in one kernel that stores no scores, which the
//! compiler otherwise uses only to meet a memory limit).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let flag = |name: &str, default: usize| -> Result<usize, String> {
        match args.iter().position(|a| a == name) {
            Some(i) => args.get(i + 1).and_then(|v| v.parse().ok()).ok_or(format!("{name} needs a number")),
            None => Ok(default),
        }
    };
    let layers = flag("--layers", 1)?;
    let mixed_precision = args.iter().any(|a| a == "--mixed-precision");
    let fused_attention = args.iter().any(|a| a == "--fused-attention").then_some(true);
    let seq = flag("--seq", if quick { 32 } else { 256 })?;
    let w = fusegraph::workloads::transformer(seq, layers, quick)?;
    let device = fusegraph::Device::shared()?;
    let precision = if mixed_precision { "mixed precision (f16 storage)" } else { "f32" };
    let attention = if fused_attention.is_some() { ", fused attention" } else { "" };
    println!("transformer: {layers} layer(s), sequence {seq}, {precision}{attention} on {}", device.describe());
    let opts = fusegraph::CompileOptions { mixed_precision, fused_attention, ..Default::default() };
    let report = fusegraph::workloads::run_example_with(&device, &w, 3, &opts)?;
    println!("{report}");
    Ok(())
}
