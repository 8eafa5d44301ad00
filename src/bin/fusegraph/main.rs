//! The `fusegraph` command-line program.
//!
//! `fusegraph info [--json]` prints the chosen adapter, backend, driver, limits and features.

mod bench;
mod roofline;

use fusegraph::{Device, DeviceOptions};
use std::process::ExitCode;

const USAGE: &str = "usage: fusegraph <command>

commands:
  info [--json]    the adapter fusegraph chooses: backend, driver, limits, features
  bench [--quick] [--workload NAME] [--runs N] [--json PATH] [--plot DIR] [--profile]
        [--fused-attention] [--mixed-precision]
                   compile every workload fused and unfused, check they agree, time them,
                   and print kernels, bytes moved, memory and speedup; --plot writes SVG
                   memory timelines and the fused graphs as DOT; --profile prints each
                   executable's slowest kernels, timed one by one; --fused-attention
                   compiles the fused mode with attention in one kernel (no scores stored);
                   --mixed-precision compiles it with f16 storage and f32 sums (fused and
                   unfused then agree within f16 tolerance); --workload takes the workloads
                   whose names start with NAME, else a micro workload or the transformer
                   at the sizes NAME gives (see ir)
  roofline [--quick] [--json PATH] [--kernels LIST] [--dtype f32|f16] [--runs N]
                   achieved GB/s and GFLOP/s per kernel family (copy, elementwise chain,
                   row reductions, softmax, layer norm, square, batched and skinny
                   matmuls, 3x3 convolution, max pooling) next to ceilings measured in
                   the same run (a streaming copy, the best square matmul)
  dot FILE [--unfused] [--mixed-precision]
                   read a program in fusegraph's text form (a graph, its outputs and its
                   parameter updates); simplify it, combine products of one operand over
                   stacked weights and fuse it, as the runtime compiles it (no device
                   needed); print it as Graphviz DOT with one
                   cluster per kernel; --mixed-precision first rewrites it to store f16,
                   as the compile option of that name does
  explain FILE [--graph] [--mixed-precision]
                   the same graph's fused kernels and every decision behind them: why each
                   producer did or did not join its consumers' kernels, which sibling
                   kernels merged and why others did not, which products were combined
                   (node numbers of the simplified graph, which --graph prints first)
  wgsl FILE [--unfused] [--cpu] [--f16-native] [--mixed-precision] [--no-excess-precision]
       [--out DIR]
                   the same graph's kernels lowered to WGSL (no device needed) for a GPU
                   without subgroups, or a CPU adapter (--cpu), with f16 storage native or
                   packed two to a word, f16 values no other kernel computes kept in f32
                   until stored (as the runtime's default; --no-excess-precision rounds
                   every op); printed, or written to DIR/k000.wgsl, ...
  ir NAME [--quick]
                   a benchmark workload's program in that text form (for dot, explain
                   and wgsl; a training step's with its parameter updates):
                   NAME a prefix of a bench workload's name, or a micro workload's name
                   with other sizes in it (elementwise_chain_16777216,
                   layer_norm_gelu_64x768), or transformer_sSEQ_lLAYERS (any sequence
                   length and depth; its --quick dimensions with --quick)
  help             this text

environment:
  FUSEGRAPH_BACKEND=vulkan|gl|metal|dx12   force a backend
  FUSEGRAPH_AUTOTUNE=off                   default matmul tilings (no timing, reproducible)
  FUSEGRAPH_SUBGROUP_MATMUL=off            the tiled matmul on CPU adapters too (comparisons)
  FUSEGRAPH_COST_MODEL=default             fusion's device-free cost model (no measuring)
  FUSEGRAPH_TILED_ATTENTION=on|off         fused attention stages blocks of keys in workgroup
                                           memory (default: on, off on CPU adapters)
  FUSEGRAPH_SHADER_CHECKS=on|off           wgpu's runtime checks in every kernel (index clamps,
                                           loop counters); off: trusted modules (default: off)
  FUSEGRAPH_SPLIT_K=off|tuned|fill:W|S     split matmuls over k: as timed on this adapter,
                                           until each has W workgroups, or every one into S
                                           slices (default: off)";

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn info(json: bool) -> Result<(), fusegraph::RuntimeError> {
    let device = Device::new(&DeviceOptions::default())?;
    let i = device.info();
    let l = device.limits();
    let limits: Vec<(&str, u64)> = vec![
        ("max_buffer_size", l.max_buffer_size),
        ("max_storage_buffer_binding_size", l.max_storage_buffer_binding_size),
        ("min_storage_buffer_offset_alignment", l.min_storage_buffer_offset_alignment as u64),
        ("max_storage_buffers_per_shader_stage", l.max_storage_buffers_per_shader_stage as u64),
        ("max_compute_workgroups_per_dimension", l.max_compute_workgroups_per_dimension as u64),
        ("max_compute_workgroup_storage_size", l.max_compute_workgroup_storage_size as u64),
        ("max_compute_invocations_per_workgroup", l.max_compute_invocations_per_workgroup as u64),
    ];
    let features: Vec<String> = device.features().iter_names().map(|(n, _)| n.to_string()).collect();
    let f16 = if device.f16_native() { "native f16" } else { "packed in u32" };
    let matmul = match device.cooperative_matrix() {
        Some(fusegraph::crates::runtime::Cooperative::Native) => "f16 on cooperative matrices (16x16x16, f32 sums)",
        Some(fusegraph::crates::runtime::Cooperative::Emulated { .. }) => "f16 on emulated cooperative matrices",
        None => "no cooperative matrices (f32 and f16 on the tiled or subgroup kernels)",
    };
    let attention = if device.tiled_attention() {
        "fused attention stages blocks of keys in workgroup memory"
    } else {
        "fused attention reads one key at a time per row"
    };
    let configs: Vec<String> = device
        .cooperative_matrix_configs()
        .iter()
        .map(|c| format!("{}x{}x{} {:?}->{:?}", c.m_size, c.n_size, c.k_size, c.ab_type, c.cr_type))
        .collect();
    if json {
        let lim: Vec<String> = limits.iter().map(|(k, v)| format!("{}: {v}", json_str(k))).collect();
        let feat: Vec<String> = features.iter().map(|f| json_str(f)).collect();
        println!(
            "{{\"adapter\": {}, \"backend\": {}, \"device_type\": {}, \"driver\": {}, \"driver_info\": {}, \"f16_storage\": {}, \"matmul\": {}, \"attention\": {}, \"shader_checks\": {}, \"cooperative_matrix_configs\": [{}], \"limits\": {{{}}}, \"features\": [{}]}}",
            json_str(&i.name),
            json_str(&format!("{:?}", i.backend)),
            json_str(&format!("{:?}", i.device_type)),
            json_str(&i.driver),
            json_str(&i.driver_info),
            json_str(f16),
            json_str(matmul),
            json_str(attention),
            device.shader_checks(),
            configs.iter().map(|c| json_str(c)).collect::<Vec<_>>().join(", "),
            lim.join(", "),
            feat.join(", ")
        );
    } else {
        println!("adapter      {}", i.name);
        println!("backend      {:?}", i.backend);
        println!("device type  {:?}", i.device_type);
        println!("driver       {} {}", i.driver, i.driver_info);
        println!("f16 storage  {f16}");
        println!("matmul       {matmul}");
        println!("attention    {attention}");
        let checks =
            if device.shader_checks() { "on (wgpu's index clamps and loop counters)" } else { "off (trusted modules)" };
        println!("shader checks {checks}");
        if !configs.is_empty() {
            println!("cooperative matrix configurations: {}", configs.join(", "));
        }
        println!("limits");
        for (k, v) in limits {
            println!("  {k:<40} {v}");
        }
        println!("features enabled: {}", if features.is_empty() { "none".into() } else { features.join(", ") });
    }
    Ok(())
}

/// A program read by [`read_graph`].
struct Read {
    graph: fusegraph::Graph,
    /// Every value a run keeps: the outputs, then the updates' values.
    kept: Vec<fusegraph::NodeId>,
    /// How many of `kept` are outputs.
    outputs: usize,
    /// The names of the parameters the program updates.
    updated: std::collections::BTreeSet<String>,
}

impl Read {
    /// The updates' values (written over their parameters: see `fuse_updating`).
    fn update_values(&self) -> &[fusegraph::NodeId] {
        &self.kept[self.outputs..]
    }
}

/// The program in fusegraph's text form at the first non-flag argument of `args`: its graph,
/// every value a run keeps (its outputs, the nodes nothing uses where it names none, then its
/// updates' values, as a compile with `CompileOptions::updates` stores them) and the names of
/// the parameters it updates; rewritten to store f16 with `--mixed-precision` (updated
/// parameters kept in f32, as the compile option does). `cmd` names the command in errors.
fn read_graph(cmd: &str, args: &[String]) -> Result<Read, String> {
    let path =
        args.iter().find(|a| !a.starts_with("--")).ok_or(format!("{cmd}: give a FILE in fusegraph's text form"))?;
    let text = std::fs::read_to_string(path).map_err(|e| format!("{cmd}: cannot read {path}: {e}"))?;
    let p = fusegraph::text::parse_program(&text).map_err(|e| format!("{cmd}: {path}: {e}"))?;
    let mut read = Read {
        kept: p.kept(),
        outputs: p.outputs.len(),
        updated: p.updates.into_iter().map(|(n, _)| n).collect(),
        graph: p.graph,
    };
    if args.iter().any(|a| a == "--mixed-precision") {
        let updates = read.update_values().to_vec();
        (read.graph, read.kept) = fusegraph::crates::passes::mixed_precision::to_mixed_precision_updating(
            &read.graph,
            &read.kept,
            &read.updated,
            &updates,
        )
        .map_err(|e| format!("{cmd}: {path}: {e}"))?;
    }
    Ok(read)
}

/// Writes `text` to stdout; a reader that stopped early (`| head`) is not an error.
fn emit(text: &str) -> Result<(), String> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("cannot write to stdout: {e}")),
        _ => Ok(()),
    }
}

/// Fusion as `dot`, `wgsl` and `explain` run it: no device, so a binding limit of 32.
fn fusion_options() -> fusegraph::crates::passes::FusionOptions {
    fusegraph::crates::passes::FusionOptions { max_bindings: 32, ..Default::default() }
}

/// The graph in fusegraph's text form at the first non-flag argument of `args`, simplified and
/// fused (partitioned one op per kernel with `--unfused`), and its kernels; `cmd` names the
/// command in errors.
fn read_kernels(
    cmd: &str,
    args: &[String],
) -> Result<(fusegraph::Graph, Vec<fusegraph::crates::passes::Kernel>), String> {
    use fusegraph::crates::passes::{partition, FusionMode};
    let mut read = read_graph(cmd, args)?;
    let kernels = if args.iter().any(|a| a == "--unfused") {
        partition(&read.graph, &read.kept, FusionMode::Off).map_err(|e| e.to_string())?
    } else {
        prepare(&mut read)?;
        fused(&read)?.kernels
    };
    Ok((read.graph, kernels))
}

/// Simplifies the program and combines its sibling products as the runtime's default compile
/// does (the products of updated parameters are not combined); returns the groups combined.
fn prepare(read: &mut Read) -> Result<Vec<fusegraph::crates::passes::Combined>, String> {
    use fusegraph::crates::passes::{combine_products, simplify};
    simplify(&mut read.graph, &mut read.kept).map_err(|e| e.to_string())?;
    combine_products(&mut read.graph, &read.kept, &read.updated).map_err(|e| e.to_string())
}

/// The program fused as the runtime fuses it (updates written in place).
fn fused(read: &Read) -> Result<fusegraph::crates::passes::Fusion, String> {
    fusegraph::crates::passes::fuse_updating(&read.graph, &read.kept, read.update_values(), &fusion_options())
        .map_err(|e| e.to_string())
}

/// `fusegraph explain FILE [--graph]`: the fused kernels and every decision of the fusion
/// pass behind them (why each producer did or did not join its consumers' kernels, and each
/// pair of sibling kernels considered once, with its verdict), by node number in the
/// simplified graph (`--graph` prints it first).
fn explain(args: &[String]) -> Result<(), String> {
    use fusegraph::crates::passes::KernelKind;
    use std::fmt::Write as _;
    if let Some(f) = args.iter().find(|a| a.starts_with("--") && *a != "--graph" && *a != "--mixed-precision") {
        return Err(format!("explain: unknown option `{f}`"));
    }
    let mut read = read_graph("explain", args)?;
    let combined = prepare(&mut read)?;
    let f = fused(&read)?;
    let g = &read.graph;
    let mut o = String::new();
    if args.iter().any(|a| a == "--graph") {
        o.push_str(&fusegraph::text::print(g));
        o.push('\n');
    }
    // Named as the printed graph numbers them (positions in topological order, not ids).
    let numbers = fusegraph::text::numbers(g);
    let name = |n: &fusegraph::NodeId| format!("%{} {}", numbers[n], g.node(*n).op.name());
    let list = |ns: &[fusegraph::NodeId]| ns.iter().map(name).collect::<Vec<_>>().join(", ");
    for c in &combined {
        let biases = c.biases.as_ref().map(|b| format!(" (and its epilogue's {})", b.name)).unwrap_or_default();
        _ = writeln!(
            o,
            "combined {} products of one operand into {} over the stacked {}{biases}",
            c.products.len(),
            name(&c.product),
            c.weights.name
        );
    }
    _ = writeln!(o, "{} kernels:", f.kernels.len());
    for (i, k) in f.kernels.iter().enumerate() {
        let kind = match &k.kind {
            KernelKind::Loop => "loop".to_string(),
            KernelKind::Row { shape, axes } => format!("rows of {shape:?} over axes {axes:?}"),
            KernelKind::Attention { .. } => "attention".to_string(),
        };
        _ = writeln!(o, "  kernel {i} ({kind}): {}; stores {}", list(&k.members), list(&k.outputs));
    }
    _ = writeln!(o, "producers, from the outputs back:");
    for d in &f.log {
        match &d.veto {
            None => _ = writeln!(o, "  {}: fused into its consumers' kernels", name(&d.producer)),
            Some(v) => _ = writeln!(o, "  {}: not fused: {v}", name(&d.producer)),
        }
    }
    // The sibling phase repeats its passes until nothing merges: each verdict once.
    let mut seen = std::collections::BTreeSet::new();
    _ = writeln!(o, "sibling kernels (by root, the member last in graph order):");
    for d in f.siblings.iter().filter(|d| seen.insert((d.a, d.b, d.veto.clone().map(|v| v.to_string())))) {
        match &d.veto {
            None => _ = writeln!(o, "  {} and {}: merged", name(&d.a), name(&d.b)),
            Some(v) => _ = writeln!(o, "  {} and {}: not merged: {v}", name(&d.a), name(&d.b)),
        }
    }
    emit(&o)
}

fn dot(args: &[String]) -> Result<(), String> {
    let (g, kernels) = read_kernels("dot", args)?;
    let clusters: Vec<Vec<fusegraph::NodeId>> = kernels.iter().map(|k| k.members.clone()).collect();
    emit(&fusegraph::dot::to_dot(&g, &clusters))?;
    eprintln!("{} kernels", kernels.len());
    Ok(())
}

/// `fusegraph wgsl FILE [--unfused] [--cpu] [--f16-native] [--no-excess-precision] [--out
/// DIR]`: every kernel's WGSL as lowered for an adapter of that kind (a GPU without subgroups
/// unless `--cpu`), with excess precision as the runtime's default compile (f16 values no
/// other kernel computes kept in f32 until stored) unless `--no-excess-precision`, no device
/// needed; printed, or written to `DIR/k000.wgsl`, … (`FUSEGRAPH_DUMP_WGSL`'s names).
fn wgsl(args: &[String]) -> Result<(), String> {
    use fusegraph::crates::passes::kernel::unshared_members;
    use fusegraph::crates::wgsl::{lower_planned, LowerOptions, Strategy};
    let flag = |f: &str| args.iter().any(|a| a == f);
    // `--out DIR` taken out; every other flag known.
    let (mut out, mut rest) = (None, Vec::new());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => out = Some(it.next().ok_or("wgsl: --out needs a DIR")?.clone()),
            "--unfused" | "--cpu" | "--f16-native" | "--mixed-precision" | "--no-excess-precision" => {
                rest.push(a.clone())
            }
            f if f.starts_with("--") => return Err(format!("wgsl: unknown option `{f}`")),
            _ => rest.push(a.clone()),
        }
    }
    let (g, kernels) = read_kernels("wgsl", &rest)?;
    let opts = LowerOptions { cpu: flag("--cpu"), f16_native: flag("--f16-native"), ..Default::default() };
    if let Some(dir) = &out {
        std::fs::create_dir_all(dir).map_err(|e| format!("wgsl: cannot create {dir}: {e}"))?;
    }
    let unshared =
        if flag("--no-excess-precision") { vec![Vec::new(); kernels.len()] } else { unshared_members(&kernels) };
    for (i, (k, unshared)) in kernels.iter().zip(&unshared).enumerate() {
        let src = lower_planned(&g, k, unshared, &opts, &Strategy::default()).annotated();
        match &out {
            Some(dir) => {
                let path = format!("{dir}/k{i:03}.wgsl");
                std::fs::write(&path, src).map_err(|e| format!("wgsl: cannot write {path}: {e}"))?;
            }
            None => emit(&format!("{src}\n"))?,
        }
    }
    eprintln!("{} kernels", kernels.len());
    Ok(())
}

/// `fusegraph ir NAME [--quick]`: the workload's program (graph, outputs, updates) in text
/// form (see `USAGE`).
fn ir(args: &[String]) -> Result<(), String> {
    use fusegraph::workloads;
    let quick = args.iter().any(|a| a == "--quick");
    if let Some(f) = args.iter().find(|a| a.starts_with("--") && *a != "--quick") {
        return Err(format!("ir: unknown option `{f}`"));
    }
    let name = args.iter().find(|a| !a.starts_with("--")).ok_or("ir: give a workload NAME")?;
    let w = workloads::select(Some(name), quick)
        .into_iter()
        .next()
        .ok_or_else(|| format!("ir: no workload matches `{name}` (have: {})", workloads::names(quick).join(", ")))?;
    let program = fusegraph::text::Program { graph: w.graph, outputs: w.outputs, updates: w.updates };
    emit(&fusegraph::text::print_program(&program))?;
    eprintln!("{}: {} nodes", w.name, program.graph.node_ids().len());
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("info") => info(args.iter().any(|a| a == "--json")),
        Some("bench") => match bench::BenchArgs::parse(&args[1..]).and_then(|a| bench::run(&a)) {
            Ok(()) => Ok(()),
            Err(e) => {
                eprintln!("fusegraph: {e}");
                return ExitCode::FAILURE;
            }
        },
        Some("roofline") => match roofline::RooflineArgs::parse(&args[1..]).and_then(|a| roofline::run(&a)) {
            Ok(()) => Ok(()),
            Err(e) => {
                eprintln!("fusegraph: {e}");
                return ExitCode::FAILURE;
            }
        },
        Some(cmd @ ("dot" | "wgsl" | "ir" | "explain")) => {
            let run = match cmd {
                "dot" => dot,
                "wgsl" => wgsl,
                "explain" => explain,
                _ => ir,
            };
            match run(&args[1..]) {
                Ok(()) => Ok(()),
                Err(e) => {
                    eprintln!("fusegraph: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        Some("help") | Some("--help") | Some("-h") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => {
            eprintln!("fusegraph: unknown command `{other}`\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fusegraph: {e}");
            ExitCode::FAILURE
        }
    }
}
