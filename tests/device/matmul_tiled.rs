//! The tiled matmul lowering: naga validation of its shaders (every dtype and f16 form,
//! ragged and batched shapes, transposed operands, fused epilogues), device sweeps against
//! the CPU reference (every candidate tiling included), and the cooperative-matrix kernel.

use crate::common;

use crate::common::{Case, CaseBuilder, Domain};
use fusegraph::crates::passes::{partition, FusionMode};
use fusegraph::crates::runtime::Cooperative;
use fusegraph::crates::wgsl::{lower, lower_with, validate, Forms, KernelForm, LowerOptions, Strategy};
use fusegraph::{CompileOptions, DType, Device, DeviceOptions, ExecutableStats, MatmulTiling, Tensor};
use std::sync::Arc;

/// `(m, k, n)`. The last but one takes the 128×128 tiles (m and n ≥ 128), ragged in m, n
/// and k. Operands whose rows are whole vec4s (k or n a multiple of 4) are staged a vec4 per
/// load: both of the last shape, ragged against every tile and `k` slice, and of 64³ and
/// 128×256×64; the lhs alone of 100×1000×7 and 130×40×258.
const SHAPES: [(usize, usize, usize); 8] =
    [(1, 1, 1), (7, 33, 5), (64, 64, 64), (65, 17, 129), (100, 1000, 7), (128, 256, 64), (130, 40, 258), (66, 72, 100)];

/// A matmul case: plain 2-D, or batched lhs [2,1,m,k] (transposed when `transposed`) times
/// rhs [3,k,n], with the epilogue `relu(x + bias)` when `epilogue`.
fn case(dt: DType, (m, k, n): (usize, usize, usize), batched: bool, transposed: bool, epilogue: bool) -> Case {
    let mut c = CaseBuilder::new((m * 131 + k * 7 + n) as u64 + dt as u64);
    let lb: &[usize] = if batched { &[2, 1] } else { &[] };
    let rb: &[usize] = if batched { &[3] } else { &[] };
    let a = if transposed {
        c.input(dt, &[lb, &[k, m]].concat(), Domain::Any).t().unwrap()
    } else {
        c.input(dt, &[lb, &[m, k]].concat(), Domain::Any)
    };
    let b = c.input(dt, &[rb, &[k, n]].concat(), Domain::Any);
    let mut y = a.matmul(&b).unwrap();
    if epilogue {
        let bias = c.input(dt, &[n], Domain::Any);
        y = y.add(&bias).unwrap().relu().unwrap();
    }
    let name = format!("matmul_{dt}_{m}x{k}x{n}_b{batched}_t{transposed}_e{epilogue}");
    let mut case = c.finish(name, &[&y]);
    // Long f32 accumulations round differently in another order.
    case.atol = 1e-3 * (k as f64 / 1000.0).max(0.1);
    case.f16_tol = 1e-2;
    case
}

fn sweep(dtypes: &[DType]) -> Vec<Case> {
    let mut out = Vec::new();
    for &dt in dtypes {
        for shape in SHAPES {
            out.push(case(dt, shape, false, false, false));
            out.push(case(dt, shape, true, true, true));
            out.push(case(dt, shape, true, false, true));
        }
    }
    out
}

/// Whether a kernel was lowered as the workgroup-tiled matmul.
fn is_tiled(src: &fusegraph::crates::wgsl::KernelSource) -> bool {
    matches!(src.form, KernelForm::TiledMatmul { .. })
}

/// Whether the lowering of `case`'s kernels (fused) takes the tiled path (the tiled family,
/// not the subgroup one, where both apply).
fn tiled(case: &Case, opts: &LowerOptions) -> bool {
    let kernels = partition(&case.graph, &case.outputs, FusionMode::On).unwrap();
    let strategy = Strategy { subgroup_matmul: false, ..Default::default() };
    kernels.iter().any(|k| is_tiled(&lower_with(&case.graph, k, opts, &strategy)))
}

#[test]
fn tiled_kernels_validate_in_every_dtype_and_f16_form() {
    let mut shaders = 0;
    for case in sweep(&[DType::F32, DType::F16, DType::I32, DType::U32]) {
        for mode in [FusionMode::Off, FusionMode::On] {
            for k in &partition(&case.graph, &case.outputs, mode).unwrap() {
                for f16_native in [false, true] {
                    for cpu in [false, true] {
                        let opts = crate::common::lower_options(cpu, f16_native);
                        for strategy in [Strategy::default(), Strategy { tiled_matmul: false, ..Default::default() }] {
                            let src = lower_with(&case.graph, k, &opts, &strategy);
                            if let Err(e) = validate(&src.wgsl) {
                                panic!("{} kernel {} ({opts:?}, {strategy:?}): {e}", case.name, src.label);
                            }
                            assert!(strategy.tiled_matmul || !is_tiled(&src));
                            shaders += 1;
                        }
                    }
                }
            }
        }
        // The tiled path is taken except for packed f16 outputs with an odd row length.
        let n = case.graph.ty(case.outputs[0]).shape.dims().last().copied().unwrap();
        let packed_odd = case.graph.ty(case.outputs[0]).dtype == DType::F16 && n % 2 == 1;
        assert!(tiled(&case, &crate::common::lower_options(true, true)), "{} not tiled", case.name);
        assert_eq!(tiled(&case, &crate::common::lower_options(true, false)), !packed_odd, "{}", case.name);
    }
    assert!(shaders > 500, "only {shaders} shaders validated");
}

#[test]
fn every_candidate_tiling_validates() {
    let mut shaders = 0;
    for case in sweep(&[DType::F32, DType::F16, DType::I32]) {
        // The f16 storage form only matters for f16.
        let f16 = case.graph.ty(case.outputs[0]).dtype == DType::F16;
        for k in &partition(&case.graph, &case.outputs, FusionMode::On).unwrap() {
            for f16_native in if f16 { vec![false, true] } else { vec![true] } {
                let opts = crate::common::lower_options(true, f16_native);
                for tiling in MatmulTiling::CANDIDATES {
                    let strategy = Strategy { matmul_tiling: Some(tiling), ..Default::default() };
                    let src = lower_with(&case.graph, k, &opts, &strategy);
                    if let Err(e) = validate(&src.wgsl) {
                        panic!("{} kernel {} ({opts:?}, {tiling}): {e}", case.name, src.label);
                    }
                    shaders += is_tiled(&src) as usize;
                    // Operands that are bindings with rows of whole vec4s (both here, unless
                    // the lhs is transposed; packed f16 never) are loaded a vec4 of their
                    // storage type at a time, into registers one `k` slice ahead.
                    if case.name.contains("_66x72x100_") && is_tiled(&src) {
                        let dt = case.graph.ty(case.outputs[0]).dtype;
                        let elem = match dt {
                            DType::F16 if f16_native => Some("f16"),
                            DType::F16 => None,
                            DType::I32 => Some("i32"),
                            _ => Some("f32"),
                        };
                        let lhs = elem.filter(|_| !case.name.contains("_ttrue"));
                        let declared = |r: &str, e: Option<&str>| {
                            e.is_some_and(|e| src.wgsl.contains(&format!("var {r}0 = vec4<{e}>();")))
                        };
                        assert_eq!(declared("pa", lhs), lhs.is_some(), "{} [{tiling}]", case.name);
                        assert_eq!(declared("pb", elem), elem.is_some(), "{} [{tiling}]", case.name);
                        let KernelForm::TiledMatmul { vec4_lhs, vec4_rhs, .. } = src.form else { unreachable!() };
                        assert_eq!((vec4_lhs, vec4_rhs), (lhs.is_some(), elem.is_some()), "{}", case.name);
                        // Turned off (for comparisons): every value through the element functions.
                        let off = Strategy { vec4_operands: false, ..strategy };
                        let plain = lower_with(&case.graph, k, &opts, &off);
                        validate(&plain.wgsl)
                            .unwrap_or_else(|e| panic!("{} [{tiling}] without vec4 operands: {e}", case.name));
                        let vec4 =
                            matches!(plain.form, KernelForm::TiledMatmul { vec4_lhs: false, vec4_rhs: false, .. });
                        assert!(vec4, "{}", case.name);
                    }
                    // Each invocation's columns side by side (for comparisons): also valid, and
                    // different from the default wherever a block has two groups of four.
                    let blocked = lower_with(&case.graph, k, &opts, &Strategy { blocked_columns: true, ..strategy });
                    if let Err(e) = validate(&blocked.wgsl) {
                        panic!("{} kernel {} ({tiling}, blocked columns): {e}", case.name, blocked.label);
                    }
                    if is_tiled(&src) && tiling.bn > 4 {
                        assert_ne!(blocked.wgsl, src.wgsl, "{} [{tiling}]", case.name);
                        // The second group of four is `gx` fours after the first.
                        let second =
                            format!("let b1 = fg_tile_b[kk * {}u + {}u + tx];", tiling.tile().1 / 4, tiling.gx);
                        assert!(src.wgsl.contains(&second), "{} [{tiling}]: no `{second}`", case.name);
                    }
                }
            }
        }
    }
    assert!(shaders > 400, "only {shaders} tiled shaders validated");
}

/// Each candidate an autotuner may pick computes what the reference does, over the sweep of
/// ragged, batched, transposed and fused shapes (f32; f16 and i32 plain). Candidates with 256
/// or more outputs per invocation take seconds each to compile on lavapipe; they run a
/// subset that still has every edge ragged, batches, a transposed operand, an epilogue,
/// f16 and i32.
#[test]
fn every_candidate_tiling_matches_the_reference() {
    let device = Device::shared().expect("a device");
    let cases: Vec<Case> = sweep(&[DType::F32])
        .into_iter()
        .chain(
            SHAPES
                .iter()
                .flat_map(|&s| [case(DType::F16, s, false, false, false), case(DType::I32, s, false, false, false)]),
        )
        .collect();
    let mut failures = Vec::new();
    let mut ran = 0;
    for tiling in MatmulTiling::CANDIDATES {
        let opts = CompileOptions { matmul_tiling: Some(tiling), ..Default::default() };
        let heavy = tiling.bm * tiling.bn >= 256;
        let subset = [
            "_7x33x5_bfalse",
            "_65x17x129_",
            "_130x40x258_btrue_tfalse",
            "_100x1000x7_bfalse",
            "_66x72x100_btrue_tfalse",
        ];
        for case in cases.iter().filter(|c| !heavy || subset.iter().any(|s| c.name.contains(s))) {
            let n = case.graph.ty(case.outputs[0]).shape.dims().last().copied().unwrap();
            let packed_odd = case.graph.ty(case.outputs[0]).dtype == DType::F16 && !device.f16_native() && n % 2 == 1;
            if packed_odd {
                continue;
            }
            ran += 1;
            if let Err(e) = check_with(&device, case, &opts) {
                failures.push(format!("{} [{tiling}]: {e}", case.name));
            }
        }
    }
    eprintln!("{ran} device checks, {} failed", failures.len());
    assert!(ran >= 6 * 25 + 3 * 8, "only {ran} checks");
    assert!(failures.is_empty(), "{} of {ran} failed:\n{}", failures.len(), failures.join("\n"));
}

/// Operands that are strided views of bindings — reshapes (as a transformer's `[1, s, d]`
/// activations seen as `[s, d]`), transposes, attention's heads split out of `[s, h·d]`
/// (`Q` and `Kᵀ`), a slice from an aligned row — are read from their bindings a vec4 at a
/// time like bindings; a view whose vec4s would not be aligned is not. Checked on the GPU
/// form of the lowering and, with the plain kernel's 64×64 and 128×128 tilings forced, against the
/// reference.
#[test]
fn strided_operands_are_read_as_vec4s() {
    let (m, k, n) = (68, 72, 100);
    let (h, d) = (3, 20);
    let build = |variant: &str| {
        let mut c = CaseBuilder::new(91 + variant.len() as u64);
        let (a, b) = match variant {
            "reshape" => (
                c.input(DType::F32, &[1, m, k], Domain::Any).reshape(vec![m, k]).unwrap(),
                c.input(DType::F32, &[k * n], Domain::Any).reshape(vec![k, n]).unwrap(),
            ),
            "transpose" => (
                c.input(DType::F32, &[k, m], Domain::Any).t().unwrap(),
                c.input(DType::F32, &[n, k], Domain::Any).t().unwrap(),
            ),
            "heads" => {
                let split = |t: Tensor, perm: &[usize]| t.reshape(vec![m, h, d]).unwrap().transpose(perm).unwrap();
                let q = split(c.input(DType::F32, &[m, h * d], Domain::Any), &[1, 0, 2]);
                let kt = split(c.input(DType::F32, &[m, h * d], Domain::Any), &[1, 2, 0]);
                (q, kt)
            }
            "slice" => (
                c.input(DType::F32, &[m + 2, k], Domain::Any).slice(&[1, 0], &[m + 1, k], &[1, 1]).unwrap(),
                c.input(DType::F32, &[k, n], Domain::Any),
            ),
            _ => (
                c.input(DType::F32, &[m, k + 4], Domain::Any).slice(&[0, 1], &[m, k + 1], &[1, 1]).unwrap(),
                c.input(DType::F32, &[k, n + 1], Domain::Any).slice(&[0, 0], &[k, n], &[1, 1]).unwrap(),
            ),
        };
        let y = a.matmul(&b).unwrap();
        let bias = c.input(DType::F32, &[*y.shape().dims().last().unwrap()], Domain::Any);
        let y = y.add(&bias).unwrap();
        let mut case = c.finish(format!("matmul_{variant}_{m}x{k}x{n}"), &[&y]);
        case.atol = 1e-3;
        case
    };
    let gpu = LowerOptions { forms: Forms::PARALLEL, subgroups: false, subgroup_size: None, ..Default::default() };
    let device = Device::shared().expect("a device");
    for (variant, vec4) in
        [("reshape", true), ("transpose", true), ("heads", true), ("slice", true), ("misaligned", false)]
    {
        let case = build(variant);
        let kernels = partition(&case.graph, &case.outputs, FusionMode::On).unwrap();
        let src = kernels.iter().map(|k| lower(&case.graph, k, &gpu)).find(is_tiled).expect("tiled");
        validate(&src.wgsl).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let KernelForm::TiledMatmul { vec4_lhs, vec4_rhs, .. } = src.form else { unreachable!() };
        assert_eq!((vec4_lhs, vec4_rhs), (vec4, vec4), "{}", case.name);
        for tiling in [MatmulTiling::CANDIDATES[0], MatmulTiling::CANDIDATES[1]] {
            let opts = CompileOptions { matmul_tiling: Some(tiling), ..Default::default() };
            check_with(&device, &case, &opts).unwrap_or_else(|e| panic!("{} [{tiling}]: {e}", case.name));
        }
    }
}

#[test]
fn tiled_kernel_workgroups_cover_every_tile_of_every_batch_entry() {
    // (shape, workgroups for batch 2×3, whether 8×8 blocks per invocation are used)
    for (shape, workgroups, large) in [((65, 17, 129), 6 * 2 * 3, false), ((130, 40, 258), 6 * 2 * 3, true)] {
        let c = case(DType::F32, shape, true, false, true);
        let kernels = partition(&c.graph, &c.outputs, FusionMode::On).unwrap();
        let src = kernels
            .iter()
            .map(|k| lower(&c.graph, k, &LowerOptions::default()))
            .find(is_tiled)
            .expect("a tiled kernel");
        assert_eq!(src.workgroups, workgroups, "{shape:?}");
        assert_eq!(src.wgsl.contains("var acc7_1 "), large, "{shape:?}");
    }
}

/// The shader markers of the cooperative-matrix kernel's multiply-adds: on the device's
/// matrices, emulated.
const COOP: &str = "coopMultiplyAdd(";
const COOP_EMULATED: &str = "fg_emu_mad(";

/// Whether a kernel was lowered as the tiled matmul on cooperative matrices of kind `coop`.
fn on_coop(src: &fusegraph::crates::wgsl::KernelSource, coop: Cooperative) -> bool {
    matches!(src.form, KernelForm::TiledMatmul { coop: Some(c), .. } if c == coop)
}

/// f16 products for the cooperative-matrix kernel, ragged in every dimension, with two `k`
/// steps and 2×2 or 3×5 tiles, and one whose operands' rows are whole vec4s (staged a vec4
/// per load): plain, and all but the third also batched with a transposed lhs and an
/// epilogue and batched with an epilogue; and a convolution with bias and ReLU.
fn coop_cases() -> Vec<Case> {
    let mut out = Vec::new();
    for (shape, batched) in [((7, 33, 5), true), ((70, 40, 90), true), ((130, 40, 258), false), ((66, 72, 100), true)] {
        out.push(case(DType::F16, shape, false, false, false));
        if batched {
            out.push(case(DType::F16, shape, true, true, true));
            out.push(case(DType::F16, shape, true, false, true));
        }
    }
    let mut c = CaseBuilder::new(77);
    let x = c.input(DType::F16, &[2, 5, 9, 10], Domain::Any);
    let w = c.input(DType::F16, &[70, 5, 3, 3], Domain::Any);
    let bias = c.input(DType::F16, &[70, 1, 1], Domain::Any);
    let y: Tensor = x.conv2d(&w, [1, 2], [1, 1], [1, 1], 1).unwrap().add(&bias).unwrap().relu().unwrap();
    let mut conv = c.finish("conv_f16_2x5x9x10_o70", &[&y]);
    conv.f16_tol = 1e-2;
    out.push(conv);
    out
}

#[test]
fn cooperative_kernels_validate_and_compile_to_spirv_for_every_subgroup_grid() {
    let (mut shaders, mut spirv) = (0, 0);
    for case in coop_cases() {
        let kernels = partition(&case.graph, &case.outputs, FusionMode::On).unwrap();
        for (size, tiling) in
            [8, 16, 32, 64, 128].into_iter().flat_map(|s| MatmulTiling::COOP_CANDIDATES.map(|t| (s, t)))
        {
            for (coop, marker) in
                [(Cooperative::Native, COOP), (Cooperative::Emulated { subgroup_size: size }, COOP_EMULATED)]
            {
                let opts = LowerOptions {
                    f16_native: true,
                    forms: Forms::PARALLEL,
                    subgroups: true,
                    subgroup_size: Some(size),
                    cooperative_matrix: Some(coop),
                    ..Default::default()
                };
                let strategy = Strategy { matmul_tiling: Some(tiling), ..Default::default() };
                let srcs: Vec<_> = kernels.iter().map(|k| lower_with(&case.graph, k, &opts, &strategy)).collect();
                assert!(srcs.iter().any(|s| on_coop(s, coop)), "{} ({size}, {coop:?}): no coop kernel", case.name);
                for src in srcs.iter().filter(|s| on_coop(s, coop)) {
                    let module = validate(&src.wgsl)
                        .unwrap_or_else(|e| panic!("{} kernel {} ({opts:?}): {e}", case.name, src.label));
                    shaders += 1;
                    // invocations / size subgroups on the squarest grid over the tile's
                    // blocks of 16×16 (4×4 of them by 128 invocations by default: one block
                    // each for 8, 2 for 16, 2×2 for 32, 4×2 for 64, all 16 for 128); one
                    // multiply-add per block per step (the emulation also defines the helper).
                    let (tm, tn) = tiling.tile();
                    let per_subgroup = (tm / 16) * (tn / 16) * size as usize / (tiling.gx * tiling.gy);
                    let calls = src.wgsl.matches(marker).count() - usize::from(marker == COOP_EMULATED);
                    assert_eq!(calls, per_subgroup, "{} ({size}, {coop:?}, {tiling})", case.name);
                    // Operands that are bindings with rows of whole vec4s (here both, unless
                    // the lhs is transposed) are staged a vec4<f16> per load, prefetched into
                    // registers one `k` slice ahead.
                    if case.name.contains("_66x72x100_") {
                        let lhs = !case.name.contains("_ttrue");
                        let KernelForm::TiledMatmul { vec4_lhs, vec4_rhs, .. } = src.form else { unreachable!() };
                        assert_eq!((vec4_lhs, vec4_rhs), (lhs, true), "{}", case.name);
                        assert_eq!(src.wgsl.contains("var pa0 = vec4<f16>();"), lhs, "{}: staged as f16", case.name);
                    }
                    // One epilogue pass per fragment row of a subgroup, through an f32 band of
                    // `rows`×16 rows: within 48 KiB with the 32-lane subgroups of NVIDIA.
                    let band: usize = src
                        .wgsl
                        .split("var<workgroup> fg_tile_c: array<f32, ")
                        .nth(1)
                        .and_then(|r| r.split('>').next())
                        .and_then(|n| n.parse().ok())
                        .expect("an f32 band");
                    let operands = (tm + tn) * tiling.tk * 2;
                    assert!(band * 4 + operands <= 49152 || size < 32, "{} ({size}, {tiling}): {band} f32", case.name);
                    assert_eq!(band % (16 * tn), 0, "{} ({size}, {tiling}): whole fragment rows", case.name);
                    // The SPIR-V a Vulkan driver would get (wgpu's own path: naga's writer).
                    if coop == Cooperative::Native {
                        let info = naga::valid::Validator::new(
                            naga::valid::ValidationFlags::all(),
                            naga::valid::Capabilities::all(),
                        )
                        .validate(&module)
                        .unwrap();
                        let options = naga::back::spv::Options {
                            lang_version: (1, 6),
                            flags: naga::back::spv::WriterFlags::empty(),
                            ..Default::default()
                        };
                        let words = naga::back::spv::write_vec(&module, &info, &options, None)
                            .unwrap_or_else(|e| panic!("{} kernel {}: SPIR-V: {e}", case.name, src.label));
                        // OpCooperativeMatrixMulAddKHR (4459) is in the module.
                        assert!(
                            words.iter().any(|w| w & 0xffff == 4459),
                            "{}: no OpCooperativeMatrixMulAddKHR",
                            case.name
                        );
                        spirv += 1;
                    }
                }
            }
        }
    }
    assert!(shaders >= 320 && spirv >= 160, "{shaders} shaders, {spirv} SPIR-V modules");
    // Subgroups that do not split the 128 invocations, f32 products, packed f16: the plain kernel.
    let f16 = case(DType::F16, (65, 17, 130), false, false, false);
    let f32 = case(DType::F32, (65, 17, 130), false, false, false);
    let native = LowerOptions {
        f16_native: true,
        forms: Forms::PARALLEL,
        subgroups: true,
        subgroup_size: Some(32),
        cooperative_matrix: Some(Cooperative::Native),
        ..Default::default()
    };
    for (case, opts) in [
        (&f16, LowerOptions { subgroup_size: Some(48), ..native }),
        (&f16, LowerOptions { subgroup_size: Some(256), ..native }),
        (&f16, LowerOptions { subgroup_size: None, ..native }),
        (&f16, LowerOptions { f16_native: false, ..native }),
        (&f32, native),
    ] {
        let kernels = partition(&case.graph, &case.outputs, FusionMode::On).unwrap();
        assert!(
            kernels.iter().all(|k| !on_coop(&lower(&case.graph, k, &opts), Cooperative::Native)),
            "{} {opts:?}",
            case.name
        );
        assert!(tiled(case, &opts), "{} {opts:?}", case.name);
    }
}

/// The cooperative-matrix kernel with each of its tilings against the reference: emulated
/// (pretend subgroups of 32 and 64 invocations: for 64×64 tiles 2×2 blocks of 16×16 per
/// subgroup, as on NVIDIA, and 4×2; for 128×128 tiles 4×2 and 4×4; 32 and 64 deep) on any
/// adapter with native f16, and on the device's own cooperative matrices where it has them.
#[test]
fn cooperative_matmul_matches_the_reference() {
    let shared = Device::shared().expect("a device");
    // Each device with the tilings it checks: every one on the device's own matrices and
    // with NVIDIA's 32 lanes; the 32-deep ones (the `k` loop is the same code) with 64.
    let all = &MatmulTiling::COOP_CANDIDATES[..];
    let mut devices: Vec<(String, Arc<Device>, &[MatmulTiling])> = Vec::new();
    if shared.cooperative_matrix() == Some(Cooperative::Native) {
        devices.push(("cooperative matrices".into(), shared.clone(), all));
    } else {
        eprintln!("{}: no cooperative matrices; the emulated kernel only", shared.describe());
    }
    for (size, tilings) in [(32, all), (64, &all[..2])] {
        let opts = DeviceOptions { cooperative_matrix_emulation: Some(size), ..Default::default() };
        match Device::new(&opts) {
            Ok(device) => devices.push((format!("emulated, subgroups of {size}"), Arc::new(device), tilings)),
            // The emulation needs native f16 (GL: packed f16).
            Err(e) => assert!(!shared.f16_native(), "{e}"),
        }
    }
    let (mut ran, mut failures) = (0, Vec::new());
    for (how, device, tilings) in &devices {
        for (case, &tiling) in coop_cases().iter().flat_map(|c| tilings.iter().map(move |t| (c, t))) {
            ran += 1;
            let how = format!("{how}, {tiling}");
            match check_with(device, case, &CompileOptions { matmul_tiling: Some(tiling), ..Default::default() }) {
                Ok(stats) if !stats.kernels.iter().any(|k| k.cooperative_matmul()) => {
                    failures.push(format!("{} [{how}]: not on cooperative matrices", case.name))
                }
                Ok(_) => {}
                Err(e) => failures.push(format!("{} [{how}]: {e}", case.name)),
            }
        }
    }
    eprintln!("{ran} device checks, {} failed", failures.len());
    assert!(failures.is_empty(), "{} of {ran} failed:\n{}", failures.len(), failures.join("\n"));
}

fn check(device: &Arc<Device>, case: &Case) -> Result<ExecutableStats, String> {
    check_with(device, case, &CompileOptions::default())
}

/// Compiles and checks `case` under `opts` ([`common::run_case`]), and that every matmul
/// took the tiling `opts` forces, if any.
fn check_with(device: &Arc<Device>, case: &Case, opts: &CompileOptions) -> Result<ExecutableStats, String> {
    let stats = common::run_case(device, case, opts)?;
    if let Some(forced) = opts.matmul_tiling {
        let used: Vec<_> = stats.kernels.iter().filter_map(|k| k.matmul_tiling).collect();
        if used.is_empty() || used.iter().any(|&t| t != forced) {
            return Err(format!("tilings {used:?}, forced {forced}"));
        }
    }
    Ok(stats)
}

#[test]
fn tiled_matmul_matches_the_reference() {
    let mut devices = Vec::new();
    let native = Device::new(&DeviceOptions { f16_native: Some(true), ..Default::default() }).expect("a device");
    if native.f16_native() {
        devices.push(("native f16", Arc::new(native)));
    }
    let packed = Device::new(&DeviceOptions { f16_native: Some(false), ..Default::default() }).expect("a device");
    devices.push(("packed f16", Arc::new(packed)));
    let cases = sweep(&[DType::F32, DType::F16, DType::I32]);
    let mut failures = Vec::new();
    let mut ran = 0;
    for (form, device) in &devices {
        eprintln!("device: {} ({form})", device.describe());
        for case in &cases {
            // The other f16 form changes nothing for f32 and i32.
            if *form == "packed f16" && devices.len() > 1 && case.graph.ty(case.outputs[0]).dtype != DType::F16 {
                continue;
            }
            let opts = crate::common::lower_options(true, device.f16_native());
            let out = case.graph.ty(case.outputs[0]);
            let packed_odd =
                out.dtype == DType::F16 && !device.f16_native() && out.shape.dims()[out.shape.rank() - 1] % 2 == 1;
            if tiled(case, &opts) == packed_odd {
                failures.push(format!("{} [{form}]: not tiled", case.name));
            }
            ran += 1;
            if let Err(e) = check(device, case) {
                failures.push(format!("{} [{form}]: {e}", case.name));
            }
        }
    }
    eprintln!("{ran} device checks, {} failed", failures.len());
    assert!(failures.is_empty(), "{} of {ran} failed:\n{}", failures.len(), failures.join("\n"));
}
