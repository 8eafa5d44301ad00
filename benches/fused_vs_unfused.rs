//! `cargo bench`: the workloads of `fusegraph bench`, fused and unfused, timed by divan
//! around `Executable::run` (upload, all kernels, readback). `fusegraph bench` times the GPU
//! work alone with timestamps; this measures what a caller of `run` waits for.

use fusegraph::{CompileOptions, Device, Executable};
use fusegraph_workloads::{self as workloads, Workload};
use std::sync::OnceLock;

fn main() {
    divan::main();
}

fn quick() -> bool {
    std::env::var("FUSEGRAPH_BENCH_FULL").is_err()
}

fn executables() -> &'static Vec<(Workload, Executable, Executable)> {
    static CELL: OnceLock<Vec<(Workload, Executable, Executable)>> = OnceLock::new();
    CELL.get_or_init(|| {
        let device = Device::shared().expect("a device");
        workloads::all(quick())
            .into_iter()
            .map(|w| {
                let compile = |opts: &CompileOptions| {
                    let mut e = device.compile(&w.graph, &w.outputs, &w.options(opts.clone())).expect("compiles");
                    for (n, v) in &w.params {
                        e.set_parameter(n, v).expect("parameter");
                    }
                    e
                };
                let (f, u) = (compile(&CompileOptions::default()), compile(&CompileOptions::unfused()));
                (w, f, u)
            })
            .collect()
    })
}

const NAMES: &[&str] = &[
    "elementwise_chain",
    "gelu_relu_matmul_bias",
    "layer_norm_gelu",
    "softmax_axis1",
    "softmax_axis0",
    "mlp",
    "cnn",
    "transformer",
    "train_mlp",
    "train_lm",
];

fn find(prefix: &str) -> &'static (Workload, Executable, Executable) {
    executables().iter().find(|(w, _, _)| w.name.starts_with(prefix)).expect("workload")
}

#[divan::bench(args = NAMES, sample_count = 10)]
fn fused(bencher: divan::Bencher, name: &str) {
    let (w, f, _) = find(name);
    let feeds = w.feed_refs();
    bencher.bench(|| f.run(&feeds).expect("runs"));
}

#[divan::bench(args = NAMES, sample_count = 10)]
fn unfused(bencher: divan::Bencher, name: &str) {
    let (w, _, u) = find(name);
    let feeds = w.feed_refs();
    bencher.bench(|| u.run(&feeds).expect("runs"));
}
