#!/usr/bin/env bash
# The test command: every crate's tests, null tests and device tests (on the default
# backend: Vulkan where a driver is installed, else GL). Pass extra cargo test args through.
set -euo pipefail
cd "$(dirname "$0")/.."
# Mesa's device-select Vulkan layer asks Wayland for a display and prints "XDG_RUNTIME_DIR is
# invalid or not set" twice per process where there is none (a headless machine, CI).
[ -n "${XDG_RUNTIME_DIR:-}" ] || export NODEVICE_SELECT=1
cargo test --workspace "$@"
# Data parallelism across processes (feature `mpi`): the example under `mpirun`, where Open MPI
# is installed (Debian: libopenmpi-dev openmpi-bin libclang-dev; CI installs them).
if command -v mpirun >/dev/null; then
    cargo build --features mpi --example train
    cargo test --features mpi --test mpi
else
    echo "MPI tests not run: no mpirun on this machine (apt-get install libopenmpi-dev openmpi-bin libclang-dev)"
fi
