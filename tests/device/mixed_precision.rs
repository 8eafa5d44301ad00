//! Mixed precision (f16 storage, f32 accumulation) halves the transformer's activation peak
//! and stays within f16 tolerance of the f32 run.

use fusegraph::crates::reference::assert_close;
use fusegraph::{CompileOptions, Device};

#[test]
fn mixed_precision_halves_activation_memory_and_matches_f32() {
    let w = fusegraph_workloads::transformer(64, 1, true).unwrap();
    let device = Device::shared().unwrap();
    let f32_opts = CompileOptions::default();
    let mp_opts = CompileOptions { mixed_precision: true, ..Default::default() };
    let full = device.plan(&w.graph, &w.outputs, &f32_opts).unwrap();
    let half = device.plan(&w.graph, &w.outputs, &mp_opts).unwrap();
    let ratio = half.lower_bound_bytes as f64 / full.lower_bound_bytes as f64;
    eprintln!("activation peak f32 {} B, mixed {} B, ratio {ratio:.3}", full.lower_bound_bytes, half.lower_bound_bytes);
    assert!(ratio <= 0.525, "ratio {ratio}");
    // Weights and constants are stored as f16 too (nothing here updates them).
    let weights = half.persistent_bytes as f64 / full.persistent_bytes as f64;
    eprintln!("weights f32 {} B, mixed {} B, ratio {weights:.3}", full.persistent_bytes, half.persistent_bytes);
    assert!(weights <= 0.52, "weights ratio {weights}");

    let run = |opts: &CompileOptions| {
        let mut e = device.compile(&w.graph, &w.outputs, opts).unwrap();
        for (n, v) in &w.params {
            e.set_parameter(n, v).unwrap();
        }
        e.run(&w.feed_refs()).unwrap()
    };
    let (a, b) = (run(&f32_opts), run(&mp_opts));
    let scale = a[0].to_f64().iter().fold(1.0f64, |m, v| m.max(v.abs()));
    assert_close(&b[0], &a[0], 2e-2, 2e-2 * scale).unwrap();
}

/// Under mixed precision a weight keeps its declared f32 type at the API but is stored as
/// f16: `set_parameter` rounds it on upload (ties to even, as the in-kernel cast would) and
/// `parameter` reads back the rounded value, widened. A parameter a training step updates
/// keeps f32 storage.
#[test]
fn mixed_precision_stores_weights_as_f16_behind_their_f32_type() {
    use fusegraph::{DType, GraphBuilder, HostTensor};
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 3]).unwrap();
    let w = b.parameter("w", DType::F32, [3, 3]).unwrap();
    let v = b.parameter("v", DType::F32, [3, 3]).unwrap();
    let y = x.matmul(&w).unwrap().matmul(&v).unwrap();
    let v_next = v.mul_scalar(0.5).unwrap();
    let device = Device::shared().unwrap();
    let opts = CompileOptions { mixed_precision: true, updates: vec![("v".into(), v_next.id())], ..Default::default() };
    let mut exe = device.compile(&b.graph(), &[y.id()], &opts).unwrap();
    let values: Vec<f32> = vec![1.0 + 2f32.powi(-11), 0.1, -3.3, 1.0e-6, 65519.0, 7.0, -0.25, 2.0e-5, 1.0 / 3.0];
    let tensor = HostTensor::new([3, 3], values.clone()).unwrap();
    exe.set_parameter("w", &tensor).unwrap();
    exe.set_parameter("v", &tensor).unwrap();
    let w_back = exe.parameter("w").unwrap();
    assert_eq!(w_back.dtype(), DType::F32);
    let want: Vec<f32> = values.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect();
    assert_eq!(w_back.as_slice::<f32>().unwrap(), want.as_slice(), "w is stored as f16");
    // The updated parameter keeps its f32 master: exact before any step.
    assert_eq!(exe.parameter("v").unwrap().as_slice::<f32>().unwrap(), values.as_slice());
    let weights =
        device.plan(&b.graph(), &[y.id()], &CompileOptions { updates: opts.updates.clone(), ..Default::default() });
    let mixed = device.plan(&b.graph(), &[y.id()], &opts);
    // w: 36 → 18 bytes (rounded up to the planner's alignment); v: 36 bytes either way.
    assert!(mixed.unwrap().persistent_bytes < weights.unwrap().persistent_bytes);
}

/// f32 → f16 casts round to the nearest f16 (ties to even) on the device exactly as the
/// reference does, across the whole range: ties, f16 subnormals (which SPIR-V's
/// `quantizeToF16` would flush to zero), the overflow threshold 65520, infinities and NaN.
/// Fused, the cast is `fg_round_f16` in registers; unfused, the f16 value is stored and read
/// back (native `f16` and packed forms).
#[test]
fn f16_casts_round_like_the_reference_over_the_whole_range() {
    use fusegraph::{DType, DeviceOptions, FusionMode, GraphBuilder, HostTensor};
    let p = |e: i32| 2f32.powi(e);
    let mut xs: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        1.0 + p(-11),       // a tie: to 1 (even)
        1.0 + 3.0 * p(-11), // a tie: up to the even 1 + 2^-9
        1.0 + p(-11) + p(-20),
        65504.0,
        65519.99,
        65520.0, // the first value that rounds to infinity
        -65520.0,
        1.0e6,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        p(-14),
        p(-14) * (1.0 - p(-12)), // the largest subnormal's neighbourhood: rounds up to 2^-14
        p(-24),
        p(-25),       // a tie: to 0
        1.5 * p(-24), // a tie: to 2^-23
        2.5 * p(-24), // a tie: to 2^-23
        -3.0e-8,
        1.0e-10,
        -1.0e-30,
        f32::MIN_POSITIVE,
    ];
    // Every binade from 2^-30 to 2^17, with random mantissas and signs.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for e in -30..=17 {
        for _ in 0..20 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let m = 1.0 + (state >> 40) as f32 / (1u64 << 24) as f32;
            let sign = if state & 1 == 0 { 1.0 } else { -1.0 };
            xs.push(sign * m * p(e));
        }
    }
    let n = xs.len();
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [n]).unwrap();
    let y = x.cast(DType::F16).unwrap().cast(DType::F32).unwrap();
    let g = b.graph();
    let feed = HostTensor::new([n], xs.clone()).unwrap();
    let want: Vec<f32> = xs.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
    for native in [true, false] {
        let device = std::sync::Arc::new(
            Device::new(&DeviceOptions { f16_native: Some(native), ..Default::default() }).unwrap(),
        );
        if native && !device.f16_native() {
            continue;
        }
        for fusion in [FusionMode::On, FusionMode::Off] {
            let exe = device.compile(&g, &[y.id()], &CompileOptions { fusion, ..Default::default() }).unwrap();
            let got = exe.run(&[("x", &feed)]).unwrap();
            let got = got[0].as_slice::<f32>().unwrap();
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
                assert!(same, "native f16 {native}, {fusion:?}: x = {:e} gave {g:e}, want {w:e}", xs[i]);
            }
        }
    }
}

/// A training step compiled with `mixed_precision` (Adam, as the `train` example's MLP):
/// the optimizer's arithmetic stays f32, so its updates are finite and near the f32 step's.
/// In f16, Adam's ε (1e-8) is 0 and small gradients square to 0: with its update in f16,
/// `fc0.bias` would become ±inf.
#[test]
fn mixed_precision_keeps_the_optimizer_update_in_f32() {
    let w = fusegraph_workloads::train_step(fusegraph_workloads::demo::Task::Mlp, true).unwrap();
    let device = Device::shared().unwrap();
    let run = |mixed_precision: bool| {
        let opts = w.options(CompileOptions { mixed_precision, ..Default::default() });
        let mut e = device.compile(&w.graph, &w.outputs, &opts).unwrap();
        for (n, v) in &w.params {
            e.set_parameter(n, v).unwrap();
        }
        e.run(&w.feed_refs()).unwrap();
        w.updates.iter().map(|(n, _)| (n.clone(), e.parameter(n).unwrap())).collect::<Vec<_>>()
    };
    let (full, half) = (run(false), run(true));
    for ((name, a), (_, b)) in full.iter().zip(&half) {
        let bad = b.to_f64().iter().filter(|v| !v.is_finite()).count();
        assert_eq!(bad, 0, "{name}: {bad} of {} values not finite", a.to_f64().len());
        // Adam's first step moves a weight by about lr·sign(g) (lr = 1e-2): where f16
        // rounding flips a tiny gradient's sign, the two steps differ by up to 2·lr.
        assert_close(b, a, 2e-2, 2.5e-2).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
