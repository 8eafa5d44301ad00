//! Slices at run-time positions: values against a hand computation and the reference (fused),
//! gradients, and a cache parameter in a store written at a fed position, step after step.

use fusegraph::crates::reference::evaluate;
use fusegraph::{grad, CompileOptions, DType, Device, GraphBuilder, HostTensor, ParamStore, Tensor};
use std::collections::BTreeMap;

fn values(dims: &[usize], seed: u64) -> HostTensor {
    HostTensor::new(dims.to_vec(), fusegraph_workloads::random_values(seed, dims.iter().product())).unwrap()
}

fn scalar(v: i32) -> HostTensor {
    HostTensor::new(Vec::<usize>::new(), vec![v]).unwrap()
}

#[test]
fn dynamic_slices_match_a_hand_computation_at_every_start() {
    let device = Device::shared().unwrap();
    let (rows, dim, cols, len) = (2, 9, 3, 4);
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [rows, dim, cols]).unwrap();
    let u = b.input("u", DType::F32, [rows, len, cols]).unwrap();
    let pos = b.input("pos", DType::I32, Vec::<usize>::new()).unwrap();
    let sliced = x.dynamic_slice(&pos, 1, len).unwrap().mul_scalar(2.0).unwrap();
    let updated = x.dynamic_update_slice(&u, &pos, 1).unwrap().add_scalar(1.0).unwrap();
    let g = b.graph();
    let outs = [sliced.id(), updated.id()];
    let exe = device.compile(&g, &outs, &CompileOptions::default()).unwrap();
    assert!(exe.stats().kernels.len() <= 2, "each fuses into one kernel: {:?}", exe.stats().kernels.len());
    let (xv, uv) = (values(&[rows, dim, cols], 1), values(&[rows, len, cols], 2));
    let (xs, us) = (xv.to_f64(), uv.to_f64());
    for p in [-3, 0, 2, 5, 6, 100] {
        let got = exe.run(&[("x", &xv), ("u", &uv), ("pos", &scalar(p))]).unwrap();
        let s = p.clamp(0, (dim - len) as i32) as usize;
        let (mut want_slice, mut want_update) = (Vec::new(), Vec::new());
        for r in 0..rows {
            for j in 0..len {
                for c in 0..cols {
                    want_slice.push(2.0 * xs[(r * dim + s + j) * cols + c]);
                }
            }
            for j in 0..dim {
                for c in 0..cols {
                    let v = if (s..s + len).contains(&j) {
                        us[(r * len + j - s) * cols + c]
                    } else {
                        xs[(r * dim + j) * cols + c]
                    };
                    want_update.push(v + 1.0);
                }
            }
        }
        let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6);
        assert!(close(&got[0].to_f64(), &want_slice), "slice at {p}");
        assert!(close(&got[1].to_f64(), &want_update), "update at {p}");
        let feeds = BTreeMap::from([("x".into(), xv.clone()), ("u".into(), uv.clone()), ("pos".into(), scalar(p))]);
        let reference = evaluate(&g, &outs, &feeds, &BTreeMap::new()).unwrap();
        assert!(close(&reference[1].to_f64(), &want_update), "reference update at {p}");
    }
}

#[test]
fn gradients_flow_to_the_window_and_around_it() {
    let device = Device::shared().unwrap();
    let b = GraphBuilder::new();
    let x = b.parameter("x", DType::F32, [6, 2]).unwrap();
    let u = b.parameter("u", DType::F32, [2, 2]).unwrap();
    let w = b.input("w", DType::F32, [6, 2]).unwrap();
    let pos = b.input("pos", DType::I32, Vec::<usize>::new()).unwrap();
    let y = x.dynamic_update_slice(&u, &pos, 0).unwrap();
    let loss = y.mul(&w).unwrap().sum(&[0, 1], false).unwrap();
    let picked = x.dynamic_slice(&pos, 0, 3).unwrap().sum(&[0, 1], false).unwrap();
    let total = loss.add(&picked).unwrap();
    let grads = grad(&total, &[&x, &u]).unwrap();
    let store = ParamStore::new(&device);
    store.insert_all([("x", &values(&[6, 2], 3)), ("u", &values(&[2, 2], 4))]).unwrap();
    let exe = store.compile(&b.graph(), &[grads[0].id(), grads[1].id()], &CompileOptions::default()).unwrap();
    let wv = values(&[6, 2], 5);
    let ws = wv.to_f64();
    let out = exe.run(&[("w", &wv), ("pos", &scalar(3))]).unwrap();
    // ∂/∂x: w outside rows 3..5, 0 inside; plus 1 on the sliced rows 3..6.
    let gx: Vec<f64> =
        (0..12).map(|i| if (6..10).contains(&i) { 0.0 } else { ws[i] } + if i >= 6 { 1.0 } else { 0.0 }).collect();
    let gu: Vec<f64> = ws[6..10].to_vec();
    let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6);
    assert!(close(&out[0].to_f64(), &gx), "{:?} vs {gx:?}", out[0].to_f64());
    assert!(close(&out[1].to_f64(), &gu), "{:?} vs {gu:?}", out[1].to_f64());
}

#[test]
fn a_cache_parameter_is_written_at_a_fed_position_step_after_step() {
    let device = Device::shared().unwrap();
    let store = ParamStore::new(&device);
    let cache = HostTensor::new([2, 16, 4], vec![0.0f32; 128]).unwrap();
    store.insert("cache", &cache).unwrap();
    let b = GraphBuilder::new();
    let c = b.parameter("cache", DType::F32, [2, 16, 4]).unwrap();
    let row = b.input("row", DType::F32, [2, 1, 4]).unwrap();
    let pos = b.input("pos", DType::I32, Vec::<usize>::new()).unwrap();
    let new = c.dynamic_update_slice(&row, &pos, 1).unwrap();
    // What the step returns reads the written row back at the position.
    let total = new.dynamic_slice(&pos, 1, 1).unwrap().sum(&[0, 1, 2], false).unwrap();
    let opts = CompileOptions { updates: vec![("cache".into(), new.id())], ..Default::default() };
    let exe = store.compile(&b.graph(), &[total.id()], &opts).unwrap();
    let mut expect = vec![0.0f64; 128];
    for p in 0..16 {
        let rv = values(&[2, 1, 4], 10 + p as u64);
        let got = exe.run(&[("row", &rv), ("pos", &scalar(p))]).unwrap()[0].to_f64()[0];
        for r in 0..2 {
            for k in 0..4 {
                expect[(r * 16 + p as usize) * 4 + k] = rv.to_f64()[r * 4 + k];
            }
        }
        assert!((got - rv.to_f64().iter().sum::<f64>()).abs() < 1e-5, "step {p}");
    }
    let now = store.get("cache").unwrap().to_f64();
    assert!(now.iter().zip(&expect).all(|(a, b)| (a - b).abs() < 1e-6));
}

/// A store holding a random `[rows, len, width]` f32 cache parameter (`seed`), a builder
/// declaring it, and its initial values.
fn cache_store(rows: usize, len: usize, width: usize, seed: u64) -> (ParamStore, GraphBuilder, Tensor, HostTensor) {
    let store = ParamStore::new(&Device::shared().unwrap());
    let initial = values(&[rows, len, width], seed);
    store.insert("cache", &initial).unwrap();
    let b = GraphBuilder::new();
    let c = b.parameter("cache", DType::F32, [rows, len, width]).unwrap();
    (store, b, c, initial)
}

/// `expect` (a `[rows, len, width]` cache) with position `p`, clamped, of each row set to
/// twice `x`'s `[rows, 1, width]` values.
fn write_doubled(expect: &mut [f64], (rows, len, width): (usize, usize, usize), p: i32, x: &[f64]) {
    let s = p.clamp(0, len as i32 - 1) as usize;
    for r in 0..rows {
        for k in 0..width {
            expect[(r * len + s) * width + k] = 2.0 * x[r * width + k];
        }
    }
}

/// Written over its cache parameter, an update moves its window alone: at a 2,048-position
/// cache the kernel reads the update's source and stores the update (a doubling fused into
/// it) as a side window of the kernel reading the cache back, which reads the start and the
/// window's rows — nothing of the rest of the cache — and the cache equals the
/// hand-computed one after steps at the first, a middle and the last position and at
/// starts past either end (clamped).
#[test]
fn a_cache_update_in_place_moves_only_its_window() {
    use fusegraph::KernelForm;
    let (rows, len, width) = (2, 2048, 16);
    let (store, b, c, initial) = cache_store(rows, len, width, 20);
    let row = b.input("row", DType::F32, [rows, 1, width]).unwrap();
    let pos = b.input("pos", DType::I32, Vec::<usize>::new()).unwrap();
    let new = c.dynamic_update_slice(&row.mul_scalar(2.0).unwrap(), &pos, 1).unwrap();
    let total = new.dynamic_slice(&pos, 1, 1).unwrap().sum(&[0, 1, 2], false).unwrap();
    let opts = CompileOptions { updates: vec![("cache".into(), new.id())], ..Default::default() };
    let exe = store.compile(&b.graph(), &[total.id()], &opts).unwrap();
    let kernels = || exe.stats().kernels.iter().map(|k| (k.label.clone(), k.form, k.bytes_moved)).collect::<Vec<_>>();
    // The write joins the kernel reading the cache back: a side window of its sum.
    let windows: Vec<_> = exe.stats().kernels.iter().filter(|k| k.windows).collect();
    assert_eq!((windows.len(), exe.stats().kernels.len()), (1, 1), "{:?}", kernels());
    assert!(windows[0].form != KernelForm::Window, "{:?}", kernels());
    let update_bytes = (rows * width * 4) as u64;
    // The doubled row read, its window written and read back, the start and the sum.
    assert_eq!(windows[0].bytes_moved, 3 * update_bytes + 8, "{:?}", kernels());
    let mut expect = initial.to_f64();
    for p in [0i32, 1000, 2047, 5000, -3] {
        let rv = values(&[rows, 1, width], 30 + p.unsigned_abs() as u64);
        exe.run(&[("row", &rv), ("pos", &scalar(p))]).unwrap();
        write_doubled(&mut expect, (rows, len, width), p, &rv.to_f64());
    }
    let now = store.get("cache").unwrap().to_f64();
    assert!(now.iter().zip(&expect).all(|(a, b)| (a - b).abs() < 1e-6), "the cache after five steps");
}

/// A start per sequence: each row of a batch of caches is written at its own position, as a
/// window, and a start of the wrong shape is a typed error.
#[test]
fn each_row_of_a_cache_is_written_at_its_own_position() {
    let (rows, len, width) = (3, 64, 4);
    let (store, b, c, initial) = cache_store(rows, len, width, 40);
    let row = b.input("row", DType::F32, [rows, 1, width]).unwrap();
    let pos = b.input("pos", DType::I32, [rows]).unwrap();
    let new = c.dynamic_update_slice(&row, &pos, 1).unwrap();
    let total = new.sum(&[0, 1, 2], false).unwrap();
    let opts = CompileOptions { updates: vec![("cache".into(), new.id())], ..Default::default() };
    let exe = store.compile(&b.graph(), &[total.id()], &opts).unwrap();
    assert!(exe.stats().kernels.iter().any(|k| k.windows));
    let mut expect = initial.to_f64();
    for (step, p) in [[0, 5, 63], [1, 70, -2], [2, 6, 0]].into_iter().enumerate() {
        let rv = values(&[rows, 1, width], 50 + step as u64);
        exe.run(&[("row", &rv), ("pos", &HostTensor::new([rows], p.to_vec()).unwrap())]).unwrap();
        for (r, &at) in p.iter().enumerate() {
            let s = at.clamp(0, len as i32 - 1) as usize;
            for k in 0..width {
                expect[(r * len + s) * width + k] = rv.to_f64()[r * width + k];
            }
        }
    }
    let now = store.get("cache").unwrap().to_f64();
    assert!(now.iter().zip(&expect).all(|(a, b)| (a - b).abs() < 1e-6), "the cache after three steps");
    let two = b.input("two", DType::I32, [2]).unwrap();
    let e = c.dynamic_update_slice(&row, &two, 1).unwrap_err().to_string();
    assert!(e.contains("one per index of axis 0"), "{e}");
}

/// A kernel that writes a cache window and stores another value — a decode step's rotated key
/// written into its cache beside the rotated query, both computed from one source — keeps
/// the window form: the update moves its window, the other output (longer than the update:
/// its elements past the update's guarded) is stored whole, and both equal the reference
/// over steps at clamped and unclamped positions.
#[test]
fn a_window_kernel_also_stores_its_other_outputs_whole() {
    use fusegraph::KernelForm;
    let (rows, len, width) = (2, 512, 8);
    let (store, b, c, initial) = cache_store(rows, len, width, 60);
    let x = b.input("x", DType::F32, [rows, 1, width]).unwrap();
    let y = b.input("y", DType::F32, [rows, 3, width]).unwrap();
    let pos = b.input("pos", DType::I32, Vec::<usize>::new()).unwrap();
    let new = c.dynamic_update_slice(&x.mul_scalar(2.0).unwrap(), &pos, 1).unwrap();
    let q = y.add(&x.exp().unwrap().broadcast_to([rows, 3, width]).unwrap()).unwrap();
    let opts = CompileOptions { updates: vec![("cache".into(), new.id())], ..Default::default() };
    let exe = store.compile(&b.graph(), &[q.id()], &opts).unwrap();
    let kernels = || exe.stats().kernels.iter().map(|k| (k.label.clone(), k.form)).collect::<Vec<_>>();
    let windows: Vec<_> = exe.stats().kernels.iter().filter(|k| k.form == KernelForm::Window).cloned().collect();
    assert_eq!((windows.len(), exe.stats().kernels.len()), (1, 1), "{:?}", kernels());
    let (update, other) = ((rows * width * 4) as u64, (rows * 3 * width * 4) as u64);
    // x and the update, the start, y and q.
    assert_eq!(windows[0].bytes_moved, 2 * update + 4 + 2 * other, "{:?}", kernels());
    let mut expect = initial.to_f64();
    for (step, p) in [0i32, 300, 511, 900, -1].into_iter().enumerate() {
        let (xv, yv) = (values(&[rows, 1, width], 70 + step as u64), values(&[rows, 3, width], 80 + step as u64));
        let got = exe.run(&[("x", &xv), ("y", &yv), ("pos", &scalar(p))]).unwrap()[0].to_f64();
        let (xs, ys) = (xv.to_f64(), yv.to_f64());
        let want: Vec<f64> =
            (0..rows * 3 * width).map(|i| ys[i] + xs[i / (3 * width) * width + i % width].exp()).collect();
        assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-4 * b.abs().max(1.0)), "step {step}: q");
        write_doubled(&mut expect, (rows, len, width), p, &xs);
    }
    let now = store.get("cache").unwrap().to_f64();
    assert!(now.iter().zip(&expect).all(|(a, b)| (a - b).abs() < 1e-6), "the cache after five steps");
}

/// A decode step's attention in the matrix–vector kernel's forms (a GPU's): the new key and
/// value, views of one product, are written into their caches by the products that read the
/// caches' live positions (where f16 is native, as the matrix–vector kernel's fusions need),
/// or by the fused attention kernel — side windows of those kernels, no window kernel — and
/// the
/// outputs and both caches equal the reference's step after step, at positions inside the
/// live slice, past it (written, not read) and clamped past the cache.
#[test]
fn cache_writes_join_the_attention_products_in_gpu_forms() {
    use fusegraph::{DeviceOptions, FusedAttention, KernelForm};
    let device = std::sync::Arc::new(Device::new(&DeviceOptions { gpu_kernels: true, ..Default::default() }).unwrap());
    let (heads, len, live, dim, width) = (2, 128, 64, 16, 32);
    let initial = BTreeMap::from([
        ("k_cache".to_string(), values(&[heads, len, dim], 90)),
        ("v_cache".to_string(), values(&[heads, len, dim], 91)),
        ("w".to_string(), values(&[width, 2 * heads * dim], 92)),
    ]);
    let b = GraphBuilder::new();
    let param = |name: &str, dims: &[usize]| b.parameter(name, DType::F32, dims.to_vec()).unwrap();
    let (kc, vc, w) = (
        param("k_cache", &[heads, len, dim]),
        param("v_cache", &[heads, len, dim]),
        param("w", &[width, 2 * heads * dim]),
    );
    let x = b.input("x", DType::F32, [1, width]).unwrap();
    let q = b.input("q", DType::F32, [heads, 1, dim]).unwrap();
    let pos = b.input("pos", DType::I32, Vec::<usize>::new()).unwrap();
    let kv = x.matmul(&w).unwrap().reshape([2, heads, 1, dim]).unwrap();
    let half =
        |i: usize| kv.slice(&[i, 0, 0, 0], &[i + 1, heads, 1, dim], &[1; 4]).unwrap().reshape([heads, 1, dim]).unwrap();
    let (new_k, new_v) =
        (kc.dynamic_update_slice(&half(0), &pos, 1).unwrap(), vc.dynamic_update_slice(&half(1), &pos, 1).unwrap());
    let live_of = |c: &Tensor| c.slice(&[0, 0, 0], &[heads, live, dim], &[1; 3]).unwrap();
    let scores = q.matmul(&live_of(&new_k).transpose(&[0, 2, 1]).unwrap()).unwrap().mul_scalar(0.25).unwrap();
    let out = scores.softmax(2).unwrap().matmul(&live_of(&new_v)).unwrap();
    let g = b.graph();
    let close = |a: &[f64], b: &[f64]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-4 * y.abs().max(1.0))
    };
    // The two products, then one fused attention kernel, writing both windows.
    for fused in [false, true] {
        let store = ParamStore::new(&device);
        let mut params = initial.clone();
        for (name, t) in &params {
            store.insert(name, t).unwrap();
        }
        let opts = CompileOptions {
            updates: vec![("k_cache".into(), new_k.id()), ("v_cache".into(), new_v.id())],
            fused_attention: if fused { FusedAttention::Always } else { FusedAttention::default() },
            ..Default::default()
        };
        let exe = store.compile(&g, &[out.id()], &opts).unwrap();
        let kernels = || exe.stats().kernels.iter().map(|k| (k.label.clone(), k.form, k.windows)).collect::<Vec<_>>();
        let stats = exe.stats();
        let sides: Vec<_> = stats.kernels.iter().filter(|k| k.windows).collect();
        // The products take the windows where the compile makes the matrix–vector kernel's
        // fusions (native f16; GL has none: a window kernel there).
        let listed = kernels();
        match (fused, device.f16_native()) {
            (false, true) => assert!(
                sides.len() == 2 && sides.iter().all(|k| matches!(k.form, KernelForm::Gemv { .. })),
                "{listed:?}"
            ),
            (false, false) => assert!(sides.len() == 1 && sides[0].form == KernelForm::Window, "{listed:?}"),
            (true, _) => {
                assert!(sides.len() == 1 && matches!(sides[0].form, KernelForm::Attention { .. }), "{listed:?}")
            }
        }
        // They read the caches' live positions and write one position of each, no more.
        let cache = (heads * len * dim * 4) as u64;
        assert!(sides.iter().all(|k| k.bytes_moved < cache + 4096), "{:?}", kernels());
        for (step, p) in [0i32, 5, 63, 100, 500].into_iter().enumerate() {
            let (xv, qv) = (values(&[1, width], 100 + step as u64), values(&[heads, 1, dim], 110 + step as u64));
            let feeds = BTreeMap::from([("x".into(), xv.clone()), ("q".into(), qv.clone()), ("pos".into(), scalar(p))]);
            let want = evaluate(&g, &[out.id(), new_k.id(), new_v.id()], &feeds, &params).unwrap();
            let got = exe.run(&[("x", &xv), ("q", &qv), ("pos", &scalar(p))]).unwrap();
            assert!(close(&got[0].to_f64(), &want[0].to_f64()), "fused {fused}, step {step} (position {p}): attention");
            for (name, new) in [("k_cache", &want[1]), ("v_cache", &want[2])] {
                assert!(close(&store.get(name).unwrap().to_f64(), &new.to_f64()), "fused {fused}, step {step}: {name}");
                params.insert(name.into(), new.clone());
            }
        }
    }
}
