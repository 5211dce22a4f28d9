// loom::gemm_ar: GEMM+AllReduce for small M (kernels/gemm_ar.cuh; docs/overlap.md). Two algorithms:
//
// FusedEpilogue (the default where the tile fits), one kernel on the caller's stream, every usable SM:
//   stream  GEMM with ArEpilogueHooks: per tile part, push it into our slot of every peer's receive half (e % 2),
//           tile_in[me][part] := e there; wait tile_in[q][part] >= e of every peer q; sum the W copies (rank order,
//           fp32), TMA-store C. The call number e is the device's (Signals::launches), so the call can be captured
//           in a CUDA graph and replayed; its buffer and signals are its own (ArFusedState).
// ReduceKernel:
//   stream  fork ── GEMM(partial[e % 2] (symmetric), tile[i] = e after each tile's stores) ── join
//   side         gemm_ar_reduce: per tile, wait tile[i] >= e on every rank, sum the W partial tiles (rank
//                order, fp32), write C
// Sequential (Auto's choice where ranks share a GPU): loom::gemm into this call's parity half, then loom::all_reduce.
// ReduceKernel and Sequential take their parity half from one symmetric buffer and share its call counter
// (ArPartialsState), so calls may mix them (and the fused epilogue, which keeps to its own state).
#include <algorithm>

#include "loom/kernels/overlap/overlap_params.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/tma.hpp"
#include "ops/overlap/overlap_state.hpp"
#include "ops/overlap/overlap_tune.hpp"

namespace loom {

namespace {
constexpr int64_t kMaxM = 128;
constexpr const char* kHooks = "loom::kernels::overlap::TileNotifyHooks";
constexpr const char* kFusedHooks = "loom::kernels::overlap::ArEpilogueHooks";
constexpr const char* kHeader = "loom/kernels/overlap/gemm_ar.cuh";

// The partial products' halves and their call counter, which the reduce kernel and the sequence share.
struct ArPartialsState final : WorldState {
    static constexpr const char* kKey = "overlap/gemm_ar/partials";
    explicit ArPartialsState(World&) {}
    void release(World& world) override { partials.buf.release(world); }
    overlap::PartialHalves partials;
};

// The reduce kernel's signals and side stream (its partials: ArPartialsState).
struct ArReduceState final : WorldState {
    static constexpr const char* kKey = "overlap/gemm_ar/reduce_kernel";
    explicit ArReduceState(World& world) : sig(world, kKey) {}
    void release(World& world) override { sig.release(world); }
    overlap::SymmetricSignals<kernels::overlap::ArReduceSignals> sig;
    overlap::SideStream side;
};

// The fused epilogue's receive halves and signals; the kernel numbers the calls.
struct ArFusedState final : WorldState {
    static constexpr const char* kKey = "overlap/gemm_ar/fused_epilogue";
    explicit ArFusedState(World& world) : sig(world, kKey) {}
    void release(World& world) override {
        recv.release(world);
        sig.release(world);
    }
    overlap::SymmetricSignals<kernels::overlap::ArFusedSignals> sig;
    overlap::SymmetricBuffer recv;  // two parity halves of W - 1 slots
};

void gemm_ar_fused(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmConfig& cfg,
                   const overlap::OpScale& sc, int num_sms, cudaStream_t stream, bool captured) {
    constexpr const char* op = "gemm_ar";
    ArFusedState& st = overlap::op_state<ArFusedState>(world, op, captured);
    const int W = world.world_size(), me = world.local_rank();
    const int64_t M = a.rows, N = b.rows;
    const int64_t es = static_cast<int64_t>(dtype_size(c.dtype));
    const std::string unfit = overlap::whole_tile_unfit(cfg, static_cast<int>(es));
    LOOM_CHECK(unfit.empty(), "{} (fused epilogue): expected {}", op, unfit);
    const int64_t num_m = (M + cfg.block_m - 1) / cfg.block_m, num_n = (N + cfg.block_n - 1) / cfg.block_n;
    LOOM_CHECK(2 * num_m * num_n <= kernels::overlap::kMaxTileSignals,
               "{} (fused epilogue): expected at most {} output tiles, given {}", op,
               kernels::overlap::kMaxTileSignals / 2, num_m * num_n);
    const int64_t slot_bytes = num_m * num_n * cfg.block_m * cfg.block_n * es;
    const std::size_t half_stride = overlap::ensure_parity_halves(
        world, st.recv, static_cast<std::size_t>(std::max(W - 1, 1) * slot_bytes), captured);
    const jit::Kernel& kernel =
        jit::get_kernel(gemm_kernel_spec(cfg, a.dtype, c.dtype, DType::F32, false, kFusedHooks, kHeader));

    // No per-call value: the kernel numbers the call and picks its half (kernels/gemm_ar.cuh).
    kernels::overlap::ArFusedHookArgs h{};
    h.recv = static_cast<uint8_t*>(st.recv.p);
    h.tile_in = &st.sig->tile_in[0][0];
    h.launches = &st.sig->launches;
    h.half_stride = static_cast<int64_t>(half_stride);
    const Ctx ctx = world.ctx();
    h.heap_bytes = static_cast<int64_t>(ctx.heap_size);
    h.slot_bytes = slot_bytes;
    h.timeout_ns = ctx.wait_timeout_ns;
    h.me = me;
    h.world = W;
    h.num_n = static_cast<int32_t>(num_n);
    GemmSm90Launch l = gemm_sm90_launch(a, b, c, overlap::gemm_options(sc), cfg, num_sms, stream);
    l.launch.smem = kernels::gemm_sm90_smem_bytes(cfg.block_m, cfg.block_n, cfg.stages, static_cast<int>(es));
    // Epilogue hooks store whole 64-row slabs of the warpgroup's staged part.
    l.tmap_d = make_tma_2d(c, kernels::kGemmWholeTileBoxRows, kernels::gemm_store_box_cols(static_cast<int>(es)));
    kernel(l.launch, l.tmap_a, l.tmap_b, l.tmap_d, l.args, h);
}

void gemm_ar_sequential(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c,
                        const overlap::OpScale& sc, cudaStream_t stream, bool captured) {
    ArPartialsState& st = overlap::op_state<ArPartialsState>(world, "gemm_ar", captured);
    const int64_t M = a.rows, N = b.rows;
    const std::size_t es = dtype_size(c.dtype), count = static_cast<std::size_t>(M * N);
    char* const partial = overlap::gemm_into_parity_half(world, st.partials, a, b, c.dtype, sc, stream, captured);
    // Into C directly when C is dense, symmetric or not (all_reduce's two-shot stages the shards of a plain C in its
    // scratch: no copy afterwards). A strided C: in place on the symmetric partial, then copied.
    if (c.stride() == N) {
        all_reduce(world, BufferView{partial, c.dtype, count}, BufferView{c.data, c.dtype, count}, stream);
        return;
    }
    all_reduce(world, BufferView{partial, c.dtype, count}, BufferView{partial, c.dtype, count}, stream);
    LOOM_CHECK_CUDA(cudaMemcpy2DAsync(c.data, static_cast<std::size_t>(c.stride()) * es, partial, N * es, N * es,
                                      static_cast<std::size_t>(M), cudaMemcpyDeviceToDevice, stream));
}

void gemm_ar_reduce_kernel(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c,
                           const OverlapPlan& plan, const overlap::OpScale& sc, int num_sms, cudaStream_t stream) {
    overlap::PartialHalves& partials = overlap::op_state<ArPartialsState>(world, "gemm_ar").partials;
    ArReduceState& st = overlap::op_state<ArReduceState>(world, "gemm_ar");
    const int64_t M = a.rows, N = b.rows;
    const std::size_t es = dtype_size(c.dtype);
    const std::size_t half_bytes = (static_cast<std::size_t>(M * N) * es + 1023) / 1024 * 1024;
    const int64_t num_n = (N + plan.gemm.block_n - 1) / plan.gemm.block_n;
    // Parity halves at a fixed offset (nothing orders a peer's reads of call e - 1 before our GEMM of call e).
    const std::size_t half_stride = overlap::ensure_parity_halves(world, partials.buf, half_bytes);

    jit::KernelSpec spec;
    spec.header = kHeader;
    spec.name = "loom::kernels::overlap::gemm_ar_reduce";
    spec.template_args = {dtype_cuda_name(c.dtype)};
    // Compile (or fetch) both kernels before the call number advances: a JIT error must leave every counter as
    // it was, or the next call would wait for targets its peers never reach.
    const jit::Kernel& reduce_kernel = jit::get_kernel(spec);
    overlap::prepare_gemm(kHooks, kHeader, a, c, plan.gemm, sc, overlap::ScaleAt::Epilogue);
    const uint64_t epoch = ++partials.calls;
    void* const partial = static_cast<char*>(partials.buf.p) + (epoch % 2) * half_stride;
    const MatrixView pview{partial, c.dtype, M, N, 0};
    gemm_validate(a, b, pview, GemmOptions{}, /*allow_f8=*/true);

    kernels::overlap::ArParams ap{};
    ap.partial = partial;
    ap.out = c.data;
    ap.tile = st.sig->tile;
    ap.ldo = c.stride();
    ap.m = static_cast<int32_t>(M);
    ap.n = static_cast<int32_t>(N);
    ap.block_m = plan.gemm.block_m;
    ap.block_n = plan.gemm.block_n;
    ap.group_m = std::max(plan.gemm.group_m, 1);
    ap.epoch = epoch;

    overlap::fork(st.side, stream);
    {
        jit::LaunchConfig lc;
        lc.grid = dim3(static_cast<unsigned>(plan.comm_blocks));
        lc.block = dim3(256);
        lc.stream = st.side.stream;
        const Ctx ctx = world.ctx();
        reduce_kernel(lc, ctx, ap);
    }
    kernels::overlap::TileNotifyHookArgs h{};
    h.tile = st.sig->tile;
    h.epoch = epoch;
    h.num_n = static_cast<int32_t>(num_n);
    h.shift_m = 0;
    overlap::launch_gemm(kHooks, kHeader, a, b, pview, plan.gemm, num_sms, stream, h, sc, overlap::ScaleAt::Epilogue);
    overlap::join(st.side, stream);
}
}  // namespace

const char* to_string(ArAlgo a) {
    switch (a) {
        case ArAlgo::Auto:
            return "auto";
        case ArAlgo::FusedEpilogue:
            return "fused-epilogue";
        case ArAlgo::ReduceKernel:
            return "reduce-kernel";
        case ArAlgo::Sequential:
            return "sequential";
    }
    return "?";
}

ArAlgo gemm_ar_algo(ArAlgo requested, bool ranks_share_gpu, const GemmConfig* config, int out_bytes) {
    LOOM_CHECK(requested != ArAlgo::Sequential || config == nullptr,
               "gemm_ar: the sequential algorithm runs loom::gemm's own config; expected no config");
    if (requested != ArAlgo::Auto) return requested;
    // With the caller's tile, that tile decides whether the fused epilogue fits.
    if (config)
        return overlap::whole_tile_unfit(*config, out_bytes).empty() ? ArAlgo::FusedEpilogue : ArAlgo::ReduceKernel;
    return ranks_share_gpu ? ArAlgo::Sequential : ArAlgo::Auto;
}

OverlapPlan gemm_ar_plan(int64_t m, int64_t n, int64_t k_loc, int world_size, int comm_sms, int arch, int num_sms,
                         ArAlgo algo, int out_bytes, DType in) {
    (void)world_size;
    OverlapPlan p;
    if (algo != ArAlgo::ReduceKernel) {
        // The fused epilogue takes no SM from the GEMM (for M <= 128 one wave of tiles bound by reading B).
        GemmConfig f =
            overlap::whole_tile_config(overlap::gemm_config(m, n, k_loc, arch, num_sms, false, in), out_bytes);
        f.grid = static_cast<int>(gemm_sm90_grid(m, n, f, num_sms));
        if (algo == ArAlgo::FusedEpilogue || overlap::whole_tile_unfit(f, out_bytes).empty()) {
            p.gemm = f;
            p.ar_algo = ArAlgo::FusedEpilogue;
            return p;
        }
    }
    const GemmConfig all =
        gemm_heuristic(m, n, k_loc, false, arch, num_sms, /*split_tail=*/false, GemmTiles::Overlap, in);
    const int64_t tiles = overlap::tile_count(m, n, all);
    // One reduce block per tile (a tile's pull is ~W x 16-64 KiB), at most 32; the GEMM keeps the rest.
    p.comm_blocks = overlap::comm_blocks(comm_sms, static_cast<int>(std::clamp<int64_t>(tiles, 1, 32)), num_sms);
    p.gemm = overlap::gemm_config(m, n, k_loc, arch, num_sms - p.comm_blocks, false, in);
    p.ar_algo = ArAlgo::ReduceKernel;
    return p;
}

namespace detail {

// The op with the options as given (loom::gemm_ar decides Auto's tuned options first:
// src/ops/overlap/overlap_tuned_ops.cpp).
void gemm_ar_run(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
                 const GemmArOptions& o) {
    constexpr const char* op = "gemm_ar";
    // ReduceKernel cannot be replayed; Auto's choice is checked once planned (below).
    const bool captured = overlap::check_capture(stream, op, o.algo != ArAlgo::ReduceKernel);
    const overlap::DeviceFacts& dev = overlap::device_facts(world, op, captured);
    const int W = world.world_size();
    overlap::check_inputs(op, a, b, c);
    const overlap::OpScale sc = overlap::scale_of(o);
    overlap::check_scale(op, sc);
    const int64_t M = a.rows, K = a.cols, N = b.rows;
    LOOM_CHECK(M <= kMaxM,
               "{}: expected M <= {} (the low-latency one-shot variant), given M = {}; use gemm_rs + all_gather or "
               "gemm + all_reduce for larger M",
               op, kMaxM, M);
    LOOM_CHECK(c.rows == M && c.cols == N, "{}: expected C of [M, N] = [{}, {}], given {} x {}", op, M, N, c.rows,
               c.cols);
    LOOM_CHECK(o.comm_sms >= 0, "{}: expected comm_sms >= 0, given {}", op, o.comm_sms);
    const int out_bytes = static_cast<int>(dtype_size(c.dtype));

    const ArAlgo algo = gemm_ar_algo(o.algo, dev.shared_gpu, o.config, out_bytes);
    if (algo == ArAlgo::Sequential) {
        gemm_validate(a, b, c, GemmOptions{}, /*allow_f8=*/true);
        gemm_ar_sequential(world, a, b, c, sc, stream, captured);
        return;
    }
    OverlapPlan plan = gemm_ar_plan(M, N, K, W, o.comm_sms, dev.arch, dev.num_sms, algo, out_bytes, a.dtype);
    overlap::use_config(op, plan, o.config, M, N, dev.num_sms, a.dtype);
    overlap::check_tile_count(op, M, N, plan.gemm);
    if (overlap::debug())
        fmt::print(stderr, "loom::gemm_ar M={} N={} K_loc={} W={} SMs {} of {}: {}\n", M, N, K, W, dev.num_sms,
                   dev.device_sms, plan.str());
    if (captured) overlap::check_capture(stream, op, plan.ar_algo == ArAlgo::FusedEpilogue);
    if (plan.ar_algo == ArAlgo::FusedEpilogue) {
        gemm_validate(a, b, c, GemmOptions{}, /*allow_f8=*/true);
        gemm_ar_fused(world, a, b, c, plan.gemm, sc, dev.num_sms, stream, captured);
    } else {
        gemm_ar_reduce_kernel(world, a, b, c, plan, sc, dev.num_sms, stream);
    }
}

}  // namespace detail

}  // namespace loom
