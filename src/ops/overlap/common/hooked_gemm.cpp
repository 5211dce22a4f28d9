#include "ops/overlap/common/hooked_gemm.hpp"

#include <type_traits>

#include "loom/kernels/overlap/overlap_params.hpp"
#include "loom/runtime/error.hpp"

namespace loom::overlap {

static_assert(std::is_trivially_copyable_v<kernels::overlap::AgGemmHookArgs>);
static_assert(std::is_trivially_copyable_v<kernels::overlap::TileNotifyHookArgs>);
static_assert(std::is_trivially_copyable_v<kernels::overlap::RsParams>);

GemmOptions gemm_options(const OpScale& s) {
    GemmOptions o;
    o.alpha = s.alpha;
    o.scale_a = s.a;
    o.scale_b = s.b;
    return o;
}

char* gemm_into_parity_half(World& world, PartialHalves& partials, const MatrixView& a, const MatrixView& b,
                            DType dtype, const OpScale& sc, cudaStream_t stream, bool captured) {
    const int64_t M = a.rows, N = b.rows;
    const std::size_t half_stride =
        ensure_parity_halves(world, partials.buf, static_cast<std::size_t>(M * N) * dtype_size(dtype), captured);
    const uint64_t epoch = ++partials.calls;
    char* const half = static_cast<char*>(partials.buf.p) + (epoch % 2) * half_stride;
    gemm(a, b, MatrixView{half, dtype, M, N, 0}, gemm_options(sc), stream);
    return half;
}

kernels::overlap::TileNotifyHookArgs tile_notify_args(uint64_t* tile, uint64_t epoch, int64_t num_n, int32_t shift_m) {
    kernels::overlap::TileNotifyHookArgs h{};
    h.tile = tile;
    h.epoch = epoch;
    h.num_n = static_cast<int32_t>(num_n);
    h.shift_m = shift_m;
    return h;
}

void prepare_gemm(const char* hooks, const char* header, const MatrixView& a, const MatrixView& c,
                  const GemmConfig& cfg, const OpScale& sc, ScaleAt at) {
    const GemmOptions epilogue = at == ScaleAt::Epilogue ? gemm_options(sc) : GemmOptions{};
    (void)jit::get_kernel(
        gemm_kernel_spec(cfg, a.dtype, c.dtype, gemm_kernel_bias(cfg, c.dtype, epilogue), false, hooks, header));
}

}  // namespace loom::overlap
