//! Device tests: every catalog case runs on the device (one kernel per op) and matches the
//! CPU reference within a per-dtype tolerance, in both f16 forms where the adapter has
//! native f16. The backend is whatever `FUSEGRAPH_BACKEND` picks (CI runs Vulkan and GL).

use crate::common;

use crate::common::{devices, run_case, Case};
use fusegraph::crates::reference::{assert_close, evaluate, tolerance};
use fusegraph::{CompileOptions, Device, FusionMode, HostTensor, KernelForm};
use std::collections::BTreeMap;
use std::sync::Arc;

fn check(device: &Arc<Device>, case: &Case, fusion: FusionMode) -> Result<(), String> {
    run_case(device, case, &CompileOptions { fusion, simplify: fusion == FusionMode::On, ..Default::default() })
        .map(|_| ())
}

fn run_all(cases: &[Case], fusion: FusionMode) {
    let mut failures = Vec::new();
    let mut ran = 0;
    for (form, device) in devices() {
        eprintln!("device: {} ({form})", device.describe());
        for case in cases {
            ran += 1;
            if let Err(e) = check(&device, case, fusion) {
                failures.push(format!("{} [{form}]: {e}", case.name));
            }
        }
    }
    eprintln!("{ran} device checks, {} failed", failures.len());
    assert!(failures.is_empty(), "{} of {ran} failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn every_op_matches_the_reference_unfused() {
    run_all(&common::catalog(1), FusionMode::Off);
}

#[test]
fn large_tensors_split_the_dispatch() {
    run_all(&common::large_cases(), FusionMode::Off);
}

#[test]
fn every_op_matches_the_reference_fused() {
    let mut cases = common::catalog(7);
    cases.extend(common::composite_cases());
    run_all(&cases, FusionMode::On);
}

/// The op catalog fused, with every kernel in the forms a GPU gets
/// ([`DeviceOptions::gpu_kernels`](fusegraph::DeviceOptions::gpu_kernels): loop kernels
/// without a CPU's serial steps, workgroup-per-row reductions, the workgroup-tiled matmul and
/// convolution, tiled attention, a GPU's split-reduction rule), which a CPU adapter never
/// picks on its own.
#[test]
fn every_op_matches_the_reference_fused_in_gpu_forms() {
    let device =
        Arc::new(Device::new(&fusegraph::DeviceOptions { gpu_kernels: true, ..Default::default() }).expect("a device"));
    eprintln!("device: {} (GPU forms)", device.describe());
    let mut cases = common::catalog(11);
    cases.extend(common::composite_cases());
    let mut failures = Vec::new();
    for case in &cases {
        if let Err(e) = check(&device, case, FusionMode::On) {
            failures.push(format!("{}: {e}", case.name));
        }
    }
    eprintln!("{} cases, {} failed", cases.len(), failures.len());
    assert!(failures.is_empty(), "{} of {} failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

/// The op catalog fused with the loop and row families mixed as a device's measurement may
/// mix them ([`fusegraph::KernelForms`]): serial loops with workgroup-per-row reductions,
/// and parallel loops with invocation-per-row ones, a case each in turn (f32 and f16 native
/// and packed, as [`devices`] has them).
#[test]
fn every_op_matches_the_reference_fused_in_mixed_forms() {
    use fusegraph::{KernelForms, Spread};
    let mixes = [(Spread::Serial, Spread::Parallel), (Spread::Parallel, Spread::Serial)];
    let mut cases = common::catalog(13);
    cases.extend(common::composite_cases());
    let mut failures = Vec::new();
    let mut ran = 0;
    for (form, device) in devices() {
        eprintln!("device: {} ({form})", device.describe());
        for (i, case) in cases.iter().enumerate() {
            ran += 1;
            let (loops, rows) = mixes[i % 2];
            let forms = KernelForms { loops, rows, ..device.kernel_forms() };
            let opts = CompileOptions { kernel_forms: Some(forms), ..Default::default() };
            if let Err(e) = run_case(&device, case, &opts) {
                failures.push(format!("{} [{form}, loops {loops}, rows {rows}]: {e}", case.name));
            }
        }
    }
    assert!(ran >= cases.len(), "{ran} runs");
    eprintln!("{ran} runs, {} failed", failures.len());
    assert!(failures.is_empty(), "{} failed:\n{}", failures.len(), failures.join("\n"));
}

/// Few long rows: each row is shared by a workgroup (the tree strategy), reduced within
/// subgroups where the device has them. Sum, max, min and product in f32, f16 and i32, and
/// the softmax and layer-norm row kernels, against the reference.
#[test]
fn rows_shared_by_a_workgroup_match_the_reference() {
    use common::{CaseBuilder, Domain};
    use fusegraph::crates::passes::partition;
    use fusegraph::crates::wgsl::{lower, LowerOptions};
    use fusegraph::{DType, ReduceKind};
    let mut cases = Vec::new();
    for (i, dt) in [DType::F32, DType::F16, DType::I32].into_iter().enumerate() {
        for kind in [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min, ReduceKind::Prod] {
            // Products stay finite over 64 values in [0.25, 3] (integers: small values wrap
            // identically on both sides).
            let (len, domain) = if kind == ReduceKind::Prod { (64, Domain::Positive) } else { (1000, Domain::Any) };
            let mut c = CaseBuilder::new(40 + i as u64);
            let x = c.input(dt, &[3, len], domain);
            let y = x.reduce(kind, &[1], false).unwrap();
            cases.push(c.finish(format!("rows_{kind:?}_{dt}"), &[&y]));
        }
        let mut c = CaseBuilder::new(50 + i as u64);
        if dt.is_float() {
            let x = c.input(dt, &[5, 777], Domain::Any);
            let s = x.softmax(1).unwrap();
            let n = x.layer_norm(&[1], 1e-5).unwrap();
            cases.push(c.finish(format!("rows_softmax_layer_norm_{dt}"), &[&s, &n]));
        }
    }
    let device = Device::shared().expect("a device");
    let cpu = device.info().device_type == fusegraph::crates::runtime::WgpuDeviceType::Cpu;
    let subgroups = device.features().contains(fusegraph::crates::runtime::WgpuFeatures::SUBGROUP);
    let opts = LowerOptions { subgroups, ..common::lower_options(cpu, device.f16_native()) };
    let mut failures = Vec::new();
    for case in &cases {
        // The fused kernels share rows among a workgroup; with subgroups they use them.
        let kernels = partition(&case.graph, &case.outputs, FusionMode::On).unwrap();
        let forms: Vec<_> = kernels.iter().map(|k| lower(&case.graph, k, &opts).form).collect();
        let shared = |f: &KernelForm| matches!(f, KernelForm::Row { shared: true, .. });
        assert!(forms.iter().any(shared), "{}: not a shared-row kernel: {forms:?}", case.name);
        let subgroups = forms.iter().any(|f| matches!(f, KernelForm::Row { subgroups: true, .. }));
        assert_eq!(subgroups, opts.subgroups, "{}", case.name);
        if let Err(e) = check(&device, case, FusionMode::On) {
            failures.push(format!("{}: {e}", case.name));
        }
    }
    eprintln!("{} cases on {} (subgroups: {})", cases.len(), device.describe(), opts.subgroups);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `tanh` is a rational fit, not the driver's builtin (`fg_tanh`): within 1e-6 of the f64
/// value over [-20, 20] (past the fit's clamp at ±7.9 it is ±1), for tiny arguments and for
/// ±0, ±∞ and NaN. 40 001 elements: a ragged tail for the kernels that compute
/// several elements per invocation on a CPU adapter; fused (one chained kernel) and not.
#[test]
fn tanh_matches_f64_over_its_whole_range() {
    use fusegraph::{DType, GraphBuilder};
    let mut xs: Vec<f32> = (0..40_001).map(|k| -20.0 + 40.0 * k as f32 / 40_000.0).collect();
    let specials = [0.0, -0.0, 1e-30, -3e-5, 3.9e-4, 4.1e-4, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 7.9, 7.91];
    xs[..specials.len()].copy_from_slice(&specials);
    let n = xs.len();
    let device = Device::shared().expect("a device");
    for fusion in [FusionMode::Off, FusionMode::On] {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [n]).unwrap();
        // tanh(x) and, in a chain, tanh(tanh(x) * 8) (arguments past the clamp again).
        let t = x.tanh().unwrap();
        let t2 = t.mul_scalar(8.0).unwrap().tanh().unwrap();
        let exe =
            device.compile(&b.graph(), &[t.id(), t2.id()], &CompileOptions { fusion, ..Default::default() }).unwrap();
        let got = exe.run(&[("x", &HostTensor::new([n], xs.clone()).unwrap())]).unwrap();
        let (g1, g2) = (got[0].to_f64(), got[1].to_f64());
        for (k, &x) in xs.iter().enumerate() {
            let want1 = (x as f64).tanh();
            let want2 = ((want1 as f32 * 8.0) as f64).tanh();
            for (got, want, what) in [(g1[k], want1, "tanh(x)"), (g2[k], want2, "tanh(8 tanh(x))")] {
                let ok = if want.is_nan() { got.is_nan() } else { (got - want).abs() <= 1e-6 * want.abs().max(1e-3) };
                assert!(ok, "{what} at x = {x:e} ({fusion:?}): got {got:e}, want {want:e}");
            }
        }
        // -0 keeps its sign.
        assert!(g1[1] == 0.0 && g1[1].is_sign_negative(), "tanh(-0) = {:e}", g1[1]);
    }
}

/// Softmax rows on a CPU adapter take the max and the sum of `exp(x - max)` in one pass (the
/// online softmax). Checked against the reference on rows with masked (−∞) elements ahead of
/// and between finite ones, an all-masked row, +∞ and NaN (NaN rows where the reference has
/// them), ragged rows (37, not a multiple of the 4 partials), fused; and the pass is in the
/// generated code for a CPU adapter.
#[test]
fn softmax_rows_in_one_pass_match_the_reference_with_masks_and_infinities() {
    use fusegraph::crates::passes::partition;
    use fusegraph::crates::wgsl::{lower, LowerOptions};
    let (rows, cols) = (24, 37);
    let mut rng = common::Rng::new(77);
    let mut v: Vec<f32> = (0..rows * cols).map(|_| rng.uniform(-6.0, 6.0) as f32).collect();
    let ninf = f32::NEG_INFINITY;
    v[..5].fill(ninf); // row 0: masked ahead of the first finite element
    for e in 0..cols {
        v[cols + e] = ninf; // row 1: all masked
        if e % 2 == 1 {
            v[4 * cols + e] = ninf; // row 4: every other element masked
        }
        if e + 1 < cols {
            v[5 * cols + e] = ninf; // row 5: only the last element finite
        }
    }
    v[2 * cols + 17] = f32::INFINITY; // row 2
    v[3 * cols + 9] = f32::NAN; // row 3
    let x = HostTensor::new(vec![rows, cols], v).unwrap();
    let b = fusegraph::GraphBuilder::new();
    let xi = b.input("x", fusegraph::DType::F32, vec![rows, cols]).unwrap();
    let y = xi.softmax(1).unwrap();
    let g = b.graph();
    let feeds: BTreeMap<String, HostTensor> = [("x".to_string(), x.clone())].into();
    let want = evaluate(&g, &[y.id()], &feeds, &BTreeMap::new()).unwrap();
    let device = Device::shared().expect("a device");
    let exe = device.compile(&g, &[y.id()], &CompileOptions::default()).unwrap();
    let got = exe.run(&[("x", &x)]).unwrap();
    assert_close(&got[0], &want[0], 1e-5, 1e-6).unwrap();
    // Rows 1 and 2 are NaN in the reference; row 0's masked elements are 0, row 5 is one-hot.
    let w = want[0].to_f64();
    assert!(w[cols].is_nan() && w[2 * cols].is_nan() && w[0] == 0.0 && w[6 * cols - 1] == 1.0);
    let kernels = partition(&g, &[y.id()], FusionMode::On).unwrap();
    let opts = LowerOptions { subgroups: true, subgroup_size: Some(8), ..common::lower_options(true, false) };
    let wgsl = lower(&g, &kernels[0], &opts).wgsl;
    assert_eq!(kernels.len(), 1);
    assert!(wgsl.contains("let n0 = max(m0, x0);") && wgsl.matches("exp(").count() >= 4, "{wgsl}");
}

/// A layer norm's two sums (of `x`, then of `(x - mean)²`) take one pass over each row
/// (Welford's updates, partials combined by Chan's rule), in the one-invocation-per-row form
/// (many rows; on a CPU adapter four partials side by side, here also rows shorter than
/// that) and the workgroup form (few rows; most invocations own no element of a 3-long
/// row). The rows sit at 1e4 with a spread of 1: a one-pass `Σx² - n·mean²` in f32 would
/// lose the variance to cancellation. A difference from a value that varies along the row
/// (a per-column vector) is not a variance and keeps its own pass.
#[test]
fn variance_rows_in_one_pass_match_the_reference_far_from_zero() {
    use fusegraph::crates::passes::partition;
    use fusegraph::crates::wgsl::{lower, LowerOptions};
    use fusegraph::DType;
    let device = Device::shared().expect("a device");
    let cpu = device.info().device_type == fusegraph::crates::runtime::WgpuDeviceType::Cpu;
    let subgroups = device.features().contains(fusegraph::crates::runtime::WgpuFeatures::SUBGROUP);
    let opts = LowerOptions { subgroups, ..common::lower_options(cpu, false) };
    let mut rng = common::Rng::new(91);
    for (rows, cols) in [(40, 103), (33, 2), (20, 3), (3, 777), (2, 3)] {
        let v: Vec<f32> = (0..rows * cols).map(|_| (1e4 + rng.uniform(-1.0, 1.0)) as f32).collect();
        let c: Vec<f32> = (0..cols).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
        let x = HostTensor::new(vec![rows, cols], v).unwrap();
        let col = HostTensor::new(vec![cols], c).unwrap();
        let what = format!("{rows}x{cols}");
        for by_column in [false, true] {
            let b = fusegraph::GraphBuilder::new();
            let xi = b.input("x", DType::F32, vec![rows, cols]).unwrap();
            let ci = b.input("c", DType::F32, vec![cols]).unwrap();
            let y = if by_column {
                // Σ x and Σ (x - c)² with `c` varying along the row.
                let d = xi.sub(&ci.add_scalar(1e4).unwrap()).unwrap();
                xi.sum(&[1], false).unwrap().add(&d.mul(&d).unwrap().sum(&[1], false).unwrap()).unwrap()
            } else {
                xi.layer_norm(&[1], 1e-5).unwrap().add(&ci).unwrap()
            };
            let g = b.graph();
            let feeds: BTreeMap<String, HostTensor> =
                [("x".to_string(), x.clone()), ("c".to_string(), col.clone())].into();
            let want = evaluate(&g, &[y.id()], &feeds, &BTreeMap::new()).unwrap();
            let exe = device.compile(&g, &[y.id()], &CompileOptions::default()).unwrap();
            let got = exe.run(&[("x", &x), ("c", &col)]).unwrap();
            let kernels = partition(&g, &[y.id()], FusionMode::On).unwrap();
            let wgsl: String = kernels.iter().map(|k| lower(&g, k, &opts).wgsl).collect();
            assert_eq!(kernels.len(), 1, "{what}");
            assert_eq!(wgsl.contains("m0 = m0 + d0 / n0;"), !by_column, "{what} by column {by_column}:\n{wgsl}");
            if by_column {
                assert_close(&got[0], &want[0], 1e-5, 1e-3).map_err(|e| format!("{what} by column: {e}")).unwrap();
                continue;
            }
            // Against the layer norm in f64 of the same f32 inputs (the reference sums in
            // f32, whose mean at 1e4 is off by up to 3e-3 here). Near 1e4 an f32 step is
            // 1e-3, and a running mean gathers a few steps of rounding: within 3.5 steps of
            // the row's spread (a variance lost to cancellation would be off by whole units).
            let cs = col.to_f64();
            let got = got[0].to_f64();
            for (r, row) in x.to_f64().chunks(cols).enumerate() {
                let mean = row.iter().sum::<f64>() / cols as f64;
                let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
                let std = (var + 1e-5).sqrt();
                for (e, v) in row.iter().enumerate() {
                    let want = (v - mean) / std + cs[e];
                    let tol = 3.5e-3 / std * ((v - mean) / std).abs().max(1.0);
                    let g = got[r * cols + e];
                    assert!(
                        (g - want).abs() <= tol,
                        "{what} layer norm at [{r}, {e}]: got {g}, want {want} (tol {tol})"
                    );
                }
            }
        }
    }
}

/// On a CPU adapter a loop kernel whose outputs are of one length divisible by 4 walks four
/// adjacent elements per step and moves whole `vec4`s: of its f32 and i32 outputs and of
/// the inputs it reads at their own index. The same input read through a transpose, and a
/// bool output, go element by element in the same kernel. Against the reference, with the
/// WGSL checked for those forms (a 63-element variant keeps the strided form).
#[test]
fn loop_kernels_move_vec4s_on_a_cpu_adapter() {
    use fusegraph::crates::passes::partition;
    use fusegraph::crates::wgsl::lower;
    use fusegraph::DType;
    let device = Device::shared().expect("a device");
    let opts = crate::common::lower_options(true, false);
    let mut rng = common::Rng::new(5);
    for (rows, cols) in [(12, 12), (9, 7)] {
        let n = rows * cols;
        let xv: Vec<f32> = (0..n).map(|_| rng.uniform(-2.0, 2.0) as f32).collect();
        let kv: Vec<i32> = (0..n).map(|_| rng.uniform(-50.0, 50.0) as i32).collect();
        let x = HostTensor::new(vec![rows, cols], xv).unwrap();
        let k = HostTensor::new(vec![rows, cols], kv).unwrap();
        let b = fusegraph::GraphBuilder::new();
        let xi = b.input("x", DType::F32, vec![rows, cols]).unwrap();
        let ki = b.input("k", DType::I32, vec![rows, cols]).unwrap();
        // The transpose needs a square x (the 9x7 case reads x twice at its own index).
        let other = if rows == cols { xi.t().unwrap() } else { xi.neg().unwrap() };
        let a = xi.mul(&other).unwrap().tanh().unwrap().add_scalar(1.0).unwrap();
        let p = xi.gt(&other).unwrap();
        let c = ki.add(&ki).unwrap().mul(&xi.mul_scalar(10.0).unwrap().cast(DType::I32).unwrap()).unwrap();
        let outs = [a.id(), c.id(), p.id()];
        let g = b.graph();
        let feeds: BTreeMap<String, HostTensor> = [("x".to_string(), x.clone()), ("k".to_string(), k.clone())].into();
        let want = evaluate(&g, &outs, &feeds, &BTreeMap::new()).unwrap();
        let exe = device.compile(&g, &outs, &CompileOptions::default()).unwrap();
        let got = exe.run(&[("x", &x), ("k", &k)]).unwrap();
        for (o, (gv, wv)) in got.iter().zip(&want).enumerate() {
            let (rtol, atol) = tolerance(wv.dtype());
            assert_close(gv, wv, rtol, atol).map_err(|e| format!("{rows}x{cols} output {o}: {e}")).unwrap();
        }
        let kernels = partition(&g, &outs, FusionMode::On).unwrap();
        let labels: Vec<String> = kernels.iter().map(|k| lower(&g, k, &opts).label).collect();
        assert_eq!(kernels.len(), 1, "{rows}x{cols}: one loop kernel: {labels:?}");
        let wgsl = lower(&g, &kernels[0], &opts).wgsl;
        let quads = wgsl.matches("array<vec4<").count();
        if n % 4 == 0 {
            // x, k, and the f32 and i32 outputs; the bool output stays u32.
            assert_eq!(quads, 4, "{wgsl}");
            assert!(wgsl.contains("= vec4<f32>(") && wgsl.contains("= vec4<i32>("), "{wgsl}");
            assert!(wgsl.contains("[i >> 2u][i & 3u]"), "the transposed read goes by element:\n{wgsl}");
        } else {
            assert_eq!(quads, 0, "{wgsl}");
        }
    }
    // A per-column vector broadcast along the rows is read a vec4 at a time where the rows
    // are of a length divisible by 4 (a bias add), element by element where not.
    for cols in [12, 7] {
        let x =
            HostTensor::new(vec![5, cols], (0..5 * cols).map(|_| rng.uniform(-1.0, 1.0) as f32).collect::<Vec<_>>());
        let w = HostTensor::new(vec![cols], (0..cols).map(|_| rng.uniform(-1.0, 1.0) as f32).collect::<Vec<_>>());
        let (x, w) = (x.unwrap(), w.unwrap());
        let b = fusegraph::GraphBuilder::new();
        let y = b.input("x", DType::F32, vec![5, cols]).unwrap().mul_scalar(2.0).unwrap();
        let y = y.add(&b.input("w", DType::F32, vec![cols]).unwrap()).unwrap();
        let g = b.graph();
        let feeds: BTreeMap<String, HostTensor> = [("x".to_string(), x.clone()), ("w".to_string(), w.clone())].into();
        let want = evaluate(&g, &[y.id()], &feeds, &BTreeMap::new()).unwrap();
        let got =
            device.compile(&g, &[y.id()], &CompileOptions::default()).unwrap().run(&[("x", &x), ("w", &w)]).unwrap();
        assert_close(&got[0], &want[0], 1e-6, 1e-6).map_err(|e| format!("bias add over rows of {cols}: {e}")).unwrap();
        let kernels = partition(&g, &[y.id()], FusionMode::On).unwrap();
        let wgsl = lower(&g, &kernels[0], &opts).wgsl;
        assert_eq!(wgsl.contains(&format!("b1[(i_0 % {cols}u) >> 2u]")), cols % 4 == 0, "{wgsl}");
    }
}

/// On a CPU adapter, a row kernel with one invocation per row whose rows are contiguous
/// and of a length divisible by 4 walks each row four adjacent elements per step in every
/// pass: the reductions' inputs and the full outputs' regions computed side by side, `vec4`
/// inputs read whole, f32 full outputs written whole; a broadcast read and a bool output go
/// element by element. A layer norm of a residual sum with a per-column scale, a softmax and
/// a comparison with the row mean, each one row kernel, against the reference; rows of 36
/// and of 34 (the strided form).
#[test]
fn row_kernels_move_vec4s_on_a_cpu_adapter() {
    use fusegraph::crates::passes::partition;
    use fusegraph::crates::wgsl::lower;
    use fusegraph::DType;
    let device = Device::shared().expect("a device");
    let opts = crate::common::lower_options(true, false);
    let mut rng = common::Rng::new(17);
    for cols in [36, 34] {
        let rows = 20;
        let mut t = |shape: &[usize]| {
            let n = shape.iter().product();
            HostTensor::new(shape.to_vec(), (0..n).map(|_| rng.uniform(-3.0, 3.0) as f32).collect::<Vec<f32>>())
                .unwrap()
        };
        let (x, r, gamma) = (t(&[rows, cols]), t(&[rows, cols]), t(&[cols]));
        for which in ["layer_norm", "softmax", "above_mean"] {
            let b = fusegraph::GraphBuilder::new();
            let xi = b.input("x", DType::F32, vec![rows, cols]).unwrap();
            let ri = b.input("r", DType::F32, vec![rows, cols]).unwrap();
            let gi = || b.input("g", DType::F32, vec![cols]).unwrap();
            let h = xi.add(&ri).unwrap();
            let y = match which {
                "layer_norm" => h.layer_norm(&[1], 1e-5).unwrap().mul(&gi()).unwrap().add_scalar(0.5).unwrap(),
                "softmax" => h.softmax(1).unwrap(),
                _ => {
                    let shift = gi().reshape(vec![1, cols]).unwrap().sum(&[1], true).unwrap();
                    h.gt(&h.mean(&[1], true).unwrap().add(&shift).unwrap()).unwrap()
                }
            };
            let g = b.graph();
            let mut feeds: BTreeMap<String, HostTensor> =
                [("x".to_string(), x.clone()), ("r".to_string(), r.clone())].into();
            if which != "softmax" {
                feeds.insert("g".to_string(), gamma.clone());
            }
            let want = evaluate(&g, &[y.id()], &feeds, &BTreeMap::new()).unwrap();
            let exe = device.compile(&g, &[y.id()], &CompileOptions::default()).unwrap();
            let used: Vec<String> = exe.inputs().into_iter().map(|(n, _)| n).collect();
            let feeds: Vec<(&str, &HostTensor)> = [("x", &x), ("r", &r), ("g", &gamma)]
                .into_iter()
                .filter(|(n, _)| used.iter().any(|u| u == n))
                .collect();
            let got = exe.run(&feeds).unwrap();
            let (rtol, atol) = tolerance(want[0].dtype());
            assert_close(&got[0], &want[0], rtol, atol).map_err(|e| format!("{which}, rows of {cols}: {e}")).unwrap();
            let kernels = partition(&g, &[y.id()], FusionMode::On).unwrap();
            let wgsl: Vec<String> = kernels.iter().map(|k| lower(&g, k, &opts).wgsl).collect();
            let all = wgsl.join("\n");
            let quads = wgsl.iter().filter(|w| w.contains("let i_0 = fg_elem(row, e);")).count();
            if cols % 4 == 0 {
                assert!(quads == 1 && all.contains("let vq"), "{which}: {all}");
                // The per-column scale, broadcast along the rows, is read a vec4 at a time.
                assert_eq!(all.contains("% 36u) >> 2u]"), which == "layer_norm", "{which}: {all}");
                assert_eq!(all.contains("[i_0 >> 2u] = vec4<f32>("), which != "above_mean", "{which}: {all}");
            } else {
                assert_eq!(quads, 0, "{which}: {all}");
            }
        }
    }
}

/// f16 on a CPU adapter: loop kernels read and write f16 four elements at a time as pairs of
/// words, converted by integer operations (`fg_f16x4_from_words`, `fg_f16x4_to_words` in
/// shaders/helpers.wgsl), in both f16 forms. Bit for bit against the reference, fused (one
/// kernel) and not, with f16 native and packed: every one of the 65 536 f16 bit patterns
/// negated and widened to f32 (both exact), and f32 values narrowed to f16 (rounded by the
/// cast, then stored exactly) at every kind of rounding boundary — each pattern's value, the
/// midpoint to the next pattern (a tie, to even) and one f32 step either side of it,
/// subnormals, the overflow at 65 520, f32 subnormals, ±0, ±inf and NaN. 65 534 elements (not a multiple of 4) take the element-wise
/// forms; the lowering for a CPU adapter is checked to take the words where it can.
#[test]
fn f16_moves_as_words_on_a_cpu_adapter() {
    use fusegraph::crates::passes::partition;
    use fusegraph::crates::wgsl::lower;
    use fusegraph::DType;
    use half::f16;
    let next_up = |v: f32| f32::from_bits(if v >= 0.0 { v.to_bits() + 1 } else { v.to_bits() - 1 });
    let next_down = |v: f32| f32::from_bits(if v > 0.0 { v.to_bits() - 1 } else { v.to_bits() + 1 });
    for n in [65536usize, 65534] {
        let xs: Vec<f16> = (0..n).map(|k| f16::from_bits(k as u16)).collect();
        let mut ys: Vec<f32> = (0..n)
            .map(|k| {
                let h = f16::from_bits(k as u16);
                let up = f16::from_bits((k as u16).wrapping_add(1));
                if !h.is_finite() || !up.is_finite() || (k & 0x7fff) == 0x7fff {
                    return h.to_f32();
                }
                // The midpoint of two adjacent f16 values has 12 significant bits: exact in f32.
                let mid = ((h.to_f64() + up.to_f64()) / 2.0) as f32;
                match k.wrapping_mul(2_654_435_761) >> 9 & 3 {
                    0 => h.to_f32(),
                    1 => mid,
                    2 => next_up(mid),
                    _ => next_down(mid),
                }
            })
            .collect();
        let specials = [
            65519.996,
            65520.0,
            -65520.0,
            65504.0,
            1e30,
            -f32::MAX,
            2.9802322e-8,
            2.9802326e-8,
            1e-8,
            1e-40,
            -1e-40,
            6.1035156e-5,
            6.103515e-5,
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1.0,
            -2.5,
        ];
        ys[..specials.len()].copy_from_slice(&specials);
        let x = HostTensor::new(vec![n], xs).unwrap();
        let y = HostTensor::new(vec![n], ys).unwrap();
        let b = fusegraph::GraphBuilder::new();
        let xi = b.input("x", DType::F16, vec![n]).unwrap();
        let yi = b.input("y", DType::F32, vec![n]).unwrap();
        let outs = [xi.neg().unwrap().id(), xi.cast(DType::F32).unwrap().id(), yi.cast(DType::F16).unwrap().id()];
        let g = b.graph();
        let feeds: BTreeMap<String, HostTensor> = [("x".to_string(), x.clone()), ("y".to_string(), y.clone())].into();
        let want = evaluate(&g, &outs, &feeds, &BTreeMap::new()).unwrap();
        let bits = |t: &HostTensor| -> Vec<u32> {
            match t.dtype() {
                DType::F16 => t
                    .as_slice::<f16>()
                    .unwrap()
                    .iter()
                    .map(|v| if v.is_nan() { u32::MAX } else { v.to_bits() as u32 })
                    .collect(),
                _ => t
                    .as_slice::<f32>()
                    .unwrap()
                    .iter()
                    .map(|v| if v.is_nan() { u32::MAX } else { v.to_bits() })
                    .collect(),
            }
        };
        for (form, device) in devices() {
            for fusion in [FusionMode::On, FusionMode::Off] {
                let exe = device.compile(&g, &outs, &CompileOptions { fusion, ..Default::default() }).unwrap();
                let got = exe.run(&[("x", &x), ("y", &y)]).unwrap();
                for (o, (gv, wv)) in got.iter().zip(&want).enumerate() {
                    let (gb, wb) = (bits(gv), bits(wv));
                    let bad: Vec<String> = (0..n)
                        .filter(|&i| gb[i] != wb[i])
                        .take(5)
                        .map(|i| {
                            format!("[{i}] x {:#06x} y {:e}: got {:#x}, want {:#x}", i, y.to_f64()[i], gb[i], wb[i])
                        })
                        .collect();
                    assert!(bad.is_empty(), "n {n}, {form}, {fusion:?}, output {o}: {}", bad.join("; "));
                }
            }
        }
        // Two kernels: the outputs of x, and the cast of y (they share no input).
        let kernels = partition(&g, &outs, FusionMode::On).unwrap();
        assert_eq!(kernels.len(), 2);
        for f16_native in [true, false] {
            let opts = crate::common::lower_options(true, f16_native);
            let wgsl: Vec<String> = kernels.iter().map(|k| lower(&g, k, &opts).wgsl).collect();
            let wgsl = wgsl.join("\n");
            let words = wgsl.contains("fg_f16x4_from_words(b0[")
                && wgsl.matches("] = fg_f16x4_to_words(vec4<f32>(").count() == 2;
            assert_eq!(words, n % 4 == 0, "n {n}, f16 native {f16_native}:\n{wgsl}");
        }
    }
}

/// Single values computed from single-element inputs (an optimizer's bias corrections from
/// its step counter) are computed once per invocation at the start of `main`
/// (`fg_usN`), not once per use per element; fused results match the reference.
#[test]
fn uniform_scalars_are_computed_once_per_invocation() {
    use fusegraph::crates::passes::{fuse, simplify, FusionOptions};
    use fusegraph::crates::wgsl::{lower, LowerOptions};
    use fusegraph::DType;
    let device = Device::shared().expect("a device");
    let mut rng = common::Rng::new(11);
    let b = fusegraph::GraphBuilder::new();
    let step = b.input("step", DType::F32, Vec::<usize>::new()).unwrap();
    let x = b.input("x", DType::F32, [300, 7]).unwrap();
    let w = b.parameter("w", DType::F32, [300, 7]).unwrap();
    let t = step.add_scalar(1.0).unwrap();
    let decay =
        |beta: f64| b.scalar(DType::F32, beta).unwrap().pow(&t).unwrap().neg().unwrap().add_scalar(1.0).unwrap();
    let lr = b.scalar(DType::F32, 0.01).unwrap().div(&decay(0.9)).unwrap();
    let root = decay(0.7).sqrt().unwrap(); // (1 − 0.999ᵗ loses digits to cancellation)
    let y = w
        .sub(&x.mul(&lr.broadcast_to([300, 7]).unwrap()).unwrap().div(&root.broadcast_to([300, 7]).unwrap()).unwrap())
        .unwrap();
    let (mut g, mut outs) = (b.graph(), vec![t.id(), y.id()]);
    let sv = HostTensor::new(Vec::<usize>::new(), vec![rng.uniform(1.0, 20.0).round() as f32]).unwrap();
    let xv = HostTensor::new(vec![300, 7], (0..2100).map(|_| rng.uniform(-2.0, 2.0) as f32).collect()).unwrap();
    let wv = HostTensor::new(vec![300, 7], (0..2100).map(|_| rng.uniform(-1.0, 1.0) as f32).collect()).unwrap();
    let feeds: BTreeMap<String, HostTensor> = [("step".to_string(), sv.clone()), ("x".to_string(), xv.clone())].into();
    let params: BTreeMap<String, HostTensor> = [("w".to_string(), wv.clone())].into();
    let want = evaluate(&g, &outs, &feeds, &params).unwrap();
    let mut exe = device.compile(&g, &outs, &CompileOptions::default()).unwrap();
    exe.set_parameter("w", &wv).unwrap();
    let got = exe.run(&[("step", &sv), ("x", &xv)]).unwrap();
    for (o, (gv, wv)) in got.iter().zip(&want).enumerate() {
        let (rtol, atol) = tolerance(wv.dtype());
        assert_close(gv, wv, rtol, atol).map_err(|e| format!("output {o}: {e}")).unwrap();
    }
    // The kernel of `y` computes the two corrections up front.
    simplify(&mut g, &mut outs).unwrap();
    let kernels = fuse(&g, &outs, &FusionOptions { max_bindings: 32, ..Default::default() }).unwrap().kernels;
    for cpu in [false, true] {
        let srcs: Vec<String> = kernels
            .iter()
            .map(|k| lower(&g, k, &LowerOptions { forms: cpu_forms(cpu), ..Default::default() }).wgsl)
            .collect();
        let of_y = srcs.iter().find(|s| s.contains("pow(")).expect("a kernel computes the corrections");
        let main = &of_y[of_y.find("fn main(").unwrap()..];
        let first = main.lines().nth(1).unwrap_or_default();
        assert!(first.trim_start().starts_with("fg_us0 = fg_u"), "{of_y}");
        assert!(main.matches("fg_us").count() >= 2, "{of_y}");
    }
}

/// The serial forms (a CPU adapter's) or the parallel ones.
fn cpu_forms(cpu: bool) -> fusegraph::crates::wgsl::Forms {
    if cpu {
        fusegraph::crates::wgsl::Forms::SERIAL
    } else {
        fusegraph::crates::wgsl::Forms::PARALLEL
    }
}

/// A concat of more operands than a kernel may bind (the gradients of a whole model,
/// flattened: data parallelism's vector) runs as a tree of concats, fused and unfused, in
/// every form.
#[test]
fn a_concat_wider_than_the_adapters_bindings_runs() {
    for (form, device) in devices() {
        let parts = device.limits().max_storage_buffers_per_shader_stage as usize * 2 + 5;
        let mut c = common::CaseBuilder::new(31);
        let xs: Vec<_> =
            (0..parts).map(|i| c.input(fusegraph::DType::F32, &[i % 4 + 1], common::Domain::Any)).collect();
        let refs: Vec<_> = xs.iter().collect();
        let cat = xs[0].builder().concat(&refs, 0).unwrap().mul_scalar(0.5).unwrap();
        let case = c.finish("wide concat", &[&cat]);
        for fusion in [FusionMode::On, FusionMode::Off] {
            check(&device, &case, fusion).unwrap_or_else(|e| panic!("{parts} parts [{form}, {fusion:?}]: {e}"));
        }
    }
}

/// A GPU's loop kernel over at least `GPU_INTERLEAVE_MIN × GPU_QUADS` elements takes
/// `GPU_QUADS` vec4s per invocation (quads `t + j·stride`, the last step ragged): forced on
/// this adapter, two outputs of one fused kernel (one of them read through a row vector
/// broadcast along the rows) match the reference, f32 and f16 in both storage forms, with
/// the dispatch a quarter of the one-vec4 form's.
#[test]
fn large_loop_kernels_in_the_gpu_form_match_the_reference() {
    use common::{CaseBuilder, Domain};
    use fusegraph::crates::wgsl::{GPU_QUADS, WORKGROUP_SIZE};
    use fusegraph::{DType, KernelForms, Spread};
    // 65,537 rows of 64: past the threshold by a ragged 16 quads.
    let (rows, width) = (65_537usize, 64usize);
    let quads = (rows * width / 4) as u64;
    let want_workgroups = quads.div_ceil(GPU_QUADS * WORKGROUP_SIZE as u64);
    let mut failures = Vec::new();
    for (form, device) in devices() {
        for (i, dt) in [DType::F32, DType::F16].into_iter().enumerate() {
            let mut c = CaseBuilder::new(70 + i as u64);
            let x = c.input(dt, &[rows, width], Domain::Any);
            let y = c.input(dt, &[rows, width], Domain::Any);
            let bias = c.input(dt, &[width], Domain::Any);
            let b = bias.broadcast_to(vec![rows, width]).unwrap();
            let a = x.add(&b).unwrap().tanh().unwrap().mul_scalar(0.5).unwrap();
            let m = x.mul(&y).unwrap().sub(&b).unwrap();
            let case = c.finish(format!("gpu_quads_{dt}"), &[&a, &m]);
            let forms = KernelForms { loops: Spread::Parallel, ..device.kernel_forms() };
            let opts = CompileOptions { kernel_forms: Some(forms), ..Default::default() };
            match run_case(&device, &case, &opts) {
                Err(e) => failures.push(format!("{} [{form}]: {e}", case.name)),
                Ok(stats) => {
                    let loops: Vec<[u32; 3]> = stats
                        .kernels
                        .iter()
                        .filter(|k| matches!(k.form, KernelForm::Loop { quads: true }))
                        .map(|k| k.workgroups)
                        .collect();
                    let packed = dt == DType::F16 && !device.f16_native();
                    let dispatched = loops.iter().map(|w| w.iter().map(|&d| d as u64).product::<u64>()).next();
                    if !packed && dispatched != Some(want_workgroups) {
                        failures.push(format!("{} [{form}]: loop kernels dispatched {loops:?}", case.name));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A run's host share ([`fusegraph::Executable::last_run_host_ms`]) is 0 before the first
/// run, then positive and within the run's wall time.
#[test]
fn a_runs_host_share_is_within_its_wall_time() {
    use fusegraph::{DType, GraphBuilder};
    let device = Device::shared().expect("a device");
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![1024, 256]).unwrap();
    let y = x.tanh().unwrap().sum(&[1], false).unwrap();
    let exe = device.compile(&b.graph(), &[y.id()], &CompileOptions::default()).unwrap();
    assert_eq!(exe.last_run_host_ms(), 0.0);
    let feed =
        HostTensor::new([1024, 256], (0..1024 * 256).map(|i| (i % 7) as f32 * 0.1).collect::<Vec<f32>>()).unwrap();
    for _ in 0..3 {
        let start = std::time::Instant::now();
        exe.run(&[("x", &feed)]).unwrap();
        let wall = start.elapsed().as_secs_f64() * 1e3;
        let host = exe.last_run_host_ms();
        assert!(host > 0.0 && host <= wall, "host {host} ms of a {wall} ms run");
    }
}
