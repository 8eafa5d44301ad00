//! Differential fuzzing of image networks on the device: random NCHW graphs of convolutions
//! (strides, padding, dilation, grouped and depthwise), bias and batch-norm epilogues,
//! activations, max and average pooling, residual adds, channel concats and slices, spatial
//! pads, sibling convolutions of one input and a pooled classifier head, compiled fused
//! (batch norms folded into their convolutions, epilogues fused, parameters-only kernels
//! hoisted), unfused and in mixed precision, and with a backward pass, each run checked
//! against the CPU reference. `fuzz_device` does the same for 2-D graphs; this checks what
//! fusion and simplification put together around convolutions and windows.
//! Deterministic: a failure names its seed, `FUSEGRAPH_FUZZ_SEED=S` runs that seed alone and
//! `FUSEGRAPH_FUZZ_CASES=N` runs more graphs.

use crate::common;

use crate::common::Rng;
use fusegraph::{CompileOptions, DType, Device, Graph, GraphBuilder, HostTensor, NodeId, Tensor};

/// One random network: its graph, outputs, feeds and parameter values.
struct Case {
    graph: Graph,
    outputs: Vec<NodeId>,
    feeds: Vec<(String, HostTensor)>,
    params: Vec<(String, HostTensor)>,
    ops: Vec<String>,
    builder: GraphBuilder,
    last: Tensor,
    /// The input and every parameter except batch-norm statistics (for gradients).
    trainable: Vec<Tensor>,
}

/// Records parameters with values in a range each needs.
struct Params<'b> {
    b: &'b GraphBuilder,
    values: Vec<(String, HostTensor)>,
    trainable: Vec<Tensor>,
}

impl Params<'_> {
    /// A parameter of `dims` uniform in `[lo, hi)`, never exactly zero.
    fn add(&mut self, rng: &mut Rng, dims: Vec<usize>, lo: f64, hi: f64, trainable: bool) -> Tensor {
        let name = format!("p{}", self.values.len());
        let n: usize = dims.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|_| {
                let v = rng.uniform(lo, hi);
                (if v.abs() < 1e-3 { 0.5 * hi } else { v }) as f32
            })
            .collect();
        let t = self.b.parameter(&name, DType::F32, dims.clone()).unwrap();
        self.values.push((name, HostTensor::new(dims, values).unwrap()));
        if trainable {
            self.trainable.push(t.clone());
        }
        t
    }
}

fn pick<T: Copy>(rng: &mut Rng, from: &[T]) -> T {
    from[(rng.next_u64() % from.len() as u64) as usize]
}

/// A convolution of `x` to `out` channels with a random geometry that keeps at least one
/// output pixel, a bias or a batch norm after it (or neither), and an activation or none.
fn conv_block(rng: &mut Rng, p: &mut Params, x: &Tensor, out: usize, ops: &mut Vec<String>) -> Tensor {
    let [_, c, h, w] = x.dims()[..] else { unreachable!("NCHW") };
    let groups = if c == out && c > 1 && rng.next_u64().is_multiple_of(3) { c } else { pick(rng, &[1, 2]).min(c) };
    let groups = if c.is_multiple_of(groups) && out.is_multiple_of(groups) { groups } else { 1 };
    let k = pick(rng, &[1, 3]);
    let k2 = if rng.next_u64().is_multiple_of(4) { pick(rng, &[1, 2, 3]) } else { k };
    let stride = [pick(rng, &[1, 1, 2]), pick(rng, &[1, 1, 2])];
    let padding = [pick(rng, &[0, 1]), pick(rng, &[0, 1])];
    let dilation = [pick(rng, &[1, 1, 2]), 1];
    // Keep at least one output pixel.
    let fits = |len: usize, k: usize, s: usize, pad: usize, d: usize| len + 2 * pad > d * (k - 1) && s > 0;
    let (stride, padding, dilation) =
        if fits(h, k, stride[0], padding[0], dilation[0]) && fits(w, k2, stride[1], padding[1], dilation[1]) {
            (stride, padding, dilation)
        } else {
            ([1, 1], [k / 2, k2 / 2], [1, 1])
        };
    let fan_in = (c / groups * k * k2) as f64;
    let weight = p.add(rng, vec![out, c / groups, k, k2], -1.0 / fan_in.sqrt(), 1.0 / fan_in.sqrt(), true);
    let mut y = x.conv2d(&weight, stride, padding, dilation, groups).unwrap();
    ops.push(format!("conv{k}x{k2}/s{stride:?}/p{padding:?}/d{dilation:?}/g{groups}"));
    match rng.next_u64() % 3 {
        0 => {
            let bias = p.add(rng, vec![out, 1, 1], -0.5, 0.5, true);
            y = y.add(&bias).unwrap();
            ops.push("bias".into());
        }
        1 => {
            let mean = p.add(rng, vec![out], -0.2, 0.2, false);
            let var = p.add(rng, vec![out], 0.5, 1.5, false);
            let gamma = p.add(rng, vec![out], 0.5, 1.5, true);
            let beta = p.add(rng, vec![out], -0.5, 0.5, true);
            y = y.batch_norm(&mean, &var, &gamma, &beta, 1e-5, 1).unwrap();
            ops.push("batch norm".into());
        }
        _ => {}
    }
    match rng.next_u64() % 4 {
        0 => {
            ops.push("relu".into());
            y.relu().unwrap()
        }
        1 => {
            ops.push("silu".into());
            y.silu().unwrap()
        }
        2 => {
            ops.push("gelu".into());
            y.gelu().unwrap()
        }
        _ => y,
    }
}

/// A random image network; `smooth` leaves out max pooling and f16 rounding (whose results
/// jump under tiny changes of their operands), for f16 storage and gradients.
fn random_case(seed: u64, smooth: bool) -> Case {
    let mut rng = Rng::new(seed);
    let b = GraphBuilder::new();
    let n = pick(&mut rng, &[1, 2, 3]);
    let c = pick(&mut rng, &[1, 3, 4, 8]);
    let (h, w) = (pick(&mut rng, &[5, 7, 8, 12]), pick(&mut rng, &[5, 6, 9, 12]));
    let x = b.input("x", DType::F32, [n, c, h, w]).unwrap();
    let xv: Vec<f32> = (0..n * c * h * w).map(|_| rng.uniform(-2.0, 2.0) as f32 + 1e-3).collect();
    let feeds = vec![("x".to_string(), HostTensor::new([n, c, h, w], xv).unwrap())];
    let mut p = Params { b: &b, values: Vec::new(), trainable: vec![x.clone()] };
    let mut pool: Vec<Tensor> = vec![x];
    let mut ops = Vec::new();
    let steps = 3 + rng.next_u64() % 6;
    for _ in 0..steps {
        let a = pool.last().unwrap().clone();
        let [_, ch, hh, ww] = a.dims()[..] else { unreachable!("NCHW") };
        let next = match rng.next_u64() % 10 {
            0..=2 => {
                let out = pick(&mut rng, &[ch, ch, 4, 8, 6]);
                conv_block(&mut rng, &mut p, &a, out, &mut ops)
            }
            3 => {
                // A residual block: a shape-keeping convolution added back.
                let y = conv_block(&mut rng, &mut p, &a, ch, &mut ops);
                if y.dims() == a.dims() {
                    ops.push("residual add".into());
                    y.add(&a).unwrap()
                } else {
                    y
                }
            }
            4 if hh >= 2 && ww >= 2 => {
                let window = pick(&mut rng, &[2, 3]).min(hh).min(ww);
                let stride = pick(&mut rng, &[1, 2]);
                let padding = if window == 3 { pick(&mut rng, &[0, 1]) } else { 0 };
                let max = !smooth && rng.next_u64().is_multiple_of(2);
                ops.push(format!("{} pool {window}/s{stride}/p{padding}", if max { "max" } else { "avg" }));
                let geometry = ([window, window], [stride, stride], [padding, padding]);
                if max {
                    a.max_pool2d(geometry.0, geometry.1, geometry.2).unwrap()
                } else {
                    a.avg_pool2d(geometry.0, geometry.1, geometry.2).unwrap()
                }
            }
            5 => {
                // Sibling convolutions of one input (Inception's branches), concatenated.
                let (l, r) = (pick(&mut rng, &[2, 4]), pick(&mut rng, &[2, 4]));
                let left = conv_block(&mut rng, &mut p, &a, l, &mut ops);
                let right = conv_block(&mut rng, &mut p, &a, r, &mut ops);
                if left.dims()[2..] == right.dims()[2..] {
                    ops.push("concat channels".into());
                    a.builder().concat(&[&left, &right], 1).unwrap()
                } else {
                    ops.push("second branch dropped".into());
                    left
                }
            }
            6 if ch > 1 => {
                let start = (rng.next_u64() % (ch as u64 - 1)) as usize;
                ops.push(format!("channels {start}.."));
                a.narrow(1, start, ch - start).unwrap()
            }
            7 => {
                let (top, left) = (pick(&mut rng, &[0, 1]), pick(&mut rng, &[0, 1, 2]));
                ops.push(format!("pad {top},{left}"));
                a.pad(&[0, 0, top, left], &[0, 0, 1, 0], 0.0).unwrap()
            }
            8 if !smooth => {
                ops.push("f16 round trip".into());
                a.cast(DType::F16).and_then(|t| t.cast(DType::F32)).unwrap()
            }
            _ => {
                ops.push("tanh".into());
                a.tanh().unwrap()
            }
        };
        pool.push(next);
    }
    let feature = pool.last().unwrap().clone();
    let mut outputs = vec![];
    // Half the networks end in a classifier head: global average pool, then a product.
    let last = if rng.next_u64().is_multiple_of(2) {
        let [nn, ch, _, _] = feature.dims()[..] else { unreachable!("NCHW") };
        let classes = pick(&mut rng, &[3, 10]);
        let head = p.add(&mut rng, vec![ch, classes], -0.5, 0.5, true);
        ops.push("pooled head".into());
        feature.mean(&[2, 3], false).unwrap().reshape(vec![nn, ch]).unwrap().matmul(&head).unwrap()
    } else {
        feature
    };
    outputs.push(last.id());
    // Sometimes an intermediate is an output too.
    if pool.len() > 2 && rng.next_u64().is_multiple_of(3) {
        let o = pool[1 + (rng.next_u64() % (pool.len() as u64 - 2)) as usize].id();
        if !outputs.contains(&o) {
            outputs.push(o);
        }
    }
    let (params, trainable) = (p.values, p.trainable);
    Case { graph: b.graph(), outputs, feeds, params, ops, builder: b, last, trainable }
}

/// The seeds each test runs ([`common::fuzz_seeds`]): 30 networks by default.
fn seeds() -> std::ops::RangeInclusive<u64> {
    common::fuzz_seeds(30)
}

/// Compiles and runs `case` under `opts` and compares its outputs with the reference at
/// `tol`, widened where the network is ill-conditioned ([`common::Program::check`]);
/// returns the executable's kernel count.
fn check(device: &std::sync::Arc<Device>, case: &Case, opts: &CompileOptions, tol: f64) -> Result<usize, String> {
    let program =
        common::Program { graph: &case.graph, outputs: &case.outputs, feeds: &case.feeds, params: &case.params };
    // Nudged by about the storage's rounding: f16's where it stores f16.
    let nudge_by = if opts.mixed_precision { 1e-3 } else { 1e-6 };
    Ok(program.check(device, opts, tol, nudge_by)?.kernels.len())
}

#[test]
fn random_image_networks_match_the_reference_fused_unfused_and_in_mixed_precision() {
    let cases = seeds().count();
    let device = Device::shared().unwrap();
    let mixed = CompileOptions { mixed_precision: true, ..Default::default() };
    let mut failures = Vec::new();
    let (mut fused_kernels, mut unfused_kernels, mut folded) = (0, 0, 0);
    for seed in seeds() {
        let case = random_case(seed, false);
        let tol = if case.ops.iter().any(|o| o == "f16 round trip") { 2e-3 } else { 2e-4 };
        match check(&device, &case, &CompileOptions::default(), tol) {
            Ok(k) => fused_kernels += k,
            Err(e) => failures.push(format!("seed {seed} (fused; {}): {e}", case.ops.join(", "))),
        }
        match check(&device, &case, &CompileOptions::unfused(), tol) {
            Ok(k) => unfused_kernels += k,
            Err(e) => failures.push(format!("seed {seed} (unfused; {}): {e}", case.ops.join(", "))),
        }
        folded += case.ops.iter().filter(|o| *o == "batch norm").count();
        let smooth = random_case(seed, true);
        if let Err(e) = check(&device, &smooth, &mixed, 3e-2) {
            failures.push(format!("seed {seed} (mixed precision; {}): {e}", smooth.ops.join(", ")));
        }
    }
    eprintln!(
        "{cases} networks ({folded} batch norms): {fused_kernels} kernels fused, {unfused_kernels} unfused; {} failures",
        failures.len()
    );
    assert!(failures.is_empty(), "{} failed:\n{}", failures.len(), failures.join("\n"));
    // Not vacuous: fusion put the networks' ops together.
    assert!(cases < 5 || fused_kernels < unfused_kernels, "{fused_kernels} fused against {unfused_kernels} unfused");
}

/// The same networks with a backward pass: the gradient of Σ last² with respect to the
/// image and every trainable parameter (convolution weights, biases, batch-norm scales and
/// shifts, the head), fused and unfused, against the reference evaluating the same graph.
#[test]
fn random_image_network_gradients_match_the_reference_fused_and_unfused() {
    let cases = seeds().count();
    let device = Device::shared().unwrap();
    let mut failures = Vec::new();
    for seed in seeds() {
        let mut case = random_case(seed, true);
        let loss = case.last.mul(&case.last).and_then(|sq| sq.sum(&(0..sq.dims().len()).collect::<Vec<_>>(), false));
        let loss = loss.unwrap();
        let grads = fusegraph::grad(&loss, &case.trainable.iter().collect::<Vec<_>>()).unwrap();
        case.graph = case.builder.graph();
        case.outputs = std::iter::once(loss.id()).chain(grads.iter().map(|t| t.id())).collect();
        for (mode, opts) in [("fused", CompileOptions::default()), ("unfused", CompileOptions::unfused())] {
            if let Err(e) = check(&device, &case, &opts, 5e-4) {
                failures.push(format!("seed {seed} ({mode}; {}): {e}", case.ops.join(", ")));
            }
        }
    }
    eprintln!("{cases} networks with gradients, {} failures", failures.len());
    assert!(failures.is_empty(), "{} failed:\n{}", failures.len(), failures.join("\n"));
}
