//! Parameter creation, seeding and safetensors round trips.

mod common;

use common::{at, init};
use fusegraph_ir::safetensors::SafetensorsError;
use fusegraph_ir::{f16, DType, GraphBuilder, HostTensor, TensorType};
use fusegraph_nn::{Init, Linear, NnError, Params};
use std::path::PathBuf;

fn temp_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("fusegraph-nn-{tag}-{}.safetensors", std::process::id()))
}

#[test]
fn parameters_are_seeded_and_reused() {
    let build = |seed| {
        let mut p = Params::new(seed);
        init(&mut p, Linear::new(&at("a"), 3, 4, true)).unwrap();
        init(&mut p, Linear::new(&at("b"), 4, 2, false)).unwrap();
        p
    };
    let (p1, p2, p3) = (build(1), build(1), build(2));
    assert_eq!(p1.as_map(), p2.as_map());
    assert_ne!(p1.get("a.weight"), p3.get("a.weight"));
    assert_eq!(p1.len(), 3);
    assert!(!p1.is_empty());
    assert_eq!(p1.num_elements(), 12 + 4 + 8);
    assert_eq!(p1.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["a.bias", "a.weight", "b.weight"]);
    // Kaiming uniform bound 1/sqrt(fan_in).
    let bound = 1.0 / 3f32.sqrt();
    assert!(p1.get("a.weight").unwrap().as_slice::<f32>().unwrap().iter().all(|v| v.abs() <= bound));

    // A second build with the same Params keeps the values; a mismatched type is an error.
    let mut p = p1.clone();
    let b = GraphBuilder::new();
    let w = p.parameter(&b, "a.weight", DType::F32, &[3, 4], Init::Zeros).unwrap();
    assert_eq!(w.dims(), &[3, 4]);
    assert_eq!(p.as_map(), p1.as_map());
    match p.parameter(&b, "a.weight", DType::F32, &[4, 3], Init::Zeros) {
        Err(NnError::Shape { name, expected, got }) => {
            assert_eq!(name, "a.weight");
            assert_eq!(expected, TensorType::new(DType::F32, [4, 3]));
            assert_eq!(got, TensorType::new(DType::F32, [3, 4]));
        }
        other => panic!("expected a shape error, got {other:?}"),
    }
    assert!(p.parameter(&b, "", DType::F32, &[1], Init::Zeros).is_err());
    assert!(p.parameter(&b, "z", DType::F32, &[2], Init::KaimingUniform { fan_in: 0 }).is_err());
    assert!(p.get("z").is_none());
    let x = p.parameter(&b, "x", DType::F16, &[2, 2], Init::XavierUniform { fan_in: 2, fan_out: 2 }).unwrap();
    assert_eq!(x.dtype(), DType::F16);
    assert_eq!(p.get("x").unwrap().dtype(), DType::F16);
}

#[test]
fn safetensors_round_trip() {
    let mut p = Params::new(3);
    init(&mut p, Linear::new(&at("fc"), 3, 5, true)).unwrap();
    p.insert("half", HostTensor::new([2], vec![f16::from_f32(1.5), f16::from_f32(-2.0)]).unwrap());
    p.insert("ints", HostTensor::new([3], vec![-1i32, 0, 7]).unwrap());
    p.insert("uints", HostTensor::new([1, 2], vec![3u32, u32::MAX]).unwrap());
    p.insert("mask", HostTensor::new([3], vec![true, false, true]).unwrap());
    p.insert("scalar", HostTensor::new(Vec::<usize>::new(), vec![4.25f32]).unwrap());
    let path = temp_path("roundtrip");
    p.save_safetensors(&path).unwrap();

    // Into an empty set: every tensor is added.
    let mut fresh = Params::new(0);
    fresh.load_safetensors(&path).unwrap();
    assert_eq!(fresh.as_map(), p.as_map());

    // Into a set built by the same layers with another seed: the values are replaced.
    let mut other = Params::new(99);
    init(&mut other, Linear::new(&at("fc"), 3, 5, true)).unwrap();
    assert_ne!(other.get("fc.weight"), p.get("fc.weight"));
    other.load_safetensors(&path).unwrap();
    assert_eq!(other.as_map(), p.as_map());
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn loading_checks_types_and_presence() {
    let path = temp_path("wrong");
    let mut saved = Params::new(0);
    saved.insert("fc.weight", HostTensor::new([2, 3], vec![0.0f32; 6]).unwrap());
    saved.save_safetensors(&path).unwrap();

    let mut p = Params::new(1);
    init(&mut p, Linear::new(&at("fc"), 3, 2, false)).unwrap();
    let before = p.clone();
    match p.load_safetensors(&path) {
        Err(NnError::Shape { name, expected, got }) => {
            assert_eq!(name, "fc.weight");
            assert_eq!(expected.shape.dims(), &[3, 2]);
            assert_eq!(got.shape.dims(), &[2, 3]);
        }
        other => panic!("expected a shape error, got {other:?}"),
    }
    assert_eq!(p.as_map(), before.as_map(), "a failed load changes nothing");

    // A wrong dtype is a shape (type) error too.
    let mut wrong_dtype = Params::new(0);
    wrong_dtype.insert("fc.weight", HostTensor::new([3, 2], vec![0i32; 6]).unwrap());
    wrong_dtype.save_safetensors(&path).unwrap();
    assert!(matches!(p.load_safetensors(&path), Err(NnError::Shape { .. })));

    // A parameter absent from the file is reported.
    let mut other = Params::new(0);
    other.insert("something.else", HostTensor::new([1], vec![1.0f32]).unwrap());
    other.save_safetensors(&path).unwrap();
    match p.load_safetensors(&path) {
        Err(NnError::Missing { name }) => assert_eq!(name, "fc.weight"),
        other => panic!("expected a missing error, got {other:?}"),
    }

    // Garbage and absent files are errors, not panics.
    std::fs::write(&path, b"not a safetensors file").unwrap();
    assert!(matches!(p.load_safetensors(&path), Err(NnError::Checkpoint(SafetensorsError::Format(_)))));
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(p.load_safetensors(&path), Err(NnError::Checkpoint(SafetensorsError::Io { .. }))));
}
