//! Data-parallel training across processes under `mpirun` (feature `mpi`): the example
//! `train --distributed` on 1 and 2 ranks (two processes sharing this machine's adapter).
//! `scripts/test.sh` builds the example with the feature and runs these where MPI is
//! installed.
#![cfg(feature = "mpi")]

use fusegraph::crates::ir::safetensors;
use fusegraph::HostTensor;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The example binary `cargo test --features mpi` built beside this test.
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join("examples").join("train");
    assert!(path.exists(), "{} is missing: cargo build --features mpi --example train", path.display());
    path
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fusegraph-mpi-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `mpirun -np ranks train --distributed --quick args…`, its exit status and output, killed
/// after `limit`.
fn mpirun(ranks: usize, args: &[&str], limit: Duration) -> (Option<i32>, String, Duration) {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "-np", &ranks.to_string()]);
    let root = Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0\n")).unwrap_or(false);
    if root {
        cmd.arg("--allow-run-as-root");
    }
    cmd.arg(example()).args(["--distributed", "--quick"]).args(args);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().expect("mpirun (Open MPI's openmpi-bin) on the PATH");
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
            return (status.code(), text, start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("mpirun {args:?} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A successful run's report.
fn train(ranks: usize, args: &[&str], json: &Path) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["--json", json.to_str().unwrap()]);
    let (code, text, _) = mpirun(ranks, &all, Duration::from_secs(300));
    assert_eq!(code, Some(0), "mpirun -np {ranks} {all:?}:\n{text}");
    serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap()
}

fn losses(report: &serde_json::Value) -> Vec<f64> {
    report["losses"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect()
}

fn assert_close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * y.abs().max(1e-12), "{what}[{i}]: {x} vs {y}");
    }
}

/// ‖a − b‖ / ‖b‖ per tensor, over every tensor of `b`.
fn assert_same(a: &BTreeMap<String, HostTensor>, b: &BTreeMap<String, HostTensor>, tol: f64, what: &str) {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>(), "{what}");
    for (name, want) in b {
        let (g, w) = (a[name].to_f64(), want.to_f64());
        let diff: f64 = g.iter().zip(&w).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
        let norm: f64 = w.iter().map(|y| y * y).sum::<f64>().sqrt().max(1e-30);
        assert!(diff / norm <= tol, "{what}: `{name}` differs by {:.3e} relative", diff / norm);
    }
}

#[test]
fn two_ranks_train_as_one_sharded_or_not() {
    let d = dir("equal");
    let path = |n: &str| d.join(n).to_str().unwrap().to_string();
    let one = train(1, &["--steps", "10", "--save", &path("one.st")], &d.join("one.json"));
    // Ranks that drew different initial weights start from rank 0's: the same run.
    let two = train(
        2,
        &["--steps", "10", "--save", &path("two.st"), "--check-replicas", "--rank-seeds"],
        &d.join("two.json"),
    );
    let sharded = train(
        2,
        &["--steps", "10", "--save", &path("sharded.st"), "--shard-optimizer", "--bucket-bytes", "4096"],
        &d.join("sharded.json"),
    );
    assert_eq!(losses(&one).len(), 10);
    assert!(losses(&one)[9] < 0.5 * losses(&one)[0], "{:?}", losses(&one));
    assert_close(&losses(&two), &losses(&one), 1e-5, "2 ranks' losses");
    assert_close(&losses(&sharded), &losses(&one), 1e-5, "sharded losses");
    let want = safetensors::read(&d.join("one.st")).unwrap();
    assert_same(&safetensors::read(&d.join("two.st")).unwrap(), &want, 1e-5, "2 ranks' checkpoint");
    assert_same(&safetensors::read(&d.join("sharded.st")).unwrap(), &want, 1e-5, "sharded checkpoint");
    // Each rank holds half the optimizer state (Adam's moments; the step counter is whole).
    let bytes = |r: &serde_json::Value| r["optimizer_bytes"].as_u64().unwrap();
    assert_eq!(bytes(&two), bytes(&one));
    assert!((2 * bytes(&sharded)).abs_diff(bytes(&one)) <= 8, "{} vs {}", bytes(&sharded), bytes(&one));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_resumed_run_continues_the_loss_curve() {
    let d = dir("resume");
    let path = |n: &str| d.join(n).to_str().unwrap().to_string();
    let straight = train(2, &["--steps", "8", "--shard-optimizer", "--save", &path("end.st")], &d.join("a.json"));
    train(2, &["--steps", "4", "--shard-optimizer", "--save", &path("half.st")], &d.join("b.json"));
    // Resumed on one rank, unsharded: the checkpoint names the state per parameter.
    let rest = train(
        1,
        &["--steps", "4", "--resume", &path("half.st"), "--start-step", "4", "--save", &path("rest.st")],
        &d.join("c.json"),
    );
    assert_close(&losses(&rest), &losses(&straight)[4..], 1e-5, "resumed losses");
    let want = safetensors::read(&d.join("end.st")).unwrap();
    assert_same(&safetensors::read(&d.join("rest.st")).unwrap(), &want, 1e-5, "resumed checkpoint");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn accumulation_and_loss_scaling_work_across_ranks() {
    let d = dir("mixed");
    let args = ["--steps", "6", "--accumulate", "2", "--mixed-precision"];
    let one = train(1, &args, &d.join("one.json"));
    let two = train(2, &[&args[..], &["--shard-optimizer", "--check-replicas"]].concat(), &d.join("two.json"));
    // f16 forward and backward: the batch split changes roundings, not the curve.
    assert_close(&losses(&two), &losses(&one), 2e-3, "mixed-precision losses");
    // A first scale that overflows f16: the first windows are skipped on every rank alike
    // (the replica check fails the job otherwise) until the scale has halved enough. How
    // many depends on the rows per rank (a rank's gradient is of its own rows' mean).
    let high = [&args[..], &["--init-loss-scale", "4194304", "--shard-optimizer", "--check-replicas"]].concat();
    let skipping = train(2, &high, &d.join("high.json"));
    let skipped = skipping["skipped"].as_u64().unwrap();
    assert!((1..6).contains(&skipped), "{skipping}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_crashed_rank_stops_the_others_and_leaves_the_last_checkpoint_whole() {
    let d = dir("crash");
    let ckpt = d.join("ckpt.st");
    let args = ["--steps", "20", "--save", ckpt.to_str().unwrap(), "--save-every", "2", "--crash", "1:5"];
    let (code, text, took) = mpirun(2, &args, Duration::from_secs(120));
    assert_ne!(code, Some(0), "the job must fail:\n{text}");
    assert!(text.contains("rank 1"), "mpirun names the failed rank:\n{text}");
    assert!(took < Duration::from_secs(120), "{took:?}");
    // The checkpoint after 4 steps, whole; nothing half-written beside it.
    let saved = safetensors::read(&ckpt).unwrap();
    assert_eq!(saved["optim.step"].to_f64(), [4.0], "{text}");
    let names: Vec<String> =
        std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names, ["ckpt.st"]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_rank_that_stops_answering_ends_the_job_at_the_collective_timeout() {
    let args = ["--steps", "10", "--hang", "1:3", "--collective-timeout", "3"];
    let (code, text, took) = mpirun(2, &args, Duration::from_secs(120));
    assert_ne!(code, Some(0), "the job must fail:\n{text}");
    assert!(text.contains("rank 0: the gradient all-reduce did not complete within 3s"), "{text}");
    assert!(took < Duration::from_secs(120), "{took:?}");
}

#[test]
fn ranks_that_recorded_different_models_stop_before_training_naming_them() {
    let (code, text, took) = mpirun(2, &["--steps", "5", "--mismatch", "1"], Duration::from_secs(120));
    assert_ne!(code, Some(0), "the job must fail:\n{text}");
    assert!(text.contains("ranks 1 recorded other trained parameters (names or shapes) than rank 0"), "{text}");
    assert!(!text.contains("step "), "no step ran:\n{text}");
    assert!(took < Duration::from_secs(120), "{took:?}");
}
