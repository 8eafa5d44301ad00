//! wgpu's shader runtime checks (`DeviceOptions::shader_checks`: index clamps, loop-bounding
//! counters), off by default. Without them kernels rely on fusegraph's own indexing, so every
//! kernel form runs here on a device without the checks and on one with them (whatever
//! `FUSEGRAPH_SHADER_CHECKS` says for the rest of the suite) against the CPU reference: every
//! op unfused and fused, the composite patterns (rows, epilogues, long chains), the tiled
//! matmul with each candidate tiling on ragged, batched and transposed shapes, and the fused
//! attention in both of its forms. The option's resolution is checked too.

use crate::common;

use crate::common::{run_case, Case, CaseBuilder, Domain};
use fusegraph::{
    CompileOptions, DType, Device, DeviceOptions, ExecutableStats, FusedAttention, FusionMode, MatmulTiling,
};
use std::sync::Arc;

/// A device with the shader checks `on` or off, and `tiled_attention`.
fn device(checks: bool, tiled_attention: bool) -> Arc<Device> {
    let opts =
        DeviceOptions { shader_checks: Some(checks), tiled_attention: Some(tiled_attention), ..Default::default() };
    let device = Device::new(&opts).expect("a device");
    assert_eq!(device.shader_checks(), checks);
    assert_eq!(device.describe().ends_with(", shader checks on"), checks, "{}", device.describe());
    Arc::new(device)
}

fn form(checks: bool) -> &'static str {
    if checks {
        "checked"
    } else {
        "unchecked"
    }
}

/// Runs `cases` under `opts`, collecting failures named by case and `form`, and those
/// `expect` finds in a run's stats (`None` where they are as expected).
fn run_all(
    device: &Arc<Device>,
    cases: &[Case],
    opts: &CompileOptions,
    form: &str,
    expect: impl Fn(&ExecutableStats) -> Option<String>,
    failures: &mut Vec<String>,
) -> usize {
    for case in cases {
        if let Err(e) = run_case(device, case, opts).and_then(|stats| expect(&stats).map_or(Ok(()), Err)) {
            failures.push(format!("{} [{form}]: {e}", case.name));
        }
    }
    cases.len()
}

/// No expectation on the stats.
fn any(_: &ExecutableStats) -> Option<String> {
    None
}

#[test]
fn shader_checks_are_off_unless_turned_on() {
    let unset = Device::new(&DeviceOptions::default()).expect("a device");
    let env_on = std::env::var("FUSEGRAPH_SHADER_CHECKS").is_ok_and(|v| matches!(v.trim(), "on" | "1" | "true"));
    assert_eq!(unset.shader_checks(), env_on);
    assert!(!device(false, false).shader_checks());
    assert!(device(true, false).shader_checks());
}

#[test]
fn every_op_matches_the_reference_with_and_without_shader_checks() {
    let mut failures = Vec::new();
    let mut ran = 0;
    for checks in [false, true] {
        let device = device(checks, false);
        let unfused = CompileOptions { fusion: FusionMode::Off, simplify: false, ..Default::default() };
        ran +=
            run_all(&device, &common::catalog(3), &unfused, &format!("unfused, {}", form(checks)), any, &mut failures);
        let mut fused = common::catalog(5);
        fused.extend(common::composite_cases());
        ran += run_all(
            &device,
            &fused,
            &CompileOptions::default(),
            &format!("fused, {}", form(checks)),
            any,
            &mut failures,
        );
    }
    eprintln!("{ran} checks, {} failed", failures.len());
    assert!(failures.is_empty(), "{} of {ran} failed:\n{}", failures.len(), failures.join("\n"));
}

/// A matmul `[b, m, k] · [k, n]` (lhs transposed from `[b, k, m]` where `transposed`) with
/// the epilogue `relu(x + bias)`.
pub(crate) fn matmul(dt: DType, b: usize, (m, k, n): (usize, usize, usize), transposed: bool) -> Case {
    let mut c = CaseBuilder::new((m * 131 + k * 7 + n + b) as u64);
    let a = match transposed {
        true => c.input(dt, &[b, k, m], Domain::Any).transpose(&[0, 2, 1]).unwrap(),
        false => c.input(dt, &[b, m, k], Domain::Any),
    };
    let w = c.input(dt, &[k, n], Domain::Any);
    let bias = c.input(dt, &[n], Domain::Any);
    let y = a.matmul(&w).and_then(|y| y.add(&bias)).and_then(|y| y.relu()).unwrap();
    let mut case = c.finish(format!("matmul_{dt}_{b}x{m}x{k}x{n}_t{transposed}"), &[&y]);
    case.atol = 1e-3 * (k as f64 / 1000.0).max(0.1);
    case.f16_tol = 1e-2;
    case
}

#[test]
fn tiled_matmuls_match_the_reference_with_and_without_shader_checks() {
    let shapes = [(7, 33, 5), (65, 17, 129), (130, 40, 258), (129, 200, 131)];
    let mut cases = Vec::new();
    for (s, &shape) in shapes.iter().enumerate() {
        cases.push(matmul(DType::F32, 1 + s % 2, shape, s % 2 == 1));
    }
    cases.push(matmul(DType::F16, 2, (66, 72, 100), false));
    let mut failures = Vec::new();
    let mut ran = 0;
    for checks in [false, true] {
        let device = device(checks, false);
        for tiling in MatmulTiling::CANDIDATES {
            let opts = CompileOptions { matmul_tiling: Some(tiling), ..Default::default() };
            // Tilings with 256 or more outputs per invocation take seconds to compile on
            // lavapipe: the ragged 2-D and the batched, transposed shapes only.
            let heavy = tiling.bm * tiling.bn >= 256;
            let cases = if heavy { &cases[2..4] } else { &cases[..] };
            let took = |stats: &ExecutableStats| {
                (!stats.kernels.iter().any(|k| k.matmul_tiling == Some(tiling)))
                    .then(|| "the tiled kernel not taken".to_string())
            };
            ran += run_all(&device, cases, &opts, &format!("{tiling}, {}", form(checks)), took, &mut failures);
        }
    }
    eprintln!("{ran} checks, {} failed", failures.len());
    assert!(failures.is_empty(), "{} of {ran} failed:\n{}", failures.len(), failures.join("\n"));
}

/// `softmax(causal(q·kᵀ/√d))·v` over `[1, 2, s, d]`, in one kernel.
fn attention(dt: DType, s: usize, d: usize) -> Case {
    let mut c = CaseBuilder::new((s * 17 + d) as u64);
    let q = c.input(dt, &[1, 2, s, d], Domain::Any);
    let k = c.input(dt, &[1, 2, s, d], Domain::Any);
    let v = c.input(dt, &[1, 2, s, d], Domain::Any);
    let scores = q.matmul(&k.transpose(&[0, 1, 3, 2]).unwrap()).unwrap().mul_scalar(1.0 / (d as f64).sqrt()).unwrap();
    let row = c.b.iota(DType::I32, [s, s], 0).unwrap();
    let col = c.b.iota(DType::I32, [s, s], 1).unwrap();
    let masked = c.b.scalar(dt, -1e9).unwrap();
    let logits = row.ge(&col).and_then(|m| m.select(&scores, &masked)).unwrap();
    let y = logits.softmax(3).and_then(|p| p.matmul(&v)).unwrap();
    let mut case = c.finish(format!("attention_{dt}_{s}x{d}"), &[&y]);
    case.atol = 1e-4;
    case.f16_tol = 1e-2;
    case
}

#[test]
fn fused_attention_matches_the_reference_with_and_without_shader_checks() {
    let cases = [attention(DType::F32, 7, 8), attention(DType::F32, 70, 16), attention(DType::F16, 33, 8)];
    let opts = CompileOptions { fused_attention: FusedAttention::Always, ..Default::default() };
    let mut failures = Vec::new();
    let mut ran = 0;
    for (checks, tiled) in [(false, false), (false, true), (true, false), (true, true)] {
        let device = device(checks, tiled);
        let form = format!("{}, {}", if tiled { "tiled" } else { "one key at a time" }, form(checks));
        let one = |stats: &ExecutableStats| {
            (stats.kernels.len() != 1).then(|| format!("{} kernels, not one", stats.kernels.len()))
        };
        ran += run_all(&device, &cases, &opts, &form, one, &mut failures);
    }
    assert!(failures.is_empty(), "{} of {ran} failed:\n{}", failures.len(), failures.join("\n"));
}
