//! Helpers shared by the integration tests.
#![allow(dead_code)]

use fusegraph_ir::{GraphBuilder, HostTensor, Tensor};
use fusegraph_nn::Params;
use std::collections::BTreeMap;

/// Evaluates `outputs` on the CPU reference with `feeds` and the values in `params`.
pub fn eval(b: &GraphBuilder, p: &Params, outputs: &[&Tensor], feeds: &[(&str, HostTensor)]) -> Vec<HostTensor> {
    let feeds: BTreeMap<String, HostTensor> = feeds.iter().map(|(n, t)| (n.to_string(), t.clone())).collect();
    let ids: Vec<_> = outputs.iter().map(|t| t.id()).collect();
    fusegraph_reference::evaluate(&b.graph(), &ids, &feeds, p.as_map()).expect("reference evaluation")
}

/// Deterministic pseudo-random f32 values in [-1, 1) (the workspace's seeded PCG).
pub fn values(n: usize, seed: u32) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed as u64);
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// An f32 host tensor of `shape` filled with [`values`].
pub fn random(shape: &[usize], seed: u32) -> HostTensor {
    HostTensor::new(shape, values(shape.iter().product(), seed)).unwrap()
}

/// The elements of an f32 tensor.
pub fn f32s(t: &HostTensor) -> Vec<f32> {
    t.as_slice::<f32>().expect("f32 tensor").to_vec()
}

/// The scope `name` under the root (`name` may hold dots).
pub fn at(name: &str) -> fusegraph_nn::Scope {
    fusegraph_nn::Scope::root().at(name)
}

/// `m` with its parameters given values in `p`.
pub fn init<M: fusegraph_nn::Module>(p: &mut Params, m: fusegraph_nn::Result<M>) -> fusegraph_nn::Result<M> {
    let m = m?;
    p.init(&m)?;
    Ok(m)
}

/// `tests/data/checkpoints` (the `transformers` fixtures) under the workspace.
pub fn checkpoints() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/checkpoints")
}

/// A reference json's prompt ids and prompt logits (row after row).
pub fn reference(path: &std::path::Path) -> (Vec<i32>, Vec<f64>) {
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let prompt = r["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap() as i32).collect();
    let rows = r["logits"].as_array().unwrap().iter();
    let logits = rows.flat_map(|row| row.as_array().unwrap().iter().map(|v| v.as_f64().unwrap())).collect();
    (prompt, logits)
}

/// The largest difference from `want`, relative to `want`'s largest magnitude.
pub fn relative_error(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    got.iter().zip(want).fold(0.0f64, |m, (a, b)| m.max((a - b).abs())) / scale
}

/// `outputs` of `b` on the CPU reference with a loaded model's parameters.
fn evaluate(b: &GraphBuilder, p: &fusegraph_nn::Pretrained, out: &Tensor, feeds: &[(&str, HostTensor)]) -> Vec<f64> {
    let feeds: BTreeMap<String, HostTensor> = feeds.iter().map(|(n, t)| (n.to_string(), t.clone())).collect();
    let got = fusegraph_reference::evaluate(&b.graph(), &[out.id()], &feeds, &p.params).expect("reference evaluation");
    got[0].to_f64()
}

/// A loaded model's prompt logits, from a prefill on the CPU reference.
pub fn prefill_logits(p: &fusegraph_nn::Pretrained, prompt: &[i32]) -> Vec<f64> {
    let b = GraphBuilder::new();
    let x = b.input("ids", fusegraph_ir::DType::I32, [1, prompt.len()]).unwrap();
    let logits = p.model.prefill(&x).unwrap().0;
    evaluate(&b, p, &logits, &[("ids", HostTensor::new([1, prompt.len()], prompt.to_vec()).unwrap())])
}

/// A loaded model's logits for the prompt's last token from a decode step at its position,
/// over caches of `max` positions (`live` of them read) that a prefill of the rest filled.
pub fn last_step_logits(p: &fusegraph_nn::Pretrained, prompt: &[i32], max: usize, live: usize) -> Vec<f64> {
    use fusegraph_ir::DType;
    let (b, n) = (GraphBuilder::new(), prompt.len());
    let head = b.input("head", DType::I32, [1, n - 1]).unwrap();
    let (_, kvs) = p.model.prefill(&head).unwrap();
    let pad = |t: &Tensor| {
        let d = t.dims().to_vec();
        let zeros = b.full(DType::F32, [d[0], d[1], max - (n - 1), d[3]], 0.0).unwrap();
        b.concat(&[t, &zeros], 2).unwrap()
    };
    let caches: Vec<_> = kvs.iter().map(|(k, v)| (pad(k), pad(v))).collect();
    let last = b.input("last", DType::I32, [1, 1]).unwrap();
    let pos = b.input("pos", DType::I32, [1]).unwrap();
    let (step, _) = p.model.decode(&last, &pos, &caches, live).unwrap();
    let feeds = [
        ("head", HostTensor::new([1, n - 1], prompt[..n - 1].to_vec()).unwrap()),
        ("last", HostTensor::new([1, 1], vec![prompt[n - 1]]).unwrap()),
        ("pos", HostTensor::new([1], vec![(n - 1) as i32]).unwrap()),
    ];
    evaluate(&b, p, &step, &feeds)
}
