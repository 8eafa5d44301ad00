//! Decode steps over a long cache: a step at an early position reads the live part of the
//! cache and writes the new position alone, and a generation that crosses from one compiled
//! cache length to the next gives the tokens of a generation over the whole cache.

use fusegraph::generate::{Generator, Sampling, DECODE_MIN_LIVE};
use fusegraph::nn::{Pretrained, Quantize};
use fusegraph::{CompileOptions, Device, HostTensor, ParamStore};

/// A random GPT-2 of width 16 (4 heads), 2 blocks and 64 tokens: its cache, not its
/// weights, is what a step over a long cache moves. Its weights are `transformers`' initial
/// ones times 10 but for the layer norms', so that its tokens depend on what it attends to
/// (at the initial scale, the last token alone nearly decides the next).
fn tiny_gpt2(positions: usize, seed: u64) -> (Pretrained, ParamStore) {
    let config = format!(
        r#"{{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 16, "n_head": 4,
            "n_layer": 2, "n_positions": {positions}, "vocab_size": 64}}"#
    );
    let mut loaded = Pretrained::random(&config, None, Quantize::None, seed).unwrap();
    for (name, t) in loaded.params.iter_mut() {
        if !name.contains("ln") {
            let scaled: Vec<f32> = t.as_slice::<f32>().unwrap().iter().map(|v| v * 10.0).collect();
            *t = HostTensor::new(t.shape().dims().to_vec(), scaled).unwrap();
        }
    }
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
        let windows = exe.stats().kernels.iter().filter(|k| k.windows).count();
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

/// Continuous batching: sequences join a batch of 3 rows between steps (a fourth waits for a
/// row), each through a prefill of its row that chooses its first token, one leaves early and
/// its row serves the next, the steps report every token once, and each sequence that ends
/// has the greedy tokens it gets alone (`Generator::generate` at batch 1: a prefill, then
/// steps).
#[test]
fn sequences_joining_and_leaving_a_batch_get_the_tokens_they_get_alone() {
    let (loaded, store) = tiny_gpt2(128, 3);
    let greedy = Sampling::greedy();
    let prompts: Vec<(Vec<i32>, usize)> =
        vec![(vec![1, 2, 3], 12), (vec![5; 7], 20), (vec![9, 8], 6), ((1..13).collect(), 15), (vec![30, 31], 9)];
    let alone: Vec<Vec<i32>> = prompts
        .iter()
        .map(|(p, n)| {
            let mut g = Generator::new(&store, loaded.model.clone(), 1, 128, CompileOptions::default()).unwrap();
            g.stop_at(Vec::new());
            g.generate(std::slice::from_ref(p), *n, &greedy).unwrap().tokens.remove(0)
        })
        .collect();
    let mut g = Generator::new(&store, loaded.model.clone(), 3, 128, CompileOptions::default()).unwrap();
    g.stop_at(Vec::new());
    let mut batch = g.batcher(&greedy).unwrap();
    let mut ids = vec![batch.join(prompts[0].0.clone(), prompts[0].1).unwrap()];
    ids.push(batch.join(prompts[1].0.clone(), prompts[1].1).unwrap());
    // A sequence that leaves after a few steps, its row then taken by another.
    let cancelled = batch.join(vec![7, 7, 7], 50).unwrap();
    let mut done = std::collections::BTreeMap::new();
    let mut waiting: Vec<usize> = vec![2, 3, 4];
    let mut reported = 0;
    for step in 0..200 {
        if step == 4 {
            assert_eq!(
                batch.leave(cancelled).map(|t| t.len()),
                Some(8),
                "its 3 prompt tokens, the prefill's token and one a step for 4 steps"
            );
        }
        while batch.free_rows() > 0 && !waiting.is_empty() && step >= 2 {
            let i = waiting.remove(0);
            ids.push(batch.join(prompts[i].0.clone(), prompts[i].1).unwrap());
        }
        reported += batch.step().unwrap().len();
        done.extend(batch.take_finished());
        if batch.active() == 0 && waiting.is_empty() {
            break;
        }
    }
    assert!(batch.join(vec![], 1).is_err() && batch.join(vec![1000], 1).is_err());
    assert_eq!(done.len(), prompts.len());
    assert_eq!(reported, prompts.iter().map(|p| p.1).sum::<usize>() + 5, "the cancelled one's 5 included");
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(done[id], alone[i], "sequence {i}");
    }
}

/// Steps submitted before the last one's ids are read (each fed its ids on the device) give
/// the tokens of steps fed from the host, greedy and sampled, at batch 2, with an
/// end-of-sequence token ending the generation early (a step already submitted then runs
/// unread).
#[test]
fn overlapped_steps_give_the_tokens_of_steps_fed_from_the_host() {
    let (loaded, store) = tiny_gpt2(128, 4);
    let prompts = vec![vec![3, 1, 4, 1, 5], vec![9, 2, 6, 5, 3]];
    let sampled = Sampling { temperature: 0.9, top_k: Some(20), top_p: Some(0.95), seed: 7 };
    for sampling in [Sampling::greedy(), sampled] {
        let run = |overlap: bool, stop: Vec<i32>| {
            let mut g = Generator::new(&store, loaded.model.clone(), 2, 128, CompileOptions::default()).unwrap();
            g.stop_at(stop);
            g.overlap_steps(overlap);
            let out = g.generate(&prompts, 30, &sampling).unwrap();
            assert_eq!(out.step_ms.len() + 1, out.tokens.iter().map(|t| t.len() - 5).max().unwrap());
            out.tokens
        };
        let free = run(false, Vec::new());
        assert_eq!(free, run(true, Vec::new()), "{sampling:?}");
        // Each sequence's eighth new token as an end: both end by it, the generation early.
        let stop = vec![free[0][12], free[1][12]];
        let ended = run(false, stop.clone());
        assert!(ended.iter().all(|t| t.len() <= 13), "{ended:?}");
        assert_eq!(ended, run(true, stop), "{sampling:?}");
    }
}
