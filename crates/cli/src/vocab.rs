//! Tokenizers from a GGUF file's `tokenizer.ggml.*` metadata, built on `tokenizers` to cut
//! text as llama.cpp cuts it: a byte-level BPE (`gpt2` model) behind one of llama.cpp's
//! pre-tokenizer types, or a SentencePiece BPE (`llama` model).

use tokenizers::Tokenizer;

/// A pre-tokenizer type of llama.cpp (`llama-vocab.cpp`): the `tokenizer.ggml.pre` names a
/// file gives it, its regexes — each cuts every piece of the one before into its matches and
/// the text between them —, and whether a piece that is a token is taken whole before any
/// merge (`ignore_merges`). The regexes are the models' own `tokenizer.json` splits where one
/// is behind the name (llama.cpp rewrites some for its engine; they cut the same pieces).
struct PreTokenizer {
    names: &'static [&'static str],
    splits: &'static [&'static str],
    ignore_merges: bool,
}

/// GPT-2's split (`ByteLevel`'s own regex).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Every type read: Llama 3's, Qwen2's (digits one at a time), GPT-2's, SmolLM's and
/// StarCoder's (GPT-2's after each digit alone), Mistral's Tekken (words split at case
/// changes), GPT-4o's (Tekken's with contractions and digits in threes), DeepSeek-V3's,
/// DeepSeek LLM's (V2's) and DeepSeek Coder's, and llama.cpp's `default`.
const PRE_TOKENIZERS: &[PreTokenizer] = &[
    PreTokenizer {
        names: &["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"],
        splits: &[LLAMA3],
        ignore_merges: true,
    },
    PreTokenizer { names: &["dbrx", "smaug-bpe"], splits: &[LLAMA3], ignore_merges: false },
    PreTokenizer {
        names: &["qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2", "hunyuan", "grok-2"],
        splits: &[
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        ignore_merges: false,
    },
    PreTokenizer {
        names: &[
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
            "exaone4",
        ],
        splits: &[GPT2],
        ignore_merges: false,
    },
    PreTokenizer {
        names: &["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"],
        splits: &[r"\p{N}", GPT2],
        ignore_merges: false,
    },
    PreTokenizer {
        names: &["tekken"],
        splits: &[concat!(
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
            r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
            r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        )],
        ignore_merges: true,
    },
    PreTokenizer {
        names: &["gpt-4o", "llama4", "minimax-m2"],
        splits: &[concat!(
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
            r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
            r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        )],
        ignore_merges: false,
    },
    PreTokenizer {
        names: &["deepseek-v3", "hunyuan-dense"],
        splits: &[
            r"\p{N}{1,3}",
            "[一-龥぀-ゟ゠-ヿ]+",
            concat!(
                r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"##,
                r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            ),
        ],
        ignore_merges: false,
    },
    PreTokenizer {
        names: &["deepseek-llm"],
        splits: &["[\r\n]", DEEPSEEK_LLM_LETTERS, DEEPSEEK_LLM_PUNCTUATION, r"\s+$", DEEPSEEK_CJK, r"\p{N}+"],
        ignore_merges: false,
    },
    PreTokenizer {
        names: &["deepseek-coder"],
        splits: &["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", DEEPSEEK_CJK, r"\p{N}"],
        ignore_merges: false,
    },
    PreTokenizer {
        names: &["default"],
        splits: &[
            r"[\p{P}\$\+<=>\^~\|]+",
            r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
            r"\p{N}+",
            "[0-9][0-9][0-9]",
        ],
        ignore_merges: false,
    },
];

/// DeepSeek LLM's (V2's) word split: an optional space, then letters of the cased scripts.
const DEEPSEEK_LLM_LETTERS: &str = concat!(
    "\\s?[A-Za-z\u{b5}\u{c0}-\u{d6}\u{d8}-\u{f6}\u{f8}-\u{1ba}\u{1bc}-\u{1bf}\u{1c4}-\u{293}",
    "\u{295}-\u{2af}\u{370}-\u{373}\u{376}\u{377}\u{37b}-\u{37d}\u{37f}\u{386}\u{388}-\u{38a}",
    "\u{38c}\u{38e}-\u{3a1}\u{3a3}-\u{3f5}\u{3f7}-\u{481}\u{48a}-\u{52f}\u{531}-\u{556}",
    "\u{10a0}-\u{10c5}\u{13a0}-\u{13f5}\u{13f8}-\u{13fd}\u{1c90}-\u{1cba}\u{1cbd}-\u{1cbf}",
    "\u{1d00}-\u{1d2b}\u{1d6b}-\u{1d77}\u{1d79}-\u{1d9a}\u{1e00}-\u{1f15}\u{1f18}-\u{1f1d}",
    "\u{1f20}-\u{1f45}\u{1f48}-\u{1f4d}\u{1f50}-\u{1f57}\u{1f59}\u{1f5b}\u{1f5d}",
    "\u{1f5f}-\u{1f7d}\u{1f80}-\u{1fb4}\u{1fb6}-\u{1fbc}\u{1fbe}\u{1fc2}-\u{1fc4}",
    "\u{1fc6}-\u{1fcc}\u{1fd0}-\u{1fd3}\u{1fd6}-\u{1fdb}\u{1fe0}-\u{1fec}\u{1ff2}-\u{1ff4}",
    "\u{1ff6}-\u{1ffc}\u{2102}\u{2107}\u{210a}-\u{2113}\u{2115}\u{2119}-\u{211d}\u{2124}",
    "\u{2126}\u{2128}\u{212a}-\u{212d}\u{212f}-\u{2134}\u{2139}\u{213c}-\u{213f}",
    "\u{2145}-\u{2149}\u{214e}\u{2183}\u{2184}\u{2c00}-\u{2c7b}\u{2c7e}-\u{2ce4}",
    "\u{2ceb}-\u{2cee}\u{2cf2}\u{2cf3}\u{a640}-\u{a66d}\u{a680}-\u{a69b}\u{a722}-\u{a76f}",
    "\u{a771}-\u{a787}\u{a78b}-\u{a78e}\u{ab70}-\u{abbf}\u{fb00}-\u{fb06}\u{fb13}-\u{fb17}",
    "\u{ff21}-\u{ff3a}\u{ff41}-\u{ff5a}\u{10400}-\u{1044f}\u{104b0}-\u{104d3}",
    "\u{104d8}-\u{104fb}\u{10c80}-\u{10cb2}\u{10cc0}-\u{10cf2}\u{118a0}-\u{118df}",
    "\u{1e900}-\u{1e943}]+",
);

/// DeepSeek LLM's punctuation split: an optional space, then ASCII and full-width punctuation.
const DEEPSEEK_LLM_PUNCTUATION: &str =
    "\\s?[!-/:-~\u{ff01}-\u{ff0f}\u{ff1a}-\u{ff5e}\u{2018}-\u{201f}\u{3000}-\u{3002}]+";

/// DeepSeek's CJK split (its LLM's and Coder's).
const DEEPSEEK_CJK: &str = "[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+";

/// Llama 3's split.
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer a `tokenizer.ggml.pre` name (GPT-2's where there is none) gives, with its
/// `ignore_merges`. An error names the types read.
fn pre_tokenizer(pre: Option<&str>) -> Result<(tokenizers::PreTokenizerWrapper, bool), String> {
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::sequence::Sequence;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    use tokenizers::SplitDelimiterBehavior;
    let name = pre.unwrap_or("gpt-2");
    let Some(p) = PRE_TOKENIZERS.iter().find(|p| p.names.contains(&name)) else {
        let firsts: Vec<&str> = PRE_TOKENIZERS.iter().map(|p| p.names[0]).collect();
        return Err(format!("`{name}` is not read ({} and the other names of their types are)", firsts.join(", ")));
    };
    let mut parts = Vec::new();
    for r in p.splits {
        let split = Split::new(SplitPattern::Regex(r.to_string()), SplitDelimiterBehavior::Isolated, false);
        parts.push(split.map_err(|e| format!("`{name}`: {e}"))?.into());
    }
    parts.push(ByteLevel::new(false, true, false).into());
    Ok((Sequence::new(parts).into(), p.ignore_merges))
}

/// A byte-level BPE from GGUF metadata: `tokens` in id order, `merges`, and the pre-tokenizer
/// type named by `pre` ([`PRE_TOKENIZERS`]). An error names the key.
pub fn byte_level_bpe(
    tokens: &[String],
    merges: Vec<(String, String)>,
    pre: Option<&str>,
) -> Result<Tokenizer, (&'static str, String)> {
    use tokenizers::models::bpe::{Vocab, BPE};
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    let (pre, ignore_merges) = pre_tokenizer(pre).map_err(|e| ("pre", e))?;
    let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let bpe = BPE::builder().vocab_and_merges(vocab, merges).ignore_merges(ignore_merges);
    let mut tokenizer = Tokenizer::new(bpe.build().map_err(|e| ("merges", e.to_string()))?);
    tokenizer.with_pre_tokenizer(Some(pre));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    Ok(tokenizer)
}

/// A SentencePiece BPE from GGUF metadata (`tokens`, their `scores` and `types`), as
/// `transformers` converts Llama 2's `tokenizer.model`: the text's spaces as `▁` (one before
/// each text segment where `prefix`, llama.cpp's `add_space_prefix`), merges ranked by the
/// merged piece's score (each piece's splits into two pieces, by their ids), characters
/// without a piece as their UTF-8 bytes' `<0xXX>` tokens; decoded back the same way.
pub fn sentencepiece_bpe(
    tokens: &[String],
    scores: &[f64],
    types: &[u64],
    prefix: bool,
) -> Result<Tokenizer, (&'static str, String)> {
    use tokenizers::decoders::{byte_fallback::ByteFallback, fuse::Fuse, sequence::Sequence, strip::Strip};
    use tokenizers::models::bpe::{Vocab, BPE};
    use tokenizers::normalizers::{Prepend, Replace};
    use tokenizers::{DecoderWrapper, NormalizerWrapper};
    let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let mut merges: Vec<(f64, u32, u32)> = Vec::new();
    for (piece, &score) in tokens.iter().zip(scores) {
        let mut splits: Vec<(f64, u32, u32)> = piece
            .char_indices()
            .skip(1)
            .filter_map(|(i, _)| Some((score, *vocab.get(&piece[..i])?, *vocab.get(&piece[i..])?)))
            .collect();
        splits.sort_by_key(|&(_, l, r)| (l, r));
        merges.extend(splits);
    }
    // Highest score first; a stable sort keeps each score's merges in the order above.
    merges.sort_by(|a, b| b.0.total_cmp(&a.0));
    let merges = merges.into_iter().map(|(_, l, r)| (tokens[l as usize].clone(), tokens[r as usize].clone())).collect();
    let mut bpe = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true).fuse_unk(true);
    if let Some(unk) = types.iter().position(|&t| t == 2) {
        bpe = bpe.unk_token(tokens[unk].clone());
    }
    let mut tokenizer = Tokenizer::new(bpe.build().map_err(|e| ("scores", e.to_string()))?);
    let space = || Replace::new(" ", "▁").map_err(|e| ("model", e.to_string()));
    let normalizer: NormalizerWrapper = match prefix {
        true => tokenizers::normalizers::Sequence::new(vec![Prepend::new("▁".into()).into(), space()?.into()]).into(),
        false => space()?.into(),
    };
    tokenizer.with_normalizer(Some(normalizer));
    let back = Replace::new("▁", " ").map_err(|e| ("model", e.to_string()))?;
    let mut decoders: Vec<DecoderWrapper> = vec![back.into(), ByteFallback::new().into(), Fuse::new().into()];
    if prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tokenizer.with_decoder(Some(Sequence::new(decoders)));
    Ok(tokenizer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer as _};

    /// Every name of `tests/data/pretokenizers.json` (each type's `tokenizer.ggml.pre` names, as
    /// llama.cpp reads them) cuts the texts — contractions, digit runs, new lines, case changes,
    /// accents, CJK, emoji, other scripts' digits — into the pieces HF `tokenizers` cuts them into
    /// with the models' own `tokenizer.json` pre-tokenizers, and every name of the table is there.
    #[test]
    fn gguf_pre_tokenizers_cut_text_as_the_models_tokenizers_do() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/pretokenizers.json");
        let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let texts: Vec<&str> = r["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
        let mut seen = Vec::new();
        for group in r["groups"].as_array().unwrap() {
            for name in group["names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()) {
                let (pre, _) = pre_tokenizer(Some(name)).unwrap();
                for (text, want) in texts.iter().zip(group["pieces"].as_array().unwrap()) {
                    let mut s = PreTokenizedString::from(*text);
                    pre.pre_tokenize(&mut s).unwrap();
                    let got: Vec<&str> = s
                        .get_splits(OffsetReferential::Original, OffsetType::Byte)
                        .into_iter()
                        .map(|(piece, _, _)| piece)
                        .collect();
                    let want: Vec<&str> = want.as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
                    assert_eq!(got, want, "{name}: {text:?}");
                }
                seen.push(name.to_string());
            }
        }
        for name in PRE_TOKENIZERS.iter().flat_map(|p| p.names) {
            assert!(seen.iter().any(|s| s == name), "{name} is not in the fixture");
        }
        let err = pre_tokenizer(Some("chameleon")).err().unwrap();
        assert!(err.contains("`chameleon` is not read") && err.contains("tekken"), "{err}");
    }

    /// A byte-level BPE vocabulary (`tests/data/gguf/bpe-vocab.gguf`) under each
    /// `tokenizer.ggml.pre` name gives the texts the ids llama.cpp gives them
    /// (`bpe-pre-llama-cpp.json`, from `scripts/fixtures/llama_cpp_reference.py pre`).
    #[test]
    fn gguf_byte_level_tokenizers_give_llama_cpp_ids() {
        use fusegraph::nn::gguf::{Gguf, GgufValue};
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/gguf");
        let gguf = Gguf::open(&dir.join("bpe-vocab.gguf")).unwrap();
        let strings = |k: &str| -> Vec<String> {
            let Some(GgufValue::Array(v)) = gguf.metadata().get(k) else { panic!("{k}") };
            v.iter().map(|s| s.as_str().unwrap().to_string()).collect()
        };
        let tokens = strings("tokenizer.ggml.tokens");
        let merges: Vec<(String, String)> = strings("tokenizer.ggml.merges")
            .iter()
            .map(|m| m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())).unwrap())
            .collect();
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("bpe-pre-llama-cpp.json")).unwrap()).unwrap();
        let texts: Vec<&str> = r["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
        let names = r["ids"].as_object().unwrap();
        assert_eq!(names.len(), PRE_TOKENIZERS.iter().map(|p| p.names.len()).sum::<usize>());
        for (name, cases) in names {
            let tokenizer = byte_level_bpe(&tokens, merges.clone(), Some(name)).unwrap();
            for (text, want) in texts.iter().zip(cases.as_array().unwrap()) {
                let got = tokenizer.encode(*text, false).unwrap().get_ids().to_vec();
                let want: Vec<u32> = want.as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32).collect();
                assert_eq!(got, want, "{name}: {text:?}");
            }
        }
    }

    /// Where llama.cpp takes a piece that is a token whole (Llama 3's and Tekken's types), it
    /// is one token even when the merges would not build it; elsewhere the merges decide.
    #[test]
    fn llama3_type_takes_a_whole_word_token_before_merges() {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "abc"].iter().map(|t| t.to_string()).collect();
        let merges = vec![("a".to_string(), "b".to_string())];
        let ids = |pre: &str| {
            let t = byte_level_bpe(&tokens, merges.clone(), Some(pre)).unwrap();
            t.encode("abc", false).unwrap().get_ids().to_vec()
        };
        assert_eq!(ids("llama-bpe"), vec![4]);
        assert_eq!(ids("tekken"), vec![4]);
        assert_eq!(ids("qwen2"), vec![3, 2]);
        assert_eq!(ids("smaug-bpe"), vec![3, 2]);
    }
}
