// The GEMM tests' device reference and element check: a naive fp64 GEMM on the GPU (kernels/gemm_reference.cuh,
// nothing in common with the kernels under test) and a comparison of every output element with it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "loom/tensor.hpp"

namespace loom::test {

// fp64 reference and sum of |products| of one GEMM's [m, n] output, in device memory.
struct DeviceReference {
    double* ref = nullptr;
    double* abs = nullptr;
    int64_t m = 0, n = 0;
    DeviceReference(int64_t rows, int64_t cols);
    ~DeviceReference();
    DeviceReference(const DeviceReference&) = delete;
    DeviceReference& operator=(const DeviceReference&) = delete;
    // (+)= alpha x A B^T (B as [N, K], or [K, N] with b_kn) of bf16 / f16 inputs a [m, k] and b, on `stream`.
    void add(const void* a, const void* b, DType in, bool b_kn, int64_t k, double alpha, bool accumulate,
             cudaStream_t stream);
    // Rows [row0, row0 + rows) of ref and abs, on the host (synchronises `stream`).
    void download(std::vector<double>& ref_out, std::vector<double>& abs_out, int64_t row0, int64_t rows,
                  cudaStream_t stream) const;
};

// [rows, n] elements of `dt` (bf16, f16 or f32; row stride ld elements) as doubles.
std::vector<double> download_matrix(const void* c, DType dt, int64_t rows, int64_t n, int64_t ld);

// Every element of got within |ref| x rel + abs x slack + floor, and DeepGEMM's similarity below 1e-5 (~1e-7 for
// right bf16 outputs, ~1e-2 for a wrong tile). "" or: how many elements differ, the first few, where, by how much.
std::string compare_to_reference(const std::vector<double>& got, const std::vector<double>& ref,
                                 const std::vector<double>& abs, int64_t n, double rel, double slack, double floor);

}  // namespace loom::test
