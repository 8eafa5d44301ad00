//! Autotuning of the tiled matmul: for each class of GEMM shape a kernel computes, at most
//! [`TIMED_TILINGS`] candidate tilings are timed once on this adapter — the untuned default,
//! the nearest measured class's winner and the best by a cost model ([`timed_tilings`]) of
//! [`MatmulTiling::CANDIDATES`], and for an f16 product that can run on the adapter's
//! cooperative matrices of [`MatmulTiling::COOP_CANDIDATES`] too, so the tuner also decides
//! between tensor cores and the plain kernel — and the fastest kept: in memory, and on disk (`~/.cache/fusegraph/tiling-v4-<adapter>.txt`, keyed
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
//!
//! Split-k ([`SplitK::Tuned`](crate::SplitK::Tuned)) is tuned the same way: per class, the
//! class's first product at its full size, compiled fused unsplit and split into each of
//! [`split_candidates`] slices (the product and its sum), timed as above; the fastest slice
//! count is kept in memory and in `splitk-v1-<adapter>.txt`.

use crate::tuned::{TunedFamily, TunedSplit, TunedTiling};
use crate::{CompileOptions, Device, FusionMode, MatmulFamily, Result};
use fusegraph_ir::{DType, GraphBuilder, HostTensor};
use fusegraph_passes::split_k::{FillOptions, Gemm};
use fusegraph_wgsl::{GemmShape, MatmulTiling};
use std::sync::Arc;

/// Rounds in which a GPU times every candidate once (after one untimed round).
const GPU_ROUNDS: usize = 5;

/// A GPU candidate this many times slower than the fastest in the untimed round is not
/// timed further.
const DROP_AFTER_WARMUP: f64 = 3.0;

/// Products smaller than this many multiply-adds keep the default tiling.
pub const MIN_TUNED_MACS: usize = 1 << 21;
/// On a CPU adapter the timed product of a class is scaled down to at most this many
/// multiply-adds.
pub const MAX_TIMED_MACS: usize = 1 << 26;
/// On a GPU, at most this many (4096³): a scaled-down product leaves most of a large GPU's
/// multiprocessors idle and so favours small tiles (more workgroups), while the class's
/// real products fill the chip. 4096³ takes milliseconds per run there.
pub const MAX_TIMED_MACS_GPU: usize = 1 << 36;

/// The slice counts split-k tuning tries for `gemm`: 1 (no split), then 2, 4, 8, 16 while each
/// slice is whole vec4s and at least `min_k` long.
pub(crate) fn split_candidates(gemm: &Gemm) -> Vec<usize> {
    let min_k = FillOptions::default().min_k;
    let mut out = vec![1];
    let mut s = 2;
    while s <= FillOptions::default().max_splits && gemm.k.is_multiple_of(4 * s) && gemm.k / s >= min_k {
        out.push(s);
        s *= 2;
    }
    out
}

/// Median milliseconds per candidate that compiled, and the last compile error.
type Timed<C> = (Vec<(C, f64)>, Option<crate::RuntimeError>);

/// The candidate with the smallest median, or the last compile error where none compiled.
pub(crate) fn fastest<C: Copy>(timings: &[(C, f64)], failed: Option<crate::RuntimeError>) -> Result<C> {
    match timings.iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
        Some(&(best, _)) => Ok(best),
        None => Err(failed.expect("every candidate failed to compile")),
    }
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

/// The tilings cache file's stem.
const TILINGS: &str = "tiling-v4";

/// A tiling read from the cache file (no timings).
fn cached_tiling(class: String, tiling: MatmulTiling) -> TunedTiling {
    TunedTiling { class, tiling, timings: vec![] }
}

/// A tiling's line in the cache file.
fn tiling_line(t: &TunedTiling) -> String {
    format!("{} = {}\n", t.class, t.tiling)
}

/// Tilings timed for a new shape class: at most this many.
pub const TIMED_TILINGS: usize = 4;

/// Workgroups a GPU runs at once, as the tiling cost model counts them (a few per
/// multiprocessor of a large GPU).
const GPU_FILL: usize = 256;
/// Workgroups a CPU adapter runs at once, as the tiling cost model counts them.
const CPU_FILL: usize = 16;

/// The cost model's estimate for `t` computing `shape`, in arbitrary units: the waves of
/// workgroups (`fill` at a time) times each invocation's multiply-adds per tile, weighed by
/// the workgroup-memory reads per multiply-add its register block needs
/// (`(bm + bn) / (bm · bn)`) and the device-memory reads per multiply-add of its tile.
/// Padding (a tile over the edge of the output) counts as work.
pub(crate) fn predicted_cost(t: &MatmulTiling, shape: &GemmShape, fill: usize) -> f64 {
    let (tm, tn) = t.tile();
    let tiles = shape.batch * shape.m.div_ceil(tm) * shape.n.div_ceil(tn);
    let waves = tiles.div_ceil(fill) as f64;
    let per_invocation = (tm * tn * shape.k) as f64 / (t.gx * t.gy) as f64;
    let shared = (t.bm + t.bn) as f64 / (t.bm * t.bn) as f64;
    let global = (tm + tn) as f64 / (tm * tn) as f64;
    waves * per_invocation * (1.0 + 2.0 * shared + 8.0 * global)
}

/// The tilings timed for a new class of `shape`, at most [`TIMED_TILINGS`]: the untuned
/// default for the shape (so that tuning never keeps a slower tiling than no tuning), with
/// `coop` the default cooperative tiling, `nearest` (the winner of the nearest class
/// measured so far) where given, then the cost model's best ([`predicted_cost`], `fill`
/// workgroups at a time) of [`MatmulTiling::CANDIDATES`] (and, with `coop`,
/// [`MatmulTiling::COOP_CANDIDATES`]).
pub(crate) fn timed_tilings(
    shape: &GemmShape,
    coop: bool,
    nearest: Option<MatmulTiling>,
    fill: usize,
) -> Vec<MatmulTiling> {
    let mut out = vec![MatmulTiling::default_for(shape.m, shape.n)];
    if coop {
        out.push(MatmulTiling::COOP_CANDIDATES[0]);
    }
    let coop_candidates: &[MatmulTiling] = if coop { &MatmulTiling::COOP_CANDIDATES } else { &[] };
    let mut ranked: Vec<MatmulTiling> = MatmulTiling::CANDIDATES.iter().chain(coop_candidates).copied().collect();
    // Stable: ties keep the candidates' order.
    ranked.sort_by(|a, b| predicted_cost(a, shape, fill).total_cmp(&predicted_cost(b, shape, fill)));
    let usable = |t: &MatmulTiling| coop || !t.is_cooperative();
    for t in nearest.filter(usable).into_iter().chain(ranked) {
        if out.len() == TIMED_TILINGS {
            break;
        }
        if !out.contains(&t) {
            out.push(t);
        }
    }
    out
}

/// The winner of the measured class nearest to `class` (the same element type, batching and
/// cooperative flag; the fewest doublings of `m`, `n` and `k` apart), if any.
fn nearest_winner<'a>(class: &str, measured: impl Iterator<Item = (&'a str, MatmulTiling)>) -> Option<MatmulTiling> {
    // `f32 b1 m512 n1024 k16 coop`: the kind is every word but the dimensions.
    let parse = |c: &str| -> Option<(Vec<String>, [f64; 3])> {
        let (mut kind, mut dims) = (Vec::new(), [None; 3]);
        for w in c.split_whitespace() {
            let dim = ["m", "n", "k"].iter().position(|p| w.starts_with(p));
            match dim.and_then(|i| Some((i, w[1..].parse::<f64>().ok()?))) {
                Some((i, v)) => dims[i] = Some(v.log2()),
                None => kind.push(w.to_string()),
            }
        }
        Some((kind, [dims[0]?, dims[1]?, dims[2]?]))
    };
    let (kind, dims) = parse(class)?;
    measured
        .filter(|(c, _)| *c != class)
        .filter_map(|(c, t)| {
            let (k, d) = parse(c)?;
            (k == kind).then(|| ((0..3).map(|i| (d[i] - dims[i]).abs()).sum::<f64>(), t))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, t)| t)
}

impl Device {
    /// The tiling for a tiled matmul kernel computing `shape` in `dtype`: the tuned choice of
    /// its class (measured now if this device has not seen the class and the disk cache has
    /// not either), or `None` where autotuning is off or the product is too small to tune.
    /// With `coop` (the kernel can run on cooperative matrices) the cooperative tilings are
    /// candidates too, and one of them is the choice where it was fastest.
    pub(crate) fn tuned_tiling(self: &Arc<Self>, shape: &GemmShape, dtype: DType, coop: bool) -> Option<MatmulTiling> {
        if !self.autotune || super::measuring() || shape.batch * shape.m * shape.n * shape.k < MIN_TUNED_MACS {
            return None;
        }
        let key = class(shape, dtype, coop);
        {
            let mut tuner = self.tuner.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(t) = tuner.tilings.get(&self.cache, TILINGS, &key, cached_tiling) {
                return Some(t.tiling);
            }
        }
        // Measured outside the lock: timing compiles and runs executables on this device.
        let start = std::time::Instant::now();
        let measured = super::during(|| self.measure_tilings(&key, shape, dtype, coop));
        let tuned = match measured {
            Ok(t) => t,
            // A candidate that cannot run here (limits) leaves the default in place.
            Err(e) => {
                tracing::warn!(target: "fusegraph::autotune", class = %key, "kept the default tiling: {e}");
                return None;
            }
        };
        let tiling = tuned.tiling;
        tracing::info!(
            target: "fusegraph::autotune",
            class = %key,
            tiling = %tiling,
            timed = tuned.timings.len(),
            seconds = start.elapsed().as_secs_f64(),
            "tuned the matmul tilings of a new shape class"
        );
        let mut tuner = self.tuner.lock().unwrap_or_else(|p| p.into_inner());
        tuner.tilings.insert(&self.cache, TILINGS, key, tuned, tiling_line);
        Some(tiling)
    }

    /// Into how many slices of `k` [`SplitK::Tuned`](crate::SplitK::Tuned) splits a product
    /// of `gemm`'s dims: its class's tuned choice (measured now if neither this device nor
    /// the disk cache, `splitk-v1-<adapter>.txt`, has it), where that divides this `k`
    /// into whole vec4s; 1 where autotuning is off, the product is below
    /// [`MIN_TUNED_MACS`], or `k` allows no split. Each candidate of
    /// [`split_candidates`] is the class's first product (at its full size: the split is
    /// about filling the device) compiled fused with that many slices and timed, the sum
    /// included, as tilings are timed.
    pub(crate) fn tuned_split_count(self: &Arc<Self>, gemm: &Gemm) -> usize {
        let shape = GemmShape { batch: gemm.batch, m: gemm.m, n: gemm.n, k: gemm.k };
        if !self.autotune
            || super::measuring()
            || gemm.batch * gemm.m * gemm.n * gemm.k < MIN_TUNED_MACS
            || split_candidates(gemm).len() < 2
        {
            return 1;
        }
        let fits = |s: usize| if s >= 2 && gemm.k.is_multiple_of(4 * s) { s } else { 1 };
        let key = class(&shape, gemm.dtype, false);
        {
            let mut tuner = self.tuner.lock().unwrap_or_else(|p| p.into_inner());
            let read = |class, splits| TunedSplit { class, splits, timings: vec![] };
            if let Some(t) = tuner.splits.get(&self.cache, "splitk-v1", &key, read) {
                return fits(t.splits);
            }
        }
        let Ok(tuned) = super::during(|| self.measure_splits(&key, &shape, gemm)) else { return 1 };
        let splits = tuned.splits;
        let mut tuner = self.tuner.lock().unwrap_or_else(|p| p.into_inner());
        tuner.splits.insert(&self.cache, "splitk-v1", key, tuned, |t| format!("{} = {}\n", t.class, t.splits));
        fits(splits)
    }

    /// Times `gemm`'s product split into each of [`split_candidates`] slices.
    fn measure_splits(self: &Arc<Self>, class: &str, shape: &GemmShape, gemm: &Gemm) -> Result<TunedSplit> {
        let (b, out, a_host, b_host) = product(shape, gemm.dtype)?;
        let graph = b.graph();
        let feeds = [("a", &a_host), ("b", &b_host)];
        let compile = |s: usize| {
            let opts = CompileOptions {
                split_k: if s > 1 { crate::SplitK::Slices(s) } else { crate::SplitK::Off },
                name: Some(format!("split-k tuning {class} with {s} slices")),
                ..Default::default()
            };
            self.compile(&graph, &[out], &opts)
        };
        let (timings, failed) = self.time_candidates(split_candidates(gemm), compile, &feeds, false)?;
        let splits = fastest(&timings, failed)?;
        Ok(TunedSplit { class: class.to_string(), splits, timings })
    }

    /// Times each candidate's executable on `feeds`: on a CPU adapter one after the other
    /// (one warm-up, three timed runs each; each holds its buffers only while it is timed,
    /// and compiling is what costs there, up to seconds per candidate); on a GPU all
    /// compiled first, run once untimed, then timed in [`GPU_ROUNDS`] interleaved rounds (but
    /// for those [`DROP_AFTER_WARMUP`] times slower than the fastest in the untimed round). A
    /// GPU's speed drifts with its clocks, so candidates timed one after the other would be
    /// compared at different clocks; interleaved rounds see the same. `interleaved` times a
    /// CPU adapter's candidates in rounds too (a few cheap candidates, whose comparison
    /// should not depend on what else the machine was doing at one moment). Returns the
    /// median per candidate that compiled, and the last compile error.
    pub(crate) fn time_candidates<C: Copy + Send>(
        self: &Arc<Self>,
        candidates: impl IntoIterator<Item = C>,
        compile: impl Fn(C) -> Result<crate::Executable> + Sync,
        feeds: &[(&str, &HostTensor)],
        interleaved: bool,
    ) -> Result<Timed<C>> {
        let mut timings = Vec::new();
        let mut failed = None;
        if self.info().device_type == wgpu::DeviceType::Cpu && !interleaved {
            for c in candidates {
                match compile(c) {
                    Ok(exe) => timings.push((c, exe.time(feeds, 1, 3)?.median())),
                    Err(e) => failed = Some(e),
                }
            }
        } else {
            let start = std::time::Instant::now();
            let mut exes = Vec::new();
            for (c, compiled) in self.compile_all(candidates, &compile) {
                match compiled {
                    Ok(exe) => exes.push((c, exe)),
                    Err(e) => failed = Some(e),
                }
            }
            let compiled = start.elapsed();
            // The untimed round first: a candidate over `DROP_AFTER_WARMUP` times the fastest
            // there cannot win and is not run again (its warm-up time stands for it).
            let warm: Vec<f64> =
                exes.iter().map(|(_, exe)| Ok(exe.time(feeds, 0, 1)?.median())).collect::<Result<_>>()?;
            let best = warm.iter().copied().fold(f64::INFINITY, f64::min);
            let kept: Vec<bool> = warm.iter().map(|&w| w <= best * DROP_AFTER_WARMUP).collect();
            let mut ms = vec![Vec::new(); exes.len()];
            for _ in 0..GPU_ROUNDS {
                for (((_, exe), ms), _) in exes.iter().zip(&mut ms).zip(&kept).filter(|(_, &k)| k) {
                    ms.extend(exe.time(feeds, 0, 1)?.ms);
                }
            }
            for (((c, _), ms), w) in exes.iter().zip(ms).zip(warm) {
                let t = crate::Timing { ms, gpu_timestamps: self.has_timestamps() };
                timings.push((*c, if t.ms.is_empty() { w } else { t.median() }));
            }
            tracing::info!(
                target: "fusegraph::autotune",
                candidates = exes.len(),
                dropped = kept.iter().filter(|k| !**k).count(),
                compile_s = compiled.as_secs_f64(),
                run_s = (start.elapsed() - compiled).as_secs_f64(),
                "timed candidates"
            );
        }
        Ok((timings, failed))
    }

    /// Each candidate's executable, compiled on a thread of its own where the backend allows
    /// it (creating a pipeline is most of a candidate's cost on a GPU, and drivers compile
    /// in parallel); one after the other on GL, whose context takes one thread at a time.
    /// The threads measure as this one does ([`super::during`]).
    fn compile_all<C: Copy + Send>(
        &self,
        candidates: impl IntoIterator<Item = C>,
        compile: &(impl Fn(C) -> Result<crate::Executable> + Sync),
    ) -> Vec<(C, Result<crate::Executable>)> {
        let candidates: Vec<C> = candidates.into_iter().collect();
        if self.info().backend == wgpu::Backend::Gl || candidates.len() < 2 {
            return candidates.into_iter().map(|c| (c, compile(c))).collect();
        }
        std::thread::scope(|scope| {
            let threads: Vec<_> =
                candidates.iter().map(|&c| (c, scope.spawn(move || super::during(|| compile(c))))).collect();
            threads
                .into_iter()
                .map(|(c, t)| {
                    let compiled = t.join().unwrap_or_else(|_| {
                        Err(crate::RuntimeError::Wgpu {
                            during: "compiling a candidate".into(),
                            detail: "panicked".into(),
                        })
                    });
                    (c, compiled)
                })
                .collect()
        })
    }

    /// Times the few tilings worth timing for `shape`'s class ([`timed_tilings`]: the
    /// defaults, the nearest measured class's winner and the cost model's best) on its
    /// representative product in `dtype` (the integer class runs i32). A candidate that
    /// fails to compile (over the device's limits) is left out; an error while timing, or
    /// no candidate compiling, abandons the class, which then keeps the default tiling.
    fn measure_tilings(
        self: &Arc<Self>,
        class: &str,
        shape: &GemmShape,
        dtype: DType,
        coop: bool,
    ) -> Result<TunedTiling> {
        let candidates = self.candidate_tilings(class, shape, coop);
        let timed = self.timed_shape(shape);
        let (tiling, timings) =
            self.time_product(class, &timed, dtype, candidates, |tiling, opts| opts.matmul_tiling = Some(tiling))?;
        Ok(TunedTiling { class: class.to_string(), tiling, timings })
    }

    /// The tilings timed for a new `class` of `shape` on this adapter ([`timed_tilings`],
    /// with the nearest class measured so far).
    fn candidate_tilings(&self, class: &str, shape: &GemmShape, coop: bool) -> Vec<MatmulTiling> {
        let nearest = {
            let mut tuner = self.tuner.lock().unwrap_or_else(|p| p.into_inner());
            // The cache file read first: its classes are neighbours too.
            let _ = tuner.tilings.get(&self.cache, TILINGS, class, cached_tiling);
            nearest_winner(class, tuner.tilings.by_class.values().map(|t| (t.class.as_str(), t.tiling)))
        };
        let fill = if self.info().device_type == wgpu::DeviceType::Cpu { CPU_FILL } else { GPU_FILL };
        timed_tilings(shape, coop, nearest, fill)
    }

    /// The product a shape class is timed on here: `shape` scaled down to at most
    /// [`MAX_TIMED_MACS`] on a CPU adapter, [`MAX_TIMED_MACS_GPU`] on a GPU.
    fn timed_shape(&self, shape: &GemmShape) -> GemmShape {
        let cpu = self.info().device_type == wgpu::DeviceType::Cpu;
        timed_shape(shape, if cpu { MAX_TIMED_MACS } else { MAX_TIMED_MACS_GPU })
    }

    /// Times each of `candidates` on the product `shape` in `dtype` (the integer class runs
    /// i32), compiled unfused and unsplit (the product as the class has it) with `choose`
    /// applied to the options; returns the fastest and every candidate's median. A candidate
    /// that fails to compile (over the device's limits) is left out; an error while timing,
    /// or no candidate compiling, is the error.
    fn time_product<C: Copy + Send>(
        self: &Arc<Self>,
        class: &str,
        shape: &GemmShape,
        dtype: DType,
        candidates: impl IntoIterator<Item = C>,
        choose: impl Fn(C, &mut CompileOptions) + Sync,
    ) -> Result<(C, Vec<(C, f64)>)> {
        let (b, out, a_host, b_host) = product(shape, dtype)?;
        let graph = b.graph();
        let feeds = [("a", &a_host), ("b", &b_host)];
        let compile = |c: C| {
            let mut opts = CompileOptions {
                fusion: FusionMode::Off,
                simplify: false,
                name: Some(format!("autotuning {class}")),
                split_k: crate::SplitK::Off,
                ..Default::default()
            };
            choose(c, &mut opts);
            self.compile(&graph, &[out], &opts)
        };
        let (timings, failed) = self.time_candidates(candidates, compile, &feeds, false)?;
        Ok((fastest(&timings, failed)?, timings))
    }

    /// Whether products of `shape`'s class in `dtype` run fastest on the subgroup matmul
    /// rather than the tiled kernel, where both apply: measured once per class and cached
    /// (`family-v1-<adapter>.txt`), as tilings are. The subgroup kernel is timed beside the
    /// tiled candidates of [`timed_tilings`] in one measurement; where the tiled family wins,
    /// its fastest tiling is the class's tuned tiling too (cached as [`Device::tuned_tiling`]
    /// would), so the class is timed once. `None` where autotuning is off or the product is
    /// below [`MIN_TUNED_MACS`].
    pub(crate) fn tuned_family(self: &Arc<Self>, shape: &GemmShape, dtype: DType) -> Option<bool> {
        if !self.autotune || super::measuring() || shape.batch * shape.m * shape.n * shape.k < MIN_TUNED_MACS {
            return None;
        }
        let key = class(shape, dtype, false);
        {
            let mut tuner = self.tuner.lock().unwrap_or_else(|p| p.into_inner());
            let read = |class, family: String| TunedFamily { class, subgroup: family == "subgroup", timings: vec![] };
            if let Some(t) = tuner.families.get(&self.cache, "family-v1", &key, read) {
                return Some(t.subgroup);
            }
        }
        let start = std::time::Instant::now();
        // `None`: the subgroup kernel; `Some(tiling)`: the tiled kernel with that tiling.
        let candidates: Vec<Option<MatmulTiling>> =
            std::iter::once(None).chain(self.candidate_tilings(&key, shape, false).into_iter().map(Some)).collect();
        let timed = self.timed_shape(shape);
        let measured = super::during(|| {
            self.time_product(&key, &timed, dtype, candidates, |c, opts| {
                opts.matmul_family = if c.is_none() { MatmulFamily::Subgroup } else { MatmulFamily::Tiled };
                opts.matmul_tiling = c;
            })
        });
        let (best, timings) = match measured {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(target: "fusegraph::autotune", class = %key, "kept the adapter's matmul family: {e}");
                return None;
            }
        };
        let fastest_of = |subgroup: bool| {
            timings.iter().filter(|t| t.0.is_none() == subgroup).map(|t| t.1).min_by(|a, b| a.total_cmp(b))
        };
        let family_timings = [true, false].into_iter().filter_map(|sg| Some((sg, fastest_of(sg)?))).collect();
        let tuned = TunedFamily { class: key.clone(), subgroup: best.is_none(), timings: family_timings };
        tracing::info!(
            target: "fusegraph::autotune",
            class = %key,
            subgroup = tuned.subgroup,
            timed = timings.len(),
            seconds = start.elapsed().as_secs_f64(),
            "measured the matmul family (and tilings) of a new shape class"
        );
        let mut tuner = self.tuner.lock().unwrap_or_else(|p| p.into_inner());
        let line = |t: &TunedFamily| format!("{} = {}\n", t.class, if t.subgroup { "subgroup" } else { "tiled" });
        tuner.families.insert(&self.cache, "family-v1", key.clone(), tuned, line);
        if let Some(tiling) = best {
            // The cache file read first, so that rewriting it keeps its other classes.
            let _ = tuner.tilings.get(&self.cache, TILINGS, &key, cached_tiling);
            let timings = timings.iter().filter_map(|&(c, ms)| Some((c?, ms))).collect();
            let tuned = TunedTiling { class: key.clone(), tiling, timings };
            tuner.tilings.insert(&self.cache, TILINGS, key, tuned, tiling_line);
        }
        Some(best.is_none())
    }

    /// Whether matmul autotuning is on for this device.
    pub fn autotune(&self) -> bool {
        self.autotune
    }
}

/// The product `a · b` of `shape` in `dtype` (the integer class runs i32), with feeds.
fn product(shape: &GemmShape, dtype: DType) -> Result<(GraphBuilder, fusegraph_ir::NodeId, HostTensor, HostTensor)> {
    let dt = match dtype {
        DType::F32 | DType::F16 => dtype,
        _ => DType::I32,
    };
    let GemmShape { batch, m, n, k } = *shape;
    let b = GraphBuilder::new();
    let lead: Vec<usize> = if batch > 1 { vec![batch] } else { vec![] };
    let x = b.input("a", dt, [lead.clone(), vec![m, k]].concat())?;
    let y = b.input("b", dt, [lead.clone(), vec![k, n]].concat())?;
    let out = x.matmul(&y)?.id();
    let a_host = HostTensor::from_f64(dt, x.ty().shape.clone(), &pattern(batch * m * k, 1))?;
    let b_host = HostTensor::from_f64(dt, y.ty().shape.clone(), &pattern(batch * k * n, 5))?;
    Ok((b, out, a_host, b_host))
}

/// Values in [-0.5, 0.5) that vary along the buffer (not zeros, so timing sees real data).
pub(crate) fn pattern(len: usize, seed: usize) -> Vec<f64> {
    (0..len).map(|i| ((i * 7 + seed) % 13) as f64 / 13.0 - 0.5).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuned::parse_line;

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
            parse_line::<MatmulTiling>("f32 b1 m512 n1024 k16 = 16x16/8x8/16").map(|p| p.1.to_string()).as_deref(),
            Some("16x16/8x8/16")
        );
        assert_eq!(parse_line::<MatmulTiling>("f32 b1 m512 = 16x16/8x8/128"), None, "not a usable tiling");
        assert_eq!(parse_line::<usize>("f32 b1 m256 n1024 k4096 = 8"), Some(("f32 b1 m256 n1024 k4096".into(), 8)));
        assert_eq!(parse_line::<usize>("f32 b1 m256 = 8x"), None);
        let gemm = |k| Gemm { batch: 1, m: 256, n: 768, k, dtype: DType::F32 };
        // Whole vec4s and at least 128 per slice, at most 16 slices.
        assert_eq!(split_candidates(&gemm(3072)), vec![1, 2, 4, 8, 16]);
        assert_eq!(split_candidates(&gemm(768)), vec![1, 2, 4]);
        assert_eq!(split_candidates(&gemm(260)), vec![1]);
        // A cooperative tiling is read back as such, though its staging exceeds the plain
        // kernel's 16 KiB.
        let large = MatmulTiling::COOP_CANDIDATES[1];
        assert!(!large.is_valid() && large.is_cooperative());
        assert_eq!(parse_line(&format!("f16 b1 m4096 n4096 k4096 coop = {large}")).map(|p| p.1), Some(large));
    }

    #[test]
    fn a_new_class_times_the_defaults_the_nearest_winner_and_the_cost_models_best() {
        let square = GemmShape { batch: 1, m: 1024, n: 1024, k: 1024 };
        for fill in [CPU_FILL, GPU_FILL] {
            let plain = timed_tilings(&square, false, None, fill);
            assert_eq!(plain.len(), TIMED_TILINGS);
            assert_eq!(plain[0], MatmulTiling::default_for(1024, 1024), "the default first");
            assert!(plain.iter().all(|t| !t.is_cooperative() && MatmulTiling::CANDIDATES.contains(t)));
            let mut unique = plain.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(unique.len(), plain.len(), "{plain:?}");
            // With cooperative matrices, the cooperative default is timed too.
            let coop = timed_tilings(&square, true, None, fill);
            assert_eq!(&coop[..2], &[MatmulTiling::default_for(1024, 1024), MatmulTiling::COOP_CANDIDATES[0]]);
            assert_eq!(coop.len(), TIMED_TILINGS);
        }
        // Few output tiles (a 256 × 768 projection) on a GPU: the model prefers smaller tiles
        // (more workgroups) over the default 128 × 128 ones it still times.
        let skinny = GemmShape { batch: 1, m: 256, n: 768, k: 3072 };
        let ranked = timed_tilings(&skinny, false, None, GPU_FILL);
        let (tm, tn) = ranked[1].tile();
        assert!(tm * tn < 128 * 128, "{ranked:?}");
        // The nearest measured class of the same kind lends its winner, timed second.
        let winner = MatmulTiling::CANDIDATES[7];
        let measured = [
            ("f32 b1 m1024 n1024 k512", winner),
            ("f32 b1 m16 n16 k16", MatmulTiling::CANDIDATES[4]),
            ("f16 b1 m1024 n1024 k1024", MatmulTiling::CANDIDATES[5]),
        ];
        let nearest = nearest_winner("f32 b1 m1024 n1024 k1024", measured.into_iter());
        assert_eq!(nearest, Some(winner));
        assert_eq!(nearest_winner("f32 batched m1024 n1024 k1024", measured.into_iter()), None, "another kind");
        assert_eq!(timed_tilings(&square, false, nearest, GPU_FILL)[1], winner);
    }
}
