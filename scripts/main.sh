#!/usr/bin/env bash
# The main job: the adapter, the fused-vs-unfused comparison of every workload (including
# the example networks), then the example networks themselves, each checked against the
# CPU reference. `--quick` runs small sizes (what CI runs); `--debug` runs the debug build
# instead of an optimized one (CI, after the tests built it); other args go to `bench`
# (e.g. --json results.json, --plot plots/).
set -euo pipefail
cd "$(dirname "$0")/.."
# Mesa's device-select Vulkan layer asks Wayland for a display and prints "XDG_RUNTIME_DIR is
# invalid or not set" twice per process where there is none (a headless machine, CI).
[ -n "${XDG_RUNTIME_DIR:-}" ] || export NODEVICE_SELECT=1
quick=()
profile=release
args=()
for a in "$@"; do
    case "$a" in
    --quick) quick=(--quick); args+=("$a") ;;
    # The debug build the tests made (CI's smoke run: no second, optimized build).
    --debug) profile=debug ;;
    *) args+=("$a") ;;
    esac
done
if [ "$profile" = release ]; then
    cargo build --release --workspace --bins --examples
else
    cargo build --workspace --bins --examples
fi
# Where cargo put them: CARGO_TARGET_DIR where set (relative to the repository root).
bin="${CARGO_TARGET_DIR:-target}/$profile"
"$bin/fusegraph" info
"$bin/fusegraph" bench "${args[@]}"
for example in mlp cnn transformer memory_limit; do
    echo
    echo "== example: $example"
    "$bin/examples/$example" "${quick[@]}"
done
