//! Split-k on the device: products split into slices of `k` and summed match the reference
//! and the unsplit run in every dtype, with their epilogue moved onto the sum; a split that
//! would break the memory limit is not made, in `compile` and in `Device::plan` alike.

use crate::common::{Case, CaseBuilder, Domain};
use fusegraph::crates::reference::evaluate;
use fusegraph::{CompileOptions, DType, Device, DeviceOptions, Executable, HostTensor, SplitK};
use std::collections::BTreeMap;
use std::sync::Arc;

fn device() -> Arc<Device> {
    Arc::new(Device::new(&DeviceOptions::default()).expect("a device"))
}

/// `relu(A·B + bias)` with `A: [batch.., m, k]` (stored transposed when `transposed`) and
/// `B: [k, n]`.
fn case(dt: DType, batch: &[usize], (m, k, n): (usize, usize, usize), transposed: bool) -> Case {
    let mut c = CaseBuilder::new((m * 131 + k * 7 + n) as u64 + dt as u64 + batch.len() as u64);
    let a = if transposed {
        c.input(dt, &[batch, &[k, m]].concat(), Domain::Any).t().unwrap()
    } else {
        c.input(dt, &[batch, &[m, k]].concat(), Domain::Any)
    };
    let b = c.input(dt, &[k, n], Domain::Any);
    let bias = c.input(dt, &[n], Domain::Any);
    let y = a.matmul(&b).unwrap().add(&bias).unwrap().relu().unwrap();
    let mut case = c.finish(format!("split_{dt}_{batch:?}_{m}x{k}x{n}_t{transposed}"), &[&y]);
    case.atol = 1e-3 * (k as f64 / 1000.0).max(0.1);
    case.f16_tol = 1e-2;
    case
}

fn feeds(case: &Case) -> Vec<(&str, &HostTensor)> {
    case.feeds.iter().map(|(n, t)| (n.as_str(), t)).collect()
}

/// Runs `exe` on `case`'s feeds and compares with `want` ([`Case::check_outputs`]).
fn compare(exe: &Executable, case: &Case, want: &[HostTensor]) -> Result<(), String> {
    let got = exe.run(&feeds(case)).map_err(|e| format!("run: {e}"))?;
    case.check_outputs(&got, want)
}

/// The labels of `exe`'s kernels (their members' op names joined by `+`).
fn labels(exe: &Executable) -> Vec<String> {
    exe.stats().kernels.iter().map(|k| k.label.clone()).collect()
}

#[test]
fn split_products_match_the_reference_and_the_unsplit_run() {
    let device = device();
    eprintln!("device: {}", device.describe());
    let cases = [
        (case(DType::F32, &[], (7, 64, 33), false), SplitK::Slices(4)),
        (case(DType::F32, &[2], (65, 256, 129), true), SplitK::Slices(2)),
        (case(DType::F16, &[], (40, 128, 24), false), SplitK::Slices(8)),
        (case(DType::I32, &[3], (9, 96, 10), false), SplitK::Slices(3)),
        // The occupancy rule: one 64×64 tile, k 1024 → 4 slices of 256 (at least 128 each).
        (case(DType::F32, &[], (64, 1024, 64), false), SplitK::Fill { workgroups: 4 }),
    ];
    let mut failures = Vec::new();
    for (case, split) in &cases {
        let f: BTreeMap<String, HostTensor> = case.feeds.iter().cloned().collect();
        let want = evaluate(&case.graph, &case.outputs, &f, &BTreeMap::new()).expect("reference");
        let unsplit = device.compile(&case.graph, &case.outputs, &CompileOptions::default()).expect("compiles");
        let opts = CompileOptions { split_k: *split, ..Default::default() };
        let exe = device.compile(&case.graph, &case.outputs, &opts).expect("compiles split");
        // Unsplit: the product and its epilogue in one kernel. Split: the sliced product,
        // then the sum with the epilogue.
        let (before, after) = (labels(&unsplit), labels(&exe));
        let fused = |l: &String| l.contains("matmul") && l.contains("add");
        let moved = after.len() == 2
            && after[0].contains("matmul")
            && !after[0].contains("add")
            && after[1].contains("reduce")
            && after[1].contains("add");
        if before.len() != 1 || !fused(&before[0]) || !moved {
            failures.push(format!("{}: kernels {before:?} → {after:?}", case.name));
            continue;
        }
        for (what, exe) in [("unsplit", &unsplit), ("split", &exe)] {
            if let Err(e) = compare(exe, case, &want) {
                failures.push(format!("{} ({what}): {e}", case.name));
            }
        }
        // The split run against the unsplit one, at the same tolerance.
        let base = unsplit.run(&feeds(case)).expect("runs");
        if let Err(e) = compare(&exe, case, &base) {
            failures.push(format!("{} (split against unsplit): {e}", case.name));
        }
    }
    assert!(failures.is_empty(), "{} of {} failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn products_the_rule_does_not_split_compile_as_before() {
    let device = device();
    // k not a multiple of 4·s; and a product that already fills the workgroups asked for.
    for (case, split) in [
        (case(DType::F32, &[], (8, 36, 8), false), SplitK::Slices(2)),
        (case(DType::F32, &[], (8, 48, 8), false), SplitK::Slices(8)),
        (case(DType::F32, &[], (64, 1024, 64), false), SplitK::Fill { workgroups: 1 }),
    ] {
        let opts = CompileOptions { split_k: split, ..Default::default() };
        let exe = device.compile(&case.graph, &case.outputs, &opts).expect("compiles");
        assert_eq!(labels(&exe).len(), 1, "{} with {split:?}: {:?}", case.name, labels(&exe));
    }
}

#[test]
fn a_split_that_breaks_the_memory_limit_is_not_made() {
    let device = device();
    let case = case(DType::F32, &[], (128, 512, 128), false);
    let split = CompileOptions { split_k: SplitK::Slices(8), ..Default::default() };
    let plain = device.plan(&case.graph, &case.outputs, &CompileOptions::default()).expect("plans");
    let planned = device.plan(&case.graph, &case.outputs, &split).expect("plans split");
    // Eight 128×128 f32 partial sums (512 KiB), partly in bytes the operands leave.
    assert!(
        planned.total_bytes >= plain.total_bytes + 4 * 128 * 128 * 4,
        "split plan {} bytes against {} unsplit",
        planned.total_bytes,
        plain.total_bytes
    );
    let exe = device.compile(&case.graph, &case.outputs, &split).expect("compiles");
    assert_eq!(exe.stats().kernels.len(), 2, "{:?}", labels(&exe));
    // A limit the unsplit plan fits and the split one does not: no split, in `plan` and
    // `compile` alike, and the result is still right.
    let limit = (plain.total_bytes + planned.total_bytes) / 2;
    let limited = CompileOptions { memory_limit: Some(limit), ..split };
    let summary = device.plan(&case.graph, &case.outputs, &limited).expect("plans within the limit");
    assert_eq!(summary.total_bytes, plain.total_bytes);
    let exe = device.compile(&case.graph, &case.outputs, &limited).expect("compiles within the limit");
    assert_eq!(labels(&exe).len(), 1, "{:?}", labels(&exe));
    assert!(exe.stats().device_bytes <= limit, "{} bytes held, limit {limit}", exe.stats().device_bytes);
    let f: BTreeMap<String, HostTensor> = case.feeds.iter().cloned().collect();
    let want = evaluate(&case.graph, &case.outputs, &f, &BTreeMap::new()).expect("reference");
    compare(&exe, &case, &want).unwrap();
}
