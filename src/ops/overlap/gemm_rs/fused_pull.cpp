// gemm_rs's fused pull (RsAlgo::FusedPull; RsPullHooks and gemm_rs_pull_finish, kernels/overlap/gemm_rs_pull.cuh):
// the GEMM stores its partial product into this call's parity half and publishes each tile to its owner; the producer
// warpgroup's spare warps sum this rank's tiles; the finish kernel sums what they left.
#include <algorithm>
#include <string>

#include "loom/jit/jit.hpp"
#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "ops/overlap/common/hooked_gemm.hpp"
#include "ops/overlap/common/plan.hpp"
#include "ops/overlap/gemm_rs/gemm_rs.hpp"

namespace loom::overlap {
namespace {

constexpr const char* kPullHooks = "loom::kernels::overlap::RsPullHooks";

// The hook arguments but the call's own (partial, epoch, signals, leftover lists).
kernels::overlap::RsPullHookArgs pull_args(const RsCall& x, const GemmConfig& cfg, int32_t bpr) {
    const Ctx ctx = x.world->ctx();
    kernels::overlap::RsPullHookArgs h{};
    h.out = static_cast<uint8_t*>(x.c.data);
    h.heap_bytes = static_cast<int64_t>(ctx.heap_size);
    h.ldc = x.c.stride();
    h.timeout_ns = ctx.wait_timeout_ns;
    h.me = x.world->local_rank();
    h.world = x.W;
    h.blocks_per_rank = bpr;
    h.num_n = static_cast<int32_t>((x.N + cfg.block_n - 1) / cfg.block_n);
    h.n = static_cast<int32_t>(x.N);
    h.group = cfg.group_m;
    return h;
}

const jit::Kernel& finish_kernel(const RsCall& x, const GemmConfig& cfg) {
    jit::KernelSpec spec;
    spec.header = kRsPullHeader;
    spec.name = "loom::kernels::overlap::gemm_rs_pull_finish";
    spec.template_args = {dtype_cuda_name(x.c.dtype), std::to_string(cfg.block_m), std::to_string(cfg.block_n)};
    return jit::get_kernel(spec);
}

}  // namespace

void gemm_rs_pull(const RsCall& x) {
    constexpr const char* op = "gemm_rs";
    RsPullState& st = op_state<RsPullState>(*x.world, op);
    GemmConfig cfg = x.plan.gemm;
    const std::string unfit = fused_unfit(x.rows_seg, cfg);
    LOOM_CHECK(unfit.empty(), "{} (fused pull): expected {}", op, unfit);
    const int32_t bpr = static_cast<int32_t>(x.rows_seg / cfg.block_m);
    groups_inside_bands(cfg, bpr);  // raster groups inside a band (rs_pull_tile_order)
    const int64_t half_stride = static_cast<int64_t>(ensure_parity_halves(
        *x.world, st.buf, static_cast<std::size_t>(x.M * x.N) * static_cast<std::size_t>(x.out_bytes)));
    jit::KernelSpec spec = gemm_kernel_spec(cfg, x.a.dtype, x.c.dtype, gemm_kernel_bias(cfg, x.c.dtype, GemmOptions{}),
                                            false, kPullHooks, kRsPullHeader);
    // A diagnostic call's (x.diag) kernel: bits 1 and 2 give wrong results; bit 4 hands every part to the finish
    // kernel (right results).
    if ((x.diag & 7) != 0) spec.defines.push_back(fmt::format("LOOM_DIAG_RS_FUSED_SKIP={}", x.diag & 7));
    const jit::Kernel& kernel = jit::get_kernel(spec);
    const jit::Kernel& finish = finish_kernel(x, cfg);
    // The reducers' leftover lists (zeroed once: each finish kernel zeroes the next call's count).
    const bool fresh = st.leftover.bytes == 0;
    auto* const leftover = static_cast<uint32_t*>(
        ensure_local(st.leftover, static_cast<std::size_t>(kernels::overlap::kRsPullLeftoverWords) * 4));
    if (fresh) LOOM_CHECK_CUDA(cudaMemsetAsync(leftover, 0, 4 * sizeof(uint32_t), x.stream));

    const uint64_t epoch = ++st.calls;
    uint8_t* const partial = static_cast<uint8_t*>(st.buf.p) + static_cast<int64_t>(epoch % 2) * half_stride;
    kernels::overlap::RsPullHookArgs h = pull_args(x, cfg, bpr);
    h.partial = partial;
    h.tile_in = &st.sig->tile_in[0][0];
    h.epoch = epoch;
    h.leftover = leftover;
    const GemmSm90Launch l = gemm_sm90_launch(x.a, x.b, MatrixView{partial, x.c.dtype, x.M, x.N, 0}, gemm_options(x.sc),
                                              cfg, x.num_sms, x.stream);
    kernel(l.launch, l.tmap_a, l.tmap_b, l.tmap_d, l.args, h);
    // The parts the reducers left: a few blocks, each of which may wait for a rank's tile holding its SM, so they
    // leave most of the SMs to the ranks whose GEMMs are still running (ranks sharing a GPU).
    jit::LaunchConfig lc;
    lc.grid = dim3(static_cast<unsigned>(std::max(1, x.num_sms / 4)));
    lc.block = dim3(kernels::overlap::kRsPullFinishThreads);
    lc.stream = x.stream;
    finish(lc, h);
}

}  // namespace loom::overlap
