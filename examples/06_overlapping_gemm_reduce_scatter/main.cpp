// Example 06: GEMM+ReduceScatter, the second layer of a tensor-parallel MLP. Every rank holds a K-slice of the
// activations A [M, K_loc] and of the weight B [N, K_loc]; loom::gemm_rs computes the partial product and, while
// the GEMM is still running, pushes each finished tile to the rank that owns its rows, which sums the W
// contributions in fp32 in rank order. Verification: rank r's rows against an fp64 CPU reference of
// sum over ranks of A_q B_q^T (every rank regenerates its peers' inputs from their seeds), every element.
//   loomrun -n 4 build/examples/06_overlapping_gemm_reduce_scatter [M N K_loc]
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/example_data.hpp"
#include "loom/bf16.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/world.hpp"

namespace {

using loom_example::random_bf16;
}  // namespace

int main(int argc, char** argv) {
    if (!loom::driver::available()) {
        std::printf("no GPU: %s\n", loom::driver::unavailable_reason().c_str());
        return 1;
    }
    auto world = loom::World::from_env();
    const int me = world.rank(), W = world.world_size();
    const int64_t m = argc > 3 ? std::atoll(argv[1]) : 200 * W;  // M / W = 200: not a multiple of the tile
    const int64_t n = argc > 3 ? std::atoll(argv[2]) : 512;
    const int64_t k = argc > 3 ? std::atoll(argv[3]) : 512;
    const int64_t rows = m / W;
    try {
        void *a, *b, *c;
        LOOM_CHECK_CUDA(cudaMalloc(&a, m * k * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&b, n * k * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&c, rows * n * 2));
        const auto ha = random_bf16(m * k, 1 + me), hb = random_bf16(n * k, 100 + me);
        LOOM_CHECK_CUDA(cudaMemcpy(a, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
        LOOM_CHECK_CUDA(cudaMemcpy(b, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
        LOOM_CHECK_CUDA(cudaMemset(c, 0xFF, rows * n * 2));
        cudaStream_t s;
        LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        // The uploads above ran on the legacy default stream, which a non-blocking stream does not wait for.
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
        world.barrier();
        loom::gemm_rs(world, {a, loom::DType::BF16, m, k, 0}, {b, loom::DType::BF16, n, k, 0},
                      {c, loom::DType::BF16, rows, n, 0}, s);
        LOOM_CHECK_CUDA(cudaStreamSynchronize(s));

        std::vector<double> ref(rows * n, 0.0), mag(rows * n, 0.0);
        for (int q = 0; q < W; ++q) {
            const auto qa = random_bf16(m * k, 1 + q), qb = random_bf16(n * k, 100 + q);
            for (int64_t i = 0; i < rows; ++i)
                for (int64_t j = 0; j < n; ++j) {
                    double acc = 0, am = 0;
                    for (int64_t x = 0; x < k; ++x) {
                        const double p =
                            loom::bf16_to_float(qa[(me * rows + i) * k + x]) * loom::bf16_to_float(qb[j * k + x]);
                        acc += p;
                        am += std::fabs(p);
                    }
                    ref[i * n + j] += acc;
                    mag[i * n + j] += am;
                }
        }
        std::vector<uint16_t> got(rows * n);
        LOOM_CHECK_CUDA(cudaMemcpy(got.data(), c, got.size() * 2, cudaMemcpyDeviceToHost));
        int64_t bad = 0;
        for (int64_t i = 0; i < rows * n; ++i)
            if (!(std::fabs(loom::bf16_to_float(got[i]) - ref[i]) <= std::fabs(ref[i]) / 128 + mag[i] / 256 + 1e-3))
                ++bad;
        std::printf("rank %d: gemm_rs M=%lld N=%lld K_loc=%lld: %s (%lld bad elements)\n", me,
                    static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                    bad ? "FAILED" : "OK", static_cast<long long>(bad));
        world.barrier();
        loom::release_overlap_state(world);
        return bad ? 1 : 0;
    } catch (const std::exception& e) {
        std::printf("rank %d: error: %s\n", me, e.what());
        return 1;
    }
}
