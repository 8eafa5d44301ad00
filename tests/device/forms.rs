//! Kernel forms by measurement ([`fusegraph::KernelForms`]): each kind of kernel whose form
//! is a choice (loops, rows, fused attention, texture operands) runs in either family on any
//! adapter, mixed as a tuner may mix them, matching the reference in f32 and f16; the
//! device measures the families once, caches them on disk and reads them back, and lowers
//! what it measured; `gpu_kernels` and forced forms measure nothing.

use crate::common::{random, Domain, Rng};
use fusegraph::crates::reference::{assert_close, evaluate, tolerance};
use fusegraph::crates::runtime::WgpuDeviceType;
use fusegraph::{
    CompileOptions, DType, Device, DeviceOptions, Graph, HostTensor, KernelForm, KernelForms, NodeId, Spread,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A softmax over 64 rows of 1024 of `tanh(1.5x + 0.25) · sigmoid(x)` (a row kernel) and,
/// apart, the same chain over 100 000 elements (a loop kernel), with random feeds.
fn program(dtype: DType) -> (Graph, Vec<NodeId>, Vec<(String, HostTensor)>) {
    let b = fusegraph::GraphBuilder::new();
    let mut rng = Rng::new(41);
    let chain = |x: &fusegraph::Tensor| {
        let a = x.mul_scalar(1.5).and_then(|a| a.add_scalar(0.25)).and_then(|a| a.tanh()).expect("chain");
        a.mul(&x.sigmoid().expect("sigmoid")).expect("chain")
    };
    let x = b.input("x", dtype, [64, 1024]).expect("x");
    let y = b.input("y", dtype, [100_000]).expect("y");
    let rows = chain(&x).softmax(1).expect("softmax");
    let loops = chain(&y);
    let feeds = vec![
        ("x".to_string(), random(&mut rng, dtype, &[64, 1024], Domain::Any)),
        ("y".to_string(), random(&mut rng, dtype, &[100_000], Domain::Any)),
    ];
    (b.graph(), vec![rows.id(), loops.id()], feeds)
}

#[test]
fn every_mix_of_loop_and_row_families_matches_the_reference() {
    let device = Arc::new(Device::new(&DeviceOptions { autotune: Some(false), ..Default::default() }).unwrap());
    let spreads = [Spread::Parallel, Spread::Serial];
    for dtype in [DType::F32, DType::F16] {
        let (g, outs, feeds) = program(dtype);
        let refs: Vec<(&str, &HostTensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let want = evaluate(&g, &outs, &feeds.iter().cloned().collect(), &BTreeMap::new()).expect("reference");
        for loops in spreads {
            for rows in spreads {
                let forms = KernelForms { loops, rows, ..KernelForms::GPU };
                let what = format!("{dtype:?}, loops {loops}, rows {rows}");
                let opts = CompileOptions { kernel_forms: Some(forms), ..Default::default() };
                let exe = device.compile(&g, &outs, &opts).unwrap_or_else(|e| panic!("[{what}] {e}"));
                let got = exe.run(&refs).unwrap_or_else(|e| panic!("[{what}] {e}")).into_vec();
                let (rtol, atol) = tolerance(dtype);
                for (o, (got, want)) in got.iter().zip(&want).enumerate() {
                    assert_close(got, want, rtol, atol).unwrap_or_else(|e| panic!("[{what}] output {o}: {e}"));
                }
                // Each kernel is in the family asked for: the row kernel an invocation per
                // row (serial) or a workgroup per row (parallel); the loop kernel, below the
                // parallel family's interleaving threshold, four elements per invocation only
                // in the serial family.
                let kernels = &exe.stats().kernels;
                let row = kernels.iter().find(|k| matches!(k.form, KernelForm::Row { .. })).expect("a row kernel");
                assert!(
                    matches!(row.form, KernelForm::Row { shared, .. } if shared == (rows == Spread::Parallel)),
                    "[{what}] {:?}",
                    row.form
                );
                let lp = kernels.iter().find(|k| matches!(k.form, KernelForm::Loop { .. })).expect("a loop kernel");
                assert_eq!(lp.form, KernelForm::Loop { quads: loops == Spread::Serial }, "[{what}]");
            }
        }
    }
}

#[test]
fn the_device_measures_each_family_once_caches_it_and_lowers_it() {
    let dir = std::env::temp_dir().join(format!("fusegraph-forms-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let opts = |gpu_kernels: bool| DeviceOptions {
        autotune: Some(true),
        cache_dir: Some(dir.clone()),
        gpu_kernels,
        ..Default::default()
    };
    // Forced forms and a GPU's forms measure nothing (a fused compile's cost model, measured
    // on first use, is measured in the device's forms: unfused here).
    let gpu = Arc::new(Device::new(&opts(true)).unwrap());
    assert_eq!(gpu.kernel_forms(), KernelForms::GPU);
    let first = Arc::new(Device::new(&opts(false)).unwrap());
    let (g, outs, feeds) = program(DType::F32);
    let forced = CompileOptions { kernel_forms: Some(KernelForms::GPU), ..CompileOptions::unfused() };
    first.compile(&g, &outs, &forced).unwrap();
    assert!(first.tuned().forms.is_empty(), "{:?}", first.tuned().forms);
    assert!(gpu.tuned().forms.is_empty());

    // Measured: every kind's two families timed, the faster (or the default) kept.
    let forms = first.kernel_forms();
    let tuned = first.tuned().forms;
    let kinds: Vec<&str> = tuned.iter().map(|t| t.kind.as_str()).collect();
    for kind in ["attention", "loops", "rows"] {
        assert!(kinds.contains(&kind), "{kind} not measured: {tuned:?}");
    }
    for t in &tuned {
        assert_eq!(t.timings.len(), 2, "{t:?}");
        assert!(t.timings.iter().all(|(_, ms)| *ms > 0.0), "{t:?}");
        assert!(t.timings.iter().any(|(c, _)| *c == t.choice), "{t:?}");
    }
    let choice = |kind: &str| tuned.iter().find(|t| t.kind == kind).map(|t| t.choice.clone()).unwrap();
    assert_eq!(forms.loops.to_string(), choice("loops"));
    assert_eq!(forms.rows.to_string(), choice("rows"));
    assert_eq!(forms.tiled_attention, choice("attention") == "tiled");
    assert_eq!(forms.texture_operands, kinds.contains(&"textures") && choice("textures") == "on");
    println!("measured forms: {tuned:?}");

    // On disk, and read back by another device without measuring.
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("forms-v1-"))
        .expect("a forms cache file");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains(&format!("loops = {}\n", forms.loops)), "{text}");
    let second = Arc::new(Device::new(&opts(false)).unwrap());
    assert_eq!(second.kernel_forms(), forms);
    assert!(second.tuned().forms.iter().all(|t| t.timings.is_empty()), "read, not measured");

    // A compile without forced forms lowers the measured ones.
    let exe = second.compile(&g, &outs, &CompileOptions::default()).unwrap();
    let row = exe.stats().kernels.iter().find(|k| matches!(k.form, KernelForm::Row { .. })).cloned().unwrap();
    assert!(matches!(row.form, KernelForm::Row { shared, .. } if shared == (forms.rows == Spread::Parallel)));
    let refs: Vec<(&str, &HostTensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let want = evaluate(&g, &outs, &feeds.iter().cloned().collect(), &BTreeMap::new()).unwrap();
    for (got, want) in exe.run(&refs).unwrap().into_vec().iter().zip(&want) {
        assert_close(got, want, 1e-5, 1e-5).unwrap();
    }

    // Unmeasured, the adapter's defaults: a CPU adapter's serial forms, a GPU's parallel.
    let off = Arc::new(Device::new(&DeviceOptions { autotune: Some(false), ..Default::default() }).unwrap());
    let cpu = off.info().device_type == WgpuDeviceType::Cpu;
    let default = if cpu { KernelForms::CPU } else { KernelForms::GPU };
    assert_eq!((off.kernel_forms().loops, off.kernel_forms().rows), (default.loops, default.rows));
    assert_eq!(off.kernel_forms().tiled_attention, default.tiled_attention);
    let _ = std::fs::remove_dir_all(&dir);
}
