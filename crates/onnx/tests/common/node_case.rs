//! One ONNX backend node test case (tests/data/onnx/node, written by
//! scripts/fixtures/make_onnx_nodes.py from `onnx.backend.test.case.node`): its model
//! imported, its inputs and expected outputs, and the comparison. Integer inputs of at most
//! 16 elements (axes, shapes, slice bounds, indices) are given at import
//! (`OnnxModel::import_specialized`), as a static-shape compiler takes them; where a node
//! needs another input at import (a Resize's scales, a Range's float bounds), every input of
//! at most 16 elements is. Shared by the crate's node test (the CPU reference) and the
//! device tests (fused, on the device).

use fusegraph_ir::{safetensors, DType, Graph, GraphBuilder, HostTensor, NodeId};
use fusegraph_onnx::OnnxModel;
use std::collections::BTreeMap;
use std::path::Path;

/// An imported case.
pub struct Case {
    /// The imported graph and its outputs.
    pub graph: Graph,
    pub outputs: Vec<NodeId>,
    /// Its inputs (in the model's dtypes) and initializers.
    pub feeds: BTreeMap<String, HostTensor>,
    pub params: BTreeMap<String, HostTensor>,
    /// The expected outputs, by name.
    pub want: Vec<(String, HostTensor)>,
}

/// Case `name` of `dir`, imported; `Err` says why it could not be.
pub fn load(dir: &Path, name: &str) -> Result<Case, String> {
    let model = OnnxModel::open(&dir.join(format!("{name}.onnx"))).map_err(|e| e.to_string())?;
    let io = safetensors::read(&dir.join(format!("{name}.safetensors"))).map_err(|e| e.to_string())?;
    let split = |kind: &str| -> Vec<(usize, String, HostTensor)> {
        let mut v: Vec<(usize, String, HostTensor)> = io
            .iter()
            .filter_map(|(k, t)| {
                let rest = k.strip_prefix(kind)?.strip_prefix(':')?;
                let (i, n) = rest.split_once(':')?;
                Some((i.parse().ok()?, n.to_string(), t.clone()))
            })
            .collect();
        v.sort_by_key(|(i, ..)| *i);
        v
    };
    let (inputs, outputs) = (split("input"), split("output"));
    // (safetensors holds a 0-d array as one element of shape [1]: back to the declared rank.)
    let declared = model.inputs().map_err(|e| e.to_string())?;
    let scalar = |n: &str| declared.iter().any(|i| i.name == n && i.dims.is_empty());
    let feeds: BTreeMap<String, HostTensor> = inputs
        .into_iter()
        .map(|(_, n, t)| {
            let t = match scalar(&n) && t.shape().dims() == [1] {
                true => HostTensor::from_f64(t.dtype(), Vec::<usize>::new(), &t.to_f64()).expect("one value"),
                false => t,
            };
            (n, t)
        })
        .collect();
    let shapes = feeds.iter().map(|(k, v)| (k.clone(), v.shape().dims().to_vec())).collect();
    // Integer inputs of a few elements (axes, shapes, bounds, indices) are given at import,
    // as a static-shape compiler takes them; the others are fed. Where a node needs another
    // input at import (a Resize's scales, a Range's float bounds), every input of a few
    // elements is given.
    let mut b = GraphBuilder::new();
    let small = |t: &HostTensor, any: bool| (any || t.dtype().is_int()) && t.shape().numel() <= 16;
    let (mut known, mut feeds): (BTreeMap<String, HostTensor>, BTreeMap<String, HostTensor>) =
        feeds.clone().into_iter().partition(|(_, t)| small(t, false));
    let mut imported = model.import_specialized(&b, &shapes, &known);
    if imported.as_ref().is_err_and(|e| e.to_string().contains("must be known at import")) {
        let all = feeds.clone().into_iter().chain(known).collect::<BTreeMap<_, _>>();
        (known, feeds) = all.into_iter().partition(|(_, t)| small(t, true));
        b = GraphBuilder::new();
        imported = model.import_specialized(&b, &shapes, &known);
    }
    let imported = imported.map_err(|e| e.to_string())?;
    // Inputs fed in the model's dtype (a float64 case's inputs were written as f32).
    let feeds: BTreeMap<String, HostTensor> = imported
        .inputs
        .iter()
        .map(|(n, t)| {
            let given = &feeds[n];
            let v = if given.dtype() == t.dtype() {
                given.clone()
            } else {
                HostTensor::from_f64(t.dtype(), given.shape().clone(), &given.to_f64()).expect("same shape")
            };
            (n.clone(), v)
        })
        .collect();
    let graph = b.graph();
    let outputs_ids: Vec<_> = imported.outputs.iter().map(|(_, t)| t.id()).collect();
    let want = outputs.into_iter().map(|(_, n, t)| (n, t)).collect();
    Ok(Case { graph, outputs: outputs_ids, feeds, params: imported.params, want })
}

/// `got` (the case's outputs) against its expected ones: within 1e-3 relative and 1e-4
/// absolute (f16 1e-2), integers and bools exactly.
pub fn check(case: &Case, got: &[HostTensor]) -> Result<(), String> {
    for ((name, want), got) in case.want.iter().zip(got) {
        // (safetensors holds a 0-d array as one element of shape [1].)
        let scalar = got.shape().rank() == 0 && want.shape().dims() == [1];
        if got.shape() != want.shape() && !scalar {
            return Err(format!("output `{name}`: shape {} for {}", got.shape(), want.shape()));
        }
        let (tol_r, tol_a) = match want.dtype() {
            DType::F16 => (1e-2, 1e-2),
            d if d.is_float() => (1e-3, 1e-4),
            _ => (0.0, 0.0),
        };
        for (i, (g, w)) in got.to_f64().iter().zip(want.to_f64()).enumerate() {
            let close = (g.is_nan() && w.is_nan()) || g == &w || (g - w).abs() <= tol_a + tol_r * w.abs();
            if !close {
                return Err(format!("output `{name}` element {i}: {g} for {w}"));
            }
        }
    }
    Ok(())
}

/// The list of cases expected to fail (`tests/expected-failures.txt`: a case's name and the
/// reason on each line, `#` comments), by name.
pub fn expected_failures(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, why) = l.split_once(' ').unwrap_or((l, ""));
            (name.to_string(), why.trim().to_string())
        })
        .collect()
}
