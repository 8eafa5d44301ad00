//! Shapes and values of the individual layers, checked on the CPU reference.

mod common;

use common::{at, eval, f32s, init, random};
use fusegraph_ir::{DType, GraphBuilder, HostTensor};
use fusegraph_nn::{
    Activation, BatchNorm2d, Conv2d, Conv2dConfig, Embedding, Forward, LayerNorm, Linear, Mlp, MultiHeadAttention,
    NnError, Params, ResidualBlock, RmsNorm, TransformerBlock,
};

#[test]
fn linear_matches_a_hand_computation() {
    let b = GraphBuilder::new();
    let mut p = Params::new(1);
    let lin = init(&mut p, Linear::new(&at("fc"), 3, 2, true)).unwrap();
    p.insert("fc.weight", HostTensor::new([3, 2], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap());
    p.insert("fc.bias", HostTensor::new([2], vec![0.5f32, -1.0]).unwrap());
    let x = b.input("x", DType::F32, [2, 3]).unwrap();
    let y = lin.forward(&x).unwrap();
    assert_eq!(y.dims(), &[2, 2]);
    let xv = HostTensor::new([2, 3], vec![1.0f32, 0.0, -1.0, 2.0, 1.0, 0.5]).unwrap();
    let out = eval(&b, &p, &[&y], &[("x", xv)]);
    // [1,0,-1]·W = [1-5, 2-6] = [-4,-4]; [2,1,.5]·W = [2+3+2.5, 4+4+3] = [7.5, 11].
    assert_eq!(f32s(&out[0]), vec![-3.5, -5.0, 8.0, 10.0]);
}

#[test]
fn linear_handles_any_rank_and_rejects_wrong_widths() {
    let b = GraphBuilder::new();
    let mut p = Params::new(2);
    let lin = init(&mut p, Linear::new(&at("fc"), 4, 5, false)).unwrap();
    assert!(lin.bias.is_none());
    assert_eq!(p.len(), 1);
    for shape in [vec![4], vec![3, 4], vec![2, 3, 4], vec![2, 1, 3, 4]] {
        let x = b.input("x", DType::F32, shape.clone()).unwrap();
        let y = lin.forward(&x).unwrap();
        let mut want = shape.clone();
        *want.last_mut().unwrap() = 5;
        assert_eq!(y.dims(), &want[..]);
    }
    // Rank-3 result equals applying the layer row by row.
    let x3 = b.input("x3", DType::F32, [2, 3, 4]).unwrap();
    let x2 = b.input("x2", DType::F32, [6, 4]).unwrap();
    let (y3, y2) = (lin.forward(&x3).unwrap(), lin.forward(&x2).unwrap());
    let v = random(&[2, 3, 4], 9);
    let v2 = HostTensor::new([6, 4], f32s(&v)).unwrap();
    let out = eval(&b, &p, &[&y3, &y2], &[("x3", v), ("x2", v2)]);
    assert_eq!(f32s(&out[0]), f32s(&out[1]));
    let bad = b.input("bad", DType::F32, [2, 3]).unwrap();
    assert!(matches!(lin.forward(&bad), Err(NnError::Config(_))));
    let scalar = b.input("s", DType::F32, Vec::<usize>::new()).unwrap();
    assert!(lin.forward(&scalar).is_err());
}

#[test]
fn conv2d_shapes_groups_and_bias() {
    let b = GraphBuilder::new();
    let mut p = Params::new(3);
    let cfg = Conv2dConfig::new(4, 6, 3).stride(2).padding(1).groups(2).bias();
    let conv = init(&mut p, Conv2d::new(&at("c"), cfg)).unwrap();
    assert_eq!(conv.weight.dims(), &[6, 2, 3, 3]);
    assert_eq!(p.get("c.bias").unwrap().shape().dims(), &[6]);
    let x = b.input("x", DType::F32, [2, 4, 9, 9]).unwrap();
    let y = conv.forward(&x).unwrap();
    assert_eq!(y.dims(), &[2, 6, 5, 5]);
    // The bias is added along the channel axis: with zero weights the output is the bias.
    p.insert("c.weight", HostTensor::new([6, 2, 3, 3], vec![0.0f32; 108]).unwrap());
    let out = eval(&b, &p, &[&y], &[("x", random(&[2, 4, 9, 9], 1))]);
    let bias = f32s(p.get("c.bias").unwrap());
    for (i, v) in f32s(&out[0]).iter().enumerate() {
        assert_eq!(*v, bias[(i / 25) % 6]);
    }
    let bad = Conv2dConfig::new(3, 6, 3).padding(1).groups(2).bias();
    assert!(matches!(init(&mut p, Conv2d::new(&at("bad"), bad)), Err(NnError::Config(_))));
    assert!(init(&mut p, Conv2d::new(&at("bad0"), bad.groups(0))).is_err());
}

#[test]
fn norms_have_the_right_shapes_and_values() {
    let b = GraphBuilder::new();
    let mut p = Params::new(4);
    let bn = init(&mut p, BatchNorm2d::new(&at("bn"), 3)).unwrap();
    for n in ["bn.running_mean", "bn.running_var", "bn.weight", "bn.bias"] {
        assert_eq!(p.get(n).unwrap().shape().dims(), &[3], "{n}");
    }
    assert!(f32s(p.get("bn.running_var").unwrap()).iter().all(|&v| (1.0..1.5).contains(&v)));
    let x = b.input("x", DType::F32, [2, 3, 4, 4]).unwrap();
    let ybn = bn.forward(&x).unwrap();
    assert_eq!(ybn.dims(), &[2, 3, 4, 4]);
    assert!(bn.forward(&b.input("r3", DType::F32, [2, 3, 4]).unwrap()).is_err());

    let ln = init(&mut p, LayerNorm::new(&at("ln"), 4)).unwrap();
    let rms = init(&mut p, RmsNorm::new(&at("rms"), 4)).unwrap();
    let t = b.input("t", DType::F32, [2, 3, 4]).unwrap();
    let (yln, yrms) = (ln.forward(&t).unwrap(), rms.forward(&t).unwrap());
    assert_eq!(yln.dims(), &[2, 3, 4]);
    assert_eq!(yrms.dims(), &[2, 3, 4]);

    let xv = random(&[2, 3, 4, 4], 5);
    let tv = random(&[2, 3, 4], 6);
    let out = eval(&b, &p, &[&ybn, &yln, &yrms], &[("x", xv.clone()), ("t", tv.clone())]);
    // Batch norm against the formula.
    let (mean, var) = (f32s(p.get("bn.running_mean").unwrap()), f32s(p.get("bn.running_var").unwrap()));
    for (i, (&got, &x)) in f32s(&out[0]).iter().zip(&f32s(&xv)).enumerate() {
        let c = (i / 16) % 3;
        let want = (x - mean[c]) / (var[c] + 1e-5).sqrt();
        assert!((got - want).abs() < 1e-5, "bn {i}: {got} vs {want}");
    }
    // Layer norm rows have mean 0 and variance ~1; RMS norm rows have mean square ~1.
    let t = f32s(&tv);
    for (r, (ln_row, rms_row)) in f32s(&out[1]).chunks(4).zip(f32s(&out[2]).chunks(4)).enumerate() {
        let m: f32 = ln_row.iter().sum::<f32>() / 4.0;
        let v: f32 = ln_row.iter().map(|x| x * x).sum::<f32>() / 4.0;
        assert!(m.abs() < 1e-5 && (v - 1.0).abs() < 1e-3, "ln row {r}: mean {m} var {v}");
        let ms: f32 = rms_row.iter().map(|x| x * x).sum::<f32>() / 4.0;
        assert!((ms - 1.0).abs() < 1e-3, "rms row {r}: {ms}");
        let src = &t[4 * r..4 * r + 4];
        let scale = (src.iter().map(|x| x * x).sum::<f32>() / 4.0 + 1e-6).sqrt();
        assert!((rms_row[0] - src[0] / scale).abs() < 1e-5);
    }
}

#[test]
fn embedding_gathers_rows() {
    let b = GraphBuilder::new();
    let mut p = Params::new(5);
    let emb = init(&mut p, Embedding::new(&at("emb"), 5, 3)).unwrap();
    let table = random(&[5, 3], 7);
    p.insert("emb.weight", table.clone());
    let ids = b.input("ids", DType::I32, [2, 2]).unwrap();
    let y = emb.forward(&ids).unwrap();
    assert_eq!(y.dims(), &[2, 2, 3]);
    let idv = vec![4, 0, 2, 4];
    let out = eval(&b, &p, &[&y], &[("ids", HostTensor::new([2, 2], idv.clone()).unwrap())]);
    let t = f32s(&table);
    let want: Vec<f32> = idv.iter().flat_map(|&i| t[3 * i as usize..3 * i as usize + 3].to_vec()).collect();
    assert_eq!(f32s(&out[0]), want);
    assert!(emb.forward(&b.input("f", DType::F32, [2]).unwrap()).is_err());
}

#[test]
fn activations_apply() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [4]).unwrap();
    let acts = [Activation::Relu, Activation::Gelu, Activation::GeluTanh, Activation::Silu];
    let ys: Vec<_> = acts.iter().map(|a| a.forward(&x).unwrap()).collect();
    let refs: Vec<_> = ys.iter().collect();
    let xv = vec![-2.0f32, -0.5, 0.0, 1.5];
    let out = eval(&b, &Params::new(0), &refs, &[("x", HostTensor::new([4], xv.clone()).unwrap())]);
    assert_eq!(f32s(&out[0]), vec![0.0, 0.0, 0.0, 1.5]);
    for (i, &v) in xv.iter().enumerate() {
        let silu = v / (1.0 + (-v).exp());
        assert!((f32s(&out[3])[i] - silu).abs() < 1e-6);
        assert!((f32s(&out[1])[i] - f32s(&out[2])[i]).abs() < 1e-2, "gelu forms agree roughly");
    }
}

#[test]
fn attention_shapes_and_config_errors() {
    let b = GraphBuilder::new();
    let mut p = Params::new(6);
    let mha = init(&mut p, MultiHeadAttention::new(&at("attn"), 8, 2, false)).unwrap();
    assert_eq!(p.len(), 8);
    let x = b.input("x", DType::F32, [2, 5, 8]).unwrap();
    let y = mha.forward(&x).unwrap();
    assert_eq!(y.dims(), &[2, 5, 8]);
    let out = eval(&b, &p, &[&y], &[("x", random(&[2, 5, 8], 3))]);
    assert!(f32s(&out[0]).iter().all(|v| v.is_finite()));
    assert!(matches!(init(&mut p, MultiHeadAttention::new(&at("bad"), 8, 3, false)), Err(NnError::Config(_))));
    assert!(init(&mut p, MultiHeadAttention::new(&at("bad0"), 8, 0, false)).is_err());
    assert!(mha.forward(&b.input("r2", DType::F32, [5, 8]).unwrap()).is_err());
    assert!(mha.forward(&b.input("w", DType::F32, [1, 5, 4]).unwrap()).is_err());
}

#[test]
fn causal_attention_ignores_the_future() {
    let (batch, seq, d) = (2, 4, 8);
    let b = GraphBuilder::new();
    let mut p = Params::new(7);
    let mha = init(&mut p, MultiHeadAttention::new(&at("attn"), d, 2, true)).unwrap();
    let x = b.input("x", DType::F32, [batch, seq, d]).unwrap();
    let y = mha.forward(&x).unwrap();
    let a = f32s(&random(&[batch, seq, d], 11));
    // Change every position after `t` and check that positions ≤ t keep their outputs.
    let run =
        |v: &[f32]| f32s(&eval(&b, &p, &[&y], &[("x", HostTensor::new([batch, seq, d], v.to_vec()).unwrap())])[0]);
    let ya = run(&a);
    for t in 0..seq - 1 {
        let mut c = a.clone();
        for bi in 0..batch {
            for s in t + 1..seq {
                for k in 0..d {
                    c[(bi * seq + s) * d + k] += 3.0 + k as f32;
                }
            }
        }
        let yc = run(&c);
        for bi in 0..batch {
            for s in 0..seq {
                let row = |v: &[f32]| v[(bi * seq + s) * d..(bi * seq + s + 1) * d].to_vec();
                if s <= t {
                    assert_eq!(row(&ya), row(&yc), "batch {bi} position {s} changed when positions > {t} did");
                } else {
                    assert_ne!(row(&ya), row(&yc), "batch {bi} position {s} should see its own input");
                }
            }
        }
    }
    // Without the mask, position 0 does see the future.
    let b2 = GraphBuilder::new();
    let mha2 = init(&mut p, MultiHeadAttention::new(&at("attn"), d, 2, false)).unwrap();
    let x2 = b2.input("x", DType::F32, [batch, seq, d]).unwrap();
    let y2 = mha2.forward(&x2).unwrap();
    let mut c = a.clone();
    c[(seq - 1) * d] += 5.0;
    let run2 =
        |v: &[f32]| f32s(&eval(&b2, &p, &[&y2], &[("x", HostTensor::new([batch, seq, d], v.to_vec()).unwrap())])[0]);
    assert_ne!(run2(&a)[..d], run2(&c)[..d]);
}

#[test]
fn blocks_have_the_right_shapes() {
    let b = GraphBuilder::new();
    let mut p = Params::new(8);
    let mlp = init(&mut p, Mlp::new(&at("mlp"), 6, 10, 3, Activation::Gelu)).unwrap();
    let x = b.input("x", DType::F32, [2, 4, 6]).unwrap();
    assert_eq!(mlp.forward(&x).unwrap().dims(), &[2, 4, 3]);

    let blk = init(&mut p, TransformerBlock::new(&at("blk"), 6, 3, 12, true)).unwrap();
    let y = blk.forward(&x).unwrap();
    assert_eq!(y.dims(), &[2, 4, 6]);

    let img = b.input("img", DType::F32, [2, 4, 8, 8]).unwrap();
    let same = init(&mut p, ResidualBlock::new(&at("res1"), 4, 4, 1)).unwrap();
    assert!(same.shortcut.is_none());
    let r1 = same.forward(&img).unwrap();
    assert_eq!(r1.dims(), &[2, 4, 8, 8]);
    let down = init(&mut p, ResidualBlock::new(&at("res2"), 4, 8, 2)).unwrap();
    assert!(down.shortcut.is_some());
    assert!(p.get("res2.downsample.0.weight").is_some() && p.get("res2.downsample.1.running_var").is_some());
    let r2 = down.forward(&img).unwrap();
    assert_eq!(r2.dims(), &[2, 8, 4, 4]);
    let odd = b.input("odd", DType::F32, [1, 4, 7, 7]).unwrap();
    assert_eq!(
        init(&mut p, ResidualBlock::new(&at("res3"), 4, 4, 2)).unwrap().forward(&odd).unwrap().dims(),
        &[1, 4, 4, 4]
    );

    let out = eval(&b, &p, &[&y, &r1, &r2], &[("x", random(&[2, 4, 6], 1)), ("img", random(&[2, 4, 8, 8], 2))]);
    for t in &out {
        assert!(f32s(t).iter().all(|v| v.is_finite()));
    }
    // Residual blocks end in a ReLU.
    assert!(f32s(&out[2]).iter().all(|&v| v >= 0.0));
}
