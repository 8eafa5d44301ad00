//! Measuring the kernel forms ([`KernelForms`]): for each kind of kernel whose form is a
//! choice, both families are timed once on the adapter on a representative workload (in
//! interleaved rounds, a CPU adapter's too) and the faster kept, in memory and on disk
//! (`forms-v1-<adapter>.txt`, `kind = choice` lines), as matmul tilings are. Where
//! autotuning is off nothing is measured and the adapter's defaults hold
//! ([`Device::default_forms`]). The adapter's default family stays unless the other runs at
//! least 5% faster.
//!
//! The workloads: loops, `tanh(1.5x + 0.25) · sigmoid(x)` over 4 Mi f32 elements (16 Mi on
//! a GPU); rows, a softmax over 2048 rows of 512 (4096 of 1024 on a GPU); attention, the
//! fused `softmax(q·kᵀ/8)·v` of 4 heads of 256 queries and keys of 64; textures, the subgroup
//! matmul of 512³ f32 (only where the device allows texture operands).

use super::autotune::{fastest, pattern};
use crate::tuned::TunedForm;
use crate::{CompileOptions, Device, FusedAttention, KernelForms, MatmulFamily, Result, SplitReductions};
use fusegraph_ir::{DType, GraphBuilder, HostTensor, NodeId};
use fusegraph_wgsl::Spread;
use std::sync::Arc;

/// The cache file of the measured forms.
const STEM: &str = "forms-v1";

/// How much faster than the adapter's default family the other must run to replace it.
const MARGIN: f64 = 0.05;

/// A kind of kernel whose form is a choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Loops,
    Rows,
    Attention,
    Textures,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Loops, Kind::Rows, Kind::Attention, Kind::Textures];

    fn name(self) -> &'static str {
        match self {
            Kind::Loops => "loops",
            Kind::Rows => "rows",
            Kind::Attention => "attention",
            Kind::Textures => "textures",
        }
    }

    /// The two families' names.
    fn choices(self) -> [&'static str; 2] {
        match self {
            Kind::Loops | Kind::Rows => ["parallel", "serial"],
            Kind::Attention => ["tiled", "keys"],
            Kind::Textures => ["on", "off"],
        }
    }

    /// This kind's family in `forms`.
    fn of(self, forms: KernelForms) -> &'static str {
        let first = match self {
            Kind::Loops => forms.loops == Spread::Parallel,
            Kind::Rows => forms.rows == Spread::Parallel,
            Kind::Attention => forms.tiled_attention,
            Kind::Textures => forms.texture_operands,
        };
        self.choices()[if first { 0 } else { 1 }]
    }

    /// `forms` with this kind's family set to `choice` (one of [`Kind::choices`]).
    fn with(self, forms: KernelForms, choice: &str) -> KernelForms {
        let first = choice == self.choices()[0];
        let spread = if first { Spread::Parallel } else { Spread::Serial };
        match self {
            Kind::Loops => KernelForms { loops: spread, ..forms },
            Kind::Rows => KernelForms { rows: spread, ..forms },
            Kind::Attention => KernelForms { tiled_attention: first, ..forms },
            Kind::Textures => KernelForms { texture_operands: first, ..forms },
        }
    }
}

/// A workload: the graph, its output and its feeds.
type Workload = (GraphBuilder, NodeId, Vec<(String, HostTensor)>);

/// `x` of `dims` in f32 with values that vary along it.
fn input(
    b: &GraphBuilder,
    feeds: &mut Vec<(String, HostTensor)>,
    name: &str,
    dims: &[usize],
) -> Result<fusegraph_ir::Tensor> {
    let x = b.input(name, DType::F32, dims.to_vec())?;
    let n = dims.iter().product();
    feeds.push((
        name.to_string(),
        HostTensor::from_f64(DType::F32, x.ty().shape.clone(), &pattern(n, feeds.len() * 3 + 1))?,
    ));
    Ok(x)
}

/// The workload `kind` is timed on (`gpu`: larger, so that the device is full).
fn workload(kind: Kind, gpu: bool) -> Result<Workload> {
    let b = GraphBuilder::new();
    let mut feeds = Vec::new();
    let out = match kind {
        Kind::Loops => {
            let x = input(&b, &mut feeds, "x", &[if gpu { 1 << 24 } else { 1 << 22 }])?;
            x.mul_scalar(1.5)?.add_scalar(0.25)?.tanh()?.mul(&x.sigmoid()?)?
        }
        Kind::Rows => {
            let dims = if gpu { [4096, 1024] } else { [2048, 512] };
            input(&b, &mut feeds, "x", &dims)?.softmax(1)?
        }
        Kind::Attention => {
            let dims = [1, 4, 256, 64];
            let q = input(&b, &mut feeds, "q", &dims)?;
            let k = input(&b, &mut feeds, "k", &dims)?;
            let v = input(&b, &mut feeds, "v", &dims)?;
            q.matmul(&k.transpose(&[0, 1, 3, 2])?)?.mul_scalar(0.125)?.softmax(3)?.matmul(&v)?
        }
        Kind::Textures => {
            let a = input(&b, &mut feeds, "a", &[512, 512])?;
            a.matmul(&input(&b, &mut feeds, "b", &[512, 512])?)?
        }
    };
    let out = out.id();
    Ok((b, out, feeds))
}

impl Device {
    /// The forms measured on this adapter (each kind measured now if neither this device
    /// nor the disk cache has it), starting from the adapter's defaults: `None` where
    /// autotuning is off, or while this thread is measuring them.
    pub(crate) fn measured_forms(self: &Arc<Self>) -> Option<KernelForms> {
        if !self.autotune() || super::measuring() {
            return None;
        }
        let mut forms = self.default_forms();
        for kind in Kind::ALL {
            if kind == Kind::Textures && self.texture_operand_rows().is_none() {
                continue;
            }
            let cached = {
                let mut tuner = self.tuner.lock().unwrap_or_else(|p| p.into_inner());
                let read = |kind, choice| TunedForm { kind, choice, timings: vec![] };
                tuner.forms.get(&self.cache, STEM, kind.name(), read).map(|t| t.choice.clone())
            };
            let choice = match cached {
                Some(choice) => Some(choice),
                None => {
                    let measured = super::during(|| self.measure_form(kind, forms));
                    match measured {
                        Ok(tuned) => {
                            tracing::info!(target: "fusegraph::autotune", kind = kind.name(), choice = %tuned.choice, timings = ?tuned.timings, "kernel form");
                            let choice = tuned.choice.clone();
                            let mut tuner = self.tuner.lock().unwrap_or_else(|p| p.into_inner());
                            let line = |t: &TunedForm| format!("{} = {}\n", t.kind, t.choice);
                            tuner.forms.insert(&self.cache, STEM, kind.name().to_string(), tuned, line);
                            Some(choice)
                        }
                        Err(e) => {
                            tracing::warn!(target: "fusegraph::autotune", kind = kind.name(), "kept the adapter's form: {e}");
                            None
                        }
                    }
                }
            };
            if let Some(choice) = choice.filter(|c| kind.choices().contains(&c.as_str())) {
                forms = kind.with(forms, &choice);
            }
        }
        Some(forms)
    }

    /// Times both of `kind`'s families on its workload, the other kinds as in `forms`.
    fn measure_form(self: &Arc<Self>, kind: Kind, forms: KernelForms) -> Result<TunedForm> {
        let gpu = self.info().device_type != wgpu::DeviceType::Cpu;
        let (b, out, feeds) = workload(kind, gpu)?;
        let graph = b.graph();
        let feeds: Vec<(&str, &HostTensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let compile = |choice: &'static str| {
            let opts = CompileOptions {
                name: Some(format!("autotuning {} forms", kind.name())),
                split_reductions: SplitReductions::Off,
                fused_attention: match kind {
                    Kind::Attention => FusedAttention::Always,
                    _ => FusedAttention::OverLimit,
                },
                matmul_family: match kind {
                    Kind::Textures => MatmulFamily::Subgroup,
                    _ => MatmulFamily::Measured,
                },
                kernel_forms: Some(kind.with(forms, choice)),
                ..Default::default()
            };
            self.compile(&graph, &[out], &opts)
        };
        let (timings, failed) = self.time_candidates(kind.choices(), compile, &feeds, true)?;
        // The adapter's default stays unless the other family is clearly faster (a tie
        // would otherwise pick by noise, and differently from run to run).
        let default = kind.of(forms);
        let ms = |c: &str| timings.iter().find(|t| t.0 == c).map(|t| t.1);
        let best = fastest(&timings, failed)?;
        let choice = match (ms(best), ms(default)) {
            (Some(b), Some(d)) if b > d * (1.0 - MARGIN) => default,
            _ => best,
        };
        Ok(TunedForm {
            kind: kind.name().to_string(),
            choice: choice.to_string(),
            timings: timings.into_iter().map(|(c, ms)| (c.to_string(), ms)).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_sets_its_own_family_and_no_other() {
        for kind in Kind::ALL {
            for base in [KernelForms::CPU, KernelForms::GPU] {
                let [a, b] = kind.choices().map(|c| kind.with(base, c));
                assert_ne!(a, b, "{kind:?}");
                assert!(a == base || b == base, "{kind:?} changed another kind's family");
            }
        }
        assert_eq!(Kind::Loops.with(KernelForms::GPU, "serial").loops, Spread::Serial);
        assert_eq!(Kind::Rows.with(KernelForms::CPU, "parallel").rows, Spread::Parallel);
        assert!(!Kind::Attention.with(KernelForms::GPU, "keys").tiled_attention);
        assert!(!Kind::Textures.with(KernelForms::CPU, "off").texture_operands);
        assert_eq!(
            KernelForms::CPU.to_string(),
            "loops serial, rows serial, attention a key at a time, texture operands on"
        );
        for kind in Kind::ALL {
            for choice in kind.choices() {
                assert_eq!(kind.of(kind.with(KernelForms::GPU, choice)), choice);
            }
        }
    }
}
