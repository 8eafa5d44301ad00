#!/usr/bin/env bash
# The main job: the adapter, the fused-vs-unfused comparison of every workload (including
# the example networks), then the example networks themselves, each checked against the
# CPU reference. `--quick` runs small sizes (what CI runs); other args go to `bench`
# (e.g. --json results.json, --plot plots/).
set -euo pipefail
cd "$(dirname "$0")/.."
# Mesa's device-select Vulkan layer asks Wayland for a display and prints "XDG_RUNTIME_DIR is
# invalid or not set" twice per process where there is none (a headless machine, CI).
[ -n "${XDG_RUNTIME_DIR:-}" ] || export NODEVICE_SELECT=1
quick=()
for a in "$@"; do
    if [ "$a" = "--quick" ]; then quick=(--quick); fi
done
cargo build --release --workspace --bins --examples
# Where cargo put them: CARGO_TARGET_DIR where set (relative to the repository root).
bin="${CARGO_TARGET_DIR:-target}/release"
"$bin/fusegraph" info
"$bin/fusegraph" bench "$@"
for example in mlp cnn transformer memory_limit; do
    echo
    echo "== example: $example"
    "$bin/examples/$example" "${quick[@]}"
done
