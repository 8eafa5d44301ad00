//! Models exported by `torch.onnx.export` (tests/data/onnx, written by
//! scripts/fixtures/make_onnx.py) import and, evaluated by the CPU reference, give ONNX
//! Runtime's outputs; unsupported ops and bad inputs are typed errors.

use fusegraph_ir::{safetensors, GraphBuilder, HostTensor};
use fusegraph_onnx::proto::{GraphProto, ModelProto, NodeProto, OperatorSetIdProto};
use fusegraph_onnx::{Dim, OnnxError, OnnxModel};
use prost::Message;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/onnx")
}

/// Imports `name`.onnx at its fixture's input shapes, evaluates it with the reference on the
/// fixture's inputs and compares every output with ONNX Runtime's.
fn check(name: &str) {
    check_with(name, name);
}

/// [`check`] of model `name` against the fixture of model `io`.
fn check_with(name: &str, io: &str) {
    let model = OnnxModel::open(&data().join(format!("{name}.onnx"))).unwrap();
    let io = safetensors::read(&data().join(format!("{io}-io.safetensors"))).unwrap();
    let feeds: BTreeMap<String, HostTensor> =
        io.iter().filter_map(|(k, v)| Some((k.strip_prefix("input:")?.to_string(), v.clone()))).collect();
    let b = GraphBuilder::new();
    let imported = model.import_for(&b, &feeds).unwrap();
    let g = b.graph();
    let ids: Vec<_> = imported.outputs.iter().map(|(_, t)| t.id()).collect();
    let got = fusegraph_reference::evaluate(&g, &ids, &feeds, &imported.params).unwrap();
    assert_eq!(imported.outputs.len(), model.output_names().len());
    for ((out, _), got) in imported.outputs.iter().zip(got) {
        let want = &io[&format!("output:{out}")];
        assert_eq!(got.shape(), want.shape(), "{name}: {out}");
        let (g, w) = (got.to_f64(), want.to_f64());
        let scale = w.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
        let err = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / scale;
        assert!(err < 1e-4, "{name}: {out} differs from ONNX Runtime's by {err:.2e} of its largest");
    }
}

#[test]
fn a_classifier_gives_onnx_runtimes_outputs() {
    check("cnn");
}

#[test]
fn an_mlp_with_shape_arithmetic_gives_onnx_runtimes_outputs() {
    check("mlp");
}

/// The MLP with its initializers in a file beside it (ONNX's external data) gives the same
/// outputs; a missing data file is an error naming the tensor and the file.
#[test]
fn external_data_is_read_from_beside_the_model() {
    check_with("mlp_external", "mlp");
    let dir = std::env::temp_dir().join(format!("fusegraph-onnx-external-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(data().join("mlp_external.onnx"), dir.join("mlp_external.onnx")).unwrap();
    let model = OnnxModel::open(&dir.join("mlp_external.onnx")).unwrap();
    let shapes = BTreeMap::from([("x".to_string(), vec![3, 32])]);
    match model.import(&GraphBuilder::new(), &shapes) {
        Err(OnnxError::Tensor { name, detail }) => assert!(detail.contains("mlp_external.weights"), "{name}: {detail}"),
        other => panic!("{other:?}"),
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// torchvision's MobileNetV3-small (a quarter of its width): depthwise convolutions,
/// squeeze-and-excitation, hardswish.
#[test]
fn mobilenet_v3_gives_onnx_runtimes_outputs() {
    check("mobilenet_v3_small");
}

/// torchvision's ResNet-18 classes at a quarter of the widths (scripts/fixtures/make_onnx.py).
#[test]
fn resnet18_gives_onnx_runtimes_outputs() {
    check("resnet18");
}

/// A tiny BERT and a tiny GPT-2 as `transformers` builds them: embeddings, attention with
/// masks built from the inputs (`Where`, `Expand`, `GatherElements`), GELU, layer norms.
#[test]
fn transformers_bert_and_gpt2_give_onnx_runtimes_outputs() {
    check("bert_tiny");
    check("gpt2_tiny");
}

/// The MLP's batch is a named dimension: it imports at any batch, and its shape
/// arithmetic (`Shape`, `Gather`, `Concat`, `Reshape`) folds away at import.
#[test]
fn a_named_dimension_takes_the_size_given() {
    let model = OnnxModel::open(&data().join("mlp.onnx")).unwrap();
    let inputs = model.inputs().unwrap();
    assert_eq!(inputs[0].dims, vec![Dim::Named("batch".into()), Dim::Fixed(32)]);
    for batch in [1, 5] {
        let b = GraphBuilder::new();
        let imported = model.import(&b, &BTreeMap::from([("x".to_string(), vec![batch, 32])])).unwrap();
        let dims: Vec<Vec<usize>> = imported.outputs.iter().map(|(_, t)| t.dims().to_vec()).collect();
        assert_eq!(dims, vec![vec![batch, 32], vec![batch, 1], vec![batch, 1, 8, 4]]);
        let g = b.graph();
        let shape_ops = g.node_ids().into_iter().filter(|&n| g.node(n).op.name() == "gather").count();
        assert_eq!(shape_ops, 0, "the shape arithmetic is folded");
    }
    let b = GraphBuilder::new();
    match model.import(&b, &BTreeMap::new()) {
        Err(OnnxError::Input { name, detail }) => assert!(name == "x" && detail.contains("batch"), "{detail}"),
        other => panic!("{other:?}"),
    }
}

/// A model with an op the importer does not map names every such node, before anything
/// is recorded; an opset outside 13–21 and bytes that are not a model are errors too.
#[test]
fn unsupported_ops_and_bad_files_are_named() {
    let node = |op: &str, name: &str| NodeProto {
        op_type: op.into(),
        name: name.into(),
        input: vec!["x".into()],
        output: vec![format!("{name}_out")],
        ..Default::default()
    };
    let model = |version: i64| ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version }],
        graph: Some(GraphProto {
            node: vec![node("Relu", "r"), node("Unique", "e1"), node("Unique", "r2"), node("Unique", "e2")],
            ..Default::default()
        }),
        ..Default::default()
    };
    let path = Path::new("model.onnx");
    let m = OnnxModel::from_bytes(&model(17).encode_to_vec(), path).unwrap();
    let names: Vec<String> = m.unsupported().iter().map(|n| format!("{}:{}", n.op_type, n.name)).collect();
    assert_eq!(names, ["Unique:e1", "Unique:r2", "Unique:e2"]);
    let e = m.import(&GraphBuilder::new(), &BTreeMap::new()).unwrap_err();
    assert!(matches!(&e, OnnxError::Unsupported(n) if n.len() == 3), "{e}");
    assert!(e.to_string().contains("Unique `e1` (ai.onnx opset 17)"), "{e}");
    assert!(matches!(OnnxModel::from_bytes(&model(11).encode_to_vec(), path), Err(OnnxError::Opset(11))));
    assert!(matches!(OnnxModel::from_bytes(b"not a model", path), Err(OnnxError::Format { .. })));
}
