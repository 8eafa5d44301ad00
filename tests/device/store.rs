//! The device parameter store: executables of several graphs and batch sizes bind one copy
//! of the parameters; updates are seen by every binder; hoisted work reruns after them; bad
//! input is a typed error that leaves the store unchanged.

use fusegraph::crates::reference::{assert_close, evaluate};
use fusegraph::{CompileOptions, DType, Device, DeviceOptions, GraphBuilder, HostTensor, ParamStore, RuntimeError};
use std::collections::BTreeMap;
use std::sync::Arc;

fn fresh() -> Arc<Device> {
    Arc::new(Device::new(&DeviceOptions::default()).expect("a device"))
}

fn values(dims: &[usize], seed: u64) -> HostTensor {
    let n: usize = dims.iter().product();
    HostTensor::new(dims.to_vec(), fusegraph_workloads::random_values(seed, n)).unwrap()
}

/// `relu(x·(w·2) + b)` at `batch`: `w·2` computes from parameters alone (hoisted).
fn model(batch: usize) -> (fusegraph::Graph, fusegraph::NodeId) {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [batch, 16]).unwrap();
    let w = b.parameter("w", DType::F32, [16, 32]).unwrap();
    let bias = b.parameter("b", DType::F32, [32]).unwrap();
    let y = x.matmul(&(&w * 2.0).unwrap()).unwrap().add(&bias).unwrap().relu().unwrap();
    (b.graph(), y.id())
}

/// One SGD step on `w` and `b` of `sum(model(x))`: `p ← p − 0.1·∂/∂p`, written to the store.
fn sgd_step(batch: usize) -> (fusegraph::Graph, fusegraph::NodeId, CompileOptions) {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [batch, 16]).unwrap();
    let w = b.parameter("w", DType::F32, [16, 32]).unwrap();
    let bias = b.parameter("b", DType::F32, [32]).unwrap();
    let y = x.matmul(&(&w * 2.0).unwrap()).unwrap().add(&bias).unwrap().relu().unwrap();
    let loss = y.sum(&[0, 1], false).unwrap();
    let g = fusegraph::grad(&loss, &[&w, &bias]).unwrap();
    let new_w = (&w - &(&g[0] * 0.1).unwrap()).unwrap();
    let new_b = (&bias - &(&g[1] * 0.1).unwrap()).unwrap();
    let opts =
        CompileOptions { updates: vec![("w".into(), new_w.id()), ("b".into(), new_b.id())], ..Default::default() };
    (b.graph(), loss.id(), opts)
}

fn reference(batch: usize, x: &HostTensor, params: &BTreeMap<String, HostTensor>) -> HostTensor {
    let (g, y) = model(batch);
    let feeds = BTreeMap::from([("x".to_string(), x.clone())]);
    evaluate(&g, &[y], &feeds, params).unwrap().remove(0)
}

#[test]
fn executables_share_one_copy_and_see_each_others_updates() {
    let device = fresh();
    let store = ParamStore::new(&device);
    let params = BTreeMap::from([("w".to_string(), values(&[16, 32], 1)), ("b".to_string(), values(&[32], 2))]);
    store.insert_all(params.iter()).unwrap();
    let param_bytes = (16 * 32 + 32) * 4;
    assert_eq!(store.bytes(), param_bytes);
    assert_eq!(device.memory().allocated, param_bytes);

    let opts = CompileOptions::default();
    let (g2, y2) = model(2);
    let (g5, y5) = model(5);
    let (gt, loss, topts) = sgd_step(4);
    let eval2 = store.compile(&g2, &[y2], &opts).unwrap();
    let mut eval5 = store.compile(&g5, &[y5], &opts).unwrap();
    let train = store.compile(&gt, &[loss], &topts).unwrap();
    // No executable holds a copy of the parameters.
    for exe in [&eval2, &eval5, &train] {
        assert!(exe.stats().persistent_bytes < 256, "{:?}", exe.stats().persistent_bytes);
        assert!(exe.store().is_some());
    }
    assert!(eval2.stats().prepared_kernels > 0, "w·2 is hoisted");
    let held: u64 = [&eval2, &eval5, &train].iter().map(|e| e.stats().device_bytes).sum();
    assert_eq!(device.memory().allocated, param_bytes + held);

    let (x2, x5, xt) = (values(&[2, 16], 3), values(&[5, 16], 4), values(&[4, 16], 5));
    let first = eval2.run(&[("x", &x2)]).unwrap().remove(0);
    assert_close(&first, &reference(2, &x2, &params), 1e-4, 1e-4).unwrap();

    // Three training steps, then both evaluations read the updated store (and rerun w·2).
    for _ in 0..3 {
        train.run(&[("x", &xt)]).unwrap();
    }
    let now = store.read_all().unwrap();
    assert_ne!(now["w"], params["w"], "the updates reached the store");
    assert_eq!(train.parameter("w").unwrap(), now["w"]);
    let after2 = eval2.run(&[("x", &x2)]).unwrap().remove(0);
    let after5 = eval5.run(&[("x", &x5)]).unwrap().remove(0);
    assert_close(&after2, &reference(2, &x2, &now), 1e-4, 1e-4).unwrap();
    assert_close(&after5, &reference(5, &x5, &now), 1e-4, 1e-4).unwrap();

    // A value set through one executable (or the store) is the value every executable reads.
    let w = values(&[16, 32], 9);
    eval5.set_parameter("w", &w).unwrap();
    assert_eq!(store.get("w").unwrap(), w);
    let mut expect = now.clone();
    expect.insert("w".into(), w);
    let again = eval2.run(&[("x", &x2)]).unwrap().remove(0);
    assert_close(&again, &reference(2, &x2, &expect), 1e-4, 1e-4).unwrap();

    drop((eval2, eval5, train));
    assert_eq!(device.memory().allocated, param_bytes);
}

#[test]
fn store_errors_are_typed_and_change_nothing() {
    let device = fresh();
    let store = ParamStore::new(&device);
    let (g, y) = model(2);
    match store.compile(&g, &[y], &CompileOptions::default()) {
        Err(RuntimeError::NotInStore { name, .. }) => assert!(name == "b" || name == "w"),
        other => panic!("expected NotInStore, got {:?}", other.map(|_| ())),
    }
    store.insert("w", &values(&[16, 32], 1)).unwrap();
    store.insert("b", &values(&[31], 2)).unwrap();
    let err = store.compile(&g, &[y], &CompileOptions::default()).map(|_| ()).unwrap_err();
    assert!(matches!(&err, RuntimeError::WrongType { name, .. } if name == "b"), "{err}");
    assert!(err.to_string().contains("f32[32]") && err.to_string().contains("f32[31]"), "{err}");

    // A type change is refused, whole batch included.
    let before = store.read_all().unwrap();
    let err = store.insert_all([("w", &values(&[16, 32], 7)), ("b", &values(&[32], 8))]).unwrap_err();
    assert!(matches!(&err, RuntimeError::WrongType { name, .. } if name == "b"), "{err}");
    assert_eq!(store.read_all().unwrap(), before);

    // A checkpoint that lacks a parameter loads nothing.
    let dir = std::env::temp_dir().join(format!("fusegraph-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("partial.safetensors");
    let only_w = BTreeMap::from([("w".to_string(), values(&[16, 32], 11))]);
    fusegraph::crates::ir::safetensors::write(&path, only_w.iter().map(|(n, t)| (n.as_str(), t))).unwrap();
    let err = store.load_safetensors(&path).unwrap_err();
    assert!(matches!(&err, RuntimeError::MissingInCheckpoint { name, .. } if name == "b"), "{err}");
    assert_eq!(store.read_all().unwrap(), before);

    // Save and load round-trip.
    let full = dir.join("full.safetensors");
    store.save_safetensors(&full).unwrap();
    let other = ParamStore::new(&device);
    other.load_safetensors(&full).unwrap();
    assert_eq!(other.read_all().unwrap(), before);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_device_limit_covers_the_store() {
    let device = Arc::new(Device::new(&DeviceOptions { memory_limit: Some(4096), ..Default::default() }).unwrap());
    let store = ParamStore::new(&device);
    store.insert("a", &values(&[512], 1)).unwrap();
    let err = store.insert("b", &values(&[768], 2)).unwrap_err();
    assert!(matches!(err, RuntimeError::DeviceMemory { .. }), "{err}");
    assert_eq!(store.len(), 1);
    assert_eq!(device.memory().allocated, 2048);
}

#[test]
fn a_compile_limit_counts_the_store_parameters_it_binds() {
    let device = fresh();
    let store = ParamStore::new(&device);
    store.insert_all([("w", &values(&[16, 32], 1)), ("b", &values(&[32], 2))]).unwrap();
    let (g, y) = model(64);
    let alone = store.compile(&g, &[y], &CompileOptions::default()).unwrap();
    let s = alone.stats().clone();
    drop(alone);
    assert_eq!(s.store_bytes, (16 * 32 + 32) * 4);
    // The executable's own buffers fit a limit that does not also hold its parameters.
    let own = s.persistent_bytes.max(4) + s.arena_bytes + s.staging_bytes;
    let opts = CompileOptions { memory_limit: Some(own + s.store_bytes / 2), remat: false, ..Default::default() };
    match store.compile(&g, &[y], &opts) {
        Err(RuntimeError::ResourceExhausted { needed, limit, persistent, .. }) => {
            assert!(needed > limit && persistent >= s.store_bytes, "{needed} {limit} {persistent}");
        }
        other => panic!("expected ResourceExhausted, got {:?}", other.map(|_| ())),
    }
    let fits = CompileOptions { memory_limit: Some(own + s.store_bytes), ..opts };
    store.compile(&g, &[y], &fits).unwrap();
}

#[test]
fn mixed_precision_reads_the_f32_store_and_casts_at_use() {
    let device = fresh();
    let store = ParamStore::new(&device);
    let params = BTreeMap::from([("w".to_string(), values(&[16, 32], 1)), ("b".to_string(), values(&[32], 2))]);
    store.insert_all(params.iter()).unwrap();
    let (g, y) = model(8);
    let exe = store.compile(&g, &[y], &CompileOptions { mixed_precision: true, ..Default::default() }).unwrap();
    let x = values(&[8, 16], 3);
    let got = exe.run(&[("x", &x)]).unwrap().remove(0);
    assert_close(&got, &reference(8, &x, &params), 2e-2, 2e-2).unwrap();
    // The store keeps its f32 values; the f16 copies are the executable's, hoisted.
    assert_eq!(store.ty("w").unwrap().dtype, DType::F32);
    assert!(exe.stats().prepared_kernels > 0);
    let w = values(&[16, 32], 4);
    store.insert("w", &w).unwrap();
    let mut now = params.clone();
    now.insert("w".into(), w);
    let again = exe.run(&[("x", &x)]).unwrap().remove(0);
    assert_close(&again, &reference(8, &x, &now), 2e-2, 2e-2).unwrap();
}
