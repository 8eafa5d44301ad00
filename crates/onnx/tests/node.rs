//! ONNX's backend node tests (tests/data/onnx/node, written by
//! scripts/fixtures/make_onnx_nodes.py from `onnx.backend.test.case.node`): every case of a
//! supported op at opsets 13–21 is imported and evaluated by the CPU reference, and its
//! outputs compared with the expected ones (`common/node_case.rs`). The cases that fail are
//! exactly those listed,
//! with the reason, in `tests/expected-failures.txt`, so a regression and a fix both show; the
//! per-op table is printed (`cargo test -p fusegraph-onnx --test node -- --nocapture`).

#[path = "common/node_case.rs"]
mod node_case;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/onnx/node")
}

/// Runs one case by the CPU reference; `Err` says why it failed.
fn run(name: &str) -> Result<(), String> {
    let case = node_case::load(&dir(), name)?;
    let got = fusegraph_reference::evaluate(&case.graph, &case.outputs, &case.feeds, &case.params)
        .map_err(|e| e.to_string())?;
    node_case::check(&case, &got)
}

#[test]
fn backend_node_tests_pass_but_for_the_listed_cases() {
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("index.json")).unwrap()).unwrap();
    let expected =
        node_case::expected_failures(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/expected-failures.txt"));
    // Per op: (passed, failed, left out).
    let mut table: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
    let mut failed = BTreeMap::new();
    for (name, entry) in index.as_object().unwrap() {
        let row = table.entry(entry["op"].as_str().unwrap().to_string()).or_default();
        if entry.get("left_out").is_some() {
            row.2 += 1;
            continue;
        }
        match run(name) {
            Ok(()) => row.0 += 1,
            Err(e) => {
                row.1 += 1;
                failed.insert(name.clone(), e);
            }
        }
    }
    println!("| op | passed | failed | not run (opset, data) |\n| --- | ---: | ---: | ---: |");
    for (op, (p, f, l)) in &table {
        println!("| {op} | {p} | {f} | {l} |");
    }
    let (p, f): (usize, usize) = table.values().fold((0, 0), |(p, f), r| (p + r.0, f + r.1));
    println!("{p} passed, {f} failed");
    let unexpected: Vec<String> =
        failed.iter().filter(|(n, _)| !expected.contains_key(*n)).map(|(n, e)| format!("{n}: {e}")).collect();
    let fixed: Vec<&String> = expected.keys().filter(|n| !failed.contains_key(*n)).collect();
    assert!(unexpected.is_empty(), "{} unexpected failures:\n{}", unexpected.len(), unexpected.join("\n"));
    assert!(fixed.is_empty(), "listed as failing but passing (remove them from the list): {fixed:?}");
}
