// gemm_ar's reduce kernel (ArAlgo::ReduceKernel): the GEMM with TileNotifyHooks into this call's parity half of the
// partials (ArPartialsState) and gemm_ar_reduce (kernels/overlap/gemm_ar.cuh) on comm_blocks SMs of a side stream
// (ArReduceState), pulling each tile from every rank once stored (one-shot), or each owned tile from every rank and
// every other tile from its owner once summed (two-shot); after the GEMM, on its stream, gemm_ar_reduce again on
// every usable SM, claiming the tiles the side blocks have not reached.
#include <algorithm>

#include "loom/jit/jit.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "ops/overlap/common/hooked_gemm.hpp"
#include "ops/overlap/gemm_ar/gemm_ar.hpp"

namespace loom::overlap {
namespace {

constexpr const char* kNotifyHooks = "loom::kernels::overlap::TileNotifyHooks";

const jit::Kernel& reduce_kernel_of(DType out) {
    jit::KernelSpec spec;
    spec.header = kArHeader;
    spec.name = "loom::kernels::overlap::gemm_ar_reduce";
    spec.template_args = {dtype_cuda_name(out)};
    return jit::get_kernel(spec);
}

}  // namespace

void gemm_ar_reduce_kernel(const ArCall& x) {
    World& world = *x.world;
    const GemmConfig& cfg = x.plan.gemm;
    PartialHalves& partials = op_state<ArPartialsState>(world, "gemm_ar").partials;
    ArReduceState& st = op_state<ArReduceState>(world, "gemm_ar");
    const std::size_t half_bytes = (static_cast<std::size_t>(x.M * x.N) * x.out_bytes + 1023) / 1024 * 1024;
    const int64_t num_n = (x.N + cfg.block_n - 1) / cfg.block_n;
    // Parity halves at a fixed offset (nothing orders a peer's reads of call e - 1 before our GEMM of call e).
    const std::size_t half_stride = ensure_parity_halves(world, partials.buf, half_bytes);
    // Compile (or fetch) both kernels before the call number advances: a JIT error must leave every counter as it
    // was, or the next call would wait for targets its peers never reach.
    const jit::Kernel& reduce_kernel = reduce_kernel_of(x.c.dtype);
    prepare_gemm(kNotifyHooks, kArHeader, x.a, x.c, cfg, x.sc, ScaleAt::Epilogue);
    const uint64_t epoch = ++partials.calls;
    void* const partial = static_cast<char*>(partials.buf.p) + (epoch % 2) * half_stride;
    const MatrixView pview{partial, x.c.dtype, x.M, x.N, 0};
    gemm_validate(x.a, x.b, pview, GemmOptions{}, /*allow_f8=*/true);

    kernels::overlap::ArParams ap{};
    ap.partial = partial;
    ap.out = x.c.data;
    ap.tile = st.sig->tile;
    ap.reduced = st.sig->reduced;
    ap.claims = &st.sig->claims;
    ap.claim_base = st.claims;
    ap.two_shot = x.plan.ar_two_shot ? 1 : 0;
    ap.ldo = x.c.stride();
    ap.m = static_cast<int32_t>(x.M);
    ap.n = static_cast<int32_t>(x.N);
    ap.block_m = cfg.block_m;
    ap.block_n = cfg.block_n;
    ap.group_m = std::max(cfg.group_m, 1);
    ap.epoch = epoch;

    const unsigned side_blocks = static_cast<unsigned>(x.plan.comm_blocks);
    const unsigned finish_blocks = static_cast<unsigned>(std::max(x.num_sms, 1));
    fork(st.side, x.stream);
    launch_on_side(reduce_kernel, st.side, side_blocks, kernels::overlap::kArReduceThreads, world.ctx(), ap);
    const kernels::overlap::TileNotifyHookArgs h = tile_notify_args(st.sig->tile, epoch, num_n, 0);
    launch_gemm(kNotifyHooks, kArHeader, x.a, x.b, pview, cfg, x.num_sms, x.stream, h, x.sc, ScaleAt::Epilogue);
    // The tiles the side blocks have not reached, at the whole GPU's (the rank's SMs') rate.
    jit::LaunchConfig finish;
    finish.grid = dim3(finish_blocks);
    finish.block = dim3(kernels::overlap::kArReduceThreads);
    finish.stream = x.stream;
    reduce_kernel(finish, world.ctx(), ap);
    join(st.side, x.stream);
    // The claim counter's value after this call: every block claims once per tile it takes and once past the last.
    st.claims += static_cast<uint64_t>(overlap::tile_count(x.M, x.N, cfg)) + side_blocks + finish_blocks;
}

}  // namespace loom::overlap
