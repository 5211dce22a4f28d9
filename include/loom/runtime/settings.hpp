// loom::Settings: every process-wide setting Loom reads from the environment, read once per process.
//
// The variables (README "Environment"):
//   rank facts            LOOM_RANK, LOOM_WORLD_SIZE, LOOM_LOCAL_RANK, LOOM_LOCAL_WORLD_SIZE, LOOM_MASTER_ADDR,
//                         LOOM_MASTER_PORT, or torchrun's / Open MPI's / Slurm's (env.hpp); LOOM_DEVICE;
//                         LOOM_JOB_SECRET (the bootstrap store's admission secret; loomrun sets it); LOOM_NODE_SIZE
//                         (ranks per node, splitting hosts into emulated nodes: env.hpp)
//   LOOM_SYMMETRIC_SIZE   bytes of each rank's symmetric heap (1G)
//   LOOM_WAIT_TIMEOUT_MS  bound on every device spin-wait and copy-engine stream wait (300000; 0: unbounded)
//   LOOM_STORE_TIMEOUT_MS bound on every bootstrap-store wait (300000)
//   LOOM_CACHE_DIR        the JIT's disk cache ($XDG_CACHE_HOME/loom, else ~/.cache/loom)
//   LOOM_JIT_COMPILER     nvrtc (default), nvrtc-ptxas, nvcc, or cache-only (a cache miss is an error)
//   LOOM_CUDA_HOME        the CUDA toolkit (else CUDA_HOME, CUDA_PATH, the toolkit Loom was built against)
//   LOOM_NVSHMEM_HOME     NVSHMEM (else the build-time path, else the nvidia-nvshmem-cu13 wheel)
//   LOOM_AUTOTUNE         1: time candidate configs on first use of a shape and persist the winners
//   LOOM_LOG_LEVEL        error, warn (default), info, debug; debug also keeps kernel.ptx / kernel.sass in the cache
//   LOOM_CHECK_AGREEMENT  1: every collective / overlapped call is compared across ranks first (a host round trip)
//   LOOM_PROFILE          a directory: kernels are compiled with the intra-kernel profiler and each World writes one
//                         Chrome-trace JSON there when it shuts down (docs/profiling.md)
// Sizes take 1073741824, 512M, 1G or 2GiB; flags 1/true/yes/on or 0/false/no/off; an empty value counts as unset.
// Ops never read the environment: per-call tuning goes through their option structs.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "loom/runtime/env.hpp"

namespace loom {

// Error: failures only. Warn: warnings, and the progress of work the user asked for (autotuning). Info: one line per
// notable event. Debug: every JIT compile and cache hit with its time, each op's choice.
enum class LogLevel { Error = 0, Warn = 1, Info = 2, Debug = 3 };

// How the JIT compiles a kernel missing from the cache. The choice is part of the cache key.
enum class JitCompiler {
    Nvrtc,       // NVRTC to a cubin (nvcc when NVRTC fails)
    NvrtcPtxas,  // NVRTC to PTX, then the ptxas program
    Nvcc,        // the nvcc program
    CacheOnly,   // no compiler at run time: the entries NVRTC wrote are used, a miss is an error
};

struct Settings {
    RankInfo rank;                                      // rank facts and LOOM_DEVICE (env.hpp)
    std::size_t symmetric_size = std::size_t{1} << 30;  // LOOM_SYMMETRIC_SIZE: bytes of each rank's heap
    std::chrono::milliseconds wait_timeout{300000};     // LOOM_WAIT_TIMEOUT_MS: every wait's bound (0: unbounded)
    std::chrono::milliseconds store_timeout{300000};    // LOOM_STORE_TIMEOUT_MS: bootstrap-store waits
    std::string job_secret;                             // LOOM_JOB_SECRET: >= 16 chars; empty: rank 0's token file
    std::chrono::milliseconds shutdown_timeout{60000};  // the World's shutdown barrier (at most store_timeout)
    std::string cache_dir;                              // LOOM_CACHE_DIR, else $XDG_CACHE_HOME/loom, ~/.cache/loom
    JitCompiler jit_compiler = JitCompiler::Nvrtc;      // LOOM_JIT_COMPILER: nvrtc, nvrtc-ptxas, nvcc, cache-only
    bool jit_nvcc_fallback = true;                      // nvcc retries a kernel NVRTC failed on (tests turn it off)
    std::chrono::seconds jit_timeout{600};              // time limit of the nvcc / ptxas subprocesses
    std::string cuda_home;                              // LOOM_CUDA_HOME, CUDA_HOME, CUDA_PATH; empty: build-time
    std::string nvshmem_home;                           // LOOM_NVSHMEM_HOME; empty: build-time path, else the wheel
    bool autotune = false;                              // LOOM_AUTOTUNE: time candidate configs, persist winners
    LogLevel log_level = LogLevel::Warn;                // LOOM_LOG_LEVEL: error, warn, info, debug
    bool check_agreement = false;                       // LOOM_CHECK_AGREEMENT: compare each collective call's
                                                        // signature across ranks first (runtime/call_agreement.hpp)
    std::string profile_dir;                            // LOOM_PROFILE: profiled kernels, traces written here
    int mps_thread_percentage = 0;                      // CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (MPS's; 0: unset)
    // NVSHMEM_CUMEM_GRANULARITY (NVSHMEM's, 512 MiB by default): NVSHMEM maps a registered buffer into its symmetric
    // space in units of it, so a World of several nodes rounds its heap up to a multiple of it.
    std::size_t nvshmem_cumem_granularity = std::size_t{1} << 29;
};

// Bytes of each rank's symmetric heap for `requested` bytes in a World of `num_nodes` nodes: requested, rounded up to
// a multiple of s.nvshmem_cumem_granularity where NVSHMEM registers the heap (several nodes).
std::size_t symmetric_heap_bytes(std::size_t requested, int num_nodes, const Settings& s);

// The process's settings, parsed from the environment on first use and never again; raises loom::Error naming a
// malformed variable (and parses again on the next call). Cheap after the first call.
const Settings& settings();
// The same parse over any lookup (tests, tools).
Settings settings_from(const EnvLookup& env);
const char* to_string(JitCompiler c);
const char* to_string(LogLevel l);
// Whether messages of `level` are printed (settings().log_level at least `level`).
inline bool log_enabled(LogLevel level) { return static_cast<int>(settings().log_level) >= static_cast<int>(level); }

}  // namespace loom
