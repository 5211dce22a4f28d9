#!/usr/bin/env bash
# usage: scripts/build_wheel.sh [python version, e.g. 3.12]
# Builds the Python package's wheel (loom, with its extension and libloom.so.0 inside) into .whl/ for the given
# interpreter: python<version> on PATH, else pyenv's, else the default python3. The wheel needs at run time the CUDA
# 13 libraries libloom links (libcudart, libnvrtc, libnvJitLink: the toolkit's, or those torch's wheel loads) and
# torch for the tensor API; install it elsewhere with `pip install --no-deps .whl/loom-*.whl`.
#   LOOM_PYTHON     interpreter to build for (overrides the version argument)
#   LOOM_PREBUILT   a build directory whose libloom.so.0 the wheel ships instead of building the library again
#   LOOM_WHEEL_DIR  output directory (default .whl)
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0; fi
set -euo pipefail
cd "$(dirname "$0")/.."
py=${LOOM_PYTHON:-}
if [[ -z $py && -n ${1:-} ]]; then
    py=$(command -v "python$1" 2>/dev/null || true)
    if [[ -z $py || $("$py" -c 'import sys; print(sys.version_info >= (3,))' 2>/dev/null) != True ]]; then
        py=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1"*/bin/python"$1" 2>/dev/null | sort -V | tail -1)
    fi
    [[ -x ${py:-} ]] || { echo "build_wheel.sh: no python$1 found (PATH, pyenv)" >&2; exit 1; }
fi
py=${py:-python3}
out=${LOOM_WHEEL_DIR:-.whl}
mkdir -p "$out"
args=()
[[ -n ${LOOM_PREBUILT:-} ]] && args+=(-Ccmake.define.LOOM_PREBUILT="$(realpath "$LOOM_PREBUILT")")
command -v ccache >/dev/null && export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}
echo "building the wheel with $("$py" --version) ($py)"
"$py" -m pip wheel --disable-pip-version-check --no-deps -w "$out" "${args[@]}" .
ls -l "$out"/loom-*.whl
