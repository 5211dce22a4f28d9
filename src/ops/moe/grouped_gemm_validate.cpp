// Input validation of loom::grouped_gemm: every error names the argument, what was expected and what was given.
#include <cmath>
#include <cstdint>
#include <tuple>

#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "ops/moe/grouped_gemm_internal.hpp"
#include "runtime/pointer_check.hpp"

namespace loom::moe {
namespace {

constexpr const char* kOp = "grouped_gemm";

void check_matrix(const MatrixView& v, const char* name) {
    LOOM_CHECK(v.data != nullptr, "grouped_gemm: expected a device pointer for {}, given nullptr", name);
    LOOM_CHECK(reinterpret_cast<std::uintptr_t>(v.data) % 16 == 0,
               "grouped_gemm: expected {} 16-byte aligned, given address {}", name, v.data);
    LOOM_CHECK(v.stride() >= v.cols, "grouped_gemm: expected {}'s ld >= cols {}, given {}", name, v.cols, v.stride());
    LOOM_CHECK((v.stride() * dtype_size(v.dtype)) % 16 == 0,
               "grouped_gemm: expected {}'s row stride a multiple of 16 bytes, given ld {} ({} B)", name, v.stride(),
               v.stride() * dtype_size(v.dtype));
    // The kernels index rows and columns in int32 up to one tile (<= 256) past the edge.
    constexpr int64_t kMaxDim = INT32_MAX - 256;
    LOOM_CHECK(v.rows <= kMaxDim && v.cols <= kMaxDim && v.rows * v.stride() >= 0,
               "grouped_gemm: expected {}'s rows and columns <= {} (int32 indices), given {} x {}", name, kMaxDim,
               v.rows, v.cols);
}

}  // namespace

void grouped_gemm_validate(const GroupedGemmProblem& p, int device) {
    const auto& [a, b, c, E, offsets, G, o] = p;
    const bool f8 = a.dtype == DType::F8E4M3;
    LOOM_CHECK(a.dtype == DType::BF16 || a.dtype == DType::F16 || f8,
               "grouped_gemm: expected A bf16, f16 or f8e4m3, given {}", dtype_name(a.dtype));
    LOOM_CHECK(b.dtype == a.dtype, "grouped_gemm: expected B of A's dtype {}, given {}", dtype_name(a.dtype),
               dtype_name(b.dtype));
    LOOM_CHECK(c.dtype == DType::BF16 || c.dtype == DType::F16 || c.dtype == DType::F32,
               "grouped_gemm: expected C bf16, f16 or f32, given {}", dtype_name(c.dtype));
    LOOM_CHECK(E >= 1, "grouped_gemm: expected num_experts >= 1, given {}", E);
    LOOM_CHECK(G >= 1 && G <= kernels::moe::kGroupedMaxGroups, "grouped_gemm: expected num_groups in [1, {}], given {}",
               kernels::moe::kGroupedMaxGroups, G);
    LOOM_CHECK(offsets != nullptr,
               "grouped_gemm: expected group_offsets (device int32[num_groups + 1]), given nullptr");
    LOOM_CHECK(reinterpret_cast<std::uintptr_t>(offsets) % 4 == 0,
               "grouped_gemm: expected group_offsets 4-byte aligned, given {}", static_cast<const void*>(offsets));
    LOOM_CHECK(a.rows >= 0, "grouped_gemm: expected A with rows >= 0, given {}", a.rows);
    const int64_t k = a.cols;
    LOOM_CHECK(k > 0, "grouped_gemm: expected A with K > 0 columns, given {}", k);
    if (p.b_kn()) {
        LOOM_CHECK(b.rows == E * k,
                   "grouped_gemm: expected B as [E * K, N] = [{} x {}, N] (b_layout KN), given {} x {}", E, k, b.rows,
                   b.cols);
    } else {
        LOOM_CHECK(b.rows > 0 && b.rows % E == 0 && b.cols == k,
                   "grouped_gemm: expected B as [E * N, K] with E = {}, K = {} (b_layout NK), given {} x {}", E, k,
                   b.rows, b.cols);
    }
    const int64_t n = p.n();
    LOOM_CHECK(n > 0 && n % 8 == 0 && k % 8 == 0, "grouped_gemm: expected N and K multiples of 8, given N={} K={}", n,
               k);
    LOOM_CHECK(!p.swiglu() || n % 16 == 0,
               "grouped_gemm: SwiGLU expects N (gate + up columns) a multiple of 16, given N={}", n);
    LOOM_CHECK(c.rows == a.rows && c.cols == p.n_out(), "grouped_gemm: expected C of {} x {}{}, given {} x {}", a.rows,
               p.n_out(), p.swiglu() ? " (N / 2 with SwiGLU)" : "", c.rows, c.cols);
    if (f8) {
        LOOM_CHECK(!p.b_kn(), "grouped_gemm: f8e4m3 inputs expect b_layout NK (B_e as [N, K], K-major), given KN");
        LOOM_CHECK(k % 16 == 0, "grouped_gemm: f8e4m3 inputs expect K a multiple of 16 (16-byte rows), given K={}", k);
    }
    if (p.block_scaled()) {
        LOOM_CHECK(o.scale_a_blocks != nullptr && o.scale_b_blocks != nullptr,
                   "grouped_gemm: expected scale_a_blocks and scale_b_blocks together, given only {}",
                   o.scale_a_blocks ? "scale_a_blocks" : "scale_b_blocks");
        LOOM_CHECK(f8, "grouped_gemm: per-128-block scales expect f8e4m3 inputs, given {}", dtype_name(a.dtype));
        LOOM_CHECK(!p.swiglu() || (n / 2) % kernels::moe::kGroupedScaleBlock == 0,
                   "grouped_gemm: per-128-block scales with SwiGLU expect N / 2 a multiple of 128 (the up half starts "
                   "a scale block), given N={}",
                   n);
    }
    LOOM_CHECK(std::isfinite(o.alpha), "grouped_gemm: expected a finite alpha, given {}", o.alpha);
    LOOM_CHECK(o.num_sms >= 0, "grouped_gemm: expected num_sms >= 0, given {}", o.num_sms);
    LOOM_CHECK(o.max_rows >= 0, "grouped_gemm: expected max_rows >= 0, given {}", o.max_rows);
    check_matrix(b, "B");
    if (a.rows > 0) {
        check_matrix(a, "A");
        check_matrix(c, "C");
    }
    if (device < 0) return;
    if (a.rows > 0) {
        loom::detail::check_memory(nullptr, device, kOp, "A", a);
        loom::detail::check_memory(nullptr, device, kOp, "C", c);
    }
    loom::detail::check_memory(nullptr, device, kOp, "B", b);
    loom::detail::check_memory(
        nullptr, device, kOp, "group_offsets", offsets,
        loom::detail::buffer_bytes(kOp, "group_offsets", static_cast<std::size_t>(G) + 1, DType::I32));
    gemm_check_device_scale(kOp, "scale_a", o.scale_a, device);
    if (p.block_scaled()) {
        const auto blocks = [](int64_t x) { return static_cast<std::size_t>((x + 127) / 128); };
        const std::size_t a_scales = static_cast<std::size_t>(a.rows) * blocks(k);
        const std::size_t b_scales = static_cast<std::size_t>(E) * blocks(n) * blocks(k);
        for (const auto& [name, ptr, count] : {std::tuple{"scale_a_blocks", o.scale_a_blocks, a_scales},
                                               std::tuple{"scale_b_blocks", o.scale_b_blocks, b_scales}}) {
            LOOM_CHECK(reinterpret_cast<std::uintptr_t>(ptr) % 4 == 0,
                       "grouped_gemm: expected {} 4-byte aligned, given {}", name, static_cast<const void*>(ptr));
            if (count > 0)
                loom::detail::check_memory(nullptr, device, kOp, name, ptr,
                                           loom::detail::buffer_bytes(kOp, name, count, DType::F32));
        }
    }
    // The kernel reads A's rows and B's experts tile by tile while it stores C's tiles.
    loom::detail::check_disjoint(kOp, "C", c, "A", a);
    loom::detail::check_disjoint(kOp, "C", c, "B", b);
    if (o.scale_b != nullptr) {
        LOOM_CHECK(reinterpret_cast<std::uintptr_t>(o.scale_b) % 4 == 0,
                   "grouped_gemm: expected scale_b 4-byte aligned, given {}", static_cast<const void*>(o.scale_b));
        loom::detail::check_memory(nullptr, device, kOp, "scale_b", o.scale_b,
                                   loom::detail::buffer_bytes(kOp, "scale_b", static_cast<std::size_t>(E), DType::F32));
    }
}

}  // namespace loom::moe
