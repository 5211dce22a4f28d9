// Example 09: a Ulysses sequence-parallel attention block. Every rank holds S / W tokens of the sequence x and the
// whole projection weights; loom::qkv_gemm_a2a projects its tokens to q, k, v and all-to-alls them so that the rank
// holds the whole sequence for its heads (Hq / W query heads and their kv heads, GQA); attention runs per head
// (here a plain host implementation standing in for an attention kernel); loom::a2a_o_gemm all-to-alls the
// output back to the rank's tokens and applies the output projection. Verification: rank r's rows of the block's
// output against a single-rank fp64 host reference of the whole block on the whole sequence, every element.
//   loomrun -n 4 build/examples/09_ulysses_attention [S/W hidden]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/example_data.hpp"
#include "loom/bf16.hpp"
#include "loom/ops/attention.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/world.hpp"

namespace {

using loom_example::random_bf16;

double val(uint16_t b) { return loom::bf16_to_float(b); }
double round_bf16(double x) { return loom::bf16_to_float(loom::float_to_bf16(static_cast<float>(x))); }

// out[i, j] = sum_k a[i, k] b[j, k], rounded to bf16 (what a bf16 GEMM stores).
std::vector<double> matmul_t(const std::vector<double>& a, const std::vector<double>& b, int64_t m, int64_t n,
                             int64_t k) {
    std::vector<double> out(m * n);
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t x = 0; x < k; ++x) s += a[i * k + x] * b[j * k + x];
            out[i * n + j] = round_bf16(s);
        }
    return out;
}

// Softmax attention of one head over the whole sequence (non-causal): o[i] = softmax(q[i] . k / sqrt(D)) v.
// q, k, v, o: row i of head h at [i * ld + h * D].
void attend(const std::vector<double>& q, int64_t ldq, int64_t hq, const std::vector<double>& k,
            const std::vector<double>& v, int64_t ldkv, int64_t hkv, std::vector<double>& o, int64_t ldo, int64_t ho,
            int64_t S, int64_t D) {
    std::vector<double> p(S);
    for (int64_t i = 0; i < S; ++i) {
        double mx = -1e300;
        for (int64_t j = 0; j < S; ++j) {
            double s = 0;
            for (int64_t d = 0; d < D; ++d) s += q[i * ldq + hq * D + d] * k[j * ldkv + hkv * D + d];
            p[j] = s / std::sqrt(static_cast<double>(D));
            mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (auto& x : p) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < D; ++d) {
            double acc = 0;
            for (int64_t j = 0; j < S; ++j) acc += p[j] * v[j * ldkv + hkv * D + d];
            o[i * ldo + ho * D + d] = round_bf16(acc / sum);
        }
    }
}

std::vector<double> as_double(const std::vector<uint16_t>& h) {
    std::vector<double> d(h.size());
    for (std::size_t i = 0; i < h.size(); ++i) d[i] = val(h[i]);
    return d;
}

}  // namespace

int main(int argc, char** argv) {
    if (!loom::driver::available()) {
        std::printf("no GPU: %s\n", loom::driver::unavailable_reason().c_str());
        return 1;
    }
    auto world = loom::World::from_env();
    const int me = world.rank(), W = world.world_size();
    const int64_t R = argc > 2 ? std::atoll(argv[1]) : 96, hidden = argc > 2 ? std::atoll(argv[2]) : 256;
    const int64_t S = R * W, D = 64;
    // GQA: 2 query heads per rank; kv heads replicated on pairs of ranks where W is even (Hkv = W / 2 < W).
    const loom::UlyssesHeads heads{2 * W, W % 2 == 0 && W > 1 ? W / 2 : W, D};
    const int64_t hq_loc = heads.q / W, hkv_loc = heads.kv >= W ? heads.kv / W : 1;
    const int64_t qkv_rows = (heads.q + 2 * heads.kv) * D, group = heads.q / heads.kv;
    const int64_t kv_first = me * heads.kv / W;
    try {
        const auto hx = random_bf16(R * hidden, 1 + me, 1.f);
        const auto hw = random_bf16(qkv_rows * hidden, 100, 0.125f),
                   hwo = random_bf16(hidden * heads.q * D, 200, 0.125f);
        void *x, *wqkv, *wo, *q, *k, *v, *o, *out;
        LOOM_CHECK_CUDA(cudaMalloc(&x, R * hidden * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&wqkv, qkv_rows * hidden * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&wo, hidden * heads.q * D * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&q, S * hq_loc * D * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&k, S * hkv_loc * D * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&v, S * hkv_loc * D * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&o, S * hq_loc * D * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&out, R * hidden * 2));
        LOOM_CHECK_CUDA(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
        LOOM_CHECK_CUDA(cudaMemcpy(wqkv, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
        LOOM_CHECK_CUDA(cudaMemcpy(wo, hwo.data(), hwo.size() * 2, cudaMemcpyHostToDevice));
        LOOM_CHECK_CUDA(cudaMemset(out, 0xFF, R * hidden * 2));
        cudaStream_t s;
        LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        // The uploads above ran on the legacy default stream, which a non-blocking stream does not wait for.
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());

        // 1. Project and redistribute: this rank's heads, the whole sequence.
        loom::qkv_gemm_a2a(world, {x, loom::DType::BF16, R, hidden, 0}, {wqkv, loom::DType::BF16, qkv_rows, hidden, 0},
                           heads, {q, loom::DType::BF16, S, hq_loc * D, 0}, {k, loom::DType::BF16, S, hkv_loc * D, 0},
                           {v, loom::DType::BF16, S, hkv_loc * D, 0}, s);
        LOOM_CHECK_CUDA(cudaStreamSynchronize(s));

        // 2. Attention of this rank's heads (host stand-in for an attention kernel).
        std::vector<uint16_t> hq(S * hq_loc * D), hk(S * hkv_loc * D), hv(S * hkv_loc * D);
        LOOM_CHECK_CUDA(cudaMemcpy(hq.data(), q, hq.size() * 2, cudaMemcpyDeviceToHost));
        LOOM_CHECK_CUDA(cudaMemcpy(hk.data(), k, hk.size() * 2, cudaMemcpyDeviceToHost));
        LOOM_CHECK_CUDA(cudaMemcpy(hv.data(), v, hv.size() * 2, cudaMemcpyDeviceToHost));
        const auto dq = as_double(hq), dk = as_double(hk), dv = as_double(hv);
        std::vector<double> dout(S * hq_loc * D);
        for (int64_t h = 0; h < hq_loc; ++h) {
            const int64_t kvh = (me * hq_loc + h) / group - kv_first;  // local index of the head's kv head
            attend(dq, hq_loc * D, h, dk, dv, hkv_loc * D, kvh, dout, hq_loc * D, h, S, D);
        }
        std::vector<uint16_t> ho(dout.size());
        for (std::size_t i = 0; i < ho.size(); ++i) ho[i] = loom::float_to_bf16(static_cast<float>(dout[i]));
        LOOM_CHECK_CUDA(cudaMemcpy(o, ho.data(), ho.size() * 2, cudaMemcpyHostToDevice));
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());  // the upload (legacy stream) before s reads it

        // 3. Back to this rank's tokens, and the output projection.
        loom::a2a_o_gemm(world, {o, loom::DType::BF16, S, hq_loc * D, 0},
                         {wo, loom::DType::BF16, hidden, heads.q * D, 0}, {out, loom::DType::BF16, R, hidden, 0}, s);
        LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
        std::vector<uint16_t> got(R * hidden);
        LOOM_CHECK_CUDA(cudaMemcpy(got.data(), out, got.size() * 2, cudaMemcpyDeviceToHost));

        // Single-rank reference of the whole block.
        std::vector<double> xs;
        for (int p = 0; p < W; ++p) {
            const auto xp = as_double(random_bf16(R * hidden, 1 + p, 1.f));
            xs.insert(xs.end(), xp.begin(), xp.end());
        }
        const auto qkv = matmul_t(xs, as_double(hw), S, qkv_rows, hidden);  // [S, (Hq + 2 Hkv) D]
        std::vector<double> kk(S * heads.kv * D), vv(S * heads.kv * D), oo(S * heads.q * D);
        for (int64_t i = 0; i < S; ++i)
            for (int64_t c = 0; c < heads.kv * D; ++c) {
                kk[i * heads.kv * D + c] = qkv[i * qkv_rows + heads.q * D + c];
                vv[i * heads.kv * D + c] = qkv[i * qkv_rows + (heads.q + heads.kv) * D + c];
            }
        for (int64_t h = 0; h < heads.q; ++h)
            attend(qkv, qkv_rows, h, kk, vv, heads.kv * D, h / group, oo, heads.q * D, h, S, D);
        std::vector<double> mine(oo.begin() + me * R * heads.q * D, oo.begin() + (me + 1) * R * heads.q * D);
        const auto ref = matmul_t(mine, as_double(hwo), R, hidden, heads.q * D);
        int64_t bad = 0;
        double worst = 0;
        for (int64_t i = 0; i < R * hidden; ++i) {
            const double err = std::fabs(val(got[i]) - ref[i]);
            worst = std::max(worst, err);
            if (!(err <= 0.03 * std::fabs(ref[i]) + 0.03)) ++bad;  // bf16 q, k, v, o: rounding moves the softmax
        }
        std::printf(
            "rank %d: Ulysses attention block S=%lld hidden=%lld Hq=%lld Hkv=%lld D=%lld: %s (%lld bad "
            "elements, max error %.3g)\n",
            me, static_cast<long long>(S), static_cast<long long>(hidden), static_cast<long long>(heads.q),
            static_cast<long long>(heads.kv), static_cast<long long>(D), bad ? "FAILED" : "OK",
            static_cast<long long>(bad), worst);
        world.barrier();
        loom::release_ulysses_state(world);
        return bad ? 1 : 0;
    } catch (const std::exception& e) {
        std::printf("rank %d: error: %s\n", me, e.what());
        return 1;
    }
}
