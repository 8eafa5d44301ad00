//! Text generation with a KV cache that stays on the device: [`Generator`] runs a causal
//! language model ([`CausalLm`]: GPT-2, the Llama family) as a prefill executable (the prompt's keys and values written into
//! the cache) and a decode-step executable (one token per sequence at a fed position, its
//! keys and values written into the caches in place), both bound to the model's
//! [`ParamStore`], where the caches live as parameters.
//!
//! A decode step attends over the live part of the cache ([`Generator::live_for`]), so its
//! work grows with the position, not with the cache's length. The step's executable also
//! chooses the next tokens ([`crate::sampling`]: greedy, or temperature, top-k and top-p
//! sampling from a seeded draw per sequence fed each step), so one id per sequence is read
//! back, never the logits. The chosen ids also feed the next step on the device
//! ([`crate::Feed::Output`]): step `t + 1` is submitted before step `t`'s ids are read, so the
//! device runs the steps back to back while the host encodes the next and reads the last
//! ([`Generator::overlap_steps`]; not on a CPU adapter, whose submit runs the work).

use crate::nn::causal::{CausalLm, Kv};
use crate::sampling::Head;
pub use crate::sampling::Sampling;
use crate::{
    CompileOptions, DType, Error, Executable, Feed, GraphBuilder, HostTensor, ParamStore, Result, Submitted, Tensor,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// What [`Generator::generate`] produced and how long it took.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// Per sequence: the prompt followed by the new tokens (through an end-of-sequence token
    /// where one came).
    pub tokens: Vec<Vec<i32>>,
    /// Wall time of the prefill run (upload, run, readback of the chosen ids; with
    /// overlapped steps, the first step's submission too), in ms.
    pub prefill_ms: f64,
    /// Wall time of each decode step, in ms: from the previous token (the prefill's for the
    /// first) to this step's, read back on the host; `step_ms[i]` wrote position
    /// `prompt + i`. With overlapped steps the device has started on it before.
    pub step_ms: Vec<f64>,
    /// The host's share of each decode step, in ms (encoding, submitting, reading back: the
    /// step's wall time less its wait for the device; see
    /// [`Executable::last_run_host_ms`](crate::Executable::last_run_host_ms)), which
    /// overlapped steps hide behind the device's work on the step before.
    pub step_host_ms: Vec<f64>,
    /// New tokens over all sequences per second of decoding (prefill excluded).
    pub tokens_per_s: f64,
}

mod batcher;
pub use batcher::{Batcher, PREFILL_BUCKET};

/// The feeds of a step choosing a token for each of `ids`' rows with `head`: the ids, and
/// for a sampling head its settings and a draw per row from `rng`.
fn step_feeds(
    head: Head,
    sampling: &Sampling,
    rng: &mut Rng,
    rows: usize,
    ids: Option<HostTensor>,
) -> Result<Vec<(&'static str, HostTensor)>> {
    // A draw in [0, 1) as an f32 (an f64 just below 1 rounds to 1).
    let draws = (0..rows).map(|_| (rng.uniform() as f32).min(1.0 - f32::EPSILON / 2.0)).collect();
    let mut feeds = head.feeds(sampling, draws)?;
    feeds.extend(ids.map(|ids| ("ids", ids)));
    Ok(feeds)
}

/// Submits a step executable (prefill or decode, ending in a choosing head) with the host's
/// `feeds` and, where given, its ids from a run in flight.
fn submit_step<'e>(
    exe: &'e Executable,
    feeds: &[(&'static str, HostTensor)],
    ids: Option<&Submitted<'_>>,
) -> Result<Submitted<'e>> {
    let mut refs: Vec<(&str, Feed)> = feeds.iter().map(|(n, t)| (*n, Feed::Host(t))).collect();
    if let Some(run) = ids {
        refs.push(("ids", Feed::Output(run, 0)));
    }
    Ok(exe.submit(&refs)?)
}

/// The id a step's run chose for each row.
fn chosen_ids(run: Submitted<'_>) -> Result<Vec<i32>> {
    let out = run.wait()?.remove(0);
    Ok(out.as_slice::<i32>().expect("the chosen i32 ids").to_vec())
}

/// Runs a step executable on the host's `feeds`: the id chosen for each row.
fn run_step(exe: &Executable, feeds: &[(&'static str, HostTensor)]) -> Result<Vec<i32>> {
    chosen_ids(submit_step(exe, feeds, None)?)
}

/// The fewest cache positions a decode step attends over ([`Generator::live_for`]).
pub const DECODE_MIN_LIVE: usize = 64;

/// A model compiled for generation at one batch size and cache length, bound to a store.
pub struct Generator {
    model: Arc<dyn CausalLm>,
    stop: Vec<i32>,
    store: ParamStore,
    opts: CompileOptions,
    batch: usize,
    max_seq: usize,
    caches: Vec<(String, String)>,
    /// Decode-step executables by what they return and the cache positions their attention
    /// reads ([`Generator::live_for`]): the logits over the whole cache, the one `new`
    /// compiles; the others compiled before the generation that first needs them.
    decode: BTreeMap<(Head, usize), Executable>,
    /// Prefill executables by prompt length and what they return.
    prefill: BTreeMap<(usize, Head), Executable>,
    /// A [`Batcher`]'s prefills of one row, by prompt-length bucket and what they return.
    row_prefill: BTreeMap<(usize, Head), Executable>,
    /// Whether each step is submitted before the last one's ids are read.
    overlap: bool,
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
    /// `[batch, kv heads, max_seq, width]` f32) unless present. Generation stops at the
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
        let zero = |s: [usize; 4]| HostTensor::new(s, vec![0.0f32; s.iter().product()]);
        let [ks, vs] = Self::cache_dims(&*model, batch, max_seq);
        let zeros = [zero(ks)?, zero(vs)?];
        let caches: Vec<(String, String)> = (0..model.cache_shape().layers)
            .map(|i| (format!("kv_cache.b{batch}.{i}.k"), format!("kv_cache.b{batch}.{i}.v")))
            .collect();
        let missing: Vec<(&str, &HostTensor)> = caches
            .iter()
            .flat_map(|(k, v)| [(k.as_str(), &zeros[0]), (v.as_str(), &zeros[1])])
            .filter(|(n, _)| store.ty(n).is_none())
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
            row_prefill: BTreeMap::new(),
            // A CPU adapter (lavapipe) runs a submission's work inside the submit call:
            // nothing overlaps there.
            overlap: store.device().info().device_type != fusegraph_runtime::WgpuDeviceType::Cpu,
        };
        g.decode(Head::Logits, max_seq)?;
        Ok(g)
    }

    /// The positions a decode step writing position `pos` attends over: the smallest of
    /// [`DECODE_MIN_LIVE`] doubled (times a power of two), capped at `max_seq`, past `pos`. A
    /// step is compiled per such length, so that its attention reads about the live part of
    /// the cache — twice it at most — and not the whole: a step at position 16 of a
    /// 2,048-position cache reads 64 positions.
    pub fn live_for(&self, pos: usize) -> usize {
        let mut live = DECODE_MIN_LIVE.min(self.max_seq);
        while live <= pos && live < self.max_seq {
            live = (live * 2).min(self.max_seq);
        }
        live
    }

    /// The decode step's executable ending in `head` attending over `live` positions
    /// (compiled on first use).
    fn decode(&mut self, head: Head, live: usize) -> Result<&Executable> {
        if !self.decode.contains_key(&(head, live)) {
            let (batch, model) = (self.batch, &self.model);
            let shape = Self::cache_dims(&**model, batch, self.max_seq);
            let b = GraphBuilder::new();
            let ids = b.input("ids", DType::I32, [batch, 1])?;
            // Each sequence at its own position (one for all in `generate`; its own in a
            // `Batcher`).
            let pos = b.input("pos", DType::I32, [batch])?;
            let cache = Self::cache_params(&b, &self.caches, shape)?;
            let (logits, updated) = model.decode(&ids, &pos, &cache, live)?;
            let last = head.build(&logits.reshape([batch, model.vocab_size()])?)?;
            let exe = Self::compile(&self.store, &b, &last, &self.caches, &updated, &self.opts, "decode step")?;
            self.decode.insert((head, live), exe);
        }
        Ok(&self.decode[&(head, live)])
    }

    /// A layer's key and value caches' dimensions: `[batch, kv heads, max_seq, width]`.
    fn cache_dims(model: &dyn CausalLm, batch: usize, max_seq: usize) -> [[usize; 4]; 2] {
        model.cache_shape().dims(batch, max_seq)
    }

    /// Ends a sequence when it produces one of `tokens` (kept as its last token); none: every
    /// sequence runs to its length.
    pub fn stop_at(&mut self, tokens: Vec<i32>) {
        self.stop = tokens;
    }

    /// Whether [`Generator::generate`] submits each decode step before it reads the last
    /// step's ids, feeding them on the device, or reads each step's ids and feeds them to the
    /// next from the host (the device waiting for the host between steps). The tokens are
    /// the same either way. On by default, but on a CPU adapter (lavapipe, llvmpipe), whose
    /// submit runs the work itself, so that nothing overlaps and an overlapped prefill's
    /// time would include the first step's.
    pub fn overlap_steps(&mut self, on: bool) {
        self.overlap = on;
    }

    /// Whether decode steps overlap ([`Generator::overlap_steps`]).
    pub fn overlaps_steps(&self) -> bool {
        self.overlap
    }

    fn cache_params(b: &GraphBuilder, caches: &[(String, String)], [ks, vs]: [[usize; 4]; 2]) -> Result<Vec<Kv>> {
        caches.iter().map(|(k, v)| Ok((b.parameter(k, DType::F32, ks)?, b.parameter(v, DType::F32, vs)?))).collect()
    }

    /// The caches declared in `b`, each layer's key and value cache updated by `write(cache,
    /// new)` with the layer's `kvs` (a prefill's keys and values).
    fn write_caches(
        &self,
        b: &GraphBuilder,
        kvs: &[Kv],
        write: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>,
    ) -> Result<Vec<Kv>> {
        let shape = Self::cache_dims(&*self.model, self.batch, self.max_seq);
        let cache = Self::cache_params(b, &self.caches, shape)?;
        cache.iter().zip(kvs).map(|((kc, vc), (k, v))| Ok((write(kc, k)?, write(vc, v)?))).collect()
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

    /// The prefill executable for prompts of `len` tokens ending in `head` (compiled on first
    /// use).
    fn prefill(&mut self, len: usize, head: Head) -> Result<&Executable> {
        if !self.prefill.contains_key(&(len, head)) {
            let (vocab, batch) = (self.model.vocab_size(), self.batch);
            let b = GraphBuilder::new();
            let ids = b.input("ids", DType::I32, [batch, len])?;
            let (logits, kvs) = self.model.prefill(&ids)?;
            let last = logits.slice(&[0, len - 1, 0], &[batch, len, vocab], &[1, 1, 1])?.reshape([batch, vocab])?;
            let last = head.build(&last)?;
            let zero = b.scalar(DType::I32, 0.0)?;
            let written = self.write_caches(&b, &kvs, &|cache, new| Ok(cache.dynamic_update_slice(new, &zero, 2)?))?;
            let exe = Self::compile(&self.store, &b, &last, &self.caches, &written, &self.opts, "prefill")?;
            self.prefill.insert((len, head), exe);
        }
        Ok(&self.prefill[&(len, head)])
    }

    /// The decode-step executable a generation with `sampling` runs at its longest (the one
    /// attending over the most positions of those compiled; it returns ids: compiled by the
    /// first such generation, `None` before it).
    pub fn step_executable(&self, sampling: &Sampling) -> Option<&Executable> {
        let head = Head::of(sampling);
        self.decode.range((head, 0)..=(head, usize::MAX)).next_back().map(|(_, e)| e)
    }

    /// The decode-step executable a generation with `sampling` runs to write position `pos`
    /// (see [`Generator::live_for`]), if compiled.
    pub fn step_executable_at(&self, sampling: &Sampling, pos: usize) -> Option<&Executable> {
        self.decode.get(&(Head::of(sampling), self.live_for(pos)))
    }

    /// Per-kernel times of the decode step that writes position `pos` with `sampling`'s head
    /// (compiled by a generation that reached `pos`, else an error): `runs` timed runs after
    /// one untimed, every row fed token 0 at `pos` ([`Executable::profile`]). The step
    /// writes that position of the caches, as a generation's step would.
    pub fn profile_step(&self, sampling: &Sampling, pos: usize, runs: usize) -> Result<crate::Profile> {
        let exe = self.step_executable_at(sampling, pos).ok_or_else(|| {
            Error::Config(format!(
                "profile_step: no decode step compiled for position {pos} (attending over {} positions); \
                 generate past it first",
                self.live_for(pos)
            ))
        })?;
        if pos >= self.max_seq {
            return Err(Error::Config(format!("profile_step: position {pos} is past the cache's {}", self.max_seq)));
        }
        let ids = HostTensor::new([self.batch, 1], vec![0i32; self.batch])?;
        let mut feeds = step_feeds(Head::of(sampling), sampling, &mut Rng::new(sampling.seed), self.batch, Some(ids))?;
        feeds.push(("pos", HostTensor::new([self.batch], vec![pos as i32; self.batch])?));
        let refs: Vec<(&str, &HostTensor)> = feeds.iter().map(|(n, t)| (*n, t)).collect();
        Ok(exe.profile(&refs, 1, runs.max(1))?)
    }

    /// The decode-step executable returning logits over the whole cache (its stats, its
    /// memory plan).
    pub fn decode_executable(&self) -> &Executable {
        &self.decode[&(Head::Logits, self.max_seq)]
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
        let bad = |what: &str| Error::Config(format!("generate: {what} (sampling {sampling:?})"));
        if !(sampling.temperature >= 0.0 && sampling.temperature.is_finite()) {
            return Err(bad("temperature must be finite and ≥ 0"));
        }
        if sampling.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
            return Err(bad("top_p must be in (0, 1]"));
        }
        let batch = self.batch;
        let mut rng = Rng::new(sampling.seed);
        let mut tokens: Vec<Vec<i32>> = prompts.to_vec();
        let ids = HostTensor::new([batch, len], prompts.concat())?;
        // The executables that return the chosen ids (compiled on first use, outside the
        // timing), fed a draw per sequence when they sample.
        let head = Head::of(sampling);
        self.prefill(len, head)?;
        // A step per cache length the generation's positions need, compiled before it.
        for pos in len..len + new_tokens {
            let live = self.live_for(pos);
            self.decode(head, live)?;
        }
        // A decode step's host feeds: its draws, its position, and its ids where they come
        // from the host.
        let decode_feeds = |rng: &mut Rng, ids: Option<&[i32]>, pos: usize| -> Result<Vec<(&str, HostTensor)>> {
            let ids = ids.map(|ids| HostTensor::new([batch, 1], ids.to_vec())).transpose()?;
            let mut f = step_feeds(head, sampling, rng, batch, ids)?;
            f.push(("pos", HostTensor::new([batch], vec![pos as i32; batch])?));
            Ok(f)
        };
        let first = step_feeds(head, sampling, &mut rng, batch, Some(ids))?;
        let start = Instant::now();
        let mut run = submit_step(&self.prefill[&(len, head)], &first, None)?;
        let mut prefill_ms = 0.0;
        let mut last = start;
        let mut step_ms = Vec::with_capacity(new_tokens);
        let mut step_host_ms = Vec::with_capacity(new_tokens);
        let mut ended = vec![false; batch];
        for step in 0..new_tokens {
            // Step `step + 1` writes position `len + step` and needs this run's ids.
            let decode = &self.decode[&(head, self.live_for(len + step))];
            let ahead = match self.overlap && step + 1 < new_tokens {
                true => Some(submit_step(decode, &decode_feeds(&mut rng, None, len + step)?, Some(&run))?),
                false => None,
            };
            let exe = run.executable();
            let next = chosen_ids(run)?;
            let host_ms = exe.last_run_host_ms();
            let now = Instant::now();
            match step {
                0 => prefill_ms = (now - start).as_secs_f64() * 1e3,
                _ => {
                    step_ms.push((now - last).as_secs_f64() * 1e3);
                    step_host_ms.push(host_ms);
                }
            }
            last = now;
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
            run = match ahead {
                Some(a) => a,
                None => submit_step(decode, &decode_feeds(&mut rng, Some(&next), len + step)?, None)?,
            };
        }
        let decode_s = step_ms.iter().sum::<f64>() / 1e3;
        let tokens_per_s = if decode_s > 0.0 { (batch * step_ms.len()) as f64 / decode_s } else { f64::NAN };
        Ok(Generation { tokens, prefill_ms, step_ms, step_host_ms, tokens_per_s })
    }
}
