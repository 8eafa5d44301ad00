//! Per-kernel timing of an executable: each kernel in its own compute pass with GPU
//! timestamps at the pass's ends where the adapter has them (else each kernel submitted
//! alone and timed by the wall clock around its completion), repeated, medians kept. This
//! is what `fusegraph bench --profile` prints: where a compiled graph spends its time.

use crate::executable::Executable;
use crate::memory::buffer;
use crate::{Result, RuntimeError};
use fusegraph_ir::HostTensor;

/// Most timestamp queries one query set may hold in wgpu.
const MAX_QUERIES: usize = 4096;

/// The time of one kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// Position in dispatch order.
    pub index: usize,
    /// The kernel's label (member ops joined by `+`).
    pub label: String,
    /// Median milliseconds over the profiled runs.
    pub median_ms: f64,
}

/// Per-kernel times of an executable.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// One entry per dispatched kernel, in dispatch order.
    pub kernels: Vec<KernelTime>,
    /// Whether the times are GPU timestamps (else wall time of one submit per kernel, which
    /// includes the submit and wait overhead).
    pub gpu_timestamps: bool,
}

impl Profile {
    /// The sum of the kernels' medians.
    pub fn total_ms(&self) -> f64 {
        self.kernels.iter().map(|k| k.median_ms).sum()
    }

    /// The `n` slowest kernels, slowest first.
    pub fn slowest(&self, n: usize) -> Vec<&KernelTime> {
        let mut v: Vec<&KernelTime> = self.kernels.iter().collect();
        v.sort_by(|a, b| b.median_ms.total_cmp(&a.median_ms));
        v.truncate(n);
        v
    }
}

impl Executable {
    /// Runs once with `feeds` (uploading them and checking them as [`Executable::run`]
    /// does), then times each kernel over `runs` repetitions after `warmup` untimed ones.
    /// Parameter updates are not applied by the repetitions. Kernels hoisted out of every run
    /// ([`crate::CompileOptions::hoist_parameters`]) are not profiled.
    pub fn profile(&self, feeds: &[(&str, &HostTensor)], warmup: usize, runs: usize) -> Result<Profile> {
        let _running = self.take_turn();
        self.run_in_turn(feeds)?;
        let d = &self.device;
        // The hoisted kernels ran above; later runs skip them.
        let active: Vec<usize> =
            (self.first_kernel()..self.kernels.len()).filter(|&i| self.kernels[i].workgroups[0] > 0).collect();
        let stats = self.stats();
        let wait = || {
            d.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| RuntimeError::Wgpu { during: "waiting for a profiled run".into(), detail: e.to_string() })
        };
        let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(runs); active.len()];
        let per_set = MAX_QUERIES / 2;
        let sets: Vec<(wgpu::QuerySet, wgpu::Buffer, wgpu::Buffer)> = if d.has_timestamps() {
            active
                .chunks(per_set)
                .map(|chunk| {
                    let count = 2 * chunk.len();
                    let set = d.device.create_query_set(&wgpu::QuerySetDescriptor {
                        label: Some("fusegraph profile"),
                        ty: wgpu::QueryType::Timestamp,
                        count: count as u32,
                    });
                    let bytes = 8 * count as u64;
                    let resolve = buffer(
                        d,
                        "fusegraph profile timestamps",
                        bytes,
                        wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                    );
                    let read = buffer(
                        d,
                        "fusegraph profile readback",
                        bytes,
                        wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    );
                    (set, resolve, read)
                })
                .collect()
        } else {
            Vec::new()
        };
        for rep in 0..warmup + runs {
            if sets.is_empty() {
                for (slot, &k) in active.iter().enumerate() {
                    let mut encoder = d.device.create_command_encoder(&Default::default());
                    self.encode_kernel(&mut encoder, k, None);
                    let start = std::time::Instant::now();
                    d.queue.submit([encoder.finish()]);
                    wait()?;
                    if rep >= warmup {
                        samples[slot].push(start.elapsed().as_secs_f64() * 1e3);
                    }
                }
                continue;
            }
            let mut encoder = d.device.create_command_encoder(&Default::default());
            for (c, chunk) in active.chunks(per_set).enumerate() {
                let (set, resolve, read) = &sets[c];
                for (j, &k) in chunk.iter().enumerate() {
                    self.encode_kernel(&mut encoder, k, Some((set, 2 * j as u32)));
                }
                encoder.resolve_query_set(set, 0..2 * chunk.len() as u32, resolve, 0);
                encoder.copy_buffer_to_buffer(resolve, 0, read, 0, 16 * chunk.len() as u64);
            }
            d.queue.submit([encoder.finish()]);
            wait()?;
            let period = d.queue.get_timestamp_period() as f64;
            for (c, chunk) in active.chunks(per_set).enumerate() {
                let read = &sets[c].2;
                read.map_async(wgpu::MapMode::Read, .., |_| {});
                wait()?;
                {
                    let view = read.get_mapped_range(..).map_err(|e| RuntimeError::Wgpu {
                        during: "reading profile timestamps".into(),
                        detail: e.to_string(),
                    })?;
                    for j in 0..chunk.len() {
                        let at = |q: usize| u64::from_le_bytes(view[8 * q..8 * q + 8].try_into().expect("8 bytes"));
                        if rep >= warmup {
                            let ms = at(2 * j + 1).saturating_sub(at(2 * j)) as f64 * period / 1e6;
                            samples[c * per_set + j].push(ms);
                        }
                    }
                }
                read.unmap();
            }
        }
        let kernels = active
            .iter()
            .zip(samples)
            .map(|(&k, mut v)| {
                v.sort_by(f64::total_cmp);
                let median_ms = if v.is_empty() { f64::NAN } else { v[(v.len() - 1) / 2] };
                KernelTime { index: k, label: stats.kernels[k].label.clone(), median_ms }
            })
            .collect();
        Ok(Profile { kernels, gpu_timestamps: !sets.is_empty() })
    }

    /// Records kernel `k` alone (after the copies of its texture operands), with timestamps
    /// at `query` and `query + 1` of `set` around it, copies included, if given.
    fn encode_kernel(&self, encoder: &mut wgpu::CommandEncoder, k: usize, ts: Option<(&wgpu::QuerySet, u32)>) {
        self.encode_kernels(encoder, [k], ts);
    }
}
