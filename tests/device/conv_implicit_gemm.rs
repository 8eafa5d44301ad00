//! conv2d (groups 1) lowers to the tiled implicit GEMM (patches gathered by `fg_im2col`),
//! with its fused epilogue, and matches the reference on ragged shapes.

use fusegraph::crates::passes::{fuse, FusionOptions};
use fusegraph::crates::reference::{assert_close, evaluate};
use fusegraph::crates::wgsl::{lower, validate, KernelForm, LowerOptions};
use fusegraph::{CompileOptions, DType, Device, GraphBuilder, HostTensor};
use std::collections::BTreeMap;

#[test]
fn conv_as_implicit_gemm_matches_the_reference() {
    let device = Device::shared().unwrap();
    for (n, c, h, w, o, k, stride, pad, dil) in [
        (1, 3, 9, 7, 5, [3, 3], [1, 1], [1, 1], [1, 1]),
        (2, 4, 10, 10, 8, [3, 2], [2, 1], [1, 0], [1, 2]),
        (3, 7, 12, 11, 70, [1, 1], [1, 1], [0, 0], [1, 1]),
        (1, 16, 8, 8, 130, [3, 3], [1, 1], [1, 1], [1, 1]),
    ] {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [n, c, h, w]).unwrap();
        let wt = b.input("w", DType::F32, [o, c, k[0], k[1]]).unwrap();
        let bias = b.input("b", DType::F32, [o, 1, 1]).unwrap();
        let y = x.conv2d(&wt, stride, pad, dil, 1).unwrap().add(&bias).unwrap().relu().unwrap();
        let g = b.graph();
        let kernels = fuse(&g, &[y.id()], &FusionOptions { max_bindings: 32, ..Default::default() }).unwrap().kernels;
        assert_eq!(kernels.len(), 1);
        let src = lower(&g, &kernels[0], &LowerOptions::default());
        validate(&src.wgsl).unwrap();
        assert!(
            matches!(src.form, KernelForm::TiledMatmul { conv: true, .. }),
            "not the implicit GEMM: {:?}",
            src.form
        );

        let feed = |t: &fusegraph::Tensor, seed| {
            HostTensor::new(t.dims().to_vec(), fusegraph_workloads::random_values(seed, t.shape().numel())).unwrap()
        };
        let (xv, wv, bv) = (feed(&x, 1), feed(&wt, 2), feed(&bias, 3));
        let exe = device.compile(&g, &[y.id()], &CompileOptions::default()).unwrap();
        let got = exe.run(&[("x", &xv), ("w", &wv), ("b", &bv)]).unwrap();
        let feeds = BTreeMap::from([("x".to_string(), xv), ("w".to_string(), wv), ("b".to_string(), bv)]);
        let want = evaluate(&g, &[y.id()], &feeds, &BTreeMap::new()).unwrap();
        assert_close(&got[0], &want[0], 1e-5, 1e-4).unwrap();
    }
}
