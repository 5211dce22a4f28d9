// The analytic config choice (gemm_heuristic) and the tile plans it and the launches share: the persistent grid, the
// split-K tail plan, the completion of a tile choice into a config.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>

#include "ops/gemm/gemm_internal.hpp"

namespace loom {
namespace {

using detail::gemm_ceil_div;

// How efficiently a BLOCK_M x BLOCK_N tile runs, relative to 128 x 256 (1.0), for the heuristic's cost model.
// 128- and 192-row tiles: log(ratio to cuBLASLt) fitted as shape + tile class, waves counted whole, over the sweeps of
// docs/perf/gemm_sweep.json; they spread +-1-2 %, hence kGemmTileMargin. The overlapped GEMMs (GemmTiles::Overlap)
// take the same 128-row figures. 64-row tiles (M <= 64): a coarser per-BLOCK_N table.
double tile_efficiency(int bm, int bn) {
    struct Point {
        int bn;
        double eff;
    };
    static constexpr Point k64[] = {{256, 1.0}, {224, 0.93}, {192, 0.88}, {176, 0.85}, {128, 0.80}};
    static constexpr Point k128[] = {{256, 1.0},   {240, 0.984}, {224, 0.986}, {208, 0.982}, {192, 0.982},
                                     {176, 0.974}, {160, 0.955}, {144, 0.945}, {128, 0.926}};
    static constexpr Point k192[] = {{176, 0.995}, {160, 0.986}, {144, 0.975}, {128, 0.956}};
    auto lookup = [bn](const auto& table) {
        for (const Point& p : table)
            if (bn >= p.bn) return p.eff;
        const Point& last = table[std::size(table) - 1];
        return last.eff - 0.15 * (last.bn - bn) / 64.0;  // narrower tiles: more smem traffic per flop
    };
    if (bm <= 64) return lookup(k64);
    return bm <= 128 ? lookup(k128) : lookup(k192);
}

// One heuristic problem: the shape, the device, and the config every candidate starts from (block_k, cluster_m and
// the default BLOCK_M set).
struct TileSearch {
    int64_t m, n, k;
    bool b_kn;
    int num_sms;
    bool may_split;  // the split-K tail may be planned (asked for, and single-CTA tiles)
    GemmTiles tiles;
    GemmConfig base;
};

// The cost of BLOCK_M x BLOCK_N tiles: the area each SM sweeps (waves of the persistent grid x the tile), scaled by how
// efficiently the tile runs. A split tail's last wave costs 1 / s of a tile per split plus the fix-up. every_sm: the
// tail planned on every SM rather than on the persistent grid, min(tiles, SMs).
double tile_cost(const TileSearch& s, int bm, int bn, bool every_sm) {
    const int64_t tiles = gemm_ceil_div(s.m, bm) * gemm_ceil_div(s.n, bn);
    double waves = static_cast<double>(gemm_ceil_div(tiles, s.num_sms));
    if (s.may_split) {
        GemmConfig t = s.base;
        t.block_m = bm;
        t.block_n = bn;
        const int64_t grid = every_sm ? s.num_sms : std::min<int64_t>(tiles, s.num_sms);
        const GemmTailPlan p = gemm_tail_plan(s.m, s.n, s.k, t, grid, 0);
        if (p.splits >= 2)
            waves = static_cast<double>(p.dp_tiles / grid) +
                    static_cast<double>(gemm_ceil_div(p.tail_tiles * p.splits, grid)) / p.splits + kGemmTailFixupCost;
    }
    // 128 x 256, the tile measured most, wins within kGemmTileMargin.
    const double margin = bm == 128 && bn == 256 ? 1.0 : 1.0 + kGemmTileMargin;
    return waves * bm * bn / tile_efficiency(bm, bn) * margin;
}

// The cheapest tiles, completed into a config (stages, raster group, grid, the split tail). 192-row tiles compete with
// the default BLOCK_M for loom::gemm's single-CTA tiles at M > 128 (BLOCK_N <= kGemmMaxBlockN192); ties go to the
// tiles tried first (the default BLOCK_M, wider). every_sm: see tile_cost; a split plan then gets a CTA per split unit
// (the launch sees every tile as tail at that grid).
GemmConfig choose_tiles(const TileSearch& s, bool every_sm) {
    GemmConfig c = s.base;
    const int block_ms[] = {s.base.block_m, 192};
    const int num_block_ms = s.m > 128 && s.tiles == GemmTiles::Plain && s.base.cluster_m == 1 ? 2 : 1;
    double best = 1e300;
    for (int i = 0; i < num_block_ms; ++i) {
        const int bm = block_ms[i];
        for (int bn = bm == 192 ? kGemmMaxBlockN192 : 256; bn >= 64; bn -= 16) {
            if (s.b_kn && bn % 64 != 0) continue;
            const double cost = tile_cost(s, bm, bn, every_sm);
            if (cost < best * (1 - 1e-9)) {
                best = cost;
                c.block_m = bm;
                c.block_n = bn;
            }
        }
    }
    detail::gemm_complete_config(c, s.m, s.n, s.num_sms);
    if (s.may_split) {
        const GemmTailPlan p = gemm_tail_plan(s.m, s.n, s.k, c, every_sm ? s.num_sms : c.grid, 0);
        c.tail_splits = p.splits;
        if (every_sm && p.splits >= 2) c.grid = static_cast<int>(std::min<int64_t>(s.num_sms, p.units()));
    }
    return c;
}

// The persistent plan, and for a wave at most half full (a skinny GEMM) the single-wave alternatives: split along K
// on every SM, or whole where a short K streams faster whole (docs/perf/gemm_skinny.json, gemm_skinny_fp8.json):
// 64-row tiles filling over a third of the SMs (their 12-stage rings), and at kGemmNarrowMinM <= M <= 128 64 x 64
// tiles over both M-blocks where they fill over half the SMs.
GemmConfig persistent_plan(const TileSearch& s) {
    GemmConfig cfg = choose_tiles(s, false);
    const bool wave_thin = static_cast<int64_t>(cfg.grid) * 2 <= s.num_sms;
    const bool short_k = gemm_ceil_div(s.k, cfg.block_k) <= kGemmSkinnyWholeMaxKBlocks;
    const bool short_k_streams_whole = short_k && cfg.block_m == 64 && static_cast<int64_t>(cfg.grid) * 3 > s.num_sms;
    if (!s.may_split || !wave_thin || short_k_streams_whole) return cfg;
    if (short_k && s.tiles == GemmTiles::Plain && s.m >= kGemmNarrowMinM && s.m <= 128) {
        GemmConfig narrow = cfg;
        narrow.block_m = 64;
        narrow.block_n = 64;
        narrow.tail_splits = 1;
        detail::gemm_complete_config(narrow, s.m, s.n, s.num_sms);
        if (static_cast<int64_t>(narrow.grid) * 2 > s.num_sms) return narrow;
    }
    return choose_tiles(s, true);
}

// Decode GEMMs (M <= kGemmDecodeMaxM, plain tiles, the split tail allowed) weigh the persistent plan against the decode
// plan's (decode_plan.cpp); every other GEMM takes the persistent plan.
GemmConfig plan(const TileSearch& s) {
    const GemmConfig persistent = persistent_plan(s);
    if (s.m > kGemmDecodeMaxM || s.tiles != GemmTiles::Plain || !s.may_split) return persistent;
    return gemm_decode_plan(s.m, s.n, s.k, s.b_kn, s.num_sms, persistent);
}

}  // namespace

GemmConfig gemm_heuristic(int64_t m, int64_t n, int64_t k, bool b_kn, int arch, int num_sms, bool split_tail,
                          GemmTiles tiles, DType in) {
    // No clusters by default: single-CTA tiles measured faster than 2-CTA clusters with B multicast for bf16 / fp16
    // (docs/perf/gemm.json against gemm_cluster2.json). fp8 takes them where M has two M-blocks and the whole GPU is
    // there: at twice bf16's MMA rate, the multicast halving B's L2 reads is what keeps up (docs/perf/gemm_fp8.json).
    // The overlapped GEMMs' hooks order single-CTA tiles.
    const int cluster_m =
        dtype_size(in) == 1 && m > 128 && tiles == GemmTiles::Plain && num_sms >= kGemmFp8ClusterMinSms ? 2 : 1;
    return detail::gemm_heuristic_clustered(m, n, k, b_kn, arch, num_sms, split_tail, tiles, in, cluster_m);
}

GemmConfig detail::gemm_heuristic_clustered(int64_t m, int64_t n, int64_t k, bool b_kn, int arch, int num_sms,
                                            bool split_tail, GemmTiles tiles, DType in, int cluster_m) {
    GemmConfig cfg;
    // The same 128-byte rows, so the same tiles, stages and cost model for every input type: an fp8 k-block holds
    // twice the elements (and MMA work, at twice the rate).
    cfg.block_k = kernels::gemm_block_k(static_cast<int>(dtype_size(in)));
    if (arch < 90) {
        cfg.sm80 = true;
        return cfg;
    }
    cfg.block_m = m <= 64 ? 64 : 128;
    cfg.cluster_m = cluster_m;
    // The split-K tail needs single-CTA tiles.
    return plan(TileSearch{m, n, k, b_kn, num_sms, split_tail && cluster_m == 1, tiles, cfg});
}

void detail::gemm_complete_config(GemmConfig& c, int64_t m, int64_t n, int num_sms) {
    c.stages = kernels::gemm_sm90_plan_stages(c.block_m, c.block_n);
    // Keep the CTAs that run together close to square in L2: group_m M-blocks x (num_sms / group_m) N-blocks.
    c.group_m = static_cast<int>(std::clamp<int64_t>(
        static_cast<int64_t>(std::lround(std::sqrt(num_sms * static_cast<double>(c.block_n) / c.block_m))), 1,
        std::max<int64_t>((m + c.block_m - 1) / c.block_m, 1)));
    if (c.cluster_m > 1) c.group_m = std::max(c.cluster_m, c.group_m / c.cluster_m * c.cluster_m);
    c.grid = static_cast<int>(gemm_sm90_grid(m, n, c, num_sms));
}

GemmTailPlan gemm_tail_plan(int64_t m, int64_t n, int64_t k, const GemmConfig& cfg, int64_t grid, int requested) {
    GemmTailPlan p;
    p.tiles = gemm_ceil_div(m, cfg.block_m) * gemm_ceil_div(n, cfg.block_n);
    p.dp_tiles = p.tiles;
    grid = std::max<int64_t>(grid, 1);
    const int64_t tail = p.tiles % grid;
    if (cfg.sm80 || cfg.cluster_m != 1 || cfg.cluster_k != 1 || tail == 0 || requested == 1) return p;
    const int64_t num_k_blocks = gemm_ceil_div(k, cfg.block_k);
    const int64_t s =
        requested > 0 ? std::min<int64_t>(requested, num_k_blocks) : std::min<int64_t>(grid / tail, num_k_blocks / 4);
    if (s < 2) return p;
    p.dp_tiles = p.tiles - tail;
    p.tail_tiles = tail;
    p.splits = static_cast<int>(std::min<int64_t>(s, kGemmMaxTailSplits));
    return p;
}

int64_t gemm_sm90_grid(int64_t m, int64_t n, const GemmConfig& cfg, int num_sms) {
    // K-clusters: one cluster per tile, not persistent.
    if (cfg.cluster_k > 1) return gemm_ceil_div(m, cfg.block_m) * gemm_ceil_div(n, cfg.block_n) * cfg.cluster_k;
    // Clusters of cluster_m CTAs pair adjacent M-blocks; every CTA of a cluster walks the same tiles.
    const int64_t cm = std::max(cfg.cluster_m, 1);
    const int64_t cluster_tiles = gemm_ceil_div(gemm_ceil_div(m, cfg.block_m), cm) * gemm_ceil_div(n, cfg.block_n);
    return std::max<int64_t>(std::min<int64_t>(cluster_tiles, num_sms / cm), 1) * cm;
}

}  // namespace loom
