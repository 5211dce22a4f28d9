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
// The same values rounded to fp8 e4m3 (cuda_fp8.h's conversion, nearest even): one byte each.
void fill_random_e4m3(void* p, std::size_t n, std::uint64_t seed);

// Row-major C[m, n] = A[m, k] B[n, k]^T through cuBLASLt (column-major C^T = B A^T), bf16 (or fp8 e4m3: `in`
// CUDA_R_8F_E4M3) in, bf16 out, fp32 compute, the heuristic's best algorithm with a 64 MiB workspace. fast_accum
// (fp8 only): CUBLASLT_MATMUL_DESC_FAST_ACCUM, the products summed in the tensor cores' own precision, as Loom's
// fp8 kernel does; off, cuBLASLt promotes partial sums to fp32 on the CUDA cores.
struct LtGemm {
    cublasLtHandle_t h{};
    cublasLtMatmulDesc_t op{};
    cublasLtMatrixLayout_t la{}, lb{}, lc{};
    cublasLtMatmulAlgo_t algo{};
    void* ws = nullptr;
    size_t ws_bytes = 64 << 20;
    // Raises loom::Error when cuBLASLt finds no algorithm.
    LtGemm(int64_t m, int64_t n, int64_t k, cudaDataType_t in = CUDA_R_16BF, bool fast_accum = false);
    LtGemm(const LtGemm&) = delete;
    LtGemm& operator=(const LtGemm&) = delete;
    ~LtGemm();
    void run(const void* a, const void* b, void* c, cudaStream_t s);
    // The chosen algorithm's configuration (cuBLASLt's enum ids: tile, stages, cluster shape, split-K, ...).
    std::string describe() const;
};

}  // namespace loom::bench
