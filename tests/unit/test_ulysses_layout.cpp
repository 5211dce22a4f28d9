// CPU tests of the Ulysses ops (docs/attention.md "Ulysses sequence parallelism"): the head layout (every q head on
// exactly one rank, every rank's kv heads those its q heads attend to, GQA replication when Hkv < W), the head
// counts that cannot split, the algorithm choice, the chunk limit, the fused plans, and the kernels compiling for
// sm_90a (the all-to-alls, a2a_o_gemm's hooked GEMM without spills).
#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <string>

#include "loom/jit/jit.hpp"
#include "loom/kernels/attention/ulysses_params.hpp"
#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/ops/attention.hpp"
#include "loom/runtime/error.hpp"
#include "ops/attention/ulysses/ulysses.hpp"
#include "ops/gemm/gemm_internal.hpp"

namespace {

using loom::UlyssesHeads;
using loom::ulysses::qkv_layout;

std::string error_of(int world, UlyssesHeads h) {
    try {
        (void)qkv_layout("qkv_gemm_a2a", world, h);
    } catch (const loom::Error& e) {
        return e.what();
    }
    return "";
}

// Every layout the rule admits for W <= 8, Hq <= 16: q heads partition, kv heads are the q heads' groups.
TEST(UlyssesLayout, EveryRankHoldsItsQueryHeadsAndTheirKvHeads) {
    int checked = 0;
    for (int W = 1; W <= 8; ++W)
        for (int64_t hq = 1; hq <= 16; ++hq)
            for (int64_t hkv = 1; hkv <= hq; ++hkv) {
                const UlyssesHeads h{hq, hkv, 16};
                const bool ok = hq % hkv == 0 && hq % W == 0 && (hkv % W == 0 || W % hkv == 0);
                if (!ok) {
                    EXPECT_NE(error_of(W, h), "") << "W " << W << " hq " << hq << " hkv " << hkv;
                    continue;
                }
                const auto l = qkv_layout("qkv_gemm_a2a", W, h);
                ASSERT_EQ(l.hq_loc * W, hq);
                ASSERT_EQ(l.cols(), (hq + 2 * hkv) * 16);
                std::set<int64_t> q_cols;
                const int64_t group = hq / hkv;
                for (int r = 0; r < W; ++r) {
                    for (int64_t c = 0; c < l.q_width(); ++c) q_cols.insert(l.q_col(r) + c);
                    // The kv heads of rank r: every q head it holds attends to one of them.
                    const int64_t kv0 = (l.k_col(r) - hq * 16) / 16;
                    ASSERT_EQ((l.v_col(r) - (hq + hkv) * 16) / 16, kv0);
                    ASSERT_GE(kv0, 0);
                    ASSERT_LE(kv0 + l.hkv_loc, hkv);
                    for (int64_t qh = r * l.hq_loc; qh < (r + 1) * l.hq_loc; ++qh) {
                        const int64_t kvh = qh / group;
                        EXPECT_TRUE(kvh >= kv0 && kvh < kv0 + l.hkv_loc)
                            << "W " << W << " hq " << hq << " hkv " << hkv << " rank " << r << " q head " << qh;
                    }
                    if (hkv >= W) {
                        EXPECT_EQ(l.hkv_loc, hkv / W);
                        EXPECT_EQ(kv0, r * (hkv / W));
                    } else {
                        EXPECT_EQ(l.hkv_loc, 1);
                        EXPECT_EQ(kv0, r / (W / hkv));  // replicated on W / Hkv consecutive ranks
                    }
                }
                EXPECT_EQ(static_cast<int64_t>(q_cols.size()), hq * 16);
                EXPECT_EQ(*q_cols.rbegin(), hq * 16 - 1);
                ++checked;
            }
    EXPECT_GT(checked, 50);
}

TEST(UlyssesLayout, HeadsThatDoNotSplitRaiseNamingThem) {
    EXPECT_NE(error_of(3, {32, 8, 128}).find("divide heads.q"), std::string::npos);    // 3 does not divide 32
    EXPECT_NE(error_of(4, {12, 6, 128}).find("heads.kv"), std::string::npos);          // 6 vs 4 ranks
    EXPECT_NE(error_of(2, {32, 5, 128}).find("dividing heads.q"), std::string::npos);  // groups not whole
    EXPECT_NE(error_of(2, {32, 8, 100}).find("heads.dim a multiple of 8"), std::string::npos);
    EXPECT_NE(error_of(2, {0, 8, 128}).find("> 0"), std::string::npos);
    EXPECT_EQ(error_of(3, {6, 3, 64}), "");  // odd W
    EXPECT_EQ(error_of(3, {6, 1, 64}), "");  // MQA: one kv head on every rank
    EXPECT_EQ(error_of(8, {32, 8, 128}), "");
    EXPECT_EQ(error_of(8, {64, 4, 128}), "");
}

TEST(UlyssesPlan, AutoIsFusedAcrossRanks) {
    using loom::UlyssesAlgo;
    EXPECT_EQ(loom::ulysses::choose_algo(UlyssesAlgo::Auto, 1, false), UlyssesAlgo::Sequential);
    EXPECT_EQ(loom::ulysses::choose_algo(UlyssesAlgo::Auto, 2, false), UlyssesAlgo::Fused);
    EXPECT_EQ(loom::ulysses::choose_algo(UlyssesAlgo::Auto, 4, true), UlyssesAlgo::Sequential);
    EXPECT_EQ(loom::ulysses::choose_algo(UlyssesAlgo::Sequential, 8, false), UlyssesAlgo::Sequential);
    EXPECT_EQ(loom::ulysses::choose_algo(UlyssesAlgo::Fused, 1, true), UlyssesAlgo::Fused);
    EXPECT_STREQ(loom::to_string(UlyssesAlgo::Fused), "Fused");
}

TEST(UlyssesPlan, ChunksCoverTheRowsUpToTheSignalLimit) {
    EXPECT_EQ(loom::ulysses::o_chunks("a2a_o_gemm", 1), 1);
    EXPECT_EQ(loom::ulysses::o_chunks("a2a_o_gemm", 128), 1);
    EXPECT_EQ(loom::ulysses::o_chunks("a2a_o_gemm", 129), 2);
    const int64_t most = int64_t(loom::kernels::attention::kUlyssesMaxChunks) * loom::ulysses::kChunkRows;
    EXPECT_EQ(loom::ulysses::o_chunks("a2a_o_gemm", most), loom::kernels::attention::kUlyssesMaxChunks);
    EXPECT_THROW((void)loom::ulysses::o_chunks("a2a_o_gemm", most + 1), loom::Error);
}

// The fused GEMM leaves the comm blocks their SMs, and its tiles fit the tile signals.
TEST(UlyssesPlan, FusedPlanLeavesTheCommBlocksTheirSms) {
    for (int sms : {16, 33, 132})
        for (int64_t rows : {1000, 4096}) {
            const auto plan = loom::ulysses::fused_plan("qkv_gemm_a2a", rows, (64 + 16) * 128, 8192, loom::DType::BF16,
                                                        90, sms, 0, nullptr);
            EXPECT_GE(plan.comm_blocks, 1);
            EXPECT_LE(plan.comm_blocks, std::max(1, sms / 4));
            EXPECT_LE(plan.gemm.grid + plan.comm_blocks, sms) << plan.str();
            EXPECT_EQ(plan.gemm.cluster_m, 1);
            EXPECT_EQ(plan.gemm.tail_splits, 1);
        }
    loom::GemmConfig bad;
    bad.cluster_m = 2;
    EXPECT_THROW((void)loom::ulysses::fused_plan("a2a_o_gemm", 1024, 4096, 4096, loom::DType::BF16, 90, 132, 0, &bad),
                 loom::Error);
}

TEST(UlyssesCompile, AllToAllKernelsCompile) {
    for (const char* name : {"loom::kernels::attention::ulysses_qkv_a2a", "loom::kernels::attention::ulysses_o_a2a"}) {
        loom::jit::KernelSpec spec;
        spec.header = "loom/kernels/attention/ulysses.cuh";
        spec.name = name;
        const auto r = loom::jit::compile(spec, 90);
        EXPECT_FALSE(r.cubin.empty()) << name;
        EXPECT_EQ(r.spill_bytes, 0) << name << "\n" << r.resource_report;
    }
}

TEST(UlyssesCompile, OutputProjectionGemmHasNoSpills) {
    for (int bn : {256, 192, 128})
        for (loom::DType out : {loom::DType::BF16, loom::DType::F32}) {
            loom::GemmConfig c;
            c.block_m = 128;
            c.block_n = bn;
            c.cluster_m = 1;
            c.stages = loom::kernels::gemm_sm90_plan_stages(128, bn, 0);
            const auto spec =
                loom::gemm_kernel_spec(c, loom::DType::BF16, out, loom::gemm_kernel_bias(c, out, loom::GemmOptions{}),
                                       false, loom::ulysses::kOGemmHooks, loom::ulysses::kOGemmHeader);
            const auto r = loom::jit::compile(spec, 90);
            EXPECT_FALSE(r.cubin.empty()) << spec.display();
            EXPECT_EQ(r.spill_bytes, 0) << spec.display() << "\n" << r.resource_report;
        }
}

}  // namespace
