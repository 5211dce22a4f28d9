// Probe: is a skinny GEMM wrong, or its reference? One bf16 product C[M, N] = A[M, K] B[N, K]^T computed four ways
// and each compared element by element with a host fp64 product of the same bf16 inputs:
//   loom       loom::gemm with the heuristic's config for this process's SM count (an MPS share sees fewer SMs)
//   lt         cuBLASLt, fp32 compute, its heuristic's algorithm
//   gemmex     cublasGemmEx, fp32 compute, default math mode (reduced-precision split-K reductions allowed; what
//              PyTorch's default allow_bf16_reduced_precision_reduction = True gives)
//   gemmex-fp32  cublasGemmEx with CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION
// An element is wrong when |x - ref| > 2^-7 |ref| + 2^-7 (two bf16 ulps of the output and fp32 accumulation slack).
//   build/bench/probe-gemm-reference-check [M N K]                    one process, the whole GPU
//   build/bin/loomrun -n 4 build/bench/probe-gemm-reference-check     four 25 % shares: each rank prints its line
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cublaslt.hpp"
#include "loom/bf16.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"

namespace {

std::vector<uint16_t> download(const void* p, std::size_t n) {
    std::vector<uint16_t> h(n);
    LOOM_CHECK_CUDA(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost));
    return h;
}

struct Tally {
    std::size_t wrong = 0, unwritten = 0;  // unwritten: still the NaN poison
    double max_err = 0;
    std::size_t first_col = SIZE_MAX, last_col = 0;  // the columns of the wrong elements
};

Tally compare(const std::vector<uint16_t>& c, const std::vector<double>& ref, std::size_t n) {
    Tally t;
    for (std::size_t i = 0; i < ref.size(); ++i) {
        const double x = loom::bf16_to_float(c[i]);
        const double err = std::fabs(x - ref[i]);
        t.max_err = std::max(t.max_err, std::isfinite(x) ? err : INFINITY);
        if (err <= std::ldexp(std::fabs(ref[i]), -7) + std::ldexp(1.0, -7)) continue;
        ++t.wrong;
        t.unwritten += std::isnan(x);
        t.first_col = std::min(t.first_col, i % n);
        t.last_col = std::max(t.last_col, i % n);
    }
    return t;
}

void gemm_ex(cublasHandle_t h, const void* a, const void* b, void* c, int m, int n, int k) {
    const float alpha = 1.f, beta = 0.f;  // column-major C^T[n, m] = B[n, k] A^T
    const cublasStatus_t s =
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, b, CUDA_R_16BF, k, a, CUDA_R_16BF, k, &beta, c,
                     CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    LOOM_CHECK(s == CUBLAS_STATUS_SUCCESS, "cublasGemmEx failed: status {}", int(s));
}

}  // namespace

int main(int argc, char** argv) {
    const int m = argc > 3 ? std::atoi(argv[1]) : 17, n = argc > 3 ? std::atoi(argv[2]) : 4096;
    const int k = argc > 3 ? std::atoi(argv[3]) : 2048;
    const char* rank = std::getenv("LOOM_RANK");
    int dev = 0, sms = 0;
    LOOM_CHECK_CUDA(cudaGetDevice(&dev));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const std::size_t na = std::size_t(m) * k, nb = std::size_t(n) * k, nc = std::size_t(m) * n;
    void *a, *b, *c;
    LOOM_CHECK_CUDA(cudaMalloc(&a, na * 2));
    LOOM_CHECK_CUDA(cudaMalloc(&b, nb * 2));
    LOOM_CHECK_CUDA(cudaMalloc(&c, nc * 2));
    loom::bench::fill_random_bf16(a, na, 1 + m);
    loom::bench::fill_random_bf16(b, nb, 2 + n);
    const std::vector<uint16_t> ha = download(a, na), hb = download(b, nb);
    std::vector<double> ref(nc);
    for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
            double s = 0;
            for (int l = 0; l < k; ++l)
                s += double(loom::bf16_to_float(ha[std::size_t(i) * k + l])) *
                     loom::bf16_to_float(hb[std::size_t(j) * k + l]);
            ref[std::size_t(i) * n + j] = s;
        }
    auto run = [&](const std::string& name, auto&& fn) {
        LOOM_CHECK_CUDA(cudaMemset(c, 0xff, nc * 2));  // NaN: an element never written is wrong
        fn();
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
        const Tally t = compare(download(c, nc), ref, n);
        std::printf("rank %s sms %d %dx%dx%d %-12s wrong %zu of %zu (%zu unwritten", rank ? rank : "-", sms, m, n, k,
                    name.c_str(), t.wrong, nc, t.unwritten);
        if (t.wrong) std::printf(", columns %zu..%zu", t.first_col, t.last_col);
        std::printf(")  max |err| %.4g\n", t.max_err);
    };
    const loom::GemmConfig cfg = loom::gemm_heuristic(m, n, k, false, 90, sms);
    const loom::MatrixView va{a, loom::DType::BF16, m, k, k}, vb{b, loom::DType::BF16, n, k, k};
    const loom::MatrixView vc{c, loom::DType::BF16, m, n, n};
    run("loom " + cfg.str(), [&] {
        loom::GemmOptions o;
        o.config = &cfg;
        loom::gemm(va, vb, vc, o);
    });
    loom::bench::LtGemm lt(m, n, k);
    run("lt", [&] { lt.run(a, b, c, nullptr); });
    cublasHandle_t h;
    LOOM_CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS, "cublasCreate failed");
    run("gemmex", [&] { gemm_ex(h, a, b, c, m, n, k); });
    cublasSetMathMode(h, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
    run("gemmex-fp32", [&] { gemm_ex(h, a, b, c, m, n, k); });
    cublasDestroy(h);
    return 0;
}
