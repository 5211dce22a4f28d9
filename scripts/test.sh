#!/usr/bin/env bash
# usage: scripts/test.sh
# Installs the dependencies and builds (scripts/setup.sh), checks formatting (clang-format) and that docs/perf's
# generated README and plots match its JSON (scripts/perf_summary.py, scripts/plot_perf.py), installs the package
# and builds tests/consumer against it (the getting-started program; it runs, or says there is no GPU), runs the
# CPU tests, the performance model's (tests/model, standard library only) and the Python package's
# (scripts/test_python.sh: fresh virtual environment, pip install ., pytest), and
# runs the GPU tests (tests/run_gpu_tests.sh: 1 process, then 2, 3, 4 and 8 ranks under loomrun, emulated nodes,
# the Python GPU tests) when a GPU is present.
#   LOOM_BUILD_DIR        build directory (default build)
#   LOOM_SKIP_DEPS=1, LOOM_NVSHMEM_HOME: as for scripts/setup.sh
#   LOOM_GTEST_ARGS       extra GoogleTest flags for the GPU tests (e.g. --gtest_filter=Overlap.*)
#   LOOM_WAIT_TIMEOUT_MS  device wait bound of the GPU tests (default 20000)
#   LOOM_SOURCE_DIR       repository root for tests and benchmarks run from a moved build (default: found from
#                         the executable's path)
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0; fi
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build_dir=${LOOM_BUILD_DIR:-build}

echo "== format check (clang-format, .clang-format)"
git ls-files '*.cpp' '*.hpp' '*.cuh' '*.cu' | xargs clang-format --dry-run --Werror

echo "== docs/perf generated files (perf_summary.py --check, plot_perf.py --check)"
python3 scripts/perf_summary.py --check
python3 scripts/plot_perf.py --check

echo "== install + find_package(loom) consumer"
rm -rf "$build_dir/install" "$build_dir/consumer"
cmake --install "$build_dir" --prefix "$build_dir/install" >/dev/null
cmake -S tests/consumer -B "$build_dir/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$PWD/$build_dir/install" >/dev/null
cmake --build "$build_dir/consumer" >/dev/null
"$build_dir/consumer/loom_consumer"

echo "== CPU tests"
ctest --test-dir "$build_dir" -L unit --output-on-failure -j 2

echo "== performance model (tools/loom_model: unit tests, parameter files, published and measured figures)"
PYTHONPATH=tools python3 -m unittest discover -s tests/model

echo "== Python package (fresh virtual environment, pip install ., CPU pytest)"
scripts/test_python.sh "$build_dir"

echo "== GPU tests"
if "$build_dir/bin/loom-info" --has-gpu >/dev/null 2>&1; then
    tests/run_gpu_tests.sh "$build_dir"
else
    echo "GPU tests skipped: $("$build_dir/bin/loom-info" --has-gpu 2>&1 || true)"
fi
