// cuBLASLt baseline shared by the GEMM and overlapped-GEMM benchmarks, and their bf16 random fill.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace loom::bench {

// Fresh bf16 values in [-1, 1) (xorshift from `seed`, round to nearest even), copied to the device buffer p.
void fill_random_bf16(void* p, std::size_t n, std::uint64_t seed);

// Row-major C[m, n] = A[m, k] B[n, k]^T through cuBLASLt (column-major C^T = B A^T), bf16 in/out, fp32 compute,
// the heuristic's best algorithm with a 64 MiB workspace.
struct LtGemm {
    cublasLtHandle_t h{};
    cublasLtMatmulDesc_t op{};
    cublasLtMatrixLayout_t la{}, lb{}, lc{};
    cublasLtMatmulAlgo_t algo{};
    void* ws = nullptr;
    size_t ws_bytes = 64 << 20;
    LtGemm(int64_t m, int64_t n, int64_t k);  // raises loom::Error when cuBLASLt finds no algorithm
    LtGemm(const LtGemm&) = delete;
    LtGemm& operator=(const LtGemm&) = delete;
    ~LtGemm();
    void run(const void* a, const void* b, void* c, cudaStream_t s);
    // The chosen algorithm's configuration (cuBLASLt's enum ids: tile, stages, cluster shape, split-K, ...).
    std::string describe() const;
};

}  // namespace loom::bench
