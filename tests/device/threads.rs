//! One device and one executable used from several threads at once: two threads run the
//! same executable (runs share its arena and staging buffer, so they take turns; otherwise
//! the second submit would fail with "the staging buffer is still mapped") while one of
//! them also compiles and runs other graphs. CI runs this on GL as well as Vulkan
//! (`FUSEGRAPH_BACKEND`).

use fusegraph::{CompileOptions, DType, Device, DeviceOptions, GraphBuilder, HostTensor};
use std::sync::{Arc, Barrier};

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 37 + seed * 11) % 101) as f32 / 101.0 - 0.5).collect()
}

#[test]
fn threads_share_a_device_and_take_turns_on_an_executable() {
    let device = Arc::new(Device::new(&DeviceOptions { autotune: Some(false), ..Default::default() }).unwrap());
    eprintln!("device: {}", device.describe());

    // The long executable: a 240-op elementwise chain over 4 Mi elements (about two seconds
    // per run on llvmpipe), so the threads' runs overlap.
    let n = 1 << 22;
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [n]).unwrap();
    let w = b.input("w", DType::F32, [n]).unwrap();
    let mut y = x.clone();
    for _ in 0..80 {
        y = y.add(&w).unwrap().mul_scalar(0.5).unwrap().tanh().unwrap();
    }
    let long = device.compile(&b.graph(), &[y.id()], &CompileOptions::default()).unwrap();
    let xv = HostTensor::new([n], values(n, 1)).unwrap();
    let wv = HostTensor::new([n], values(n, 2)).unwrap();
    let feeds = [("x", &xv), ("w", &wv)];
    let want_long = long.run(&feeds).unwrap();
    let t0 = std::time::Instant::now();
    long.run(&feeds).unwrap();
    eprintln!("long run alone: {:.2} s", t0.elapsed().as_secs_f64());

    // The short work: compile and run a small graph, several times, each checked.
    let short = |k: usize| -> Vec<f32> {
        let b = GraphBuilder::new();
        let a = b.input("a", DType::F32, [64, 32]).unwrap();
        let s = a.softmax(1).unwrap().mul_scalar(k as f64).unwrap();
        let exe = device.compile(&b.graph(), &[s.id()], &CompileOptions::default()).unwrap();
        let av = HostTensor::new([64, 32], values(64 * 32, 3)).unwrap();
        exe.run(&[("a", &av)]).unwrap()[0].as_slice::<f32>().unwrap().to_vec()
    };
    let want_short: Vec<Vec<f32>> = (1..=6).map(short).collect();

    let start = Barrier::new(2);
    std::thread::scope(|scope| {
        let first_thread = scope.spawn(|| {
            start.wait();
            (0..2).map(|_| long.run(&feeds).unwrap()).collect::<Vec<_>>()
        });
        let second_thread = scope.spawn(|| {
            start.wait();
            std::thread::sleep(std::time::Duration::from_millis(50));
            let again = long.run(&feeds).unwrap();
            ((1..=6).map(short).collect::<Vec<_>>(), again)
        });
        for got in first_thread.join().expect("the first thread finished") {
            assert_eq!(got, want_long, "the long executable's result changed under concurrent use");
        }
        let (shorts, again) = second_thread.join().expect("the second thread finished");
        assert_eq!(again, want_long, "the second thread's run of the long executable");
        assert_eq!(shorts, want_short);
    });
}
