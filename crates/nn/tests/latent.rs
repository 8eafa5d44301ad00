//! Multi-head latent attention (DeepSeek-V2 and V3, GLM-4.7-Flash): tiny `transformers`
//! checkpoints (tests/data/checkpoints, `scripts/fixtures/make_llama.py
//! deepseek-v3|deepseek-v2|glm4-moe-lite`) give
//! `transformers`' prompt logits on the CPU reference, and a decode step over the compressed
//! cache gives the last prompt position's logits; the configs of the released models.

mod common;

use common::{checkpoints, last_step_logits, prefill_logits, reference, relative_error};
use fusegraph_ir::DType;
use fusegraph_nn::llama::{Architecture, Router};
use fusegraph_nn::{CacheShape, LlamaConfig, Pretrained, Quantize};
use serde_json::Value;
use std::path::Path;

/// The prompt's logits `transformers` gives, from a prefill; then the prompt again as a
/// prefill of all but its last token and one decode step of the last over the compressed
/// cache (a cache of 64 positions, 32 live), whose logits are the prefill's last row.
#[test]
fn deepseek_checkpoints_match_transformers_prefill_and_decode() {
    for (name, layers) in [("deepseek-v3-tiny", 3), ("deepseek-v2-tiny", 3), ("glm4-moe-lite-tiny", 4)] {
        let loaded = Pretrained::load(&checkpoints().join(name), None, Quantize::AsStored).unwrap();
        let (prompt, want) = reference(&checkpoints().join(format!("{name}-reference.json")));
        let err = relative_error(&prefill_logits(&loaded, &prompt), &want);
        assert!(err < 1e-4, "{name}: prefill logits {err:.2e} from transformers'");
        // One latent head per layer: the latent's width, then the rotary key's.
        let shape = loaded.model.cache_shape();
        assert_eq!(shape, CacheShape { layers, heads: 1, key_width: 32, value_width: 8 }, "{name}");
        let last = (prompt.len() - 1) * loaded.model.vocab_size();
        let err = relative_error(&last_step_logits(&loaded, &prompt, 64, 32), &want[last..]);
        assert!(err < 1e-4, "{name}: the decode step's logits {err:.2e} from transformers' last row");
    }
}

/// Quantized on load to Q8_0 — the latent's up-projection `kv_b_proj` included, read as
/// blocks and split per head — the prompt's logits stay within Q8_0's rounding of
/// `transformers`' (2.3e-2, as the dense fixtures'). deepseek-v2-tiny: in deepseek-v3-tiny the
/// rounding moves one token's expert choice (one row 0.71 off, the others within 5e-2).
#[test]
fn deepseek_quantized_on_load_stays_near_transformers() {
    let name = "deepseek-v2-tiny";
    let loaded = Pretrained::load(&checkpoints().join(name), None, Quantize::To(DType::Q8_0)).unwrap();
    let kv_b = &loaded.params["model.layers.0.self_attn.kv_b_proj.weight"];
    assert_eq!(kv_b.dtype(), DType::Q8_0);
    let (prompt, want) = reference(&checkpoints().join(format!("{name}-reference.json")));
    let err = relative_error(&prefill_logits(&loaded, &prompt), &want);
    assert!(err > 1e-6 && err < 3e-2, "{name} in Q8_0: logits {err:.2e} from transformers'");
}

/// `deepseek2` GGUF files as llama.cpp's converter writes them (`attn_kv_b` split into
/// `attn_k_b`, each head's key part transposed, and `attn_v_b`; one key/value head; Q8_0):
/// the model they describe (V3's sigmoid router by its gating function, V2's softmax) gives
/// `transformers`' logits on the file's values; the latent up-projection is put back
/// together from its halves (f32), the expert stacks keep their blocks. The V2 file has
/// DeepSeek-V2-Lite's one `q_proj` and 27 layers (llama.cpp reads `q_proj` only then).
#[test]
fn deepseek2_gguf_files_give_transformers_logits() {
    for (file, arch) in
        [("deepseek-v3-tiny-q8_0", Architecture::DeepseekV3), ("deepseek-v2-tiny-q8_0", Architecture::DeepseekV2)]
    {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/gguf");
        let loaded = Pretrained::load(&dir.join(format!("{file}.gguf")), None, Quantize::AsStored).unwrap();
        assert!(loaded.model.name().starts_with(arch.class_name()), "{}", loaded.model.name());
        let kv_b = &loaded.params["model.layers.0.self_attn.kv_b_proj.weight"];
        assert_eq!((kv_b.dtype(), kv_b.shape().dims()), (DType::F32, &[32, 4 * (16 + 20)][..]));
        let stacks: Vec<_> = loaded.params.iter().filter(|(p, _)| p.contains(".experts.")).collect();
        assert!(stacks.len() == 6 && stacks.iter().all(|(_, t)| t.dtype() == DType::Q8_0), "{file}");
        let (prompt, want) = reference(&dir.join(format!("{file}-reference.json")));
        let err = relative_error(&prefill_logits(&loaded, &prompt), &want);
        assert!(err < 1e-4, "{file}: logits {err:.2e} from transformers' on the file's values");
    }
}

/// DeepSeek-V3's, DeepSeek-V2-Lite's and GLM-4.7-Flash's published config.json shapes: latent
/// widths, rotary part, the scores' YaRN scale, routers, dense layers and parameter counts (671B,
/// 15.7B and 30B as their model cards give them, with V3's multi-token-prediction layer left out).
#[test]
fn deepseek_configs_read_their_latent_attention_and_routers() {
    let v3 = serde_json::json!({
        "architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 129280, "hidden_size": 7168,
        "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
        "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
        "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc",
        "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
        "norm_topk_prob": true, "scoring_func": "sigmoid", "max_position_embeddings": 163840,
        "rms_norm_eps": 1e-6, "rope_theta": 10000, "num_nextn_predict_layers": 1,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1
    });
    let c = LlamaConfig::from_json(&v3.to_string()).unwrap();
    assert_eq!(c.architecture, Architecture::DeepseekV3);
    let l = c.latent.unwrap();
    assert_eq!((l.q_lora_rank, l.kv_lora_rank, l.qk_head_dim(), l.v_head_dim), (Some(1536), 512, 192, 128));
    assert_eq!((c.head_dim, c.rotary_dim, c.rotary_interleaved, c.mtp_layers), (64, 64, true, 1));
    // 192^-½ · (0.1 ln 40 + 1)²
    let want = (0.1f64 * 40f64.ln() + 1.0).powi(2) / 192f64.sqrt();
    assert!((c.attention_scale - want).abs() < 1e-12, "{} against {want}", c.attention_scale);
    let moe = c.moe.clone().unwrap();
    assert_eq!(moe.router, Router::Sigmoid { groups: 8, top_groups: 4, scale: 2.5 });
    assert_eq!(moe.sparse_layers.iter().filter(|&&s| !s).count(), 3);
    assert!(moe.normalize);
    let model = fusegraph_nn::Llama::new(&fusegraph_nn::Scope::root(), c).unwrap();
    let count = fusegraph_nn::Module::num_elements(&model);
    assert!((671_000_000_000..672_000_000_000).contains(&count), "{count}");
    let shape = fusegraph_nn::CausalLm::cache_shape(&model);
    assert_eq!((shape.heads, shape.key_width + shape.value_width), (1, 576));

    // tests/data/configs/deepseek-v2-lite.json (the `mla` phase of scripts/gpu.sh).
    let path = checkpoints().join("../configs/deepseek-v2-lite.json");
    let lite: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let c = LlamaConfig::from_json(&lite.to_string()).unwrap();
    assert_eq!(c.latent.unwrap().q_lora_rank, None);
    assert_eq!(c.moe.as_ref().unwrap().router, Router::SoftmaxGroups { groups: 1, top_groups: 1, scale: 1.0 });
    let model = fusegraph_nn::Llama::new(&fusegraph_nn::Scope::root(), c).unwrap();
    let count = fusegraph_nn::Module::num_elements(&model);
    assert!((15_600_000_000..15_800_000_000).contains(&count), "{count}");

    // GLM-4.7-Flash's shapes (`transformers`' defaults for its class are its released config):
    // latent attention of 20 heads, values 256 wide, 64 experts 4 a token; 29.9B parameters.
    let flash = serde_json::json!({
        "architectures": ["Glm4MoeLiteForCausalLM"], "vocab_size": 154880, "hidden_size": 2048,
        "intermediate_size": 10240, "moe_intermediate_size": 1536, "num_hidden_layers": 47,
        "num_attention_heads": 20, "num_key_value_heads": 20, "max_position_embeddings": 202752,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": false
    });
    let c = LlamaConfig::from_json(&flash.to_string()).unwrap();
    let l = c.latent.unwrap();
    assert_eq!((l.q_lora_rank, l.kv_lora_rank, l.qk_head_dim(), l.v_head_dim), (Some(768), 512, 256, 128 * 2));
    let moe = c.moe.clone().unwrap();
    assert_eq!((moe.experts, moe.top_k, moe.router), (64, 4, Router::Sigmoid { groups: 1, top_groups: 1, scale: 1.8 }));
    assert_eq!(moe.sparse_layers.iter().filter(|&&s| !s).count(), 1);
    let count = fusegraph_nn::Module::num_elements(&fusegraph_nn::Llama::new(&fusegraph_nn::Scope::root(), c).unwrap());
    assert!((29_500_000_000..30_500_000_000).contains(&count), "{count}");
    let mut odd = flash.clone();
    odd["mlp_layer_types"] = serde_json::json!(["dense", "moe"]);
    let err = LlamaConfig::from_json(&odd.to_string()).unwrap_err().to_string();
    assert!(err.contains("mlp_layer_types"), "{err}");

    let mut bad = lite.clone();
    bad["topk_method"] = "random".into();
    let err = LlamaConfig::from_json(&bad.to_string()).unwrap_err().to_string();
    assert!(err.contains("topk_method") && err.contains("random"), "{err}");
    let mut bad = lite;
    bad["qk_rope_head_dim"] = 63.into();
    let err = LlamaConfig::from_json(&bad.to_string()).unwrap_err().to_string();
    assert!(err.contains("qk_rope_head_dim") && err.contains("63"), "{err}");
}
