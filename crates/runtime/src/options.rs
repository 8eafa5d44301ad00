//! What a compilation is asked for: [`crate::CompileOptions`] and its split choices.

use crate::Device;
use crate::KernelForms;
use fusegraph_ir::NodeId;
use fusegraph_passes::split_k::{fill_splits, FillOptions, Gemm};
pub use fusegraph_passes::split_reduce::FillOptions as ReduceFill;
pub use fusegraph_passes::FusedAttention;
use fusegraph_passes::FusionMode;
use fusegraph_wgsl::{MatmulTiling, Spread};
use std::sync::Arc;

/// Options of one compilation.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Fusion on (default) or off (one kernel per primitive op).
    pub fusion: FusionMode,
    /// Run the simplification passes (folding, CSE, DCE, batch-norm folding) first (default).
    pub simplify: bool,
    /// The most device memory this executable may hold (parameters + arena + staging, and
    /// workspace textures only where they fit beside those). Combined with the device's own
    /// limit, if any.
    pub memory_limit: Option<u64>,
    /// Recompute cheap values where memory peaks to meet the limit (default on).
    pub remat: bool,
    /// A name for messages (`OOM when allocating the plan for <name>`).
    pub name: Option<String>,
    /// Store every f32 activation, weight and constant as f16, accumulating in f32; outputs
    /// keep their types. Halves activation and weight memory. Parameters keep their declared
    /// f32 type at the API: `set_parameter` rounds the value to f16 on upload and
    /// `parameter` reads it back widened. Parameters that `updates` writes (training) keep
    /// f32 storage and are rounded at their uses instead, and the elementwise arithmetic
    /// that computes their new values (an optimizer's) stays f32: in f16 Adam's `ε` is 0.
    /// For training, the `train` module's mixed precision (loss scaling) is the recipe.
    pub mixed_precision: bool,
    /// Parameter updates: after each run, parameter `name` takes the value node `NodeId`
    /// computed in that run (a training step's new weights and optimizer state). The copy
    /// happens on the device, after every kernel, in the same submit.
    pub updates: Vec<(String, NodeId)>,
    /// Force this tiling on every tiled matmul kernel (experiments, tests of each
    /// candidate); `None` takes the device's autotuned choice, or the default for the shape.
    /// One of [`MatmulTiling::COOP_CANDIDATES`] puts the f16 products that can run on
    /// cooperative matrices on them with that tiling (any other tiling keeps them on the
    /// plain kernel).
    pub matmul_tiling: Option<MatmulTiling>,
    /// Force the columns each workgroup of the matrix–vector kernel computes where its
    /// weight lies along `k` (a weight stored `[out, in]`, read transposed): one of
    /// [`fusegraph_wgsl::GEMV_COLUMNS`], the other invocations of the 256 splitting `k`
    /// (experiments: `fusegraph roofline`'s `decode_gemv` rows); `None` takes the kernel's
    /// choice for the shape. Another value is [`crate::RuntimeError::InvalidOption`].
    pub gemv_columns: Option<usize>,
    /// Writes every kernel's WGSL into this folder as `k000.wgsl`, `k001.wgsl`, … in
    /// dispatch order, each headed by `// kernel LABEL (N workgroups)` (the environment
    /// variable `FUSEGRAPH_DUMP_WGSL=DIR` does the same for every compile; [`crate::env`]). Best effort: a
    /// folder that cannot be written is skipped.
    pub dump_wgsl: Option<std::path::PathBuf>,
    /// Memory-efficient attention: when every `softmax(x)·v` (attention's probabilities
    /// times the values) runs in one kernel that stores neither the scores nor the
    /// probabilities ([`FusedAttention::OverLimit`], the default: only when the plan would
    /// otherwise exceed the memory limit, tried before rematerialization). It saves
    /// `2 · batch · heads · seq²` values per attention layer; the kernel suits GPUs, and is
    /// slower than the unfused attention on a CPU adapter (BENCHMARKS.md).
    pub fused_attention: FusedAttention,
    /// Split-k: matrix products too small to occupy the device become `s` products over
    /// slices of `k`, summed ([`fusegraph_passes::split_k`]). Off by default (`fusegraph
    /// bench --split-k` sets it). A split that would make the plan exceed the memory limit is
    /// not made.
    pub split_k: SplitK,
    /// With fusion on, reductions with few outputs and long rows (a loss, a norm, a bias
    /// gradient's column sums) become two reductions, the first over chunks of each row
    /// with many workgroups ([`fusegraph_passes::split_reduce`]). Default: by the occupancy
    /// rule of the row kernels' family ([`SplitReductions::Adapter`]); off in [`crate::CompileOptions::unfused`]. A split that would make the plan
    /// exceed the memory limit is not made.
    pub split_reductions: SplitReductions,
    /// Run the kernels that compute from parameters and constants alone (batch-norm
    /// folding's scaled weights, a constant computed on its own) once after the parameters
    /// are set rather than on every run (default on): [`crate::Executable::set_parameter`] marks
    /// them to run again on the next run. What they leave for later kernels stays in the
    /// arena for the executable's life, so this can cost arena bytes; it is dropped where the
    /// plan would otherwise not fit the memory limit. Kernels that read a parameter `updates`
    /// writes run every time. With a [`crate::ParamStore`], any write to the store (an
    /// insert, a load, another executable's training step) marks them to run again.
    /// [`crate::ExecutableStats::prepared_kernels`] counts them; a graph whose every op reads
    /// parameters alone is then computed once and returned as stored until a parameter
    /// changes. Off in [`crate::CompileOptions::unfused`] (the naive baseline).
    pub hoist_parameters: bool,
    /// The matrix-product family where both apply: the subgroup matmul (no workgroup memory
    /// or barriers; adapters with a fixed subgroup size) or the workgroup-tiled kernel
    /// ([`MatmulFamily`]; by default measured per shape class). A forced `matmul_tiling`
    /// means the tiled kernel.
    pub matmul_family: MatmulFamily,
    /// With fusion on, matrix products that share their left operand and whose weights are
    /// parameters of one shape that no update writes (attention's query, key and value
    /// projections) become one batched product over the weights stacked into one parameter
    /// ([`fusegraph_passes::combine`]): one kernel instead of one per product, no extra
    /// byte (each weight is a contiguous part of the stack, set and read by its own name).
    /// Default on; off in [`crate::CompileOptions::unfused`].
    pub combine_products: bool,
    /// Within a kernel, compute the f16 results of elementwise ops and reductions that no
    /// other kernel computes from one another in f32, rounding each to f16 only where it is
    /// stored or read by an op computed in f16 (XLA's excess precision,
    /// `xla_allow_excess_precision`; see [`fusegraph_wgsl::lower_planned`]). Default on:
    /// results are at least as close to the exact ones, but differ in the last f16 bits from
    /// a run that rounds every op (the unfused one), and rounding costs about a dozen
    /// integer operations per f16 op where f16 is emulated (BENCHMARKS.md).
    /// Off: every f16 op's result is rounded, as the reference evaluator does. f32 graphs
    /// are unaffected.
    pub excess_precision: bool,
    /// The kernel forms to lower in; `None` (the default): the device's
    /// ([`Device::kernel_forms`], measured where autotuning is on). For comparisons and
    /// tests of each form.
    pub kernel_forms: Option<KernelForms>,
}

/// The matrix-product family of [`CompileOptions::matmul_family`], where both the subgroup
/// matmul and the workgroup-tiled kernel apply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatmulFamily {
    /// Measured per shape class where autotuning is on ([`crate::Device::tuned`]),
    /// else the subgroup kernel on a CPU adapter and the tiled one elsewhere (the default).
    #[default]
    Measured,
    /// The subgroup matmul.
    Subgroup,
    /// The workgroup-tiled kernel.
    Tiled,
}

/// Which matrix products [`crate::CompileOptions::split_k`] splits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SplitK {
    /// None (the default).
    #[default]
    Off,
    /// Each product whose tiled kernel would have fewer than `workgroups` workgroups (one
    /// per output tile of its untuned tiling per batch entry), into the fewest
    /// power-of-two slices that bring it there, each slice at least 128 long and a
    /// multiple of 4 ([`fusegraph_passes::split_k::fill_splits`]).
    Fill {
        /// The workgroups a product should have (a few per multiprocessor of the GPU).
        workgroups: u64,
    },
    /// Every product whose `k` is a multiple of `4 · s`, into `s` slices (experiments and
    /// tests).
    Slices(usize),
    /// Each product into the slice count measured fastest on this device for its shape
    /// class (1, 2, 4, 8 or 16, each slice whole vec4s and at least 128 long; the product
    /// and its sum timed together, as matmul tilings are tuned, and cached on disk beside
    /// them). Products below the autotuner's size threshold, and every product where
    /// autotuning is off, are not split. Measuring happens in `compile` (and `plan`) the
    /// first time a class is seen.
    Tuned,
}

/// Which reductions [`crate::CompileOptions::split_reductions`] splits
/// ([`fusegraph_passes::split_reduce`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SplitReductions {
    /// None.
    Off,
    /// By the occupancy rule for the row kernels' family the compile lowers in (the
    /// default; [`KernelForms::rows`]): [`ReduceFill::GPU`] for workgroup-per-row kernels
    /// (parallel), [`ReduceFill::CPU`] for invocation-per-row ones (serial), whose partials
    /// are each one invocation's.
    #[default]
    Adapter,
    /// By this occupancy rule on any adapter (tests run a GPU's on a CPU adapter).
    Fill(ReduceFill),
}

impl SplitReductions {
    /// The occupancy rule in force where row kernels are lowered in the `rows` family.
    pub(crate) fn fill(self, rows: Spread) -> Option<ReduceFill> {
        match self {
            SplitReductions::Off => None,
            SplitReductions::Adapter if rows == Spread::Serial => Some(ReduceFill::CPU),
            SplitReductions::Adapter => Some(ReduceFill::GPU),
            SplitReductions::Fill(f) => Some(f),
        }
    }
}

impl SplitK {
    /// `off`, `tuned`, `fill:W` (W workgroups) or `S` (slices), as `fusegraph bench --split-k` takes
    /// them; `None` for anything else.
    pub fn parse(v: &str) -> Option<SplitK> {
        match v.trim() {
            "off" => Some(SplitK::Off),
            "tuned" => Some(SplitK::Tuned),
            v => match v.strip_prefix("fill:") {
                Some(w) => w.parse().ok().map(|workgroups| SplitK::Fill { workgroups }),
                None => v.parse().ok().map(SplitK::Slices),
            },
        }
    }

    /// Into how many slices this splits `gemm` on `device` (1: not at all).
    pub(crate) fn splits(&self, device: &Arc<Device>, gemm: &Gemm) -> usize {
        match *self {
            SplitK::Off => 1,
            SplitK::Tuned => device.tuned_split_count(gemm),
            SplitK::Fill { workgroups } => {
                let tile = MatmulTiling::default_for(gemm.m, gemm.n).tile();
                fill_splits(gemm, &FillOptions { workgroups, tile, ..Default::default() })
            }
            SplitK::Slices(s) if s >= 2 && gemm.k.is_multiple_of(4 * s) => s,
            SplitK::Slices(_) => 1,
        }
    }
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            fusion: FusionMode::On,
            simplify: true,
            memory_limit: None,
            remat: true,
            name: None,
            updates: vec![],
            mixed_precision: false,
            matmul_tiling: None,
            gemv_columns: None,
            dump_wgsl: None,
            fused_attention: FusedAttention::OverLimit,
            split_k: SplitK::Off,
            split_reductions: SplitReductions::Adapter,
            hoist_parameters: true,
            matmul_family: MatmulFamily::Measured,
            combine_products: true,
            excess_precision: true,
            kernel_forms: None,
        }
    }
}

impl CompileOptions {
    /// One kernel per primitive op, no simplification, no hoisting and no combined
    /// products: the baseline of comparisons.
    pub fn unfused() -> Self {
        CompileOptions {
            fusion: FusionMode::Off,
            simplify: false,
            hoist_parameters: false,
            combine_products: false,
            split_reductions: SplitReductions::Off,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_k_choices_parse_and_apply() {
        assert_eq!(SplitK::parse("off"), Some(SplitK::Off));
        assert_eq!(SplitK::parse(" fill:264 "), Some(SplitK::Fill { workgroups: 264 }));
        assert_eq!(SplitK::parse("4"), Some(SplitK::Slices(4)));
        for bad in ["", "on", "fill:", "fill:x", "-2", "4.5"] {
            assert_eq!(SplitK::parse(bad), None, "{bad:?}");
        }
        assert_eq!(SplitK::parse("tuned"), Some(SplitK::Tuned));
        let device = Arc::new(Device::new(&crate::DeviceOptions::default()).expect("a device"));
        let splits =
            |s: SplitK, m, n, k| s.splits(&device, &Gemm { batch: 1, m, n, k, dtype: fusegraph_ir::DType::F32 });
        // Slices: only where every slice is whole vec4s.
        assert_eq!(splits(SplitK::Slices(4), 8, 8, 64), 4);
        assert_eq!(splits(SplitK::Slices(4), 8, 8, 40), 1);
        assert_eq!(splits(SplitK::Slices(1), 8, 8, 64), 1);
        assert_eq!(splits(SplitK::Off, 8, 8, 1 << 16), 1);
        // Fill counts the untuned tiling's tiles: 256×768 takes 128×128 tiles (12 of them).
        assert_eq!(splits(SplitK::Fill { workgroups: 48 }, 256, 768, 3072), 4);
        assert_eq!(splits(SplitK::Fill { workgroups: 12 }, 256, 768, 3072), 1);
        // Tuned: products below the tuning threshold, or whose k allows no slice of 128,
        // are not measured.
        assert_eq!(splits(SplitK::Tuned, 8, 8, 64), 1);
        assert_eq!(splits(SplitK::Tuned, 1024, 1024, 200), 1);
        assert!(device.tuned().splits.is_empty());
    }
}
