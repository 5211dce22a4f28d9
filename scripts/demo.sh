#!/usr/bin/env bash
# Set-up and demo: installs dependencies, builds, and runs the symmetric-memory demo on 2 ranks under loomrun
# (ranks share the one GPU under MPS when there is only one). Without a GPU it says so and exits non-zero.
#   LOOM_DEMO_RANKS  number of ranks (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build_dir=${LOOM_BUILD_DIR:-build}
exec "$build_dir/bin/loomrun" -n "${LOOM_DEMO_RANKS:-2}" "$build_dir/examples/00_hello_symmetric"
