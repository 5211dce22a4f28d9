// The persistent GEMM's tile order on the host (tile/tile_order.hpp): FastDiv divides exactly, and the grouped order
// with the host's divisors (FastTileGrid, what the scheduler walks) maps every tile index as the plain divisions do —
// a wrong quotient would make two CTAs compute one tile and leave another unwritten.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "loom/tile/tile_order.hpp"

namespace {

using loom::tile::FastDiv;
using loom::tile::FastTileGrid;
using loom::tile::TileGrid;

TEST(TileOrder, FastDivIsExact) {
    std::vector<int32_t> divisors;
    for (int32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
    for (int32_t d : {65535, 65536, 65537, 1000003, (1 << 30) - 1, 1 << 30, (1 << 30) + 1, INT32_MAX})
        divisors.push_back(d);
    std::vector<int32_t> values;
    for (int32_t n = 0; n <= 70000; ++n) values.push_back(n);
    for (int64_t n = 70001; n <= INT32_MAX; n = n * 3 + 7) values.push_back(static_cast<int32_t>(n));
    for (int32_t n : {INT32_MAX - 1, INT32_MAX, 1 << 30, (1 << 30) - 1}) values.push_back(n);
    for (int32_t d : divisors) {
        const FastDiv f = FastDiv::of(d);
        for (int32_t n : values) ASSERT_EQ(f.div(n), n / d) << n << " / " << d;
        // Near multiples of d, where a quotient that is one off would show.
        for (int64_t q = 1; q * d <= INT32_MAX && q < 50000; q = q * 2 + 1)
            for (int64_t e = -1; e <= 1; ++e) {
                const int64_t n = q * d + e;
                if (n >= 0 && n <= INT32_MAX) ASSERT_EQ(f.div(static_cast<int32_t>(n)), n / d) << n << " / " << d;
            }
    }
}

TEST(TileOrder, FastGridWalksTheGroupedOrder) {
    for (int32_t num_m = 1; num_m <= 40; ++num_m)
        for (int32_t num_n = 1; num_n <= 24; ++num_n)
            for (int32_t group = 1; group <= num_m + 1; ++group) {
                const TileGrid g{num_m, num_n, group};
                const FastTileGrid f = FastTileGrid::of(g);
                std::vector<int> seen(static_cast<size_t>(num_m) * num_n, 0);
                for (int32_t l = 0; l < g.num_tiles(); ++l) {
                    int32_t m0, n0, m1, n1;
                    loom::tile::grouped_order(l, g, m0, n0);
                    loom::tile::grouped_order(l, f, m1, n1);
                    ASSERT_EQ(m1, m0) << "grid " << num_m << " x " << num_n << " group " << group << " tile " << l;
                    ASSERT_EQ(n1, n0) << "grid " << num_m << " x " << num_n << " group " << group << " tile " << l;
                    ++seen[static_cast<size_t>(m1) * num_n + n1];
                    // The rotated order takes either grid.
                    loom::tile::rotated_order(l, g, num_m - 1, m0, n0);
                    loom::tile::rotated_order(l, f, num_m - 1, m1, n1);
                    ASSERT_EQ(m1, m0);
                }
                for (int c : seen) ASSERT_EQ(c, 1) << "grid " << num_m << " x " << num_n << " group " << group;
            }
}

TEST(TileOrder, SchedulerGridCountsClusterTiles) {
    // 8192 x 4096 at 128 x 256: 64 x 16 tiles; 2-CTA clusters walk 32 M-block pairs in groups of 8 / 2.
    const TileGrid a = loom::tile::scheduler_grid(8192, 4096, 128, 256, 1, 16);
    EXPECT_EQ(a.num_m, 64);
    EXPECT_EQ(a.num_n, 16);
    EXPECT_EQ(a.group_m, 16);
    const TileGrid b = loom::tile::scheduler_grid(8192 + 1, 4096 + 1, 128, 256, 2, 16);
    EXPECT_EQ(b.num_m, 33);  // 65 M-blocks in clusters of 2
    EXPECT_EQ(b.num_n, 17);
    EXPECT_EQ(b.group_m, 8);
    EXPECT_EQ(loom::tile::scheduler_grid(64, 64, 128, 256, 2, 1).group_m, 1);  // at least one
    // A group larger than the M-blocks is one group of all of them.
    EXPECT_EQ(loom::tile::scheduler_grid(1000, 4096, 128, 256, 1, 1 << 30).group_m, 8);
    EXPECT_EQ(loom::tile::scheduler_grid(1000, 4096, 128, 256, 2, 1 << 30).group_m, 4);
}

}  // namespace
