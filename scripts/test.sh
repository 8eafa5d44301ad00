#!/usr/bin/env bash
# The test command: every crate's tests, null tests and device tests (on the default
# backend: Vulkan where a driver is installed, else GL). Pass extra cargo test args through.
set -euo pipefail
cd "$(dirname "$0")/.."
# Mesa's device-select Vulkan layer asks Wayland for a display and prints "XDG_RUNTIME_DIR is
# invalid or not set" twice per process where there is none (a headless machine, CI).
[ -n "${XDG_RUNTIME_DIR:-}" ] || export NODEVICE_SELECT=1
cargo test --workspace "$@"
