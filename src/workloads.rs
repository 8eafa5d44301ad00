//! The benchmark workloads, shared by `fusegraph bench`, the criterion benches and tests:
//! each builds a graph, its parameters and random feeds (seeded, never zeros).

use crate::{DType, Graph, GraphBuilder, HostTensor, NodeId, Tensor};

/// A graph ready to compile and run.
pub struct Workload {
    /// Short name (`softmax_axis0`, `mlp`, …).
    pub name: String,
    /// The graph.
    pub graph: Graph,
    /// Its outputs.
    pub outputs: Vec<NodeId>,
    /// One value per input.
    pub feeds: Vec<(String, HostTensor)>,
    /// One value per parameter.
    pub params: Vec<(String, HostTensor)>,
}

impl Workload {
    /// Feeds as the `(name, &tensor)` pairs `Executable::run` takes.
    pub fn feed_refs(&self) -> Vec<(&str, &HostTensor)> {
        self.feeds.iter().map(|(n, t)| (n.as_str(), t)).collect()
    }
}

/// Seeded values in [-1, 1] away from zero.
pub fn random_values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let v = ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0;
            (if v.abs() < 1e-3 { 0.5 } else { v }) as f32
        })
        .collect()
}

struct Recorder {
    b: GraphBuilder,
    feeds: Vec<(String, HostTensor)>,
    seed: u64,
}

impl Recorder {
    fn new() -> Self {
        Recorder { b: GraphBuilder::new(), feeds: Vec::new(), seed: 1 }
    }
    fn input(&mut self, name: &str, dims: &[usize]) -> Tensor {
        self.seed += 1;
        let n = dims.iter().product();
        self.feeds
            .push((name.into(), HostTensor::new(dims.to_vec(), random_values(self.seed, n)).expect("sizes agree")));
        self.b.input(name, DType::F32, dims.to_vec()).expect("valid input")
    }
    fn finish(self, name: String, outs: &[&Tensor]) -> Workload {
        Workload {
            name,
            graph: self.b.graph(),
            outputs: outs.iter().map(|t| t.id()).collect(),
            feeds: self.feeds,
            params: vec![],
        }
    }
}

/// A chain of 20 elementwise ops over `n` elements.
pub fn elementwise_chain(n: usize) -> Workload {
    let mut r = Recorder::new();
    let mut x = r.input("x", &[n]);
    let y = r.input("y", &[n]);
    for k in 0..20 {
        x = match k % 4 {
            0 => x.add(&y),
            1 => x.mul_scalar(0.5),
            2 => x.tanh(),
            _ => x.sub(&y),
        }
        .expect("valid op");
    }
    r.finish(format!("elementwise_chain_{n}"), &[&x])
}

/// `gelu(relu(A·B) + bias)` for square `n`.
pub fn matmul_epilogue(n: usize) -> Workload {
    let mut r = Recorder::new();
    let a = r.input("a", &[n, n]);
    let b = r.input("b", &[n, n]);
    let bias = r.input("bias", &[n]);
    let y = a.matmul(&b).and_then(|m| m.relu()).and_then(|m| m.add(&bias)).and_then(|m| m.gelu()).expect("valid ops");
    r.finish(format!("gelu_relu_matmul_bias_{n}"), &[&y])
}

/// Layer norm over the last axis, then GELU, on `[rows, d]`.
pub fn layer_norm_gelu(rows: usize, d: usize) -> Workload {
    let mut r = Recorder::new();
    let x = r.input("x", &[rows, d]);
    let gamma = r.input("gamma", &[d]);
    let beta = r.input("beta", &[d]);
    let y = x
        .layer_norm(&[1], 1e-5)
        .and_then(|t| t.mul(&gamma))
        .and_then(|t| t.add(&beta))
        .and_then(|t| t.gelu())
        .expect("valid ops");
    r.finish(format!("layer_norm_gelu_{rows}x{d}"), &[&y])
}

/// Softmax of `[n, n]` along `axis`.
pub fn softmax(n: usize, axis: usize) -> Workload {
    let mut r = Recorder::new();
    let x = r.input("x", &[n, n]);
    let y = x.softmax(axis).expect("valid op");
    r.finish(format!("softmax_axis{axis}_{n}"), &[&y])
}

/// The micro workloads, small with `quick`.
pub fn micro(quick: bool) -> Vec<Workload> {
    let (chain, mm, rows, sm): (usize, &[usize], usize, usize) =
        if quick { (1 << 16, &[64, 128], 64, 128) } else { (1 << 22, &[128, 256, 512], 1024, 512) };
    let mut out = vec![elementwise_chain(chain)];
    out.extend(mm.iter().map(|&n| matmul_epilogue(n)));
    out.push(layer_norm_gelu(rows, 768));
    out.push(softmax(sm, 1));
    out.push(softmax(sm, 0));
    out
}

/// Every workload's name, for `--workload` (a prefix of a name selects it).
pub fn names(quick: bool) -> Vec<String> {
    micro(quick).into_iter().map(|w| w.name).collect()
}
