#!/usr/bin/env bash
# The test command: every crate's tests, null tests and device tests (on the default
# backend: Vulkan where a driver is installed, else GL). Pass extra cargo test args through.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace "$@"
