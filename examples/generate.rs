//! Generates text with GPT-2 and a KV cache on the device: a Hugging Face checkpoint
//! directory (`config.json` and `model.safetensors`, or a sharded index), or random weights
//! of any GPT-2 shape (GPT-2 small's by default). Prints the text (through the directory's
//! tokenizer, else one byte per token id below 256), tokens per second,
//! and the decode step's time at chosen positions: flat, since a step attends to the whole
//! cache under a mask whatever the position.
//!
//! `cargo run --release --example generate -- [--model DIR | --random] [--prompt TEXT]
//! [--tokens N] [--batch B] [--temperature T] [--top-k K] [--top-p P] [--seed S]
//! [--max-seq M] [--report-at 16,128,512] [--json PATH]`
//!
//! The prompt is encoded by the directory's byte-level BPE tokenizer (Hugging Face
//! `tokenizers`: its `tokenizer.json`, else `vocab.json` and `merges.txt` as GPT-2 has them);
//! without one (random weights) one byte per token.

use clap::Parser;
use fusegraph::generate::{Generator, Sampling};
use fusegraph::nn::{Checkpoint, Gpt2, Gpt2Config, KeyMap, Params, Scope};
use fusegraph::{CompileOptions, Device, ParamStore};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tokenizers::Tokenizer;

/// GPT-2 text generation with a KV cache on the device.
#[derive(Parser)]
struct Args {
    /// A Hugging Face GPT-2 directory [default: the tiny test checkpoint with its BPE
    /// tokenizer].
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Random weights of the shape below instead of a checkpoint.
    #[arg(long)]
    random: bool,
    /// Random model: vocabulary.
    #[arg(long, default_value_t = 50257)]
    vocab: usize,
    /// Random model: positions.
    #[arg(long, default_value_t = 1024)]
    n_positions: usize,
    /// Random model: width.
    #[arg(long, default_value_t = 768)]
    n_embd: usize,
    /// Random model: blocks.
    #[arg(long, default_value_t = 12)]
    n_layer: usize,
    /// Random model: heads.
    #[arg(long, default_value_t = 12)]
    n_head: usize,
    /// The prompt.
    #[arg(long, default_value = "The quick brown fox")]
    prompt: String,
    /// New tokens per sequence.
    #[arg(long, default_value_t = 32)]
    tokens: usize,
    /// Sequences generated at once (each from the prompt).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Keep the K most likely tokens.
    #[arg(long, value_name = "K")]
    top_k: Option<usize>,
    /// Keep the most likely tokens up to probability P.
    #[arg(long, value_name = "P")]
    top_p: Option<f64>,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Cache length [default: prompt + tokens].
    #[arg(long, value_name = "M")]
    max_seq: Option<usize>,
    /// Positions at which to report the decode step's time (median of the steps within 8).
    #[arg(long, value_delimiter = ',', default_value = "16,128,512")]
    report_at: Vec<usize>,
    /// Decode steps run once before the timed generation (first dispatches, hoisted kernels).
    #[arg(long, default_value_t = 16)]
    warmup: usize,
    /// Write the figures as JSON to PATH.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
}

/// GPT-2's byte-level symbols: byte `b` is the character `bytes_to_unicode()[b]`.
/// The byte-level BPE tokenizer of a Hugging Face GPT-2 directory: `tokenizer.json`, else
/// `vocab.json` with `merges.txt` and GPT-2's byte-level pre-tokenizer and decoder; `None`
/// where it has neither.
fn tokenizer(dir: &Path) -> Result<Option<Tokenizer>, Box<dyn std::error::Error>> {
    use tokenizers::decoders::byte_level::ByteLevel;
    use tokenizers::models::bpe::BPE;
    let json = dir.join("tokenizer.json");
    if json.exists() {
        return Ok(Some(Tokenizer::from_file(&json).map_err(|e| format!("{}: {e}", json.display()))?));
    }
    let (vocab, merges) = (dir.join("vocab.json"), dir.join("merges.txt"));
    if !vocab.exists() || !merges.exists() {
        return Ok(None);
    }
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let bpe = BPE::from_file(&path(&vocab), &path(&merges)).build().map_err(|e| format!("{}: {e}", vocab.display()))?;
    let mut t = Tokenizer::new(bpe);
    t.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    t.with_decoder(Some(ByteLevel::default()));
    Ok(Some(t))
}

fn main() {
    let args = Args::parse();
    fusegraph::init_logging();
    if let Err(e) = run(args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::shared()?;
    let store = ParamStore::new(&device);
    let (model, tokenizer) = if args.random {
        let c = Gpt2Config {
            vocab_size: args.vocab,
            n_positions: args.n_positions,
            n_embd: args.n_embd,
            n_layer: args.n_layer,
            n_head: args.n_head,
            layer_norm_epsilon: 1e-5,
        };
        let model = Gpt2::new(&Scope::root(), c)?;
        store.insert_all(Params::of(&model, args.seed)?.iter())?;
        (model, None)
    } else {
        let dir = args
            .model
            .clone()
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/checkpoints/gpt2-tiny-bpe"));
        let model =
            Gpt2::new(&Scope::root(), Gpt2Config::from_json(&std::fs::read_to_string(dir.join("config.json"))?)?)?;
        store.insert_all(Checkpoint::open(&dir)?.load(&model, &KeyMap::gpt2())?.iter())?;
        (model, tokenizer(&dir)?)
    };
    let c = model.config;
    // Tokens: the tokenizer's, else one per byte.
    let prompt: Vec<i32> = match &tokenizer {
        Some(t) => t
            .encode(args.prompt.as_str(), false)
            .map_err(|e| e.to_string())?
            .get_ids()
            .iter()
            .map(|&i| i as i32)
            .collect(),
        None => args.prompt.bytes().map(|b| b as i32 % c.vocab_size as i32).collect(),
    };
    let decode = |ids: &[i32]| -> Result<String, Box<dyn std::error::Error>> {
        Ok(match &tokenizer {
            Some(t) => {
                t.decode(&ids.iter().map(|&i| i as u32).collect::<Vec<_>>(), false).map_err(|e| e.to_string())?
            }
            None => {
                String::from_utf8_lossy(&ids.iter().map(|&i| i.clamp(0, 255) as u8).collect::<Vec<_>>()).into_owned()
            }
        })
    };
    let max_seq = args.max_seq.unwrap_or(prompt.len() + args.tokens).min(c.n_positions);
    println!(
        "GPT-2 {} blocks × width {} × {} heads, vocabulary {}, {} parameters, on {}",
        c.n_layer,
        c.n_embd,
        c.n_head,
        c.vocab_size,
        fusegraph::nn::Module::num_elements(&model),
        device.describe()
    );
    let mut generator =
        Generator::new(&store, std::sync::Arc::new(model.clone()), args.batch, max_seq, CompileOptions::default())?;
    let sampling = Sampling { temperature: args.temperature, top_k: args.top_k, top_p: args.top_p, seed: args.seed };
    let prompts = vec![prompt.clone(); args.batch];
    if args.warmup > 0 {
        generator.generate(&prompts, args.warmup.min(max_seq - prompt.len()), &sampling)?;
    }
    let out = generator.generate(&prompts, args.tokens, &sampling)?;
    for (i, seq) in out.tokens.iter().enumerate() {
        println!("[{i}] {:?}", decode(seq)?);
    }
    println!("prefill       {:.2} ms ({} tokens × {})", out.prefill_ms, prompt.len(), args.batch);
    println!("decode        {:.1} tokens/s ({} steps × batch {})", out.tokens_per_s, out.step_ms.len(), args.batch);
    // Step i wrote position prompt + i.
    let at = |pos: usize| -> Option<f64> {
        let mut v: Vec<f64> = (pos.saturating_sub(8)..=pos + 8)
            .filter_map(|p| p.checked_sub(prompt.len()).and_then(|i| out.step_ms.get(i)).copied())
            .collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let mut report = BTreeMap::new();
    for &pos in &args.report_at {
        if let Some(ms) = at(pos) {
            println!("step at {pos:>4}  {ms:.3} ms");
            report.insert(pos.to_string(), ms);
        }
    }
    if let Some(path) = args.json {
        let json = serde_json::json!({
            "device": device.describe(),
            "n_layer": c.n_layer, "n_embd": c.n_embd, "n_head": c.n_head, "vocab_size": c.vocab_size,
            "batch": args.batch, "prompt_tokens": prompt.len(), "new_tokens": args.tokens, "max_seq": max_seq,
            "prefill_ms": out.prefill_ms, "tokens_per_s": out.tokens_per_s, "step_ms_at": report,
            "step_ms": out.step_ms,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&json)? + "\n")?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
