//! The decoder of a multimodal checkpoint (`Gemma3ForConditionalGeneration`: the config's
//! `text_config`, the checkpoint's `language_model.` keys beside a vision tower that is not
//! read) gives the logits `transformers` gives for text alone.

mod common;

use common::{checkpoints, prefill_logits, reference, relative_error};
use fusegraph_nn::llama::Architecture;
use fusegraph_nn::{LlamaConfig, Pretrained, Quantize};

#[test]
fn a_multimodal_checkpoints_decoder_gives_transformers_text_logits() {
    let dir = checkpoints();
    let text = std::fs::read_to_string(dir.join("gemma3-mm-tiny/config.json")).unwrap();
    let c = LlamaConfig::from_json(&text).unwrap();
    assert_eq!((c.architecture, c.multimodal, c.num_hidden_layers), (Architecture::Gemma3, true, 3));
    let loaded = Pretrained::load(&dir.join("gemma3-mm-tiny"), None, Quantize::AsStored).unwrap();
    let decoder =
        |k: &String| k.starts_with("model.layers.") || k.starts_with("model.embed") || k == "model.norm.weight";
    assert!(loaded.params.keys().all(decoder));
    let (prompt, want) = reference(&dir.join("gemma3-mm-tiny-reference.json"));
    let err = relative_error(&prefill_logits(&loaded, &prompt), &want);
    assert!(err < 1e-4, "logits {err:.2e} from transformers'");
}
