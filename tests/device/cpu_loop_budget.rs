//! Kernels for CPU adapters keep each invocation's loop iterations under
//! `fusegraph_wgsl::CPU_LOOP_BUDGET`: Mesa's llvmpipe and lavapipe end every loop of a shader
//! invocation once 65 535 iterations have run between them, silently: past the budget, each
//! case here gives wrong answers on lavapipe and llvmpipe. On other adapters they check the
//! same results.

use fusegraph::crates::reference::{assert_close, evaluate};
use fusegraph::{CompileOptions, DType, Device, GraphBuilder, HostTensor, Tensor};
use std::collections::BTreeMap;

/// Eight inputs each summed whole and the sums added (cut down from `fuzz_device`'s backward
/// test, seeds 160 and 161), rows of two shapes, so no row kernel holds them all. Fused into
/// one loop kernel of eight serial loops, four elements side by side and four per invocation
/// would make that 32 loops of 2 600 iterations in one invocation, and the eighth input would
/// add only its first element. Fusion gives long reductions row kernels; unfused, each sum is
/// a loop kernel of its own.
#[test]
fn long_serial_sums_read_every_element() {
    let device = Device::shared().unwrap();
    let (a, b) = ([65usize, 40usize], [40usize, 65usize]);
    let shapes = [b, a, a, a, a, a, a, a];
    let g = GraphBuilder::new();
    let mut total: Option<Tensor> = None;
    for (i, &dims) in shapes.iter().enumerate() {
        let s = g.input(&format!("x{i}"), DType::F32, dims).unwrap().sum(&[0, 1], false).unwrap();
        total = Some(match total {
            None => s,
            Some(t) => t.add(&s).unwrap(),
        });
    }
    let y = total.unwrap();
    for opts in [CompileOptions::default(), CompileOptions::unfused()] {
        let exe = device.compile(&g.graph(), &[y.id()], &opts).unwrap();
        // Ones in input `k`, zeros elsewhere: the sum is that input's element count.
        for k in 0..shapes.len() {
            let feeds: Vec<(String, HostTensor)> = shapes
                .iter()
                .enumerate()
                .map(|(j, d)| {
                    (format!("x{j}"), HostTensor::new(d.to_vec(), vec![(j == k) as u8 as f32; d[0] * d[1]]).unwrap())
                })
                .collect();
            let refs: Vec<(&str, &HostTensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
            let got = exe.run(&refs).unwrap()[0].to_f64()[0];
            assert_eq!(got, 2600.0, "input {k} of shape {:?}, fusion {:?}", shapes[k], opts.fusion);
        }
    }
}

/// Unfused, a sum is a kernel of its own: as a loop kernel, one invocation per output, over
/// rows of 100 000 lavapipe would sum only the first 65 535 elements. A CPU adapter lowers
/// such a lone reduction as a row kernel (a workgroup per row). Four outputs, a multiple of
/// 4: the output must not be declared as vec4s while stored one element at a time (invalid
/// WGSL).
#[test]
fn an_unfused_sum_longer_than_the_loop_budget_reads_every_element() {
    let device = Device::shared().unwrap();
    let (rows, len) = (4usize, 100_000usize);
    let g = GraphBuilder::new();
    let s = g.input("x", DType::F32, [rows, len]).unwrap().sum(&[1], false).unwrap();
    let graph = g.graph();
    let xv = HostTensor::new([rows, len], fusegraph_workloads::random_values(6, rows * len)).unwrap();
    let feeds = BTreeMap::from([("x".to_string(), xv.clone())]);
    let want = evaluate(&graph, &[s.id()], &feeds, &BTreeMap::new()).unwrap();
    let exe = device.compile(&graph, &[s.id()], &CompileOptions::unfused()).unwrap();
    let got = exe.run(&[("x", &xv)]).unwrap();
    assert_close(&got[0], &want[0], 1e-4, 1e-2).unwrap();
}

/// 64 rows of 131 072 elements: with one invocation per row on a CPU adapter, its passes over
/// the row (max, sum, outputs) would run past the limit, the softmax wrong and the row sums
/// short by about 0.3%.
#[test]
fn long_rows_are_reduced_whole() {
    let device = Device::shared().unwrap();
    let (rows, len) = (64usize, 131_072usize);
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, [rows, len]).unwrap();
    let (y, s) = (x.softmax(1).unwrap(), x.sum(&[1], false).unwrap());
    let graph = g.graph();
    let xv = HostTensor::new([rows, len], fusegraph_workloads::random_values(5, rows * len)).unwrap();
    let want = evaluate(&graph, &[y.id(), s.id()], &BTreeMap::from([("x".to_string(), xv.clone())]), &BTreeMap::new())
        .unwrap();
    let exe = device.compile(&graph, &[y.id(), s.id()], &CompileOptions::default()).unwrap();
    let got = exe.run(&[("x", &xv)]).unwrap();
    assert_close(&got[0], &want[0], 1e-3, 1e-8).unwrap();
    assert_close(&got[1], &want[1], 1e-4, 1e-2).unwrap();
}
