//! The README's example: build a graph, compile it, run it, check it against the CPU
//! reference. `cargo run --release --example quickstart`

use clap::Parser;
use fusegraph::crates::reference;
use fusegraph::{compile, CompileOptions, DType, GraphBuilder, HostTensor};
use std::collections::BTreeMap;

/// The README's example: build a graph, compile it, run it, check it against the CPU
/// reference. Takes no options.
#[derive(Parser)]
struct Args {}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    Args::parse();
    fusegraph::init_logging();
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [4, 8])?;
    let w = b.parameter("w", DType::F32, [8, 16])?;
    let bias = b.parameter("b", DType::F32, [16])?;
    let y = x.matmul(&w)?.add(&bias)?.gelu()?.softmax(1)?;

    let graph = b.graph();
    let mut exe = compile(&graph, &[y.id()], &CompileOptions::default())?;
    let wv = HostTensor::new([8, 16], (0..128).map(|i| ((i * 37 % 11) as f32 - 5.0) / 10.0).collect())?;
    let bv = HostTensor::new([16], (0..16).map(|i| i as f32 / 16.0).collect())?;
    exe.set_parameter("w", &wv)?;
    exe.set_parameter("b", &bv)?;
    let xv = HostTensor::new([4, 8], (0..32).map(|i| (i as f32).sin()).collect())?;
    let out = exe.run(&[("x", &xv)])?;

    let feeds = BTreeMap::from([("x".to_string(), xv)]);
    let params = BTreeMap::from([("w".to_string(), wv), ("b".to_string(), bv)]);
    let want = reference::evaluate(&graph, &[y.id()], &feeds, &params)?;
    reference::assert_close(&out[0], &want[0], 1e-5, 1e-6)?;

    println!("device   {}", exe.device().describe());
    println!("kernels  {}", exe.stats().kernels.len());
    println!("arena    {} bytes", exe.stats().arena_bytes);
    println!("row 0    {:?}", &out[0].as_slice::<f32>().unwrap()[..4]);
    println!("matches the CPU reference");
    Ok(())
}
