//! Mixtures of experts: the layer against a host computation of its definition (each token's
//! top k experts by router probability, their gated MLPs weighted by those probabilities),
//! in f32 and with q8_0 expert stacks; the configs of the MoE classes; stacked checkpoint
//! parameters and the errors that name a missing or extra expert.

mod common;

use common::{eval, random};
use fusegraph_ir::{DType, GraphBuilder, HostTensor};
use fusegraph_nn::feed_forward::{top_k, SparseMoe};
use fusegraph_nn::llama::{Architecture, FeedForward, MoeConfig, MoeStyle, QkNorm, Router, SharedExpert};
use fusegraph_nn::{Checkpoint, KeyMap, Llama, LlamaConfig, Matrices, Module, NnError, Params, Scope};
use std::path::{Path, PathBuf};

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// `x [t, h]` · `w` for a stacked weight's expert `e`, in its stored layout (`[e, in, out]`,
/// or a block type's `[e, out, in]`).
fn expert_product(x: &[f64], w: &HostTensor, e: usize) -> Vec<f64> {
    let d = w.shape().dims();
    let (rows_out, n) = (w.dtype().block().is_some(), d[1] * d[2]);
    let (inp, out) = if rows_out { (d[2], d[1]) } else { (d[1], d[2]) };
    let v = &w.to_f64()[e * n..(e + 1) * n];
    (0..out).map(|o| (0..inp).map(|i| x[i] * if rows_out { v[o * inp + i] } else { v[i * out + o] }).sum()).collect()
}

/// The mixture's output for one token `x`, computed on the host from `p`'s values.
fn mixture(moe: &SparseMoe, p: &Params, x: &[f64]) -> Vec<f64> {
    let get = |path: &str| p.get(path).unwrap().clone();
    let router = get(moe.gate.weight.path());
    let (n, block) = (moe.gate.out_dim(), router.dtype().block().is_some());
    let router = router.to_f64();
    let at = |i: usize, e: usize| if block { router[e * x.len() + i] } else { router[i * n + e] };
    let logits: Vec<f64> = (0..n).map(|e| x.iter().enumerate().map(|(i, v)| v * at(i, e)).sum()).collect();
    let top = logits.iter().cloned().fold(f64::MIN, f64::max);
    let z: f64 = logits.iter().map(|l| (l - top).exp()).sum();
    let probs: Vec<f64> = logits.iter().map(|l| (l - top).exp() / z).collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|a, b| probs[*b].total_cmp(&probs[*a]));
    let chosen = &order[..moe.top_k];
    let total: f64 = chosen.iter().map(|&e| probs[e]).sum();
    let (gate, up, down) = (
        get(moe.experts.gate_up[0].weight.path()),
        get(moe.experts.gate_up[1].weight.path()),
        get(moe.experts.down_proj.weight.path()),
    );
    let mut y = vec![0.0; x.len()];
    for &e in chosen {
        let g = expert_product(x, &gate, e);
        let u = expert_product(x, &up, e);
        let h: Vec<f64> = g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect();
        let w = if moe.normalize { probs[e] / total } else { probs[e] };
        for (y, d) in y.iter_mut().zip(expert_product(&h, &down, e)) {
            *y += w * d;
        }
    }
    y
}

fn config(experts: usize, top_k: usize, expert_size: usize, normalize: bool) -> MoeConfig {
    let style = MoeStyle::Standard;
    let (sparse_layers, router) = (vec![true], Router::Softmax { corrected: false });
    MoeConfig { experts, top_k, expert_size, normalize, shared_expert: None, sparse_layers, style, router }
}

/// `moe` under a fresh seed with its router drawn wide (so that no token's choice is near a
/// tie), applied to 5 random tokens on the CPU reference; its largest difference from the host
/// computation, relative to the largest output.
fn error_of(moe: &SparseMoe, hidden: usize) -> f64 {
    let mut p = Params::of(moe, 7).unwrap();
    let router = moe.gate.weight.path();
    let ty = p.get(router).unwrap().ty();
    let wide = random(ty.shape.dims(), 3).to_f64();
    p.insert(router, HostTensor::from_f64(ty.dtype, ty.shape.clone(), &wide).unwrap());
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [5, hidden]).unwrap();
    let y = moe.forward(&x, fusegraph_nn::llama::Activation::Silu).unwrap();
    let xs = random(&[5, hidden], 11);
    let got = eval(&b, &p, &[&y], &[("x", xs.clone())])[0].to_f64();
    let xs = xs.to_f64();
    let want: Vec<f64> = xs.chunks(hidden).flat_map(|row| mixture(moe, &p, row)).collect();
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    got.iter().zip(&want).fold(0.0f64, |m, (a, b)| m.max((a - b).abs())) / scale
}

#[test]
fn a_mixture_sends_each_token_through_its_top_k_experts() {
    for (top, normalize) in [(1, false), (2, true), (3, false), (6, true)] {
        let moe = SparseMoe::new(&Scope::root().at("mlp"), 16, &config(6, top, 24, normalize)).unwrap();
        let err = error_of(&moe, 16);
        assert!(err < 1e-5, "top {top} (normalized {normalize}): {err:.2e}");
    }
    // Expert stacks of q8_0 blocks (`[experts, out, in]`), dequantized as they are read.
    let scope = Scope::root().storing_matrices(Matrices::All(DType::Q8_0)).at("mlp");
    let moe = SparseMoe::new(&scope, 32, &config(4, 2, 64, true)).unwrap();
    assert_eq!(moe.experts.gate_up[0].weight.ty().dtype, DType::Q8_0);
    assert_eq!(moe.experts.down_proj.weight.dims(), &[4, 32, 64]);
    let err = error_of(&moe, 32);
    assert!(err < 1e-5, "q8_0 experts: {err:.2e}");
}

#[test]
fn top_k_takes_the_largest_first_and_the_first_of_ties() {
    let b = GraphBuilder::new();
    let p = b.input("p", DType::F32, [2, 5]).unwrap();
    let (values, indices) = top_k(&p, 3).unwrap();
    let feed = HostTensor::new([2, 5], vec![0.1f32, 0.4, 0.1, 0.3, 0.1, 0.2, 0.2, 0.0, 0.5, 0.2]).unwrap();
    let out = eval(&b, &Params::new(0), &[&values, &indices], &[("p", feed)]);
    assert_eq!(out[0].as_slice::<f32>().unwrap(), &[0.4, 0.3, 0.1, 0.5, 0.2, 0.2]);
    assert_eq!(out[1].as_slice::<i32>().unwrap(), &[1, 3, 0, 3, 0, 1]);
    assert!(matches!(top_k(&p, 6), Err(NnError::Config(_))));
}

/// Qwen3-30B-A3B's shape (48 layers of 128 experts, 8 per token, 768 wide; no shared expert).
const QWEN3_30B_A3B: &str = r#"{"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960,
  "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
  "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
  "num_hidden_layers": 48, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "use_sliding_window": false, "vocab_size": 151936}"#;

/// Mixtral-8x7B's shape.
const MIXTRAL_8X7B: &str = r#"{"architectures": ["MixtralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768,
  "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "num_local_experts": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 32000}"#;

/// gpt-oss-20b's shape.
const GPT_OSS_20B: &str = r#"{"architectures": ["GptOssForCausalLM"], "attention_bias": true, "eos_token_id": 200002,
  "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "intermediate_size": 2880,
  "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4,
  "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32, "rms_norm_eps": 1e-05,
  "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
  "rope_type": "yarn", "truncate": false}, "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0,
  "tie_word_embeddings": false, "vocab_size": 201088}"#;

#[test]
fn moe_configs_give_their_mixtures_and_parameter_counts() {
    let c = LlamaConfig::from_json(QWEN3_30B_A3B).unwrap();
    assert_eq!((c.architecture, c.qk_norm), (Architecture::Qwen3Moe, QkNorm::PerHead));
    let moe = c.moe.clone().unwrap();
    assert_eq!((moe.experts, moe.top_k, moe.expert_size, moe.normalize), (128, 8, 768, true));
    assert_eq!(moe.sparse_layers, vec![true; 48]);
    // 30.5B parameters, as the model card says.
    let n = Llama::new(&Scope::root(), c).unwrap().num_elements();
    assert!((30.4e9..30.6e9).contains(&(n as f64)), "{n}");

    let c = LlamaConfig::from_json(MIXTRAL_8X7B).unwrap();
    let moe = c.moe.clone().unwrap();
    assert_eq!((moe.experts, moe.top_k, moe.expert_size, moe.normalize), (8, 2, 14336, true));
    let n = Llama::new(&Scope::root(), c).unwrap().num_elements();
    assert!((46.6e9..46.8e9).contains(&(n as f64)), "{n}");

    // OLMoE-1B-7B's shapes (tests/data/configs, for GPU runs): 6.9B parameters.
    let olmoe = std::fs::read_to_string(fixture("../configs/olmoe-1b-7b.json")).unwrap();
    let c = LlamaConfig::from_json(&olmoe).unwrap();
    assert_eq!(
        (c.architecture, c.qk_norm, c.moe.as_ref().map(|m| (m.experts, m.top_k))),
        (Architecture::Olmoe, QkNorm::Whole, Some((64, 8)))
    );
    let n = Llama::new(&Scope::root(), c).unwrap().num_elements();
    assert!((6.8e9..7.0e9).contains(&(n as f64)), "{n}");

    // gpt-oss-20b's shapes: 21B parameters (32 experts, 4 a token; sinks; windows on even layers).
    let c = LlamaConfig::from_json(GPT_OSS_20B).unwrap();
    assert_eq!((c.architecture, c.attention_sinks, c.qkv_bias, c.o_bias), (Architecture::GptOss, true, true, true));
    assert_eq!(
        c.moe.as_ref().map(|m| (m.experts, m.top_k, m.normalize, m.style)),
        Some((32, 4, true, MoeStyle::GptOss { alpha: 1.702, limit: 7.0 }))
    );
    assert_eq!(c.sliding_windows[..3], [Some(128), None, Some(128)]);
    let n = Llama::new(&Scope::root(), c).unwrap().num_elements();
    assert!((20.8e9..21.0e9).contains(&(n as f64)), "{n}");

    // MiniMax-M2's shapes (its released config.json's fields): whole-projection q/k norms,
    // rotary positions on 64 of each head's 128, 256 experts by sigmoid score plus a correction
    // bias, 8 a token; 229B parameters (the model card's 230B).
    let minimax = r#"{"architectures": ["MiniMaxM2ForCausalLM"], "hidden_size": 3072, "intermediate_size": 1536,
      "num_hidden_layers": 62, "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
      "num_local_experts": 256, "num_experts_per_tok": 8, "rotary_dim": 64, "rope_theta": 5000000,
      "vocab_size": 200064, "max_position_embeddings": 196608, "use_qk_norm": true, "qk_norm_type": "per_layer",
      "scoring_func": "sigmoid", "use_routing_bias": true, "rms_norm_eps": 1e-06, "tie_word_embeddings": false}"#;
    let c = LlamaConfig::from_json(minimax).unwrap();
    assert_eq!((c.architecture, c.qk_norm, c.rotary_dim), (Architecture::MiniMaxM2, QkNorm::Whole, 64));
    let moe = c.moe.clone().unwrap();
    assert_eq!((moe.experts, moe.top_k, moe.expert_size, moe.normalize), (256, 8, 1536, true));
    assert_eq!(
        (moe.router, moe.sparse_layers.iter().all(|&s| s)),
        (Router::Sigmoid { groups: 1, top_groups: 1, scale: 1.0 }, true)
    );
    let model = Llama::new(&Scope::root(), c).unwrap();
    let renames = model.checkpoint_renames();
    assert!(renames.contains(&(
        "model.layers.3.block_sparse_moe.e_score_correction_bias".into(),
        "model.layers.3.mlp.gate.e_score_correction_bias".into()
    )));
    let n = model.num_elements();
    assert!((228.0e9..230.5e9).contains(&(n as f64)), "{n}");

    // Qwen2-MoE: the shared expert; `decoder_sparse_step` and `mlp_only_layers` pick the layers.
    let qwen2 = r#"{"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
      "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 100, "max_position_embeddings": 64,
      "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
      "shared_expert_intermediate_size": 48, "decoder_sparse_step": 2, "mlp_only_layers": [3]}"#;
    let c = LlamaConfig::from_json(qwen2).unwrap();
    let moe = c.moe.clone().unwrap();
    let shared = Some(SharedExpert { width: 48, gated: true, bias: false });
    assert_eq!((moe.shared_expert, moe.normalize, c.qkv_bias), (shared, false, true));
    assert_eq!(moe.sparse_layers, [false, true, false, false]);
    let model = Llama::new(&Scope::root(), c).unwrap();
    assert!(matches!(model.layers[0].mlp, FeedForward::Dense(_)));
    let FeedForward::Sparse(sparse) = &model.layers[1].mlp else { panic!("layer 1 is a mixture") };
    assert!(sparse.shared_expert.is_some() && sparse.shared_expert_gate.is_some());
    assert_eq!(sparse.experts.gate_up[0].weight.path(), "model.layers.1.mlp.experts.gate_proj.weight");

    let field = |text: &str| match LlamaConfig::from_json(text) {
        Err(NnError::ConfigField { field, value, .. }) => (field, value),
        other => panic!("{other:?}"),
    };
    // GLM-4.5: dense first layers, DeepSeek-V3's grouped sigmoid router, shared experts.
    let glm = r#"{"architectures": ["Glm4MoeForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
      "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 100, "max_position_embeddings": 64,
      "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "n_shared_experts": 2,
      "first_k_dense_replace": 2, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
      "attention_bias": true, "num_nextn_predict_layers": 1}"#;
    let c = LlamaConfig::from_json(glm).unwrap();
    let moe = c.moe.clone().unwrap();
    assert_eq!(moe.sparse_layers, [false, false, true, true]);
    assert_eq!(moe.router, Router::Sigmoid { groups: 4, top_groups: 2, scale: 2.5 });
    assert_eq!((moe.shared_expert, moe.normalize), (Some(SharedExpert { width: 32, gated: false, bias: false }), true));
    assert_eq!((c.qkv_bias, c.o_bias, c.rotary_dim, c.rotary_interleaved, c.mtp_layers), (true, false, 8, false, 1));
    let model = Llama::new(&Scope::root(), c).unwrap();
    let FeedForward::Sparse(sparse) = &model.layers[2].mlp else { panic!("layer 2 is a mixture") };
    assert_eq!(sparse.correction.as_ref().unwrap().path(), "model.layers.2.mlp.gate.e_score_correction_bias");
    assert!(sparse.shared_expert_gate.is_none());
    let three = glm.replace(r#""topk_group": 2"#, r#""topk_group": 5"#);
    assert_eq!(field(&three).0, "n_group");

    // ERNIE 4.5 MoE: mixtures from the start index to the end (-1: the last layer) every
    // interval-th layer, chosen by probability plus `moe_statics`' correction, shared experts
    // with biases, a biased head.
    let ernie = r#"{"architectures": ["Ernie4_5_MoeForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
      "num_hidden_layers": 6, "num_attention_heads": 4, "vocab_size": 100, "max_position_embeddings": 64,
      "moe_num_experts": 8, "moe_k": 2, "moe_intermediate_size": 16, "moe_num_shared_experts": 2,
      "moe_layer_start_index": 1, "moe_layer_end_index": -1, "moe_layer_interval": 2, "use_bias": true,
      "tie_word_embeddings": false}"#;
    let c = LlamaConfig::from_json(ernie).unwrap();
    let moe = c.moe.clone().unwrap();
    assert_eq!(moe.sparse_layers, [false, true, false, true, false, true]);
    assert_eq!((moe.router, moe.top_k, moe.normalize), (Router::Softmax { corrected: true }, 2, true));
    assert_eq!(moe.shared_expert, Some(SharedExpert { width: 32, gated: false, bias: true }));
    assert!(c.head_bias && c.rotary_interleaved);
    let model = Llama::new(&Scope::root(), c).unwrap();
    let FeedForward::Sparse(sparse) = &model.layers[1].mlp else { panic!("layer 1 is a mixture") };
    assert_eq!(sparse.correction.as_ref().unwrap().dims(), &[1, 8]);
    assert_eq!(
        field(&ernie.replace(r#""moe_layer_interval": 2"#, r#""moe_layer_interval": 0"#)).0,
        "moe_layer_interval"
    );

    let many = MIXTRAL_8X7B.replace(r#""num_experts_per_tok": 2"#, r#""num_experts_per_tok": 9"#);
    assert_eq!(field(&many), ("num_experts_per_tok".into(), "9".into()));
    let olmoe = MIXTRAL_8X7B
        .replace("MixtralForCausalLM", "OlmoeForCausalLM")
        .replace("\"bos_token_id\"", "\"clip_qkv\": 8.0, \"bos_token_id\"");
    assert_eq!(field(&olmoe), ("clip_qkv".into(), "8".into()));
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/checkpoints").join(name)
}

/// A copy of the qwen3-moe-tiny checkpoint's tensors with `edit` applied, written to a
/// temporary file.
fn edited_checkpoint(tag: &str, edit: impl FnOnce(&mut Vec<(String, HostTensor)>)) -> PathBuf {
    let ck = Checkpoint::open(&fixture("qwen3-moe-tiny")).unwrap();
    let mut tensors: Vec<(String, HostTensor)> =
        ck.keys().into_iter().map(|k| (k.clone(), ck.tensor(&k).unwrap())).collect();
    edit(&mut tensors);
    let path = std::env::temp_dir().join(format!("fusegraph-moe-{tag}-{}.safetensors", std::process::id()));
    let mut p = Params::new(0);
    for (k, t) in tensors {
        p.insert(&k, t);
    }
    p.save_safetensors(&path).unwrap();
    path
}

#[test]
fn stacked_experts_load_by_slot_and_a_missing_or_extra_expert_is_named() {
    let dir = fixture("qwen3-moe-tiny");
    let model = Llama::new(
        &Scope::root(),
        LlamaConfig::from_json(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap(),
    )
    .unwrap();
    let map = KeyMap::llama(false);
    let ck = Checkpoint::open(&dir).unwrap();
    let params = ck.load(&model, &map).unwrap();
    // Slot 5 of the stack is expert 5's `[out, in]` tensor, transposed to `[in, out]`.
    let stack = &params["model.layers.1.mlp.experts.up_proj.weight"];
    assert_eq!(stack.shape().dims(), &[8, 64, 32]);
    let part = ck.tensor("model.layers.1.mlp.experts.5.up_proj.weight").unwrap().to_f64();
    let slot = &stack.to_f64()[5 * 64 * 32..6 * 64 * 32];
    assert!((0..32).all(|o| (0..64).all(|i| slot[i * 32 + o] == part[o * 64 + i])));

    // Quantized on load: slot 5 is expert 5's `[out, in]` rows in q8_0 blocks.
    let quantized = fusegraph_nn::Pretrained::load(&dir, None, fusegraph_nn::Quantize::To(DType::Q8_0)).unwrap();
    let stack = &quantized.params["model.layers.1.mlp.experts.up_proj.weight"];
    assert_eq!((stack.dtype(), stack.shape().dims()), (DType::Q8_0, &[8, 32, 64][..]));
    let part: Vec<f32> = part.iter().map(|&v| v as f32).collect();
    let blocks = fusegraph_ir::quant::quantize(DType::Q8_0, &part).unwrap();
    assert_eq!(&stack.to_bytes()[5 * blocks.len()..6 * blocks.len()], &blocks[..]);

    let missing =
        edited_checkpoint("missing", |t| t.retain(|(k, _)| k != "model.layers.1.mlp.experts.5.up_proj.weight"));
    match Checkpoint::open(&missing).unwrap().load(&model, &map) {
        Err(NnError::MissingKey { key, param, .. }) => {
            assert_eq!(key, "model.layers.1.mlp.experts.5.up_proj.weight");
            assert_eq!(param, "model.layers.1.mlp.experts.up_proj.weight");
        }
        other => panic!("{:?}", other.map(|p| p.len())),
    }
    let extra = edited_checkpoint("extra", |t| {
        let copy = t.iter().find(|(k, _)| k == "model.layers.1.mlp.experts.7.up_proj.weight").unwrap().1.clone();
        t.push(("model.layers.1.mlp.experts.8.up_proj.weight".into(), copy));
    });
    match Checkpoint::open(&extra).unwrap().load(&model, &map) {
        Err(NnError::UnknownKey { key, .. }) => {
            assert!(key.starts_with("model.layers.1.mlp.experts.8.up_proj.weight"), "{key}")
        }
        other => panic!("{:?}", other.map(|p| p.len())),
    }
    for path in [missing, extra] {
        std::fs::remove_file(path).unwrap();
    }
}

/// An MXFP4 tensor stored as gpt-oss's checkpoints store it (`{name}_blocks` u8 `[.., n, 16]`,
/// value `2j` the low nibble of byte `j`; `{name}_scales` E8M0 `[.., n]`) reads as llama.cpp's
/// blocks of the same values; blocks and scales that do not agree are an error naming both.
#[test]
fn mxfp4_blocks_and_scales_read_as_one_tensor() {
    use safetensors::tensor::{Dtype, TensorView};
    let write = |tag: &str, blocks: (&[usize], &[u8]), scales: (&[usize], &[u8])| {
        let views = [
            ("w_blocks", TensorView::new(Dtype::U8, blocks.0.to_vec(), blocks.1).unwrap()),
            ("w_scales", TensorView::new(Dtype::U8, scales.0.to_vec(), scales.1).unwrap()),
        ];
        let path = std::env::temp_dir().join(format!("fusegraph-mxfp4-{tag}-{}.safetensors", std::process::id()));
        std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
        path
    };
    // Two rows of one block: nibble `v mod 16` for value `v`, scales 2^(126 − 127) and 2^(128 − 127).
    let nibbles: Vec<u8> =
        (0..2).flat_map(|_| (0..16).map(|j| (((2 * j) % 16) | (((2 * j + 1) % 16) << 4)) as u8)).collect();
    let path = write("good", (&[2, 1, 16], &nibbles), (&[2, 1], &[126, 128]));
    let ck = Checkpoint::open(&path).unwrap();
    assert_eq!(ck.keys(), ["w"]);
    let t = ck.tensor("w").unwrap();
    assert_eq!((t.dtype(), t.shape().dims()), (DType::MXFP4, &[2, 32][..]));
    let levels = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
    let want: Vec<f64> = [0.5, 2.0].iter().flat_map(|s| (0..32).map(move |v| s * levels[v % 16])).collect();
    assert_eq!(t.to_f64(), want);
    let bad = write("bad", (&[2, 1, 16], &nibbles), (&[2, 2], &[126, 128, 1, 1]));
    let err = Checkpoint::open(&bad).unwrap().tensor("w").unwrap_err().to_string();
    assert!(err.contains("w_blocks") && err.contains("w_scales"), "{err}");
    for p in [path, bad] {
        std::fs::remove_file(p).unwrap();
    }
}

/// GLM-4.5's checkpoints hold their multi-token-prediction layer after the decoder's
/// (`num_nextn_predict_layers`): its keys are dropped; a layer past it is still an unknown key.
#[test]
fn multi_token_prediction_layers_are_dropped() {
    let src = fixture("glm4-moe-tiny");
    let ck = Checkpoint::open(&src).unwrap();
    let write = |tag: &str, extra: &str| {
        let dir = std::env::temp_dir().join(format!("fusegraph-mtp-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
        let mut p = Params::new(0);
        for k in ck.keys() {
            p.insert(&k, ck.tensor(&k).unwrap());
        }
        p.insert(extra, HostTensor::new([2], vec![1.0f32, 2.0]).unwrap());
        p.save_safetensors(&dir.join("model.safetensors")).unwrap();
        dir
    };
    let mtp = write("mtp", "model.layers.3.eh_proj.weight");
    let loaded = fusegraph_nn::Pretrained::load(&mtp, None, fusegraph_nn::Quantize::AsStored).unwrap();
    assert!(!loaded.params.keys().any(|k| k.starts_with("model.layers.3.")));
    let past = write("past", "model.layers.4.eh_proj.weight");
    match fusegraph_nn::Pretrained::load(&past, None, fusegraph_nn::Quantize::AsStored) {
        Err(NnError::UnknownKey { key, .. }) => assert_eq!(key, "model.layers.4.eh_proj.weight"),
        other => panic!("{:?}", other.map(|p| p.params.len())),
    }
    for dir in [mtp, past] {
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// gpt-oss's f32 expert stacks are `[experts, in, out]` in its checkpoints: quantized on load
/// they take a block type's `[experts, out, in]`, the values transposed (within Q8_0's rounding).
#[test]
fn in_out_expert_stacks_quantize_on_load_transposed() {
    use fusegraph_nn::{Pretrained, Quantize};
    let dir = fixture("gpt-oss-tiny");
    let f32s = Pretrained::load(&dir, None, Quantize::AsStored).unwrap().params;
    let q8 = Pretrained::load(&dir, None, Quantize::To(DType::Q8_0)).unwrap().params;
    for name in ["model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"] {
        let (a, b) = (&f32s[name], &q8[name]);
        let [e, i, o] = <[usize; 3]>::try_from(a.shape().dims()).unwrap();
        assert_eq!((b.dtype(), b.shape().dims()), (DType::Q8_0, &[e, o, i][..]), "{name}");
        let (av, bv) = (a.to_f64(), b.to_f64());
        let top = av.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (x, y, z) in (0..e).flat_map(|x| (0..i).flat_map(move |y| (0..o).map(move |z| (x, y, z)))) {
            let (want, got) = (av[(x * i + y) * o + z], bv[(x * o + z) * i + y]);
            assert!((want - got).abs() <= 1e-2 * top, "{name}[{x}, {y}, {z}]: {got} for {want}");
        }
    }
}
