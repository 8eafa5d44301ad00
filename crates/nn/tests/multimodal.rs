//! The decoder of a multimodal checkpoint (`Gemma3ForConditionalGeneration`,
//! `Mistral3ForConditionalGeneration`: the config's `text_config`, the checkpoint's
//! `language_model.` keys beside a vision tower that is not read, the head tied as the outer
//! config says) gives the logits `transformers` gives for text alone.

mod common;

use common::{checkpoints, prefill_logits, reference, relative_error};
use fusegraph_nn::llama::Architecture;
use fusegraph_nn::{LlamaConfig, Pretrained, Quantize};

#[test]
fn a_multimodal_checkpoints_decoder_gives_transformers_text_logits() {
    let dir = checkpoints();
    for (name, architecture, layers) in
        [("gemma3-mm-tiny", Architecture::Gemma3, 3), ("mistral3-mm-tiny", Architecture::Mistral, 2)]
    {
        let text = std::fs::read_to_string(dir.join(name).join("config.json")).unwrap();
        let c = LlamaConfig::from_json(&text).unwrap();
        assert_eq!((c.architecture, c.multimodal, c.num_hidden_layers), (architecture, true, layers), "{name}");
        // Mistral 3's `text_config` says its head is its own; the outer config ties it.
        assert!(c.tie_word_embeddings, "{name}");
        let loaded = Pretrained::load(&dir.join(name), None, Quantize::AsStored).unwrap();
        let decoder =
            |k: &String| k.starts_with("model.layers.") || k.starts_with("model.embed") || k == "model.norm.weight";
        assert!(loaded.params.keys().all(decoder), "{name}");
        let (prompt, want) = reference(&dir.join(format!("{name}-reference.json")));
        let err = relative_error(&prefill_logits(&loaded, &prompt), &want);
        assert!(err < 1e-4, "{name}: logits {err:.2e} from transformers'");
    }
}
