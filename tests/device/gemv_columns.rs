//! The matrix–vector kernel's columns per workgroup forced (`CompileOptions::gemv_columns`,
//! the `decode_gemv` rows of `fusegraph roofline`): every allowed count, over f32, bf16 and
//! block weights (k-quants and IQ types too) stored `[out, in]`, matches the reference with as many workgroups as it
//! says; another count is a typed error.

use crate::common::{run_case, CaseBuilder, Domain};
use fusegraph::{CompileOptions, DType, Device, DeviceOptions, KernelForm, RuntimeError};
use std::sync::Arc;

#[test]
fn forced_columns_per_workgroup_match_the_reference() {
    let device = Arc::new(Device::new(&DeviceOptions { gpu_kernels: true, ..Default::default() }).expect("a device"));
    let mut failures = Vec::new();
    // (weight type, rows, k, columns): ragged columns, k past one step of the narrowest split,
    // a row prologue's absence either way.
    for (w, m, k, n) in [
        (DType::F32, 1, 1030, 45),
        (DType::BF16, 2, 296, 37),
        (DType::Q4_0, 1, 1184, 41),
        (DType::Q8_0, 3, 256, 33),
        (DType::Q5_0, 2, 352, 29),
        (DType::Q4_1, 1, 480, 23),
        (DType::Q5_1, 2, 224, 25),
        (DType::Q4K, 1, 768, 19),
        (DType::Q6K, 2, 512, 21),
        (DType::Q5K, 3, 768, 17),
        (DType::IQ4NL, 1, 416, 27),
        (DType::Q2K, 2, 512, 19),
        (DType::Q3K, 1, 768, 23),
        (DType::IQ4XS, 3, 512, 21),
    ] {
        let mut c = CaseBuilder::new(k as u64 + n as u64);
        let x = c.input(DType::F32, &[m, k], Domain::Any);
        let wt = c.input(w, &[n, k], Domain::Any);
        let y = x.matmul(&wt.cast(DType::F32).unwrap().t().unwrap()).unwrap();
        let mut case = c.finish(format!("gemv_{w}_{m}x{k}x{n}"), &[&y]);
        case.atol = case.atol.max(1e-3 * k as f64 / 1000.0);
        for columns in fusegraph::crates::wgsl::GEMV_COLUMNS {
            let opts = CompileOptions { gemv_columns: Some(columns), ..Default::default() };
            match run_case(&device, &case, &opts) {
                Err(e) => failures.push(format!("{} at {columns} columns: {e}", case.name)),
                Ok(stats) => {
                    let gemv: Vec<_> =
                        stats.kernels.iter().filter(|k| matches!(k.form, KernelForm::Gemv { .. })).collect();
                    if gemv.len() != 1 || gemv[0].workgroups.iter().product::<u32>() != n.div_ceil(columns) as u32 {
                        failures.push(format!("{} at {columns} columns: {:?}", case.name, stats.kernels));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let b = fusegraph::GraphBuilder::new();
    let y = b.input("x", DType::F32, [1, 64]).unwrap().matmul(&b.input("w", DType::F32, [64, 8]).unwrap()).unwrap();
    let e = device.compile(&b.graph(), &[y.id()], &CompileOptions { gemv_columns: Some(3), ..Default::default() });
    match e.err().expect("3 columns are refused") {
        RuntimeError::InvalidOption { option, detail } => {
            assert_eq!(option, "gemv_columns");
            assert!(detail.contains("3 columns"), "{detail}");
        }
        other => panic!("expected InvalidOption, got {other}"),
    }
}
