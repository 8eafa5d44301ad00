//! `fusegraph bench`: every workload compiled fused and unfused, checked equal, timed.

use fusegraph::crates::reference::assert_close;
use fusegraph::crates::runtime::Timing;
use fusegraph::{CompileOptions, Device, Executable, RuntimeError, SplitK};
use fusegraph_workloads::{self as workloads, Workload};
use std::fmt::Write as _;
use std::sync::Arc;

/// Compile every workload fused and unfused, check they agree, time them, and print
/// kernels, bytes moved, memory and speedup.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Small sizes.
    #[arg(long)]
    pub quick: bool,
    /// The workloads whose names start with NAME, else a micro workload or the transformer at
    /// the sizes NAME gives (see `fusegraph ir`).
    #[arg(long, value_name = "NAME")]
    pub workload: Option<String>,
    /// Write every row as JSON to PATH.
    #[arg(long, value_name = "PATH")]
    pub json: Option<String>,
    /// Write SVG memory timelines and the fused graphs as DOT to DIR.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<String>,
    /// Timed runs per mode (default 20, 5 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    runs: Option<u32>,
    /// Print each workload's slowest kernels (fused and unfused) after its timing.
    #[arg(long)]
    pub profile: bool,
    /// Compile the fused mode with `CompileOptions::fused_attention` on (attention's
    /// `softmax(q·kᵀ)·v` in one kernel, as under a tight memory limit).
    #[arg(long)]
    pub fused_attention: bool,
    /// Compile the fused mode with f16 storage and f32 sums, and the training steps with the
    /// `train` example's mixed precision (loss scaling, f32 master weights); fused and unfused
    /// are then compared within f16 tolerance.
    #[arg(long)]
    pub mixed_precision: bool,
    /// Split matmuls over k in the fused mode: off, tuned (as timed on this adapter), fill:W
    /// (until each has W workgroups) or S (every one into S slices).
    #[arg(long, value_name = "CHOICE", value_parser = parse_split_k, default_value = "off")]
    pub split_k: SplitK,
}

fn parse_split_k(v: &str) -> Result<SplitK, String> {
    SplitK::parse(v).ok_or(format!("`{v}`: off, tuned, fill:W or a slice count S"))
}

impl BenchArgs {
    /// Timed runs per mode.
    pub fn runs(&self) -> usize {
        self.runs.map_or(if self.quick { 5 } else { 20 }, |r| r as usize)
    }
}

/// One measured line of the table.
pub struct Record {
    pub workload: String,
    pub mode: &'static str,
    /// Kernels a run dispatches (hoisted ones left out).
    pub kernels: usize,
    /// Bytes those kernels move.
    pub bytes_moved: u64,
    pub naive_bytes: u64,
    pub peak_bytes: u64,
    pub lower_bound_bytes: u64,
    pub median_ms: f64,
    pub p10_ms: f64,
    pub p90_ms: f64,
    pub timer: &'static str,
}

/// Fused against unfused from runs timed in turn: `unfused[i] / fused[i]` for each round `i`,
/// summarised by its median and 10th/90th percentiles (nearest rank). A ratio within one
/// round compares the two modes under the same minute of machine load; the ratio of the two
/// medians would mix a fast phase of one with a slow phase of the other.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Speedup {
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
}

impl Speedup {
    /// The per-round ratios of `unfused` over `fused` (the same number of rounds, at least
    /// one, every time positive).
    pub fn paired(unfused: &[f64], fused: &[f64]) -> Result<Speedup, String> {
        if unfused.len() != fused.len() || fused.is_empty() {
            return Err(format!(
                "speedup: {} unfused and {} fused runs, need the same number (> 0)",
                unfused.len(),
                fused.len()
            ));
        }
        if let Some(t) = unfused.iter().chain(fused).find(|t| !(t.is_finite() && **t > 0.0)) {
            return Err(format!("speedup: run time {t} ms is not a positive number"));
        }
        let ratios = Timing { ms: unfused.iter().zip(fused).map(|(u, f)| u / f).collect(), gpu_timestamps: false };
        Ok(Speedup { median: ratios.median(), p10: ratios.quantile(0.1), p90: ratios.quantile(0.9) })
    }
}

fn compile(device: &Arc<Device>, w: &Workload, opts: &CompileOptions) -> Result<Executable, RuntimeError> {
    let mut exe = device.compile(&w.graph, &w.outputs, &w.options(opts.clone()))?;
    for (name, value) in &w.params {
        exe.set_parameter(name, value)?;
    }
    Ok(exe)
}

/// Times `fused` and `unfused` in turn, one sample of each per round after two warm-up runs
/// of each, so that both see the same minutes of a machine whose speed drifts (a shared VM
/// here swung 2× within minutes; timed one after the other, a ratio caught the drift
/// instead). A sample is one run on a CPU adapter; on a GPU (`gpu`), runs back to back in one
/// submission, as many as fill about 4 ms ([`crate::roofline::runs_per_sample`]): a short
/// step submitted alone after a wait runs far below its speed in a stream of steps.
fn time_in_turn(
    w: &Workload,
    fused: &Executable,
    unfused: &Executable,
    runs: usize,
    gpu: bool,
) -> Result<[Timing; 2], String> {
    let feeds = w.feed_refs();
    let mut out = [Timing { ms: Vec::new(), gpu_timestamps: false }, Timing { ms: Vec::new(), gpu_timestamps: false }];
    let mut per_sample = [1usize; 2];
    for round in 0..=runs {
        for ((exe, t), n) in [fused, unfused].into_iter().zip(out.iter_mut()).zip(per_sample.iter_mut()) {
            let one = match round {
                0 => exe.time(&feeds, 2, 1),
                _ => exe.time_back_to_back(&feeds, 0, 1, *n),
            }
            .map_err(|e| e.to_string())?;
            if round == 0 && gpu {
                *n = crate::roofline::runs_per_sample(one.median());
            }
            if round > 0 {
                t.ms.extend(one.ms);
            }
            t.gpu_timestamps = one.gpu_timestamps;
        }
    }
    Ok(out)
}

fn measure(w: &Workload, mode: &'static str, exe: &Executable, t: Timing) -> Result<Record, String> {
    let plan = exe.memory_plan();
    let s = exe.stats();
    Ok(Record {
        workload: w.name.clone(),
        mode,
        // What a run dispatches: the hoisted kernels run only after a parameter is set.
        kernels: s.kernels.len() - s.prepared_kernels,
        bytes_moved: s.kernels[s.prepared_kernels..].iter().map(|k| k.bytes_moved).sum(),
        naive_bytes: plan.naive_bytes + s.persistent_bytes + s.staging_bytes,
        peak_bytes: s.arena_bytes + s.persistent_bytes + s.staging_bytes,
        lower_bound_bytes: plan.lower_bound_bytes + s.persistent_bytes + s.staging_bytes,
        median_ms: t.median(),
        p10_ms: t.quantile(0.1),
        p90_ms: t.quantile(0.9),
        timer: if t.gpu_timestamps { "gpu" } else { "wall" },
    })
}

fn mib(b: u64) -> String {
    format!("{:.2}", b as f64 / (1024.0 * 1024.0))
}

/// Writes the memory timelines of both plans as SVG and the fused graph as DOT (and SVG when
/// Graphviz's `dot` is installed).
fn plot(dir: &str, w: &Workload, fused: &Executable, unfused: &Executable) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("--plot {dir}: {e}"))?;
    for (mode, exe) in [("fused", fused), ("unfused", unfused)] {
        let svg =
            fusegraph_workloads::plot::memory_timeline_svg(exe.memory_plan(), &format!("{} ({mode})", w.name), None);
        let path = format!("{dir}/{}_{mode}_memory.svg", w.name);
        std::fs::write(&path, svg).map_err(|e| format!("{path}: {e}"))?;
    }
    let dot_path = format!("{dir}/{}_fused.dot", w.name);
    std::fs::write(&dot_path, fused.to_dot()).map_err(|e| format!("{dot_path}: {e}"))?;
    let svg_path = format!("{dir}/{}_fused_graph.svg", w.name);
    let rendered = std::process::Command::new("dot")
        .args(["-Tsvg", &dot_path, "-o", &svg_path])
        .status()
        .is_ok_and(|s| s.success());
    if !rendered {
        eprintln!("(Graphviz `dot` not found: wrote {dot_path} only)");
    }
    Ok(())
}

/// The slowest kernels of one executable: time, share of the profiled total, label.
fn profile_table(w: &Workload, mode: &str, exe: &Executable, runs: usize) -> Result<String, String> {
    let p = exe.profile(&w.feed_refs(), 1, runs.clamp(1, 5)).map_err(|e| e.to_string())?;
    let total = p.total_ms();
    let timer = if p.gpu_timestamps { "GPU timestamps per kernel" } else { "wall time per kernel" };
    let mut out = format!("{} {mode}: {} kernels, {total:.3} ms in all ({timer}); slowest:\n", w.name, p.kernels.len());
    for k in p.slowest(12) {
        let mut label = k.label.clone();
        if label.len() > 90 {
            label.truncate(87);
            label.push_str("...");
        }
        let _ =
            writeln!(out, "  #{:<4} {:>10.3} ms {:>5.1}%  {label}", k.index, k.median_ms, 100.0 * k.median_ms / total);
    }
    Ok(out)
}

pub fn run(args: &BenchArgs) -> Result<(), String> {
    let device = Device::shared().map_err(|e| e.to_string())?;
    let info = device.info().clone();
    eprintln!("device: {}", device.describe());
    let selected: Vec<Workload> = workloads::select_with(args.workload.as_deref(), args.quick, args.mixed_precision);
    if selected.is_empty() {
        return Err(format!(
            "bench: no workload matches `{}` (have: {})",
            args.workload.clone().unwrap_or_default(),
            workloads::names(args.quick).join(", ")
        ));
    }
    let mut records = Vec::new();
    // Drawn on a terminal only (indicatif hides itself elsewhere).
    let bar = indicatif::ProgressBar::new(selected.len() as u64)
        .with_style(indicatif::ProgressStyle::with_template("{pos}/{len} {wide_msg}").expect("a valid template"));
    for w in &selected {
        bar.set_message(format!("{}: compiling fused and unfused", w.name));
        // A training step's mixed precision is in its graph (`select_with`: loss scaling,
        // f32 master weights); the other workloads take the compile option.
        let fused_opts = CompileOptions {
            fused_attention: match args.fused_attention {
                true => fusegraph::FusedAttention::Always,
                false => fusegraph::FusedAttention::OverLimit,
            },
            mixed_precision: args.mixed_precision && w.updates.is_empty(),
            split_k: args.split_k,
            ..Default::default()
        };
        let tol = workloads::tolerance(&CompileOptions { mixed_precision: args.mixed_precision, ..Default::default() });
        let fused = compile(&device, w, &fused_opts).map_err(|e| format!("{}: {e}", w.name))?;
        let unfused = compile(&device, w, &CompileOptions::unfused()).map_err(|e| format!("{}: {e}", w.name))?;
        let a = fused.run(&w.feed_refs()).map_err(|e| e.to_string())?;
        let b = unfused.run(&w.feed_refs()).map_err(|e| e.to_string())?;
        for (x, y) in a.iter().zip(&b) {
            assert_close(x, y, tol, tol).map_err(|e| format!("{}: fused and unfused differ: {e}", w.name))?;
        }
        // A training step: both ran one update from the same parameters.
        for (name, _) in &w.updates {
            let (x, y) = (fused.parameter(name), unfused.parameter(name));
            let (x, y) = (x.map_err(|e| e.to_string())?, y.map_err(|e| e.to_string())?);
            assert_close(&x, &y, tol, tol)
                .map_err(|e| format!("{}: fused and unfused updates of `{name}` differ: {e}", w.name))?;
        }
        bar.set_message(format!("{}: outputs agree; timing {} runs each", w.name, args.runs()));
        if let Some(dir) = &args.plot {
            plot(dir, w, &fused, &unfused)?;
        }
        let gpu = info.device_type != fusegraph::crates::runtime::WgpuDeviceType::Cpu;
        let [tf, tu] = time_in_turn(w, &fused, &unfused, args.runs(), gpu)?;
        let speedup = Speedup::paired(&tu.ms, &tf.ms).map_err(|e| format!("{}: {e}", w.name))?;
        let rf = measure(w, "fused", &fused, tf)?;
        let ru = measure(w, "unfused", &unfused, tu)?;
        if args.profile {
            for (mode, exe) in [("fused", &fused), ("unfused", &unfused)] {
                print!("{}", profile_table(w, mode, exe, args.runs())?);
            }
        }
        records.push((ru, rf, speedup));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut table = String::new();
    let _ = writeln!(
        table,
        "{:<28} {:<8} {:>7} {:>12} {:>10} {:>11} {:>10} {:>10} {:>8}",
        "workload", "mode", "kernels", "moved MiB", "peak MiB", "bound MiB", "naive MiB", "median ms", "speedup"
    );
    for (u, f, sp) in &records {
        for r in [u, f] {
            let speedup = if r.mode == "fused" { format!("{:.2}x", sp.median) } else { String::new() };
            let _ = writeln!(
                table,
                "{:<28} {:<8} {:>7} {:>12} {:>10} {:>11} {:>10} {:>10.3} {:>8}",
                r.workload,
                r.mode,
                r.kernels,
                mib(r.bytes_moved),
                mib(r.peak_bytes),
                mib(r.lower_bound_bytes),
                mib(r.naive_bytes),
                r.median_ms,
                speedup
            );
        }
    }
    print!("{table}");
    let forms = device.kernel_forms().to_string();
    println!(
        "timer: {}; adapter: {} ({:?}); kernel forms: {forms}",
        records.first().map_or("-", |r| r.1.timer),
        info.name,
        info.backend
    );
    if let Some(path) = &args.json {
        let json: Vec<serde_json::Value> = records
            .iter()
            .flat_map(|(u, f, sp)| [(u, None), (f, Some(sp))])
            .map(|(r, sp)| {
                serde_json::json!({
                    "workload": r.workload, "mode": r.mode, "kernels": r.kernels,
                    "bytes_moved": r.bytes_moved, "naive_bytes": r.naive_bytes, "peak_bytes": r.peak_bytes,
                    "lower_bound_bytes": r.lower_bound_bytes, "median_ms": r.median_ms,
                    "p10_ms": r.p10_ms, "p90_ms": r.p90_ms,
                    "speedup": sp.map(|s| s.median), "speedup_p10": sp.map(|s| s.p10),
                    "speedup_p90": sp.map(|s| s.p90), "timer": r.timer,
                    "adapter": info.name, "backend": format!("{:?}", info.backend), "kernel_forms": forms,
                })
            })
            .collect();
        crate::roofline::write_json(path, &json)?;
        eprintln!("wrote {path}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Speedup;

    #[test]
    fn speedup_pairs_the_runs_of_one_round() {
        // The machine slows 3× after two rounds; fused is 2× faster in every round. The
        // ratio of the medians (4 / 6) would call fused slower.
        let unfused = [4.0, 4.0, 12.0, 12.0, 12.0];
        let fused = [2.0, 2.0, 6.0, 6.0, 6.0];
        assert_eq!(Speedup::paired(&unfused, &fused), Ok(Speedup { median: 2.0, p10: 2.0, p90: 2.0 }));
        let s = Speedup::paired(&[3.0, 8.0, 5.0, 9.0, 4.0], &[1.0, 2.0, 1.0, 3.0, 2.0]).unwrap();
        // Ratios 3, 4, 5, 3, 2: sorted 2, 3, 3, 4, 5.
        assert_eq!((s.median, s.p10, s.p90), (3.0, 2.0, 5.0));
    }

    #[test]
    fn speedup_rejects_unpaired_or_bad_times() {
        let err = Speedup::paired(&[1.0, 2.0], &[1.0]).unwrap_err();
        assert!(err.contains("2 unfused and 1 fused"), "{err}");
        assert!(Speedup::paired(&[], &[]).is_err());
        let err = Speedup::paired(&[1.0, 0.0], &[1.0, 1.0]).unwrap_err();
        assert!(err.contains("run time 0 ms"), "{err}");
        assert!(Speedup::paired(&[1.0], &[f64::NAN]).is_err());
    }
}
