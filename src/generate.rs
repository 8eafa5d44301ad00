//! Text generation with a KV cache that stays on the device: [`Generator`] runs a causal
//! language model ([`CausalLm`]: GPT-2, the Llama family) as a prefill executable (the prompt's keys and values written into
//! the cache) and a decode-step executable (one token per sequence at a fed position, its
//! keys and values written into the caches in place), both bound to the model's
//! [`ParamStore`], where the caches live as parameters.
//!
//! A decode step attends to the whole cache under a mask of the positions written so far, so
//! its work does not grow with the position: its time stays flat as the sequence grows.
//! Greedy decoding ([`Sampling::greedy`]) takes each sequence's argmax on the device, in the
//! step's own executable, and reads back one id per sequence; temperature, top-k and top-p
//! sampling (seeded) happen on the host from the last position's logits, read back whole.

use crate::nn::causal::{CausalLm, Kv};
use crate::{CompileOptions, DType, Error, Executable, GraphBuilder, HostTensor, ParamStore, Result, Tensor};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// How the next token is chosen from the logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0 for greedy (the first maximum); otherwise the logits are divided by it.
    pub temperature: f64,
    /// Keep only the `k` most likely tokens.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches `p` (at least
    /// one).
    pub top_p: Option<f64>,
    /// Seed of the sampling generator.
    pub seed: u64,
}

impl Sampling {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Sampling { temperature: 0.0, top_k: None, top_p: None, seed: 0 }
    }
}

/// What [`Generator::generate`] produced and how long it took.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// Per sequence: the prompt followed by the new tokens (through an end-of-sequence token
    /// where one came).
    pub tokens: Vec<Vec<i32>>,
    /// Wall time of the prefill run (upload, run, readback of the last logits), in ms.
    pub prefill_ms: f64,
    /// Wall time of each decode step, in ms: `step_ms[i]` wrote position `prompt + i`.
    pub step_ms: Vec<f64>,
    /// New tokens over all sequences per second of decoding (prefill excluded).
    pub tokens_per_s: f64,
}

/// A model compiled for generation at one batch size and cache length, bound to a store.
pub struct Generator {
    model: Arc<dyn CausalLm>,
    stop: Vec<i32>,
    store: ParamStore,
    opts: CompileOptions,
    batch: usize,
    max_seq: usize,
    caches: Vec<(String, String)>,
    /// Decode-step executables by whether they return the greedy ids (else the logits: the
    /// one `new` compiles); the greedy one compiled on first use.
    decode: BTreeMap<bool, Executable>,
    /// Prefill executables by prompt length and whether they return the greedy ids.
    prefill: BTreeMap<(usize, bool), Executable>,
}

/// The sampling generator: the workspace's seeded PCG.
struct Rng(rand_pcg::Pcg64Mcg);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(rand::SeedableRng::seed_from_u64(seed))
    }
    fn uniform(&mut self) -> f64 {
        rand::Rng::random(&mut self.0)
    }
}

impl Generator {
    /// Compiles the decode step of `model` for `batch` sequences of up to `max_seq`
    /// positions (≤ the model's longest) against `store`, which must hold the model's
    /// parameters; the caches are added to it (zeros, `kv_cache.b{batch}.{layer}.k` and `.v`,
    /// `[batch, kv heads, max_seq, head width]` f32) unless present. Generation stops at the
    /// model's end-of-sequence tokens ([`Generator::stop_at`] changes them).
    pub fn new(
        store: &ParamStore,
        model: Arc<dyn CausalLm>,
        batch: usize,
        max_seq: usize,
        opts: CompileOptions,
    ) -> Result<Self> {
        let longest = model.max_positions();
        if batch == 0 || max_seq == 0 || max_seq > longest {
            return Err(Error::Config(format!(
                "generate: batch {batch} and max_seq {max_seq} must be ≥ 1, max_seq ≤ the model's {longest} positions"
            )));
        }
        let shape = Self::cache_dims(&*model, batch, max_seq);
        let zeros = HostTensor::new(shape, vec![0.0f32; shape.iter().product()])?;
        let caches: Vec<(String, String)> = (0..model.cache_shape().0)
            .map(|i| (format!("kv_cache.b{batch}.{i}.k"), format!("kv_cache.b{batch}.{i}.v")))
            .collect();
        let missing: Vec<(&str, &HostTensor)> = caches
            .iter()
            .flat_map(|(k, v)| [k.as_str(), v.as_str()])
            .filter(|n| store.ty(n).is_none())
            .map(|n| (n, &zeros))
            .collect();
        store.insert_all(missing)?;
        let mut g = Generator {
            stop: model.eos_token_ids(),
            model,
            store: store.clone(),
            opts,
            batch,
            max_seq,
            caches,
            decode: BTreeMap::new(),
            prefill: BTreeMap::new(),
        };
        g.decode(false)?;
        Ok(g)
    }

    /// The decode step's executable: the last logits `[batch, vocab]`, or with `greedy` each
    /// row's first maximum `[batch]` (i32) (compiled on first use).
    fn decode(&mut self, greedy: bool) -> Result<&Executable> {
        if !self.decode.contains_key(&greedy) {
            let (batch, model) = (self.batch, &self.model);
            let shape = Self::cache_dims(&**model, batch, self.max_seq);
            let b = GraphBuilder::new();
            let ids = b.input("ids", DType::I32, [batch, 1])?;
            let pos = b.input("pos", DType::I32, Vec::<usize>::new())?;
            let cache = Self::cache_params(&b, &self.caches, shape)?;
            let (logits, updated) = model.decode(&ids, &pos, &cache)?;
            let last = head(&logits.reshape([batch, model.vocab_size()])?, greedy)?;
            let exe = Self::compile(&self.store, &b, &last, &self.caches, &updated, &self.opts, "decode step")?;
            self.decode.insert(greedy, exe);
        }
        Ok(&self.decode[&greedy])
    }

    /// A cache's dimensions: `[batch, kv heads, max_seq, head width]`.
    fn cache_dims(model: &dyn CausalLm, batch: usize, max_seq: usize) -> [usize; 4] {
        let (_, heads, dh) = model.cache_shape();
        [batch, heads, max_seq, dh]
    }

    /// Ends a sequence when it produces one of `tokens` (kept as its last token); none: every
    /// sequence runs to its length.
    pub fn stop_at(&mut self, tokens: Vec<i32>) {
        self.stop = tokens;
    }

    fn cache_params(b: &GraphBuilder, caches: &[(String, String)], shape: [usize; 4]) -> Result<Vec<Kv>> {
        caches
            .iter()
            .map(|(k, v)| Ok((b.parameter(k, DType::F32, shape)?, b.parameter(v, DType::F32, shape)?)))
            .collect()
    }

    fn compile(
        store: &ParamStore,
        b: &GraphBuilder,
        out: &Tensor,
        caches: &[(String, String)],
        updated: &[Kv],
        opts: &CompileOptions,
        name: &str,
    ) -> Result<Executable> {
        let updates = caches
            .iter()
            .zip(updated)
            .flat_map(|((kn, vn), (k, v))| [(kn.clone(), k.id()), (vn.clone(), v.id())])
            .collect();
        let opts = CompileOptions { updates, name: Some(name.into()), ..opts.clone() };
        Ok(store.compile(&b.graph(), &[out.id()], &opts)?)
    }

    /// The prefill executable for prompts of `len` tokens, returning the last logits or with
    /// `greedy` the greedy ids (compiled on first use).
    fn prefill(&mut self, len: usize, greedy: bool) -> Result<&Executable> {
        if !self.prefill.contains_key(&(len, greedy)) {
            let (vocab, batch) = (self.model.vocab_size(), self.batch);
            let b = GraphBuilder::new();
            let ids = b.input("ids", DType::I32, [batch, len])?;
            let (logits, kvs) = self.model.prefill(&ids)?;
            let last = logits.slice(&[0, len - 1, 0], &[batch, len, vocab], &[1, 1, 1])?.reshape([batch, vocab])?;
            let last = head(&last, greedy)?;
            let shape = Self::cache_dims(&*self.model, batch, self.max_seq);
            let cache = Self::cache_params(&b, &self.caches, shape)?;
            let zero = b.scalar(DType::I32, 0.0)?;
            let written = cache
                .iter()
                .zip(&kvs)
                .map(|((kc, vc), (k, v))| {
                    Ok((kc.dynamic_update_slice(k, &zero, 2)?, vc.dynamic_update_slice(v, &zero, 2)?))
                })
                .collect::<Result<Vec<Kv>>>()?;
            let exe = Self::compile(&self.store, &b, &last, &self.caches, &written, &self.opts, "prefill")?;
            self.prefill.insert((len, greedy), exe);
        }
        Ok(&self.prefill[&(len, greedy)])
    }

    /// The decode-step executable a generation with `sampling` runs (the greedy one returns
    /// ids: compiled by the first greedy generation, `None` before it).
    pub fn step_executable(&self, sampling: &Sampling) -> Option<&Executable> {
        self.decode.get(&(sampling.temperature == 0.0))
    }

    /// The decode-step executable returning logits (its stats, its memory plan).
    pub fn decode_executable(&self) -> &Executable {
        &self.decode[&false]
    }

    /// Generates `new_tokens` tokens after each of `prompts` (one per sequence of the batch,
    /// all of one length ≥ 1; prompt plus new tokens within `max_seq`).
    pub fn generate(&mut self, prompts: &[Vec<i32>], new_tokens: usize, sampling: &Sampling) -> Result<Generation> {
        self.generate_streaming(prompts, new_tokens, sampling, &mut |_| Ok(()))
    }

    /// [`Generator::generate`], calling `each` with every step's new tokens (one per
    /// sequence, `None` for a sequence that has ended) as they are chosen; an error from
    /// `each` stops the generation and is returned.
    pub fn generate_streaming(
        &mut self,
        prompts: &[Vec<i32>],
        new_tokens: usize,
        sampling: &Sampling,
        each: &mut dyn FnMut(&[Option<i32>]) -> Result<()>,
    ) -> Result<Generation> {
        let len = prompts.first().map_or(0, Vec::len);
        if prompts.len() != self.batch || len == 0 || prompts.iter().any(|p| p.len() != len) {
            return Err(Error::Config(format!(
                "generate: {} prompt(s) of lengths {:?}; this generator takes {} of one length ≥ 1",
                prompts.len(),
                prompts.iter().map(Vec::len).collect::<Vec<_>>(),
                self.batch
            )));
        }
        if len + new_tokens > self.max_seq {
            return Err(Error::Config(format!(
                "generate: {len} prompt + {new_tokens} new tokens exceed max_seq {}",
                self.max_seq
            )));
        }
        let vocab = self.model.vocab_size() as i32;
        if let Some(t) = prompts.iter().flatten().find(|&&t| !(0..vocab).contains(&t)) {
            return Err(Error::Config(format!("generate: token {t} is outside the vocabulary 0..{vocab}")));
        }
        let batch = self.batch;
        let mut rng = Rng::new(sampling.seed);
        let mut tokens: Vec<Vec<i32>> = prompts.to_vec();
        let ids = HostTensor::new([batch, len], prompts.concat())?;
        // Greedy: the executables that return the ids (compiled on first use, outside the
        // timing).
        let greedy = sampling.temperature == 0.0;
        self.prefill(len, greedy)?;
        self.decode(greedy)?;
        let choose = |out: HostTensor, rng: &mut Rng| -> Vec<i32> {
            match greedy {
                true => out.as_slice::<i32>().expect("the argmax's i32 ids").to_vec(),
                false => sample_rows(&out, sampling, rng),
            }
        };
        let start = Instant::now();
        let out = self.prefill[&(len, greedy)].run(&[("ids", &ids)])?.remove(0);
        let prefill_ms = start.elapsed().as_secs_f64() * 1e3;
        let mut next = choose(out, &mut rng);
        let decode = &self.decode[&greedy];
        let mut step_ms = Vec::with_capacity(new_tokens);
        let mut ended = vec![false; batch];
        for step in 0..new_tokens {
            let mut chosen = vec![None; batch];
            for (((seq, &t), ended), chosen) in tokens.iter_mut().zip(&next).zip(&mut ended).zip(&mut chosen) {
                if !*ended {
                    seq.push(t);
                    *chosen = Some(t);
                    *ended = self.stop.contains(&t);
                }
            }
            each(&chosen)?;
            if step + 1 == new_tokens || ended.iter().all(|&e| e) {
                break;
            }
            let ids = HostTensor::new([batch, 1], next.clone())?;
            let pos = HostTensor::new(Vec::<usize>::new(), vec![(len + step) as i32])?;
            let t0 = Instant::now();
            let out = decode.run(&[("ids", &ids), ("pos", &pos)])?.remove(0);
            step_ms.push(t0.elapsed().as_secs_f64() * 1e3);
            next = choose(out, &mut rng);
        }
        let decode_s = step_ms.iter().sum::<f64>() / 1e3;
        let tokens_per_s = if decode_s > 0.0 { (batch * step_ms.len()) as f64 / decode_s } else { f64::NAN };
        Ok(Generation { tokens, prefill_ms, step_ms, tokens_per_s })
    }
}

/// The step's output from its last logits `[batch, vocab]`: them, or with `greedy` each
/// row's first maximum (what [`sample`] picks at temperature 0).
fn head(last: &Tensor, greedy: bool) -> Result<Tensor> {
    Ok(if greedy { last.argmax(1, false)? } else { last.clone() })
}

/// The next token of each row of `logits: [batch, vocab]`.
fn sample_rows(logits: &HostTensor, s: &Sampling, rng: &mut Rng) -> Vec<i32> {
    let v = logits.to_f64();
    let vocab = logits.shape().dims()[1];
    v.chunks(vocab).map(|row| sample(row, s, rng) as i32).collect()
}

/// One token from one row of logits: greedy at temperature 0, else temperature, top-k and
/// top-p (in that order, as `transformers` applies them) and a draw.
fn sample(row: &[f64], s: &Sampling, rng: &mut Rng) -> usize {
    let argmax = || row.iter().enumerate().fold(0, |best, (i, &x)| if x > row[best] { i } else { best });
    if s.temperature <= 0.0 {
        return argmax();
    }
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    if let Some(k) = s.top_k {
        order.truncate(k.max(1));
    }
    let top = row[order[0]] / s.temperature;
    let mut probs: Vec<f64> = order.iter().map(|&i| (row[i] / s.temperature - top).exp()).collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    if let Some(p) = s.top_p {
        let mut cum = 0.0;
        let keep = probs.iter().take_while(|&&q| {
            let before = cum;
            cum += q;
            before < p
        });
        let n = keep.count().max(1);
        order.truncate(n);
        probs.truncate(n);
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|q| *q /= total);
    }
    let mut u = rng.uniform();
    for (&i, &q) in order.iter().zip(&probs) {
        if u < q {
            return i;
        }
        u -= q;
    }
    order[order.len() - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_follows_its_rules() {
        let row = [0.0, 3.0, 1.0, 3.0, -2.0];
        let mut rng = Rng::new(1);
        assert_eq!(sample(&row, &Sampling::greedy(), &mut rng), 1, "the first maximum");
        let top1 = Sampling { temperature: 1.0, top_k: Some(1), top_p: None, seed: 0 };
        assert_eq!(sample(&row, &top1, &mut rng), 1);
        let top2 = Sampling { top_k: Some(2), ..top1 };
        for _ in 0..50 {
            assert!([1, 3].contains(&sample(&row, &top2, &mut rng)));
        }
        // top-p 0.5: the two 3.0 logits hold 0.42 each, so two tokens are kept.
        let nucleus = Sampling { temperature: 1.0, top_k: None, top_p: Some(0.5), seed: 0 };
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            seen.insert(sample(&row, &nucleus, &mut rng));
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), [1, 3]);
        // Full sampling reaches every token and follows the softmax roughly.
        let all = Sampling { temperature: 1.0, top_k: None, top_p: None, seed: 0 };
        let mut counts = [0usize; 5];
        for _ in 0..20000 {
            counts[sample(&row, &all, &mut rng)] += 1;
        }
        let z: f64 = row.iter().map(|x| x.exp()).sum();
        for (i, &c) in counts.iter().enumerate() {
            let want = row[i].exp() / z;
            assert!((c as f64 / 20000.0 - want).abs() < 0.02, "token {i}: {c} vs {want}");
        }
        // A seed gives the same draws.
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        assert!((0..10).all(|_| sample(&row, &all, &mut a) == sample(&row, &all, &mut b)));
    }
}
