//! Matmul autotuning on the device: a shape class is measured once, the choice is written to
//! the disk cache, a second device on the same adapter reads it back instead of measuring,
//! the off switch keeps the default tiling, and every choice computes what the reference
//! does. One test function for all that: its devices cache in a fresh folder. A second test checks the default per adapter kind (off on llvmpipe through
//! GL) without compiling anything.

use crate::common::{CaseBuilder, Domain};
use fusegraph::crates::reference::{assert_close, evaluate};
use fusegraph::crates::runtime::{Backend, Cooperative, WgpuBackend, WgpuDeviceType, TIMED_TILINGS};
use fusegraph::{CompileOptions, DType, Device, DeviceOptions, HostTensor, MatmulTiling, SplitK};
use std::collections::BTreeMap;
use std::sync::Arc;

#[test]
fn tuned_tilings_are_measured_once_cached_on_disk_and_reused() {
    let dir = std::env::temp_dir().join(format!("fusegraph-autotune-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Measurements cached in a fresh folder; the GPU's kernel forms (the tiled family, whose
    // tilings are tuned; `gpu_kernels` does not measure the family).
    let opts = |autotune: bool| DeviceOptions {
        autotune: Some(autotune),
        cache_dir: Some(dir.join("fusegraph")),
        gpu_kernels: true,
        ..Default::default()
    };

    // 256 × 256 × 66 (class k128): above the tuning threshold, quick to time.
    let mut c = CaseBuilder::new(11);
    let a = c.input(DType::F32, &[256, 66], Domain::Any);
    let b = c.input(DType::F32, &[66, 256], Domain::Any);
    let y = a.matmul(&b).unwrap().relu().unwrap();
    let case = c.finish("autotune", &[&y]);
    let feeds: BTreeMap<String, HostTensor> = case.feeds.iter().cloned().collect();
    let want = evaluate(&case.graph, &case.outputs, &feeds, &BTreeMap::new()).unwrap();
    let refs: Vec<(&str, &HostTensor)> = case.feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let run = |device: &Arc<Device>| -> MatmulTiling {
        let exe = device.compile(&case.graph, &case.outputs, &CompileOptions::default()).unwrap();
        let got = exe.run(&refs).unwrap();
        assert_close(&got[0], &want[0], 1e-4, 1e-3).unwrap();
        let tilings: Vec<MatmulTiling> = exe.stats().kernels.iter().filter_map(|k| k.matmul_tiling).collect();
        assert_eq!(tilings.len(), 1, "one tiled kernel");
        tilings[0]
    };

    let first = Arc::new(Device::new(&opts(true)).unwrap());
    let chosen = run(&first);
    let tuned = first.tuned().tilings;
    assert_eq!(tuned.len(), 1, "{tuned:?}");
    assert_eq!(tuned[0].class, "f32 b1 m256 n256 k128");
    assert_eq!(tuned[0].tiling, chosen);
    // A new class times a few candidates — the shape's default among them — and keeps the
    // fastest of them.
    assert_eq!(tuned[0].timings.len(), TIMED_TILINGS, "{tuned:?}");
    assert!(tuned[0].timings.iter().any(|t| t.0 == MatmulTiling::default_for(256, 256)), "{tuned:?}");
    let best = tuned[0].timings.iter().min_by(|x, y| x.1.total_cmp(&y.1)).unwrap().0;
    assert_eq!(best, chosen);
    eprintln!("timings: {:?}", tuned[0].timings.iter().map(|(t, ms)| format!("{t} {ms:.2} ms")).collect::<Vec<_>>());
    let files: Vec<_> = std::fs::read_dir(dir.join("fusegraph")).unwrap().flatten().map(|e| e.path()).collect();
    let cache = files.iter().find(|p| p.to_string_lossy().contains("tiling-v4")).expect("a tiling cache file");
    let text = std::fs::read_to_string(cache).unwrap();
    assert_eq!(text.trim(), format!("f32 b1 m256 n256 k128 = {chosen}"));

    // A second device on the same adapter reads the choice back: nothing is measured.
    let second = Arc::new(Device::new(&opts(true)).unwrap());
    assert_eq!(run(&second), chosen);
    let tuned = second.tuned().tilings;
    assert_eq!(tuned.len(), 1);
    assert!(tuned[0].timings.is_empty(), "read from the cache, not measured: {tuned:?}");

    // A damaged cache line is ignored and the class measured again.
    std::fs::write(cache, "f32 b1 m256 n256 k128 = 99x99/3x3/1\n").unwrap();
    let third = Arc::new(Device::new(&opts(true)).unwrap());
    run(&third);
    assert_eq!(third.tuned().tilings[0].timings.len(), TIMED_TILINGS);

    // Off: the default tiling for the shape, nothing tuned.
    let off = Arc::new(Device::new(&opts(false)).unwrap());
    assert!(!off.autotune());
    assert_eq!(run(&off), MatmulTiling::default_for(256, 256));
    assert!(off.tuned().tilings.is_empty());

    // Small products keep the default without measuring.
    let mut c = CaseBuilder::new(12);
    let a = c.input(DType::F32, &[33, 7], Domain::Any);
    let b = c.input(DType::F32, &[7, 65], Domain::Any);
    let small = c.finish("small", &[&a.matmul(&b).unwrap()]);
    let exe = second.compile(&small.graph, &small.outputs, &CompileOptions::default()).unwrap();
    assert_eq!(exe.stats().kernels[0].matmul_tiling, Some(MatmulTiling::default_for(33, 65)));
    assert_eq!(second.tuned().tilings.len(), 1);

    // An f16 product: on an adapter's own cooperative matrices the cooperative tilings are
    // candidates too (class `… coop`), and the kernel runs on them exactly when one of them
    // won; elsewhere the plain candidates only, and the plain kernel.
    let mut c = CaseBuilder::new(13);
    let a = c.input(DType::F16, &[256, 66], Domain::Any);
    let b = c.input(DType::F16, &[66, 256], Domain::Any);
    let half = c.finish("autotune_f16", &[&a.matmul(&b).unwrap()]);
    let exe = second.compile(&half.graph, &half.outputs, &CompileOptions::default()).unwrap();
    let feeds: BTreeMap<String, HostTensor> = half.feeds.iter().cloned().collect();
    let want = evaluate(&half.graph, &half.outputs, &feeds, &BTreeMap::new()).unwrap();
    let refs: Vec<(&str, &HostTensor)> = half.feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
    assert_close(&exe.run(&refs).unwrap()[0], &want[0], 2e-2, 1e-2).unwrap();
    let native = second.cooperative_matrix() == Some(Cooperative::Native);
    let tuned = second.tuned().tilings.into_iter().find(|t| t.class.starts_with("f16")).expect("the f16 class tuned");
    assert_eq!(tuned.class, if native { "f16 b1 m256 n256 k128 coop" } else { "f16 b1 m256 n256 k128" });
    // At most a few candidates, the plain default among them and, on cooperative matrices,
    // the default cooperative tiling too.
    assert_eq!(tuned.timings.len(), TIMED_TILINGS, "{tuned:?}");
    assert!(tuned.timings.iter().any(|t| t.0 == MatmulTiling::default_for(256, 256)), "{tuned:?}");
    assert_eq!(native, tuned.timings.iter().any(|t| t.0 == MatmulTiling::COOP_CANDIDATES[0]), "{tuned:?}");
    let kernel = &exe.stats().kernels[0];
    assert_eq!(kernel.matmul_tiling, Some(tuned.tiling));
    assert_eq!(kernel.cooperative_matmul(), tuned.tiling.is_cooperative(), "{tuned:?}");
    eprintln!("f16 timings: {:?}", tuned.timings.iter().map(|(t, ms)| format!("{t} {ms:.2} ms")).collect::<Vec<_>>());

    // Split-k, tuned: a 128×128 output over k 1024 is timed unsplit and in 2, 4 and 8 slices
    // (16 would leave slices of 64), the product and its sum together; the fastest is
    // kept, compiled, cached and read back.
    let mut c = CaseBuilder::new(14);
    let a = c.input(DType::F32, &[128, 1024], Domain::Any);
    let b = c.input(DType::F32, &[1024, 128], Domain::Any);
    let bias = c.input(DType::F32, &[128], Domain::Any);
    let skinny = c.finish("split_k_tuned", &[&a.matmul(&b).unwrap().add(&bias).unwrap()]);
    let feeds: BTreeMap<String, HostTensor> = skinny.feeds.iter().cloned().collect();
    let want = evaluate(&skinny.graph, &skinny.outputs, &feeds, &BTreeMap::new()).unwrap();
    let refs: Vec<(&str, &HostTensor)> = skinny.feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let tuned_split = CompileOptions { split_k: SplitK::Tuned, ..Default::default() };
    let run_split = |device: &Arc<Device>| -> usize {
        let exe = device.compile(&skinny.graph, &skinny.outputs, &tuned_split).unwrap();
        assert_close(&exe.run(&refs).unwrap()[0], &want[0], 1e-4, 2e-3).unwrap();
        exe.stats().kernels.len()
    };
    let kernels = run_split(&first);
    let splits = first.tuned().splits;
    assert_eq!(splits.len(), 1, "{splits:?}");
    assert_eq!(splits[0].class, "f32 b1 m128 n128 k1024");
    assert_eq!(splits[0].timings.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2, 4, 8]);
    let fastest = splits[0].timings.iter().min_by(|x, y| x.1.total_cmp(&y.1)).unwrap().0;
    assert_eq!(splits[0].splits, fastest);
    // The product and its epilogue in one kernel, or the split product and the sum.
    assert_eq!(kernels, if fastest == 1 { 1 } else { 2 }, "{splits:?}");
    eprintln!("split-k timings: {:?}", splits[0].timings);
    let files: Vec<_> = std::fs::read_dir(dir.join("fusegraph")).unwrap().flatten().map(|e| e.path()).collect();
    let cache = files.iter().find(|p| p.to_string_lossy().contains("splitk-v1")).expect("a split-k cache file");
    assert_eq!(std::fs::read_to_string(cache).unwrap().trim(), format!("f32 b1 m128 n128 k1024 = {fastest}"));
    // Read back, not measured; a cached choice of 2 slices is taken as it is.
    std::fs::write(cache, "f32 b1 m128 n128 k1024 = 2\n").unwrap();
    let fourth = Arc::new(Device::new(&opts(true)).unwrap());
    assert_eq!(run_split(&fourth), 2);
    assert!(fourth.tuned().splits[0].timings.is_empty(), "{:?}", fourth.tuned().splits);
    // Autotuning off: no split, nothing measured.
    assert_eq!(run_split(&off), 1);
    assert!(off.tuned().splits.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn autotuning_is_on_by_default_except_on_llvmpipe_through_gl() {
    let env = std::env::var("FUSEGRAPH_AUTOTUNE").ok();
    let mut opened = 0;
    for backend in [Backend::Vulkan, Backend::Gl] {
        // A machine may lack one of the two; CI has both (lavapipe and llvmpipe).
        let Ok(d) = Device::new(&DeviceOptions { backend: Some(backend), ..Default::default() }) else { continue };
        opened += 1;
        let slow_compiles = d.info().backend == WgpuBackend::Gl && d.info().device_type == WgpuDeviceType::Cpu;
        let expected = match env.as_deref().map(str::trim) {
            Some("off" | "0" | "false") => false,
            Some("on" | "1" | "true") => true,
            _ => !slow_compiles,
        };
        assert_eq!(d.autotune(), expected, "{} with FUSEGRAPH_AUTOTUNE={env:?}", d.describe());
        let forced = Device::new(&DeviceOptions { backend: Some(backend), autotune: Some(true), ..Default::default() });
        assert!(forced.unwrap().autotune(), "the option overrides the default");
    }
    assert!(opened > 0, "no Vulkan or GL adapter");
}
