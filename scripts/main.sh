#!/usr/bin/env bash
# The main job: the adapter, then the example networks. Extra args go to the examples.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release -- info
cargo run --release --example quickstart
