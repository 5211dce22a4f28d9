// The getting-started program (docs/getting-started.md), built against the installed package: AllGather+GEMM on
// every rank, checked against a host reference. Every rank holds `rows` rows of A and its own weight B (N_loc x K);
// loom::ag_gemm computes C = all_gather(A) * B^T while A's rows travel. Run it under loomrun:
//   loomrun -n 2 ./loom_consumer
// Without a GPU it says so and exits 0: building it has then shown that the package compiles and links.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <loom/loom.hpp>
#include <vector>

namespace {

// Inputs in [-1, 1) from a seed, so that every rank can rebuild every other rank's rows for the reference.
std::vector<std::uint16_t> random_bf16(std::size_t n, std::uint64_t seed) {
    std::vector<std::uint16_t> v(n);
    std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (auto& e : v) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        e = loom::float_to_bf16(static_cast<float>((x >> 40) & 0xffffff) / 16777216.f * 2.f - 1.f);
    }
    return v;
}

}  // namespace

int main() try {
    int devices = 0;
    if (cudaError_t err = cudaGetDeviceCount(&devices); err != cudaSuccess || devices == 0) {
        const loom::RankInfo& me = loom::settings().rank;
        std::printf("loom consumer: no GPU (%s); rank %d of %d (%s): built and linked against the package\n",
                    err != cudaSuccess ? cudaGetErrorString(err) : "no device", me.rank, me.world_size,
                    me.source.c_str());
        return 0;
    }

    loom::World world = loom::World::from_env();
    int major = 0;
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, world.device()));
    if (major < 9) {
        std::printf("loom consumer: GPU %d is sm_%d0; loom::ag_gemm needs sm_90: nothing to run\n", world.device(),
                    major);
        return 0;
    }
    const int rank = world.rank(), ranks = world.world_size();
    const int64_t rows = 256, n_loc = 256, k = 512, m = rows * ranks;

    // This rank's rows of A, its B, and C; A, B and C may be any device memory (the op keeps its own buffers).
    const std::vector<std::uint16_t> host_a = random_bf16(rows * k, 1 + rank),
                                     host_b = random_bf16(n_loc * k, 100 + rank);
    void *a = nullptr, *b = nullptr, *c = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(&a, host_a.size() * 2));
    LOOM_CHECK_CUDA(cudaMalloc(&b, host_b.size() * 2));
    LOOM_CHECK_CUDA(cudaMalloc(&c, m * n_loc * 2));
    LOOM_CHECK_CUDA(cudaMemcpy(a, host_a.data(), host_a.size() * 2, cudaMemcpyHostToDevice));
    LOOM_CHECK_CUDA(cudaMemcpy(b, host_b.data(), host_b.size() * 2, cudaMemcpyHostToDevice));
    cudaStream_t stream;
    LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    // Collective: every rank makes the same call. Enqueued on `stream`; the host does not wait.
    loom::ag_gemm(world, {a, loom::DType::BF16, rows, k}, {b, loom::DType::BF16, n_loc, k},
                  {c, loom::DType::BF16, m, n_loc}, stream);
    std::vector<std::uint16_t> host_c(m * n_loc);
    LOOM_CHECK_CUDA(cudaMemcpyAsync(host_c.data(), c, host_c.size() * 2, cudaMemcpyDeviceToHost, stream));
    LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));

    // Reference: rank r's rows of A, rebuilt from its seed, times this rank's B, in double precision.
    double worst = 0;
    int64_t bad = 0;
    for (int r = 0; r < ranks; ++r) {
        const std::vector<std::uint16_t> shard = r == rank ? host_a : random_bf16(rows * k, 1 + r);
        for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < n_loc; ++j) {
                double ref = 0;
                for (int64_t p = 0; p < k; ++p)
                    ref += double(loom::bf16_to_float(shard[i * k + p])) * loom::bf16_to_float(host_b[j * k + p]);
                const double got = loom::bf16_to_float(host_c[(r * rows + i) * n_loc + j]);
                const double err = std::fabs(got - ref);
                worst = std::fmax(worst, err);
                if (!(err <= std::fabs(ref) / 128 + 0.02)) ++bad;  // bf16 output: 8 significant bits
            }
    }
    std::printf("loom consumer: rank %d of %d: ag_gemm M=%lld N_loc=%lld K=%lld: max |error| %.4f: %s\n", rank, ranks,
                static_cast<long long>(m), static_cast<long long>(n_loc), static_cast<long long>(k), worst,
                bad ? "FAILED" : "OK");
    LOOM_CHECK_CUDA(cudaStreamDestroy(stream));
    LOOM_CHECK_CUDA(cudaFree(a));
    LOOM_CHECK_CUDA(cudaFree(b));
    LOOM_CHECK_CUDA(cudaFree(c));
    return bad ? 1 : 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "loom consumer: %s\n", e.what());
    return 1;
}
