//! Mixed precision (f16 storage, f32 accumulation) halves the transformer's activation peak
//! and stays within f16 tolerance of the f32 run.

use fusegraph::crates::reference::assert_close;
use fusegraph::{CompileOptions, Device};

#[test]
fn mixed_precision_halves_activation_memory_and_matches_f32() {
    let w = fusegraph::workloads::transformer(64, 1, true).unwrap();
    let device = Device::shared().unwrap();
    let f32_opts = CompileOptions::default();
    let mp_opts = CompileOptions { mixed_precision: true, ..Default::default() };
    let full = device.plan(&w.graph, &w.outputs, &f32_opts).unwrap();
    let half = device.plan(&w.graph, &w.outputs, &mp_opts).unwrap();
    let ratio = half.lower_bound_bytes as f64 / full.lower_bound_bytes as f64;
    eprintln!("activation peak f32 {} B, mixed {} B, ratio {ratio:.3}", full.lower_bound_bytes, half.lower_bound_bytes);
    assert!(ratio <= 0.525, "ratio {ratio}");
    assert_eq!(half.persistent_bytes, full.persistent_bytes, "weights keep their f32 masters");

    let run = |opts: &CompileOptions| {
        let mut e = device.compile(&w.graph, &w.outputs, opts).unwrap();
        for (n, v) in &w.params {
            e.set_parameter(n, v).unwrap();
        }
        e.run(&w.feed_refs()).unwrap()
    };
    let (a, b) = (run(&f32_opts), run(&mp_opts));
    let scale = a[0].to_f64().iter().fold(1.0f64, |m, v| m.max(v.abs()));
    assert_close(&b[0], &a[0], 2e-2, 2e-2 * scale).unwrap();
}
