// The split-K workspace (fp32 partial slots and arrival counters) per (device, stream), and its binding to the Hopper
// kernel's split tail and to the gemv kernel's K-splits.
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "loom/runtime/error.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "runtime/stream_key.hpp"

namespace loom {
namespace {

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
    static std::map<std::pair<int, std::uint64_t>, TailWorkspace> cache;
    TailWorkspace& ws = cache[{device, detail::stream_key(stream)}];
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

detail::GemmSplitWorkspace detail::gemm_split_workspace(cudaStream_t stream, size_t partial_floats, size_t num_counters,
                                                        std::unique_lock<std::mutex>& lock) {
    int device = 0;
    LOOM_CHECK_CUDA(cudaGetDevice(&device));
    std::unique_lock<std::mutex> held(tail_workspace_mutex());
    TailWorkspace* ws = tail_workspace(device, stream, partial_floats, num_counters);
    if (ws == nullptr) return {};
    lock = std::move(held);
    return {ws->partials, ws->counters};
}

int gemm_bind_split_tail(GemmSm90Launch& l, const GemmConfig& cfg, int64_t m, int64_t n, int64_t k, cudaStream_t stream,
                         std::unique_lock<std::mutex>& lock) {
    if (cfg.sm80 || cfg.tail_splits < 2) return 1;
    const GemmTailPlan tail = gemm_tail_plan(m, n, k, cfg, l.launch.grid.x, cfg.tail_splits);
    if (tail.splits < 2) return 1;
    // The kernel packs (tail tile << 8) | split into an int32 (splits <= kGemmMaxTailSplits).
    LOOM_CHECK(tail.units() <= INT32_MAX && tail.tail_tiles < (int64_t{1} << 23),
               "gemm: {} split-tail work units ({} tail tiles) are too many for {}", tail.units(), tail.tail_tiles,
               cfg.str());
    const size_t slot = static_cast<size_t>(kernels::gemm_split_tail_slot_floats(cfg.block_m, cfg.block_n));
    const detail::GemmSplitWorkspace ws = detail::gemm_split_workspace(
        stream, static_cast<size_t>(tail.tail_tiles * tail.splits) * slot, static_cast<size_t>(tail.tail_tiles), lock);
    if (ws.partials == nullptr) return 1;  // capturing a graph: this launch runs without the split
    l.args.partials = ws.partials;
    l.args.tile_counters = ws.counters;
    l.args.dp_tiles = static_cast<int32_t>(tail.dp_tiles);
    l.args.tail_splits = tail.splits;
    l.args.work_units = static_cast<int32_t>(tail.units());
    l.args.num_k_blocks = static_cast<int32_t>(detail::gemm_ceil_div(k, cfg.block_k));
    return tail.splits;
}

}  // namespace loom
