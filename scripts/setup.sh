#!/usr/bin/env bash
# usage: scripts/setup.sh
# Installs Loom's build dependencies (pinned apt packages, the nvidia-nvshmem-cu13 wheel) and builds Loom (Release,
# Ninja). Idempotent. Needs the CUDA 13 toolkit (nvcc on PATH or in /usr/local/cuda).
#   LOOM_BUILD_DIR     build directory (default build)
#   LOOM_SKIP_DEPS=1   install nothing (the dependencies are present)
#   LOOM_NVSHMEM_HOME  NVSHMEM install the build records (default: the nvidia-nvshmem-cu13 wheel)
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0; fi
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${LOOM_BUILD_DIR:-build}

if [[ "${LOOM_SKIP_DEPS:-0}" != 1 ]]; then
    apt_pkgs=(cmake ninja-build g++ git python3-pip clang-format
              googletest=1.12.1-0.2 libgtest-dev=1.12.1-0.2
              libcli11-dev=2.1.2+ds-1 nlohmann-json3-dev=3.11.2-2 libfmt-dev=9.1.0+ds1-2)
    missing=()
    for p in "${apt_pkgs[@]}"; do
        dpkg -s "${p%%=*}" >/dev/null 2>&1 || missing+=("$p")
    done
    if ((${#missing[@]})); then
        SUDO=""; [[ $(id -u) == 0 ]] || SUDO=sudo
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
    fi
    if ! python3 -c "import nvidia.nvshmem" 2>/dev/null; then
        python3 -m pip install -q --disable-pip-version-check "nvidia-nvshmem-cu13==3.4.5"
    fi
fi

command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
nvshmem_home=${LOOM_NVSHMEM_HOME:-$(python3 -c "import nvidia.nvshmem, os; print(list(nvidia.nvshmem.__path__)[0])" 2>/dev/null || true)}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_NVSHMEM_HOME="$nvshmem_home" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
