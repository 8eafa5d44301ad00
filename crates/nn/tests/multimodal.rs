//! The decoder of a multimodal checkpoint (`Gemma3ForConditionalGeneration`: the config's
//! `text_config`, the checkpoint's `language_model.` keys beside a vision tower that is not
//! read) gives the logits `transformers` gives for text alone.

use fusegraph_ir::{DType, GraphBuilder, HostTensor};
use fusegraph_nn::llama::Architecture;
use fusegraph_nn::{LlamaConfig, Pretrained, Quantize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

#[test]
fn a_multimodal_checkpoints_decoder_gives_transformers_text_logits() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/checkpoints");
    let text = std::fs::read_to_string(dir.join("gemma3-mm-tiny/config.json")).unwrap();
    let c = LlamaConfig::from_json(&text).unwrap();
    assert_eq!((c.architecture, c.multimodal, c.num_hidden_layers), (Architecture::Gemma3, true, 3));
    let loaded = Pretrained::load(&dir.join("gemma3-mm-tiny"), None, Quantize::AsStored).unwrap();
    assert!(loaded
        .params
        .keys()
        .all(|k| k.starts_with("model.layers.") || k.starts_with("model.embed") || k == "model.norm.weight"));
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("gemma3-mm-tiny-reference.json")).unwrap()).unwrap();
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
    let feeds = BTreeMap::from([("ids".to_string(), HostTensor::new([1, prompt.len()], prompt.clone()).unwrap())]);
    let got = fusegraph_reference::evaluate(&b.graph(), &[logits.id()], &feeds, &loaded.params).unwrap()[0].to_f64();
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let err = got.iter().zip(&want).fold(0.0f64, |m, (a, b)| m.max((a - b).abs())) / scale;
    assert!(err < 1e-4, "logits {err:.2e} from transformers'");
}
