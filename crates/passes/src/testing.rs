//! Graphs for tests and benchmarks of the memory passes, shared with the device tests of the
//! runtime (not a stable API): model-shaped graphs (an MLP, a small conv net, a transformer
//! block), an elementwise chain, the rematerialization example, the scaled product of the
//! hoisting tests, and random graphs from a seeded generator.

use fusegraph_ir::{DType, Graph, GraphBuilder, NodeId, Result, Tensor};

/// The seeded generator of the property tests and random graphs: PCG-64
/// (`rand_pcg::Pcg64Mcg`, the workspace's one generator), with the draws they use.
#[derive(Clone, Debug)]
pub struct TestRng(rand_pcg::Pcg64Mcg);

impl TestRng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        TestRng(rand::SeedableRng::seed_from_u64(seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        rand::RngCore::next_u64(&mut self.0)
    }

    /// A number in `0..n` (`n` ≥ 1).
    pub fn below(&mut self, n: usize) -> usize {
        rand::Rng::random_range(&mut self.0, 0..n.max(1))
    }
}

/// A random graph of about `ops` ops on `[8, 8]` f32 values (unary, binary, transpose,
/// matmul, row sums broadcast back), with one to three outputs.
pub fn random_graph(rng: &mut TestRng, ops: usize) -> (Graph, Vec<NodeId>) {
    random_graph_with(rng, ops, false)
}

/// [`random_graph`]; with `keep_inputs` the last output also adds every input, so inputs live
/// to the end and cheap functions of them are rematerialization candidates.
pub fn random_graph_with(rng: &mut TestRng, ops: usize, keep_inputs: bool) -> (Graph, Vec<NodeId>) {
    let b = GraphBuilder::new();
    let mut pool: Vec<Tensor> = (0..2 + rng.below(2))
        .map(|i| b.input(&format!("x{i}"), DType::F32, vec![8, 8]).expect("valid input"))
        .collect();
    let w = b.parameter("w", DType::F32, vec![8, 8]).expect("valid parameter");
    let inputs = pool.len();
    for _ in 0..ops {
        let a = pool[rng.below(pool.len())].clone();
        let c = pool[rng.below(pool.len())].clone();
        let t = match rng.below(8) {
            0 => a.exp(),
            1 => a.tanh(),
            2 => a.add(&c),
            3 => a.mul(&c),
            4 => a.t(),
            5 => a.matmul(&w),
            6 => a.sum(&[1], true).and_then(|s| c.sub(&s)),
            _ => a.neg(),
        };
        pool.push(t.expect("shapes agree"));
    }
    let mut last = pool.last().expect("non-empty").clone();
    if keep_inputs {
        for x in &pool[..inputs] {
            last = last.add(x).expect("shapes agree");
        }
    }
    let mut outs = vec![last.id()];
    for _ in 0..rng.below(3) {
        let o = pool[inputs + rng.below(pool.len() - inputs)].id();
        if !outs.contains(&o) {
            outs.push(o);
        }
    }
    (b.graph(), outs)
}

/// `n` unary elementwise ops in a chain on an f32 input of `shape`.
pub fn elementwise_chain(n: usize, shape: Vec<usize>) -> Result<(Graph, Vec<NodeId>)> {
    let b = GraphBuilder::new();
    let mut x = b.input("x", DType::F32, shape)?;
    for i in 0..n {
        x = match i % 5 {
            0 => x.exp()?,
            1 => x.tanh()?,
            2 => x.sin()?,
            3 => x.neg()?,
            _ => x.sigmoid()?,
        };
    }
    Ok((b.graph(), vec![x.id()]))
}

fn dense(x: &Tensor, name: &str, inp: usize, out: usize) -> Result<Tensor> {
    let b = x.builder();
    let w = b.parameter(&format!("{name}.w"), DType::F32, vec![inp, out])?;
    let bias = b.parameter(&format!("{name}.b"), DType::F32, vec![out])?;
    x.matmul(&w)?.add(&bias)
}

/// An MLP 784-1024-1024-10 on a `[batch, 784]` input: matmul + bias + relu twice, then a
/// matmul + bias and a softmax.
pub fn mlp(batch: usize) -> Result<(Graph, Vec<NodeId>)> {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![batch, 784])?;
    let h = dense(&x, "l1", 784, 1024)?.relu()?;
    let h = dense(&h, "l2", 1024, 1024)?.relu()?;
    let y = dense(&h, "l3", 1024, 10)?.softmax(1)?;
    Ok((b.graph(), vec![y.id()]))
}

/// A small conv net on `[batch, 3, 32, 32]`: three conv3×3 + bias + relu + maxpool2 layers
/// (16, 32, 64 channels), then a dense layer to 10 logits.
pub fn conv_net(batch: usize) -> Result<(Graph, Vec<NodeId>)> {
    let b = GraphBuilder::new();
    let mut x = b.input("x", DType::F32, vec![batch, 3, 32, 32])?;
    let mut c = 3;
    for (i, o) in [16usize, 32, 64].into_iter().enumerate() {
        let w = b.parameter(&format!("conv{i}.w"), DType::F32, vec![o, c, 3, 3])?;
        let bias = b.parameter(&format!("conv{i}.b"), DType::F32, vec![o])?;
        let y = x.conv2d(&w, [1, 1], [1, 1], [1, 1], 1)?;
        let bias = bias.broadcast_in_dim(y.dims().to_vec(), vec![1])?;
        x = y.add(&bias)?.relu()?.max_pool2d([2, 2], [2, 2], [0, 0])?;
        c = o;
    }
    let flat = x.reshape(vec![batch, 64 * 4 * 4])?;
    let y = dense(&flat, "fc", 64 * 4 * 4, 10)?;
    Ok((b.graph(), vec![y.id()]))
}

fn layer_norm(x: &Tensor, name: &str, d: usize) -> Result<Tensor> {
    let b = x.builder();
    let gamma = b.parameter(&format!("{name}.g"), DType::F32, vec![d])?;
    let beta = b.parameter(&format!("{name}.b"), DType::F32, vec![d])?;
    x.layer_norm(&[1], 1e-5)?.mul(&gamma)?.add(&beta)
}

/// A pre-norm transformer block on `[seq, d]`: layer norm, q/k/v projections split into
/// `heads`, scaled dot-product attention with softmax, output projection and residual add,
/// then layer norm, an MLP (4·d, gelu) and a residual add.
pub fn transformer_block(seq: usize, d: usize, heads: usize) -> Result<(Graph, Vec<NodeId>)> {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![seq, d])?;
    let dh = d / heads.max(1);
    let h = layer_norm(&x, "ln1", d)?;
    let split = |t: Tensor| t.reshape(vec![seq, heads, dh])?.transpose(&[1, 0, 2]);
    let q = split(dense(&h, "q", d, d)?)?;
    let k = split(dense(&h, "k", d, d)?)?;
    let v = split(dense(&h, "v", d, d)?)?;
    let scores = q.matmul(&k.transpose(&[0, 2, 1])?)?.mul_scalar(1.0 / (dh as f64).sqrt())?;
    let att = scores.softmax(2)?.matmul(&v)?.transpose(&[1, 0, 2])?.reshape(vec![seq, d])?;
    let x1 = x.add(&dense(&att, "o", d, d)?)?;
    let h2 = layer_norm(&x1, "ln2", d)?;
    let m = dense(&dense(&h2, "fc1", d, 4 * d)?.gelu()?, "fc2", 4 * d, d)?;
    let y = x1.add(&m)?;
    Ok((b.graph(), vec![y.id()]))
}

/// The rematerialization example: `a = exp(x)` is needed early (by `tanh`) and late (by the
/// final adds), with two transposes of a 4 KiB `[32, 32]` f32 value in between. Planned with
/// [`crate::FusionMode::Off`] kernels, the arena needs 16 KiB; recomputing `a` right before
/// its late use (its input `x` is live until the end anyway) brings it to 12 KiB.
pub fn remat_graph() -> (Graph, Vec<NodeId>) {
    let build = || -> Result<(Graph, Vec<NodeId>)> {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, vec![32, 32])?;
        let a = x.exp()?;
        let c = a.tanh()?.t()?;
        let d = c.t()?;
        let y = d.add(&a)?.add(&x)?;
        Ok((b.graph(), vec![y.id()]))
    };
    build().expect("the example graph is well typed")
}

/// `exp(x · (w ⊙ s)) · v · 0.5` on `x: [n, 64]`, with the scale applied per output column
/// (batch-norm folding's shape): the scaled weight is arithmetic, so it cannot join the
/// matmul's prologue and is a kernel of its own that reads parameters only (`w`, `s`). The
/// second, wider product (`v: [64, 256]`) puts the plan's peak after the scaled weight's
/// last use, so keeping it alive (hoisting) costs arena bytes. Returns the graph, `[y]`, and
/// the scaled weight.
pub fn scaled_matmul(n: usize) -> Result<(Graph, Vec<NodeId>, NodeId)> {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [n, 64])?;
    let w = b.parameter("w", DType::F32, [64, 64])?;
    let s = b.parameter("s", DType::F32, [64])?;
    let v = b.parameter("v", DType::F32, [64, 256])?;
    let ws = w.mul(&s.broadcast_to([64, 64])?)?;
    let y = x.matmul(&ws)?.exp()?.matmul(&v)?.mul_scalar(0.5)?;
    Ok((b.graph(), vec![y.id()], ws.id()))
}

/// Random values in [-1.25, 0.75] (never zeros on a pattern) for every input of `g`,
/// deterministic per seed: the feeds of the passes' tests that compare a rewritten graph with
/// the original through the reference.
pub fn random_feeds(g: &Graph, seed: u64) -> std::collections::BTreeMap<String, fusegraph_ir::HostTensor> {
    let mut rng = TestRng::new(seed);
    let mut out = std::collections::BTreeMap::new();
    for id in g.node_ids() {
        if let fusegraph_ir::Op::Input { name } = &g.node(id).op {
            let ty = g.ty(id);
            let v: Vec<f64> = (0..ty.shape.numel()).map(|_| (rng.below(2001) as f64 / 1000.0) - 1.25).collect();
            out.insert(name.clone(), fusegraph_ir::HostTensor::from_f64(ty.dtype, ty.shape.clone(), &v).unwrap());
        }
    }
    out
}
