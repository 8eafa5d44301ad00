//! The `fusegraph` program: `info` works, a bad backend name is a clear error.

use std::process::Command;

fn fusegraph(args: &[&str], backend: Option<&str>) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fusegraph"));
    cmd.args(args);
    if let Some(b) = backend {
        cmd.env("FUSEGRAPH_BACKEND", b);
    }
    cmd.output().expect("the binary runs")
}

#[test]
fn info_json_names_adapter_and_limits() {
    let out = fusegraph(&["info", "--json"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let info: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(info["adapter"].is_string() && info["backend"].is_string(), "{text}");
    for limit in ["max_storage_buffer_binding_size", "min_storage_buffer_offset_alignment"] {
        assert!(info["limits"][limit].as_u64().is_some_and(|v| v > 0), "{limit} in {text}");
    }
    assert!(info["features"].is_array(), "{text}");
}

/// Every `--json` the programs write parses with a strict JSON parser (serde_json rejects
/// `NaN`, unescaped quotes and trailing commas), each row with its numbers.
#[test]
fn json_outputs_parse_strictly() {
    let dir = std::env::temp_dir().join(format!("fusegraph-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let read = |name: &str| -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}: {text}"))
    };
    let bench = dir.join("bench.json");
    let args = ["bench", "--workload", "elementwise_chain_4096", "--runs", "2", "--json", bench.to_str().unwrap()];
    let out = fusegraph(&args, None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows = read("bench.json");
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r["median_ms"].as_f64().is_some_and(|ms| ms > 0.0)), "{rows:?}");
    assert!(rows[1]["speedup"].as_f64().is_some() && rows[0]["speedup"].is_null(), "{rows:?}");
    let roof = dir.join("roofline.json");
    let args =
        ["roofline", "--quick", "--kernels", "copy", "--dtype", "f32", "--runs", "1", "--json", roof.to_str().unwrap()];
    let out = fusegraph(&args, None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows = read("roofline.json");
    assert!(!rows.is_empty() && rows.iter().all(|r| r["gbps"].as_f64().is_some() && r["kernel"] == "copy"), "{rows:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unknown_backend_is_reported_not_panicked() {
    let out = fusegraph(&["info"], Some("cuda"));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("unknown backend `cuda` (expected vulkan, gl, metal or dx12)"), "{err}");
    assert!(!err.contains("panicked"));
}

#[test]
fn unknown_command_is_usage_error() {
    let out = fusegraph(&["frobnicate"], None);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn dot_draws_one_cluster_per_kernel() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/softmax.ir");
    let fused = fusegraph(&["dot", path], None);
    assert!(fused.status.success(), "{}", String::from_utf8_lossy(&fused.stderr));
    let text = String::from_utf8(fused.stdout).unwrap();
    assert!(text.starts_with("digraph"));
    assert_eq!(text.matches("subgraph cluster_").count(), 1, "{text}");
    let unfused = fusegraph(&["dot", path, "--unfused"], None);
    let text = String::from_utf8(unfused.stdout).unwrap();
    assert_eq!(text.matches("subgraph cluster_").count(), 7, "{text}");
    let missing = fusegraph(&["dot", "/nonexistent.ir"], None);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read /nonexistent.ir"));
}

/// `wgsl` lowers without a device: one kernel fused (a row kernel, validated by naga), seven
/// unfused; `--no-excess-precision` rounds more; `--cpu` changes the code; `--out` writes
/// the files the dump names.
#[test]
fn wgsl_prints_or_writes_every_kernel() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/softmax.ir");
    let text = |args: &[&str]| {
        let out = fusegraph(args, None);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let fused = text(&["wgsl", path]);
    assert_eq!(fused.matches("@compute").count(), 1, "{fused}");
    fusegraph::crates::wgsl::validate(&fused).unwrap_or_else(|e| panic!("{e}\n{fused}"));
    assert_eq!(text(&["wgsl", path, "--unfused"]).matches("@compute").count(), 7);
    // In f16 the fused softmax keeps its intermediates in f32 (excess precision, the
    // runtime's default): fewer roundings than with every op rounded.
    let rounds = |extra: &[&str]| {
        let mut args = vec!["wgsl", path, "--mixed-precision"];
        args.extend(extra);
        text(&args).matches("fg_round_f16(").count()
    };
    let (wide, every) = (rounds(&[]), rounds(&["--no-excess-precision"]));
    assert!(wide < every, "{wide} roundings with excess precision, {every} without");
    // A loop kernel takes four elements per invocation on a CPU adapter, one on a GPU (below
    // 2^20 elements).
    let dir = std::env::temp_dir().join(format!("fusegraph-cli-wgsl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tanh = dir.join("tanh.ir");
    std::fs::write(&tanh, "%0 = input() {name=\"x\"} : f32[1024]\n%1 = tanh(%0) : f32[1024]\n").unwrap();
    let tanh = tanh.to_str().unwrap();
    assert!(text(&["wgsl", tanh, "--cpu"]).contains("let i_3 = 4u * t + 3u;"));
    assert!(!text(&["wgsl", tanh]).contains("let i_3"));
    std::fs::remove_dir_all(&dir).unwrap();
    let written = text(&["wgsl", "--out", dir.to_str().unwrap(), path, "--unfused"]);
    assert!(written.is_empty(), "{written}");
    let mut names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names.len(), 7);
    assert_eq!((names[0].as_str(), names[6].as_str()), ("k000.wgsl", "k006.wgsl"));
    std::fs::remove_dir_all(&dir).unwrap();
    for (args, message) in [
        (&["wgsl", path, "--gpu"][..], "unexpected argument '--gpu'"),
        (&["wgsl", path, "--out"][..], "a value is required for '--out <DIR>'"),
        (&["wgsl"][..], "the following required arguments were not provided"),
    ] {
        // clap's usage errors.
        let out = fusegraph(args, None);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(message), "{args:?}");
    }
}

/// `ir` prints a workload's graph, at another size where its name gives one, in the text
/// form `wgsl` reads back: the 20-op chain at 4096 elements is one kernel.
#[test]
fn ir_prints_a_workload_that_wgsl_reads_back() {
    let out = fusegraph(&["ir", "elementwise_chain_4096"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let graph = String::from_utf8(out.stdout).unwrap();
    assert_eq!(graph.matches(" = tanh(").count(), 5, "{graph}");
    assert!(graph.contains("f32[4096]"), "{graph}");
    let path = std::env::temp_dir().join(format!("fusegraph-cli-ir-{}.ir", std::process::id()));
    std::fs::write(&path, &graph).unwrap();
    let wgsl = fusegraph(&["wgsl", path.to_str().unwrap()], None);
    std::fs::remove_file(&path).unwrap();
    assert!(wgsl.status.success(), "{}", String::from_utf8_lossy(&wgsl.stderr));
    let src = String::from_utf8(wgsl.stdout).unwrap();
    assert_eq!(src.matches("@compute").count(), 1, "{src}");
    let quick = fusegraph(&["ir", "mlp", "--quick"], None);
    assert!(quick.status.success(), "{}", String::from_utf8_lossy(&quick.stderr));
    for (args, message) in [
        (&["ir", "nonsense"][..], "no workload matches `nonsense`"),
        (&["ir"][..], "the following required arguments were not provided"),
        (&["ir", "mlp", "--fast"][..], "unexpected argument '--fast'"),
    ] {
        let out = fusegraph(args, None);
        // A workload that does not exist fails (1); a bad command line is a usage error (2).
        let code = if args.len() == 2 && args[1] == "nonsense" { 1 } else { 2 };
        assert_eq!(out.status.code(), Some(code), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(message), "{args:?}");
    }
}

/// `bench --workload` takes a micro workload at other sizes too: the chain at 4096 elements,
/// fused into one kernel against 30 unfused, both checked against the reference.
#[test]
fn bench_runs_a_micro_workload_at_the_size_its_name_gives() {
    let out = fusegraph(&["bench", "--workload", "elementwise_chain_4096", "--runs", "2"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let kernels = |mode: &str| -> Option<u32> {
        let line = text.lines().find(|l| l.starts_with("elementwise_chain_4096") && l.contains(mode))?;
        line.split_whitespace().nth(2)?.parse().ok()
    };
    assert_eq!((kernels(" fused "), kernels(" unfused ")), (Some(1), Some(30)), "{text}");
}

#[test]
fn roofline_measures_only_the_families_and_dtype_asked_for() {
    let out = fusegraph(&["roofline", "--quick", "--kernels", "copy,soft", "--dtype", "f16", "--runs", "2"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<&str> = text.lines().filter(|l| l.contains("[")).collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert!(rows[0].starts_with("copy ") && rows[0].contains(" f16 "), "{text}");
    assert!(rows[1].starts_with("softmax_rows ") && rows[1].contains(" f16 "), "{text}");
    assert!(text.contains("ceilings (measured in this run): copy"), "{text}");
    // The contraction and window families beside the square products, each with its shape.
    let out = fusegraph(
        &["roofline", "--quick", "--kernels", "batched,skinny,decode,conv,max_pool", "--dtype", "f32", "--runs", "1"],
        None,
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    // Rows only: a GPU also prints the tilings it tuned (`autotuned f32 …`).
    let rows: Vec<&str> = text.lines().filter(|l| l.contains(" f32 ") && !l.starts_with("autotuned")).collect();
    let want = [
        ("batched_matmul", "8x64x64x64"),
        ("skinny_matmul", "8x512x512"),
        ("conv2d", "[2,32,28,28]*3x3"),
        ("max_pool2d", "[4,64,64,64]/2x2"),
        ("decode_gemv", "1x512x512"),
    ];
    assert_eq!(rows.len(), want.len(), "{text}");
    for (row, (kernel, shape)) in rows.iter().zip(want) {
        let fields: Vec<&str> = row.split_whitespace().collect();
        assert!(fields[0].starts_with(kernel) && fields.contains(&shape), "{kernel} {shape}: {text}");
        // A measured time and a nonzero throughput.
        let ms: f64 = fields[fields.iter().position(|f| *f == shape).unwrap() + 1].parse().unwrap();
        assert!(ms > 0.0, "{text}");
    }
    // The decoder step's product in every weight format, k-quants and IQ types included.
    let out = fusegraph(&["roofline", "--quick", "--kernels", "decode", "--runs", "1"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for w in
        ["f32", "bf16", "q8_0", "q4_0", "q5_0", "iq4_nl", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs", "mxfp4"]
    {
        let row = text.lines().find(|l| l.starts_with("decode_gemv") && l.split_whitespace().any(|f| f == w));
        assert!(row.is_some(), "no decode_gemv row in {w}: {text}");
    }
    // Bad filters are usage errors before anything is measured.
    for (args, message) in [
        (&["roofline", "--kernels", "tanh"][..], "no kernel family starts with `tanh`"),
        (&["roofline", "--dtype", "f64"][..], "invalid value 'f64' for '--dtype <DTYPE>'"),
        (&["roofline", "--runs", "0"][..], "invalid value '0' for '--runs <N>'"),
    ] {
        let out = fusegraph(args, None);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(message) && !err.contains("device:"), "{args:?}: {err}");
    }
}

#[test]
fn explain_gives_every_fusion_decision() {
    // Two reductions of x and a third of exp(x), all outputs: one row kernel.
    let path = std::env::temp_dir().join(format!("fusegraph_explain_{}.ir", std::process::id()));
    std::fs::write(
        &path,
        "%0 = input() {name=\"x\"} : f32[4,64]\n\
         %1 = reduce(%0) {kind=sum, axes=[1], keep_dims=false} : f32[4]\n\
         %2 = reduce(%0) {kind=max, axes=[1], keep_dims=false} : f32[4]\n\
         %3 = exp(%0) : f32[4,64]\n\
         %4 = mul(%0, %3) : f32[4,64]\n\
         %5 = reduce(%3) {kind=sum, axes=[1], keep_dims=false} : f32[4]\n",
    )
    .unwrap();
    let file = path.to_str().unwrap();
    let out = fusegraph(&["explain", file, "--graph"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("%0 = input()"), "{text}");
    for line in [
        "1 kernels:",
        "  kernel 0 (rows of [4, 64] over axes [1]): %1 reduce, %2 reduce, %3 exp, %4 mul, %5 reduce; stores %1 reduce, %2 reduce, %4 mul, %5 reduce",
        "  %5 reduce: not fused: a graph output (stored anyway) not read by exactly one other kernel",
        "  %3 exp: fused into its consumers' kernels",
        "  %1 reduce and %2 reduce: merged",
    ] {
        assert!(text.lines().any(|l| l == line), "missing `{line}` in\n{text}");
    }
    // With --mixed-precision the graph stores f16 as the compile option does: the input
    // cast once, each of the four outputs cast back to f32.
    let mixed = fusegraph(&["explain", file, "--mixed-precision", "--graph"], None);
    assert!(mixed.status.success(), "{}", String::from_utf8_lossy(&mixed.stderr));
    let text = String::from_utf8(mixed.stdout).unwrap();
    assert!(text.lines().any(|l| l.ends_with("= cast(%0) {to=f16} : f16[4,64]")), "{text}");
    assert_eq!(text.lines().filter(|l| l.contains("{to=f32} : f32[")).count(), 4, "{text}");
    let bad = fusegraph(&["explain", file, "--frobnicate"], None);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unexpected argument '--frobnicate'"));
    std::fs::remove_file(&path).unwrap();

    // Two products of `x` combined over stacked weights: the rewritten graph's node ids are
    // not its printed numbers, and every node the kernels and decisions name is the node of
    // that number in the printed graph.
    std::fs::write(
        &path,
        "%0 = input() {name=\"x\"} : f32[4,8]\n\
         %1 = parameter() {name=\"w1\"} : f32[8,8]\n\
         %2 = parameter() {name=\"w2\"} : f32[8,8]\n\
         %3 = matmul(%0, %1) : f32[4,8]\n\
         %4 = matmul(%0, %2) : f32[4,8]\n\
         %5 = tanh(%3) : f32[4,8]\n\
         %6 = mul(%5, %4) : f32[4,8]\n",
    )
    .unwrap();
    // For a GPU the products of four rows are not combined: the matrix–vector kernel takes
    // both, accumulated side by side under their epilogue, in one kernel.
    let out = fusegraph(&["explain", file], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains("combined") && text.lines().any(|l| l == "1 kernels:"), "{text}");
    let out = fusegraph(&["explain", file, "--graph", "--cpu"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("combined 2 products of one operand"), "{text}");
    let named: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("  kernel ").and_then(|k| k.split_once("): ")).map(|(_, m)| m))
        .flat_map(|m| m.split("; stores ").flat_map(|part| part.split(", ")))
        .chain(text.lines().filter_map(|l| l.strip_prefix("  ").and_then(|d| d.split_once(": ")).map(|(n, _)| n)))
        .filter(|n| n.starts_with('%'))
        .collect();
    assert!(named.len() > 10, "{text}");
    for member in named {
        let (num, op) = member.split_once(' ').unwrap();
        let printed = format!("{num} = {op}(");
        assert!(text.lines().any(|l| l.starts_with(&printed)), "`{member}` is not `{printed}…` in\n{text}");
    }
    std::fs::remove_file(&path).unwrap();

    // A transformer block: the sibling phase refuses merges that would make a cycle, and
    // says so once per pair.
    let ir = fusegraph(&["ir", "transformer", "--quick"], None);
    assert!(ir.status.success(), "{}", String::from_utf8_lossy(&ir.stderr));
    let path = std::env::temp_dir().join(format!("fusegraph_explain_tr_{}.ir", std::process::id()));
    std::fs::write(&path, ir.stdout).unwrap();
    let out = fusegraph(&["explain", path.to_str().unwrap()], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let cycles: Vec<&str> = text
        .lines()
        .filter(|l| l.ends_with("not merged: the kernel would depend on itself through another kernel"))
        .collect();
    assert!(!cycles.is_empty(), "{text}");
    let distinct: std::collections::BTreeSet<&&str> = cycles.iter().collect();
    assert_eq!(distinct.len(), cycles.len(), "{text}");
    std::fs::remove_file(&path).unwrap();
}

/// `ir` writes a training step's outputs and updates (its Adam moments are stored, though
/// the new weights read them), and `explain` fuses what a compile with those updates stores:
/// the same kernels the runtime compiles.
#[test]
fn explain_fuses_a_training_step_as_the_runtime_compiles_it() {
    let w = fusegraph_workloads::training(true).into_iter().find(|w| w.name == "train_mlp").unwrap();
    let out = fusegraph(&["ir", "train_mlp", "--quick"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let program = String::from_utf8(out.stdout).unwrap();
    assert_eq!(program.lines().filter(|l| l.starts_with("update(")).count(), w.updates.len());
    assert_eq!(program.lines().filter(|l| l.starts_with("outputs(")).count(), 1);
    let path = std::env::temp_dir().join(format!("fusegraph_train_{}.ir", std::process::id()));
    std::fs::write(&path, &program).unwrap();
    // Fused for the kind of adapter the compile below runs on.
    let device = fusegraph::Device::shared().unwrap();
    let cpu = device.info().device_type == fusegraph::crates::runtime::WgpuDeviceType::Cpu;
    let args =
        if cpu { vec!["explain", path.to_str().unwrap(), "--cpu"] } else { vec!["explain", path.to_str().unwrap()] };
    let out = fusegraph(&args, None);
    std::fs::remove_file(&path).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let explained: usize = text.lines().find_map(|l| l.strip_suffix(" kernels:")).unwrap().parse().unwrap();
    let opts = w.options(fusegraph::CompileOptions { split_k: fusegraph::SplitK::Off, ..Default::default() });
    let exe = fusegraph::compile(&w.graph, &w.outputs, &opts).unwrap();
    assert_eq!(explained, exe.stats().kernels.len(), "{text}");

    // Products of one operand whose weights are updated are not combined (the runtime keeps
    // updated parameters apart); without the updates they are.
    let products = "%0 = input() {name=\"x\"} : f32[4,8]\n\
                    %1 = parameter() {name=\"w1\"} : f32[8,8]\n\
                    %2 = parameter() {name=\"w2\"} : f32[8,8]\n\
                    %3 = matmul(%0, %1) : f32[4,8]\n\
                    %4 = matmul(%0, %2) : f32[4,8]\n\
                    %5 = mul(%3, %4) : f32[4,8]\n\
                    %6 = sub(%1, %1) : f32[8,8]\n";
    for (tail, combined) in [("", true), ("outputs(%5)\nupdate(%6) {name=\"w1\"}\n", false)] {
        std::fs::write(&path, format!("{products}{tail}")).unwrap();
        let out = fusegraph(&["explain", path.to_str().unwrap(), "--cpu"], None);
        std::fs::remove_file(&path).unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(text.contains("combined 2 products"), combined, "{tail}\n{text}");
    }
}

fn checkpoint(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/checkpoints").join(name)
}

/// `generate --json` on a Llama-family directory (tests/data/checkpoints, written by
/// `transformers`): a text prompt encodes to `transformers`' ids, a chat renders to
/// `apply_chat_template`'s text and ids (Llama 3's template with a system message, and
/// ChatML), and greedy decoding gives `transformers`' 32 tokens after each.
#[test]
fn generate_writes_what_transformers_writes_for_prompts_and_chats() {
    let dir = std::env::temp_dir().join(format!("fusegraph-generate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ids =
        |v: &serde_json::Value| -> Vec<i64> { v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect() };
    for name in
        ["llama-tiny", "qwen2-tiny", "qwen3-tiny", "gemma3-tiny", "phi3-tiny", "gemma2-tiny", "phi3-longrope-tiny"]
    {
        let text = std::fs::read_to_string(checkpoint(&format!("{name}-reference.json"))).unwrap();
        let r: serde_json::Value = serde_json::from_str(&text).unwrap();
        let model = checkpoint(name);
        let json = dir.join(format!("{name}.json"));
        let common = ["generate", "--model", model.to_str().unwrap(), "--tokens", "32", "--ignore-eos"];
        let prompt_ids = ids(&r["prompt_ids"]).iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        let runs: [(&[&str], &str, &str); 3] = [
            (&["--prompt-ids", &prompt_ids], "prompt_ids", "greedy"),
            (&["--prompt", r["prompt"].as_str().unwrap()], "prompt_ids", "greedy"),
            (
                &["--chat", "--system", r["system"].as_str().unwrap(), "--prompt", r["user"].as_str().unwrap()],
                "chat_ids",
                "chat_greedy",
            ),
        ];
        // The text prompt on one model, the ids on the other (each run compiles its own).
        let skip = if name == "llama-tiny" { "--prompt-ids" } else { "--prompt" };
        for (args, want_prompt, want_new) in runs.into_iter().filter(|(a, _, _)| a[0] != skip) {
            let mut all: Vec<&str> = common.to_vec();
            all.extend_from_slice(args);
            all.extend_from_slice(&["--json", json.to_str().unwrap()]);
            let out = fusegraph(&all, None);
            assert!(out.status.success(), "{name} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            let got: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
            assert_eq!(ids(&got["prompt_ids"]), ids(&r[want_prompt]), "{name} {args:?}");
            assert_eq!(ids(&got["generated_ids"]), ids(&r[want_new]), "{name} {args:?}");
            if want_prompt == "chat_ids" {
                assert_eq!(got["prompt_text"], r["chat_text"], "{name}: the rendered chat");
            }
            assert!(got["prefill_ms"].as_f64().unwrap() > 0.0 && got["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
            assert!(got["step_kernels"].as_u64().unwrap() > 0 && got["step_bytes_moved"].as_u64().unwrap() > 0);
        }
    }
    // GGUF files (llama.cpp's format: Llamas in Q8_0, Q4_0, Q4_K/Q5_K/Q6_K and
    // IQ4_XS/IQ4_NL/Q3_K/Q2_K, a Qwen2 in Q5_0/Q8_0, a Qwen3 in IQ4_NL/Q8_0, a Gemma 2, a Gemma 3
    // and a Phi-3 in Q8_0, tests/data/gguf): transformers' tokens from their dequantized weights; and the
    // f32 checkpoint quantized on load to Q4_0, which holds the Q4_0 file's blocks.
    let gguf = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/gguf");
    let llama_tiny = checkpoint("llama-tiny");
    for (model, reference, extra) in [
        (gguf.join("llama-tiny-q8_0.gguf"), "llama-tiny-q8_0", &[][..]),
        (gguf.join("llama-tiny-q4_0.gguf"), "llama-tiny-q4_0", &[]),
        (llama_tiny, "llama-tiny-q4_0", &["--quantize", "q4_0"]),
        (gguf.join("llama-k-q4_k_m.gguf"), "llama-k-q4_k_m", &[]),
        (gguf.join("qwen2-tiny-q5_0.gguf"), "qwen2-tiny-q5_0", &[]),
        (gguf.join("llama-k-iq4_xs.gguf"), "llama-k-iq4_xs", &[]),
        (gguf.join("qwen3-tiny-iq4_nl.gguf"), "qwen3-tiny-iq4_nl", &[]),
        (gguf.join("gemma3-tiny-q8_0.gguf"), "gemma3-tiny-q8_0", &[]),
        (gguf.join("phi3-tiny-q8_0.gguf"), "phi3-tiny-q8_0", &[]),
        (gguf.join("gemma2-tiny-q8_0.gguf"), "gemma2-tiny-q8_0", &[]),
        (gguf.join("phi3-longrope-tiny-q8_0.gguf"), "phi3-longrope-tiny-q8_0", &[]),
    ] {
        let reference = std::fs::read_to_string(gguf.join(format!("{reference}-reference.json"))).unwrap();
        let r: serde_json::Value = serde_json::from_str(&reference).unwrap();
        let prompt_ids = ids(&r["prompt_ids"]).iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        let json = dir.join("gguf.json");
        let args = ["generate", "--model", model.to_str().unwrap(), "--prompt-ids", &prompt_ids, "--tokens", "32"];
        let out = fusegraph(&[&args[..], extra, &["--ignore-eos", "--json", json.to_str().unwrap()]].concat(), None);
        assert!(out.status.success(), "{model:?}: {}", String::from_utf8_lossy(&out.stderr));
        let got: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(ids(&got["generated_ids"]), ids(&r["greedy"]), "{model:?} {extra:?}");
    }
    // The GGUF file's own tokenizer (`tokenizer.ggml.*`, as llama.cpp's converter writes
    // llama-tiny's): the text prompt and the chat give `transformers`' ids and text.
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(checkpoint("llama-tiny-reference.json")).unwrap()).unwrap();
    let model = gguf.join("llama-tiny-q8_0.gguf");
    let json = dir.join("gguf-text.json");
    let chat = ["--chat", "--system", r["system"].as_str().unwrap(), "--prompt", r["user"].as_str().unwrap()];
    for (args, want) in [(&["--prompt", r["prompt"].as_str().unwrap()][..], "prompt_ids"), (&chat[..], "chat_ids")] {
        let common =
            ["generate", "--model", model.to_str().unwrap(), "--tokens", "2", "--json", json.to_str().unwrap()];
        let out = fusegraph(&[&common[..], args].concat(), None);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let got: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(ids(&got["prompt_ids"]), ids(&r[want]), "gguf tokenizer, {args:?}");
        if want == "chat_ids" {
            assert_eq!(got["prompt_text"], r["chat_text"], "gguf chat template");
        }
    }
    // A SentencePiece tokenizer in the file (`tokenizer.ggml.model` "llama", as Llama 2's,
    // Mistral's and TinyLlama's files hold it): `sentencepiece`'s ids for the text prompt,
    // then transformers' greedy tokens for them, written back as text.
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(gguf.join("llama-tiny-spm-reference.json")).unwrap()).unwrap();
    let model = gguf.join("llama-tiny-spm.gguf");
    let prompt = r["texts"][0]["text"].as_str().unwrap();
    let args = ["generate", "--model", model.to_str().unwrap(), "--prompt", prompt, "--tokens", "32", "--ignore-eos"];
    let out = fusegraph(&[&args[..], &["--json", json.to_str().unwrap()]].concat(), None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(ids(&got["prompt_ids"]), ids(&r["prompt_ids"]), "sentencepiece ids");
    assert_eq!(ids(&got["generated_ids"]), ids(&r["greedy"]), "greedy tokens");
    assert!(got["text"].as_str().is_some_and(|t| !t.is_empty()), "{got}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Bad input to `generate` is a clear error: a directory of an unsupported class names the
/// field and value, a text prompt without a tokenizer asks for ids.
#[test]
fn generate_names_what_is_wrong() {
    let dir = std::env::temp_dir().join(format!("fusegraph-generate-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = std::fs::read_to_string(checkpoint("llama-tiny/config.json")).unwrap();
    let path = dir.join("config.json");
    std::fs::write(&path, config.replace("LlamaForCausalLM", "PhiForCausalLM")).unwrap();
    let out = fusegraph(&["generate", "--model", dir.to_str().unwrap(), "--prompt-ids", "1,2"], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("architectures") && err.contains("PhiForCausalLM"), "{err}");
    let out = fusegraph(&["generate", "--random-config", path.to_str().unwrap(), "--prompt", "hi"], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("architectures"), "{err}");
    std::fs::write(&path, &config).unwrap();
    let out = fusegraph(&["generate", "--random-config", path.to_str().unwrap(), "--prompt", "hi"], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--prompt-ids"), "{err}");
    let out = fusegraph(
        &["generate", "--random-config", path.to_str().unwrap(), "--prompt-ids", "5,6,7", "--tokens", "4"],
        None,
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Block types are for matrices, through --quantize, which takes nothing else.
    for (flag, value, says) in
        [("--quantize", "f16", "q8_0, q4_0, q5_0, q4_1, q5_1 or none"), ("--dtype", "q4_0", "quantize")]
    {
        let out =
            fusegraph(&["generate", "--random-config", path.to_str().unwrap(), "--prompt-ids", "5", flag, value], None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{flag} {value}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `fusegraph run` on the CNN and the ResNet-18 `torch.onnx.export` wrote (tests/data/onnx):
/// the outputs it writes as `.npy` are ONNX Runtime's, and the summary names the fused
/// kernels; `explain`
/// reads the `.onnx` file; a missing input and an unknown input name are errors naming them.
#[test]
fn run_executes_an_onnx_model_and_writes_npy_outputs() {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/onnx");
    let dir = std::env::temp_dir().join(format!("fusegraph-run-{}", std::process::id()));
    let model = data.join("cnn.onnx");
    let input = format!("image={}", data.join("cnn-image.npy").display());
    let args = ["run", model.to_str().unwrap(), "--input", &input, "--output", dir.to_str().unwrap()];
    let out = fusegraph(&args, None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains("fused kernels"), "{err}");
    let io = fusegraph::crates::ir::safetensors::read(&data.join("cnn-io.safetensors")).unwrap();
    for name in ["probs", "class"] {
        let bytes = std::fs::read(dir.join(format!("{name}.npy"))).unwrap();
        let npy = npyz::NpyFile::new(&bytes[..]).unwrap();
        let got: Vec<f64> = match name {
            "class" => npy.into_vec::<i32>().unwrap().into_iter().map(f64::from).collect(),
            _ => npy.into_vec::<f32>().unwrap().into_iter().map(f64::from).collect(),
        };
        let want = io[&format!("output:{name}")].to_f64();
        assert_eq!(got.len(), want.len(), "{name}");
        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(worst < 1e-4, "{name}: {worst:.2e} from ONNX Runtime's");
    }
    // torchvision's ResNet-18 (a quarter of its widths): its logits.
    let resnet = data.join("resnet18.onnx");
    let input = format!("image={}", data.join("resnet18-image.npy").display());
    let out = fusegraph(&["run", resnet.to_str().unwrap(), "--input", &input, "--output", dir.to_str().unwrap()], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(dir.join("logits.npy")).unwrap();
    let got: Vec<f32> = npyz::NpyFile::new(&bytes[..]).unwrap().into_vec().unwrap();
    let want = fusegraph::crates::ir::safetensors::read(&data.join("resnet18-io.safetensors")).unwrap()
        ["output:logits"]
        .to_f64();
    let scale = want.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
    let worst = got.iter().zip(&want).map(|(a, b)| (f64::from(*a) - b).abs()).fold(0.0, f64::max);
    assert!(got.len() == want.len() && worst / scale < 1e-4, "resnet18 logits: {worst:.2e} from ONNX Runtime's");
    let out = fusegraph(&["explain", model.to_str().unwrap()], None);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("kernels:"));
    let out = fusegraph(&["run", model.to_str().unwrap()], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("no --input for the model's input `image`"), "{err}");
    let out = fusegraph(&["run", model.to_str().unwrap(), "--input", "pixels=x.npy"], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("`pixels`") && err.contains("image"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `generate --queue FILE --batch 2`: three prompts through two rows (the third joins when
/// one ends); the prompt given as ids and as text each get `transformers`' 32 greedy tokens,
/// the third its own 32.
#[test]
fn generate_serves_a_queue_of_prompts_through_fewer_rows() {
    let dir = std::env::temp_dir().join(format!("fusegraph-queue-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(checkpoint("llama-tiny-reference.json")).unwrap();
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids =
        |v: &serde_json::Value| -> Vec<i64> { v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect() };
    let prompt_ids = ids(&r["prompt_ids"]).iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    let queue = dir.join("queue.txt");
    std::fs::write(&queue, format!("{prompt_ids}\n{}\n5, 6, 7\n", r["prompt"].as_str().unwrap())).unwrap();
    let json = dir.join("queue.json");
    let model = checkpoint("llama-tiny");
    let out = fusegraph(
        &[
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--queue",
            queue.to_str().unwrap(),
            "--batch",
            "2",
            "--tokens",
            "32",
            "--ignore-eos",
            "--json",
            json.to_str().unwrap(),
        ],
        None,
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let seqs = got["sequences"].as_array().unwrap();
    assert_eq!(seqs.len(), 3);
    for s in &seqs[..2] {
        assert_eq!(ids(&s["prompt_ids"]), ids(&r["prompt_ids"]));
        assert_eq!(ids(&s["generated_ids"]), ids(&r["greedy"]));
    }
    assert_eq!((ids(&seqs[2]["prompt_ids"]), ids(&seqs[2]["generated_ids"]).len()), (vec![5, 6, 7], 32));
    assert_eq!((got["rows"].as_u64(), got["new_tokens"].as_u64()), (Some(2), Some(96)));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `generate --report-at P --profile RUNS`: the step at `P` reported with a time for each
/// of its kernels (as many as the step has, their bytes summing to the step's), and without
/// `--report-at` the last step profiled.
#[test]
fn generate_profiles_the_decode_step() {
    let dir = std::env::temp_dir().join(format!("fusegraph-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/configs/gpt2-w256-l4-v1k.json");
    let run = |extra: &[&str]| -> serde_json::Value {
        let json = dir.join("profile.json");
        let mut args = vec![
            "generate",
            "--random-config",
            config.to_str().unwrap(),
            "--prompt-ids",
            "1,2",
            "--tokens",
            "6",
            "--max-seq",
            "16",
            "--ignore-eos",
            "--profile",
            "2",
            "--json",
            json.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let out = fusegraph(&args, None);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("profile of the step at"));
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
    };
    let check = |profile: &serde_json::Value, kernels: u64, bytes: u64, pos: u64| {
        let ks = profile["kernels"].as_array().unwrap();
        assert_eq!((ks.len() as u64, profile["position"].as_u64()), (kernels, Some(pos)));
        assert_eq!(ks.iter().map(|k| k["bytes_moved"].as_u64().unwrap()).sum::<u64>(), bytes);
        assert!(ks.iter().all(|k| k["ms"].as_f64().is_some_and(|ms| ms > 0.0)), "{profile}");
    };
    let got = run(&["--report-at", "4"]);
    let at = &got["steps_at"][0];
    check(&at["profile"], at["kernels"].as_u64().unwrap(), at["bytes_moved"].as_u64().unwrap(), 4);
    assert!(got["profile"].is_null());
    // Six new tokens after two: the last step wrote position 6.
    let got = run(&[]);
    check(&got["profile"], got["step_kernels"].as_u64().unwrap(), got["step_bytes_moved"].as_u64().unwrap(), 6);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `explain` shows a decode step's cache write as the runtime compiles it: for a GPU the
/// write's kernel dissolves into the matrix–vector product reading the cache, a side window
/// of that kernel; for a CPU adapter (a tiled product) it stays a kernel of its own, as it does
/// where the new cache is an output rather than the parameter's update.
#[test]
fn explain_shows_cache_writes_as_side_windows_of_the_products_reading_them() {
    use fusegraph::{text, DType, GraphBuilder};
    let b = GraphBuilder::new();
    let cache = b.parameter("cache", DType::F32, [4, 64, 16]).unwrap();
    let x = b.input("x", DType::F32, [1, 64]).unwrap();
    let q = b.input("q", DType::F32, [4, 1, 16]).unwrap();
    let pos = b.input("pos", DType::I32, Vec::<usize>::new()).unwrap();
    let new = cache.dynamic_update_slice(&x.reshape([4, 1, 16]).unwrap(), &pos, 1).unwrap();
    let scores = q.matmul(&new.transpose(&[0, 2, 1]).unwrap()).unwrap();
    let path = std::env::temp_dir().join(format!("fusegraph_windows_{}.ir", std::process::id()));
    let file = path.to_str().unwrap();
    let mut counts = Vec::new();
    let update = vec![("cache".to_string(), new.id())];
    for (outputs, updates) in [(vec![scores.id()], update), (vec![scores.id(), new.id()], Vec::new())] {
        let program = text::Program { graph: b.graph(), outputs, updates };
        std::fs::write(&path, text::print_program(&program)).unwrap();
        for args in [vec!["explain", file], vec!["explain", file, "--cpu"]] {
            let out = fusegraph(&args, None);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let text = String::from_utf8(out.stdout).unwrap();
            let kernels: usize = text.lines().find_map(|l| l.strip_suffix(" kernels:")).unwrap().parse().unwrap();
            counts.push((kernels, text.lines().filter(|l| l.contains("(side windows: ")).count()));
        }
    }
    std::fs::remove_file(&path).unwrap();
    // (GPU, CPU) with the update, then with the new cache an output instead.
    assert_eq!(counts, [(1, 1), (2, 0), (2, 0), (2, 0)]);
}
