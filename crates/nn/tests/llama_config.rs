//! Llama-family `config.json`s in both forms `transformers` writes: 4.x (`rope_theta` and
//! `rope_scaling` at the top level, most checkpoints people hold) and 5.x (`rope_parameters`),
//! the rotary frequencies `transformers` computes from them, the per-layer windows, and the
//! typed errors for what is not supported.

use fusegraph_ir::DType;
use fusegraph_nn::llama::{Architecture, Norms, QkNorm, RopeScaling};
use fusegraph_nn::{CausalLm, LlamaConfig, Module, NnError, Pretrained, Quantize};

/// Llama-3.2-1B's `config.json` as published (transformers 4.45).
const LLAMA_3_2_1B: &str = include_str!("../../../tests/data/configs/llama-3.2-1b.json");

#[test]
fn a_transformers_4_config_gives_the_model_and_transformers_rotary_frequencies() {
    let c = LlamaConfig::from_json(LLAMA_3_2_1B).unwrap();
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!((c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim), (2048, 32, 8, 64));
    assert!(c.tie_word_embeddings && !c.qkv_bias && !c.mlp_bias);
    assert_eq!(c.eos_token_ids, vec![128001]);
    assert_eq!(c.rope_theta, 500000.0);
    assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { factor: 32.0, .. }));
    assert_eq!(c.sliding_windows, vec![None; 16]);
    // transformers 5.24's ROPE_INIT_FUNCTIONS["llama3"] on this config: indices 0, 1 (high
    // frequencies, kept), 10, 16 (the band between, interpolated), 20, 24, 31 (low, ÷ 32).
    let want = [
        (0, 1.0),
        (1, 0.663601279258728),
        (10, 0.016560440883040428),
        (16, 0.000429556705057621),
        (20, 8.570255886297673e-06),
        (24, 1.6619674170215148e-06),
        (31, 9.418306490260875e-08),
    ];
    let f = c.inv_freq();
    assert_eq!(f.len(), 32);
    for (i, v) in want {
        assert!((f[i] - v).abs() <= 1e-6 * v, "inv_freq[{i}] = {} (transformers {v})", f[i]);
    }
    // `linear` scaling divides every frequency (transformers: 0.25, 0.1659…, 7.53e-7).
    let mut linear: serde_json::Value = serde_json::from_str(LLAMA_3_2_1B).unwrap();
    linear["rope_scaling"] = serde_json::json!({"type": "linear", "factor": 4.0});
    let f = LlamaConfig::from_json(&linear.to_string()).unwrap().inv_freq();
    for (i, v) in [(0, 0.25), (1, 0.165900319814682), (31, 7.5346451922087e-07)] {
        assert!((f[i] - v).abs() <= 1e-6 * v, "linear inv_freq[{i}] = {} (transformers {v})", f[i]);
    }
    // The model's shapes: 1.24 B parameters, the head tied (no lm_head), bf16 by its config.
    let model = fusegraph_nn::Llama::new(&fusegraph_nn::Scope::root(), c).unwrap();
    assert_eq!(model.num_elements(), 1_235_814_400);
    assert!(model.lm_head.is_none());
    assert_eq!(model.cache_shape(), fusegraph_nn::CacheShape::uniform(16, 8, 64));
}

#[test]
fn a_transformers_5_config_reads_rope_parameters() {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/checkpoints/llama-tiny/config.json"),
    )
    .unwrap();
    assert!(text.contains("rope_parameters") && !text.contains("rope_scaling"));
    let c = LlamaConfig::from_json(&text).unwrap();
    assert_eq!(c.rope_theta, 500000.0);
    assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { original_max_position_embeddings: 64.0, .. }));
    assert_eq!((c.num_attention_heads, c.num_key_value_heads, c.head_dim), (4, 2, 16));
}

#[test]
fn windows_biases_and_heads_follow_the_architecture() {
    let qwen = r#"{"architectures": ["Qwen2ForCausalLM"], "vocab_size": 100, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64, "rope_theta": 1000000.0,
        "sliding_window": 16, "use_sliding_window": true, "max_window_layers": 2,
        "tie_word_embeddings": true, "eos_token_id": [5, 7]}"#;
    let c = LlamaConfig::from_json(qwen).unwrap();
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert!(c.qkv_bias && !c.o_bias);
    assert_eq!(c.sliding_windows, vec![None, None, Some(16), Some(16)]);
    assert_eq!(c.eos_token_ids, vec![5, 7]);
    assert_eq!(c.head_dim, 8);
    // Without use_sliding_window, Qwen2 attends fully; `layer_types` overrides both.
    let off = qwen.replace("\"use_sliding_window\": true", "\"use_sliding_window\": false");
    assert_eq!(LlamaConfig::from_json(&off).unwrap().sliding_windows, vec![None; 4]);
    let typed = qwen.replace(
        "\"max_window_layers\": 2",
        r#""layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]"#,
    );
    assert_eq!(LlamaConfig::from_json(&typed).unwrap().sliding_windows, vec![Some(16), None, Some(16), None]);
    let mistral = qwen.replace("Qwen2ForCausalLM", "MistralForCausalLM");
    let c = LlamaConfig::from_json(&mistral).unwrap();
    assert_eq!(c.sliding_windows, vec![Some(16); 4]);
    assert!(!c.qkv_bias);
    // Llama's attention_bias puts biases on all four projections.
    let biased = LLAMA_3_2_1B.replace("\"attention_bias\": false", "\"attention_bias\": true");
    let c = LlamaConfig::from_json(&biased).unwrap();
    assert!(c.qkv_bias && c.o_bias);
}

#[test]
fn unsupported_fields_are_typed_errors_naming_field_and_value() {
    let cases = [
        (LLAMA_3_2_1B.replace("LlamaForCausalLM", "GemmaForCausalLM"), "architectures", "GemmaForCausalLM"),
        (LLAMA_3_2_1B.replace("\"silu\"", "\"gelu\""), "hidden_act", "gelu"),
        (LLAMA_3_2_1B.replace("\"llama3\"", "\"dynamic\""), "rope_scaling.rope_type", "dynamic"),
        (LLAMA_3_2_1B.replace("\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5"), "num_key_value_heads", "5"),
        (LLAMA_3_2_1B.replace("\"factor\": 32.0", "\"factor\": -1"), "rope_scaling.factor", "-1"),
        (LLAMA_3_2_1B.replace("\"head_dim\": 64", "\"head_dim\": 63"), "head_dim", "63"),
    ];
    for (text, field, value) in cases {
        match LlamaConfig::from_json(&text) {
            Err(NnError::ConfigField { field: f, value: v, .. }) => {
                assert_eq!((f.as_str(), v.as_str()), (field, value));
            }
            other => panic!("{field}: {:?}", other.map(|c| c.architecture)),
        }
    }
    let e = LlamaConfig::from_json(&LLAMA_3_2_1B.replace("\"bfloat16\"", "\"float8\""));
    assert!(e.is_ok(), "the config itself does not care");
    let float8 = LLAMA_3_2_1B.replace("\"bfloat16\"", "\"float8\"");
    let e = Pretrained::random(&float8, None, Quantize::AsStored, 0).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("dtype") && e.to_string().contains("float8"), "{e}");
    // Block types hold matrices only, through `Quantize`; `Quantize` takes block types only.
    for (dtype, quantize, field) in
        [(Some(DType::Q4_0), Quantize::AsStored, "dtype"), (None, Quantize::To(DType::F16), "quantize")]
    {
        match Pretrained::random(LLAMA_3_2_1B, dtype, quantize, 0).map(|_| ()) {
            Err(NnError::ConfigField { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{dtype:?} {quantize:?}: {other:?}"),
        }
    }
}

/// Gemma 3 1B's shapes in `transformers` 4's form: no `layer_types` (every
/// `sliding_window_pattern`-th layer global), the local layers' base as
/// `rope_local_base_freq`. Its differences land in the config's fields; Gemma 2's
/// soft-capping and bidirectional attention are typed errors.
#[test]
fn a_gemma3_config_gives_its_layers_norms_and_scales() {
    let gemma = r#"{
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "attention_bias": false, "attn_logit_softcapping": null, "final_logit_softcapping": null,
        "bos_token_id": 2, "eos_token_id": [1, 106], "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "intermediate_size": 6912,
        "max_position_embeddings": 32768, "num_attention_heads": 4, "num_hidden_layers": 26,
        "num_key_value_heads": 1, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
        "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
        "vocab_size": 262144
    }"#;
    let c = LlamaConfig::from_json(gemma).unwrap();
    assert_eq!(c.architecture, Architecture::Gemma3);
    let global: Vec<usize> = (0..26).filter(|&i| c.sliding_windows[i].is_none()).collect();
    assert_eq!(global, vec![5, 11, 17, 23]);
    assert!(c.sliding_windows.iter().flatten().all(|&w| w == 512));
    assert_eq!((c.rope_theta, c.sliding_rope.clone()), (1e6, Some((1e4, RopeScaling::Default))));
    assert_eq!(c.sliding_inv_freq().unwrap()[1], (1.0 / 10000f32.powf(2.0 / 256.0)) as f64);
    assert_eq!((c.attention_scale, c.embed_scale, c.norm_offset), (1.0 / 16.0, Some(1152f64.sqrt()), 1.0));
    assert!(c.qk_norm == QkNorm::PerHead && c.norms == Norms::Sandwich && c.tie_word_embeddings && !c.qkv_bias);
    assert_eq!(c.hidden_act, fusegraph_nn::llama::Activation::GeluTanh);
    assert_eq!((c.eos_token_ids.clone(), c.bos_token_id), (vec![1, 106], Some(2)));
    // A logit cap applies (Gemma 3 as Gemma 2); a score cap is refused below.
    let capped = LlamaConfig::from_json(
        &gemma.replace("\"final_logit_softcapping\": null", "\"final_logit_softcapping\": 30.0"),
    );
    assert_eq!((capped.unwrap().final_softcap, c.final_softcap, c.attn_softcap), (Some(30.0), None, None));
    // Four norms a layer and the q and k norms, a head wide.
    let norms = layer0_norms(c);
    assert_eq!(norms.len(), 6, "{norms:?}");
    assert_eq!(norms.iter().filter(|(_, d)| *d == [256]).count(), 2, "{norms:?}");
    for (from, to, field) in [
        ("\"attn_logit_softcapping\": null", "\"attn_logit_softcapping\": 50.0", "attn_logit_softcapping"),
        ("\"gelu_pytorch_tanh\"", "\"gelu\"", "hidden_act"),
        ("\"rope_theta\"", "\"use_bidirectional_attention\": true, \"rope_theta\"", "use_bidirectional_attention"),
    ] {
        match LlamaConfig::from_json(&gemma.replace(from, to)) {
            Err(NnError::ConfigField { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {:?}", other.map(|c| c.architecture)),
        }
    }
}

/// Phi-3-mini-4k's shapes in `transformers` 4's form: fused projections, a window on every
/// layer, all of each head rotated; with `partial_rotary_factor` a part of it.
#[test]
fn a_phi3_config_gives_fused_projections_and_its_rotary_part() {
    let phi3 = r#"{
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_act": "silu",
        "hidden_size": 3072, "intermediate_size": 8192, "max_position_embeddings": 4096,
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
        "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
        "sliding_window": 2047, "tie_word_embeddings": false, "vocab_size": 32064,
        "bos_token_id": 1, "eos_token_id": 32000
    }"#;
    let c = LlamaConfig::from_json(phi3).unwrap();
    assert_eq!(c.architecture, Architecture::Phi3);
    assert!(c.fused_qkv && c.fused_gate_up && !c.qkv_bias);
    assert_eq!((c.head_dim, c.rotary_dim), (96, 96));
    assert_eq!(c.sliding_windows, vec![Some(2047); 32]);
    let model = fusegraph_nn::Llama::new(&fusegraph_nn::Scope::root(), c).unwrap();
    let layer0: Vec<(String, Vec<usize>)> = model
        .params()
        .iter()
        .filter(|p| p.path().starts_with("model.layers.0.") && p.path().ends_with("proj.weight"))
        .map(|p| (p.path().to_string(), p.ty().shape.dims().to_vec()))
        .collect();
    let names: Vec<&str> = layer0.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "model.layers.0.self_attn.qkv_proj.weight",
            "model.layers.0.self_attn.o_proj.weight",
            "model.layers.0.mlp.gate_up_proj.weight",
            "model.layers.0.mlp.down_proj.weight"
        ]
    );
    assert_eq!((layer0[0].1.clone(), layer0[2].1.clone()), (vec![3072, 3 * 3072], vec![3072, 2 * 8192]));
    let partial =
        LlamaConfig::from_json(&phi3.replace("\"rope_theta\"", "\"partial_rotary_factor\": 0.75, \"rope_theta\""));
    let partial = partial.unwrap();
    assert_eq!((partial.rotary_dim, partial.inv_freq().len()), (72, 36));
    for (from, to, field, value) in [
        (
            "\"rope_scaling\": null",
            r#""rope_scaling": {"type": "dynamic", "factor": 2.0}"#,
            "rope_scaling.rope_type",
            "dynamic",
        ),
        ("\"rope_theta\"", "\"partial_rotary_factor\": 0.7, \"rope_theta\"", "partial_rotary_factor", "0.7"),
    ] {
        match LlamaConfig::from_json(&phi3.replace(from, to)) {
            Err(NnError::ConfigField { field: f, value: v, .. }) => {
                assert_eq!((f.as_str(), v.as_str()), (field, value))
            }
            other => panic!("{field}: {:?}", other.map(|c| c.architecture)),
        }
    }
}

/// Gemma 2 2B's shapes in `transformers` 4's form (no `layer_types`: the even layers slide):
/// its caps, and Gemma 3's layers without the q and k norms.
#[test]
fn a_gemma2_config_gives_alternating_windows_and_soft_caps() {
    let gemma2 = r#"{
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "intermediate_size": 9216,
        "max_position_embeddings": 8192, "num_attention_heads": 8, "num_hidden_layers": 26,
        "num_key_value_heads": 4, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0, "sliding_window": 4096, "vocab_size": 256000,
        "bos_token_id": 2, "eos_token_id": 1
    }"#;
    let c = LlamaConfig::from_json(gemma2).unwrap();
    assert_eq!(c.architecture, Architecture::Gemma2);
    let sliding: Vec<bool> = c.sliding_windows.iter().map(Option::is_some).collect();
    assert_eq!(sliding, (0..26).map(|i| i % 2 == 0).collect::<Vec<_>>());
    assert_eq!((c.attn_softcap, c.final_softcap), (Some(50.0), Some(30.0)));
    assert!(
        c.qk_norm == QkNorm::None && c.norms == Norms::Sandwich && c.tie_word_embeddings && c.sliding_rope.is_none()
    );
    assert_eq!((c.norm_offset, c.embed_scale, c.attention_scale), (1.0, Some(2304f64.sqrt()), 1.0 / 16.0));
    // The caps default to Gemma 2's; a cap that is not positive is refused.
    let default = LlamaConfig::from_json(&gemma2.replace("\"attn_logit_softcapping\": 50.0, ", "")).unwrap();
    assert_eq!(default.attn_softcap, Some(50.0));
    match LlamaConfig::from_json(&gemma2.replace("50.0", "-1.0")) {
        Err(NnError::ConfigField { field, .. }) => assert_eq!(field, "attn_logit_softcapping"),
        other => panic!("{:?}", other.map(|c| c.attn_softcap)),
    }
}

/// Phi-3.5-mini's shapes in `transformers` 4's form: `longrope` scaling, a divisor per
/// frequency within the trained 4,096 positions and another beyond, computed in f32 as
/// `transformers` does, and the attention factor from the context lengths' ratio; factor
/// lists of the wrong length are typed errors naming the list.
#[test]
fn a_phi3_5_config_gives_longrope_frequencies_and_attention_factor() {
    let factors = |first: f64, n: usize| (0..n).map(|i| (first + i as f64 * 0.5).to_string()).collect::<Vec<_>>();
    let phi35 = |long: usize| {
        format!(
            r#"{{
            "architectures": ["Phi3ForCausalLM"], "hidden_act": "silu", "hidden_size": 3072,
            "intermediate_size": 8192, "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096, "num_attention_heads": 32,
            "num_hidden_layers": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-05,
            "rope_scaling": {{"type": "longrope", "short_factor": [{}], "long_factor": [{}]}},
            "rope_theta": 10000.0, "sliding_window": 262144, "vocab_size": 32064
        }}"#,
            factors(1.0, 48).join(", "),
            factors(2.0, long).join(", ")
        )
    };
    let c = LlamaConfig::from_json(&phi35(48)).unwrap();
    let want = (1.0 + 32f64.ln() / 4096f64.ln()).sqrt();
    assert!((c.rope_attention_factor() - want).abs() < 1e-12, "{}", c.rope_attention_factor());
    let freq = |factor: f64, i: usize| (1.0 / (factor as f32 * 10000f32.powf((2 * i) as f32 / 96.0))) as f64;
    let short = c.inv_freq();
    let (long, original) = c.long_inv_freq().expect("longrope's long frequencies");
    assert_eq!((short.len(), long.len(), original), (48, 48, 4096));
    for i in [0, 3, 47] {
        assert_eq!((short[i], long[i]), (freq(1.0 + i as f64 * 0.5, i), freq(2.0 + i as f64 * 0.5, i)));
    }
    match LlamaConfig::from_json(&phi35(47)) {
        Err(NnError::ConfigField { field, value, .. }) => {
            assert_eq!((field.as_str(), value.as_str()), ("rope_scaling.long_factor", "47 factors"))
        }
        other => panic!("{:?}", other.map(|c| c.architecture)),
    }
}

/// SmolLM3-3B's, Granite 3.3 8B's and OLMo 2 7B's shapes: SmolLM3 without rotary positions
/// on every fourth layer (no `no_rope_layers` in the file), Granite's multipliers in its
/// fields (a non-positive one a typed error), OLMo 2's norms after each branch only and its q
/// and k norms over the whole projections.
#[test]
fn smollm3_granite_and_olmo2_configs_give_their_layers() {
    let common = r#""hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
        "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 65536,
        "rms_norm_eps": 1e-06, "rope_theta": 5000000.0, "vocab_size": 128256"#;
    let smol = format!(r#"{{"architectures": ["SmolLM3ForCausalLM"], {common}, "tie_word_embeddings": true}}"#);
    let c = LlamaConfig::from_json(&smol).unwrap();
    assert_eq!(c.architecture, Architecture::SmolLM3);
    let nope: Vec<usize> = (0..36).filter(|&i| !c.rope_layers[i]).collect();
    assert_eq!(nope, (0..9).map(|i| 4 * i + 3).collect::<Vec<_>>());
    assert_eq!(c.sliding_windows, vec![None; 36]);
    let listed = smol.replace("\"tie_word_embeddings\"", "\"no_rope_layers\": [1, 0], \"tie_word_embeddings\"");
    match LlamaConfig::from_json(&listed) {
        Err(NnError::ConfigField { field, value, .. }) => {
            assert_eq!((field.as_str(), value.as_str()), ("no_rope_layers", "2 entries"))
        }
        other => panic!("{:?}", other.map(|c| c.architecture)),
    }

    let granite = r#"{"architectures": ["GraniteForCausalLM"], "hidden_size": 4096, "intermediate_size": 12800,
        "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 10000000.0,
        "vocab_size": 49159, "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
        "attention_multiplier": 0.0078125, "logits_scaling": 16.0, "tie_word_embeddings": true}"#;
    let c = LlamaConfig::from_json(granite).unwrap();
    assert_eq!(
        (c.embed_scale, c.residual_scale, c.attention_scale, c.logits_scaling),
        (Some(12.0), 0.22, 0.0078125, 16.0)
    );
    assert!(c.rope_layers.iter().all(|&r| r) && c.norms == Norms::Pre);
    match LlamaConfig::from_json(&granite.replace("\"logits_scaling\": 16.0", "\"logits_scaling\": 0")) {
        Err(NnError::ConfigField { field, .. }) => assert_eq!(field, "logits_scaling"),
        other => panic!("{:?}", other.map(|c| c.architecture)),
    }

    let olmo2 = r#"{"architectures": ["Olmo2ForCausalLM"], "hidden_size": 4096, "intermediate_size": 11008,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-06, "rope_theta": 500000,
        "vocab_size": 100352, "tie_word_embeddings": false}"#;
    let c = LlamaConfig::from_json(olmo2).unwrap();
    assert_eq!((c.norms, c.qk_norm, c.attention_scale), (Norms::Post, QkNorm::Whole, 1.0 / 128f64.sqrt()));
    let norms = layer0_norms(c);
    let want = [
        ("model.layers.0.self_attn.q_norm.weight", 4096),
        ("model.layers.0.self_attn.k_norm.weight", 4096),
        ("model.layers.0.post_attention_layernorm.weight", 4096),
        ("model.layers.0.post_feedforward_layernorm.weight", 4096),
    ];
    assert_eq!(norms, want.map(|(n, w)| (n.to_string(), vec![w])).to_vec());
}

/// Qwen2.5-7B-Instruct's YaRN block (factor 4 over 32,768 trained positions): frequencies
/// above the band kept, below it divided by the factor, the cos and sin scale `0.1 ln 4 + 1`;
/// DeepSeek's `mscale`/`mscale_all_dim` give the ratio of that form; a zero factor is a typed
/// error naming it.
#[test]
fn a_yarn_config_gives_kept_divided_and_blended_frequencies() {
    let qwen = r#"{"architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
        "vocab_size": 152064}"#;
    let c = LlamaConfig::from_json(qwen).unwrap();
    assert!((c.rope_attention_factor() - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-12);
    let (plain, yarn) = (RopeScaling::Default.inv_freq(1e6, 128), c.inv_freq());
    assert_eq!(yarn.len(), 64);
    // The band: from the index turning 32 times over the context (floored) to the one turning
    // once (ceiled).
    let index = |r: f64| 128.0 * (32768.0 / (r * 2.0 * std::f64::consts::PI)).ln() / (2.0 * 1e6f64.ln());
    let (low, high) = (index(32.0).floor() as usize, index(1.0).ceil() as usize);
    assert!(0 < low && low < high && high < 64, "{low}..{high}");
    for i in 0..64 {
        let ratio = yarn[i] / plain[i];
        if i <= low {
            assert!((ratio - 1.0).abs() < 1e-6, "{i}: {ratio}");
        } else if i >= high {
            assert!((ratio - 0.25).abs() < 1e-6, "{i}: {ratio}");
        } else {
            assert!(ratio < 1.0 && ratio > 0.25, "{i}: {ratio}");
        }
    }
    let deepseek = qwen.replace(r#""type": "yarn""#, r#""type": "yarn", "mscale": 1.0, "mscale_all_dim": 0.707"#);
    let c = LlamaConfig::from_json(&deepseek).unwrap();
    let m = |k: f64| 0.1 * k * 4f64.ln() + 1.0;
    assert!((c.rope_attention_factor() - m(1.0) / m(0.707)).abs() < 1e-12);
    match LlamaConfig::from_json(&qwen.replace("\"factor\": 4.0", "\"factor\": 0")) {
        Err(NnError::ConfigField { field, .. }) => assert_eq!(field, "rope_scaling.factor"),
        other => panic!("{:?}", other.map(|c| c.architecture)),
    }
}

/// OLMo 3 7B's shapes in `transformers` 5's form: OLMo 2's norms, three sliding layers before
/// each full one, YaRN on the full layers only (the sliding layers' own parameters, unscaled).
#[test]
fn an_olmo3_config_gives_sliding_layers_and_yarn_on_the_full_ones() {
    let olmo3 = r#"{"architectures": ["Olmo3ForCausalLM"], "hidden_size": 4096, "intermediate_size": 11008,
        "num_hidden_layers": 8, "num_attention_heads": 32, "num_key_value_heads": 32,
        "max_position_embeddings": 65536, "rms_norm_eps": 1e-06, "sliding_window": 4096,
        "rope_parameters": {
            "full_attention": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192,
                               "attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1,
                               "rope_theta": 500000},
            "sliding_attention": {"rope_type": "default", "rope_theta": 500000}},
        "vocab_size": 100278, "tie_word_embeddings": false}"#;
    let c = LlamaConfig::from_json(olmo3).unwrap();
    assert_eq!((c.architecture, c.norms, c.qk_norm), (Architecture::Olmo3, Norms::Post, QkNorm::Whole));
    let w = Some(4096);
    assert_eq!(c.sliding_windows, vec![w, w, w, None, w, w, w, None]);
    assert_eq!((c.rope_attention_factor(), c.sliding_attention_factor()), (1.2079441541679836, 1.0));
    assert_eq!(c.sliding_inv_freq().unwrap(), RopeScaling::Default.inv_freq(500000.0, 128));
    assert!(c.inv_freq()[63] < c.sliding_inv_freq().unwrap()[63] / 7.9, "the full layers' low frequencies divided");
}

/// The first layer's norms of a model of `c`: each one's path and shape.
fn layer0_norms(c: LlamaConfig) -> Vec<(String, Vec<usize>)> {
    let model = fusegraph_nn::Llama::new(&fusegraph_nn::Scope::root(), c).unwrap();
    model
        .params()
        .iter()
        .filter(|p| p.path().starts_with("model.layers.0.") && p.path().ends_with("norm.weight"))
        .map(|p| (p.path().to_string(), p.ty().shape.dims().to_vec()))
        .collect()
}

/// Seed-OSS-36B's shapes: q, k and v biases by default, the output projection's only where
/// `attention_out_bias` says; Ministral 8B's: a window on the layers `layer_types` names.
#[test]
fn seed_oss_and_ministral_configs_give_their_biases_and_windows() {
    let seed = r#"{"architectures": ["SeedOssForCausalLM"], "hidden_size": 5120, "intermediate_size": 27648,
        "num_hidden_layers": 64, "num_attention_heads": 80, "num_key_value_heads": 8, "head_dim": 128,
        "max_position_embeddings": 524288, "rms_norm_eps": 1e-06, "rope_theta": 10000000.0,
        "vocab_size": 155136, "tie_word_embeddings": false}"#;
    let c = LlamaConfig::from_json(seed).unwrap();
    assert_eq!((c.architecture, c.qkv_bias, c.o_bias), (Architecture::SeedOss, true, false));
    let c = LlamaConfig::from_json(&seed.replace("\"tie_word", "\"attention_out_bias\": true, \"tie_word")).unwrap();
    assert!(c.qkv_bias && c.o_bias);
    let ministral = r#"{"architectures": ["MinistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-05, "rope_theta": 100000000.0,
        "sliding_window": 32768, "vocab_size": 131072,
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention"]}"#;
    let c = LlamaConfig::from_json(ministral).unwrap();
    assert_eq!(c.architecture, Architecture::Ministral);
    assert_eq!(c.sliding_windows, vec![None, Some(32768), Some(32768), Some(32768)]);
}

/// GLM-4-9B-0414's shapes in `transformers` 4's form: half of each head rotated (the class's
/// default), pairs interleaved, q/k/v biases by default, norms around each branch, gate and
/// up one projection; its checkpoint's norm names map onto the model's.
#[test]
fn a_glm4_config_gives_its_rotary_half_biases_and_norm_names() {
    let glm4 = r#"{"architectures": ["Glm4ForCausalLM"], "hidden_size": 4096, "intermediate_size": 13696,
        "num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
        "vocab_size": 151552, "tie_word_embeddings": false}"#;
    let c = LlamaConfig::from_json(glm4).unwrap();
    assert_eq!((c.rotary_dim, c.rotary_interleaved, c.qkv_bias, c.o_bias), (64, true, true, false));
    assert_eq!((c.norms, c.fused_qkv, c.fused_gate_up), (Norms::Sandwich, false, true));
    let model = fusegraph_nn::Llama::new(&fusegraph_nn::Scope::root(), c).unwrap();
    let renames = model.checkpoint_renames();
    assert_eq!(renames.len(), 6);
    assert!(renames.contains(&(
        "model.layers.1.post_attention_layernorm.weight".into(),
        "model.layers.1.pre_feedforward_layernorm.weight".into()
    )));
}
