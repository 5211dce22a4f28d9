// gemm_ar's fused epilogue (ArAlgo::FusedEpilogue; ArEpilogueHooks, kernels/overlap/gemm_ar.cuh): the GEMM's epilogue
// pushes each tile part to every peer and sums the W copies itself (ArFusedState; the kernel numbers the calls).
#include <algorithm>
#include <string>

#include "loom/jit/jit.hpp"
#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/tma.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "ops/overlap/common/hooked_gemm.hpp"
#include "ops/overlap/common/plan.hpp"
#include "ops/overlap/gemm_ar/gemm_ar.hpp"

namespace loom::overlap {

void gemm_ar_fused(const ArCall& x) {
    constexpr const char* op = "gemm_ar";
    constexpr const char* kFusedHooks = "loom::kernels::overlap::ArEpilogueHooks";
    World& world = *x.world;
    const GemmConfig& cfg = x.plan.gemm;
    ArFusedState& st = op_state<ArFusedState>(world, op, x.captured);
    const int W = x.W;
    const int64_t es = x.out_bytes;
    const std::string unfit = whole_tile_unfit(cfg, x.out_bytes);
    LOOM_CHECK(unfit.empty(), "{} (fused epilogue): expected {}", op, unfit);
    const int64_t num_m = (x.M + cfg.block_m - 1) / cfg.block_m, num_n = (x.N + cfg.block_n - 1) / cfg.block_n;
    LOOM_CHECK(2 * num_m * num_n <= kernels::overlap::kMaxTileSignals,
               "{} (fused epilogue): expected at most {} output tiles, given {}", op,
               kernels::overlap::kMaxTileSignals / 2, num_m * num_n);
    const int64_t slot_bytes = num_m * num_n * cfg.block_m * cfg.block_n * es;
    const std::size_t half_stride =
        ensure_parity_halves(world, st.buf, static_cast<std::size_t>(std::max(W - 1, 1) * slot_bytes), x.captured);
    const jit::Kernel& kernel =
        jit::get_kernel(gemm_kernel_spec(cfg, x.a.dtype, x.c.dtype, DType::F32, false, kFusedHooks, kArHeader));

    // No per-call value: the kernel numbers the call and picks its half (kernels/overlap/gemm_ar.cuh).
    kernels::overlap::ArFusedHookArgs h{};
    h.recv = static_cast<uint8_t*>(st.buf.p);
    h.tile_in = &st.sig->tile_in[0][0];
    h.launches = &st.sig->launches;
    h.half_stride = static_cast<int64_t>(half_stride);
    const Ctx ctx = world.ctx();
    h.heap_bytes = static_cast<int64_t>(ctx.heap_size);
    h.slot_bytes = slot_bytes;
    h.timeout_ns = ctx.wait_timeout_ns;
    h.me = world.local_rank();
    h.world = W;
    h.num_n = static_cast<int32_t>(num_n);
    GemmSm90Launch l = gemm_sm90_launch(x.a, x.b, x.c, gemm_options(x.sc), cfg, x.num_sms, x.stream);
    l.launch.smem = kernels::gemm_sm90_smem_bytes(cfg.block_m, cfg.block_n, cfg.stages, x.out_bytes);
    // Epilogue hooks store whole 64-row slabs of the warpgroup's staged part.
    l.tmap_d = make_tma_2d(x.c, kernels::kGemmWholeTileBoxRows, kernels::gemm_store_box_cols(x.out_bytes));
    kernel(l.launch, l.tmap_a, l.tmap_b, l.tmap_d, l.args, h);
}

}  // namespace loom::overlap
