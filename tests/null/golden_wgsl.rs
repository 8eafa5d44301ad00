//! Golden WGSL: a handful of representative fused kernels, diffed against files in
//! `tests/wgsl/` so unintended changes to the generated code show up in review
//! (`UPDATE_EXPECT=1 cargo test --test null golden_wgsl::` rewrites them). Each is also validated
//! by naga.

use crate::common::{composite_builders, Case, CaseBuilder, Domain};
use fusegraph::crates::passes::attention::fuse_attention;
use fusegraph::crates::passes::{fuse, FusionOptions, Kernel};
use fusegraph::crates::wgsl::{lower, validate, Forms, KernelForm, LowerOptions, CPU_LOOP_BUDGET};
use fusegraph::{DType, Graph, NodeId};

fn golden(name: &str, dtype: DType, f16_native: bool, file: expect_test::ExpectFile) {
    golden_with(name, dtype, crate::common::lower_options(false, f16_native), file);
}

fn golden_with(name: &str, dtype: DType, opts: LowerOptions, file: expect_test::ExpectFile) {
    golden_kernels(name, dtype, opts, |_, kernels, _| kernels, file);
}

/// As [`golden_with`], with `post` applied to the fused kernels.
fn golden_kernels(
    name: &str,
    dtype: DType,
    opts: LowerOptions,
    post: fn(&Graph, Vec<Kernel>, &[NodeId]) -> Vec<Kernel>,
    file: expect_test::ExpectFile,
) {
    let (_, build) = composite_builders().into_iter().find(|(n, _)| *n == name).unwrap();
    let mut c = CaseBuilder::new(1);
    let outs = build(&mut c, dtype);
    golden_case(c.finish(name, &outs.iter().collect::<Vec<_>>()), opts, post, file);
}

/// The fused kernels of `case` (after `post`), lowered under `opts`, against `file`.
fn golden_case(
    case: Case,
    opts: LowerOptions,
    post: fn(&Graph, Vec<Kernel>, &[NodeId]) -> Vec<Kernel>,
    file: expect_test::ExpectFile,
) {
    let f = fuse(&case.graph, &case.outputs, &FusionOptions { max_bindings: 32, ..Default::default() }).unwrap();
    let text: Vec<String> = post(&case.graph, f.kernels, &case.outputs)
        .iter()
        .map(|k| {
            let src = lower(&case.graph, k, &opts);
            validate(&src.wgsl).unwrap();
            src.annotated()
        })
        .collect();
    file.assert_eq(&text.join("\n"));
}

#[test]
fn softmax_row_kernel() {
    golden("softmax_last", DType::F32, false, expect_test::expect_file!["../wgsl/softmax_last.wgsl"]);
}

/// The same row kernel with subgroup reductions (one partial per subgroup, no tree).
#[test]
fn softmax_row_kernel_with_subgroups() {
    let opts = LowerOptions { subgroups: true, ..crate::common::lower_options(false, false) };
    golden_with("softmax_last", DType::F32, opts, expect_test::expect_file!["../wgsl/softmax_last_subgroups.wgsl"]);
}

#[test]
fn layer_norm_row_kernel_packed_f16() {
    golden("layer_norm", DType::F16, false, expect_test::expect_file!["../wgsl/layer_norm_f16_packed.wgsl"]);
}

#[test]
fn matmul_with_fused_epilogue() {
    golden("gelu_relu_matmul_bias", DType::F32, false, expect_test::expect_file!["../wgsl/gelu_relu_matmul_bias.wgsl"]);
}

#[test]
fn elementwise_chain_native_f16() {
    golden("chain20", DType::F16, true, expect_test::expect_file!["../wgsl/chain20_f16_native.wgsl"]);
}

/// The same chain for a CPU adapter: four elements per grid-stride step, loaded first and
/// computed statement by statement side by side (`CPU_INTERLEAVE`).
#[test]
fn elementwise_chain_interleaved_for_cpu() {
    let opts = crate::common::lower_options(true, false);
    golden_with("chain20", DType::F32, opts, expect_test::expect_file!["../wgsl/chain20_cpu_interleaved.wgsl"]);
}

/// Two outputs of one loop kernel on a CPU adapter: both regions computed for four elements
/// side by side (names `_j_u`), every value before any store.
#[test]
fn two_outputs_interleaved_for_cpu() {
    let opts = crate::common::lower_options(true, false);
    golden_with(
        "two_elementwise_outputs",
        DType::F32,
        opts,
        expect_test::expect_file!["../wgsl/two_outputs_cpu_interleaved.wgsl"],
    );
}

/// An f32 layer norm whose rows a workgroup shares: one pass over the row for both of its
/// sums (each invocation's Welford mean and squared deviations, then a subgroup sum of
/// `n * mean` and one of `ssd + n * (mean - t)²`), then the outputs.
#[test]
fn layer_norm_rows_in_one_pass_with_subgroups() {
    let opts = LowerOptions { subgroups: true, ..crate::common::lower_options(false, false) };
    golden_with("layer_norm", DType::F32, opts, expect_test::expect_file!["../wgsl/layer_norm_subgroups.wgsl"]);
}

/// The same epilogue on a CPU adapter (lavapipe, subgroups of 8): the subgroup matmul, its
/// operands read from textures. The product is larger than the composite's (72 rows, 40
/// columns: more than a workgroup's 64 and 32), so that every workgroup does not read the
/// whole of an operand and both are worth their copy into a texture.
#[test]
fn matmul_with_texture_operands_for_cpu() {
    let opts = LowerOptions {
        forms: Forms::SERIAL,
        loop_budget: Some(CPU_LOOP_BUDGET),
        subgroups: true,
        subgroup_size: Some(8),
        texture_operands: Some(16384),
        ..Default::default()
    };
    let mut c = CaseBuilder::new(1);
    let a = c.input(DType::F32, &[72, 33], Domain::Any);
    let b = c.input(DType::F32, &[33, 40], Domain::Any);
    let bias = c.input(DType::F32, &[40], Domain::Any);
    let y = a.matmul(&b).unwrap().relu().unwrap().add(&bias).unwrap().gelu().unwrap();
    golden_case(
        c.finish("gelu_relu_matmul_bias", &[&y]),
        opts,
        |_, kernels, _| kernels,
        expect_test::expect_file!["../wgsl/gelu_relu_matmul_bias_cpu_textures.wgsl"],
    );
}

/// The same matmul in f16 on cooperative matrices, subgroups of 32 (NVIDIA): a 2×2 grid of
/// subgroups, each with 2×2 accumulators of 16×16, the plain kernel's staging and epilogue.
#[test]
fn f16_matmul_on_cooperative_matrices() {
    let opts = LowerOptions {
        f16_native: true,
        forms: Forms::PARALLEL,
        subgroups: true,
        subgroup_size: Some(32),
        cooperative_matrix: Some(fusegraph::crates::runtime::Cooperative::Native),
        ..Default::default()
    };
    golden_with(
        "gelu_relu_matmul_bias",
        DType::F16,
        opts,
        expect_test::expect_file!["../wgsl/gelu_relu_matmul_bias_f16_coop.wgsl"],
    );
}

/// The attention kernel of composite `name` in `dtype`, one file per form: `files[0]` one
/// invocation per output row reading its keys one at a time (the CPU form), `files[1]` the
/// workgroup staging blocks of keys (the GPU form).
fn attention_goldens(name: &str, dtype: DType, base: LowerOptions, files: [expect_test::ExpectFile; 2]) {
    let post = |g: &Graph, kernels: Vec<Kernel>, outs: &[NodeId]| {
        let fused = fuse_attention(g, kernels, outs, 32);
        assert_eq!(fused.len(), 1, "{fused:?}");
        fused
    };
    for (tiled_attention, file) in [false, true].into_iter().zip(files) {
        golden_kernels(name, dtype, LowerOptions { tiled_attention, ..base }, post, file);
    }
}

/// Memory-efficient attention: the scores, softmax and product in one kernel (online
/// softmax), f16 stored packed, in both forms.
#[test]
fn attention_in_one_kernel_packed_f16() {
    attention_goldens(
        "attention_scores",
        DType::F16,
        LowerOptions { f16_native: false, ..Default::default() },
        [
            expect_test::expect_file!["../wgsl/attention_scores_f16_packed.wgsl"],
            expect_test::expect_file!["../wgsl/attention_scores_tiled_f16_packed.wgsl"],
        ],
    );
}

/// Causal attention in one kernel: each row stops at its band's end (the one-key form),
/// each workgroup at the first block past its rows' bands once every row agrees (the tiled
/// form), where the masked keys would add exactly nothing.
#[test]
fn causal_attention_stops_at_the_band() {
    attention_goldens(
        "causal_attention",
        DType::F32,
        LowerOptions::default(),
        [
            expect_test::expect_file!["../wgsl/causal_attention.wgsl"],
            expect_test::expect_file!["../wgsl/causal_attention_tiled.wgsl"],
        ],
    );
}

/// On a GPU a loop kernel of at least `GPU_INTERLEAVE_MIN` elements reads and writes vec4s,
/// four elements per invocation (one 4-byte load in flight per invocation held an f32 copy
/// to a fifth of an H100's bandwidth), and from `GPU_QUADS` times that many, `GPU_QUADS`
/// vec4s per invocation, every load before the first store; a smaller one keeps one element
/// per invocation, so that it still spreads over the GPU's lanes.
#[test]
fn gpu_loop_kernels_take_more_elements_per_invocation_only_when_large() {
    use fusegraph::crates::wgsl::{GPU_INTERLEAVE_MIN, GPU_QUADS, WORKGROUP_SIZE};
    let opts = LowerOptions { subgroups: true, ..crate::common::lower_options(false, true) };
    let (min, quads) = (GPU_INTERLEAVE_MIN as usize, GPU_QUADS as usize);
    for (n, per_invocation) in [(min * quads + 8, 4 * quads), (min * quads - 4, 4), (min, 4), (min / 2, 1)] {
        let b = fusegraph::GraphBuilder::new();
        let x = b.input("x", DType::F32, vec![n]).unwrap();
        let y = b.input("y", DType::F32, vec![n]).unwrap();
        let out = x.add(&y).unwrap().tanh().unwrap().mul_scalar(0.5).unwrap();
        let g = b.graph();
        let f = fuse(&g, &[out.id()], &FusionOptions::default()).unwrap();
        assert_eq!(f.kernels.len(), 1);
        let src = lower(&g, &f.kernels[0], &opts);
        validate(&src.wgsl).unwrap();
        let four = per_invocation >= 4;
        assert_eq!(src.workgroups, n.div_ceil(per_invocation * WORKGROUP_SIZE as usize) as u64, "{n} elements");
        assert_eq!(src.form, KernelForm::Loop { quads: four }, "{n} elements");
        assert_eq!(src.wgsl.contains("array<vec4<f32>>"), four, "{n} elements:\n{}", src.wgsl);
        // The sub-steps' loads all precede the first store.
        let last = format!("ts{}", quads - 1);
        assert_eq!(src.wgsl.contains(&last), per_invocation > 4, "{n} elements");
        if per_invocation > 4 {
            let last_load = src.wgsl.rfind(&format!("b1[i_0s{} >> 2u]", quads - 1)).expect("the last sub-step's load");
            let first_store = src.wgsl.find("b2[ts0] =").expect("the first store");
            assert!(last_load < first_store, "{}", src.wgsl);
        }
    }
}

/// The text names a kernel's values by their place in the kernel, not by their graph ids:
/// a model's later layers lower to the texts of its earlier ones (the runtime compiles one
/// pipeline per text), and each kernel's bindings still name its own inputs and outputs.
#[test]
fn a_layer_more_adds_no_kernel_text() {
    use fusegraph::crates::passes::{plan_graph, simplify, FusionMode, PlanOptions};
    use fusegraph::crates::wgsl::localize;
    use std::collections::BTreeSet;
    let texts = |layers: usize, fusion: FusionMode| {
        let w = fusegraph_workloads::transformer(16, layers, true).unwrap();
        let (mut g, mut outs) = (w.graph.clone(), w.outputs.clone());
        simplify(&mut g, &mut outs).unwrap();
        let planned = plan_graph(&g, &outs, &PlanOptions { fusion, ..Default::default() }).unwrap();
        let mut texts = BTreeSet::new();
        for k in &planned.kernels {
            assert!(localize(&g, k).is_some(), "kernel {} copies into a graph of its own", k.members.len());
            let src = lower(&g, k, &LowerOptions::default());
            // Inputs in the order the kernel's text reads them first; outputs in order.
            let side = |output: bool| -> Vec<NodeId> {
                src.bindings.iter().filter(|b| b.output == output).map(|b| b.node).collect()
            };
            let mut read = side(false);
            read.sort();
            let mut inputs = k.inputs.clone();
            inputs.sort();
            assert_eq!((read, side(true)), (inputs, k.outputs.clone()));
            texts.insert(src.wgsl);
        }
        (planned.kernels.len(), texts)
    };
    for fusion in [FusionMode::On, FusionMode::Off] {
        let (k2, two) = texts(2, fusion);
        let (k3, three) = texts(3, fusion);
        eprintln!(
            "{fusion:?}: 2 layers {k2} kernels, {} texts; 3 layers {k3} kernels, {} texts",
            two.len(),
            three.len()
        );
        assert!(k3 > k2);
        assert_eq!(two, three, "{fusion:?}: the third layer lowers to texts of the first two");
    }
}
