// loom::gemm_rs: GEMM+ReduceScatter (kernels/gemm_rs.cuh, gemm_rs_pull.cuh; docs/overlap.md). Four algorithms:
//
// FusedEpilogue (M / W a multiple of BLOCK_M), one kernel on the caller's stream, every usable SM:
//   GEMM(tiles rows-of-rank-(me+1) first, own rows last): the accumulators of a peer's tile are stored into slot
//   `me` of its scratch half (e % 2) and tile_in[me][tile] := e raised there (or, copy-engine transport, into the
//   local outbox, whose chunks a side stream copies); an own tile waits for tile_in[q][tile] >= e of every peer q,
//   adds their copies to its accumulators and is stored to C. With the SM transport the call number e is the
//   device's (RsFusedSmSignals::launches), so the call can be captured in a CUDA graph; the copy-engine
//   transport's stream operations carry the host's. Each transport has its own state (scratch, signals).
//
// FusedPull (M / W a multiple of BLOCK_M; Auto's choice where ranks share a GPU, M / W is a multiple of 64 and
// K_loc x the input's bytes <= 8 KiB), on the caller's stream, every usable SM (kernels/gemm_rs_pull.cuh):
//   GEMM(partial [M, N] into this call's parity half of a symmetric buffer, bands interleaved tile by tile; each
//   tile published to its owner: tile_in[me][tile] := e there); the producer warpgroup's spare warps sum the W copies
//   of this rank's tiles into C as tile_in[q][tile] >= e for every rank q; gemm_rs_pull_finish sums what they left.
//
// Sequential (Auto's choice where ranks share a GPU and the fused pull is not): loom::gemm into this call's
// parity half of a symmetric [M, N]
//   buffer, then loom::reduce_scatter (straight into C when C is dense, else in place and copied out).
//
// ScatterReduce (any M / W; P scatter-reduce blocks, the same on every rank):
//   stream  fork ── GEMM(partial [M, N], tiles rows-of-rank-(me+1) first, own rows last; tile[i] = e) ── join
//   side         gemm_rs_scatter_reduce: wait freed[d] >= F; per ready tile: push its rows to their owners'
//                scratch, tile_in[me][tile] := e there; then (second walk) reduce its own rows once
//                tile_in[q][tile] >= e for every peer q; freed[me] += 1 on every peer at the end
//   F = P x (calls before e) (freed_total before the call).
#include <algorithm>
#include <string>
#include <vector>

#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/kernels/overlap/overlap_params.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/env.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "loom/runtime/tma.hpp"
#include "ops/collectives/coll_state.hpp"
#include "ops/overlap/overlap_state.hpp"
#include "ops/overlap/overlap_tune.hpp"

namespace loom {

namespace {
constexpr const char* kHeader = "loom/kernels/overlap/gemm_rs.cuh";
constexpr const char* kNotifyHooks = "loom::kernels::overlap::TileNotifyHooks";
constexpr const char* kFusedHooks = "loom::kernels::overlap::RsAccHooks";
constexpr const char* kPullHeader = "loom/kernels/overlap/gemm_rs_pull.cuh";
constexpr const char* kPullHooks = "loom::kernels::overlap::RsPullHooks";

// Whether the fused epilogue's tiles go through the copy engine: only between ranks (W > 1). Its stream operations
// carry the host's call number (RsFusedCeState), so such a call cannot be replayed from a CUDA graph; otherwise the
// kernel numbers its calls on the device (RsFusedSmState) and can.
bool fused_by_copy_engine(RsTransport transport, int world_size) {
    return transport == RsTransport::CopyEngine && world_size > 1;
}

// Why the fused epilogue cannot run this shape with this tile config, or "" when it can.
std::string fused_unfit(int64_t rows_seg, const GemmConfig& cfg) {
    if (rows_seg % cfg.block_m != 0)
        return fmt::format("M / W = {} a multiple of BLOCK_M = {} (each M-block one rank's rows)", rows_seg,
                           cfg.block_m);
    return "";
}

// The heuristic's tile for the fused epilogue: when asked for explicitly, a 64-row tile if M / W is a multiple of 64
// only; and a width next to the heuristic's where ptxas (CUDA 13.0) spills the RsAccHooks kernel (4-20 bytes at
// BLOCK_N 240 / 224, and 208 / 144 with fp32 out; the plain and the other hooked kernels do not):
// OverlapCompile.HookedGemmHasNoSpills compiles every width this leaves.
GemmConfig fused_config(GemmConfig c, int64_t m, int64_t n, int64_t rows_seg, int out_bytes, bool forced, int num_sms) {
    if (forced && rows_seg % c.block_m != 0 && rows_seg % 64 == 0) c.block_m = 64;
    if (c.block_n == 240 || c.block_n == 224) c.block_n = 256;
    if (out_bytes == 4 && (c.block_n == 208 || c.block_n == 144)) c.block_n -= 16;
    c.stages = kernels::gemm_sm90_plan_stages(c.block_m, c.block_n);
    c.grid = static_cast<int>(gemm_sm90_grid(m, n, c, num_sms));
    return c;
}

// The sequence's state: its partial products' halves (no signals).
struct RsSequentialState final : WorldState {
    static constexpr const char* kKey = "overlap/gemm_rs/sequential";
    explicit RsSequentialState(World&) {}
    void release(World& world) override { partials.buf.release(world); }
    overlap::PartialHalves partials;
};

void gemm_rs_sequential(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c,
                        const overlap::OpScale& sc, cudaStream_t stream, bool captured) {
    RsSequentialState& st = overlap::op_state<RsSequentialState>(world, "gemm_rs", captured);
    const int W = world.world_size(), me = world.rank();
    const int64_t M = a.rows, N = b.rows, rows_seg = M / W;
    const std::size_t es = dtype_size(c.dtype), count = static_cast<std::size_t>(M * N);
    const std::size_t seg = static_cast<std::size_t>(rows_seg * N);
    // Parity halves: a peer may still read (pull) this rank's partial of call e while call e + 1's GEMM runs; it has
    // finished by the time this rank's reduce_scatter of call e + 1 has met it, before call e + 2 writes the half.
    // Captured in a graph, every replay writes the same half: the ranks meet on the device first (every peer's
    // earlier reads of it are done). Eager calls load that barrier's kernel (loading is not allowed in a capture).
    if (captured) {
        barrier_on_stream(world, stream);
    } else {
        coll::prepare_barrier(coll::coll_state(world));
    }
    char* const partial = overlap::gemm_into_parity_half(world, st.partials, a, b, c.dtype, sc, stream, captured);
    const BufferView in{partial, c.dtype, count};
    // Straight into a dense C, symmetric or not: the pull ReduceScatter (each rank reads its rows of every partial)
    // needs only the input symmetric. In place and copied out measured ~5 % slower with 8 ranks on one H200 (an extra
    // pass over C, and the in-place algorithm). A strided C: in place, then copied out.
    if (c.stride() == N) {
        reduce_scatter(world, in, BufferView{c.data, c.dtype, seg}, stream);
        return;
    }
    char* const mine = partial + static_cast<std::size_t>(me) * seg * es;
    reduce_scatter(world, in, BufferView{mine, c.dtype, seg}, stream);
    LOOM_CHECK_CUDA(cudaMemcpy2DAsync(c.data, static_cast<std::size_t>(c.stride()) * es, mine, N * es, N * es,
                                      static_cast<std::size_t>(rows_seg), cudaMemcpyDeviceToDevice, stream));
}

// The fused epilogue with the SM transport: its scratch halves and signals; the kernel numbers the calls
// (RsFusedSmSignals::launches), so they replay from a CUDA graph.
struct RsFusedSmState final : WorldState {
    static constexpr const char* kKey = "overlap/gemm_rs/fused_epilogue_sm";
    explicit RsFusedSmState(World& world) : sig(world, kKey) {}
    void release(World& world) override {
        scratch.release(world);
        sig.release(world);
    }
    overlap::SymmetricSignals<kernels::overlap::RsFusedSmSignals> sig;
    overlap::SymmetricBuffer scratch;  // two parity halves of W - 1 slots
};

// The fused epilogue with the copy-engine transport: its scratch halves, signals, outbox and copy stream. Its stream
// operations carry the host's call number.
struct RsFusedCeState final : WorldState {
    static constexpr const char* kKey = "overlap/gemm_rs/fused_epilogue_ce";
    explicit RsFusedCeState(World& world) : sig(world, kKey) {}
    void release(World& world) override {
        scratch.release(world);
        sig.release(world);
    }
    overlap::SymmetricSignals<kernels::overlap::RsFusedCeSignals> sig;
    overlap::SymmetricBuffer scratch;  // two parity halves of W - 1 slots
    overlap::LocalBuffer outbox;       // [W][slot_bytes]
    overlap::SideStream side;          // the copies
    uint64_t calls = 0;                // this transport's calls on the World (the epoch of the current call)
    // RsFusedCeSignals::stored[lead] (tiles of that chunk stored to the outbox, cumulative over calls) once the
    // current call's GEMM is done.
    std::vector<uint64_t> stored_total;
};

// The fused epilogue's scratch: W - 1 slots (one per peer), each one band of blocks_per_rank x num_n tiles.
struct RsFusedShape {
    int64_t rows_seg, num_n, blocks_per_rank, slot_bytes, half_bytes;
};
RsFusedShape rs_fused_shape(int W, int64_t M, int64_t N, int64_t es, const GemmConfig& cfg) {
    RsFusedShape f;
    f.rows_seg = M / W;
    f.num_n = (N + cfg.block_n - 1) / cfg.block_n;
    f.blocks_per_rank = f.rows_seg / cfg.block_m;
    f.slot_bytes = f.blocks_per_rank * f.num_n * cfg.block_m * cfg.block_n * es;
    f.half_bytes = std::max(W - 1, 1) * f.slot_bytes;  // one slot per peer
    return f;
}

// The hook arguments both transports share (the call's number and scratch half are the transport's).
kernels::overlap::RsFusedHookArgs rs_fused_args(World& world, const RsFusedShape& f, const GemmConfig& cfg,
                                                uint64_t* tile_in) {
    const int W = world.world_size(), me = world.local_rank();
    const Ctx ctx = world.ctx();
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
    h.rows_per_rank = static_cast<int32_t>(f.rows_seg);
    h.group = std::min<int32_t>(cfg.group_m, static_cast<int32_t>(f.blocks_per_rank));
    // Diagnostics, wrong results: bits 1, 2 and 8 reach the kernel.
    h.diag_skip = static_cast<int32_t>(env_int("LOOM_DIAG_RS_FUSED_SKIP", 0) & 11);
    return h;
}

const jit::Kernel& rs_fused_kernel(const GemmConfig& cfg, const MatrixView& a, const MatrixView& c) {
    return jit::get_kernel(gemm_kernel_spec(cfg, a.dtype, c.dtype, gemm_kernel_bias(cfg, c.dtype, GemmOptions{}), false,
                                            kFusedHooks, kHeader));
}

void gemm_rs_fused_sm(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c,
                      const GemmConfig& cfg, const RsFusedShape& f, const overlap::OpScale& sc, int num_sms,
                      cudaStream_t stream, bool captured) {
    RsFusedSmState& st = overlap::op_state<RsFusedSmState>(world, "gemm_rs", captured);
    const int64_t half_stride = static_cast<int64_t>(
        overlap::ensure_parity_halves(world, st.scratch, static_cast<std::size_t>(f.half_bytes), captured));
    const jit::Kernel& kernel = rs_fused_kernel(cfg, a, c);
    // No per-call value: the kernel numbers the call and picks its half (kernels/overlap/gemm_rs.cuh).
    kernels::overlap::RsFusedHookArgs h = rs_fused_args(world, f, cfg, &st.sig->tile_in[0][0]);
    h.scratch = static_cast<uint8_t*>(st.scratch.p);
    h.launches = &st.sig->launches;
    h.half_stride = half_stride;
    const GemmSm90Launch l = gemm_sm90_launch(a, b, c, overlap::gemm_options(sc), cfg, num_sms, stream);
    kernel(l.launch, l.tmap_a, l.tmap_b, l.tmap_d, l.args, h);
}

// The copy stream of the copy-engine transport: per peer d (bands in the GEMM's order, rank me + 1's rows first), per
// chunk (in a band, groups in order and each group's columns in order: the order the GEMM completes them), wait until
// the GEMM stored the whole chunk into the outbox, copy it into our slot of d's scratch half and raise
// tile_in[me][lead] := epoch there. `no_bytes` (diagnostics): the signals without the copies' bytes.
void rs_ce_copies(World& world, RsFusedCeState& st, const kernels::overlap::RsFusedHookArgs& h, int64_t chunk_n,
                  int64_t tile_bytes, uint64_t epoch, bool no_bytes) {
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
                stream_ops::wait_value(st.side.stream, &st.sig->stored[lead], st.stored_total[lead]);
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
void gemm_rs_fused_ce(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c,
                      const GemmConfig& cfg, const RsFusedShape& f, std::size_t ce_chunk_bytes,
                      const overlap::OpScale& sc, int num_sms, cudaStream_t stream, bool captured) {
    RsFusedCeState& st = overlap::op_state<RsFusedCeState>(world, "gemm_rs", captured);
    const int W = world.world_size();
    const int64_t half_stride = static_cast<int64_t>(
        overlap::ensure_parity_halves(world, st.scratch, static_cast<std::size_t>(f.half_bytes), captured));
    const jit::Kernel& kernel = rs_fused_kernel(cfg, a, c);
    kernels::overlap::RsFusedHookArgs h = rs_fused_args(world, f, cfg, &st.sig->tile_in[0][0]);
    const uint64_t epoch = ++st.calls;
    h.scratch = static_cast<uint8_t*>(st.scratch.p) + static_cast<int64_t>(epoch % 2) * half_stride;
    h.epoch = epoch;
    const GemmSm90Launch l = gemm_sm90_launch(a, b, c, overlap::gemm_options(sc), cfg, num_sms, stream);
    const int64_t es = static_cast<int64_t>(dtype_size(c.dtype));
    const int64_t tile_bytes = int64_t(cfg.block_m) * cfg.block_n * es;
    const int64_t want = ce_chunk_bytes > 0 ? static_cast<int64_t>(ce_chunk_bytes) : int64_t(2) << 20;
    const int64_t chunk_n = std::clamp<int64_t>(want / (h.group * tile_bytes), 1, f.num_n);
    const int64_t num_tiles = a.rows / cfg.block_m * f.num_n;
    h.outbox = static_cast<uint8_t*>(overlap::ensure_local(st.outbox, static_cast<std::size_t>(W * f.slot_bytes)));
    if (static_cast<int64_t>(st.stored_total.size()) < num_tiles) st.stored_total.resize(num_tiles, 0);
    h.stored = st.sig->stored;
    h.chunk_n = static_cast<int32_t>(chunk_n);
    // The side stream starts after the previous call (outbox read out, peers' scratch half free: see the kernel's
    // write-after-read note); the GEMM runs concurrently with it.
    overlap::fork(st.side, stream);
    kernel(l.launch, l.tmap_a, l.tmap_b, l.tmap_d, l.args, h);
    // Diagnostics, wrong results: bit 16 leaves out the copy engine's bytes (signals only).
    rs_ce_copies(world, st, h, chunk_n, tile_bytes, epoch, (env_int("LOOM_DIAG_RS_FUSED_SKIP", 0) & 16) != 0);
    overlap::join(st.side, stream);
}

void gemm_rs_fused(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, GemmConfig cfg,
                   RsTransport transport, std::size_t ce_chunk_bytes, const overlap::OpScale& sc, int num_sms,
                   cudaStream_t stream, bool captured) {
    const int W = world.world_size();
    const int64_t M = a.rows, N = b.rows, rows_seg = M / W;
    const std::string unfit = fused_unfit(rows_seg, cfg);
    LOOM_CHECK(unfit.empty(), "gemm_rs (fused epilogue): expected {}", unfit);
    if (transport == RsTransport::CopyEngine) {
        // A chunk is a run of columns of one raster group, waited for whole, so every CTA must meet all its tiles of
        // peers' rows before its first own tile: raster groups must not straddle a band boundary (group_m divides
        // the M-blocks per rank), which also makes the slot layout's groups the raster's.
        overlap::groups_inside_bands(cfg, rows_seg / cfg.block_m);
    }
    const RsFusedShape f = rs_fused_shape(W, M, N, static_cast<int64_t>(dtype_size(c.dtype)), cfg);
    if (fused_by_copy_engine(transport, W))
        return gemm_rs_fused_ce(world, a, b, c, cfg, f, ce_chunk_bytes, sc, num_sms, stream, captured);
    gemm_rs_fused_sm(world, a, b, c, cfg, f, sc, num_sms, stream, captured);
}

// The fused pull's state: its partial products' halves, signals and the reducers' leftover lists.
struct RsPullState final : WorldState {
    static constexpr const char* kKey = "overlap/gemm_rs/fused_pull";
    explicit RsPullState(World& world) : sig(world, kKey) {}
    void release(World& world) override {
        partials.release(world);
        sig.release(world);
    }
    overlap::SymmetricSignals<kernels::overlap::RsPullSignals> sig;
    overlap::SymmetricBuffer partials;  // two parity halves of [M, N]
    overlap::LocalBuffer leftover;      // kRsPullLeftoverWords
    uint64_t calls = 0;                 // the fused pull's calls on the World (the epoch of the current call)
};

kernels::overlap::RsPullHookArgs rs_pull_args(World& world, const MatrixView& c, const GemmConfig& cfg, int64_t N,
                                              int32_t bpr) {
    const Ctx ctx = world.ctx();
    kernels::overlap::RsPullHookArgs h{};
    h.out = static_cast<uint8_t*>(c.data);
    h.heap_bytes = static_cast<int64_t>(ctx.heap_size);
    h.ldc = c.stride();
    h.timeout_ns = ctx.wait_timeout_ns;
    h.me = world.local_rank();
    h.world = world.world_size();
    h.blocks_per_rank = bpr;
    h.num_n = static_cast<int32_t>((N + cfg.block_n - 1) / cfg.block_n);
    h.n = static_cast<int32_t>(N);
    h.group = cfg.group_m;
    // Diagnostics: bits 1 and 2 give wrong results; bit 4 hands every part to the finish kernel (right results).
    h.diag_skip = static_cast<int32_t>(env_int("LOOM_DIAG_RS_FUSED_SKIP", 0) & 7);
    return h;
}

void gemm_rs_pull(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, GemmConfig cfg,
                  const overlap::OpScale& sc, int num_sms, cudaStream_t stream) {
    constexpr const char* op = "gemm_rs";
    RsPullState& ps = overlap::op_state<RsPullState>(world, op);
    const int W = world.world_size();
    const int64_t M = a.rows, N = b.rows, rows_seg = M / W;
    const std::string unfit = fused_unfit(rows_seg, cfg);
    LOOM_CHECK(unfit.empty(), "{} (fused pull): expected {}", op, unfit);
    const std::size_t es = dtype_size(c.dtype);
    const int32_t bpr = static_cast<int32_t>(rows_seg / cfg.block_m);
    overlap::groups_inside_bands(cfg, bpr);  // raster groups inside a band (rs_pull_tile_order)
    const int64_t half_stride =
        static_cast<int64_t>(overlap::ensure_parity_halves(world, ps.partials, static_cast<std::size_t>(M * N) * es));
    const jit::Kernel& kernel = jit::get_kernel(gemm_kernel_spec(
        cfg, a.dtype, c.dtype, gemm_kernel_bias(cfg, c.dtype, GemmOptions{}), false, kPullHooks, kPullHeader));
    jit::KernelSpec fspec;
    fspec.header = kPullHeader;
    fspec.name = "loom::kernels::overlap::gemm_rs_pull_finish";
    fspec.template_args = {dtype_cuda_name(c.dtype), std::to_string(cfg.block_m), std::to_string(cfg.block_n)};
    const jit::Kernel& finish = jit::get_kernel(fspec);
    // The reducers' leftover lists (zeroed once: each finish kernel zeroes the next call's count).
    const bool fresh = ps.leftover.bytes == 0;
    auto* const leftover = static_cast<uint32_t*>(
        overlap::ensure_local(ps.leftover, static_cast<std::size_t>(kernels::overlap::kRsPullLeftoverWords) * 4));
    if (fresh) LOOM_CHECK_CUDA(cudaMemsetAsync(leftover, 0, 4 * sizeof(uint32_t), stream));

    const uint64_t epoch = ++ps.calls;
    uint8_t* const partial = static_cast<uint8_t*>(ps.partials.p) + static_cast<int64_t>(epoch % 2) * half_stride;
    kernels::overlap::RsPullHookArgs h = rs_pull_args(world, c, cfg, N, bpr);
    h.partial = partial;
    h.tile_in = &ps.sig->tile_in[0][0];
    h.epoch = epoch;
    h.leftover = leftover;
    const GemmSm90Launch l =
        gemm_sm90_launch(a, b, MatrixView{partial, c.dtype, M, N, 0}, overlap::gemm_options(sc), cfg, num_sms, stream);
    kernel(l.launch, l.tmap_a, l.tmap_b, l.tmap_d, l.args, h);
    // The parts the reducers left: a few blocks, each of which may wait for a rank's tile holding its SM, so they
    // leave most of the SMs to the ranks whose GEMMs are still running (ranks sharing a GPU).
    jit::LaunchConfig lc;
    lc.grid = dim3(static_cast<unsigned>(std::max(1, num_sms / 4)));
    lc.block = dim3(kernels::overlap::kRsPullFinishThreads);
    lc.stream = stream;
    finish(lc, h);
}

// The scatter-reduce's state: its scratch, local partial product, signals and side stream.
struct RsScatterState final : WorldState {
    static constexpr const char* kKey = "overlap/gemm_rs/scatter_reduce";
    explicit RsScatterState(World& world) : sig(world, kKey) {}
    void release(World& world) override {
        scratch.release(world);
        sig.release(world);
    }
    overlap::SymmetricSignals<kernels::overlap::RsScatterSignals> sig;
    overlap::SymmetricBuffer scratch;  // [W][M / W][N]
    overlap::LocalBuffer partial;      // [M, N]
    overlap::SideStream side;
    uint64_t calls = 0;        // the scatter-reduce's calls on the World (the epoch of the current call)
    uint64_t freed_total = 0;  // RsScatterSignals::freed a peer reaches once it finished the last call
};

void gemm_rs_scatter(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c,
                     const OverlapPlan& plan, const overlap::OpScale& sc, int num_sms, cudaStream_t stream) {
    RsScatterState& st = overlap::op_state<RsScatterState>(world, "gemm_rs");
    const int W = world.world_size(), me = world.local_rank();
    const int64_t M = a.rows, N = b.rows, rows_seg = M / W;
    const std::size_t full_bytes = static_cast<std::size_t>(M * N) * dtype_size(c.dtype);
    void* scratch = overlap::ensure_symmetric(world, st.scratch, full_bytes);  // [W][M / W][N]
    void* partial = overlap::ensure_local(st.partial, full_bytes);             // [M, N]
    const MatrixView pview{partial, c.dtype, M, N, 0};

    jit::KernelSpec spec;
    spec.header = kHeader;
    spec.name = "loom::kernels::overlap::gemm_rs_scatter_reduce";
    spec.template_args = {dtype_cuda_name(c.dtype)};
    // Both kernels compiled before the counters advance (a JIT error leaves them as they were).
    const jit::Kernel& scatter_kernel = jit::get_kernel(spec);
    overlap::prepare_gemm(kNotifyHooks, kHeader, a, pview, plan.gemm, sc, overlap::ScaleAt::Epilogue);

    const int64_t num_n = (N + plan.gemm.block_n - 1) / plan.gemm.block_n;
    const uint64_t epoch = ++st.calls;
    const int P = plan.comm_blocks;
    kernels::overlap::RsParams rp{};
    rp.partial = partial;
    rp.scratch = scratch;
    rp.out = c.data;
    rp.sig = st.sig.p;
    rp.ldo = c.stride();
    rp.m = static_cast<int32_t>(M);
    rp.n = static_cast<int32_t>(N);
    rp.rows_seg = static_cast<int32_t>(rows_seg);
    rp.block_m = plan.gemm.block_m;
    rp.block_n = plan.gemm.block_n;
    rp.group_m = std::max(plan.gemm.group_m, 1);
    // Rows destined to rank me + 1 first, own rows last (they need no transfer).
    rp.shift_m = static_cast<int32_t>(((me + 1) % W) * rows_seg / plan.gemm.block_m);
    rp.epoch = epoch;
    rp.free_target = st.freed_total;
    st.freed_total += static_cast<uint64_t>(P);

    overlap::fork(st.side, stream);
    {
        jit::LaunchConfig lc;
        lc.grid = dim3(static_cast<unsigned>(P));
        lc.block = dim3(kernels::overlap::kScatterReduceThreads);
        lc.stream = st.side.stream;
        const Ctx ctx = world.ctx();
        scatter_kernel(lc, ctx, rp);
    }
    kernels::overlap::TileNotifyHookArgs h{};
    h.tile = st.sig->tile;
    h.epoch = epoch;
    h.num_n = static_cast<int32_t>(num_n);
    h.shift_m = rp.shift_m;
    overlap::launch_gemm(kNotifyHooks, kHeader, a, b, pview, plan.gemm, num_sms, stream, h, sc,
                         overlap::ScaleAt::Epilogue);
    overlap::join(st.side, stream);
}

}  // namespace

const char* to_string(RsTransport t) {
    switch (t) {
        case RsTransport::Auto:
            return "auto";
        case RsTransport::Sm:
            return "sm";
        case RsTransport::CopyEngine:
            return "copy-engine";
    }
    return "?";
}

RsTransport gemm_rs_transport(RsTransport requested, RsAlgo algo, bool ranks_share_gpu) {
    if (requested == RsTransport::Auto)
        return !ranks_share_gpu && algo == RsAlgo::FusedEpilogue ? RsTransport::CopyEngine : RsTransport::Sm;
    LOOM_CHECK(
        requested != RsTransport::CopyEngine || !ranks_share_gpu,
        "gemm_rs: the copy-engine transport needs every rank on its own GPU (here ranks share one: a copy within "
        "a GPU is a copy kernel the waiting GEMM would starve); use RsTransport::Sm or Auto");
    LOOM_CHECK(requested == RsTransport::Sm || algo == RsAlgo::FusedEpilogue,
               "gemm_rs: the {} transport is the fused epilogue's; the {} algorithm moves its tiles its own way",
               to_string(requested), to_string(algo));
    return requested;
}

const char* to_string(RsAlgo a) {
    switch (a) {
        case RsAlgo::Auto:
            return "auto";
        case RsAlgo::FusedEpilogue:
            return "fused-epilogue";
        case RsAlgo::ScatterReduce:
            return "scatter-reduce";
        case RsAlgo::Sequential:
            return "sequential";
        case RsAlgo::FusedPull:
            return "fused-pull";
    }
    return "?";
}

RsChoice gemm_rs_distinct_auto(int64_t tiles, int num_sms) {
    const int64_t sms = std::max(num_sms, 1);
    if (tiles <= sms) return {RsAlgo::FusedEpilogue, RsTransport::Sm};
    if (tiles < 3 * sms) return {RsAlgo::Sequential, RsTransport::Auto};
    return {RsAlgo::FusedEpilogue, RsTransport::CopyEngine};
}

RsAlgo gemm_rs_algo(RsAlgo requested, bool ranks_share_gpu, const GemmConfig* config, int64_t rows_seg,
                    int64_t k_bytes) {
    LOOM_CHECK(requested != RsAlgo::Sequential || config == nullptr,
               "gemm_rs: the sequential algorithm runs loom::gemm's own config; expected no config");
    if (requested != RsAlgo::Auto) return requested;
    // With the caller's tile, that tile decides whether a fused algorithm fits: where ranks share a GPU the fused
    // pull (nothing in the GEMM waits for the slowest rank's share), else the fused epilogue.
    if (config) {
        if (!fused_unfit(rows_seg, *config).empty()) return RsAlgo::ScatterReduce;
        return ranks_share_gpu ? RsAlgo::FusedPull : RsAlgo::FusedEpilogue;
    }
    // Ranks sharing a GPU: the fused pull where its tile (128 rows, or 64: gemm_rs_plan) fits M / W and the
    // reduce-scatter is worth hiding, else the sequence. All ranks' GEMMs and their reduce-scatter share one GPU, so
    // the reduce-scatter's time over the GEMM's goes as 1 / (K_loc x the input's bytes) whatever W is, while the
    // pull's own cost (its interleaved tile order, publishing, reducers beside the MMAs) is a few % of the GEMM.
    // Measured (docs/overlap.md "Session 27", one H200): at K_loc x bytes <= 7.4 KiB the pull read 0.990-1.064 of
    // the sequence (bf16 K_loc <= 3696 at 4 and 8 ranks, fp8 K_loc <= 7392 at 4); at 14-18 KiB (bf16 K_loc
    // 7168-9216 at 4 ranks) 0.963-0.998 in every run (fp8 K_loc 9216, 9 KiB: 0.993-0.995).
    if (ranks_share_gpu)
        return rows_seg % 64 == 0 && k_bytes <= kSharedPullMaxKBytes ? RsAlgo::FusedPull : RsAlgo::Sequential;
    return RsAlgo::Auto;
}

OverlapPlan gemm_rs_plan(int64_t m, int64_t n, int64_t k_loc, int world_size, int comm_sms, int arch, int num_sms,
                         RsAlgo algo, int out_bytes, DType in) {
    const int64_t rows_seg = m / std::max(world_size, 1);
    if (algo != RsAlgo::ScatterReduce) {
        // The fused algorithms take no SM from the GEMM; the pull runs the fused epilogue's tile.
        const bool forced = algo == RsAlgo::FusedEpilogue || algo == RsAlgo::FusedPull;
        OverlapPlan f;
        f.gemm = fused_config(overlap::gemm_config(m, n, k_loc, arch, num_sms, false, in), m, n, rows_seg, out_bytes,
                              forced, num_sms);
        f.rs_algo = algo == RsAlgo::FusedPull ? RsAlgo::FusedPull : RsAlgo::FusedEpilogue;
        if (forced || fused_unfit(rows_seg, f.gemm).empty()) return f;
    }
    OverlapPlan p;
    p.rs_algo = RsAlgo::ScatterReduce;
    // 16 blocks of ld/st pushes (~20-30 GB/s each over NVLink) keep up with the GEMM's output rate on the
    // Triton-distributed shapes; small outputs need fewer (each block reduces at least one row).
    p.comm_blocks = overlap::comm_blocks(comm_sms, static_cast<int>(std::clamp<int64_t>(rows_seg, 1, 16)), num_sms);
    p.gemm = overlap::gemm_config(m, n, k_loc, arch, num_sms - p.comm_blocks, false, in);
    return p;
}

namespace detail {

// The op with the options as given (loom::gemm_rs decides Auto's tuned options first:
// src/ops/overlap/overlap_tuned_ops.cpp).
void gemm_rs_run(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
                 const GemmRsOptions& o) {
    constexpr const char* op = "gemm_rs";
    // The fused pull and the scatter-reduce cannot be replayed; the fused epilogue with the SM transport can. Auto's
    // choice is checked once made (below).
    const bool captured = overlap::check_capture(
        stream, op,
        o.algo == RsAlgo::Sequential ||
            ((o.algo == RsAlgo::Auto || o.algo == RsAlgo::FusedEpilogue) && o.transport != RsTransport::CopyEngine));
    const overlap::DeviceFacts& dev = overlap::device_facts(world, op, captured);
    const int W = world.world_size();
    overlap::check_inputs(op, a, b, c);
    const overlap::OpScale sc = overlap::scale_of(o);
    overlap::check_scale(op, sc);
    const int64_t M = a.rows, K = a.cols, N = b.rows;
    LOOM_CHECK(M % W == 0, "{}: expected M a multiple of the world size {}, given M = {}", op, W, M);
    const int64_t rows_seg = M / W;
    LOOM_CHECK(c.rows == rows_seg && c.cols == N, "{}: expected C of [M / W, N] = [{}, {}], given {} x {}", op,
               rows_seg, N, c.rows, c.cols);
    LOOM_CHECK(M <= INT32_MAX && N <= INT32_MAX && M * N <= (int64_t(1) << 40), "{}: shapes too large: M={} N={}", op,
               M, N);
    LOOM_CHECK(o.comm_sms >= 0, "{}: expected comm_sms >= 0, given {}", op, o.comm_sms);
    const int out_bytes = static_cast<int>(dtype_size(c.dtype));

    // A requested transport asks for the fused epilogue: Auto takes the fused pull or the sequence (ranks sharing a
    // GPU) only when none was requested.
    RsAlgo algo = gemm_rs_algo(o.algo, dev.shared_gpu && o.transport == RsTransport::Auto, o.config, rows_seg,
                               K * static_cast<int64_t>(dtype_size(a.dtype)));
    RsTransport transport_req = o.transport;
    OverlapPlan plan;
    if (algo != RsAlgo::Sequential)
        plan = gemm_rs_plan(M, N, K, W, o.comm_sms, dev.arch, dev.num_sms, algo, out_bytes, a.dtype);
    // Nothing requested, a GPU per rank: the plan's waves of tiles choose between the fused epilogue's transports
    // and the sequence (gemm_rs_distinct_auto).
    if (algo == RsAlgo::Auto && !dev.shared_gpu && !o.config && o.transport == RsTransport::Auto &&
        plan.rs_algo == RsAlgo::FusedEpilogue) {
        const RsChoice ch = gemm_rs_distinct_auto(overlap::tile_count(M, N, plan.gemm), dev.num_sms);
        algo = ch.algo;
        transport_req = ch.transport;
    }
    if (algo == RsAlgo::Sequential) {
        LOOM_CHECK(o.transport == RsTransport::Auto,
                   "{}: the sequential algorithm moves no tiles itself; expected RsTransport::Auto, given {}", op,
                   to_string(o.transport));
        if (overlap::debug())
            fmt::print(stderr, "loom::gemm_rs M={} N={} K_loc={} W={}: sequential (loom::gemm, loom::reduce_scatter)\n",
                       M, N, K, W);
        gemm_rs_sequential(world, a, b, c, sc, stream, captured);
        return;
    }
    overlap::use_config(op, plan, o.config, M, N, dev.num_sms, a.dtype);
    overlap::check_tile_count(op, M, N, plan.gemm);
    if (overlap::debug())
        fmt::print(stderr, "loom::gemm_rs M={} N={} K_loc={} W={} SMs {} of {}: {}\n", M, N, K, W, dev.num_sms,
                   dev.device_sms, plan.str());
    gemm_validate(a, b, MatrixView{c.data, c.dtype, M, N, 0}, GemmOptions{}, /*allow_f8=*/true);

    // The fused epilogue's transport. Auto: the copy engine when every rank has its own GPU (two H200s, W = 2: 0.95x
    // to 1.0x the time of the epilogue's own NVLink bulk copies, which stall the GEMM's TMA loads; docs/overlap.md),
    // else Sm: ranks sharing a GPU cannot take the copy engine (a copy within one GPU is a runtime copy kernel: the
    // persistent GEMM, waiting for the peers' copies, would starve it).
    const RsTransport transport = gemm_rs_transport(transport_req, plan.rs_algo, dev.shared_gpu);
    if (captured)
        overlap::check_capture(stream, op,
                               plan.rs_algo == RsAlgo::FusedEpilogue && !fused_by_copy_engine(transport, W));
    if (plan.rs_algo == RsAlgo::FusedPull) {
        gemm_rs_pull(world, a, b, c, plan.gemm, sc, dev.num_sms, stream);
    } else if (plan.rs_algo == RsAlgo::FusedEpilogue) {
        gemm_rs_fused(world, a, b, c, plan.gemm, transport, o.ce_chunk_bytes, sc, dev.num_sms, stream, captured);
    } else {
        gemm_rs_scatter(world, a, b, c, plan, sc, dev.num_sms, stream);
    }
}

}  // namespace detail

}  // namespace loom
