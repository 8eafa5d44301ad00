//! `Executable::stats()` and `to_dot()` say what fused, on a real device.

use fusegraph::{CompileOptions, DType, Device, GraphBuilder};

#[test]
fn stats_and_dot_of_a_fused_softmax() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [8, 128]).unwrap();
    let y = x.softmax(1).unwrap();
    let device = Device::shared().unwrap();
    let fused = device.compile(&b.graph(), &[y.id()], &CompileOptions::default()).unwrap();
    let unfused = device.compile(&b.graph(), &[y.id()], &CompileOptions::unfused()).unwrap();
    assert_eq!(fused.stats().kernels.len(), 1);
    assert_eq!(unfused.stats().kernels.len(), 7);
    // Unfused, the max and the sum broadcast back over the rows by the same code: one
    // pipeline for both.
    assert_eq!((fused.stats().pipelines, unfused.stats().pipelines), (1, 6));
    assert_eq!(fused.stats().kernels[0].members.len(), 7);
    // Fused: read x once, write y once. Unfused: every intermediate is written and read.
    assert_eq!(fused.stats().bytes_moved, 2 * 8 * 128 * 4);
    assert!(unfused.stats().bytes_moved > 4 * fused.stats().bytes_moved);
    let dot = fused.to_dot();
    assert_eq!(dot.matches("subgraph cluster_").count(), 1);
}

#[test]
fn profile_times_every_kernel_and_leaves_results_unchanged() {
    use fusegraph::HostTensor;
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [64, 256]).unwrap();
    let w = b.input("w", DType::F32, [256, 128]).unwrap();
    let h = x.matmul(&w).unwrap().relu().unwrap();
    let y = h.softmax(1).unwrap();
    let device = Device::shared().unwrap();
    let xv =
        HostTensor::new([64, 256], (0..64 * 256).map(|i| ((i * 37 % 101) as f32) / 101.0 - 0.5).collect()).unwrap();
    let wv =
        HostTensor::new([256, 128], (0..256 * 128).map(|i| ((i * 53 % 97) as f32) / 97.0 - 0.5).collect()).unwrap();
    let feeds = [("x", &xv), ("w", &wv)];
    for opts in [CompileOptions::default(), CompileOptions::unfused()] {
        let exe = device.compile(&b.graph(), &[y.id()], &opts).unwrap();
        let before = exe.run(&feeds).unwrap();
        let p = exe.profile(&feeds, 1, 3).unwrap();
        let stats = exe.stats();
        assert_eq!(p.kernels.len(), stats.kernels.len());
        for (i, k) in p.kernels.iter().enumerate() {
            assert_eq!(k.index, i);
            assert_eq!(k.label, stats.kernels[i].label);
            assert!(k.median_ms.is_finite() && k.median_ms > 0.0, "{k:?}");
        }
        assert_eq!(p.slowest(2).len(), 2.min(p.kernels.len()));
        assert!(p.slowest(3).windows(2).all(|w| w[0].median_ms >= w[1].median_ms));
        // Profiling re-runs the kernels on the same inputs: the outputs are unchanged.
        assert_eq!(exe.run(&feeds).unwrap(), before);
    }
}

#[test]
fn dump_wgsl_writes_each_kernel_in_dispatch_order() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [8, 128]).unwrap();
    let y = x.softmax(1).unwrap().exp().unwrap();
    let device = Device::shared().unwrap();
    let dir = std::env::temp_dir().join(format!("fusegraph-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let opts = CompileOptions { dump_wgsl: Some(dir.clone()), ..CompileOptions::unfused() };
    let exe = device.compile(&b.graph(), &[y.id()], &opts).unwrap();
    let n = exe.stats().kernels.len();
    for (k, stats) in exe.stats().kernels.iter().enumerate() {
        let text = std::fs::read_to_string(dir.join(format!("k{k:03}.wgsl"))).unwrap();
        assert!(text.contains("@compute"), "k{k:03}");
        // The kernel's label heads its source: the files follow the dispatch order.
        assert!(text.starts_with(&format!("// kernel {}", stats.label)), "k{k:03}: {}", &text[..60.min(text.len())]);
    }
    assert!(!dir.join(format!("k{n:03}.wgsl")).exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Kernels that lower to the same code share a pipeline: a third transformer layer's kernels
/// mostly reuse the pipelines of the first two. (Not all: where the adapter's cost model
/// has a layer norm recompute the residual stream's adds rather than read it, that kernel
/// grows by a layer's adds with each layer.)
#[test]
fn repeated_layers_share_their_pipelines() {
    let device = Device::shared().unwrap();
    let pipelines = |layers: usize| {
        let w = fusegraph_workloads::transformer(16, layers, true).unwrap();
        let exe = device.compile(&w.graph, &w.outputs, &CompileOptions::default()).unwrap();
        (exe.stats().kernels.len(), exe.stats().pipelines)
    };
    let ((k2, p2), (k3, p3)) = (pipelines(2), pipelines(3));
    eprintln!("2 layers: {k2} kernels, {p2} pipelines; 3 layers: {k3} kernels, {p3} pipelines");
    assert!(k3 > k2 && p2 < k2 && p3 >= p2);
    assert!(2 * (p3 - p2) < k3 - k2, "the third layer's {} kernels need {} new pipelines", k3 - k2, p3 - p2);
}

/// Timing runs back to back: each sample is one submission of `per_sample` runs, every run
/// executes (a counter parameter updated by each run counts them: the first run with the
/// feeds, then warm-up and timed samples), and a time per run comes back per sample.
#[test]
fn back_to_back_timing_runs_every_execution_and_times_each_sample() {
    use fusegraph::{HostTensor, ParamStore};
    let device = Device::shared().unwrap();
    let store = ParamStore::new(&device);
    store.insert("count", &HostTensor::new([4], vec![0.0f32; 4]).unwrap()).unwrap();
    let b = GraphBuilder::new();
    let count = b.parameter("count", DType::F32, [4]).unwrap();
    let x = b.input("x", DType::F32, [4]).unwrap();
    let next = count.add_scalar(1.0).unwrap();
    let y = x.mul(&next).unwrap();
    let opts = CompileOptions { updates: vec![("count".into(), next.id())], ..Default::default() };
    let exe = store.compile(&b.graph(), &[y.id()], &opts).unwrap();
    let xv = HostTensor::new([4], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let t = exe.time_back_to_back(&[("x", &xv)], 1, 3, 5).unwrap();
    assert_eq!(t.ms.len(), 3);
    assert!(t.ms.iter().all(|&ms| ms > 0.0 && ms.is_finite()), "{:?}", t.ms);
    assert_eq!(store.get("count").unwrap().to_f64(), vec![21.0; 4], "1 run, then 4 samples of 5");
}
