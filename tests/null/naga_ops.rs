//! Null tests: every kernel of every catalog case lowers to WGSL that naga accepts, in both
//! f16 forms (native `f16` and packed in u32). No device is opened.

use crate::common;

use fusegraph::crates::passes::{partition, FusionMode};
use fusegraph::crates::wgsl::{lower, validate, Forms, LowerOptions, Spread, CPU_LOOP_BUDGET};

#[test]
fn every_catalog_kernel_validates_in_both_f16_forms_and_every_row_strategy() {
    let mut cases = common::catalog(1);
    cases.extend(common::composite_cases());
    cases.extend(common::large_cases());
    let mut shaders = 0;
    for case in &cases {
        for mode in [FusionMode::Off, FusionMode::On] {
            let kernels = partition(&case.graph, &case.outputs, mode).unwrap();
            for k in &kernels {
                for (f16_native, cpu, subgroups) in [
                    (false, false, false),
                    (true, false, false),
                    (false, true, false),
                    (true, true, false),
                    (false, false, true),
                    (true, false, true),
                    (false, true, true),
                ] {
                    // A CPU adapter with subgroups of 8 (lavapipe): matmuls take the subgroup kernel.
                    let subgroup_size = (cpu && subgroups).then_some(8);
                    let loop_budget = cpu.then_some(CPU_LOOP_BUDGET);
                    // With `cpu`, each mix of the loop and row families (any adapter's tuner
                    // may pick either per kind); else the parallel ones.
                    let spreads: &[(Spread, Spread)] = if cpu {
                        &[
                            (Spread::Serial, Spread::Serial),
                            (Spread::Serial, Spread::Parallel),
                            (Spread::Parallel, Spread::Serial),
                        ]
                    } else {
                        &[(Spread::Parallel, Spread::Parallel)]
                    };
                    for &(loops, rows) in spreads {
                        let forms = Forms { loops, rows };
                        let opts = LowerOptions {
                            f16_native,
                            forms,
                            loop_budget,
                            subgroups,
                            subgroup_size,
                            ..Default::default()
                        };
                        let src = lower(&case.graph, k, &opts);
                        if let Err(e) = validate(&src.wgsl) {
                            panic!(
                            "case {} kernel {} (f16_native={f16_native}, cpu={cpu}, {forms:?}, subgroups={subgroups}): {e}",
                            case.name, src.label
                        );
                        }
                        shaders += 1;
                    }
                }
            }
        }
    }
    assert!(shaders > 500, "only {shaders} shaders validated");
}
