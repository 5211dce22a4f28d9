#!/usr/bin/env bash
# Tests: installs dependencies, builds, checks formatting, runs the CPU tests (always), builds a consumer
# project against the installed package, and runs the GPU tests when a GPU is present (skipped otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build_dir=${LOOM_BUILD_DIR:-build}

echo "== format check (clang-format, .clang-format)"
git ls-files '*.cpp' '*.hpp' '*.cuh' '*.cu' | xargs clang-format --dry-run --Werror

echo "== install + find_package(loom) consumer"
rm -rf "$build_dir/install" "$build_dir/consumer"
cmake --install "$build_dir" --prefix "$build_dir/install" >/dev/null
cmake -S tests/consumer -B "$build_dir/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$PWD/$build_dir/install" >/dev/null
cmake --build "$build_dir/consumer" >/dev/null
"$build_dir/consumer/loom_consumer"

echo "== CPU tests"
ctest --test-dir "$build_dir" -L unit --output-on-failure -j 2

echo "== GPU tests"
if "$build_dir/bin/loom-info" --has-gpu >/dev/null 2>&1; then
    tests/run_gpu_tests.sh "$build_dir"
else
    echo "GPU tests skipped: $("$build_dir/bin/loom-info" --has-gpu 2>&1 || true)"
fi
