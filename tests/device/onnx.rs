//! ONNX models exported by `torch.onnx.export` (tests/data/onnx, written by
//! scripts/fixtures/make_onnx.py) — a CNN, an MLP, torchvision's MobileNetV3-small and
//! ResNet-18 (a quarter of their widths), and a tiny BERT and GPT-2 as `transformers` builds
//! them — run fused on the device and give ONNX Runtime's outputs, in fewer kernels than
//! unfused; and ONNX's backend node cases run fused on the device.

#[path = "../../crates/onnx/tests/common/node_case.rs"]
mod node_case;

use fusegraph::crates::ir::safetensors;
use fusegraph::onnx::OnnxModel;
use fusegraph::{CompileOptions, Device, FusionMode, GraphBuilder, HostTensor, ParamStore};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/onnx")
}

#[test]
fn exported_models_run_fused_and_give_onnx_runtimes_outputs() {
    for name in ["cnn", "mlp", "mobilenet_v3_small", "resnet18", "bert_tiny", "gpt2_tiny"] {
        let model = OnnxModel::open(&data().join(format!("{name}.onnx"))).unwrap();
        let io = safetensors::read(&data().join(format!("{name}-io.safetensors"))).unwrap();
        let feeds: BTreeMap<String, HostTensor> =
            io.iter().filter_map(|(k, v)| Some((k.strip_prefix("input:")?.to_string(), v.clone()))).collect();
        let b = GraphBuilder::new();
        let imported = model.import_for(&b, &feeds).unwrap();
        let store = ParamStore::new(&Device::shared().unwrap());
        store.insert_all(imported.params.iter()).unwrap();
        let ids: Vec<_> = imported.outputs.iter().map(|(_, t)| t.id()).collect();
        let mut kernels = Vec::new();
        for fusion in [FusionMode::Off, FusionMode::On] {
            let opts = CompileOptions { fusion, ..Default::default() };
            let exe = store.compile(&b.graph(), &ids, &opts).unwrap();
            kernels.push(exe.stats().kernels.len());
            let run: Vec<(&str, &HostTensor)> = feeds.iter().map(|(k, v)| (k.as_str(), v)).collect();
            let outs = exe.run(&run).unwrap();
            for ((out, _), got) in imported.outputs.iter().zip(&outs) {
                let want = &io[&format!("output:{out}")];
                let (g, w) = (got.to_f64(), want.to_f64());
                let scale = w.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
                let err = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / scale;
                assert!(err < 1e-4, "{name} ({fusion:?}): {out} differs from ONNX Runtime's by {err:.2e}");
            }
        }
        eprintln!("{name}: {} kernels unfused, {} fused", kernels[0], kernels[1]);
        assert!(kernels[1] < kernels[0], "{name}: {kernels:?}");
        // ResNet-18's 20 convolutions, each with its batch norm and activation (and the
        // residual add) fused in, its pooling and its head: at most 30 kernels.
        assert!(name != "resnet18" || kernels[1] <= 30, "{name}: {kernels:?}");
    }
}

/// ONNX's backend node cases, compiled fused on the device, give their expected outputs:
/// every case the crate's node test passes (through the CPU reference) in this adapter's
/// kernel forms, and those of the ops whose import is most composite — `Resize` in every
/// mode, pooling (ceil_mode, dilations, 3-D, MaxPool's Indices), `Einsum` (diagonals) and
/// `BatchNormalization` in training mode — in a GPU's forms too.
#[test]
fn node_cases_run_fused_on_the_device() {
    let dir = data().join("node");
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("index.json")).unwrap()).unwrap();
    let failing = node_case::expected_failures(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/onnx/tests/expected-failures.txt"),
    );
    let composite = ["Resize", "MaxPool", "AveragePool", "Einsum", "BatchNormalization"];
    let cases: Vec<(&String, bool)> = index
        .as_object()
        .unwrap()
        .iter()
        .filter(|(n, e)| e.get("left_out").is_none() && !failing.contains_key(n.as_str()))
        .map(|(n, e)| (n, composite.contains(&e["op"].as_str().unwrap_or(""))))
        .collect();
    assert!(cases.len() >= 670 && cases.iter().filter(|c| c.1).count() >= 75, "{} cases", cases.len());
    let gpu_forms = std::sync::Arc::new(
        Device::new(&fusegraph::DeviceOptions { gpu_kernels: true, ..Default::default() }).unwrap(),
    );
    let (mut failures, mut ran) = (Vec::new(), 0);
    for (device, all) in [(Device::shared().unwrap(), true), (gpu_forms, false)] {
        for (name, _) in cases.iter().filter(|c| all || c.1) {
            ran += 1;
            let outcome = node_case::load(&dir, name).and_then(|case| {
                let store = ParamStore::new(&device);
                store.insert_all(case.params.iter()).map_err(|e| e.to_string())?;
                let exe =
                    store.compile(&case.graph, &case.outputs, &CompileOptions::default()).map_err(|e| e.to_string())?;
                let feeds: Vec<(&str, &HostTensor)> = case.feeds.iter().map(|(k, v)| (k.as_str(), v)).collect();
                node_case::check(&case, &exe.run(&feeds).map_err(|e| e.to_string())?)
            });
            if let Err(e) = outcome {
                failures.push(format!("{name} ({}): {e}", device.describe()));
            }
        }
    }
    assert!(failures.is_empty(), "{} of {ran} failed:\n{}", failures.len(), failures.join("\n"));
}
