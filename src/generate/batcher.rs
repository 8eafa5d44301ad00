//! Continuous batching: one decode step serves the generator's `batch` rows, each a sequence
//! at its own position; a sequence joins a free row between steps and leaves when it ends.

use super::{run_step, step_feeds, Generator, Rng};
use crate::sampling::{Head, Sampling};
use crate::{Error, HostTensor, Result};

/// Sequences generated together by one decode step at their own positions (continuous
/// batching), from [`Generator::batcher`]: up to the generator's batch of them at a time.
///
/// A sequence that joins takes a free row, and its prompt goes through a prefill of that row
/// alone ([`PREFILL_BUCKET`]: one executable per power-of-two prompt length, the prompt padded
/// to it), which writes the row's caches and chooses its first token while the other rows
/// wait that one run. Then each step adds a token, until it has `max_new` of them, produces
/// one of the generator's end-of-sequence tokens, or fills the cache; then it leaves, freeing
/// the row, and [`Batcher::take_finished`] hands it out. A row's cache is written at its own
/// positions and read up to them only, so what a sequence gets does not depend on its
/// neighbours: greedy, its tokens are those it gets alone.
pub struct Batcher<'g> {
    gen: &'g mut Generator,
    sampling: Sampling,
    head: Head,
    rng: Rng,
    rows: Vec<Option<Row>>,
    finished: Vec<(u64, Vec<i32>)>,
    /// First tokens chosen by joins' prefills, reported by the next step.
    pending: Vec<(u64, i32)>,
    next_id: u64,
}

/// The shortest prompt bucket of a [`Batcher`]'s prefill: a prompt of `n` tokens is padded
/// to the power of two at least `max(n, PREFILL_BUCKET)` (at most the cache's length), so a
/// server compiles a handful of prefills, not one per prompt length. The padding comes after
/// the prompt, so causal attention keeps it out of the prompt's positions, and the decode
/// steps overwrite its cache positions before any step reads them.
pub const PREFILL_BUCKET: usize = 16;

/// A sequence in a row: its tokens (prompt, then generated), how many of them the cache
/// holds, and when it ends.
struct Row {
    id: u64,
    tokens: Vec<i32>,
    fed: usize,
    prompt: usize,
    max_new: usize,
}

impl Generator {
    /// The prefill of one row of the caches for prompts padded to `bucket` tokens, ending in
    /// `head` (compiled on first use): `ids` `[1, bucket]`, the `row` to write and the `last`
    /// prompt position, whose logits choose the token. It writes the row's whole caches (the
    /// prompt's keys and values, zeros after), its other rows untouched.
    fn row_prefill(&mut self, bucket: usize, head: Head) -> Result<&crate::Executable> {
        if !self.row_prefill.contains_key(&(bucket, head)) {
            let vocab = self.model.vocab_size();
            let b = crate::GraphBuilder::new();
            let ids = b.input("ids", crate::DType::I32, [1, bucket])?;
            let row = b.input("row", crate::DType::I32, Vec::<usize>::new())?;
            let last = b.input("last", crate::DType::I32, Vec::<usize>::new())?;
            let (logits, kvs) = self.model.prefill(&ids)?;
            let chosen = head.build(&logits.dynamic_slice(&last, 1, 1)?.reshape([1, vocab])?)?;
            let rest = self.max_seq - bucket;
            let written = self.write_caches(&b, &kvs, &|cache, new| {
                let whole = if rest == 0 { new.clone() } else { new.pad(&[0; 4], &[0, 0, rest, 0], 0.0)? };
                Ok(cache.dynamic_update_slice(&whole, &row, 0)?)
            })?;
            let exe = Self::compile(&self.store, &b, &chosen, &self.caches, &written, &self.opts, "row prefill")?;
            self.row_prefill.insert((bucket, head), exe);
        }
        Ok(&self.row_prefill[&(bucket, head)])
    }

    /// A [`Batcher`] sampling with `sampling` (compiling the decode steps it needs, one per
    /// cache length, first).
    pub fn batcher(&mut self, sampling: &Sampling) -> Result<Batcher<'_>> {
        let head = Head::of(sampling);
        let mut live = 0;
        while live < self.max_seq {
            live = self.live_for(live);
            self.decode(head, live)?;
        }
        let rows = (0..self.batch).map(|_| None).collect();
        Ok(Batcher {
            gen: self,
            sampling: *sampling,
            head,
            rng: Rng::new(sampling.seed),
            rows,
            finished: Vec::new(),
            pending: Vec::new(),
            next_id: 0,
        })
    }
}

impl Batcher<'_> {
    /// Rows free for a sequence to join.
    pub fn free_rows(&self) -> usize {
        self.rows.iter().filter(|r| r.is_none()).count()
    }

    /// Sequences in the batch.
    pub fn active(&self) -> usize {
        self.rows.len() - self.free_rows()
    }

    /// Adds a sequence to generate up to `max_new` tokens after `prompt` (≥ 1 token, in the
    /// vocabulary, prompt plus new tokens within the generator's `max_seq`); returns its id.
    /// Errors: no free row, or a prompt that does not fit.
    pub fn join(&mut self, prompt: Vec<i32>, max_new: usize) -> Result<u64> {
        let vocab = self.gen.model.vocab_size() as i32;
        let max_seq = self.gen.max_seq;
        if prompt.is_empty() || prompt.len() + max_new > max_seq {
            return Err(Error::Config(format!(
                "batcher: a prompt of {} tokens plus {max_new} new ones must be 1..={max_seq} tokens",
                prompt.len()
            )));
        }
        if let Some(t) = prompt.iter().find(|t| !(0..vocab).contains(*t)) {
            return Err(Error::Config(format!("batcher: token {t} is outside the vocabulary 0..{vocab}")));
        }
        let Some(free) = self.rows.iter().position(Option::is_none) else {
            return Err(Error::Config(format!("batcher: all {} rows are taken", self.rows.len())));
        };
        let id = self.next_id;
        self.next_id += 1;
        let len = prompt.len();
        let bucket = len.max(PREFILL_BUCKET).next_power_of_two().min(max_seq);
        let mut ids = prompt.clone();
        ids.resize(bucket, 0);
        let mut feeds =
            step_feeds(self.head, &self.sampling, &mut self.rng, 1, Some(HostTensor::new([1, bucket], ids)?))?;
        feeds.push(("row", HostTensor::new(Vec::<usize>::new(), vec![free as i32])?));
        feeds.push(("last", HostTensor::new(Vec::<usize>::new(), vec![len as i32 - 1])?));
        let first = run_step(self.gen.row_prefill(bucket, self.head)?, &feeds)?[0];
        let mut row = Row { id, prompt: len, tokens: prompt, fed: len, max_new };
        self.pending.push((id, first));
        match self.add(&mut row, first) {
            true => self.finished.push((id, row.tokens)),
            false => self.rows[free] = Some(row),
        }
        Ok(id)
    }

    /// Appends `t` to `row`'s tokens; whether the sequence has ended: `max_new` tokens, an
    /// end-of-sequence token, or a full cache.
    fn add(&self, row: &mut Row, t: i32) -> bool {
        row.tokens.push(t);
        row.tokens.len() - row.prompt >= row.max_new
            || self.gen.stop.contains(&t)
            || row.tokens.len() >= self.gen.max_seq
    }

    /// Removes sequence `id` whether or not it has ended; returns its tokens (prompt, then
    /// those generated), or `None` for an id not in the batch.
    pub fn leave(&mut self, id: u64) -> Option<Vec<i32>> {
        let row = self.rows.iter_mut().find(|r| r.as_ref().is_some_and(|r| r.id == id))?;
        row.take().map(|r| r.tokens)
    }

    /// The sequences that ended since the last call, with their tokens (prompt, then those
    /// generated), in the order they ended.
    pub fn take_finished(&mut self) -> Vec<(u64, Vec<i32>)> {
        std::mem::take(&mut self.finished)
    }

    /// One decode step over every row: each sequence feeds the last token it generated at
    /// its position; returns the tokens generated since the last step by sequence id (the
    /// first tokens of sequences that joined, then this step's). Sequences that end leave the
    /// batch ([`Batcher::take_finished`]). With no sequence, nothing runs.
    pub fn step(&mut self) -> Result<Vec<(u64, i32)>> {
        let mut out = std::mem::take(&mut self.pending);
        let Some(top) = self.rows.iter().flatten().map(|r| r.fed).max() else { return Ok(out) };
        let batch = self.rows.len();
        // A free row runs position 0 with token 0: it writes its own cache row, which the
        // next sequence there overwrites from position 0 before it reads it.
        let ids: Vec<i32> = self.rows.iter().map(|r| r.as_ref().map_or(0, |r| r.tokens[r.fed])).collect();
        let pos: Vec<i32> = self.rows.iter().map(|r| r.as_ref().map_or(0, |r| r.fed as i32)).collect();
        let ids = HostTensor::new([batch, 1], ids)?;
        let mut feeds = step_feeds(self.head, &self.sampling, &mut self.rng, batch, Some(ids))?;
        feeds.push(("pos", HostTensor::new([batch], pos)?));
        let chosen = run_step(&self.gen.decode[&(self.head, self.gen.live_for(top))], &feeds)?;
        for (r, t) in chosen.into_iter().enumerate() {
            let Some(mut row) = self.rows[r].take() else { continue };
            row.fed += 1;
            out.push((row.id, t));
            match self.add(&mut row, t) {
                true => self.finished.push((row.id, row.tokens)),
                false => self.rows[r] = Some(row),
            }
        }
        Ok(out)
    }
}
