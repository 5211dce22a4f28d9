// Where the JIT's tools and headers are, and their versions (part of every cache key).
//
// Located once per process (thread-safe static). Precedence for the CUDA toolkit: settings().cuda_home
// (LOOM_CUDA_HOME, CUDA_HOME, CUDA_PATH), then the toolkit Loom was built against; its tools there, else on PATH.
// NVSHMEM: settings().nvshmem_home (LOOM_NVSHMEM_HOME), the build-time LOOM_NVSHMEM_HOME_DEFAULT, then the
// nvidia-nvshmem pip wheel (found through python3).
#pragma once

#include <string>
#include <vector>

namespace loom::jit::detail {

struct Toolchain {
    std::string cuda_home;                       // "" when unknown
    std::vector<std::string> cuda_include_dirs;  // include/ and include/cccl that exist
    std::string nvcc;                            // absolute path, or "" when not found
    std::string ptxas;
    std::string cuobjdump;
    std::string nvrtc_version;  // "13.0"
};
const Toolchain& toolchain();

// "V13.0.88" (from `nvcc --version`), run once; raises when nvcc is missing.
const std::string& nvcc_version();
// Driver version ("13000"), or "" without a driver. Never throws.
std::string driver_version();

struct NvshmemHome {
    std::string home;     // contains include/nvshmem.h and lib/
    std::string version;  // "3.4.5"
};
// Raises loom::Error naming every place looked when no NVSHMEM install is found.
const NvshmemHome& nvshmem_home();

// settings().cache_dir (LOOM_CACHE_DIR, else $XDG_CACHE_HOME/loom, else ~/.cache/loom). Created when missing.
std::string cache_root();

// File helpers used across the JIT.
bool file_exists(const std::string& path);
std::string read_file(const std::string& path);                   // raises naming the path
void write_file(const std::string& path, std::string_view data);  // raises naming the path
void make_dirs(const std::string& path);

}  // namespace loom::jit::detail
