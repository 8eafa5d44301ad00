//! Llama 4's decoder (`Llama4ForCausalLM`): a tiny `transformers` checkpoint
//! (tests/data/checkpoints, `scripts/fixtures/make_llama.py llama4`) gives `transformers`'
//! prompt logits on the CPU reference and, through a decode step over its cache, the last
//! prompt position's; Llama 4 Scout's published config (a `Llama4ForConditionalGeneration`
//! holding the decoder's as `text_config`) reads as its decoder.

use fusegraph_ir::{DType, GraphBuilder, HostTensor, Tensor};
use fusegraph_nn::llama::{Architecture, MoeStyle, QkNorm, Router};
use fusegraph_nn::{LlamaConfig, Pretrained, Quantize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/checkpoints").join(name)
}

fn eval(b: &GraphBuilder, p: &Pretrained, out: &[Tensor], feeds: &[(&str, HostTensor)]) -> Vec<f64> {
    let feeds: BTreeMap<String, HostTensor> = feeds.iter().map(|(n, t)| (n.to_string(), t.clone())).collect();
    let ids: Vec<_> = out.iter().map(|t| t.id()).collect();
    fusegraph_reference::evaluate(&b.graph(), &ids, &feeds, &p.params).expect("reference evaluation")[0].to_f64()
}

fn relative_error(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    got.iter().zip(want).fold(0.0f64, |m, (a, b)| m.max((a - b).abs())) / scale
}

/// The prompt (18 tokens: chunks of 5 cut it four times, the query temperature over 4
/// positions changes four times) gives `transformers`' logits; a decode step at its last
/// position over a cache of 64 positions gives the last row.
#[test]
fn llama4_matches_transformers_in_prefill_and_a_decode_step() {
    let loaded = Pretrained::load(&fixture("llama4-tiny"), None, Quantize::AsStored).unwrap();
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("llama4-tiny-reference.json")).unwrap()).unwrap();
    let prompt: Vec<i32> = r["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap() as i32).collect();
    let want: Vec<f64> = r["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()))
        .collect();
    let (model, n) = (&loaded.model, prompt.len());
    let b = GraphBuilder::new();
    let x = b.input("ids", DType::I32, [1, n]).unwrap();
    let logits = model.prefill(&x).unwrap().0;
    let got = eval(&b, &loaded, &[logits], &[("ids", HostTensor::new([1, n], prompt.clone()).unwrap())]);
    let err = relative_error(&got, &want);
    assert!(err < 1e-4, "prefill logits {err:.2e} from transformers'");

    let b = GraphBuilder::new();
    let head = b.input("head", DType::I32, [1, n - 1]).unwrap();
    let (_, kvs) = model.prefill(&head).unwrap();
    let max = 64;
    let caches: Vec<_> = kvs
        .iter()
        .map(|(k, v)| {
            let pad = |t: &Tensor| {
                let d = t.dims().to_vec();
                let zeros = b.full(DType::F32, [d[0], d[1], max - (n - 1), d[3]], 0.0).unwrap();
                b.concat(&[t, &zeros], 2).unwrap()
            };
            (pad(k), pad(v))
        })
        .collect();
    let last = b.input("last", DType::I32, [1, 1]).unwrap();
    let pos = b.input("pos", DType::I32, [1]).unwrap();
    let (step, _) = model.decode(&last, &pos, &caches, 32).unwrap();
    let feeds = [
        ("head", HostTensor::new([1, n - 1], prompt[..n - 1].to_vec()).unwrap()),
        ("last", HostTensor::new([1, 1], vec![prompt[n - 1]]).unwrap()),
        ("pos", HostTensor::new([1], vec![(n - 1) as i32]).unwrap()),
    ];
    let got = eval(&b, &loaded, &[step], &feeds);
    let vocab = model.vocab_size();
    let err = relative_error(&got, &want[(n - 1) * vocab..]);
    assert!(err < 1e-4, "the decode step's logits {err:.2e} from transformers' last row");
}

/// Quantized on load to Q8_0 (its expert stacks `[experts, hidden, 2 · inner]` re-laid as
/// blocks along `hidden`), the prompt's logits stay within Q8_0's rounding of `transformers`'.
#[test]
fn llama4_quantized_on_load_stays_near_transformers() {
    let loaded = Pretrained::load(&fixture("llama4-tiny"), None, Quantize::To(DType::Q8_0)).unwrap();
    let stack = &loaded.params["model.layers.1.mlp.experts.gate_up_proj"];
    assert_eq!((stack.dtype(), stack.shape().dims()), (DType::Q8_0, &[4, 64, 64][..]));
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("llama4-tiny-reference.json")).unwrap()).unwrap();
    let prompt: Vec<i32> = r["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap() as i32).collect();
    let want: Vec<f64> = r["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()))
        .collect();
    let b = GraphBuilder::new();
    let x = b.input("ids", DType::I32, [1, prompt.len()]).unwrap();
    let logits = loaded.model.prefill(&x).unwrap().0;
    let got = eval(&b, &loaded, &[logits], &[("ids", HostTensor::new([1, prompt.len()], prompt.clone()).unwrap())]);
    let err = relative_error(&got, &want);
    assert!(err > 1e-6 && err < 3e-2, "in Q8_0: logits {err:.2e} from transformers'");
}

/// Llama 4 Scout's config.json (`Llama4ForConditionalGeneration`, the decoder's fields as
/// `text_config`, `attn_temperature_tuning` written as a number): every fourth layer without
/// rotary positions and with the query temperature, chunks of 8,192 on the others, 16 experts
/// one a token on every layer; 107.8B parameters in its decoder (the model card's 109B with
/// the vision encoder).
#[test]
fn llama4_scout_config_reads_as_its_decoder() {
    let scout = serde_json::json!({
        "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
        "text_config": {
            "attention_bias": false, "attention_chunk_size": 8192, "attn_scale": 0.1,
            "attn_temperature_tuning": 4, "bos_token_id": 200000, "eos_token_id": [200001, 200007, 200008],
            "floor_scale": 8192, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
            "interleave_moe_layer_step": 1, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
            "max_position_embeddings": 10485760, "model_type": "llama4_text", "num_attention_heads": 40,
            "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8, "num_local_experts": 16,
            "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "use_qk_norm": true, "vocab_size": 202048,
            "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"}
        },
        "vision_config": {"hidden_size": 1408}
    });
    let c = LlamaConfig::from_json(&scout.to_string()).unwrap();
    assert_eq!((c.architecture, c.qk_norm, c.rotary_interleaved), (Architecture::Llama4, QkNorm::AfterRotation, true));
    assert_eq!(c.rope_layers[..4], [true, true, true, false]);
    assert_eq!(c.attention_chunks[..4], [Some(8192), Some(8192), Some(8192), None]);
    let t = c.query_temperature.clone().unwrap();
    assert_eq!((t.beta, t.length, t.shift, &t.layers[..4]), (0.1, 8192, 1, &[false, false, false, true][..]));
    let moe = c.moe.clone().unwrap();
    assert_eq!(
        (moe.experts, moe.top_k, moe.expert_size, moe.router, moe.style),
        (16, 1, 8192, Router::TopLogits, MoeStyle::Llama4)
    );
    assert!(moe.sparse_layers.iter().all(|&s| s) && c.intermediate_size == 16384);
    assert_eq!(c.eos_token_ids, [200001, 200007, 200008]);
    let count = fusegraph_nn::Module::num_elements(&fusegraph_nn::Llama::new(&fusegraph_nn::Scope::root(), c).unwrap());
    assert!((107_000_000_000..108_500_000_000).contains(&count), "{count}");
}
