//! Llama 4's decoder (`Llama4ForCausalLM`): a tiny `transformers` checkpoint
//! (tests/data/checkpoints, `scripts/fixtures/make_llama.py llama4`) gives `transformers`'
//! prompt logits on the CPU reference and, through a decode step over its cache, the last
//! prompt position's; Llama 4 Scout's published config (a `Llama4ForConditionalGeneration`
//! holding the decoder's as `text_config`) reads as its decoder.

mod common;

use common::{checkpoints, last_step_logits, prefill_logits, reference, relative_error};
use fusegraph_ir::DType;
use fusegraph_nn::llama::{Architecture, MoeStyle, QkNorm, Router};
use fusegraph_nn::{LlamaConfig, Pretrained, Quantize};

/// The prompt (18 tokens: chunks of 5 cut it four times, the query temperature over 4
/// positions changes four times) gives `transformers`' logits; a decode step at its last
/// position over a cache of 64 positions gives the last row.
#[test]
fn llama4_matches_transformers_in_prefill_and_a_decode_step() {
    let loaded = Pretrained::load(&checkpoints().join("llama4-tiny"), None, Quantize::AsStored).unwrap();
    let (prompt, want) = reference(&checkpoints().join("llama4-tiny-reference.json"));
    let err = relative_error(&prefill_logits(&loaded, &prompt), &want);
    assert!(err < 1e-4, "prefill logits {err:.2e} from transformers'");
    let last = (prompt.len() - 1) * loaded.model.vocab_size();
    let err = relative_error(&last_step_logits(&loaded, &prompt, 64, 32), &want[last..]);
    assert!(err < 1e-4, "the decode step's logits {err:.2e} from transformers' last row");
}

/// Quantized on load to Q8_0 (its expert stacks `[experts, hidden, 2 · inner]` re-laid as
/// blocks along `hidden`), the prompt's logits stay within Q8_0's rounding of `transformers`'.
#[test]
fn llama4_quantized_on_load_stays_near_transformers() {
    let loaded = Pretrained::load(&checkpoints().join("llama4-tiny"), None, Quantize::To(DType::Q8_0)).unwrap();
    let stack = &loaded.params["model.layers.1.mlp.experts.gate_up_proj"];
    assert_eq!((stack.dtype(), stack.shape().dims()), (DType::Q8_0, &[4, 64, 64][..]));
    let (prompt, want) = reference(&checkpoints().join("llama4-tiny-reference.json"));
    let err = relative_error(&prefill_logits(&loaded, &prompt), &want);
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
