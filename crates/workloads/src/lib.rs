//! The benchmark workloads, shared by `fusegraph bench`, the divan benches and tests:
//! each builds a graph, its parameters and random feeds (seeded, never zeros).

pub mod data_parallel;
pub mod demo;
pub mod plot;

use fusegraph::{DType, Graph, GraphBuilder, HostTensor, NodeId, Tensor};
use fusegraph_nn::{Forward, Gpt, GptConfig, MlpClassifier, NnError, Params, ResNet, Scope};

/// A graph ready to compile and run.
pub struct Workload {
    /// Short name (`softmax_axis0`, `mlp`, …).
    pub name: String,
    /// The graph.
    pub graph: Graph,
    /// Its outputs.
    pub outputs: Vec<NodeId>,
    /// One value per input.
    pub feeds: Vec<(String, HostTensor)>,
    /// One value per parameter.
    pub params: Vec<(String, HostTensor)>,
    /// A training step's parameter updates (`CompileOptions::updates`: new weights and
    /// optimizer state, written on the device); empty for the inference workloads. Compile
    /// with [`Workload::options`], or the backward pass and the update are dead code.
    pub updates: Vec<(String, NodeId)>,
}

impl Workload {
    /// `model` applied to an f32 input `"x"` of `dims` (random values), with parameters
    /// drawn from `seed`.
    pub fn of_model(name: String, model: &dyn Forward, dims: &[usize], seed: u64) -> Result<Workload, NnError> {
        let p = Params::of(model, seed)?;
        let b = GraphBuilder::new();
        let input = b.input("x", DType::F32, dims.to_vec())?;
        let out = model.forward(&input)?;
        let x = HostTensor::new(dims.to_vec(), random_values(7, dims.iter().product()))?;
        let params = p.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        Ok(Workload {
            name,
            graph: b.graph(),
            outputs: vec![out.id()],
            feeds: vec![("x".into(), x)],
            params,
            updates: vec![],
        })
    }

    /// Feeds as the `(name, &tensor)` pairs `Executable::run` takes.
    pub fn feed_refs(&self) -> Vec<(&str, &HostTensor)> {
        self.feeds.iter().map(|(n, t)| (n.as_str(), t)).collect()
    }

    /// `base` with this workload's parameter updates: the options to compile it with.
    pub fn options(&self, base: fusegraph::CompileOptions) -> fusegraph::CompileOptions {
        fusegraph::CompileOptions { updates: self.updates.clone(), ..base }
    }
}

/// Random blocks of a block type that nothing here quantizes to (the k-quants and the IQ
/// types: not in `fusegraph::quant::QUANTIZED`) of `dims` (a last dimension of whole blocks):
/// random packed values and sub-block scales, f16 scales small enough that the values lie
/// within about ±3.
pub fn random_blocks(seed: u64, dtype: DType, dims: &[usize]) -> HostTensor {
    use rand::{Rng, RngCore, SeedableRng};
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed);
    let (elems, bytes) = dtype.block().expect("a block type");
    let blocks = dims.iter().product::<usize>() / elems;
    let mut data = vec![0u8; blocks * bytes];
    rng.fill_bytes(&mut data);
    // Each f16 scale's place and range: the largest integer product it multiplies within 3.
    let scales: &[(usize, f32, f32)] = match dtype {
        // d·63·15 and dmin·63.
        DType::Q4K => &[(0, 0.0005, 0.003), (2, 0.0, 0.025)],
        // d·63·31 and dmin·63.
        DType::Q5K => &[(0, 0.0003, 0.0015), (2, 0.0, 0.025)],
        // d·128·32.
        DType::Q6K => &[(208, 0.0001, 0.0007)],
        // d·15·3 and dmin·15.
        DType::Q2K => &[(80, 0.01, 0.06), (82, 0.0, 0.2)],
        // d·32·4.
        DType::Q3K => &[(108, 0.003, 0.02)],
        // d·127.
        DType::IQ4NL => &[(0, 0.005, 0.02)],
        // d·32·127.
        DType::IQ4XS => &[(0, 0.0001, 0.0007)],
        _ => panic!("{dtype}: quantize to it instead (fusegraph::quant::quantize)"),
    };
    for block in data.chunks_exact_mut(bytes) {
        for &(at, lo, hi) in scales {
            let v = fusegraph::f16::from_f32(rng.random_range(lo..hi));
            block[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    HostTensor::from_blocks(dtype, dims.to_vec(), data).expect("whole blocks")
}

/// Seeded values in [-1, 1] away from zero.
pub fn random_values(seed: u64, n: usize) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let v: f32 = rng.random_range(-1.0..1.0);
            if v.abs() < 1e-3 {
                0.5
            } else {
                v
            }
        })
        .collect()
}

struct Recorder {
    b: GraphBuilder,
    feeds: Vec<(String, HostTensor)>,
    seed: u64,
}

impl Recorder {
    fn new() -> Self {
        Recorder { b: GraphBuilder::new(), feeds: Vec::new(), seed: 1 }
    }
    fn input(&mut self, name: &str, dims: &[usize]) -> Tensor {
        self.seed += 1;
        let n = dims.iter().product();
        self.feeds
            .push((name.into(), HostTensor::new(dims.to_vec(), random_values(self.seed, n)).expect("sizes agree")));
        self.b.input(name, DType::F32, dims.to_vec()).expect("valid input")
    }
    fn finish(self, name: String, outs: &[&Tensor]) -> Workload {
        Workload {
            name,
            graph: self.b.graph(),
            outputs: outs.iter().map(|t| t.id()).collect(),
            feeds: self.feeds,
            params: vec![],
            updates: vec![],
        }
    }
}

/// A chain of 20 elementwise ops over `n` elements.
pub fn elementwise_chain(n: usize) -> Workload {
    let mut r = Recorder::new();
    let mut x = r.input("x", &[n]);
    let y = r.input("y", &[n]);
    for k in 0..20 {
        x = match k % 4 {
            0 => x.add(&y),
            1 => x.mul_scalar(0.5),
            2 => x.tanh(),
            _ => x.sub(&y),
        }
        .expect("valid op");
    }
    r.finish(format!("elementwise_chain_{n}"), &[&x])
}

/// `gelu(relu(A·B) + bias)` for square `n`.
pub fn matmul_epilogue(n: usize) -> Workload {
    let mut r = Recorder::new();
    let a = r.input("a", &[n, n]);
    let b = r.input("b", &[n, n]);
    let bias = r.input("bias", &[n]);
    let y = a.matmul(&b).and_then(|m| m.relu()).and_then(|m| m.add(&bias)).and_then(|m| m.gelu()).expect("valid ops");
    r.finish(format!("gelu_relu_matmul_bias_{n}"), &[&y])
}

/// Layer norm over the last axis, then GELU, on `[rows, d]`.
pub fn layer_norm_gelu(rows: usize, d: usize) -> Workload {
    let mut r = Recorder::new();
    let x = r.input("x", &[rows, d]);
    let gamma = r.input("gamma", &[d]);
    let beta = r.input("beta", &[d]);
    let y = x
        .layer_norm(&[1], 1e-5)
        .and_then(|t| t.mul(&gamma))
        .and_then(|t| t.add(&beta))
        .and_then(|t| t.gelu())
        .expect("valid ops");
    r.finish(format!("layer_norm_gelu_{rows}x{d}"), &[&y])
}

/// Softmax of `[n, n]` along `axis`.
pub fn softmax(n: usize, axis: usize) -> Workload {
    let mut r = Recorder::new();
    let x = r.input("x", &[n, n]);
    let y = x.softmax(axis).expect("valid op");
    r.finish(format!("softmax_axis{axis}_{n}"), &[&y])
}

/// The `mlp` example network: 784-1024-1024-10 with ReLU and softmax at `batch`
/// (784-256-256-10 with `quick`).
pub fn mlp(batch: usize, quick: bool) -> Result<Workload, NnError> {
    let dims: &[usize] = if quick { &[784, 256, 256, 10] } else { &[784, 1024, 1024, 10] };
    let model = MlpClassifier::new(&Scope::root(), dims)?;
    Workload::of_model(format!("mlp_b{batch}"), &model, &[batch, dims[0]], 1)
}

/// The `cnn` example network: a ResNet-style net on 3×32×32 inputs (channels 16-32-64, or
/// 8-16-32 with `quick`), 10 classes.
pub fn cnn(batch: usize, quick: bool) -> Result<Workload, NnError> {
    let channels = if quick { [8, 16, 32] } else { [16, 32, 64] };
    let model = ResNet::new(&Scope::root(), channels, 10)?;
    Workload::of_model(format!("cnn_b{batch}"), &model, &[batch, 3, 32, 32], 2)
}

/// The `transformer` example network: GPT-2-small-shaped decoder blocks (d_model 768, 12
/// heads, MLP 3072, causal) at sequence `seq`, batch 1; with `quick` d_model 128, 4 heads,
/// MLP 512.
pub fn transformer(seq: usize, layers: usize, quick: bool) -> Result<Workload, NnError> {
    let (d_model, heads, d_mlp) = if quick { (128, 4, 512) } else { (768, 12, 3072) };
    let cfg = GptConfig { d_model, heads, d_mlp, layers, vocab: None, max_seq: seq };
    let model = Gpt::new(&Scope::root(), cfg)?;
    Workload::of_model(format!("transformer_s{seq}_l{layers}"), &model, &[1, seq, d_model], 3)
}

/// The example networks at their bench sizes (small with `quick`).
pub fn networks(quick: bool) -> Vec<Workload> {
    let built = if quick {
        vec![mlp(16, true), cnn(2, true), transformer(32, 1, true)]
    } else {
        vec![mlp(256, false), cnn(32, false), transformer(256, 1, false)]
    };
    built.into_iter().map(|w| w.expect("the example networks are well formed")).collect()
}

/// A training step of the `train` example's `task` (forward, backward and Adam's update of
/// every weight and its state, written in place on the device) at its sizes (`quick`: the
/// example's `--quick` ones), named `train_mlp` or `train_lm`; the feeds are its first
/// micro-batch. Its one output is the loss.
pub fn train_step(task: crate::demo::Task, quick: bool) -> Result<Workload, fusegraph::train::TrainError> {
    train_step_with(task, quick, false)
}

/// [`train_step`], with `mixed_precision` the `train` example's mixed precision (its
/// `--mixed-precision`: f16 forward and backward with dynamic loss scaling, f32 master
/// weights and optimizer state; [`fusegraph::train::LossScaling`]). That, not
/// `CompileOptions::mixed_precision`, is how a training step runs in f16: the compile
/// option would round Adam's arithmetic to f16 too, where its ε (1e-8) is zero and small
/// squared gradients underflow, and the update divides by zero.
pub fn train_step_with(
    task: crate::demo::Task,
    quick: bool,
    mixed_precision: bool,
) -> Result<Workload, fusegraph::train::TrainError> {
    let mut cfg = crate::demo::Config::new(task, quick);
    if mixed_precision {
        cfg.options.mixed_precision = Some(fusegraph::train::LossScaling::default());
    }
    let setup = crate::demo::build(&cfg)?;
    Ok(Workload {
        name: format!("train_{}", task.name()),
        feeds: setup.feeds(0)?,
        params: setup.params.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        outputs: setup.step.outputs(),
        updates: setup.step.updates,
        graph: setup.step.graph,
    })
}

/// The training steps of both `train` tasks ([`train_step`]).
pub fn training(quick: bool) -> Vec<Workload> {
    training_with(quick, false)
}

/// The training steps of both `train` tasks, in mixed precision with `mixed_precision`
/// ([`train_step_with`]).
pub fn training_with(quick: bool, mixed_precision: bool) -> Vec<Workload> {
    use crate::demo::Task;
    [Task::Mlp, Task::Lm]
        .into_iter()
        .map(|t| train_step_with(t, quick, mixed_precision).expect("the training demos are well formed"))
        .collect()
}

/// Every workload: the micro ones, the networks, then the training steps.
pub fn all(quick: bool) -> Vec<Workload> {
    all_with(quick, false)
}

/// [`all`], the training steps in mixed precision with `mixed_precision`.
fn all_with(quick: bool, mixed_precision: bool) -> Vec<Workload> {
    let mut out = micro(quick);
    out.extend(networks(quick));
    out.extend(training_with(quick, mixed_precision));
    out
}

/// The micro workloads, small with `quick`.
pub fn micro(quick: bool) -> Vec<Workload> {
    let (chain, mm, rows, sm): (usize, &[usize], usize, usize) =
        if quick { (1 << 16, &[64, 128], 64, 128) } else { (1 << 22, &[128, 256, 512], 1024, 512) };
    let mut out = vec![elementwise_chain(chain)];
    out.extend(mm.iter().map(|&n| matmul_epilogue(n)));
    out.push(layer_norm_gelu(rows, 768));
    out.push(softmax(sm, 1));
    out.push(softmax(sm, 0));
    out
}

/// A micro workload at the size its name gives, as the micro workloads are named:
/// `elementwise_chain_N`, `gelu_relu_matmul_bias_N`, `layer_norm_gelu_RxD`,
/// `softmax_axisA_N` (A 0 or 1), any positive sizes; and the transformer network at any
/// sequence length and depth, `transformer_sS_lL` (its `quick` dimensions with `quick`).
/// `None` for any other name.
pub fn sized(name: &str, quick: bool) -> Option<Workload> {
    let num = |s: &str| s.parse::<usize>().ok().filter(|&n| n > 0);
    if let Some((seq, layers)) = name.strip_prefix("transformer_s").and_then(|s| s.split_once("_l")) {
        return transformer(num(seq)?, num(layers)?, quick).ok();
    }
    if let Some(n) = name.strip_prefix("elementwise_chain_") {
        return Some(elementwise_chain(num(n)?));
    }
    if let Some(n) = name.strip_prefix("gelu_relu_matmul_bias_") {
        return Some(matmul_epilogue(num(n)?));
    }
    if let Some((rows, d)) = name.strip_prefix("layer_norm_gelu_").and_then(|s| s.split_once('x')) {
        return Some(layer_norm_gelu(num(rows)?, num(d)?));
    }
    let (axis, n) = name.strip_prefix("softmax_axis")?.split_once('_')?;
    let axis = axis.parse().ok().filter(|&a: &usize| a < 2)?;
    Some(softmax(num(n)?, axis))
}

/// The workloads `name` selects (every one without a name): those whose names start with
/// it, else the micro workload it names at other sizes ([`sized`]). Empty if none.
pub fn select(name: Option<&str>, quick: bool) -> Vec<Workload> {
    select_with(name, quick, false)
}

/// [`select`], the training steps in mixed precision with `mixed_precision`
/// ([`train_step_with`]; the other workloads are f32 graphs either way).
pub fn select_with(name: Option<&str>, quick: bool, mixed_precision: bool) -> Vec<Workload> {
    let listed: Vec<Workload> =
        all_with(quick, mixed_precision).into_iter().filter(|w| name.is_none_or(|n| w.name.starts_with(n))).collect();
    match (listed.is_empty(), name) {
        (true, Some(n)) => sized(n, quick).into_iter().collect(),
        _ => listed,
    }
}

/// Every workload's name, for `--workload` (a prefix of a name selects it).
pub fn names(quick: bool) -> Vec<String> {
    all(quick).into_iter().map(|w| w.name).collect()
}

/// What an example run measured.
#[derive(Clone, Debug)]
pub struct Report {
    /// Kernels (fused), the hoisted ones included.
    pub kernels: usize,
    /// Of those, the kernels that compute from parameters alone and run only after a
    /// parameter is set ([`fusegraph::CompileOptions::hoist_parameters`]).
    pub prepared_kernels: usize,
    /// Matrix products run combined, and the batched products they became
    /// ([`fusegraph::ExecutableStats::combined_products`]).
    pub combined_products: (usize, usize),
    /// Distinct pipelines of the fused kernels ([`fusegraph::ExecutableStats::pipelines`]).
    pub pipelines: usize,
    /// Kernels with fusion off, for comparison.
    pub unfused_kernels: usize,
    /// Device bytes of the executable's buffers (parameters + arena + staging).
    pub device_bytes: u64,
    /// Device bytes of its workspace textures (the subgroup matmul's operands on CPU
    /// adapters), which an unfused run holds too; not in `device_bytes`.
    pub workspace_bytes: u64,
    /// The arena if every value had its own buffer, plus parameters and staging.
    pub naive_bytes: u64,
    /// The same without fusion: every primitive op's result in its own buffer (the memory
    /// of a runtime with neither fusion nor buffer reuse).
    pub unfused_naive_bytes: u64,
    /// The peak of live bytes plus parameters and staging.
    pub lower_bound_bytes: u64,
    /// The activations alone: the arena (inputs and intermediate values, reused).
    pub arena_bytes: u64,
    /// The activations without fusion or reuse: every primitive op's result its own buffer.
    pub unfused_naive_arena_bytes: u64,
    /// Median time of one run, ms.
    pub median_ms: f64,
    /// Whether the time is from GPU timestamps.
    pub gpu_timer: bool,
    /// Largest |fused − reference| over the outputs.
    pub max_abs_error: f64,
}

/// Compiles `w` fused on `device`, runs it, checks every output against the CPU reference
/// (error if they differ beyond f32 tolerance scaled by the output's magnitude), and times
/// `runs` runs.
pub fn run_example(device: &std::sync::Arc<fusegraph::Device>, w: &Workload, runs: usize) -> Result<Report, String> {
    run_example_with(device, w, runs, &fusegraph::CompileOptions::default())
}

/// The relative tolerance outputs compiled with `opts` are checked with: f16's (2e-2) under
/// `mixed_precision`, else 1e-4.
pub fn tolerance(opts: &fusegraph::CompileOptions) -> f64 {
    if opts.mixed_precision {
        2e-2
    } else {
        1e-4
    }
}

/// [`run_example`] compiled with `opts`; under `mixed_precision` the outputs are checked
/// against the f32 reference within f16 tolerance (2e-2, scaled by the output's magnitude).
pub fn run_example_with(
    device: &std::sync::Arc<fusegraph::Device>,
    w: &Workload,
    runs: usize,
    opts: &fusegraph::CompileOptions,
) -> Result<Report, String> {
    use fusegraph::crates::reference;
    let tol = tolerance(opts);
    let mut exe = device.compile(&w.graph, &w.outputs, opts).map_err(|e| e.to_string())?;
    for (name, value) in &w.params {
        exe.set_parameter(name, value).map_err(|e| e.to_string())?;
    }
    let got = exe.run(&w.feed_refs()).map_err(|e| e.to_string())?;
    let feeds = w.feeds.iter().cloned().collect();
    let params = w.params.iter().cloned().collect();
    let want = reference::evaluate(&w.graph, &w.outputs, &feeds, &params).map_err(|e| e.to_string())?;
    let mut max_abs_error = 0.0f64;
    for (g, r) in got.iter().zip(&want) {
        let scale = r.to_f64().iter().fold(1.0f64, |m, v| m.max(v.abs()));
        reference::assert_close(g, r, tol, tol * scale)
            .map_err(|e| format!("{}: does not match the reference: {e}", w.name))?;
        for (a, b) in g.to_f64().iter().zip(r.to_f64()) {
            max_abs_error = max_abs_error.max((a - b).abs());
        }
    }
    let t = exe.time(&w.feed_refs(), 1, runs).map_err(|e| e.to_string())?;
    let unfused =
        device.plan(&w.graph, &w.outputs, &fusegraph::CompileOptions::unfused()).map_err(|e| e.to_string())?;
    let s = exe.stats();
    let fixed = s.persistent_bytes + s.staging_bytes;
    Ok(Report {
        kernels: s.kernels.len(),
        prepared_kernels: s.prepared_kernels,
        combined_products: s.combined_products,
        pipelines: s.pipelines,
        unfused_kernels: unfused.kernels,
        device_bytes: s.device_bytes - s.workspace_bytes,
        workspace_bytes: s.workspace_bytes,
        naive_bytes: s.naive_bytes + fixed,
        unfused_naive_bytes: unfused.naive_bytes + unfused.persistent_bytes + unfused.staging_bytes,
        lower_bound_bytes: s.lower_bound_bytes + fixed,
        arena_bytes: s.arena_bytes,
        unfused_naive_arena_bytes: unfused.naive_bytes,
        median_ms: t.median(),
        gpu_timer: t.gpu_timestamps,
        max_abs_error,
    })
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        writeln!(
            f,
            "kernels      {} fused ({} unfused); the fused ones need {} pipelines (kernels with the same code share one)",
            self.kernels, self.unfused_kernels, self.pipelines
        )?;
        if self.prepared_kernels > 0 {
            writeln!(
                f,
                "             {} of them compute from parameters alone (such as folded weights): run once after the parameters are set, not every run",
                self.prepared_kernels
            )?;
        }
        if self.combined_products.0 > 0 {
            writeln!(
                f,
                "             {} matrix products of shared inputs run as {} (their weights stacked into parameters, no extra byte)",
                self.combined_products.0, self.combined_products.1
            )?;
        }
        writeln!(
            f,
            "memory       {:.2} MiB on the device (lower bound {:.2} MiB); every value its own buffer: {:.2} MiB fused, {:.2} MiB unfused ({:.2}x more)",
            mib(self.device_bytes),
            mib(self.lower_bound_bytes),
            mib(self.naive_bytes),
            mib(self.unfused_naive_bytes),
            self.unfused_naive_bytes as f64 / self.device_bytes.max(1) as f64
        )?;
        if self.workspace_bytes > 0 {
            writeln!(
                f,
                "workspace    {:.2} MiB of matmul operand textures besides (this CPU adapter reads operands through them; released under a memory limit)",
                mib(self.workspace_bytes)
            )?;
        }
        writeln!(
            f,
            "activations  {:.2} MiB arena; every value its own buffer, unfused: {:.2} MiB ({:.2}x more)",
            mib(self.arena_bytes),
            mib(self.unfused_naive_arena_bytes),
            self.unfused_naive_arena_bytes as f64 / self.arena_bytes.max(1) as f64
        )?;
        writeln!(
            f,
            "time         {:.3} ms per run (median, {})",
            self.median_ms,
            if self.gpu_timer { "GPU timestamps" } else { "wall" }
        )?;
        write!(f, "reference    matches (max |error| {:.2e})", self.max_abs_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every micro workload's name builds it again, at its size and at another.
    #[test]
    fn micro_workloads_are_rebuilt_from_their_names() {
        for w in micro(true) {
            let again = sized(&w.name, true).unwrap_or_else(|| panic!("`{}` not rebuilt", w.name));
            assert_eq!(again.name, w.name);
            assert_eq!(fusegraph::text::print(&again.graph), fusegraph::text::print(&w.graph), "{}", w.name);
        }
        assert_eq!(sized("elementwise_chain_12", true).map(|w| w.graph.ty(w.outputs[0]).shape.numel()), Some(12));
        assert_eq!(
            sized("layer_norm_gelu_3x5", true).map(|w| w.graph.ty(w.outputs[0]).shape.dims().to_vec()),
            Some(vec![3, 5])
        );
        for bad in ["elementwise_chain_0", "elementwise_chain_x", "softmax_axis2_8", "layer_norm_gelu_3", "mlp", ""] {
            assert!(sized(bad, true).is_none(), "`{bad}` should name no workload");
        }
        // The transformer at another depth: the listed one's graph with its block repeated.
        let listed = networks(true).into_iter().find(|w| w.name.starts_with("transformer")).expect("listed");
        let again = sized(&listed.name, true).expect("rebuilt");
        assert_eq!(fusegraph::text::print(&again.graph), fusegraph::text::print(&listed.graph));
        let deeper = sized("transformer_s8_l3", true).expect("deeper");
        assert_eq!(deeper.name, "transformer_s8_l3");
        assert!(deeper.graph.len() > 2 * sized("transformer_s8_l1", true).expect("one layer").graph.len());
        for bad in ["transformer_s0_l1", "transformer_s8_l0", "transformer_s8", "transformer_l2"] {
            assert!(sized(bad, true).is_none(), "`{bad}` should name no workload");
        }
        // Selection: listed workloads by prefix first, then sized names.
        let names = |name: &str| select(Some(name), true).into_iter().map(|w| w.name).collect::<Vec<_>>();
        assert_eq!(names("softmax"), ["softmax_axis1_128", "softmax_axis0_128"]);
        assert_eq!(names("softmax_axis0_64"), ["softmax_axis0_64"]);
        assert!(names("nonsense").is_empty());
        assert_eq!(select(None, true).len(), all(true).len());
    }
}
