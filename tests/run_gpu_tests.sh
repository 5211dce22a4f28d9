#!/usr/bin/env bash
# GPU tests: the single-process GPU tests, then the multi-rank tests under loomrun at 2, 4 and 8 ranks (ranks
# share the visible GPUs; on one GPU loomrun starts MPS), and the cross-node tests in emulated multi-node layouts.
# Stops at the first failure, saying which run failed.
#   usage: tests/run_gpu_tests.sh <build dir>      extra gtest flags: LOOM_GTEST_ARGS="--gtest_filter=..."
set -uo pipefail
build=${1:?usage: tests/run_gpu_tests.sh <build dir>}
cd "$(dirname "$0")/.." || exit 1
loomrun="$build/bin/loomrun"
gtest_args=${LOOM_GTEST_ARGS:-}
export LOOM_WAIT_TIMEOUT_MS=${LOOM_WAIT_TIMEOUT_MS:-20000}

step() {
    local what=$1
    shift
    echo "== $what"
    if ! "$@"; then
        echo "FAILED: $what (command: $*)" >&2
        exit 1
    fi
}

for exe in "$build/tests/loom_gpu_tests" "$build/tests/loom_dist_tests" "$build/tests/loom_test_child" "$loomrun"; do
    [[ -x $exe ]] || { echo "FAILED: $exe not built" >&2; exit 1; }
done

# shellcheck disable=SC2086
step "loom_gpu_tests (1 process)" "$build/tests/loom_gpu_tests" $gtest_args
for n in 2 4 8; do
    # shellcheck disable=SC2086
    step "loom_dist_tests under loomrun -n $n" "$loomrun" -n "$n" "$build/tests/loom_dist_tests" $gtest_args
done
# Emulated nodes (docs/crossnode.md): nodes x ranks per node = 2x2, 2x4, 4x2; peers across nodes only through NVSHMEM.
for layout in "2 4" "4 8" "2 8"; do
    read -r k n <<<"$layout"
    step "CrossNode tests under LOOM_NODE_SIZE=$k loomrun -n $n" env LOOM_NODE_SIZE="$k" "$loomrun" -n "$n" \
        "$build/tests/loom_dist_tests" --gtest_filter='CrossNode*'
done
step "examples/00_hello_symmetric under loomrun -n 2" "$loomrun" -n 2 "$build/examples/00_hello_symmetric"
echo "GPU tests passed"
