//! Continuous batching: one decode step serves the generator's `batch` rows, each a sequence
//! at its own position; a sequence joins a free row between steps and leaves when it ends.

use super::{chosen_ids, step_feeds, Generator, Rng};
use crate::sampling::{Head, Sampling};
use crate::{Error, HostTensor, Result};

/// Sequences generated together by one decode step at their own positions (continuous
/// batching), from [`Generator::batcher`]: up to the generator's batch of them at a time.
///
/// A sequence that joins takes a free row; its prompt goes through the same decode step a
/// token a step (no prefill executable of its own, so that the other rows keep generating),
/// then each step adds a token, until it has `max_new` of them, produces one of the
/// generator's end-of-sequence tokens, or fills the cache; then it leaves, freeing the row,
/// and [`Batcher::take_finished`] hands it out. A row's cache is written at its own positions
/// and read up to them only, so what a sequence gets does not depend on its neighbours:
/// greedy, its tokens are those it gets alone.
pub struct Batcher<'g> {
    gen: &'g mut Generator,
    sampling: Sampling,
    head: Head,
    rng: Rng,
    rows: Vec<Option<Row>>,
    finished: Vec<(u64, Vec<i32>)>,
    next_id: u64,
}

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
        self.rows[free] = Some(Row { id, prompt: prompt.len(), tokens: prompt, fed: 0, max_new });
        Ok(id)
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

    /// One decode step over every row: each sequence feeds its next token (from its prompt,
    /// or the last it generated) at its position; returns the tokens generated this step by
    /// sequence id. Sequences that end leave the batch ([`Batcher::take_finished`]). With no
    /// sequence, nothing runs.
    pub fn step(&mut self) -> Result<Vec<(u64, i32)>> {
        let Some(top) = self.rows.iter().flatten().map(|r| r.fed).max() else { return Ok(Vec::new()) };
        let batch = self.rows.len();
        // A free row runs position 0 with token 0: it writes its own cache row, which the
        // next sequence there overwrites from position 0 before it reads it.
        let ids: Vec<i32> = self.rows.iter().map(|r| r.as_ref().map_or(0, |r| r.tokens[r.fed])).collect();
        let pos: Vec<i32> = self.rows.iter().map(|r| r.as_ref().map_or(0, |r| r.fed as i32)).collect();
        let mut feeds = step_feeds(self.head, &self.sampling, &mut self.rng, HostTensor::new([batch, 1], ids)?)?;
        feeds.push(("pos", HostTensor::new([batch], pos)?));
        let chosen = chosen_ids(&self.gen.decode[&(self.head, self.gen.live_for(top))], &feeds)?;
        let mut out = Vec::new();
        for (slot, t) in self.rows.iter_mut().zip(chosen) {
            let Some(row) = slot else { continue };
            row.fed += 1;
            if row.fed < row.prompt {
                continue;
            }
            row.tokens.push(t);
            out.push((row.id, t));
            let ended = row.tokens.len() - row.prompt >= row.max_new
                || self.gen.stop.contains(&t)
                || row.tokens.len() >= self.gen.max_seq;
            if ended {
                let row = slot.take().expect("the row");
                self.finished.push((row.id, row.tokens));
            }
        }
        Ok(out)
    }
}
