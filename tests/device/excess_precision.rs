//! Excess precision (`CompileOptions::excess_precision`, on by default): within a fused
//! kernel, the f16 values no other kernel computes stay in f32 and are rounded to f16 only
//! where they are stored, as XLA allows within a fusion; off, every f16 op rounds, as the
//! unfused run and the reference do.

use crate::common::{devices, Rng};
use fusegraph::crates::reference::evaluate;
use fusegraph::{CompileOptions, DType, Graph, GraphBuilder, HostTensor, NodeId};
use std::collections::BTreeMap;

const N: usize = 4099;

/// The roofline's 20-op chain (`add y`, `× 0.5`, `tanh`, `sub y`, five times) over `[N]`.
fn chain(dtype: DType) -> (Graph, NodeId) {
    let b = GraphBuilder::new();
    let x = b.input("x", dtype, [N]).unwrap();
    let y = b.input("y", dtype, [N]).unwrap();
    let mut v = x;
    for _ in 0..5 {
        v = v.add(&y).unwrap().mul_scalar(0.5).unwrap().tanh().unwrap().sub(&y).unwrap();
    }
    (b.graph(), v.id())
}

/// Random values, f16 values all (so the f16 and the f32 graph read the same numbers).
fn halves(rng: &mut Rng, lo: f64, hi: f64) -> Vec<f64> {
    (0..N).map(|_| half::f16::from_f64(rng.uniform(lo, hi)).to_f64()).collect()
}

/// The spacing of f16 values at `v`.
fn f16_ulp(v: f64) -> f64 {
    let a = v.abs().max(2f64.powi(-14));
    2f64.powi(a.log2().floor() as i32 - 10)
}

/// The chain in f16 on the device is the chain computed in f32 and rounded once: the f32
/// reference's result rounded to f16 on (almost) every element, where rounding every op
/// (excess precision off) differs on about a quarter of them; off, the fused kernel rounds
/// exactly as the unfused kernels do.
#[test]
fn fused_f16_chain_rounds_only_where_stored() {
    let mut rng = Rng::new(7);
    let (xs, ys) = (halves(&mut rng, -3.0, 3.0), halves(&mut rng, -1.0, 1.0));
    let feeds = |dtype| {
        [("x", &xs), ("y", &ys)]
            .map(|(n, v)| (n.to_string(), HostTensor::from_f64(dtype, [N], v).unwrap()))
            .into_iter()
            .collect::<BTreeMap<_, _>>()
    };
    let (g32, out32) = chain(DType::F32);
    let exact = evaluate(&g32, &[out32], &feeds(DType::F32), &BTreeMap::new()).unwrap()[0].to_f64();
    let want: Vec<f64> = exact.iter().map(|&v| half::f16::from_f64(v).to_f64()).collect();
    // Elements further from the f32 result than one f16 step (and 4e-6: some results are
    // differences of nearly equal values, whose f16 steps are far below the f32 error).
    let misses = |got: &[f64]| got.iter().zip(&want).filter(|(g, w)| (*g - *w).abs() > f16_ulp(**w) + 4e-6).count();
    // Elements that differ at all (a near tie may round the other way after the device's
    // `tanh`, a few f32 steps off the reference's).
    let differ = |got: &[f64]| got.iter().zip(&want).filter(|(g, w)| g != w).count();
    let (g16, out16) = chain(DType::F16);
    let f16_feeds = feeds(DType::F16);
    let feed_refs: Vec<(&str, &HostTensor)> = f16_feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
    for (name, device) in devices() {
        let run = |opts: &CompileOptions| {
            let exe = device.compile(&g16, &[out16], opts).unwrap();
            let fused = opts.fusion == fusegraph::FusionMode::On;
            assert_eq!(exe.stats().kernels.len() == 1, fused, "{name}: one kernel fused, one per op unfused");
            exe.run(&feed_refs).unwrap()[0].to_f64()
        };
        let wide = run(&CompileOptions::default());
        let rounded = run(&CompileOptions { excess_precision: false, ..Default::default() });
        let unfused = run(&CompileOptions::unfused());
        assert_eq!(rounded, unfused, "{name}: without excess precision the fused kernel rounds every op");
        let (wide_misses, rounded_misses) = (misses(&wide), misses(&rounded));
        let (wide_ne, rounded_ne) = (differ(&wide), differ(&rounded));
        eprintln!(
            "{name}: of {N} elements, {wide_ne} and {rounded_ne} differ from the f32 result rounded to f16, \
             {wide_misses} and {rounded_misses} by more than a step (excess precision on, off)"
        );
        assert_eq!(wide_misses, 0, "{name}: excess precision rounds once");
        assert!(wide_ne <= N / 100, "{name}: excess precision rounds once ({wide_ne} of {N} differ)");
        assert!(rounded_ne > N / 10, "{name}: rounding every op is visible ({rounded_ne} of {N} differ)");
    }
}

/// Row kernels too: an f16 softmax and layer norm, fused, with excess precision are the f32
/// results rounded once on (almost) every element, far closer than rounding every op (which
/// still rounds as the unfused kernels do).
#[test]
fn fused_f16_rows_round_only_where_stored() {
    const ROWS: usize = 64;
    // f16 constants only (the softmax's scale, the mean's `1 / COLS`), so that the f32 graph
    // computes the same function.
    const COLS: usize = 1024;
    let build = |dtype| {
        let b = GraphBuilder::new();
        let x = b.input("x", dtype, [ROWS, COLS]).unwrap();
        let soft = x.mul_scalar(1.75).unwrap().softmax(1).unwrap();
        let norm = x.layer_norm(&[1], 1e-5).unwrap();
        (b.graph(), vec![soft.id(), norm.id()])
    };
    let mut rng = Rng::new(11);
    let values: Vec<f64> = (0..ROWS * COLS).map(|_| half::f16::from_f64(rng.uniform(-3.0, 3.0)).to_f64()).collect();
    let feed = |dtype| HostTensor::from_f64(dtype, [ROWS, COLS], &values).unwrap();
    let (g32, outs32) = build(DType::F32);
    let feeds32: BTreeMap<String, HostTensor> = [("x".to_string(), feed(DType::F32))].into();
    let exact = evaluate(&g32, &outs32, &feeds32, &BTreeMap::new()).unwrap();
    let (g16, outs16) = build(DType::F16);
    let x16 = feed(DType::F16);
    for (name, device) in devices() {
        let run = |opts: &CompileOptions| {
            let exe = device.compile(&g16, &outs16, opts).unwrap();
            let fused = opts.fusion == fusegraph::FusionMode::On;
            assert!(!fused || exe.stats().kernels.len() <= 2, "{name}: fused row kernels");
            exe.run(&[("x", &x16)]).unwrap()
        };
        let wide = run(&CompileOptions::default());
        let rounded = run(&CompileOptions { excess_precision: false, ..Default::default() });
        let unfused = run(&CompileOptions::unfused());
        for (k, what) in ["softmax", "layer norm"].iter().enumerate() {
            let want: Vec<f64> = exact[k].to_f64().iter().map(|&v| half::f16::from_f64(v).to_f64()).collect();
            let differ = |got: &HostTensor| got.to_f64().iter().zip(&want).filter(|(g, w)| g != w).count();
            let misses = |got: &HostTensor| {
                got.to_f64().iter().zip(&want).filter(|(g, w)| (*g - *w).abs() > f16_ulp(**w) + 4e-6).count()
            };
            let (wide_ne, rounded_ne) = (differ(&wide[k]), differ(&rounded[k]));
            eprintln!(
                "{name} {what}: of {} elements, {wide_ne} and {rounded_ne} differ from the f32 result rounded to \
                 f16 (excess precision on, off)",
                ROWS * COLS
            );
            assert_eq!(misses(&wide[k]), 0, "{name} {what}: within a step of the f32 result");
            assert!(wide_ne <= ROWS * COLS / 1000, "{name} {what}: excess precision rounds once ({wide_ne} differ)");
            assert!(
                rounded_ne >= ROWS * COLS / 10,
                "{name} {what}: rounding every op is visible ({rounded_ne} differ)"
            );
            assert_eq!(rounded[k].to_f64(), unfused[k].to_f64(), "{name} {what}: rounding every op");
        }
    }
}
