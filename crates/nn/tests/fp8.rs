//! FP8 checkpoints (`transformers`' fine-grained `fp8`, as DeepSeek-V3's, Kimi K2's and the
//! `-FP8` releases store their weights; compressed-tensors' per-tensor and per-channel FP8):
//! read as the values they stand for, the scales and activation scales not left as unknown
//! keys, a scale that fits no layout an error naming both tensors.

mod common;

use common::{checkpoints, prefill_logits, reference, relative_error};
use fusegraph_ir::DType;
use fusegraph_nn::{Checkpoint, Pretrained, Quantize};
use safetensors::tensor::TensorView;
use safetensors::Dtype;

/// `qwen3-fp8-tiny` (`scripts/fixtures/make_llama.py qwen3-fp8`: qwen3-tiny's projections in
/// FP8 blocks of 32 × 32) gives the logits of the values its blocks stand for — the logits
/// `transformers` gives after loading the directory — within 1e-4, on the CPU reference.
#[test]
fn an_fp8_checkpoint_gives_the_logits_of_its_values() {
    let dir = checkpoints().join("qwen3-fp8-tiny");
    let ck = Checkpoint::open(&dir).unwrap();
    assert!(ck.keys().iter().all(|k| !k.ends_with("_scale_inv")), "the scales go with their weights");
    let q = ck.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.dtype(), DType::F32);
    let loaded = Pretrained::load(&dir, None, Quantize::AsStored).unwrap();
    let (prompt, want) = reference(&checkpoints().join("qwen3-fp8-tiny-reference.json"));
    let err = relative_error(&prefill_logits(&loaded, &prompt), &want);
    assert!(err < 1e-4, "logits {err:.2e} from the reference's");
}

/// A file of FP8 weights with each layout of scales: per block (`weight_scale_inv`, blocks of
/// 2 × 2, the last ones partial), per tensor and per output row (compressed-tensors'
/// `weight_scale`, beside an `input_scale` that is dropped); and one whose scales fit none.
#[test]
fn fp8_scales_apply_per_block_tensor_and_row() {
    // E4M3 bytes: 1.0, 2.0, -0.5, 448.
    let code = |v: f32| match v {
        1.0 => 0x38u8,
        2.0 => 0x40,
        -0.5 => 0xb0,
        _ => 0x7e,
    };
    let values = [1.0f32, 2.0, -0.5, 448.0, 1.0, 1.0, 2.0, 2.0, 448.0, -0.5, 1.0, 2.0, 1.0, 1.0, 1.0];
    let w: Vec<u8> = values.iter().map(|&v| code(v)).collect();
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (blocks, one, rows, bad) = (
        f32s(&[1.0, 10.0, 100.0, 1000.0, 1e4, 1e5]),
        f32s(&[0.5]),
        f32s(&[1.0, 2.0, 3.0]),
        f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
    );
    fn view(dtype: Dtype, shape: Vec<usize>, data: &[u8]) -> TensorView<'_> {
        TensorView::new(dtype, shape, data).unwrap()
    }
    let tensors = vec![
        ("a.weight", view(Dtype::F8_E4M3, vec![3, 5], &w)),
        ("a.weight_scale_inv", view(Dtype::F32, vec![2, 3], &blocks)),
        ("b.weight", view(Dtype::F8_E4M3, vec![3, 5], &w)),
        ("b.weight_scale", view(Dtype::F32, vec![1], &one)),
        ("b.input_scale", view(Dtype::F32, vec![1], &one)),
        ("c.weight", view(Dtype::F8_E4M3, vec![3, 5], &w)),
        ("c.weight_scale", view(Dtype::F32, vec![3, 1], &rows)),
        ("d.weight", view(Dtype::F8_E4M3, vec![3, 5], &w)),
        ("d.weight_scale_inv", view(Dtype::F32, vec![3, 2], &bad)),
    ];
    let path = std::env::temp_dir().join(format!("fusegraph-fp8-{}.safetensors", std::process::id()));
    std::fs::write(&path, safetensors::serialize(tensors, None).unwrap()).unwrap();
    let ck = Checkpoint::open(&path).unwrap();
    assert_eq!(ck.keys(), ["a.weight", "b.weight", "c.weight", "d.weight"]);
    let block_scale = [[1.0, 10.0, 100.0], [1000.0, 1e4, 1e5]];
    let get = |k: &str| ck.tensor(k).unwrap().to_f64();
    for (r, c) in (0..3).flat_map(|r| (0..5).map(move |c| (r, c))) {
        let v = values[r * 5 + c] as f64;
        assert_eq!(get("a.weight")[r * 5 + c], v * block_scale[r / 2][c / 2], "a[{r}, {c}]");
        assert_eq!(get("b.weight")[r * 5 + c], v * 0.5, "b[{r}, {c}]");
        assert_eq!(get("c.weight")[r * 5 + c], v * (r + 1) as f64, "c[{r}, {c}]");
    }
    let err = ck.tensor("d.weight").unwrap_err().to_string();
    assert!(err.contains("d.weight_scale_inv") && err.contains("FP8 d.weight"), "{err}");
    std::fs::remove_file(path).unwrap();
}
