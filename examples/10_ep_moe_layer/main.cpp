// Example 10: an expert-parallel MoE layer. Every rank holds T tokens x [T, H] and L = E / W whole experts (experts
// [r L, (r + 1) L)): a SwiGLU MLP each, w_gate / w_up [I, H] stacked as one [2 I, H] weight (gate rows first) and
// w_down [H, I]. Then
//   route         a router (logits = x w_router^T, top-k, softmax over the k) — here on the host, for brevity;
//   ep_dispatch   sends each token once to every rank that holds one of its experts, landing expert-contiguous:
//                 recv_x [capacity, H] with device offsets per local expert;
//   grouped_gemm  x2 over the received rows with the L local experts: SwiGLU(recv_x w_gu^T), then w_down;
//   ep_combine    sends the expert outputs back and reduces them with the top-k weights: y [T, H] in token order.
// Verification: rank r's tokens against a plain per-token, per-expert loop on the host in double precision (every
// rank regenerates every expert's weights from seeds), every element.
//   loomrun -n 8 build/examples/10_ep_moe_layer [T H I E k]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "common/example_data.hpp"
#include "loom/bf16.hpp"
#include "loom/ops/moe.hpp"
#include "loom/ops/moe_ep.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/world.hpp"

namespace {

using loom_example::random_bf16_floats;
using loom_example::upload;

std::vector<uint16_t> to_bf16(const std::vector<float>& f) {
    std::vector<uint16_t> b(f.size());
    for (std::size_t i = 0; i < f.size(); ++i) b[i] = loom::float_to_bf16(f[i]);
    return b;
}

}  // namespace

int main(int argc, char** argv) {
    if (!loom::driver::available()) {
        std::printf("no GPU: %s\n", loom::driver::unavailable_reason().c_str());
        return 1;
    }
    auto world = loom::World::from_env();
    const int me = world.rank(), W = world.world_size();
    const bool args = argc > 5;
    const int T = args ? std::atoi(argv[1]) : 128, H = args ? std::atoi(argv[2]) : 256;
    const int I = args ? std::atoi(argv[3]) : 128, E = args ? std::atoi(argv[4]) : 4 * W,
              k = args ? std::atoi(argv[5]) : 4;
    try {
        LOOM_CHECK(E % W == 0 && k <= E, "E: expected a multiple of the world size {} and >= k, given {}", W, E);
        const int L = E / W;
        // Every expert's weights (the same on every rank); this rank's L experts go to the device.
        const auto gu = random_bf16_floats(static_cast<std::size_t>(E) * 2 * I * H, 21, 0.1f);  // [E][2I][H]
        const auto down = random_bf16_floats(static_cast<std::size_t>(E) * H * I, 22, 0.1f);    // [E][H][I]
        const auto router = random_bf16_floats(static_cast<std::size_t>(E) * H, 23, 0.5f);      // [E][H]
        const std::vector<float> gu_r(gu.begin() + static_cast<std::ptrdiff_t>(me) * L * 2 * I * H,
                                      gu.begin() + static_cast<std::ptrdiff_t>(me + 1) * L * 2 * I * H);
        const std::vector<float> down_r(down.begin() + static_cast<std::ptrdiff_t>(me) * L * H * I,
                                        down.begin() + static_cast<std::ptrdiff_t>(me + 1) * L * H * I);
        const auto x = random_bf16_floats(static_cast<std::size_t>(T) * H, 100 + me, 1.f);

        // Route: top-k of the router logits, softmax over the chosen k.
        std::vector<int32_t> ids(static_cast<std::size_t>(T) * k);
        std::vector<float> wts(ids.size());
        std::vector<double> logit(E);
        std::vector<int> order(E);
        for (int t = 0; t < T; ++t) {
            for (int e = 0; e < E; ++e) {
                logit[e] = 0;
                for (int c = 0; c < H; ++c) logit[e] += double(x[t * H + c]) * router[e * H + c];
            }
            std::iota(order.begin(), order.end(), 0);
            std::partial_sort(order.begin(), order.begin() + k, order.end(),
                              [&](int a, int b) { return logit[a] > logit[b]; });
            double sum = 0;
            for (int s = 0; s < k; ++s) sum += std::exp(logit[order[s]] - logit[order[0]]);
            for (int s = 0; s < k; ++s) {
                ids[t * k + s] = order[s];
                wts[t * k + s] = static_cast<float>(std::exp(logit[order[s]] - logit[order[0]]) / sum);
            }
        }

        void *d_x = upload(to_bf16(x)), *d_ids = upload(ids), *d_w = upload(wts), *d_gu = upload(to_bf16(gu_r)),
             *d_down = upload(to_bf16(down_r)), *d_y = upload(std::vector<uint16_t>(static_cast<std::size_t>(T) * H));
        cudaStream_t s;
        LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        // The uploads above ran on the legacy default stream, which a non-blocking stream does not wait for.
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());

        // Dispatch (auto capacity: the host learns the rows to allocate for the expert outputs).
        const loom::EpHandle hd = loom::ep_dispatch(world, {d_x, loom::DType::BF16, T, H}, static_cast<int32_t*>(d_ids),
                                                    static_cast<float*>(d_w), k, E, s);
        void *d_h = nullptr, *d_o = nullptr;
        LOOM_CHECK_CUDA(cudaMalloc(&d_h, static_cast<std::size_t>(hd.capacity) * I * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&d_o, static_cast<std::size_t>(hd.capacity) * H * 2));
        loom::GroupedGemmOptions up;
        up.activation = loom::MoeActivation::SwiGLU;
        up.max_rows = static_cast<int>(hd.capacity);
        loom::grouped_gemm(hd.recv_x, {d_gu, loom::DType::BF16, int64_t{L} * 2 * I, H}, L,
                           {d_h, loom::DType::BF16, hd.capacity, I}, hd.recv_offsets, L, s, up);
        loom::GroupedGemmOptions dn;
        dn.max_rows = static_cast<int>(hd.capacity);
        loom::grouped_gemm({d_h, loom::DType::BF16, hd.capacity, I}, {d_down, loom::DType::BF16, int64_t{L} * H, I}, L,
                           {d_o, loom::DType::BF16, hd.capacity, H}, hd.recv_offsets, L, s, dn);
        loom::ep_combine(world, hd, {d_o, loom::DType::BF16, hd.capacity, H}, {d_y, loom::DType::BF16, T, H}, s);
        loom::ep_check(world, hd, s);  // synchronises the stream
        std::vector<uint16_t> y(static_cast<std::size_t>(T) * H);
        LOOM_CHECK_CUDA(cudaMemcpy(y.data(), d_y, y.size() * 2, cudaMemcpyDeviceToHost));

        // The plain loop: each token's experts' SwiGLU MLPs (intermediate and output rounded to bf16 as the GEMMs
        // store them), weighted.
        int64_t bad = 0;
        std::vector<double> act(I);
        for (int t = 0; t < T; ++t) {
            std::vector<double> ref(H, 0.0), mag(H, 0.0);
            for (int sl = 0; sl < k; ++sl) {
                const int e = ids[t * k + sl];
                for (int j = 0; j < I; ++j) {
                    double g = 0, u = 0;
                    for (int c = 0; c < H; ++c) {
                        g += double(x[t * H + c]) * gu[(static_cast<std::size_t>(e) * 2 * I + j) * H + c];
                        u += double(x[t * H + c]) * gu[(static_cast<std::size_t>(e) * 2 * I + I + j) * H + c];
                    }
                    act[j] = loom::bf16_to_float(loom::float_to_bf16(static_cast<float>(g / (1 + std::exp(-g)) * u)));
                }
                for (int c = 0; c < H; ++c) {
                    double a = 0, am = 0;
                    for (int j = 0; j < I; ++j) {
                        const double p = act[j] * down[(static_cast<std::size_t>(e) * H + c) * I + j];
                        a += p;
                        am += std::fabs(p);
                    }
                    ref[c] += wts[t * k + sl] * a;
                    mag[c] += wts[t * k + sl] * am;
                }
            }
            for (int c = 0; c < H; ++c) {
                const double got = loom::bf16_to_float(y[static_cast<std::size_t>(t) * H + c]);
                if (!(std::fabs(got - ref[c]) <= 2e-2 * std::fabs(ref[c]) + mag[c] / 64 + 1e-3)) ++bad;
            }
        }
        std::printf(
            "rank %d: EP MoE layer T=%d H=%d I=%d E=%d k=%d (%d experts per rank, capacity %lld rows): %s "
            "(%lld bad elements)\n",
            me, T, H, I, E, k, L, static_cast<long long>(hd.capacity), bad ? "FAILED" : "OK",
            static_cast<long long>(bad));
        world.barrier();
        loom::release_moe_ep_state(world);
        for (void* p : {d_x, d_ids, d_w, d_gu, d_down, d_y, d_h, d_o}) cudaFree(p);
        return bad ? 1 : 0;
    } catch (const std::exception& e) {
        std::printf("rank %d: error: %s\n", me, e.what());
        return 1;
    }
}
