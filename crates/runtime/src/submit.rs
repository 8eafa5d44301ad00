//! Runs in flight: [`Executable::submit`] checks the feeds, writes them, encodes and submits
//! a run and returns at once with a [`Submitted`], whose outputs are read when asked for
//! ([`Submitted::wait`]). A later run — of this executable or another on the same device —
//! can take one of its outputs as a feed without the value leaving the device
//! ([`Feed::Output`]: a copy recorded at the start of the later run, which the queue orders
//! after the earlier one). So a decode loop submits step `t + 1`, fed step `t`'s chosen ids,
//! before it reads step `t`'s: the device goes from one step to the next while the host
//! encodes the one after and reads the last, instead of idling for the host's share of each
//! step and a round trip.
//!
//! Each run in flight reads back through its own staging buffer, taken from the
//! executable's free list (a second one from the device's pool, under its limit, the first
//! time two runs of one executable are in flight), and returned on `wait` or drop.
//!
//! Host feeds are written by `queue.write_buffer`, which lands before the run's first
//! command. Where a chained output lies in the run's own arena (the executable fed its own
//! last output: a decode loop's steps), it may share bytes with an input slot the plan
//! reuses, which such a write would overwrite before the copy reads it; and a buffer cannot
//! be copied into itself. There every feed goes through the executable's feed buffer: host
//! feeds written there, the chained output copied there by the run's first command, then
//! each copied to its slot.

use crate::executable::{Executable, Unmap};
use crate::memory::Allocation;
use crate::pool::Kind;
use crate::{Result, RuntimeError};
use fusegraph_ir::HostTensor;
use fusegraph_passes::Location;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Where a feed of [`Executable::submit`] comes from.
#[derive(Clone, Copy)]
pub enum Feed<'a> {
    /// A value from the host, written before the run.
    Host(&'a HostTensor),
    /// Output `index` (in `compile`'s order) of a run submitted earlier on the same device,
    /// copied on the device. Its element type and element count must be the input's (a
    /// `[b]` output feeds a `[b, 1]` input), and its executable must not have been
    /// submitted again since (the newer run would have overwritten it).
    Output(&'a Submitted<'a>, usize),
}

impl<'a> From<&'a HostTensor> for Feed<'a> {
    fn from(t: &'a HostTensor) -> Self {
        Feed::Host(t)
    }
}

/// A run submitted by [`Executable::submit`] whose outputs have not been read yet. Dropping
/// it without [`Submitted::wait`] waits for the run and discards its outputs.
pub struct Submitted<'e> {
    exe: &'e Executable,
    /// The executable's run count when this run was submitted.
    run: u64,
    index: wgpu::SubmissionIndex,
    /// `None` once returned to the executable's free list.
    staging: Option<Allocation>,
    mapped: mpsc::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
    /// The host's time checking, writing, encoding and submitting.
    host: Duration,
}

/// Bytes copied for a chained feed: the value's, whole words.
fn value_bytes(t: &fusegraph_ir::TensorType) -> u64 {
    t.buffer_bytes() as u64
}

impl Executable {
    /// Submits a run with `feeds` (one per input, by name: from the host or from another
    /// run's output, [`Feed`]) and returns without waiting for it; its outputs are read by
    /// [`Submitted::wait`]. Runs of one executable may be in flight together: the device
    /// runs them in submission order. Errors (missing, unknown or mis-typed feeds, unset
    /// parameters, a chained output that is gone) come before anything is written.
    pub fn submit(&self, feeds: &[(&str, Feed<'_>)]) -> Result<Submitted<'_>> {
        let _running = self.take_turn();
        self.submit_in_turn(feeds)
    }

    /// [`Executable::run`], for a caller holding [`Executable::take_turn`]'s guard.
    pub(crate) fn run_in_turn(&self, feeds: &[(&str, &HostTensor)]) -> Result<Vec<HostTensor>> {
        let feeds: Vec<(&str, Feed)> = feeds.iter().map(|&(n, t)| (n, Feed::Host(t))).collect();
        self.submit_in_turn(&feeds)?.wait()
    }

    /// [`Executable::submit`], for a caller holding [`Executable::take_turn`]'s guard.
    pub(crate) fn submit_in_turn(&self, feeds: &[(&str, Feed<'_>)]) -> Result<Submitted<'_>> {
        let start = Instant::now();
        self.check_feeds(feeds)?;
        // Each chained feed's source (checked before anything is written), by input.
        let mut chained = std::collections::BTreeMap::new();
        for (name, feed) in feeds {
            if let (Some(slot), Feed::Output(run, i)) = (self.inputs.get(*name), feed) {
                chained.insert(*name, run.output_location(self, name, *i, &slot.ty)?);
            }
        }
        let arena = self.arena.buffer();
        let staged = match chained.values().any(|(buffer, _)| buffer == arena) {
            true => Some(self.feed_buffer()?),
            false => None,
        };
        let staging = self.take_staging()?;
        let d = &self.device;
        let scope = d.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut encoder =
            d.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("fusegraph run") });
        for (name, feed) in feeds {
            let Some(slot) = self.inputs.get(*name) else { continue };
            let bytes = value_bytes(&slot.ty);
            match (feed, &staged) {
                (Feed::Host(value), None) => d.queue.write_buffer(arena, slot.loc.offset, &value.to_bytes()),
                (Feed::Host(value), Some((buffer, places))) => {
                    d.queue.write_buffer(buffer, places[*name], &value.to_bytes())
                }
                (Feed::Output(..), Some((buffer, places))) => {
                    let (source, from) = &chained[*name];
                    encoder.copy_buffer_to_buffer(source, from.offset, buffer, places[*name], bytes);
                }
                (Feed::Output(..), None) => {
                    let (source, from) = &chained[*name];
                    encoder.copy_buffer_to_buffer(source, from.offset, arena, slot.loc.offset, bytes);
                }
            }
        }
        // Through the feed buffer: each fed input from its place there to its slot.
        if let Some((buffer, places)) = &staged {
            for (name, _) in feeds {
                if let Some(slot) = self.inputs.get(*name) {
                    encoder.copy_buffer_to_buffer(buffer, places[*name], arena, slot.loc.offset, value_bytes(&slot.ty));
                }
            }
        }
        let before = self.generation();
        self.encode(&mut encoder, None);
        for (slot, staging_offset) in &self.outputs {
            let src = self.region(slot.loc.region);
            encoder.copy_buffer_to_buffer(src, slot.loc.offset, staging.buffer(), *staging_offset, slot.loc.size);
        }
        // Parameters change last, so outputs hold this run's values whatever they alias.
        self.encode_updates(&mut encoder);
        let index = d.queue.submit([encoder.finish()]);
        let run = self.runs.fetch_add(1, Ordering::AcqRel) + 1;
        if let Some(e) = pollster::block_on(scope.pop()) {
            self.return_staging(staging);
            return Err(RuntimeError::Wgpu { during: "encoding the run".into(), detail: e.to_string() });
        }
        self.prepared_done(before);
        let (tx, mapped) = mpsc::channel();
        staging.buffer().map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        Ok(Submitted { exe: self, run, index, staging: Some(staging), mapped, host: start.elapsed() })
    }

    /// Checks `feeds` against the declared inputs (host feeds by type; chained ones in
    /// [`Submitted::output_location`]), that every bound input has a feed and every
    /// parameter a value.
    fn check_feeds(&self, feeds: &[(&str, Feed<'_>)]) -> Result<()> {
        // Any input the graph declares may be fed (checked against its declaration); feeds of
        // inputs the outputs do not need are ignored.
        let names = || self.declared_inputs.keys().cloned().collect::<Vec<_>>().join(", ");
        for (name, value) in feeds {
            let declared = self
                .declared_inputs
                .get(*name)
                .ok_or_else(|| RuntimeError::UnknownFeed { name: name.to_string(), inputs: names() })?;
            if let Feed::Host(value) = value {
                if value.ty() != *declared {
                    return Err(RuntimeError::WrongType {
                        what: "feed",
                        name: name.to_string(),
                        expected: declared.clone(),
                        got: value.ty(),
                    });
                }
            }
        }
        for (name, slot) in &self.inputs {
            if !feeds.iter().any(|(n, _)| n == name) {
                return Err(RuntimeError::MissingFeed { name: name.clone(), expected: slot.ty.clone() });
            }
        }
        for (name, (_, loaded)) in &self.params {
            if !loaded {
                let ty = self.declared_params[name].clone();
                return Err(RuntimeError::MissingParameter { name: name.clone(), ty });
            }
        }
        Ok(())
    }

    /// A staging buffer for a run: a free one, else a new one from the device's pool.
    fn take_staging(&self) -> Result<Allocation> {
        let free = self.staging.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match free {
            Some(s) => Ok(s),
            None => self.device.allocate(Kind::Staging, self.stats.staging_bytes, &mut 0, "a second staging buffer"),
        }
    }

    fn return_staging(&self, staging: Allocation) {
        self.staging.lock().unwrap_or_else(|p| p.into_inner()).push(staging);
    }

    /// The feed buffer (created on first use) and each input's place in it.
    fn feed_buffer(&self) -> Result<(wgpu::Buffer, std::collections::BTreeMap<&str, u64>)> {
        let mut places = std::collections::BTreeMap::new();
        let mut end = 0;
        for (name, slot) in &self.inputs {
            places.insert(name.as_str(), end);
            end += value_bytes(&slot.ty);
        }
        let mut held = self.feed_buffer.lock().unwrap_or_else(|p| p.into_inner());
        if held.is_none() {
            *held = Some(self.device.allocate(Kind::Storage, end.max(4), &mut 0, "the feed buffer")?);
        }
        Ok((held.as_ref().expect("just created").buffer().clone(), places))
    }
}

impl<'e> Submitted<'e> {
    /// Where output `index` of this run lies, for feeding input `name` (of type `ty`) of
    /// `target`: an error where the output does not exist, is of another element type or
    /// count, lives on another device, or was overwritten by a later run or a parameter
    /// update.
    fn output_location(
        &self,
        target: &Executable,
        name: &str,
        index: usize,
        ty: &fusegraph_ir::TensorType,
    ) -> Result<(wgpu::Buffer, Location)> {
        let bad = |reason: String| RuntimeError::ChainedFeed { name: name.to_string(), reason };
        let exe = self.exe;
        if !std::sync::Arc::ptr_eq(&exe.device, &target.device) {
            return Err(bad("the output's run is on another device".into()));
        }
        let Some((slot, _)) = exe.outputs.get(index) else {
            return Err(bad(format!("output {index} of a run with {} outputs", exe.outputs.len())));
        };
        if slot.ty.dtype != ty.dtype || slot.ty.shape.numel() != ty.shape.numel() {
            return Err(bad(format!("output {index} is {}, the input {ty}", slot.ty)));
        }
        let latest = exe.runs.load(Ordering::Acquire);
        if latest != self.run {
            return Err(bad(format!(
                "output {index} of run {} was overwritten: its executable ran {} more time(s) since",
                self.run,
                latest - self.run
            )));
        }
        let overlaps = |to: &Location| {
            to.region == slot.loc.region
                && to.offset < slot.loc.offset + slot.loc.size
                && slot.loc.offset < to.offset + to.size
        };
        if exe.updates.iter().any(|(_, to)| overlaps(to)) {
            return Err(bad(format!("output {index} lies in a parameter its run updates")));
        }
        Ok((exe.region(slot.loc.region).clone(), slot.loc))
    }

    /// The executable this run runs.
    pub fn executable(&self) -> &'e Executable {
        self.exe
    }

    /// Waits for the run and reads its outputs, in the order they were given to `compile`.
    /// The executable's [`Executable::last_run_host_ms`] becomes this run's host time
    /// (submitting, then reading the outputs once the device is done).
    pub fn wait(mut self) -> Result<Vec<HostTensor>> {
        let d = &self.exe.device;
        let wait = wgpu::PollType::Wait { submission_index: Some(self.index.clone()), timeout: None };
        d.device
            .poll(wait)
            .map_err(|e| RuntimeError::Wgpu { during: "waiting for the run".into(), detail: e.to_string() })?;
        let waited = Instant::now();
        let staging = self.staging.as_ref().expect("present until waited for");
        let mapped = self
            .mapped
            .recv()
            .map_err(|e| RuntimeError::Wgpu { during: "mapping the staging buffer".into(), detail: e.to_string() })
            .and_then(|r| {
                r.map_err(|e| RuntimeError::Wgpu { during: "mapping the staging buffer".into(), detail: e.to_string() })
            });
        let result = {
            // Once mapped, the staging buffer is unmapped on every way out, errors included: a
            // buffer left mapped would fail every later run that takes it.
            let _unmap = mapped.is_ok().then(|| Unmap(staging.buffer()));
            mapped?;
            let view = staging.buffer().get_mapped_range(..).map_err(|e| RuntimeError::Wgpu {
                during: "reading the staging buffer".into(),
                detail: e.to_string(),
            })?;
            self.exe
                .outputs
                .iter()
                .map(|(slot, off)| {
                    HostTensor::from_bytes(&slot.ty, &view[*off as usize..(*off + slot.loc.size) as usize])
                })
                .collect::<std::result::Result<Vec<_>, _>>()
        };
        let host = self.host + waited.elapsed();
        self.exe.host_ns.store(host.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
        if let Some(s) = self.staging.take() {
            self.exe.return_staging(s);
        }
        Ok(result?)
    }
}

impl Drop for Submitted<'_> {
    /// Waits for a run not waited for, so that its staging buffer returns unmapped.
    fn drop(&mut self) {
        let Some(staging) = self.staging.take() else { return };
        let wait = wgpu::PollType::Wait { submission_index: Some(self.index.clone()), timeout: None };
        if self.exe.device.device.poll(wait).is_ok() && matches!(self.mapped.try_recv(), Ok(Ok(()))) {
            staging.buffer().unmap();
            self.exe.return_staging(staging);
        }
        // Otherwise (a lost device, a failed map) it was never mapped: dropped, it returns
        // to the device's pool.
    }
}
