//! `largest_batch` answers for the graph `compile` will build: the same stages (mixed
//! precision, split-k, split reductions, rematerialization) for the planner query and the
//! compile. For every mix of those options on a transformer (inference), and for four
//! mixes on its training step: the batch it returns compiles under the limit, and one more
//! fails with the typed `ResourceExhausted`.

use fusegraph::nn::{Adam, Params};
use fusegraph::train::{build_step, TrainOptions};
use fusegraph::{CompileOptions, Device, DeviceOptions, GraphBuilder, Recorded, RuntimeError, SplitK, SplitReductions};
use fusegraph_workloads::demo::{lm, lm_model};
use std::sync::Arc;

/// A 1-block GPT (width 64, MLP 256: its down-projection's `k` splits in two), sequence 16.
fn model() -> fusegraph::nn::Gpt {
    lm_model(32, 16, 64, 2, 256, 1).expect("a model")
}

/// The model's logits and loss at `batch` (no updates).
fn inference(batch: usize) -> Result<Recorded, String> {
    let model = model();
    let b = GraphBuilder::new();
    let objective = lm(&b, &model, batch, 16).map_err(|e| e.to_string())?;
    Ok(Recorded { graph: b.graph(), outputs: vec![objective.output.id(), objective.loss.id()], updates: vec![] })
}

/// The model's training step with Adam at `batch`: its updates write the weights and moments.
fn training(batch: usize) -> Result<Recorded, String> {
    let model = model();
    let mut params = Params::of(&model, 0).map_err(|e| e.to_string())?;
    let b = GraphBuilder::new();
    let objective = lm(&b, &model, batch, 16).map_err(|e| e.to_string())?;
    let step = build_step(&b, &mut params, &objective, &Adam::new(1e-3), &TrainOptions::default())
        .map_err(|e| e.to_string())?;
    Ok(step.recorded())
}

/// Every mix of mixed precision, split reductions, split-k and rematerialization (`all`),
/// or four that turn each on and off at least once, and all four together (for the training
/// step, whose every plan and compile is a few times the inference's).
fn mixes(all: bool) -> Vec<CompileOptions> {
    let mut out = Vec::new();
    for mixed_precision in [false, true] {
        for split_reductions in [SplitReductions::Off, SplitReductions::Adapter] {
            for split_k in [SplitK::Off, SplitK::Fill { workgroups: 64 }] {
                for remat in [false, true] {
                    let on = [mixed_precision, split_reductions != SplitReductions::Off, split_k != SplitK::Off, remat];
                    // Kept when not `all`: none, all, mixed precision with split
                    // reductions, split-k with remat.
                    let kept = [[false; 4], [true; 4], [true, true, false, false], [false, false, true, true]];
                    if all || kept.contains(&on) {
                        out.push(CompileOptions {
                            mixed_precision,
                            split_reductions,
                            split_k,
                            remat,
                            ..Default::default()
                        });
                    }
                }
            }
        }
    }
    out
}

/// Checks every mix of [`mixes`] under the limit that batch 16 needs with the default
/// options (so each answer is somewhere between a few and a hundred).
fn check(name: &str, build: fn(usize) -> Result<Recorded, String>, all: bool) {
    // Nothing measured: the answers are about memory, and tilings do not change it.
    let options = DeviceOptions { autotune: Some(false), ..Default::default() };
    let device = Arc::new(Device::new(&options).expect("a device"));
    const MAX: usize = 128;
    let at16 = build(16).unwrap();
    let opts = CompileOptions { updates: at16.updates.clone(), ..Default::default() };
    let limit = fusegraph::crates::passes::held_bytes(&device.plan(&at16.graph, &at16.outputs, &opts).unwrap());
    for opts in mixes(all) {
        let what = format!(
            "{name}, mixed precision {}, split reductions {:?}, split-k {:?}, remat {}",
            opts.mixed_precision, opts.split_reductions, opts.split_k, opts.remat
        );
        let batch = device.largest_batch(build, limit, &opts, MAX).unwrap().unwrap_or_else(|| panic!("{what}: none"));
        assert!(batch < MAX, "{what}: the limit should bind");
        let limited =
            |r: &Recorded| CompileOptions { memory_limit: Some(limit), updates: r.updates.clone(), ..opts.clone() };
        let fits = build(batch).unwrap();
        let exe = device.compile(&fits.graph, &fits.outputs, &limited(&fits));
        assert!(exe.is_ok(), "{what}: batch {batch} should compile under {limit} bytes: {:?}", exe.err());
        let over = build(batch + 1).unwrap();
        let err = device.compile(&over.graph, &over.outputs, &limited(&over)).err();
        assert!(
            matches!(err, Some(RuntimeError::ResourceExhausted { .. })),
            "{what}: batch {} should not fit {limit} bytes: {err:?}",
            batch + 1
        );
        eprintln!("{what}: largest batch {batch}");
    }
}

#[test]
fn the_largest_batch_of_a_transformer_compiles_and_one_more_does_not() {
    check("transformer", inference, true);
}

#[test]
fn the_largest_batch_of_a_training_step_compiles_and_one_more_does_not() {
    check("training step", training, false);
}

/// `plan` is the compile's plan: for every quick bench workload (the micro kernels, the
/// example networks and both training steps, their updates included), unfused and fused,
/// with and without mixed precision, the planner's figures equal the compiled executable's.
#[test]
fn plan_equals_the_compiled_executables_memory() {
    let device = Arc::new(Device::new(&Default::default()).expect("a device"));
    for w in fusegraph_workloads::all(true) {
        for base in [CompileOptions::default(), CompileOptions::unfused()] {
            for mixed_precision in [false, true] {
                let opts = CompileOptions { updates: w.updates.clone(), mixed_precision, ..base.clone() };
                let what = format!("{} ({:?}, mixed precision {mixed_precision})", w.name, opts.fusion);
                let plan = device.plan(&w.graph, &w.outputs, &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
                let exe = device.compile(&w.graph, &w.outputs, &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
                let s = exe.stats();
                let compiled = (s.persistent_bytes, s.arena_bytes, s.staging_bytes, s.kernels.len());
                let planned = (plan.persistent_bytes, plan.arena_bytes, plan.staging_bytes, plan.kernels);
                assert_eq!(planned, compiled, "{what}: (persistent, arena, staging, kernels)");
                assert_eq!(plan.lower_bound_bytes, s.lower_bound_bytes, "{what}");
            }
        }
    }
}
