// loom::ag_gemm: AllGather+GEMM with a copy-engine or SM producer and the hooked Hopper GEMM as consumer
// (kernels/ag_gemm.cuh; docs/overlap.md).
//
// Per call e on every rank (W ranks, this one `me`, R = M / W rows per rank, chunk = R x K elements):
//   stream      fork ── [CE: own rows, chunk[me] = T] ── [Sm: wait started] ── GEMM(hooks: wait chunk[r] >= T) ── join
//   side             ready[me] = e on every rank; for d = me+1, me+2, ... (Sm: from d = me): [d != me: wait
//                    ready[d] >= e]; copy chunk -> d's gather rows [me R, me R + R); chunk[me] on d += pieces
//                    (target T). The copy engine's own rows go on the stream, before the GEMM: a copy within one
//                    GPU is a runtime copy kernel, which the persistent GEMM would starve (docs/overlap.md). With
//                    ranks sharing a GPU every copy is such a kernel: the stream joins the side before the GEMM.
//                    Where it can (own_local below) the GEMM reads the own rows from A in place instead: no copy.
//                    With one GPU per rank the host enqueues the side stream's work after the GEMM's launch.
// T (chunk_total) counts pieces over all calls: the copy engine sets the new total, each SM block adds 1.
// Sequential (Auto's choice with a GPU per rank when the GEMM's tiles fit one wave): loom::all_gather, then loom::gemm.
// The heuristic's raster groups are narrowed to lie inside one rank's rows (overlap::groups_inside_bands).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "loom/jit/jit.hpp"
#include "loom/kernels/overlap/overlap_params.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/env.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "loom/runtime/tma.hpp"
#include "ops/overlap/overlap_state.hpp"
#include "ops/overlap/overlap_tune.hpp"

namespace loom {

const char* to_string(AgProducer p) {
    switch (p) {
        case AgProducer::Auto:
            return "auto";
        case AgProducer::CopyEngine:
            return "copy-engine";
        case AgProducer::Sm:
            return "sm";
        case AgProducer::Direct:
            return "direct";
        case AgProducer::Sequential:
            return "sequential";
    }
    return "?";
}

AgProducer ag_gemm_producer(AgProducer requested, int world_size, int64_t rows_per_rank, int block_m, bool gathered,
                            bool ranks_share_gpu, int64_t tiles, int num_sms) {
    const bool direct_fits = world_size > 1 && block_m > 0 && rows_per_rank % block_m == 0 && !gathered;
    if (requested == AgProducer::Auto) {
        if (ranks_share_gpu) return direct_fits ? AgProducer::Direct : AgProducer::CopyEngine;
        return world_size > 1 && tiles > 0 && tiles <= num_sms ? AgProducer::Sequential : AgProducer::CopyEngine;
    }
    LOOM_CHECK(
        requested != AgProducer::Direct || direct_fits,
        "ag_gemm: the direct producer needs M / W = {} a multiple of the GEMM's BLOCK_M = {}, more than one rank "
        "(given {}), and no gathered buffer (it gathers nothing{})",
        rows_per_rank, block_m, world_size, gathered ? "; one was given" : "");
    return requested;
}

std::string OverlapPlan::str() const {
    return fmt::format("{} comm_blocks {} reserved_sms {}{}{}{}{}", gemm.str(), comm_blocks, reserved_sms,
                       rs_algo == RsAlgo::Auto ? "" : " rs ", rs_algo == RsAlgo::Auto ? "" : to_string(rs_algo),
                       ar_algo == ArAlgo::Auto ? "" : " ar ", ar_algo == ArAlgo::Auto ? "" : to_string(ar_algo));
}

namespace overlap {

// The copy-engine and SM producers' state (the sequence without a gathered buffer takes only its gather buffer).
struct AgGatherState final : WorldState {
    static constexpr const char* kKey = "overlap/ag_gemm/gather";
    explicit AgGatherState(World& world) : sig(world, kKey) {}
    void release(World& world) override {
        gather.release(world);
        sig.release(world);
    }
    SymmetricSignals<kernels::overlap::AgGatherSignals> sig;
    SymmetricBuffer gather;  // [M, K]
    SideStream side;
    uint64_t calls = 0;          // the producers' calls on this World (the epoch of the current call)
    uint64_t chunk_total = 0;    // target of chunk after the current call
    uint64_t started_total = 0;  // SM producer: target of started
};

// The direct producer's state: its staging halves and signals.
struct AgDirectState final : WorldState {
    static constexpr const char* kKey = "overlap/ag_gemm/direct";
    explicit AgDirectState(World& world) : sig(world, kKey) {}
    void release(World& world) override {
        staging.release(world);
        sig.release(world);
    }
    SymmetricSignals<kernels::overlap::AgDirectSignals> sig;
    SymmetricBuffer staging;   // two parity halves of this rank's shard
    uint64_t calls = 0;        // the direct producer's calls on this World (the epoch of the current call)
    uint64_t chunk_total = 0;  // target of chunk after the current call
};

}  // namespace overlap

namespace {

constexpr const char* kHooks = "loom::kernels::overlap::AgGemmHooks";
constexpr const char* kHeader = "loom/kernels/overlap/ag_gemm.cuh";

// The sequence (AgProducer::Sequential): loom::all_gather of the shards into `gview` (the caller's `gathered` or the
// op's own gather buffer, [M, K] dense), then loom::gemm over it with loom::gemm's own config. The op's signals and
// counters are untouched, so calls may mix it with the overlapped producers: its all_gather meets every peer in this
// call (each peer's earlier GEMMs over its gather buffer are done), and the next overlapped call's copies into this
// rank's buffer wait for its ready signal, raised behind this call's GEMM.
void ag_gemm_sequential(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c,
                        const MatrixView& gview, const overlap::OpScale& sc, cudaStream_t stream) {
    all_gather(world, BufferView{a.data, a.dtype, static_cast<std::size_t>(a.rows * a.cols)},
               BufferView{gview.data, a.dtype, static_cast<std::size_t>(gview.rows * gview.cols)}, stream);
    gemm(gview, b, c, overlap::gemm_options(sc), stream);
}

// The direct producer (its own state: staging halves and signals). Per call e on every rank, on the stream:
//   stage kernel (kernels/ag_gemm.cuh ag_gemm_direct_stage: read_done[me] := e - 1 at every peer, wait read_done[q]
//   >= e - 2 of every peer q, copy the shard into staging half e % 2, chunk[me] += 1 per block at every rank) ──
//   GEMM (own rows from the shard; rank r's rows from r's half e % 2 through a_peer[r], after chunk[r] >= T).
// LOOM_AG_DIRECT_STAGE=stream (tuning) does the same with the runtime's copy and stream memory operations instead
// (wait read_done, cudaMemcpyAsync, chunk[me] := T at every rank, GEMM, read_done[me] := e at every peer): 2W - 1
// cuStreamWaitValue64 / cuStreamWriteValue64 per call, to time what the kernel saves.
bool direct_stage_by_stream() {
    static const bool v = [] {
        const std::string s = env_str("LOOM_AG_DIRECT_STAGE").value_or("kernel");
        LOOM_CHECK(s == "kernel" || s == "stream", "LOOM_AG_DIRECT_STAGE: expected kernel or stream, given '{}'", s);
        return s == "stream";
    }();
    return v;
}

void ag_gemm_direct(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmConfig& cfg,
                    kernels::overlap::AgGemmHookArgs h, const overlap::OpScale& sc, int num_sms, cudaStream_t stream) {
    constexpr const char* op = "ag_gemm";
    overlap::AgDirectState& st = overlap::op_state<overlap::AgDirectState>(world, op);
    const int W = world.world_size(), me = world.local_rank();
    const int64_t R = a.rows, K = a.cols;
    const std::size_t shard_bytes = static_cast<std::size_t>(R * K) * dtype_size(a.dtype);
    const std::size_t half_stride = overlap::ensure_parity_halves(world, st.staging, shard_bytes);
    const bool by_stream = direct_stage_by_stream();
    // Compiled before the counters advance (a JIT error leaves them as they were).
    const jit::Kernel* stage = nullptr;
    if (!by_stream) {
        jit::KernelSpec spec;
        spec.header = kHeader;
        spec.name = "loom::kernels::overlap::ag_gemm_direct_stage";
        stage = &jit::get_kernel(spec);
    }
    const uint64_t epoch = ++st.calls;
    char* const staging = static_cast<char*>(st.staging.p) + (epoch % 2) * half_stride;
    auto* sig = st.sig.p;
    if (by_stream) {
        if (epoch > 2)
            for (int q = 0; q < W; ++q)
                if (q != me) stream_ops::wait_value(stream, &sig->read_done[q], epoch - 2, stream_ops::WaitCmp::GEQ);
        LOOM_CHECK_CUDA(cudaMemcpyAsync(staging, a.data, shard_bytes, cudaMemcpyDeviceToDevice, stream));
        st.chunk_total += 1;
        for (int d = 0; d < W; ++d) stream_ops::signal_ce(world, &sig->chunk[me], st.chunk_total, d, stream);
    } else {
        // Blocks: ~256 KiB of the shard each, at most 32 (the same count on every rank: the GEMM's target).
        const auto blocks = static_cast<unsigned>(std::clamp<std::size_t>(shard_bytes >> 18, 1, 32));
        st.chunk_total += blocks;
        kernels::overlap::AgDirectParams p{a.data, staging, sig, shard_bytes, epoch};
        jit::LaunchConfig lc;
        lc.grid = dim3(blocks);
        lc.block = dim3(512);
        lc.stream = stream;
        (*stage)(lc, world.ctx(), p);
    }
    h.direct = 1;
    h.world = W;
    for (int r = 0; r < W; ++r) {
        const CUtensorMap m =
            make_tma_2d(MatrixView{world.peer_ptr(staging, r), a.dtype, R, K, 0}, cfg.block_m, cfg.block_k);
        std::memcpy(&h.a_peer[r], &m, sizeof(m));
    }
    h.chunk = sig->chunk;
    h.target = st.chunk_total;
    // The gather map is never read (every tile is own or a peer's): a map of A's shape over A's address does.
    overlap::launch_gemm(kHooks, kHeader, MatrixView{a.data, a.dtype, R * W, K, 0}, b, c, cfg, num_sms, stream, h, sc,
                         overlap::ScaleAt::Accumulators);
    if (by_stream)
        for (int d = 0; d < W; ++d)
            if (d != me) stream_ops::signal_ce(world, &sig->read_done[me], epoch, d, stream);
}

}  // namespace

OverlapPlan ag_gemm_plan(int64_t m, int64_t n_loc, int64_t k, int world_size, AgProducer producer, int comm_sms,
                         int arch, int num_sms, bool ranks_share_gpu, DType in) {
    OverlapPlan p;
    if (producer == AgProducer::Sm) {
        // 8 SMs of TMA copies keep ~W - 1 chunks in flight at NVLink speed; fewer for small chunks.
        const int64_t chunk_bytes = m / std::max(world_size, 1) * k * static_cast<int64_t>(dtype_size(in));
        const int dflt = static_cast<int>(std::clamp<int64_t>(chunk_bytes / (256 << 10), 1, 8));
        p.comm_blocks = overlap::comm_blocks(comm_sms, dflt, num_sms);
    }
    // Copy engine with peers on this GPU: the copies are runtime copy kernels, and ag_gemm runs them before the
    // GEMM (see ag_gemm), so the GEMM keeps every SM. (ranks_share_gpu stays a parameter: the plan is the place
    // where sharing would change the split.)
    (void)ranks_share_gpu;
    p.gemm = overlap::gemm_config(m, n_loc, k, arch, num_sms - p.comm_blocks - p.reserved_sms, /*split_tail=*/true, in);
    return p;
}

namespace detail {

// The op with the options as given (loom::ag_gemm decides Auto's tuned options first:
// src/ops/overlap/overlap_tuned_ops.cpp).
void ag_gemm_run(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
                 const AgGemmOptions& o) {
    constexpr const char* op = "ag_gemm";
    const bool captured = overlap::check_capture(stream, op, o.producer == AgProducer::Sequential);
    const overlap::DeviceFacts& dev = overlap::device_facts(world, op, captured);
    const int W = world.world_size(), me = world.local_rank();
    overlap::check_inputs(op, a, b, c);
    const overlap::OpScale sc = overlap::scale_of(o);
    overlap::check_scale(op, sc);
    LOOM_CHECK(a.stride() == a.cols, "{}: expected this rank's A shard dense (ld == K = {}), given ld {}", op, a.cols,
               a.stride());
    const int64_t R = a.rows, M = R * W, K = a.cols, N = b.rows;
    const std::size_t es = dtype_size(a.dtype);
    const std::size_t chunk_bytes = static_cast<std::size_t>(R * K) * es;
    LOOM_CHECK(c.rows == M && c.cols == N,
               "{}: expected C of [M, N_loc] = [{} x {} rows, {}] (world x A's rows, B's rows), given {} x {}", op, W,
               R, N, c.rows, c.cols);
    LOOM_CHECK(M <= INT32_MAX, "{}: expected M to fit in int32, given {}", op, M);

    LOOM_CHECK(o.comm_sms >= 0, "{}: expected comm_sms >= 0, given {}", op, o.comm_sms);
    // Auto: the direct producer where ranks share a GPU and it applies (no copy but each rank's own shard), else the
    // copy engine. (On a shared GPU, where the copy engine's copies run before the GEMM, it still measured faster
    // than the overlapped SM producer, whose blocks take SMs from the GEMM: 8 ranks on one H200, M = 8192,
    // N = 11008, K = 4096: 1684 vs 2392 us.)
    // The copy engine's and the direct producer's plan (no comm blocks: the same GEMM); the SM producer's, planned
    // beside its blocks, only when it is the one. (One heuristic call per call: host time, before the GEMM's launch.)
    OverlapPlan plan =
        ag_gemm_plan(M, N, K, W, AgProducer::CopyEngine, o.comm_sms, dev.arch, dev.num_sms, dev.shared_gpu, a.dtype);
    const GemmConfig& tile = o.config ? *o.config : plan.gemm;
    const AgProducer producer =
        ag_gemm_producer(o.producer, W, R, tile.block_m, o.gathered.data != nullptr, dev.shared_gpu,
                         o.config ? 0 : overlap::tile_count(M, N, tile), dev.num_sms);
    LOOM_CHECK(producer != AgProducer::Sequential || o.config == nullptr,
               "{}: the sequential producer runs loom::gemm's own config; expected no config", op);
    if (producer == AgProducer::Sm)
        plan = ag_gemm_plan(M, N, K, W, producer, o.comm_sms, dev.arch, dev.num_sms, dev.shared_gpu, a.dtype);
    // The producers' state: the copy engine's and the SM producer's, and the sequence's gather buffer when none is
    // given.
    overlap::AgGatherState* const st =
        producer != AgProducer::Direct && (producer != AgProducer::Sequential || !o.gathered.data)
            ? &overlap::op_state<overlap::AgGatherState>(world, op, captured)
            : nullptr;
    void* gather = nullptr;
    if (o.gathered.data) {
        const MatrixView& g = o.gathered;
        LOOM_CHECK(g.dtype == a.dtype && g.rows == M && g.cols == K && g.stride() == K,
                   "{}: expected the gathered buffer dense [{}, {}] {}, given {} x {} (ld {}) {}", op, M, K,
                   dtype_name(a.dtype), g.rows, g.cols, g.stride(), dtype_name(g.dtype));
        LOOM_CHECK(world.is_symmetric(g.data, static_cast<std::size_t>(M * K) * es),
                   "{}: the gathered buffer ({}, {} bytes) is not in the symmetric heap: allocate it with world.alloc",
                   op, g.data, M * K * es);
        gather = g.data;
    } else if (producer != AgProducer::Direct) {
        gather = overlap::ensure_symmetric(world, st->gather, static_cast<std::size_t>(M * K) * es, captured);
    }
    // The direct producer has no gather buffer; its GEMM's A map (never read: every tile is redirected) spans A.
    const MatrixView gview{gather ? gather : a.data, a.dtype, M, K, 0};
    gemm_validate(gview, b, c, GemmOptions{}, /*allow_f8=*/true);
    if (producer == AgProducer::Sequential) {
        ag_gemm_sequential(world, a, b, c, gview, sc, stream);
        return;
    }

    overlap::use_config(op, plan, o.config, M, N, dev.num_sms, a.dtype, /*split_tail_ok=*/true);
    // Raster groups inside a rank's rows (the heuristic's plan; a caller's config is run as given): the rotated order
    // then runs every own tile before the first peer's, so no CTA of the first wave waits for a copy. A group
    // straddling two ranks' rows (M / W smaller than group_m M-blocks: small M, or W = 8) puts tiles of the next
    // rank's rows into the first wave, and a persistent CTA that waits there runs its whole walk that much later
    // (two H200s, W = 2, M = 1024-2048: 15-25 % slower than with the groups inside the bands; docs/overlap.md).
    if (!o.config && R % plan.gemm.block_m == 0) overlap::groups_inside_bands(plan.gemm, R / plan.gemm.block_m);
    if (overlap::debug())
        fmt::print(stderr, "loom::ag_gemm M={} N={} K={} W={} producer {} SMs {} of {}: {} (call {}, signals at {})\n",
                   M, N, K, W, to_string(producer), dev.num_sms, dev.device_sms, plan.str(), st ? st->calls + 1 : 0,
                   st ? static_cast<void*>(st->sig.p) : nullptr);

    // Both kernels compiled before the counters advance (a JIT error leaves them as they were).
    const bool tma = o.sm_path != DataPath::LdSt;
    LOOM_CHECK(o.sm_path == DataPath::Auto || o.sm_path == DataPath::LdSt || o.sm_path == DataPath::Tma,
               "{}: expected the Sm producer's data path LdSt or Tma, given {}", op, to_string(o.sm_path));
    const jit::Kernel* push_kernel = nullptr;
    if (producer == AgProducer::Sm) {
        jit::KernelSpec spec;
        spec.header = kHeader;
        spec.name = "loom::kernels::overlap::ag_gemm_push";
        spec.template_args = {tma ? "1" : "0"};
        push_kernel = &jit::get_kernel(spec);
    }
    overlap::prepare_gemm(kHooks, kHeader, gview, c, plan.gemm, sc, overlap::ScaleAt::Accumulators);

    // The own rows in place: with the copy engine (or direct), no gathered buffer asked for, own M-blocks whole and
    // a shard TMA can read, the GEMM loads this rank's tiles from its shard and the copy of them (a D2D copy kernel
    // in stream order before the GEMM: R x K x 2 bytes, 16-64 us at the Triton-distributed shapes) is not made.
    const bool own_local = (producer == AgProducer::CopyEngine || producer == AgProducer::Direct) && !o.gathered.data &&
                           R % plan.gemm.block_m == 0 && reinterpret_cast<std::uintptr_t>(a.data) % 16 == 0;
    kernels::overlap::AgGemmHookArgs h{};
    if (own_local) {
        const CUtensorMap m = make_tma_2d(MatrixView{a.data, a.dtype, R, K, 0}, plan.gemm.block_m, plan.gemm.block_k);
        static_assert(sizeof(m) == sizeof(h.a_local), "CUtensorMap is 128 bytes");
        std::memcpy(&h.a_local, &m, sizeof(m));
        h.own_local = 1;
        h.own_row0 = static_cast<int32_t>(me * R);
    }

    if (producer == AgProducer::Direct) {
        h.timeout_ns = world.ctx().wait_timeout_ns;
        h.rows_per_rank = static_cast<int32_t>(R);
        h.shift_m = static_cast<int32_t>(me * R / plan.gemm.block_m);
        ag_gemm_direct(world, a, b, c, plan.gemm, h, sc, dev.num_sms, stream);
        return;
    }
    overlap::AgGatherState& gs = *st;
    const uint64_t epoch = ++gs.calls;
    auto* sig = gs.sig.p;
    char* const my_rows = static_cast<char*>(gather) + static_cast<std::size_t>(me) * chunk_bytes;
    // The copy engine's side stream: this rank's ready signal, then per peer d (from me + 1): wait d's ready, copy the
    // shard into d's gather rows, raise chunk[me] there; with own_local chunk[me] here too (nothing to copy).
    auto enqueue_copy_engine_side = [&] {
        for (int d = 0; d < W; ++d)
            if (d != me) stream_ops::signal_ce(world, &sig->ready[me], epoch, d, gs.side.stream);
        for (int i = 1; i < W; ++i) {
            const int d = (me + i) % W;
            stream_ops::wait_value(gs.side.stream, &sig->ready[d], epoch, stream_ops::WaitCmp::GEQ);
            stream_ops::put_ce(world, my_rows, a.data, chunk_bytes, d, gs.side.stream);
            stream_ops::signal_ce(world, &sig->chunk[me], gs.chunk_total, d, gs.side.stream);
        }
        // In place (own_local): chunk[me] still gets this call's total, so that a later call with the SM producer,
        // which adds to it, reaches its target.
        if (own_local) stream_ops::signal_ce(world, &sig->chunk[me], gs.chunk_total, me, gs.side.stream);
    };
    overlap::fork(gs.side, stream);
    // With one GPU per rank the side stream's work is enqueued after the GEMM's launch: the GEMM starts on the own
    // rows, which need none of it, and its launch does not wait behind the host's 3W - 2 stream operations (on an
    // idle GPU those were GPU idle time at the start of every call).
    const bool side_after_gemm = producer == AgProducer::CopyEngine && !dev.shared_gpu;
    if (producer == AgProducer::CopyEngine) {
        gs.chunk_total += 1;
        // This rank's own rows, unless read in place: a copy within one GPU is a runtime copy kernel, which the
        // persistent GEMM (every SM when no other rank shares the GPU) would starve if both were queued at once. In
        // stream order before the GEMM it never competes (and the GEMM starts on these rows anyway).
        if (!own_local) {
            stream_ops::put_ce(world, my_rows, a.data, chunk_bytes, me, stream);
            stream_ops::signal_ce(world, &sig->chunk[me], gs.chunk_total, me, stream);
        }
        // Ranks sharing a GPU: every copy is a runtime copy kernel, which needs SMs of this rank's MPS share. Next to
        // the persistent GEMM (all but two SMs of the share, spinning on the peers' chunks) 8 ranks on one H200 hung
        // in bench-overlap within a few back-to-back calls: each time a sender's copy never landed, and always the
        // sender's last one (the likeliest to be issued while its own GEMM already held the share). Here the GEMM
        // starts after this rank's copies, so the copies of a rank never compete with its GEMM. No overlap on
        // shared GPUs with this producer.
        if (dev.shared_gpu) {
            enqueue_copy_engine_side();
            overlap::join(gs.side, stream);
        }
    } else {
        const int P = plan.comm_blocks;
        gs.chunk_total += static_cast<uint64_t>(P);
        gs.started_total += static_cast<uint64_t>(P);
        kernels::overlap::AgPushParams pp{};
        pp.a_local = a.data;
        pp.gather = gather;
        pp.sig = sig;
        pp.chunk_bytes = chunk_bytes;
        pp.epoch = epoch;
        pp.stages = 4;
        pp.stage_bytes = 16 * 1024;
        jit::LaunchConfig lc;
        lc.grid = dim3(static_cast<unsigned>(P));
        lc.block = dim3(512);
        lc.smem = tma ? 128 + std::size_t(pp.stages) * pp.stage_bytes : 0;  // lang::tma_staging_bytes
        lc.stream = gs.side.stream;
        const Ctx ctx = world.ctx();
        (*push_kernel)(lc, ctx, pp);
        // The GEMM takes the remaining SMs only once every producer block is resident: it can never starve them.
        stream_ops::wait_value(stream, &sig->started, gs.started_total, stream_ops::WaitCmp::GEQ);
    }
    h.chunk = sig->chunk;
    h.target = gs.chunk_total;
    h.timeout_ns = world.ctx().wait_timeout_ns;
    h.rows_per_rank = static_cast<int32_t>(R);
    h.shift_m = static_cast<int32_t>(me * R / plan.gemm.block_m);
    overlap::launch_gemm(kHooks, kHeader, gview, b, c, plan.gemm, dev.num_sms, stream, h, sc,
                         overlap::ScaleAt::Accumulators);
    if (side_after_gemm) enqueue_copy_engine_side();
    overlap::join(gs.side, stream);
}

}  // namespace detail

}  // namespace loom
