//! Checkpoints written by `transformers` (tests/data/checkpoints, made by
//! scripts/fixtures/make_checkpoints.py): a tiny GPT-2 in f32, bf16 and sharded form gives
//! `transformers`' logits and greedy tokens, and with its BPE tokenizer its text; bad
//! checkpoints are typed errors naming the key, and leave the store as it was.

use fusegraph::crates::ir::safetensors;
use fusegraph::generate::{Generator, Sampling};
use fusegraph::nn::{Checkpoint, Forward, Gpt2, Gpt2Config, KeyMap, NnError, Scope};
use fusegraph::{CompileOptions, DType, Device, GraphBuilder, HostTensor, ParamStore};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/checkpoints")
}

fn model() -> Gpt2 {
    let config = std::fs::read_to_string(data().join("gpt2-tiny/config.json")).unwrap();
    Gpt2::new(&Scope::root(), Gpt2Config::from_json(&config).unwrap()).unwrap()
}

fn reference() -> BTreeMap<String, HostTensor> {
    safetensors::read(&data().join("gpt2-tiny-reference.safetensors")).unwrap()
}

fn ints(t: &HostTensor) -> Vec<i32> {
    t.as_slice::<i32>().unwrap().to_vec()
}

/// The logits of `prompt` from the checkpoint at `dir`, on the device.
fn logits(dir: &str, prompt: &HostTensor) -> (HostTensor, ParamStore) {
    let m = model();
    let values = Checkpoint::open(&data().join(dir)).unwrap().load(&m, &KeyMap::gpt2()).unwrap();
    let store = ParamStore::new(&Device::shared().unwrap());
    store.insert_all(values.iter()).unwrap();
    let b = GraphBuilder::new();
    let ids = b.input("ids", DType::I32, prompt.shape().dims().to_vec()).unwrap();
    let y = m.forward(&ids).unwrap();
    let exe = store.compile(&b.graph(), &[y.id()], &CompileOptions::default()).unwrap();
    (exe.run(&[(&ids, prompt)]).unwrap().remove(0), store)
}

fn max_diff(a: &HostTensor, b: &HostTensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.to_f64().iter().zip(b.to_f64()).fold(0.0, |m, (x, y)| m.max((x - y).abs()))
}

#[test]
fn gpt2_logits_match_transformers_in_every_format() {
    let r = reference();
    let scale = r["logits"].to_f64().iter().fold(0.0f64, |m, v| m.max(v.abs()));
    for (dir, want) in [("gpt2-tiny", "logits"), ("gpt2-tiny-sharded", "logits"), ("gpt2-tiny-bf16", "logits_bf16")] {
        let (got, _) = logits(dir, &r["prompt"]);
        let d = max_diff(&got, &r[want]);
        assert!(d < 1e-4 * scale.max(1.0), "{dir}: logits differ by {d} (scale {scale})");
    }
    // The bf16 weights differ from the f32 ones: the two references are not the same.
    assert!(max_diff(&r["logits"], &r["logits_bf16"]) > 1e-4);
}

#[test]
fn greedy_generation_matches_transformers_token_for_token() {
    let r = reference();
    let m = model();
    let values = Checkpoint::open(&data().join("gpt2-tiny")).unwrap().load(&m, &KeyMap::gpt2()).unwrap();
    let store = ParamStore::new(&Device::shared().unwrap());
    store.insert_all(values.iter()).unwrap();
    for (prompt, want) in [("prompt", "greedy"), ("batch_prompt", "batch_greedy")] {
        let dims = r[prompt].shape().dims().to_vec();
        let (batch, len) = (dims[0], dims[1]);
        let flat = ints(&r[prompt]);
        let prompts: Vec<Vec<i32>> = flat.chunks(len).map(|c| c.to_vec()).collect();
        let mut g =
            Generator::new(&store, std::sync::Arc::new(m.clone()), batch, 64, CompileOptions::default()).unwrap();
        // Every layer's key and value caches are written where they lie, not copied, and the
        // step writes the new position's window alone.
        let step = g.decode_executable();
        assert_eq!(step.memory_plan().updated_in_place.len(), 2 * m.config.n_layer);
        let windows = step.stats().kernels.iter().filter(|k| k.windows).count();
        assert!((m.config.n_layer..=2 * m.config.n_layer).contains(&windows), "{windows} window kernels");
        let out = g.generate(&prompts, 32, &Sampling::greedy()).unwrap();
        let expect: Vec<Vec<i32>> = ints(&r[want]).chunks(len + 32).map(|c| c.to_vec()).collect();
        assert_eq!(out.tokens, expect, "{want}");
        assert_eq!(out.step_ms.len(), 31);
        assert!(out.tokens_per_s > 0.0);
    }
}

/// A GPT-2 with its byte-level BPE tokenizer (`gpt2-tiny-bpe`, made by
/// scripts/fixtures/make_bpe.py): Hugging Face's `tokenizers` reads the `tokenizer.json`
/// that `transformers` saved and gives the prompt's ids (merged: fewer tokens than bytes);
/// greedy generation gives `transformers`' 24 tokens, and they decode to its text.
#[test]
fn gpt2_with_its_bpe_tokenizer_writes_what_transformers_writes() {
    let dir = data().join("gpt2-tiny-bpe");
    let text = std::fs::read_to_string(data().join("gpt2-tiny-bpe-reference.json")).unwrap();
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<i32> {
        v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap() as i32).collect()
    };
    let tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let text = r["prompt"].as_str().unwrap();
    let prompt: Vec<i32> = tokenizer.encode(text, false).unwrap().get_ids().iter().map(|&i| i as i32).collect();
    assert_eq!(prompt, ids(&r["prompt_ids"]));
    assert!(prompt.len() * 3 < text.len() * 2, "{} tokens for {} bytes", prompt.len(), text.len());

    let config = Gpt2Config::from_json(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let m = Gpt2::new(&Scope::root(), config).unwrap();
    let store = ParamStore::new(&Device::shared().unwrap());
    store.insert_all(Checkpoint::open(&dir).unwrap().load(&m, &KeyMap::gpt2()).unwrap().iter()).unwrap();
    let want = ids(&r["generated_ids"]);
    // The model's whole length: the steps attend over their live part of the cache (64
    // positions, then all 96 where the generation passes 64).
    let max_seq = m.config.n_positions;
    let mut g = Generator::new(&store, std::sync::Arc::new(m.clone()), 1, max_seq, CompileOptions::default()).unwrap();
    let out = g.generate(std::slice::from_ref(&prompt), want.len(), &Sampling::greedy()).unwrap();
    assert_eq!(out.tokens[0][..prompt.len()], prompt[..]);
    assert_eq!(out.tokens[0][prompt.len()..], want[..]);
    let all: Vec<u32> = out.tokens[0].iter().map(|&i| i as u32).collect();
    assert_eq!(tokenizer.decode(&all, false).unwrap(), r["text"].as_str().unwrap());
}

/// Writes `tensors` as a safetensors file in a fresh directory and returns its path.
fn write(tag: &str, tensors: &BTreeMap<String, HostTensor>) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fusegraph-ckpt-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.safetensors");
    safetensors::write(&path, tensors.iter().map(|(k, v)| (k.as_str(), v))).unwrap();
    path
}

#[test]
fn bad_checkpoints_are_typed_errors_and_change_nothing() {
    let r = reference();
    let (_, store) = logits("gpt2-tiny", &r["prompt"]);
    let before = store.read_all().unwrap();
    let m = model();
    let good = Checkpoint::open(&data().join("gpt2-tiny")).unwrap();
    let raw: BTreeMap<String, HostTensor> =
        good.keys().into_iter().map(|k| (k.clone(), good.tensor(&k).unwrap())).collect();
    let try_load = |path: &Path| -> Result<(), NnError> {
        let values = Checkpoint::open(path)?.load(&m, &KeyMap::gpt2())?;
        store.insert_all(values.iter()).map_err(|e| NnError::Config(e.to_string()))
    };

    let mut missing = raw.clone();
    missing.remove("transformer.h.1.mlp.c_fc.bias");
    match try_load(&write("missing", &missing)) {
        Err(NnError::MissingKey { param, .. }) => assert_eq!(param, "h.1.mlp.c_fc.bias"),
        other => panic!("expected MissingKey, got {other:?}"),
    }
    let mut wrong = raw.clone();
    wrong.insert("transformer.wpe.weight".into(), HostTensor::new([32, 32], vec![0.0f32; 1024]).unwrap());
    let err = try_load(&write("shape", &wrong)).unwrap_err();
    assert!(matches!(&err, NnError::KeyShape { key, .. } if key == "transformer.wpe.weight"), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("f32[32,32]") && msg.contains("f32[64,32]"), "{msg}");
    let mut extra = raw.clone();
    extra.insert("transformer.h.0.attn.q_proj.weight".into(), HostTensor::new([2], vec![0.0f32; 2]).unwrap());
    let err = try_load(&write("unknown", &extra)).unwrap_err();
    assert!(matches!(&err, NnError::UnknownKey { key, .. } if key == "transformer.h.0.attn.q_proj.weight"), "{err}");

    // A dtype fusegraph does not read, named by its key.
    let path = write("dtype", &raw);
    let bytes = std::fs::read(&path).unwrap();
    let f64_bytes = [0u8; 8 * 32];
    let mut views: Vec<(String, ::safetensors::tensor::TensorView)> = Vec::new();
    let st = ::safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for (k, v) in st.tensors() {
        if k == "transformer.ln_f.bias" {
            views.push((
                k,
                ::safetensors::tensor::TensorView::new(::safetensors::Dtype::F64, vec![32], &f64_bytes).unwrap(),
            ));
        } else {
            views.push((k, v));
        }
    }
    std::fs::write(&path, ::safetensors::serialize(views, None).unwrap()).unwrap();
    let err = try_load(&path).unwrap_err().to_string();
    assert!(err.contains("transformer.ln_f.bias") && err.contains("F64"), "{err}");

    // A truncated file: an error naming it, at open.
    let path = write("truncated", &raw);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = try_load(&path).unwrap_err().to_string();
    assert!(err.contains("model.safetensors"), "{err}");

    assert_eq!(store.read_all().unwrap(), before, "nothing was half loaded");
}

#[test]
fn a_torchvision_resnet18_gives_torchvisions_logits() {
    use fusegraph::nn::TorchvisionResNet;
    let dir = data();
    let r = safetensors::read(&dir.join("resnet18-narrow-reference.safetensors")).unwrap();
    let m = TorchvisionResNet::new(&Scope::root(), [8, 16, 32, 64], [2, 2, 2, 2], 10).unwrap();
    let values = Checkpoint::open(&dir.join("resnet18-narrow")).unwrap().load(&m, &KeyMap::torchvision()).unwrap();
    assert_eq!(values["fc.weight"].shape().dims(), &[64, 10], "torch's [out, in] transposed");
    let store = ParamStore::new(&Device::shared().unwrap());
    store.insert_all(values.iter()).unwrap();
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 3, 64, 64]).unwrap();
    let y = m.forward(&x).unwrap();
    let exe = store.compile(&b.graph(), &[y.id()], &CompileOptions::default()).unwrap();
    let got = exe.run(&[(&x, &r["input"])]).unwrap().remove(0);
    let scale = r["logits"].to_f64().iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let d = max_diff(&got, &r["logits"]);
    assert!(d < 1e-4 * scale.max(1.0), "logits differ by {d} (scale {scale})");
}
