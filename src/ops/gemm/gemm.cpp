#include "loom/ops/gemm.hpp"

#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "loom/runtime/error.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "loom/runtime/tma.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "runtime/env_vars.hpp"

namespace loom {
namespace detail {

GemmDevice gemm_device() {
    static std::mutex mu;
    static std::unordered_map<int, GemmDevice> cache;
    int dev = 0;
    LOOM_CHECK_CUDA(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(dev);
    if (it != cache.end()) return it->second;
    GemmDevice info;
    int major = 0, minor = 0;
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&info.num_sms, cudaDevAttrMultiProcessorCount, dev));
    info.arch = major * 10 + minor;
    info.device = dev;
    cache.emplace(dev, info);
    return info;
}

bool gemm_takes_sm80(const GemmOptions& o, const GemmDevice& dev) {
    return dev.arch < 90 || o.force_sm80 || env_flag("LOOM_GEMM_FORCE_SM80");
}

void gemm_complete_config(GemmConfig& c, int64_t m, int64_t n, int num_sms) {
    c.stages = kernels::gemm_sm90_plan_stages(c.block_m, c.block_n);
    // Keep the CTAs that run together close to square in L2: group_m M-blocks x (num_sms / group_m) N-blocks.
    c.group_m = static_cast<int>(std::clamp<int64_t>(
        static_cast<int64_t>(std::lround(std::sqrt(num_sms * static_cast<double>(c.block_n) / c.block_m))), 1,
        std::max<int64_t>((m + c.block_m - 1) / c.block_m, 1)));
    if (const int64_t forced = env_int("LOOM_GEMM_GROUP_M", 0); forced > 0) c.group_m = static_cast<int>(forced);
    if (c.cluster_m > 1) c.group_m = std::max(c.cluster_m, c.group_m / c.cluster_m * c.cluster_m);
    c.grid = static_cast<int>(gemm_sm90_grid(m, n, c, num_sms));
}

}  // namespace detail
namespace {

// How efficiently a BLOCK_M x BLOCK_N tile runs, relative to 128 x 256 (1.0), for the heuristic's cost model.
// 128- and 192-row tiles: fitted to two bench-gemm --sweep calls on the H200 (docs/gemm.md "Session 14": every config
// of the 13 shapes, log(ratio to cuBLASLt) = shape + tile class, waves counted whole; 13-47 runs per class), after the
// partial-slab TMA epilogue gave BLOCK_N 176 / 208 / 224 / 240 the TMA stores. Their spread is +-1-2 %, hence
// kGemmTileMargin. The overlapped GEMMs (GemmTiles::Overlap) take the same 128-row figures: their hooked kernels are
// the plain kernel's mainloop and epilogue (docs/overlap.md "Session 17"). 64-row tiles (M <= 64): the earlier
// per-BLOCK_N table (session 8).
double tile_efficiency(int bm, int bn) {
    struct Point {
        int bn;
        double eff;
    };
    static constexpr Point kSession8[] = {{256, 1.0}, {224, 0.93}, {192, 0.88}, {176, 0.85}, {128, 0.80}};
    static constexpr Point k128[] = {{256, 1.0},   {240, 0.984}, {224, 0.986}, {208, 0.982}, {192, 0.982},
                                     {176, 0.974}, {160, 0.955}, {144, 0.945}, {128, 0.926}};
    static constexpr Point k192[] = {{176, 0.995}, {160, 0.986}, {144, 0.975}, {128, 0.956}};
    auto lookup = [bn](const auto& table) {
        for (const Point& p : table)
            if (bn >= p.bn) return p.eff;
        const Point& last = table[std::size(table) - 1];
        return last.eff - 0.15 * (last.bn - bn) / 64.0;  // narrower tiles: more smem traffic per flop
    };
    if (bm <= 64) return lookup(kSession8);
    return bm <= 128 ? lookup(k128) : lookup(k192);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr int kMaxTailSplits = 256;

// Split-tail workspace of one (device, stream): fp32 partial slots and one arrival counter per tail tile, grown on
// demand and kept for the life of the process. The counters are zeroed once, when allocated (stream-ordered before
// the first launch that uses them); every launch leaves them zero again. Launches on one stream are ordered, so
// they can share it; other streams get their own.
struct TailWorkspace {
    float* partials = nullptr;
    size_t partial_floats = 0;
    uint32_t* counters = nullptr;
    size_t num_counters = 0;
};

std::mutex& tail_workspace_mutex() {
    static std::mutex mu;
    return mu;
}

// The workspace of (device, stream) with room for `partial_floats` and `num_counters`. The caller holds
// tail_workspace_mutex() from here until its launch is enqueued: growing one synchronises the stream and frees the
// old buffers. nullptr while the stream captures a graph: a captured launch would keep this workspace's pointers,
// which a later call on the stream may free (growth) or use at the same time as a replay (on any stream).
TailWorkspace* tail_workspace(int device, cudaStream_t stream, size_t partial_floats, size_t num_counters) {
    if (stream_ops::capturing(stream)) return nullptr;
    static std::map<std::pair<int, cudaStream_t>, TailWorkspace> cache;
    TailWorkspace& ws = cache[{device, stream}];
    if (ws.partial_floats >= partial_floats && ws.num_counters >= num_counters) return &ws;
    LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));  // earlier launches on this stream may still use the old ones
    if (ws.partial_floats < partial_floats) {
        LOOM_CHECK_CUDA(cudaFree(ws.partials));
        ws.partials = nullptr;
        ws.partial_floats = 0;
        const size_t floats = (partial_floats + (1u << 18) - 1) / (1u << 18) * (1u << 18);  // whole MiB
        LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&ws.partials), floats * sizeof(float)));
        ws.partial_floats = floats;
    }
    if (ws.num_counters < num_counters) {
        LOOM_CHECK_CUDA(cudaFree(ws.counters));
        ws.counters = nullptr;
        ws.num_counters = 0;
        const size_t count = std::max<size_t>(num_counters, 1024);
        LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&ws.counters), count * sizeof(uint32_t)));
        LOOM_CHECK_CUDA(cudaMemsetAsync(ws.counters, 0, count * sizeof(uint32_t), stream));
        ws.num_counters = count;
    }
    return &ws;
}

}  // namespace

std::string GemmConfig::str() const {
    if (sm80) return "sm80 128x128x32 st4 (mma.sync)";
    return fmt::format("sm90 {}x{}x{} st{} wg{} cluster{} g{} grid{}{}{}", block_m, block_n, block_k, stages,
                       consumers(), cluster_m, group_m, grid,
                       tail_splits > 1 ? fmt::format(" tail{}", tail_splits) : "", tma_store ? "" : " direct-store");
}

GemmTailPlan gemm_tail_plan(int64_t m, int64_t n, int64_t k, const GemmConfig& cfg, int64_t grid, int requested) {
    GemmTailPlan p;
    p.tiles = ceil_div(m, cfg.block_m) * ceil_div(n, cfg.block_n);
    p.dp_tiles = p.tiles;
    grid = std::max<int64_t>(grid, 1);
    const int64_t tail = p.tiles % grid;
    if (cfg.sm80 || cfg.cluster_m != 1 || tail == 0 || requested == 1) return p;
    const int64_t num_k_blocks = ceil_div(k, cfg.block_k);
    const int64_t s =
        requested > 0 ? std::min<int64_t>(requested, num_k_blocks) : std::min<int64_t>(grid / tail, num_k_blocks / 4);
    if (s < 2) return p;
    p.dp_tiles = p.tiles - tail;
    p.tail_tiles = tail;
    p.splits = static_cast<int>(std::min<int64_t>(s, kMaxTailSplits));
    return p;
}

GemmConfig gemm_heuristic(int64_t m, int64_t n, int64_t k, bool b_kn, int arch, int num_sms, bool split_tail,
                          GemmTiles tile_set, DType in) {
    GemmConfig cfg;
    // The same 128-byte rows, so the same tiles, stages and cost model for every input type: an fp8 k-block holds
    // twice the elements (and MMA work, at twice the rate).
    cfg.block_k = kernels::gemm_block_k(static_cast<int>(dtype_size(in)));
    if (arch < 90) {
        cfg.sm80 = true;
        return cfg;
    }
    cfg.block_m = m <= 64 ? 64 : 128;
    // No clusters by default. Measured on the H200 (docs/perf/gemm.json vs gemm_cluster2.json, same call,
    // interleaved with cuBLASLt): 2-CTA clusters with B multicast 0.973x cuBLASLt (geomean over the 13
    // shapes; 0.66x before a819ef7 dropped a cluster-scope fence from every slot release), one CTA per tile 0.987x.
    // LOOM_GEMM_CLUSTER=2 still selects the cluster kernel.
    // fp8 is the exception: at twice bf16's MMA rate each k-block's operands must arrive twice as fast, and with K
    // rows that are not a multiple of 128 bytes (each TMA row then spans two L2 lines) one CTA per tile ran at 0.70x
    // cuBLASLt (8192 x 8192 x 3696); clusters, whose multicast halves B's L2 reads, read 1.01x there and
    // 0.990x geomean over the 13 shapes against 0.963-0.965 without (docs/gemm.md "FP8"). They need two M-blocks, and
    // the whole GPU: on an MPS share (4 ranks on one H200, 26 SMs each) the clustered kernel ran 1.5-1.7x cuBLASLt's
    // time where single-CTA tiles ran 0.9x (docs/gemm.md "FP8"). (The overlapped GEMMs' hooks order single-CTA tiles:
    // GemmTiles::Overlap plans without clusters, so with the split tail.)
    cfg.cluster_m =
        dtype_size(in) == 1 && m > 128 && tile_set == GemmTiles::Plain && num_sms >= kGemmFp8ClusterMinSms ? 2 : 1;
    if (const int64_t forced = env_int("LOOM_GEMM_CLUSTER", 0); forced == 1 || forced == 2) {
        cfg.cluster_m = static_cast<int>(forced);
    }
    // Split-K tail (single-CTA tiles only): automatic (0), off (LOOM_GEMM_TAIL_SPLITS=0 or 1) or forced (n >= 2).
    const int64_t forced_splits = env_int("LOOM_GEMM_TAIL_SPLITS", -1);
    const bool may_split = split_tail && cfg.cluster_m == 1 && forced_splits != 0 && forced_splits != 1;
    const int requested = forced_splits >= 2 ? static_cast<int>(std::min<int64_t>(forced_splits, kMaxTailSplits)) : 0;
    // 192-row tiles compete with the 128-row ones (single-CTA tiles, BLOCK_N <= kGemmMaxBlockN192).
    const bool plain = tile_set == GemmTiles::Plain;
    const int block_ms[] = {cfg.block_m, 192};
    const int num_block_ms = m > 128 && plain && cfg.cluster_m == 1 ? 2 : 1;
    // every_sm: plan the split tail on every SM rather than on the persistent grid, min(tiles, SMs), which leaves a
    // GEMM with fewer tiles than SMs no tail to split; on every SM its one partial wave is the tail, split along K
    // over more CTAs than there are tiles.
    auto choose = [&](bool every_sm) {
        GemmConfig c = cfg;
        double best = 1e300;
        for (int i = 0; i < num_block_ms; ++i) {
            const int bm = block_ms[i];
            const int64_t num_m = ceil_div(m, bm);
            for (int bn = bm == 192 ? kGemmMaxBlockN192 : 256; bn >= 64; bn -= 16) {
                if (b_kn && bn % 64 != 0) continue;
                const int64_t tiles = num_m * ceil_div(n, bn);
                // Waves of the persistent grid; a split tail's last wave costs 1 / s of a tile per split (more when
                // forced splits outnumber the grid) plus the fix-up.
                double waves = static_cast<double>(ceil_div(tiles, num_sms));
                if (may_split) {
                    GemmConfig t = c;
                    t.block_m = bm;
                    t.block_n = bn;
                    const int64_t grid = every_sm ? num_sms : std::min<int64_t>(tiles, num_sms);
                    const GemmTailPlan p = gemm_tail_plan(m, n, k, t, grid, requested);
                    if (p.splits >= 2)
                        waves = static_cast<double>(p.dp_tiles / grid) +
                                static_cast<double>(ceil_div(p.tail_tiles * p.splits, grid)) / p.splits +
                                kGemmTailFixupCost;
                }
                // The area each SM sweeps, scaled by how efficiently a tile of that size runs; 128 x 256, the tile
                // measured most, wins within kGemmTileMargin; other ties go to the tiles tried first (128 rows, wider).
                const double margin = bm == 128 && bn == 256 ? 1.0 : 1.0 + kGemmTileMargin;
                const double cost = waves * bm * bn / tile_efficiency(bm, bn) * margin;
                if (cost < best * (1 - 1e-9)) {
                    best = cost;
                    c.block_m = bm;
                    c.block_n = bn;
                }
            }
        }
        detail::gemm_complete_config(c, m, n, num_sms);
        if (may_split) {
            const GemmTailPlan p = gemm_tail_plan(m, n, k, c, every_sm ? num_sms : c.grid, requested);
            c.tail_splits = p.splits;
            // Planned on every SM: a CTA per split unit (the launch then sees every tile as tail at this grid).
            if (every_sm && p.splits >= 2) c.grid = static_cast<int>(std::min<int64_t>(num_sms, p.units()));
        }
        return c;
    };
    cfg = choose(false);
    // Single-wave split-K only where the persistent plan leaves more than half the SMs idle. Measured (H200,
    // docs/gemm.md "Skinny M"): 8 x 4096 x 4096 0.81 -> 0.93x cuBLASLt (64 tiles of 64 x 64 -> 64 x 128 split 4);
    // with a wave nearly full (128 tiles of 64 x 64 at M = 16 ... 64, N = 8192) the split plans' wider tiles lost
    // 3-10 % and were not taken. Since the rings went 12 deep (session 23) a wave over a third full streams a short
    // K faster whole: 64 tiles of 64 x 64 at K = 4096 took 19.8 us against the split's 21.1 (bf16; fp8 13.1 against
    // 15.6), while at K = 14336 the split still won (bf16 44.7 against 49.8 us; fp8 tied) and at 32 tiles or fewer
    // it won everywhere (16 x 2048 x 4096: 14.7 against 18.3 us). Only the 64-row tiles' 12-stage rings stream so:
    // 128 x 64 tiles (8 stages) whole at 128 x 4096 x 14336 fp8 (112 k-blocks) took 35.4 us, 0.79x cuBLASLt. Forced
    // splits (LOOM_GEMM_TAIL_SPLITS) apply whenever the wave is at most half full.
    const bool wave_thin = static_cast<int64_t>(cfg.grid) * 2 <= num_sms;
    const bool short_k = ceil_div(k, cfg.block_k) <= kGemmSkinnyWholeMaxKBlocks && requested == 0;
    const bool short_k_streams_whole = short_k && cfg.block_m == 64 && static_cast<int64_t>(cfg.grid) * 3 > num_sms;
    if (may_split && wave_thin && !short_k_streams_whole) {
        // 64 < M <= 128: 64 x 64 tiles over the M-blocks, whole, where they fill more than half the SMs and K is short
        // (the same streaming as above, with each N-block's B read by both M-blocks through L2). Measured (H200,
        // docs/gemm.md "Session 23", call 8), against the split 128-row plan: 128 x 4096 x 4096 21.3 / 24.2 us (bf16)
        // and 13.7 / 18.0 (fp8), 128 x 4096 x 8192 32.6 / 33.7 and 20.4 / 23.2, 128 x 3072 x 4096 19.4 / 19.5 and
        // 13.0 / 15.4; at 64 such tiles (128 x 2048 x 4096) the split won in bf16 (16.0 against 18.7 us). M >= 96:
        // the second M-block's 64-row A boxes mostly past M slow every load (as session 10 found for one M-block),
        // and at M = 72 the plan lost (call 10: 72 x 4096 x 8192 bf16 42.5 against 33.1 us).
        if (short_k && tile_set == GemmTiles::Plain && m >= kGemmNarrowMinM && m <= 128) {
            GemmConfig narrow = cfg;
            narrow.block_m = 64;
            narrow.block_n = 64;
            narrow.tail_splits = 1;
            detail::gemm_complete_config(narrow, m, n, num_sms);
            if (static_cast<int64_t>(narrow.grid) * 2 > num_sms) return narrow;
        }
        cfg = choose(true);
    }
    return cfg;
}

int64_t gemm_sm90_grid(int64_t m, int64_t n, const GemmConfig& cfg, int num_sms) {
    // Clusters of cluster_m CTAs pair adjacent M-blocks; every CTA of a cluster walks the same tiles.
    const int64_t cm = std::max(cfg.cluster_m, 1);
    const int64_t cluster_tiles = ceil_div(ceil_div(m, cfg.block_m), cm) * ceil_div(n, cfg.block_n);
    return std::max<int64_t>(std::min<int64_t>(cluster_tiles, num_sms / cm), 1) * cm;
}

void gemm_validate_config(const GemmConfig& c, bool b_kn, DType in) {
    if (c.sm80) return;
    LOOM_CHECK(c.block_m == 64 || c.block_m == 128 || c.block_m == 192,
               "gemm config: expected block_m 64, 128 or 192, given {}", c.block_m);
    LOOM_CHECK(c.block_n % 16 == 0 && c.block_n >= 16 && c.block_n <= 256,
               "gemm config: expected block_n a multiple of 16 in [16, 256], given {}", c.block_n);
    // Three consumer warpgroups compile under a 128-register cap (512 threads): wgmma n208 and wider needs more.
    LOOM_CHECK(c.block_m != 192 || c.block_n <= kGemmMaxBlockN192,
               "gemm config: block_m 192 expects block_n <= {} (the 128 registers of a 512-thread CTA), given {}",
               kGemmMaxBlockN192, c.block_n);
    LOOM_CHECK(c.block_m != 192 || c.cluster_m == 1, "gemm config: block_m 192 expects cluster_m 1, given {}",
               c.cluster_m);
    LOOM_CHECK(!b_kn || c.block_n % 64 == 0, "gemm config: B as [K, N] needs block_n a multiple of 64, given {}",
               c.block_n);
    const int block_k = kernels::gemm_block_k(static_cast<int>(dtype_size(in)));
    LOOM_CHECK(c.block_k == block_k, "gemm config: expected block_k {} (one 128-byte row of {}), given {}", block_k,
               dtype_name(in), c.block_k);
    LOOM_CHECK(c.stages >= 2 && c.stages <= kernels::kGemmSm90MaxStages,
               "gemm config: expected stages in [2, {}], given {}", kernels::kGemmSm90MaxStages, c.stages);
    LOOM_CHECK(kernels::gemm_sm90_smem_bytes(c.block_m, c.block_n, c.stages) <= kernels::kGemmSm90MaxSmem,
               "gemm config: {} needs {} B of shared memory, the limit is {}", c.str(),
               kernels::gemm_sm90_smem_bytes(c.block_m, c.block_n, c.stages), kernels::kGemmSm90MaxSmem);
    LOOM_CHECK(c.cluster_m == 1 || c.cluster_m == 2, "gemm config: expected cluster_m 1 or 2, given {}", c.cluster_m);
    LOOM_CHECK(c.group_m >= 1, "gemm config: expected group_m >= 1, given {}", c.group_m);
    LOOM_CHECK(c.grid >= 0 && c.grid % c.cluster_m == 0,
               "gemm config: expected grid >= 0 and a multiple of cluster_m {}, given {}", c.cluster_m, c.grid);
    LOOM_CHECK(c.tail_splits >= 1 && c.tail_splits <= kMaxTailSplits,
               "gemm config: expected tail_splits in [1, {}] (1: no split tail), given {}", kMaxTailSplits,
               c.tail_splits);
    LOOM_CHECK(c.tail_splits == 1 || c.cluster_m == 1,
               "gemm config: the split tail needs cluster_m 1, given tail_splits {} with cluster_m {}", c.tail_splits,
               c.cluster_m);
}

void gemm_validate(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o, bool allow_f8) {
    const bool f8 = a.dtype == DType::F8E4M3;
    if (allow_f8) {
        LOOM_CHECK(a.dtype == DType::BF16 || a.dtype == DType::F16 || f8,
                   "gemm: expected A bf16, f16 or f8e4m3, given {}", dtype_name(a.dtype));
    } else {
        LOOM_CHECK(a.dtype == DType::BF16 || a.dtype == DType::F16, "gemm: expected A bf16 or f16, given {}",
                   dtype_name(a.dtype));
    }
    LOOM_CHECK(b.dtype == a.dtype, "gemm: expected B of A's dtype {}, given {}", dtype_name(a.dtype),
               dtype_name(b.dtype));
    LOOM_CHECK(c.dtype == DType::BF16 || c.dtype == DType::F16 || c.dtype == DType::F32,
               "gemm: expected C bf16, f16 or f32, given {}", dtype_name(c.dtype));
    const int64_t m = a.rows, k = a.cols;
    const int64_t n = o.b_kn ? b.cols : b.rows;
    const int64_t bk = o.b_kn ? b.rows : b.cols;
    LOOM_CHECK(m > 0 && n > 0 && k > 0, "gemm: expected non-empty shapes, given M={} N={} K={}", m, n, k);
    LOOM_CHECK(bk == k, "gemm: expected B with K={} ({}), given {} x {}", k, o.b_kn ? "[K, N]" : "[N, K]", b.rows,
               b.cols);
    LOOM_CHECK(c.rows == m && c.cols == n, "gemm: expected C of {} x {}, given {} x {}", m, n, c.rows, c.cols);
    LOOM_CHECK(n % 8 == 0 && k % 8 == 0, "gemm: expected N and K multiples of 8, given N={} K={}", n, k);
    if (f8) {
        // wgmma takes 8-bit operands K-major only; TMA needs 16-byte rows.
        LOOM_CHECK(!o.b_kn,
                   "gemm: f8e4m3 inputs expect B as [N, K] (wgmma reads 8-bit operands K-major only), given "
                   "b_kn (B as [K, N])");
        LOOM_CHECK(k % 16 == 0, "gemm: f8e4m3 inputs expect K a multiple of 16 (16-byte rows), given K={}", k);
    }
    LOOM_CHECK(m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX, "gemm: shapes must fit in int32, given {} {} {}", m,
               n, k);
    for (const auto* v : {&a, &b, &c}) {
        const char* name = v == &a ? "A" : v == &b ? "B" : "C";
        LOOM_CHECK(v->data != nullptr, "gemm: {} has a null data pointer", name);
        LOOM_CHECK(reinterpret_cast<std::uintptr_t>(v->data) % 16 == 0,
                   "gemm: expected {} 16-byte aligned, given address {}", name, v->data);
        LOOM_CHECK(v->stride() >= v->cols, "gemm: expected {}'s ld >= cols {}, given {}", name, v->cols, v->stride());
        LOOM_CHECK((v->stride() * dtype_size(v->dtype)) % 16 == 0,
                   "gemm: expected {}'s row stride a multiple of 16 bytes, given ld {} ({} B)", name, v->stride(),
                   v->stride() * dtype_size(v->dtype));
    }
    if (o.bias.data) {
        LOOM_CHECK(o.bias.dtype == DType::F32 || o.bias.dtype == DType::BF16 || o.bias.dtype == DType::F16,
                   "gemm: expected bias f32, bf16 or f16, given {}", dtype_name(o.bias.dtype));
        LOOM_CHECK(static_cast<int64_t>(o.bias.count) == n, "gemm: expected bias of N={} elements, given {}", n,
                   o.bias.count);
        LOOM_CHECK(reinterpret_cast<std::uintptr_t>(o.bias.data) % 4 == 0, "gemm: expected bias 4-byte aligned");
    }
    LOOM_CHECK(std::isfinite(o.alpha) && std::isfinite(o.beta), "gemm: expected finite alpha/beta, given {} {}",
               o.alpha, o.beta);
    gemm_check_device_scale("gemm", "scale_a", o.scale_a);
    gemm_check_device_scale("gemm", "scale_b", o.scale_b);
}

void gemm_check_device_scale(const char* op, const char* name, const float* p) {
    if (p == nullptr) return;
    LOOM_CHECK(reinterpret_cast<std::uintptr_t>(p) % 4 == 0, "{}: expected {} 4-byte aligned, given {}", op, name,
               static_cast<const void*>(p));
    cudaPointerAttributes attr{};
    const cudaError_t e = cudaPointerGetAttributes(&attr, p);
    LOOM_CHECK(e == cudaSuccess && (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged),
               "{}: expected {} to point at one float in device memory (read when the kernel runs), given {} ({})", op,
               name, static_cast<const void*>(p), e == cudaSuccess ? "host memory" : cudaGetErrorString(e));
}

bool gemm_plain_epilogue(const GemmConfig& cfg, DType out) {
    // 16-bit outputs only: what it saves is the stmatrix staging; with fp32 out (pair stores either way) the hooked
    // GEMMs' register allocation spilled without the arithmetic and did not with it.
    return !cfg.sm80 && cfg.tma_store && dtype_size(out) == 2 &&
           cfg.block_n >= kernels::gemm_store_box_cols(static_cast<int>(dtype_size(out)));
}

std::optional<DType> gemm_kernel_bias(const GemmConfig& cfg, DType out, const GemmOptions& opts) {
    if (opts.bias.data) return opts.bias.dtype;
    if (opts.alpha == 1.f && !opts.scale_a && !opts.scale_b && gemm_plain_epilogue(cfg, out)) return std::nullopt;
    return DType::F32;
}

jit::KernelSpec gemm_kernel_spec(const GemmConfig& cfg, DType in, DType out, std::optional<DType> bias, bool b_kn,
                                 const std::string& hooks, const std::string& header) {
    jit::KernelSpec spec;
    if (cfg.sm80) {
        spec.header = "loom/kernels/gemm/gemm_sm80.cuh";
        spec.name = "loom::kernels::gemm_sm80_mma_sync";
        spec.template_args = {dtype_cuda_name(in), dtype_cuda_name(out), dtype_cuda_name(bias.value_or(DType::F32)),
                              "4", b_kn ? "false" : "true"};
        return spec;
    }
    LOOM_CHECK(bias || gemm_plain_epilogue(cfg, out),
               "gemm: the kernel without alpha / bias (no bias type) needs the TMA-store epilogue, given {}",
               cfg.str());
    spec.header = header;
    spec.name = "loom::kernels::gemm_sm90_tma_wgmma";
    spec.template_args = {dtype_cuda_name(in),
                          dtype_cuda_name(out),
                          bias ? dtype_cuda_name(*bias) : "void",
                          std::to_string(cfg.block_m),
                          std::to_string(cfg.block_n),
                          std::to_string(cfg.stages),
                          b_kn ? "false" : "true",
                          std::to_string(cfg.cluster_m),
                          cfg.tma_store ? "true" : "false",
                          hooks};
    if (cfg.tail_splits >= 2) {
        // Hooks that publish tiles (epilogue / after-store parts) cannot take it (kernels/gemm.cuh asserts it too).
        LOOM_CHECK((hooks == "loom::tile::GemmNoHooks" || hooks == "loom::kernels::overlap::AgGemmHooks") &&
                       cfg.cluster_m == 1,
                   "gemm: the split tail is for the plain GEMM and ag_gemm's hooks with cluster_m 1, given hooks {}, "
                   "cluster_m {}",
                   hooks, cfg.cluster_m);
        spec.template_args.push_back("true");  // kSplitTail
    }
    return spec;
}

namespace {
// The kernels' arguments for whole tiles (no split tail); the split-tail fields are set by the caller that splits.
kernels::GemmArgs whole_tile_args(const MatrixView& c, int64_t m, int64_t n, int64_t k, const GemmOptions& o) {
    kernels::GemmArgs args{.d = c.data,
                           .bias = o.bias.data,
                           .ldd = c.stride(),
                           .m = static_cast<int32_t>(m),
                           .n = static_cast<int32_t>(n),
                           .k = static_cast<int32_t>(k),
                           .alpha = o.alpha,
                           .beta = o.beta};
    args.scale_a = o.scale_a;
    args.scale_b = o.scale_b;
    return args;
}
}  // namespace

GemmSm90Launch gemm_sm90_launch(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o,
                                const GemmConfig& cfg, int num_sms, cudaStream_t stream) {
    LOOM_CHECK(
        !cfg.tma_store || o.beta == 0.f,
        "gemm: the TMA-store epilogue does not read C: expected beta 0 or config.tma_store = false, given beta {}",
        o.beta);
    GemmSm90Launch l{};
    const int64_t m = a.rows, k = a.cols, n = c.cols;
    // The kernel assumes every tile has k-blocks (kernels/gemm.cuh: no zeroing after an empty mainloop).
    LOOM_CHECK(m > 0 && n > 0 && k > 0, "gemm: expected non-empty shapes, given M={} N={} K={}", m, n, k);
    // Skinny A (one M-block, single-CTA tiles): a box of M rows rounded up to 8 (one 128B-swizzle atom), not BLOCK_M.
    const int a_box_rows = m < cfg.block_m && cfg.cluster_m == 1 ? static_cast<int>((m + 7) / 8 * 8) : cfg.block_m;
    l.tmap_a = make_tma_2d(a, a_box_rows, cfg.block_k);
    // A K-major B tile is loaded in cluster_m slices (each CTA of a cluster multicasts one); [K, N] B in 64-column
    // boxes either way.
    l.tmap_b = o.b_kn ? make_tma_2d(b, cfg.block_k, 64) : make_tma_2d(b, cfg.block_n / cfg.cluster_m, cfg.block_k);
    // The plain epilogue stores per warp (16-row boxes); GEMMs with epilogue hooks re-encode it with
    // kGemmWholeTileBoxRows (see GemmSm90Launch::tmap_d).
    l.tmap_d =
        make_tma_2d(c, kernels::kGemmStoreBoxRows, kernels::gemm_store_box_cols(static_cast<int>(dtype_size(c.dtype))));
    l.args = whole_tile_args(c, m, n, k, o);
    l.args.a_box_rows = a_box_rows < cfg.block_m ? a_box_rows : 0;
    l.args.grid =
        tile::FastTileGrid::of(tile::scheduler_grid(m, n, cfg.block_m, cfg.block_n, cfg.cluster_m, cfg.group_m));
    const int64_t grid = cfg.grid > 0 ? cfg.grid : gemm_sm90_grid(m, n, cfg, num_sms);
    l.launch.grid = dim3(static_cast<unsigned>(std::max<int64_t>(grid, cfg.cluster_m)));
    l.launch.cluster = dim3(static_cast<unsigned>(cfg.cluster_m), 1, 1);
    l.launch.block = dim3(static_cast<unsigned>(128 * (cfg.consumers() + 1)));
    l.launch.smem = kernels::gemm_sm90_smem_bytes(cfg.block_m, cfg.block_n, cfg.stages);
    l.launch.stream = stream;
    return l;
}

int gemm_bind_split_tail(GemmSm90Launch& l, const GemmConfig& cfg, int64_t m, int64_t n, int64_t k, cudaStream_t stream,
                         std::unique_lock<std::mutex>& lock) {
    if (cfg.sm80 || cfg.tail_splits < 2) return 1;
    const GemmTailPlan tail = gemm_tail_plan(m, n, k, cfg, l.launch.grid.x, cfg.tail_splits);
    if (tail.splits < 2) return 1;
    // The kernel packs (tail tile << 8) | split into an int32 (splits <= 256).
    LOOM_CHECK(tail.units() <= INT32_MAX && tail.tail_tiles < (int64_t{1} << 23),
               "gemm: {} split-tail work units ({} tail tiles) are too many for {}", tail.units(), tail.tail_tiles,
               cfg.str());
    int device = 0;
    LOOM_CHECK_CUDA(cudaGetDevice(&device));
    std::unique_lock<std::mutex> held(tail_workspace_mutex());
    const size_t slot = static_cast<size_t>(kernels::gemm_split_tail_slot_floats(cfg.block_m, cfg.block_n));
    TailWorkspace* ws = tail_workspace(device, stream, static_cast<size_t>(tail.tail_tiles * tail.splits) * slot,
                                       static_cast<size_t>(tail.tail_tiles));
    if (ws == nullptr) return 1;  // capturing a graph: this launch runs without the split
    l.args.partials = ws->partials;
    l.args.tile_counters = ws->counters;
    l.args.dp_tiles = static_cast<int32_t>(tail.dp_tiles);
    l.args.tail_splits = tail.splits;
    l.args.work_units = static_cast<int32_t>(tail.units());
    l.args.num_k_blocks = static_cast<int32_t>(ceil_div(k, cfg.block_k));
    lock = std::move(held);
    return tail.splits;
}

void gemm(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o, cudaStream_t stream) {
    gemm_validate(a, b, c, o, /*allow_f8=*/true);
    const detail::GemmDevice dev = detail::gemm_device();
    LOOM_CHECK(dev.arch >= 80, "gemm: expected a GPU of compute capability >= 8.0, given {}.{}", dev.arch / 10,
               dev.arch % 10);
    std::string source;
    const GemmConfig cfg = detail::gemm_config_for(a, b, c, o, dev, stream, &source);
    detail::gemm_launch(a, b, c, o, cfg, dev, stream, source.c_str());
}

namespace detail {

void gemm_launch(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o, GemmConfig cfg,
                 const GemmDevice& dev, cudaStream_t stream, const char* source) {
    const int64_t m = a.rows, k = a.cols, n = c.cols;
    if (gemm_takes_sm80(o, dev)) cfg.sm80 = true;
    LOOM_CHECK(!cfg.sm80 || a.dtype != DType::F8E4M3,
               "gemm: f8e4m3 inputs need the Hopper kernel (wgmma, sm_90); the sm_80 path (mma.sync) takes bf16 / f16, "
               "given {}",
               dev.arch < 90 ? fmt::format("a GPU of compute capability {}.{}", dev.arch / 10, dev.arch % 10)
                             : std::string("force_sm80 / LOOM_GEMM_FORCE_SM80"));
    if (o.beta != 0.f) cfg.tma_store = false;  // only the direct-store epilogue reads C
    gemm_validate_config(cfg, o.b_kn, a.dtype);
    // Alpha = 1 without a bias takes the kernel whose epilogue does no arithmetic (where its epilogue applies).
    const std::optional<DType> bias_t = gemm_kernel_bias(cfg, c.dtype, o);
    const bool debug = source != nullptr && env_flag("LOOM_GEMM_DEBUG");
    if (cfg.sm80) {
        if (debug) fmt::print(stderr, "loom::gemm M={} N={} K={}: {} ({})\n", m, n, k, cfg.str(), source);
        const jit::Kernel* kernel = &jit::get_kernel(gemm_kernel_spec(cfg, a.dtype, c.dtype, bias_t, o.b_kn));
        const kernels::GemmArgs args = whole_tile_args(c, m, n, k, o);
        jit::LaunchConfig lc;
        lc.grid = dim3(static_cast<unsigned>(ceil_div(n, kernels::kSm80BlockN)),
                       static_cast<unsigned>(ceil_div(m, kernels::kSm80BlockM)));
        lc.block = dim3(kernels::kSm80Threads);
        lc.smem = kernels::gemm_sm80_smem_bytes(4);
        lc.stream = stream;
        LOOM_CHECK(lc.grid.y <= 65535, "gemm (sm80 path): expected M <= {}, given {}", 65535 * 128, m);
        const void* a_ptr = a.data;
        const void* b_ptr = b.data;
        const int64_t lda = a.stride(), ldb = b.stride();
        (*kernel)(lc, a_ptr, lda, b_ptr, ldb, args);
        return;
    }
    GemmSm90Launch l = gemm_sm90_launch(a, b, c, o, cfg, dev.num_sms, stream);
    // The split tail as this launch runs it (none without a tail at this grid, or while capturing a graph); the
    // workspace stays locked until the launch is enqueued.
    std::unique_lock<std::mutex> ws_lock;
    cfg.tail_splits = gemm_bind_split_tail(l, cfg, m, n, k, stream, ws_lock);
    if (debug) fmt::print(stderr, "loom::gemm M={} N={} K={}: {} ({})\n", m, n, k, cfg.str(), source);
    const jit::Kernel* kernel = &jit::get_kernel(gemm_kernel_spec(cfg, a.dtype, c.dtype, bias_t, o.b_kn));
    struct NoHooks {
    } hooks;  // loom::tile::GemmNoHooks: an empty object, one byte as a kernel parameter
    (*kernel)(l.launch, l.tmap_a, l.tmap_b, l.tmap_d, l.args, hooks);
}

}  // namespace detail

}  // namespace loom
