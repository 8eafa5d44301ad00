//! The memory-limit example: one network compiled under a shrinking memory limit. The plan
//! is known before anything runs: first it fits, then rematerialization recomputes cheap
//! values to fit (more kernels, same results), then compilation fails with the typed
//! out-of-memory error. Then the planner answers "what is the largest batch that fits".
//! Last, attention at long sequences: under a limit that its scores do not fit, the compiler
//! computes `softmax(q·kᵀ)·v` in one kernel that stores neither scores nor probabilities,
//! and the largest batch that fits grows accordingly.
//! `cargo run --release --example memory_limit [-- --quick]`

use clap::Parser;
use fusegraph::nn::{module, Forward, Gpt, GptConfig, Linear, Params, Scope};
use fusegraph::{CompileOptions, DType, Device, FusedAttention, GraphBuilder, HostTensor, RuntimeError, Tensor};
use fusegraph_workloads::{random_values, Workload};

/// `y = x + s + f(s)` with `s = gelu(x)` and `f` narrow → wide → narrow → wide linear layers:
/// the wide activation `s` is needed at the start and again at the end, so it is live across
/// the wide middle, where memory peaks. Recomputing it from `x` (live to the end anyway)
/// inside the last kernel frees its bytes in between: the textbook case for
/// rematerialization.
struct WideResidualMlp {
    down1: Linear,
    up1: Linear,
    down2: Linear,
    up2: Linear,
}

module!(WideResidualMlp { down1, up1, down2, up2 });

impl WideResidualMlp {
    fn new(s: &Scope, wide: usize) -> fusegraph::Result<Self> {
        Ok(WideResidualMlp {
            down1: Linear::new(&s.at("down1"), wide, 64, true)?,
            up1: Linear::new(&s.at("up1"), 64, wide, true)?,
            down2: Linear::new(&s.at("down2"), wide, 64, true)?,
            up2: Linear::new(&s.at("up2"), 64, wide, true)?,
        })
    }
}

impl Forward for WideResidualMlp {
    fn forward(&self, x: &Tensor) -> fusegraph::nn::Result<Tensor> {
        let s = x.gelu()?;
        let h = self.down1.forward(&s)?.relu()?;
        let m = self.up1.forward(&h)?.relu()?;
        let h = self.down2.forward(&m)?.relu()?;
        Ok(x.add(&s)?.add(&self.up2.forward(&h)?)?)
    }
}

/// The network at `batch` as a workload: its graph, a random input and seeded parameters.
fn wide_residual_mlp(batch: usize, wide: usize) -> fusegraph::Result<Workload> {
    let model = WideResidualMlp::new(&Scope::root(), wide)?;
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [batch, wide])?;
    let y = model.forward(&x)?;
    let feeds = vec![("x".to_string(), HostTensor::new([batch, wide], random_values(3, batch * wide))?)];
    let params = Params::of(&model, 11)?.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    Ok(Workload {
        name: format!("wide_residual_mlp_b{batch}"),
        graph: b.graph(),
        outputs: vec![y.id()],
        feeds,
        params,
        updates: vec![],
    })
}

/// One network compiled under a shrinking memory limit (rematerialization, then the typed
/// out-of-memory error), the largest batch that fits, and attention fused to fit a limit.
#[derive(Parser)]
struct Args {
    /// Small sizes (smaller networks, sequences and memory budgets).
    #[arg(long)]
    quick: bool,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let quick = Args::parse().quick;
    fusegraph::init_logging();
    let device = Device::shared()?;
    let w = wide_residual_mlp(if quick { 64 } else { 256 }, if quick { 1024 } else { 4096 })?;
    let base = CompileOptions { name: Some(w.name.clone()), ..Default::default() };
    let plain = device.plan(&w.graph, &w.outputs, &base)?;
    println!("{} on {}", w.name, device.describe());
    println!(
        "no limit: {} bytes ({} kernels, lower bound of the arena {} bytes)",
        plain.total_bytes, plain.kernels, plain.lower_bound_bytes
    );

    let reference = {
        let mut exe = device.compile(&w.graph, &w.outputs, &base)?;
        for (n, v) in &w.params {
            exe.set_parameter(n, v)?;
        }
        exe.run(&w.feed_refs())?
    };
    let fixed = plain.persistent_bytes + plain.staging_bytes;
    let mut arena = plain.arena_bytes;
    loop {
        let limit = fixed + arena;
        let opts = CompileOptions { memory_limit: Some(limit), ..base.clone() };
        match device.compile(&w.graph, &w.outputs, &opts) {
            Ok(mut exe) => {
                for (n, v) in &w.params {
                    exe.set_parameter(n, v)?;
                }
                let out = exe.run(&w.feed_refs())?;
                let s = exe.stats();
                let same = out == reference;
                // A CPU adapter's matmul workspace (textures) only where the limit leaves room.
                let workspace = match s.workspace_bytes {
                    0 => String::new(),
                    w => format!(" (+ {w} of matmul workspace)"),
                };
                println!(
                    "limit {limit:>9}: fits in {:>9} bytes{workspace}, {} kernels{}; outputs {}",
                    s.arena_bytes + s.persistent_bytes + s.staging_bytes,
                    s.kernels.len(),
                    if s.arena_bytes < plain.arena_bytes {
                        " (rematerialized: arena smaller than the plain plan's)"
                    } else {
                        ""
                    },
                    if same { "identical" } else { "DIFFER" }
                );
                if !same {
                    return Err("rematerialized outputs differ".into());
                }
            }
            Err(e @ RuntimeError::ResourceExhausted { .. }) => {
                println!("limit {limit:>9}: {e}");
                break;
            }
            Err(e) => return Err(e.into()),
        }
        arena = arena * 95 / 100;
    }

    let budget = if quick { 4 << 20 } else { 64 << 20 };
    let build = |batch: usize| -> Result<(fusegraph::Graph, Vec<fusegraph::NodeId>), fusegraph::IrError> {
        let w = fusegraph_workloads::mlp(batch, quick).map_err(|e| fusegraph::IrError::ty("mlp", e.to_string()))?;
        Ok((w.graph, w.outputs))
    };
    match device.largest_batch(build, budget, &CompileOptions::default(), 1 << 16)? {
        Some(b) => println!("largest mlp batch within {budget} bytes: {b} (asked the planner; nothing ran)"),
        None => println!("not even batch 1 of the mlp fits {budget} bytes"),
    }
    attention(&device, quick)
}

/// A transformer block whose attention scores do not fit the limit: compiled with the
/// attention fused (the compiler's own choice under the limit), run, and checked against
/// the plain compile; then the largest batch at a long sequence with and without it.
fn attention(device: &std::sync::Arc<Device>, quick: bool) -> Result<(), Box<dyn std::error::Error>> {
    let seq = if quick { 256 } else { 512 };
    let w = fusegraph_workloads::transformer(seq, 1, true)?;
    let named = CompileOptions { name: Some(w.name.clone()), ..Default::default() };
    let three = CompileOptions { fused_attention: FusedAttention::Never, ..named.clone() };
    let fused = CompileOptions { fused_attention: FusedAttention::Always, ..named.clone() };
    let (plain, small) = (device.plan(&w.graph, &w.outputs, &three)?, device.plan(&w.graph, &w.outputs, &fused)?);
    let limit = small.total_bytes;
    let run = |opts: &CompileOptions| -> Result<(Vec<HostTensor>, fusegraph::ExecutableStats), RuntimeError> {
        let mut exe = device.compile(&w.graph, &w.outputs, opts)?;
        for (n, v) in &w.params {
            exe.set_parameter(n, v)?;
        }
        Ok((exe.run(&w.feed_refs())?.into_vec(), exe.stats().clone()))
    };
    let (want, _) = run(&three)?;
    let limited = CompileOptions { memory_limit: Some(limit), ..named };
    match run(&CompileOptions { memory_limit: Some(limit), ..three.clone() }) {
        Err(e @ RuntimeError::ResourceExhausted { .. }) => println!("{}, attention in three kernels: {e}", w.name),
        other => return Err(format!("expected the plain attention not to fit {limit} bytes: {:?}", other.err()).into()),
    }
    let (got, stats) = run(&limited)?;
    let diff = got[0].to_f64().iter().zip(want[0].to_f64()).fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
    let fused_kernels = stats.kernels.iter().filter(|k| k.attention()).count();
    println!(
        "{}: {} bytes with the attention in three kernels; under a limit of {limit} it fits in {} bytes \
         with {fused_kernels} fused attention kernel(s) ({} kernels); outputs within {diff:.1e} of the plain run",
        w.name,
        plain.total_bytes,
        stats.arena_bytes + stats.persistent_bytes + stats.staging_bytes,
        stats.kernels.len()
    );
    if fused_kernels == 0 || diff > 1e-4 {
        return Err("the fused attention was not used, or its outputs differ".into());
    }

    // The planner alone, at a long sequence: GPT-2-small blocks.
    let (long, budget) = if quick { (512, 64u64 << 20) } else { (2048, 1u64 << 30) };
    let (d_model, heads, d_mlp) = if quick { (128, 4, 512) } else { (768, 12, 3072) };
    let block = Gpt::new(&Scope::root(), GptConfig { d_model, heads, d_mlp, layers: 1, vocab: None, max_seq: long })?;
    let build = |batch: usize| -> fusegraph::Result<(fusegraph::Graph, Vec<fusegraph::NodeId>)> {
        let b = GraphBuilder::new();
        let y = block.forward(&b.input("x", DType::F32, [batch, long, d_model])?)?;
        Ok((b.graph(), vec![y.id()]))
    };
    let batches = |opts: &CompileOptions| device.largest_batch(build, budget, opts, 1 << 12);
    let show = |b: Option<usize>| b.map_or("none".to_string(), |b| b.to_string());
    println!(
        "largest batch of a transformer block at sequence {long} within {budget} bytes: {} with the attention \
         in three kernels, {} letting the compiler fuse it (asked the planner; nothing ran)",
        show(batches(&three)?),
        show(batches(&CompileOptions::default())?)
    );
    Ok(())
}
