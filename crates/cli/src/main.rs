//! The `fusegraph` command-line program.
//!
//! `fusegraph info [--json]` prints the chosen adapter, backend, driver, limits and features.

mod bench;
mod generate;
mod roofline;
mod run;
mod vocab;

use clap::{Parser, Subcommand};
use fusegraph::crates::wgsl::{Forms, LowerOptions, CPU_LOOP_BUDGET};
use fusegraph::{Device, DeviceOptions};
use std::process::ExitCode;

/// Records tensor graphs, fuses and plans them like XLA, runs them as WGSL on wgpu.
#[derive(Parser)]
#[command(name = "fusegraph", after_help = ENVIRONMENT)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

const ENVIRONMENT: &str = "environment (fusegraph_runtime::env):
  FUSEGRAPH_BACKEND=vulkan|gl|metal|dx12   force a backend
  FUSEGRAPH_AUTOTUNE=off|on                off: measure nothing on the adapter (default
                                           tilings, device-free cost model: reproducible)
  FUSEGRAPH_SHADER_CHECKS=on|off           wgpu's runtime checks in every kernel (default off)
  FUSEGRAPH_DUMP_WGSL=DIR                  write every compiled kernel's WGSL to DIR
  FUSEGRAPH_GPU_KERNELS=on                 lower a GPU's kernel forms on any adapter (lavapipe)";

#[derive(Subcommand)]
enum Command {
    /// The adapter fusegraph chooses: backend, driver, limits, features.
    Info {
        /// As one JSON object.
        #[arg(long)]
        json: bool,
    },
    Bench(bench::BenchArgs),
    Roofline(roofline::RooflineArgs),
    Generate(generate::GenerateArgs),
    Run(run::RunArgs),
    /// A program in fusegraph's text form (a graph, its outputs and its parameter updates),
    /// or an ONNX model (`.onnx`, named dimensions of size 1), simplified, its products of one
    /// operand combined and fused as the runtime compiles it for a GPU with native f16 (or,
    /// with `--cpu`, a CPU adapter; no device needed), as Graphviz DOT with one cluster per
    /// kernel.
    Dot {
        /// The program.
        file: String,
        #[command(flatten)]
        form: Form,
    },
    /// The same program's fused kernels and every decision behind them: why each producer did
    /// or did not join its consumers' kernels, which sibling kernels merged, which products
    /// were combined (node numbers of the simplified graph).
    Explain {
        /// The program.
        file: String,
        /// Print the simplified graph first.
        #[arg(long)]
        graph: bool,
        /// Rewrite it to store f16 first, as the compile option does.
        #[arg(long)]
        mixed_precision: bool,
        /// Fuse as for a CPU adapter (the serial forms: no matrix–vector kernel).
        #[arg(long)]
        cpu: bool,
    },
    /// The same program's kernels lowered to WGSL (no device needed) for a GPU without
    /// subgroups, or a CPU adapter; printed, or written to DIR/k000.wgsl, ...
    Wgsl {
        /// The program.
        file: String,
        #[command(flatten)]
        form: Form,
        /// Native f16 storage (else two f16 packed in a u32, where products of a few rows
        /// take the tiled kernel, as the runtime's).
        #[arg(long)]
        f16_native: bool,
        /// Round every f16 op (the runtime's default compile keeps f16 values no other
        /// kernel computes in f32 until stored).
        #[arg(long)]
        no_excess_precision: bool,
        /// Write the kernels to DIR instead of printing them.
        #[arg(long, value_name = "DIR")]
        out: Option<String>,
    },
    /// A benchmark workload's program in the text form (for dot, explain and wgsl; a training
    /// step's with its parameter updates): a prefix of a bench workload's name, or a micro
    /// workload's name with other sizes in it (elementwise_chain_16777216,
    /// layer_norm_gelu_64x768), or transformer_sSEQ_lLAYERS.
    Ir {
        /// The workload.
        name: String,
        /// Its --quick dimensions.
        #[arg(long)]
        quick: bool,
    },
}

/// How `dot` and `wgsl` partition the program.
#[derive(clap::Args)]
struct Form {
    /// One kernel per op, no simplification.
    #[arg(long)]
    unfused: bool,
    /// Rewrite it to store f16 first, as the compile option does.
    #[arg(long)]
    mixed_precision: bool,
    /// For a CPU adapter: the serial forms (within Mesa's loop budget for `wgsl`), its split
    /// rule, no matrix–vector kernel.
    #[arg(long)]
    cpu: bool,
}

/// What the device-free commands fuse for, as a compile on such an adapter does: a CPU
/// adapter's serial forms and split rule, or a GPU's parallel ones, where products of a few
/// rows take the matrix–vector kernel (with native f16, as the runtime's rule has it),
/// within WebGPU's default workgroup memory.
#[derive(Clone, Copy)]
struct Target {
    cpu: bool,
    gemv: bool,
}

impl Target {
    fn new(cpu: bool, f16_native: bool) -> Target {
        Target { cpu, gemv: !cpu && f16_native }
    }
}

fn info(json: bool) -> Result<(), fusegraph::RuntimeError> {
    let device = std::sync::Arc::new(Device::new(&DeviceOptions::default())?);
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
    // The forms this adapter's kernels take (measured where autotuning is on).
    let forms = device.kernel_forms();
    let attention = if forms.tiled_attention {
        "fused attention stages blocks of keys in workgroup memory"
    } else {
        "fused attention reads one key at a time per row"
    };
    let measured = if device.autotune() { "measured" } else { "the adapter's defaults" };
    let kernel_forms = format!("{forms} ({measured})");
    let configs: Vec<String> = device
        .cooperative_matrix_configs()
        .iter()
        .map(|c| format!("{}x{}x{} {:?}->{:?}", c.m_size, c.n_size, c.k_size, c.ab_type, c.cr_type))
        .collect();
    if json {
        let info = serde_json::json!({
            "adapter": i.name, "backend": format!("{:?}", i.backend),
            "device_type": format!("{:?}", i.device_type), "driver": i.driver, "driver_info": i.driver_info,
            "f16_storage": f16, "matmul": matmul, "attention": attention, "kernel_forms": kernel_forms,
            "shader_checks": device.shader_checks(), "cooperative_matrix_configs": configs,
            "limits": limits.iter().map(|(k, v)| (k.to_string(), *v)).collect::<std::collections::BTreeMap<_, _>>(),
            "features": features,
        });
        println!("{info}");
    } else {
        println!("adapter      {}", i.name);
        println!("backend      {:?}", i.backend);
        println!("device type  {:?}", i.device_type);
        println!("driver       {} {}", i.driver, i.driver_info);
        println!("f16 storage  {f16}");
        println!("matmul       {matmul}");
        println!("attention    {attention}");
        println!("kernel forms {kernel_forms}");
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
    /// The parameter each update value (`kept` after the outputs) is written to, in order.
    update_names: Vec<String>,
}

impl Read {
    /// The updates' values (written over their parameters: see `fuse_updating`).
    fn update_values(&self) -> &[fusegraph::NodeId] {
        &self.kept[self.outputs..]
    }
}

/// The program in fusegraph's text form at `path`: its graph,
/// every value a run keeps (its outputs, the nodes nothing uses where it names none, then its
/// updates' values, as a compile with `CompileOptions::updates` stores them) and the names of
/// the parameters it updates; rewritten to store f16 with `--mixed-precision` (updated
/// parameters kept in f32, as the compile option does). `cmd` names the command in errors.
fn read_graph(cmd: &str, path: &str, mixed_precision: bool) -> Result<Read, String> {
    let mut read = if path.ends_with(".onnx") {
        read_onnx(path).map_err(|e| format!("{cmd}: {path}: {e}"))?
    } else {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{cmd}: cannot read {path}: {e}"))?;
        let p = fusegraph::text::parse_program(&text).map_err(|e| format!("{cmd}: {path}: {e}"))?;
        Read {
            kept: p.kept(),
            outputs: p.outputs.len(),
            updated: p.updates.iter().map(|(n, _)| n.clone()).collect(),
            update_names: p.updates.into_iter().map(|(n, _)| n).collect(),
            graph: p.graph,
        }
    };
    if mixed_precision {
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

/// An ONNX model's graph, imported with every named dimension (a batch) of size 1.
fn read_onnx(path: &str) -> Result<Read, String> {
    use fusegraph::onnx::{Dim, OnnxModel};
    let model = OnnxModel::open(std::path::Path::new(path)).map_err(|e| e.to_string())?;
    let shapes = model
        .inputs()
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|i| (i.name, i.dims.iter().map(|d| if let Dim::Fixed(n) = d { *n } else { 1 }).collect()))
        .collect();
    let b = fusegraph::GraphBuilder::new();
    let imported = model.import(&b, &shapes).map_err(|e| e.to_string())?;
    let kept: Vec<fusegraph::NodeId> = imported.outputs.iter().map(|(_, t)| t.id()).collect();
    Ok(Read { outputs: kept.len(), kept, updated: Default::default(), update_names: Vec::new(), graph: b.graph() })
}

/// Writes `text` to stdout; a reader that stopped early (`| head`) is not an error.
fn emit(text: &str) -> Result<(), String> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("cannot write to stdout: {e}")),
        _ => Ok(()),
    }
}

/// Fusion as `dot`, `wgsl` and `explain` run it for `target`: no device, so a binding limit
/// of 32.
fn fusion_options(target: Target) -> fusegraph::crates::passes::FusionOptions {
    fusegraph::crates::passes::FusionOptions { max_bindings: 32, gemv: target.gemv, ..Default::default() }
}

/// The graph in fusegraph's text form at `path`, rewritten and fused as the runtime compiles
/// it for `target` (partitioned one op per kernel with `--unfused`), and its kernels; `cmd`
/// names the command in errors.
fn read_kernels(
    cmd: &str,
    path: &str,
    form: &Form,
    target: Target,
) -> Result<(fusegraph::Graph, Vec<fusegraph::crates::passes::Kernel>), String> {
    use fusegraph::crates::passes::{partition, FusionMode};
    let mut read = read_graph(cmd, path, form.mixed_precision)?;
    let kernels = if form.unfused {
        partition(&read.graph, &read.kept, FusionMode::Off).map_err(|e| e.to_string())?
    } else {
        prepare(&mut read, target)?;
        fused(&read, target)?.kernels
    };
    Ok((read.graph, kernels))
}

/// Rewrites the program (simplification, split reductions by `target`'s rule) and combines
/// its sibling products as the runtime's default compile does (the products of updated
/// parameters are not combined, nor, with the matrix–vector kernel, those of a few rows);
/// returns the groups combined.
fn prepare(read: &mut Read, target: Target) -> Result<Vec<fusegraph::crates::passes::Combined>, String> {
    use fusegraph::crates::passes::combine_sibling_products;
    use fusegraph::crates::passes::rewrite::{rewrite, Rewrites};
    use fusegraph::ReduceFill;
    let fill = if target.cpu { ReduceFill::CPU } else { ReduceFill::GPU };
    let rewrites = Rewrites { simplify: true, split_k: None, split_reductions: Some(fill) };
    rewrite(&mut read.graph, &mut read.kept, &rewrites, &|_, _| true).map_err(|e| e.to_string())?;
    combine_sibling_products(&mut read.graph, &read.kept, &read.updated, target.gemv).map_err(|e| e.to_string())
}

/// The program fused as the runtime fuses it for `target` (updates written in place, window
/// kernels folded into the kernels reading them).
fn fused(read: &Read, target: Target) -> Result<fusegraph::crates::passes::Fusion, String> {
    use fusegraph::crates::passes::{fold_windows, fuse_updating, planner::update_pairs};
    let opts = fusion_options(target);
    let mut f = fuse_updating(&read.graph, &read.kept, read.update_values(), &opts).map_err(|e| e.to_string())?;
    let named: Vec<(String, usize)> = read.update_names.iter().cloned().zip(read.outputs..).collect();
    let updates = update_pairs(&read.graph, &read.kept, &named).map_err(|e| e.to_string())?;
    f.kernels = fold_windows(&read.graph, f.kernels, &read.kept, &updates, (opts.max_bindings, opts.gemv));
    Ok(f)
}

/// `fusegraph explain FILE [--graph] [--cpu]`: the fused kernels (for a GPU with native f16,
/// or a CPU adapter) and every decision of the fusion pass behind them (why each producer did
/// or did not join its consumers' kernels, and each pair of sibling kernels considered once,
/// with its verdict), by node number in the simplified graph (`--graph` prints it first).
fn explain(path: &str, graph: bool, mixed_precision: bool, target: Target) -> Result<(), String> {
    use fusegraph::crates::passes::KernelKind;
    use std::fmt::Write as _;
    let mut read = read_graph("explain", path, mixed_precision)?;
    let combined = prepare(&mut read, target)?;
    let f = fused(&read, target)?;
    let g = &read.graph;
    let mut o = String::new();
    if graph {
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
        let sides = fusegraph::crates::passes::side_windows(g, k);
        let sides = if sides.is_empty() { String::new() } else { format!(" (side windows: {})", list(&sides)) };
        _ = writeln!(o, "  kernel {i} ({kind}): {}; stores {}{sides}", list(&k.members), list(&k.outputs));
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

fn dot(path: &str, form: &Form) -> Result<(), String> {
    let (g, kernels) = read_kernels("dot", path, form, Target::new(form.cpu, true))?;
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
fn wgsl(path: &str, form: &Form, opts: LowerOptions, excess_precision: bool, out: Option<&str>) -> Result<(), String> {
    use fusegraph::crates::passes::kernel::unshared_members;
    use fusegraph::crates::wgsl::{lower_planned, Strategy};
    let (g, kernels) = read_kernels("wgsl", path, form, Target::new(form.cpu, opts.f16_native))?;
    if let Some(dir) = out {
        std::fs::create_dir_all(dir).map_err(|e| format!("wgsl: cannot create {dir}: {e}"))?;
    }
    let unshared = if excess_precision { unshared_members(&kernels) } else { vec![Vec::new(); kernels.len()] };
    for (i, (k, unshared)) in kernels.iter().zip(&unshared).enumerate() {
        let src = lower_planned(&g, k, unshared, &opts, &Strategy::default()).annotated();
        match out {
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
fn ir(name: &str, quick: bool) -> Result<(), String> {
    use fusegraph_workloads as workloads;
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
    let cli = Cli::parse();
    fusegraph::init_logging();
    let result = match cli.command {
        Command::Info { json } => info(json).map_err(|e| e.to_string()),
        Command::Bench(a) => bench::run(&a),
        Command::Roofline(a) => roofline::run(&a),
        Command::Generate(a) => generate::run(&a),
        Command::Run(a) => run::run(&a),
        Command::Dot { file, form } => dot(&file, &form),
        Command::Explain { file, graph, mixed_precision, cpu } => {
            explain(&file, graph, mixed_precision, Target::new(cpu, true))
        }
        Command::Wgsl { file, form, f16_native, no_excess_precision, out } => {
            let opts = match form.cpu {
                true => LowerOptions {
                    forms: Forms::SERIAL,
                    loop_budget: Some(CPU_LOOP_BUDGET),
                    f16_native,
                    ..Default::default()
                },
                false => LowerOptions { f16_native, ..Default::default() },
            };
            wgsl(&file, &form, opts, !no_excess_precision, out.as_deref())
        }
        Command::Ir { name, quick } => ir(&name, quick),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fusegraph: {e}");
            ExitCode::FAILURE
        }
    }
}
