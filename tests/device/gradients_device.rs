//! Whole-model gradients computed on the device (fused) match the CPU reference evaluating
//! the same backward graph: an MLP, a small CNN and a small transformer.

use fusegraph::crates::reference::{assert_close, evaluate};
use fusegraph::nn::{Forward, Gpt, GptConfig, MlpClassifier, Params, ResNet, Scope};
use fusegraph::DType;
use fusegraph::{grad, CompileOptions, Device, GraphBuilder, HostTensor, Tensor};
use std::collections::BTreeMap;

fn check(name: &str, b: &GraphBuilder, p: &Params, x: &Tensor, out: &Tensor) {
    // A scalar loss that weights every output element differently.
    let n = out.shape().numel();
    let weights = b
        .constant(
            out.dtype(),
            out.dims().to_vec(),
            &fusegraph_workloads::random_values(9, n).iter().map(|&v| v as f64).collect::<Vec<_>>(),
        )
        .unwrap();
    let axes: Vec<usize> = (0..out.rank()).collect();
    let loss = out.mul(&weights).unwrap().sum(&axes, false).unwrap();
    let names: Vec<String> = p.iter().map(|(k, _)| k.clone()).collect();
    let params: Vec<Tensor> = names.iter().map(|k| param_tensor(b, k)).collect();
    let refs: Vec<&Tensor> = params.iter().collect();
    let grads = grad(&loss, &refs).unwrap();
    let outs: Vec<_> = grads.iter().map(|g| g.id()).collect();
    let g = b.graph();

    let xv = HostTensor::new(x.dims().to_vec(), fusegraph_workloads::random_values(4, x.shape().numel())).unwrap();
    let feeds = BTreeMap::from([("x".to_string(), xv.clone())]);
    let want = evaluate(&g, &outs, &feeds, p.as_map()).unwrap();

    let device = Device::shared().unwrap();
    let mut exe = device.compile(&g, &outs, &CompileOptions::default()).unwrap();
    for (k, v) in p.iter() {
        exe.set_parameter(k, v).unwrap();
    }
    let got = exe.run(&[("x", &xv)]).unwrap();
    for ((k, a), w) in names.iter().zip(&got).zip(&want) {
        let scale = w.to_f64().iter().fold(1e-3f64, |m, v| m.max(v.abs()));
        assert_close(a, w, 1e-3, 1e-4 * scale).unwrap_or_else(|e| panic!("{name}: gradient of {k}: {e}"));
    }
    eprintln!("{name}: {} parameter gradients match, {} kernels", names.len(), exe.stats().kernels.len());
}

/// The Parameter node named `name` in the builder's graph.
fn param_tensor(b: &GraphBuilder, name: &str) -> Tensor {
    let g = b.graph();
    let id = g
        .node_ids()
        .into_iter()
        .find(|&n| matches!(&g.node(n).op, fusegraph::Op::Parameter { name: m } if m == name))
        .expect("a parameter of that name");
    b.tensor(id).unwrap()
}

/// `model` applied to an f32 input of `dims`, with parameters drawn from `seed`.
fn apply(model: &dyn Forward, dims: &[usize], seed: u64) -> (GraphBuilder, Params, Tensor, Tensor) {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, dims.to_vec()).unwrap();
    let y = model.forward(&x).unwrap();
    (b, Params::of(model, seed).unwrap(), x, y)
}

#[test]
fn mlp_gradients_match_the_reference() {
    let (b, p, x, y) = apply(&MlpClassifier::new(&Scope::root(), &[16, 32, 10]).unwrap(), &[8, 16], 1);
    check("mlp", &b, &p, &x, &y);
}

#[test]
fn cnn_gradients_match_the_reference() {
    let (b, p, x, y) = apply(&ResNet::new(&Scope::root(), [4, 4, 8], 3).unwrap(), &[1, 3, 32, 32], 2);
    check("cnn", &b, &p, &x, &y);
}

#[test]
fn transformer_gradients_match_the_reference() {
    let cfg = GptConfig { d_model: 16, heads: 2, d_mlp: 32, layers: 1, vocab: None, max_seq: 8 };
    let (b, p, x, y) = apply(&Gpt::new(&Scope::root(), cfg).unwrap(), &[1, 8, 16], 3);
    check("transformer", &b, &p, &x, &y);
}

/// A max reduction's gradient goes to the elements equal to the maximum, found by
/// comparing `x` with `max(x)`: an exact tie. Recomputed in the kernel of the maximum and
/// again in the kernels of the comparison, `x = silu(silu(input))` may round differently in
/// one copy (lavapipe's does, as in `tests/fuzz_device.rs`'s seed 333), and the gradient of a
/// maximum would go missing: fusion stores such a value once.
#[test]
fn max_reduction_gradients_reach_every_maximum() {
    let b = GraphBuilder::new();
    let (rows, cols) = (65, 256);
    let x = b.input("x", fusegraph::DType::F32, vec![rows, cols]).unwrap();
    let y = x.silu().unwrap().silu().unwrap();
    let centered = y.sub(&y.max(&[0], true).unwrap()).unwrap();
    let squares = |t: &Tensor| t.mul(t).unwrap().sum(&[0, 1], false).unwrap();
    let loss = squares(&centered).add(&squares(&y)).unwrap();
    let grads = grad(&loss, &[&x]).unwrap();
    let g = b.graph();
    let xv = HostTensor::new([rows, cols], fusegraph_workloads::random_values(7, rows * cols)).unwrap();
    let feeds = BTreeMap::from([("x".to_string(), xv.clone())]);
    let want = evaluate(&g, &[grads[0].id()], &feeds, &BTreeMap::new()).unwrap();
    let device = Device::shared().unwrap();
    let exe = device.compile(&g, &[grads[0].id()], &CompileOptions::default()).unwrap();
    let got = exe.run(&[("x", &xv)]).unwrap();
    let scale = want[0].to_f64().iter().fold(1.0f64, |m, v| m.max(v.abs()));
    assert_close(&got[0], &want[0], 1e-4, 1e-5 * scale).unwrap();
}

/// A mixture of experts trains: the gradients of a loss through its router (the chosen
/// experts' probabilities), its gathered expert stacks (each expert's rows get the gradients
/// of the tokens that chose it) and its shared expert, on the device, match the reference's.
#[test]
fn mixture_of_experts_gradients_match_the_reference() {
    use fusegraph::nn::feed_forward::SparseMoe;
    use fusegraph::nn::llama::{Activation, MoeConfig, MoeStyle, Router, SharedExpert};
    let c = MoeConfig {
        experts: 6,
        top_k: 2,
        expert_size: 24,
        normalize: true,
        shared_expert: Some(SharedExpert { width: 20, gated: true, bias: false }),
        sparse_layers: vec![true],
        style: MoeStyle::Standard,
        router: Router::Softmax { corrected: false },
    };
    let moe = SparseMoe::new(&Scope::root().at("mlp"), 16, &c).unwrap();
    let mut p = Params::of(&moe, 5).unwrap();
    // A wide router, so that no token's choice is near a tie.
    let router = moe.gate.weight.path();
    let dims = p.get(router).unwrap().shape().dims().to_vec();
    let wide: Vec<f32> =
        fusegraph_workloads::random_values(11, dims.iter().product()).iter().map(|v| 3.0 * v).collect();
    p.insert(router, HostTensor::new(dims, wide).unwrap());
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [7, 16]).unwrap();
    let y = moe.forward(&x, Activation::Silu).unwrap();
    check("mixture of experts", &b, &p, &x, &y);
}

/// Multi-head latent attention trains: the gradients of a loss through its compressed
/// queries, its latent and rotary key, the up-projection absorbed into the queries and applied
/// to the weighed latents, under a causal mask, on the device, match the reference's.
#[test]
fn latent_attention_gradients_match_the_reference() {
    use fusegraph::nn::latent::{LatentAttention, LatentConfig};
    use fusegraph::nn::llama::rotary_angles;
    let c = LatentConfig {
        q_lora_rank: Some(8),
        kv_lora_rank: 16,
        qk_nope_head_dim: 8,
        qk_rope_head_dim: 4,
        v_head_dim: 6,
    };
    let attn = LatentAttention::new(&Scope::root().at("self_attn"), 16, 2, c, false).unwrap();
    let p = Params::of(&attn, 7).unwrap();
    let (b, seq) = (GraphBuilder::new(), 5);
    let x = b.input("x", DType::F32, [1, seq, 16]).unwrap();
    let pos = b.iota(DType::I32, [seq], 0).unwrap();
    let angles = rotary_angles(&pos, &[1.0, 0.1]).unwrap();
    let [q, latent, k_rope] = attn.project(&x, &angles, true).unwrap();
    let (rows, cols) = (pos.reshape([seq, 1]).unwrap(), pos.reshape([1, seq]).unwrap());
    let keep = cols.broadcast_to([seq, seq]).unwrap().le(&rows.broadcast_to([seq, seq]).unwrap()).unwrap();
    let scale = 1.0 / (c.qk_head_dim() as f64).sqrt();
    let y = attn.attend(&q, &latent, &k_rope, &keep, (scale, None)).unwrap();
    let y = attn.o_proj.forward(&y).unwrap();
    check("latent attention", &b, &p, &x, &y);
}
