// Example 08: sequence-parallel decode of one attention layer. The KV cache of each sequence is cut into one uneven
// shard per rank (rank r holds tokens [cut_r, cut_r+1); the last rank holds none of sequence 0); every rank runs
// loom::sp_decode_attention on its shard and gets the attention over the whole KV. Verification: the same result
// as loom::decode_attention over the whole KV on one rank (each rank builds the whole cache from one seed).
//   loomrun -n 4 build/examples/08_sp_decode [batch kv_len]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/example_data.hpp"
#include "loom/bf16.hpp"
#include "loom/ops/attention.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/world.hpp"

namespace {

using loom_example::random_bf16;
using loom_example::upload;
}  // namespace

int main(int argc, char** argv) {
    if (!loom::driver::available()) {
        std::printf("no GPU: %s\n", loom::driver::unavailable_reason().c_str());
        return 1;
    }
    auto world = loom::World::from_env();
    const int me = world.rank(), W = world.world_size();
    const int B = argc > 2 ? std::atoi(argv[1]) : 4;
    const int S = argc > 2 ? std::atoi(argv[2]) : 8192;
    const int Hq = 32, Hkv = 8, D = 128;
    const std::size_t row = std::size_t(Hkv) * D;  // elements per token
    const auto k = random_bf16(std::size_t(B) * S * row, 1), v = random_bf16(std::size_t(B) * S * row, 2);
    const auto q = random_bf16(std::size_t(B) * Hq * D, 3);
    std::vector<int32_t> lens(B), my_lens(B);
    std::vector<int> lo(B);
    for (int b = 0; b < B; ++b) {
        lens[b] = S - 37 * b;  // lengths not multiples of anything in particular
        // Uneven cuts: rank r's share grows with r; sequence 0's last rank holds nothing.
        const int parts = (b == 0 && W > 1) ? W - 1 : W;
        const int64_t total = int64_t(parts) * (parts + 1) / 2;
        int64_t acc = 0;
        for (int r = 0; r <= me; ++r) {
            const int64_t a = r < parts ? lens[b] * acc / total : lens[b];
            acc += r + 1;
            const int64_t z = r < parts ? lens[b] * acc / total : lens[b];
            if (r == me) lo[b] = static_cast<int>(a), my_lens[b] = static_cast<int>(z - a);
        }
    }
    // This rank's shard as a contiguous cache [B, S, Hkv, D].
    std::vector<uint16_t> mk(k.size()), mv(v.size());
    for (int b = 0; b < B; ++b) {
        const std::size_t from = (std::size_t(b) * S + lo[b]) * row, to = std::size_t(b) * S * row;
        std::memcpy(&mk[to], &k[from], std::size_t(my_lens[b]) * row * 2);
        std::memcpy(&mv[to], &v[from], std::size_t(my_lens[b]) * row * 2);
    }
    void *dq = upload(q), *dk = upload(k), *dv = upload(v), *dmk = upload(mk), *dmv = upload(mv);
    void *dlens = upload(lens), *dmy = upload(my_lens);
    void *o_sp = nullptr, *o_one = nullptr, *l_sp = nullptr, *l_one = nullptr;
    const std::size_t rows = std::size_t(B) * Hq;
    LOOM_CHECK_CUDA(cudaMalloc(&o_sp, rows * D * 2));
    LOOM_CHECK_CUDA(cudaMalloc(&o_one, rows * D * 2));
    LOOM_CHECK_CUDA(cudaMalloc(&l_sp, rows * 4));
    LOOM_CHECK_CUDA(cudaMalloc(&l_one, rows * 4));

    const loom::DecodeQuery dqv{dq, loom::DType::BF16, B, Hq, D};
    loom::KvCache whole, shard;
    whole.k = dk, whole.v = dv, whole.num_kv_heads = Hkv, whole.max_seq_len = S;
    whole.seq_lens = static_cast<const int32_t*>(dlens);
    shard = whole;
    shard.k = dmk, shard.v = dmv, shard.seq_lens = static_cast<const int32_t*>(dmy);
    loom::sp_decode_attention(world, dqv, shard, o_sp, static_cast<float*>(l_sp), nullptr);
    loom::decode_attention(dqv, whole, o_one, static_cast<float*>(l_one), nullptr);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());

    std::vector<uint16_t> a(rows * D), b(rows * D);
    std::vector<float> la(rows), lb(rows);
    LOOM_CHECK_CUDA(cudaMemcpy(a.data(), o_sp, a.size() * 2, cudaMemcpyDeviceToHost));
    LOOM_CHECK_CUDA(cudaMemcpy(b.data(), o_one, b.size() * 2, cudaMemcpyDeviceToHost));
    LOOM_CHECK_CUDA(cudaMemcpy(la.data(), l_sp, rows * 4, cudaMemcpyDeviceToHost));
    LOOM_CHECK_CUDA(cudaMemcpy(lb.data(), l_one, rows * 4, cudaMemcpyDeviceToHost));
    double max_o = 0, max_l = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
        max_o = std::max(max_o, double(std::abs(loom::bf16_to_float(a[i]) - loom::bf16_to_float(b[i]))));
    for (std::size_t i = 0; i < rows; ++i) max_l = std::max(max_l, double(std::abs(la[i] - lb[i])));
    const bool ok = max_o <= 1e-2 && max_l <= 1e-3;
    std::printf("rank %d: sp_decode over %d ranks vs one-rank decode: max |dO| %.2e, max |dLSE| %.2e: %s\n", me, W,
                max_o, max_l, ok ? "OK" : "MISMATCH");
    for (void* p : {dq, dk, dv, dmk, dmv, dlens, dmy, o_sp, o_one, l_sp, l_one}) cudaFree(p);
    loom::release_attention_state(world);
    return ok ? 0 : 1;
}
