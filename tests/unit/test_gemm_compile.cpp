// CPU tests of the GEMM: the heuristic's choices, input validation, and JIT compilation of the kernels for
// sm_90a / sm_80 without a GPU (no local-memory spills, small stack, HGMMA in the SASS when cuobjdump exists).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "loom/jit/jit.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/error.hpp"
#include "loom/tile/tile_order.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "ops/overlap/ag_gemm/ag_gemm.hpp"
#include "ops/overlap/gemm_rs/gemm_rs.hpp"

namespace {

using loom::DType;

// The heuristic planning with 2-CTA clusters (bench-gemm --heuristic-cluster 2).
loom::GemmConfig clustered2(int64_t m, int64_t n, int64_t k) {
    return loom::detail::gemm_heuristic_clustered(m, n, k, false, 90, 132, true, loom::GemmTiles::Plain, DType::BF16,
                                                  2);
}

TEST(GemmHeuristic, PicksWideTilesAndFitsSharedMemory) {
    const auto c = loom::gemm_heuristic(8192, 8192, 8192, false, 90, 132);
    EXPECT_FALSE(c.sm80);
    EXPECT_EQ(c.block_m, 128);
    EXPECT_EQ(c.block_n, 256);
    EXPECT_EQ(c.stages, 4);
    EXPECT_EQ(c.grid, 132);
    EXPECT_EQ(c.cluster_m, 1);  // clusters measured slower on the H200 (docs/perf/gemm_cluster2.json)
    EXPECT_EQ(clustered2(8192, 8192, 8192).cluster_m, 2);
    EXPECT_EQ(clustered2(8192, 8192, 8192).group_m % 2, 0);  // whole clusters in a raster group
    // gemm_heuristic is the clustered plan with its own choice: one CTA per tile for bf16.
    EXPECT_EQ(loom::detail::gemm_heuristic_clustered(8192, 8192, 8192, false, 90, 132, true, loom::GemmTiles::Plain,
                                                     DType::BF16, 1)
                  .str(),
              c.str());
    EXPECT_NO_THROW(loom::gemm_validate_config(c, false));
    // N = 1792: 7 x 256 columns leave a 4th wave of 52 tiles at 448 tiles; 224 fills 8 x 64 = 512 tiles in 4
    // waves: 4 x 224 / 0.98 beats the 52 tail tiles split 2 ways (3 + 1/2 + 0.1 waves of 256 columns)
    // (docs/perf/gemm.json, 8192 x 1792 x 4096).
    const auto n1792 = loom::gemm_heuristic(8192, 1792, 4096, false, 90, 132);
    EXPECT_EQ(n1792.block_m, 128);
    EXPECT_EQ(n1792.block_n, 224);
    EXPECT_EQ(n1792.tail_splits, 1);
    // Skinny M uses one consumer warpgroup.
    EXPECT_EQ(loom::gemm_heuristic(16, 4096, 4096, false, 90, 132).block_m, 64);
    // B as [K, N] restricts BLOCK_N to multiples of 64.
    for (int n : {1376, 1792, 3696, 520})
        EXPECT_EQ(loom::gemm_heuristic(8192, n, 4096, true, 90, 132).block_n % 64, 0) << n;
    EXPECT_TRUE(loom::gemm_heuristic(1024, 1024, 1024, false, 80, 108).sm80);
    EXPECT_FALSE(c.str().empty());
}

// Split-K tail, as the overlapped GEMMs plan (GemmTiles::Overlap: 128-row tiles): 8192 x 3840 x 8192 at 128 x 256
// has 64 x 15 = 960 tiles = 7 full waves + 36 on 132 SMs; the 36 split 3 ways (132 / 36 = 3, K = 128 k-blocks) cost
// 7 + 1/3 + 0.1 waves instead of 8. 8192^3: 2048 tiles leave a tail of 68, which 132 SMs cannot split twice: no
// split. (At N = 3696 the 128-row plan is 128 x 176 split 5: 21 x 176 = N, 1344 tiles = 10 waves + 24.)
TEST(GemmHeuristic, SplitsTheTailWave) {
    auto heuristic128 = [](int64_t m, int64_t n, int64_t k, bool b_kn, int sms, bool split = true) {
        return loom::gemm_heuristic(m, n, k, b_kn, 90, sms, split, loom::GemmTiles::Overlap);
    };
    const auto c = heuristic128(8192, 3840, 8192, false, 132);
    EXPECT_EQ(c.block_n, 256);
    EXPECT_EQ(c.grid, 132);
    EXPECT_EQ(c.tail_splits, 3);
    EXPECT_NE(c.str().find("tail3"), std::string::npos) << c.str();
    EXPECT_NO_THROW(loom::gemm_validate_config(c, false));
    EXPECT_EQ(loom::gemm_heuristic(8192, 8192, 8192, false, 90, 132).tail_splits, 1);
    EXPECT_EQ(loom::gemm_heuristic(8192, 8192, 8192, false, 90, 132).str().find("tail"), std::string::npos);
    // Exact waves: 4096^3 at 128 x 256 is 512 tiles = 3 x 132 + 116: 132 / 116 = 1, no split.
    EXPECT_EQ(loom::gemm_heuristic(4096, 4096, 4096, false, 90, 132).tail_splits, 1);
    // Too few k-blocks to split (K = 256: 4 k-blocks, at most 4 / 4 = 1 split).
    EXPECT_EQ(loom::gemm_heuristic(8192, 3840, 256, false, 90, 132).tail_splits, 1);
    // B as [K, N] too.
    EXPECT_EQ(heuristic128(8192, 3840, 8192, true, 132).tail_splits, 3);
    // Off when asked (gemm_rs / gemm_ar: their hooks publish every tile) and with clusters.
    EXPECT_EQ(heuristic128(8192, 3840, 8192, false, 132, /*split=*/false).tail_splits, 1);
    EXPECT_EQ(clustered2(8192, 3840, 8192).tail_splits, 1);
    for (int sms : {132, 114, 14}) {
        const auto plan = loom::gemm_rs_plan(8192, 3840, 8192, 8, 0, 90, sms);
        EXPECT_EQ(plan.gemm.tail_splits, 1) << sms;
        // ag_gemm's hooks (wait before loads, redirect A) take the split tail: the plain GEMM's plan on its SMs.
        const auto ag = loom::ag_gemm_plan(8192, 3840, 8192, 8, loom::AgProducer::CopyEngine, 0, 90, sms);
        const auto plain = heuristic128(8192, 3840, 8192, false, sms);
        EXPECT_EQ(ag.gemm.tail_splits, plain.tail_splits) << sms;
        EXPECT_EQ(ag.gemm.block_n, plain.block_n) << sms;
        EXPECT_EQ(ag.gemm.grid, plain.grid) << sms;
    }
    EXPECT_EQ(loom::ag_gemm_plan(8192, 3840, 8192, 8, loom::AgProducer::CopyEngine, 0, 90, 132).gemm.tail_splits, 3);
    // Fewer tiles than SMs: the one partial wave is the tail, every tile split so that the units fill the SMs (a skinny
    // GEMM's B read by every SM), where the wave is at most a third full or K is long (docs/perf/gemm_skinny.json).
    for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{16, 4096, 14336},
                                  {16, 2048, 4096},
                                  {16, 1280, 8192},
                                  {128, 1024, 4096}}) {
        const auto c = loom::gemm_heuristic(m, n, k, false, 90, 132);
        const int64_t tiles = (m + c.block_m - 1) / c.block_m * ((n + c.block_n - 1) / c.block_n);
        EXPECT_GE(c.tail_splits, 2) << c.str();
        EXPECT_EQ(c.grid, std::min<int64_t>(132, tiles * c.tail_splits)) << c.str();
        EXPECT_GT(c.grid, tiles) << c.str();
        EXPECT_NO_THROW(loom::gemm_validate_config(c, false));
        // The launch sees the same plan at that grid: every tile is tail.
        const auto p = loom::gemm_tail_plan(m, n, k, c, c.grid, c.tail_splits);
        EXPECT_EQ(p.dp_tiles, 0) << c.str();
        EXPECT_EQ(p.splits, c.tail_splits) << c.str();
    }
    // Without the split tail (split_tail = false) and in the overlapped GEMMs' plans the persistent 128-row plan stays:
    // the decode plan (GemmHeuristic.DecodePlan* below) is loom::gemm's, with the split tail allowed.
    EXPECT_EQ(loom::gemm_heuristic(128, 4096, 4096, false, 90, 132, false, loom::GemmTiles::Overlap).block_m, 128);
    const auto fp8_128 =
        loom::gemm_heuristic(128, 4096, 14336, false, 90, 132, false, loom::GemmTiles::Plain, DType::F8E4M3);
    EXPECT_EQ(fp8_128.block_m, 128) << fp8_128.str();  // no split asked for: the persistent 128 x 64 plan
    EXPECT_EQ(fp8_128.tail_splits, 1) << fp8_128.str();
    // The ring depth: as deep as shared memory allows up to kGemmPlanMaxStages; the large tiles keep what fits.
    EXPECT_EQ(loom::kernels::gemm_sm90_plan_stages(64, 64), 12);
    EXPECT_EQ(loom::kernels::gemm_sm90_plan_stages(128, 64), 8);
    EXPECT_EQ(loom::kernels::gemm_sm90_plan_stages(64, 128), 8);
    EXPECT_EQ(loom::kernels::gemm_sm90_plan_stages(128, 128), 6);
    EXPECT_EQ(loom::kernels::gemm_sm90_plan_stages(128, 256), 4);
    EXPECT_EQ(loom::gemm_heuristic(128, 8192, 14336, false, 90, 132).stages, 8);
    EXPECT_EQ(loom::gemm_heuristic(8192, 8192, 8192, false, 90, 132).stages, 4);
    for (int bm : {64, 128, 192})
        for (int bn = 16; bn <= 256; bn += 16)
            EXPECT_LE(loom::kernels::gemm_sm90_smem_bytes(bm, bn, loom::kernels::gemm_sm90_plan_stages(bm, bn)),
                      loom::kernels::kGemmSm90MaxSmem)
                << bm << " x " << bn;
}

// The plain GEMM's tiles on the odd-N shapes (docs/perf/gemm_sweep.json): N = 3696 as 43 x 21 = 903 tiles of
// 192 x 176 (6.84 waves, three consumer warpgroups) instead of 960 of 128 x 256 split 3 ways; N = 1376 as 64 x 8 = 512
// of 128 x 176 (3.88 waves; 192 x 160, 387 tiles in 2.93 waves, costs 1 % more by the model) instead of 384 of
// 128 x 256, 11 % of them past N. 192-row tiles never for M <= 128, never wider than kGemmMaxBlockN192, never in the
// overlapped GEMMs.
TEST(GemmHeuristic, TakesThreeConsumerTiles) {
    const auto n3696 = loom::gemm_heuristic(8192, 3696, 8192, false, 90, 132);
    EXPECT_EQ(n3696.block_m, 192);
    EXPECT_EQ(n3696.block_n, 176);
    EXPECT_EQ(n3696.consumers(), 3);
    EXPECT_EQ(n3696.stages, 4);
    EXPECT_EQ(n3696.tail_splits, 1);
    EXPECT_EQ(n3696.str().find("tail"), std::string::npos) << n3696.str();
    const auto n1376 = loom::gemm_heuristic(8192, 1376, 4096, false, 90, 132);
    EXPECT_EQ(n1376.block_m, 128);
    EXPECT_EQ(n1376.block_n, 176);
    for (const auto& c : {n1376, n3696}) EXPECT_NO_THROW(loom::gemm_validate_config(c, false)) << c.str();
    for (int64_t m : {1, 64, 100, 128}) EXPECT_LE(loom::gemm_heuristic(m, 1376, 4096, false, 90, 132).block_m, 128);
    for (int n : {1376, 1792, 3696, 520, 8192}) {
        for (bool b_kn : {false, true}) {
            const auto c = loom::gemm_heuristic(8192, n, 4096, b_kn, 90, 132);
            if (c.block_m == 192) EXPECT_LE(c.block_n, loom::kGemmMaxBlockN192) << c.str();
            EXPECT_NO_THROW(loom::gemm_validate_config(c, b_kn)) << c.str();
        }
    }
    EXPECT_EQ(loom::gemm_heuristic(8192, 1376, 4096, false, 90, 132, true, loom::GemmTiles::Overlap).block_m, 128);
    EXPECT_EQ(loom::ag_gemm_plan(8192, 1376, 4096, 8, loom::AgProducer::CopyEngine, 0, 90, 132).gemm.block_m, 128);
    EXPECT_EQ(loom::gemm_rs_plan(8192, 1376, 4096, 8, 0, 90, 132).gemm.block_m, 128);
}

// The overlapped GEMMs weigh 128-row tiles as the plain GEMM does: where the plain heuristic keeps 128 rows,
// ag_gemm's copy-engine plan on all SMs is the same config. At W = 2, N_loc = 5504 that is 128 x 240 with a split
// tail (not 128 x 256: 22 N-blocks, the last half empty).
TEST(GemmHeuristic, OverlapTilesAreThePlainOnesOf128Rows) {
    const int64_t shapes[][2] = {{11008, 4096}, {14336, 4096}, {28672, 8192}, {53248, 16384}, {29568, 8192}};
    int compared = 0;
    for (int w : {2, 4, 8}) {
        for (const auto& s : shapes) {
            const int64_t n_loc = s[0] / w, k = s[1];
            const auto plain = loom::gemm_heuristic(8192, n_loc, k, false, 90, 132);
            const auto ag = loom::ag_gemm_plan(8192, n_loc, k, w, loom::AgProducer::CopyEngine, 0, 90, 132).gemm;
            EXPECT_EQ(ag.block_m, 128) << ag.str();
            if (plain.block_m != 128) continue;
            ++compared;
            EXPECT_EQ(ag.block_n, plain.block_n) << w << " " << n_loc << ": " << ag.str() << " vs " << plain.str();
            EXPECT_EQ(ag.tail_splits, plain.tail_splits) << ag.str() << " vs " << plain.str();
            EXPECT_EQ(ag.grid, plain.grid) << ag.str() << " vs " << plain.str();
        }
    }
    EXPECT_EQ(compared, 14);  // all but N_loc = 3696 at W = 8 (plain: 192 x 176)
    const auto w2 = loom::ag_gemm_plan(8192, 5504, 4096, 2, loom::AgProducer::CopyEngine, 0, 90, 132).gemm;
    EXPECT_EQ(w2.block_n, 240) << w2.str();
    EXPECT_GT(w2.tail_splits, 1) << w2.str();
}

// Decode GEMMs (M <= 128, src/ops/gemm/decode_plan.cpp) on 132 SMs. Where the persistent plan leaves half the SMs
// idle (N = 3072 / 4096: 48 or 64 tiles of 64 x 64, each streaming a deep K) the decode plan splits K so that the
// units fill at least 88 % of the SMs (e.g. 43 tiles of 64 x 96 split 3 ways: 129 CTAs), every tile split, and the
// model costs it at most 0.9 of the 64 CTAs.
TEST(GemmHeuristic, DecodePlanStreamsOnEverySm) {
    for (DType in : {DType::BF16, DType::F8E4M3})
        for (int64_t m : {1, 16, 32, 64})
            for (int64_t n : {3072, 4096})
                for (int64_t k : {8192, 16384}) {
                    const auto c = loom::gemm_heuristic(m, n, k, false, 90, 132, true, loom::GemmTiles::Plain, in);
                    const std::string at = fmt::format("{}x{}x{} {}: {}", m, n, k, loom::dtype_name(in), c.str());
                    EXPECT_EQ(c.block_m, 64) << at;
                    EXPECT_GE(c.tail_splits, 2) << at;
                    EXPECT_GE(c.grid, 116) << at;
                    const auto p = loom::gemm_tail_plan(m, n, k, c, c.grid, c.tail_splits);
                    EXPECT_EQ(p.dp_tiles, 0) << at;
                    EXPECT_EQ(p.splits, c.tail_splits) << at;
                    EXPECT_GE(p.units(), c.grid) << at;
                    EXPECT_NO_THROW(loom::gemm_validate_config(c, false, in)) << at;
                    loom::GemmConfig half = c;
                    half.block_n = 64;
                    half.tail_splits = 1;
                    loom::detail::gemm_complete_config(half, m, n, 132);
                    EXPECT_LE(half.grid, 64) << at;
                    EXPECT_LT(loom::gemm_decode_cost_us(m, n, k, c, 132),
                              0.9 * loom::gemm_decode_cost_us(m, n, k, half, 132))
                        << at;
                }
}

// Where 64 x 64 tiles already fill the SMs (N = 8192: 128 tiles) the persistent plan stays (docs/perf/
// gemm_skinny.json: 1.02x and 1.00x cuBLASLt), and at M = 128 the 128 x 64 one (its 8 stages).
TEST(GemmHeuristic, DecodePlanKeepsFullWaves) {
    for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{16, 8192, 14336}, {64, 8192, 4096}}) {
        const auto c = loom::gemm_heuristic(m, n, k, false, 90, 132);
        EXPECT_EQ(c.block_n, 64) << c.str();
        EXPECT_EQ(c.tail_splits, 1) << c.str();
        EXPECT_EQ(c.grid, 128) << c.str();
        EXPECT_EQ(c.stages, loom::kernels::kGemmPlanMaxStages) << c.str();
    }
    const auto m128 = loom::gemm_heuristic(128, 8192, 14336, false, 90, 132);
    EXPECT_EQ(m128.block_m, 128) << m128.str();
    EXPECT_EQ(m128.block_n, 64) << m128.str();
    EXPECT_EQ(m128.tail_splits, 1) << m128.str();
}

// The decode plan over the grid bench-gemm --decode measures (and B as [K, N]): configs the kernel takes, whose split
// the launch runs as planned, never costlier by the model than the persistent plan (the same call without decode
// candidates is not reachable here, so: than whole 64- / 128-row tiles of the persistent grid at BLOCK_N 64).
TEST(GemmHeuristic, DecodePlanOverTheGrid) {
    for (DType in : {DType::BF16, DType::F8E4M3})
        for (bool b_kn : {false, true}) {
            if (b_kn && in == DType::F8E4M3) continue;  // fp8 takes B as [N, K] only
            for (int64_t m : {1, 8, 16, 32, 64, 100, 128})
                for (int64_t n : {1024, 4096, 8192, 16384, 32768})
                    for (int64_t k : {1024, 4096, 8192, 16384})
                        for (int sms : {132, 66, 26}) {
                            const auto c =
                                loom::gemm_heuristic(m, n, k, b_kn, 90, sms, true, loom::GemmTiles::Plain, in);
                            const std::string at = fmt::format("{}x{}x{} {} b_kn {} {} SMs: {}", m, n, k,
                                                               loom::dtype_name(in), b_kn, sms, c.str());
                            EXPECT_NO_THROW(loom::gemm_validate_config(c, b_kn, in)) << at;
                            EXPECT_LE(c.grid, sms) << at;
                            if (b_kn) EXPECT_EQ(c.block_n % 64, 0) << at;
                            if (c.tail_splits >= 2) {
                                EXPECT_EQ(loom::gemm_tail_plan(m, n, k, c, c.grid, c.tail_splits).splits, c.tail_splits)
                                    << at;
                            }
                            loom::GemmConfig plain = c;
                            plain.block_m = m <= 64 ? 64 : 128;
                            plain.block_n = 64;
                            plain.tail_splits = 1;
                            loom::detail::gemm_complete_config(plain, m, n, sms);
                            EXPECT_LE(loom::gemm_decode_cost_us(m, n, k, c, sms),
                                      loom::gemm_decode_cost_us(m, n, k, plain, sms) * 1.03)
                                << at;
                        }
        }
}

TEST(GemmHeuristic, TailPlan) {
    loom::GemmConfig c;  // 128 x 256
    auto p = loom::gemm_tail_plan(8192, 3696, 8192, c, 132, 0);
    EXPECT_EQ(p.tiles, 960);
    EXPECT_EQ(p.dp_tiles, 924);
    EXPECT_EQ(p.tail_tiles, 36);
    EXPECT_EQ(p.splits, 3);
    EXPECT_EQ(p.units(), 924 + 108);
    // Forced: any count >= 2, capped at the k-blocks; 1 is off; no tail, nothing to split.
    EXPECT_EQ(loom::gemm_tail_plan(8192, 3696, 8192, c, 132, 8).splits, 8);
    EXPECT_EQ(loom::gemm_tail_plan(8192, 3696, 256, c, 132, 8).splits, 4);
    p = loom::gemm_tail_plan(8192, 3696, 8192, c, 132, 1);
    EXPECT_EQ(p.splits, 1);
    EXPECT_EQ(p.dp_tiles, 960);
    EXPECT_EQ(p.tail_tiles, 0);
    EXPECT_EQ(loom::gemm_tail_plan(8192, 8192, 8192, c, 128, 4).splits, 1);  // 2048 = 16 x 128
    // A grid larger than the tiles: no whole tiles, every tile split (1000 x 1000: 8 x 4 = 32 tiles).
    p = loom::gemm_tail_plan(1000, 1000, 2000, c, 132, 0);
    EXPECT_EQ(p.dp_tiles, 0);
    EXPECT_EQ(p.tail_tiles, 32);
    EXPECT_EQ(p.splits, 4);  // min(132 / 32, 32 k-blocks / 4)
    // A small forced grid: 32 tiles on 12 CTAs = 24 whole + 8 split.
    p = loom::gemm_tail_plan(1000, 1000, 2000, c, 12, 3);
    EXPECT_EQ(p.dp_tiles, 24);
    EXPECT_EQ(p.tail_tiles, 8);
    EXPECT_EQ(p.splits, 3);
    c.cluster_m = 2;
    EXPECT_EQ(loom::gemm_tail_plan(8192, 3696, 8192, c, 132, 0).splits, 1);
    // Validation.
    loom::GemmConfig v;
    v.tail_splits = 0;
    EXPECT_THROW(loom::gemm_validate_config(v, false), loom::Error);
    v.tail_splits = 3;
    EXPECT_NO_THROW(loom::gemm_validate_config(v, false));
    v.cluster_m = 2;
    EXPECT_THROW(loom::gemm_validate_config(v, false), loom::Error);
    v.cluster_m = 1;
    EXPECT_THROW(loom::gemm_kernel_spec(v, DType::BF16, DType::BF16, DType::F32, false,
                                        "loom::kernels::overlap::TileNotifyHooks", "loom/kernels/overlap/gemm_rs.cuh"),
                 loom::Error);
}

// The work units as the kernel's CTAs walk them (tile_order.hpp: split_tail_unit): every (tile, k-block) exactly
// once, whole tiles first, each tail tile's splits contiguous in K, in split order, none empty.
TEST(GemmHeuristic, SplitTailUnitsCoverEveryKBlockOnce) {
    const struct {
        int tiles, grid, splits, kblocks;
    } cases[] = {{960, 132, 3, 128}, {32, 12, 3, 32}, {32, 132, 4, 32}, {7, 3, 2, 5}, {100, 33, 8, 8}, {5, 4, 3, 7}};
    for (const auto& cs : cases) {
        SCOPED_TRACE(testing::Message() << cs.tiles << " tiles, grid " << cs.grid << ", " << cs.splits << " splits, "
                                        << cs.kblocks << " k-blocks");
        const int dp = cs.tiles / cs.grid * cs.grid;
        const int units = loom::tile::split_tail_units(cs.tiles, dp, cs.splits);
        EXPECT_EQ(units, dp + (cs.tiles - dp) * cs.splits);
        std::vector<int> seen(size_t(cs.tiles) * cs.kblocks, 0);
        std::vector<int> next_kb(cs.tiles, 0), next_split(cs.tiles, 0);
        for (int b = 0; b < cs.grid; ++b) {
            for (int u = b; u < units; u += cs.grid) {
                const auto w = loom::tile::split_tail_unit(u, dp, cs.splits, cs.kblocks);
                ASSERT_GE(w.linear, 0);
                ASSERT_LT(w.linear, cs.tiles);
                EXPECT_EQ(w.split >= 0, w.linear >= dp);
                EXPECT_GE(w.kb_count, 1);
                for (int kb = w.kb_begin; kb < w.kb_begin + w.kb_count; ++kb)
                    ++seen[size_t(w.linear) * cs.kblocks + kb];
            }
        }
        for (int u = dp; u < units; ++u) {  // in unit order: splits 0..s-1 of a tile, adjacent in K
            const auto w = loom::tile::split_tail_unit(u, dp, cs.splits, cs.kblocks);
            EXPECT_EQ(w.split, next_split[w.linear]++);
            EXPECT_EQ(w.kb_begin, next_kb[w.linear]);
            next_kb[w.linear] = w.kb_begin + w.kb_count;
        }
        for (size_t i = 0; i < seen.size(); ++i)
            ASSERT_EQ(seen[i], 1) << "tile " << i / cs.kblocks << " k-block " << i % cs.kblocks;
    }
}

TEST(GemmHeuristic, RejectsBadConfigs) {
    loom::GemmConfig c;
    c.block_n = 72;
    EXPECT_THROW(loom::gemm_validate_config(c, false), loom::Error);
    c.block_n = 224;
    EXPECT_THROW(loom::gemm_validate_config(c, true), loom::Error);  // [K, N] B needs multiples of 64
    c.block_n = 256;
    c.stages = 6;  // 6 x 48 KiB > 227 KiB
    EXPECT_THROW(loom::gemm_validate_config(c, false), loom::Error);
    c.stages = 4;
    c.block_m = 96;
    EXPECT_THROW(loom::gemm_validate_config(c, false), loom::Error);
    c.block_m = 192;  // three consumer warpgroups: block_n <= 176, single-CTA
    c.block_n = 192;
    EXPECT_THROW(loom::gemm_validate_config(c, false), loom::Error);
    c.block_n = 176;
    EXPECT_NO_THROW(loom::gemm_validate_config(c, false));
    c.cluster_m = 2;
    EXPECT_THROW(loom::gemm_validate_config(c, false), loom::Error);
}

// K-clusters (GemmConfig::cluster_k): the sizes the kernel takes, alone (no M-clusters, no split tail), with the tile's
// fragments divided among the ranks and the partial fitting the ring; one cluster per tile.
TEST(GemmHeuristic, ClusterKConfigs) {
    loom::GemmConfig c;
    c.block_m = 128;
    c.block_n = 64;
    c.stages = 8;
    c.tma_store = false;
    for (int s : {2, 4, 8}) {
        c.cluster_k = s;
        EXPECT_NO_THROW(loom::gemm_validate_config(c, false)) << c.str();
        EXPECT_NE(c.str().find(fmt::format("ksplit{}", s)), std::string::npos) << c.str();
        // 1024 x 1000 outputs of 128 x 64 tiles: 8 x 16 tiles, one cluster of s CTAs each.
        EXPECT_EQ(loom::gemm_sm90_grid(1024, 1000, c, 132), 8 * 16 * s);
        EXPECT_EQ(loom::gemm_tail_plan(1024, 1000, 4096, c, 132, 0).splits, 1);  // no split tail with K-clusters
    }
    auto rejects = [](loom::GemmConfig bad, const char* what) {
        try {
            loom::gemm_validate_config(bad, false);
            ADD_FAILURE() << "accepted " << bad.str();
        } catch (const loom::Error& e) {
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
    };
    loom::GemmConfig bad = c;
    bad.cluster_k = 3;
    rejects(bad, "expected cluster_k 1, 2, 4 or 8, given 3");
    bad = c;
    bad.cluster_k = 2;
    bad.cluster_m = 2;
    rejects(bad, "cluster_k 2 expects cluster_m 1 and tail_splits 1");
    bad = c;
    bad.cluster_k = 2;
    bad.tail_splits = 3;
    rejects(bad, "cluster_k 2 expects cluster_m 1 and tail_splits 1");
    bad = c;
    bad.block_n = 48;  // 6 fragments: not divisible by 4
    bad.cluster_k = 4;
    rejects(bad, "expected block_n a multiple of 32, given 48");
    bad = c;
    bad.block_m = 192;
    bad.block_n = 176;
    bad.stages = 2;  // 2 x 46 KiB + 24 KiB of staging < the 132 KiB partial
    bad.cluster_k = 2;
    rejects(bad, "expected stages >= 3, given 2");
    bad = c;
    bad.cluster_k = 4;
    bad.grid = 6;
    rejects(bad, "a multiple of the cluster size 4, given 6");
    // The kernel specs: the direct-store instantiation with CLUSTER_K last, and only without hooks.
    const auto spec = loom::gemm_kernel_spec(c, DType::BF16, DType::BF16, DType::F32, false);
    ASSERT_GE(spec.template_args.size(), 12u);
    EXPECT_EQ(spec.template_args[8], "false");   // kTmaStoreEpilogue
    EXPECT_EQ(spec.template_args[10], "false");  // kSplitTail
    EXPECT_EQ(spec.template_args[11], "8");      // CLUSTER_K (c.cluster_k from the loop above)
    EXPECT_THROW(
        loom::gemm_kernel_spec(c, DType::BF16, DType::BF16, DType::F32, false, "loom::kernels::overlap::AgGemmHooks"),
        loom::Error);
    EXPECT_FALSE(loom::gemm_plain_epilogue(c, DType::BF16));
    const loom::GemmConfig back = loom::gemm_config_from_json(loom::gemm_config_to_json(c));
    EXPECT_EQ(back.cluster_k, 8);
    EXPECT_EQ(loom::gemm_config_from_json(
                  R"({"block_m":128,"block_n":64,"block_k":64,"stages":8,"cluster_m":1,"group_m":8,"grid":0,)"
                  R"("tail_splits":1,"tma_store":true,"sm80":false})")
                  .cluster_k,
              1);  // a persisted winner without the field
}

// The decode plan weighs K-clusters where few tiles leave SMs idle, on a whole GPU only, each a config the kernel
// takes in one wave; it does not choose them (measured, its model does not rank them).
TEST(GemmHeuristic, DecodePlanWeighsClusterK) {
    for (const auto& [m, n, k] :
         {std::tuple<int64_t, int64_t, int64_t>{128, 1024, 4096}, {16, 1024, 16384}, {64, 4096, 1024}}) {
        const loom::GemmConfig persistent =
            loom::gemm_heuristic(m, n, k, false, 90, 132, false, loom::GemmTiles::Plain, DType::BF16);
        int weighed = 0;
        for (const auto& cand : loom::gemm_decode_candidates(m, n, k, false, 132, persistent)) {
            if (cand.config.cluster_k == 1) continue;
            ++weighed;
            const loom::GemmConfig& c = cand.config;
            EXPECT_NO_THROW(loom::gemm_validate_config(c, false)) << c.str();
            EXPECT_LE(c.grid, 132) << c.str();
            EXPECT_EQ(c.grid, loom::gemm_sm90_grid(m, n, c, 132)) << c.str();
            EXPECT_GE((k + c.block_k - 1) / c.block_k, 2 * c.cluster_k) << c.str();
            EXPECT_TRUE(std::isfinite(cand.cost_us) && cand.cost_us > 0) << c.str();
        }
        EXPECT_GT(weighed, 0) << m << "x" << n << "x" << k;
        EXPECT_EQ(loom::gemm_heuristic(m, n, k, false, 90, 132, true, loom::GemmTiles::Plain, DType::BF16).cluster_k,
                  1);
        for (const auto& cand : loom::gemm_decode_candidates(m, n, k, false, 26, persistent))
            EXPECT_EQ(cand.config.cluster_k, 1) << "26 SMs: " << cand.config.str();
    }
}

// The decode plan weighs M-clusters (64-row tiles in 2-CTA clusters sharing B) for 64 < M <= 128 on a whole GPU,
// whole tiles on an even persistent grid; it does not choose them (measured slower at 43 of 44 shapes).
TEST(GemmHeuristic, DecodePlanWeighsClusterM) {
    for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{128, 8192, 4096},
                                  {72, 1024, 1024},
                                  {100, 32768, 16384},
                                  {64, 4096, 4096},
                                  {16, 4096, 4096}}) {
        const loom::GemmConfig persistent =
            loom::gemm_heuristic(m, n, k, false, 90, 132, false, loom::GemmTiles::Plain, DType::BF16);
        int weighed = 0;
        for (const auto& cand : loom::gemm_decode_candidates(m, n, k, false, 132, persistent)) {
            if (cand.config.cluster_m == 1) continue;
            ++weighed;
            const loom::GemmConfig& c = cand.config;
            EXPECT_NO_THROW(loom::gemm_validate_config(c, false)) << c.str();
            EXPECT_EQ(c.block_m, 64) << c.str();
            EXPECT_EQ(c.cluster_m, 2) << c.str();
            EXPECT_EQ(c.tail_splits, 1) << c.str();
            EXPECT_EQ(c.grid % 2, 0) << c.str();
            EXPECT_LE(c.grid, 132) << c.str();
            EXPECT_TRUE(std::isfinite(cand.cost_us) && cand.cost_us > 0) << c.str();
        }
        EXPECT_EQ(weighed > 0, m > 64) << m << "x" << n << "x" << k;
        EXPECT_EQ(loom::gemm_heuristic(m, n, k, false, 90, 132, true, loom::GemmTiles::Plain, DType::BF16).cluster_m,
                  1);
        for (const auto& cand : loom::gemm_decode_candidates(m, n, k, false, 26, persistent))
            EXPECT_EQ(cand.config.cluster_m, 1) << "26 SMs: " << cand.config.str();
    }
}

TEST(GemmValidate, NamesTheProblem) {
    alignas(16) static char buf[1 << 16];
    loom::MatrixView a{buf, DType::BF16, 64, 64, 0}, b{buf, DType::BF16, 64, 64, 0}, c{buf, DType::BF16, 64, 64, 0};
    EXPECT_NO_THROW(loom::gemm_validate(a, b, c, {}));
    loom::MatrixView bad_k{buf, DType::BF16, 64, 60, 0};
    EXPECT_THROW(loom::gemm_validate(a, bad_k, c, {}), loom::Error);
    loom::MatrixView f8{buf, DType::F8E4M3, 64, 64, 0};
    EXPECT_THROW(loom::gemm_validate(f8, b, c, {}), loom::Error);
    loom::MatrixView mis{buf + 2, DType::BF16, 64, 64, 0};
    EXPECT_THROW(loom::gemm_validate(mis, b, c, {}), loom::Error);
    loom::MatrixView ld{buf, DType::BF16, 64, 64, 68};  // 136-byte rows: not a multiple of 16
    EXPECT_THROW(loom::gemm_validate(ld, b, c, {}), loom::Error);
    loom::GemmOptions o;
    o.bias = loom::BufferView{buf, DType::F32, 63};
    EXPECT_THROW(loom::gemm_validate(a, b, c, o), loom::Error);
}

// fp8 e4m3: accepted where gemm_validate allows it (loom::gemm and the overlapped ops), B as
// [N, K], K a multiple of 16, both operands e4m3; configs carry 128-element k-blocks, and the split tail counts those.
// Device scales: device memory, 4-byte aligned.
TEST(GemmValidate, Fp8Inputs) {
    alignas(16) static char buf[1 << 16];
    loom::MatrixView a{buf, DType::F8E4M3, 64, 64, 0}, b{buf, DType::F8E4M3, 64, 64, 0};
    loom::MatrixView c{buf, DType::BF16, 64, 64, 0};
    EXPECT_NO_THROW(loom::gemm_validate(a, b, c, {}, /*allow_f8=*/true));
    EXPECT_THROW(loom::gemm_validate(a, b, c, {}), loom::Error);  // the overlapped ops' call
    loom::GemmOptions kn;
    kn.b_kn = true;
    EXPECT_THROW(loom::gemm_validate(a, b, c, kn, true), loom::Error);
    loom::MatrixView a24{buf, DType::F8E4M3, 64, 24, 32}, b24{buf, DType::F8E4M3, 64, 24, 32};
    EXPECT_THROW(loom::gemm_validate(a24, b24, c, {}, true), loom::Error);  // K = 24: rows of 24 bytes
    loom::MatrixView b16{buf, DType::BF16, 64, 64, 0};
    EXPECT_THROW(loom::gemm_validate(a, b16, c, {}, true), loom::Error);
    loom::MatrixView c8{buf, DType::F8E4M3, 64, 64, 0};
    EXPECT_THROW(loom::gemm_validate(a, b, c8, {}, true), loom::Error);  // fp8 output is not offered
    float host_scale = 1.f;
    loom::GemmOptions host_ptr;
    host_ptr.scale_b = &host_scale;  // a device scale in host memory (or no GPU to ask)
    EXPECT_THROW(loom::gemm_validate(a, b, c, host_ptr, true), loom::Error);
    loom::GemmOptions odd;
    odd.scale_a = reinterpret_cast<const float*>(reinterpret_cast<std::uintptr_t>(buf) + 2);
    EXPECT_THROW(loom::gemm_validate(a, b, c, odd, true), loom::Error);  // not 4-byte aligned

    const auto cfg =
        loom::gemm_heuristic(8192, 8192, 8192, false, 90, 132, true, loom::GemmTiles::Plain, DType::F8E4M3);
    EXPECT_EQ(cfg.block_k, 128);
    EXPECT_EQ(cfg.block_m, 128);
    EXPECT_EQ(cfg.block_n, 256);
    EXPECT_EQ(cfg.cluster_m, 2);  // fp8 takes 2-CTA clusters where M has two M-blocks
    EXPECT_EQ(cfg.tail_splits, 1);
    EXPECT_NE(cfg.str().find("128x256x128"), std::string::npos) << cfg.str();
    const auto skinny =
        loom::gemm_heuristic(128, 8192, 4096, false, 90, 132, true, loom::GemmTiles::Plain, DType::F8E4M3);
    EXPECT_EQ(skinny.cluster_m, 1) << skinny.str();
    // On an MPS share (4 ranks on one H200: 26 SMs) the clusters ran 1.8x slower than single-CTA tiles.
    const auto share =
        loom::gemm_heuristic(8192, 5504, 4096, false, 90, 26, true, loom::GemmTiles::Plain, DType::F8E4M3);
    EXPECT_EQ(share.cluster_m, 1) << share.str();
    EXPECT_EQ(skinny.block_k, 128);
    EXPECT_NO_THROW(loom::gemm_validate_config(cfg, false, DType::F8E4M3));
    EXPECT_THROW(loom::gemm_validate_config(cfg, false, DType::BF16), loom::Error);
    EXPECT_THROW(loom::gemm_validate_config(loom::GemmConfig{}, false, DType::F8E4M3), loom::Error);
    // The split tail's cap is the k-blocks: K = 256 is 2 of 128 elements (4 of 64 for bf16).
    loom::GemmConfig single = cfg;  // the split tail is for single-CTA tiles
    single.cluster_m = 1;
    EXPECT_EQ(loom::gemm_tail_plan(8192, 3696, 256, single, 132, 8).splits, 2);
    EXPECT_EQ(loom::gemm_tail_plan(8192, 3696, 256, loom::GemmConfig{}, 132, 8).splits, 4);
}

// The autotuner's candidates: the heuristic first, every one valid and distinct, the tile classes bench-gemm --sweep
// times (192-row tiles only where M > 128, 64-row ones only where M <= 64, 64-multiples for [K, N] B); one for sm_80.
TEST(GemmTune, CandidatesStartWithTheHeuristic) {
    struct S {
        int64_t m, n, k;
        bool b_kn;
        DType in;
    };
    for (const S& s : {S{8192, 4096, 1792, false, DType::BF16}, S{8192, 1376, 4096, false, DType::BF16},
                       S{8192, 3696, 8192, false, DType::BF16}, S{1000, 520, 328, true, DType::F16},
                       S{48, 1024, 512, false, DType::BF16}, S{8192, 8192, 3696, false, DType::F8E4M3}}) {
        SCOPED_TRACE(testing::Message() << s.m << " x " << s.n << " x " << s.k << (s.b_kn ? " kn " : " nk ")
                                        << loom::dtype_name(s.in));
        const auto c = loom::gemm_tune_candidates(s.m, s.n, s.k, s.b_kn, s.in, 90, 132);
        ASSERT_GE(c.size(), 4u);
        EXPECT_EQ(c[0].str(),
                  loom::gemm_heuristic(s.m, s.n, s.k, s.b_kn, 90, 132, true, loom::GemmTiles::Plain, s.in).str());
        std::set<std::string> names;
        bool has192 = false, has64 = false, has128 = false;
        for (const auto& x : c) {
            EXPECT_NO_THROW(loom::gemm_validate_config(x, s.b_kn, s.in)) << x.str();
            EXPECT_TRUE(names.insert(x.str()).second) << "twice: " << x.str();
            EXPECT_EQ(x.block_k, loom::kernels::gemm_block_k(loom::dtype_size(s.in)));
            has192 |= x.block_m == 192;
            has64 |= x.block_m == 64;
            has128 |= x.block_m == 128;
            if (s.b_kn) EXPECT_EQ(x.block_n % 64, 0) << x.str();
        }
        EXPECT_EQ(has192, s.m > 128);
        EXPECT_EQ(has64, s.m <= 64);
        EXPECT_EQ(has128, s.m > 64);
    }
    EXPECT_EQ(loom::gemm_tune_candidates(4096, 4096, 4096, false, DType::BF16, 80, 108).size(), 1u);
}

// Where loom::gemm's heuristic takes the gemv kernel (16-bit; M <= 8: rows of 2 KiB or more, M <= 16: rows of 4 KiB
// or more), its plan comes first, then the Hopper heuristic's plan and its alternatives; elsewhere no gemv candidate.
TEST(GemmTune, DecodeCandidatesStartWithTheGemvPlan) {
    for (DType in : {DType::BF16, DType::F16}) {
        const auto c = loom::gemm_tune_candidates(16, 4096, 4096, false, in, 90, 132);
        ASSERT_GE(c.size(), 3u);
        EXPECT_TRUE(c[0].gemv);
        EXPECT_EQ(c[0].str(), loom::detail::gemm_gemv_plan(16, 4096, 4096, in, 132).str());
        EXPECT_EQ(c[1].str(),
                  loom::gemm_heuristic(16, 4096, 4096, false, 90, 132, true, loom::GemmTiles::Plain, in).str());
        for (std::size_t i = 1; i < c.size(); ++i) EXPECT_FALSE(c[i].gemv) << c[i].str();
        const loom::GemmConfig back = loom::gemm_config_from_json(loom::gemm_config_to_json(c[0]));
        EXPECT_EQ(back.str(), c[0].str());
        EXPECT_TRUE(back.gemv);
    }
    for (const auto& [m, k, in] :
         {std::tuple{8, 1024, DType::BF16}, std::tuple{1, 1024, DType::F16}, std::tuple{9, 2048, DType::BF16}})
        EXPECT_TRUE(loom::gemm_tune_candidates(m, 4096, k, false, in, 90, 132)[0].gemv) << m << " " << k;
    for (const auto& [m, k, b_kn, in] :
         {std::tuple{17, 4096, false, DType::BF16}, std::tuple{16, 1024, false, DType::BF16},
          std::tuple{8, 512, false, DType::BF16}, std::tuple{16, 4096, true, DType::BF16},
          std::tuple{9, 8192, false, DType::F8E4M3}, std::tuple{1, 16384, false, DType::F8E4M3}})
        EXPECT_FALSE(loom::gemm_tune_candidates(m, 4096, k, b_kn, in, 90, 132)[0].gemv) << m << " " << k;
    EXPECT_TRUE(loom::detail::gemm_gemv_supported(32, false, DType::F8E4M3, 89));
    EXPECT_FALSE(loom::detail::gemm_gemv_supported(32, false, DType::F8E4M3, 80));
    EXPECT_FALSE(loom::detail::gemm_gemv_supported(33, false, DType::BF16, 90));
}

// The autotuner times K-clusters for decode GEMMs on a whole GPU: one wave of 64- or 128-column tiles, every candidate
// one the kernel takes; none beyond kGemmDecodeMaxM rows or on a small MPS share.
TEST(GemmTune, DecodeCandidatesIncludeClusterK) {
    for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{128, 1024, 4096},
                                  {64, 4096, 4096},
                                  {1, 1024, 1024},
                                  {97, 2048, 16384}}) {
        int weighed = 0;
        for (const loom::GemmConfig& c : loom::gemm_tune_candidates(m, n, k, false, DType::BF16, 90, 132)) {
            if (c.cluster_k == 1) continue;
            ++weighed;
            EXPECT_NO_THROW(loom::gemm_validate_config(c, false)) << c.str();
            EXPECT_EQ(c.block_m, m <= 64 ? 64 : 128) << c.str();
            EXPECT_TRUE(c.block_n == 64 || c.block_n == 128) << c.str();
            EXPECT_EQ(c.grid, loom::gemm_sm90_grid(m, n, c, 132)) << c.str();
            EXPECT_LE(c.grid, 132) << c.str();
        }
        EXPECT_GT(weighed, 0) << m << "x" << n << "x" << k;
        for (const loom::GemmConfig& c : loom::gemm_tune_candidates(m, n, k, false, DType::BF16, 90, 26))
            EXPECT_EQ(c.cluster_k, 1) << "26 SMs: " << c.str();
    }
    for (const loom::GemmConfig& c : loom::gemm_tune_candidates(129, 1024, 4096, false, DType::BF16, 90, 132))
        EXPECT_EQ(c.cluster_k, 1) << "M 129: " << c.str();
    // 128 x 4096 x 4096: 64 tiles of 64 columns take clusters of 2 (128 CTAs), not 4; 32 of 128 columns 2 or 4.
    std::set<std::pair<int, int>> kc;
    for (const loom::GemmConfig& c : loom::gemm_tune_candidates(128, 4096, 4096, false, DType::BF16, 90, 132))
        if (c.cluster_k > 1) kc.insert({c.block_n, c.cluster_k});
    EXPECT_EQ(kc, (std::set<std::pair<int, int>>{{64, 2}, {128, 2}, {128, 4}}));
}

// The gemv plan: a ring that fits two CTAs per SM, K-splits that fill the SMs once without exceeding half the slices,
// none where the blocks alone fill them; a config of another shape is rejected by name.
TEST(GemmHeuristic, GemvPlanFillsTheSms) {
    for (DType in : {DType::BF16, DType::F8E4M3})
        for (int64_t m : {1, 8, 9, 16, 17, 32})
            for (int64_t n : {8, 1024, 4096, 16384, 32768})
                for (int64_t k : {16, 1024, 4096, 16384}) {
                    SCOPED_TRACE(testing::Message() << m << " x " << n << " x " << k << " " << loom::dtype_name(in));
                    const loom::GemmConfig c = loom::detail::gemm_gemv_plan(m, n, k, in, 132);
                    EXPECT_TRUE(c.gemv);
                    EXPECT_NO_THROW(loom::gemm_validate_config(c, false, in));
                    EXPECT_GE(c.block_m, m);
                    EXPECT_LE(2 * (loom::kernels::gemv_smem_bytes(c.block_m / 8, c.stages) + 1024), 228 * 1024);
                    const int64_t blocks = (n + 63) / 64;
                    const int64_t slices = (k * static_cast<int64_t>(loom::dtype_size(in)) + 255) / 256;
                    EXPECT_EQ(c.grid, blocks * c.tail_splits);
                    EXPECT_LE(c.grid, std::max<int64_t>(blocks, 132));
                    if (c.tail_splits > 1) EXPECT_LE(c.tail_splits * 2, slices);
                    if (blocks >= 132) EXPECT_EQ(c.tail_splits, 1);
                    if (slices >= 64) EXPECT_GT(2 * c.grid, std::min<int64_t>(132, blocks * 32));
                }
    loom::GemmConfig bad = loom::detail::gemm_gemv_plan(1, 4096, 4096, DType::BF16, 132);
    EXPECT_THROW(loom::gemm_validate_config(bad, true, DType::BF16), loom::Error);
    bad.stages = 9;
    EXPECT_THROW(loom::gemm_validate_config(bad, false, DType::BF16), loom::Error);
}

TEST(GemmTune, ConfigJsonRoundTrips) {
    for (const auto& c : loom::gemm_tune_candidates(8192, 3696, 8192, false, DType::BF16, 90, 132)) {
        const loom::GemmConfig back = loom::gemm_config_from_json(loom::gemm_config_to_json(c));
        EXPECT_EQ(back.str(), c.str());
        EXPECT_EQ(back.block_k, c.block_k);
        EXPECT_EQ(back.tma_store, c.tma_store);
    }
    EXPECT_THROW(loom::gemm_config_from_json("{\"block_m\": 128}"), loom::Error);
    EXPECT_THROW(loom::gemm_config_from_json("not json"), loom::Error);
}

void expect_clean(const loom::jit::CompileResult& r, const std::string& what) {
    EXPECT_FALSE(r.cubin.empty()) << what;
    EXPECT_EQ(r.spill_bytes, 0) << what << "\n" << r.resource_report;
    EXPECT_GE(r.stack_bytes, 0) << what;
    EXPECT_LE(r.stack_bytes, 64) << what << "\n" << r.resource_report;  // printf args of the hang report only
}

// Every config bench-gemm --sweep times (BLOCK_N 128..256 with the most stages that fit, 3 stages, cluster on and
// off), both B layouts, plus a skinny one-consumer config with fp32 output: no spills, no wgmma serialisation.
TEST(GemmCompile, HopperKernelHasNoSpills) {
    std::vector<loom::GemmConfig> cfgs;
    for (int cluster : {1, 2}) {
        for (int bn : {256, 224, 192, 160, 128}) {
            loom::GemmConfig c;
            c.block_n = bn;
            c.cluster_m = cluster;
            c.stages = loom::kernels::gemm_sm90_plan_stages(c.block_m, bn);
            cfgs.push_back(c);
        }
        loom::GemmConfig three;
        three.stages = 3;
        three.cluster_m = cluster;
        cfgs.push_back(three);
        loom::GemmConfig direct;  // beta != 0: direct global stores
        direct.tma_store = false;
        direct.cluster_m = cluster;
        cfgs.push_back(direct);
    }
    // 64 < M <= 128: 64-row tiles in 2-CTA clusters sharing B, at the plan's ring depth.
    for (int bn : {64, 128, 256}) {
        loom::GemmConfig c;
        c.block_m = 64;
        c.block_n = bn;
        c.cluster_m = 2;
        c.stages = loom::kernels::gemm_sm90_plan_stages(64, bn);
        cfgs.push_back(c);
    }
    // K-clusters (the decode plan's: 64- and 128-row tiles, narrow BLOCK_N, 2-8 ranks), direct stores.
    for (int bm : {64, 128}) {
        for (int bn : {64, 128}) {
            for (int s : {2, 4, 8}) {
                loom::GemmConfig c;
                c.block_m = bm;
                c.block_n = bn;
                c.cluster_k = s;
                c.tma_store = false;
                c.stages = loom::kernels::gemm_sm90_plan_stages(bm, bn);
                cfgs.push_back(c);
            }
        }
    }
    // 192-row tiles (three consumer warpgroups under a 128-register cap), single-CTA, as bench-gemm --sweep times them
    // (and the direct-store kernel for beta != 0).
    for (int bn : {176, 160, 128}) {
        loom::GemmConfig c;
        c.block_m = 192;
        c.block_n = bn;
        c.stages = loom::kernels::gemm_sm90_max_stages(192, bn);
        cfgs.push_back(c);
        c.tma_store = false;  // beta != 0
        if (bn == 176) cfgs.push_back(c);
    }
    for (const auto& cfg : cfgs) {
        for (bool b_kn : {false, true}) {
            if (b_kn && cfg.block_n % 64 != 0) continue;
            EXPECT_NO_THROW(loom::gemm_validate_config(cfg, b_kn)) << cfg.str();
            // The affine kernel (alpha, bias) and, where it applies, the one without (TBias = void, stmatrix).
            std::vector<std::optional<DType>> biases = {DType::F32};
            if (loom::gemm_plain_epilogue(cfg, DType::BF16)) biases.push_back(std::nullopt);
            for (const auto& bias : biases) {
                auto spec = loom::gemm_kernel_spec(cfg, DType::BF16, DType::BF16, bias, b_kn);
                const auto r = loom::jit::compile(spec, 90);
                expect_clean(r, spec.display());
                EXPECT_EQ(r.resource_report.find("C7510"), std::string::npos)
                    << "wgmma serialised in " << spec.display() << "\n"
                    << r.resource_report;
            }
        }
    }
    // A kernel without alpha / bias needs the TMA-store epilogue.
    loom::GemmConfig no_tma;
    no_tma.tma_store = false;
    EXPECT_THROW(loom::gemm_kernel_spec(no_tma, DType::BF16, DType::BF16, std::nullopt, false), loom::Error);
    // SASS check where the toolkit ships cuobjdump (CUDA 13.0 here may not).
    loom::GemmConfig cfg;
    const auto r = loom::jit::compile(loom::gemm_kernel_spec(cfg, DType::BF16, DType::BF16, DType::F32, false), 90);
    const char* cuda = std::getenv("CUDA_HOME");
    const std::string tool = std::string(cuda ? cuda : "/usr/local/cuda") + "/bin/cuobjdump";
    if (std::ifstream(tool).good()) {
        const std::string path = testing::TempDir() + "loom_gemm_sm90.cubin";
        std::ofstream(path, std::ios::binary).write(r.cubin.data(), static_cast<std::streamsize>(r.cubin.size()));
        std::string sass;
        if (FILE* p = popen((tool + " -sass " + path).c_str(), "r")) {
            char line[512];
            while (fgets(line, sizeof line, p)) sass += line;
            pclose(p);
        }
        EXPECT_NE(sass.find("HGMMA"), std::string::npos) << "no HGMMA in the SASS of " << cfg.str();
    }
    loom::GemmConfig small;
    small.block_m = 64;
    small.block_n = 176;
    small.stages = 6;
    small.cluster_m = 1;
    expect_clean(loom::jit::compile(loom::gemm_kernel_spec(small, DType::F16, DType::F32, DType::BF16, false), 90),
                 small.str());
    // The skinny GEMMs' deep rings (the plan's 12 stages at 64 x 64, 8 at 128 x 64), plain epilogue and affine.
    for (const auto& [bm, bn] : {std::pair{64, 64}, std::pair{128, 64}}) {
        loom::GemmConfig deep;
        deep.block_m = bm;
        deep.block_n = bn;
        deep.stages = loom::kernels::gemm_sm90_plan_stages(bm, bn);
        deep.cluster_m = 1;
        EXPECT_NO_THROW(loom::gemm_validate_config(deep, false)) << deep.str();
        for (const std::optional<DType> bias : {std::optional<DType>{}, std::optional<DType>{DType::F32}})
            expect_clean(loom::jit::compile(loom::gemm_kernel_spec(deep, DType::BF16, DType::BF16, bias, false), 90),
                         deep.str());
    }
    loom::GemmConfig f32out;  // TMA-store epilogue with 32-column fp32 boxes
    f32out.block_n = 128;
    f32out.stages = 5;
    expect_clean(loom::jit::compile(loom::gemm_kernel_spec(f32out, DType::BF16, DType::F32, DType::BF16, true), 90),
                 f32out.str());
}

// The split-tail instantiations (kSplitTail = true): both epilogues, both B layouts, fp32 / bf16 out, one and two
// consumer warpgroups. The fix-up (slot stores, counter, the summing loads) must fit beside the mainloop's
// accumulators without spills or wgmma serialisation.
TEST(GemmCompile, SplitTailKernelHasNoSpills) {
    struct Cfg {
        int bm, bn, stages;
        bool tma_store;
        DType out;
    };
    for (const Cfg& x :
         {Cfg{128, 256, 4, true, DType::BF16}, Cfg{128, 256, 4, true, DType::F32}, Cfg{128, 256, 4, false, DType::BF16},
          Cfg{128, 224, 4, true, DType::BF16}, Cfg{128, 192, 4, true, DType::F16}, Cfg{128, 128, 6, true, DType::F32},
          Cfg{64, 176, 6, true, DType::F32}, Cfg{64, 256, 5, true, DType::BF16}, Cfg{64, 128, 8, true, DType::BF16},
          Cfg{128, 64, 8, true, DType::BF16}, Cfg{192, 176, 4, true, DType::BF16}, Cfg{192, 176, 4, true, DType::F32},
          Cfg{192, 128, 5, true, DType::BF16}, Cfg{192, 160, 4, false, DType::F16},
          // The decode plans' split tiles (src/ops/gemm/decode_plan.cpp).
          Cfg{64, 64, 12, true, DType::BF16}, Cfg{64, 96, 10, true, DType::BF16},
          Cfg{128, 128, 6, true, DType::BF16}}) {
        for (bool b_kn : {false, true}) {
            loom::GemmConfig c;
            c.block_m = x.bm;
            c.block_n = x.bn;
            c.stages = x.stages;
            c.tma_store = x.tma_store;
            c.tail_splits = 2;
            if (b_kn && c.block_n % 64 != 0) continue;
            EXPECT_NO_THROW(loom::gemm_validate_config(c, b_kn)) << c.str();
            std::vector<std::optional<DType>> biases = {DType::F32};
            if (loom::gemm_plain_epilogue(c, x.out)) biases.push_back(std::nullopt);
            for (const auto& bias : biases) {
                const auto spec = loom::gemm_kernel_spec(c, DType::BF16, x.out, bias, b_kn);
                ASSERT_EQ(spec.template_args.size(), 11u);
                EXPECT_EQ(spec.template_args.back(), "true");
                const auto r = loom::jit::compile(spec, 90);
                expect_clean(r, spec.display());
                EXPECT_EQ(r.resource_report.find("C7510"), std::string::npos)
                    << "wgmma serialised in " << spec.display() << "\n"
                    << r.resource_report;
            }
        }
    }
    // fp8 e4m3 inputs (B as [N, K]) split as the decode plans split them.
    for (const auto& [bm, bn, stages] : {std::tuple<int, int, int>{64, 64, 12}, {64, 96, 10}, {128, 64, 8}}) {
        loom::GemmConfig c;
        c.block_m = bm;
        c.block_n = bn;
        c.block_k = 128;
        c.stages = stages;
        c.tail_splits = 2;
        EXPECT_NO_THROW(loom::gemm_validate_config(c, false, DType::F8E4M3)) << c.str();
        for (const auto& bias : {std::optional<DType>{DType::F32}, std::optional<DType>{}}) {
            const auto spec = loom::gemm_kernel_spec(c, DType::F8E4M3, DType::BF16, bias, false);
            const auto r = loom::jit::compile(spec, 90);
            expect_clean(r, spec.display());
            EXPECT_EQ(r.resource_report.find("C7510"), std::string::npos)
                << "wgmma serialised in " << spec.display() << "\n"
                << r.resource_report;
        }
    }
    // Without the split the spec (and so the kernel and its JIT cache entry) is the one it was before.
    EXPECT_EQ(
        loom::gemm_kernel_spec(loom::GemmConfig{}, DType::BF16, DType::BF16, DType::F32, false).template_args.size(),
        10u);
}

// The fp8 instantiations (wgmma k32 e4m3): both epilogues, 16- and 32-bit outputs, one, two and three consumer
// warpgroups, the split tail.
TEST(GemmCompile, Fp8KernelHasNoSpills) {
    struct Cfg {
        int bm, bn, splits;
        DType out;
        bool affine;
    };
    for (const Cfg& x :
         {Cfg{128, 256, 1, DType::BF16, false}, Cfg{128, 256, 1, DType::BF16, true}, Cfg{128, 256, 1, DType::F32, true},
          Cfg{128, 224, 1, DType::F16, false}, Cfg{64, 256, 1, DType::BF16, true}, Cfg{192, 176, 1, DType::BF16, false},
          Cfg{128, 256, 3, DType::BF16, false}, Cfg{192, 176, 3, DType::F32, true}}) {
        loom::GemmConfig c =
            loom::gemm_heuristic(8192, 8192, 8192, false, 90, 132, true, loom::GemmTiles::Plain, DType::F8E4M3);
        c.cluster_m = x.bm == 128 && x.splits == 1 ? 2 : 1;  // the heuristic's clusters where they apply
        c.block_m = x.bm;
        c.block_n = x.bn;
        c.tail_splits = x.splits;
        c.stages = loom::kernels::gemm_sm90_plan_stages(x.bm, x.bn);
        EXPECT_NO_THROW(loom::gemm_validate_config(c, false, DType::F8E4M3)) << c.str();
        const std::optional<DType> bias = x.affine ? std::optional<DType>(DType::F32) : std::nullopt;
        const auto spec = loom::gemm_kernel_spec(c, DType::F8E4M3, x.out, bias, false);
        EXPECT_EQ(spec.template_args.front(), "__nv_fp8_e4m3");
        const auto r = loom::jit::compile(spec, 90);
        expect_clean(r, spec.display());
        EXPECT_EQ(r.resource_report.find("C7510"), std::string::npos)
            << "wgmma serialised in " << spec.display() << "\n"
            << r.resource_report;
    }
}

// The gemv kernel (kernels/gemm/gemv.cuh) for every A-row tile count, 16-bit and fp8 inputs, 16- and 32-bit outputs, at
// the stages its plan takes, with the workspace's split sum and (one tile: the launch's only use of it) the cluster's:
// no spills on sm_90a, and the workspace variant compiles for the oldest GPU of each input type.
TEST(GemmCompile, GemvKernelHasNoSpills) {
    for (DType in : {DType::BF16, DType::F16, DType::F8E4M3})
        for (int64_t m : {1, 16, 32})
            for (DType out : {DType::BF16, DType::F32}) {
                const loom::GemmConfig c = loom::detail::gemm_gemv_plan(m, 4096, 4096, in, 132);
                EXPECT_NO_THROW(loom::gemm_validate_config(c, false, in)) << c.str();
                const auto spec = loom::detail::gemm_gemv_kernel_spec(in, out, std::nullopt, m, c.stages, false);
                expect_clean(loom::jit::compile(spec, 90), spec.display());
                if (m == 1) {
                    const auto cluster = loom::detail::gemm_gemv_kernel_spec(in, out, std::nullopt, m, c.stages, true);
                    expect_clean(loom::jit::compile(cluster, 90), cluster.display());
                }
                if (m == 16 && out == DType::BF16) {
                    const int oldest = in == DType::F8E4M3 ? 89 : 80;
                    expect_clean(loom::jit::compile(spec, oldest), spec.display() + " sm_" + std::to_string(oldest));
                }
            }
}

TEST(GemmCompile, Sm80KernelCompilesForAmpereAndAda) {
    loom::GemmConfig cfg;
    cfg.sm80 = true;
    for (int arch : {80, 89}) {
        for (bool b_kn : {false, true}) {
            auto spec = loom::gemm_kernel_spec(cfg, DType::BF16, DType::BF16, DType::F32, b_kn);
            expect_clean(loom::jit::compile(spec, arch), spec.display() + " sm_" + std::to_string(arch));
        }
    }
}

}  // namespace
