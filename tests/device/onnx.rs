//! ONNX models exported by `torch.onnx.export` (tests/data/onnx, written by
//! scripts/fixtures/make_onnx.py) — a CNN, an MLP, torchvision's MobileNetV3-small (a
//! quarter of its width), and a tiny BERT and GPT-2 as `transformers` builds them — run
//! fused on the device and give ONNX Runtime's outputs, in fewer kernels than unfused.

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
    for name in ["cnn", "mlp", "mobilenet_v3_small", "bert_tiny", "gpt2_tiny"] {
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
    }
}
