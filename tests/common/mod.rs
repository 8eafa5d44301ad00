//! The op catalog shared by the naga (null) tests and the device tests: one small graph per
//! op × dtype × shape family, with random feeds (never zeros) suited to each op's domain.

#![allow(dead_code)]

use fusegraph::{BinaryOp, DType, Graph, GraphBuilder, HostTensor, NodeId, ReduceKind, Tensor, UnaryOp};
use std::collections::BTreeMap;

/// The devices a device test runs on: the adapter with native f16 where it has it, and with
/// f16 stored packed in `u32`, each named.
pub fn devices() -> Vec<(String, std::sync::Arc<fusegraph::Device>)> {
    use fusegraph::{Device, DeviceOptions};
    let native = Device::new(&DeviceOptions { f16_native: Some(true), ..Default::default() }).expect("a device");
    let mut out = Vec::new();
    if native.f16_native() {
        out.push(("native f16".to_string(), std::sync::Arc::new(native)));
    }
    let packed = Device::new(&DeviceOptions { f16_native: Some(false), ..Default::default() }).expect("a device");
    out.push(("packed f16".to_string(), std::sync::Arc::new(packed)));
    out
}

/// The tests' seeded generator (the workspace's PCG), so failures reproduce.
pub struct Rng(rand_pcg::Pcg64Mcg);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(rand::SeedableRng::seed_from_u64(seed))
    }
    pub fn next_u64(&mut self) -> u64 {
        rand::RngCore::next_u64(&mut self.0)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * rand::Rng::random::<f64>(&mut self.0)
    }
}

/// The seeds a differential fuzz test runs: `1..=default` cases, `FUSEGRAPH_FUZZ_CASES=N`
/// for more or fewer, `FUSEGRAPH_FUZZ_FROM=F` to start at seed `F` (fresh cases after a long
/// run), `FUSEGRAPH_FUZZ_SEED=S` for seed `S` alone (the one a failure named).
/// Lowering options of a Mesa CPU adapter without subgroups (`cpu`: the serial forms within
/// its loop budget) or of a GPU without them (the parallel forms), f16 native or packed.
#[allow(dead_code)]
pub fn lower_options(cpu: bool, f16_native: bool) -> fusegraph::crates::wgsl::LowerOptions {
    use fusegraph::crates::wgsl::{Forms, LowerOptions, CPU_LOOP_BUDGET};
    LowerOptions {
        f16_native,
        forms: if cpu { Forms::SERIAL } else { Forms::PARALLEL },
        loop_budget: cpu.then_some(CPU_LOOP_BUDGET),
        subgroups: false,
        subgroup_size: None,
        ..Default::default()
    }
}

pub fn fuzz_seeds(default: u64) -> std::ops::RangeInclusive<u64> {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse::<u64>().ok());
    match var("FUSEGRAPH_FUZZ_SEED") {
        Some(seed) => seed..=seed,
        None => {
            let from = var("FUSEGRAPH_FUZZ_FROM").unwrap_or(1);
            from..=from.saturating_add(var("FUSEGRAPH_FUZZ_CASES").unwrap_or(default).saturating_sub(1))
        }
    }
}

/// The value domain an operand needs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Domain {
    /// Anything in the dtype's test range (floats in [-3, 3]).
    Any,
    /// Strictly positive (log, sqrt, pow base).
    Positive,
    /// Away from zero (divisors, recip).
    NonZero,
    /// Indices for a table axis of this size; some out of range to exercise clamping.
    Index(usize),
}

pub fn random(rng: &mut Rng, dtype: DType, dims: &[usize], domain: Domain) -> HostTensor {
    let n: usize = dims.iter().product();
    if dtype.block().is_some() && !fusegraph::quant::QUANTIZED.contains(&dtype) {
        return fusegraph_workloads::random_blocks(rng.next_u64(), dtype, dims);
    }
    // The floats, and the blocks of 32 quantized from them.
    let real = dtype.is_float() || dtype == DType::BF16 || dtype.block().is_some();
    let values: Vec<f64> = (0..n)
        .map(|_| match (dtype, domain) {
            (_, Domain::Index(d)) => {
                (rng.uniform(-1.0, d as f64 + 1.0).floor()).max(if dtype == DType::U32 { 0.0 } else { -1.0 })
            }
            (DType::Bool, _) => (rng.next_u64() & 1) as f64,
            (_, Domain::Any) if real => {
                let v = rng.uniform(-3.0, 3.0);
                if v.abs() < 1e-3 {
                    0.5
                } else {
                    v
                }
            }
            (_, Domain::Positive) if real => rng.uniform(0.25, 3.0),
            (_, Domain::NonZero) if real => {
                let v = rng.uniform(0.5, 3.0);
                if rng.next_u64() & 1 == 1 {
                    v
                } else {
                    -v
                }
            }
            (DType::I32, Domain::NonZero) => {
                let v = rng.uniform(1.0, 20.0).floor();
                if rng.next_u64() & 1 == 1 {
                    v
                } else {
                    -v
                }
            }
            (DType::U32, Domain::NonZero | Domain::Positive) => rng.uniform(1.0, 20.0).floor(),
            (DType::I32, Domain::Positive) => rng.uniform(1.0, 20.0).floor(),
            (DType::I32, _) => rng.uniform(-50.0, 50.0).floor(),
            (DType::U32, _) => rng.uniform(0.0, 100.0).floor(),
            _ => unreachable!("{dtype}: the k-quants and IQ types come from fusegraph_workloads::random_blocks"),
        })
        .collect();
    HostTensor::from_f64(dtype, dims.to_vec(), &values).expect("shape and values agree")
}

/// One test graph: build it, feed it, compare every output with the reference.
pub struct Case {
    pub name: String,
    pub graph: Graph,
    pub outputs: Vec<NodeId>,
    pub feeds: Vec<(String, HostTensor)>,
    /// Extra absolute tolerance for long f32 accumulations.
    pub atol: f64,
    /// Extra relative and absolute tolerance for f16 outputs of multi-op graphs: the reference
    /// rounds every intermediate to f16, a fused kernel keeps them in f32.
    pub f16_tol: f64,
}

impl Case {
    /// Compares `got` with `want` (the reference's outputs, or another run's) at each
    /// output dtype's tolerance, widened by the case's `atol` for floats and, for f16, by
    /// its `f16_tol` relative to the largest magnitude: f16 products summed in f32 in
    /// another order than the reference's f64 sum can round to a neighbouring f16 value
    /// before an epilogue.
    pub fn check_outputs(&self, got: &[HostTensor], want: &[HostTensor]) -> Result<(), String> {
        use fusegraph::crates::reference::{assert_close, tolerance};
        for (g, w) in got.iter().zip(want) {
            let (mut rtol, atol) = tolerance(w.dtype());
            let mut atol = if w.dtype().is_float() { atol.max(self.atol) } else { atol };
            if w.dtype() == DType::F16 {
                let scale = w.to_f64().iter().fold(1.0f64, |m, v| m.max(v.abs()));
                rtol = rtol.max(self.f16_tol);
                atol = atol.max(self.f16_tol * scale);
            }
            assert_close(g, w, rtol, atol)?;
        }
        Ok(())
    }
}

/// Compiles `case` on `device` under `opts`, runs it on its feeds and compares the outputs
/// with the CPU reference's ([`Case::check_outputs`]); the executable's stats, for callers
/// that check which kernels it took.
pub fn run_case(
    device: &std::sync::Arc<fusegraph::Device>,
    case: &Case,
    opts: &fusegraph::CompileOptions,
) -> Result<fusegraph::ExecutableStats, String> {
    use fusegraph::crates::reference::evaluate;
    let feeds: BTreeMap<String, HostTensor> = case.feeds.iter().cloned().collect();
    let want = evaluate(&case.graph, &case.outputs, &feeds, &BTreeMap::new()).map_err(|e| format!("reference: {e}"))?;
    let exe = device.compile(&case.graph, &case.outputs, opts).map_err(|e| format!("compile: {e}"))?;
    let refs: Vec<(&str, &HostTensor)> = case.feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let got = exe.run(&refs).map_err(|e| format!("run: {e}"))?;
    case.check_outputs(&got, &want)?;
    Ok(exe.stats().clone())
}

/// Records inputs with random values while a case is built.
pub struct CaseBuilder {
    pub b: GraphBuilder,
    rng: Rng,
    feeds: Vec<(String, HostTensor)>,
}

impl CaseBuilder {
    pub fn new(seed: u64) -> Self {
        CaseBuilder { b: GraphBuilder::new(), rng: Rng::new(seed), feeds: Vec::new() }
    }
    pub fn input(&mut self, dtype: DType, dims: &[usize], domain: Domain) -> Tensor {
        let name = format!("x{}", self.feeds.len());
        let t = self.b.input(&name, dtype, dims.to_vec()).expect("valid input");
        self.feeds.push((name, random(&mut self.rng, dtype, dims, domain)));
        t
    }
    pub fn finish(self, name: impl Into<String>, outputs: &[&Tensor]) -> Case {
        Case {
            name: name.into(),
            graph: self.b.graph(),
            outputs: outputs.iter().map(|t| t.id()).collect(),
            feeds: self.feeds,
            atol: 0.0,
            f16_tol: 0.0,
        }
    }
}

const SHAPES: [&[usize]; 6] = [&[], &[1], &[7], &[33, 5], &[2, 1, 3, 2, 2, 3], &[1000]];

fn unary_domain(u: UnaryOp) -> Domain {
    match u {
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt => Domain::Positive,
        UnaryOp::Recip => Domain::NonZero,
        _ => Domain::Any,
    }
}

/// Every op × every dtype it accepts, over several shapes. `seed` varies the values.
pub fn catalog(seed: u64) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut s = seed;
    let mut next = || {
        s += 1;
        CaseBuilder::new(s)
    };
    for u in UnaryOp::ALL {
        for dt in DType::ALL.into_iter().filter(|&d| u.accepts(d)) {
            for (k, dims) in SHAPES.iter().enumerate() {
                let mut c = next();
                let x = c.input(dt, dims, unary_domain(u));
                let y = x.unary(u).unwrap();
                cases.push(c.finish(format!("{}_{dt}_s{k}", u.name()), &[&y]));
            }
            // A transposed (strided) operand.
            let mut c = next();
            let x = c.input(dt, &[5, 3, 4], unary_domain(u));
            let y = x.transpose(&[2, 0, 1]).unwrap().unary(u).unwrap();
            cases.push(c.finish(format!("{}_{dt}_transposed", u.name()), &[&y]));
        }
    }
    for op in BinaryOp::ALL {
        for dt in DType::ALL.into_iter().filter(|&d| op.accepts(d)) {
            let (da, db) = match op {
                BinaryOp::Div => (Domain::Any, Domain::NonZero),
                BinaryOp::Pow => (Domain::Positive, Domain::Any),
                _ => (Domain::Any, Domain::Any),
            };
            for (k, dims) in SHAPES.iter().enumerate() {
                let mut c = next();
                let a = c.input(dt, dims, da);
                let b = c.input(dt, dims, db);
                let y = a.binary(op, &b).unwrap();
                cases.push(c.finish(format!("{}_{dt}_s{k}", op.name()), &[&y]));
            }
            let mut c = next();
            let a = c.input(dt, &[4, 1, 3], da);
            let b = c.input(dt, &[5, 1], db);
            let y = a.binary(op, &b).unwrap();
            cases.push(c.finish(format!("{}_{dt}_broadcast", op.name()), &[&y]));
        }
    }
    for dt in DType::COMPUTED {
        let mut c = next();
        let cond = c.input(DType::Bool, &[6, 5], Domain::Any);
        let a = c.input(dt, &[6, 5], Domain::Any);
        let b = c.input(dt, &[1, 5], Domain::Any);
        let y = cond.select(&a, &b).unwrap();
        cases.push(c.finish(format!("select_{dt}"), &[&y]));
        for to in DType::COMPUTED {
            let mut c = next();
            let x = c.input(dt, &[37], Domain::Any);
            let y = x.cast(to).unwrap();
            cases.push(c.finish(format!("cast_{dt}_to_{to}"), &[&y]));
        }
        layout_cases(dt, &mut next, &mut cases);
    }
    // bf16 is stored only: a cast to a float type is the op that reads it (alone, and as a
    // matmul's operand as a bf16 weight is read).
    for to in [DType::F32, DType::F16] {
        let mut c = next();
        let x = c.input(DType::BF16, &[37], Domain::Any);
        let y = x.cast(to).unwrap();
        cases.push(c.finish(format!("cast_bf16_to_{to}"), &[&y]));
    }
    let mut c = next();
    let x = c.input(DType::F32, &[6, 24], Domain::Any);
    let w = c.input(DType::BF16, &[24, 10], Domain::Any);
    let y = x.matmul(&w.cast(DType::F32).unwrap()).unwrap();
    cases.push(c.finish("matmul_bf16_weight".to_string(), &[&y]));
    // The block types likewise: casts, a weight in either orientation (GGUF's `[out, in]`
    // transposed into the product, and `[in, out]`), and rows gathered from a table, each
    // last axis a few blocks (`e` values each).
    for q in DType::ALL.into_iter().filter(|d| d.block().is_some()) {
        let e = q.block().expect("a block type").0;
        for to in [DType::F32, DType::F16] {
            let mut c = next();
            let x = c.input(q, &[3, 2 * e], Domain::Any);
            let y = x.cast(to).unwrap();
            cases.push(c.finish(format!("cast_{q}_to_{to}"), &[&y]));
        }
        for dt in [DType::F32, DType::F16] {
            let mut c = next();
            let x = c.input(dt, &[6, 2 * e], Domain::Any);
            let w = c.input(q, &[10, 2 * e], Domain::Any);
            let y = x.matmul(&w.cast(dt).unwrap().transpose(&[1, 0]).unwrap()).unwrap();
            let mut case = c.finish(format!("matmul_{q}_weight_rows_{dt}"), &[&y]);
            // Sums of 512 products where a block is 256 values: f32's rounding against f64's.
            case.atol = 1e-7 * (2 * e) as f64;
            cases.push(case);
        }
        let mut c = next();
        let x = c.input(DType::F32, &[5, 24], Domain::Any);
        let w = c.input(q, &[24, 3 * e], Domain::Any);
        let y = x.matmul(&w.cast(DType::F32).unwrap()).unwrap();
        cases.push(c.finish(format!("matmul_{q}_weight"), &[&y]));
        let mut c = next();
        let table = c.input(q, &[9, e], Domain::Any);
        let ids = c.input(DType::I32, &[4], Domain::Index(9));
        let y = table.cast(DType::F32).unwrap().gather(&ids, 0).unwrap();
        cases.push(c.finish(format!("gather_{q}_rows"), &[&y]));
    }
    numeric_cases(&mut next, &mut cases);
    cases
}

fn layout_cases(dt: DType, next: &mut impl FnMut() -> CaseBuilder, cases: &mut Vec<Case>) {
    let mut c = next();
    let x = c.input(dt, &[3, 1], Domain::Any);
    let y = x.broadcast_in_dim(vec![2, 3, 4], vec![1, 2]).unwrap();
    let z = c.input(dt, &[], Domain::Any).broadcast_to([5, 2]).unwrap();
    cases.push(c.finish(format!("broadcast_{dt}"), &[&y, &z]));

    let mut c = next();
    let x = c.input(dt, &[4, 6], Domain::Any);
    let y = x.reshape([2, 3, 4]).unwrap();
    cases.push(c.finish(format!("reshape_{dt}"), &[&y]));

    let mut c = next();
    let x = c.input(dt, &[2, 3, 1, 2, 3, 2], Domain::Any);
    let y = x.transpose(&[5, 3, 0, 2, 4, 1]).unwrap();
    let w = c.input(dt, &[7, 9], Domain::Any).t().unwrap();
    cases.push(c.finish(format!("transpose_{dt}"), &[&y, &w]));

    let mut c = next();
    let x = c.input(dt, &[9, 10, 3], Domain::Any);
    let y = x.slice(&[1, 2, 0], &[8, 10, 3], &[3, 2, 1]).unwrap();
    cases.push(c.finish(format!("slice_{dt}"), &[&y]));

    let mut c = next();
    let (a, b, d) =
        (c.input(dt, &[2, 3], Domain::Any), c.input(dt, &[2, 1], Domain::Any), c.input(dt, &[2, 4], Domain::Any));
    let y = c.b.concat(&[&a, &b, &d], 1).unwrap();
    let z = c.b.concat(&[&a, &a], 0).unwrap();
    cases.push(c.finish(format!("concat_{dt}"), &[&y, &z]));

    let mut c = next();
    let x = c.input(dt, &[3, 4], Domain::Any);
    let y = x.pad(&[1, 0], &[2, 3], 1.0).unwrap();
    cases.push(c.finish(format!("pad_{dt}"), &[&y]));

    for it in [DType::I32, DType::U32] {
        for axis in [0, 1] {
            let mut c = next();
            let table = c.input(dt, &[6, 5, 2], Domain::Any);
            let dim = table.dims()[axis];
            let idx = c.input(it, &[3, 4], Domain::Index(dim));
            let y = table.gather(&idx, axis).unwrap();
            cases.push(c.finish(format!("gather_{dt}_{it}_axis{axis}"), &[&y]));
        }
        // A window of 2 at a start from −1 to past the last fitting one (clamped).
        for axis in [0, 1, 2] {
            let mut c = next();
            let x = c.input(dt, &[6, 5, 4], Domain::Any);
            let mut dims = x.dims().to_vec();
            dims[axis] = 2;
            let u = c.input(dt, &dims, Domain::Any);
            let start = c.input(it, &[], Domain::Index(x.dims()[axis] - 1));
            let y = x.dynamic_update_slice(&u, &start, axis).unwrap();
            cases.push(c.finish(format!("dynamic_update_slice_{dt}_{it}_axis{axis}"), &[&y]));
        }
        // A start per index of axis 0.
        for axis in [1, 2] {
            let mut c = next();
            let x = c.input(dt, &[3, 5, 4], Domain::Any);
            let mut dims = x.dims().to_vec();
            dims[axis] = 2;
            let u = c.input(dt, &dims, Domain::Any);
            let start = c.input(it, &[3], Domain::Index(x.dims()[axis] - 1));
            let y = x.dynamic_update_slice(&u, &start, axis).unwrap();
            cases.push(c.finish(format!("dynamic_update_slice_rows_{dt}_{it}_axis{axis}"), &[&y]));
        }
    }
}

fn numeric_cases(next: &mut impl FnMut() -> CaseBuilder, cases: &mut Vec<Case>) {
    for dt in [DType::F32, DType::F16, DType::I32, DType::U32] {
        for kind in ReduceKind::ALL {
            for (axes, keep) in [(&[1usize][..], false), (&[0, 2][..], true), (&[0, 1, 2][..], false)] {
                let mut c = next();
                // Products of many values overflow; keep their reductions short.
                let dims: &[usize] = if kind == ReduceKind::Prod { &[2, 3, 2] } else { &[5, 17, 3] };
                let domain = if kind == ReduceKind::Prod && dt.is_float() { Domain::NonZero } else { Domain::Any };
                let x = c.input(dt, dims, domain);
                let y = x.reduce(kind, axes, keep).unwrap();
                let mut case = c.finish(format!("reduce_{}_{dt}_{axes:?}_{keep}", kind.name()), &[&y]);
                case.atol = 1e-4;
                cases.push(case);
            }
        }
        let mut c = next();
        let x = c.input(dt, &[4, 9, 3], Domain::Any);
        let y = x.argmax(1, false).unwrap();
        let z = x.argmax(2, true).unwrap();
        cases.push(c.finish(format!("argmax_{dt}"), &[&y, &z]));
        // Rows long enough for row kernels, along the last axis and along the first.
        let mut c = next();
        let x = c.input(dt, &[70, 100], Domain::Any);
        let y = x.argmax(1, false).unwrap();
        let z = x.argmax(0, true).unwrap();
        cases.push(c.finish(format!("argmax_rows_{dt}"), &[&y, &z]));

        let mut c = next();
        let a = c.input(dt, &[2, 1, 7, 33], Domain::Any);
        let b = c.input(dt, &[3, 33, 5], Domain::Any);
        let y = a.matmul(&b).unwrap();
        let mut case = c.finish(format!("matmul_{dt}_batched"), &[&y]);
        case.atol = 1e-4;
        cases.push(case);

        let mut c = next();
        let x = c.input(dt, &[3, 4, 5], Domain::Any);
        let i = c.b.iota(dt, vec![3, 4], 1).unwrap();
        let f = c.b.full(dt, vec![2], 3.0).unwrap();
        let k = c.b.constant(dt, vec![2], &[1.0, 2.0]).unwrap();
        let y = x.sum(&[2], false).unwrap().add(&i).unwrap();
        cases.push(c.finish(format!("leaves_{dt}"), &[&y, &f, &k]));
    }
    for dt in [DType::F32, DType::F16] {
        for (stride, pad, dil, groups) in
            [([1, 1], [0, 0], [1, 1], 1), ([2, 1], [1, 2], [1, 1], 2), ([1, 2], [2, 1], [2, 1], 4)]
        {
            let mut c = next();
            let x = c.input(dt, &[2, 4, 9, 8], Domain::Any);
            let w = c.input(dt, &[8, 4 / groups, 3, 3], Domain::Any);
            let y = x.conv2d(&w, stride, pad, dil, groups).unwrap();
            let mut case = c.finish(format!("conv2d_{dt}_s{stride:?}_p{pad:?}_d{dil:?}_g{groups}"), &[&y]);
            case.atol = 1e-4;
            cases.push(case);
        }
        let mut c = next();
        let x = c.input(dt, &[2, 3, 9, 7], Domain::Any);
        let y = x.max_pool2d([3, 2], [2, 2], [1, 1]).unwrap();
        let z = x.avg_pool2d([2, 3], [1, 2], [1, 0]).unwrap();
        cases.push(c.finish(format!("pool_{dt}"), &[&y, &z]));
    }
}

/// Tensors larger than 65535 workgroups of 256 invocations: the dispatch must split.
pub fn large_cases() -> Vec<Case> {
    let n = 65535 * 256 + 1001;
    let mut out = Vec::new();
    for dt in [DType::F32, DType::F16] {
        let mut c = CaseBuilder::new(99);
        let a = c.input(dt, &[n], Domain::Any);
        let b = c.input(dt, &[n], Domain::Any);
        let y = a.mul(&b).unwrap().add(&a).unwrap();
        out.push(c.finish(format!("large_{dt}"), &[&y]));
    }
    out
}

/// Composite patterns the fusion pass must handle: row patterns over any axis, epilogues,
/// long chains, sibling reductions. Each is named by what it checks.
pub fn composite_cases() -> Vec<Case> {
    let mut out = Vec::new();
    let f = DType::F32;
    for (name, build) in composite_builders() {
        for dt in [f, DType::F16] {
            let mut c = CaseBuilder::new(name.len() as u64 * 31 + dt as u64);
            let outs = build(&mut c, dt);
            let refs: Vec<&Tensor> = outs.iter().collect();
            let mut case = c.finish(format!("{name}_{dt}"), &refs);
            case.atol = 1e-4;
            case.f16_tol = 1e-2;
            out.push(case);
        }
    }
    out
}

type Builder = fn(&mut CaseBuilder, DType) -> Vec<Tensor>;

/// The composite graphs, by name.
pub fn composite_builders() -> Vec<(&'static str, Builder)> {
    vec![
        ("chain20", |c, dt| {
            let mut x = c.input(dt, &[1000], Domain::Any);
            let y = c.input(dt, &[1000], Domain::Any);
            for k in 0..20 {
                x = match k % 4 {
                    0 => x.add(&y).unwrap(),
                    1 => x.mul_scalar(0.5).unwrap(),
                    2 => x.tanh().unwrap(),
                    _ => x.sub(&y).unwrap(),
                };
            }
            vec![x]
        }),
        ("softmax_last", |c, dt| vec![c.input(dt, &[13, 100], Domain::Any).softmax(1).unwrap()]),
        ("softmax_axis0", |c, dt| vec![c.input(dt, &[100, 13], Domain::Any).softmax(0).unwrap()]),
        ("softmax_short_rows", |c, dt| vec![c.input(dt, &[50, 3, 5], Domain::Any).softmax(1).unwrap()]),
        ("log_softmax", |c, dt| vec![c.input(dt, &[6, 70], Domain::Any).log_softmax(1).unwrap()]),
        ("layer_norm", |c, dt| {
            let x = c.input(dt, &[8, 96], Domain::Any);
            let gamma = c.input(dt, &[96], Domain::Any);
            let beta = c.input(dt, &[96], Domain::Any);
            vec![x.layer_norm(&[1], 1e-5).unwrap().mul(&gamma).unwrap().add(&beta).unwrap()]
        }),
        // A pre-norm block's residual stream: `h` feeds the layer norm and the residual add.
        ("residual_layer_norm", |c, dt| {
            let x = c.input(dt, &[12, 72], Domain::Any);
            let r = c.input(dt, &[12, 72], Domain::Any);
            let gamma = c.input(dt, &[72], Domain::Any);
            let h = x.add(&r).unwrap();
            vec![h.layer_norm(&[1], 1e-5).unwrap().mul(&gamma).unwrap().add(&h).unwrap()]
        }),
        ("layer_norm_gelu", |c, dt| {
            vec![c.input(dt, &[4, 80], Domain::Any).layer_norm(&[1], 1e-5).unwrap().gelu().unwrap()]
        }),
        ("matmul_bias_relu", |c, dt| {
            let a = c.input(dt, &[17, 40], Domain::Any);
            let b = c.input(dt, &[40, 23], Domain::Any);
            let bias = c.input(dt, &[23], Domain::Any);
            vec![a.matmul(&b).unwrap().add(&bias).unwrap().relu().unwrap()]
        }),
        ("gelu_relu_matmul_bias", |c, dt| {
            let a = c.input(dt, &[9, 33], Domain::Any);
            let b = c.input(dt, &[33, 20], Domain::Any);
            let bias = c.input(dt, &[20], Domain::Any);
            vec![a.matmul(&b).unwrap().relu().unwrap().add(&bias).unwrap().gelu().unwrap()]
        }),
        ("conv_bn_relu", |c, dt| {
            let x = c.input(dt, &[2, 3, 10, 10], Domain::Any);
            let w = c.input(dt, &[8, 3, 3, 3], Domain::Any);
            let mean = c.input(dt, &[8, 1, 1], Domain::Any);
            let var = c.input(dt, &[8, 1, 1], Domain::Positive);
            let gamma = c.input(dt, &[8, 1, 1], Domain::Any);
            let beta = c.input(dt, &[8, 1, 1], Domain::Any);
            let y = x.conv2d(&w, [1, 1], [1, 1], [1, 1], 1).unwrap();
            let scale = var.add_scalar(1e-5).unwrap().rsqrt().unwrap().mul(&gamma).unwrap();
            vec![y.sub(&mean).unwrap().mul(&scale).unwrap().add(&beta).unwrap().relu().unwrap()]
        }),
        ("sibling_reductions", |c, dt| {
            let x = c.input(dt, &[6, 200], Domain::Any);
            let e = x.exp().unwrap();
            vec![e.sum(&[1], false).unwrap(), e.max(&[1], false).unwrap()]
        }),
        ("reduce_all", |c, dt| {
            vec![c.input(dt, &[300, 7], Domain::Any).mul_scalar(0.1).unwrap().sum(&[0, 1], false).unwrap()]
        }),
        ("variance_keepdims_false", |c, dt| vec![c.input(dt, &[5, 90], Domain::Any).variance(&[1], false).unwrap()]),
        ("attention_scores", |c, dt| {
            let q = c.input(dt, &[2, 16, 8], Domain::Any);
            let k = c.input(dt, &[2, 16, 8], Domain::Any);
            let v = c.input(dt, &[2, 16, 8], Domain::Any);
            let s = q.matmul(&k.t().unwrap()).unwrap().mul_scalar(0.35).unwrap().softmax(2).unwrap();
            vec![s.matmul(&v).unwrap()]
        }),
        // Causal attention as `fusegraph-nn` writes it: the mask an `iota` comparison (70
        // queries: too many for constant folding to make a constant of it), −10⁹ masked.
        ("causal_attention", |c, dt| {
            let q = c.input(dt, &[2, 70, 8], Domain::Any);
            let k = c.input(dt, &[2, 70, 8], Domain::Any);
            let v = c.input(dt, &[2, 70, 8], Domain::Any);
            let b = q.builder();
            let row = b.iota(DType::I32, [70, 70], 0).unwrap();
            let col = b.iota(DType::I32, [70, 70], 1).unwrap();
            let s = q.matmul(&k.t().unwrap()).unwrap().mul_scalar(0.35).unwrap();
            let s = row.ge(&col).unwrap().select(&s, &b.scalar(dt, -1e9).unwrap()).unwrap();
            vec![s.softmax(2).unwrap().matmul(&v).unwrap()]
        }),
        // Many rows of a ragged length: on a CPU adapter each row is reduced by one
        // invocation with several partial results side by side, plus a remainder.
        ("many_ragged_rows", |c, dt| {
            let x = c.input(dt, &[40, 103], Domain::Any);
            vec![
                x.softmax(1).unwrap(),
                x.layer_norm(&[1], 1e-5).unwrap(),
                x.reduce(ReduceKind::Max, &[1], false).unwrap(),
            ]
        }),
        // Two independent chains over the same inputs: sibling fusion makes them one loop
        // kernel with two outputs (on a CPU adapter both are computed for several elements
        // side by side before either is stored).
        ("two_elementwise_outputs", |c, dt| {
            let x = c.input(dt, &[37, 29], Domain::Any);
            let y = c.input(dt, &[37, 29], Domain::Any);
            let a = x.mul(&y).unwrap().tanh().unwrap();
            let b = x.sub(&y).unwrap().mul_scalar(3.0).unwrap().tanh().unwrap();
            vec![a, b]
        }),
        ("shared_producer_two_consumers", |c, dt| {
            let x = c.input(dt, &[40, 30], Domain::Any);
            let e = x.exp().unwrap();
            let a = e.sum(&[1], true).unwrap();
            let b = e.mul_scalar(2.0).unwrap().add(&x).unwrap();
            vec![a, b]
        }),
    ]
}

/// A random program of a differential fuzzer: a graph, the outputs compared, the inputs fed
/// and the parameters set (both by name).
pub struct Program<'a> {
    pub graph: &'a Graph,
    pub outputs: &'a [NodeId],
    pub feeds: &'a [(String, HostTensor)],
    pub params: &'a [(String, HostTensor)],
}

impl Program<'_> {
    /// Compiles the program under `opts`, sets its parameters, runs it and compares every
    /// output with the CPU reference within `tol` (relative, and absolute against the
    /// output's largest magnitude), widened where the program is ill-conditioned: by four
    /// times how far the reference moves when every feed and parameter moves by `nudge_by`
    /// of itself (see [`nudge`]). Returns the executable's stats.
    pub fn check(
        &self,
        device: &std::sync::Arc<fusegraph::Device>,
        opts: &fusegraph::CompileOptions,
        tol: f64,
        nudge_by: f64,
    ) -> Result<fusegraph::ExecutableStats, String> {
        use fusegraph::crates::reference::evaluate;
        let mut exe = device.compile(self.graph, self.outputs, opts).map_err(|e| format!("compile: {e}"))?;
        for (name, value) in self.params {
            exe.set_parameter(name, value).map_err(|e| format!("set {name}: {e}"))?;
        }
        let refs: Vec<(&str, &HostTensor)> = self.feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let got = exe.run(&refs).map_err(|e| format!("run: {e}"))?;
        let feeds: BTreeMap<String, HostTensor> = self.feeds.iter().cloned().collect();
        let params: BTreeMap<String, HostTensor> = self.params.iter().cloned().collect();
        let reference = |feeds: &BTreeMap<String, HostTensor>, params: &BTreeMap<String, HostTensor>| {
            evaluate(self.graph, self.outputs, feeds, params).map_err(|e| format!("reference: {e}"))
        };
        let want = reference(&feeds, &params)?;
        let nudged = reference(&nudge(&feeds, nudge_by), &nudge(&params, nudge_by))?;
        for (k, got) in got.iter().enumerate() {
            close(got, &want[k], &nudged[k], tol).map_err(|e| format!("output {k}: {e}"))?;
        }
        Ok(exe.stats().clone())
    }
}

/// Compares `got` with the reference's `want` within `tol` (relative, and absolute against
/// the largest magnitude of `want`), widened by four times how far the reference moved to
/// `nudged` when its operands moved by about the storage's rounding (see [`nudge`]).
pub fn close(got: &HostTensor, want: &HostTensor, nudged: &HostTensor, tol: f64) -> Result<(), String> {
    let (w, moved) = (want.to_f64(), nudged.to_f64());
    let scale = w.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let moved = w.iter().zip(&moved).fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
    fusegraph::crates::reference::assert_close(got, want, tol, tol * scale + 4.0 * moved)
}

/// `values` with every element moved by `by` of itself, up and down in turn: about the
/// storage's rounding (f32: a millionth, ten times its unit roundoff; f16: a thousandth,
/// twice its). Where a graph is ill-conditioned (a layer norm of a nearly constant row, a
/// column max whose tie a step breaks), the device's own rounding moves its results as much
/// as this moves the reference's.
pub fn nudge(values: &BTreeMap<String, HostTensor>, by: f64) -> BTreeMap<String, HostTensor> {
    values
        .iter()
        .map(|(name, v)| {
            let values: Vec<f32> =
                v.to_f64().iter().enumerate().map(|(i, x)| (x * (1.0 + by * [1.0, -1.0][i % 2])) as f32).collect();
            (name.clone(), HostTensor::new(v.shape().dims().to_vec(), values).expect("same shape"))
        })
        .collect()
}
