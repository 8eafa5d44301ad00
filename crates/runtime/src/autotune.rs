//! Autotuning of the tiled matmul: for each class of GEMM shape a kernel computes, every
//! candidate tiling ([`MatmulTiling::CANDIDATES`], and for an f16 product that can run on
//! the adapter's cooperative matrices [`MatmulTiling::COOP_CANDIDATES`] too, so the tuner
//! also decides between tensor cores and the plain kernel) is timed once on this adapter and
//! the fastest kept: in memory, and on disk (`~/.cache/fusegraph/tiling-v4-<adapter>.txt`, keyed
//! by adapter and driver) so the next run reuses it. Off with
//! [`DeviceOptions::autotune`](crate::DeviceOptions::autotune) or `FUSEGRAPH_AUTOTUNE=off`
//! (every kernel then takes [`MatmulTiling::default_for`] its shape, for reproducible runs),
//! and off by default on llvmpipe through GL, where each candidate takes seconds to compile.
//!
//! A class is the element type, whether there is a batch, and `m`, `n`, `k` rounded up to
//! powers of two (from 16 to 4096), and `coop` where cooperative tilings are candidates.
//! A candidate that cannot be compiled here (over the adapter's workgroup memory, say) is
//! left out. Products below [`MIN_TUNED_MACS`] multiply-adds are not
//! tuned: dispatch cost dominates them and timing them says little. Each candidate runs the
//! class's representative product (the first shape seen, scaled down to at most
//! [`MAX_TIMED_MACS`] on a CPU adapter, [`MAX_TIMED_MACS_GPU`] on a GPU); on a CPU adapter
//! each candidate once to warm up and three times timed, one after the other; on a GPU, whose
//! clocks drift, all candidates once untimed and then once per round for five interleaved
//! rounds. The median decides.

use crate::{CompileOptions, Device, FusionMode, Result};
use fusegraph_ir::{DType, GraphBuilder, HostTensor};
use fusegraph_wgsl::{GemmShape, MatmulTiling};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Rounds in which a GPU times every candidate once (after one untimed round).
const GPU_ROUNDS: usize = 5;

/// Products smaller than this many multiply-adds keep the default tiling.
pub const MIN_TUNED_MACS: usize = 1 << 21;
/// On a CPU adapter the timed product of a class is scaled down to at most this many
/// multiply-adds.
pub const MAX_TIMED_MACS: usize = 1 << 26;
/// On a GPU, at most this many (4096³): a scaled-down product leaves most of a large GPU's
/// multiprocessors idle and so favours small tiles (more workgroups), while the class's
/// real products fill the chip. 4096³ takes milliseconds per run there.
pub const MAX_TIMED_MACS_GPU: usize = 1 << 36;

/// One tuned class: what was chosen, and whether it was measured in this process or read
/// from the disk cache.
#[derive(Clone, Debug, PartialEq)]
pub struct TunedTiling {
    /// The shape class, e.g. `f32 b1 m256 n1024 k1024`.
    pub class: String,
    /// The fastest candidate.
    pub tiling: MatmulTiling,
    /// Median milliseconds of each candidate that ran, when measured in this process; empty
    /// when read from the cache.
    pub timings: Vec<(MatmulTiling, f64)>,
}

/// The autotuner's state on a device.
#[derive(Default)]
pub(crate) struct Tuner {
    loaded: bool,
    chosen: BTreeMap<String, TunedTiling>,
}

fn bucket(x: usize) -> usize {
    x.clamp(16, 4096).next_power_of_two()
}

fn class(shape: &GemmShape, dtype: DType, coop: bool) -> String {
    let t = match dtype {
        DType::F32 | DType::F16 => dtype.to_string(),
        _ => "int".to_string(),
    };
    let b = if shape.batch > 1 { "batched" } else { "b1" };
    let c = if coop { " coop" } else { "" };
    format!("{t} {b} m{} n{} k{}{c}", bucket(shape.m), bucket(shape.n), bucket(shape.k))
}

/// The representative product timed for a class: `shape` with its largest dimensions halved
/// until it is at most `max_macs` multiply-adds (a batch first drops to 4).
fn timed_shape(shape: &GemmShape, max_macs: usize) -> GemmShape {
    let mut s = GemmShape { batch: shape.batch.min(4), ..*shape };
    while s.batch * s.m * s.n * s.k > max_macs {
        let largest = s.m.max(s.n).max(s.k);
        if s.m == largest {
            s.m = s.m.div_ceil(2);
        } else if s.n == largest {
            s.n = s.n.div_ceil(2);
        } else {
            s.k = s.k.div_ceil(2);
        }
    }
    s
}

fn parse_line(line: &str) -> Option<(String, MatmulTiling)> {
    let (class, tiling) = line.rsplit_once(" = ")?;
    Some((class.trim().to_string(), tiling.trim().parse().ok()?))
}

impl Device {
    /// The tiling for a tiled matmul kernel computing `shape` in `dtype`: the tuned choice of
    /// its class (measured now if this device has not seen the class and the disk cache has
    /// not either), or `None` where autotuning is off or the product is too small to tune.
    /// With `coop` (the kernel can run on cooperative matrices) the cooperative tilings are
    /// candidates too, and one of them is the choice where it was fastest.
    pub(crate) fn tuned_tiling(self: &Arc<Self>, shape: &GemmShape, dtype: DType, coop: bool) -> Option<MatmulTiling> {
        if !self.autotune || shape.batch * shape.m * shape.n * shape.k < MIN_TUNED_MACS {
            return None;
        }
        let key = class(shape, dtype, coop);
        {
            let mut tuner = self.tuner.lock().unwrap_or_else(|p| p.into_inner());
            if !tuner.loaded {
                tuner.loaded = true;
                let text =
                    crate::calibrate::cache_file(self, "tiling-v4").and_then(|p| std::fs::read_to_string(p).ok());
                for (class, tiling) in text.iter().flat_map(|t| t.lines()).filter_map(parse_line) {
                    tuner.chosen.insert(class.clone(), TunedTiling { class, tiling, timings: vec![] });
                }
            }
            if let Some(t) = tuner.chosen.get(&key) {
                return Some(t.tiling);
            }
        }
        // Measured outside the lock: timing compiles and runs executables on this device.
        let max_macs =
            if self.info().device_type == wgpu::DeviceType::Cpu { MAX_TIMED_MACS } else { MAX_TIMED_MACS_GPU };
        let tuned = match self.measure_tilings(&key, &timed_shape(shape, max_macs), dtype, coop) {
            Ok(t) => t,
            // A candidate that cannot run here (limits) leaves the default in place.
            Err(_) => return None,
        };
        let tiling = tuned.tiling;
        let mut tuner = self.tuner.lock().unwrap_or_else(|p| p.into_inner());
        tuner.chosen.insert(key, tuned);
        if let Some(path) = crate::calibrate::cache_file(self, "tiling-v4") {
            let text: String = tuner.chosen.values().map(|t| format!("{} = {}\n", t.class, t.tiling)).collect();
            // Written aside and renamed, so a reader never sees half a file.
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            let _ = std::fs::create_dir_all(path.parent().expect("a file in a folder"));
            if std::fs::write(&tmp, text).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }
        Some(tiling)
    }

    /// Times every candidate tiling on `shape` in `dtype` (the integer class runs i32), the
    /// cooperative ones too with `coop`. A candidate that fails to compile (over the device's
    /// limits) is left out; an error while timing, or no candidate compiling, abandons the
    /// class, which then keeps the default tiling.
    fn measure_tilings(
        self: &Arc<Self>,
        class: &str,
        shape: &GemmShape,
        dtype: DType,
        coop: bool,
    ) -> Result<TunedTiling> {
        let dt = match dtype {
            DType::F32 | DType::F16 => dtype,
            _ => DType::I32,
        };
        let GemmShape { batch, m, n, k } = *shape;
        let b = GraphBuilder::new();
        let lead: Vec<usize> = if batch > 1 { vec![batch] } else { vec![] };
        let x = b.input("a", dt, [lead.clone(), vec![m, k]].concat())?;
        let y = b.input("b", dt, [lead.clone(), vec![k, n]].concat())?;
        let out = x.matmul(&y)?;
        let (a_host, b_host) = (
            HostTensor::from_f64(dt, x.ty().shape.clone(), &pattern(batch * m * k, 1))?,
            HostTensor::from_f64(dt, y.ty().shape.clone(), &pattern(batch * k * n, 5))?,
        );
        let feeds = [("a", &a_host), ("b", &b_host)];
        let compile = |tiling: MatmulTiling| {
            let opts = CompileOptions {
                fusion: FusionMode::Off,
                simplify: false,
                matmul_tiling: Some(tiling),
                name: Some(format!("autotuning {class} with {tiling}")),
                // The product as the class has it, whatever FUSEGRAPH_SPLIT_K says.
                split_k: crate::SplitK::Off,
                ..Default::default()
            };
            self.compile(&b.graph(), &[out.id()], &opts)
        };
        let coop_candidates: &[MatmulTiling] = if coop { &MatmulTiling::COOP_CANDIDATES } else { &[] };
        let candidates = MatmulTiling::CANDIDATES.iter().chain(coop_candidates).copied();
        let mut timings = Vec::new();
        let mut failed = None;
        if self.info().device_type == wgpu::DeviceType::Cpu {
            // One candidate at a time: each holds its buffers only while it is timed, and on
            // a CPU adapter compiling is what costs (up to seconds per candidate).
            for tiling in candidates {
                match compile(tiling) {
                    Ok(exe) => timings.push((tiling, exe.time(&feeds, 1, 3)?.median())),
                    Err(e) => failed = Some(e),
                }
            }
        } else {
            // A GPU's speed drifts with its clocks: on an H100 the second candidate, timed
            // one after the other with one warm-up, took 3.8 ms for a kernel that ran in
            // 0.70 ms in the same process a little later, and the last candidate always
            // matched. So every candidate is compiled first, then all are run once untimed
            // and timed in GPU_ROUNDS interleaved rounds, and the median of each decides.
            let mut exes = Vec::new();
            for tiling in candidates {
                match compile(tiling) {
                    Ok(exe) => exes.push((tiling, exe)),
                    Err(e) => failed = Some(e),
                }
            }
            let mut ms = vec![Vec::new(); exes.len()];
            for round in 0..=GPU_ROUNDS {
                for ((_, exe), ms) in exes.iter().zip(&mut ms) {
                    let t = exe.time(&feeds, 0, 1)?;
                    if round > 0 {
                        ms.extend(t.ms);
                    }
                }
            }
            for ((tiling, _), ms) in exes.iter().zip(ms) {
                let t = crate::Timing { ms, gpu_timestamps: self.has_timestamps() };
                timings.push((*tiling, t.median()));
            }
        }
        let Some(tiling) = timings.iter().min_by(|a, b| a.1.total_cmp(&b.1)).map(|t| t.0) else {
            return Err(failed.expect("every candidate failed to compile"));
        };
        Ok(TunedTiling { class: class.to_string(), tiling, timings })
    }

    /// The tilings tuned so far on this device (measured or read from the disk cache), by
    /// class.
    pub fn tuned_tilings(&self) -> Vec<TunedTiling> {
        self.tuner.lock().unwrap_or_else(|p| p.into_inner()).chosen.values().cloned().collect()
    }

    /// Whether matmul autotuning is on for this device.
    pub fn autotune(&self) -> bool {
        self.autotune
    }
}

/// Values in [-0.5, 0.5) that vary along the buffer (not zeros, so timing sees real data).
fn pattern(len: usize, seed: usize) -> Vec<f64> {
    (0..len).map(|i| ((i * 7 + seed) % 13) as f64 / 13.0 - 0.5).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_to_powers_of_two_and_timed_shapes_shrink() {
        let s = GemmShape { batch: 1, m: 300, n: 1000, k: 7 };
        assert_eq!(class(&s, DType::F32, false), "f32 b1 m512 n1024 k16");
        assert_eq!(class(&GemmShape { batch: 12, ..s }, DType::I32, false), "int batched m512 n1024 k16");
        assert_eq!(class(&s, DType::F16, true), "f16 b1 m512 n1024 k16 coop");
        let big = GemmShape { batch: 48, m: 4096, n: 4096, k: 4096 };
        let t = timed_shape(&big, MAX_TIMED_MACS);
        assert!(t.batch * t.m * t.n * t.k <= MAX_TIMED_MACS, "{t:?}");
        assert_eq!(t.batch, 4);
        assert_eq!(
            parse_line("f32 b1 m512 n1024 k16 = 16x16/8x8/16").map(|p| p.1.to_string()).as_deref(),
            Some("16x16/8x8/16")
        );
        assert_eq!(parse_line("f32 b1 m512 = 16x16/8x8/128"), None, "not a usable tiling");
        // A cooperative tiling is read back as such, though its staging exceeds the plain
        // kernel's 16 KiB.
        let large = MatmulTiling::COOP_CANDIDATES[1];
        assert!(!large.is_valid() && large.is_cooperative());
        assert_eq!(parse_line(&format!("f16 b1 m4096 n4096 k4096 coop = {large}")).map(|p| p.1), Some(large));
    }
}
