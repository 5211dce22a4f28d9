// Example 07: a whole tensor-parallel MoE layer. Every rank holds T_loc tokens x [T_loc, H] with their top-k routing
// (expert ids and weights) and a slice of every expert: the gate and up rows [r I / W, (r + 1) I / W) of w_gate / w_up
// (stacked as one [2 I / W, H] weight, gate rows first: the grouped GEMM's SwiGLU epilogue multiplies silu(gate) by up)
// and the same columns of w_down [H, I]. Then
//   loom::ag_moe  gathers every rank's routed tokens and multiplies them with this rank's gate / up slices, SwiGLU in
//                 the epilogue: h [rows, I / W] in the expert-sorted layout it also returns (`routing`, ranks 1: one
//                 group per expert over every rank's tokens, so the GEMMs read each expert's weights once);
//   loom::moe_rs  multiplies h with this rank's down slice, reduces each token's top-k rows with its weights and sums
//                 the ranks' partial products into the token's owner: y [T_loc, H].
// Auto picks each op's algorithm by size: Sequential (Loom's collectives around the grouped GEMMs) below 2048 routed
// rows, Fused (communication overlapped with the grouped GEMM) from there on, where it applies (docs/moe.md).
// Verification: rank r's tokens against a plain per-token, per-expert loop on the host in double precision (every rank
// regenerates every rank's inputs from their seeds), every element.
//   loomrun -n 4 build/examples/07_tp_moe_layer [T_loc H I E k]
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
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/world.hpp"

namespace {

using loom_example::next_random;
using loom_example::random_bf16_floats;
using loom_example::upload;

// Rank q's routing: k distinct experts per token (every fourth token sends its first slot to expert 0: skewed), and
// weights summing to 1.
void routing_of(int q, int t_loc, int e, int k, std::vector<int32_t>& ids, std::vector<float>& wts) {
    uint64_t x = 7777 + static_cast<uint64_t>(q) * 131;
    ids.resize(static_cast<std::size_t>(t_loc) * k);
    wts.resize(ids.size());
    std::vector<int32_t> perm(e);
    for (int t = 0; t < t_loc; ++t) {
        std::iota(perm.begin(), perm.end(), 0);
        for (int i = e - 1; i > 0; --i) std::swap(perm[i], perm[next_random(x) % (i + 1)]);
        if (t % 4 == 0) std::swap(perm[0], *std::find(perm.begin(), perm.end(), 0));
        float sum = 0;
        for (int s = 0; s < k; ++s) {
            ids[t * k + s] = perm[s];
            wts[t * k + s] = 0.1f + static_cast<float>(next_random(x) % 1000) / 1000.f;
            sum += wts[t * k + s];
        }
        for (int s = 0; s < k; ++s) wts[t * k + s] /= sum;
    }
}
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
    const int t_loc = args ? std::atoi(argv[1]) : 100, H = args ? std::atoi(argv[2]) : 256;
    const int I = args ? std::atoi(argv[3]) : 64 * W, E = args ? std::atoi(argv[4]) : 8,
              k = args ? std::atoi(argv[5]) : 2;
    const int i_loc = I / W;
    try {
        LOOM_CHECK(I % W == 0 && i_loc % 8 == 0, "I: expected a multiple of 8 x world size, given {}", I);
        // Full weights (the same on every rank), then this rank's slices.
        const auto gate = random_bf16_floats(static_cast<std::size_t>(E) * I * H, 11, 0.1f);
        const auto up = random_bf16_floats(static_cast<std::size_t>(E) * I * H, 12, 0.1f);
        const auto down = random_bf16_floats(static_cast<std::size_t>(E) * H * I, 13, 0.1f);
        std::vector<float> up_r(static_cast<std::size_t>(E) * 2 * i_loc * H),
            down_r(static_cast<std::size_t>(E) * H * i_loc);
        for (int e = 0; e < E; ++e) {
            for (int j = 0; j < i_loc; ++j)
                for (int c = 0; c < H; ++c) {
                    const std::size_t src = (static_cast<std::size_t>(e) * I + me * i_loc + j) * H + c;
                    up_r[(static_cast<std::size_t>(e) * 2 * i_loc + j) * H + c] = gate[src];
                    up_r[(static_cast<std::size_t>(e) * 2 * i_loc + i_loc + j) * H + c] = up[src];
                }
            for (int c = 0; c < H; ++c)
                for (int j = 0; j < i_loc; ++j)
                    down_r[(static_cast<std::size_t>(e) * H + c) * i_loc + j] =
                        down[(static_cast<std::size_t>(e) * H + c) * I + me * i_loc + j];
        }
        const auto x = random_bf16_floats(static_cast<std::size_t>(t_loc) * H, 100 + me, 1.f);
        std::vector<int32_t> ids;
        std::vector<float> wts;
        routing_of(me, t_loc, E, k, ids, wts);

        const loom::MoeRoutingShape shape{t_loc * W, k, E};  // expert-major (ranks 1)
        void* d_route = nullptr;
        LOOM_CHECK_CUDA(cudaMalloc(&d_route, loom::moe_routing_bytes(shape)));
        const loom::MoeRouting routing = loom::moe_routing_view(shape, d_route, loom::moe_routing_bytes(shape));
        void *d_x = upload(to_bf16(x)), *d_ids = upload(ids), *d_w = upload(wts), *d_up = upload(to_bf16(up_r)),
             *d_down = upload(to_bf16(down_r)), *d_h = nullptr, *d_y = nullptr;
        LOOM_CHECK_CUDA(cudaMalloc(&d_h, std::max<std::size_t>(shape.max_rows() * i_loc * 2, 256)));
        LOOM_CHECK_CUDA(cudaMalloc(&d_y, std::max<std::size_t>(static_cast<std::size_t>(t_loc) * H * 4, 256)));
        cudaStream_t s;
        LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        // The uploads above ran on the legacy default stream, which a non-blocking stream does not wait for.
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());

        loom::TpMoeOptions up_opts;
        up_opts.gemm.activation = loom::MoeActivation::SwiGLU;
        const loom::MatrixView h{d_h, loom::DType::BF16, shape.max_rows(), i_loc};
        loom::ag_moe(world, {d_x, loom::DType::BF16, t_loc, H}, static_cast<int32_t*>(d_ids), static_cast<float*>(d_w),
                     {d_up, loom::DType::BF16, int64_t{E} * 2 * i_loc, H}, routing, h, s, up_opts);
        loom::moe_rs(world, h, {d_down, loom::DType::BF16, int64_t{E} * H, i_loc}, routing,
                     {d_y, loom::DType::F32, t_loc, H}, s);
        LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
        std::vector<float> y(static_cast<std::size_t>(t_loc) * H);
        LOOM_CHECK_CUDA(cudaMemcpy(y.data(), d_y, y.size() * 4, cudaMemcpyDeviceToHost));

        // The plain loop: for each of this rank's tokens and slots, the expert's SwiGLU MLP (its intermediate rounded
        // to bf16 per rank slice, as the GEMM stores it), weighted.
        int64_t bad = 0;
        std::vector<double> act(I);
        for (int t = 0; t < t_loc; ++t) {
            std::vector<double> ref(H, 0.0), mag(H, 0.0);
            for (int sl = 0; sl < k; ++sl) {
                const int e = ids[t * k + sl];
                for (int j = 0; j < I; ++j) {
                    double g = 0, u = 0;
                    for (int c = 0; c < H; ++c) {
                        const std::size_t wi = (static_cast<std::size_t>(e) * I + j) * H + c;
                        g += double(x[static_cast<std::size_t>(t) * H + c]) * gate[wi];
                        u += double(x[static_cast<std::size_t>(t) * H + c]) * up[wi];
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
            for (int c = 0; c < H; ++c)
                if (!(std::fabs(y[static_cast<std::size_t>(t) * H + c] - ref[c]) <=
                      1e-2 * std::fabs(ref[c]) + mag[c] / 128 + 1e-4))
                    ++bad;
        }
        std::printf("rank %d: TP-MoE layer T_loc=%d H=%d I=%d E=%d k=%d: %s (%lld bad elements)\n", me, t_loc, H, I, E,
                    k, bad ? "FAILED" : "OK", static_cast<long long>(bad));
        world.barrier();
        loom::release_moe_state(world);
        for (void* p : {d_route, d_x, d_ids, d_w, d_up, d_down, d_h, d_y}) cudaFree(p);
        return bad ? 1 : 0;
    } catch (const std::exception& e) {
        std::printf("rank %d: error: %s\n", me, e.what());
        return 1;
    }
}
