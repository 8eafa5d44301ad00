//! Models through the module API on a device: the demo LM trained, then evaluated by a
//! second executable at another batch size bound to the same parameter store; the jit
//! compiling once per shape; feeds and outputs by tensor handle.

use fusegraph::crates::reference::evaluate;
use fusegraph::nn::{Forward, Linear, Params, Scope};
use fusegraph::train::Trainer;
use fusegraph::{
    CompileOptions, DType, Device, DeviceOptions, GraphBuilder, HostTensor, Jit, ParamStore, RuntimeError,
};
use fusegraph_workloads::demo::{self, Config, Model, Task};
use std::collections::BTreeMap;
use std::sync::Arc;

#[test]
fn a_trained_lm_is_evaluated_at_another_batch_from_the_same_store() {
    let device = Arc::new(Device::new(&DeviceOptions::default()).unwrap());
    let cfg = Config::new(Task::Lm, true);
    let setup = demo::build(&cfg).unwrap();
    let mut trainer = Trainer::new(&device, setup.step.clone(), &setup.params).unwrap();
    let store = trainer.store().clone();
    let initial = store.read_all().unwrap();
    let mut losses = Vec::new();
    for i in 0..4 {
        let feeds = setup.feeds(i).unwrap();
        let refs: Vec<(&str, &HostTensor)> = feeds.iter().map(|(k, v)| (k.as_str(), v)).collect();
        losses.push(trainer.step(&refs).unwrap().loss);
    }
    let trained = store.read_all().unwrap();
    assert_ne!(trained["h.0.attn.q.weight"], initial["h.0.attn.q.weight"], "training wrote the store");

    // An evaluation graph at batch 3 (training ran at 8), bound to the same store.
    let Model::Lm(model) = &setup.model else { panic!("the LM task builds an LM") };
    let b = GraphBuilder::new();
    let objective = demo::lm(&b, model, 3, model.config.max_seq).unwrap();
    let allocated = device.memory().allocated;
    let eval = store.compile(&b.graph(), &[objective.loss.id()], &CompileOptions::default()).unwrap();
    // The evaluation holds no parameter: the device holds them once, in the store.
    let s = eval.stats();
    assert_eq!(device.memory().allocated - allocated, s.device_bytes);
    let model_bytes: u64 = fusegraph::nn::Module::params(model).iter().map(|p| p.ty().buffer_bytes() as u64).sum();
    assert!(store.bytes() > model_bytes, "the store holds the optimizer state too");
    assert_eq!(s.store_bytes, model_bytes);
    // Compiled on its own, the same graph would hold the weights beside its constants.
    let alone = device.plan(&b.graph(), &[objective.loss.id()], &CompileOptions::default()).unwrap();
    assert!(alone.persistent_bytes >= s.persistent_bytes + model_bytes, "{alone:?} vs {s:?}");

    let feeds = setup.feeds_at(100, 3).unwrap();
    let refs: Vec<(&str, &HostTensor)> = feeds.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let got = eval.run(&refs).unwrap().remove(0).to_f64()[0];
    let feed_map: BTreeMap<String, HostTensor> = feeds.into_iter().collect();
    let want = evaluate(&b.graph(), &[objective.loss.id()], &feed_map, &trained).unwrap()[0].to_f64()[0];
    assert!((got - want).abs() <= 1e-4 * want.abs().max(1.0), "loss {got} vs the reference {want}");
    let untrained = evaluate(&b.graph(), &[objective.loss.id()], &feed_map, &initial).unwrap()[0].to_f64()[0];
    assert!((got - untrained).abs() > 1e-3, "the evaluation saw the trained weights ({got} vs untrained {untrained})");

    // A fifth training step changes the weights again; the evaluation reads them, no copy.
    let feeds = setup.feeds(4).unwrap();
    let refs: Vec<(&str, &HostTensor)> = feeds.iter().map(|(k, v)| (k.as_str(), v)).collect();
    trainer.step(&refs).unwrap();
    let again =
        eval.run(&setup.feeds_at(100, 3).unwrap().iter().map(|(k, v)| (k.as_str(), v)).collect::<Vec<_>>()).unwrap();
    assert_ne!(again[0].to_f64()[0], got);
}

#[test]
fn the_jit_compiles_once_per_shape_and_feeds_by_handle() {
    let device = Device::shared().unwrap();
    let fc1 = Linear::new(&Scope::root().at("fc1"), 8, 16, true).unwrap();
    let fc2 = Linear::new(&Scope::root().at("fc2"), 16, 4, false).unwrap();
    let store = ParamStore::new(&device);
    let model = (fc1, fc2);
    let params = Params::of(&model, 5).unwrap();
    store.insert_all(params.iter()).unwrap();
    let (fc1, fc2) = &model;
    let jit = Jit::new(&store, CompileOptions::default(), |_, x| Ok(vec![fc2.forward(&fc1.forward(&x[0])?.gelu()?)?]));
    for (i, batch) in [1, 7, 32, 7, 1, 32, 32].into_iter().enumerate() {
        let x = HostTensor::new([batch, 8], fusegraph_workloads::random_values(i as u64, batch * 8)).unwrap();
        let got = jit.run(&[("x", &x)]).unwrap().remove(0);
        assert_eq!(got.shape().dims(), &[batch, 4]);
        // Against the reference of the same model recorded at this batch.
        let b = GraphBuilder::new();
        let xt = b.input("x", DType::F32, [batch, 8]).unwrap();
        let y = fc2.forward(&fc1.forward(&xt).unwrap().gelu().unwrap()).unwrap();
        let want = evaluate(&b.graph(), &[y.id()], &BTreeMap::from([("x".into(), x)]), params.as_map()).unwrap();
        fusegraph::crates::reference::assert_close(&got, &want[0], 1e-4, 1e-5).unwrap();
    }
    assert_eq!((jit.misses(), jit.hits()), (3, 4));
    assert_eq!(jit.signatures().len(), 3);
    // A new dtype is a new signature, and the model's own error comes back typed.
    let ints = HostTensor::new([2, 8], vec![1i32; 16]).unwrap();
    assert!(jit.run(&[("x", &ints)]).is_err());
    assert_eq!(jit.misses(), 3);

    // Feeds and outputs by handle on a plain executable.
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 8]).unwrap();
    let h = fc1.forward(&x).unwrap();
    let y = fc2.forward(&h).unwrap();
    let exe = store.compile(&b.graph(), &[h.id(), y.id()], &CompileOptions::default()).unwrap();
    let xv = HostTensor::new([2, 8], fusegraph_workloads::random_values(9, 16)).unwrap();
    let out = exe.run(&[(&x, &xv)]).unwrap();
    assert_eq!(out.value(&y).unwrap().shape().dims(), &[2, 4]);
    assert_eq!(out.value(&h), Some(&out[0]));
    assert_eq!(out.value(&x), None);
    match exe.run(&[(&h, &xv)]) {
        Err(RuntimeError::NotAnInput { .. }) => {}
        other => panic!("expected NotAnInput, got {:?}", other.map(|_| ())),
    }
    fn send<T: Send + Sync>(_: &T) {}
    send(&exe);
    send(&store);
}
