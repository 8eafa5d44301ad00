//! Reverse-mode autodiff: every differentiable op's gradient, evaluated with the reference
//! interpreter on the appended backward graph, against central finite differences of the
//! forward graph (f32). The loss of a test is `Σ out · W` for fixed random weights `W`.

use fusegraph_ir::{text, verify, DType, Graph, GraphBuilder, HostTensor, NodeId, Op, Tensor, UnaryOp};
use fusegraph_passes::{grad, partition, FusionMode, GradError};
use fusegraph_reference::evaluate;
use std::collections::BTreeMap;

const RTOL: f64 = 2e-2;
const ATOL: f64 = 2e-3;
/// Finite-difference step for smooth functions.
const H: f64 = 1e-2;
/// Step for functions linear in each wrt element (no truncation error, less rounding).
const H_LINEAR: f64 = 0.1;

/// A deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `n` values uniform in `[lo, hi)`.
    fn uniform(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| lo + (hi - lo) * self.unit()).collect()
    }

    /// `n` values with `|v|` in `[lo, hi)` and a random sign (away from zero).
    fn away(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| (lo + (hi - lo) * self.unit()) * if self.unit() < 0.5 { -1.0 } else { 1.0 }).collect()
    }

    /// `n` distinct values, pairwise at least `gap` apart, in random order, centred on 0
    /// (no ties and no kinks crossed by a finite-difference step below `gap / 2`).
    fn distinct(&mut self, n: usize, gap: f64) -> Vec<f64> {
        let mut v: Vec<f64> = (0..n).map(|i| (i as f64 - n as f64 / 2.0) * gap * 1.5).collect();
        for i in (1..n).rev() {
            let j = (self.unit() * (i + 1) as f64) as usize;
            v.swap(i, j.min(i));
        }
        v.iter().map(|x| x + self.unit() * gap * 0.4).collect()
    }
}

/// A test graph and values for its leaves.
struct Case {
    b: GraphBuilder,
    feeds: BTreeMap<String, HostTensor>,
    params: BTreeMap<String, HostTensor>,
    rng: Rng,
}

impl Case {
    fn new(seed: u64) -> Self {
        Case { b: GraphBuilder::new(), feeds: BTreeMap::new(), params: BTreeMap::new(), rng: Rng(seed) }
    }

    /// An f32 input with the given values.
    fn input(&mut self, name: &str, shape: &[usize], vals: Vec<f64>) -> Tensor {
        self.feeds.insert(name.into(), HostTensor::from_f64(DType::F32, shape.to_vec(), &vals).unwrap());
        self.b.input(name, DType::F32, shape.to_vec()).unwrap()
    }

    /// An f32 input uniform in `[-1.5, 1.5)`.
    fn rand(&mut self, name: &str, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        let vals = self.rng.uniform(n, -1.5, 1.5);
        self.input(name, shape, vals)
    }

    /// An f32 parameter with random values in `[-1, 1)`.
    fn param(&mut self, name: &str, shape: &[usize]) -> Tensor {
        let vals = self.rng.uniform(shape.iter().product(), -1.0, 1.0);
        self.params.insert(name.into(), HostTensor::from_f64(DType::F32, shape.to_vec(), &vals).unwrap());
        self.b.parameter(name, DType::F32, shape.to_vec()).unwrap()
    }

    /// An integer input (not differentiated).
    fn ints(&mut self, name: &str, dtype: DType, shape: &[usize], vals: &[f64]) -> Tensor {
        self.feeds.insert(name.into(), HostTensor::from_f64(dtype, shape.to_vec(), vals).unwrap());
        self.b.input(name, dtype, shape.to_vec()).unwrap()
    }

    /// `Σ out · W` for fixed random `W`.
    fn loss(&mut self, out: &Tensor) -> Tensor {
        let w = self.rng.uniform(out.shape().numel(), -1.0, 1.0);
        let w = self.b.constant(out.dtype(), out.dims().to_vec(), &w).unwrap();
        let axes: Vec<usize> = (0..out.rank()).collect();
        out.mul(&w).unwrap().sum(&axes, false).unwrap()
    }

    fn eval(&self, g: &Graph, outs: &[NodeId]) -> Vec<Vec<f64>> {
        evaluate(g, outs, &self.feeds, &self.params).unwrap().iter().map(|t| t.to_f64()).collect()
    }

    /// Appends the gradient of the loss of `out` wrt `wrt` and returns the graph, the loss,
    /// the gradient nodes and their values.
    fn grads(&mut self, out: &Tensor, wrt: &[&Tensor]) -> (Graph, NodeId, Vec<NodeId>, Vec<Vec<f64>>) {
        let loss = self.loss(out);
        let mut g = self.b.graph();
        let ids: Vec<NodeId> = wrt.iter().map(|t| t.id()).collect();
        let grads = grad(&mut g, loss.id(), &ids).unwrap();
        verify(&g).unwrap();
        for (&d, w) in grads.iter().zip(wrt) {
            assert_eq!(g.ty(d), w.ty(), "gradient type");
        }
        let vals = self.eval(&g, &grads);
        (g, loss.id(), grads, vals)
    }

    /// Checks the gradients of `Σ out · W` wrt each of `wrt` (inputs or parameters) against
    /// central differences with step `h`.
    fn check_h(&mut self, out: &Tensor, wrt: &[&Tensor], h: f64) {
        let (g, loss, _, got) = self.grads(out, wrt);
        let mut failures = Vec::new();
        for (w, got) in wrt.iter().zip(&got) {
            let (name, is_param) = match &self.b.graph().node(w.id()).op {
                Op::Input { name } => (name.clone(), false),
                Op::Parameter { name } => (name.clone(), true),
                op => panic!("wrt must be an input or parameter, not {}", op.name()),
            };
            let table = if is_param { &self.params } else { &self.feeds };
            let base = table[&name].to_f64();
            for (i, &g_i) in got.iter().enumerate() {
                let probe = |delta: f64| {
                    let mut v = base.clone();
                    v[i] += delta;
                    let actual = v[i] as f32 as f64;
                    let t = HostTensor::from_f64(DType::F32, w.dims().to_vec(), &v).unwrap();
                    let (mut feeds, mut params) = (self.feeds.clone(), self.params.clone());
                    if is_param { &mut params } else { &mut feeds }.insert(name.clone(), t);
                    (actual, evaluate(&g, &[loss], &feeds, &params).unwrap()[0].to_f64()[0])
                };
                let ((xp, lp), (xm, lm)) = (probe(h), probe(-h));
                let fd = (lp - lm) / (xp - xm);
                if (g_i - fd).abs() > ATOL + RTOL * fd.abs().max(g_i.abs()) {
                    failures.push(format!("{name}[{i}]: grad {g_i} vs finite difference {fd}"));
                }
            }
        }
        assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
    }

    fn check(&mut self, out: &Tensor, wrt: &[&Tensor]) {
        self.check_h(out, wrt, H);
    }
}

// ---- elementwise ----

#[test]
fn unary_ops() {
    for u in UnaryOp::ALL {
        if u == UnaryOp::Not {
            continue;
        }
        let mut c = Case::new(1 + u as u64);
        let vals = match u {
            UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt => c.rng.uniform(6, 0.3, 2.0),
            UnaryOp::Recip | UnaryOp::Abs | UnaryOp::Sign => c.rng.away(6, 0.3, 1.5),
            // Fractions away from the integers, so no step crosses a jump.
            UnaryOp::Floor | UnaryOp::Ceil => {
                c.rng.uniform(6, 0.2, 0.8).iter().zip([-2.0, -1.0, 0.0, 1.0, 2.0, 3.0]).map(|(f, k)| f + k).collect()
            }
            _ => c.rng.uniform(6, -1.5, 1.5),
        };
        let x = c.input("x", &[2, 3], vals);
        let y = x.unary(u).unwrap();
        c.check(&y, &[&x]);
    }
}

#[test]
fn zero_derivative_ops_give_zero_gradients() {
    let mut c = Case::new(3);
    let x = c.input("x", &[4], vec![0.3, 1.7, -2.4, 0.6]);
    let y = x.floor().unwrap().add(&x.ceil().unwrap()).unwrap().add(&x.sign().unwrap()).unwrap();
    let (_, _, _, got) = c.grads(&y, &[&x]);
    assert_eq!(got[0], vec![0.0; 4]);
}

#[test]
fn binary_ops() {
    type Build = fn(&Tensor, &Tensor) -> fusegraph_ir::Result<Tensor>;
    let ops: [(&str, Build); 7] = [
        ("add", |a, b| a.add(b)),
        ("sub", |a, b| a.sub(b)),
        ("mul", |a, b| a.mul(b)),
        ("div", |a, b| a.div(b)),
        ("pow", |a, b| a.pow(b)),
        ("max", |a, b| a.maximum(b)),
        ("min", |a, b| a.minimum(b)),
    ];
    for (k, (name, f)) in ops.into_iter().enumerate() {
        let mut c = Case::new(10 + k as u64);
        let av = match name {
            "pow" => c.rng.uniform(12, 0.5, 2.0),
            _ => c.rng.uniform(12, -1.5, 1.5),
        };
        let bv: Vec<f64> = match name {
            "div" => c.rng.away(12, 0.4, 1.5),
            // Well away from `a`, so no step crosses the kink.
            "max" | "min" => av.iter().zip(c.rng.away(12, 0.1, 0.6)).map(|(a, d)| a + d).collect(),
            _ => c.rng.uniform(12, -1.5, 1.5),
        };
        let a = c.input("a", &[3, 4], av);
        let b = c.input("b", &[3, 4], bv);
        let y = f(&a, &b).unwrap();
        c.check(&y, &[&a, &b]);
    }
}

#[test]
fn binary_with_broadcast_operands() {
    let mut c = Case::new(20);
    let a = c.rand("a", &[3, 1]);
    let b = c.rand("b", &[4]);
    let d = c.input("d", &[2, 3, 4], Rng(5).away(24, 0.5, 1.5));
    let y = a.mul(&b).unwrap().add(&b).unwrap().sub(&a).unwrap().div(&d).unwrap();
    c.check(&y, &[&a, &b, &d]);
}

#[test]
fn one_operand_used_twice_and_max_ties_go_to_the_first() {
    let mut c = Case::new(21);
    let x = c.rand("x", &[5]);
    let y = x.mul(&x).unwrap().add(&x.maximum(&x).unwrap()).unwrap().add(&x.div(&x.exp().unwrap()).unwrap()).unwrap();
    c.check(&y, &[&x]);
}

#[test]
fn pow_at_zero_base_has_finite_exponent_gradient() {
    let mut c = Case::new(22);
    let a = c.input("a", &[2], vec![0.0, 2.0]);
    let b = c.input("b", &[2], vec![2.0, 3.0]);
    let y = a.pow(&b).unwrap();
    let (_, _, _, got) = c.grads(&y, &[&a, &b]);
    assert!(got.iter().flatten().all(|v| v.is_finite()), "{got:?}");
    assert_eq!(got[1][0], 0.0);
}

#[test]
fn select_routes_to_the_chosen_branch() {
    let mut c = Case::new(23);
    let x = c.input("x", &[3, 4], Rng(7).away(12, 0.2, 1.5));
    let y = c.rand("y", &[3, 4]);
    let zero = c.b.scalar(DType::F32, 0.0).unwrap();
    // The condition depends on `x` too; that path is a comparison and stops without error.
    let cond = x.gt(&zero).unwrap();
    let out = cond.select(&x.mul(&y).unwrap(), &y.exp().unwrap()).unwrap();
    c.check(&out, &[&x, &y]);
}

#[test]
fn casts_between_floats_and_through_integers() {
    // f32 → f16 → f32: the cotangent is cast back (values exact in f16).
    let mut c = Case::new(24);
    let x = c.rand("x", &[3]);
    let y = x.cast(DType::F16).unwrap().mul_scalar(2.0).unwrap().cast(DType::F32).unwrap();
    let w = c.b.constant(DType::F32, [3], &[0.5, -1.25, 3.0]).unwrap();
    let loss = y.mul(&w).unwrap().sum(&[0], false).unwrap();
    let mut g = c.b.graph();
    let d = grad(&mut g, loss.id(), &[x.id()]).unwrap();
    assert_eq!(c.eval(&g, &d)[0], vec![1.0, -2.5, 6.0]);

    // Through an integer: that factor is a constant of the gradient.
    let mut c = Case::new(25);
    let vals: Vec<f64> = [0.3, 1.4, -2.6, 0.5].iter().map(|v| v / 3.0).collect();
    let x = c.input("x", &[4], vals);
    let k = x.mul_scalar(3.0).unwrap().cast(DType::I32).unwrap().cast(DType::F32).unwrap();
    let y = x.mul(&k.add_scalar(0.5).unwrap()).unwrap();
    c.check(&y, &[&x]);
}

// ---- layout ----

#[test]
fn broadcast_in_dim_sums_back() {
    let mut c = Case::new(30);
    let a = c.rand("a", &[3, 1]);
    let b = c.rand("b", &[4]);
    let s = c.rand("s", &[]);
    let one = c.rand("one", &[1]);
    let y = a
        .broadcast_in_dim(vec![2, 3, 4], vec![1, 2])
        .unwrap()
        .mul(&b.broadcast_in_dim(vec![2, 3, 4], vec![2]).unwrap())
        .unwrap()
        .add(&s.broadcast_in_dim(vec![2, 3, 4], vec![]).unwrap())
        .unwrap()
        .mul(&one.broadcast_in_dim(vec![2, 3, 4], vec![0]).unwrap().exp().unwrap())
        .unwrap();
    c.check(&y, &[&a, &b, &s, &one]);
}

#[test]
fn reshape_and_transpose() {
    let mut c = Case::new(31);
    let x = c.rand("x", &[2, 3, 4]);
    let y = x.transpose(&[2, 0, 1]).unwrap().reshape([4, 6]).unwrap().exp().unwrap().t().unwrap();
    c.check(&y, &[&x]);
}

#[test]
fn strided_slices() {
    let mut c = Case::new(32);
    let x = c.rand("x", &[7, 9]);
    let y = x.slice(&[1, 2], &[7, 9], &[2, 3]).unwrap().sin().unwrap();
    c.check(&y, &[&x]);

    let mut c = Case::new(33);
    let x = c.rand("x", &[3, 8, 5]);
    let a = x.slice(&[0, 1, 0], &[3, 8, 4], &[2, 3, 1]).unwrap();
    let b = x.slice(&[1, 1, 2], &[3, 3, 5], &[5, 1, 2]).unwrap(); // stride past the extent
    let y = a.exp().unwrap().sum(&[0, 1, 2], false).unwrap().add(&b.sin().unwrap().sum(&[0, 1, 2], false).unwrap());
    c.check(&y.unwrap(), &[&x]);
}

#[test]
fn concat_and_pad() {
    let mut c = Case::new(34);
    let a = c.rand("a", &[2, 3]);
    let b = c.rand("b", &[2, 1]);
    let y = c.b.concat(&[&a, &b, &a], 1).unwrap().tanh().unwrap();
    c.check(&y, &[&a, &b]);

    let mut c = Case::new(35);
    let x = c.rand("x", &[2, 3]);
    let p = x.pad(&[1, 0], &[2, 3], 1.5).unwrap();
    let y = p.mul(&p).unwrap();
    c.check(&y, &[&x]);
}

#[test]
fn gather_with_repeated_and_clamped_indices() {
    let mut c = Case::new(36);
    let t = c.rand("t", &[5, 3]);
    let i = c.ints("i", DType::I32, &[2, 3], &[0.0, 4.0, 2.0, 4.0, 9.0, -1.0]);
    let y = t.gather(&i, 0).unwrap().sin().unwrap();
    c.check(&y, &[&t]);

    let mut c = Case::new(37);
    let t = c.rand("t", &[2, 4, 3]);
    let i = c.ints("i", DType::U32, &[5], &[3.0, 1.0, 3.0, 0.0, 7.0]);
    let y = t.gather(&i, 1).unwrap().exp().unwrap();
    c.check(&y, &[&t]);

    let mut c = Case::new(38);
    let t = c.rand("t", &[2, 3, 4]);
    let i = c.ints("i", DType::I32, &[2, 2], &[3.0, 3.0, 0.0, 1.0]);
    let y = t.gather(&i, 2).unwrap();
    c.check_h(&y, &[&t], H_LINEAR);
}

// ---- reductions ----

#[test]
fn sum_over_several_axes() {
    for keep in [false, true] {
        let mut c = Case::new(40 + keep as u64);
        let x = c.rand("x", &[2, 3, 4]);
        let y = x.sum(&[0, 2], keep).unwrap().sin().unwrap();
        let z = x.exp().unwrap().sum(&[0, 1, 2], keep).unwrap();
        let out = y.sum(&(0..y.rank()).collect::<Vec<_>>(), false).unwrap().add(&z.reshape([]).unwrap()).unwrap();
        c.check(&out, &[&x]);
    }
}

#[test]
fn max_min_and_prod_reductions() {
    for (k, keep) in [false, true].into_iter().enumerate() {
        let mut c = Case::new(50 + k as u64);
        let vals = c.rng.distinct(24, 0.1);
        let x = c.input("x", &[2, 3, 4], vals);
        let a = x.max(&[1], keep).unwrap();
        let b = x.max(&[0, 2], keep).unwrap().exp().unwrap();
        let m = x.min(&[2], keep).unwrap();
        let all = |t: &Tensor| t.sum(&(0..t.rank()).collect::<Vec<_>>(), false).unwrap();
        let y = all(&a).add(&all(&b)).unwrap().add(&all(&m.mul(&m).unwrap())).unwrap();
        c.check(&y, &[&x]);

        let mut c = Case::new(52 + k as u64);
        let vals = c.rng.away(24, 0.5, 1.5);
        let x = c.input("x", &[2, 3, 4], vals);
        let y = x.prod(&[1], keep).unwrap();
        c.check(&y, &[&x]);
    }
}

#[test]
fn reduce_max_ties_split_equally() {
    let mut c = Case::new(54);
    let x = c.input("x", &[2, 3], vec![1.0, 3.0, 3.0, -1.0, -1.0, -1.0]);
    let y = x.max(&[1], false).unwrap().sum(&[0], false).unwrap();
    let z = x.min(&[0, 1], false).unwrap();
    let mut g = c.b.graph();
    let d = grad(&mut g, y.id(), &[x.id()]).unwrap();
    let third = (1.0f32 / 3.0) as f64;
    assert_eq!(c.eval(&g, &d)[0], [0.0, 0.5, 0.5, third, third, third]);
    let d = grad(&mut g, z.id(), &[x.id()]).unwrap();
    assert_eq!(c.eval(&g, &d)[0], [0.0, 0.0, 0.0, third, third, third]);
}

// ---- contractions ----

#[test]
fn matmul_plain_transposed_and_batched() {
    let shapes: [(&[usize], &[usize]); 5] = [
        (&[3, 4], &[4, 5]),
        (&[2, 3, 4], &[4, 5]),
        (&[2, 1, 3, 4], &[3, 4, 2]),
        (&[1, 3, 4], &[2, 4, 5]),
        (&[3, 1, 2, 3], &[1, 2, 3, 2]),
    ];
    for (k, (sa, sb)) in shapes.into_iter().enumerate() {
        let mut c = Case::new(60 + k as u64);
        let a = c.rand("a", sa);
        let b = c.rand("b", sb);
        let y = a.matmul(&b).unwrap();
        c.check_h(&y, &[&a, &b], H_LINEAR);
    }
    // Transposed operands: Aᵀ·Bᵀ.
    let mut c = Case::new(66);
    let p = c.rand("p", &[4, 3]);
    let q = c.rand("q", &[2, 5, 4]);
    let y = p.t().unwrap().matmul(&q.t().unwrap()).unwrap().tanh().unwrap();
    c.check(&y, &[&p, &q]);
}

/// `(n, c, h, w, o, kh, kw, stride, padding, dilation, groups)`.
type ConvCase = (usize, usize, usize, usize, usize, usize, usize, [usize; 2], [usize; 2], [usize; 2], usize);

#[test]
fn conv2d_parameter_combinations() {
    let cases: [ConvCase; 12] = [
        (2, 3, 5, 6, 4, 3, 3, [1, 1], [0, 0], [1, 1], 1),
        (2, 3, 7, 6, 4, 3, 3, [2, 2], [1, 1], [1, 1], 1),
        (1, 4, 7, 8, 6, 3, 2, [2, 3], [1, 0], [1, 1], 2),
        (1, 2, 8, 7, 3, 3, 2, [1, 1], [2, 1], [2, 2], 1),
        (2, 4, 9, 8, 4, 2, 3, [3, 2], [0, 1], [2, 1], 2),
        (1, 4, 6, 6, 4, 3, 3, [2, 2], [1, 1], [1, 1], 4), // depthwise
        (1, 2, 5, 5, 4, 3, 3, [1, 1], [1, 1], [1, 1], 2), // depthwise, two outputs per channel
        (1, 2, 4, 5, 3, 1, 1, [2, 2], [1, 1], [1, 1], 1), // padding beyond the kernel span
        (1, 2, 7, 7, 2, 2, 2, [3, 3], [0, 0], [1, 1], 1), // stride drops trailing rows
        (1, 1, 5, 6, 2, 3, 3, [2, 1], [2, 2], [1, 2], 1),
        (2, 6, 6, 5, 6, 2, 2, [1, 2], [1, 0], [3, 1], 3),
        (1, 2, 3, 3, 2, 3, 3, [1, 1], [0, 0], [1, 1], 1), // a 1×1 output
    ];
    for (k, (n, ch, h, w, o, kh, kw, stride, padding, dilation, groups)) in cases.into_iter().enumerate() {
        let mut c = Case::new(70 + k as u64);
        let x = c.rand("x", &[n, ch, h, w]);
        let wt = c.param("w", &[o, ch / groups, kh, kw]);
        let y = x.conv2d(&wt, stride, padding, dilation, groups).unwrap();
        c.check_h(&y, &[&x, &wt], H_LINEAR);
    }
}

/// `(input shape, window, stride, padding)`.
type PoolCase = ([usize; 4], [usize; 2], [usize; 2], [usize; 2]);

#[test]
fn pooling() {
    let cases: [PoolCase; 5] = [
        ([2, 3, 6, 6], [2, 2], [2, 2], [0, 0]),
        ([1, 2, 7, 6], [3, 3], [2, 1], [1, 1]),
        ([1, 2, 5, 8], [3, 2], [1, 2], [1, 0]),
        ([2, 1, 7, 7], [2, 3], [3, 2], [1, 1]),
        ([1, 1, 4, 4], [1, 1], [1, 1], [0, 0]),
    ];
    for (k, (shape, window, stride, padding)) in cases.into_iter().enumerate() {
        let mut c = Case::new(90 + k as u64);
        let vals = c.rng.distinct(shape.iter().product(), 0.04);
        let x = c.input("x", &shape, vals);
        let y = x.max_pool2d(window, stride, padding).unwrap();
        c.check(&y, &[&x]);
        let y = x.avg_pool2d(window, stride, padding).unwrap();
        c.check_h(&y, &[&x], H_LINEAR);
    }
}

#[test]
fn max_pool_ties_split_and_the_graph_prints_and_parses() {
    let mut c = Case::new(99);
    let x = c.input("x", &[1, 1, 2, 2], vec![1.0, 2.0, 2.0, 0.0]);
    let y = x.max_pool2d([2, 2], [1, 1], [1, 1]).unwrap();
    let loss = y.sum(&[0, 1, 2, 3], false).unwrap();
    let mut g = c.b.graph();
    let d = grad(&mut g, loss.id(), &[x.id()]).unwrap();
    // Nine windows; the centre one holds all four values and its tie 2 = 2 splits.
    assert_eq!(c.eval(&g, &d)[0], vec![1.0, 3.5, 3.5, 1.0]);
    let printed = text::print(&g);
    assert_eq!(text::print(&text::parse(&printed).unwrap()), printed);
}

// ---- composites and models ----

#[test]
fn composites_from_the_builder() {
    type Build = fn(&Tensor) -> fusegraph_ir::Result<Tensor>;
    let ops: [(&str, Build); 8] = [
        ("softmax", |x| x.softmax(1)),
        ("log_softmax", |x| x.log_softmax(0)),
        ("layer_norm", |x| x.layer_norm(&[1], 1e-5)),
        ("gelu", |x| x.gelu()),
        ("gelu_tanh", |x| x.gelu_tanh()),
        ("silu", |x| x.silu()),
        ("relu", |x| x.relu()),
        ("variance", |x| x.variance(&[0, 1], false)),
    ];
    for (k, (name, f)) in ops.into_iter().enumerate() {
        let mut c = Case::new(100 + k as u64);
        let vals =
            if name == "relu" || name == "softmax" { c.rng.distinct(12, 0.2) } else { c.rng.uniform(12, -1.5, 1.5) };
        let x = c.input("x", &[3, 4], vals);
        let y = f(&x).unwrap();
        c.check(&y, &[&x]);
    }
}

#[test]
fn two_layer_mlp_gradient_wrt_every_weight() {
    let mut c = Case::new(110);
    let x = c.rand("x", &[4, 5]);
    let w1 = c.param("w1", &[5, 8]);
    let b1 = c.param("b1", &[8]);
    let w2 = c.param("w2", &[8, 3]);
    let b2 = c.param("b2", &[3]);
    let h = x.matmul(&w1).unwrap().add(&b1).unwrap().gelu().unwrap();
    let logits = h.matmul(&w2).unwrap().add(&b2).unwrap();
    // Cross-entropy against fixed targets.
    let targets = c.b.constant(DType::F32, [4, 3], &[1., 0., 0., 0., 1., 0., 0., 0., 1., 0., 1., 0.]).unwrap();
    let nll = logits.log_softmax(1).unwrap().mul(&targets).unwrap().neg().unwrap().mean(&[0, 1], false).unwrap();
    c.check(&nll, &[&w1, &b1, &w2, &b2, &x]);

    // The backward graph partitions like any other graph.
    let loss = c.loss(&nll);
    let mut g = c.b.graph();
    let mut outs = grad(&mut g, loss.id(), &[w1.id(), w2.id()]).unwrap();
    outs.push(loss.id());
    for mode in [FusionMode::Off, FusionMode::On] {
        assert!(!partition(&g, &outs, mode).unwrap().is_empty());
    }
}

#[test]
fn small_conv_net() {
    let mut c = Case::new(111);
    let x = c.rand("x", &[2, 2, 6, 6]);
    let k = c.param("k", &[3, 2, 3, 3]);
    let h = x.conv2d(&k, [1, 1], [1, 1], [1, 1], 1).unwrap().tanh().unwrap().avg_pool2d([2, 2], [2, 2], [0, 0]);
    let y = h.unwrap().reshape([2, 27]).unwrap();
    let w = c.param("w", &[27, 2]);
    let out = y.matmul(&w).unwrap().sigmoid().unwrap();
    c.check(&out, &[&k, &w, &x]);
}

// ---- the API's contract ----

#[test]
fn errors() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [3]).unwrap();
    let i = b.input("i", DType::I32, [3]).unwrap();
    let s = x.sum(&[0], false).unwrap();
    let mut g = b.graph();
    assert!(matches!(grad(&mut g, x.id(), &[x.id()]), Err(GradError::NotScalar { .. })));
    let is = i.sum(&[0], false).unwrap();
    let mut g = b.graph();
    assert!(matches!(grad(&mut g, is.id(), &[x.id()]), Err(GradError::NotScalar { .. })));
    let err = grad(&mut g, s.id(), &[i.id()]).unwrap_err();
    assert!(matches!(err, GradError::NotDifferentiable { ref op, .. } if op == "input"), "{err}");
    let mut other = GraphBuilder::new().graph();
    assert!(matches!(grad(&mut other, s.id(), &[]), Err(GradError::Ir(_))));
    assert!(GradError::NotScalar { node: 0, ty: x.ty().clone() }.to_string().contains("rank-0"));
}

#[test]
fn unrelated_stopped_duplicate_and_loss_wrt() {
    let mut c = Case::new(120);
    let x = c.rand("x", &[3]);
    let u = c.rand("u", &[2, 2]);
    // The loss reaches `x` only through argmax and a comparison: no gradient, no error.
    let am = x.argmax(0, false).unwrap().cast(DType::F32).unwrap();
    let gt = x.gt(&x.mul_scalar(0.5).unwrap()).unwrap().cast(DType::F32).unwrap().sum(&[0], false).unwrap();
    let y = c.rand("y", &[]);
    let loss = y.mul(&am).unwrap().add(&gt).unwrap().add(&y.mul(&y).unwrap()).unwrap();
    let mut g = c.b.graph();
    let d = grad(&mut g, loss.id(), &[x.id(), u.id(), y.id(), y.id(), loss.id()]).unwrap();
    verify(&g).unwrap();
    assert_eq!(d[2], d[3]);
    let v = c.eval(&g, &d);
    let yv = c.feeds["y"].to_f64()[0];
    let amv = c.eval(&g, &[am.id()])[0][0];
    assert_eq!(v[0], vec![0.0; 3]);
    assert_eq!(v[1], vec![0.0; 4]);
    assert!((v[2][0] - (amv + 2.0 * yv)).abs() < 1e-6);
    assert_eq!(v[4], vec![1.0]);
    assert!(matches!(g.node(d[0]).op, Op::Full { value } if value == 0.0));
}

#[test]
fn intermediate_wrt_and_unneeded_parameters() {
    let mut c = Case::new(121);
    let x = c.rand("x", &[3]);
    let h = x.exp().unwrap();
    let y = h.mul(&h).unwrap().sum(&[0], false).unwrap();
    let before = c.b.graph().len();
    let mut g = c.b.graph();
    let d = grad(&mut g, y.id(), &[h.id()]).unwrap();
    // d/dh Σh² = 2h, and nothing flows further back to x (not requested): seed, reshape,
    // broadcast, two products and their sum.
    assert!(g.len() - before <= 6, "{}", text::print(&g));
    let (hv, dv) = (c.eval(&g, &[h.id()]), c.eval(&g, &d));
    for (a, b) in hv[0].iter().zip(&dv[0]) {
        assert!((2.0 * a - b).abs() < 1e-5);
    }
}

#[test]
fn f16_graphs_get_f16_gradients() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F16, [2, 3]).unwrap();
    let w = b.parameter("w", DType::F16, [3, 2]).unwrap();
    let y = x.matmul(&w).unwrap().tanh().unwrap().sum(&[0, 1], false).unwrap();
    let mut g = b.graph();
    let d = grad(&mut g, y.id(), &[x.id(), w.id()]).unwrap();
    verify(&g).unwrap();
    assert_eq!(g.ty(d[0]), x.ty());
    assert_eq!(g.ty(d[1]), w.ty());
    let xs = HostTensor::from_f64(DType::F16, [2, 3], &[0.5, -1.0, 0.25, 1.0, 0.0, -0.5]).unwrap();
    let ws = HostTensor::from_f64(DType::F16, [3, 2], &[0.5, 0.25, -0.5, 1.0, 0.75, -0.25]).unwrap();
    let feeds = BTreeMap::from([("x".to_string(), xs.clone())]);
    let params = BTreeMap::from([("w".to_string(), ws.clone())]);
    let got = evaluate(&g, &d, &feeds, &params).unwrap();
    // The same graph in f32.
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 3]).unwrap();
    let w = b.parameter("w", DType::F32, [3, 2]).unwrap();
    let y = x.matmul(&w).unwrap().tanh().unwrap().sum(&[0, 1], false).unwrap();
    let mut g = b.graph();
    let d = grad(&mut g, y.id(), &[x.id(), w.id()]).unwrap();
    let to32 = |t: &HostTensor| HostTensor::from_f64(DType::F32, t.shape().clone(), &t.to_f64()).unwrap();
    let feeds = BTreeMap::from([("x".to_string(), to32(&xs))]);
    let params = BTreeMap::from([("w".to_string(), to32(&ws))]);
    let want = evaluate(&g, &d, &feeds, &params).unwrap();
    for (a, b) in got.iter().zip(&want) {
        for (p, q) in a.to_f64().iter().zip(b.to_f64()) {
            assert!((p - q).abs() < 1e-2 + 1e-2 * q.abs(), "{p} vs {q}");
        }
    }
}

#[test]
fn second_order_gradient() {
    // d/dx Σ x³ = 3x²; differentiating Σ (3x²) again gives 6x.
    let mut c = Case::new(130);
    let x = c.rand("x", &[4]);
    let y = x.mul(&x).unwrap().mul(&x).unwrap().sum(&[0], false).unwrap();
    let mut g = c.b.graph();
    let d1 = grad(&mut g, y.id(), &[x.id()]).unwrap()[0];
    let s =
        g.add_op(Op::Reduce { kind: fusegraph_ir::ReduceKind::Sum, axes: vec![0], keep_dims: false }, &[d1]).unwrap();
    let d2 = grad(&mut g, s, &[x.id()]).unwrap()[0];
    verify(&g).unwrap();
    let (xv, v) = (c.feeds["x"].to_f64(), c.eval(&g, &[d1, d2]));
    for ((x, d1), d2) in xv.iter().zip(&v[0]).zip(&v[1]) {
        assert!((d1 - 3.0 * x * x).abs() < 1e-5, "{d1} vs {}", 3.0 * x * x);
        assert!((d2 - 6.0 * x).abs() < 1e-5, "{d2} vs {}", 6.0 * x);
    }
}
