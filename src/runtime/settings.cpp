// The one parse of Loom's environment variables, and the process's copy of its result.
#include "loom/runtime/settings.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "loom/runtime/error.hpp"
#include "runtime/env_vars.hpp"
#include "runtime/settings_override.hpp"

namespace loom {
namespace {

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
}

JitCompiler parse_compiler(const std::optional<std::string>& v) {
    if (!v) return JitCompiler::Nvrtc;
    const std::string s = lower(*v);
    if (s == "nvrtc") return JitCompiler::Nvrtc;
    if (s == "nvrtc-ptxas") return JitCompiler::NvrtcPtxas;
    if (s == "nvcc") return JitCompiler::Nvcc;
    if (s == "cache-only") return JitCompiler::CacheOnly;
    LOOM_FAIL("LOOM_JIT_COMPILER: expected nvrtc, nvrtc-ptxas, nvcc or cache-only, given \"{}\"", *v);
}

LogLevel parse_level(const std::optional<std::string>& v) {
    if (!v) return LogLevel::Warn;
    const std::string s = lower(*v);
    if (s == "error") return LogLevel::Error;
    if (s == "warn" || s == "warning") return LogLevel::Warn;
    if (s == "info") return LogLevel::Info;
    if (s == "debug") return LogLevel::Debug;
    LOOM_FAIL("LOOM_LOG_LEVEL: expected error, warn, info or debug, given \"{}\"", *v);
}

// Never destroyed: Worlds shut down (and read their timeouts) during static destruction. A parse that throws leaves
// the static uninitialised, so the next call parses again.
Settings& process_settings() {
    static Settings* const s = new Settings(settings_from(process_env()));
    return *s;
}

}  // namespace

Settings settings_from(const EnvLookup& env) {
    Settings s;
    s.rank = rank_info_from_env(env);
    s.symmetric_size = env_bytes(env, "LOOM_SYMMETRIC_SIZE", s.symmetric_size);
    LOOM_CHECK(s.symmetric_size > 0, "LOOM_SYMMETRIC_SIZE: expected a size > 0, given 0");
    s.wait_timeout = env_ms(env, "LOOM_WAIT_TIMEOUT_MS", s.wait_timeout);
    s.store_timeout = env_ms(env, "LOOM_STORE_TIMEOUT_MS", s.store_timeout);
    LOOM_CHECK(s.store_timeout.count() > 0, "LOOM_STORE_TIMEOUT_MS: expected a timeout > 0 ms, given {}",
               s.store_timeout.count());
    s.shutdown_timeout = std::min(s.shutdown_timeout, s.store_timeout);
    if (auto v = env_str(env, "LOOM_JOB_SECRET")) {
        // The value is never printed.
        LOOM_CHECK(v->size() >= 16, "LOOM_JOB_SECRET: expected at least 16 characters, given {}", v->size());
        s.job_secret = *v;
    }
    if (auto v = env_str(env, "LOOM_CACHE_DIR")) {
        s.cache_dir = *v;
    } else if (auto x = env_str(env, "XDG_CACHE_HOME")) {
        s.cache_dir = *x + "/loom";
    } else if (auto h = env_str(env, "HOME")) {
        s.cache_dir = *h + "/.cache/loom";
    } else {
        s.cache_dir = "/tmp/.cache/loom";
    }
    s.jit_compiler = parse_compiler(env_str(env, "LOOM_JIT_COMPILER"));
    for (const char* var : {"LOOM_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"})
        if (auto v = env_str(env, var)) {
            s.cuda_home = *v;
            break;
        }
    if (auto v = env_str(env, "LOOM_NVSHMEM_HOME")) s.nvshmem_home = *v;
    s.autotune = env_flag(env, "LOOM_AUTOTUNE");
    s.log_level = parse_level(env_str(env, "LOOM_LOG_LEVEL"));
    s.check_agreement = env_flag(env, "LOOM_CHECK_AGREEMENT");
    if (auto v = env_str(env, "LOOM_PROFILE")) s.profile_dir = *v;
    if (auto v = env_str(env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")) {
        const double pct = std::atof(v->c_str());
        s.mps_thread_percentage = pct > 0 && pct <= 100 ? static_cast<int>(pct) : 0;
    }
    s.nvshmem_cumem_granularity = env_bytes(env, "NVSHMEM_CUMEM_GRANULARITY", s.nvshmem_cumem_granularity);
    LOOM_CHECK(s.nvshmem_cumem_granularity > 0, "NVSHMEM_CUMEM_GRANULARITY: expected a size > 0, given 0");
    return s;
}

std::size_t symmetric_heap_bytes(std::size_t requested, int num_nodes, const Settings& s) {
    if (num_nodes <= 1) return requested;
    const std::size_t g = s.nvshmem_cumem_granularity;
    return (requested + g - 1) / g * g;
}

const Settings& settings() { return process_settings(); }

const char* to_string(JitCompiler c) {
    switch (c) {
        case JitCompiler::Nvrtc:
            return "nvrtc";
        case JitCompiler::NvrtcPtxas:
            return "nvrtc-ptxas";
        case JitCompiler::Nvcc:
            return "nvcc";
        case JitCompiler::CacheOnly:
            return "cache-only";
    }
    return "?";
}

const char* to_string(LogLevel l) {
    switch (l) {
        case LogLevel::Error:
            return "error";
        case LogLevel::Warn:
            return "warn";
        case LogLevel::Info:
            return "info";
        case LogLevel::Debug:
            return "debug";
    }
    return "?";
}

namespace detail {

ScopedSettings::ScopedSettings(const Settings& s) : old_(std::make_unique<Settings>(process_settings())) {
    process_settings() = s;
}

ScopedSettings::~ScopedSettings() { process_settings() = *old_; }

}  // namespace detail
}  // namespace loom
