// CPU tests of the intra-kernel profiler (docs/profiling.md): the trace writer's JSON against the Trace Event format,
// the clock alignment on synthetic offsets, and that the profiler's calls compile away without LOOM_PROFILE.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/trace_check.hpp"
#include "loom/jit/jit.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/profile.hpp"
#include "loom/runtime/settings.hpp"
#include "runtime/profile_trace.hpp"
#include "runtime/settings_override.hpp"

namespace {

namespace fs = std::filesystem;
using loom::lang::ProfileEvent;
using loom::profile::RankRecords;

ProfileEvent ev(uint64_t t, uint16_t tag, uint8_t kind, uint32_t sm, uint32_t block, uint8_t warp, uint32_t value) {
    ProfileEvent e{};
    e.t_ns = t;
    e.tag = tag;
    e.kind = kind;
    e.sm = sm;
    e.block = block;
    e.warp = warp;
    e.value = value;
    return e;
}

// A rank's records as a GEMM would leave them: per SM one CTA whose two consumer warpgroups (warps 0 and 4) run tiles
// back to back, a producer (warp 8) waiting for chunks, records of different threads interleaved in the ring as the
// atomics order them; plus two blocks of a collective resident on one SM at once.
RankRecords gemm_like(int rank, uint64_t t0, std::mt19937& rng, int sms, int tiles_per_sm) {
    RankRecords rr;
    rr.rank = rank;
    std::vector<std::vector<ProfileEvent>> per_thread;
    for (int sm = 0; sm < sms; ++sm) {
        for (uint8_t warp : {uint8_t{0}, uint8_t{4}}) {
            std::vector<ProfileEvent> th;
            uint64_t t = t0 + rng() % 1000;
            for (int k = 0; k < tiles_per_sm; ++k) {
                const uint32_t tile = (static_cast<uint32_t>(sm * tiles_per_sm + k) << 16) | k;
                th.push_back(ev(t, loom::lang::kTagGemmTile, loom::lang::kProfileBegin, sm, sm, warp, tile));
                t += 500 + rng() % 500;
                th.push_back(ev(t, loom::lang::kTagGemmTile, loom::lang::kProfileEnd, sm, sm, warp, tile));
                t += rng() % 3;  // back to back, sometimes at the same nanosecond
            }
            per_thread.push_back(th);
        }
        std::vector<ProfileEvent> producer;
        uint64_t t = t0;
        for (int k = 0; k < tiles_per_sm; ++k) {
            producer.push_back(ev(t, loom::lang::kTagAgChunkWait, loom::lang::kProfileBegin, sm, sm, 8, k % 4));
            t += rng() % 200;
            producer.push_back(ev(t, loom::lang::kTagAgChunkWait, loom::lang::kProfileEnd, sm, sm, 8, k % 4));
            t += 300;
        }
        per_thread.push_back(producer);
    }
    // Two blocks of one kernel on SM 7 at once, each with a nested barrier; and one instant.
    for (uint32_t block : {100u, 101u}) {
        const uint64_t t = t0 + 50 + block;
        per_thread.push_back({ev(t, loom::lang::kTagCollKernel, loom::lang::kProfileBegin, 7, block, 0, 2),
                              ev(t + 10, loom::lang::kTagCollBarrier, loom::lang::kProfileBegin, 7, block, 0, 1),
                              ev(t + 10, loom::lang::kTagCollBarrier, loom::lang::kProfileEnd, 7, block, 0, 1),
                              ev(t + 10, loom::lang::kProfileUserTag0, loom::lang::kProfileInstant, 7, block, 0, 9),
                              ev(t + 400, loom::lang::kTagCollKernel, loom::lang::kProfileEnd, 7, block, 0, 2)});
    }
    // Interleave the threads' records (each thread's stay in program order, as one thread's atomics are ordered).
    std::vector<std::size_t> pos(per_thread.size(), 0);
    for (;;) {
        std::vector<std::size_t> live;
        for (std::size_t i = 0; i < per_thread.size(); ++i)
            if (pos[i] < per_thread[i].size()) live.push_back(i);
        if (live.empty()) break;
        const std::size_t i = live[rng() % live.size()];
        rr.events.push_back(per_thread[i][pos[i]++]);
    }
    return rr;
}

std::size_t count_ph(const nlohmann::json& trace, const std::string& ph, const std::string& name = "") {
    std::size_t n = 0;
    for (const auto& e : trace["traceEvents"])
        if (e["ph"] == ph && (name.empty() || e["name"] == name)) ++n;
    return n;
}

// The EP kernels' spans take their names from the value: the low-latency phase, the throughput-mode kernel.
TEST(ProfileTrace, EpSpansAreNamedByPhaseAndKernel) {
    RankRecords rr;
    rr.rank = 0;
    const struct {
        uint16_t tag;
        uint32_t value;
        uint32_t block;
    } spans[] = {{loom::lang::kTagEpLlPhase, loom::lang::kEpLlDispatchSend, 0},
                 {loom::lang::kTagEpLlPhase, loom::lang::kEpLlCombineRecv, 1},
                 {loom::lang::kTagEpLlPhase, 99, 2},
                 {loom::lang::kTagEpKernel, loom::lang::kEpLayoutScan, 3},
                 {loom::lang::kTagEpKernel, loom::lang::kEpCombineReduce, 4},
                 {loom::lang::kTagEpKernel, 99, 5}};
    for (const auto& sp : spans) {
        rr.events.push_back(
            ev(1000 + 10 * sp.block, sp.tag, loom::lang::kProfileBegin, sp.block, sp.block, 0, sp.value));
        rr.events.push_back(ev(1005 + 10 * sp.block, sp.tag, loom::lang::kProfileEnd, sp.block, sp.block, 0, sp.value));
    }
    const nlohmann::json trace = loom::profile::build_trace({rr}, {0});
    ASSERT_EQ(loom_test::check_trace(trace), "");
    for (const char* name :
         {"ep_ll.dispatch_send", "ep_ll.combine_recv", "ep_ll.?", "ep.layout_scan", "ep.combine_reduce", "ep.?"})
        EXPECT_EQ(count_ph(trace, "B", name), 1u) << name;
}

TEST(ProfileTrace, ValidatesAgainstTraceEventFormat) {
    std::mt19937 rng(std::random_device{}());
    const int sms = 3, tiles = 5;
    std::vector<RankRecords> ranks = {gemm_like(0, 1'000'000, rng, sms, tiles),
                                      gemm_like(1, 7'000'000, rng, sms, tiles)};
    loom::profile::TraceStats st;
    const nlohmann::json trace = loom::profile::build_trace(ranks, {0, 6'000'000}, &st);
    ASSERT_EQ(loom_test::check_trace(trace), "");
    EXPECT_EQ(st.unmatched, 0u);
    EXPECT_EQ(st.instants, 4u);
    // Every tile of every rank is one span, named, with its coordinates.
    const auto tiles_by_rank = loom_test::span_args(trace, "gemm.tile");
    ASSERT_EQ(tiles_by_rank.size(), 2u);
    for (const auto& [pid, args] : tiles_by_rank) {
        EXPECT_EQ(args.size(), static_cast<std::size_t>(sms * 2 * tiles)) << "rank " << pid;
        for (const auto& a : args) EXPECT_EQ(a["value"].get<uint32_t>() & 0xffffu, a["n_block"].get<uint32_t>());
    }
    EXPECT_EQ(count_ph(trace, "B", "coll.all_reduce"), 4u);
    EXPECT_EQ(count_ph(trace, "B", "coll.barrier"), 4u);
    EXPECT_EQ(count_ph(trace, "i", "tag 1024"), 4u);
    // The two blocks resident on SM 7 at once are on two tracks (CTA slots 0 and 1).
    std::set<long long> coll_tids;
    for (const auto& e : trace["traceEvents"])
        if (e["ph"] == "B" && e["name"] == "coll.all_reduce" && e["pid"] == 0)
            coll_tids.insert(e["tid"].get<long long>());
    EXPECT_EQ(coll_tids, (std::set<long long>{70000, 70100}));
    // One process per rank, named; a thread name per track.
    EXPECT_EQ(count_ph(trace, "M", "process_name"), 2u);
    EXPECT_GE(count_ph(trace, "M", "thread_name"), static_cast<std::size_t>(2 * sms * 3));
    // Clock offsets applied: rank 1's records (6 ms later on its own clock) start where rank 0's do.
    double first[2] = {1e30, 1e30};
    for (const auto& e : trace["traceEvents"])
        if (e["ph"] == "B") first[e["pid"].get<int>()] = std::min(first[e["pid"].get<int>()], e["ts"].get<double>());
    EXPECT_LT(std::abs(first[0] - first[1]), 1.0);  // µs: both within the synthetic 1 µs jitter
    EXPECT_EQ(first[0] < first[1] ? first[0] : first[1], 0.0);
}

TEST(ProfileTrace, UnmatchedRecordsAreLeftOutAndCounted) {
    RankRecords rr;
    rr.rank = 0;
    rr.dropped = 3;
    using namespace loom::lang;
    rr.events = {ev(10, kTagGemmTile, kProfileBegin, 1, 1, 0, 1),  // its end was dropped
                 ev(20, kTagAgChunkWait, kProfileBegin, 1, 1, 0, 2), ev(30, kTagAgChunkWait, kProfileEnd, 1, 1, 0, 2),
                 ev(40, kTagArPeerWait, kProfileEnd, 2, 2, 0, 0)};  // an end whose begin was dropped
    loom::profile::TraceStats st;
    const nlohmann::json trace = loom::profile::build_trace({rr}, {0}, &st);
    EXPECT_EQ(loom_test::check_trace(trace), "");
    EXPECT_EQ(st.spans, 1u);
    EXPECT_EQ(st.unmatched, 2u);
    EXPECT_EQ(trace["otherData"]["dropped_records"]["0"], 3);
    EXPECT_EQ(count_ph(trace, "B"), 1u);
}

TEST(ProfileTrace, CheckerRejectsBadTraces) {
    // The checker must be able to fail: misnesting, an unsorted track, a missing field.
    const nlohmann::json misnested = {{"traceEvents",
                                       {{{"ph", "B"}, {"name", "a"}, {"pid", 0}, {"tid", 1}, {"ts", 1.0}},
                                        {{"ph", "B"}, {"name", "b"}, {"pid", 0}, {"tid", 1}, {"ts", 2.0}},
                                        {{"ph", "E"}, {"name", "a"}, {"pid", 0}, {"tid", 1}, {"ts", 3.0}},
                                        {{"ph", "E"}, {"name", "b"}, {"pid", 0}, {"tid", 1}, {"ts", 4.0}}}}};
    EXPECT_NE(loom_test::check_trace(misnested), "");
    const nlohmann::json unsorted = {{"traceEvents",
                                      {{{"ph", "i"}, {"name", "a"}, {"pid", 0}, {"tid", 1}, {"ts", 5.0}},
                                       {{"ph", "i"}, {"name", "b"}, {"pid", 0}, {"tid", 1}, {"ts", 4.0}}}}};
    EXPECT_NE(loom_test::check_trace(unsorted), "");
    const nlohmann::json no_ts = {{"traceEvents", {{{"ph", "i"}, {"name", "a"}, {"pid", 0}, {"tid", 1}}}}};
    EXPECT_NE(loom_test::check_trace(no_ts), "");
    const nlohmann::json open_b = {{"traceEvents", {{{"ph", "B"}, {"name", "a"}, {"pid", 0}, {"tid", 1}, {"ts", 0}}}}};
    EXPECT_NE(loom_test::check_trace(open_b), "");
}

TEST(ProfileClock, OffsetsRelativeToRankZero) {
    // Ranks whose GPU clocks run at random offsets from the host's; each reading taken at another host instant.
    std::mt19937_64 rng(std::random_device{}());
    const int W = 6;
    std::vector<int64_t> gpu_minus_host(W);
    std::vector<loom::profile::ClockReading> readings(W);
    for (int r = 0; r < W; ++r) {
        gpu_minus_host[r] = static_cast<int64_t>(rng() % 4'000'000'000'000ull) - 2'000'000'000'000ll;
        const int64_t host = 1'000'000'000 + static_cast<int64_t>(rng() % 1'000'000);
        readings[r] = {host, host + gpu_minus_host[r], 500};
    }
    const std::vector<int64_t> off = loom::profile::clock_offsets(readings);
    ASSERT_EQ(off.size(), static_cast<std::size_t>(W));
    EXPECT_EQ(off[0], 0);
    for (int r = 0; r < W; ++r) EXPECT_EQ(off[r], gpu_minus_host[r] - gpu_minus_host[0]) << "rank " << r;
    // One host instant seen by every rank's GPU maps to one time on rank 0's clock.
    const int64_t instant = 5'000'000'000;
    for (int r = 0; r < W; ++r) EXPECT_EQ(instant + gpu_minus_host[r] - off[r], instant + gpu_minus_host[0]);
    // And in a trace: the same instant recorded on every rank lands at ts 0 on every pid.
    std::vector<RankRecords> ranks(W);
    for (int r = 0; r < W; ++r) {
        ranks[r].rank = r;
        const auto t = static_cast<uint64_t>(instant + gpu_minus_host[r]);
        ranks[r].events = {ev(t, loom::lang::kTagCollBarrier, loom::lang::kProfileBegin, 0, 0, 0, 1),
                           ev(t + 1000, loom::lang::kTagCollBarrier, loom::lang::kProfileEnd, 0, 0, 0, 1)};
    }
    const nlohmann::json trace = loom::profile::build_trace(ranks, off);
    ASSERT_EQ(loom_test::check_trace(trace), "");
    for (const auto& e : trace["traceEvents"]) {
        if (e["ph"] == "B") EXPECT_EQ(e["ts"].get<double>(), 0.0) << e.dump();
        if (e["ph"] == "E") EXPECT_EQ(e["ts"].get<double>(), 1.0) << e.dump();
    }
}

TEST(ProfileApi, TagsAndSwitch) {
    EXPECT_THROW(loom::profile::register_tag(5, "mine"), loom::Error);
    loom::profile::register_tag(loom::lang::kProfileUserTag0 + 40, "my.phase");
    EXPECT_EQ(loom::profile::tag_name(loom::lang::kProfileUserTag0 + 40), "my.phase");
    EXPECT_EQ(loom::profile::tag_name(loom::lang::kTagGemmTile), "gemm.tile");
    {
        loom::detail::ScopedSettings s([](loom::Settings& x) { x.profile_dir = "/tmp/x"; });
        EXPECT_TRUE(loom::profile::enabled());
        loom::profile::set_enabled(false);
        EXPECT_FALSE(loom::profile::enabled());
        loom::profile::set_enabled(true);
        EXPECT_TRUE(loom::profile::enabled());
    }
    loom::profile::set_enabled(false);
    EXPECT_FALSE(loom::profile::enabled());
    const loom::Settings parsed = loom::settings_from([](const std::string& n) -> std::optional<std::string> {
        if (n == "LOOM_PROFILE") return "/tmp/traces";
        return std::nullopt;
    });
    EXPECT_EQ(parsed.profile_dir, "/tmp/traces");
}

// Compile-away: the probe kernel with its profiler calls, compiled without LOOM_PROFILE, is byte for byte the cubin
// of the same kernel with no calls at all; with LOOM_PROFILE=1 it is another kernel (another cache key, more code).
TEST(ProfileCompile, OffIsTheUninstrumentedKernel) {
    const fs::path dir = fs::path(::testing::TempDir()) / fmt::format("loom-profile-{}", ::getpid());
    fs::remove_all(dir);
    loom::detail::ScopedSettings s([&](loom::Settings& x) {
        x.cache_dir = dir.string();
        x.jit_compiler = loom::JitCompiler::Nvrtc;
        x.jit_nvcc_fallback = false;  // NVRTC must take the profiled kernels (the JIT's default compiler)
        x.log_level = loom::LogLevel::Warn;
    });
    loom::jit::KernelSpec spec;
    spec.header = std::string(LOOM_SOURCE_DIR) + "/tests/unit/kernels/profile_probe.cuh";
    spec.name = "profile_test::probe";
    loom::jit::KernelSpec bare = spec, on = spec;
    bare.defines = {"PROBE_BARE"};
    on.defines = {"LOOM_PROFILE=1"};
    const loom::jit::CompileResult a = loom::jit::compile(spec, 90);
    const loom::jit::CompileResult b = loom::jit::compile(bare, 90);
    const loom::jit::CompileResult c = loom::jit::compile(on, 90);
    EXPECT_NE(a.cache_key, b.cache_key);  // two compiles, not one cache entry
    EXPECT_EQ(a.cubin, b.cubin) << "the profiler's calls left code behind without LOOM_PROFILE";
    EXPECT_EQ(a.registers, b.registers);
    EXPECT_NE(a.cache_key, c.cache_key);
    EXPECT_NE(a.cubin, c.cubin);
    EXPECT_GT(c.cubin.size(), a.cubin.size());
    fs::remove_all(dir);
}

// Loom's instrumented kernels compile profiled through NVRTC (the sample table's ag_gemm GEMM, ag_gemm's producers,
// gemm_rs's and gemm_ar's communication kernels, a collective), the GEMM without spills.
TEST(ProfileCompile, InstrumentedKernelsCompileProfiled) {
    const fs::path dir = fs::path(::testing::TempDir()) / fmt::format("loom-profile-k-{}", ::getpid());
    fs::remove_all(dir);
    loom::detail::ScopedSettings s([&](loom::Settings& x) {
        x.cache_dir = dir.string();
        x.jit_compiler = loom::JitCompiler::Nvrtc;
        x.jit_nvcc_fallback = false;  // NVRTC must take the profiled kernels (the JIT's default compiler)
        x.log_level = loom::LogLevel::Warn;
    });
    const std::vector<loom::jit::KernelSpec> specs = {
        {"loom/kernels/overlap/ag_gemm.cuh", "loom::kernels::overlap::ag_gemm_push", {"0"}},
        {"loom/kernels/overlap/ag_gemm.cuh", "loom::kernels::overlap::ag_gemm_direct_stage", {}},
        {"loom/kernels/overlap/gemm_rs.cuh", "loom::kernels::overlap::gemm_rs_scatter_reduce", {"__nv_bfloat16"}},
        {"loom/kernels/overlap/gemm_ar.cuh", "loom::kernels::overlap::gemm_ar_reduce", {"__nv_bfloat16"}},
        {"loom/kernels/collectives/all_reduce.cuh", "loom::kernels::coll::all_reduce_two_shot", {"__nv_bfloat16", "0"}},
        {"loom/kernels/overlap/ag_gemm.cuh",
         "loom::kernels::gemm_sm90_tma_wgmma",
         {"__nv_bfloat16", "__nv_bfloat16", "float", "128", "256", "4", "true", "1", "true",
          "loom::kernels::overlap::AgGemmHooks"}},
    };
    for (loom::jit::KernelSpec spec : specs) {
        const loom::jit::CompileResult off = loom::jit::compile(spec, 90);
        spec.defines = {"LOOM_PROFILE=1"};
        const loom::jit::CompileResult r = loom::jit::compile(spec, 90);
        std::printf("unprofiled %s: %d registers, %d spill bytes\n", spec.display().c_str(), off.registers,
                    off.spill_bytes);
        EXPECT_FALSE(r.cubin.empty()) << spec.display();
        std::printf("profiled %s: %d registers, %d spill bytes\n", spec.display().c_str(), r.registers, r.spill_bytes);
        // The GEMM's warpgroups are at their register budgets (168 per consumer thread): its records cost a few
        // spilled words (28 bytes at 128 x 256, measured), never the hundreds that records beside the live
        // accumulators cost (680). Unprofiled it spills nothing.
        if (spec.name.find("gemm_sm90") != std::string::npos) {
            EXPECT_LE(off.spill_bytes, 0) << spec.display() << ": " << off.resource_report;
            EXPECT_LE(r.spill_bytes, 64) << spec.display() << ": " << r.resource_report;
        }
    }
    fs::remove_all(dir);
}

}  // namespace
