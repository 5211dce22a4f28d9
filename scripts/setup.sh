#!/usr/bin/env bash
# usage: scripts/setup.sh
# Installs Loom's build dependencies and builds Loom (Release, Ninja). Idempotent. Needs the CUDA 13 toolkit (nvcc on
# PATH or in /usr/local/cuda).
# Build tools come from the system's package manager (apt-get or dnf), without pinned versions, and are checked
# after install: CMake >= 3.25. The libraries (fmt >= 9.1, nlohmann-json >= 3.11, CLI11 >= 2.1, GoogleTest >= 1.12)
# are installed from the distribution when it has them; one that is missing or older is downloaded at a pinned
# release by CMake (cmake/dependencies.cmake), which needs network access to github.com. NVSHMEM is the
# nvidia-nvshmem-cu13 wheel (pip); matplotlib (pip, the version scripts/plot_perf.py pins) draws docs/perf/plots.
#   LOOM_BUILD_DIR     build directory (default build)
#   LOOM_SKIP_DEPS=1   install nothing (the dependencies are present)
#   LOOM_NVSHMEM_HOME  NVSHMEM install the build records (default: the nvidia-nvshmem-cu13 wheel)
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0; fi
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${LOOM_BUILD_DIR:-build}

SUDO=""
[[ $(id -u) == 0 ]] || SUDO=sudo

# Version floors: "name floor" of each library, by its package name per package manager.
apt_tools=(cmake ninja-build g++ git python3-pip clang-format)
apt_libs=("libfmt-dev 9.1" "nlohmann-json3-dev 3.11" "libcli11-dev 2.1" "libgtest-dev 1.12")
dnf_tools=(cmake ninja-build gcc-c++ git python3-pip clang-tools-extra)
dnf_libs=("fmt-devel 9.1" "json-devel 3.11" "cli11-devel 2.1" "gtest-devel 1.12")

# Installs each missing apt package; a library the distribution lacks is left to CMake.
install_apt() {
    local missing=() p
    for p in "${apt_tools[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    for p in "${apt_libs[@]}"; do dpkg -s "${p% *}" >/dev/null 2>&1 || missing+=("${p% *}"); done
    ((${#missing[@]})) || return 0
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${apt_tools[@]}"
    for p in "${apt_libs[@]}"; do
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${p% *}" >/dev/null 2>&1 ||
            echo "setup: ${p% *} is not available here; CMake downloads its pinned release"
    done
}

install_dnf() {
    local p
    $SUDO dnf install -y -q "${dnf_tools[@]}"
    for p in "${dnf_libs[@]}"; do
        $SUDO dnf install -y -q "${p% *}" >/dev/null 2>&1 ||
            echo "setup: ${p% *} is not available here; CMake downloads its pinned release"
    done
}

# Reports each installed library below its floor (CMake then uses the pinned release instead).
check_lib_floors() {
    local p name floor have
    if command -v dpkg-query >/dev/null; then
        for p in "${apt_libs[@]}"; do
            name=${p% *} floor=${p#* }
            have=$(dpkg-query -W -f='${Version}' "$name" 2>/dev/null || true)
            if [[ -n $have ]] && dpkg --compare-versions "$have" lt "$floor"; then
                echo "setup: $name $have is older than $floor; CMake downloads its pinned release"
            fi
        done
    elif command -v rpm >/dev/null; then
        for p in "${dnf_libs[@]}"; do
            name=${p% *} floor=${p#* }
            have=$(rpm -q --qf '%{VERSION}' "$name" 2>/dev/null || true)
            if [[ $have =~ ^[0-9] ]] && ! version_ge "$have" "$floor"; then
                echo "setup: $name $have is older than $floor; CMake downloads its pinned release"
            fi
        done
    fi
}

# version_ge A B: A >= B, comparing dotted numbers.
version_ge() { [[ $(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1) == "$2" ]]; }

require_cmake() {
    local have
    have=$(cmake --version 2>/dev/null | sed -n '1s/[^0-9]*\([0-9][0-9.]*\).*/\1/p')
    if [[ -z $have ]] || ! version_ge "$have" 3.25; then
        echo "setup: CMake >= 3.25 is needed, found '${have:-none}' (python3 -m pip install 'cmake>=3.25')" >&2
        exit 1
    fi
}

if [[ "${LOOM_SKIP_DEPS:-0}" != 1 ]]; then
    if command -v apt-get >/dev/null; then
        install_apt
    elif command -v dnf >/dev/null; then
        install_dnf
    else
        echo "setup: no apt-get or dnf; install CMake >= 3.25, Ninja, a C++20 compiler, git and pip yourself"
    fi
    check_lib_floors
    if ! python3 -c "import nvidia.nvshmem" 2>/dev/null; then
        python3 -m pip install -q --disable-pip-version-check "nvidia-nvshmem-cu13==3.4.5"
    fi
    if ! python3 -c "import matplotlib" 2>/dev/null; then
        python3 -m pip install -q --disable-pip-version-check "matplotlib==3.11.2"
    fi
fi
require_cmake

command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
nvshmem_home=${LOOM_NVSHMEM_HOME:-$(python3 -c "import nvidia.nvshmem, os; print(list(nvidia.nvshmem.__path__)[0])" 2>/dev/null || true)}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_NVSHMEM_HOME="$nvshmem_home" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
