//! Decode steps over a long cache: a step at an early position reads the live part of the
//! cache and writes the new position alone, and a generation that crosses from one compiled
//! cache length to the next gives the tokens of a generation over the whole cache.

use fusegraph::generate::{Generator, Sampling, DECODE_MIN_LIVE};
use fusegraph::nn::{Pretrained, Quantize};
use fusegraph::{CompileOptions, Device, KernelForm, ParamStore};

/// A random GPT-2 of width 16 (4 heads), 2 blocks and 64 tokens: its cache, not its
/// weights, is what a step over a long cache moves.
fn tiny_gpt2(positions: usize, seed: u64) -> (Pretrained, ParamStore) {
    let config = format!(
        r#"{{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 16, "n_head": 4,
            "n_layer": 2, "n_positions": {positions}, "vocab_size": 64}}"#
    );
    let loaded = Pretrained::random(&config, None, Quantize::None, seed).unwrap();
    let store = ParamStore::new(&Device::shared().unwrap());
    store.insert_all(loaded.params.iter()).unwrap();
    (loaded, store)
}

/// At position 16 of a 2,048-position cache a step moves at most a tenth of the bytes of a
/// step at position 2,000 (its attention reads 64 positions of each cache, and every cache
/// write is the one position's window), and both steps' outputs hold the tokens chosen.
#[test]
fn an_early_decode_step_moves_a_tenth_of_a_late_ones_bytes() {
    let (loaded, store) = tiny_gpt2(2048, 1);
    let mut g = Generator::new(&store, loaded.model.clone(), 1, 2048, CompileOptions::default()).unwrap();
    g.stop_at(Vec::new());
    let greedy = Sampling::greedy();
    g.generate(&[vec![3]], 20, &greedy).unwrap();
    let late: Vec<i32> = (0..1995).map(|i| i * 7 % 64).collect();
    let out = g.generate(&[late], 6, &greedy).unwrap();
    assert_eq!(out.tokens[0].len(), 2001);
    let (early, late) = (g.step_executable_at(&greedy, 16).unwrap(), g.step_executable_at(&greedy, 2000).unwrap());
    assert_eq!((g.live_for(16), g.live_for(2000)), (DECODE_MIN_LIVE, 2048));
    let (e, l) = (early.stats().bytes_moved, late.stats().bytes_moved);
    eprintln!("a step moves {e} B at position 16, {l} B at position 2000");
    assert!(e * 10 <= l, "{e} B at position 16 against {l} B at 2000");
    for exe in [early, late] {
        let windows = exe.stats().kernels.iter().filter(|k| k.form == KernelForm::Window).count();
        assert!((2..=4).contains(&windows), "{windows} window kernels");
    }
}

/// Greedy tokens across the cache lengths a generation compiles (64, then 128 of a 256-long
/// cache) equal those of the same generation whose steps attend over the whole cache once
/// past 64 (a cache of 100).
#[test]
fn crossing_cache_lengths_keeps_the_tokens() {
    let prompt: Vec<i32> = (0..50).map(|i| i * 5 % 64).collect();
    let mut tokens = Vec::new();
    for max_seq in [256, 100] {
        let (loaded, store) = tiny_gpt2(256, 2);
        let mut g = Generator::new(&store, loaded.model.clone(), 1, max_seq, CompileOptions::default()).unwrap();
        g.stop_at(Vec::new());
        let out = g.generate(std::slice::from_ref(&prompt), 45, &Sampling::greedy()).unwrap();
        assert_eq!((g.live_for(60), g.live_for(90)), (64, if max_seq == 256 { 128 } else { 100 }));
        tokens.push(out.tokens);
    }
    assert_eq!(tokens[0], tokens[1]);
}
