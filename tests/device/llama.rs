//! Llama-family checkpoints written by `transformers` (tests/data/checkpoints, made by
//! scripts/fixtures/make_llama.py): a Llama with grouped-query attention, `llama3` rotary
//! scaling and an untied head (f32, sharded, bf16), a Qwen2 with q/k/v biases, one key/value
//! head and a tied head (f32, bf16), and a Mistral with a sliding window shorter than the
//! sequence give `transformers`' logits and greedy tokens.

use fusegraph::generate::{Generator, Sampling};
use fusegraph::nn::{NnError, Pretrained, Quantize};
use fusegraph::{CompileOptions, DType, Device, DeviceOptions, GraphBuilder, HostTensor, KernelForm, ParamStore};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/checkpoints")
}

fn reference(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(data().join(format!("{name}-reference.json"))).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<i32> {
    v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap() as i32).collect()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().flat_map(|row| row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap())).collect()
}

/// The model of `dir` with its weights in a store on the shared device.
fn load(dir: &str) -> (Pretrained, ParamStore) {
    let loaded = Pretrained::load(&data().join(dir), None, Quantize::AsStored).unwrap();
    let store = ParamStore::new(&Device::shared().unwrap());
    store.insert_all(loaded.params.iter()).unwrap();
    (loaded, store)
}

/// The largest difference from `want`, relative to `want`'s largest magnitude.
fn relative_error(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    got.iter().zip(want).fold(0.0f64, |m, (a, b)| m.max((a - b).abs())) / scale
}

/// Each checkpoint's prompt logits, and its 32 greedy tokens through the KV cache (prefill,
/// then decode steps at run-time positions), as `transformers` gives them. A bf16 checkpoint
/// stays bf16 on the device and is computed in f32 from its values: it matches `transformers`
/// run on the same values in f32 to 1e-4, and `transformers`' own bf16 run (which rounds
/// every activation to bf16) to that run's rounding.
#[test]
fn llama_family_logits_and_greedy_tokens_match_transformers() {
    let cases = [
        ("llama-tiny", "llama-tiny", ""),
        ("llama-tiny-sharded", "llama-tiny", ""),
        ("llama-tiny-bf16", "llama-tiny", "_bf16_weights"),
        ("qwen2-tiny", "qwen2-tiny", ""),
        ("qwen2-tiny-bf16", "qwen2-tiny", "_bf16_weights"),
        ("mistral-tiny", "mistral-tiny", ""),
        ("qwen3-tiny", "qwen3-tiny", ""),
        ("gemma3-tiny", "gemma3-tiny", ""),
        ("phi3-tiny", "phi3-tiny", ""),
        ("gemma2-tiny", "gemma2-tiny", ""),
        ("phi3-longrope-tiny", "phi3-longrope-tiny", ""),
        ("qwen3-yarn-tiny", "qwen3-yarn-tiny", ""),
        ("smollm3-tiny", "smollm3-tiny", ""),
        ("granite-tiny", "granite-tiny", ""),
        ("olmo2-tiny", "olmo2-tiny", ""),
        ("olmo3-tiny", "olmo3-tiny", ""),
        ("seed-oss-tiny", "seed-oss-tiny", ""),
        ("ministral-tiny", "ministral-tiny", ""),
        ("ernie45-tiny", "ernie45-tiny", ""),
        ("glm4-tiny", "glm4-tiny", ""),
        ("ministral3-tiny", "ministral3-tiny", ""),
        ("qwen3-moe-tiny", "qwen3-moe-tiny", ""),
        ("qwen2-moe-tiny", "qwen2-moe-tiny", ""),
        ("mixtral-tiny", "mixtral-tiny", ""),
        ("olmoe-tiny", "olmoe-tiny", ""),
        ("gpt-oss-tiny", "gpt-oss-tiny", ""),
        ("glm4-moe-tiny", "glm4-moe-tiny", ""),
        ("ernie45-moe-tiny", "ernie45-moe-tiny", ""),
        ("granite-moe-tiny", "granite-moe-tiny", ""),
        ("deepseek-v3-tiny", "deepseek-v3-tiny", ""),
        ("deepseek-v2-tiny", "deepseek-v2-tiny", ""),
        ("qwen3-fp8-tiny", "qwen3-fp8-tiny", ""),
        ("minimax-m2-tiny", "minimax-m2-tiny", ""),
        ("glm4-moe-lite-tiny", "glm4-moe-lite-tiny", ""),
        ("llama4-tiny", "llama4-tiny", ""),
        ("gemma3-mm-tiny", "gemma3-mm-tiny", ""),
        ("mistral3-mm-tiny", "mistral3-mm-tiny", ""),
    ];
    for (dir, name, form) in cases {
        let r = reference(name);
        let (loaded, store) = load(dir);
        let model = loaded.model;
        let prompt = ids(&r["prompt_ids"]);
        let b = GraphBuilder::new();
        let x = b.input("ids", DType::I32, [1, prompt.len()]).unwrap();
        let logits = model.prefill(&x).unwrap().0;
        let exe = store.compile(&b.graph(), &[logits.id()], &CompileOptions::default()).unwrap();
        let got = exe.run(&[(&x, &HostTensor::new([1, prompt.len()], prompt.clone()).unwrap())]).unwrap();
        let err = relative_error(&got[0].to_f64(), &floats(&r[format!("logits{form}").as_str()]));
        assert!(err < 1e-4, "{dir}: logits differ from transformers' by {err:.2e} of the largest");
        if !form.is_empty() {
            let native = relative_error(&got[0].to_f64(), &floats(&r["logits_bf16"]));
            assert!(native < 5e-2, "{dir}: {native:.2e} from transformers' bf16 run");
        }

        let want = ids(&r[format!("greedy{}", if form.is_empty() { "" } else { "_bf16_weights" }).as_str()]);
        // A cache of the model's whole length: the steps attend over their live part of it.
        let max_seq = model.max_positions();
        assert!(
            prompt.len() + want.len() <= fusegraph::generate::DECODE_MIN_LIVE
                && fusegraph::generate::DECODE_MIN_LIVE < max_seq
        );
        let mut g = Generator::new(&store, model.clone(), 1, max_seq, CompileOptions::default()).unwrap();
        g.stop_at(Vec::new());
        let out = g.generate(std::slice::from_ref(&prompt), want.len(), &Sampling::greedy()).unwrap();
        assert_eq!(out.tokens[0][prompt.len()..], want[..], "{dir}: greedy tokens");
    }
}

/// Generation stops at the config's end-of-sequence token, kept as the last token.
#[test]
fn generation_stops_at_the_end_of_sequence_token() {
    let r = reference("llama-tiny");
    let (loaded, store) = load("llama-tiny");
    let prompt = ids(&r["prompt_ids"]);
    let greedy = ids(&r["greedy"]);
    let model = loaded.model;
    let mut g =
        Generator::new(&store, model.clone(), 1, prompt.len() + greedy.len(), CompileOptions::default()).unwrap();
    // Make the 5th greedy token the end of the sequence.
    g.stop_at(vec![greedy[4]]);
    let out = g.generate(std::slice::from_ref(&prompt), greedy.len(), &Sampling::greedy()).unwrap();
    let first = greedy.iter().position(|&t| t == greedy[4]).unwrap();
    assert_eq!(out.tokens[0][prompt.len()..], greedy[..=first]);
    assert_eq!(model.eos_token_ids(), vec![1], "the config's eos_token_id");
}

/// A config naming a class this library does not build, or a rotary type it does not know,
/// is a typed error naming the field and the value; a checkpoint missing a shard names the
/// file; nothing is returned half loaded.
#[test]
fn unsupported_configs_and_missing_shards_are_named() {
    let dir = std::env::temp_dir().join(format!("fusegraph-llama-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = std::fs::read_to_string(data().join("llama-tiny/config.json")).unwrap();
    let edited = config.replace("LlamaForCausalLM", "GemmaForCausalLM");
    std::fs::write(dir.join("config.json"), &edited).unwrap();
    match Pretrained::load(&dir, None, Quantize::AsStored) {
        Err(NnError::ConfigField { field, value, .. }) => {
            assert_eq!((field.as_str(), value.as_str()), ("architectures", "GemmaForCausalLM"))
        }
        other => panic!("{:?}", other.map(|p| p.model.name())),
    }
    std::fs::write(dir.join("config.json"), config.replace("\"llama3\"", "\"dynamic\"")).unwrap();
    let e = Pretrained::load(&dir, None, Quantize::AsStored).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("rope_parameters.rope_type") && e.contains("dynamic"), "{e}");

    // The sharded checkpoint without one of its shards.
    let sharded = data().join("llama-tiny-sharded");
    for entry in std::fs::read_dir(&sharded).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    let index: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap()).unwrap();
    let shard = index["weight_map"].as_object().unwrap().values().next().unwrap().as_str().unwrap().to_string();
    std::fs::remove_file(dir.join(&shard)).unwrap();
    let e = Pretrained::load(&dir, None, Quantize::AsStored).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains(&shard), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The logits of `reference`'s prompt from a loaded model.
fn prompt_logits(loaded: &Pretrained, store: &ParamStore, prompt: &[i32]) -> Vec<f64> {
    let b = GraphBuilder::new();
    let x = b.input("ids", DType::I32, [1, prompt.len()]).unwrap();
    let logits = loaded.model.prefill(&x).unwrap().0;
    let exe = store.compile(&b.graph(), &[logits.id()], &CompileOptions::default()).unwrap();
    exe.run(&[(&x, &HostTensor::new([1, prompt.len()], prompt.to_vec()).unwrap())]).unwrap()[0].to_f64()
}

/// Parameters stay in their storage dtype on the device: a bf16 checkpoint's take 2 bytes
/// each (the store's bytes and the device's `memory_allocated`), as does an f32 checkpoint
/// loaded with `Some(BF16)` — whose logits are then those of its bf16-rounded weights — and
/// f16 storage likewise; `Some(F32)` widens a bf16 checkpoint to 4 bytes each.
#[test]
fn parameters_keep_their_storage_dtype_on_the_device() {
    let r = reference("llama-tiny");
    let prompt = ids(&r["prompt_ids"]);
    for (dir, dtype, bytes_each, want, tolerance) in [
        ("llama-tiny-bf16", None, 2, "logits_bf16_weights", 1e-4),
        ("llama-tiny", Some(DType::BF16), 2, "logits_bf16_weights", 1e-4),
        ("llama-tiny-bf16", Some(DType::F32), 4, "logits_bf16_weights", 1e-4),
        ("llama-tiny", Some(DType::F16), 2, "logits", 1e-2),
    ] {
        let loaded = Pretrained::load(&data().join(dir), dtype, Quantize::AsStored).unwrap();
        let elements = loaded.model.num_elements() as u64;
        let device = Arc::new(Device::new(&DeviceOptions::default()).unwrap());
        let store = ParamStore::new(&device);
        store.insert_all(loaded.params.iter()).unwrap();
        assert_eq!(store.bytes(), bytes_each * elements, "{dir} as {dtype:?}");
        assert_eq!(device.memory().allocated, bytes_each * elements, "{dir} as {dtype:?}");
        let err = relative_error(&prompt_logits(&loaded, &store, &prompt), &floats(&r[want]));
        assert!(err < tolerance, "{dir} as {dtype:?}: {err:.2e} from {want}");
    }
}

/// llama-tiny as llama.cpp's converter writes it (tests/data/gguf, made by
/// scripts/fixtures/make_gguf.py with the `gguf` package): the F32 file gives the
/// safetensors checkpoint's logits (q and k rows unpermuted, llama3 scaling from
/// `rope_freqs`), the Q8_0 and Q4_0 files the logits and greedy tokens `transformers` computes
/// from their dequantized weights — their matrices on the device as the file's blocks, each
/// dequantized inside the product that reads it. So do they in a GPU's kernel forms, whose
/// decode step reads the weights through the matrix–vector kernel (the blocks by whole words).
#[test]
fn gguf_files_give_transformers_logits_and_tokens() {
    let f32_ref = reference("llama-tiny");
    let (q8_ref, q4_ref) = (gguf_reference("q8_0"), gguf_reference("q4_0"));
    let gpu_forms = Arc::new(Device::new(&DeviceOptions { gpu_kernels: true, ..Default::default() }).unwrap());
    for (file, r, block) in [
        ("llama-tiny-f32.gguf", &f32_ref, None),
        ("llama-tiny-q8_0.gguf", &q8_ref, Some(DType::Q8_0)),
        ("llama-tiny-q4_0.gguf", &q4_ref, Some(DType::Q4_0)),
    ] {
        let loaded = Pretrained::load(&gguf_dir().join(file), None, Quantize::AsStored).unwrap();
        let matrices = loaded.params.values().filter(|t| t.shape().rank() == 2).map(|t| t.dtype());
        assert!(matrices.clone().all(|d| Some(d) == block || (block.is_none() && d == DType::F32)), "{file}");
        check_logits_and_tokens(&loaded, r, file, &Device::shared().unwrap());
        let forms = check_logits_and_tokens(&loaded, r, &format!("{file} in GPU forms"), &gpu_forms);
        let packed = forms.iter().filter(|f| matches!(f, KernelForm::Gemv { packed: true, .. })).count();
        assert!(packed >= 7 * usize::from(block.is_some()), "{file}: {packed} packed products of {forms:?}");
        assert!(forms.iter().any(|f| matches!(f, KernelForm::Gemv { .. })), "{file}: {forms:?}");
    }
}

/// `Quantize::To` quantizes a safetensors checkpoint as llama.cpp's reference code does: the
/// f32 llama-tiny quantized on load to Q8_0 or Q4_0 holds the very blocks the `gguf`
/// package wrote into the fixture files, so it gives their logits and tokens.
#[test]
fn quantizing_on_load_gives_the_gguf_files_blocks() {
    for (q, r) in [(DType::Q8_0, gguf_reference("q8_0")), (DType::Q4_0, gguf_reference("q4_0"))] {
        let loaded = Pretrained::load(&data().join("llama-tiny"), None, Quantize::To(q)).unwrap();
        let file =
            Pretrained::load(&gguf_dir().join(format!("llama-tiny-{q}.gguf")), None, Quantize::AsStored).unwrap();
        for (path, t) in &file.params {
            if t.dtype() == q {
                let (mine, theirs) = (loaded.params[path].to_bytes(), t.to_bytes());
                let differ = mine.iter().zip(&theirs).filter(|(a, b)| a != b).count();
                assert!(differ == 0 && mine.len() == theirs.len(), "{path}: {differ} bytes differ");
            }
        }
        check_logits_and_tokens(&loaded, &r, &format!("llama-tiny quantized to {q}"), &Device::shared().unwrap());
    }
}

/// A Q4_0 model's parameters take at most 0.3 of their f16 bytes on the device.
#[test]
fn a_q4_0_model_takes_under_a_third_of_its_f16_bytes() {
    let loaded = Pretrained::load(&gguf_dir().join("llama-tiny-q4_0.gguf"), None, Quantize::AsStored).unwrap();
    let f16_bytes = 2 * loaded.model.num_elements() as u64;
    let device = Arc::new(Device::new(&DeviceOptions::default()).unwrap());
    let store = ParamStore::new(&device);
    store.insert_all(loaded.params.iter()).unwrap();
    let allocated = device.memory().allocated;
    eprintln!("q4_0: {allocated} bytes on the device, f16 {f16_bytes}");
    assert_eq!(allocated, store.bytes());
    assert!(allocated * 10 <= f16_bytes * 3, "{allocated} bytes of {f16_bytes} in f16");
}

/// GGUF files of mixed block types keep their blocks on the device and give the logits and
/// greedy tokens `transformers` computes from their dequantized weights, in a CPU adapter's
/// kernel forms and a GPU's (the decode step's products through the matrix–vector kernel,
/// reading the blocks by words): `llama-k-q4_k_m.gguf` (Q4_K matrices and embedding, Q5_K
/// `attn_v` and `ffn_up`, Q6_K `attn_output`, `ffn_down` and `output`, 256 wide: about a
/// third of its f16 bytes) and
/// `qwen2-tiny-q5_0.gguf` (a `qwen2` file: q/k/v biases, rows as `transformers` has them, a
/// tied head; Q5_0 matrices, Q8_0 `ffn_down` and embedding) and `llama-k-iq4_xs.gguf`
/// (IQ4_XS q, o and embedding, IQ4_NL `attn_k`, Q3_K `attn_v` and `ffn_down`, Q2_K `ffn_gate`
/// and `ffn_up`, Q6_K `output`) and `qwen3-tiny-iq4_nl.gguf` (a `qwen3` file: q and k norms,
/// heads wider than the width over the heads; IQ4_NL matrices, a Q8_0 embedding) and
/// `gemma3-tiny-q8_0.gguf` (a `gemma3` file: norm gains stored as `1 + w`, Gemma's norm
/// names, five sliding layers and a global one with its linear rotary scaling; Q8_0) and
/// `phi3-tiny-q8_0.gguf` (a `phi3` file: `attn_qkv` and `ffn_up` fused, rotary positions on
/// part of each head; Q8_0), `gemma2-tiny-q8_0.gguf` (a `gemma2` file: soft caps from its
/// metadata, every other layer a window; Q8_0) and `phi3-longrope-tiny-q8_0.gguf` (Phi-3.5's
/// longrope factors as `rope_factors_long`/`rope_factors_short`; Q8_0), a `qwen3` file with
/// YaRN scaling and `smollm3`, `granite` (its multipliers from the metadata) and `olmo2`
/// files, one of them OLMo 3 (a window pattern; YaRN on the full layers only), and a
/// `seed_oss` file (its biases by the tensors it holds) and an `ernie4_5` file (rotary pairs
/// interleaved, as llama.cpp's rope type 0 turns them) and a `glm4` file (its norms under the
/// names of norms around each branch, the rotated part as `rope.dimension_count`) and a
/// `mistral3` file (YaRN with its log multiplier, Llama 4's temperature) (Q8_0).
#[test]
fn mixed_block_files_keep_their_blocks_and_give_transformers_logits_and_tokens() {
    let gpu_forms = Arc::new(Device::new(&DeviceOptions { gpu_kernels: true, ..Default::default() }).unwrap());
    for (file, types, f16_share) in [
        ("llama-k-q4_k_m", &[DType::Q4K, DType::Q5K, DType::Q6K][..], 0.37),
        ("qwen2-tiny-q5_0", &[DType::Q5_0, DType::Q8_0], 0.6),
        ("llama-k-iq4_xs", &[DType::IQ4XS, DType::IQ4NL, DType::Q3K, DType::Q2K, DType::Q6K], 0.3),
        ("qwen3-tiny-iq4_nl", &[DType::IQ4NL, DType::Q8_0], 0.6),
        ("gemma3-tiny-q8_0", &[DType::Q8_0], 0.6),
        ("phi3-tiny-q8_0", &[DType::Q8_0], 0.6),
        ("gemma2-tiny-q8_0", &[DType::Q8_0], 0.6),
        ("phi3-longrope-tiny-q8_0", &[DType::Q8_0], 0.6),
        ("qwen3-yarn-tiny-q8_0", &[DType::Q8_0], 0.6),
        ("smollm3-tiny-q8_0", &[DType::Q8_0], 0.6),
        ("granite-tiny-q8_0", &[DType::Q8_0], 0.6),
        ("olmo2-tiny-q8_0", &[DType::Q8_0], 0.6),
        ("olmo3-tiny-q8_0", &[DType::Q8_0], 0.6),
        ("seed-oss-tiny-q8_0", &[DType::Q8_0], 0.6),
        ("ernie45-tiny-q8_0", &[DType::Q8_0], 0.6),
        ("glm4-tiny-q8_0", &[DType::Q8_0], 0.6),
        ("ministral3-tiny-q8_0", &[DType::Q8_0], 0.6),
    ] {
        let text = std::fs::read_to_string(gguf_dir().join(format!("{file}-reference.json"))).unwrap();
        let r: Value = serde_json::from_str(&text).unwrap();
        let loaded = Pretrained::load(&gguf_dir().join(format!("{file}.gguf")), None, Quantize::AsStored).unwrap();
        let held: std::collections::BTreeSet<DType> =
            loaded.params.values().filter(|t| t.shape().rank() == 2).map(|t| t.dtype()).collect();
        assert_eq!(held, types.iter().copied().collect(), "{file}: the matrices keep the file's types");
        let device = Arc::new(Device::new(&DeviceOptions::default()).unwrap());
        let store = ParamStore::new(&device);
        store.insert_all(loaded.params.iter()).unwrap();
        let (allocated, f16_bytes) = (device.memory().allocated, 2 * loaded.model.num_elements() as u64);
        eprintln!("{file}: {allocated} bytes on the device, f16 {f16_bytes}");
        assert!(allocated as f64 <= f16_bytes as f64 * f16_share, "{file}: {allocated} bytes of {f16_bytes} in f16");
        check_logits_and_tokens(&loaded, &r, file, &Device::shared().unwrap());
        let forms = check_logits_and_tokens(&loaded, &r, &format!("{file} in GPU forms"), &gpu_forms);
        let packed = forms.iter().filter(|f| matches!(f, KernelForm::Gemv { packed: true, .. })).count();
        assert!(packed >= 7, "{file}: {packed} products reading packed words of {forms:?}");
    }
}

/// GGUF mixtures of experts as llama.cpp's converter writes them — a `qwen3moe` file, a
/// `qwen2moe` file (its shared expert, 48 wide, in f32; its gate a vector), a `llama` file with
/// experts (Mixtral's), an `olmoe` file, a `gpt-oss` file (sinks; gate and up stacks apart,
/// interleaved into one on load; biases) and a `glm4moe` file (sigmoid gating with correction
/// biases, shared experts, a dense first layer) and an `ernie4_5-moe` file (correction biases,
/// shared experts by width, leading dense layers) and a `granitemoe` file (gate and up stacks
/// joined into one on load); Q8_0 expert stacks `[experts, out, in]` (and
/// gpt-oss's in MXFP4, as released), f32 routers: the stacks keep their blocks, and the logits
/// and greedy tokens are `transformers`' on the file's values, in the adapter's forms and a GPU's.
#[test]
fn gguf_mixtures_keep_their_expert_blocks_and_give_transformers_logits_and_tokens() {
    let gpu_forms = Arc::new(Device::new(&DeviceOptions { gpu_kernels: true, ..Default::default() }).unwrap());
    // (file, its expert stacks' block type)
    let files = [
        ("qwen3-moe-tiny-q8_0", DType::Q8_0),
        ("qwen2-moe-tiny-q8_0", DType::Q8_0),
        ("mixtral-tiny-q8_0", DType::Q8_0),
        ("olmoe-tiny-q8_0", DType::Q8_0),
        ("gpt-oss-tiny-q8_0", DType::Q8_0),
        ("glm4-moe-tiny-q8_0", DType::Q8_0),
        ("gpt-oss-tiny-mxfp4", DType::MXFP4),
        ("ernie45-moe-tiny-q8_0", DType::Q8_0),
        ("granite-moe-tiny-q8_0", DType::Q8_0),
        ("deepseek-v3-tiny-q8_0", DType::Q8_0),
        ("deepseek-v2-tiny-q8_0", DType::Q8_0),
        ("minimax-m2-tiny-q8_0", DType::Q8_0),
        ("llama4-tiny-q8_0", DType::Q8_0),
    ];
    for (file, stored) in files {
        let text = std::fs::read_to_string(gguf_dir().join(format!("{file}-reference.json"))).unwrap();
        let r: Value = serde_json::from_str(&text).unwrap();
        let loaded = Pretrained::load(&gguf_dir().join(format!("{file}.gguf")), None, Quantize::AsStored).unwrap();
        let stacks: Vec<_> =
            loaded.params.iter().filter(|(path, _)| path.contains(".experts.") && !path.ends_with("bias")).collect();
        assert!([4, 6].contains(&stacks.len()), "{file}: two or three stacks a layer");
        for (path, t) in stacks {
            // Rows of whole blocks in the file's type (Mixtral's experts 48 wide: their down stack in f32).
            let (d, blocks) = (t.shape().dims(), t.dtype() == stored);
            let rows = if blocks { d[2] } else { d[1] };
            assert_eq!(rows % 32 == 0, blocks, "{file}: {path} {}", t.ty());
            assert!(blocks || t.dtype() == DType::F32, "{file}: {path} {}", t.ty());
            let (elems, block_bytes) = stored.block().unwrap();
            let want = if blocks { t.shape().numel() / elems * block_bytes } else { 4 * t.shape().numel() };
            assert_eq!(t.to_bytes().len(), want, "{file}: {path}");
        }
        let routers =
            || loaded.params.iter().filter(|(p, _)| p.ends_with("mlp.gate.weight") || p.ends_with("mlp.router.weight"));
        assert!(routers().count() == 2 && routers().all(|(_, t)| t.dtype() == DType::F32), "{file}");
        check_logits_and_tokens(&loaded, &r, file, &Device::shared().unwrap());
        check_logits_and_tokens(&loaded, &r, &format!("{file} in GPU forms"), &gpu_forms);
    }
}

/// gpt-oss as it is released: its expert stacks MXFP4 (`…_blocks` beside `…_scales`) stay
/// MXFP4 on the device (17 bytes for 32 values) and give the logits and greedy tokens
/// `transformers` computes from that directory, in the adapter's forms and a GPU's; read
/// dequantized (`Quantize::None`, f32 `[experts, in, out]`), the same logits.
#[test]
fn gpt_oss_mxfp4_experts_stay_blocks_and_give_transformers_logits_and_tokens() {
    let r = reference("gpt-oss-tiny-mxfp4");
    let loaded = Pretrained::load(&data().join("gpt-oss-tiny-mxfp4"), None, Quantize::AsStored).unwrap();
    let stacks: Vec<_> =
        loaded.params.iter().filter(|(p, _)| p.ends_with("_proj") && p.contains(".experts.")).collect();
    assert_eq!(stacks.len(), 4);
    for (path, t) in &stacks {
        assert_eq!(t.dtype(), DType::MXFP4, "{path}");
        assert_eq!(t.to_bytes().len() * 32, t.shape().numel() * 17, "{path}");
    }
    check_logits_and_tokens(&loaded, &r, "gpt-oss-tiny-mxfp4", &Device::shared().unwrap());
    let gpu_forms = Arc::new(Device::new(&DeviceOptions { gpu_kernels: true, ..Default::default() }).unwrap());
    check_logits_and_tokens(&loaded, &r, "gpt-oss-tiny-mxfp4 in GPU forms", &gpu_forms);
    let plain = Pretrained::load(&data().join("gpt-oss-tiny-mxfp4"), None, Quantize::None).unwrap();
    let up = &plain.params["model.layers.0.mlp.experts.gate_up_proj"];
    assert_eq!((up.dtype(), up.shape().dims()), (DType::F32, &[8, 64, 64][..]));
    let store = ParamStore::new(&Device::shared().unwrap());
    store.insert_all(plain.params.iter()).unwrap();
    let err = relative_error(&prompt_logits(&plain, &store, &ids(&r["prompt_ids"])), &floats(&r["logits"]));
    assert!(err < 1e-4, "dequantized on load: {err:.2e}");
}

/// Qwen3's per-head q and k norms, Gemma 3's layers (sandwich norms with `1 + w` gains,
/// scaled embeddings and scores, a tanh GELU, sliding layers with their own rotary base) and
/// Phi-3's (fused projections, rotary positions on part of each head; Phi-3.5's longrope
/// factors, short within the trained context and long past it mid-generation), Gemma 2's
/// (soft-capped scores and logits), SmolLM3's (a layer without rotary positions), Granite's
/// (multipliers), OLMo 2's (norms after each branch, q and k normed whole) and OLMo 3's
/// (sliding layers with unscaled rotary positions beside YaRN-scaled full ones), Seed-OSS's
/// (biases on q, k, v and the output apart), Ministral's (windows by layer type) and Ernie
/// 4.5's (rotary pairs interleaved, biases everywhere) and GLM-4's (its norm names, fused gate
/// and up, interleaved pairs on half of each head) and Ministral 3's (YaRN, queries scaled by
/// position) in a GPU's kernel forms, whose decode step's products take the matrix–vector kernel:
/// `transformers`' logits and greedy tokens.
#[test]
fn newer_llama_family_layers_in_gpu_forms() {
    let gpu_forms = Arc::new(Device::new(&DeviceOptions { gpu_kernels: true, ..Default::default() }).unwrap());
    for name in [
        "qwen3-tiny",
        "gemma3-tiny",
        "phi3-tiny",
        "gemma2-tiny",
        "phi3-longrope-tiny",
        "smollm3-tiny",
        "granite-tiny",
        "olmo2-tiny",
        "olmo3-tiny",
        "seed-oss-tiny",
        "ministral-tiny",
        "ernie45-tiny",
        "glm4-tiny",
        "ministral3-tiny",
        "qwen3-moe-tiny",
        "qwen2-moe-tiny",
        "mixtral-tiny",
        "olmoe-tiny",
        "gpt-oss-tiny",
        "glm4-moe-tiny",
        "ernie45-moe-tiny",
        "granite-moe-tiny",
        "deepseek-v3-tiny",
        "deepseek-v2-tiny",
        "minimax-m2-tiny",
        "glm4-moe-lite-tiny",
        "llama4-tiny",
    ] {
        let loaded = Pretrained::load(&data().join(name), None, Quantize::AsStored).unwrap();
        let forms = check_logits_and_tokens(&loaded, &reference(name), &format!("{name} in GPU forms"), &gpu_forms);
        assert!(forms.iter().any(|f| matches!(f, KernelForm::Gemv { .. })), "{name}: {forms:?}");
    }
}

fn gguf_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf")
}

fn gguf_reference(kind: &str) -> Value {
    let text = std::fs::read_to_string(gguf_dir().join(format!("llama-tiny-{kind}-reference.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// `loaded`'s prompt logits on `device` within 1e-4 of `r`'s and its greedy tokens `r`'s, no
/// gathered expert weights stored by the decode step; returns the forms of its kernels.
fn check_logits_and_tokens(loaded: &Pretrained, r: &Value, what: &str, device: &Arc<Device>) -> Vec<KernelForm> {
    let store = ParamStore::new(device);
    store.insert_all(loaded.params.iter()).unwrap();
    let prompt = ids(&r["prompt_ids"]);
    let err = relative_error(&prompt_logits(loaded, &store, &prompt), &floats(&r["logits"]));
    assert!(err < 1e-4, "{what}: logits differ by {err:.2e} of the largest");
    let want = ids(&r["greedy"]);
    let mut g =
        Generator::new(&store, loaded.model.clone(), 1, prompt.len() + want.len(), CompileOptions::default()).unwrap();
    g.stop_at(Vec::new());
    let out = g.generate(std::slice::from_ref(&prompt), want.len(), &Sampling::greedy()).unwrap();
    assert_eq!(out.tokens[0][prompt.len()..], want[..], "{what}: greedy tokens");
    let step = g.step_executable(&Sampling::greedy()).expect("compiled by the generation");
    // A mixture's experts are gathered inside the products that read them: no gathered
    // weight stack (`[tokens, k, rows, cols]`) is ever stored.
    let graph = step.graph();
    let stored_stacks = step
        .memory_plan()
        .locations
        .keys()
        .filter(|&&id| matches!(graph.node(id).op, fusegraph::Op::Gather { .. }) && graph.ty(id).shape.rank() == 4);
    assert_eq!(stored_stacks.count(), 0, "{what}: a gathered expert stack is stored");
    step.stats().kernels.iter().map(|k| k.form).collect()
}

/// The step chooses the next tokens on the device and reads back one id per sequence:
/// greedy is the argmax; sampling at top-k 1 chooses the same tokens (random logits have no
/// ties), at batch 2 over 24 new tokens; sampling with every filter is repeatable by its
/// seed, and its ids lie in the vocabulary.
#[test]
fn tokens_chosen_on_the_device() {
    let loaded = Pretrained::load(&data().join("llama-tiny"), None, Quantize::AsStored).unwrap();
    let store = ParamStore::new(&Device::shared().unwrap());
    store.insert_all(loaded.params.iter()).unwrap();
    let mut g = Generator::new(&store, loaded.model.clone(), 2, 32, CompileOptions::default()).unwrap();
    g.stop_at(Vec::new());
    let prompts = [vec![5, 17, 42, 8], vec![99, 3, 250, 61]];
    let greedy = g.generate(&prompts, 24, &Sampling::greedy()).unwrap();
    let top1 = Sampling { temperature: 1.0, top_k: Some(1), top_p: None, seed: 7 };
    assert_eq!(greedy.tokens, g.generate(&prompts, 24, &top1).unwrap().tokens);
    // Each ran its own step, the sampled one fed a draw per sequence.
    let inputs = |s: &Sampling| -> Vec<String> {
        g.step_executable(s).expect("compiled by its first use").inputs().into_iter().map(|(n, _)| n).collect()
    };
    assert!(!inputs(&Sampling::greedy()).contains(&"uniform".to_string()));
    assert!(inputs(&top1).contains(&"uniform".to_string()), "{:?}", inputs(&top1));
    let all = Sampling { temperature: 0.8, top_k: Some(50), top_p: Some(0.9), seed: 3 };
    let (a, b) = (g.generate(&prompts, 12, &all).unwrap(), g.generate(&prompts, 12, &all).unwrap());
    assert_eq!(a.tokens, b.tokens, "a seed repeats its draws");
    let vocab = loaded.model.vocab_size() as i32;
    assert!(a.tokens.iter().flatten().all(|t| (0..vocab).contains(t)), "{:?}", a.tokens);
    let other = g.generate(&prompts, 12, &Sampling { seed: 4, ..all }).unwrap();
    assert_ne!(a.tokens, other.tokens, "another seed, other draws");
    let bad = Sampling { top_p: Some(1.5), ..all };
    let err = g.generate(&prompts, 4, &bad).unwrap_err().to_string();
    assert!(err.contains("top_p must be in (0, 1]"), "{err}");
}

/// The sampling head on the device, fused as a step compiles it (with this adapter's
/// measured cost model and forms, with none measured — where the top-p threshold recomputed
/// in two kernels once dropped the token on it from one kernel's sums — and in a GPU's
/// forms), against
/// the CPU reference of the same graph: random logits of a 3,000-token vocabulary, every
/// filter mix, random draws.
#[test]
fn sampled_ids_on_the_device_match_the_reference() {
    use fusegraph::crates::reference::evaluate;
    use fusegraph::sampling::Head;
    use fusegraph::{DType, GraphBuilder, HostTensor};
    use std::collections::BTreeMap;
    let (batch, vocab) = (3, 3000);
    let mut rng = crate::common::Rng::new(21);
    let logits = crate::common::random(&mut rng, DType::F32, &[batch, vocab], crate::common::Domain::Any);
    let logits = HostTensor::from_f64(
        DType::F32,
        logits.shape().clone(),
        &logits.to_f64().iter().map(|x| x * 6.0).collect::<Vec<_>>(),
    )
    .unwrap();
    let gpu_forms = std::sync::Arc::new(
        Device::new(&fusegraph::DeviceOptions { gpu_kernels: true, ..Default::default() }).unwrap(),
    );
    let settings = [(1.0, None, None), (0.7, Some(40), None), (1.2, None, Some(0.8)), (1.0, Some(200), Some(0.6))];
    let unmeasured = std::sync::Arc::new(
        Device::new(&fusegraph::DeviceOptions { autotune: Some(false), ..Default::default() }).unwrap(),
    );
    let devices = [(Device::shared().unwrap(), "measured"), (unmeasured, "unmeasured"), (gpu_forms, "GPU forms")];
    for ((device, which), (t, k, p)) in devices.iter().flat_map(|d| settings.map(|s| (d, s))) {
        let s = Sampling { temperature: t, top_k: k, top_p: p, seed: 0 };
        let b = GraphBuilder::new();
        let x = b.input("logits", DType::F32, [batch, vocab]).unwrap();
        let out = Head::of(&s).build(&x).unwrap();
        let exe = device.compile(&b.graph(), &[out.id()], &CompileOptions::default()).unwrap();
        for round in 0..4 {
            let draws: Vec<f32> = (0..batch).map(|i| ((round * batch + i) as f32 * 0.377).fract()).collect();
            let mut feeds: BTreeMap<String, HostTensor> =
                Head::of(&s).feeds(&s, draws).unwrap().into_iter().map(|(n, t)| (n.to_string(), t)).collect();
            feeds.insert("logits".into(), logits.clone());
            let want = evaluate(&b.graph(), &[out.id()], &feeds, &BTreeMap::new()).unwrap();
            let refs: Vec<(&str, &HostTensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
            let got = exe.run(&refs).unwrap();
            assert_eq!(
                got[0].as_slice::<i32>(),
                want[0].as_slice::<i32>(),
                "{s:?}, round {round}, {} ({which})",
                device.describe()
            );
        }
    }
}

/// A Llama-family decode step writes each layer's new key and value into the caches by a
/// window kernel — which also stores the rotated query — that moves less than the layer's
/// caches hold (a full pass would read and write them all), and keeps `transformers`'
/// greedy tokens.
#[test]
fn a_llama_step_writes_only_the_new_positions_of_its_caches() {
    let loaded = Pretrained::load(&data().join("llama-tiny"), None, Quantize::AsStored).unwrap();
    let r = reference("llama-tiny");
    let store = ParamStore::new(&Device::shared().unwrap());
    store.insert_all(loaded.params.iter()).unwrap();
    let shape = loaded.model.cache_shape();
    let (layers, heads, dim) = (shape.layers, shape.heads, shape.key_width);
    let len = loaded.model.max_positions();
    let mut g = Generator::new(&store, loaded.model.clone(), 1, len, CompileOptions::default()).unwrap();
    g.stop_at(Vec::new());
    let prompt = ids(&r["prompt_ids"]);
    let want = ids(&r["greedy"]);
    let out = g.generate(std::slice::from_ref(&prompt), want.len(), &Sampling::greedy()).unwrap();
    assert_eq!(out.tokens[0][prompt.len()..], want[..], "greedy tokens");
    let step = g.step_executable_at(&Sampling::greedy(), 16).expect("compiled");
    let layer_caches = (2 * heads * len * dim * 4) as u64;
    let kernels = &step.stats().kernels;
    // A window kernel per layer, or (the matrix–vector kernel's forms) side windows of the two
    // products reading the caches.
    let windows: Vec<u64> = kernels.iter().filter(|k| k.windows).map(|k| k.bytes_moved).collect();
    let listed = || kernels.iter().map(|k| (&k.label, k.form)).collect::<Vec<_>>();
    assert!([layers, 2 * layers].contains(&windows.len()), "{:?}", listed());
    eprintln!("window kernels move {windows:?} B; a layer's caches hold {layer_caches} B");
    assert!(windows.iter().all(|&b| b < layer_caches), "{windows:?} B against {layer_caches} B");
}

/// Every GGUF model fixture whose reference holds llama.cpp's prompt logits
/// (`scripts/fixtures/llama_cpp_reference.py compare`: llama.cpp through llama-cpp-python
/// 0.3.36, on the CPU) gives logits within 4e-2 of the largest of llama.cpp's. llama.cpp runs a
/// quantized file's products on activations quantized to 8 bits, which puts it 1e-2 … 3.1e-2
/// from `transformers` on the same weights (with f32 weights, 1e-3 at most); a file read
/// otherwise than llama.cpp reads it — a norm, a rotary layout, a window, a scale — moves the
/// logits by half the largest or more.
#[test]
fn gguf_models_give_llama_cpp_logits() {
    let mut checked = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(gguf_dir()).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    for path in files {
        let Some(name) = path.file_name().unwrap().to_str().unwrap().strip_suffix("-reference.json") else { continue };
        let r: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let Some(want) = r.get("llama_cpp_logits") else { continue };
        let want = floats(want);
        let loaded = Pretrained::load(&gguf_dir().join(format!("{name}.gguf")), None, Quantize::AsStored).unwrap();
        let store = ParamStore::new(&Device::shared().unwrap());
        store.insert_all(loaded.params.iter()).unwrap();
        let err = relative_error(&prompt_logits(&loaded, &store, &ids(&r["prompt_ids"])), &want);
        eprintln!("{name}: {err:.2e} of the largest logit from llama.cpp's");
        assert!(err < 4e-2, "{name}: logits differ from llama.cpp's by {err:.2e} of the largest");
        checked.push(name.to_string());
    }
    assert_eq!(checked.len(), 30, "{checked:?}");
}
