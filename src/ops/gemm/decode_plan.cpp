// The decode plan (gemm_decode_plan): for M <= kGemmDecodeMaxM the GEMM streams the weight B from memory, and its
// time is set by how evenly and how deeply every SM streams it, not by the tensor cores. The plan weighs the
// persistent plan against whole and split-K plans of every BLOCK_N on a bandwidth model (gemm_decode_cost_us).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "loom/tile/tile_order.hpp"
#include "ops/gemm/gemm_internal.hpp"

namespace loom {
namespace {

using detail::gemm_ceil_div;

// The bandwidth model's constants, fitted (least squares, relative error, a free offset per shape) to bench-gemm
// --decode-sweep's timings of each shape's candidates on one H200 with a clean L2: M in {1, 16, 64, 128}, N in {1K, 4K,
// 8K}, K in {1K, 4K, 16K}, bf16 and fp8 (fitted on half the shapes, the model's picks on the other half cost 0.8-1.6 %
// over the best timed candidate, against 1.4-2.6 % for the constants fitted on long streams only).
// One SM's rate from HBM: 1 / (kSmUsPerMb + kSmUsKbPerMb / in-flight KiB of B) MB per us, in flight the ring's stages
// or the unit's k-blocks if fewer: about 48 GB/s with 96 KiB in flight (64 x 64, 12 stages), 30 GB/s with 16 KiB.
constexpr double kSmUsPerMb = 18.0;
constexpr double kSmUsKbPerMb = 256.0;
// One SM's rate for what it reads from L2 (A, re-read by every CTA, and B), MB per us.
constexpr double kSmL2MbPerUs = 5.5;
// The memory's rate for the weights, MB per us, as it enters the 4-norm below.
constexpr double kHbmMbPerUs = 5.2;
// The two bounds combine as a 4-norm: near each other, neither is reached.
constexpr double kBoundNorm = 4.0;
// What each work unit costs its CTA besides streaming: its ring's first loads and its epilogue (a CTA running a whole
// tile and a split unit pays it twice).
constexpr double kUnitUs = 3.15;
// Split-K: the last split's hand-off (the counter's acquire, the completing CTA's start of its epilogue) and the slots
// it reads back at one SM's L2 rate.
constexpr double kFixupUs = 1.75;
constexpr double kFixupMbPerUs = 0.076;
// K-clusters (GemmConfig::cluster_k): the ranks' sum after the mainloop (a consumer barrier, the partial into the
// ring, a cluster barrier) and the peers' partials of the owned columns read through distributed shared memory, MB per
// us. kClusterSumUs is the median excess of the --decode-sweep timings of one-wave K-clusters of 2 and 4 over the model
// with the sum free (each shape's offset from its other candidates; one H200, bf16 and fp8, M 64 and 128).
constexpr double kClusterSumUs = 2.3;
constexpr double kDsmemMbPerUs = 0.2;
// Split plans whose units stream fewer k-blocks than this are not weighed.
constexpr int64_t kMinUnitKBlocks = 2;
// The most K-splits weighed, and the most work units per SM (which bounds the split workspace: units x BM x BN fp32).
constexpr int kMaxDecodeSplits = 64;
constexpr int64_t kMaxUnitsPerSm = 4;

// One CTA streaming `kb` k-blocks of B's `cfg.block_n` rows (and A's rows from L2) as one work unit, in us.
double unit_stream_us(const GemmConfig& cfg, double kb, double a_mb, double b_mb) {
    const double inflight_kib = std::min<double>(cfg.stages, kb) * cfg.block_n * 128.0 / 1024.0;
    const double us_per_b_mb = kSmUsPerMb + kSmUsKbPerMb / std::max(inflight_kib, 1.0);
    return kUnitUs + std::max(kb * b_mb * us_per_b_mb, kb * (a_mb + b_mb) / kSmL2MbPerUs);
}

double bound_norm(double t_hbm, double t_sm) {
    return std::pow(std::pow(t_hbm, kBoundNorm) + std::pow(t_sm, kBoundNorm), 1.0 / kBoundNorm);
}

}  // namespace

double gemm_decode_cost_us(int64_t m, int64_t n, int64_t k, const GemmConfig& cfg, int num_sms) {
    const int64_t num_kb = gemm_ceil_div(k, cfg.block_k);
    // Bytes of one k-block (128-byte rows of any input type): B's BLOCK_N rows, A's box (M rounded up to 8 below one
    // tile: launch_sm90.cpp).
    const double b_mb = cfg.block_n * 128.0 / 1e6;
    const int64_t a_rows = m < cfg.block_m ? (m + 7) / 8 * 8 : cfg.block_m;
    const double a_mb = static_cast<double>(a_rows) * 128.0 / 1e6;
    const double weights_mb = static_cast<double>(n) * static_cast<double>(num_kb) * 128.0 / 1e6;
    if (cfg.cluster_m > 1) {
        // M-clusters: cluster_m CTAs on adjacent M-blocks walk the same N-blocks, each loading 1 / cluster_m of B's
        // k-block and multicasting it to the others.
        const int64_t cm = cfg.cluster_m;
        const int64_t cluster_tiles = gemm_ceil_div(gemm_ceil_div(m, cfg.block_m), cm) * gemm_ceil_div(n, cfg.block_n);
        const int64_t grid = cfg.grid > 0 ? cfg.grid : gemm_sm90_grid(m, n, cfg, num_sms);
        const double waves = std::ceil(static_cast<double>(cluster_tiles) / std::max<int64_t>(grid / cm, 1));
        // One CTA streams its share of B's rows (and of the ring's bytes in flight) from memory; A and the rest of B
        // still reach it, as the L2 term counts them.
        GemmConfig share = cfg;
        share.block_n = static_cast<int>(cfg.block_n / cm);
        const double unit = unit_stream_us(share, static_cast<double>(num_kb), a_mb + b_mb * (cm - 1) / cm, b_mb / cm);
        return bound_norm(weights_mb / kHbmMbPerUs, waves * unit);
    }
    if (cfg.cluster_k > 1) {
        // One cluster per tile, every rank streaming its share of the k-blocks, the clusters in waves over the SMs;
        // then the ranks' sum: each reads the peers' partials of its columns (the warps' rows inside M).
        const int64_t tiles = gemm_ceil_div(m, cfg.block_m) * gemm_ceil_div(n, cfg.block_n);
        const double waves = std::ceil(static_cast<double>(tiles * cfg.cluster_k) / std::max(num_sms, 1));
        const double kb = std::ceil(static_cast<double>(num_kb) / cfg.cluster_k);
        const int64_t rows = std::min<int64_t>(cfg.block_m, (m + 15) / 16 * 16);
        const double peers_mb =
            static_cast<double>(cfg.cluster_k - 1) * rows * (cfg.block_n / cfg.cluster_k) * 4.0 / 1e6;
        const double t_sm = waves * (unit_stream_us(cfg, kb, a_mb, b_mb) + kClusterSumUs + peers_mb / kDsmemMbPerUs);
        return bound_norm(weights_mb / kHbmMbPerUs, t_sm);
    }
    const int64_t grid = std::max<int64_t>(cfg.grid > 0 ? cfg.grid : gemm_sm90_grid(m, n, cfg, num_sms), 1);
    // The plan the launch runs at that grid (gemm_bind_split_tail: requested 1 is no split).
    const GemmTailPlan p = gemm_tail_plan(m, n, k, cfg, grid, std::max(cfg.tail_splits, 1));
    // Each CTA's time: its units (unit u runs on CTA u % grid: tile/scheduler.cuh), each streaming its k-blocks with
    // as many in flight as the ring holds or the unit has.
    std::vector<double> cta_us(static_cast<size_t>(grid), 0.0);
    const int64_t units = p.units();
    for (int64_t u = 0; u < units; ++u) {
        const tile::WorkUnit w = tile::split_tail_unit(static_cast<int32_t>(u), static_cast<int32_t>(p.dp_tiles),
                                                       p.splits, static_cast<int32_t>(num_kb));
        cta_us[static_cast<size_t>(u % grid)] += unit_stream_us(cfg, static_cast<double>(w.kb_count), a_mb, b_mb);
    }
    const double t_sm = *std::max_element(cta_us.begin(), cta_us.end());
    double t = bound_norm(weights_mb / kHbmMbPerUs, t_sm);
    if (p.splits >= 2) {
        // The tile's completing CTA reads every split's slot: the warps' rows inside M (16 per warp).
        const int64_t rows = std::min<int64_t>(cfg.block_m, (m + 15) / 16 * 16);
        t += kFixupUs + p.splits * static_cast<double>(rows * cfg.block_n) * 4.0 / 1e6 / kFixupMbPerUs;
    }
    return t;
}

std::optional<GemmConfig> gemm_cluster_k_plan(const GemmConfig& tile, int64_t m, int64_t n, int64_t k, int s,
                                              int num_sms) {
    const int64_t tiles = gemm_ceil_div(m, tile.block_m) * gemm_ceil_div(n, tile.block_n);
    const int stages = std::max(tile.stages, kernels::gemm_sm90_cluster_k_min_stages(tile.block_m, tile.block_n));
    if (num_sms < kGemmClusterKMinSms || stages > kernels::gemm_sm90_max_stages(tile.block_m, tile.block_n))
        return std::nullopt;
    if (tile.block_n / 8 % s != 0 || tiles * s > num_sms || gemm_ceil_div(k, tile.block_k) / s < kMinUnitKBlocks)
        return std::nullopt;
    GemmConfig kc = tile;
    kc.cluster_m = 1;
    kc.tail_splits = 1;
    kc.cluster_k = s;
    kc.stages = stages;
    kc.grid = static_cast<int>(tiles * s);
    return kc;
}

std::vector<GemmDecodeCandidate> gemm_decode_candidates(int64_t m, int64_t n, int64_t k, bool b_kn, int num_sms,
                                                        const GemmConfig& persistent) {
    std::vector<GemmDecodeCandidate> out;
    out.push_back({persistent, gemm_decode_cost_us(m, n, k, persistent, num_sms)});
    GemmConfig base = persistent;
    base.cluster_m = 1;
    base.block_m = m <= 64 ? 64 : 128;
    const int64_t num_kb = gemm_ceil_div(k, base.block_k);
    auto weigh = [&](const GemmConfig& c) { out.push_back({c, gemm_decode_cost_us(m, n, k, c, num_sms)}); };
    for (int bn = 256; bn >= 64; bn -= 16) {
        if (b_kn && bn % 64 != 0) continue;
        GemmConfig c = base;
        c.block_n = bn;
        c.tail_splits = 1;
        detail::gemm_complete_config(c, m, n, num_sms);
        weigh(c);  // whole tiles on the persistent grid
        const int max_splits = static_cast<int>(std::min<int64_t>(kMaxDecodeSplits, num_kb / kMinUnitKBlocks));
        for (int s = 2; s <= max_splits; ++s) {
            // Split on every SM: the tiles after the full waves (every tile, with fewer tiles than SMs) s ways.
            const GemmTailPlan p = gemm_tail_plan(m, n, k, c, num_sms, s);
            if (p.splits != s || p.units() > kMaxUnitsPerSm * num_sms) continue;
            GemmConfig split = c;
            split.tail_splits = s;
            split.grid = static_cast<int>(std::min<int64_t>(num_sms, p.units()));
            // The launch plans at its own grid: the same units only where that grid leaves the same tail.
            const GemmTailPlan at_grid = gemm_tail_plan(m, n, k, split, split.grid, s);
            if (at_grid.splits != s || at_grid.dp_tiles != p.dp_tiles) continue;
            weigh(split);
        }
        // K-clusters of s CTAs per tile.
        for (int s : {2, 4, 8})
            if (const std::optional<GemmConfig> kc = gemm_cluster_k_plan(c, m, n, k, s, num_sms)) weigh(*kc);
    }
    // M-clusters (64 < M <= 128): 64-row tiles, the two M-blocks of each N-block in a 2-CTA cluster sharing its B by
    // multicast, whole tiles at the plan's ring depth and at the deepest that fits; on as many SMs as fp8's 2-CTA
    // clusters need.
    if (m > 64 && m <= 128 && num_sms >= kGemmFp8ClusterMinSms) {
        for (int bn : {64, 128, 256}) {
            GemmConfig c = base;
            c.block_m = 64;
            c.block_n = bn;
            c.cluster_m = 2;
            c.tail_splits = 1;
            detail::gemm_complete_config(c, m, n, num_sms);
            weigh(c);
            c.stages = kernels::gemm_sm90_max_stages(64, bn);
            weigh(c);
        }
    }
    return out;
}

GemmConfig gemm_decode_plan(int64_t m, int64_t n, int64_t k, bool b_kn, int num_sms, const GemmConfig& persistent) {
    const std::vector<GemmDecodeCandidate> all = gemm_decode_candidates(m, n, k, b_kn, num_sms, persistent);
    // The first is `persistent`, which keeps its place unless another is more than the margin cheaper.
    GemmConfig best = all.front().config;
    double best_cost = all.front().cost_us * (1.0 - kGemmDecodeMargin);
    for (std::size_t i = 1; i < all.size(); ++i) {
        // K-clusters are weighed (bench-gemm --decode-sweep times the cheapest) but not chosen: the fastest of them
        // was 2-10 % ahead of this plan's pick at 13 of 48 shapes, but the model does not tell which (choosing by it
        // gained at most 0.2 % geomean and lost up to 10 % elsewhere; docs/gemm.md). The autotuner times them instead.
        // M-clusters likewise: the fastest of them lost to this plan's pick at 43 of 44 shapes (docs/gemm.md).
        if (all[i].config.cluster_k > 1 || all[i].config.cluster_m > 1) continue;
        if (all[i].cost_us < best_cost) {
            best_cost = all[i].cost_us;
            best = all[i].config;
        }
    }
    return best;
}

}  // namespace loom
