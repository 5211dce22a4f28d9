// loom::gemm vs cuBLASLt (bf16 in, bf16 out, fp32 accumulate, same inputs, best heuristic algorithm), run back to
// back: 8192^3, 4096^3 and the per-rank TP=8 MLP GEMMs at M = 8192 (AllGather+GEMM and GEMM+ReduceScatter).
//
//   bench-gemm [--out docs/perf/gemm.json] [--quick]
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "harness.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/runtime/error.hpp"

namespace {

#define CHECK_LT(x)                                                                      \
    do {                                                                                 \
        cublasStatus_t s_ = (x);                                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS) LOOM_FAIL("{} failed: status {}", #x, int(s_)); \
    } while (0)

__attribute__((unused)) void fill_random(void* p, size_t n, uint64_t seed) {
    std::vector<uint16_t> h(n);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (auto& v : h) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const float f = static_cast<float>((x >> 40) & 0xffffff) / 16777216.f * 2.f - 1.f;
        uint32_t u;
        std::memcpy(&u, &f, 4);
        v = static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    }
    LOOM_CHECK_CUDA(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice));
}

// Row-major C[m, n] = A[m, k] B[n, k]^T is column-major C^T[n, m] = (B as k x n col-major)^T * (A as k x m).
struct LtGemm {
    cublasLtHandle_t h{};
    cublasLtMatmulDesc_t op{};
    cublasLtMatrixLayout_t la{}, lb{}, lc{};
    cublasLtMatmulAlgo_t algo{};
    void* ws = nullptr;
    size_t ws_bytes = 64 << 20;
    LtGemm(int m, int n, int k) {
        CHECK_LT(cublasLtCreate(&h));
        LOOM_CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
        CHECK_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, n, k));
        CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, m, k));
        CHECK_LT(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, m, n));
        cublasLtMatmulPreference_t pref;
        CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
        CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                      sizeof ws_bytes));
        cublasLtMatmulHeuristicResult_t res{};
        int count = 0;
        CHECK_LT(cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &res, &count));
        LOOM_CHECK(count > 0, "cuBLASLt found no algorithm for {} x {} x {}", m, n, k);
        algo = res.algo;
        cublasLtMatmulPreferenceDestroy(pref);
    }
    void run(const void* a, const void* b, void* c, cudaStream_t s) {
        const float alpha = 1.f, beta = 0.f;
        CHECK_LT(cublasLtMatmul(h, op, &alpha, b, la, a, lb, &beta, c, lc, c, lc, &algo, ws, ws_bytes, s));
    }
    ~LtGemm() {
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(lc);
        cublasLtMatmulDescDestroy(op);
        cublasLtDestroy(h);
        cudaFree(ws);
    }
};

struct Shape {
    const char* kind;
    int m, n, k;
};

}  // namespace

int main(int argc, char** argv) {
    std::string out;
    bool quick = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--out" && i + 1 < argc) out = argv[++i];
        if (a == "--quick") quick = true;
    }
    std::vector<Shape> shapes = {{"square", 8192, 8192, 8192}, {"square", 4096, 4096, 4096}};
    for (auto [n, k] :
         std::vector<std::pair<int, int>>{{11008, 4096}, {14336, 4096}, {28672, 8192}, {53248, 16384}, {29568, 8192}})
        shapes.push_back({"ag_gemm", 8192, n / 8, k});
    for (auto [n, k] : std::vector<std::pair<int, int>>{
             {4096, 11008}, {4096, 14336}, {3584, 14336}, {4608, 36864}, {8192, 28672}, {8192, 29568}})
        shapes.push_back({"gemm_rs", 8192, n, k / 8});
    if (quick) shapes.resize(2);

    loom::bench::Report report("gemm", 1, argc, argv);
    cudaStream_t stream;
    LOOM_CHECK_CUDA(cudaStreamCreate(&stream));
    int dev = 0, sms = 0, major = 0, minor = 0;
    LOOM_CHECK_CUDA(cudaGetDevice(&dev));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    double log_sum = 0;
    double worst = 1e9;
    for (const Shape& s : shapes) {
        void *a, *b, *c, *c_ref;
        LOOM_CHECK_CUDA(cudaMalloc(&a, size_t(s.m) * s.k * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&b, size_t(s.n) * s.k * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&c, size_t(s.m) * s.n * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&c_ref, size_t(s.m) * s.n * 2));
        fill_random(a, size_t(s.m) * s.k, 1);
        fill_random(b, size_t(s.n) * s.k, 2);
        loom::MatrixView A{a, loom::DType::BF16, s.m, s.k, 0}, B{b, loom::DType::BF16, s.n, s.k, 0};
        loom::MatrixView C{c, loom::DType::BF16, s.m, s.n, 0};
        const auto cfg = loom::gemm_heuristic(s.m, s.n, s.k, false, major * 10 + minor, sms);
        LtGemm lt(s.m, s.n, s.k);
        loom::gemm(A, B, C, {}, stream);  // compile outside the timing
        const auto t_loom = loom::bench::time_op([&](cudaStream_t st) { loom::gemm(A, B, C, {}, st); }, stream);
        const auto t_lt = loom::bench::time_op([&](cudaStream_t st) { lt.run(a, b, c_ref, st); }, stream);
        const double flops = 2.0 * s.m * s.n * s.k;
        const double ratio = t_lt.median_us / t_loom.median_us;
        log_sum += std::log(ratio);
        worst = std::min(worst, ratio);
        report.add_row({{"kind", s.kind},
                        {"m", s.m},
                        {"n", s.n},
                        {"k", s.k},
                        {"config", cfg.str()},
                        {"loom_us", t_loom.median_us},
                        {"loom_tflops", flops / t_loom.median_us / 1e6},
                        {"cublaslt_tflops", flops / t_lt.median_us / 1e6},
                        {"baselines", {{"cublaslt", t_lt.median_us}}}});
        cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(c_ref);
    }
    std::printf("geomean ratio to cuBLASLt: %.3f, worst %.3f\n", std::exp(log_sum / shapes.size()), worst);
    if (!out.empty())
        report.write(out);
    else
        report.write("/dev/stdout");
    return 0;
}
