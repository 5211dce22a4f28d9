// loom::gemm_rs: GEMM+ReduceScatter, scatter-then-reduce (kernels/gemm_rs.cuh; docs/overlap.md).
//
// Per call e on every rank (P scatter-reduce blocks, the same on every rank):
//   stream  fork ── GEMM(partial [M, N], tiles rows-of-rank-(me+1) first, own rows last; tile[i] = e) ── join
//   side         gemm_rs_scatter_reduce: wait freed[d] >= F; per ready tile: push its rows to their owners'
//                scratch, tile_in[me][tile] := e there; then (second walk) reduce its own rows once
//                tile_in[q][tile] >= e for every peer q; freed[me] += 1 on every peer at the end
// F = P x (calls before e) (freed_total before the call).
#include <algorithm>

#include "loom/kernels/overlap_params.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/error.hpp"
#include "ops/overlap_state.hpp"

namespace loom {

namespace {
constexpr const char* kHooks = "loom::kernels::overlap::TileNotifyHooks";
}

OverlapPlan gemm_rs_plan(int64_t m, int64_t n, int64_t k_loc, int world_size, int comm_sms, int arch, int num_sms) {
    OverlapPlan p;
    // 16 blocks of ld/st pushes (~20-30 GB/s each over NVLink) keep up with the GEMM's output rate on the
    // Triton-distributed shapes; small outputs need fewer (each block reduces at least one row).
    const int64_t rows_seg = m / std::max(world_size, 1);
    p.comm_blocks = overlap::comm_blocks(comm_sms, static_cast<int>(std::clamp<int64_t>(rows_seg, 1, 16)), num_sms);
    p.gemm = overlap::gemm_config(m, n, k_loc, arch, num_sms - p.comm_blocks);
    return p;
}

void gemm_rs(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
             const GemmRsOptions& o) {
    constexpr const char* op = "gemm_rs";
    overlap::OpState& st = overlap::op_state(world, overlap::OpKind::GemmRs, op);
    const int W = world.world_size(), me = world.local_rank();
    overlap::check_inputs(op, a, b, c);
    const int64_t M = a.rows, K = a.cols, N = b.rows;
    LOOM_CHECK(M % W == 0, "{}: expected M a multiple of the world size {}, given M = {}", op, W, M);
    const int64_t rows_seg = M / W;
    LOOM_CHECK(c.rows == rows_seg && c.cols == N, "{}: expected C of [M / W, N] = [{}, {}], given {} x {}", op,
               rows_seg, N, c.rows, c.cols);
    LOOM_CHECK(M <= INT32_MAX && N <= INT32_MAX && M * N <= (int64_t(1) << 40), "{}: shapes too large: M={} N={}", op,
               M, N);
    LOOM_CHECK(o.comm_sms >= 0, "{}: expected comm_sms >= 0, given {}", op, o.comm_sms);
    const std::size_t es = dtype_size(c.dtype);
    const std::size_t full_bytes = static_cast<std::size_t>(M * N) * es;

    OverlapPlan plan = gemm_rs_plan(M, N, K, W, o.comm_sms, st.arch, st.num_sms);
    if (o.config) {
        plan.gemm = *o.config;
        if (plan.gemm.grid == 0)
            plan.gemm.grid = static_cast<int>(gemm_sm90_grid(M, N, plan.gemm, st.num_sms - plan.comm_blocks));
    }
    overlap::check_config(op, plan.gemm);
    const int64_t num_m = (M + plan.gemm.block_m - 1) / plan.gemm.block_m;
    const int64_t num_n = (N + plan.gemm.block_n - 1) / plan.gemm.block_n;
    LOOM_CHECK(num_m * num_n <= kernels::overlap::kMaxTileSignals,
               "{}: expected at most {} output tiles, given {} x {} (M={} N={} with {})", op,
               kernels::overlap::kMaxTileSignals, num_m, num_n, M, N, plan.gemm.str());
    if (overlap::debug())
        fmt::print(stderr, "loom::gemm_rs M={} N={} K_loc={} W={} SMs {} of {}: {}\n", M, N, K, W, st.num_sms,
                   st.device_sms, plan.str());

    void* scratch = overlap::ensure_symmetric(world, st, full_bytes);  // [W][M / W][N]
    void* partial = overlap::ensure_local(st, full_bytes);             // [M, N]
    const MatrixView pview{partial, c.dtype, M, N, 0};
    gemm_validate(a, b, pview, GemmOptions{});

    jit::KernelSpec spec;
    spec.header = "loom/kernels/gemm_rs.cuh";
    spec.name = "loom::kernels::overlap::gemm_rs_scatter_reduce";
    spec.template_args = {dtype_cuda_name(c.dtype)};
    // Both kernels compiled before the counters advance (a JIT error leaves them as they were).
    const jit::Kernel& scatter_kernel = jit::get_kernel(spec);
    overlap::prepare_gemm(kHooks, "loom/kernels/gemm_rs.cuh", a, pview, plan.gemm);

    const uint64_t epoch = ++st.calls;
    const int P = plan.comm_blocks;
    kernels::overlap::RsParams rp{};
    rp.partial = partial;
    rp.scratch = scratch;
    rp.out = c.data;
    rp.sig = st.sig;
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

    overlap::fork(st, stream);
    {
        jit::LaunchConfig lc;
        lc.grid = dim3(static_cast<unsigned>(P));
        lc.block = dim3(kernels::overlap::kScatterReduceThreads);
        lc.stream = st.side;
        const Ctx ctx = world.ctx();
        scatter_kernel(lc, ctx, rp);
    }
    kernels::overlap::TileNotifyHookArgs h{};
    h.tile = st.sig->tile;
    h.epoch = epoch;
    h.num_n = static_cast<int32_t>(num_n);
    h.shift_m = rp.shift_m;
    overlap::launch_gemm(kHooks, "loom/kernels/gemm_rs.cuh", a, b, pview, plan.gemm, st.num_sms, stream, h);
    overlap::join(st, stream);
}

}  // namespace loom
