//! What the autotuner and the cost model keep between runs: the tuned choices by shape class
//! ([`Tuner`]), the kernel forms ([`KernelForms`]) and the device's cache files ([`Cache`]).

use fusegraph_wgsl::{Forms, MatmulTiling, Spread};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Where one device's measurements are cached: `{dir}/{stem}-{adapter, backend and
/// driver}.txt`, with `-unchecked` for a device without wgpu's shader checks (the default,
/// whose kernels compile to other code than a checked device's).
#[derive(Clone, Debug, Default)]
pub(crate) struct Cache {
    pub(crate) dir: Option<PathBuf>,
    pub(crate) key: String,
}

impl Cache {
    /// The cache of the adapter `info` in `dir` (none: nothing is read or written).
    pub(crate) fn new(dir: Option<PathBuf>, info: &wgpu::AdapterInfo, shader_checks: bool) -> Cache {
        let checks = if shader_checks { "" } else { "-unchecked" };
        let key = format!("{}-{:?}-{}-{}{checks}", info.name, info.backend, info.driver, info.driver_info)
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        Cache { dir, key }
    }

    /// The cache file `stem`.
    pub(crate) fn file(&self, stem: &str) -> Option<PathBuf> {
        Some(self.dir.as_ref()?.join(format!("{stem}-{}.txt", self.key)))
    }

    /// Writes `lines` to the cache file `stem`, aside and renamed, so a reader never sees
    /// half a file.
    pub(crate) fn write(&self, stem: &str, lines: String) {
        if let Some(path) = self.file(stem) {
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            let _ = std::fs::create_dir_all(path.parent().expect("a file in a folder"));
            if std::fs::write(&tmp, lines).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }
    }
}

/// The family each kind of kernel is lowered in, where the form is a choice rather than an
/// adapter's fact: one of two per kind, picked by measuring both on the adapter
/// ([`crate::Device::kernel_forms`]), forced per compile by [`crate::CompileOptions::kernel_forms`].
/// Correctness limits (the loop budget of Mesa's CPU adapters, exact `tanh`, f16 rounding)
/// are not forms: they hold in every family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelForms {
    /// Elementwise (loop) kernels: an element per invocation (parallel) or several side by
    /// side over grid-stride steps (serial); see [`Spread`].
    pub loops: Spread,
    /// Reductions' row kernels: a workgroup per row (parallel) or an invocation per row
    /// (serial).
    pub rows: Spread,
    /// The fused attention kernel stages blocks of keys in workgroup memory (else each
    /// invocation reads its keys one at a time).
    pub tiled_attention: bool,
    /// The subgroup matmul reads its operands from textures, where the device allows them
    /// ([`crate::DeviceOptions::texture_operands`]).
    pub texture_operands: bool,
}

impl KernelForms {
    /// A GPU's forms (the default off a CPU adapter).
    pub const GPU: KernelForms =
        KernelForms { loops: Spread::Parallel, rows: Spread::Parallel, tiled_attention: true, texture_operands: false };
    /// A CPU adapter's forms (its default).
    pub const CPU: KernelForms =
        KernelForms { loops: Spread::Serial, rows: Spread::Serial, tiled_attention: false, texture_operands: true };

    /// The code generator's part: the loop and row families.
    pub fn forms(&self) -> Forms {
        Forms { loops: self.loops, rows: self.rows }
    }
}

impl std::fmt::Display for KernelForms {
    /// `loops serial, rows serial, attention a key at a time, texture operands on`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let attention = if self.tiled_attention { "tiled" } else { "a key at a time" };
        let textures = if self.texture_operands { "on" } else { "off" };
        write!(f, "loops {}, rows {}, attention {attention}, texture operands {textures}", self.loops, self.rows)
    }
}

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
    pub(crate) tilings: Choices<TunedTiling>,
    pub(crate) splits: Choices<TunedSplit>,
    pub(crate) families: Choices<TunedFamily>,
    pub(crate) forms: Choices<TunedForm>,
}

/// The matmul family measured fastest for a shape class where the subgroup matmul and the
/// tiled kernel both apply ([`crate::CompileOptions::matmul_family`]).
#[derive(Clone, Debug, PartialEq)]
pub struct TunedFamily {
    /// The shape class.
    pub class: String,
    /// Whether the subgroup matmul won.
    pub subgroup: bool,
    /// Median ms of each family as timed, subgroup first (empty when read from the cache).
    pub timings: Vec<(bool, f64)>,
}

/// The family measured fastest for one kind of kernel whose form is a choice
/// ([`crate::KernelForms`]).
#[derive(Clone, Debug, PartialEq)]
pub struct TunedForm {
    /// The kind: `loops`, `rows`, `attention` or `textures`.
    pub kind: String,
    /// The family chosen: `parallel` or `serial` (loops, rows), `tiled` or `keys`
    /// (attention), `on` or `off` (textures).
    pub choice: String,
    /// Median ms of each family as timed (empty when read from the cache).
    pub timings: Vec<(String, f64)>,
}

/// One kind of tuned choice by class: read from the device's cache file on first use, the
/// whole file rewritten after each measurement (`class = value` lines).
pub(crate) struct Choices<T> {
    pub(crate) loaded: bool,
    pub(crate) by_class: BTreeMap<String, T>,
}

impl<T> Default for Choices<T> {
    fn default() -> Self {
        Choices { loaded: false, by_class: BTreeMap::new() }
    }
}

impl<T> Choices<T> {
    /// The choice for `key`, the cache file `stem` read first if it has not been; `read`
    /// makes a choice of a cached line's class and value.
    pub(crate) fn get<V: std::str::FromStr>(
        &mut self,
        cache: &Cache,
        stem: &str,
        key: &str,
        read: impl Fn(String, V) -> T,
    ) -> Option<&T> {
        if !self.loaded {
            self.loaded = true;
            let text = cache.file(stem).and_then(|p| std::fs::read_to_string(p).ok());
            for (class, value) in text.iter().flat_map(|t| t.lines()).filter_map(parse_line) {
                self.by_class.insert(class.clone(), read(class, value));
            }
        }
        self.by_class.get(key)
    }

    /// Records a measured choice and rewrites the cache file `stem`, a `line` per class.
    pub(crate) fn insert(&mut self, cache: &Cache, stem: &str, key: String, choice: T, line: impl Fn(&T) -> String) {
        self.by_class.insert(key, choice);
        cache.write(stem, self.by_class.values().map(line).collect());
    }
}

/// One class tuned for split-k ([`SplitK::Tuned`](crate::SplitK::Tuned)): the slice count
/// chosen (1: no split), and the timings when measured in this process.
#[derive(Clone, Debug, PartialEq)]
pub struct TunedSplit {
    /// The shape class, as for tilings (`f32 b1 m256 n1024 k4096`).
    pub class: String,
    /// The fastest slice count.
    pub splits: usize,
    /// Median milliseconds of the product (and its sum) per slice count, when measured in
    /// this process; empty when read from the cache.
    pub timings: Vec<(usize, f64)>,
}

pub(crate) fn parse_line<T: std::str::FromStr>(line: &str) -> Option<(String, T)> {
    let (class, value) = line.rsplit_once(" = ")?;
    Some((class.trim().to_string(), value.trim().parse().ok()?))
}

/// What a device has measured so far, or read from the disk cache ([`crate::Device::tuned`]),
/// each by class or kind.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tuned {
    /// The tiled matmul's tilings.
    pub tilings: Vec<TunedTiling>,
    /// The matmul families (tiled or subgroup).
    pub families: Vec<TunedFamily>,
    /// Split-k slice counts.
    pub splits: Vec<TunedSplit>,
    /// Kernel forms.
    pub forms: Vec<TunedForm>,
}
