// Rank facts, typed variables and loom::Settings parsed from synthetic environments (EnvLookup), and the process's
// settings switched for a scope (ScopedSettings).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>

#include "loom/runtime/env.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "runtime/env_vars.hpp"
#include "runtime/settings_override.hpp"

namespace {

using Vars = std::map<std::string, std::string>;

loom::EnvLookup lookup(const Vars& vars) {
    return [vars](const std::string& name) -> std::optional<std::string> {
        auto it = vars.find(name);
        if (it == vars.end()) return std::nullopt;
        return it->second;
    };
}

loom::RankInfo parse(const Vars& vars) { return loom::rank_info_from_env(lookup(vars)); }

// The error raised for `vars`, which must mention every string in `needles`.
void expect_error(const Vars& vars, std::initializer_list<std::string> needles) {
    try {
        auto info = parse(vars);
        ADD_FAILURE() << "parsed without error: rank " << info.rank << " of " << info.world_size;
    } catch (const loom::Error& e) {
        for (auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
}

TEST(Env, DefaultIsOneRank) {
    auto info = parse({});
    EXPECT_EQ(info.source, "default");
    EXPECT_EQ(info.rank, 0);
    EXPECT_EQ(info.world_size, 1);
    EXPECT_EQ(info.local_rank, 0);
    EXPECT_EQ(info.local_world_size, 1);
    EXPECT_EQ(info.node, 0);
    EXPECT_EQ(info.master_addr, "127.0.0.1");
    EXPECT_EQ(info.master_port, 29500);
    EXPECT_EQ(info.device, -1);
}

TEST(Env, LoomVariables) {
    auto info = parse({{"LOOM_RANK", "5"},
                       {"LOOM_WORLD_SIZE", "8"},
                       {"LOOM_LOCAL_RANK", "1"},
                       {"LOOM_LOCAL_WORLD_SIZE", "4"},
                       {"LOOM_MASTER_ADDR", "node0"},
                       {"LOOM_MASTER_PORT", "1234"},
                       {"LOOM_DEVICE", "1"}});
    EXPECT_EQ(info.source, "loom");
    EXPECT_EQ(info.rank, 5);
    EXPECT_EQ(info.world_size, 8);
    EXPECT_EQ(info.local_rank, 1);
    EXPECT_EQ(info.local_world_size, 4);
    EXPECT_EQ(info.node, 1);
    EXPECT_EQ(info.master_addr, "node0");
    EXPECT_EQ(info.master_port, 1234);
    EXPECT_EQ(info.device, 1);
}

TEST(Env, LoomTakesPrecedenceOverTorchrunAndMpi) {
    auto info = parse({{"LOOM_RANK", "1"},
                       {"LOOM_WORLD_SIZE", "2"},
                       {"RANK", "3"},
                       {"WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_RANK", "0"},
                       {"OMPI_COMM_WORLD_SIZE", "1"},
                       {"MASTER_PORT", "4000"},
                       {"LOOM_MASTER_PORT", "5000"}});
    EXPECT_EQ(info.source, "loom");
    EXPECT_EQ(info.rank, 1);
    EXPECT_EQ(info.world_size, 2);
    EXPECT_EQ(info.local_rank, 1);  // no local variables: one node
    EXPECT_EQ(info.local_world_size, 2);
    EXPECT_EQ(info.master_port, 5000);
}

TEST(Env, Torchrun) {
    auto info = parse({{"RANK", "6"},
                       {"WORLD_SIZE", "8"},
                       {"LOCAL_RANK", "2"},
                       {"LOCAL_WORLD_SIZE", "4"},
                       {"MASTER_ADDR", "10.0.0.1"},
                       {"MASTER_PORT", "29501"},
                       {"OMPI_COMM_WORLD_RANK", "0"},
                       {"OMPI_COMM_WORLD_SIZE", "1"}});
    EXPECT_EQ(info.source, "torchrun");
    EXPECT_EQ(info.rank, 6);
    EXPECT_EQ(info.node, 1);
    EXPECT_EQ(info.local_rank, 2);
    EXPECT_EQ(info.master_addr, "10.0.0.1");
    EXPECT_EQ(info.master_port, 29502) << "MASTER_PORT is torchrun's store; Loom's takes the next port";
}

TEST(Env, OpenMpi) {
    auto info = parse({{"OMPI_COMM_WORLD_RANK", "3"},
                       {"OMPI_COMM_WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                       {"MASTER_ADDR", "head"},
                       {"SLURM_PROCID", "0"},
                       {"SLURM_NTASKS", "1"}});
    EXPECT_EQ(info.source, "openmpi");
    EXPECT_EQ(info.rank, 3);
    EXPECT_EQ(info.world_size, 4);
    EXPECT_EQ(info.local_rank, 1);
    EXPECT_EQ(info.local_world_size, 2);
    EXPECT_EQ(info.node, 1);
    EXPECT_EQ(info.master_addr, "head");
    // One node: the address defaults to loopback.
    auto one = parse({{"OMPI_COMM_WORLD_RANK", "1"},
                      {"OMPI_COMM_WORLD_SIZE", "2"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
    EXPECT_EQ(one.master_addr, "127.0.0.1");
}

TEST(Env, SlurmTasksPerNodeForms) {
    Vars base{{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}, {"LOOM_MASTER_ADDR", "n0"}};
    for (auto [name, value] : std::vector<std::pair<std::string, std::string>>{{"SLURM_NTASKS_PER_NODE", "4"},
                                                                               {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
                                                                               {"SLURM_TASKS_PER_NODE", "4,4"},
                                                                               {"SLURM_TASKS_PER_NODE", "4(x1),4"}}) {
        Vars v = base;
        v[name] = value;
        auto info = parse(v);
        EXPECT_EQ(info.source, "slurm") << name << "=" << value;
        EXPECT_EQ(info.rank, 5);
        EXPECT_EQ(info.local_world_size, 4) << name << "=" << value;
        EXPECT_EQ(info.node, 1);
        EXPECT_EQ(info.master_addr, "n0");
    }
    // The step's layout wins over the job's.
    Vars v = base;
    v["SLURM_STEP_TASKS_PER_NODE"] = "4(x2)";
    v["SLURM_TASKS_PER_NODE"] = "8";
    EXPECT_EQ(parse(v).local_world_size, 4);
}

TEST(Env, SlurmMalformed) {
    Vars base{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "1"}, {"MASTER_ADDR", "n0"}};
    Vars v = base;
    v["SLURM_TASKS_PER_NODE"] = "4,2";
    expect_error(v, {"SLURM_TASKS_PER_NODE", "\"4,2\"", "same number of tasks"});
    v["SLURM_TASKS_PER_NODE"] = "3(2)";
    expect_error(v, {"SLURM_TASKS_PER_NODE", "\"3(2)\""});
    v = base;
    expect_error(v, {"SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"});  // local id without the layout
}

TEST(Env, MissingPartnerVariable) {
    expect_error({{"LOOM_RANK", "0"}}, {"LOOM_RANK", "LOOM_WORLD_SIZE"});
    expect_error({{"WORLD_SIZE", "4"}}, {"WORLD_SIZE", "RANK"});
    expect_error({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}}, {"LOCAL_RANK", "LOCAL_WORLD_SIZE"});
    expect_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"});
}

TEST(Env, NonNumbers) {
    expect_error({{"LOOM_RANK", "one"}, {"LOOM_WORLD_SIZE", "2"}}, {"LOOM_RANK", "\"one\"", "integer"});
    expect_error({{"LOOM_RANK", "0"}, {"LOOM_WORLD_SIZE", "2x"}}, {"LOOM_WORLD_SIZE", "\"2x\""});
    expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1.5"}},
                 {"LOCAL_WORLD_SIZE", "\"1.5\""});
    expect_error({{"LOOM_RANK", "99999999999999999999"}, {"LOOM_WORLD_SIZE", "2"}}, {"LOOM_RANK"});
}

TEST(Env, InconsistentValues) {
    expect_error({{"LOOM_RANK", "4"}, {"LOOM_WORLD_SIZE", "4"}}, {"LOOM_RANK", "[0, 4)", "given 4"});
    expect_error({{"LOOM_RANK", "-1"}, {"LOOM_WORLD_SIZE", "4"}}, {"LOOM_RANK", "given -1"});
    expect_error({{"LOOM_RANK", "0"}, {"LOOM_WORLD_SIZE", "0"}}, {"LOOM_WORLD_SIZE", ">= 1"});
    expect_error({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
                 {"LOCAL_RANK", "[0, 2)"});
    expect_error(
        {{"RANK", "1"}, {"WORLD_SIZE", "6"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}},
        {"LOCAL_WORLD_SIZE=4", "WORLD_SIZE=6", "does not divide"});
    expect_error(
        {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}},
        {"node by node"});
}

TEST(Env, PortAndAddress) {
    expect_error({{"LOOM_MASTER_PORT", "70000"}}, {"LOOM_MASTER_PORT", "\"70000\"", "[0, 65535]"});
    expect_error({{"MASTER_PORT", "http"}}, {"MASTER_PORT", "\"http\""});
    // Loom's store takes MASTER_PORT + 1; LOOM_MASTER_PORT is taken as given (0: rank 0 picks a free port).
    EXPECT_EQ(parse({{"MASTER_PORT", "29500"}}).master_port, 29501);
    EXPECT_EQ(parse({{"MASTER_PORT", "1"}}).master_port, 2);
    EXPECT_EQ(parse({{"MASTER_PORT", "29500"}, {"LOOM_MASTER_PORT", "29500"}}).master_port, 29500);
    EXPECT_EQ(parse({{"LOOM_MASTER_PORT", "0"}}).master_port, 0);
    for (const char* edge : {"0", "65535", "-3"})
        expect_error({{"MASTER_PORT", edge}}, {"MASTER_PORT", "[1, 65534]", "MASTER_PORT + 1", "LOOM_MASTER_PORT"});
    // Several nodes need an address.
    expect_error({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}},
                 {"LOOM_MASTER_ADDR", "MASTER_ADDR", "2-node"});
    // LOOM_MASTER_ADDR beats MASTER_ADDR; empty values count as unset.
    auto info = parse({{"LOOM_MASTER_ADDR", ""}, {"MASTER_ADDR", "m"}, {"LOOM_MASTER_PORT", ""}});
    EXPECT_EQ(info.master_addr, "m");
    EXPECT_EQ(info.master_port, 29500);
    expect_error({{"LOOM_DEVICE", "gpu0"}}, {"LOOM_DEVICE", "\"gpu0\""});
}

TEST(Env, Bytes) {
    auto bytes = [](const std::string& v) { return loom::env_bytes(lookup({{"LOOM_X", v}}), "LOOM_X", 7); };
    EXPECT_EQ(bytes("1073741824"), 1073741824u);
    EXPECT_EQ(bytes("1G"), 1ull << 30);
    EXPECT_EQ(bytes("512M"), 512ull << 20);
    EXPECT_EQ(bytes("64K"), 64ull << 10);
    EXPECT_EQ(bytes("2GiB"), 2ull << 30);
    EXPECT_EQ(bytes("3mb"), 3ull << 20);
    EXPECT_EQ(bytes(" 16 KiB "), 16ull << 10);
    EXPECT_EQ(loom::env_bytes(lookup({}), "LOOM_X", 7), 7u);
    for (std::string bad : {"", "G", "1.5G", "-1", "12Q", "1GiBs", "99999999999999999999", "17179869184G"}) {
        if (bad.empty()) continue;  // empty is unset
        try {
            bytes(bad);
            ADD_FAILURE() << "accepted \"" << bad << "\"";
        } catch (const loom::Error& e) {
            EXPECT_NE(std::string(e.what()).find("LOOM_X"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("\"" + bad + "\""), std::string::npos) << e.what();
        }
    }
}

TEST(Env, IntFlagAndMilliseconds) {
    auto env =
        lookup({{"A", "42"}, {"B", "x"}, {"T", "TRUE"}, {"F", "off"}, {"M", "250"}, {"N", "-3"}, {"Q", "maybe"}});
    EXPECT_EQ(loom::env_int(env, "A", 1), 42);
    EXPECT_EQ(loom::env_int(env, "unset", 9), 9);
    EXPECT_THROW(loom::env_int(env, "B", 1), loom::Error);
    EXPECT_TRUE(loom::env_flag(env, "T"));
    EXPECT_FALSE(loom::env_flag(env, "F"));
    EXPECT_FALSE(loom::env_flag(env, "unset"));
    EXPECT_THROW(loom::env_flag(env, "Q"), loom::Error);
    EXPECT_EQ(loom::env_ms(env, "M", std::chrono::milliseconds(1)).count(), 250);
    EXPECT_THROW(loom::env_ms(env, "N", std::chrono::milliseconds(1)), loom::Error);
    // A bound that would overflow the waits' nanosecond clocks is refused, not wrapped to "expired at once".
    EXPECT_THROW(loom::env_ms(lookup({{"L", "9223372036854775807"}}), "L", std::chrono::milliseconds(1)), loom::Error);
}

// ---- loom::Settings ---------------------------------------------------------------------------------------------

loom::Settings settings_of(const Vars& vars) { return loom::settings_from(lookup(vars)); }

// settings_from(vars) raises, naming `var` and the value given.
void expect_settings_error(const Vars& vars, const std::string& var) {
    try {
        settings_of(vars);
        ADD_FAILURE() << "parsed without error: " << var;
    } catch (const loom::Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(var), std::string::npos) << msg;
        EXPECT_NE(msg.find("\"" + vars.at(var) + "\""), std::string::npos) << msg;
    }
}

TEST(Settings, Defaults) {
    const loom::Settings s = settings_of({{"HOME", "/home/u"}});
    EXPECT_EQ(s.rank.source, "default");
    EXPECT_EQ(s.rank.world_size, 1);
    EXPECT_EQ(s.rank.device, -1);
    EXPECT_EQ(s.symmetric_size, std::size_t{1} << 30);
    EXPECT_EQ(s.wait_timeout.count(), 300000);  // every wait is bounded unless the user opts out
    EXPECT_EQ(s.store_timeout.count(), 300000);
    EXPECT_EQ(s.shutdown_timeout.count(), 60000);
    EXPECT_EQ(s.cache_dir, "/home/u/.cache/loom");
    EXPECT_EQ(s.jit_compiler, loom::JitCompiler::Nvrtc);
    EXPECT_TRUE(s.jit_nvcc_fallback);
    EXPECT_EQ(s.jit_timeout.count(), 600);
    EXPECT_EQ(s.cuda_home, "");
    EXPECT_EQ(s.nvshmem_home, "");
    EXPECT_FALSE(s.autotune);
    EXPECT_EQ(s.log_level, loom::LogLevel::Warn);
    EXPECT_FALSE(s.check_agreement);
    EXPECT_EQ(s.mps_thread_percentage, 0);
}

TEST(Settings, WaitTimeoutZeroIsAnExplicitOptOut) {
    EXPECT_EQ(settings_of({{"LOOM_WAIT_TIMEOUT_MS", "0"}}).wait_timeout.count(), 0);
    EXPECT_EQ(settings_of({{"LOOM_WAIT_TIMEOUT_MS", ""}}).wait_timeout.count(), 300000);  // empty counts as unset
}

TEST(Settings, EachVariable) {
    const loom::Settings s = settings_of({{"LOOM_RANK", "1"},
                                          {"LOOM_WORLD_SIZE", "2"},
                                          {"LOOM_DEVICE", "3"},
                                          {"LOOM_SYMMETRIC_SIZE", "2G"},
                                          {"LOOM_WAIT_TIMEOUT_MS", "20000"},
                                          {"LOOM_STORE_TIMEOUT_MS", "90000"},
                                          {"LOOM_CACHE_DIR", "/scratch/loom"},
                                          {"LOOM_JIT_COMPILER", "nvcc"},
                                          {"LOOM_CUDA_HOME", "/opt/cuda"},
                                          {"LOOM_NVSHMEM_HOME", "/opt/nvshmem"},
                                          {"LOOM_AUTOTUNE", "1"},
                                          {"LOOM_LOG_LEVEL", "debug"},
                                          {"LOOM_CHECK_AGREEMENT", "1"},
                                          {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25"}});
    EXPECT_EQ(s.rank.source, "loom");
    EXPECT_EQ(s.rank.rank, 1);
    EXPECT_EQ(s.rank.device, 3);
    EXPECT_EQ(s.symmetric_size, std::size_t{2} << 30);
    EXPECT_EQ(s.wait_timeout.count(), 20000);
    EXPECT_EQ(s.store_timeout.count(), 90000);
    EXPECT_EQ(s.shutdown_timeout.count(), 60000);
    EXPECT_EQ(s.cache_dir, "/scratch/loom");
    EXPECT_EQ(s.jit_compiler, loom::JitCompiler::Nvcc);
    EXPECT_EQ(s.cuda_home, "/opt/cuda");
    EXPECT_EQ(s.nvshmem_home, "/opt/nvshmem");
    EXPECT_TRUE(s.autotune);
    EXPECT_EQ(s.log_level, loom::LogLevel::Debug);
    EXPECT_TRUE(s.check_agreement);
    EXPECT_EQ(s.mps_thread_percentage, 25);
}

// A World of several nodes rounds its heap up to NVSHMEM's registration unit (NVSHMEM_CUMEM_GRANULARITY, 512 MiB by
// default), which cannot map a buffer of another size; one node keeps the size asked for.
TEST(Settings, HeapBytesFollowNvshmemGranularity) {
    const loom::Settings s = settings_of({});
    EXPECT_EQ(s.nvshmem_cumem_granularity, std::size_t{512} << 20);
    const std::size_t odd = (std::size_t{700} << 20) + 12345;
    EXPECT_EQ(loom::symmetric_heap_bytes(odd, 1, s), odd);
    EXPECT_EQ(loom::symmetric_heap_bytes(odd, 2, s), std::size_t{1024} << 20);
    EXPECT_EQ(loom::symmetric_heap_bytes(std::size_t{1} << 30, 4, s), std::size_t{1} << 30);
    const loom::Settings g = settings_of({{"NVSHMEM_CUMEM_GRANULARITY", "2g"}});
    EXPECT_EQ(g.nvshmem_cumem_granularity, std::size_t{2} << 30);
    EXPECT_EQ(loom::symmetric_heap_bytes(std::size_t{1} << 30, 2, g), std::size_t{2} << 30);
    EXPECT_THROW(settings_of({{"NVSHMEM_CUMEM_GRANULARITY", "0"}}), loom::Error);
}

TEST(Settings, FallbacksAndEmptyValues) {
    // The cache: LOOM_CACHE_DIR, else $XDG_CACHE_HOME/loom, else ~/.cache/loom, else /tmp/.cache/loom.
    EXPECT_EQ(settings_of({{"XDG_CACHE_HOME", "/xdg"}, {"HOME", "/home/u"}}).cache_dir, "/xdg/loom");
    EXPECT_EQ(settings_of({{"LOOM_CACHE_DIR", ""}, {"HOME", "/home/u"}}).cache_dir, "/home/u/.cache/loom");
    EXPECT_EQ(settings_of({}).cache_dir, "/tmp/.cache/loom");
    // The toolkit: LOOM_CUDA_HOME, else CUDA_HOME, else CUDA_PATH.
    EXPECT_EQ(settings_of({{"CUDA_HOME", "/a"}, {"CUDA_PATH", "/b"}}).cuda_home, "/a");
    EXPECT_EQ(settings_of({{"CUDA_PATH", "/b"}}).cuda_home, "/b");
    EXPECT_EQ(settings_of({{"LOOM_CUDA_HOME", "/c"}, {"CUDA_HOME", "/a"}}).cuda_home, "/c");
    // Empty values count as unset.
    const loom::Settings e = settings_of(
        {{"LOOM_SYMMETRIC_SIZE", ""}, {"LOOM_JIT_COMPILER", ""}, {"LOOM_LOG_LEVEL", ""}, {"LOOM_AUTOTUNE", ""}});
    EXPECT_EQ(e.symmetric_size, std::size_t{1} << 30);
    EXPECT_EQ(e.jit_compiler, loom::JitCompiler::Nvrtc);
    EXPECT_EQ(e.log_level, loom::LogLevel::Warn);
    EXPECT_FALSE(e.autotune);
    // The shutdown barrier waits at most the store timeout.
    EXPECT_EQ(settings_of({{"LOOM_STORE_TIMEOUT_MS", "1500"}}).shutdown_timeout.count(), 1500);
    // An MPS share outside (0, 100] is no share.
    EXPECT_EQ(settings_of({{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "0"}}).mps_thread_percentage, 0);
    EXPECT_EQ(settings_of({{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "150"}}).mps_thread_percentage, 0);
    EXPECT_EQ(settings_of({{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "12.5"}}).mps_thread_percentage, 12);
}

TEST(Settings, JitCompilers) {
    using loom::JitCompiler;
    for (auto [text, want] : {std::pair{"nvrtc", JitCompiler::Nvrtc}, std::pair{"nvrtc-ptxas", JitCompiler::NvrtcPtxas},
                              std::pair{"nvcc", JitCompiler::Nvcc}, std::pair{"cache-only", JitCompiler::CacheOnly},
                              std::pair{"NVCC", JitCompiler::Nvcc}}) {
        const loom::Settings s = settings_of({{"LOOM_JIT_COMPILER", text}});
        EXPECT_EQ(s.jit_compiler, want) << text;
        if (std::string(text) != "NVCC") EXPECT_STREQ(loom::to_string(s.jit_compiler), text);
    }
}

TEST(Settings, LogLevels) {
    using loom::LogLevel;
    for (auto [text, want] : {std::pair{"error", LogLevel::Error}, std::pair{"warn", LogLevel::Warn},
                              std::pair{"warning", LogLevel::Warn}, std::pair{"info", LogLevel::Info},
                              std::pair{"debug", LogLevel::Debug}, std::pair{"DEBUG", LogLevel::Debug}}) {
        EXPECT_EQ(settings_of({{"LOOM_LOG_LEVEL", text}}).log_level, want) << text;
    }
    EXPECT_STREQ(loom::to_string(LogLevel::Info), "info");
    // log_enabled compares against the process's level.
    const loom::detail::ScopedSettings info([](loom::Settings& s) { s.log_level = LogLevel::Info; });
    EXPECT_TRUE(loom::log_enabled(LogLevel::Error));
    EXPECT_TRUE(loom::log_enabled(LogLevel::Info));
    EXPECT_FALSE(loom::log_enabled(LogLevel::Debug));
}

TEST(Settings, MalformedValuesNameTheVariable) {
    expect_settings_error({{"LOOM_SYMMETRIC_SIZE", "lots"}}, "LOOM_SYMMETRIC_SIZE");
    expect_settings_error({{"LOOM_WAIT_TIMEOUT_MS", "-1"}}, "LOOM_WAIT_TIMEOUT_MS");
    expect_settings_error({{"LOOM_STORE_TIMEOUT_MS", "soon"}}, "LOOM_STORE_TIMEOUT_MS");
    expect_settings_error({{"LOOM_JIT_COMPILER", "clang"}}, "LOOM_JIT_COMPILER");
    expect_settings_error({{"LOOM_AUTOTUNE", "maybe"}}, "LOOM_AUTOTUNE");
    expect_settings_error({{"LOOM_LOG_LEVEL", "verbose"}}, "LOOM_LOG_LEVEL");
    expect_settings_error({{"LOOM_DEVICE", "gpu0"}}, "LOOM_DEVICE");
    expect_settings_error({{"LOOM_RANK", "one"}, {"LOOM_WORLD_SIZE", "2"}}, "LOOM_RANK");
    // Values that parse but cannot be used.
    EXPECT_THROW(settings_of({{"LOOM_SYMMETRIC_SIZE", "0"}}), loom::Error);
    try {
        settings_of({{"LOOM_STORE_TIMEOUT_MS", "0"}});
        ADD_FAILURE() << "accepted a store timeout of 0 ms";
    } catch (const loom::Error& e) {
        EXPECT_NE(std::string(e.what()).find("LOOM_STORE_TIMEOUT_MS"), std::string::npos) << e.what();
    }
}

TEST(Settings, ScopedSettingsSwitchAndRestore) {
    const loom::Settings before = loom::settings();
    {
        const loom::detail::ScopedSettings tune([](loom::Settings& s) { s.autotune = !s.autotune; });
        EXPECT_EQ(loom::settings().autotune, !before.autotune);
        {
            loom::Settings other = loom::settings();
            other.cache_dir = "/elsewhere";
            const loom::detail::ScopedSettings nested(other);
            EXPECT_EQ(loom::settings().cache_dir, "/elsewhere");
            EXPECT_EQ(loom::settings().autotune, !before.autotune);
        }
        EXPECT_EQ(loom::settings().cache_dir, before.cache_dir);
    }
    EXPECT_EQ(loom::settings().autotune, before.autotune);
    // The reference stays valid across switches.
    const loom::Settings& ref = loom::settings();
    const loom::detail::ScopedSettings quiet([](loom::Settings& s) { s.log_level = loom::LogLevel::Error; });
    EXPECT_EQ(ref.log_level, loom::LogLevel::Error);
}

}  // namespace
