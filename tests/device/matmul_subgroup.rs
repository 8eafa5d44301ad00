//! The subgroup matmul (CPU adapters with a fixed subgroup size): naga validation of its
//! shaders at several subgroup sizes, which operands it reads as vec4 views, and a device
//! sweep against the CPU reference (ragged, batched and broadcast shapes, transposed, sliced
//! and reshaped operands, fused epilogues, attention's head views), with its operands read
//! from textures (the default on lavapipe) and from their buffers.

use crate::common::{Case, CaseBuilder, Domain};
use fusegraph::crates::passes::{partition, FusionMode, Kernel, KernelKind};
use fusegraph::crates::reference::{assert_close, evaluate, tolerance};
use fusegraph::crates::wgsl::{
    gemm_shape, lower, subgroup_matmul, validate, Forms, KernelForm, LowerOptions, CPU_LOOP_BUDGET, TEXTURE_ROW,
};
use fusegraph::{
    CompileOptions, DType, Device, DeviceOptions, GraphBuilder, HostTensor, KernelForms, MatmulFamily, NodeId, Tensor,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Whether a kernel was lowered as the subgroup matmul.
fn on_subgroups(src: &fusegraph::crates::wgsl::KernelSource) -> bool {
    matches!(src.form, KernelForm::SubgroupMatmul { .. })
}

/// Whether `device` lowers f32 products to the subgroup matmul: a CPU adapter with
/// subgroup operations of a fixed size (lavapipe).
fn takes_subgroup_matmul(device: &Device) -> bool {
    let info = device.info();
    info.device_type == fusegraph::crates::runtime::WgpuDeviceType::Cpu
        && info.subgroup_min_size == info.subgroup_max_size
        && device.features().contains(fusegraph::crates::runtime::WgpuFeatures::SUBGROUP)
}

/// Compiles with texture operands wherever `device` allows them, whatever it measured.
fn with_textures(device: &Arc<Device>) -> CompileOptions {
    let forms = KernelForms { texture_operands: true, ..device.kernel_forms() };
    CompileOptions { kernel_forms: Some(forms), ..Default::default() }
}

fn cpu_opts(lanes: u32) -> LowerOptions {
    LowerOptions {
        f16_native: false,
        forms: Forms::SERIAL,
        loop_budget: Some(CPU_LOOP_BUDGET),
        subgroups: true,
        subgroup_size: Some(lanes),
        ..Default::default()
    }
}

/// How each operand of a case's matmul is laid out in memory.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    /// Row-major `[.., rows, cols]`.
    Plain,
    /// Stored `[.., cols, rows]` and transposed.
    Transposed,
    /// Columns 4.. of a wider row-major matrix (an offset view).
    Sliced,
    /// Every other row of a taller matrix (a row stride of 2 rows).
    Strided,
}

fn operand(c: &mut CaseBuilder, batch: &[usize], rows: usize, cols: usize, layout: Layout) -> Tensor {
    let dims = |r: usize, cc: usize| [batch, &[r, cc]].concat();
    let b = batch.len();
    let zeros = vec![0; b];
    let ones = vec![1; b];
    match layout {
        Layout::Plain => c.input(DType::F32, &dims(rows, cols), Domain::Any),
        Layout::Transposed => c.input(DType::F32, &dims(cols, rows), Domain::Any).t().unwrap(),
        Layout::Sliced => {
            let x = c.input(DType::F32, &dims(rows, cols + 8), Domain::Any);
            let start = [zeros.clone(), vec![0, 4]].concat();
            let limit = [batch.to_vec(), vec![rows, cols + 4]].concat();
            x.slice(&start, &limit, &[ones.clone(), vec![1, 1]].concat()).unwrap()
        }
        Layout::Strided => {
            let x = c.input(DType::F32, &dims(2 * rows, cols), Domain::Any);
            let limit = [batch.to_vec(), vec![2 * rows, cols]].concat();
            x.slice(&[zeros, vec![0, 0]].concat(), &limit, &[ones, vec![2, 1]].concat()).unwrap()
        }
    }
}

/// `a · b` (+ bias per column, relu, times a scale per row when `epilogue`), a batched over
/// [2, 1] and b over [3] when `batched`.
fn case((m, k, n): (usize, usize, usize), batched: bool, la: Layout, lb: Layout, epilogue: bool) -> Case {
    let mut c = CaseBuilder::new((m * 131 + k * 7 + n) as u64 + la as u64 * 3 + lb as u64);
    let (ba, bb): (&[usize], &[usize]) = if batched { (&[2, 1], &[3]) } else { (&[], &[]) };
    let a = operand(&mut c, ba, m, k, la);
    let b = operand(&mut c, bb, k, n, lb);
    let mut y = a.matmul(&b).unwrap();
    if epilogue {
        let bias = c.input(DType::F32, &[n], Domain::Any);
        let scale = c.input(DType::F32, &[m, 1], Domain::Any);
        y = y.add(&bias).unwrap().relu().unwrap().mul(&scale).unwrap();
    }
    let mut case = c.finish(format!("sg_{m}x{k}x{n}_b{batched}_{la:?}_{lb:?}_e{epilogue}"), &[&y]);
    case.atol = 1e-3 * (k as f64 / 1000.0).max(0.1);
    case
}

/// Attention's two products on head views of one fused `qkv` projection `[t, 3·h·d]`:
/// scores `Q·Kᵀ` (rhs contiguous along k), then `P·V` (rhs a strided view), then the heads
/// merged back by transpose + reshape into an output projection (an lhs that is no view).
fn attention_case(t: usize, h: usize, d: usize) -> Case {
    let mut c = CaseBuilder::new((t * 31 + h * 7 + d) as u64);
    let qkv = c.input(DType::F32, &[t, 3 * h * d], Domain::Any);
    let split = qkv.reshape(vec![t, 3, h, d]).unwrap();
    let part = |i: usize| {
        split.slice(&[0, i, 0, 0], &[t, i + 1, h, d], &[1, 1, 1, 1]).unwrap().reshape(vec![t, h, d]).unwrap()
    };
    let q = part(0).transpose(&[1, 0, 2]).unwrap();
    let kt = part(1).transpose(&[1, 2, 0]).unwrap();
    let v = part(2).transpose(&[1, 0, 2]).unwrap();
    let scores = q.matmul(&kt).unwrap().tanh().unwrap();
    let heads = scores.matmul(&v).unwrap();
    let merged = heads.transpose(&[1, 0, 2]).unwrap().reshape(vec![t, h * d]).unwrap();
    let w = c.input(DType::F32, &[h * d, h * d], Domain::Any);
    let y = merged.matmul(&w).unwrap();
    let mut case = c.finish(format!("sg_attention_t{t}_h{h}_d{d}"), &[&y]);
    case.atol = 2e-3 * (t.max(h * d) as f64 / 100.0).max(1.0);
    case
}

/// A convolution (an implicit GEMM: weights [o, c·kh·kw] times each image's patches) of
/// `c` input channels (stride, padding, dilation as given), with bias and relu when
/// `epilogue`.
fn conv_case(
    c: usize,
    o: usize,
    hw: usize,
    kernel: usize,
    (stride, pad, dil): (usize, usize, usize),
    epilogue: bool,
) -> Case {
    let mut b = CaseBuilder::new((c * 31 + o * 7 + hw + kernel * 3 + stride + pad + dil) as u64);
    let x = b.input(DType::F32, &[2, c, hw, hw + 1], Domain::Any);
    let w = b.input(DType::F32, &[o, c, kernel, kernel], Domain::Any);
    let mut y = x.conv2d(&w, [stride, stride], [pad, pad], [dil, dil], 1).unwrap();
    if epilogue {
        let oh = y.ty().shape.dims()[2];
        let bias = b.input(DType::F32, &[o, 1, 1], Domain::Any);
        y = y.add(&bias.broadcast_to(vec![2, o, oh, y.ty().shape.dims()[3]]).unwrap()).unwrap().relu().unwrap();
    }
    let mut case = b.finish(format!("sg_conv_c{c}_o{o}_hw{hw}_k{kernel}_s{stride}_p{pad}_d{dil}_e{epilogue}"), &[&y]);
    case.atol = 1e-4 * (c * kernel * kernel) as f64;
    case
}

fn sweep() -> Vec<Case> {
    use Layout::*;
    let mut out = Vec::new();
    // k of 5, 27 and 7 are not multiples of 4 (a ragged last step).
    for shape in [
        (1, 4, 4),
        (7, 32, 36),
        (65, 64, 33),
        (130, 256, 100),
        (8, 12, 1000),
        (64, 8, 64),
        (9, 5, 12),
        (33, 27, 20),
        (70, 7, 36),
    ] {
        out.push(case(shape, false, Plain, Plain, false));
        out.push(case(shape, true, Plain, Plain, true));
        out.push(case(shape, true, Plain, Transposed, false));
        out.push(case(shape, false, Transposed, Sliced, true));
        out.push(case(shape, false, Sliced, Strided, false));
        out.push(case(shape, true, Strided, Transposed, true));
    }
    out.push(attention_case(40, 3, 16));
    out.push(attention_case(9, 2, 8));
    out.push(conv_case(4, 8, 9, 3, (1, 1, 1), true));
    out.push(conv_case(8, 70, 12, 3, (2, 1, 1), false));
    out.push(conv_case(16, 5, 7, 1, (1, 0, 1), true));
    out.push(conv_case(4, 12, 11, 3, (1, 2, 2), false));
    out.push(conv_case(3, 16, 10, 3, (1, 1, 1), true));
    out.push(conv_case(5, 6, 9, 3, (2, 1, 1), false));
    out
}

/// Every kernel of every case validates at subgroup sizes 4 to 32; every matmul kernel takes
/// the subgroup lowering (k is a multiple of 4 throughout the sweep), reading operands that
/// are aligned views as vec4s; a `k` that is not a multiple of 4 keeps the tiled kernel.
#[test]
fn subgroup_kernels_validate_and_read_views_as_vec4() {
    let mut shaders = 0;
    let mut vec4_operands = 0;
    for case in sweep() {
        for mode in [FusionMode::Off, FusionMode::On] {
            for k in &partition(&case.graph, &case.outputs, mode).unwrap() {
                for lanes in [4, 8, 16, 32] {
                    let opts = cpu_opts(lanes);
                    let src = lower(&case.graph, k, &opts);
                    if let Err(e) = validate(&src.wgsl) {
                        panic!("{} kernel {} ({lanes} lanes): {e}\n{}", case.name, src.label, src.wgsl);
                    }
                    // Every product takes it, whatever its `k`.
                    let has_matmul =
                        k.members.iter().any(|&m| matches!(case.graph.node(m).op.name(), "matmul" | "conv2d"));
                    assert_eq!(on_subgroups(&src), has_matmul, "{} kernel {}", case.name, src.label);
                    if let Some(plan) = subgroup_matmul(&case.graph, k, &opts) {
                        // One vec4 binding per distinct binding the views read, and the
                        // output where its rows are a multiple of 4 long.
                        let leaves: std::collections::BTreeSet<_> =
                            [&plan.lhs, &plan.rhs].into_iter().flatten().map(|v| v.leaf).collect();
                        let vec4s = leaves.len() + plan.vec4_store as usize;
                        assert_eq!(src.wgsl.matches("array<vec4<f32>>").count(), vec4s, "{}", case.name);
                        let n = *case.graph.ty(k.outputs[0]).shape.dims().last().unwrap();
                        let rows_of_4 = case.graph.node(k.outputs[0]).op.name() != "conv2d" && n % 4 == 0;
                        assert!(!rows_of_4 || plan.vec4_store, "{}", case.name);
                        assert!(
                            matches!(src.form, KernelForm::SubgroupMatmul { vec4_store, .. } if vec4_store == plan.vec4_store)
                        );
                        assert_eq!(plan.vec4_store, src.wgsl.contains("] = vec4<f32>("), "{}: the store", case.name);
                        vec4_operands += plan.lhs.is_some() as usize + plan.rhs.is_some() as usize;
                        shaders += 1;
                    }
                }
            }
        }
    }
    assert!(shaders >= 4 * 70, "only {shaders} subgroup shaders");
    assert!(vec4_operands >= shaders, "only {vec4_operands} vec4 operands in {shaders} shaders");
    // Plain row-major operands are both views; with k = 5 (not a multiple of 4) the lhs is
    // read through its element function, the rhs (a view along n) still as vec4s.
    let plain = case((33, 16, 40), false, Layout::Plain, Layout::Plain, false);
    let k = &partition(&plain.graph, &plain.outputs, FusionMode::On).unwrap()[0];
    let plan = subgroup_matmul(&plain.graph, k, &cpu_opts(8)).expect("a subgroup matmul");
    assert!(plan.lhs.is_some() && plan.rhs.is_some() && !plan.rhs_transposed);
    assert_eq!((plan.rows, plan.cols()), (40, 32));
    let transposed = case((33, 16, 40), false, Layout::Plain, Layout::Transposed, false);
    let k = &partition(&transposed.graph, &transposed.outputs, FusionMode::On).unwrap()[0];
    assert!(subgroup_matmul(&transposed.graph, k, &cpu_opts(8)).expect("a subgroup matmul").rhs_transposed);
    let odd = case((33, 5, 40), false, Layout::Plain, Layout::Plain, false);
    let k = &partition(&odd.graph, &odd.outputs, FusionMode::On).unwrap()[0];
    let plan = subgroup_matmul(&odd.graph, k, &cpu_opts(8)).expect("a subgroup matmul");
    assert!(plan.lhs.is_none() && plan.rhs.is_some());
    // One step of 4, then the last one: `k4` = 1 for the fifth.
    assert!(lower(&odd.graph, k, &cpu_opts(8)).wgsl.contains("let k4 = 1u;"));
    let odd_t = case((33, 5, 40), false, Layout::Plain, Layout::Transposed, false);
    let k = &partition(&odd_t.graph, &odd_t.outputs, FusionMode::On).unwrap()[0];
    let plan = subgroup_matmul(&odd_t.graph, k, &cpu_opts(8)).expect("a subgroup matmul");
    assert!(plan.lhs.is_none() && plan.rhs.is_none());
    // Attention's heads merged back ([h, t, d] → [t, h, d] → [t, h·d]) feed the output
    // projection as a view whose k is two axes of the binding: (h, t·d) and (d, 1).
    let att = attention_case(40, 3, 16);
    let split: Vec<_> = partition(&att.graph, &att.outputs, FusionMode::On)
        .unwrap()
        .iter()
        .filter_map(|k| subgroup_matmul(&att.graph, k, &cpu_opts(8)))
        .filter(|p| p.lhs_k_axes.len() > 1)
        .map(|p| p.lhs_k_axes)
        .collect();
    assert_eq!(split, vec![vec![(3, 40 * 16), (16, 1)]]);
    // A convolution over 3 channels of 3×3 (k = 27) takes the subgroup kernel with its
    // weights read through their element function; over 4 (k = 36) they are vec4s.
    for (c, vec4) in [(3, false), (4, true)] {
        let conv = conv_case(c, 8, 9, 3, (1, 1, 1), false);
        let k = &partition(&conv.graph, &conv.outputs, FusionMode::On).unwrap()[0];
        let plan = subgroup_matmul(&conv.graph, k, &cpu_opts(8)).expect("a subgroup matmul");
        assert!(plan.lhs.is_some() == vec4 && plan.rhs.is_none(), "c = {c}");
        let src = lower(&conv.graph, k, &cpu_opts(8));
        assert!(matches!(src.form, KernelForm::SubgroupMatmul { conv: true, .. }), "{:?}", src.form);
    }
    // On a GPU with a fixed subgroup size too (the runtime then measures which family runs:
    // `CompileOptions::subgroup_matmul`), not without a fixed subgroup size.
    let gpu = LowerOptions { forms: Forms::PARALLEL, ..cpu_opts(32) };
    let k = &partition(&plain.graph, &plain.outputs, FusionMode::On).unwrap()[0];
    assert!(subgroup_matmul(&plain.graph, k, &cpu_opts(8)).is_some());
    assert!(subgroup_matmul(&plain.graph, k, &gpu).is_some());
    assert!(subgroup_matmul(&plain.graph, k, &LowerOptions { subgroup_size: None, ..cpu_opts(8) }).is_none());
}

/// A fused epilogue's values that are constant along each row of the product (a scale per
/// matmul row, a convolution's bias per output channel) are read once per row in the store
/// loop, and those constant along each column (a matmul's bias per output feature) once per
/// column before the rows; both are passed to `eO_acc`. Both the subgroup and the tiled
/// kernels (the device sweep checks their numbers).
#[test]
fn invariant_epilogue_values_are_read_once_per_row_or_column() {
    let mm = case((65, 64, 33), true, Layout::Plain, Layout::Plain, true);
    let conv = conv_case(3, 8, 9, 3, (1, 1, 1), true);
    let mut c = CaseBuilder::new(5);
    let a = c.input(DType::F32, &[65, 64], Domain::Any);
    let b = c.input(DType::F32, &[64, 33], Domain::Any);
    let bias = c.input(DType::F32, &[33], Domain::Any);
    let column_bias = c.finish("column_bias", &[&a.matmul(&b).unwrap().add(&bias).unwrap()]);
    // A batch norm's scale and shift per channel, computed in the kernel from its statistics
    // (as batch-norm folding leaves them when they are parameters): each computed once per
    // row, not per element.
    let mut c = CaseBuilder::new(6);
    let x = c.input(DType::F32, &[2, 4, 9, 10], Domain::Any);
    let w = c.input(DType::F32, &[8, 4, 3, 3], Domain::Any);
    let var = c.input(DType::F32, &[8, 1, 1], Domain::Positive);
    let gamma = c.input(DType::F32, &[8, 1, 1], Domain::Any);
    let beta = c.input(DType::F32, &[8, 1, 1], Domain::Any);
    let y = x.conv2d(&w, [1, 1], [1, 1], [1, 1], 1).unwrap();
    let dims = y.ty().shape.dims().to_vec();
    let scale = gamma.mul(&var.rsqrt().unwrap()).unwrap().broadcast_to(dims.clone()).unwrap();
    let shift = beta.sub(&gamma.mul(&gamma).unwrap()).unwrap().broadcast_to(dims).unwrap();
    let batch_norm = c.finish("batch_norm", &[&y.mul(&scale).unwrap().add(&shift).unwrap().relu().unwrap()]);
    // (case, values per row, values per column)
    for (c, per_row, per_col) in [(&mm, 1, 1), (&conv, 1, 0), (&column_bias, 0, 1), (&batch_norm, 2, 0)] {
        let k = &partition(&c.graph, &c.outputs, FusionMode::On).unwrap()[0];
        for opts in [cpu_opts(8), LowerOptions { forms: Forms::PARALLEL, subgroups: false, ..cpu_opts(8) }] {
            let src = lower(&c.graph, k, &opts).wgsl;
            validate(&src).unwrap_or_else(|e| panic!("{}: {e}\n{src}", c.name));
            let head = src.lines().find(|l| l.contains("_acc(i: u32, acc: f32")).expect("an epilogue");
            assert_eq!(head.matches(", h").count(), per_row + per_col, "{}: {head}", c.name);
            let main = &src[src.find("@compute").expect("main")..];
            let first_row = main.find("let idx = ").expect("a row");
            let is_read = |l: &str, col: bool| {
                let l = l.trim_start();
                l.starts_with("let h") && l.split(" = ").next().is_some_and(|name| name.contains('_') == col)
            };
            // Row values inside each row; column values once, before the rows.
            let row_reads = main.lines().filter(|l| is_read(l, false)).count();
            let rows = main.matches("let idx = ").count();
            assert!(rows > 1 && row_reads == per_row * rows, "{}: {row_reads} row reads, {rows} rows", c.name);
            let col_reads = main.lines().filter(|l| is_read(l, true)).count();
            let before = main[..first_row].lines().filter(|l| is_read(l, true)).count();
            assert!(col_reads == before && (col_reads > 0) == (per_col > 0), "{}: {col_reads} column reads", c.name);
        }
    }
}

/// On the test device, fused and unfused, every case matches the reference; where the device
/// is a CPU adapter with a fixed subgroup size (lavapipe) its matmuls take the subgroup
/// lowering (checked in the WGSL the executable compiled).
#[test]
fn subgroup_matmul_matches_the_reference() {
    let device = Device::shared().expect("a device");
    let expect_sg = takes_subgroup_matmul(&device);
    eprintln!("device: {} (subgroup matmul expected: {expect_sg})", device.describe());
    let dir = std::env::temp_dir().join(format!("fusegraph_sg_{}", std::process::id()));
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in sweep() {
        let feeds: BTreeMap<String, HostTensor> = case.feeds.iter().cloned().collect();
        let want = evaluate(&case.graph, &case.outputs, &feeds, &BTreeMap::new()).expect("reference");
        let refs: Vec<(&str, &HostTensor)> = case.feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
        for fusion in [true, false] {
            let _ = std::fs::remove_dir_all(&dir);
            let fusion = if fusion { FusionMode::On } else { FusionMode::Off };
            let opts = CompileOptions { fusion, dump_wgsl: Some(dir.clone()), ..Default::default() };
            let exe = device.compile(&case.graph, &case.outputs, &opts).expect("compiles");
            let kernels = &exe.stats().kernels;
            let sg = kernels.iter().any(|k| matches!(k.form, KernelForm::SubgroupMatmul { .. }));
            // A subgroup kernel carries no tiling, and every kernel's WGSL was dumped.
            let stats_sg = kernels.iter().any(|k| k.subgroup_matmul() && k.matmul_tiling.is_none());
            assert_eq!(std::fs::read_dir(&dir).expect("dumped WGSL").count(), kernels.len(), "{}", case.name);
            if sg != expect_sg || stats_sg != sg {
                failures.push(format!(
                    "{} ({fusion:?}): subgroup matmul {sg} (stats {stats_sg}), expected {expect_sg}",
                    case.name
                ));
            }
            let got = exe.run(&refs).expect("runs");
            let (rtol, atol) = tolerance(DType::F32);
            if let Err(e) = assert_close(&got[0], &want[0], rtol, atol.max(case.atol)) {
                failures.push(format!("{} ({fusion:?}): {e}", case.name));
            }
            checked += 1;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(checked, 2 * sweep().len());
    assert!(failures.is_empty(), "{} of {checked} failed:\n{}", failures.len(), failures.join("\n"));
}

/// f16 storage with f32 accumulation (mixed precision's products) takes the subgroup
/// matmul too where f16 is native: views of f16 bindings are read as `vec4<f16>` and
/// widened; products match the reference within f16 tolerance, fused and unfused.
#[test]
fn f16_products_take_the_subgroup_matmul() {
    let native = LowerOptions { f16_native: true, ..cpu_opts(8) };
    let mut cases = Vec::new();
    for (m, k, n, transposed) in [(65, 64, 33, false), (7, 32, 36, true), (40, 256, 12, false)] {
        let mut c = CaseBuilder::new((m + k + n) as u64);
        let a = c.input(DType::F16, &[m, k], Domain::Any);
        let b = if transposed {
            c.input(DType::F16, &[n, k], Domain::Any).t().unwrap()
        } else {
            c.input(DType::F16, &[k, n], Domain::Any)
        };
        let bias = c.input(DType::F16, &[n], Domain::Any);
        let y = a.matmul(&b).unwrap().add(&bias).unwrap().relu().unwrap();
        let mut case = c.finish(format!("f16_{m}x{k}x{n}_t{transposed}"), &[&y]);
        case.atol = 2e-3 * (k as f64).sqrt();
        cases.push(case);
    }
    // Mixed precision's weights: f32, rounded to f16 on their way into the product.
    let mut c = CaseBuilder::new(3);
    let a = c.input(DType::F16, &[33, 48], Domain::Any);
    let w = c.input(DType::F32, &[48, 20], Domain::Any).cast(DType::F16).unwrap();
    let mut cast = c.finish("f16_cast_weights", &[&a.matmul(&w).unwrap()]);
    cast.atol = 2e-3 * 7.0;
    cases.push(cast);
    let mut b = CaseBuilder::new(9);
    let x = b.input(DType::F16, &[2, 4, 9, 10], Domain::Any);
    let w = b.input(DType::F16, &[8, 4, 3, 3], Domain::Any);
    let y = x.conv2d(&w, [1, 1], [1, 1], [1, 1], 1).unwrap();
    let mut conv = b.finish("f16_conv", &[&y]);
    conv.atol = 2e-3 * 6.0;
    cases.push(conv);
    for case in &cases {
        let k = &partition(&case.graph, &case.outputs, FusionMode::On).unwrap()[0];
        let lowered = lower(&case.graph, k, &native);
        let src = &lowered.wgsl;
        validate(src).unwrap_or_else(|e| panic!("{}: {e}\n{src}", case.name));
        assert!(on_subgroups(&lowered), "{}: no subgroup matmul\n{src}", case.name);
        // Views of f16 bindings are declared and read as vec4<f16>; the f32 weights below a
        // cast as vec4<f32>, rounded per vec4.
        assert!(src.contains("array<vec4<f16>>") && src.contains("vec4<f32>(b"), "{}\n{src}", case.name);
        let cast = case.name == "f16_cast_weights";
        assert_eq!(src.contains("array<vec4<f32>>"), cast, "{}\n{src}", case.name);
        assert_eq!(src.contains("= fg_round_f16x4(b"), cast, "{}\n{src}", case.name);
        // Packed f16 (no native f16) keeps the tiled kernel.
        assert!(!on_subgroups(&lower(&case.graph, k, &cpu_opts(8))), "{}", case.name);
    }
    let device = Device::shared().expect("a device");
    let expect_sg = takes_subgroup_matmul(&device) && device.f16_native();
    for case in &cases {
        let feeds: BTreeMap<String, HostTensor> = case.feeds.iter().cloned().collect();
        let want = evaluate(&case.graph, &case.outputs, &feeds, &BTreeMap::new()).expect("reference");
        let refs: Vec<(&str, &HostTensor)> = case.feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
        for fusion in [FusionMode::On, FusionMode::Off] {
            let exe =
                device.compile(&case.graph, &case.outputs, &CompileOptions { fusion, ..Default::default() }).unwrap();
            let sg = exe.stats().kernels.iter().any(|k| k.subgroup_matmul() && k.matmul_tiling.is_none());
            assert_eq!(sg, expect_sg, "{} ({fusion:?})", case.name);
            let got = exe.run(&refs).unwrap();
            let (rtol, atol) = tolerance(DType::F16);
            assert_close(&got[0], &want[0], rtol, atol.max(case.atol))
                .unwrap_or_else(|e| panic!("{} ({fusion:?}): {e}", case.name));
        }
    }
}

fn texture_opts(rows: u32) -> LowerOptions {
    LowerOptions { texture_operands: Some(rows), ..cpu_opts(8) }
}

/// With texture operands, the bindings the subgroup matmul reads as vec4 views (lhs and
/// rhs, either rhs layout, sliced, strided and head views, convolution weights) and the
/// inputs that an operand without a view reads inside the `k` loop (a convolution's image,
/// a transposed lhs through its element function) become `texture_2d<f32>` bindings read
/// through `fg_tK` — those of whole vec4s — every shader validates, and no storage access to
/// them is left. A binding of more vec4s than `rows · TEXTURE_ROW` keeps its buffer.
#[test]
fn texture_operands_replace_the_vec4_views_that_fit() {
    let (mut textures, mut skipped) = (0, 0);
    for case in sweep() {
        for k in partition(&case.graph, &case.outputs, FusionMode::On).unwrap() {
            let Some(plan) = subgroup_matmul(&case.graph, &k, &texture_opts(16384)) else { continue };
            let src = lower(&case.graph, &k, &texture_opts(16384));
            validate(&src.wgsl).unwrap_or_else(|e| panic!("{}: {e}\n{}", case.name, src.wgsl));
            let contraction = *k
                .members
                .iter()
                .find(|&&m| matches!(case.graph.node(m).op, fusegraph::Op::MatMul | fusegraph::Op::Conv2d { .. }))
                .expect("a contraction");
            let conv = matches!(case.graph.node(contraction).op, fusegraph::Op::Conv2d { .. });
            let ops = case.graph.operands(contraction).to_vec();
            let (lhs_op, rhs_op) = if conv { (ops[1], ops[0]) } else { (ops[0], ops[1]) };
            // Only operands whose elements the kernel loads more than once: the lhs where
            // the product has more columns than a workgroup's 32 (8 lanes × 4), the rhs where
            // it has more rows than a workgroup's, either where its binding is smaller than
            // the operand (shared by the batch), and every operand of a convolution.
            let (gemm, _) = gemm_shape(&case.graph, &k, &texture_opts(16384)).expect("a GEMM");
            let reused = |side: usize, n: NodeId| {
                let numel = case.graph.ty(n).shape.numel();
                conv || match side {
                    0 => gemm.n > 32 || numel < gemm.batch * gemm.m * gemm.k,
                    _ => gemm.m > plan.rows || numel < gemm.batch * gemm.k * gemm.n,
                }
            };
            let mut expected: Vec<NodeId> = [&plan.lhs, &plan.rhs]
                .into_iter()
                .enumerate()
                .filter_map(|(side, v)| v.as_ref().map(|v| v.leaf).filter(|&n| reused(side, n)))
                .collect();
            for (side, (view, op)) in [(&plan.lhs, lhs_op), (&plan.rhs, rhs_op)].into_iter().enumerate() {
                let mut stack = if view.is_none() { vec![op] } else { vec![] };
                while let Some(n) = stack.pop() {
                    if k.members.contains(&n) {
                        stack.extend(case.graph.operands(n).iter().copied());
                    } else if case.graph.ty(n).shape.numel() % 4 == 0 && reused(side, n) && !expected.contains(&n) {
                        expected.push(n);
                    }
                }
            }
            skipped += [&plan.lhs, &plan.rhs].into_iter().flatten().filter(|v| !expected.contains(&v.leaf)).count();
            assert_eq!(plan.textures, expected, "{}", case.name);
            for (b, binding) in src.bindings.iter().enumerate() {
                assert_eq!(binding.texture, expected.contains(&binding.node) && !binding.output, "{}", case.name);
                let declared = format!("var b{b}: texture_2d<f32>;");
                assert_eq!(src.wgsl.contains(&declared), binding.texture, "{}\n{}", case.name, src.wgsl);
                // No storage access is left to a texture binding.
                assert!(!binding.texture || !src.wgsl.contains(&format!("b{b}[")), "{}\n{}", case.name, src.wgsl);
                textures += binding.texture as usize;
            }
        }
    }
    assert!(textures >= 40, "only {textures} texture operands");
    // The sweep's products of at most 64 rows read their rhs from its buffer.
    assert!(skipped >= 20, "only {skipped} operands loaded once");
    // A skinny product loads its rhs once: no texture for it, the lhs (loaded once per 32
    // columns) in one.
    let c = case((8, 64, 256), false, Layout::Plain, Layout::Plain, false);
    let k = &partition(&c.graph, &c.outputs, FusionMode::On).unwrap()[0];
    let skinny = subgroup_matmul(&c.graph, k, &texture_opts(16384)).expect("a subgroup matmul");
    assert_eq!(skinny.textures, vec![skinny.lhs.as_ref().expect("a view").leaf]);
    // A weight shared by a batch of skinny products is loaded by each of them.
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [4, 8, 64]).unwrap();
    let w = b.input("w", DType::F32, [64, 256]).unwrap();
    let y = x.matmul(&w).unwrap();
    let shared = &partition(&b.graph(), &[y.id()], FusionMode::On).unwrap()[0];
    assert_eq!(subgroup_matmul(&b.graph(), shared, &texture_opts(16384)).expect("a subgroup matmul").textures.len(), 2);
    // [65, 64] holds 1,040 vec4s, more than one row of a texture; [64, 36] 576.
    let c = case((65, 64, 36), false, Layout::Plain, Layout::Plain, false);
    let k = &partition(&c.graph, &c.outputs, FusionMode::On).unwrap()[0];
    const { assert!(65 * 64 / 4 > TEXTURE_ROW && 64 * 36 / 4 <= TEXTURE_ROW) };
    let one_row = subgroup_matmul(&c.graph, k, &texture_opts(1)).expect("a subgroup matmul");
    let rhs = one_row.rhs.as_ref().expect("a view").leaf;
    assert_eq!(one_row.textures, vec![rhs]);
    let two_rows = subgroup_matmul(&c.graph, k, &texture_opts(2)).expect("a subgroup matmul");
    assert_eq!(two_rows.textures.len(), 2);
    assert!(subgroup_matmul(&c.graph, k, &cpu_opts(8)).expect("a subgroup matmul").textures.is_empty());
    // An lhs concatenated from 20 inputs along `k` reads each through its element function:
    // 16 of them become textures (WebGPU's minimum of sampled textures per stage), the rest
    // stay buffers.
    let mut b = CaseBuilder::new(8);
    let parts: Vec<Tensor> = (0..20).map(|_| b.input(DType::F32, &[12, 4], Domain::Any)).collect();
    let rhs = b.input(DType::F32, &[80, 8], Domain::Any);
    let lhs = b.b.concat(&parts.iter().collect::<Vec<_>>(), 1).unwrap();
    let many = b.finish("concat_lhs", &[&lhs.matmul(&rhs).unwrap()]);
    // (The fusion pass keeps a concatenation out of a product's kernel; the kernel is made
    // by hand.)
    let (cat, product) = (lhs.id(), many.outputs[0]);
    let k = Kernel {
        kind: KernelKind::Loop,
        members: vec![cat, product],
        outputs: vec![product],
        inputs: parts.iter().map(|p| p.id()).chain([rhs.id()]).collect(),
    };
    let src = lower(&many.graph, &k, &texture_opts(16384));
    validate(&src.wgsl).unwrap_or_else(|e| panic!("{e}\n{}", src.wgsl));
    assert_eq!(src.bindings.iter().filter(|b| b.texture).count(), 16);
}

/// The executable copies each texture operand into its workspace texture before the kernel
/// that reads it. On the test device, with texture operands on and off, every case of the
/// sweep matches the reference (fused); where the device is lavapipe, the kernels that read
/// textures are those with vec4 views, and only the executables with textures hold a
/// workspace.
#[test]
fn texture_operands_match_the_buffer_reads() {
    let on = Device::shared().expect("a device");
    let off = Arc::new(Device::new(&DeviceOptions { texture_operands: Some(false), ..Default::default() }).unwrap());
    let expect = takes_subgroup_matmul(&on);
    let mut failures = Vec::new();
    let mut textured = 0;
    for case in sweep() {
        let feeds: BTreeMap<String, HostTensor> = case.feeds.iter().cloned().collect();
        let want = evaluate(&case.graph, &case.outputs, &feeds, &BTreeMap::new()).expect("reference");
        let refs: Vec<(&str, &HostTensor)> = case.feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
        for (device, textures) in [(&on, true), (&off, false)] {
            let exe = device.compile(&case.graph, &case.outputs, &with_textures(device)).expect("compiles");
            let stats = exe.stats();
            let read = stats.kernels.iter().map(|k| k.texture_operands()).sum::<usize>();
            // As many as the lowering makes textures (checked in the test above).
            let lowered = partition(&case.graph, &case.outputs, FusionMode::On)
                .unwrap()
                .iter()
                .map(|k| lower(&case.graph, k, &texture_opts(16384)).bindings.iter().filter(|b| b.texture).count())
                .sum::<usize>();
            let expected = if textures && expect { lowered } else { 0 };
            if read != expected || (stats.workspace_bytes > 0) != (read > 0) {
                failures.push(format!(
                    "{} (textures {textures}): {read} texture operands, {expected} expected, workspace {} bytes",
                    case.name, stats.workspace_bytes
                ));
            }
            textured += read;
            let got = exe.run(&refs).expect("runs");
            let (rtol, atol) = tolerance(DType::F32);
            if let Err(e) = assert_close(&got[0], &want[0], rtol, atol.max(case.atol)) {
                failures.push(format!("{} (textures {textures}): {e}", case.name));
            }
        }
    }
    assert!(!expect || textured >= 60, "only {textured} texture operands");
    assert!(failures.is_empty(), "{} failed:\n{}", failures.len(), failures.join("\n"));
}

/// The workspace is device memory like any buffer: counted in `memory_allocated` and the
/// executable's `device_bytes`, released with the executable, and held only where the
/// memory limit leaves room for it beside the buffers — a limit one byte short of buffers
/// plus workspace compiles with buffer reads instead, and still computes the product.
#[test]
fn the_workspace_is_counted_and_yields_to_the_memory_limit() {
    let c = case((130, 256, 100), true, Layout::Plain, Layout::Plain, true);
    let feeds: BTreeMap<String, HostTensor> = c.feeds.iter().cloned().collect();
    let want = evaluate(&c.graph, &c.outputs, &feeds, &BTreeMap::new()).expect("reference");
    let refs: Vec<(&str, &HostTensor)> = c.feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let device = Arc::new(Device::new(&DeviceOptions::default()).unwrap());
    let exe = device.compile(&c.graph, &c.outputs, &with_textures(&device)).unwrap();
    let s = exe.stats().clone();
    assert_eq!(device.memory().allocated, s.device_bytes);
    // Every buffer is at least 4 bytes (the empty persistent region's too).
    let buffers: u64 = [s.arena_bytes, s.persistent_bytes, s.staging_bytes].iter().map(|&b| b.max(4)).sum();
    assert_eq!(s.device_bytes, buffers + s.workspace_bytes);
    if !takes_subgroup_matmul(&device) {
        assert_eq!(s.workspace_bytes, 0);
        return;
    }
    // Two textures (lhs, rhs) as tall as their values need, 16-byte texels: lhs [2, 1, 130,
    // 256] as 16,640 vec4s (17 rows), rhs [3, 256, 100] as 19,200 (19 rows).
    assert_eq!(s.workspace_bytes, (17 + 19) * TEXTURE_ROW as u64 * 16);
    let got = exe.run(&refs).unwrap();
    drop(exe);
    assert_eq!(device.memory().allocated, 0);
    let (rtol, atol) = tolerance(DType::F32);
    assert_close(&got[0], &want[0], rtol, atol.max(c.atol)).unwrap();
    for (limit, workspace) in [(s.device_bytes, s.workspace_bytes), (s.device_bytes - 1, 0)] {
        let opts = CompileOptions { memory_limit: Some(limit), ..with_textures(&device) };
        let exe = device.compile(&c.graph, &c.outputs, &opts).unwrap();
        assert_eq!(exe.stats().workspace_bytes, workspace, "limit {limit}");
        assert!(exe.stats().device_bytes <= limit);
        let reads = exe.stats().kernels.iter().map(|k| k.texture_operands()).sum::<usize>();
        assert_eq!(reads > 0, workspace > 0);
        let got = exe.run(&refs).unwrap();
        assert_close(&got[0], &want[0], rtol, atol.max(c.atol)).unwrap();
    }
}

/// Where the subgroup matmul and the tiled kernel both apply, which one runs is measured once
/// per shape class (autotuning on) and cached, the winner is the one compiled, and either can
/// be forced; all three agree with the reference.
#[test]
fn the_matmul_family_is_measured_per_class_and_can_be_forced() {
    let dir = std::env::temp_dir().join(format!("fusegraph-family-{}", std::process::id()));
    let opts = DeviceOptions { autotune: Some(true), cache_dir: Some(dir.clone()), ..Default::default() };
    let device = Arc::new(Device::new(&opts).expect("a device"));
    let info = device.info();
    let fixed = info.subgroup_min_size == info.subgroup_max_size
        && (4..=64).contains(&info.subgroup_min_size)
        && device.features().contains(fusegraph::crates::runtime::WgpuFeatures::SUBGROUP);
    if !fixed {
        eprintln!("skipped: {} has no fixed subgroup size, so only the tiled family applies", device.describe());
        return;
    }
    let (m, k, n) = (128, 160, 192);
    assert!(m * k * n >= fusegraph::crates::runtime::MIN_TUNED_MACS);
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [m, k]).unwrap();
    let w = b.input("w", DType::F32, [k, n]).unwrap();
    let y = x.matmul(&w).unwrap().relu().unwrap();
    let g = b.graph();
    let feeds = BTreeMap::from([
        ("x".to_string(), HostTensor::new([m, k], fusegraph_workloads::random_values(1, m * k)).unwrap()),
        ("w".to_string(), HostTensor::new([k, n], fusegraph_workloads::random_values(2, k * n)).unwrap()),
    ]);
    let want = evaluate(&g, &[y.id()], &feeds, &BTreeMap::new()).unwrap().remove(0);
    let refs: Vec<(&str, &HostTensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let run = |matmul_family: MatmulFamily| {
        let exe = device.compile(&g, &[y.id()], &CompileOptions { matmul_family, ..Default::default() }).unwrap();
        let got = exe.run(&refs).unwrap().remove(0);
        assert_close(&got, &want, 1e-4, 1e-4).unwrap();
        exe.stats().kernels.iter().map(|k| k.form).find(|f| !matches!(f, KernelForm::Loop { .. })).unwrap()
    };
    let chosen = run(MatmulFamily::Measured);
    let families = device.tuned().families;
    assert_eq!(families.len(), 1, "one class measured: {families:?}");
    assert_eq!(families[0].timings.len(), 2, "both families timed");
    assert_eq!(matches!(chosen, KernelForm::SubgroupMatmul { .. }), families[0].subgroup, "{chosen:?}");
    assert!(matches!(run(MatmulFamily::Subgroup), KernelForm::SubgroupMatmul { .. }));
    assert!(matches!(run(MatmulFamily::Tiled), KernelForm::TiledMatmul { .. }));
    // Cached on disk: a new device reads the choice instead of measuring.
    let again = Arc::new(Device::new(&opts).expect("a device"));
    let exe = again.compile(&g, &[y.id()], &CompileOptions::default()).unwrap();
    assert!(exe.stats().kernels.iter().any(|k| k.form == chosen));
    assert!(again.tuned().families.iter().all(|f| f.timings.is_empty()), "read, not measured");
    eprintln!("measured {:?} on {}", families[0].timings, device.describe());
    let _ = std::fs::remove_dir_all(&dir);
}
