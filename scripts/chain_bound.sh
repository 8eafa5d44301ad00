#!/usr/bin/env bash
# What bounds the 20-op elementwise chain on a CPU adapter: the generated kernel (from the
# golden file, 16 Mi elements) timed beside a vec4 copy and three edits of its `fg_tanh`
#   core      the rational function alone (no clamp, no NaN test: wrong past |x| > 7.9,
#             for timing only)
#   div       one fma and one division in place of tanh
#   identity  tanh(x) = x (the chain's loads, stores and 15 cheap ops)
# with crates/runtime/examples/time_wgsl.rs, the kernels in turn per round.
# Usage: scripts/chain_bound.sh [RUNS]   (BENCHMARKS.md, fifteenth session)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-11}
n=16777216
dir=$(mktemp -d)
python3 - "$dir" "$n" <<'PY'
import sys
out, n = sys.argv[1], int(sys.argv[2])
src = open("tests/wgsl/chain20_cpu_interleaved.wgsl").read().replace("t < 250u", f"t < {n // 4}u")
start = src.index("fn fg_tanh(x: f32) -> f32 {")
end = src.index("\n}\n", start) + 3
tanh = src[start:end]
core = tanh.replace("clamp(x, -7.90531110763549805f, 7.90531110763549805f)", "x").replace(
    "select(c * p / q, x, nan)", "c * p / q")
assert core != tanh
variants = {
    "chain": tanh,
    "core": core,
    "div": "fn fg_tanh(x: f32) -> f32 {\n    return x / fma(x, x, 1.0f);\n}\n",
    "identity": "fn fg_tanh(x: f32) -> f32 {\n    return x;\n}\n",
}
for name, body in variants.items():
    open(f"{out}/{name}.wgsl", "w").write(src[:start] + body + src[end:])
open(f"{out}/copy.wgsl", "w").write(f"""@group(0) @binding(0) var<storage, read_write> b0: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> b1: array<vec4<f32>>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let stride = nwg.x * nwg.y * 256u;
    for (var t = (wid.y * nwg.x + wid.x) * 256u + lid; t < {n // 4}u; t = t + stride) {{
        b1[t] = -b0[t];
    }}
}}
""")
PY
cargo build -q --release -p fusegraph-runtime --example time_wgsl
# 1024 workgroups: what the runtime dispatches for a loop kernel on a CPU adapter.
./target/release/examples/time_wgsl "$n" "$runs" 1024 "$dir"/{copy,chain,core,div,identity}.wgsl \
    | sed "s|$dir/||" \
    | awk -v n="$n" '{ ms = $3; bytes = ($1 == "copy.wgsl:") ? 8 * n : 12 * n; gbps = bytes / ms / 1e6;
        if ($1 == "copy.wgsl:") copy = gbps;
        printf "%s  %.2f GB/s (%.0f%% of copy)\n", $0, gbps, 100 * gbps / copy }'
rm -rf "$dir"
