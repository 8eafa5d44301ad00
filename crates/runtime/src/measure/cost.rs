//! Measuring the cost model on the adapter: the per-dispatch cost, the streaming bandwidth
//! and the matmul throughput that fusion's benefit estimate uses. Measured once per adapter
//! and driver, cached in memory and on disk (`~/.cache/fusegraph/`), so fusion decisions are
//! stable from run to run. A device whose autotuning is turned off
//! ([`crate::DeviceOptions::autotune`], `FUSEGRAPH_AUTOTUNE=off`) measures nothing and uses
//! the device-free defaults.

use crate::{CompileOptions, Device, FusionMode, Result};
use fusegraph_ir::{DType, GraphBuilder, HostTensor, NodeId};
use fusegraph_passes::cost::CostModel;
use std::sync::Arc;

fn cache_path(device: &Device) -> Option<std::path::PathBuf> {
    device.cache.file("cost-v1")
}

fn parse(text: &str) -> Option<CostModel> {
    let v: Vec<f64> = text.split_whitespace().filter_map(|t| t.parse().ok()).collect();
    match v.as_slice() {
        [d, b, f] if *d > 0.0 && *b > 0.0 && *f > 0.0 => Some(CostModel { dispatch_s: *d, bandwidth: *b, flops: *f }),
        _ => None,
    }
}

impl Device {
    /// The cost model fusion uses on this device: measured on first use (or read from the
    /// disk cache), the defaults if autotuning is turned off or measuring fails.
    pub fn cost_model(self: &Arc<Self>) -> CostModel {
        if !self.measure_cost || super::measuring() {
            return CostModel::default();
        }
        *self.cost.get_or_init(|| {
            let path = cache_path(self);
            if let Some(c) = path.as_ref().and_then(|p| std::fs::read_to_string(p).ok()).and_then(|t| parse(&t)) {
                return c;
            }
            match super::during(|| self.measure_cost()) {
                Ok(c) => {
                    if let Some(p) = path {
                        let _ = std::fs::create_dir_all(p.parent().expect("a file in a folder"));
                        let _ = std::fs::write(p, format!("{} {} {}\n", c.dispatch_s, c.bandwidth, c.flops));
                    }
                    c
                }
                Err(_) => CostModel::default(),
            }
        })
    }

    fn measure_cost(self: &Arc<Self>) -> Result<CostModel> {
        let opts = CompileOptions {
            fusion: FusionMode::Off,
            simplify: false,
            split_k: crate::SplitK::Off,
            ..Default::default()
        };
        let ms = |b: &GraphBuilder, outs: &[NodeId], feeds: &[(&str, &HostTensor)]| -> Result<f64> {
            let exe = self.compile(&b.graph(), outs, &opts)?;
            Ok(exe.time(feeds, 2, 5)?.median())
        };
        // Dispatch: 64 one-element kernels.
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [1])?;
        let mut y = x.clone();
        for _ in 0..64 {
            y = y.neg()?;
        }
        let one = HostTensor::new([1], vec![1.0f32])?;
        let dispatch_s = ms(&b, &[y.id()], &[("x", &one)])? / 64.0 / 1e3;
        // Bandwidth: a streaming kernel over 4 Mi f32 (read + write).
        let n = 1 << 22;
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [n])?;
        let y = x.neg()?;
        let big = HostTensor::new([n], vec![1.5f32; n])?;
        let bandwidth = (8 * n) as f64 / (ms(&b, &[y.id()], &[("x", &big)])? / 1e3);
        // Arithmetic as fusion recomputes it: 32 elementwise ops in one fused kernel over the
        // same elements, less the time the streaming kernel takes to move them.
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [n])?;
        let mut y = x.clone();
        for k in 0..32 {
            y = if k % 2 == 0 { y.mul(&x)? } else { y.add(&x)? };
        }
        let fused = CompileOptions { split_k: crate::SplitK::Off, ..Default::default() };
        let exe = self.compile(&b.graph(), &[y.id()], &fused)?;
        let chain_ms = exe.time(&[("x", &big)], 2, 5)?.median();
        let stream_ms = (8 * n) as f64 / bandwidth * 1e3;
        let flops = (32 * n) as f64 / ((chain_ms - stream_ms).max(chain_ms / 8.0) / 1e3);
        Ok(CostModel { dispatch_s: dispatch_s.max(1e-7), bandwidth: bandwidth.max(1e6), flops: flops.max(1e6) })
    }
}
