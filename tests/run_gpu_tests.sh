#!/usr/bin/env bash
# GPU tests: the single-process GPU tests, then the multi-rank tests under loomrun at 2, 3, 4 and 8 ranks (ranks
# share the visible GPUs; on one GPU loomrun starts MPS), the cross-node and expert-parallel tests in emulated
# multi-node layouts, and the Python package's GPU tests at 2 ranks. Stops at the first failure, saying which run
# failed.
#   usage: tests/run_gpu_tests.sh <build dir>      extra gtest flags: LOOM_GTEST_ARGS="--gtest_filter=..."
#   LOOM_PYTHON     interpreter with the loom package and torch installed (default: the build's py-venv from
#                   scripts/test_python.sh)
#   LOOM_TEST_SEED  the run's seed of the tests' random inputs (default: a fresh one, printed first; pass it again to
#                   reproduce a failure)
set -uo pipefail
build=${1:?usage: tests/run_gpu_tests.sh <build dir>}
cd "$(dirname "$0")/.." || exit 1
loomrun="$build/bin/loomrun"
gtest_args=${LOOM_GTEST_ARGS:-}
export LOOM_WAIT_TIMEOUT_MS=${LOOM_WAIT_TIMEOUT_MS:-20000}
export LOOM_TEST_SEED=${LOOM_TEST_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
echo "LOOM_TEST_SEED=$LOOM_TEST_SEED"

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
for n in 2 3 4 8; do
    # shellcheck disable=SC2086
    step "loom_dist_tests under loomrun -n $n" "$loomrun" -n "$n" "$build/tests/loom_dist_tests" $gtest_args
done
# Emulated nodes (docs/crossnode.md): nodes x ranks per node = 2x2, 2x4, 4x2; peers across nodes only through NVSHMEM.
# The expert-parallel ops run across nodes too (their own paths and refusals there).
for layout in "2 4" "4 8" "2 8"; do
    read -r k n <<<"$layout"
    step "CrossNode and EP tests under LOOM_NODE_SIZE=$k loomrun -n $n" env LOOM_NODE_SIZE="$k" "$loomrun" -n "$n" \
        "$build/tests/loom_dist_tests" --gtest_filter='CrossNode*:MoeEp*:EpLl*'
done
step "examples/00_hello_symmetric under loomrun -n 2" "$loomrun" -n 2 "$build/examples/00_hello_symmetric"
python=${LOOM_PYTHON:-$build/py-venv/bin/python}
if ! "$python" -c 'import loom, torch' 2>/dev/null; then
    echo "FAILED: $python cannot import loom and torch (scripts/test_python.sh $build installs the package; or set" \
        "LOOM_PYTHON)" >&2
    exit 1
fi
# No pytest cache: the ranks' processes would write it at once.
step "Python GPU tests under loomrun -n 2" "$loomrun" -n 2 "$python" -m pytest -q -p no:cacheprovider python/tests/gpu
echo "GPU tests passed"
