// Decode-sized loom::gemm (M <= 128: the decode plan, src/ops/gemm/decode_plan.cpp) against an fp64 device reference
// (tests/common/kernels/gemm_reference.cuh, nothing in common with the GEMM) on fresh random inputs: C poisoned with
// NaN first, every element checked, the words past C's end checked untouched, and a second run compared bitwise with
// the first (the split-K fix-up sums in a fixed order). M runs over 1..128 with tails of every warp (16 rows) and
// warpgroup (64 rows), N and K include values that are not multiples of 128; bf16 and fp8 e4m3 inputs. The configs are
// the H200's (132 SMs) given explicitly, so the same plans run on any Hopper GPU, and this device's own heuristic.
// fp8 e4m3 values are exact in bf16: the reference multiplies bf16 copies of them.
// Run: build/tests/loom_gpu_tests --gtest_filter='GemmDecode.*'
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/device_io.hpp"
#include "common/gemm_reference.hpp"
#include "common/reference.hpp"
#include "common/test_env.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"

namespace {

using loom::DType;
using loom::GemmConfig;

constexpr int kH200Sms = 132;

using loom::test::DevMem;

// n random values in [-1, 1) rounded to `in`, uploaded to `dst` in that type, and (exactly) as bf16 to `dst_bf16`.
void upload_random(void* dst, void* dst_bf16, std::size_t n, DType in, uint64_t seed) {
    const auto f = loom::test::random_floats(n, seed);
    std::vector<uint16_t> h16(n);
    if (in == DType::F8E4M3) {
        std::vector<__nv_fp8_e4m3> h8(n);
        for (std::size_t i = 0; i < n; ++i) {
            h8[i] = __nv_fp8_e4m3(f[i]);  // nearest even, satfinite; 3 mantissa bits fit bf16's 7
            h16[i] = loom::test::float_to_bf16(static_cast<float>(h8[i]));
        }
        LOOM_CHECK_CUDA(cudaMemcpy(dst, h8.data(), n, cudaMemcpyHostToDevice));
    } else {
        for (std::size_t i = 0; i < n; ++i) h16[i] = loom::test::float_to_bf16(f[i]);
        LOOM_CHECK_CUDA(cudaMemcpy(dst, h16.data(), n * 2, cudaMemcpyHostToDevice));
    }
    LOOM_CHECK_CUDA(cudaMemcpy(dst_bf16, h16.data(), n * 2, cudaMemcpyHostToDevice));
}

std::string describe(int64_t m, int64_t n, int64_t k, DType in, const GemmConfig* cfg) {
    return fmt::format("M={} N={} K={} {} {}", m, n, k, loom::dtype_name(in),
                       cfg ? cfg->str() : "(this device's plan)");
}

// Runs C = A B^T (bf16 out) twice with `cfg` (null: loom::gemm's own choice) and checks the first result against the
// fp64 reference, the words past C, and the second result bitwise. "" or what is wrong.
std::string run_checked(int64_t m, int64_t n, int64_t k, DType in, const GemmConfig* cfg, uint64_t seed) {
    const std::size_t isz = loom::dtype_size(in);
    constexpr std::size_t kGuard = 4096;  // bf16 elements past C's end that must stay poisoned
    DevMem a(static_cast<std::size_t>(m * k) * isz), b(static_cast<std::size_t>(n * k) * isz);
    DevMem a16(static_cast<std::size_t>(m * k) * 2), b16(static_cast<std::size_t>(n * k) * 2);
    const std::size_t c_elems = static_cast<std::size_t>(m * n) + kGuard;
    DevMem c(c_elems * 2), c2(c_elems * 2);
    upload_random(a.p, a16.p, static_cast<std::size_t>(m * k), in, seed);
    upload_random(b.p, b16.p, static_cast<std::size_t>(n * k), in, seed + 1);
    LOOM_CHECK_CUDA(cudaMemset(c.p, 0xFF, c_elems * 2));  // NaN
    LOOM_CHECK_CUDA(cudaMemset(c2.p, 0xFF, c_elems * 2));
    loom::test::DeviceReference ref(m, n);
    ref.add(a16.p, b16.p, DType::BF16, false, k, 1.0, false, nullptr);
    loom::GemmOptions o;
    o.config = cfg;
    const loom::MatrixView A{a.p, in, m, k, 0}, B{b.p, in, n, k, 0};
    try {
        loom::gemm(A, B, loom::MatrixView{c.p, DType::BF16, m, n, 0}, o);
        loom::gemm(A, B, loom::MatrixView{c2.p, DType::BF16, m, n, 0}, o);
        const cudaError_t e = cudaDeviceSynchronize();
        if (e != cudaSuccess) return std::string("the launch failed: ") + cudaGetErrorString(e);
    } catch (const loom::Error& e) {
        return std::string("loom::Error: ") + e.what();
    }
    std::vector<double> r, s;
    ref.download(r, s, 0, m, nullptr);
    const std::vector<double> got = loom::test::download_matrix(c.p, DType::BF16, m, n, n);
    std::string err;
    if (in == DType::F8E4M3) {
        // The tensor cores add e4m3 products with ~14-bit sums, truncating (tests/gpu/test_gemm.cpp): per element
        // twice bf16's rounding plus 2^-10 of the products' magnitudes (~1 at K = 4096 with these inputs, against ~4
        // for a lost or doubled k-block, a 128-product sum), and a similarity below 1e-4 (test_gemm.cpp's fp8 bound).
        std::size_t bad = 0;
        for (std::size_t i = 0; i < got.size(); ++i) {
            const double tol = std::fabs(r[i]) / 256 + s[i] / 1024 + 1e-4;
            if (!(std::fabs(got[i] - r[i]) <= tol) && bad++ < 4)
                err += fmt::format(" ({}, {}): got {} expected {} (tol {:.3g});", static_cast<int64_t>(i) / n,
                                   static_cast<int64_t>(i) % n, got[i], r[i], tol);
        }
        const double diff = loom::test::calc_diff(r, got);
        if (bad > 0 || !(diff < 1e-4))
            err = fmt::format("{} of {} elements differ, similarity {:.3g}:{}", bad, got.size(), diff, err);
    } else {
        // bf16 output: twice its rounding, and the fp32 sums' error (compare_to_reference's similarity below 1e-5).
        err = loom::test::compare_to_reference(got, r, s, n, 1.0 / 256, 1.0 / 65536, 1e-4);
    }
    std::vector<uint16_t> first(c_elems), second(c_elems);
    LOOM_CHECK_CUDA(cudaMemcpy(first.data(), c.p, c_elems * 2, cudaMemcpyDeviceToHost));
    LOOM_CHECK_CUDA(cudaMemcpy(second.data(), c2.p, c_elems * 2, cudaMemcpyDeviceToHost));
    std::size_t touched = 0;
    for (std::size_t i = static_cast<std::size_t>(m * n); i < c_elems; ++i) touched += first[i] != 0xFFFF;
    if (touched) err += fmt::format(" {} elements past C written", touched);
    if (std::memcmp(first.data(), second.data(), static_cast<std::size_t>(m * n) * 2) != 0)
        err += " a second run differs bitwise";
    return err;
}

void check(int64_t m, int64_t n, int64_t k, DType in, const GemmConfig* cfg, uint64_t seed) {
    EXPECT_EQ(run_checked(m, n, k, in, cfg, seed), "") << describe(m, n, k, in, cfg);
}

// The H200's plan (132 SMs) for the shape.
GemmConfig h200_plan(int64_t m, int64_t n, int64_t k, DType in) {
    return loom::gemm_heuristic(m, n, k, false, 90, kH200Sms, true, loom::GemmTiles::Plain, in);
}

class GemmDecode : public ::testing::Test {
  protected:
    void SetUp() override {
        LOOM_REQUIRE_GPU();
        const loom::detail::GemmDevice dev = loom::detail::gemm_device();
        if (dev.arch < 90) GTEST_SKIP() << "the decode plans are the Hopper kernel's, given sm_" << dev.arch;
    }
};

// Every M's tail class: 1..17 (warp 0 alone, then warp 1), 31..33, 48, 63..65 (the second warpgroup of 128-row tiles),
// 80, 81, 100, 127, 128.
const std::vector<int64_t> kRowsBf16 = {1,  2,  3,  5,  7,  8,  9,  15, 16,  17,  31,
                                        32, 33, 48, 63, 64, 65, 80, 81, 100, 127, 128};

TEST_F(GemmDecode, Bf16AcrossM) {
    // A deep K (the split-K plans), N and K off the 128 grid, and a short K.
    struct Shape {
        int64_t n, k;
    };
    uint64_t seed = 7000;
    for (const Shape& s : {Shape{4096, 8192}, Shape{1032, 4104}, Shape{2056, 1000}})
        for (int64_t m : kRowsBf16) {
            const GemmConfig cfg = h200_plan(m, s.n, s.k, DType::BF16);
            SCOPED_TRACE(describe(m, s.n, s.k, DType::BF16, &cfg));
            check(m, s.n, s.k, DType::BF16, &cfg, seed++);
        }
    // This device's own choice (an MPS share or another SM count plans differently).
    for (int64_t m : {1, 16, 65, 128}) check(m, 4096, 8192, DType::BF16, nullptr, seed++);
}

TEST_F(GemmDecode, Fp8AcrossM) {
    struct Shape {
        int64_t n, k;
    };
    uint64_t seed = 8000;
    for (const Shape& s : {Shape{4096, 4096}, Shape{1032, 2064}})
        for (int64_t m : {1, 7, 16, 17, 33, 64, 65, 100, 128}) {
            const GemmConfig cfg = h200_plan(m, s.n, s.k, DType::F8E4M3);
            SCOPED_TRACE(describe(m, s.n, s.k, DType::F8E4M3, &cfg));
            check(m, s.n, s.k, DType::F8E4M3, &cfg, seed++);
        }
    for (int64_t m : {1, 128}) check(m, 4096, 4096, DType::F8E4M3, nullptr, seed++);
}

// The split-K fix-up hands over and sums only the warps' rows inside M: forced split plans whose M ends in every warp
// of 64- and 128-row tiles, with several splits per tile and more units than CTAs (each CTA completes several tiles).
TEST_F(GemmDecode, SplitFixupRowsAtEveryWarp) {
    uint64_t seed = 9000;
    for (int bm : {64, 128})
        for (int64_t m : {1, 16, 17, 33, 49, 64, 65, 80, 81, 97, 113, 128}) {
            if (m > bm) continue;
            for (const auto& [n, splits, grid] : {std::tuple<int64_t, int, int>{1032, 4, 132}, {4096, 3, 40}}) {
                GemmConfig cfg;
                cfg.block_m = bm;
                cfg.block_n = 128;
                cfg.cluster_m = 1;
                loom::detail::gemm_complete_config(cfg, m, n, kH200Sms);
                cfg.grid = grid;
                cfg.tail_splits = splits;
                // Every tile is split at this grid (fewer tiles than CTAs) or the full waves run whole first.
                const auto plan = loom::gemm_tail_plan(m, n, 4104, cfg, grid, splits);
                ASSERT_EQ(plan.splits, splits) << cfg.str();
                SCOPED_TRACE(describe(m, n, 4104, DType::BF16, &cfg));
                check(m, n, 4104, DType::BF16, &cfg, seed++);
            }
        }
}

// K-clusters (GemmConfig::cluster_k): the ranks of a cluster sum their partials of the warps' rows inside M and each
// stores its share of the columns; M ends in every warp of 64- and 128-row tiles, N off the tile grid, K of 65
// k-blocks (split unevenly over 2, 4 and 8 ranks), bf16 and fp8; a second run bitwise the same.
TEST_F(GemmDecode, ClusterKRowsAtEveryWarp) {
    uint64_t seed = 9500;
    for (int bm : {64, 128})
        for (int s : {2, 4, 8})
            for (int64_t m : {1, 16, 17, 33, 49, 64, 65, 100, 128}) {
                if (m > bm) continue;
                for (int64_t n : {1032, 4096}) {
                    GemmConfig cfg;
                    cfg.block_m = bm;
                    cfg.block_n = 64;
                    cfg.stages = loom::kernels::gemm_sm90_plan_stages(bm, 64);
                    cfg.cluster_k = s;
                    cfg.tma_store = false;
                    loom::detail::gemm_complete_config(cfg, m, n, kH200Sms);
                    SCOPED_TRACE(describe(m, n, 4160, DType::BF16, &cfg));
                    check(m, n, 4160, DType::BF16, &cfg, seed++);
                }
            }
    for (int64_t m : {1, 17, 128}) {
        GemmConfig cfg;
        cfg.block_m = 128;
        cfg.block_n = 128;
        cfg.block_k = 128;
        cfg.stages = loom::kernels::gemm_sm90_plan_stages(128, 128);
        cfg.cluster_k = 4;
        cfg.tma_store = false;
        loom::detail::gemm_complete_config(cfg, m, 1032, kH200Sms);
        SCOPED_TRACE(describe(m, 1032, 4224, DType::F8E4M3, &cfg));
        check(m, 1032, 4224, DType::F8E4M3, &cfg, seed++);
    }
}

// The H200's decode plans split K where N leaves too few tiles to fill the SMs (the shapes above run split plans).
TEST_F(GemmDecode, DeepKPlansSplit) {
    for (int64_t m : {1, 16, 64})
        for (DType in : {DType::BF16, DType::F8E4M3})
            EXPECT_GE(h200_plan(m, 4096, in == DType::BF16 ? 8192 : 4096, in).tail_splits, 2)
                << m << " " << loom::dtype_name(in);
}

}  // namespace
