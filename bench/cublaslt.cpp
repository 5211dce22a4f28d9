#include "cublaslt.hpp"

#include <cuda_fp8.h>
#include <fmt/format.h>

#include <string>
#include <vector>

#include "loom/bf16.hpp"
#include "loom/runtime/error.hpp"

#define CHECK_LT(x)                                                                      \
    do {                                                                                 \
        cublasStatus_t s_ = (x);                                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS) LOOM_FAIL("{} failed: status {}", #x, int(s_)); \
    } while (0)

namespace loom::bench {

namespace {
// Uniform in [-1, 1), xorshift from `seed`.
std::vector<float> random_unit(std::size_t n, std::uint64_t seed) {
    std::vector<float> h(n);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (auto& v : h) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        v = static_cast<float>((x >> 40) & 0xffffff) / 16777216.f * 2.f - 1.f;
    }
    return h;
}
}  // namespace

void fill_random_bf16(void* p, std::size_t n, std::uint64_t seed) {
    const std::vector<float> f = random_unit(n, seed);
    std::vector<uint16_t> h(n);
    for (std::size_t i = 0; i < n; ++i) h[i] = loom::float_to_bf16(f[i]);
    LOOM_CHECK_CUDA(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice));
}

void fill_random_e4m3(void* p, std::size_t n, std::uint64_t seed) {
    const std::vector<float> f = random_unit(n, seed);
    std::vector<__nv_fp8_e4m3> h(n);
    for (std::size_t i = 0; i < n; ++i) h[i] = __nv_fp8_e4m3(f[i]);
    LOOM_CHECK_CUDA(cudaMemcpy(p, h.data(), n, cudaMemcpyHostToDevice));
}

LtGemm::LtGemm(int64_t m, int64_t n, int64_t k, cudaDataType_t in, bool fast_accum) {
    CHECK_LT(cublasLtCreate(&h));
    LOOM_CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
    CHECK_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (fast_accum) {
        const int8_t on = 1;
        CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof on));
    }
    CHECK_LT(cublasLtMatrixLayoutCreate(&la, in, k, n, k));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lb, in, k, m, k));
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

void LtGemm::run(const void* a, const void* b, void* c, cudaStream_t s) {
    const float alpha = 1.f, beta = 0.f;
    CHECK_LT(cublasLtMatmul(h, op, &alpha, b, la, a, lb, &beta, c, lc, c, lc, &algo, ws, ws_bytes, s));
}

std::string LtGemm::describe() const {
    auto get = [this](cublasLtMatmulAlgoConfigAttributes_t a) -> long long {
        // The attribute's size first (cuBLASLt wants the exact size): an integer of at most 8 bytes, little-endian.
        size_t size = 0;
        if (cublasLtMatmulAlgoConfigGetAttribute(&algo, a, nullptr, 0, &size) != CUBLAS_STATUS_SUCCESS || size == 0 ||
            size > 8)
            return -1;
        uint64_t v = 0;
        size_t written = 0;
        if (cublasLtMatmulAlgoConfigGetAttribute(&algo, a, &v, size, &written) != CUBLAS_STATUS_SUCCESS) return -2;
        if (size == 4) return static_cast<int32_t>(v);  // ALGO_CONFIG_ID is signed
        return static_cast<long long>(v);
    };
    // Enum ids of cublasLt.h (cublasLtMatmulTile_t, cublasLtMatmulStages_t, cublasLtClusterShape_t, ...); cuBLAS's
    // m is our N (it computes the column-major C^T = B A^T).
    return fmt::format("id {} tile {} stages {} cluster {} inner {} splitk {} reduction {} swizzle {} custom {}",
                       get(CUBLASLT_ALGO_CONFIG_ID), get(CUBLASLT_ALGO_CONFIG_TILE_ID),
                       get(CUBLASLT_ALGO_CONFIG_STAGES_ID), get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
                       get(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID), get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                       get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                       get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION));
}

LtGemm::~LtGemm() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(h);
    cudaFree(ws);
}

}  // namespace loom::bench
