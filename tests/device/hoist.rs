//! Kernels that compute from parameters alone run once after the parameters are set, not
//! on every run (`CompileOptions::hoist_parameters`): checked on the device against the CPU
//! reference, before and after a parameter changes.

use crate::common;

use crate::common::{random, Domain, Rng};
use fusegraph::crates::reference::{assert_close, evaluate, tolerance};
use fusegraph::{CompileOptions, DType, GraphBuilder, HostTensor};
use std::collections::BTreeMap;

/// A convolution with inference batch norm and ReLU: batch-norm folding scales the weights by
/// `γ / √(σ² + ε)`, a kernel that reads parameters only.
#[test]
fn folded_weights_are_computed_once_and_again_after_a_parameter_changes() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 3, 10, 10]).unwrap();
    let w = b.parameter("w", DType::F32, [8, 3, 3, 3]).unwrap();
    let stats: Vec<_> =
        ["mean", "var", "gamma", "beta"].iter().map(|n| b.parameter(n, DType::F32, [8]).unwrap()).collect();
    let conv = x.conv2d(&w, [1, 1], [1, 1], [1, 1], 1).unwrap();
    let y = conv.batch_norm(&stats[0], &stats[1], &stats[2], &stats[3], 1e-5, 1).unwrap().relu().unwrap();
    let g = b.graph();

    let mut rng = Rng::new(7);
    let feeds = BTreeMap::from([("x".to_string(), random(&mut rng, DType::F32, &[2, 3, 10, 10], Domain::Any))]);
    let mut params = BTreeMap::from([("w".to_string(), random(&mut rng, DType::F32, &[8, 3, 3, 3], Domain::Any))]);
    for (n, domain) in [("mean", Domain::Any), ("var", Domain::Positive), ("gamma", Domain::Any), ("beta", Domain::Any)]
    {
        params.insert(n.to_string(), random(&mut rng, DType::F32, &[8], domain));
    }
    let check = |got: &HostTensor, params: &BTreeMap<String, HostTensor>| {
        let want = evaluate(&g, &[y.id()], &feeds, params).unwrap();
        let (rtol, atol) = tolerance(DType::F32);
        assert_close(got, &want[0], rtol, atol).unwrap();
    };
    let feed: Vec<(&str, &HostTensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();

    for (name, device) in common::devices() {
        let mut exe = device.compile(&g, &[y.id()], &CompileOptions::default()).unwrap();
        let mut plain =
            device.compile(&g, &[y.id()], &CompileOptions { hoist_parameters: false, ..Default::default() }).unwrap();
        assert_eq!(plain.stats().prepared_kernels, 0, "{name}");
        let prepared = exe.stats().prepared_kernels;
        assert!(prepared >= 1, "{name}: the scaled weights are hoisted: {:#?}", exe.stats().kernels);
        for (n, v) in &params {
            exe.set_parameter(n, v).unwrap();
            plain.set_parameter(n, v).unwrap();
        }
        let first = exe.run(&feed).unwrap().remove(0);
        check(&first, &params);
        // The hoisted kernels are skipped now; the values they left are intact.
        let again = exe.run(&feed).unwrap().remove(0);
        assert_eq!(first.as_slice::<f32>(), again.as_slice::<f32>(), "{name}: second run");
        assert_eq!(first.as_slice::<f32>(), plain.run(&feed).unwrap()[0].as_slice::<f32>(), "{name}: hoisting off");
        // A timed loop (what the bench measures) leaves them intact too.
        exe.time(&feed, 1, 3).unwrap();
        assert_eq!(first.as_slice::<f32>(), exe.run(&feed).unwrap()[0].as_slice::<f32>(), "{name}: after timing");

        // A new γ changes the folded weights: they are computed again on the next run.
        let mut changed = params.clone();
        changed.insert("gamma".into(), random(&mut rng, DType::F32, &[8], Domain::Any));
        exe.set_parameter("gamma", &changed["gamma"]).unwrap();
        let after = exe.run(&feed).unwrap().remove(0);
        assert_ne!(first.as_slice::<f32>(), after.as_slice::<f32>(), "{name}");
        check(&after, &changed);
        check(&exe.run(&feed).unwrap()[0], &changed);
    }
}

/// Hoisting keeps the scaled weight alive past the peak of `exp(x·(w ⊙ s))·v`: under a
/// memory limit that only the plain plan fits, the compile drops hoisting instead of failing.
#[test]
fn a_memory_limit_drops_hoisting_where_it_would_not_fit() {
    let (g, outs, _) = fusegraph::crates::passes::testing::scaled_matmul(256).unwrap();
    let y = outs[0];
    let device = &common::devices()[0].1;
    let total = |hoist_parameters| {
        let opts = CompileOptions { hoist_parameters, ..Default::default() };
        device.plan(&g, &[y], &opts).unwrap().total_bytes
    };
    let (plain, hoisted) = (total(false), total(true));
    assert!(hoisted > plain, "{hoisted} vs {plain}");
    let prepared = |limit| {
        // Without rematerialization (whose budgeted plans do not hoist either).
        let opts = CompileOptions { memory_limit: Some(limit), remat: false, ..Default::default() };
        device.compile(&g, &[y], &opts).unwrap().stats().prepared_kernels
    };
    assert_eq!(prepared(plain), 0);
    assert_eq!(prepared(hoisted), 1);
}
