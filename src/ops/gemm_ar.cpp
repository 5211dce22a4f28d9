// loom::gemm_ar: GEMM+AllReduce for small M, one-shot pull of per-tile partial products
// (kernels/gemm_ar.cuh; docs/overlap.md).
//
// Per call e on every rank:
//   stream  fork ── GEMM(partial[e % 2] (symmetric), tile[i] = e after each tile's stores) ── join
//   side         gemm_ar_reduce: per tile, wait tile[i] >= e on every rank, sum the W partial tiles (rank
//                order, fp32), write C
#include <algorithm>

#include "loom/kernels/overlap_params.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/error.hpp"
#include "ops/overlap_state.hpp"

namespace loom {

namespace {
constexpr int64_t kMaxM = 128;
constexpr const char* kHooks = "loom::kernels::overlap::TileNotifyHooks";
constexpr const char* kHeader = "loom/kernels/gemm_ar.cuh";
}  // namespace

OverlapPlan gemm_ar_plan(int64_t m, int64_t n, int64_t k_loc, int world_size, int comm_sms, int arch, int num_sms) {
    (void)world_size;
    OverlapPlan p;
    const GemmConfig all = gemm_heuristic(m, n, k_loc, false, arch, num_sms, /*split_tail=*/false);
    const int64_t tiles = ((m + all.block_m - 1) / all.block_m) * ((n + all.block_n - 1) / all.block_n);
    // One reduce block per tile (a tile's pull is ~W x 16-64 KiB), at most 32; the GEMM keeps the rest.
    p.comm_blocks = overlap::comm_blocks(comm_sms, static_cast<int>(std::clamp<int64_t>(tiles, 1, 32)), num_sms);
    p.gemm = overlap::gemm_config(m, n, k_loc, arch, num_sms - p.comm_blocks);
    return p;
}

void gemm_ar(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
             const GemmArOptions& o) {
    constexpr const char* op = "gemm_ar";
    overlap::OpState& st = overlap::op_state(world, overlap::OpKind::GemmAr, op);
    const int W = world.world_size();
    overlap::check_inputs(op, a, b, c);
    const int64_t M = a.rows, K = a.cols, N = b.rows;
    LOOM_CHECK(M <= kMaxM,
               "{}: expected M <= {} (the low-latency one-shot variant), given M = {}; use gemm_rs + all_gather or "
               "gemm + all_reduce for larger M",
               op, kMaxM, M);
    LOOM_CHECK(c.rows == M && c.cols == N, "{}: expected C of [M, N] = [{}, {}], given {} x {}", op, M, N, c.rows,
               c.cols);
    LOOM_CHECK(o.comm_sms >= 0, "{}: expected comm_sms >= 0, given {}", op, o.comm_sms);
    const std::size_t es = dtype_size(c.dtype);
    const std::size_t half_bytes = (static_cast<std::size_t>(M * N) * es + 1023) / 1024 * 1024;

    OverlapPlan plan = gemm_ar_plan(M, N, K, W, o.comm_sms, st.arch, st.num_sms);
    if (o.config) {
        plan.gemm = *o.config;
        if (plan.gemm.grid == 0)
            plan.gemm.grid = static_cast<int>(gemm_sm90_grid(M, N, plan.gemm, st.num_sms - plan.comm_blocks));
    }
    overlap::check_config(op, plan.gemm);
    const int64_t num_n = (N + plan.gemm.block_n - 1) / plan.gemm.block_n;
    const int64_t num_m = (M + plan.gemm.block_m - 1) / plan.gemm.block_m;
    LOOM_CHECK(num_m * num_n <= kernels::overlap::kMaxTileSignals, "{}: expected at most {} output tiles, given {}", op,
               kernels::overlap::kMaxTileSignals, num_m * num_n);
    if (overlap::debug())
        fmt::print(stderr, "loom::gemm_ar M={} N={} K_loc={} W={} SMs {} of {}: {}\n", M, N, K, W, st.num_sms,
                   st.device_sms, plan.str());

    // Parity halves at a fixed offset (nothing orders a peer's reads of call e - 1 before our GEMM of call e).
    const std::size_t half_stride = overlap::ensure_parity_halves(world, st, half_bytes);
    char* const partials = static_cast<char*>(st.sym);

    jit::KernelSpec spec;
    spec.header = "loom/kernels/gemm_ar.cuh";
    spec.name = "loom::kernels::overlap::gemm_ar_reduce";
    spec.template_args = {dtype_cuda_name(c.dtype)};
    // Compile (or fetch) both kernels before the call number advances: a JIT error must leave every counter as
    // it was, or the next call would wait for targets its peers never reach.
    const jit::Kernel& reduce_kernel = jit::get_kernel(spec);
    overlap::prepare_gemm(kHooks, kHeader, a, c, plan.gemm);
    const uint64_t epoch = ++st.calls;
    void* const partial = partials + (epoch % 2) * half_stride;
    const MatrixView pview{partial, c.dtype, M, N, 0};
    gemm_validate(a, b, pview, GemmOptions{});

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

    overlap::fork(st, stream);
    {
        jit::LaunchConfig lc;
        lc.grid = dim3(static_cast<unsigned>(plan.comm_blocks));
        lc.block = dim3(256);
        lc.stream = st.side;
        const Ctx ctx = world.ctx();
        reduce_kernel(lc, ctx, ap);
    }
    kernels::overlap::TileNotifyHookArgs h{};
    h.tile = st.sig->tile;
    h.epoch = epoch;
    h.num_n = static_cast<int32_t>(num_n);
    h.shift_m = 0;
    overlap::launch_gemm(kHooks, kHeader, a, b, pview, plan.gemm, st.num_sms, stream, h);
    overlap::join(st, stream);
}

}  // namespace loom
