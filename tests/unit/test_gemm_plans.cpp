// CPU tests of every GEMM planner's output over tiles x ranks x SM counts: loom::gemm's heuristic and its autotuner's
// candidates, and the plans of ag_gemm, gemm_rs and gemm_ar for every algorithm / producer, all pass
// gemm_validate_config (so their stages fit in shared memory beside the plain epilogue's staging); gemm_ar's fused
// epilogue also fits its whole staged tile. A config an overlapped op is given explicitly is validated, not adapted:
// stages that do not fit raise loom::Error naming the most that do.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "ops/overlap/ag_gemm/ag_gemm.hpp"
#include "ops/overlap/common/plan.hpp"
#include "ops/overlap/common/tune.hpp"
#include "ops/overlap/gemm_ar/gemm_ar.hpp"
#include "ops/overlap/gemm_rs/gemm_rs.hpp"

namespace {

using loom::DType;
using loom::GemmConfig;

constexpr int kSms[] = {8, 13, 26, 33, 44, 66, 100, 114, 132};
constexpr int64_t kRows[] = {1, 17, 64, 97, 128, 251, 300, 1024, 8192};
constexpr int64_t kCols[] = {136, 520, 1376, 4096};
constexpr int64_t kDepths[] = {128, 2048};

// The config is one the kernels take, and its ring plus the plain epilogue's staging fit in shared memory.
void expect_fits(const GemmConfig& c, DType in, const std::string& what) {
    EXPECT_NO_THROW(loom::gemm_validate_config(c, false, in)) << what << ": " << c.str();
    if (!c.sm80)
        EXPECT_LE(loom::kernels::gemm_sm90_smem_bytes(c.block_m, c.block_n, c.stages), loom::kernels::kGemmSm90MaxSmem)
            << what << ": " << c.str();
}

std::string where(int64_t m, int64_t n, int64_t k, int w, int sms) {
    return "M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k) +
           " W=" + std::to_string(w) + " SMs=" + std::to_string(sms);
}

TEST(GemmPlans, HeuristicAndCandidatesFit) {
    for (DType in : {DType::BF16, DType::F8E4M3})
        for (int sms : kSms)
            for (int64_t m : kRows)
                for (int64_t n : kCols)
                    for (int64_t k : kDepths) {
                        const std::string at = where(m, n, k, 1, sms);
                        for (bool split : {true, false})
                            for (auto tiles : {loom::GemmTiles::Plain, loom::GemmTiles::Overlap})
                                expect_fits(loom::gemm_heuristic(m, n, k, false, 90, sms, split, tiles, in), in,
                                            "heuristic " + at);
                        for (const GemmConfig& c : loom::gemm_tune_candidates(m, n, k, false, in, 90, sms))
                            expect_fits(c, in, "tune candidate " + at);
                    }
}

TEST(GemmPlans, OverlapPlansFitAtEveryWorldSize) {
    using loom::AgProducer;
    using loom::ArAlgo;
    using loom::RsAlgo;
    for (int w = 1; w <= 8; ++w)
        for (int sms : kSms)
            for (int64_t rows : kRows) {
                if (rows > 1024) continue;
                const int64_t m = rows * w;
                for (int64_t n : kCols)
                    for (int64_t k : kDepths) {
                        const std::string at = where(m, n, k, w, sms);
                        for (int out_bytes : {2, 4}) {
                            for (RsAlgo a :
                                 {RsAlgo::Auto, RsAlgo::FusedEpilogue, RsAlgo::FusedPull, RsAlgo::ScatterReduce}) {
                                const auto p = loom::gemm_rs_plan(m, n, k, w, 0, 90, sms, a, out_bytes);
                                expect_fits(p.gemm, DType::BF16,
                                            "gemm_rs " + std::string(loom::to_string(a)) + " " + at);
                            }
                            for (ArAlgo a : {ArAlgo::Auto, ArAlgo::FusedEpilogue, ArAlgo::ReduceKernel}) {
                                const auto p = loom::gemm_ar_plan(m, n, k, w, 0, 90, sms, a, out_bytes);
                                if (p.ar_algo == ArAlgo::Sequential) continue;  // loom::gemm's own plan
                                expect_fits(p.gemm, DType::BF16,
                                            "gemm_ar " + std::string(loom::to_string(a)) + " " + at);
                                if (p.ar_algo == ArAlgo::FusedEpilogue)
                                    EXPECT_EQ(loom::overlap::whole_tile_unfit(p.gemm, out_bytes), "")
                                        << "gemm_ar fused epilogue " << at << ": " << p.gemm.str();
                            }
                        }
                        for (AgProducer pr : {AgProducer::Auto, AgProducer::CopyEngine, AgProducer::Sm,
                                              AgProducer::Direct, AgProducer::Sequential})
                            for (bool shared : {false, true}) {
                                const auto p = loom::ag_gemm_plan(m, n, k, w, pr, 0, 90, sms, shared);
                                expect_fits(p.gemm, DType::BF16, "ag_gemm " + at);
                            }
                        for (const GemmConfig& t :
                             loom::overlap::tile_alternatives(loom::overlap::gemm_config(m, n, k, 90, sms), m, n, sms))
                            expect_fits(t, DType::BF16, "overlap tile alternative " + at);
                    }
            }
}

// The helper the overlap tests use for a 64 x 128 tile, taken from the heuristic's config: at W = 1 the heuristic's
// tile is 64 x 64 with 12 stages, which do not fit beside a 128-wide B tile. The explicit config is refused with the
// most stages that fit; the tile's own plan_stages fits.
TEST(GemmPlans, ExplicitStagesAreValidatedNotAdapted) {
    GemmConfig c = loom::gemm_heuristic(64, 200, 128, false, 90, 132);
    EXPECT_EQ(c.block_m, 64);
    EXPECT_EQ(c.stages, 12);
    c.block_n = 128;
    try {
        loom::gemm_validate_config(c, false);
        ADD_FAILURE() << "expected loom::Error for " << c.str();
    } catch (const loom::Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("needs 312512 B of shared memory"), std::string::npos) << msg;
        EXPECT_NE(msg.find("expected stages <= 8 for 64 x 128 tiles"), std::string::npos) << msg;
    }
    c.stages = loom::kernels::gemm_sm90_plan_stages(c.block_m, c.block_n);
    EXPECT_EQ(c.stages, 8);
    EXPECT_NO_THROW(loom::gemm_validate_config(c, false)) << c.str();
}

// Fields whose range the kernels' int32 arithmetic bounds, and the gemv config with sm80 set, are checked.
TEST(GemmPlans, ConfigFieldsOutOfRangeAreRefused) {
    const GemmConfig base = loom::gemm_heuristic(4096, 4096, 4096, false, 90, 132);
    auto refused = [](const GemmConfig& c, const char* part) {
        try {
            loom::gemm_validate_config(c, false);
        } catch (const loom::Error& e) {
            return std::string(e.what()).find(part) != std::string::npos;
        }
        return false;
    };
    GemmConfig c = base;
    c.group_m = 1 << 30;
    EXPECT_TRUE(refused(c, "expected group_m in [1, 1024], given 1073741824"));
    c = base;
    c.grid = 1 << 30;
    EXPECT_TRUE(refused(c, "expected grid in [0, 1048576]"));
    GemmConfig g = loom::detail::gemm_gemv_plan(8, 4096, 4096, loom::DType::BF16, 132);
    g.sm80 = true;
    g.stages = 40;
    EXPECT_TRUE(refused(g, "the gemv kernel expects stages in [2,"));
}

}  // namespace
