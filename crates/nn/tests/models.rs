//! The models and the module tree: paths, visit order, one module recorded into graphs of
//! several shapes, evaluated on the CPU reference.

mod common;

use common::{eval, f32s, random};
use fusegraph_ir::{DType, GraphBuilder, HostTensor};
use fusegraph_nn::{
    module, Activation, Forward, Gpt, GptConfig, Linear, MlpClassifier, Module, NnError, Params, ResNet, Scope,
    Sequential,
};

#[test]
fn mlp_gives_probabilities_at_any_batch() {
    let m = MlpClassifier::new(&Scope::root(), &[6, 8, 5, 3]).unwrap();
    let p = Params::of(&m, 1).unwrap();
    assert_eq!(p.len(), 6);
    for batch in [1, 4] {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [batch, 6]).unwrap();
        let probs = m.forward(&x).unwrap();
        assert_eq!(probs.dims(), &[batch, 3]);
        let out = eval(&b, &p, &[&probs], &[("x", random(&[batch, 6], 3))]);
        for row in f32s(&out[0]).chunks(3) {
            assert!(row.iter().all(|&v| v.is_finite() && (0.0..=1.0).contains(&v)));
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5, "row {row:?}");
        }
    }
    assert!(matches!(MlpClassifier::new(&Scope::root(), &[6]), Err(NnError::Config(_))));
}

#[test]
fn resnet_builds_and_evaluates() {
    let m = ResNet::new(&Scope::root(), [4, 8, 8], 10).unwrap();
    let p = Params::of(&m, 2).unwrap();
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 3, 32, 32]).unwrap();
    let logits = m.forward(&x).unwrap();
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
    let cfg = GptConfig { d_model: d, heads: 2, d_mlp: 16, layers: 2, vocab: None, max_seq: seq };
    let m = Gpt::new(&Scope::root(), cfg).unwrap();
    let p = Params::of(&m, 3).unwrap();
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [batch, seq, d]).unwrap();
    let h = m.forward(&x).unwrap();
    assert_eq!(h.dims(), &[batch, seq, d]);
    assert!(p.get("h.1.attn.q.weight").is_some() && p.get("ln_f.weight").is_some());
    let out = eval(&b, &p, &[&h], &[("x", random(&[batch, seq, d], 5))]);
    assert!(f32s(&out[0]).iter().all(|v| v.is_finite()));
}

#[test]
fn gpt_with_a_vocabulary_gives_logits_at_every_length() {
    let (d, vocab, max_seq) = (8, 11, 6);
    let cfg = GptConfig { d_model: d, heads: 2, d_mlp: 16, layers: 1, vocab: Some(vocab), max_seq };
    let m = Gpt::new(&Scope::root(), cfg).unwrap();
    let p = Params::of(&m, 4).unwrap();
    assert_eq!(p.get("wte.weight").unwrap().shape().dims(), &[vocab, d]);
    assert_eq!(p.get("wpe.weight").unwrap().shape().dims(), &[max_seq, d]);
    let tokens: Vec<i32> = (0..12).map(|i| (i * 7) % vocab as i32).collect();
    // A prefix's logits do not depend on what follows it (causal), whatever the length.
    let mut full = Vec::new();
    for (batch, seq) in [(2, 6), (2, 3), (1, 6)] {
        let b = GraphBuilder::new();
        let ids = b.input("ids", m.input_dtype(), [batch, seq]).unwrap();
        let logits = m.forward(&ids).unwrap();
        assert_eq!(logits.dims(), &[batch, seq, vocab]);
        let rows: Vec<i32> = (0..batch).flat_map(|r| tokens[6 * r..6 * r + seq].to_vec()).collect();
        let out = eval(&b, &p, &[&logits], &[("ids", HostTensor::new([batch, seq], rows).unwrap())]);
        full.push(f32s(&out[0]));
    }
    let l = vocab;
    for r in 0..2 {
        let (long, short) = (&full[0][r * 6 * l..], &full[1][r * 3 * l..(r + 1) * 3 * l]);
        for (a, b) in long[..3 * l].iter().zip(short) {
            assert!((a - b).abs() < 1e-5, "row {r}: {a} vs {b}");
        }
    }
    assert_eq!(full[2][..], full[0][..6 * l]);
    let b = GraphBuilder::new();
    let too_long = b.input("ids", DType::I32, [1, 7]).unwrap();
    assert!(matches!(m.forward(&too_long), Err(NnError::Config(_))));
    let bad = GptConfig { heads: 3, ..cfg };
    assert!(matches!(Gpt::new(&Scope::root(), bad), Err(NnError::Config(_))));
}

/// A user's model: a struct of layers, named by its fields' scopes.
struct TwoLayer {
    encoder: Sequential,
    head: Linear,
}

module!(TwoLayer { encoder, head });

#[test]
fn a_struct_of_layers_is_a_module_with_tree_paths() {
    let s = Scope::root().at("net");
    let encoder = Sequential::new()
        .push(Linear::new(&s.at("encoder").at(0), 4, 8, true).unwrap())
        .push(Activation::Relu)
        .push(Linear::new(&s.at("encoder").at(2), 8, 8, false).unwrap());
    let m = TwoLayer { encoder, head: Linear::new(&s.at("head"), 8, 3, true).unwrap() };
    let paths: Vec<String> = m.params().iter().map(|p| p.path().to_string()).collect();
    assert_eq!(
        paths,
        ["net.encoder.0.weight", "net.encoder.0.bias", "net.encoder.2.weight", "net.head.weight", "net.head.bias"]
    );
    assert_eq!(m.num_elements(), 4 * 8 + 8 + 64 + 24 + 3);

    // Modules are plain data: they move to other threads.
    fn send_sync<T: Send + Sync>(_: &T) {}
    send_sync(&m);

    // One parameter node per path, however often the module is applied in a graph.
    let p = Params::of(&m, 7).unwrap();
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 4]).unwrap();
    let y1 = m.head.forward(&m.encoder.forward(&x).unwrap()).unwrap();
    let y2 = m.head.forward(&m.encoder.forward(&x).unwrap()).unwrap();
    let g = b.graph();
    let params =
        g.node_ids().into_iter().filter(|&id| matches!(g.node(id).op, fusegraph_ir::Op::Parameter { .. })).count();
    assert_eq!(params, 5);
    let out = eval(&b, &p, &[&y1, &y2], &[("x", random(&[2, 4], 1))]);
    assert_eq!(out[0], out[1]);
    // The same path recorded at another type is an error naming it.
    let clash = Linear::new(&s.at("head"), 8, 4, true).unwrap();
    let err = clash.forward(&b.input("h", DType::F32, [2, 8]).unwrap()).unwrap_err().to_string();
    assert!(err.contains("net.head.weight"), "{err}");
    let mut q = p.clone();
    assert!(matches!(q.init(&clash), Err(NnError::Shape { .. })));
}
