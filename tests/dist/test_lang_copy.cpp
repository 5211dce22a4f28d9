// One-sided data movement between ranks, bitwise: every put/get variant (Thread/Warp/Block x ld-st/TMA;
// blocking, nbi + quiet, put_signal), odd sizes and misaligned offsets, fresh random data, poisoned
// destinations; then LL8/LL16 packets.
#include <cuda_runtime.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/reference.hpp"
#include "common/test_env.hpp"
#include "common/test_kernels.hpp"
#include "loom/runtime/error.hpp"

namespace {

using loom::jit::LaunchConfig;
using loom::test::lang_kernel;

// Mirrors loom_test::Op (tests/dist/kernels/lang_test.cuh).
enum class Op : int { Put, PutNbi, PutSignal, Get, GetNbi };
const char* op_name(Op op) {
    const char* names[] = {"put", "put_nbi+quiet", "put_signal", "get", "get_nbi+quiet"};
    return names[int(op)];
}

// Bytes rank `sender` puts / exposes in case `c`: reproducible on every rank, different per case and rank.
std::vector<unsigned char> case_data(int sender, uint64_t c, std::size_t n) {
    std::mt19937_64 rng(loom::test::run_seed(0x10C0FFEEull * (sender + 1) + c * 0x9E3779B97F4A7C15ull));
    std::vector<unsigned char> v(n);
    for (auto& b : v) b = static_cast<unsigned char>(rng());
    return v;
}

constexpr unsigned char kPoison = 0xA5;

struct Variant {
    const char* group;
    int threads;
    int tma;
};

TEST(LangCopy, EveryPutGetVariantBitwise) {
    LOOM_REQUIRE_GPU();
    auto& w = loom::test::world();
    const int me = w.rank(), n_ranks = w.world_size();
    const int to = (me + 1) % n_ranks, from = (me + n_ranks - 1) % n_ranks;
    const std::size_t sizes[] = {1, 15, 16, 17, 4095, 65536 + 3, (1u << 20) + 7};
    const int offsets[][2] = {{0, 0}, {3, 3}, {5, 1}, {8, 0}};  // (dst, src) byte offsets: aligned, equal, mismatched
    const std::size_t cap = (1u << 20) + 7 + 64;
    auto* dst = w.alloc<unsigned char>(cap);
    auto* src = w.alloc<unsigned char>(cap);
    auto* sig = w.alloc<uint64_t>(1);
    LOOM_CHECK_CUDA(cudaMemset(sig, 0, 8));
    const bool has_tma = loom::jit::current_arch() >= 90;
    const Variant variants[] = {{"loom::lang::Thread", 1, 0},  {"loom::lang::Warp", 32, 0},
                                {"loom::lang::Block", 256, 0}, {"loom::lang::Thread", 1, 1},
                                {"loom::lang::Warp", 32, 1},   {"loom::lang::Block", 256, 1}};
    uint64_t epoch = 0;
    std::vector<unsigned char> got(cap);
    for (const Variant& v : variants) {
        if (v.tma && !has_tma) continue;
        const auto& k = lang_kernel("loom_test::move", {v.group, v.tma ? "1" : "0"});
        const std::size_t smem = v.tma ? 128 + 4 * 8192 : 0;
        for (Op op : {Op::Put, Op::PutNbi, Op::PutSignal, Op::Get, Op::GetNbi}) {
            const bool is_get = op == Op::Get || op == Op::GetNbi;
            for (std::size_t n : sizes) {
                for (const auto& off : offsets) {
                    ++epoch;
                    const auto mine = case_data(me, epoch, n);
                    LOOM_CHECK_CUDA(cudaMemset(dst, kPoison, cap));
                    LOOM_CHECK_CUDA(cudaMemcpy(src + off[1], mine.data(), n, cudaMemcpyHostToDevice));
                    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
                    w.barrier("copy-ready");  // every source filled, every destination poisoned
                    const int peer = is_get ? from : to;
                    k(LaunchConfig{dim3(1), dim3(v.threads), smem}, w.ctx(), op, dst + off[0],
                      static_cast<const unsigned char*>(src + off[1]), uint64_t(n), peer, sig, epoch);
                    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
                    w.barrier("copy-done");  // every put into me has landed
                    LOOM_CHECK_CUDA(cudaMemcpy(got.data(), dst, cap, cudaMemcpyDeviceToHost));
                    const auto want = case_data(from, epoch, n);
                    bool ok = std::memcmp(got.data() + off[0], want.data(), n) == 0;
                    std::size_t poisoned = 0;
                    for (std::size_t i = 0; i < cap; ++i)
                        if (i < std::size_t(off[0]) || i >= off[0] + n) poisoned += got[i] != kPoison;
                    EXPECT_TRUE(ok && poisoned == 0)
                        << v.group << (v.tma ? " TMA " : " ld/st ") << op_name(op) << " bytes " << n << " offsets ("
                        << off[0] << "," << off[1] << "): data " << (ok ? "ok" : "WRONG") << ", " << poisoned
                        << " bytes outside the range overwritten";
                }
            }
        }
    }
    w.free(sig);
    w.free(src);
    w.free(dst);
}

TEST(LangCopy, LowLatencyPackets) {
    LOOM_REQUIRE_GPU();
    auto& w = loom::test::world();
    const int me = w.rank(), n_ranks = w.world_size();
    const int to = (me + 1) % n_ranks, from = (me + n_ranks - 1) % n_ranks;
    const uint32_t n = 100, iters = 10000;
    auto* packets = w.alloc<char>(16 * n);
    auto* ack = w.alloc<uint64_t>(1);
    uint32_t *scratch = nullptr, *errors = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(&scratch, 32 * n));
    LOOM_CHECK_CUDA(cudaMalloc(&errors, 4));
    for (const char* packet : {"loom::lang::LL8", "loom::lang::LL16"}) {
        LOOM_CHECK_CUDA(cudaMemset(packets, 0, 16 * n));
        LOOM_CHECK_CUDA(cudaMemset(ack, 0, 8));
        LOOM_CHECK_CUDA(cudaMemset(errors, 0, 4));
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
        w.barrier("ll");
        lang_kernel("loom_test::ll_pingpong", {packet})(LaunchConfig{dim3(1), dim3(32)}, w.ctx(), packets, ack, n,
                                                        iters, to, from, scratch, errors);
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
        uint32_t bad = 1;
        LOOM_CHECK_CUDA(cudaMemcpy(&bad, errors, 4, cudaMemcpyDeviceToHost));
        EXPECT_EQ(bad, 0u) << packet << ": words received that differ from what was sent";
        w.barrier("ll-done");
    }
    LOOM_CHECK_CUDA(cudaFree(errors));
    LOOM_CHECK_CUDA(cudaFree(scratch));
    w.free(ack);
    w.free(packets);
}

}  // namespace
