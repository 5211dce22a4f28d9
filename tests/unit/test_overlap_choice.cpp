// The overlapped ops' automatic choices and their refusals (src/ops/overlap/{ag_gemm,gemm_rs,gemm_ar}/plan.cpp), on the
// host: what Auto resolves to for ranks on distinct GPUs and ranks sharing one, and the
// clear errors for a producer or transport that cannot run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>

#include "loom/ops/overlap.hpp"
#include "loom/runtime/error.hpp"
#include "ops/overlap/ag_gemm/ag_gemm.hpp"
#include "ops/overlap/gemm_ar/gemm_ar.hpp"
#include "ops/overlap/gemm_rs/gemm_rs.hpp"

namespace {

using loom::AgProducer;
using loom::ArAlgo;
using loom::RsAlgo;
using loom::RsTransport;

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const loom::Error& e) {
        return e.what();
    }
    return "";
}

TEST(OverlapChoice, AgGemmProducer) {
    // Distinct GPUs: the copy engine; ranks sharing one: direct where it applies.
    EXPECT_EQ(loom::ag_gemm_producer(AgProducer::Auto, 2, 4096, 128, false, false), AgProducer::CopyEngine);
    EXPECT_EQ(loom::ag_gemm_producer(AgProducer::Auto, 8, 1024, 128, false, true), AgProducer::Direct);
    EXPECT_EQ(loom::ag_gemm_producer(AgProducer::Auto, 8, 1000, 128, false, true), AgProducer::CopyEngine);  // M/W
    EXPECT_EQ(loom::ag_gemm_producer(AgProducer::Auto, 8, 1024, 128, true, true), AgProducer::CopyEngine);   // gathered
    EXPECT_EQ(loom::ag_gemm_producer(AgProducer::Auto, 1, 1024, 128, false, true), AgProducer::CopyEngine);  // one rank
    // Distinct GPUs: the sequence when the GEMM's tiles fit one wave on the SMs (nothing to overlap), else the copy
    // engine; tiles unknown (0) or one rank: the copy engine. Ranks sharing a GPU keep their choice whatever the tiles.
    EXPECT_EQ(loom::ag_gemm_producer(AgProducer::Auto, 2, 256, 128, false, false, 132, 132), AgProducer::Sequential);
    EXPECT_EQ(loom::ag_gemm_producer(AgProducer::Auto, 2, 256, 128, false, false, 133, 132), AgProducer::CopyEngine);
    EXPECT_EQ(loom::ag_gemm_producer(AgProducer::Auto, 2, 256, 128, true, false, 44, 132), AgProducer::Sequential);
    EXPECT_EQ(loom::ag_gemm_producer(AgProducer::Auto, 2, 256, 128, false, false, 0, 132), AgProducer::CopyEngine);
    EXPECT_EQ(loom::ag_gemm_producer(AgProducer::Auto, 1, 256, 128, false, false, 44, 132), AgProducer::CopyEngine);
    EXPECT_EQ(loom::ag_gemm_producer(AgProducer::Auto, 8, 256, 128, false, true, 44, 14), AgProducer::Direct);
    EXPECT_EQ(loom::ag_gemm_producer(AgProducer::Sequential, 2, 256, 128, true, true, 9999, 1), AgProducer::Sequential);
    // Requested producers pass through; direct is checked.
    EXPECT_EQ(loom::ag_gemm_producer(AgProducer::Sm, 8, 1000, 128, true, true), AgProducer::Sm);
    EXPECT_EQ(loom::ag_gemm_producer(AgProducer::Direct, 2, 256, 128, false, false), AgProducer::Direct);
    const std::string e = error_of([] { loom::ag_gemm_producer(AgProducer::Direct, 2, 200, 128, false, true); });
    EXPECT_NE(e.find("M / W = 200 a multiple of the GEMM's BLOCK_M = 128"), std::string::npos) << e;
    EXPECT_NE(error_of([] { loom::ag_gemm_producer(AgProducer::Direct, 2, 256, 128, true, true); }).find("gathered"),
              std::string::npos);
}

// Where ag_gemm gathers A: a gathered buffer outside the symmetric heap is written through the state's buffer and
// copied (the overlapped producers' peers write into the gather buffer) except by the sequence, whose loom::all_gather
// takes any out.
TEST(OverlapChoice, AgGemmGatherPlacement) {
    using loom::AgGatherAt;
    for (AgProducer p : {AgProducer::CopyEngine, AgProducer::Sm}) {
        EXPECT_EQ(loom::ag_gather_at(p, false, false), AgGatherAt::Own) << loom::to_string(p);
        EXPECT_EQ(loom::ag_gather_at(p, true, true), AgGatherAt::Callers) << loom::to_string(p);
        EXPECT_EQ(loom::ag_gather_at(p, true, false), AgGatherAt::OwnThenCopy) << loom::to_string(p);
    }
    EXPECT_EQ(loom::ag_gather_at(AgProducer::Sequential, false, false), AgGatherAt::Own);
    EXPECT_EQ(loom::ag_gather_at(AgProducer::Sequential, true, true), AgGatherAt::Callers);
    EXPECT_EQ(loom::ag_gather_at(AgProducer::Sequential, true, false), AgGatherAt::Callers);
    EXPECT_EQ(loom::ag_gather_at(AgProducer::Direct, false, false), AgGatherAt::None);
    // Across nodes the sequence's hierarchical all_gather writes a symmetric out: a plain one is copied into.
    EXPECT_EQ(loom::ag_gather_at(AgProducer::Sequential, true, false, true), AgGatherAt::OwnThenCopy);
    EXPECT_EQ(loom::ag_gather_at(AgProducer::Sequential, true, true, true), AgGatherAt::Callers);
    EXPECT_EQ(loom::ag_gather_at(AgProducer::CopyEngine, true, false, true), AgGatherAt::OwnThenCopy);
}

// A World of several nodes: Auto takes a form that runs there; an algorithm that reaches its peers through the node's
// heap only raises, naming itself, what it needs and the World.
TEST(OverlapChoice, AcrossNodes) {
    // ag_gemm: the sequence for one wave of tiles, else (or with a config) the two-level copy-engine form.
    EXPECT_EQ(loom::ag_gemm_producer_across_nodes(AgProducer::Auto, 2, 4, 100, 132), AgProducer::Sequential);
    EXPECT_EQ(loom::ag_gemm_producer_across_nodes(AgProducer::Auto, 2, 4, 133, 132), AgProducer::CopyEngine);
    EXPECT_EQ(loom::ag_gemm_producer_across_nodes(AgProducer::Auto, 2, 4, 0, 132), AgProducer::CopyEngine);
    EXPECT_EQ(loom::ag_gemm_producer_across_nodes(AgProducer::Auto, 2, 4, 10, 132, true), AgProducer::CopyEngine);
    EXPECT_EQ(loom::ag_gemm_producer_across_nodes(AgProducer::Sequential, 2, 4), AgProducer::Sequential);
    EXPECT_EQ(loom::ag_gemm_producer_across_nodes(AgProducer::CopyEngine, 4, 2), AgProducer::CopyEngine);
    for (AgProducer p : {AgProducer::Sm, AgProducer::Direct}) {
        const std::string e = error_of([&] { loom::ag_gemm_producer_across_nodes(p, 2, 4); });
        EXPECT_NE(e.find(std::string("ag_gemm: the producer ") + loom::to_string(p) + " runs within one node"),
                  std::string::npos)
            << e;
        EXPECT_NE(e.find("expected AgProducer::CopyEngine, Sequential or Auto"), std::string::npos) << e;
        EXPECT_NE(e.find("in a World of 2 nodes x 4 ranks"), std::string::npos) << e;
    }
    // gemm_rs and gemm_ar: the sequence (gemm_rs's ScatterReduce: its two-level form); a config (which only the hooked
    // GEMMs take) raises.
    EXPECT_EQ(loom::gemm_rs_algo_across_nodes(RsAlgo::Auto, 2, 2), RsAlgo::Sequential);
    EXPECT_EQ(loom::gemm_rs_algo_across_nodes(RsAlgo::Sequential, 2, 2), RsAlgo::Sequential);
    EXPECT_EQ(loom::gemm_rs_algo_across_nodes(RsAlgo::ScatterReduce, 2, 2), RsAlgo::ScatterReduce);  // two-level
    EXPECT_NE(error_of([] { loom::gemm_rs_algo_across_nodes(RsAlgo::Auto, 2, 2, true); }).find("expected no config"),
              std::string::npos);
    for (RsAlgo a : {RsAlgo::FusedEpilogue, RsAlgo::FusedPull}) {
        const std::string e = error_of([&] { loom::gemm_rs_algo_across_nodes(a, 4, 2); });
        EXPECT_NE(e.find(std::string("gemm_rs: the algorithm ") + loom::to_string(a) + " runs within one node"),
                  std::string::npos)
            << e;
        EXPECT_NE(e.find("in a World of 4 nodes x 2 ranks"), std::string::npos) << e;
    }
    using loom::ArShots;
    EXPECT_EQ(loom::gemm_ar_algo_across_nodes(ArAlgo::Auto, ArShots::Auto, 2, 2), ArAlgo::Sequential);
    EXPECT_EQ(loom::gemm_ar_algo_across_nodes(ArAlgo::Sequential, ArShots::Auto, 2, 2), ArAlgo::Sequential);
    EXPECT_NE(error_of([] {
                  loom::gemm_ar_algo_across_nodes(ArAlgo::Auto, ArShots::Auto, 2, 2, true);
              }).find("expected no config"),
              std::string::npos);
    EXPECT_NE(error_of([] {
                  loom::gemm_ar_algo_across_nodes(ArAlgo::Sequential, ArShots::OneShot, 2, 2);
              }).find("ArShots::one-shot is the reduce kernel's"),
              std::string::npos);
    for (ArAlgo a : {ArAlgo::FusedEpilogue, ArAlgo::ReduceKernel}) {
        const std::string e = error_of([&] { loom::gemm_ar_algo_across_nodes(a, ArShots::Auto, 2, 4); });
        EXPECT_NE(e.find(std::string("gemm_ar: the algorithm ") + loom::to_string(a) + " runs within one node"),
                  std::string::npos)
            << e;
    }
    // ArShots ask for the reduce kernel.
    EXPECT_NE(error_of([] {
                  loom::gemm_ar_algo_across_nodes(ArAlgo::Auto, ArShots::TwoShot, 2, 4);
              }).find("the algorithm reduce-kernel runs within one node"),
              std::string::npos);
}

TEST(OverlapChoice, GemmRsTransport) {
    EXPECT_EQ(loom::gemm_rs_transport(RsTransport::Auto, RsAlgo::FusedEpilogue, false), RsTransport::CopyEngine);
    EXPECT_EQ(loom::gemm_rs_transport(RsTransport::Auto, RsAlgo::FusedEpilogue, true), RsTransport::Sm);
    EXPECT_EQ(loom::gemm_rs_transport(RsTransport::Auto, RsAlgo::ScatterReduce, false), RsTransport::Sm);
    EXPECT_EQ(loom::gemm_rs_transport(RsTransport::Sm, RsAlgo::FusedEpilogue, false), RsTransport::Sm);
    EXPECT_NE(error_of([] {
                  loom::gemm_rs_transport(RsTransport::CopyEngine, RsAlgo::FusedEpilogue, true);
              }).find("needs every rank on its own GPU"),
              std::string::npos);
    EXPECT_NE(error_of([] {
                  loom::gemm_rs_transport(RsTransport::CopyEngine, RsAlgo::ScatterReduce, false);
              }).find("is the fused epilogue's"),
              std::string::npos);
}

TEST(OverlapChoice, GemmRsByWaves) {
    // A GPU per rank, the fused epilogue planned: its own pushes within one wave, the sequence below three, then the
    // copy engine.
    auto is = [](loom::RsChoice c, RsAlgo a, RsTransport t) { return c.algo == a && c.transport == t; };
    EXPECT_TRUE(is(loom::gemm_rs_distinct_auto(1, 132), RsAlgo::FusedEpilogue, RsTransport::Sm));
    EXPECT_TRUE(is(loom::gemm_rs_distinct_auto(132, 132), RsAlgo::FusedEpilogue, RsTransport::Sm));
    EXPECT_TRUE(is(loom::gemm_rs_distinct_auto(133, 132), RsAlgo::Sequential, RsTransport::Auto));
    EXPECT_TRUE(is(loom::gemm_rs_distinct_auto(395, 132), RsAlgo::Sequential, RsTransport::Auto));
    EXPECT_TRUE(is(loom::gemm_rs_distinct_auto(396, 132), RsAlgo::FusedEpilogue, RsTransport::CopyEngine));
    EXPECT_TRUE(is(loom::gemm_rs_distinct_auto(1024, 132), RsAlgo::FusedEpilogue, RsTransport::CopyEngine));
    EXPECT_TRUE(is(loom::gemm_rs_distinct_auto(2, 0), RsAlgo::Sequential, RsTransport::Auto));  // SM count clamped to 1
}

TEST(OverlapChoice, GemmRsAlgo) {
    // Auto: the plan decides with a GPU per rank; where ranks share one, the fused pull when M / W is a multiple of 64
    // and K_loc x the input's bytes is at most 8 KiB, else the sequence.
    const int64_t kb = 2 * 2752;  // bf16, K_loc 2752 (M = 8192, K = 11008 at 4 ranks)
    EXPECT_EQ(loom::gemm_rs_algo(RsAlgo::Auto, false, nullptr, 1024, kb), RsAlgo::Auto);
    EXPECT_EQ(loom::gemm_rs_algo(RsAlgo::Auto, true, nullptr, 1024, kb), RsAlgo::FusedPull);
    EXPECT_EQ(loom::gemm_rs_algo(RsAlgo::Auto, true, nullptr, 192, kb), RsAlgo::FusedPull);
    EXPECT_EQ(loom::gemm_rs_algo(RsAlgo::Auto, true, nullptr, 136, kb), RsAlgo::Sequential);
    EXPECT_EQ(loom::gemm_rs_algo(RsAlgo::Auto, true, nullptr, 1024, 2 * 4096), RsAlgo::FusedPull);
    EXPECT_EQ(loom::gemm_rs_algo(RsAlgo::Auto, true, nullptr, 1024, 2 * 7168), RsAlgo::Sequential);  // bf16, deep K
    EXPECT_EQ(loom::gemm_rs_algo(RsAlgo::Auto, true, nullptr, 1024, 1 * 7168), RsAlgo::FusedPull);   // fp8
    EXPECT_EQ(loom::gemm_rs_algo(RsAlgo::Auto, false, nullptr, 1024, 2 * 7168), RsAlgo::Auto);       // a GPU per rank
    // A caller's tile decides between the two hooked algorithms, on a shared GPU too.
    loom::GemmConfig whole;
    whole.block_m = 128;
    whole.block_n = 256;
    whole.stages = 4;
    EXPECT_EQ(loom::gemm_rs_algo(RsAlgo::Auto, false, &whole, 1024, kb), RsAlgo::FusedEpilogue);
    EXPECT_EQ(loom::gemm_rs_algo(RsAlgo::Auto, true, &whole, 1024, 2 * 9216), RsAlgo::FusedPull);
    EXPECT_EQ(loom::gemm_rs_algo(RsAlgo::Auto, true, &whole, 136, kb), RsAlgo::ScatterReduce);
    EXPECT_EQ(loom::gemm_rs_algo(RsAlgo::Auto, false, &whole, 136, kb), RsAlgo::ScatterReduce);  // 136 % 128 != 0
    // Requested algorithms pass through; the sequence takes no config.
    EXPECT_EQ(loom::gemm_rs_algo(RsAlgo::FusedEpilogue, true, nullptr, 1024, kb), RsAlgo::FusedEpilogue);
    EXPECT_EQ(loom::gemm_rs_algo(RsAlgo::ScatterReduce, true, nullptr, 1024, kb), RsAlgo::ScatterReduce);
    EXPECT_EQ(loom::gemm_rs_algo(RsAlgo::Sequential, false, nullptr, 136, kb), RsAlgo::Sequential);
    EXPECT_NE(
        error_of([&] { loom::gemm_rs_algo(RsAlgo::Sequential, false, &whole, 1024, kb); }).find("expected no config"),
        std::string::npos);
    EXPECT_STREQ(loom::to_string(RsAlgo::Sequential), "sequential");
    EXPECT_STREQ(loom::to_string(RsAlgo::FusedPull), "fused-pull");
    // The fused pull's plan: the fused epilogue's tile, a 64-row one where only that fits M / W.
    EXPECT_EQ(loom::gemm_rs_plan(8192, 4096, 1376, 8, 0, 90, 14, RsAlgo::FusedPull).rs_algo, RsAlgo::FusedPull);
    EXPECT_EQ(loom::gemm_rs_plan(192 * 4, 512, 512, 4, 0, 90, 26, RsAlgo::FusedPull).gemm.block_m, 64);
}

TEST(OverlapChoice, GemmArAlgo) {
    using loom::ArShots;
    // Auto without a config: the plan decides (a GPU per rank or ranks sharing one).
    EXPECT_EQ(loom::gemm_ar_algo(ArAlgo::Auto, ArShots::Auto, nullptr, 2), ArAlgo::Auto);
    // A caller's tile decides between the two hooked algorithms, on a shared GPU too.
    loom::GemmConfig whole;
    whole.block_m = 64;
    whole.block_n = 128;
    whole.stages = 4;
    loom::GemmConfig odd = whole;
    odd.block_n = 96;  // 192 bytes of bf16 per row: no whole 128-byte slabs
    EXPECT_EQ(loom::gemm_ar_algo(ArAlgo::Auto, ArShots::Auto, &whole, 2), ArAlgo::FusedEpilogue);
    EXPECT_EQ(loom::gemm_ar_algo(ArAlgo::Auto, ArShots::Auto, &odd, 2), ArAlgo::ReduceKernel);
    EXPECT_EQ(loom::gemm_ar_algo(ArAlgo::Auto, ArShots::Auto, &odd, 4), ArAlgo::FusedEpilogue);  // 384 bytes of fp32
    // Requested algorithms pass through; the sequence takes no config; a requested reduction asks for the reduce
    // kernel, and only the reduce kernel takes one.
    EXPECT_EQ(loom::gemm_ar_algo(ArAlgo::ReduceKernel, ArShots::Auto, nullptr, 2), ArAlgo::ReduceKernel);
    EXPECT_EQ(loom::gemm_ar_algo(ArAlgo::FusedEpilogue, ArShots::Auto, nullptr, 2), ArAlgo::FusedEpilogue);
    EXPECT_EQ(loom::gemm_ar_algo(ArAlgo::Sequential, ArShots::Auto, nullptr, 2), ArAlgo::Sequential);
    EXPECT_EQ(loom::gemm_ar_algo(ArAlgo::Auto, ArShots::TwoShot, &whole, 2), ArAlgo::ReduceKernel);
    EXPECT_EQ(loom::gemm_ar_algo(ArAlgo::ReduceKernel, ArShots::OneShot, nullptr, 2), ArAlgo::ReduceKernel);
    EXPECT_NE(
        error_of([&] { loom::gemm_ar_algo(ArAlgo::Sequential, ArShots::Auto, &whole, 2); }).find("expected no config"),
        std::string::npos);
    EXPECT_NE(error_of([&] {
                  loom::gemm_ar_algo(ArAlgo::FusedEpilogue, ArShots::TwoShot, nullptr, 2);
              }).find("reduce kernel"),
              std::string::npos);
    EXPECT_NE(
        error_of([&] { loom::gemm_ar_algo(ArAlgo::Sequential, ArShots::OneShot, nullptr, 2); }).find("reduce kernel"),
        std::string::npos);
}

TEST(OverlapChoice, GemmArShots) {
    using loom::ArShots;
    // Auto: one-shot at 2 ranks (both move 3 units of C per rank) and up to kArTwoShotMinBytes, else two-shot.
    EXPECT_FALSE(loom::gemm_ar_two_shot(ArShots::Auto, 2, int64_t(1) << 30));
    EXPECT_FALSE(loom::gemm_ar_two_shot(ArShots::Auto, 4, loom::kArTwoShotMinBytes));
    EXPECT_TRUE(loom::gemm_ar_two_shot(ArShots::Auto, 4, loom::kArTwoShotMinBytes + 2));
    EXPECT_TRUE(loom::gemm_ar_two_shot(ArShots::TwoShot, 2, 2));
    EXPECT_FALSE(loom::gemm_ar_two_shot(ArShots::OneShot, 8, int64_t(1) << 30));
}

// gemm_ar's plan over M = 1..16K on the Qwen3-32B row-parallel shapes (hidden 5120; K_loc = 25600 / W for the MLP's
// down projection, 8192 / W for attention's output projection): every plan is feasible, its reduce blocks within the
// cap and leaving the GEMM most SMs, and the two-shot reduction where C is large at more than 2 ranks.
TEST(OverlapChoice, GemmArPlanGrid) {
    using loom::ArShots;
    for (int w : {2, 4, 8}) {
        for (bool shared : {false, true}) {
            const int sms = shared ? 132 / w : 132;
            for (int64_t k : {int64_t(25600) / w, int64_t(8192) / w}) {
                for (int64_t m : {1, 7, 16, 128, 129, 512, 1000, 2048, 4096, 8192, 16384}) {
                    const auto at = fmt::format("W={} shared={} M={} K={}", w, shared, m, k);
                    const loom::OverlapPlan p = loom::gemm_ar_plan(m, 5120, k, w, 0, 90, sms, ArAlgo::Auto, 2,
                                                                   loom::DType::BF16, ArShots::Auto, shared ? w : 1);
                    EXPECT_NE(p.ar_algo, ArAlgo::Auto) << at;
                    // Ranks sharing a GPU: the sequence at every M (the reduce kernel's sums hide next to nothing
                    // under the GEMMs there, GemmArCostShared).
                    if (shared) EXPECT_EQ(p.ar_algo, ArAlgo::Sequential) << at;
                    if (p.ar_algo == ArAlgo::ReduceKernel) {
                        EXPECT_GE(p.comm_blocks, 1) << at;
                        EXPECT_LE(p.comm_blocks, std::max(1, sms / 4)) << at;
                        EXPECT_EQ(p.ar_two_shot, w > 2 && m * 5120 * 2 > loom::kArTwoShotMinBytes) << at;
                    }
                    // A requested reduce kernel plans whatever Auto picked.
                    const loom::OverlapPlan r = loom::gemm_ar_plan(m, 5120, k, w, 0, 90, sms, ArAlgo::ReduceKernel, 2,
                                                                   loom::DType::BF16, ArShots::TwoShot, shared ? w : 1);
                    EXPECT_EQ(r.ar_algo, ArAlgo::ReduceKernel) << at;
                    EXPECT_TRUE(r.ar_two_shot) << at;
                    EXPECT_GE(r.gemm.grid, 1) << at;
                    const loom::ArCost c =
                        loom::gemm_ar_cost(m, 5120, k, w, sms, shared ? w : 1, 2, loom::DType::BF16, r.gemm, true, 0);
                    EXPECT_GT(c.sequence_us, 0) << at;
                    EXPECT_GT(c.overlap_us, 0) << at;
                    if (::testing::Test::HasFailure()) return;
                    if (std::getenv("LOOM_PRINT_AR_PLANS"))
                        fmt::print("{}: {} seq {:.1f} us overlap {:.1f} us ({} blocks)\n", at,
                                   loom::to_string(p.ar_algo), c.sequence_us, c.overlap_us, c.comm_blocks);
                }
            }
        }
    }
    // A GPU per rank, one wave of tiles: the fused epilogue (the decode shapes).
    EXPECT_EQ(loom::gemm_ar_plan(16, 8192, 3584, 2, 0, 90, 132).ar_algo, ArAlgo::FusedEpilogue);
    // The caller's comm_sms are the reduce kernel's blocks.
    EXPECT_EQ(loom::gemm_ar_plan(4096, 5120, 1600, 4, 6, 90, 132, ArAlgo::ReduceKernel).comm_blocks, 6);
}

// The reduce kernel's side blocks alone as measured with 4 ranks sharing one H200 (26 SMs each under MPS, N = 5120,
// bf16, 4 blocks; `bench-overlap --ops ar`, forced variants, before the full-grid launch after the GEMM): the model's
// shared block rate is at most what every point moved per block past its GEMM (the GEMM alone on 26 SMs: 2381 us at
// K_loc = 2048, 7457 at 6400, M = 16384, scaled to the 22 SMs left), and Auto runs the sequence at these shapes
// (measured 0.34-0.47x of it with the reduce kernel).
TEST(OverlapChoice, GemmArCostShared) {
    struct Point {
        int64_t m, k_loc;
        bool two_shot;
        double measured_us;
    };
    const int sms = 26, w = 4, blocks = 4;
    for (const Point pt :
         {Point{2048, 2048, true, 770}, Point{8192, 2048, true, 2928}, Point{16384, 2048, true, 7880},
          Point{16384, 6400, true, 14835}, Point{16384, 2048, false, 6548}, Point{16384, 6400, false, 14989}}) {
        const auto at = fmt::format("M={} K_loc={} two_shot={}", pt.m, pt.k_loc, pt.two_shot);
        const double gemm_alone = (pt.k_loc == 2048 ? 2381.0 : 7457.0) * static_cast<double>(pt.m) / 16384;
        const double past_gemm = pt.measured_us - gemm_alone * sms / (sms - blocks);
        const double traffic = (pt.two_shot ? 3.0 : w + 1.0) * static_cast<double>(pt.m) * 5120 * 2;
        EXPECT_LE(loom::kArReduceBlockBytesPerUsShared, traffic / past_gemm / blocks) << at;
        const loom::GemmConfig tile = loom::overlap::gemm_config(pt.m, 5120, pt.k_loc, 90, sms - blocks);
        const loom::ArCost c =
            loom::gemm_ar_cost(pt.m, 5120, pt.k_loc, w, sms, w, 2, loom::DType::BF16, tile, pt.two_shot, blocks);
        EXPECT_EQ(c.comm_blocks, blocks) << at;
        EXPECT_GT(c.overlap_us, c.sequence_us) << at;
        EXPECT_EQ(loom::gemm_ar_plan(pt.m, 5120, pt.k_loc, w, 0, 90, sms, ArAlgo::Auto, 2, loom::DType::BF16,
                                     loom::ArShots::Auto, w)
                      .ar_algo,
                  ArAlgo::Sequential)
            << at;
    }
}

}  // namespace
