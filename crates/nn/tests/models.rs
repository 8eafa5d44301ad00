//! The model builders build, evaluate on the CPU reference and give sensible outputs.

mod common;

use common::{eval, f32s, random};
use fusegraph_ir::{DType, GraphBuilder, HostTensor};
use fusegraph_nn::{models, NnError, Params};

#[test]
fn mlp_gives_probabilities() {
    let b = GraphBuilder::new();
    let mut p = Params::new(1);
    let (x, probs) = models::mlp(&b, &mut p, 4, &[6, 8, 5, 3]).unwrap();
    assert_eq!(x.dims(), &[4, 6]);
    assert_eq!(probs.dims(), &[4, 3]);
    assert_eq!(p.len(), 6);
    let out = eval(&b, &p, &[&probs], &[("x", random(&[4, 6], 3))]);
    for row in f32s(&out[0]).chunks(3) {
        assert!(row.iter().all(|&v| v.is_finite() && (0.0..=1.0).contains(&v)));
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5, "row {row:?}");
    }
    assert!(matches!(models::mlp(&b, &mut p, 4, &[6]), Err(NnError::Config(_))));
}

#[test]
fn resnet_builds_and_evaluates() {
    let b = GraphBuilder::new();
    let mut p = Params::new(2);
    let (x, logits) = models::resnet(&b, &mut p, 2, [4, 8, 8], 10).unwrap();
    assert_eq!(x.dims(), &[2, 3, 32, 32]);
    assert_eq!(logits.dims(), &[2, 10]);
    assert!(p.get("layer2.downsample.0.weight").is_some());
    assert!(p.get("layer3.downsample.0.weight").is_some(), "stride 2 needs a projection shortcut");
    assert!(p.get("layer1.downsample.0.weight").is_none());
    let out = eval(&b, &p, &[&logits], &[("x", random(&[2, 3, 32, 32], 4))]);
    let v = f32s(&out[0]);
    assert!(v.iter().all(|v| v.is_finite()));
    assert_ne!(v[..10], v[10..], "different images, different logits");
}

#[test]
fn gpt_builds_and_evaluates() {
    let (batch, seq, d) = (2, 5, 8);
    let b = GraphBuilder::new();
    let mut p = Params::new(3);
    let (x, h) = models::gpt(&b, &mut p, batch, seq, d, 2, 16, 2, None).unwrap();
    assert_eq!(x.dims(), &[batch, seq, d]);
    assert_eq!(h.dims(), &[batch, seq, d]);
    assert!(p.get("h.1.attn.q.weight").is_some() && p.get("ln_f.weight").is_some());
    let out = eval(&b, &p, &[&h], &[("x", random(&[batch, seq, d], 5))]);
    assert!(f32s(&out[0]).iter().all(|v| v.is_finite()));
}

#[test]
fn gpt_with_a_vocabulary_gives_logits() {
    let (batch, seq, d, vocab) = (2, 4, 8, 11);
    let b = GraphBuilder::new();
    let mut p = Params::new(4);
    let (ids, logits) = models::gpt(&b, &mut p, batch, seq, d, 2, 16, 1, Some(vocab)).unwrap();
    assert_eq!(ids.dims(), &[batch, seq]);
    assert_eq!(ids.dtype(), DType::I32);
    assert_eq!(logits.dims(), &[batch, seq, vocab]);
    assert_eq!(p.get("wte.weight").unwrap().shape().dims(), &[vocab, d]);
    assert_eq!(p.get("wpe.weight").unwrap().shape().dims(), &[seq, d]);
    let tokens: Vec<i32> = (0..(batch * seq) as i32).map(|i| (i * 7) % vocab as i32).collect();
    let out = eval(&b, &p, &[&logits], &[("ids", HostTensor::new([batch, seq], tokens).unwrap())]);
    assert!(f32s(&out[0]).iter().all(|v| v.is_finite()));
    assert!(matches!(models::gpt(&b, &mut p, 1, 4, 8, 3, 16, 1, None), Err(NnError::Config(_))));
}
