// CPU tests of the decode attention (docs/attention.md): every kernel variant compiles for sm_90a and sm_80 without
// local-memory spills (the split kernel also without static shared memory), the choice of heads per block and of
// splits, and the shape validation (no GPU needed: the checks that raise come before any device query).
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "loom/jit/jit.hpp"
#include "loom/kernels/attention/decode_params.hpp"
#include "loom/ops/attention.hpp"
#include "loom/runtime/error.hpp"
#include "ops/attention/decode_plan.hpp"

namespace {

using loom::DType;
namespace la = loom::attention;

void expect_clean(const loom::jit::KernelSpec& spec, int arch) {
    const auto r = loom::jit::compile(spec, arch);
    EXPECT_EQ(r.spill_bytes, 0) << spec.display() << " sm_" << arch << "\n" << r.resource_report;
}

// Compiles every decode_split job on a few threads, then checks each for spills and for static shared memory: the
// kernel's cp.async stages must start at the aligned shared base (decode.cuh), which a static variable would shift.
void expect_all_clean(const std::vector<std::pair<loom::jit::KernelSpec, int>>& jobs) {
    std::vector<loom::jit::CompileResult> results(jobs.size());
    std::vector<std::string> errors(jobs.size());
    std::atomic<std::size_t> next{0};
    auto worker = [&] {
        for (std::size_t i; (i = next++) < jobs.size();) {
            try {
                results[i] = loom::jit::compile(jobs[i].first, jobs[i].second);
            } catch (const std::exception& e) {
                errors[i] = e.what();
            }
        }
    };
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < std::max(2u, std::min(4u, std::thread::hardware_concurrency())); ++t)
        threads.emplace_back(worker);
    for (auto& t : threads) t.join();
    for (std::size_t i = 0; i < jobs.size(); ++i) {
        EXPECT_TRUE(errors[i].empty()) << jobs[i].first.display() << " sm_" << jobs[i].second << ": " << errors[i];
        EXPECT_EQ(results[i].spill_bytes, 0) << jobs[i].first.display() << " sm_" << jobs[i].second << "\n"
                                             << results[i].resource_report;
        EXPECT_EQ(results[i].smem_bytes, 0) << jobs[i].first.display() << " sm_" << jobs[i].second << "\n"
                                            << results[i].resource_report;
    }
}

// H200's opt-in shared memory per block (and A100's): the configs the heuristic and the sweep pick under it.
constexpr int kSmem90 = 232448, kSmem80 = 166912;

// The heuristic's shape for every (dtype, head_dim, heads per block) the launcher can pick.
TEST(AttentionCompile, DecodeSplitHasNoSpills) {
    std::vector<std::pair<loom::jit::KernelSpec, int>> jobs;
    for (int arch : {90, 80})
        for (DType t : {DType::BF16, DType::F16})
            for (int d : {64, 128, 256})
                for (int h : {1, 2, 4, 8}) {
                    const loom::DecodeConfig c = la::decode_default_config(d, h, arch == 90 ? kSmem90 : kSmem80);
                    jobs.emplace_back(la::decode_split_spec(t, d, h, c), arch);
                }
    expect_all_clean(jobs);
}

// Every shape bench-attention's sweep times, for the groups of 4 and 8 (D = 128) and 8 (D = 64, 256), bf16.
TEST(AttentionCompile, DecodeSweepConfigsHaveNoSpills) {
    std::vector<std::pair<loom::jit::KernelSpec, int>> jobs;
    for (int arch : {90, 80})
        for (auto [d, h] : {std::pair{128, 4}, std::pair{128, 8}, std::pair{64, 8}, std::pair{256, 8}}) {
            const int smem = arch == 90 ? kSmem90 : kSmem80;
            const auto configs = la::decode_sweep_configs(d, h, smem);
            EXPECT_GE(configs.size(), 8u);
            for (const auto& c : configs) {
                la::check_decode_config("test", c, d, h, smem);
                jobs.emplace_back(la::decode_split_spec(DType::BF16, d, h, c), arch);
            }
        }
    expect_all_clean(jobs);
}

// decode_precompile: one record per config, in order.
TEST(AttentionCompile, PrecompileKeepsTheOrder) {
    const auto configs = la::decode_sweep_configs(128, 8, kSmem90);
    const auto records = la::decode_precompile(DType::BF16, 128, 8, configs, 90);
    ASSERT_EQ(records.size(), configs.size());
    for (std::size_t i = 0; i < configs.size(); ++i)
        EXPECT_EQ(records[i].cache_key,
                  loom::jit::compile(la::decode_split_spec(DType::BF16, 128, 8, configs[i]), 90).cache_key);
}

TEST(AttentionCompile, MergeAndSpCombineHaveNoSpills) {
    for (int arch : {90, 80})
        for (DType t : {DType::BF16, DType::F16})
            for (int d : {64, 128, 256}) {
                expect_clean(la::decode_merge_spec(t, d), arch);
                for (auto x : {la::SpExchange::Packets, la::SpExchange::Direct, la::SpExchange::TwoShot})
                    expect_clean(la::sp_combine_spec(t, d, x), arch);
            }
}

TEST(AttentionPlan, DefaultConfigIsValidAndFits) {
    for (int d : {64, 128, 256})
        for (int h : {1, 2, 4, 8}) {
            const loom::DecodeConfig c = la::decode_default_config(d, h, kSmem90);
            const bool mma = h >= la::kDecodeMmaMinHeads && d <= 128;
            EXPECT_EQ(c.mma, mma);
            if (mma) {
                EXPECT_EQ(c.tile_tokens, 64);
                EXPECT_EQ(c.stages, d == 128 ? 3 : 4);
            } else {
                EXPECT_EQ(c.tile_tokens * d, 4096);  // 16 KiB of K + V per stage
                EXPECT_EQ(c.stages, 4);
            }
            EXPECT_NO_THROW(la::check_decode_config("test", c, d, h, kSmem90));
            // A device with less shared memory per block gets fewer stages (or CUDA cores).
            const loom::DecodeConfig small = la::decode_default_config(d, h, 40 << 10);
            EXPECT_NO_THROW(la::check_decode_config("test", small, d, h, 40 << 10));
        }
}

TEST(AttentionPlan, BadConfigsRaise) {
    auto expect_error = [](const loom::DecodeConfig& c, int d, int h, const char* needle) {
        try {
            la::check_decode_config("decode_attention", c, d, h, kSmem90);
            ADD_FAILURE() << "no error for " << needle;
        } catch (const loom::Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    loom::DecodeConfig c;
    c.tile_tokens = 32;
    EXPECT_NO_THROW(la::check_decode_config("decode_attention", c, 128, 8, kSmem90));
    auto c1 = c;
    c1.head_split = 3;
    expect_error(c1, 128, 8, "head_split 1, or 2");
    auto c2 = c;
    c2.head_split = 2;
    expect_error(c2, 128, 1, "head_split 1, or 2");  // one head cannot be split
    auto c3 = c;
    c3.stages = 9;
    expect_error(c3, 128, 8, "stages in [2, 8], given 9");
    auto c4 = c;
    c4.tile_tokens = 20;
    expect_error(c4, 128, 8, "tile_tokens a multiple of 8");
    c4.tile_tokens = 72;
    expect_error(c4, 128, 8, "at most 64");
    auto c5 = c;
    c5.stages = 8;
    c5.tile_tokens = 32;
    expect_error(c5, 256, 8, "shared memory per block");
    auto c6 = c;
    c6.splits = 129;
    expect_error(c6, 128, 8, "splits in [0, 128]");
    auto c7 = c;
    c7.mma = true;  // tensor cores: 64-token tiles, D <= 128, one half
    expect_error(c7, 128, 8, "DecodeConfig::mma");
    c7.tile_tokens = 64;
    EXPECT_NO_THROW(la::check_decode_config("decode_attention", c7, 128, 8, kSmem90));
    expect_error(c7, 256, 8, "DecodeConfig::mma");
    c7.head_split = 2;
    expect_error(c7, 128, 8, "DecodeConfig::mma");
    // A tile whose stages' shared memory would overflow int is refused by its size, not passed by a wrapped one.
    c7.head_split = 1;
    c7.tile_tokens = 516736;
    c7.stages = 8;
    expect_error(c7, 128, 8, "multiple of 64 in [64, 512], given head_split 1, head_dim 128, tile_tokens 516736");
}

TEST(AttentionPlan, HeadsPerBlockCoverTheGroup) {
    EXPECT_EQ(la::decode_heads_per_block(1), 1);
    EXPECT_EQ(la::decode_heads_per_block(3), 4);
    EXPECT_EQ(la::decode_heads_per_block(4), 4);
    EXPECT_EQ(la::decode_heads_per_block(8), 8);
    EXPECT_EQ(la::decode_heads_per_block(12), 8);  // two blocks of the group
    EXPECT_EQ(la::decode_heads_per_block(96), 8);
}

TEST(AttentionPlan, SplitsFillWholeWaves) {
    // decode_splits(base blocks, max_len, tile, head_dim, heads, SMs, requested).
    // One sequence, 8 kv heads (group 4), 32K tokens on 132 SMs (one block saturates an SM): 16 splits of 2048
    // tokens, 128 blocks, one per SM.
    EXPECT_EQ(la::decode_splits(8, 32768, 32, 128, 4, 132, 0), 16);
    // 16 sequences: 128 blocks already, one split.
    EXPECT_EQ(la::decode_splits(16 * 8, 32768, 32, 128, 4, 132, 0), 1);
    // Enough blocks already: one split.
    EXPECT_EQ(la::decode_splits(64 * 8, 32768, 32, 128, 4, 132, 0), 1);
    // Every split at least one tile; an empty cache one split.
    EXPECT_LE(la::decode_splits(8, 100, 32, 128, 4, 132, 0), 4);
    EXPECT_EQ(la::decode_splits(8, 0, 32, 128, 4, 132, 0), 1);
    // Capped, and the request wins.
    EXPECT_LE(la::decode_splits(1, 1 << 30, 32, 128, 4, 1000, 0), la::kMaxSplits);
    EXPECT_EQ(la::decode_splits(8, 1000, 32, 128, 4, 132, 7), 7);
    // Fewer blocks than SMs are split to occupy at least 90 % of the SMs.
    for (int64_t base : {8, 12, 96, 128, 256, 768})
        for (int64_t len : {8192, 32768, 131072}) {
            const int s = la::decode_splits(base, len, 32, 128, 8, 132, 0);
            EXPECT_GE(s, 1);
            EXPECT_LE(s, la::kMaxSplits);
            if (base < 132) {
                EXPECT_GE(base * s, 0.9 * 132) << base << " " << len;
            }
        }
}

TEST(AttentionPlan, PipelineDepthKeepsTheBusiestSmsBlocksResident) {
    // A stand-in for the occupancy: 2 blocks of 3 stages per SM, 3 of 2 stages (the H200's at D 128 with tensor cores).
    auto resident = [](const loom::DecodeConfig& c) { return c.stages >= 3 ? 2 : 3; };
    loom::DecodeConfig c;
    c.mma = true;
    c.stages = 3;
    c.tile_tokens = 64;
    for (int64_t per_sm : {1, 2}) EXPECT_EQ(la::decode_resident_config(c, per_sm, resident).stages, 3) << per_sm;
    const loom::DecodeConfig shallow = la::decode_resident_config(c, 3, resident);
    EXPECT_EQ(shallow.stages, 2);
    EXPECT_EQ(shallow.tile_tokens, 64);  // only the depth changes
    EXPECT_TRUE(shallow.mma);
    // More blocks than any depth keeps resident: the shape as given.
    for (int64_t per_sm : {4, 6, 100}) EXPECT_EQ(la::decode_resident_config(c, per_sm, resident).stages, 3) << per_sm;
    // The deepest shape that holds them: 4 stages -> 3 when 3 stages hold 3 blocks.
    auto deeper = [](const loom::DecodeConfig& c) { return c.stages >= 4 ? 2 : c.stages == 3 ? 3 : 4; };
    c.stages = 4;
    EXPECT_EQ(la::decode_resident_config(c, 3, deeper).stages, 3);
    EXPECT_EQ(la::decode_resident_config(c, 4, deeper).stages, 2);
}

TEST(AttentionPlan, SpAutoExchangeBySize) {
    using la::SpExchange;
    // Packets below 256 rows, whatever the ranks.
    EXPECT_EQ(la::sp_auto_exchange(255, 8, 128), SpExchange::Packets);
    EXPECT_EQ(la::sp_auto_exchange(1, 2, 128), SpExchange::Packets);
    // Direct until each rank would send 8 MiB directly (rows x 129 x 4 bytes to each of W - 1 peers), then two shots.
    EXPECT_EQ(la::sp_auto_exchange(256, 8, 128), SpExchange::Direct);
    EXPECT_EQ(la::sp_auto_exchange(2048, 8, 128), SpExchange::Direct);   // 7.4 MB
    EXPECT_EQ(la::sp_auto_exchange(4096, 8, 128), SpExchange::TwoShot);  // 14.8 MB
    EXPECT_EQ(la::sp_auto_exchange(4096, 4, 128), SpExchange::Direct);   // 6.3 MB
    EXPECT_EQ(la::sp_auto_exchange(12800, 2, 256), SpExchange::TwoShot);
    EXPECT_EQ(la::sp_auto_exchange(1 << 20, 1, 128), SpExchange::Direct);  // no peer: nothing to save
}

// Shape errors raise before anything touches the device.
TEST(AttentionPlan, BadShapesRaiseNamingTheArgument) {
    alignas(16) static char buf[64];
    auto expect_error = [](const loom::DecodeQuery& q, const loom::KvCache& kv, const loom::DecodeOptions& o,
                           const char* needle) {
        try {
            la::plan_decode("decode_attention", q, kv, buf, nullptr, o, nullptr);
            ADD_FAILURE() << "no error for " << needle;
        } catch (const loom::Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    const loom::DecodeQuery q{buf, DType::BF16, 2, 32, 128};
    loom::KvCache kv;
    kv.k = kv.v = buf;
    kv.num_kv_heads = 8;
    kv.max_seq_len = 16;
    kv.seq_lens = reinterpret_cast<const int32_t*>(buf);
    const loom::DecodeOptions o;
    auto qd = q;
    qd.head_dim = 96;
    expect_error(qd, kv, o, "head_dim 64, 128 or 256, given 96");
    auto kv3 = kv;
    kv3.num_kv_heads = 3;
    expect_error(q, kv3, o, "integral GQA group");
    auto qf = q;
    qf.dtype = DType::F32;
    expect_error(qf, kv, o, "bf16 or f16, given f32");
    auto kvp = kv;
    kvp.block_table = reinterpret_cast<const int32_t*>(buf);
    kvp.max_seq_len = 0;
    kvp.num_pages = 4;
    kvp.max_pages = 2;
    kvp.page_size = 512;
    expect_error(q, kvp, o, "page_size in [1, 256], given 512");
    auto oc = o;
    oc.softcap = -1.f;
    expect_error(q, kv, oc, "softcap");
    auto os = o;
    os.num_splits = 1000;
    expect_error(q, kv, os, "num_splits");
    auto q0 = q;
    q0.batch = 0;
    expect_error(q0, kv, o, "batch >= 1, given 0");
}

}  // namespace
