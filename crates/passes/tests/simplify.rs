//! Snapshot tests of every simplification rule (printed IR after the pass), each checked
//! against the reference interpreter on random inputs.

use expect_test::{expect, Expect};
use fusegraph_ir::{text, DType, GraphBuilder, HostTensor, Tensor};
use fusegraph_passes::simplify;
use fusegraph_reference::{assert_close, evaluate};
use std::collections::BTreeMap;

fn feeds(g: &fusegraph_ir::Graph) -> BTreeMap<String, HostTensor> {
    let mut out = BTreeMap::new();
    let mut s = 12345u64;
    for id in g.node_ids() {
        if let fusegraph_ir::Op::Input { name } = &g.node(id).op {
            let ty = g.ty(id);
            let vals: Vec<f64> = (0..ty.shape.numel())
                .map(|_| {
                    s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((s >> 33) as f64 / (1u64 << 31) as f64) * 2.0 + 0.25
                })
                .collect();
            out.insert(name.clone(), HostTensor::from_f64(ty.dtype, ty.shape.clone(), &vals).unwrap());
        }
    }
    out
}

/// Simplifies the graph of `outs`, snapshots the printed result, and checks that it computes
/// what the original computed.
fn check(b: &GraphBuilder, outs: &[&Tensor], expect: Expect) {
    let g0 = b.graph();
    let outs0: Vec<_> = outs.iter().map(|t| t.id()).collect();
    let mut g = g0.clone();
    let mut outs1 = outs0.clone();
    simplify(&mut g, &mut outs1).unwrap();
    fusegraph_ir::verify(&g).unwrap();
    expect.assert_eq(&text::print(&g));
    let f = feeds(&g0);
    let want = evaluate(&g0, &outs0, &f, &BTreeMap::new()).unwrap();
    let got = evaluate(&g, &outs1, &f, &BTreeMap::new()).unwrap();
    for (a, w) in got.iter().zip(&want) {
        assert_close(a, w, 1e-5, 1e-5).unwrap();
    }
}

#[test]
fn constant_folding_and_full_spreading() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 3]).unwrap();
    let c = b.constant(DType::F32, [3], &[1.0, 2.0, 3.0]).unwrap();
    let k = c.mul(&c).unwrap().exp().unwrap(); // folds to a constant
    let s = b.scalar(DType::F32, 2.0).unwrap().sqrt().unwrap(); // folds to a full
    let y = x.add(&k).unwrap().mul(&s).unwrap();
    check(
        &b,
        &[&y],
        expect![[r#"
            %0 = input() {name="x"} : f32[2,3]
            %1 = constant() {values=[2.7182817459106445, 54.598148345947266, 8103.083984375]} : f32[3]
            %2 = broadcast(%1) {shape=[2,3], dims=[1]} : f32[2,3]
            %3 = add(%0, %2) : f32[2,3]
            %4 = full() {value=1.4142135381698608} : f32[2,3]
            %5 = mul(%3, %4) : f32[2,3]
        "#]],
    );
}

#[test]
fn algebraic_identities() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 3]).unwrap();
    let y = x.mul_scalar(1.0).unwrap().add_scalar(0.0).unwrap().neg().unwrap().neg().unwrap();
    let t = y.transpose(&[1, 0]).unwrap().transpose(&[1, 0]).unwrap();
    let r = t.reshape([3, 2]).unwrap().reshape([6]).unwrap();
    check(
        &b,
        &[&r],
        expect![[r#"
            %0 = input() {name="x"} : f32[2,3]
            %1 = reshape(%0) {shape=[6]} : f32[6]
        "#]],
    );
}

#[test]
fn cse_and_dce() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [4]).unwrap();
    let _unused = x.sin().unwrap();
    let a = x.exp().unwrap();
    let a2 = x.exp().unwrap();
    let y = a.add(&a2).unwrap();
    check(
        &b,
        &[&y],
        expect![[r#"
            %0 = input() {name="x"} : f32[4]
            %1 = exp(%0) : f32[4]
            %2 = add(%1, %1) : f32[4]
        "#]],
    );
}

#[test]
fn batch_norm_folds_into_conv() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [1, 2, 5, 5]).unwrap();
    let w = b.input("w", DType::F32, [3, 2, 3, 3]).unwrap();
    let stat = |n: &str| b.input(n, DType::F32, [3]).unwrap();
    let (mean, var, gamma, beta) = (stat("mean"), stat("var"), stat("gamma"), stat("beta"));
    let y = x.conv2d(&w, [1, 1], [1, 1], [1, 1], 1).unwrap();
    let z = y.batch_norm(&mean, &var, &gamma, &beta, 1e-5, 1).unwrap().relu().unwrap();
    check(
        &b,
        &[&z],
        expect![[r#"
            %0 = input() {name="x"} : f32[1,2,5,5]
            %1 = input() {name="w"} : f32[3,2,3,3]
            %2 = input() {name="mean"} : f32[3]
            %3 = input() {name="var"} : f32[3]
            %4 = input() {name="gamma"} : f32[3]
            %5 = input() {name="beta"} : f32[3]
            %6 = full() {value=9.999999747378752e-6} : f32[3]
            %7 = add(%3, %6) : f32[3]
            %8 = rsqrt(%7) : f32[3]
            %9 = mul(%8, %4) : f32[3]
            %10 = broadcast(%9) {shape=[3,2,3,3], dims=[0]} : f32[3,2,3,3]
            %11 = mul(%1, %10) : f32[3,2,3,3]
            %12 = conv2d(%0, %11) {stride=[1,1], padding=[1,1], dilation=[1,1], groups=1} : f32[1,3,5,5]
            %13 = mul(%2, %9) : f32[3]
            %14 = sub(%5, %13) : f32[3]
            %15 = broadcast(%14) {shape=[1,3,5,5], dims=[1]} : f32[1,3,5,5]
            %16 = add(%12, %15) : f32[1,3,5,5]
            %17 = full() {value=0.0} : f32[1,3,5,5]
            %18 = max(%16, %17) : f32[1,3,5,5]
        "#]],
    );
}

#[test]
fn batch_norm_folds_into_matmul() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [4, 6]).unwrap();
    let w = b.input("w", DType::F32, [6, 3]).unwrap();
    let stat = |n: &str| b.input(n, DType::F32, [3]).unwrap();
    let (mean, var, gamma, beta) = (stat("mean"), stat("var"), stat("gamma"), stat("beta"));
    let z = x.matmul(&w).unwrap().batch_norm(&mean, &var, &gamma, &beta, 1e-3, 1).unwrap();
    check(
        &b,
        &[&z],
        expect![[r#"
            %0 = input() {name="x"} : f32[4,6]
            %1 = input() {name="w"} : f32[6,3]
            %2 = input() {name="mean"} : f32[3]
            %3 = input() {name="var"} : f32[3]
            %4 = input() {name="gamma"} : f32[3]
            %5 = input() {name="beta"} : f32[3]
            %6 = full() {value=0.0010000000474974513} : f32[3]
            %7 = add(%3, %6) : f32[3]
            %8 = rsqrt(%7) : f32[3]
            %9 = mul(%8, %4) : f32[3]
            %10 = broadcast(%9) {shape=[6,3], dims=[1]} : f32[6,3]
            %11 = mul(%1, %10) : f32[6,3]
            %12 = matmul(%0, %11) : f32[4,3]
            %13 = mul(%2, %9) : f32[3]
            %14 = sub(%5, %13) : f32[3]
            %15 = broadcast(%14) {shape=[4,3], dims=[1]} : f32[4,3]
            %16 = add(%12, %15) : f32[4,3]
        "#]],
    );
}

#[test]
fn batch_norm_with_constant_statistics_folds_to_new_weights() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [1, 2, 4, 4]).unwrap();
    let w = b.constant(DType::F32, [2, 2, 1, 1], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    let c = |v: [f64; 2]| b.constant(DType::F32, [2], &v).unwrap();
    let (mean, var, gamma, beta) = (c([0.5, -1.0]), c([4.0, 0.25]), c([2.0, 1.0]), c([0.0, 1.0]));
    let y = x.conv2d(&w, [1, 1], [0, 0], [1, 1], 1).unwrap();
    let z = y.batch_norm(&mean, &var, &gamma, &beta, 0.0, 1).unwrap();
    check(
        &b,
        &[&z],
        expect![[r#"
            %0 = input() {name="x"} : f32[1,2,4,4]
            %1 = constant() {values=[1.0, 2.0, 6.0, 8.0]} : f32[2,2,1,1]
            %2 = conv2d(%0, %1) {stride=[1,1], padding=[0,0], dilation=[1,1], groups=1} : f32[1,2,4,4]
            %3 = constant() {values=[-0.5, 3.0]} : f32[2]
            %4 = broadcast(%3) {shape=[1,2,4,4], dims=[1]} : f32[1,2,4,4]
            %5 = add(%2, %4) : f32[1,2,4,4]
        "#]],
    );
}
