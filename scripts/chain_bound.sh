#!/usr/bin/env bash
# What bounds the 20-op elementwise chain: the kernel fusegraph generates for it (16 Mi
# elements; the form for a CPU adapter, or with --gpu the form for a GPU) timed beside the
# runtime's copy and edits that take its parts away (scripts/chain_variants.sh lists them),
# with crates/runtime/examples/time_wgsl.rs, the kernels in turn per round.
# Usage: scripts/chain_bound.sh [RUNS] [--gpu]   (BENCHMARKS.md, fifteenth session)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-11}
form=--cpu
[ "${2:-}" = --gpu ] && form=
n=16777216
dir=$(mktemp -d)
cargo build -q --release --bin fusegraph
cargo build -q --release -p fusegraph-runtime --example time_wgsl
scripts/chain_variants.sh "$dir" "$n" $form
report() {
    awk -v n="$1" '{ ms = $3; f = $1; sub(".*/", "", f);
        bytes = (f ~ /^copy/ ? 8 : 12) * n / (f ~ /16\.wgsl/ ? 2 : 1); gbps = bytes / ms / 1e6;
        if (f == "copy.wgsl:") copy = gbps; if (f == "copy16.wgsl:") copy16 = gbps;
        c = (f ~ /16\.wgsl/) ? copy16 : copy;
        printf "%s  %.2f GB/s (%.0f%% of copy)\n", $0, gbps, 100 * gbps / c }'
}
# The copies first: each row's share is of its own dtype's copy.
files=("$dir"/copy.wgsl "$dir"/copy16.wgsl)
[ -e "${files[1]}" ] || files=("${files[0]}")
for f in "$dir"/*.wgsl; do case "$f" in */copy*.wgsl) ;; *) files+=("$f") ;; esac; done
./target/release/examples/time_wgsl "$n" "$runs" auto "${files[@]}" | sed "s|$dir/||" | report "$n"
rm -rf "$dir"
