//! Trains a model with one executable per step (forward, backward, Adam update on the device):
//! an MLP on Gaussian blobs or a small GPT-style character LM on grammar text, both generated
//! in-process.
//!
//! `cargo run --release --example train -- [--model mlp|lm] [--steps N] [--quick]
//! [--accumulate N] [--mixed-precision] [--checkpoint] [--memory-limit BYTES] [--json PATH]`

use fusegraph::train::demo::{run, Config, Task};
use fusegraph::train::LossScaling;
use std::io::Write;

const USAGE: &str = "usage: train [--model mlp|lm] [--steps N] [--quick] [--accumulate N] \
                     [--mixed-precision] [--checkpoint] [--memory-limit BYTES] [--json PATH]";

struct Args {
    cfg: Config,
    json: Option<String>,
}

fn parse() -> Result<Args, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let mut task = Task::Mlp;
    let (mut steps, mut accumulate, mut limit, mut json) = (None, 1, None, None);
    let (mut mixed, mut checkpoint) = (false, false);
    let mut it = args.iter();
    let num = |v: Option<&String>, what: &str| -> Result<u64, String> {
        v.ok_or(format!("{what} needs a value"))?.parse::<u64>().map_err(|e| format!("{what}: {e}"))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => {}
            "--model" => {
                task = match it.next().map(String::as_str) {
                    Some("mlp") => Task::Mlp,
                    Some("lm") => Task::Lm,
                    other => return Err(format!("--model: expected mlp or lm, got {other:?}")),
                }
            }
            "--steps" => steps = Some(num(it.next(), "--steps")? as usize),
            "--accumulate" => accumulate = num(it.next(), "--accumulate")? as usize,
            "--memory-limit" => limit = Some(num(it.next(), "--memory-limit")?),
            "--json" => json = Some(it.next().ok_or("--json needs a path")?.clone()),
            "--mixed-precision" => mixed = true,
            "--checkpoint" => checkpoint = true,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    if accumulate == 0 {
        return Err("--accumulate must be ≥ 1".into());
    }
    let mut cfg = Config::new(task, quick);
    if let Some(s) = steps {
        cfg.steps = s;
    }
    cfg.options.accumulate = accumulate;
    cfg.options.mixed_precision = mixed.then(LossScaling::default);
    cfg.options.checkpoint = checkpoint;
    cfg.options.memory_limit = limit;
    Ok(Args { cfg, json })
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(2);
        }
    };
    if let Err(e) = train(&args) {
        eprintln!("\nerror: {e}");
        std::process::exit(1);
    }
}

fn train(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let cfg = &args.cfg;
    let device = fusegraph::Device::shared()?;
    println!(
        "train {}: {} steps × {} micro-batch(es){}{}{} on {}",
        cfg.task.name(),
        cfg.steps,
        cfg.options.accumulate,
        if cfg.options.mixed_precision.is_some() { ", mixed precision" } else { "" },
        if cfg.options.checkpoint { ", checkpointing" } else { "" },
        cfg.options.memory_limit.map(|l| format!(", memory limit {l} B")).unwrap_or_default(),
        device.describe()
    );
    let mut progress = |step: usize, steps: usize, loss: f32, rate: f64| {
        eprint!("\rstep {step}/{steps} loss {loss:.4} {rate:.1} steps/s   ");
        let _ = std::io::stderr().flush();
    };
    let report = run(cfg, &device, &mut progress)?;
    eprintln!();
    println!("first loss    {:.4}", report.first_loss);
    println!("last loss     {:.4}", report.last_loss);
    println!("steps         {} ({} skipped)", report.steps, report.skipped);
    println!("planned peak  {} B (arena {} B), {} kernels/run", report.peak_bytes, report.arena_bytes, report.kernels);
    println!("median step   {:.2} ms", report.median_step_ms);
    if report.recomputed > 0 {
        println!("checkpointing {} forward nodes recomputed", report.recomputed);
    }
    if let Some(s) = report.loss_scale {
        println!("loss scale    {s}");
    }
    if let Some(path) = &args.json {
        std::fs::write(path, report.to_json() + "\n")?;
        println!("wrote {path}");
    }
    Ok(())
}
