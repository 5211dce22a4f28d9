// qkv_gemm_a2a's fused algorithm (ulysses.hpp): the QKV GEMM with TileNotifyHooks (gemm_rs's tile-publishing GEMM,
// kernels/overlap/gemm_rs.cuh) into this call's half of the symmetric product, and ulysses_qkv_a2a on comm_blocks SMs
// of a side stream pulling this rank's head columns of every rank's tiles as they are stored.
#include <algorithm>

#include "loom/jit/jit.hpp"
#include "ops/attention/ulysses/ulysses.hpp"
#include "ops/overlap/common/hooked_gemm.hpp"

namespace loom::ulysses {
namespace {

constexpr const char* kNotifyHooks = "loom::kernels::overlap::TileNotifyHooks";
constexpr const char* kNotifyHeader = "loom/kernels/overlap/gemm_rs.cuh";

}  // namespace

void qkv_fused(const QkvCall& x) {
    World& world = *x.world;
    QkvState& st = overlap::op_state<QkvState>(world, "qkv_gemm_a2a");
    const GemmConfig& cfg = x.plan.gemm;
    const int64_t N = x.layout.cols(), es = dtype_size(x.dtype);
    const std::size_t half_stride =
        overlap::ensure_parity_halves(world, st.buf, static_cast<std::size_t>(x.R * N * es));
    jit::KernelSpec spec;
    spec.header = kHeader;
    spec.name = "loom::kernels::attention::ulysses_qkv_a2a";
    // Both kernels compiled before the call counter advances (a JIT error leaves it as it was).
    const jit::Kernel& a2a = jit::get_kernel(spec);
    overlap::prepare_gemm(kNotifyHooks, kNotifyHeader, x.x, MatrixView{st.buf.p, x.dtype, x.R, N, 0}, cfg,
                          overlap::OpScale{}, overlap::ScaleAt::Epilogue);

    const uint64_t epoch = ++st.calls;
    auto* const half = static_cast<uint8_t*>(st.buf.p) + (epoch % 2) * half_stride;
    const MatrixView product{half, x.dtype, x.R, N, 0};
    kernels::attention::UlyssesQkvParams p = qkv_params(x, st);
    p.qkv = half;
    p.epoch = epoch;
    p.block_m = cfg.block_m;
    p.block_n_bytes = static_cast<int32_t>(cfg.block_n * es);
    p.num_m = static_cast<int32_t>((x.R + cfg.block_m - 1) / cfg.block_m);
    p.num_n = static_cast<int32_t>((N + cfg.block_n - 1) / cfg.block_n);
    p.group_m = std::max(cfg.group_m, 1);
    p.whole = 0;

    overlap::fork(st.side, x.stream);
    overlap::launch_on_side(a2a, st.side, static_cast<unsigned>(x.plan.comm_blocks),
                            kernels::attention::kUlyssesThreads, world.ctx(), p);
    const kernels::overlap::TileNotifyHookArgs h = overlap::tile_notify_args(st.sig->tile, epoch, p.num_n, 0);
    overlap::launch_gemm(kNotifyHooks, kNotifyHeader, x.x, x.w, product, cfg, x.num_sms, x.stream, h,
                         overlap::OpScale{}, overlap::ScaleAt::Epilogue);
    overlap::join(st.side, x.stream);
}

}  // namespace loom::ulysses
