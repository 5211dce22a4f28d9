// loom::Settings: every process-wide setting Loom reads from the environment, read once per process.
//
// The variables (README "Environment"): rank facts (env.hpp: LOOM_RANK, ... or torchrun's / Open MPI's / Slurm's),
// LOOM_DEVICE, LOOM_SYMMETRIC_SIZE, LOOM_COLL_SCRATCH, LOOM_WAIT_TIMEOUT_MS, LOOM_STORE_TIMEOUT_MS, LOOM_CACHE_DIR,
// LOOM_JIT_COMPILER, LOOM_CUDA_HOME, LOOM_NVSHMEM_HOME, LOOM_AUTOTUNE, LOOM_LOG_LEVEL, LOOM_DIAG_MAILBOX.
// Ops never read the environment: per-call tuning goes through their option structs.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "loom/runtime/env.hpp"

namespace loom {

enum class LogLevel { Error = 0, Warn = 1, Info = 2, Debug = 3 };

// How the JIT compiles a kernel missing from the cache.
enum class JitCompiler {
    Nvrtc,       // NVRTC to a cubin (nvcc when NVRTC fails)
    NvrtcPtxas,  // NVRTC to PTX, then the ptxas program
    Nvcc,        // the nvcc program
    CacheOnly,   // no compiler at run time: a cache miss is an error
};

struct Settings {
    RankInfo rank;                                      // rank facts (env.hpp)
    std::size_t symmetric_size = std::size_t{1} << 30;  // LOOM_SYMMETRIC_SIZE: bytes of each rank's heap
    std::size_t coll_scratch = std::size_t{64} << 20;   // LOOM_COLL_SCRATCH: the collectives' symmetric scratch
    std::chrono::milliseconds wait_timeout{0};          // LOOM_WAIT_TIMEOUT_MS: device spin-wait bound (0: none)
    std::chrono::milliseconds store_timeout{300000};    // LOOM_STORE_TIMEOUT_MS: bootstrap-store waits
    std::chrono::milliseconds shutdown_timeout{60000};  // the World's shutdown barrier (min with store_timeout)
    std::string cache_dir;                              // LOOM_CACHE_DIR, else $XDG_CACHE_HOME/loom, ~/.cache/loom
    JitCompiler jit_compiler = JitCompiler::Nvrtc;      // LOOM_JIT_COMPILER: nvrtc, nvrtc-ptxas, nvcc, cache-only
    std::chrono::seconds jit_timeout{600};              // time limit of the nvcc / ptxas subprocesses
    std::string cuda_home;                              // LOOM_CUDA_HOME, CUDA_HOME, CUDA_PATH; empty: build-time
    std::string nvshmem_home;                           // LOOM_NVSHMEM_HOME; empty: build-time path, else the wheel
    bool autotune = false;                              // LOOM_AUTOTUNE: time candidate configs, persist winners
    LogLevel log_level = LogLevel::Warn;                // LOOM_LOG_LEVEL: error, warn, info, debug
    bool diag_mailbox = false;                          // LOOM_DIAG_MAILBOX: timed-out waits also post a record
    int mps_thread_percentage = 0;                      // CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (MPS's; 0: unset)
};

// The process's settings, parsed from the environment on first use; raises loom::Error naming a malformed variable.
const Settings& settings();
// The same parse over any lookup (tests, tools).
Settings settings_from(const EnvLookup& env);
const char* to_string(JitCompiler c);
const char* to_string(LogLevel l);
// Whether messages of `level` are printed (settings().log_level at least `level`).
inline bool log_enabled(LogLevel level) { return static_cast<int>(settings().log_level) >= static_cast<int>(level); }

}  // namespace loom
