//! Sibling products combined on the device (`CompileOptions::combine_products`): attention's
//! query, key and value projections run as one batched product over their weights stacked
//! into one parameter, each weight a part of it that `set_parameter` and `parameter` reach by
//! its own name. Checked against the CPU reference on random values, against the compile
//! with the products apart, after a part changes, and under mixed precision.

use crate::common;

use crate::common::{random, Domain, Rng};
use fusegraph::crates::reference::{assert_close, evaluate, tolerance};
use fusegraph::{CompileOptions, DType, Graph, GraphBuilder, HostTensor, NodeId};
use std::collections::BTreeMap;

/// One attention head's projections of a layer-normed input, with biases, and the
/// attention over them; `x: [2, 12, 16]` (more rows than the matrix–vector kernel takes, so
/// the products combine in every form), projections `[16, 16]`.
fn attention() -> (Graph, NodeId) {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 12, 16]).unwrap();
    let h = x.sub(&x.mean(&[2], true).unwrap().broadcast_to([2, 12, 16]).unwrap()).unwrap();
    let linear = |name: &str| {
        let w = b.parameter(&format!("{name}.w"), DType::F32, [16, 16]).unwrap();
        let bias = b.parameter(&format!("{name}.b"), DType::F32, [16]).unwrap();
        h.matmul(&w).unwrap().add(&bias.broadcast_to([2, 12, 16]).unwrap()).unwrap()
    };
    let (q, k, v) = (linear("q"), linear("k"), linear("v"));
    let scores = q.matmul(&k.transpose(&[0, 2, 1]).unwrap()).unwrap().mul_scalar(0.25).unwrap().softmax(2).unwrap();
    let y = scores.matmul(&v).unwrap().add(&x).unwrap();
    (b.graph(), y.id())
}

fn values(g: &Graph, seed: u64) -> (BTreeMap<String, HostTensor>, BTreeMap<String, HostTensor>) {
    let mut rng = Rng::new(seed);
    let feeds = BTreeMap::from([("x".to_string(), random(&mut rng, DType::F32, &[2, 12, 16], Domain::Any))]);
    let mut params = BTreeMap::new();
    for id in g.node_ids() {
        let fusegraph::Op::Parameter { name } = &g.node(id).op else { continue };
        let ty = g.ty(id);
        // Small weights keep the softmax away from saturation.
        let t = random(&mut rng, DType::F32, ty.shape.dims(), Domain::Any).to_f64();
        let t: Vec<f64> = t.iter().map(|v| v / 8.0).collect();
        params.insert(name.clone(), HostTensor::from_f64(DType::F32, ty.shape.clone(), &t).unwrap());
    }
    (feeds, params)
}

#[test]
fn projections_run_as_one_product_on_stacked_parameters() {
    let (g, y) = attention();
    let (feeds, mut params) = values(&g, 5);
    let feed: Vec<(&str, &HostTensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let (rtol, atol) = tolerance(DType::F32);
    for (name, device) in common::devices() {
        let mut on = device.compile(&g, &[y], &CompileOptions::default()).unwrap();
        let mut off =
            device.compile(&g, &[y], &CompileOptions { combine_products: false, ..Default::default() }).unwrap();
        // Three projection kernels became one.
        assert_eq!(on.stats().kernels.len() + 2, off.stats().kernels.len(), "{name}: {:#?}", on.stats().kernels);
        assert_eq!(on.stats().combined_products, (3, 1), "{name}");
        assert_eq!(off.stats().combined_products, (0, 0), "{name}");
        assert!(on.stats().persistent_bytes <= off.stats().persistent_bytes, "{name}");
        // The user's parameters, by their own names; the stacks are not among them.
        assert_eq!(on.parameters(), off.parameters(), "{name}");
        for (n, v) in &params {
            on.set_parameter(n, v).unwrap();
            off.set_parameter(n, v).unwrap();
        }
        let want = evaluate(&g, &[y], &feeds, &params).unwrap();
        let got = on.run(&feed).unwrap().remove(0);
        assert_close(&got, &want[0], rtol, atol).unwrap();
        // Apart, the products are other kernels (a GPU's autotuner may tile the stacked
        // product otherwise): the same values up to the order of their sums.
        assert_close(&got, &off.run(&feed).unwrap()[0], 1e-5, 1e-5).unwrap();
        // Each part reads back as set: the parts lie where set_parameter wrote them.
        for n in ["q.w", "k.w", "v.w", "k.b"] {
            assert_eq!(on.parameter(n).unwrap().as_slice::<f32>(), params[n].as_slice::<f32>(), "{name}: {n}");
        }
        // A new middle part (the key weights) changes the output as the reference says.
        let (_, other) = values(&g, 9);
        params.insert("k.w".into(), other["k.w"].clone());
        on.set_parameter("k.w", &params["k.w"]).unwrap();
        let want = evaluate(&g, &[y], &feeds, &params).unwrap();
        assert_close(&on.run(&feed).unwrap()[0], &want[0], rtol, atol).unwrap();
        assert_eq!(on.parameter("q.w").unwrap().as_slice::<f32>(), params["q.w"].as_slice::<f32>(), "{name}");
        let (_, back) = values(&g, 5);
        params.insert("k.w".into(), back["k.w"].clone());
    }
}

#[test]
fn stacked_parameters_under_mixed_precision() {
    let (g, y) = attention();
    let (feeds, params) = values(&g, 13);
    let feed: Vec<(&str, &HostTensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let want = evaluate(&g, &[y], &feeds, &params).unwrap();
    // f16 values through two products and a softmax over 12 keys: a few of 384 elements
    // land 3e-3 from the f64 reference.
    let (rtol, atol) = tolerance(DType::F16);
    let atol = atol.max(4e-3);
    for (name, device) in common::devices() {
        let mixed = CompileOptions { mixed_precision: true, ..Default::default() };
        let mut on = device.compile(&g, &[y], &mixed).unwrap();
        let off_opts = CompileOptions { combine_products: false, ..mixed.clone() };
        let off = device.compile(&g, &[y], &off_opts).unwrap();
        assert!(on.stats().kernels.len() < off.stats().kernels.len(), "{name}: {:#?}", on.stats().kernels);
        for (n, v) in &params {
            on.set_parameter(n, v).unwrap();
        }
        assert_close(&on.run(&feed).unwrap()[0], &want[0], rtol, atol).unwrap();
        // Stored in f16: a part reads back rounded to f16.
        let back = on.parameter("v.w").unwrap().to_f64();
        let set = params["v.w"].to_f64();
        assert!(back.iter().zip(&set).all(|(a, b)| (a - b).abs() <= b.abs() * 1e-3 + 1e-7), "{name}");
    }
}
