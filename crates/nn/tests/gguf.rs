//! GGUF files (tests/data/gguf, written by the `gguf` package through
//! scripts/fixtures/make_gguf.py): metadata and every tensor type read, quantized blocks
//! dequantized bit for bit as the package's reference code does; malformed files are
//! typed errors naming the tensor.

use fusegraph_ir::{quant, safetensors, DType, HostTensor};
use fusegraph_nn::gguf::{Gguf, GgufValue};
use fusegraph_nn::{NnError, Pretrained, Quantize};
use std::path::{Path, PathBuf};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/gguf")
}

#[test]
fn every_type_reads_as_the_gguf_package_dequantizes_it() {
    let g = Gguf::open(&data().join("types.gguf")).unwrap();
    assert_eq!(g.version, 3);
    let m = g.metadata();
    assert_eq!(m["general.name"].as_str(), Some("fusegraph types fixture"));
    assert_eq!(m["general.architecture"].as_str(), Some("llama"));
    assert_eq!(m["test.count"].as_u64(), Some(15));
    assert_eq!(m["test.list"], GgufValue::Array(vec![GgufValue::Int(1), GgufValue::Int(2), GgufValue::Int(3)]));
    let reference = safetensors::read(&data().join("types-reference.safetensors")).unwrap();
    let types: Vec<(String, DType)> = g.tensors().iter().map(|t| (t.name.clone(), t.ty)).collect();
    assert_eq!(types.len(), 16, "{types:?}");
    for (name, ty) in types {
        let got = g.tensor(&name).unwrap();
        let want = &reference[&name];
        assert_eq!(got.shape(), want.shape(), "{name}");
        let (got, want) = (got.to_f64(), want.to_f64());
        let differ = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "{name} ({ty:?}): {differ} of {} values differ from the gguf package's", want.len());
        assert!(want.iter().any(|v| *v != 0.0), "{name}: the reference is not all zeros");
    }
    assert!(matches!(g.tensor("nope"), Err(NnError::Gguf { tensor: Some(t), .. }) if t == "nope"));
}

/// The package's Q8_0, Q4_0 (…) and MXFP4 blocks are llama.cpp's reference quantization of the
/// f32 values: `fusegraph_ir::quant::quantize` writes the same bytes, and the file's blocks are
/// held as they are (a block-type host tensor).
#[test]
fn quantizing_writes_the_gguf_packages_blocks() {
    let g = Gguf::open(&data().join("types.gguf")).unwrap();
    let reference = safetensors::read(&data().join("types-reference.safetensors")).unwrap();
    let x: Vec<f32> = reference["f32"].to_f64().iter().map(|&v| v as f32).collect();
    let types = [("q8_0", DType::Q8_0), ("q4_0", DType::Q4_0), ("q5_0", DType::Q5_0), ("q4_1", DType::Q4_1)];
    for (name, dtype) in types.into_iter().chain([("q5_1", DType::Q5_1), ("mxfp4", DType::MXFP4)]) {
        let file = g.tensor(name).unwrap();
        assert_eq!(file.dtype(), dtype);
        let mine = HostTensor::from_blocks(dtype, file.shape().clone(), quant::quantize(dtype, &x).unwrap()).unwrap();
        assert_eq!(mine, file, "{name}: blocks differ from the gguf package's");
    }
}

/// A GGUF file of one tensor `w` (type id `ty`, `dims` innermost first, data `data` at
/// `offset`), version `version`, with `magic`.
fn file(magic: &[u8], version: u32, ty: u32, dims: &[u64], offset: u64, data: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(magic);
    f.extend_from_slice(&version.to_le_bytes());
    f.extend_from_slice(&1u64.to_le_bytes()); // tensors
    f.extend_from_slice(&0u64.to_le_bytes()); // metadata
    f.extend_from_slice(&1u64.to_le_bytes());
    f.push(b'w');
    f.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        f.extend_from_slice(&d.to_le_bytes());
    }
    f.extend_from_slice(&ty.to_le_bytes());
    f.extend_from_slice(&offset.to_le_bytes());
    f.resize(f.len().div_ceil(32) * 32 + offset as usize, 0);
    f.extend_from_slice(data);
    f
}

#[test]
fn malformed_files_are_typed_errors_naming_the_tensor() {
    let dir = std::env::temp_dir().join(format!("fusegraph-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let open = |name: &str, bytes: Vec<u8>| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        Gguf::open(&path)
    };
    let ok = open("ok.gguf", file(b"GGUF", 3, 0, &[4, 2], 0, &[0u8; 32])).unwrap();
    assert_eq!(ok.tensors()[0].dims, vec![2, 4]);
    assert_eq!(ok.tensor("w").unwrap().to_f64(), vec![0.0; 8]);
    let cases: [(&str, Vec<u8>, Option<&str>, &str); 5] = [
        ("magic.gguf", file(b"GGML", 3, 0, &[4, 2], 0, &[0u8; 32]), None, "magic"),
        ("version.gguf", file(b"GGUF", 4, 0, &[4, 2], 0, &[0u8; 32]), None, "version 4"),
        ("type.gguf", file(b"GGUF", 3, 99, &[4, 2], 0, &[0u8; 32]), Some("w"), "type id 99"),
        ("misaligned.gguf", file(b"GGUF", 3, 0, &[4, 2], 4, &[0u8; 32]), Some("w"), "alignment"),
        ("truncated.gguf", file(b"GGUF", 3, 0, &[4, 2], 0, &[0u8; 20]), Some("w"), "past the file's end"),
    ];
    for (name, bytes, tensor, says) in cases {
        match open(name, bytes) {
            Err(e @ NnError::Gguf { .. }) => {
                let NnError::Gguf { tensor: t, .. } = &e else { unreachable!() };
                assert_eq!(t.as_deref(), tensor, "{name}: {e}");
                assert!(e.to_string().contains(says), "{name}: {e}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    // A quantized tensor whose elements are not whole blocks.
    let e = open("blocks.gguf", file(b"GGUF", 3, 8, &[40], 0, &[0u8; 64])).unwrap_err().to_string();
    assert!(e.contains("`w`") && e.contains("blocks"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A tensor whose shape disagrees with the model the metadata describes (here
/// `llama.feed_forward_length` changed in a copy of a fixture) is a typed error naming the
/// file's tensor and the parameter, for dequantized and packed weights alike, and an
/// architecture not read is one naming the field; nothing is returned.
#[test]
fn a_tensor_the_model_does_not_fit_is_named() {
    let dir = std::env::temp_dir().join(format!("fusegraph-gguf-shape-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["llama-tiny-f32.gguf", "llama-tiny-q4_0.gguf"] {
        let mut bytes = std::fs::read(data().join(file)).unwrap();
        let key = b"llama.feed_forward_length";
        let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
        assert_eq!(u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()), 4, "a uint32 value");
        let value = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap());
        bytes[at + 4..at + 8].copy_from_slice(&(value + 32).to_le_bytes());
        let path = dir.join(file);
        std::fs::write(&path, bytes).unwrap();
        match Pretrained::load(&path, None, Quantize::AsStored).map(|_| ()) {
            Err(NnError::KeyShape { key, param, .. }) => {
                assert!(key.contains("ffn_") && param.contains("mlp."), "{file}: {key} for {param}");
            }
            other => panic!("{file}: {other:?}"),
        }
    }
    // An architecture the reader does not map (`general.architecture` changed to `gemma`).
    let mut bytes = std::fs::read(data().join("llama-tiny-f32.gguf")).unwrap();
    let key = b"general.architecture";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4 + 8;
    assert_eq!(&bytes[at..at + 5], b"llama");
    bytes[at..at + 5].copy_from_slice(b"gemma");
    let path = dir.join("gemma.gguf");
    std::fs::write(&path, bytes).unwrap();
    match Pretrained::load(&path, None, Quantize::AsStored).map(|_| ()) {
        Err(NnError::ConfigField { field, value, supported }) => {
            assert_eq!((field.as_str(), value.as_str()), ("general.architecture", "gemma"));
            assert!(supported.contains("llama") && supported.contains("qwen2"), "{supported}");
        }
        other => panic!("gemma: {other:?}"),
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
