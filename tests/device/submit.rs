//! Runs in flight: `Executable::submit` returns before the device runs, later runs take an
//! earlier run's output as a feed on the device (`Feed::Output`), from another executable or
//! from their own, and a feed that cannot be taken is a typed error before anything is
//! written.

use fusegraph::{CompileOptions, DType, Device, Feed, GraphBuilder, HostTensor, RuntimeError};

/// `y = 2x + 1` of `x: f32[4, 1]`, as `[4]`.
fn affine() -> fusegraph::Executable {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [4, 1]).unwrap();
    let y = x.mul_scalar(2.0).unwrap().add_scalar(1.0).unwrap().reshape([4]).unwrap();
    Device::shared().unwrap().compile(&b.graph(), &[y.id()], &CompileOptions::default()).unwrap()
}

/// `z = x · x` of `x: f32[4]`, and `x + 1`.
fn square() -> fusegraph::Executable {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [4]).unwrap();
    let z = x.mul(&x).unwrap();
    let w = x.add_scalar(1.0).unwrap();
    Device::shared().unwrap().compile(&b.graph(), &[z.id(), w.id()], &CompileOptions::default()).unwrap()
}

/// Six runs of one executable, each fed the one before's output on the device and none
/// waited for until all are submitted, then a run of another executable fed the last one's
/// output: every run's outputs are what the host computes step by step.
#[test]
fn runs_in_flight_feed_each_other_on_the_device() {
    let (a, s) = (affine(), square());
    let x0 = vec![0.5f32, -1.25, 3.0, 0.0];
    let first = HostTensor::new([4, 1], x0.clone()).unwrap();
    let mut runs = vec![a.submit(&[("x", Feed::Host(&first))]).unwrap()];
    for _ in 0..5 {
        let next = a.submit(&[("x", Feed::Output(runs.last().unwrap(), 0))]).unwrap();
        runs.push(next);
    }
    let last = s.submit(&[("x", Feed::Output(runs.last().unwrap(), 0))]).unwrap();
    let mut want = x0;
    for run in runs {
        want = want.iter().map(|v| 2.0 * v + 1.0).collect();
        assert_eq!(run.wait().unwrap()[0].as_slice::<f32>().unwrap(), want.as_slice());
    }
    let out = last.wait().unwrap();
    let squares: Vec<f32> = want.iter().map(|v| v * v).collect();
    assert_eq!(out[0].as_slice::<f32>().unwrap(), squares.as_slice());
    assert_eq!(out[1].as_slice::<f32>().unwrap(), want.iter().map(|v| v + 1.0).collect::<Vec<_>>().as_slice());
    // A run dropped unread, then an ordinary run: the staging buffers came back unmapped.
    drop(a.submit(&[("x", Feed::Host(&first))]).unwrap());
    let again = a.run(&[("x", &first)]).unwrap();
    assert_eq!(again[0].as_slice::<f32>().unwrap(), &[2.0, -1.5, 7.0, 1.0]);
}

/// A chained feed from an overwritten output, of another element count or type, or past
/// the outputs, is `RuntimeError::ChainedFeed` naming the input; an executable whose submit
/// failed runs as before.
#[test]
fn chained_feeds_that_cannot_be_taken_are_typed_errors() {
    let (a, s) = (affine(), square());
    let x = HostTensor::new([4, 1], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let older = a.submit(&[("x", Feed::Host(&x))]).unwrap();
    let newer = a.submit(&[("x", Feed::Host(&x))]).unwrap();
    let reason = |e: RuntimeError| match e {
        RuntimeError::ChainedFeed { name, reason } => {
            assert_eq!(name, "x");
            reason
        }
        other => panic!("expected ChainedFeed, got {other}"),
    };
    let e = reason(s.submit(&[("x", Feed::Output(&older, 0))]).err().unwrap());
    assert!(e.contains("overwritten"), "{e}");
    let e = reason(s.submit(&[("x", Feed::Output(&newer, 1))]).err().unwrap());
    assert!(e.contains("output 1 of a run with 1 outputs"), "{e}");
    let run_s = s.submit(&[("x", Feed::Output(&newer, 0))]).unwrap();
    // `s`'s second output is f32[4]: the right count for `a`'s f32[4, 1]; an i32 is not.
    let b = GraphBuilder::new();
    let n = b.input("x", DType::I32, [4]).unwrap().add_scalar(1.0).unwrap();
    let ints = Device::shared().unwrap().compile(&b.graph(), &[n.id()], &CompileOptions::default()).unwrap();
    let e = reason(ints.submit(&[("x", Feed::Output(&run_s, 1))]).err().unwrap());
    assert!(e.contains("f32[4]") && e.contains("i32[4]"), "{e}");
    let b = GraphBuilder::new();
    let wide = b.input("x", DType::F32, [8]).unwrap().neg().unwrap();
    let wide = Device::shared().unwrap().compile(&b.graph(), &[wide.id()], &CompileOptions::default()).unwrap();
    let e = reason(wide.submit(&[("x", Feed::Output(&run_s, 0))]).err().unwrap());
    assert!(e.contains("f32[8]"), "{e}");
    let chained = a.submit(&[("x", Feed::Output(&run_s, 1))]).unwrap();
    let (older, newer) = (older.wait().unwrap(), newer.wait().unwrap());
    assert_eq!(older, newer);
    assert_eq!(run_s.wait().unwrap()[1].as_slice::<f32>().unwrap(), &[4.0, 6.0, 8.0, 10.0]);
    assert_eq!(chained.wait().unwrap()[0].as_slice::<f32>().unwrap(), &[9.0, 13.0, 17.0, 21.0]);
}

/// A sampler's chain — each run gathers its rows of a transition table by the ids the last
/// run sampled and samples the next (a decode loop without the model, its head
/// `sampling::Head` as a step compiles it) — run with each run fed the last one's ids on the
/// device, all in flight, and run from the host one at a time: the same ids. The head's
/// output shares bytes with a host-fed input's slot (the plan reuses the draws' slot once
/// they are read), so a chained feed read after the next run's host writes would read draws.
#[test]
fn a_run_fed_its_own_output_keeps_it_from_its_host_feeds() {
    use fusegraph::sampling::{Head, Sampling};
    let (batch, vocab) = (2, 300);
    let b = GraphBuilder::new();
    let ids = b.input("ids", DType::I32, [batch, 1]).unwrap();
    let table = b.input("table", DType::F32, [vocab, vocab]).unwrap();
    let logits = table.gather(&ids.reshape([batch]).unwrap(), 0).unwrap();
    let head = Head::Sampled { top_k: true, top_p: true };
    let next = head.build(&logits).unwrap();
    let exe = Device::shared().unwrap().compile(&b.graph(), &[next.id()], &CompileOptions::default()).unwrap();
    let plan = exe.memory_plan();
    let out = plan.locations[&next.id()];
    let overlaps = |n: fusegraph::NodeId| {
        let l = plan.locations[&n];
        l.region == out.region && l.offset < out.offset + out.size && out.offset < l.offset + l.size
    };
    let g = b.graph();
    let inputs: Vec<fusegraph::NodeId> =
        g.node_ids().into_iter().filter(|&n| matches!(g.node(n).op, fusegraph::Op::Input { .. })).collect();
    eprintln!("output at {out:?}; inputs {:?}", inputs.iter().map(|n| plan.locations[n]).collect::<Vec<_>>());
    assert!(inputs.iter().any(|&n| overlaps(n)), "the case this test is for: the output in a host-fed input's bytes");
    let values: Vec<f32> = (0..vocab * vocab).map(|i| ((i * 7919) % 1000) as f32 / 100.0).collect();
    let table = HostTensor::new([vocab, vocab], values).unwrap();
    let sampling = Sampling { temperature: 0.7, top_k: Some(40), top_p: Some(0.9), seed: 0 };
    let draws: Vec<Vec<f32>> = (0..12).map(|i| vec![(i as f32 * 0.37) % 1.0, (i as f32 * 0.61 + 0.2) % 1.0]).collect();
    let start = HostTensor::new([batch, 1], vec![3i32, 250]).unwrap();
    // From the host, one run at a time.
    let mut want = Vec::new();
    let mut fed = start.clone();
    for d in &draws {
        let feeds = head.feeds(&sampling, d.clone()).unwrap();
        let mut refs: Vec<(&str, &HostTensor)> = feeds.iter().map(|(n, t)| (*n, t)).collect();
        refs.extend([("ids", &fed), ("table", &table)]);
        let got = exe.run(&refs).unwrap().remove(0);
        fed = HostTensor::new([batch, 1], got.as_slice::<i32>().unwrap().to_vec()).unwrap();
        want.push(got);
    }
    // On the device, every run in flight before the first is read.
    let mut runs: Vec<fusegraph::Submitted> = Vec::new();
    let all_feeds: Vec<_> = draws.iter().map(|d| head.feeds(&sampling, d.clone()).unwrap()).collect();
    for feeds in &all_feeds {
        let mut refs: Vec<(&str, Feed)> = feeds.iter().map(|(n, t)| (*n, Feed::Host(t))).collect();
        refs.push(("table", Feed::Host(&table)));
        refs.push(("ids", runs.last().map_or(Feed::Host(&start), |r| Feed::Output(r, 0))));
        let run = exe.submit(&refs).unwrap();
        runs.push(run);
    }
    let got: Vec<HostTensor> = runs.into_iter().map(|r| r.wait().unwrap().remove(0)).collect();
    assert_eq!(got, want);
}
