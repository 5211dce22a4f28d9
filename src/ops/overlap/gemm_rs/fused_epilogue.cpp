// gemm_rs's fused epilogue (RsAlgo::FusedEpilogue; RsAccHooks, kernels/overlap/gemm_rs.cuh): the GEMM's epilogue
// moves the peers' tiles and sums its own, with the SM transport (RsFusedSmState: the kernel numbers the calls) or the
// copy-engine transport (RsFusedCeState: a side stream copies the outbox's chunks; the host numbers the calls).
#include <algorithm>
#include <string>

#include "loom/jit/jit.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "ops/overlap/common/hooked_gemm.hpp"
#include "ops/overlap/common/plan.hpp"
#include "ops/overlap/gemm_rs/gemm_rs.hpp"
#include "runtime/stream_watchdog.hpp"

namespace loom::overlap {
namespace {

constexpr const char* kFusedHooks = "loom::kernels::overlap::RsAccHooks";

// The scratch: W - 1 slots (one per peer), each one band of blocks_per_rank x num_n tiles.
struct FusedShape {
    int64_t num_n, blocks_per_rank, slot_bytes, half_bytes;
};
FusedShape fused_shape(const RsCall& x, const GemmConfig& cfg) {
    FusedShape f;
    f.num_n = (x.N + cfg.block_n - 1) / cfg.block_n;
    f.blocks_per_rank = x.rows_seg / cfg.block_m;
    f.slot_bytes = f.blocks_per_rank * f.num_n * cfg.block_m * cfg.block_n * static_cast<int64_t>(x.out_bytes);
    f.half_bytes = std::max(x.W - 1, 1) * f.slot_bytes;  // one slot per peer
    return f;
}

// The hook arguments both transports share (the call's number and scratch half are the transport's).
kernels::overlap::RsFusedHookArgs fused_args(const RsCall& x, const FusedShape& f, const GemmConfig& cfg,
                                             uint64_t* tile_in) {
    const int W = x.W, me = x.world->local_rank();
    const Ctx ctx = x.world->ctx();
    kernels::overlap::RsFusedHookArgs h{};
    h.tile_in = tile_in;
    h.heap_bytes = static_cast<int64_t>(ctx.heap_size);
    h.slot_bytes = f.slot_bytes;
    h.timeout_ns = ctx.wait_timeout_ns;
    h.me = me;
    h.world = W;
    h.blocks_per_rank = static_cast<int32_t>(f.blocks_per_rank);
    h.num_n = static_cast<int32_t>(f.num_n);
    h.shift_m = static_cast<int32_t>(((me + 1) % W) * f.blocks_per_rank);
    h.rows_per_rank = static_cast<int32_t>(x.rows_seg);
    h.group = std::min<int32_t>(cfg.group_m, static_cast<int32_t>(f.blocks_per_rank));
    return h;
}

// The RsAccHooks GEMM; a diagnostic call's (x.diag) built with its bits 1, 2 and 8 (wrong results by design).
const jit::Kernel& fused_kernel(const RsCall& x, const GemmConfig& cfg) {
    jit::KernelSpec spec = gemm_kernel_spec(cfg, x.a.dtype, x.c.dtype, gemm_kernel_bias(cfg, x.c.dtype, GemmOptions{}),
                                            false, kFusedHooks, kRsHeader);
    if ((x.diag & 11) != 0) spec.defines.push_back(fmt::format("LOOM_DIAG_RS_FUSED_SKIP={}", x.diag & 11));
    return jit::get_kernel(spec);
}

void fused_sm(const RsCall& x, const GemmConfig& cfg, const FusedShape& f) {
    RsFusedSmState& st = op_state<RsFusedSmState>(*x.world, "gemm_rs", x.captured);
    const int64_t half_stride = static_cast<int64_t>(
        ensure_parity_halves(*x.world, st.buf, static_cast<std::size_t>(f.half_bytes), x.captured));
    const jit::Kernel& kernel = fused_kernel(x, cfg);
    // No per-call value: the kernel numbers the call and picks its half (kernels/overlap/gemm_rs.cuh).
    kernels::overlap::RsFusedHookArgs h = fused_args(x, f, cfg, &st.sig->tile_in[0][0]);
    h.scratch = static_cast<uint8_t*>(st.buf.p);
    h.launches = &st.sig->launches;
    h.half_stride = half_stride;
    const GemmSm90Launch l = gemm_sm90_launch(x.a, x.b, x.c, gemm_options(x.sc), cfg, x.num_sms, x.stream);
    kernel(l.launch, l.tmap_a, l.tmap_b, l.tmap_d, l.args, h);
}

// The copy stream: per peer d (bands in the GEMM's order, rank me + 1's rows first), per chunk (in a band, groups in
// order and each group's columns in order: the order the GEMM completes them), wait until the GEMM stored the whole
// chunk into the outbox, copy it into our slot of d's scratch half and raise tile_in[me][lead] := epoch there.
// `no_bytes` (diagnostics): the signals without the copies' bytes.
void enqueue_copies(World& world, RsFusedCeState& st, const kernels::overlap::RsFusedHookArgs& h, int64_t chunk_n,
                    int64_t tile_bytes, uint64_t epoch, bool no_bytes, detail::WatchedWaits& watch) {
    const int W = h.world, me = h.me;
    const int32_t bpr = h.blocks_per_rank, nn = h.num_n, group = h.group;
    for (int i = 1; i < W; ++i) {
        const int d = (me + i) % W;
        for (int32_t first = 0; first < bpr; first += group) {
            const int64_t rows = std::min(group, bpr - first);
            for (int32_t n0 = 0; n0 < nn; n0 += static_cast<int32_t>(chunk_n)) {
                const int64_t cols = std::min<int64_t>(chunk_n, nn - n0);
                const int64_t at = kernels::overlap::rs_slot_tile(first, n0, bpr, nn, group);  // first tile
                const int64_t lead = int64_t(d) * bpr * nn + at;
                st.stored_total[lead] += static_cast<uint64_t>(rows * cols);
                watch.wait_value(st.side.stream, &st.sig->stored[lead], st.stored_total[lead], me);  // own GEMM
                stream_ops::put_signal_ce(
                    world, h.scratch + kernels::overlap::rs_slot_of(me, d) * h.slot_bytes + at * tile_bytes,
                    h.outbox + d * h.slot_bytes + at * tile_bytes,
                    no_bytes ? 0 : static_cast<std::size_t>(rows * cols * tile_bytes), &st.sig->tile_in[me][lead],
                    epoch, d, st.side.stream);
            }
        }
    }
}

// The copy-engine transport. The outbox is local ([W][slot_bytes], band d's tiles in slot d, the slot layout of
// rs_slot_tile). A chunk: chunk_n consecutive columns of one raster group of a band, contiguous in the layout.
void fused_ce(const RsCall& x, const GemmConfig& cfg, const FusedShape& f, std::size_t ce_chunk_bytes) {
    RsFusedCeState& st = op_state<RsFusedCeState>(*x.world, "gemm_rs", x.captured);
    const int64_t half_stride = static_cast<int64_t>(
        ensure_parity_halves(*x.world, st.buf, static_cast<std::size_t>(f.half_bytes), x.captured));
    const jit::Kernel& kernel = fused_kernel(x, cfg);
    kernels::overlap::RsFusedHookArgs h = fused_args(x, f, cfg, &st.sig->tile_in[0][0]);
    const uint64_t epoch = ++st.calls;
    h.scratch = static_cast<uint8_t*>(st.buf.p) + static_cast<int64_t>(epoch % 2) * half_stride;
    h.epoch = epoch;
    const GemmSm90Launch l = gemm_sm90_launch(x.a, x.b, x.c, gemm_options(x.sc), cfg, x.num_sms, x.stream);
    const int64_t tile_bytes = int64_t(cfg.block_m) * cfg.block_n * x.out_bytes;
    const int64_t want = ce_chunk_bytes > 0 ? static_cast<int64_t>(ce_chunk_bytes) : int64_t(2) << 20;
    const int64_t chunk_n = std::clamp<int64_t>(want / (h.group * tile_bytes), 1, f.num_n);
    h.outbox = static_cast<uint8_t*>(ensure_local(st.outbox, static_cast<std::size_t>(x.W * f.slot_bytes)));
    const int64_t num_tiles = x.M / cfg.block_m * f.num_n;
    if (static_cast<int64_t>(st.stored_total.size()) < num_tiles) st.stored_total.resize(num_tiles, 0);
    h.stored = st.sig->stored;
    h.chunk_n = static_cast<int32_t>(chunk_n);
    // The side stream starts after the previous call (outbox read out, peers' scratch half free: see the kernel's
    // write-after-read note); the GEMM runs concurrently with it.
    detail::WatchedWaits watch(*x.world, "gemm_rs", epoch, x.stream);  // the copy stream's waits, bounded on the host
    fork(st.side, x.stream);
    kernel(l.launch, l.tmap_a, l.tmap_b, l.tmap_d, l.args, h);
    // Diagnostics, wrong results: bit 16 leaves out the copy engine's bytes (signals only).
    enqueue_copies(*x.world, st, h, chunk_n, tile_bytes, epoch, (x.diag & 16) != 0, watch);
    join(st.side, x.stream);
    watch.enqueued();
}

}  // namespace

void gemm_rs_fused(const RsCall& x, std::size_t ce_chunk_bytes) {
    GemmConfig cfg = x.plan.gemm;
    const std::string unfit = fused_unfit(x.rows_seg, cfg);
    LOOM_CHECK(unfit.empty(), "gemm_rs (fused epilogue): expected {}", unfit);
    if (x.transport == RsTransport::CopyEngine) {
        // A chunk is a run of columns of one raster group, waited for whole, so every CTA must meet all its tiles of
        // peers' rows before its first own tile: raster groups must not straddle a band boundary (group_m divides
        // the M-blocks per rank), which also makes the slot layout's groups the raster's.
        groups_inside_bands(cfg, x.rows_seg / cfg.block_m);
    }
    const FusedShape f = fused_shape(x, cfg);
    if (fused_by_copy_engine(x.transport, x.W)) return fused_ce(x, cfg, f, ce_chunk_bytes);
    fused_sm(x, cfg, f);
}

}  // namespace loom::overlap
