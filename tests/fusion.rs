//! Fusion tests: the kernel count first (no device), then the numbers against the
//! reference are checked by `device_ops::every_op_matches_the_reference_fused`, which runs
//! these same composite graphs.

mod common;

use common::{composite_builders, CaseBuilder};
use fusegraph::crates::passes::{fuse, FusionOptions, KernelKind};
use fusegraph::DType;

fn kernels_of(name: &str) -> Vec<fusegraph::crates::passes::Kernel> {
    let (_, build) = composite_builders().into_iter().find(|(n, _)| *n == name).expect("a composite of that name");
    let mut c = CaseBuilder::new(1);
    let outs = build(&mut c, DType::F32);
    let case = c.finish(name, &outs.iter().collect::<Vec<_>>());
    fuse(&case.graph, &case.outputs, &FusionOptions { max_bindings: 32, ..Default::default() }).unwrap().kernels
}

#[test]
fn print_counts() {
    for (name, _) in composite_builders() {
        let ks = kernels_of(name);
        eprintln!(
            "{name}: {} kernels {:?}",
            ks.len(),
            ks.iter().map(|k| (k.members.len(), matches!(k.kind, KernelKind::Row { .. }))).collect::<Vec<_>>()
        );
    }
}

#[test]
fn print_logs() {
    for name in ["layer_norm", "conv_bn_relu", "attention_scores"] {
        let (_, build) = composite_builders().into_iter().find(|(n, _)| *n == name).unwrap();
        let mut c = CaseBuilder::new(1);
        let outs = build(&mut c, DType::F32);
        let case = c.finish(name, &outs.iter().collect::<Vec<_>>());
        let f = fuse(&case.graph, &case.outputs, &FusionOptions { max_bindings: 32, ..Default::default() }).unwrap();
        eprintln!("== {name}\n{}", fusegraph::text::print(&case.graph));
        for d in &f.log {
            eprintln!("{} {:?} {:?}", d.producer, case.graph.node(d.producer).op.name(), d.veto);
        }
        for k in &f.kernels {
            eprintln!("kernel {:?}", k.members);
        }
    }
}
