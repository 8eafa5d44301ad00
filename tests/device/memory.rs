//! Memory on a real device: limits, rematerialization, the typed OOM error, statistics that
//! match the plan, no growth over many runs, and the largest batch that fits.

use fusegraph::crates::passes::testing;
use fusegraph::crates::reference::{assert_close, evaluate};
use fusegraph::{CompileOptions, DType, Device, DeviceOptions, GraphBuilder, HostTensor, RuntimeError};
use std::collections::BTreeMap;
use std::sync::Arc;

fn fresh(limit: Option<u64>) -> Arc<Device> {
    Arc::new(Device::new(&DeviceOptions { memory_limit: limit, ..Default::default() }).expect("a device"))
}

fn feed(dims: &[usize], seed: u64) -> HostTensor {
    let n: usize = dims.iter().product();
    HostTensor::new(dims.to_vec(), fusegraph_workloads::random_values(seed, n)).unwrap()
}

#[test]
fn remat_makes_a_plan_fit_and_gives_the_same_results() {
    let (g, outs) = testing::remat_graph();
    let device = fresh(None);
    let unfused = CompileOptions::unfused();
    let plain = device.plan(&g, &outs, &unfused).unwrap();
    let fixed = plain.persistent_bytes + plain.staging_bytes;
    assert_eq!(plain.arena_bytes, 16 * 1024, "{plain:?}");
    let limit = fixed + 14 * 1024;

    // Without remat: the typed OOM error, before anything is allocated.
    let no_remat = CompileOptions { memory_limit: Some(limit), remat: false, ..unfused.clone() };
    let before = device.memory().allocated;
    match device.compile(&g, &outs, &no_remat) {
        Err(RuntimeError::ResourceExhausted { needed, limit: l, .. }) => {
            assert_eq!(l, limit);
            assert!(needed > limit);
        }
        other => panic!("expected ResourceExhausted, got {:?}", other.map(|_| ())),
    }
    assert_eq!(device.memory().allocated, before);

    // With remat (the default): it fits, and computes what the reference computes.
    let with_remat = CompileOptions { memory_limit: Some(limit), ..unfused };
    let exe = device.compile(&g, &outs, &with_remat).unwrap();
    assert!(exe.stats().arena_bytes <= 12 * 1024, "{:?}", exe.stats().arena_bytes);
    assert!(exe.stats().arena_bytes + fixed <= limit);
    let x = feed(&[32, 32], 5);
    let got = exe.run(&[("x", &x)]).unwrap();
    let want = evaluate(&g, &outs, &BTreeMap::from([("x".to_string(), x.clone())]), &BTreeMap::new()).unwrap();
    assert_close(&got[0], &want[0], 1e-5, 1e-5).unwrap();
    let again = exe.run(&[("x", &x)]).unwrap();
    assert_eq!(got, again);
}

#[test]
fn a_limit_below_the_lower_bound_is_a_typed_error_naming_the_numbers() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [256, 256]).unwrap();
    let w = b.parameter("w", DType::F32, [256, 256]).unwrap();
    let y = x.matmul(&w).unwrap().softmax(1).unwrap();
    let device = fresh(None);
    let opts = CompileOptions { memory_limit: Some(100_000), name: Some("tiny".into()), ..Default::default() };
    let err = device.compile(&b.graph(), &[y.id()], &opts).err().expect("does not fit");
    let msg = err.to_string();
    assert!(msg.starts_with("OOM when allocating the plan for tiny: needs "), "{msg}");
    for part in ["(parameters 262144, arena ", "limit 100000; lower bound ", "largest live tensors at the peak: %"] {
        assert!(msg.contains(part), "missing `{part}` in {msg}");
    }
    assert_eq!(device.memory().allocated, 0);
    assert_eq!(device.memory().reserved, 0);
}

#[test]
fn statistics_match_the_plan_and_the_cache_is_reused() {
    let device = fresh(None);
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [64, 128]).unwrap();
    let w = b.parameter("w", DType::F32, [128, 32]).unwrap();
    let y = x.matmul(&w).unwrap().relu().unwrap();
    let (g, outs) = (b.graph(), vec![y.id()]);
    let plan = device.plan(&g, &outs, &CompileOptions::default()).unwrap();
    let mut exe = device.compile(&g, &outs, &CompileOptions::default()).unwrap();
    let s = exe.stats().clone();
    assert_eq!(s.arena_bytes + s.persistent_bytes + s.staging_bytes, plan.total_bytes);
    // Besides the planned buffers, the workspace textures of a CPU adapter's matmul (not
    // planned: they yield to a memory limit), counted like any allocation.
    let held = plan.total_bytes + s.workspace_bytes;
    assert_eq!(device.memory().allocated, held);
    assert_eq!(device.memory().allocated, s.device_bytes);
    assert_eq!(device.memory().reserved, held);
    assert_eq!(device.memory().peak, held);
    exe.set_parameter("w", &feed(&[128, 32], 1)).unwrap();
    exe.run(&[("x", &feed(&[64, 128], 2))]).unwrap();
    assert_eq!(device.memory().allocated, held, "running allocates nothing");

    drop(exe);
    assert_eq!(device.memory().allocated, 0);
    assert_eq!(device.memory().reserved, plan.total_bytes, "released buffers stay cached, textures do not");
    assert_eq!(device.memory().peak, held);
    device.reset_peak_memory_stats();
    assert_eq!(device.memory().peak, 0);

    // A second compile of the same graph reuses the cached buffers.
    let exe = device.compile(&g, &outs, &CompileOptions::default()).unwrap();
    assert_eq!(device.memory().reserved, held);
    drop(exe);
    device.empty_cache();
    assert_eq!(device.memory().reserved, 0);
}

#[test]
fn reserved_memory_stays_under_the_limit_and_does_not_grow_over_a_thousand_runs() {
    let limit = 4 << 20;
    let device = fresh(Some(limit));
    let works = [
        fusegraph_workloads::softmax(64, 1),
        fusegraph_workloads::elementwise_chain(4096),
        fusegraph_workloads::matmul_epilogue(32),
    ];
    let exes: Vec<_> =
        works.iter().map(|w| device.compile(&w.graph, &w.outputs, &CompileOptions::default()).unwrap()).collect();
    let reserved = device.memory().reserved;
    assert!(reserved <= limit);
    for i in 0..1000 {
        let (w, e) = (&works[i % 3], &exes[i % 3]);
        e.run(&w.feed_refs()).unwrap();
        assert!(device.memory().reserved <= limit);
    }
    assert_eq!(device.memory().reserved, reserved, "runs do not allocate");
    // Compile-run-drop cycles reuse the cache instead of growing it.
    drop(exes);
    for _ in 0..20 {
        let e = device.compile(&works[0].graph, &works[0].outputs, &CompileOptions::default()).unwrap();
        e.run(&works[0].feed_refs()).unwrap();
    }
    assert!(device.memory().reserved <= reserved);
    // The device limit applies to what is held at once: a graph bigger than it fails.
    let big = fusegraph_workloads::elementwise_chain(1 << 20);
    assert!(matches!(
        device.compile(&big.graph, &big.outputs, &CompileOptions::default()),
        Err(RuntimeError::ResourceExhausted { .. })
    ));
}

#[test]
fn largest_batch_that_fits_is_a_planner_query() {
    let device = fresh(None);
    let build = |batch: usize| testing::mlp(batch);
    let limit = 8 << 20;
    let opts = CompileOptions::default();
    let b = device.largest_batch(build, limit, &opts, 4096).unwrap().expect("batch 1 fits");
    let (g, outs) = testing::mlp(b).unwrap();
    assert!(device.plan(&g, &outs, &opts).unwrap().total_bytes <= limit);
    let (g1, outs1) = testing::mlp(b + 1).unwrap();
    assert!(device.plan(&g1, &outs1, &opts).unwrap().total_bytes > limit);
    assert_eq!(device.memory().allocated, 0, "planning allocates nothing");
    // And the runtime agrees: b compiles under the limit, b + 1 does not.
    let limited = CompileOptions { memory_limit: Some(limit), ..opts };
    assert!(device.compile(&g, &outs, &limited).is_ok());
    assert!(matches!(device.compile(&g1, &outs1, &limited), Err(RuntimeError::ResourceExhausted { .. })));
}

/// A cached buffer may serve a new executable although it is larger than planned (up to
/// 25%), but never past that executable's own `memory_limit`.
#[test]
fn reused_buffers_stay_within_the_compile_limit() {
    let device = fresh(None);
    let graph = |n: usize| {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [n]).unwrap();
        let y = x.exp().unwrap();
        (b.graph(), vec![y.id()])
    };
    // Buffers 10% larger than the next executable needs, released to the cache.
    let (big, big_out) = graph(1100);
    drop(device.compile(&big, &big_out, &CompileOptions::default()).unwrap());
    let cached = device.memory().reserved;
    let (g, outs) = graph(1000);
    let plan = device.plan(&g, &outs, &CompileOptions::default()).unwrap();
    let limit = [plan.arena_bytes, plan.persistent_bytes, plan.staging_bytes].iter().map(|&b| b.max(4)).sum();
    let exe = device.compile(&g, &outs, &CompileOptions { memory_limit: Some(limit), ..Default::default() }).unwrap();
    assert!(exe.stats().device_bytes <= limit, "{} bytes held under a limit of {limit}", exe.stats().device_bytes);
    let x = feed(&[1000], 3);
    let got = exe.run(&[("x", &x)]).unwrap();
    let want = evaluate(&g, &outs, &BTreeMap::from([("x".to_string(), x.clone())]), &BTreeMap::new()).unwrap();
    assert_close(&got[0], &want[0], 1e-5, 1e-6).unwrap();
    drop(exe);
    // Without a limit the larger cached buffers are reused: nothing new is created.
    let before = device.memory().reserved;
    let exe = device.compile(&g, &outs, &CompileOptions::default()).unwrap();
    assert!(device.memory().reserved <= before.max(cached), "reserved grew: {}", device.memory().reserved);
    drop(exe);
}
