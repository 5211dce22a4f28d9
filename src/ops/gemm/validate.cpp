// Input and config validation of loom::gemm, shared with the overlapped GEMMs: every error names what was expected and
// what was given.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "runtime/pointer_check.hpp"

namespace loom {

void gemm_validate_config(const GemmConfig& c, bool b_kn, DType in) {
    if (c.gemv) {  // with or without sm80: the gemv kernel runs on sm_80 and later
        LOOM_CHECK(!b_kn, "gemm config: the gemv kernel expects B as [N, K], given b_kn (B as [K, N])");
        LOOM_CHECK(c.block_n == kernels::kGemvRows, "gemm config: the gemv kernel expects block_n {}, given {}",
                   kernels::kGemvRows, c.block_n);
        LOOM_CHECK(c.stages >= 2 && c.stages <= kernels::kGemvMaxStages,
                   "gemm config: the gemv kernel expects stages in [2, {}], given {}", kernels::kGemvMaxStages,
                   c.stages);
        LOOM_CHECK(c.tail_splits >= 1 && c.tail_splits <= 65535,
                   "gemm config: the gemv kernel expects tail_splits (K-splits) in [1, 65535], given {}",
                   c.tail_splits);
        return;
    }
    if (c.sm80) return;
    LOOM_CHECK(c.block_m == 64 || c.block_m == 128 || c.block_m == 192,
               "gemm config: expected block_m 64, 128 or 192, given {}", c.block_m);
    LOOM_CHECK(c.block_n % 16 == 0 && c.block_n >= 16 && c.block_n <= 256,
               "gemm config: expected block_n a multiple of 16 in [16, 256], given {}", c.block_n);
    // Three consumer warpgroups compile under a 128-register cap (512 threads): wgmma n208 and wider needs more.
    LOOM_CHECK(c.block_m != 192 || c.block_n <= kGemmMaxBlockN192,
               "gemm config: block_m 192 expects block_n <= {} (the 128 registers of a 512-thread CTA), given {}",
               kGemmMaxBlockN192, c.block_n);
    LOOM_CHECK(c.block_m != 192 || c.cluster_m == 1, "gemm config: block_m 192 expects cluster_m 1, given {}",
               c.cluster_m);
    LOOM_CHECK(!b_kn || c.block_n % 64 == 0, "gemm config: B as [K, N] needs block_n a multiple of 64, given {}",
               c.block_n);
    const int block_k = kernels::gemm_block_k(static_cast<int>(dtype_size(in)));
    LOOM_CHECK(c.block_k == block_k, "gemm config: expected block_k {} (one 128-byte row of {}), given {}", block_k,
               dtype_name(in), c.block_k);
    LOOM_CHECK(c.stages >= 2 && c.stages <= kernels::kGemmSm90MaxStages,
               "gemm config: expected stages in [2, {}], given {}", kernels::kGemmSm90MaxStages, c.stages);
    LOOM_CHECK(kernels::gemm_sm90_smem_bytes(c.block_m, c.block_n, c.stages) <= kernels::kGemmSm90MaxSmem,
               "gemm config: {} needs {} B of shared memory, the limit is {}: expected stages <= {} for {} x {} tiles",
               c.str(), kernels::gemm_sm90_smem_bytes(c.block_m, c.block_n, c.stages), kernels::kGemmSm90MaxSmem,
               kernels::gemm_sm90_max_stages(c.block_m, c.block_n), c.block_m, c.block_n);
    LOOM_CHECK(c.cluster_m == 1 || c.cluster_m == 2, "gemm config: expected cluster_m 1 or 2, given {}", c.cluster_m);
    LOOM_CHECK(c.group_m >= 1 && c.group_m <= kGemmMaxGroupM, "gemm config: expected group_m in [1, {}], given {}",
               kGemmMaxGroupM, c.group_m);
    LOOM_CHECK(c.grid >= 0 && c.grid <= kGemmMaxGrid && c.grid % (c.cluster_m * std::max(c.cluster_k, 1)) == 0,
               "gemm config: expected grid in [0, {}] and a multiple of the cluster size {}, given {}", kGemmMaxGrid,
               c.cluster_m * std::max(c.cluster_k, 1), c.grid);
    LOOM_CHECK(c.tail_splits >= 1 && c.tail_splits <= kGemmMaxTailSplits,
               "gemm config: expected tail_splits in [1, {}] (1: no split tail), given {}", kGemmMaxTailSplits,
               c.tail_splits);
    LOOM_CHECK(c.tail_splits == 1 || c.cluster_m == 1,
               "gemm config: the split tail needs cluster_m 1, given tail_splits {} with cluster_m {}", c.tail_splits,
               c.cluster_m);
    LOOM_CHECK(c.cluster_k == 1 || c.cluster_k == 2 || c.cluster_k == 4 || c.cluster_k == 8,
               "gemm config: expected cluster_k 1, 2, 4 or 8, given {}", c.cluster_k);
    if (c.cluster_k > 1) {
        LOOM_CHECK(
            c.cluster_m == 1 && c.tail_splits == 1,
            "gemm config: cluster_k {} expects cluster_m 1 and tail_splits 1, given cluster_m {} and tail_splits "
            "{}",
            c.cluster_k, c.cluster_m, c.tail_splits);
        LOOM_CHECK(c.block_n / 8 % c.cluster_k == 0,
                   "gemm config: cluster_k {} divides the tile's {} 8-column fragments among the ranks: expected "
                   "block_n a multiple of {}, given {}",
                   c.cluster_k, c.block_n / 8, 8 * c.cluster_k, c.block_n);
        const int min_stages = kernels::gemm_sm90_cluster_k_min_stages(c.block_m, c.block_n);
        LOOM_CHECK(c.stages >= min_stages,
                   "gemm config: cluster_k {} sums each rank's fp32 partial of a {} x {} tile in its ring: expected "
                   "stages >= {}, given {}",
                   c.cluster_k, c.block_m, c.block_n, min_stages, c.stages);
    }
}

void gemm_validate(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o, bool allow_f8) {
    const bool f8 = a.dtype == DType::F8E4M3;
    if (allow_f8) {
        LOOM_CHECK(a.dtype == DType::BF16 || a.dtype == DType::F16 || f8,
                   "gemm: expected A bf16, f16 or f8e4m3, given {}", dtype_name(a.dtype));
    } else {
        LOOM_CHECK(a.dtype == DType::BF16 || a.dtype == DType::F16, "gemm: expected A bf16 or f16, given {}",
                   dtype_name(a.dtype));
    }
    LOOM_CHECK(b.dtype == a.dtype, "gemm: expected B of A's dtype {}, given {}", dtype_name(a.dtype),
               dtype_name(b.dtype));
    LOOM_CHECK(c.dtype == DType::BF16 || c.dtype == DType::F16 || c.dtype == DType::F32,
               "gemm: expected C bf16, f16 or f32, given {}", dtype_name(c.dtype));
    const int64_t m = a.rows, k = a.cols;
    const int64_t n = o.b_kn ? b.cols : b.rows;
    const int64_t bk = o.b_kn ? b.rows : b.cols;
    LOOM_CHECK(m > 0 && n > 0 && k > 0, "gemm: expected non-empty shapes, given M={} N={} K={}", m, n, k);
    LOOM_CHECK(bk == k, "gemm: expected B with K={} ({}), given {} x {}", k, o.b_kn ? "[K, N]" : "[N, K]", b.rows,
               b.cols);
    LOOM_CHECK(c.rows == m && c.cols == n, "gemm: expected C of {} x {}, given {} x {}", m, n, c.rows, c.cols);
    LOOM_CHECK(n % 8 == 0 && k % 8 == 0, "gemm: expected N and K multiples of 8, given N={} K={}", n, k);
    if (f8) {
        // wgmma takes 8-bit operands K-major only; TMA needs 16-byte rows.
        LOOM_CHECK(!o.b_kn,
                   "gemm: f8e4m3 inputs expect B as [N, K] (wgmma reads 8-bit operands K-major only), given "
                   "b_kn (B as [K, N])");
        LOOM_CHECK(k % 16 == 0, "gemm: f8e4m3 inputs expect K a multiple of 16 (16-byte rows), given K={}", k);
    }
    // The kernels index rows, columns and k-blocks in int32, up to one tile past the edge.
    LOOM_CHECK(m <= kGemmMaxDim && n <= kGemmMaxDim && k <= kGemmMaxDim,
               "gemm: expected M, N and K <= {} (int32 indices), given M={} N={} K={}", kGemmMaxDim, m, n, k);
    for (const auto* v : {&a, &b, &c}) {
        const char* name = v == &a ? "A" : v == &b ? "B" : "C";
        LOOM_CHECK(v->data != nullptr, "gemm: expected a device pointer for {}, given nullptr", name);
        LOOM_CHECK(reinterpret_cast<std::uintptr_t>(v->data) % 16 == 0,
                   "gemm: expected {} 16-byte aligned, given address {}", name, v->data);
        LOOM_CHECK(v->stride() >= v->cols, "gemm: expected {}'s ld >= cols {}, given {}", name, v->cols, v->stride());
        LOOM_CHECK((v->stride() * dtype_size(v->dtype)) % 16 == 0,
                   "gemm: expected {}'s row stride a multiple of 16 bytes, given ld {} ({} B)", name, v->stride(),
                   v->stride() * dtype_size(v->dtype));
    }
    if (o.bias.data) {
        LOOM_CHECK(o.bias.dtype == DType::F32 || o.bias.dtype == DType::BF16 || o.bias.dtype == DType::F16,
                   "gemm: expected bias f32, bf16 or f16, given {}", dtype_name(o.bias.dtype));
        LOOM_CHECK(static_cast<int64_t>(o.bias.count) == n, "gemm: expected bias of N={} elements, given {}", n,
                   o.bias.count);
        LOOM_CHECK(reinterpret_cast<std::uintptr_t>(o.bias.data) % 4 == 0, "gemm: expected bias 4-byte aligned");
    }
    LOOM_CHECK(std::isfinite(o.alpha) && std::isfinite(o.beta), "gemm: expected finite alpha/beta, given {} {}",
               o.alpha, o.beta);
    gemm_check_device_scale("gemm", "scale_a", o.scale_a);
    gemm_check_device_scale("gemm", "scale_b", o.scale_b);
}

void gemm_check_device_scale(const char* op, const char* name, const float* p, int device) {
    if (p == nullptr) return;
    LOOM_CHECK(reinterpret_cast<std::uintptr_t>(p) % 4 == 0, "{}: expected {} 4-byte aligned, given {}", op, name,
               static_cast<const void*>(p));
    if (device < 0 && cudaGetDevice(&device) != cudaSuccess) {
        cudaGetLastError();
        device = 0;
    }
    detail::check_memory(nullptr, device, op, name, p, sizeof(float));
}

void gemm_check_memory(const char* op, const MatrixView& a, const MatrixView& b, const MatrixView& c,
                       const GemmOptions& o, const World* world, int device) {
    detail::check_memory(world, device, op, "A", a);
    detail::check_memory(world, device, op, "B", b);
    detail::check_memory(world, device, op, "C", c);
    // The kernels read A and B tile by tile while C's tiles are stored: C may share no element with them.
    detail::check_disjoint(op, "C", c, "A", a);
    detail::check_disjoint(op, "C", c, "B", b);
    if (o.bias.data)
        detail::check_memory(world, device, op, "bias", o.bias.data,
                             detail::buffer_bytes(op, "bias", o.bias.count, o.bias.dtype));
}

}  // namespace loom
