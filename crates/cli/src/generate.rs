//! `fusegraph generate`: text from a Hugging Face model directory (GPT-2 or a Llama-family
//! model), its tokenizer and its chat template, or from random weights of any config's
//! shapes.

use crate::vocab;
use clap::Args;
use fusegraph::generate::{Generator, Sampling};
use fusegraph::nn::{Pretrained, Quantize};
use fusegraph::{CompileOptions, DType, Device, ParamStore};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tokenizers::Tokenizer;

/// Generates text with a KV cache on the device: a prompt (or a chat) in, tokens streamed
/// to stdout as they are chosen.
#[derive(Args)]
pub struct GenerateArgs {
    /// A Hugging Face model directory: `config.json`, `model.safetensors` (or a sharded
    /// index), `tokenizer.json` and `tokenizer_config.json`.
    #[arg(long, value_name = "DIR", required_unless_present = "random_config", conflicts_with = "random_config")]
    model: Option<PathBuf>,
    /// Random weights of the shapes a `config.json` gives (no tokenizer: give
    /// `--prompt-ids`).
    #[arg(long, value_name = "FILE.json")]
    random_config: Option<PathBuf>,
    /// The prompt's text (encoded by the directory's tokenizer, with its special tokens).
    #[arg(long, conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// The prompt as token ids.
    #[arg(long, value_delimiter = ',', value_name = "ID,ID,…")]
    prompt_ids: Option<Vec<i32>>,
    /// Wrap `--prompt` as a user message in the model's chat template (with
    /// `add_generation_prompt`), as `apply_chat_template` renders it.
    #[arg(long, requires = "prompt")]
    chat: bool,
    /// A system message before the user's (with `--chat`).
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// New tokens at most (fewer where an end-of-sequence token comes).
    #[arg(long, default_value_t = 64)]
    tokens: usize,
    /// 0: greedy; otherwise the logits are divided by it and sampled.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Sample from the k most likely tokens.
    #[arg(long)]
    top_k: Option<usize>,
    /// Sample from the smallest set of tokens whose probability reaches p.
    #[arg(long)]
    top_p: Option<f64>,
    /// The parameters' storage dtype on the device: f32, f16 or bf16 (computed in f32 either
    /// way; default: the checkpoint's, as its config names it; f32 for a GGUF file's).
    #[arg(long)]
    dtype: Option<DType>,
    /// The matrices' block type on the device: `q8_0`, `q4_0`, `q5_0`, `q4_1` or `q5_1` (quantized on load by
    /// llama.cpp's round-to-nearest), or `none` (a GGUF file's blocks dequantized). Default:
    /// as the file stores them.
    #[arg(long, value_parser = parse_quantize)]
    quantize: Option<Quantize>,
    /// The sampling seed (and the random weights' seed).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Sequences generated together (each from the prompt).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// The cache's length (default: prompt plus new tokens).
    #[arg(long)]
    max_seq: Option<usize>,
    /// Generate this many tokens first, untimed and not shown (the driver's first-run work
    /// out of the figures).
    #[arg(long, default_value_t = 0)]
    warmup: usize,
    /// Do not stop at the config's end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Write prompt ids, generated ids, text, prefill ms and decode tokens/s as JSON.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Positions at which to report the decode step: its kernels, the bytes they move (the
    /// step compiled for that position's cache length) and its time (the median of the
    /// steps within 8 positions).
    #[arg(long, value_delimiter = ',', value_name = "POS,POS,…")]
    report_at: Vec<usize>,
    /// Time each kernel of the decode step at every `--report-at` position (else at the last
    /// position generated) over RUNS runs: the kernels grouped by label, form and workgroups,
    /// slowest first, with their bytes and rates (and every kernel in `--json`).
    #[arg(long, value_name = "RUNS")]
    profile: Option<usize>,
    /// Read each decode step's ids back before submitting the next (the device waits for the
    /// host between steps) instead of feeding them on the device to a step already
    /// submitted: for comparison; the tokens are the same. (A CPU adapter, whose submit
    /// runs the work, always does.)
    #[arg(long)]
    no_overlap: bool,
    /// Compile the prefill and decode steps with `CompileOptions::fused_attention` always on:
    /// scores, softmax and the weighted sum in one kernel per layer.
    #[arg(long)]
    fused_attention: bool,
    /// Continuous batching: generate `--tokens` after every prompt of FILE (a line each: text
    /// for the model's tokenizer, or comma-separated ids) through `--batch` rows, each
    /// sequence joining as a row frees and leaving at its end (`--prompt` not needed).
    #[arg(long, value_name = "FILE")]
    queue: Option<PathBuf>,
}

/// A model directory's tokenizer and chat template.
struct Text {
    tokenizer: Tokenizer,
    /// `chat_template` of `tokenizer_config.json`, else `chat_template.jinja`.
    template: Option<String>,
    bos: Option<String>,
    eos: Option<String>,
}

/// A special token of `tokenizer_config.json`: a string or `{"content": …}`.
fn special(config: &serde_json::Value, key: &str) -> Option<String> {
    let v = config.get(key)?;
    v.as_str().or_else(|| v.get("content").and_then(|c| c.as_str())).map(str::to_string)
}

impl Text {
    fn open(dir: &Path) -> Result<Text, String> {
        let path = dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let config_path = dir.join("tokenizer_config.json");
        let config: serde_json::Value = match std::fs::read_to_string(&config_path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| format!("{}: {e}", config_path.display()))?,
            Err(_) => serde_json::Value::Null,
        };
        let template = match config.get("chat_template") {
            Some(serde_json::Value::String(t)) => Some(t.clone()),
            // A list of named templates: the one named `default`.
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
            _ => std::fs::read_to_string(dir.join("chat_template.jinja")).ok(),
        };
        Ok(Text { tokenizer, template, bos: special(&config, "bos_token"), eos: special(&config, "eos_token") })
    }

    /// The tokenizer of a GGUF file: a `tokenizer.json` beside it (with its
    /// `tokenizer_config.json`), else the file's `tokenizer.ggml.*` metadata as llama.cpp's
    /// converter writes it — model `gpt2`, a byte-level BPE (Llama 3's, Qwen2's, GPT-2's:
    /// [`vocab::byte_level_bpe`]), or model `llama`, a SentencePiece BPE (Llama 2's, Mistral's,
    /// TinyLlama's: [`vocab::sentencepiece_bpe`]); control tokens special, the bos token added where
    /// `add_bos_token` — and its chat template from `tokenizer.chat_template`. `None` where it
    /// has none.
    fn of_gguf(path: &Path) -> Result<Option<Text>, String> {
        use fusegraph::nn::gguf::{Gguf, GgufValue};
        use tokenizers::processors::template::TemplateProcessing;
        use tokenizers::AddedToken;
        let dir = path.parent().unwrap_or(Path::new("."));
        if dir.join("tokenizer.json").exists() {
            return Text::open(dir).map(Some);
        }
        let gguf = Gguf::open(path).map_err(|e| e.to_string())?;
        let m = gguf.metadata();
        let key = |k: &str| m.get(&format!("tokenizer.ggml.{k}"));
        let bad = |k: &str, what: &str| format!("{}: tokenizer.ggml.{k}: {what}", path.display());
        let Some(model) = key("model") else { return Ok(None) };
        let list = |k: &str| match key(k) {
            Some(GgufValue::Array(v)) => Ok(v),
            _ => Err(bad(k, "missing or not a list")),
        };
        let tokens: Vec<String> = list("tokens")?
            .iter()
            .map(|s| s.as_str().map(str::to_string).ok_or_else(|| bad("tokens", "not strings")))
            .collect::<Result<_, _>>()?;
        let types: Vec<u64> = match key("token_type") {
            Some(GgufValue::Array(v)) => v.iter().map(|t| t.as_u64().unwrap_or(1)).collect(),
            _ => vec![1; tokens.len()],
        };
        let mut tokenizer = match model.as_str() {
            Some("gpt2") => {
                let merges: Vec<(String, String)> = list("merges")?
                    .iter()
                    .map(|m| {
                        let m = m.as_str().ok_or_else(|| bad("merges", "not strings"))?;
                        m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())).ok_or_else(|| bad("merges", m))
                    })
                    .collect::<Result<_, _>>()?;
                vocab::byte_level_bpe(&tokens, merges, key("pre").and_then(GgufValue::as_str))
                    .map_err(|(k, e)| bad(k, &e))?
            }
            Some("llama") => {
                let scores: Vec<f64> = list("scores")?
                    .iter()
                    .map(|v| v.as_f64().ok_or_else(|| bad("scores", "not numbers")))
                    .collect::<Result<_, _>>()?;
                if scores.len() != tokens.len() {
                    return Err(bad("scores", &format!("{} scores for {} tokens", scores.len(), tokens.len())));
                }
                let prefix = !matches!(key("add_space_prefix"), Some(GgufValue::Bool(false)));
                vocab::sentencepiece_bpe(&tokens, &scores, &types, prefix).map_err(|(k, e)| bad(k, &e))?
            }
            _ => {
                let what = format!(
                    "{model:?} is not read (`gpt2`, a byte-level BPE, and `llama`, a SentencePiece BPE, are): \
                     put the model's tokenizer.json beside the file"
                );
                return Err(bad("model", &what));
            }
        };
        // Control tokens (type 3) are special: matched whole, skipped when decoding; user-defined
        // ones (type 4) are matched whole in the raw text and decoded, as llama.cpp parses both
        // out of the text before the rest is tokenized (a SentencePiece model's space prefix
        // then starts each stretch of text after one, as in llama.cpp).
        let of_type = |ty: u64, special: bool| -> Vec<AddedToken> {
            let tokens = types.iter().zip(&tokens).filter(|(t, _)| **t == ty);
            tokens.map(|(_, tok)| AddedToken::from(tok.clone(), special).normalized(false)).collect()
        };
        tokenizer.add_special_tokens(&of_type(3, true));
        tokenizer.add_tokens(&of_type(4, false));
        let id_of = |k: &str| key(k).and_then(GgufValue::as_u64).filter(|&i| (i as usize) < tokens.len());
        let token_of = |k: &str| id_of(k).map(|i| tokens[i as usize].clone());
        let (bos, eos) = (token_of("bos_token_id"), token_of("eos_token_id"));
        // llama.cpp adds the bos token to a SentencePiece model's text unless told not to.
        let add_bos = match key("add_bos_token") {
            Some(GgufValue::Bool(add)) => *add,
            _ => model.as_str() == Some("llama"),
        };
        if let (Some(b), true) = (&bos, add_bos) {
            let id = id_of("bos_token_id").expect("the bos token's id") as u32;
            let post = TemplateProcessing::builder()
                .try_single(format!("{b} $A"))
                .and_then(|t| t.try_pair(format!("{b} $A {b} $B")))
                .map_err(|e| bad("add_bos_token", &e))?
                .special_tokens(vec![(b.clone(), id)])
                .build()
                .map_err(|e| bad("add_bos_token", &e.to_string()))?;
            tokenizer.with_post_processor(Some(post));
        }
        let template = m.get("tokenizer.chat_template").and_then(GgufValue::as_str).map(str::to_string);
        Ok(Some(Text { tokenizer, template, bos, eos }))
    }

    /// The chat `[system], user` rendered by the template as `transformers`'
    /// `apply_chat_template(…, add_generation_prompt=True)` does (Jinja with trimmed blocks,
    /// Python's string methods).
    fn chat(&self, system: Option<&str>, user: &str) -> Result<String, String> {
        let template = self.template.as_deref().ok_or("the model directory has no chat template")?;
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        // `transformers`' own global: the local time in Python's `strftime` format (Llama 3.1's
        // templates date the system message with it).
        env.add_function("strftime_now", |format: String| -> Result<String, minijinja::Error> {
            use chrono::format::{Item, StrftimeItems};
            if StrftimeItems::new(&format).any(|i| matches!(i, Item::Error)) {
                let msg = format!("strftime_now: `{format}` is not a strftime format");
                return Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg));
            }
            Ok(chrono::Local::now().format(&format).to_string())
        });
        env.add_template("chat", template).map_err(|e| format!("chat template: {e}"))?;
        let mut messages = Vec::new();
        if let Some(s) = system {
            messages.push(minijinja::context! { role => "system", content => s });
        }
        messages.push(minijinja::context! { role => "user", content => user });
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => self.bos.clone().unwrap_or_default(),
            eos_token => self.eos.clone().unwrap_or_default(),
        };
        env.get_template("chat").and_then(|t| t.render(ctx)).map_err(|e| format!("chat template: {e}"))
    }

    fn encode(&self, text: &str, special_tokens: bool) -> Result<Vec<i32>, String> {
        let enc = self.tokenizer.encode(text, special_tokens).map_err(|e| format!("tokenizer: {e}"))?;
        Ok(enc.get_ids().iter().map(|&i| i as i32).collect())
    }

    fn decode(&self, ids: &[i32]) -> Result<String, String> {
        let ids: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
        self.tokenizer.decode(&ids, true).map_err(|e| format!("tokenizer: {e}"))
    }
}

/// `--quantize`: a block type or `none`.
fn parse_quantize(s: &str) -> Result<Quantize, String> {
    match s {
        "none" => Ok(Quantize::None),
        "q8_0" => Ok(Quantize::To(DType::Q8_0)),
        "q4_0" => Ok(Quantize::To(DType::Q4_0)),
        "q5_0" => Ok(Quantize::To(DType::Q5_0)),
        "q4_1" => Ok(Quantize::To(DType::Q4_1)),
        "q5_1" => Ok(Quantize::To(DType::Q5_1)),
        other => Err(format!("`{other}`: expected q8_0, q4_0, q5_0, q4_1, q5_1 or none")),
    }
}

pub fn run(a: &GenerateArgs) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let quantize = a.quantize.unwrap_or_default();
    let (loaded, text) = match (&a.model, &a.random_config) {
        (Some(dir), _) => {
            let loaded = Pretrained::load(dir, a.dtype, quantize).map_err(|e| err(&e))?;
            let text = if dir.extension().is_some_and(|e| e == "gguf") {
                Text::of_gguf(dir)?
            } else if dir.join("tokenizer.json").exists() {
                Some(Text::open(dir)?)
            } else {
                None
            };
            (loaded, text)
        }
        (None, Some(file)) => {
            let config = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
            (Pretrained::random(&config, a.dtype, quantize, a.seed).map_err(|e| err(&e))?, None)
        }
        (None, None) => return Err("give --model DIR or --random-config FILE.json".into()),
    };
    let model = loaded.model;
    if let Some(file) = &a.queue {
        return serve_queue(a, file, model, text.as_ref(), &loaded.params);
    }
    // The prompt's text as encoded (the chat rendered), and its ids.
    let (prompt_text, prompt): (Option<String>, Vec<i32>) = match (&a.prompt_ids, &a.prompt, &text) {
        (Some(ids), _, _) => (None, ids.clone()),
        (None, Some(p), Some(t)) if a.chat => {
            let chat = t.chat(a.system.as_deref(), p)?;
            let ids = t.encode(&chat, false)?;
            (Some(chat), ids)
        }
        (None, Some(p), Some(t)) => (Some(p.clone()), t.encode(p, true)?),
        (None, Some(_), None) => return Err("this model has no tokenizer.json: give --prompt-ids".into()),
        (None, None, _) => return Err("give --prompt TEXT or --prompt-ids 1,2,3".into()),
    };
    if prompt.is_empty() {
        return Err("the prompt has no tokens".into());
    }
    let (device, store, mut generator, max_seq) = generator_for(a, &model, &loaded.params, prompt.len())?;
    drop(loaded.params);
    let weight_bytes = store.bytes();
    let sampling = Sampling { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed };
    let prompts = vec![prompt.clone(); a.batch];
    if a.warmup > 0 {
        let n = a.warmup.min(max_seq.saturating_sub(prompt.len())).max(1);
        generator.generate(&prompts, n, &sampling).map_err(|e| err(&e))?;
    }
    // Stream the first sequence: print what its decoded text gained at each step.
    let mut new: Vec<i32> = Vec::new();
    let mut shown = String::new();
    let mut out = std::io::stdout().lock();
    let mut stream = |step: &[Option<i32>]| -> fusegraph::Result<()> {
        if let Some(t) = step[0] {
            new.push(t);
            let piece = match &text {
                Some(tx) => tx.decode(&new).map_err(fusegraph::Error::Config)?,
                None => format!("{} ", new.iter().map(i32::to_string).collect::<Vec<_>>().join(" ")),
            };
            // A token ending inside a multi-byte character decodes to U+FFFD: wait for the rest.
            if piece.starts_with(&shown) && !piece.ends_with('\u{FFFD}') {
                let _ = write!(out, "{}", &piece[shown.len()..]);
                let _ = out.flush();
                shown = piece;
            }
        }
        Ok(())
    };
    let gen = generator.generate_streaming(&prompts, a.tokens, &sampling, &mut stream).map_err(|e| err(&e))?;
    println!();
    let generated = gen.tokens[0][prompt.len()..].to_vec();
    // The decode step as compiled: its kernels, how many are matrix–vector products, and the
    // bytes its kernels read and write.
    let step = generator.step_executable(&sampling).map(|e| e.stats());
    let (kernels, gemv, moved) = step.map_or((0, 0, 0), |s| {
        let gemv = s.kernels.iter().filter(|k| matches!(k.form, fusegraph::KernelForm::Gemv { .. })).count();
        (s.kernels.len(), gemv, s.bytes_moved)
    });
    use crate::roofline::median;
    eprintln!(
        "prefill {:.2} ms ({} tokens × {}), decode {:.1} tokens/s ({} steps); a step: {kernels} kernels \
         ({gemv} matrix–vector), {:.1} MB moved, {:.3} ms median of which {:.3} ms on the host",
        gen.prefill_ms,
        prompt.len(),
        a.batch,
        gen.tokens_per_s,
        gen.step_ms.len(),
        moved as f64 / 1e6,
        median(&gen.step_ms),
        median(&gen.step_host_ms)
    );
    // Step i wrote position prompt + i.
    let near = |v: &[f64], pos: usize| -> Option<f64> {
        let lo = pos.saturating_sub(8).max(prompt.len()) - prompt.len();
        let hi = (pos + 8).checked_sub(prompt.len())?.min(v.len().checked_sub(1)?);
        (lo <= hi).then(|| median(&v[lo..=hi]))
    };
    let mut steps_at = Vec::new();
    for &pos in &a.report_at {
        let (Some(ms), Some(exe)) = (near(&gen.step_ms, pos), generator.step_executable_at(&sampling, pos)) else {
            eprintln!(
                "step at {pos}: not generated (positions {}..{})",
                prompt.len(),
                prompt.len() + gen.step_ms.len()
            );
            continue;
        };
        let (kernels, bytes) = (exe.stats().kernels.len(), exe.stats().bytes_moved);
        let host = near(&gen.step_host_ms, pos).unwrap_or(f64::NAN);
        eprintln!(
            "step at {pos}: {kernels} kernels, {:.2} MB moved (attending over {} positions), {ms:.3} ms ({host:.3} on the host)",
            bytes as f64 / 1e6,
            generator.live_for(pos)
        );
        let profile = match a.profile {
            Some(runs) => Some(profile_step(&generator, &sampling, pos, runs)?),
            None => None,
        };
        steps_at.push(serde_json::json!({
            "position": pos, "live_positions": generator.live_for(pos), "kernels": kernels,
            "bytes_moved": bytes, "ms": ms, "host_ms": host, "profile": profile,
        }));
    }
    // The last step wrote position prompt + steps − 1.
    let profiled = match a.profile.filter(|_| a.report_at.is_empty() && !gen.step_ms.is_empty()) {
        Some(runs) => Some(profile_step(&generator, &sampling, prompt.len() + gen.step_ms.len() - 1, runs)?),
        None => None,
    };
    if let Some(path) = &a.json {
        let text = match &text {
            Some(t) => Some(t.decode(&generated)?),
            None => None,
        };
        let json = serde_json::json!({
            "model": model.name(),
            "device": device.describe(),
            "batch": a.batch,
            "overlapped_steps": generator.overlaps_steps(),
            "parameter_bytes": weight_bytes,
            "prompt_text": prompt_text,
            "prompt_ids": prompt,
            "generated_ids": generated,
            "sequences": gen.tokens,
            "text": text,
            "prefill_ms": gen.prefill_ms,
            "decode_tokens_per_s": if gen.tokens_per_s.is_finite() { Some(gen.tokens_per_s) } else { None },
            "step_ms": gen.step_ms,
            "step_host_ms": gen.step_host_ms,
            "step_kernels": kernels,
            "step_matrix_vector_kernels": gemv,
            "step_bytes_moved": moved,
            "steps_at": steps_at,
            "profile": profiled,
        });
        let body = serde_json::to_string_pretty(&json).map_err(|e| err(&e))?;
        std::fs::write(path, body + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// `--profile RUNS` at `pos`: prints the step's kernels grouped by label, form and workgroups
/// (count, summed ms, share, bytes, GB/s), slowest group first, and returns every kernel as
/// JSON.
fn profile_step(
    generator: &Generator,
    sampling: &Sampling,
    pos: usize,
    runs: usize,
) -> Result<serde_json::Value, String> {
    let p = generator.profile_step(sampling, pos, runs).map_err(|e| e.to_string())?;
    let exe = generator.step_executable_at(sampling, pos).expect("profiled, so compiled");
    let stats = exe.stats();
    let total = p.total_ms();
    // (label, form, workgroups) → (kernels, ms, bytes)
    type Group = (String, String, [u32; 3]);
    let mut groups: std::collections::BTreeMap<Group, (usize, f64, u64)> = Default::default();
    let mut kernels = Vec::new();
    for k in &p.kernels {
        let s = &stats.kernels[k.index];
        let form = format!("{:?}", s.form);
        let g = groups.entry((s.label.clone(), form.clone(), s.workgroups)).or_default();
        *g = (g.0 + 1, g.1 + k.median_ms, g.2 + s.bytes_moved);
        kernels.push(serde_json::json!({
            "index": k.index, "label": s.label, "form": form, "workgroups": s.workgroups,
            "bytes_moved": s.bytes_moved, "ms": k.median_ms,
        }));
    }
    let mut rows: Vec<_> = groups.into_iter().collect();
    rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
    let timer =
        if p.gpu_timestamps { "GPU timestamps, a pass per kernel" } else { "wall time, a submission per kernel" };
    eprintln!("profile of the step at {pos}: {} kernels, {total:.3} ms in all ({timer}), by group:", p.kernels.len());
    for ((label, form, wg), (count, ms, bytes)) in rows {
        let mut label = label;
        if label.len() > 70 {
            label.truncate(67);
            label.push_str("...");
        }
        eprintln!(
            "  {count:>3} × {:>8.4} ms = {ms:>7.3} ms {:>5.1}%  {:>8.2} MB {:>7.1} GB/s  {wg:?} {form}  {label}",
            ms / count as f64,
            100.0 * ms / total,
            bytes as f64 / 1e6,
            bytes as f64 / ms / 1e6,
        );
    }
    Ok(serde_json::json!({
        "position": pos, "runs": runs, "gpu_timestamps": p.gpu_timestamps, "total_ms": total, "kernels": kernels,
    }))
}

/// The store holding `params` on the shared device and a generator over it for `--batch`
/// sequences of up to `--max-seq` positions (default: `longest` prompt tokens plus
/// `--tokens`, at most the model's), stopping at the model's end-of-sequence tokens unless
/// `--ignore-eos`; prints the model, its parameters and the compile time. Returns the device,
/// the store, the generator and its cache length.
fn generator_for(
    a: &GenerateArgs,
    model: &std::sync::Arc<dyn fusegraph::nn::CausalLm>,
    params: &std::collections::BTreeMap<String, fusegraph::HostTensor>,
    longest: usize,
) -> Result<(std::sync::Arc<Device>, ParamStore, Generator, usize), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let device = Device::shared().map_err(|e| err(&e))?;
    let store = ParamStore::new(&device);
    store.insert_all(params.iter()).map_err(|e| err(&e))?;
    let dtypes: std::collections::BTreeSet<String> = params.values().map(|t| t.dtype().to_string()).collect();
    let max_seq = a.max_seq.unwrap_or(longest + a.tokens).min(model.max_positions());
    eprintln!(
        "{}, {:.1} MB of {} parameters, on {}",
        model.name(),
        store.bytes() as f64 / 1e6,
        dtypes.into_iter().collect::<Vec<_>>().join("/"),
        device.describe()
    );
    let start = Instant::now();
    let opts = CompileOptions {
        fused_attention: if a.fused_attention { fusegraph::FusedAttention::Always } else { Default::default() },
        ..Default::default()
    };
    let mut generator = Generator::new(&store, model.clone(), a.batch, max_seq, opts).map_err(|e| err(&e))?;
    if a.ignore_eos {
        generator.stop_at(Vec::new());
    }
    if a.no_overlap {
        generator.overlap_steps(false);
    }
    eprintln!("compiled in {:.2} s", start.elapsed().as_secs_f64());
    Ok((device, store, generator, max_seq))
}

/// `--queue FILE`: every prompt of the file through `--batch` rows of a [`Batcher`], in file
/// order as rows free; each sequence printed as it ends (decoded where the model has a
/// tokenizer), then the totals; `--json` writes every sequence and the figures.
fn serve_queue(
    a: &GenerateArgs,
    file: &std::path::Path,
    model: std::sync::Arc<dyn fusegraph::nn::CausalLm>,
    text: Option<&Text>,
    params: &std::collections::BTreeMap<String, fusegraph::HostTensor>,
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let body = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut prompts: Vec<Vec<i32>> = Vec::new();
    for (n, line) in body.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let ids: Option<Vec<i32>> = line.split(',').map(|t| t.trim().parse().ok()).collect();
        prompts.push(match (ids, text) {
            (Some(ids), _) => ids,
            (None, Some(t)) => t.encode(line, true)?,
            (None, None) => {
                return Err(format!("{}:{}: not ids, and the model has no tokenizer", file.display(), n + 1))
            }
        });
    }
    let longest = prompts.iter().map(Vec::len).max().ok_or(format!("{}: no prompts", file.display()))?;
    let (device, _store, mut generator, _) = generator_for(a, &model, params, longest)?;
    let sampling = Sampling { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed };
    let mut batch = generator.batcher(&sampling).map_err(|e| err(&e))?;
    let (mut waiting, mut ids) = (prompts.iter().enumerate(), std::collections::BTreeMap::new());
    let mut done: Vec<(usize, Vec<i32>)> = Vec::new();
    let (start, mut steps, mut new_tokens) = (Instant::now(), 0usize, 0usize);
    loop {
        while batch.free_rows() > 0 {
            let Some((i, p)) = waiting.next() else { break };
            ids.insert(batch.join(p.clone(), a.tokens).map_err(|e| err(&e))?, i);
        }
        if batch.active() == 0 {
            break;
        }
        new_tokens += batch.step().map_err(|e| err(&e))?.len();
        steps += 1;
        for (id, tokens) in batch.take_finished() {
            let i = ids[&id];
            let shown = match text {
                Some(t) => format!("{:?}", t.decode(&tokens[prompts[i].len()..])?),
                None => format!("{:?}", &tokens[prompts[i].len()..]),
            };
            println!("[{i}] {shown}");
            done.push((i, tokens));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "{} sequences through {} rows: {new_tokens} new tokens in {steps} steps, {:.2} s ({:.1} tokens/s)",
        prompts.len(),
        a.batch,
        secs,
        new_tokens as f64 / secs
    );
    if let Some(path) = &a.json {
        done.sort();
        let sequences: Vec<_> = done
            .iter()
            .map(|(i, t)| serde_json::json!({"prompt_ids": prompts[*i], "generated_ids": t[prompts[*i].len()..]}))
            .collect();
        let json = serde_json::json!({
            "model": model.name(), "device": device.describe(), "rows": a.batch, "steps": steps,
            "new_tokens": new_tokens, "seconds": secs, "tokens_per_s": new_tokens as f64 / secs,
            "sequences": sequences,
        });
        let body = serde_json::to_string_pretty(&json).map_err(|e| err(&e))?;
        std::fs::write(path, body + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A template's `strftime_now` gives today's date in the format asked for (as `date`
    /// formats it), as Llama 3.1's templates use it; a format it cannot read is an error.
    #[test]
    fn chat_templates_read_the_date_as_transformers_gives_it() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/checkpoints/llama-tiny");
        let mut text = Text::open(&dir).unwrap();
        text.template = Some(
            "{%- if strftime_now is defined %}{{ strftime_now('%d %b %Y') }}{% else %}26 Jul 2024{% endif %}|\
             {{ messages[-1]['content'] }}"
                .into(),
        );
        let date = || {
            let out = std::process::Command::new("date").arg("+%d %b %Y").env("LC_ALL", "C").output().unwrap();
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        let (before, got, after) = (date(), text.chat(None, "hi").unwrap(), date());
        assert!(got == format!("{before}|hi") || got == format!("{after}|hi"), "{got:?} on {before}");
        text.template = Some("{{ strftime_now('%Q') }}".into());
        let err = text.chat(None, "hi").unwrap_err();
        assert!(err.contains("`%Q` is not a strftime format"), "{err}");
    }

    /// A GGUF file's SentencePiece tokenizer (`tokenizer.ggml.model` "llama", written as
    /// llama.cpp's converter writes Llama 2's) gives `sentencepiece`'s ids and text for plain
    /// text, leading and repeated spaces, new lines and characters with no piece of their own
    /// (their UTF-8 bytes' pieces), llama.cpp's where a user-defined piece splits the text
    /// (each stretch after one starting with the space prefix again), the bos token first
    /// where special tokens are added.
    #[test]
    fn sentencepiece_tokenizers_from_gguf_match_sentencepiece() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/gguf");
        let text = Text::of_gguf(&dir.join("llama-tiny-spm.gguf")).unwrap().expect("the file's tokenizer");
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("llama-tiny-spm-reference.json")).unwrap()).unwrap();
        let ids = |v: &serde_json::Value| -> Vec<i32> {
            v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap() as i32).collect()
        };
        let cases = r["texts"].as_array().unwrap();
        assert_eq!(cases.len(), 6);
        assert!(cases.iter().any(|c| c["ids"] != c["sentencepiece_ids"]), "a text split by a user-defined piece");
        for case in cases {
            let (t, want) = (case["text"].as_str().unwrap(), ids(&case["ids"]));
            assert_eq!(text.encode(t, false).unwrap(), want, "{t:?}");
            if case["ids"] == case["sentencepiece_ids"] {
                assert_eq!(text.decode(&want).unwrap(), case["decoded"].as_str().unwrap(), "{t:?}");
            }
        }
        let first = cases[0]["text"].as_str().unwrap();
        assert_eq!(text.encode(first, true).unwrap(), ids(&r["prompt_ids"]), "the bos token first");
        assert_eq!(text.bos.as_deref(), Some("<s>"));
    }

    /// A SentencePiece tokenizer without the space prefix (`add_space_prefix` false, as
    /// llama.cpp's converter writes Gemma's) gives `sentencepiece`'s ids and text: no `▁`
    /// before the text, leading and doubled spaces kept, bytes for characters with no piece,
    /// a user-defined piece matched whole.
    #[test]
    fn sentencepiece_tokenizers_without_the_space_prefix_match_sentencepiece() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/gguf");
        let text = Text::of_gguf(&dir.join("spm-noprefix.gguf")).unwrap().expect("the file's tokenizer");
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("spm-noprefix-reference.json")).unwrap()).unwrap();
        let ids = |v: &serde_json::Value| -> Vec<i32> {
            v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap() as i32).collect()
        };
        let cases = r["texts"].as_array().unwrap();
        assert_eq!(cases.len(), 6);
        for case in cases {
            let (t, want) = (case["text"].as_str().unwrap(), ids(&case["ids"]));
            assert_eq!(text.encode(t, false).unwrap(), want, "{t:?}");
            assert_eq!(text.decode(&want).unwrap(), case["decoded"].as_str().unwrap(), "{t:?}");
        }
        let with_bos = text.encode(cases[0]["text"].as_str().unwrap(), true).unwrap();
        assert_eq!(with_bos[0] as i64, r["bos"].as_i64().unwrap(), "the bos token first");
    }
}
