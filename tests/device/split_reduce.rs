//! Split reductions on the device: a reduction with few outputs and long rows runs over many
//! workgroups ([`fusegraph::crates::passes::split_reduce`]), fused with its producer, and
//! matches the reference at sizes from 1 to 2^24 (ragged ones padded), f32 and f16, under a
//! GPU's occupancy rule (forced here on any adapter) and the adapter's own.

use fusegraph::crates::reference::evaluate;
use fusegraph::{
    CompileOptions, DType, Device, DeviceOptions, Executable, GraphBuilder, HostTensor, KernelForm, ReduceFill,
    SplitReductions, Tensor,
};
use std::collections::BTreeMap;
use std::sync::Arc;

fn device() -> Arc<Device> {
    Arc::new(Device::new(&DeviceOptions::default()).expect("a device"))
}

/// The adapter lowering every kernel as for a GPU ([`DeviceOptions::gpu_kernels`]).
fn gpu_forms() -> Arc<Device> {
    Arc::new(Device::new(&DeviceOptions { gpu_kernels: true, ..Default::default() }).expect("a device"))
}

/// `n` values in `[lo, hi)` from the tests' seeded generator.
fn uniform(seed: u64, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    let mut rng = crate::common::Rng::new(seed);
    (0..n).map(|_| rng.uniform(lo, hi)).collect()
}

/// What is reduced: the input alone, or `gelu(1.5x + 0.25) · sigmoid(x)` of it (the
/// elementwise chain of the roofline, fused into the first reduction).
fn produce(x: &Tensor, fused: bool) -> Tensor {
    if !fused {
        return x.clone();
    }
    let a = x.mul_scalar(1.5).unwrap().add_scalar(0.25).unwrap().gelu().unwrap();
    a.mul(&x.sigmoid().unwrap()).unwrap()
}

/// The kernel that reads the input `x` (the first reduction with its producer).
fn reading(exe: &Executable, x: fusegraph::NodeId) -> fusegraph::KernelStats {
    let stats = exe.stats();
    let reads_x = |k: &&fusegraph::KernelStats| k.members.iter().any(|&m| exe.graph().operands(m).contains(&x));
    stats.kernels.iter().find(reads_x).cloned().expect("a kernel reads the input")
}

/// Input `x` of the executable's graph.
fn input_x(exe: &Executable) -> fusegraph::NodeId {
    let g = exe.graph();
    g.node_ids().into_iter().find(|&id| matches!(&g.node(id).op, fusegraph::Op::Input { name } if name == "x")).unwrap()
}

fn workgroups(k: &fusegraph::KernelStats) -> u64 {
    k.workgroups.iter().map(|&w| w as u64).product()
}

#[test]
fn a_full_sum_spreads_over_many_workgroups_in_two_kernels() {
    let device = device();
    eprintln!("device: {}", device.describe());
    let n = 1 << 22;
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [n]).unwrap();
    let y = produce(&x, true).sum(&[0], false).unwrap();
    let g = b.graph();
    let xv = HostTensor::from_f64(DType::F32, [n], &uniform(1, n, 0.5, 1.5)).unwrap();
    let feeds = BTreeMap::from([("x".to_string(), xv.clone())]);
    let want = evaluate(&g, &[y.id()], &feeds, &BTreeMap::new()).unwrap()[0].to_f64()[0];
    // On a GPU each partial of the first kernel is a workgroup's row; on a CPU adapter's
    // forms, an invocation's (workgroups of up to 256), fewer of them.
    let gpu = gpu_forms();
    for (rule, device, fill, least) in [
        ("gpu rule, gpu forms", &gpu, SplitReductions::Fill(ReduceFill::GPU), 1024),
        ("gpu rule, adapter forms", &device, SplitReductions::Fill(ReduceFill::GPU), 4),
        ("adapter rule", &device, SplitReductions::Adapter, 2),
        ("off", &device, SplitReductions::Off, 1),
    ] {
        let opts = CompileOptions { split_reductions: fill, ..Default::default() };
        let exe = device.compile(&g, &[y.id()], &opts).unwrap();
        let labels: Vec<String> = exe.stats().kernels.iter().map(|k| k.label.clone()).collect();
        let first = reading(&exe, input_x(&exe));
        eprintln!("{rule}: {labels:?}, the input's kernel {:?} workgroups", first.workgroups);
        if rule == "off" {
            assert_eq!(labels.len(), 1, "{rule}: {labels:?}");
            assert_eq!(workgroups(&first), 1, "{rule}: one workgroup for the one output");
        } else {
            // The producer, the views and the first reduction in one kernel; the partials'
            // sum in a second.
            assert_eq!(labels.len(), 2, "{rule}: {labels:?}");
            assert!(workgroups(&first) >= least, "{rule}: {:?} workgroups for one output", first.workgroups);
        }
        let got = exe.run(&[("x", &xv)]).unwrap()[0].to_f64()[0];
        assert!((got - want).abs() <= 1e-5 * want.abs(), "{rule}: {got} against {want}");
    }
}

#[test]
fn split_sums_and_maxima_match_the_reference_from_1_to_2_pow_24() {
    let device = device();
    let gpu = gpu_forms();
    eprintln!("device: {}", device.describe());
    let sizes = [1usize, 7, 1000, 4099, 65_537, (1 << 20) + 3, 1 << 22, 1 << 24];
    let mut failures = Vec::new();
    let mut ran = 0;
    for &n in &sizes {
        for dtype in [DType::F32, DType::F16] {
            // f16 is not run natively everywhere; the device stores it packed where it must.
            for fused in [false, true] {
                if fused && n > 1 << 22 {
                    continue; // the reference's f64 chain over 2^24 elements takes minutes in debug
                }
                for max in [false, true] {
                    // Sums of f32 over positive values (a lost chunk moves the result far past
                    // the tolerance); of f16 over values of both signs up to 2^20 (a positive
                    // sum of more would overflow f16); maxima exactly, at every size.
                    if !max && dtype == DType::F16 && n > 1 << 20 {
                        continue;
                    }
                    let (lo, hi) = if dtype == DType::F32 || max { (0.5, 1.5) } else { (-1.0, 1.0) };
                    let b = GraphBuilder::new();
                    let x = b.input("x", dtype, [n]).unwrap();
                    let p = produce(&x, fused);
                    let y = if max { p.max(&[0], false) } else { p.sum(&[0], false) }.unwrap();
                    let g = b.graph();
                    let xv = HostTensor::from_f64(dtype, [n], &uniform(n as u64, n, lo, hi)).unwrap();
                    let feeds = BTreeMap::from([("x".to_string(), xv.clone())]);
                    let want = evaluate(&g, &[y.id()], &feeds, &BTreeMap::new()).unwrap()[0].to_f64()[0];
                    for (device, fill) in [
                        (&gpu, SplitReductions::Fill(ReduceFill::GPU)),
                        (&device, SplitReductions::Fill(ReduceFill::GPU)),
                        (&device, SplitReductions::Adapter),
                    ] {
                        ran += 1;
                        let opts = CompileOptions { split_reductions: fill, ..Default::default() };
                        let exe = device.compile(&g, &[y.id()], &opts).unwrap();
                        let got = exe.run(&[("x", &xv)]).unwrap()[0].to_f64()[0];
                        let eps = if dtype == DType::F32 { 16.0 * f32::EPSILON as f64 } else { 2.0 * 9.77e-4 };
                        // A maximum is exact, but of the producer's values, which are not.
                        let tol = match (max, fused) {
                            (true, false) => 0.0,
                            (true, true) => eps * want.abs(),
                            (false, _) => eps * (want.abs() + 8.0 * (n as f64).sqrt()),
                        };
                        if (got - want).abs() > tol || got.is_nan() {
                            let what = if max { "max" } else { "sum" };
                            let forms = if Arc::ptr_eq(device, &gpu) { "gpu" } else { "adapter" };
                            failures.push(format!(
                                "{what} {dtype} n={n} fused={fused} {fill:?}, {forms} forms: {got} against {want}"
                            ));
                        }
                    }
                }
            }
        }
    }
    eprintln!("{ran} checks, {} failed", failures.len());
    assert!(failures.is_empty(), "{} of {ran} failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn column_sums_split_over_the_batch_match_the_reference() {
    // A bias gradient's shape: [batch · seq, features] summed over its rows; and a mean over
    // the middle axes of an image batch, whose result keeps its dims.
    let gpu = gpu_forms();
    for (dims, axes, keep) in [(&[8192usize, 96][..], &[0usize][..], false), (&[3, 64, 33, 5], &[1, 2], true)] {
        for dtype in [DType::F32, DType::F16] {
            let b = GraphBuilder::new();
            let x = b.input("x", dtype, dims.to_vec()).unwrap();
            let y = x.tanh().unwrap().mean(axes, keep).unwrap();
            let g = b.graph();
            let n: usize = dims.iter().product();
            let xv = HostTensor::from_f64(dtype, dims.to_vec(), &uniform(7, n, -2.0, 2.0)).unwrap();
            let feeds = BTreeMap::from([("x".to_string(), xv.clone())]);
            let want = evaluate(&g, &[y.id()], &feeds, &BTreeMap::new()).unwrap();
            let opts =
                CompileOptions { split_reductions: SplitReductions::Fill(ReduceFill::GPU), ..Default::default() };
            let exe = gpu.compile(&g, &[y.id()], &opts).unwrap();
            let outputs: usize = g.ty(y.id()).shape.numel();
            let first = reading(&exe, input_x(&exe));
            // Unsplit, a GPU gives each output one workgroup.
            assert!(
                workgroups(&first) as usize > outputs,
                "{dims:?} over {axes:?}: {:?} workgroups for {outputs} outputs",
                first.workgroups
            );
            let got = exe.run(&[("x", &xv)]).unwrap();
            let (atol, rtol) = fusegraph::crates::reference::tolerance(dtype);
            fusegraph::crates::reference::assert_close(&got[0], &want[0], atol, rtol)
                .unwrap_or_else(|e| panic!("{dims:?} over {axes:?} {dtype}: {e}"));
        }
    }
}

#[test]
fn split_argmax_matches_the_reference() {
    // The first maximum's index, also where the maximum repeats (i32 data from a small range,
    // f16 rounding), split under a GPU's rule in both kernel forms and under the adapter's.
    let device = device();
    let gpu = gpu_forms();
    let mut failures = Vec::new();
    for &n in &[7usize, 4099, 65_537, (1 << 20) + 3] {
        for dtype in [DType::F32, DType::F16, DType::I32] {
            let b = GraphBuilder::new();
            let x = b.input("x", dtype, [n]).unwrap();
            let y = x.argmax(0, false).unwrap();
            let g = b.graph();
            let values: Vec<f64> = match dtype {
                DType::I32 => uniform(n as u64 + 3, n, -50.0, 50.0).iter().map(|v| v.floor()).collect(),
                _ => uniform(n as u64 + 3, n, -4.0, 4.0),
            };
            let xv = HostTensor::from_f64(dtype, [n], &values).unwrap();
            let feeds = BTreeMap::from([("x".to_string(), xv.clone())]);
            let want = evaluate(&g, &[y.id()], &feeds, &BTreeMap::new()).unwrap()[0].to_f64()[0];
            for (forms, device, fill) in [
                ("gpu", &gpu, SplitReductions::Fill(ReduceFill::GPU)),
                ("adapter", &device, SplitReductions::Fill(ReduceFill::GPU)),
                ("adapter", &device, SplitReductions::Adapter),
            ] {
                let opts = CompileOptions { split_reductions: fill, ..Default::default() };
                let exe = device.compile(&g, &[y.id()], &opts).unwrap();
                // Split: the chunks' maxima and indices, then the chunk that wins.
                let kernels = exe.stats().kernels.len();
                if n >= 65_537 && fill != SplitReductions::Adapter && kernels < 2 {
                    failures.push(format!("argmax {dtype} n={n} {forms} forms: not split ({kernels} kernel)"));
                }
                let got = exe.run(&[("x", &xv)]).unwrap()[0].to_f64()[0];
                if got != want {
                    failures.push(format!("argmax {dtype} n={n} {fill:?}, {forms} forms: {got} against {want}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// An argmax over rows of at least 64 is a row reduction: a workgroup shares each of a few
/// long rows (an invocation takes each of many short ones), never a loop kernel whose one
/// invocation scans a row alone — a GPU's one thread for a whole head in a decode step. It
/// gives the reference's index: the first maximum, with ties (values on a coarse grid), rows
/// of −∞ alone (element 0), NaN at element 0 (0, where the reference's scan starts and nothing
/// replaces it) and NaNs elsewhere (never a maximum), along the last axis and along others,
/// in f32, f16 and i32, in the adapter's forms and a GPU's.
#[test]
fn argmax_rows_are_row_kernels_matching_the_reference() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for (forms, device) in [("adapter", device()), ("gpu", gpu_forms())] {
        for (dims, axis) in
            [(vec![4usize, 1000], 1usize), (vec![1000, 3], 0), (vec![2, 3, 700], 2), (vec![9000, 70], 1)]
        {
            for dtype in [DType::F32, DType::F16, DType::I32] {
                let n: usize = dims.iter().product();
                let len = dims[axis];
                let inner: usize = dims[axis + 1..].iter().product();
                // Element `e` of row `r` (rows in the order of the kept axes).
                let at = |r: usize, e: usize| (r / inner * len + e) * inner + r % inner;
                let mut values: Vec<f64> = match dtype {
                    DType::I32 => uniform(n as u64, n, -50.0, 50.0).iter().map(|v| v.floor()).collect(),
                    _ => uniform(n as u64, n, -4.0, 4.0).iter().map(|v| (v * 2.0).round() / 2.0).collect(),
                };
                if dtype != DType::I32 {
                    for e in 0..len {
                        values[at(0, e)] = f64::NEG_INFINITY;
                        values[at(2, e)] = if e % 7 == 3 { f64::NAN } else { values[at(2, e)] };
                    }
                    values[at(1, 0)] = f64::NAN;
                    values[at(2, len - 1)] = 9.0;
                }
                let b = GraphBuilder::new();
                let x = b.input("x", dtype, dims.clone()).unwrap();
                let y = x.argmax(axis, false).unwrap();
                let g = b.graph();
                let xv = HostTensor::from_f64(dtype, dims.clone(), &values).unwrap();
                let feeds = BTreeMap::from([("x".to_string(), xv.clone())]);
                let want = evaluate(&g, &[y.id()], &feeds, &BTreeMap::new()).unwrap()[0].to_f64();
                // Unsplit: a split's chunk maxima are a max reduction's, whose NaN handling is the
                // adapter's (`split_argmax_matches_the_reference` has no NaN).
                let opts = CompileOptions { split_reductions: SplitReductions::Off, ..Default::default() };
                let exe = device.compile(&g, &[y.id()], &opts).unwrap();
                let case = format!("{dims:?} along {axis}, {dtype}, {forms} forms");
                let stats = exe.stats();
                let forms_of: Vec<_> =
                    stats.kernels.iter().filter(|k| k.label.contains("argmax")).map(|k| k.form).collect();
                if forms_of.is_empty() || !forms_of.iter().all(|f| matches!(f, KernelForm::Row { .. })) {
                    failures.push(format!("{case}: argmax kernels {forms_of:?}"));
                }
                let got = exe.run(&[("x", &xv)]).unwrap()[0].to_f64();
                if got != want {
                    let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                    failures.push(format!("{case}: row {first}: {} against {}", got[first], want[first]));
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 24);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A head's argmax over the products of a long row (2,048 logits, each a 2,048-long product
/// with a bf16 weight read transposed, as a Llama head's): the reference's index in the
/// adapter's forms and a GPU's. Fused into the argmax's loop kernel, every logit was computed
/// inside one invocation's scan, which on lavapipe gave another index (a random
/// Llama-3.2-1B-shaped model's greedy token was not the reference's).
#[test]
fn a_heads_argmax_over_long_products_matches_the_reference() {
    let (n, k) = (2048usize, 2048usize);
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [1, k]).unwrap();
    let w = b.input("w", DType::BF16, [n, k]).unwrap();
    let logits = x.matmul(&w.cast(DType::F32).unwrap().t().unwrap()).unwrap();
    let y = logits.argmax(1, false).unwrap();
    let g = b.graph();
    let xv = HostTensor::from_f64(DType::F32, [1, k], &uniform(5, k, -1.0, 1.0)).unwrap();
    let wv = HostTensor::from_f64(DType::BF16, [n, k], &uniform(6, n * k, -0.05, 0.05)).unwrap();
    let feeds = BTreeMap::from([("x".to_string(), xv.clone()), ("w".to_string(), wv.clone())]);
    let out = evaluate(&g, &[y.id(), logits.id()], &feeds, &BTreeMap::new()).unwrap();
    let (want, l) = (out[0].to_f64()[0], out[1].to_f64());
    // The reference's maximum stands clear of the runner-up by more than rounding.
    let mut sorted = l.clone();
    sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
    assert!(sorted[0] - sorted[1] > 1e-4, "{:?}", &sorted[..2]);
    for (forms, device) in [("adapter", device()), ("gpu", gpu_forms())] {
        let exe = device.compile(&g, &[y.id()], &CompileOptions::default()).unwrap();
        let got = exe.run(&[("x", &xv), ("w", &wv)]).unwrap()[0].to_f64()[0];
        assert_eq!(got, want, "{forms} forms");
    }
}
