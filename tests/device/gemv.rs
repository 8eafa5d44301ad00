//! The matrix–vector kernel (`wgsl::matmul_gemv`) in a GPU's forms: products of a few rows,
//! sibling products of one input, norms joining as a row prologue, paired products under one
//! epilogue — each against the reference, with the kernels it should take.

use crate::common::run_case;
use fusegraph::{CompileOptions, Device, KernelForm};
use std::sync::Arc;

/// Products of at most `GEMV_MAX_ROWS` rows in a GPU's forms take the matrix–vector kernel
/// (an f16 result stored as packed halves excepted), which splits `k` over a workgroup:
/// ragged `k` and `n`, a batch, a transposed lhs, f16, an epilogue, one to four columns per
/// invocation, unrolled steps and their remainder, f32 weights read transposed by workgroups
/// of 8, 2 and 1 columns, and weights read through a fused cast — bf16 ones row-major (`k` strided) and stored `[out, in]` and read
/// transposed (`k` contiguous: by whole words where `k` is a multiple of 8, else through the
/// element function), and q4_0, q8_0, q5_0, q4_1, q5_1 and iq4_nl ones stored `[out, in]` and
/// read transposed, a block at a time (blocks at both word alignments; more blocks than a
/// column's 32 invocations; a cast on to f16), and q4_k, q5_k, q6_k, q2_k, q3_k (at both
/// alignments) and iq4_xs ones a chunk of a super-block at a time — all match the reference.
#[test]
fn few_row_products_take_the_matrix_vector_kernel_in_gpu_forms() {
    use crate::common::{CaseBuilder, Domain};
    use fusegraph::DType;
    let device =
        Arc::new(Device::new(&fusegraph::DeviceOptions { gpu_kernels: true, ..Default::default() }).expect("a device"));
    let gemv = |k_contiguous, packed| KernelForm::Gemv { k_contiguous, packed, row_prologue: false };
    // (case, the product's kernel form)
    let mut cases = Vec::new();
    for (dt, b, m, k, n, transposed) in
        [(DType::F32, 1, 1, 200, 37, false), (DType::F32, 2, 3, 64, 20, true), (DType::F16, 1, 8, 72, 100, false)]
    {
        cases.push((crate::shader_checks::matmul(dt, b, (m, k, n), transposed), gemv(false, false)));
    }
    // Row-major weights long enough for the unrolled steps and their remainder: `v` = 4, 2
    // and 1 columns per invocation, ragged `n`.
    for (m, k, n) in [(2, 1100, 1001), (4, 700, 70), (6, 520, 18)] {
        cases.push((crate::shader_checks::matmul(DType::F32, 1, (m, k, n), false), gemv(false, false)));
    }
    // f32 weights stored `[out, in]` and read transposed, four `k` a step: few columns spread
    // over narrower workgroups (8, 2 and 1 columns), `k` not a multiple of 4.
    for (m, k, n) in [(1, 1030, 400), (3, 520, 3), (1, 2054, 5)] {
        let mut c = CaseBuilder::new(10 + k as u64);
        let x = c.input(DType::F32, &[m, k], Domain::Any);
        let w = c.input(DType::F32, &[n, k], Domain::Any);
        let y = x.matmul(&w.t().unwrap()).unwrap();
        let mut case = c.finish(format!("gemv_f32_weight_rows_{m}x{k}x{n}"), &[&y]);
        case.atol = 1e-3 * k as f64 / 1000.0;
        cases.push((case, gemv(true, false)));
    }
    let mut c = CaseBuilder::new(5);
    let x = c.input(DType::F32, &[4, 40], Domain::Any);
    let w = c.input(DType::BF16, &[40, 33], Domain::Any);
    let y = x.matmul(&w.cast(DType::F32).unwrap()).unwrap();
    cases.push((c.finish("gemv_bf16_weight", &[&y]), gemv(false, false)));
    for (k, packed) in [(296, true), (42, false)] {
        let mut c = CaseBuilder::new(9);
        let x = c.input(DType::F32, &[3, k], Domain::Any);
        let w = c.input(DType::BF16, &[21, k], Domain::Any);
        let y = x.matmul(&w.cast(DType::F32).unwrap().t().unwrap()).unwrap();
        cases.push((c.finish(format!("gemv_bf16_weight_rows_k{k}"), &[&y]), gemv(true, packed)));
    }
    for q in [DType::Q4_0, DType::Q8_0, DType::Q5_0, DType::Q4_1, DType::Q5_1, DType::IQ4NL] {
        // 3 blocks a column: its blocks alternate between word-aligned and not.
        let mut c = CaseBuilder::new(6);
        let x = c.input(DType::F32, &[2, 1, 96], Domain::Any);
        let w = c.input(q, &[50, 96], Domain::Any);
        let r = c.input(DType::F32, &[2, 1, 50], Domain::Any);
        let y = x.reshape([2, 96]).unwrap().matmul(&w.cast(DType::F32).unwrap().t().unwrap()).unwrap();
        let y = y.reshape([2, 1, 50]).unwrap().add(&r).unwrap();
        cases.push((c.finish(format!("gemv_{q}_weight_rows"), &[&y]), gemv(true, true)));
        // 37 blocks a column (some invocations take two), one row.
        let mut c = CaseBuilder::new(7);
        let x = c.input(DType::F32, &[1, 1184], Domain::Any);
        let w = c.input(q, &[9, 1184], Domain::Any);
        let y = x.matmul(&w.cast(DType::F32).unwrap().t().unwrap()).unwrap();
        cases.push((c.finish(format!("gemv_{q}_weight_long_k"), &[&y]), gemv(true, true)));
        // Few columns, 128 blocks each: narrower workgroups.
        let mut c = CaseBuilder::new(11);
        let x = c.input(DType::F32, &[1, 4096], Domain::Any);
        let w = c.input(q, &[3, 4096], Domain::Any);
        let y = x.matmul(&w.cast(DType::F32).unwrap().t().unwrap()).unwrap();
        cases.push((c.finish(format!("gemv_{q}_weight_few_columns"), &[&y]), gemv(true, true)));
        // Dequantized on to f16, 8 rows.
        let mut c = CaseBuilder::new(8);
        let x = c.input(DType::F16, &[8, 64], Domain::Any);
        let w = c.input(q, &[12, 64], Domain::Any);
        let y = x.matmul(&w.cast(DType::F16).unwrap().t().unwrap()).unwrap();
        cases.push((c.finish(format!("gemv_{q}_weight_f16"), &[&y]), gemv(true, true)));
    }
    // MXFP4 weights (gpt-oss's experts) read through their element function, `k` contiguous;
    // and a stack of them of which each row's two experts are gathered, as a mixture reads them
    // (the gathered matrices keep their layout: `k` contiguous too).
    let mut c = CaseBuilder::new(12);
    let x = c.input(DType::F32, &[2, 96], Domain::Any);
    let w = c.input(DType::MXFP4, &[50, 96], Domain::Any);
    let y = x.matmul(&w.cast(DType::F32).unwrap().t().unwrap()).unwrap();
    cases.push((c.finish("gemv_mxfp4_weight_rows", &[&y]), gemv(true, false)));
    let mut c = CaseBuilder::new(13);
    let x = c.input(DType::F32, &[3, 1, 1, 64], Domain::Any);
    let chosen = c.input(DType::I32, &[3, 2], Domain::Index(4));
    let stack = c.input(DType::MXFP4, &[4, 40, 64], Domain::Any);
    let w = stack.cast(DType::F32).unwrap().gather(&chosen, 0).unwrap().transpose(&[0, 1, 3, 2]).unwrap();
    let y = x.broadcast_to([3, 2, 1, 64]).unwrap().matmul(&w).unwrap();
    cases.push((c.finish("gemv_mxfp4_gathered_experts", &[&y]), gemv(true, false)));
    // Likewise a stack of Q4_K super-blocks (a Q4_K_M file's experts).
    let mut c = CaseBuilder::new(14);
    let x = c.input(DType::F32, &[2, 1, 1, 256], Domain::Any);
    let chosen = c.input(DType::I32, &[2, 3], Domain::Index(5));
    let stack = c.input(DType::Q4K, &[5, 24, 256], Domain::Any);
    let w = stack.cast(DType::F32).unwrap().gather(&chosen, 0).unwrap().transpose(&[0, 1, 3, 2]).unwrap();
    let y = x.broadcast_to([2, 3, 1, 256]).unwrap().matmul(&w).unwrap();
    let mut case = c.finish("gemv_q4_k_gathered_experts", &[&y]);
    case.atol = 1e-3;
    cases.push((case, gemv(true, false)));
    // k-quant weights (super-blocks of 256) read by whole words, a chunk of a super-block a
    // step: two and three super-blocks a column (Q6_K's at either alignment), one to three
    // rows.
    let k_quants = [(DType::Q4K, 1, 512), (DType::Q6K, 3, 768), (DType::Q4K, 2, 768), (DType::Q6K, 1, 512)];
    let more = [(DType::Q5K, 2, 512), (DType::Q2K, 1, 768), (DType::Q3K, 3, 768), (DType::Q3K, 1, 512)];
    for (i, (q, m, k)) in k_quants.into_iter().chain(more).chain([(DType::IQ4XS, 2, 768)]).enumerate() {
        let mut c = CaseBuilder::new(40 + i as u64);
        let x = c.input(DType::F32, &[m, k], Domain::Any);
        let w = c.input(q, &[27, k], Domain::Any);
        let y = x.matmul(&w.cast(DType::F32).unwrap().t().unwrap()).unwrap();
        let mut case = c.finish(format!("gemv_{q}_weight_{m}x{k}"), &[&y]);
        case.atol = 1e-3;
        cases.push((case, gemv(true, true)));
    }
    let mut failures = Vec::new();
    for (case, form) in &cases {
        match run_case(&device, case, &CompileOptions::default()) {
            Err(e) => failures.push(format!("{}: {e}", case.name)),
            Ok(stats) => {
                let forms: Vec<_> = stats.kernels.iter().map(|k| k.form).collect();
                // An f16 result stored as packed halves (no native f16: GL) keeps the tiled
                // kernel, whose invocations own whole words.
                let packed = case.name.contains("f16") && !device.f16_native();
                if !packed && !forms.contains(form) {
                    failures.push(format!("{}: kernels {forms:?}", case.name));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

/// Sibling products of one input — a decode step's q, k and v projections — share one
/// matrix–vector kernel in a GPU's forms (one dispatch, a range of workgroups each): a
/// row-major f32 weight with a bias, a bf16 weight and a q8_0 one read transposed by words
/// with a relu after it, at one and three rows, match the reference; in a CPU adapter's forms
/// (and without native f16) they stay three kernels.
#[test]
fn sibling_products_of_one_input_share_a_matrix_vector_kernel_in_gpu_forms() {
    use crate::common::{CaseBuilder, Domain};
    use fusegraph::DType;
    let gpu = Arc::new(Device::new(&fusegraph::DeviceOptions { gpu_kernels: true, ..Default::default() }).unwrap());
    for rows in [1, 3] {
        let mut c = CaseBuilder::new(30 + rows as u64);
        let x = c.input(DType::F32, &[rows, 1, 96], Domain::Any);
        let h = x.reshape([rows, 96]).unwrap();
        let (wq, bq) = (c.input(DType::F32, &[96, 70], Domain::Any), c.input(DType::F32, &[70], Domain::Any));
        let wk = c.input(DType::BF16, &[40, 96], Domain::Any);
        let wv = c.input(DType::Q8_0, &[24, 96], Domain::Any);
        let q = h.matmul(&wq).unwrap().add(&bq).unwrap();
        let k = h.matmul(&wk.cast(DType::F32).unwrap().t().unwrap()).unwrap();
        let v = h.matmul(&wv.cast(DType::F32).unwrap().t().unwrap()).unwrap().relu().unwrap();
        let mut case = c.finish(format!("sibling_products_{rows}_rows"), &[&q, &k, &v]);
        case.atol = 1e-4;
        let stats = run_case(&gpu, &case, &CompileOptions::default()).unwrap();
        let products = |k: &fusegraph::KernelStats| k.label.matches("matmul").count();
        let kernels: Vec<_> = stats.kernels.iter().map(|k| (k.label.clone(), k.form)).collect();
        if !gpu.f16_native() {
            // f16 results would be packed halves, which the kernel does not store: no merge.
            assert!(stats.kernels.iter().all(|k| products(k) <= 1), "{kernels:?}");
            continue;
        }
        assert_eq!(stats.kernels.len(), 1, "{kernels:?}");
        assert_eq!(products(&stats.kernels[0]), 3, "{kernels:?}");
        assert!(matches!(stats.kernels[0].form, KernelForm::Gemv { packed: true, .. }), "{kernels:?}");
        let cpu = run_case(&Device::shared().unwrap(), &case, &CompileOptions::default()).unwrap();
        if Device::shared().unwrap().kernel_forms().loops == fusegraph::Spread::Serial {
            assert!(cpu.kernels.iter().all(|k| products(k) <= 1), "{:?}", cpu.kernels);
        }
    }
}

/// A layer norm (two reductions) or an RMS norm (one) whose rows only feed products of a few
/// rows joins their matrix–vector kernel in a GPU's forms, which reduces and stages the rows
/// itself: row-major f32 weights (strided columns) with a bias, `[out, in]` f32, bf16 and q4_0
/// weights read along `k`, sibling products, one to eight rows, f16 activations, and a
/// softmax per head before the heads' weighted sums — each one kernel with a row prologue,
/// matching the reference. In a CPU adapter's forms the norm
/// keeps its row kernel.
#[test]
fn norms_feeding_few_row_products_join_their_matrix_vector_kernel_in_gpu_forms() {
    use crate::common::{CaseBuilder, Domain};
    use fusegraph::DType;
    let gpu = Arc::new(Device::new(&fusegraph::DeviceOptions { gpu_kernels: true, ..Default::default() }).unwrap());
    let rms = |x: &fusegraph::Tensor| -> fusegraph::Tensor {
        let scale = x.mul(x).unwrap().mean(&[1], true).unwrap().add_scalar(1e-6).unwrap().rsqrt().unwrap();
        x.mul(&scale).unwrap()
    };
    let mut cases = Vec::new();
    for (rows, k) in [(1, 256), (2, 200), (8, 64), (5, 96)] {
        let mut c = CaseBuilder::new(50 + rows as u64);
        let x = c.input(DType::F32, &[rows, k], Domain::Any);
        let (gamma, beta) = (c.input(DType::F32, &[k], Domain::Any), c.input(DType::F32, &[k], Domain::Any));
        let h = x.layer_norm(&[1], 1e-5).unwrap().mul(&gamma).unwrap().add(&beta).unwrap();
        let (w, b) = (c.input(DType::F32, &[k, 70], Domain::Any), c.input(DType::F32, &[70], Domain::Any));
        let y = h.matmul(&w).unwrap().add(&b).unwrap();
        cases.push((c.finish(format!("layer_norm_product_{rows}_rows"), &[&y]), 1));
        let mut c = CaseBuilder::new(60 + rows as u64);
        let x = c.input(DType::F32, &[rows, k], Domain::Any);
        let h = x.layer_norm(&[1], 1e-5).unwrap();
        let wt = c.input(DType::F32, &[40, k], Domain::Any);
        let z = h.matmul(&wt.t().unwrap()).unwrap().relu().unwrap();
        cases.push((c.finish(format!("layer_norm_transposed_{rows}_rows"), &[&z]), 1));
    }
    for rows in [1, 2, 3] {
        let mut c = CaseBuilder::new(70 + rows as u64);
        let x = c.input(DType::F32, &[rows, 1, 512], Domain::Any);
        let gamma = c.input(DType::F32, &[512], Domain::Any);
        let h = rms(&x.reshape([rows, 512]).unwrap()).mul(&gamma).unwrap();
        let wq = c.input(DType::BF16, &[48, 512], Domain::Any);
        let wk = c.input(DType::Q4_0, &[32, 512], Domain::Any);
        let wv = c.input(DType::F32, &[512, 24], Domain::Any);
        let q = h.matmul(&wq.cast(DType::F32).unwrap().t().unwrap()).unwrap();
        let k = h.matmul(&wk.cast(DType::F32).unwrap().t().unwrap()).unwrap();
        let v = h.matmul(&wv).unwrap();
        cases.push((c.finish(format!("rms_norm_siblings_{rows}_rows"), &[&q, &k, &v]), 3));
    }
    // Sibling products of each k-quant.
    let mut c = CaseBuilder::new(77);
    let x = c.input(DType::F32, &[1, 1, 512], Domain::Any);
    let gamma = c.input(DType::F32, &[512], Domain::Any);
    let h = rms(&x.reshape([1, 512]).unwrap()).mul(&gamma).unwrap();
    let mut outs = Vec::new();
    for (q, n) in [(DType::Q4K, 40), (DType::Q5K, 24), (DType::Q6K, 16)] {
        let w = c.input(q, &[n, 512], Domain::Any);
        outs.push(h.matmul(&w.cast(DType::F32).unwrap().t().unwrap()).unwrap());
    }
    let refs: Vec<&fusegraph::Tensor> = outs.iter().collect();
    cases.push((c.finish("rms_norm_k_quant_siblings", &refs), 3));
    let mut c = CaseBuilder::new(78);
    let x = c.input(DType::F32, &[1, 1, 768], Domain::Any);
    let gamma = c.input(DType::F32, &[768], Domain::Any);
    let h = rms(&x.reshape([1, 768]).unwrap()).mul(&gamma).unwrap();
    let mut outs = Vec::new();
    for (q, n) in [(DType::Q2K, 24), (DType::Q3K, 16), (DType::IQ4XS, 40)] {
        let w = c.input(q, &[n, 768], Domain::Any);
        outs.push(h.matmul(&w.cast(DType::F32).unwrap().t().unwrap()).unwrap());
    }
    let refs: Vec<&fusegraph::Tensor> = outs.iter().collect();
    cases.push((c.finish("rms_norm_k_and_iq_siblings", &refs), 3));
    // A softmax per head feeding the head's weighted sum of values: each workgroup reduces
    // and stages its own head's rows (one a head; three a key/value head, as grouped heads).
    for (i, (heads, rows, keys, dim)) in [(4, 1, 64, 16), (2, 3, 100, 24)].into_iter().enumerate() {
        let mut c = CaseBuilder::new(85 + i as u64);
        let scores = c.input(DType::F32, &[1, heads, rows, keys], Domain::Any);
        let v = c.input(DType::F32, &[1, heads, keys, dim], Domain::Any);
        let out = scores.mul_scalar(0.5).unwrap().softmax(3).unwrap().matmul(&v).unwrap();
        cases.push((c.finish(format!("softmax_values_{heads}x{rows}"), &[&out]), 1));
    }
    let mut c = CaseBuilder::new(80);
    let x = c.input(DType::F16, &[1, 128], Domain::Any);
    let w = c.input(DType::F16, &[128, 64], Domain::Any);
    let y = x.layer_norm(&[1], 1e-5).unwrap().matmul(&w).unwrap();
    let mut half = c.finish("layer_norm_product_f16", &[&y]);
    half.atol = 5e-2;
    cases.push((half, 1));
    for (mut case, products) in cases {
        case.atol = case.atol.max(2e-4);
        let stats = run_case(&gpu, &case, &CompileOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let kernels: Vec<_> = stats.kernels.iter().map(|k| (k.label.clone(), k.form)).collect();
        if !gpu.f16_native() {
            assert!(stats.kernels.iter().all(|k| !k.label.contains("reduce") || !k.label.contains("matmul")));
            continue;
        }
        assert_eq!(stats.kernels.len(), 1, "{}: {kernels:?}", case.name);
        assert_eq!(stats.kernels[0].label.matches("matmul").count(), products, "{}: {kernels:?}", case.name);
        assert!(
            matches!(stats.kernels[0].form, KernelForm::Gemv { row_prologue: true, .. }),
            "{}: {kernels:?}",
            case.name
        );
        if Device::shared().unwrap().kernel_forms().loops == fusegraph::Spread::Serial {
            let cpu = run_case(&Device::shared().unwrap(), &case, &CompileOptions::default()).unwrap();
            assert!(cpu.kernels.len() > 1, "{}: {:?}", case.name, cpu.kernels);
        }
    }
}

/// A gate and an up projection under one epilogue (`silu(x·Wg) · (x·Wu)`) take one
/// matrix–vector kernel in a GPU's forms, accumulating both products side by side: row-major
/// f32 weights, `[out, in]` f32, bf16, q8_0, q4_0, q4_k and q5_k weights read along `k`, one
/// to three rows, with and without an RMS norm before them as the kernel's prologue — each one
/// kernel of two products, matching the reference. Weights of unlike types (q4_k and q5_k,
/// q4_0 and q8_0, bf16 and f32) take a kernel per product, matching the reference too.
#[test]
fn paired_products_share_a_matrix_vector_kernel_in_gpu_forms() {
    use crate::common::{CaseBuilder, Domain};
    use fusegraph::DType;
    let gpu = Arc::new(Device::new(&fusegraph::DeviceOptions { gpu_kernels: true, ..Default::default() }).unwrap());
    // (rows, k, n, the gate's and the up projection's weight dtypes, [out, in] weights, an RMS
    // norm first)
    let shapes = [
        (1, 64, 96, [DType::F32; 2], false, false),
        (3, 64, 70, [DType::F32; 2], true, true),
        (1, 128, 96, [DType::BF16; 2], true, true),
        (2, 256, 64, [DType::Q8_0; 2], true, false),
        (1, 256, 64, [DType::Q4_0; 2], true, true),
        (1, 512, 64, [DType::Q4K; 2], true, true),
        (2, 512, 40, [DType::Q5K; 2], true, false),
        (1, 512, 48, [DType::Q4K, DType::Q5K], true, true),
        (1, 256, 48, [DType::Q4_0, DType::Q8_0], true, true),
        (1, 256, 48, [DType::BF16, DType::F32], true, false),
    ];
    for (i, (rows, k, n, [dg, du], transposed, norm)) in shapes.into_iter().enumerate() {
        let mut c = CaseBuilder::new(90 + i as u64);
        let x = c.input(DType::F32, &[rows, k], Domain::Any);
        let h = if norm {
            let scale = x.mul(&x).unwrap().mean(&[1], true).unwrap().add_scalar(1e-6).unwrap().rsqrt().unwrap();
            x.mul(&scale).unwrap()
        } else {
            x
        };
        let weight = |c: &mut CaseBuilder, dt: DType| {
            let w = c.input(dt, &if transposed { [n, k] } else { [k, n] }, Domain::Any).cast(DType::F32).unwrap();
            if transposed {
                w.t().unwrap()
            } else {
                w
            }
        };
        let (wg, wu) = (weight(&mut c, dg), weight(&mut c, du));
        let gate = h.matmul(&wg).unwrap();
        let y = gate.mul(&gate.sigmoid().unwrap()).unwrap().mul(&h.matmul(&wu).unwrap()).unwrap();
        let mut case = c.finish(format!("paired_{rows}x{k}x{n}_{dg:?}_{du:?}_{norm}"), &[&y]);
        case.atol = case.atol.max(2e-4);
        let stats = run_case(&gpu, &case, &CompileOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let kernels: Vec<_> = stats.kernels.iter().map(|k| (k.label.clone(), k.form)).collect();
        if !gpu.f16_native() {
            continue;
        }
        if dg != du {
            // Weights of unlike types are not walked in one loop: a kernel per product.
            assert!(stats.kernels.iter().all(|k| k.label.matches("matmul").count() <= 1), "{}: {kernels:?}", case.name);
            continue;
        }
        assert_eq!(stats.kernels.len(), 1, "{}: {kernels:?}", case.name);
        assert_eq!(stats.kernels[0].label.matches("matmul").count(), 2, "{}: {kernels:?}", case.name);
        let packed = dg != DType::F32;
        assert!(
            matches!(stats.kernels[0].form, KernelForm::Gemv { packed: p, row_prologue: r, .. } if p == packed && r == norm),
            "{}: {kernels:?}",
            case.name
        );
    }
}
