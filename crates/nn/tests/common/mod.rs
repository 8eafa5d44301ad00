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
