#include "common/gemm_reference.hpp"

#include <cmath>
#include <cstring>

#include "common/reference.hpp"
#include "common/test_kernels.hpp"
#include "loom/runtime/error.hpp"

namespace loom::test {

DeviceReference::DeviceReference(int64_t rows, int64_t cols) : m(rows), n(cols) {
    const std::size_t bytes = static_cast<std::size_t>(rows * cols) * sizeof(double);
    LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&ref), bytes));
    LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&abs), bytes));
}

DeviceReference::~DeviceReference() {
    cudaFree(ref);
    cudaFree(abs);
}

void DeviceReference::add(const void* a, const void* b, DType in, bool b_kn, int64_t k, double alpha, bool accumulate,
                          cudaStream_t stream) {
    LOOM_CHECK(in == DType::BF16 || in == DType::F16, "DeviceReference: expected bf16 or f16 inputs, given {}",
               dtype_name(in));
    const jit::Kernel& kernel = test_kernel("tests/common/kernels/gemm_reference.cuh", "loom_test::gemm_reference",
                                            {dtype_cuda_name(in), b_kn ? "true" : "false"});
    jit::LaunchConfig lc;
    lc.block = dim3(32, 8);
    lc.grid = dim3(static_cast<unsigned>((n + 31) / 32), static_cast<unsigned>((m + 7) / 8));
    lc.stream = stream;
    const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k), acc = accumulate ? 1 : 0;
    kernel(lc, a, b, ref, abs, mi, ni, ki, alpha, acc);
}

void DeviceReference::download(std::vector<double>& ref_out, std::vector<double>& abs_out, int64_t row0, int64_t rows,
                               cudaStream_t stream) const {
    LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
    const std::size_t count = static_cast<std::size_t>(rows * n), off = static_cast<std::size_t>(row0 * n);
    ref_out.resize(count);
    abs_out.resize(count);
    LOOM_CHECK_CUDA(cudaMemcpy(ref_out.data(), ref + off, count * sizeof(double), cudaMemcpyDeviceToHost));
    LOOM_CHECK_CUDA(cudaMemcpy(abs_out.data(), abs + off, count * sizeof(double), cudaMemcpyDeviceToHost));
}

std::vector<double> download_matrix(const void* c, DType dt, int64_t rows, int64_t n, int64_t ld) {
    const std::size_t es = dtype_size(dt);
    std::vector<unsigned char> h(static_cast<std::size_t>(rows * n) * es);
    LOOM_CHECK_CUDA(cudaMemcpy2D(h.data(), n * es, c, ld * es, n * es, rows, cudaMemcpyDeviceToHost));
    std::vector<double> out(static_cast<std::size_t>(rows * n));
    for (std::size_t i = 0; i < out.size(); ++i) {
        if (dt == DType::F32) {
            float f;
            std::memcpy(&f, &h[i * 4], 4);
            out[i] = f;
        } else {
            uint16_t bits;
            std::memcpy(&bits, &h[i * 2], 2);
            out[i] = dt == DType::BF16 ? bf16_to_float(bits) : half_to_float(bits);
        }
    }
    return out;
}

std::string compare_to_reference(const std::vector<double>& got, const std::vector<double>& ref,
                                 const std::vector<double>& abs, int64_t n, double rel, double slack, double floor) {
    std::size_t bad = 0;
    std::string first;
    for (std::size_t i = 0; i < ref.size(); ++i) {
        const double tol = std::fabs(ref[i]) * rel + abs[i] * slack + floor;
        if (std::fabs(got[i] - ref[i]) <= tol) continue;  // NaN (the poison) fails here
        if (bad++ < 4)
            first += fmt::format(" ({}, {}): got {} expected {} (tol {:.3g});", static_cast<int64_t>(i) / n,
                                 static_cast<int64_t>(i) % n, got[i], ref[i], tol);
    }
    const double diff = calc_diff(ref, got);
    if (bad == 0 && diff < 1e-5) return "";
    return fmt::format("{} of {} elements differ, similarity {:.3g}:{}", bad, ref.size(), diff, first);
}

}  // namespace loom::test
