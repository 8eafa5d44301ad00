#!/usr/bin/env bash
# What bounds the 20-op elementwise chain: the kernel fusegraph generates for it (16 Mi
# elements; the form for a CPU adapter, or with --gpu the form for a GPU) timed beside the
# runtime's copy and edits that take its parts away (scripts/chain_variants.sh lists them),
# with crates/runtime/examples/time_wgsl.rs, the kernels in turn per round.
# Usage: scripts/chain_bound.sh [RUNS] [--gpu]   (BENCHMARKS.md)
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
# The copies first: each row's share is of its own dtype's copy.
files=("$dir"/copy.wgsl "$dir"/copy16.wgsl)
[ -e "${files[1]}" ] || files=("${files[0]}")
for f in "$dir"/*.wgsl; do case "$f" in */copy*.wgsl) ;; *) files+=("$f") ;; esac; done
./target/release/examples/time_wgsl "$n" "$runs" auto "${files[@]}" | sed "s|$dir/||" | scripts/chain_report.sh "$n"
rm -rf "$dir"
