// gemm_rs's fused-epilogue slot layout and copy-engine chunks (kernels/overlap_params.hpp), on the host: the layout is
// a bijection onto the slot's tiles, and every chunk the host's copy stream enumerates
// (src/ops/overlap/gemm_rs/fused_epilogue.cpp: groups in order, chunk_n columns at a time) is one contiguous run of
// slot tiles whose members all name it as their chunk — the device's signal index (rs_chunk_lead) and the host's copy
// range must agree, or a copy would carry tiles whose owner waits on another chunk's signal.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "loom/kernels/overlap/overlap_params.hpp"

namespace {

using loom::kernels::overlap::rs_chunk_lead;
using loom::kernels::overlap::rs_pull_tile_order;
using loom::kernels::overlap::rs_slot_tile;

void check_layout(int32_t bpr, int32_t num_n, int32_t group, int32_t chunk_n) {
    SCOPED_TRACE(testing::Message() << "bpr " << bpr << " num_n " << num_n << " group " << group << " chunk_n "
                                    << chunk_n);
    const int64_t tiles = int64_t(bpr) * num_n;
    std::vector<int> seen(tiles, 0);
    for (int32_t m = 0; m < bpr; ++m)
        for (int32_t n = 0; n < num_n; ++n) {
            const int64_t t = rs_slot_tile(m, n, bpr, num_n, group);
            ASSERT_GE(t, 0);
            ASSERT_LT(t, tiles);
            ++seen[t];
        }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; })) << "not a bijection";

    // The host's chunks, as gemm_rs_fused enumerates them.
    std::vector<int> covered(tiles, 0);
    for (int32_t first = 0; first < bpr; first += group) {
        const int32_t rows = std::min(group, bpr - first);
        for (int32_t n0 = 0; n0 < num_n; n0 += chunk_n) {
            const int32_t cols = std::min(chunk_n, num_n - n0);
            const int64_t at = rs_slot_tile(first, n0, bpr, num_n, group);
            // Every tile of the chunk lies in [at, at + rows * cols) and names `at` as its chunk.
            for (int32_t m = first; m < first + rows; ++m)
                for (int32_t n = n0; n < n0 + cols; ++n) {
                    const int64_t t = rs_slot_tile(m, n, bpr, num_n, group);
                    ASSERT_GE(t, at);
                    ASSERT_LT(t, at + int64_t(rows) * cols);
                    ASSERT_EQ(rs_chunk_lead(m, n, bpr, num_n, group, chunk_n), at);
                    ++covered[t];
                }
        }
    }
    EXPECT_TRUE(std::all_of(covered.begin(), covered.end(), [](int c) { return c == 1; }))
        << "the chunks do not cover the slot exactly once";
}

TEST(OverlapLayout, SlotLayoutIsABijectionAndChunksAreContiguous) {
    // Group sizes dividing the band (the copy-engine transport narrows group_m so), one that does not (the Sm
    // transport keeps the heuristic's), a group wider than the band, N tails of the chunk width, one column per chunk.
    for (int32_t bpr : {1, 2, 5, 16, 32})
        for (int32_t num_n : {1, 3, 16, 18})
            for (int32_t group : {1, 2, 5, 8, 16, 40})
                for (int32_t chunk_n : {1, 2, 3, 16, 64}) check_layout(bpr, num_n, group, chunk_n);
}

// Within a group the layout follows the GEMM's raster (tile::grouped_order walks a group's M-blocks fastest), so the
// tiles the GEMM completes one after another sit one after another in the slot.
TEST(OverlapLayout, GroupColumnsAreConsecutive) {
    const int32_t bpr = 32, num_n = 16, group = 16;
    for (int32_t first = 0; first < bpr; first += group)
        for (int32_t n = 0; n < num_n; ++n)
            for (int32_t m = first; m + 1 < first + group; ++m)
                EXPECT_EQ(rs_slot_tile(m + 1, n, bpr, num_n, group), rs_slot_tile(m, n, bpr, num_n, group) + 1);
}

// The fused pull's order (kernels/gemm_rs_pull.cuh) visits every tile once; linear d + W j is tile j of band d in the
// band's grouped raster on every rank (the reducers find their tiles so), and every W consecutive tiles hold one tile
// of each band.
TEST(OverlapLayout, PullOrderInterleavesTheBands) {
    for (int32_t W : {1, 2, 3, 8})
        for (int32_t bpr : {1, 4, 8})
            for (int32_t num_n : {1, 5, 16})
                for (int32_t group : {1, 2, 4, 8}) {
                    if (bpr % group != 0) continue;
                    const int32_t tiles = W * bpr * num_n;
                    std::vector<int> seen(static_cast<std::size_t>(tiles), 0);
                    for (int32_t l = 0; l < tiles; ++l) {
                        int32_t m = -1, n = -1;
                        rs_pull_tile_order(l, W, bpr, num_n, group, m, n);
                        ASSERT_GE(m, 0);
                        ASSERT_LT(m, W * bpr);
                        ASSERT_GE(n, 0);
                        ASSERT_LT(n, num_n);
                        ASSERT_EQ(m / bpr, l % W) << "linear " << l << " is not in band " << l % W;
                        int32_t gm = -1, gn = -1;
                        loom::tile::grouped_order(l / W, loom::tile::TileGrid{bpr, num_n, group}, gm, gn);
                        ASSERT_EQ(m, (l % W) * bpr + gm);
                        ASSERT_EQ(n, gn);
                        ++seen[static_cast<std::size_t>(m) * num_n + n];
                    }
                    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }))
                        << "W " << W << " bpr " << bpr << " num_n " << num_n << " group " << group;
                }
}

}  // namespace
