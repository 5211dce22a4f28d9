// Example 05: AllGather+GEMM, the first layer of a tensor-parallel MLP. Every rank holds rows
// [r * M/W, (r + 1) * M/W) of the activations A and its own column block of the weight B; loom::ag_gemm
// gathers A while the GEMM already consumes the rows that have arrived (own rows first).
// Verification: the op also returns the gathered A (a symmetric buffer), which must equal every rank's shard
// bitwise, and C must match loom::gemm on that gathered A (same kernel family, so tolerance-tight).
//   loomrun -n 4 build/examples/05_overlapping_allgather_gemm [rows_per_rank N_loc K] [ce|sm]
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/example_data.hpp"
#include "loom/bf16.hpp"
#include "loom/ops/gemm.hpp"
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
    const int64_t rows = argc > 3 ? std::atoll(argv[1]) : 1000;  // not a multiple of the 128-row tile
    const int64_t n = argc > 3 ? std::atoll(argv[2]) : 1024;
    const int64_t k = argc > 3 ? std::atoll(argv[3]) : 2048;
    const bool sm = argc > 4 && std::string(argv[4]) == "sm";
    auto world = loom::World::from_env();
    const int me = world.rank(), W = world.world_size();
    const int64_t m = rows * W;
    try {
        void *a, *b, *c, *c_ref;
        LOOM_CHECK_CUDA(cudaMalloc(&a, rows * k * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&b, n * k * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&c, m * n * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&c_ref, m * n * 2));
        auto* gathered = world.alloc<uint16_t>(m * k);
        const auto ha = random_bf16(rows * k, 1 + me), hb = random_bf16(n * k, 100 + me);
        LOOM_CHECK_CUDA(cudaMemcpy(a, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
        LOOM_CHECK_CUDA(cudaMemcpy(b, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
        LOOM_CHECK_CUDA(cudaMemset(c, 0xFF, m * n * 2));  // NaN: unwritten elements fail
        cudaStream_t s;
        LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        // The uploads above ran on the legacy default stream, which a non-blocking stream does not wait for.
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
        world.barrier();

        loom::AgGemmOptions o;
        o.producer = sm ? loom::AgProducer::Sm : loom::AgProducer::CopyEngine;
        o.gathered = loom::MatrixView{gathered, loom::DType::BF16, m, k, 0};
        loom::ag_gemm(world, {a, loom::DType::BF16, rows, k, 0}, {b, loom::DType::BF16, n, k, 0},
                      {c, loom::DType::BF16, m, n, 0}, s, o);
        loom::gemm({gathered, loom::DType::BF16, m, k, 0}, {b, loom::DType::BF16, n, k, 0},
                   {c_ref, loom::DType::BF16, m, n, 0}, {}, s);
        LOOM_CHECK_CUDA(cudaStreamSynchronize(s));

        bool ok = true;
        std::vector<uint16_t> g(m * k), got(m * n), ref(m * n);
        LOOM_CHECK_CUDA(cudaMemcpy(g.data(), gathered, g.size() * 2, cudaMemcpyDeviceToHost));
        for (int r = 0; r < W; ++r)
            if (std::memcmp(g.data() + r * rows * k, random_bf16(rows * k, 1 + r).data(), rows * k * 2) != 0) {
                std::printf("rank %d: gathered rows of rank %d differ\n", me, r);
                ok = false;
            }
        LOOM_CHECK_CUDA(cudaMemcpy(got.data(), c, got.size() * 2, cudaMemcpyDeviceToHost));
        LOOM_CHECK_CUDA(cudaMemcpy(ref.data(), c_ref, ref.size() * 2, cudaMemcpyDeviceToHost));
        int64_t bad = 0;
        for (int64_t i = 0; i < m * n; ++i) {
            const float x = loom::bf16_to_float(got[i]), y = loom::bf16_to_float(ref[i]);
            if (!(std::fabs(x - y) <= std::fabs(y) / 64.f + 1e-2f)) ++bad;
        }
        if (bad)
            std::printf("rank %d: %lld of %lld elements differ from loom::gemm on the gathered A\n", me,
                        static_cast<long long>(bad), static_cast<long long>(m * n));
        ok = ok && bad == 0;
        std::printf("rank %d: ag_gemm M=%lld N_loc=%lld K=%lld (%s producer): %s\n", me, static_cast<long long>(m),
                    static_cast<long long>(n), static_cast<long long>(k), sm ? "SM" : "copy-engine",
                    ok ? "OK" : "FAILED");
        world.barrier();
        loom::release_overlap_state(world);
        world.free(gathered);
        return ok ? 0 : 1;
    } catch (const std::exception& e) {
        std::printf("rank %d: error: %s\n", me, e.what());
        return 1;
    }
}
