//! `fusegraph roofline`: achieved GB/s and GFLOP/s per kernel family next to ceilings
//! measured on the same adapter in the same run (a streaming copy kernel for bandwidth, run
//! in turn with every kernel so both see the same load; the best matmul for arithmetic), in
//! the llm.c manner.

use fusegraph::{
    CompileOptions, DType, Device, Executable, GraphBuilder, HostTensor, MatmulTiling, NodeId, SplitReductions, Tensor,
};
use std::fmt::Write as _;
use std::sync::Arc;

/// Achieved GB/s and GFLOP/s per kernel family next to ceilings measured in the same run (a
/// streaming copy, the best square matmul).
#[derive(clap::Args)]
pub struct RooflineArgs {
    /// Small sizes.
    #[arg(long)]
    pub quick: bool,
    /// Write every row as JSON to PATH.
    #[arg(long, value_name = "PATH")]
    pub json: Option<String>,
    /// Only the kernel families whose names start with one of these, comma-separated.
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = family)]
    pub kernels: Vec<String>,
    /// Only this dtype (default: f32 and f16).
    #[arg(long, value_parser = ["f32", "f16"])]
    dtype: Option<String>,
    /// Timed runs per row (default 10, 5 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    runs: Option<u32>,
}

fn family(k: &str) -> Result<String, String> {
    if FAMILIES.iter().any(|f| f.starts_with(k)) {
        Ok(k.to_string())
    } else {
        Err(format!("no kernel family starts with `{k}` (families: {})", FAMILIES.join(", ")))
    }
}

impl RooflineArgs {
    fn dtype(&self) -> Option<DType> {
        self.dtype.as_deref().map(|d| if d == "f16" { DType::F16 } else { DType::F32 })
    }
}

/// The kernel families the roofline measures, in order. The square `matmul` rows set the
/// arithmetic ceiling; the other contractions are measured against it.
const FAMILIES: [&str; 14] = [
    "copy",
    "elementwise_chain20",
    "reduce_sum_rows",
    "reduce_sum_all",
    "reduce_sum_64_rows",
    "reduce_sum_columns",
    "softmax_rows",
    "layer_norm_rows",
    "matmul",
    "batched_matmul",
    "skinny_matmul",
    "decode_gemv",
    "conv2d",
    "max_pool2d",
];

/// The problem sizes of one run: small with `--quick`, larger on a GPU (a 64 MiB copy takes
/// tens of microseconds there, and the matmul targets are stated at 4096³).
struct Sizes {
    /// Elements of the streaming kernels (copy, chain, rows, pooling).
    n: usize,
    /// Sides of the square products.
    mm: &'static [usize],
    /// Batched products of attention's shape: (batch × heads, sequence, head width), each
    /// `[b, s, d] · [b, d, s]`.
    attention: (usize, usize, usize),
    /// A skinny product: (rows, side), `[rows, side] · [side, side]`, bound by reading the
    /// weight, as a decoder's step at a small batch.
    skinny: (usize, usize),
    /// A 3×3 convolution of a ResNet stage, stride 1, padding 1: (batch, channels in and out,
    /// side of the square image).
    conv: (usize, usize, usize),
}

impl Sizes {
    fn new(quick: bool, cpu: bool) -> Self {
        match (quick, cpu) {
            (true, _) => Sizes { n: 1 << 20, mm: &[256], attention: (8, 64, 64), skinny: (8, 512), conv: (2, 32, 28) },
            (false, true) => {
                Sizes { n: 1 << 24, mm: &[512, 1024], attention: (48, 256, 64), skinny: (8, 2048), conv: (8, 64, 56) }
            }
            (false, false) => Sizes {
                n: 1 << 26,
                mm: &[1024, 2048, 4096],
                attention: (96, 1024, 64),
                skinny: (8, 8192),
                conv: (32, 128, 56),
            },
        }
    }
}

/// Records a workload into a builder: its outputs and feeds.
type Build<'a> = &'a dyn Fn(&GraphBuilder) -> (Vec<NodeId>, Vec<(String, HostTensor)>);

struct Row {
    kernel: String,
    shape: String,
    dtype: DType,
    ms: f64,
    gflops: f64,
    gbps: f64,
    /// The copy's bandwidth over the rounds it ran in turn with this kernel.
    ceiling_gbps: f64,
}

fn feed(t: &Tensor, seed: u64) -> (String, HostTensor) {
    if t.dtype().block().is_some() && !fusegraph::quant::QUANTIZED.contains(&t.dtype()) {
        return (format!("x{seed}"), fusegraph_workloads::random_blocks(seed, t.dtype(), t.dims()));
    }
    let n = t.shape().numel();
    let v = fusegraph_workloads::random_values(seed, n).into_iter().map(f64::from).collect::<Vec<_>>();
    (format!("x{seed}"), HostTensor::from_f64(t.dtype(), t.dims().to_vec(), &v).expect("sizes agree"))
}

/// The f32 copy that sets the bandwidth ceiling, timed in turn with every kernel of the run.
struct Ceiling {
    exe: Executable,
    feeds: Vec<(String, HostTensor)>,
    /// Its run times, one per round of every kernel's timing.
    ms: Vec<f64>,
    /// A run's time alone, as first measured (see [`runs_per_sample`]).
    per_run: f64,
}

fn refs(feeds: &[(String, HostTensor)]) -> Vec<(&str, &HostTensor)> {
    feeds.iter().map(|(n, t)| (n.as_str(), t)).collect()
}

/// The median of `v` (the upper one of an even count), NaN for none.
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Compiles a graph and times it. On a CPU adapter in `runs` rounds of one run each, every
/// round followed by one run of the ceiling's copy, so that a kernel and the ceiling it is
/// compared with see the same machine (on a shared CPU box the load drifts by ±20% within a
/// minute); on a GPU (`interleave` false) `runs` samples in one call and then as many of the
/// copy: each call uploads the inputs and reads the outputs back, which over PCIe costs far
/// more than the kernels at these sizes. A GPU sample is a submission of runs back to back,
/// about [`GPU_SAMPLE_MS`] of them ([`Executable::time_back_to_back`]): a short kernel
/// submitted alone after a wait runs at a fraction of its speed in a stream of work (an H100's
/// copy 0.514 ms alone, 0.218 ms among 20). Returns (median ms, the executable, the copy's
/// GB/s over these rounds).
#[allow(clippy::too_many_arguments)]
fn time(
    device: &Arc<Device>,
    b: &GraphBuilder,
    outs: &[NodeId],
    feeds: &[(String, HostTensor)],
    runs: usize,
    opts: &CompileOptions,
    ceiling: &mut Ceiling,
    interleave: bool,
) -> Result<(f64, Executable, f64), String> {
    let exe = device.compile(&b.graph(), outs, opts).map_err(|e| e.to_string())?;
    let refs = refs(feeds);
    let (per_round, rounds) = if interleave { (1, runs) } else { (runs, 1) };
    let per_run = warm_up(&exe, &refs, interleave)?;
    let copy_refs = self::refs(&ceiling.feeds);
    let back_to_back = |exe: &Executable, refs: &[(&str, &HostTensor)], per_run: f64| match interleave {
        true => exe.time(refs, 0, per_round),
        false => exe.time_back_to_back(refs, 0, per_round, runs_per_sample(per_run)),
    };
    let mut ms = Vec::with_capacity(runs);
    let mut copy_ms = Vec::with_capacity(runs);
    for _ in 0..rounds {
        ms.extend(back_to_back(&exe, &refs, per_run).map_err(|e| e.to_string())?.ms);
        let t = back_to_back(&ceiling.exe, &copy_refs, ceiling.per_run).map_err(|e| e.to_string())?;
        copy_ms.extend(&t.ms);
        ceiling.ms.extend(&t.ms);
    }
    let copy_gbps = ceiling.exe.stats().bytes_moved as f64 / median(&copy_ms) / 1e6;
    Ok((median(&ms), exe, copy_gbps))
}

/// Untimed runs before a row is timed: three on a CPU adapter; on a GPU enough more back to
/// back (one upload of the inputs, then each run submitted as soon as the last is done) to
/// fill [`GPU_WARM_UP_MS`] of kernel time (four to 201 in all), so that every row starts on a
/// card that has been busy for a while. With two runs, an H100's 4096³ product took 15 ms
/// compiled right after the same tiling had run at 5.7 ms, in every run: the card's clocks
/// after a pause for compiling are the suspect.
/// Returns the ms of a run timed alone after the first two (for [`runs_per_sample`]).
fn warm_up(exe: &Executable, feeds: &[(&str, &HostTensor)], cpu: bool) -> Result<f64, String> {
    let first = exe.time(feeds, 2, 1).map_err(|e| e.to_string())?;
    let per_run = first.median().max(1e-3);
    if !cpu {
        let more = ((GPU_WARM_UP_MS / per_run).ceil() as usize).clamp(1, 198);
        exe.time(feeds, more, 0).map_err(|e| e.to_string())?;
    }
    Ok(per_run)
}

/// The kernel time a GPU row's warm-up runs fill (see [`warm_up`]).
const GPU_WARM_UP_MS: f64 = 250.0;

/// The kernel time of one GPU sample: runs back to back in one submission, as many as fill
/// it (1 to 64), each a run's time lone after a wait being `per_run`.
const GPU_SAMPLE_MS: f64 = 4.0;

pub(crate) fn runs_per_sample(per_run: f64) -> usize {
    ((GPU_SAMPLE_MS / per_run.max(1e-3)).ceil() as usize).clamp(1, 64)
}

fn inputs(b: &GraphBuilder, dtype: DType, shapes: &[&[usize]]) -> (Vec<Tensor>, Vec<(String, HostTensor)>) {
    let mut ts = Vec::new();
    let mut fs = Vec::new();
    for (i, s) in shapes.iter().enumerate() {
        let t = b.input(&format!("x{}", i + 1), dtype, s.to_vec()).expect("valid input");
        fs.push(feed(&t, i as u64 + 1));
        ts.push(t);
    }
    (ts, fs)
}

/// `lhs · rhs` of two random inputs of these shapes: a [`Build`]'s graph for a product.
fn product(b: &GraphBuilder, dtype: DType, lhs: &[usize], rhs: &[usize]) -> (Vec<NodeId>, Vec<(String, HostTensor)>) {
    let (x, f) = inputs(b, dtype, &[lhs, rhs]);
    (vec![x[0].matmul(&x[1]).expect("matmul").id()], f)
}

pub fn run(args: &RooflineArgs) -> Result<(), String> {
    let device = Device::shared().map_err(|e| e.to_string())?;
    let info = device.info().clone();
    eprintln!("device: {}", device.describe());
    let cpu = info.device_type == fusegraph::crates::runtime::WgpuDeviceType::Cpu;
    let sizes = Sizes::new(args.quick, cpu);
    let (n, mm) = (sizes.n, sizes.mm);
    let runs = args.runs.map_or(if args.quick { 5 } else { 10 }, |r| r as usize);
    let mut rows: Vec<Row> = Vec::new();
    // The bandwidth ceiling: an f32 copy (`neg`: each element read once and written once),
    // run once after every timed run of every kernel.
    let mut ceiling = {
        let b = GraphBuilder::new();
        let (x, feeds) = inputs(&b, DType::F32, &[&[n]]);
        let y = x[0].neg().expect("neg");
        let exe = device.compile(&b.graph(), &[y.id()], &CompileOptions::default()).map_err(|e| e.to_string())?;
        let per_run = exe.time(&refs(&feeds), 2, 1).map_err(|e| e.to_string())?.median();
        Ceiling { exe, feeds, ms: Vec::new(), per_run }
    };
    let mut measure_with = |kernel: &str,
                            dtype: DType,
                            shape: String,
                            flops: f64,
                            opts: &CompileOptions,
                            build: Build|
     -> Result<(), String> {
        let wanted = args.kernels.is_empty() || args.kernels.iter().any(|k| kernel.starts_with(k.as_str()));
        if !wanted || args.dtype().is_some_and(|d| d != dtype) {
            return Ok(());
        }
        eprintln!("timing {kernel} {dtype} {shape}");
        let b = GraphBuilder::new();
        let (outs, feeds) = build(&b);
        let (ms, exe, ceiling_gbps) = time(&device, &b, &outs, &feeds, runs, opts, &mut ceiling, cpu)?;
        let bytes = exe.stats().bytes_moved as f64;
        // A tiled matmul is named with its tiling (autotuned, or the default for its shape)
        // and `coop` on cooperative matrices, a subgroup matmul as such.
        let stats = exe.stats();
        let coop = if stats.kernels.iter().any(|k| k.cooperative_matmul()) { " coop" } else { "" };
        let kernel = match stats.kernels.iter().find_map(|k| k.matmul_tiling) {
            Some(t) => format!("{kernel}{coop} {t}"),
            None if stats.kernels.iter().any(|k| k.subgroup_matmul()) => format!("{kernel} subgroup"),
            None => kernel.to_string(),
        };
        let row = Row { kernel, shape, dtype, ms, gflops: flops / ms / 1e6, gbps: bytes / ms / 1e6, ceiling_gbps };
        // Each row as it comes, so that a run cut short still says what it measured.
        eprintln!(
            "  {} {}: {:.4} ms, {:.1} GB/s ({:.0}% of copy), {:.1} GFLOP/s",
            row.kernel,
            row.dtype,
            row.ms,
            row.gbps,
            100.0 * row.gbps / row.ceiling_gbps,
            row.gflops
        );
        rows.push(row);
        Ok(())
    };
    let plain = CompileOptions::default();
    for dtype in [DType::F32, DType::F16] {
        measure_with("copy", dtype, format!("[{n}]"), 0.0, &plain, &|b| {
            let (x, f) = inputs(b, dtype, &[&[n]]);
            (vec![x[0].neg().expect("neg").id()], f)
        })?;
        measure_with("elementwise_chain20", dtype, format!("[{n}]"), 20.0 * n as f64, &plain, &|b| {
            let (x, f) = inputs(b, dtype, &[&[n], &[n]]);
            let mut y = x[0].clone();
            for k in 0..20 {
                y = match k % 4 {
                    0 => y.add(&x[1]),
                    1 => y.mul_scalar(0.5),
                    2 => y.tanh(),
                    _ => y.sub(&x[1]),
                }
                .expect("valid op");
            }
            (vec![y.id()], f)
        })?;
        measure_with("reduce_sum_rows", dtype, format!("[{},1024]", n / 1024), n as f64, &plain, &|b| {
            let (x, f) = inputs(b, dtype, &[&[n / 1024, 1024]]);
            (vec![x[0].sum(&[1], false).expect("sum").id()], f)
        })?;
        // Few outputs, long rows: split over many workgroups (`CompileOptions::split_reductions`),
        // the whole tensor to one value also unsplit, for comparison.
        measure_with("reduce_sum_all", dtype, format!("[{n}]"), n as f64, &plain, &|b| {
            let (x, f) = inputs(b, dtype, &[&[n]]);
            (vec![x[0].sum(&[0], false).expect("sum").id()], f)
        })?;
        let unsplit = CompileOptions { split_reductions: SplitReductions::Off, ..plain.clone() };
        measure_with("reduce_sum_all unsplit", dtype, format!("[{n}]"), n as f64, &unsplit, &|b| {
            let (x, f) = inputs(b, dtype, &[&[n]]);
            (vec![x[0].sum(&[0], false).expect("sum").id()], f)
        })?;
        measure_with("reduce_sum_64_rows", dtype, format!("[64,{}]", n / 64), n as f64, &plain, &|b| {
            let (x, f) = inputs(b, dtype, &[&[64, n / 64]]);
            (vec![x[0].sum(&[1], false).expect("sum").id()], f)
        })?;
        // A bias gradient's shape: 768 columns summed over the rows.
        let rows = n / 768;
        measure_with("reduce_sum_columns", dtype, format!("[{rows},768]"), (rows * 768) as f64, &plain, &|b| {
            let (x, f) = inputs(b, dtype, &[&[rows, 768]]);
            (vec![x[0].sum(&[0], false).expect("sum").id()], f)
        })?;
        measure_with("softmax_rows", dtype, format!("[{},1024]", n / 1024), 5.0 * n as f64, &plain, &|b| {
            let (x, f) = inputs(b, dtype, &[&[n / 1024, 1024]]);
            (vec![x[0].softmax(1).expect("softmax").id()], f)
        })?;
        measure_with("layer_norm_rows", dtype, format!("[{},1024]", n / 1024), 8.0 * n as f64, &plain, &|b| {
            let (x, f) = inputs(b, dtype, &[&[n / 1024, 1024]]);
            (vec![x[0].layer_norm(&[1], 1e-5).expect("layer_norm").id()], f)
        })?;
        for &m in mm {
            let build: Build = &|b| product(b, dtype, &[m, m], &[m, m]);
            let flops = 2.0 * (m * m * m) as f64;
            measure_with("matmul", dtype, format!("{m}x{m}x{m}"), flops, &plain, build)?;
            if device.autotune() || cpu {
                // The tiled kernel's untuned choice beside the tuned one (or the subgroup one).
                let untuned = CompileOptions { matmul_tiling: Some(MatmulTiling::default_for(m, m)), ..plain.clone() };
                measure_with("matmul untuned", dtype, format!("{m}x{m}x{m}"), flops, &untuned, build)?;
            }
            // Each cooperative-matrix tiling forced, beside whatever the tuner chose.
            if dtype == DType::F16 && device.cooperative_matrix().is_some() {
                for t in MatmulTiling::COOP_CANDIDATES {
                    let forced = CompileOptions { matmul_tiling: Some(t), ..plain.clone() };
                    measure_with("matmul", dtype, format!("{m}x{m}x{m}"), flops, &forced, build)?;
                }
            }
        }
        let (heads, s, d) = sizes.attention;
        let flops = 2.0 * (heads * s * d * s) as f64;
        measure_with("batched_matmul", dtype, format!("{heads}x{s}x{d}x{s}"), flops, &plain, &|b| {
            product(b, dtype, &[heads, s, d], &[heads, d, s])
        })?;
        let (rows, side) = sizes.skinny;
        let flops = 2.0 * (rows * side * side) as f64;
        measure_with("skinny_matmul", dtype, format!("{rows}x{side}x{side}"), flops, &plain, &|b| {
            product(b, dtype, &[rows, side], &[side, side])
        })?;
        let (batch, c, side) = sizes.conv;
        // Each output element: a sum of c·3·3 products.
        let flops = 2.0 * (batch * c * side * side * c * 9) as f64;
        measure_with("conv2d", dtype, format!("[{batch},{c},{side},{side}]*3x3"), flops, &plain, &|b| {
            let (x, f) = inputs(b, dtype, &[&[batch, c, side, side], &[c, c, 3, 3]]);
            (vec![x[0].conv2d(&x[1], [1, 1], [1, 1], [1, 1], 1).expect("conv2d").id()], f)
        })?;
        // 2×2 windows, stride 2, over n elements: a comparison per element read.
        let pool = [n / (64 * 64 * 64), 64, 64, 64];
        measure_with("max_pool2d", dtype, format!("[{},64,64,64]/2x2", pool[0]), n as f64, &plain, &|b| {
            let (x, f) = inputs(b, dtype, &[&pool]);
            (vec![x[0].max_pool2d([2, 2], [2, 2], [0, 0]).expect("max_pool2d").id()], f)
        })?;
    }
    // A decoder step's product at batch 1 over a weight stored `[n, k]` (PyTorch's and GGUF's
    // layout, read transposed) in each weight format, dequantized as the product loads it:
    // what a step's bytes per weight cost in each format.
    // Beside the kernel's own split, each workgroup given 8, 16 and 32 columns
    // (`CompileOptions::gemv_columns`; not with `--quick`).
    let (_, side) = sizes.skinny;
    let columns: &[Option<usize>] = if args.quick { &[None] } else { &[None, Some(8), Some(16), Some(32)] };
    use DType::*;
    for w in [F32, BF16, Q8_0, Q4_0, Q5_0, IQ4NL, Q2K, Q3K, Q4K, Q5K, Q6K, IQ4XS, MXFP4] {
        for &gemv_columns in columns {
            let flops = 2.0 * (side * side) as f64;
            let name = gemv_columns.map_or("decode_gemv".to_string(), |c| format!("decode_gemv c{c}"));
            let opts = CompileOptions { gemv_columns, ..plain.clone() };
            measure_with(&name, w, format!("1x{side}x{side}"), flops, &opts, &|b| {
                let x = b.input("x1", DType::F32, [1, side]).expect("valid input");
                let wt = b.input("x2", w, [side, side]).expect("valid input");
                let y = x.matmul(&wt.cast(DType::F32).and_then(|t| t.t()).expect("cast")).expect("matmul");
                (vec![y.id()], vec![feed(&x, 1), feed(&wt, 2)])
            })?;
        }
    }
    // Ceilings from this run: a row's "% of copy" is against the copy runs of its own rounds
    // (the same minute of machine load); the summary gives the copy's median over all
    // rounds, and the best matmul throughput.
    if rows.is_empty() {
        return Err(format!("roofline: no kernel family matches --kernels {}", args.kernels.join(",")));
    }
    let ceiling_gbps = ceiling.exe.stats().bytes_moved as f64 / median(&ceiling.ms) / 1e6;
    let ceiling_gflops = rows.iter().filter(|r| r.kernel.starts_with("matmul")).map(|r| r.gflops).fold(0.0, f64::max);
    let mut table = String::new();
    let _ = writeln!(
        table,
        "{:<28} {:<5} {:<16} {:>10} {:>10} {:>8} {:>10} {:>8}",
        "kernel", "dtype", "shape", "ms", "GB/s", "%copy", "GFLOP/s", "%best"
    );
    for r in &rows {
        let _ = writeln!(
            table,
            "{:<28} {:<5} {:<16} {:>10.3} {:>10.2} {:>7.0}% {:>10.2} {:>7.0}%",
            r.kernel,
            r.dtype.name(),
            r.shape,
            r.ms,
            r.gbps,
            100.0 * r.gbps / r.ceiling_gbps,
            r.gflops,
            if r.gflops > 0.0 && ceiling_gflops > 0.0 { 100.0 * r.gflops / ceiling_gflops } else { 0.0 }
        );
    }
    print!("{table}");
    // What the autotuner measured in this run: every candidate tiling's median per class.
    for t in device.tuned().tilings.iter().filter(|t| !t.timings.is_empty()) {
        let each: Vec<String> = t.timings.iter().map(|(c, ms)| format!("{c} {ms:.3}")).collect();
        println!("autotuned {}: {} (ms: {})", t.class, t.tiling, each.join(", "));
    }
    let forms = device.kernel_forms().to_string();
    println!("ceilings (measured in this run): copy {ceiling_gbps:.2} GB/s, matmul {ceiling_gflops:.2} GFLOP/s; adapter {} ({:?}); kernel forms: {forms}", info.name, info.backend);
    // f16 against f32 at the largest product, best kernel of each, and the best f16 kernel
    // on cooperative matrices against f32 where the adapter has them.
    if let Some(&m) = mm.last() {
        let shape = format!("{m}x{m}x{m}");
        let best = |dt: DType| {
            rows.iter()
                .filter(|r| r.kernel.starts_with("matmul") && r.shape == shape && r.dtype == dt)
                .map(|r| r.gflops)
                .fold(0.0, f64::max)
        };
        let (f32_best, f16_best) = (best(DType::F32), best(DType::F16));
        if f32_best > 0.0 && f16_best > 0.0 {
            println!(
                "matmul {shape}: f16 {f16_best:.2} against f32 {f32_best:.2} GFLOP/s ({:.2}x)",
                f16_best / f32_best
            );
        }
        let coop_best = rows
            .iter()
            .filter(|r| r.kernel.starts_with("matmul coop") && r.shape == shape)
            .map(|r| r.gflops)
            .fold(0.0, f64::max);
        if f32_best > 0.0 && coop_best > 0.0 {
            println!(
                "matmul {shape}: f16 on cooperative matrices {coop_best:.2} against f32 {f32_best:.2} GFLOP/s ({:.2}x)",
                coop_best / f32_best
            );
        }
    }
    if let Some(path) = &args.json {
        let json: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "kernel": r.kernel, "shape": r.shape, "dtype": r.dtype.name(), "ms": r.ms,
                    "gflops": r.gflops, "gbps": r.gbps, "ceiling_gbps": r.ceiling_gbps,
                    "ceiling_gflops": ceiling_gflops, "adapter": info.name, "backend": format!("{:?}", info.backend),
                    "kernel_forms": forms,
                })
            })
            .collect();
        write_json(path, &json)?;
    }
    Ok(())
}

/// Writes `value` as pretty JSON to `path` (non-finite numbers, such as a timing that failed,
/// become `null`).
pub fn write_json(path: &str, value: &impl serde::Serialize) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| format!("--json {path}: {e}"))?;
    std::fs::write(path, text + "\n").map_err(|e| format!("--json {path}: {e}"))
}

#[cfg(test)]
mod tests {
    /// A timing that failed (NaN, ±∞) is written as `null`: the file stays strict JSON.
    #[test]
    fn a_failed_timing_is_null_in_strict_json() {
        let path = std::env::temp_dir().join(format!("fusegraph-nan-{}.json", std::process::id()));
        let path = path.to_str().unwrap();
        let rows = vec![serde_json::json!({ "kernel": "copy \"quoted\"", "ms": f64::NAN, "gbps": f64::INFINITY })];
        super::write_json(path, &rows).unwrap();
        let text = std::fs::read_to_string(path).unwrap();
        let back: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
        assert!(back[0]["ms"].is_null() && back[0]["gbps"].is_null(), "{text}");
        assert_eq!(back[0]["kernel"], "copy \"quoted\"");
        std::fs::remove_file(path).unwrap();
    }
}
