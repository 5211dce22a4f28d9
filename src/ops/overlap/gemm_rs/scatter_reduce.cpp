// gemm_rs's scatter-reduce (RsAlgo::ScatterReduce): the GEMM with TileNotifyHooks into a local partial product and
// gemm_rs_scatter_reduce (kernels/overlap/gemm_rs.cuh) on comm_blocks SMs of a side stream beside it (gemm_rs.hpp).
#include <algorithm>

#include "loom/jit/jit.hpp"
#include "ops/overlap/common/hooked_gemm.hpp"
#include "ops/overlap/gemm_rs/gemm_rs.hpp"

namespace loom::overlap {
namespace {

constexpr const char* kNotifyHooks = "loom::kernels::overlap::TileNotifyHooks";

// The scatter-reduce kernel's parameters but the call's own (epoch, free target).
kernels::overlap::RsParams scatter_params(const RsCall& x, RsScatterState& st, void* partial, void* scratch) {
    const GemmConfig& cfg = x.plan.gemm;
    const int me = x.world->local_rank();
    kernels::overlap::RsParams rp{};
    rp.partial = partial;
    rp.scratch = scratch;
    rp.out = x.c.data;
    rp.sig = st.sig.p;
    rp.ldo = x.c.stride();
    rp.m = static_cast<int32_t>(x.M);
    rp.n = static_cast<int32_t>(x.N);
    rp.rows_seg = static_cast<int32_t>(x.rows_seg);
    rp.block_m = cfg.block_m;
    rp.block_n = cfg.block_n;
    rp.group_m = std::max(cfg.group_m, 1);
    // Rows destined to rank me + 1 first, own rows last (they need no transfer).
    rp.shift_m = static_cast<int32_t>(((me + 1) % x.W) * x.rows_seg / cfg.block_m);
    return rp;
}

}  // namespace

void gemm_rs_scatter(const RsCall& x) {
    World& world = *x.world;
    RsScatterState& st = op_state<RsScatterState>(world, "gemm_rs");
    const GemmConfig& cfg = x.plan.gemm;
    const std::size_t full_bytes = static_cast<std::size_t>(x.M * x.N) * dtype_size(x.c.dtype);
    void* scratch = ensure_symmetric(world, st.buf, full_bytes);  // [W][M / W][N]
    void* partial = ensure_local(st.partial, full_bytes);         // [M, N]
    const MatrixView pview{partial, x.c.dtype, x.M, x.N, 0};

    jit::KernelSpec spec;
    spec.header = kRsHeader;
    spec.name = "loom::kernels::overlap::gemm_rs_scatter_reduce";
    spec.template_args = {dtype_cuda_name(x.c.dtype)};
    // Both kernels compiled before the counters advance (a JIT error leaves them as they were).
    const jit::Kernel& scatter_kernel = jit::get_kernel(spec);
    prepare_gemm(kNotifyHooks, kRsHeader, x.a, pview, cfg, x.sc, ScaleAt::Epilogue);

    const int64_t num_n = (x.N + cfg.block_n - 1) / cfg.block_n;
    const uint64_t epoch = ++st.calls;
    const int P = x.plan.comm_blocks;
    kernels::overlap::RsParams rp = scatter_params(x, st, partial, scratch);
    rp.epoch = epoch;
    rp.free_target = st.freed_total;
    st.freed_total += static_cast<uint64_t>(P);

    fork(st.side, x.stream);
    launch_on_side(scatter_kernel, st.side, static_cast<unsigned>(P), kernels::overlap::kScatterReduceThreads,
                   world.ctx(), rp);
    const kernels::overlap::TileNotifyHookArgs h = tile_notify_args(st.sig->tile, epoch, num_n, rp.shift_m);
    launch_gemm(kNotifyHooks, kRsHeader, x.a, x.b, pview, cfg, x.num_sms, x.stream, h, x.sc, ScaleAt::Epilogue);
    join(st.side, x.stream);
}

}  // namespace loom::overlap
