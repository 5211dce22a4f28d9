#!/usr/bin/env bash
# usage: scripts/test_python.sh [build dir]
# The Python package's CPU tests: a fresh virtual environment, pip install . (linking the build dir's libloom when
# it has one: LOOM_PREBUILT), import loom, pytest python/tests/test_cpu*.py. Needs no GPU. The environment sees the
# interpreter's own packages, so a torch installed there is used; without torch, test_cpu_torch.py (the tensor
# API's CPU tests) is skipped and says so, and the GPU machine's runs (which have torch) cover it.
#   LOOM_PYTHON           interpreter of the environment (default python3)
#   LOOM_PY_TORCH         1: install torch into the environment (the CPU wheel index first, then PyPI's CUDA build:
#                         about 3.5 GB); 0 (default): use the interpreter's torch if it has one
#   LOOM_TORCH_INDEX_URL  the CPU wheel index tried first (default: PyTorch's CPU index)
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0; fi
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
venv=$build_dir/py-venv
rm -rf "$venv"
"${LOOM_PYTHON:-python3}" -m venv --system-site-packages "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install pytest numpy
if [[ ${LOOM_PY_TORCH:-0} == 1 ]]; then
    index=${LOOM_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
    "${pip[@]}" install --timeout 15 --retries 1 --index-url "$index" torch 2>/dev/null ||
        "${pip[@]}" install torch
fi
prebuilt=()
[[ -e $build_dir/libloom.so.0 ]] && prebuilt=(-Ccmake.define.LOOM_PREBUILT="$PWD/$build_dir")
command -v ccache >/dev/null && export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}
"${pip[@]}" install "${prebuilt[@]}" .
"$venv/bin/python" -c "import loom; print('import loom', loom.__version__, 'from', loom.__file__)"
cd python/tests
"../../$venv/bin/python" -m pytest -q -rs -p no:cacheprovider test_cpu.py test_cpu_torch.py
