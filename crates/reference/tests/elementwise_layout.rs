//! Leaves, elementwise ops, casts and data movement, against hand-computed values.

mod common;

use common::{assert_approx, eval, eval1, f32c, konst, range};
use fusegraph_ir::{DType, GraphBuilder, HostTensor, UnaryOp};

#[test]
fn leaves_round_to_dtype() {
    let b = GraphBuilder::new();
    let c = f32c(&b, [2], &[0.1, 1e40]);
    assert_eq!(eval1(&b, &c).1, vec![0.1f32 as f64, f64::INFINITY]);
    let h = b.full(DType::F16, [3], 1.0 + 1.0 / 4096.0).unwrap();
    assert_eq!(eval1(&b, &h), (vec![3], vec![1.0; 3]));
    let i0 = b.iota(DType::I32, [2, 3], 0).unwrap();
    assert_eq!(eval1(&b, &i0).1, vec![0.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    let i1 = b.iota(DType::F32, [2, 3], 1).unwrap();
    assert_eq!(eval1(&b, &i1).1, vec![0.0, 1.0, 2.0, 0.0, 1.0, 2.0]);
    let big = b.iota(DType::F16, [2050], 0).unwrap();
    assert_eq!(eval1(&b, &big).1[2049], 2048.0, "f16 iota rounds");
    let s = b.scalar(DType::U32, 7.0).unwrap();
    assert_eq!(eval1(&b, &s), (vec![], vec![7.0]));
}

#[test]
fn unary_float_ops() {
    let b = GraphBuilder::new();
    let x = f32c(&b, [4], &[-1.5, 0.0, 0.5, 2.0]);
    let cases: Vec<(UnaryOp, [f64; 4])> = vec![
        (UnaryOp::Neg, [1.5, 0.0, -0.5, -2.0]),
        (UnaryOp::Abs, [1.5, 0.0, 0.5, 2.0]),
        (UnaryOp::Floor, [-2.0, 0.0, 0.0, 2.0]),
        (UnaryOp::Ceil, [-1.0, 0.0, 1.0, 2.0]),
        (UnaryOp::Sign, [-1.0, 0.0, 1.0, 1.0]),
        (UnaryOp::Exp, [(-1.5f64).exp(), 1.0, 0.5f64.exp(), 2.0f64.exp()]),
        (UnaryOp::Tanh, [(-1.5f64).tanh(), 0.0, 0.5f64.tanh(), 2.0f64.tanh()]),
        (
            UnaryOp::Sigmoid,
            [1.0 / (1.0 + 1.5f64.exp()), 0.5, 1.0 / (1.0 + (-0.5f64).exp()), 1.0 / (1.0 + (-2.0f64).exp())],
        ),
        (UnaryOp::Erf, [-0.9661051464753108, 0.0, 0.5204998778130465, 0.9953222650189527]),
        (UnaryOp::Sin, [(-1.5f64).sin(), 0.0, 0.5f64.sin(), 2.0f64.sin()]),
        (UnaryOp::Cos, [(-1.5f64).cos(), 1.0, 0.5f64.cos(), 2.0f64.cos()]),
    ];
    for (op, want) in cases {
        let y = x.unary(op).unwrap();
        let want: Vec<f64> = want.iter().map(|&v| v as f32 as f64).collect();
        assert_eq!(eval1(&b, &y).1, want, "{op:?}");
    }
    let p = f32c(&b, [3], &[4.0, 0.25, 0.0]);
    assert_eq!(eval1(&b, &p.sqrt().unwrap()).1, vec![2.0, 0.5, 0.0]);
    assert_eq!(eval1(&b, &p.rsqrt().unwrap()).1, vec![0.5, 2.0, f64::INFINITY]);
    assert_eq!(eval1(&b, &p.recip().unwrap()).1, vec![0.25, 4.0, f64::INFINITY]);
    let l = eval1(&b, &p.log().unwrap()).1;
    assert_eq!(&l[..2], &[4f64.ln() as f32 as f64, 0.25f64.ln() as f32 as f64]);
    assert_eq!(l[2], f64::NEG_INFINITY);
}

#[test]
fn binary_ops_and_comparisons() {
    let b = GraphBuilder::new();
    let x = f32c(&b, [4], &[1.0, -2.0, 3.0, 4.0]);
    let y = f32c(&b, [4], &[2.0, -2.0, 0.0, 0.5]);
    let (_, add) = eval1(&b, &x.add(&y).unwrap());
    assert_eq!(add, vec![3.0, -4.0, 3.0, 4.5]);
    assert_eq!(eval1(&b, &x.sub(&y).unwrap()).1, vec![-1.0, 0.0, 3.0, 3.5]);
    assert_eq!(eval1(&b, &x.mul(&y).unwrap()).1, vec![2.0, 4.0, 0.0, 2.0]);
    assert_eq!(eval1(&b, &x.div(&y).unwrap()).1, vec![0.5, 1.0, f64::INFINITY, 8.0]);
    assert_eq!(eval1(&b, &x.maximum(&y).unwrap()).1, vec![2.0, -2.0, 3.0, 4.0]);
    assert_eq!(eval1(&b, &x.minimum(&y).unwrap()).1, vec![1.0, -2.0, 0.0, 0.5]);
    assert_eq!(eval1(&b, &x.abs().unwrap().pow(&y).unwrap()).1, vec![1.0, 0.25, 1.0, 2.0]);
    let lt = x.lt(&y).unwrap();
    assert_eq!(lt.dtype(), DType::Bool);
    assert_eq!(eval1(&b, &lt).1, vec![1.0, 0.0, 0.0, 0.0]);
    assert_eq!(eval1(&b, &x.le(&y).unwrap()).1, vec![1.0, 1.0, 0.0, 0.0]);
    assert_eq!(eval1(&b, &x.gt(&y).unwrap()).1, vec![0.0, 0.0, 1.0, 1.0]);
    assert_eq!(eval1(&b, &x.ge(&y).unwrap()).1, vec![0.0, 1.0, 1.0, 1.0]);
    assert_eq!(eval1(&b, &x.eq(&y).unwrap()).1, vec![0.0, 1.0, 0.0, 0.0]);
    assert_eq!(eval1(&b, &x.ne(&y).unwrap()).1, vec![1.0, 0.0, 1.0, 1.0]);
    let p = konst(&b, DType::Bool, [4], &[0.0, 0.0, 1.0, 1.0]);
    let q = konst(&b, DType::Bool, [4], &[0.0, 1.0, 0.0, 1.0]);
    assert_eq!(eval1(&b, &p.and(&q).unwrap()).1, vec![0.0, 0.0, 0.0, 1.0]);
    assert_eq!(eval1(&b, &p.or(&q).unwrap()).1, vec![0.0, 1.0, 1.0, 1.0]);
    assert_eq!(eval1(&b, &p.not().unwrap()).1, vec![1.0, 1.0, 0.0, 0.0]);
    assert_eq!(eval1(&b, &p.eq(&q).unwrap()).1, vec![1.0, 0.0, 0.0, 1.0]);
    let sel = p.select(&x, &y).unwrap();
    assert_eq!(eval1(&b, &sel).1, vec![2.0, -2.0, 3.0, 4.0]);
}

#[test]
fn integer_wrap_and_division() {
    let b = GraphBuilder::new();
    let (max, min) = (i32::MAX as f64, i32::MIN as f64);
    let x = konst(&b, DType::I32, [5], &[max, min, 7.0, -7.0, 65536.0]);
    let y = konst(&b, DType::I32, [5], &[1.0, -1.0, 0.0, 2.0, 65536.0]);
    assert_eq!(eval1(&b, &x.add(&y).unwrap()).1, vec![min, max, 7.0, -5.0, 131072.0]);
    assert_eq!(eval1(&b, &x.sub(&y).unwrap()).1, vec![max - 1.0, min + 1.0, 7.0, -9.0, 0.0]);
    assert_eq!(eval1(&b, &x.mul(&y).unwrap()).1, vec![max, min, 0.0, -14.0, 0.0]);
    assert_eq!(eval1(&b, &x.div(&y).unwrap()).1, vec![max, min, 7.0, -3.0, 1.0]);
    assert_eq!(eval1(&b, &x.neg().unwrap()).1, vec![-max, min, -7.0, 7.0, -65536.0]);
    assert_eq!(eval1(&b, &x.abs().unwrap()).1, vec![max, min, 7.0, 7.0, 65536.0]);
    assert_eq!(eval1(&b, &x.sign().unwrap()).1, vec![1.0, -1.0, 1.0, -1.0, 1.0]);
    assert_eq!(eval1(&b, &x.maximum(&y).unwrap()).1, vec![max, -1.0, 7.0, 2.0, 65536.0]);

    let umax = u32::MAX as f64;
    let u = konst(&b, DType::U32, [3], &[0.0, umax, 9.0]);
    let v = konst(&b, DType::U32, [3], &[1.0, 2.0, 0.0]);
    assert_eq!(eval1(&b, &u.sub(&v).unwrap()).1, vec![umax, umax - 2.0, 9.0]);
    assert_eq!(eval1(&b, &u.add(&v).unwrap()).1, vec![1.0, 1.0, 9.0]);
    assert_eq!(eval1(&b, &u.mul(&v).unwrap()).1, vec![0.0, umax - 1.0, 0.0]);
    assert_eq!(eval1(&b, &u.div(&v).unwrap()).1, vec![0.0, 2147483647.0, 9.0]);
}

#[test]
fn f16_rounds_every_op() {
    let b = GraphBuilder::new();
    let x = konst(&b, DType::F16, [2], &[2048.0, 0.1]);
    let one = b.full(DType::F16, [2], 1.0).unwrap();
    let (_, got) = eval1(&b, &x.add(&one).unwrap());
    assert_eq!(
        got,
        vec![2048.0, fusegraph_ir::f16::from_f64(fusegraph_ir::f16::from_f64(0.1).to_f64() + 1.0).to_f64()]
    );
}

#[test]
fn casts_truncate_saturate_and_reinterpret() {
    let b = GraphBuilder::new();
    let x = f32c(&b, [6], &[-2.7, 2.7, 3e10, -3e10, f64::NAN, 0.0]);
    assert_eq!(eval1(&b, &x.cast(DType::I32).unwrap()).1, vec![-2.0, 2.0, i32::MAX as f64, i32::MIN as f64, 0.0, 0.0]);
    assert_eq!(eval1(&b, &x.cast(DType::U32).unwrap()).1, vec![0.0, 2.0, u32::MAX as f64, 0.0, 0.0, 0.0]);
    assert_eq!(eval1(&b, &x.cast(DType::Bool).unwrap()).1, vec![1.0, 1.0, 1.0, 1.0, 1.0, 0.0]);
    let i = konst(&b, DType::I32, [3], &[-1.0, i32::MIN as f64, 2049.0]);
    assert_eq!(eval1(&b, &i.cast(DType::U32).unwrap()).1, vec![u32::MAX as f64, 2147483648.0, 2049.0]);
    assert_eq!(eval1(&b, &i.cast(DType::F16).unwrap()).1, vec![-1.0, f64::NEG_INFINITY, 2048.0]);
    let u = konst(&b, DType::U32, [2], &[u32::MAX as f64, 5.0]);
    assert_eq!(eval1(&b, &u.cast(DType::I32).unwrap()).1, vec![-1.0, 5.0]);
    let t = konst(&b, DType::Bool, [2], &[1.0, 0.0]);
    assert_eq!(eval1(&b, &t.cast(DType::F32).unwrap()).1, vec![1.0, 0.0]);
    let big = konst(&b, DType::I32, [1], &[16777217.0]);
    assert_eq!(eval1(&b, &big.cast(DType::F32).unwrap()).1, vec![16777216.0]);
}

#[test]
fn broadcast_in_dim() {
    let b = GraphBuilder::new();
    let v = f32c(&b, [3], &[1.0, 2.0, 3.0]);
    let rows = v.broadcast_in_dim(vec![2, 3], vec![1]).unwrap();
    assert_eq!(eval1(&b, &rows).1, vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    let cols = v.broadcast_in_dim(vec![3, 2], vec![0]).unwrap();
    assert_eq!(eval1(&b, &cols).1, vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
    let m = f32c(&b, [1, 3], &[1.0, 2.0, 3.0]);
    let r = m.broadcast_in_dim(vec![2, 2, 3], vec![0, 2]).unwrap();
    assert_eq!(eval1(&b, &r), (vec![2, 2, 3], [1.0, 2.0, 3.0].repeat(4)));
    let s = b.scalar(DType::I32, 4.0).unwrap().broadcast_to([2, 2]).unwrap();
    assert_eq!(eval1(&b, &s).1, vec![4.0; 4]);
}

#[test]
fn reshape_and_transpose() {
    let b = GraphBuilder::new();
    let x = f32c(&b, [2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(eval1(&b, &x.reshape([3, 2]).unwrap()), (vec![3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
    assert_eq!(eval1(&b, &x.transpose(&[1, 0]).unwrap()), (vec![3, 2], vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]));
    // result[a, b, c] = x[b, c, a] for perm [2, 0, 1].
    let y = f32c(&b, [2, 3, 4], &range(24));
    let (dims, got) = eval1(&b, &y.transpose(&[2, 0, 1]).unwrap());
    assert_eq!(dims, vec![4, 2, 3]);
    let mut want = Vec::new();
    for a in 0..4 {
        for bb in 0..2 {
            for c in 0..3 {
                want.push((bb * 12 + c * 4 + a) as f64);
            }
        }
    }
    assert_eq!(got, want);
}

#[test]
fn slice_pad_concat() {
    let b = GraphBuilder::new();
    let x = f32c(&b, [2, 5], &range(10));
    let s = x.slice(&[0, 1], &[2, 5], &[1, 2]).unwrap();
    assert_eq!(eval1(&b, &s), (vec![2, 2], vec![1.0, 3.0, 6.0, 8.0]));
    let s2 = x.slice(&[1, 0], &[2, 5], &[1, 3]).unwrap();
    assert_eq!(eval1(&b, &s2), (vec![1, 2], vec![5.0, 8.0]));
    let e = x.slice(&[1, 2], &[1, 2], &[1, 1]).unwrap();
    assert_eq!(eval1(&b, &e), (vec![0, 0], vec![]));

    let m = f32c(&b, [2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let p = m.pad(&[1, 0], &[0, 2], 9.0).unwrap();
    assert_eq!(eval1(&b, &p), (vec![3, 4], vec![9.0, 9.0, 9.0, 9.0, 1.0, 2.0, 9.0, 9.0, 3.0, 4.0, 9.0, 9.0]));
    let pi = konst(&b, DType::I32, [1], &[5.0]).pad(&[1], &[1], -1.0).unwrap();
    assert_eq!(eval1(&b, &pi).1, vec![-1.0, 5.0, -1.0]);
    let pf = m.pad(&[0, 0], &[0, 0], 0.0).unwrap();
    assert_eq!(eval1(&b, &pf).1, vec![1.0, 2.0, 3.0, 4.0]);

    let a = f32c(&b, [2, 1], &[1.0, 2.0]);
    let c = f32c(&b, [2, 2], &[3.0, 4.0, 5.0, 6.0]);
    let j = b.concat(&[&a, &c, &a], 1).unwrap();
    assert_eq!(eval1(&b, &j), (vec![2, 4], vec![1.0, 3.0, 4.0, 1.0, 2.0, 5.0, 6.0, 2.0]));
    let k = b.concat(&[&c, &c.transpose(&[1, 0]).unwrap()], 0).unwrap();
    assert_eq!(eval1(&b, &k), (vec![4, 2], vec![3.0, 4.0, 5.0, 6.0, 3.0, 5.0, 4.0, 6.0]));
}

#[test]
fn gather_clamps_indices() {
    let b = GraphBuilder::new();
    let table = f32c(&b, [3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let idx = konst(&b, DType::I32, [4], &[-1.0, 0.0, 2.0, 7.0]);
    let g = table.gather(&idx, 0).unwrap();
    assert_eq!(eval1(&b, &g), (vec![4, 2], vec![1.0, 2.0, 1.0, 2.0, 5.0, 6.0, 5.0, 6.0]));
    let cols = konst(&b, DType::U32, [2, 2], &[1.0, 0.0, 4000000000.0, 1.0]);
    let g1 = table.gather(&cols, 1).unwrap();
    assert_eq!(eval1(&b, &g1), (vec![3, 2, 2], vec![2.0, 1.0, 2.0, 2.0, 4.0, 3.0, 4.0, 4.0, 6.0, 5.0, 6.0, 6.0]));
    let ti = konst(&b, DType::I32, [3], &[10.0, 20.0, 30.0]);
    let g2 = ti.gather(&konst(&b, DType::I32, [], &[1.0]), 0).unwrap();
    assert_eq!(eval1(&b, &g2), (vec![], vec![20.0]));
}

#[test]
fn inputs_are_fed() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::I32, [3]).unwrap();
    let y = x.add_scalar(1.0).unwrap();
    let out = eval(&b, &[&y, &x], &[("x", HostTensor::new([3], vec![1i32, -2, i32::MAX]).unwrap())]);
    assert_eq!(out[0].as_slice::<i32>().unwrap(), &[2, -1, i32::MIN]);
    assert_eq!(out[1].as_slice::<i32>().unwrap(), &[1, -2, i32::MAX]);
    assert_approx(&out[0].to_f64(), &[2.0, -1.0, i32::MIN as f64], 0.0);
}
