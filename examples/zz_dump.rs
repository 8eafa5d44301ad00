use fusegraph::nn::{Pretrained, Quantize};
use fusegraph::{DType, GraphBuilder};
fn main() {
    let config = std::fs::read_to_string("tests/data/configs/gpt2-124m.json").unwrap();
    let loaded = Pretrained::random(&config, Some(DType::F16), Quantize::None, 0).unwrap();
    let model = loaded.model;
    let (layers, heads, dh) = model.cache_shape();
    let b = GraphBuilder::new();
    let ids = b.input("ids", DType::I32, [1, 1]).unwrap();
    let pos = b.input("pos", DType::I32, [1]).unwrap();
    let cache: Vec<_> = (0..layers)
        .map(|i| {
            (
                b.parameter(&format!("kv_cache.b1.{i}.k"), DType::F32, [1, heads, 64, dh]).unwrap(),
                b.parameter(&format!("kv_cache.b1.{i}.v"), DType::F32, [1, heads, 64, dh]).unwrap(),
            )
        })
        .collect();
    let (logits, updated) = model.decode(&ids, &pos, &cache, 64).unwrap();
    let last = logits.reshape([1, model.vocab_size()]).unwrap().argmax(1, false).unwrap();
    let mut p = fusegraph::text::Program { graph: b.graph(), outputs: vec![last.id()], updates: vec![] };
    for (i, (k, v)) in updated.iter().enumerate() {
        p.updates.push((format!("kv_cache.b1.{i}.k"), k.id()));
        p.updates.push((format!("kv_cache.b1.{i}.v"), v.id()));
    }
    print!("{}", fusegraph::text::print_program(&p));
}
