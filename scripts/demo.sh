#!/usr/bin/env bash
# usage: scripts/demo.sh
# Installs the dependencies and builds (scripts/setup.sh), then runs the symmetric-memory demo
# (examples/00_hello_symmetric) under loomrun: each rank writes a pattern into every peer's symmetric memory and
# checks what it received. Ranks share the GPU under MPS when there are fewer GPUs than ranks. Without a GPU it
# says so and exits non-zero.
#   LOOM_DEMO_RANKS   number of ranks (default 2)
#   LOOM_BUILD_DIR    build directory (default build)
#   LOOM_SKIP_DEPS=1, LOOM_NVSHMEM_HOME: as for scripts/setup.sh
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0; fi
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build_dir=${LOOM_BUILD_DIR:-build}
exec "$build_dir/bin/loomrun" -n "${LOOM_DEMO_RANKS:-2}" "$build_dir/examples/00_hello_symmetric"
