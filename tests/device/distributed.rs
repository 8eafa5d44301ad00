//! Data parallelism's two executables on one rank ([`Single`]): the same losses, weights and
//! optimizer state as the single-process trainer, sharded or not, with accumulation and loss
//! scaling; checkpoints a trainer resumes from; typed errors. The multi-process runs are in
//! `tests/mpi.rs` (feature `mpi`).

use fusegraph::crates::nn::Params;
use fusegraph::distributed::{DataParallel, DistributedOptions, Single, GRAD_ACC};
use fusegraph::train::{Adam, LossScaling, TrainOptions, Trainer};
use fusegraph::{Device, GraphBuilder, HostTensor, ParamStore};
use fusegraph_workloads::demo::{self, Config, Setup, Task};
use std::collections::BTreeMap;

fn config(options: TrainOptions) -> Config {
    config_of(Task::Mlp, options)
}

fn config_of(task: Task, options: TrainOptions) -> Config {
    Config { options, ..Config::new(task, true) }
}

fn data_parallel<'c>(setup: &Setup, cfg: &Config, dist: &DistributedOptions, params: &mut Params) -> DataParallel<'c> {
    let b = GraphBuilder::new();
    let objective = setup.model.objective(&b, setup.batch()).unwrap();
    let store = ParamStore::new(&Device::shared().unwrap());
    DataParallel::new(&store, &b, params, &objective, &Adam::new(cfg.lr), &cfg.options, dist, &Single).unwrap()
}

fn feeds(setup: &Setup, i: usize) -> Vec<(String, HostTensor)> {
    setup.feeds(i).unwrap()
}

fn refs(f: &[(String, HostTensor)]) -> Vec<(&str, &HostTensor)> {
    f.iter().map(|(k, v)| (k.as_str(), v)).collect()
}

/// ‖a − b‖ / ‖b‖ of every tensor `b` holds, at most `tol`.
fn assert_same(a: &BTreeMap<String, HostTensor>, b: &BTreeMap<String, HostTensor>, tol: f64, what: &str) {
    for (name, want) in b {
        let got = a.get(name).unwrap_or_else(|| panic!("{what}: `{name}` missing"));
        let (g, w) = (got.to_f64(), want.to_f64());
        let diff: f64 = g.iter().zip(&w).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
        let norm: f64 = w.iter().map(|y| y * y).sum::<f64>().sqrt().max(1e-30);
        assert!(diff / norm <= tol, "{what}: `{name}` differs by {:.3e} relative", diff / norm);
    }
}

/// Trains `steps` optimizer steps with the trainer and with one rank's data parallelism
/// from the same start; checks losses, flags, weights and (unsharded) optimizer state.
/// Returns the windows whose update was skipped.
fn matches_the_trainer(task: Task, options: TrainOptions, shard: bool, tol: f64) -> usize {
    let cfg = config_of(task, options);
    let setup = demo::build(&cfg).unwrap();
    let mut trainer = Trainer::new(&Device::shared().unwrap(), setup.step.clone(), &setup.params).unwrap();
    let mut params = Params::of(setup.model.module(), cfg.seed).unwrap();
    // Small buckets: the gradient vector is summed in many pieces.
    let dist =
        DistributedOptions { shard_optimizer: shard, bucket_bytes: 4096, check_replicas: true, ..Default::default() };
    let mut dp = data_parallel(&setup, &cfg, &dist, &mut params);
    let n = cfg.options.accumulate;
    let (mut window, mut skipped) = (Vec::new(), 0);
    for i in 0..4 * n {
        let f = feeds(&setup, i);
        let t = trainer.step(&refs(&f)).unwrap();
        let d = dp.step(&refs(&f)).unwrap();
        assert!((t.loss - d.loss).abs() <= tol as f32 * t.loss.abs(), "micro-batch {i}: {} vs {}", t.loss, d.loss);
        assert_eq!((t.window_end, t.applied), (d.window_end, d.applied), "micro-batch {i}");
        window.push(t.loss);
        match d.global_loss {
            Some(g) => {
                skipped += usize::from(!d.applied);
                let mean = window.drain(..).sum::<f32>() / n as f32;
                assert!((g - mean).abs() <= 1e-5 * mean.abs(), "window loss {g} vs {mean}");
            }
            None => assert!(!d.window_end),
        }
    }
    let names: Vec<String> = setup.step.trained.clone();
    let want = trainer.store().read(&names).unwrap();
    assert_same(&dp.store().read(&names).unwrap(), &want, tol, "weights");
    let ours = dp.store().read_all().unwrap();
    assert!(ours.contains_key(GRAD_ACC));
    if !shard {
        let state: Vec<String> = names.iter().flat_map(|n| [format!("{n}.adam_m"), format!("{n}.adam_v")]).collect();
        assert_same(&dp.store().read(&state).unwrap(), &trainer.store().read(&state).unwrap(), tol, "state");
    }
    skipped
}

#[test]
fn one_rank_trains_as_the_trainer() {
    assert_eq!(matches_the_trainer(Task::Mlp, TrainOptions::default(), false, 1e-5), 0);
}

#[test]
fn one_rank_with_sharded_state_trains_as_the_trainer() {
    assert_eq!(matches_the_trainer(Task::Mlp, TrainOptions::default(), true, 1e-5), 0);
}

/// The language model: dozens of parameters, so the flattened vectors are concats wider than
/// a kernel's bindings. Its tolerance is looser: the keys' biases have a zero gradient (a
/// softmax ignores what is added to every key's score), so theirs is rounding noise, which
/// Adam scales to full-size steps that differ with the kernels' summation order.
#[test]
fn one_rank_trains_the_language_model_as_the_trainer() {
    assert_eq!(matches_the_trainer(Task::Lm, TrainOptions::default(), true, 1e-3), 0);
}

#[test]
fn one_rank_accumulates_and_scales_the_loss_as_the_trainer() {
    // An initial scale that overflows f16 first: the first window is skipped in both, and
    // the scale halves until steps apply.
    let scaling = LossScaling { init_scale: 65536.0 * 64.0, growth_interval: 2, min_scale: 1.0 };
    let options = TrainOptions { accumulate: 2, mixed_precision: Some(scaling), ..Default::default() };
    let skipped = matches_the_trainer(Task::Mlp, options, true, 2e-3);
    assert!((1..4).contains(&skipped), "{skipped} of 4 windows skipped");
}

#[test]
fn a_sharded_checkpoint_resumes_in_a_trainer() {
    let cfg = config(TrainOptions::default());
    let setup = demo::build(&cfg).unwrap();
    let dist = DistributedOptions { shard_optimizer: true, ..Default::default() };
    let mut params = Params::of(setup.model.module(), cfg.seed).unwrap();
    let mut dp = data_parallel(&setup, &cfg, &dist, &mut params);
    for i in 0..2 {
        dp.step(&refs(&feeds(&setup, i))).unwrap();
    }
    let dir = std::env::temp_dir().join(format!("fusegraph-dp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("step2.safetensors");
    dp.save(&path).unwrap();
    // The checkpoint names the state per parameter, as a trainer's store does.
    let saved = fusegraph::crates::ir::safetensors::read(&path).unwrap();
    assert!(saved.contains_key("fc0.weight.adam_m") && saved.contains_key("optim.step"), "{:?}", saved.keys());
    assert!(!saved.keys().any(|k| k.starts_with("ddp.")), "{:?}", saved.keys());
    for i in 2..4 {
        dp.step(&refs(&feeds(&setup, i))).unwrap();
    }

    let mut resumed = setup.params.clone();
    resumed.load_safetensors(&path).unwrap();
    let mut trainer = Trainer::new(&Device::shared().unwrap(), setup.step.clone(), &resumed).unwrap();
    for i in 2..4 {
        trainer.step(&refs(&feeds(&setup, i))).unwrap();
    }
    let names = setup.step.trained.clone();
    assert_same(&dp.store().read(&names).unwrap(), &trainer.store().read(&names).unwrap(), 1e-5, "resumed");

    // And sharded again, from the per-parameter state.
    let mut again = Params::of(setup.model.module(), cfg.seed).unwrap();
    again.load_safetensors(&path).unwrap();
    let mut dp2 = data_parallel(&setup, &cfg, &dist, &mut again);
    for i in 2..4 {
        dp2.step(&refs(&feeds(&setup, i))).unwrap();
    }
    assert_same(&dp2.store().read(&names).unwrap(), &trainer.store().read(&names).unwrap(), 1e-5, "resharded");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_distribution_options_are_typed_errors() {
    let cfg = config(TrainOptions { accumulate: 2, ..Default::default() });
    let setup = demo::build(&cfg).unwrap();
    let b = GraphBuilder::new();
    let objective = setup.model.objective(&b, setup.batch()).unwrap();
    let store = ParamStore::new(&Device::shared().unwrap());
    let mut params = Params::of(setup.model.module(), cfg.seed).unwrap();
    let tiny = DistributedOptions { bucket_bytes: 2, ..Default::default() };
    let adam = Adam::new(cfg.lr);
    let err = DataParallel::new(&store, &b, &mut params, &objective, &adam, &cfg.options, &tiny, &Single)
        .err()
        .expect("a bucket of 2 bytes is refused")
        .to_string();
    assert!(err.contains("bucket_bytes 2"), "{err}");

    let mut dp = data_parallel(&setup, &cfg, &DistributedOptions::default(), &mut params);
    let out = dp.step(&refs(&feeds(&setup, 0))).unwrap();
    assert!(!out.window_end && out.global_loss.is_none());
    let err = dp.save(&std::env::temp_dir().join("never-written.safetensors")).unwrap_err().to_string();
    assert!(err.contains("inside one"), "{err}");
    // A feed of the wrong shape names the input.
    let mut bad = feeds(&setup, 1);
    bad[0].1 = HostTensor::new([3, 16], vec![0.5f32; 48]).unwrap();
    let err = dp.step(&refs(&bad)).unwrap_err().to_string();
    assert!(err.contains("`x`"), "{err}");
}

/// The planner's figure for a rank's data-parallel step is what it allocates: the largest
/// batch under a device limit compiles there and one more fails with a typed out-of-memory
/// error; sharding the optimizer state over 2 ranks lowers a rank's figure, so a larger batch
/// fits.
#[test]
fn the_largest_data_parallel_batch_compiles_and_one_more_does_not() {
    use fusegraph::distributed::{largest_batch, planned_bytes};
    use fusegraph::{DeviceOptions, RuntimeError};
    let cfg = config(TrainOptions::default());
    let setup = demo::build(&cfg).unwrap();
    let params = Params::of(setup.model.module(), cfg.seed).unwrap();
    let adam = Adam::new(cfg.lr);
    let build = |batch: usize| {
        let b = GraphBuilder::new();
        let objective = setup.model.objective(&b, batch)?;
        Ok((b, objective))
    };
    let device = Device::shared().unwrap();
    let plain = DistributedOptions::default();
    let sharded = DistributedOptions { shard_optimizer: true, ..Default::default() };
    let bytes = |batch: usize, dist: &DistributedOptions, of: (usize, usize)| {
        let (b, objective) = build(batch).unwrap();
        planned_bytes(&device, &b, &params, &objective, &adam, &cfg.options, dist, of).unwrap()
    };
    let limit = bytes(300, &plain, (0, 1));
    let best = largest_batch(&device, build, &params, &adam, &cfg.options, &plain, (0, 1), limit, 4096).unwrap();
    let best = best.expect("batch 300 fits its own figure");
    assert!(best >= 300 && bytes(best, &plain, (0, 1)) <= limit && bytes(best + 1, &plain, (0, 1)) > limit);

    let limited =
        std::sync::Arc::new(Device::new(&DeviceOptions { memory_limit: Some(limit), ..Default::default() }).unwrap());
    let compile = |batch: usize| {
        let (b, objective) = build(batch).unwrap();
        let mut p = params.clone();
        DataParallel::new(&ParamStore::new(&limited), &b, &mut p, &objective, &adam, &cfg.options, &plain, &Single)
            .map(|_| ())
    };
    compile(best).unwrap_or_else(|e| panic!("batch {best} under {limit} B: {e}"));
    match compile(best + 1) {
        Err(fusegraph::Error::Runtime(RuntimeError::ResourceExhausted { .. })) => {}
        other => panic!("batch {} under {limit} B: {:?}", best + 1, other.err()),
    }

    // Two ranks: each holds half the Adam moments sharded (the update also stages its new
    // slice for the gather, so the figure drops by less than the half).
    let (whole, half) = (bytes(64, &plain, (1, 2)), bytes(64, &sharded, (1, 2)));
    assert!(half < whole, "{half} sharded against {whole}");
    let per_rank = |dist: &DistributedOptions| {
        largest_batch(&device, build, &params, &adam, &cfg.options, dist, (1, 2), limit, 4096).unwrap().unwrap()
    };
    assert!(per_rank(&sharded) > per_rank(&plain));
}
