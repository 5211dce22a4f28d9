// The collectives in a World of several nodes (their hierarchical forms, src/ops/collectives/hier/), on one machine
// through the emulated multi-node mode (docs/crossnode.md). Skipped in a one-node World.
//
// Run:
//   LOOM_NODE_SIZE=2 build/bin/loomrun -n 4 build/tests/loom_dist_tests --gtest_filter='CrossNodeCollectives*'  # 2x2
//   LOOM_NODE_SIZE=4 build/bin/loomrun -n 8 build/tests/loom_dist_tests --gtest_filter='CrossNodeCollectives*'  # 2x4
//   LOOM_NODE_SIZE=2 build/bin/loomrun -n 8 build/tests/loom_dist_tests --gtest_filter='CrossNodeCollectives*'  # 4x2
//   LOOM_NODE_SIZE=1 build/bin/loomrun -n 3 build/tests/loom_dist_tests --gtest_filter='CrossNodeCollectives*'  # 3x1
//
// Every result is checked element by element against the exact expected value: data movement bitwise, reductions on
// small integers (exact in f32, f16 and bf16 at up to 8 ranks). Every check's verdict is gathered from all ranks
// (test::agree) before it is asserted, so ranks fail together.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/reference.hpp"
#include "common/symmetric.hpp"
#include "common/test_env.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/runtime/error.hpp"

namespace loom {
namespace {

using test::Sym;

class CrossNodeCollectives : public ::MultiNodeTest {};

// splitmix64's finaliser: inputs that differ anywhere give unrelated outputs, so data moved to a wrong place shows at
// any offset (a pattern with a period hides moves by a multiple of it).
std::uint64_t mix(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
std::uint64_t key(int rank, int k, std::size_t i) {
    return (static_cast<std::uint64_t>(rank) << 56) ^ (static_cast<std::uint64_t>(k) << 48) ^ i;
}

// Small integers in [-8, 8], exact in every float dtype and in their sums over 8 ranks.
double value(int rank, std::size_t i, int k) {
    return static_cast<double>(static_cast<int>(mix(key(rank, k, i)) % 17) - 8);
}
void encode(DType t, double v, char* dst) {
    const float f = static_cast<float>(v);
    if (t == DType::F32) {
        std::memcpy(dst, &f, 4);
    } else {
        const std::uint16_t h = t == DType::BF16 ? test::float_to_bf16(f) : test::float_to_half(f);
        std::memcpy(dst, &h, 2);
    }
}
double decode(DType t, const char* src) {
    if (t == DType::F32) {
        float f;
        std::memcpy(&f, src, 4);
        return f;
    }
    std::uint16_t h;
    std::memcpy(&h, src, 2);
    return t == DType::BF16 ? test::bf16_to_float(h) : test::half_to_float(h);
}
// Byte b of element i of rank `rank`'s data movement input (variant k).
char pattern(int rank, std::size_t byte, int k) {
    return static_cast<char>(mix(key(rank, k, byte) ^ (1ull << 47)) & 0xff);
}

std::vector<char> reduce_input(DType t, int rank, std::size_t n, int k) {
    const std::size_t es = dtype_size(t);
    std::vector<char> raw(n * es);
    for (std::size_t i = 0; i < n; ++i) encode(t, value(rank, i, k), raw.data() + i * es);
    return raw;
}
std::vector<char> move_input(int rank, std::size_t bytes, int k) {
    std::vector<char> raw(bytes);
    for (std::size_t b = 0; b < bytes; ++b) raw[b] = pattern(rank, b, k);
    return raw;
}
double reduced(ReduceOp op, int W, std::size_t i, int k) {
    double acc = value(0, i, k);
    for (int s = 1; s < W; ++s) acc = op == ReduceOp::Max ? std::fmax(acc, value(s, i, k)) : acc + value(s, i, k);
    return acc;
}

void upload(void* dst, const std::vector<char>& src) {
    LOOM_CHECK_CUDA(cudaMemcpy(dst, src.data(), src.size(), cudaMemcpyHostToDevice));
}
std::vector<char> download(const void* src, std::size_t bytes) {
    std::vector<char> h(bytes);
    LOOM_CHECK_CUDA(cudaMemcpy(h.data(), src, bytes, cudaMemcpyDeviceToHost));
    return h;
}

std::string label(const char* op, DType t, std::size_t n) {
    return std::string(op) + " " + dtype_name(t) + " count " + std::to_string(n);
}

const std::size_t kCounts[] = {1, 3, 1000, 65537, 1u << 20};

// ---- data movement: out, bitwise ----------------------------------------------------------------------------------
// Chunk j of a rank's all_gather out must be rank j's in (variant k).
std::string check_all_gather(const std::vector<char>& out, int W, std::size_t B, int k) {
    for (int j = 0; j < W; ++j)
        for (std::size_t b = 0; b < B; ++b)
            if (out[j * B + b] != pattern(j, b, k))
                return "chunk " + std::to_string(j) + " byte " + std::to_string(b) + " is wrong";
    return "";
}
// Block j of rank me's all_to_all out must be block me of rank j's in.
std::string check_all_to_all(const std::vector<char>& out, int W, int me, std::size_t B, int k) {
    for (int j = 0; j < W; ++j)
        for (std::size_t b = 0; b < B; ++b)
            if (out[j * B + b] != pattern(j, me * B + b, k))
                return "block from rank " + std::to_string(j) + " byte " + std::to_string(b) + " is wrong";
    return "";
}
std::string check_reduced(const std::vector<char>& out, DType t, ReduceOp op, int W, std::size_t first, std::size_t n,
                          int k) {
    const std::size_t es = dtype_size(t);
    for (std::size_t i = 0; i < n; ++i) {
        const double want = reduced(op, W, first + i, k), got = decode(t, out.data() + i * es);
        if (got != want)
            return "element " + std::to_string(i) + ": expected " + std::to_string(want) + ", got " +
                   std::to_string(got);
    }
    return "";
}

TEST_F(CrossNodeCollectives, AllGatherMatchesEveryRanksInput) {
    const int W = w->world_size(), me = w->rank();
    for (DType t : {DType::F32, DType::BF16, DType::U8, DType::I64})
        for (std::size_t n : kCounts) {
            const std::size_t B = n * dtype_size(t);
            for (bool in_place : {false, true}) {
                Sym out(*w, W * B), in(*w, B);
                const BufferView o{out.as(), t, W * n};
                const BufferView i{in_place ? out.as() + me * B : in.as(), t, n};
                LOOM_CHECK_CUDA(cudaMemset(out.as(), 0xA5, W * B));
                upload(i.data, move_input(me, B, 0));
                sync_all("xnc ag in");
                all_gather(*w, i, o, stream);
                ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
                const std::string v = check_all_gather(download(out.as(), W * B), W, B, 0);
                const std::string bad = test::agree(*w, v, "xnc ag " + label("", t, n) + (in_place ? " ip" : ""));
                ASSERT_EQ(bad, "") << label("all_gather", t, n) << (in_place ? " in place" : "");
            }
        }
}

TEST_F(CrossNodeCollectives, ReduceScatterIsExact) {
    const int W = w->world_size(), me = w->rank();
    for (DType t : {DType::F32, DType::BF16, DType::F16})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max})
            for (std::size_t n : kCounts) {
                if (op == ReduceOp::Max && (n > 65537 || t != DType::F32)) continue;  // fewer kernels to compile
                const std::size_t es = dtype_size(t);
                Sym in(*w, W * n * es), out(*w, n * es);
                upload(in.as(), reduce_input(t, me, W * n, 0));
                LOOM_CHECK_CUDA(cudaMemset(out.as(), 0xFF, n * es));
                sync_all("xnc rs in");
                CollOptions opts;
                opts.op = op;
                reduce_scatter(*w, BufferView{in.as(), t, W * n}, BufferView{out.as(), t, n}, stream, opts);
                ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
                const std::string v = check_reduced(download(out.as(), n * es), t, op, W, me * n, n, 0);
                const std::string bad = test::agree(*w, v, "xnc rs " + label("", t, n) + std::to_string(int(op)));
                ASSERT_EQ(bad, "") << label("reduce_scatter", t, n) << (op == ReduceOp::Max ? " max" : " sum");
            }
}

TEST_F(CrossNodeCollectives, ReduceScatterInPlace) {
    const int W = w->world_size(), me = w->rank();
    const DType t = DType::F32;
    const std::size_t n = 4099, es = 4;
    Sym in(*w, W * n * es);
    upload(in.as(), reduce_input(t, me, W * n, 0));
    sync_all("xnc rs ip in");
    const BufferView out{in.as() + me * n * es, t, n};
    reduce_scatter(*w, BufferView{in.as(), t, W * n}, out, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::string v = check_reduced(download(out.data, n * es), t, ReduceOp::Sum, W, me * n, n, 0);
    ASSERT_EQ(test::agree(*w, v, "xnc rs ip"), "");
}

TEST_F(CrossNodeCollectives, AllReduceIsExactAndEqualOnEveryRank) {
    const int me = w->rank(), W = w->world_size();
    const std::size_t counts[] = {1, 2, 7, 1000, 4099, 65537, 1u << 20};
    for (DType t : {DType::F32, DType::BF16, DType::F16})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max})
            for (std::size_t n : counts)
                for (bool in_place : {false, true}) {
                    if (op == ReduceOp::Max && (n > 65537 || t != DType::F32)) continue;  // fewer kernels to compile
                    const std::size_t es = dtype_size(t);
                    Sym in(*w, n * es), out(*w, n * es);
                    upload(in.as(), reduce_input(t, me, n, 0));
                    LOOM_CHECK_CUDA(cudaMemset(out.as(), 0xFF, n * es));
                    sync_all("xnc ar in");
                    CollOptions opts;
                    opts.op = op;
                    char* const dst = in_place ? in.as() : out.as();
                    all_reduce(*w, BufferView{in.as(), t, n}, BufferView{dst, t, n}, stream, opts);
                    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
                    const std::string v = check_reduced(download(dst, n * es), t, op, W, 0, n, 0);
                    const std::string bad = test::agree(
                        *w, v, "xnc ar " + label("", t, n) + std::to_string(int(op)) + (in_place ? "ip" : ""));
                    ASSERT_EQ(bad, "") << label("all_reduce", t, n) << (op == ReduceOp::Max ? " max" : " sum")
                                       << (in_place ? " in place" : "");
                }
}

TEST_F(CrossNodeCollectives, AllToAllDeliversEveryBlock) {
    const int W = w->world_size(), me = w->rank();
    for (DType t : {DType::F32, DType::BF16, DType::U8, DType::I64})
        for (std::size_t n : kCounts) {
            if (n == (1u << 20) && t == DType::I64) continue;  // 8 MiB per peer block: 64 MiB x 2 per rank at 8
            const std::size_t B = n * dtype_size(t);
            Sym in(*w, W * B), out(*w, W * B);
            upload(in.as(), move_input(me, W * B, 0));
            LOOM_CHECK_CUDA(cudaMemset(out.as(), 0x5A, W * B));
            sync_all("xnc a2a in");
            all_to_all(*w, BufferView{in.as(), t, W * n}, BufferView{out.as(), t, W * n}, stream);
            ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
            const std::string v = check_all_to_all(download(out.as(), W * B), W, me, B, 0);
            ASSERT_EQ(test::agree(*w, v, "xnc a2a " + label("", t, n)), "") << label("all_to_all", t, n);
        }
}

// 100 calls back to back on one stream, with no host synchronisation between them, reusing the same in and out: each
// call's input is copied into in on the stream first and its out copied aside after it (both stream-ordered), so a
// peer that raced ahead into the next call would corrupt what is checked.
constexpr int kRounds = 100;

TEST_F(CrossNodeCollectives, HundredBackToBackCallsOfEveryOp) {
    const int W = w->world_size(), me = w->rank();
    const std::size_t n = 4099;  // per rank: not a multiple of 16 bytes or of the ranks per node
    std::string verdict;
    // all_gather: u8 data, in place and out of place alternating
    {
        const std::size_t B = n;
        Sym inputs(*w, kRounds * B), in(*w, B), out(*w, W * B), hist(*w, kRounds * W * B);
        std::vector<char> all;
        for (int k = 0; k < kRounds; ++k) {
            const auto x = move_input(me, B, k);
            all.insert(all.end(), x.begin(), x.end());
        }
        upload(inputs.as(), all);
        sync_all("xnc b2b ag");
        for (int k = 0; k < kRounds; ++k) {
            char* const src = k % 2 ? out.as() + me * B : in.as();
            LOOM_CHECK_CUDA(cudaMemcpyAsync(src, inputs.as() + k * B, B, cudaMemcpyDeviceToDevice, stream));
            all_gather(*w, BufferView{src, DType::U8, n}, BufferView{out.as(), DType::U8, W * n}, stream);
            LOOM_CHECK_CUDA(cudaMemcpyAsync(hist.as() + k * W * B, out.as(), W * B, cudaMemcpyDeviceToDevice, stream));
        }
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        const auto h = download(hist.as(), kRounds * W * B);
        for (int k = 0; k < kRounds && verdict.empty(); ++k) {
            const std::string v =
                check_all_gather(std::vector<char>(h.begin() + k * W * B, h.begin() + (k + 1) * W * B), W, B, k);
            if (!v.empty()) verdict = "all_gather call " + std::to_string(k) + ": " + v;
        }
    }
    ASSERT_EQ(test::agree(*w, verdict, "xnc b2b ag v"), "");
    // reduce_scatter and all_reduce: f32 sums
    for (int which = 0; which < 2; ++which) {
        const bool rs = which == 0;
        const std::size_t in_n = rs ? W * n : n, out_n = n;
        Sym inputs(*w, kRounds * in_n * 4), in(*w, in_n * 4), out(*w, out_n * 4), hist(*w, kRounds * out_n * 4);
        std::vector<char> all;
        for (int k = 0; k < kRounds; ++k) {
            const auto x = reduce_input(DType::F32, me, in_n, k);
            all.insert(all.end(), x.begin(), x.end());
        }
        upload(inputs.as(), all);
        sync_all("xnc b2b red");
        for (int k = 0; k < kRounds; ++k) {
            LOOM_CHECK_CUDA(
                cudaMemcpyAsync(in.as(), inputs.as() + k * in_n * 4, in_n * 4, cudaMemcpyDeviceToDevice, stream));
            const BufferView i{in.as(), DType::F32, in_n}, o{out.as(), DType::F32, out_n};
            if (rs)
                reduce_scatter(*w, i, o, stream);
            else
                all_reduce(*w, i, o, stream);
            LOOM_CHECK_CUDA(
                cudaMemcpyAsync(hist.as() + k * out_n * 4, out.as(), out_n * 4, cudaMemcpyDeviceToDevice, stream));
        }
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        const auto h = download(hist.as(), kRounds * out_n * 4);
        for (int k = 0; k < kRounds && verdict.empty(); ++k) {
            const std::string v =
                check_reduced(std::vector<char>(h.begin() + k * out_n * 4, h.begin() + (k + 1) * out_n * 4), DType::F32,
                              ReduceOp::Sum, W, rs ? me * n : 0, out_n, k);
            if (!v.empty())
                verdict = std::string(rs ? "reduce_scatter" : "all_reduce") + " call " + std::to_string(k) + ": " + v;
        }
        ASSERT_EQ(test::agree(*w, verdict, std::string("xnc b2b red v") + (rs ? "rs" : "ar")), "");
    }
    // all_to_all: u8 blocks
    {
        const std::size_t B = n;
        Sym inputs(*w, kRounds * W * B), in(*w, W * B), out(*w, W * B), hist(*w, kRounds * W * B);
        std::vector<char> all;
        for (int k = 0; k < kRounds; ++k) {
            const auto x = move_input(me, W * B, k);
            all.insert(all.end(), x.begin(), x.end());
        }
        upload(inputs.as(), all);
        sync_all("xnc b2b a2a");
        for (int k = 0; k < kRounds; ++k) {
            LOOM_CHECK_CUDA(cudaMemcpyAsync(in.as(), inputs.as() + k * W * B, W * B, cudaMemcpyDeviceToDevice, stream));
            all_to_all(*w, BufferView{in.as(), DType::U8, W * n}, BufferView{out.as(), DType::U8, W * n}, stream);
            LOOM_CHECK_CUDA(cudaMemcpyAsync(hist.as() + k * W * B, out.as(), W * B, cudaMemcpyDeviceToDevice, stream));
        }
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        const auto h = download(hist.as(), kRounds * W * B);
        for (int k = 0; k < kRounds && verdict.empty(); ++k) {
            const std::string v =
                check_all_to_all(std::vector<char>(h.begin() + k * W * B, h.begin() + (k + 1) * W * B), W, me, B, k);
            if (!v.empty()) verdict = "all_to_all call " + std::to_string(k) + ": " + v;
        }
    }
    ASSERT_EQ(test::agree(*w, verdict, "xnc b2b a2a v"), "");
}

// What the hierarchical forms cannot take raises on every rank before anything is launched, naming it.
TEST_F(CrossNodeCollectives, RejectsWhatTheHierarchicalFormsCannotTake) {
    const int W = w->world_size();
    const std::size_t n = 256;
    Sym sym(*w, W * n * 4);
    void* plain = nullptr;
    ASSERT_EQ(cudaMalloc(&plain, W * n * 4), cudaSuccess);
    const auto message = [](auto&& f) -> std::string {
        try {
            f();
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    };
    const BufferView in{sym.as(), DType::F32, n}, out_plain{plain, DType::F32, W * n};
    const std::string a = message([&] { all_gather(*w, in, out_plain, stream); });
    EXPECT_NE(a.find("the hierarchical algorithm needs it there"), std::string::npos) << a;
    CollOptions ring;
    ring.algo = CollAlgo::Ring;
    // In place (in == out + rank x in.count), so that the options are what is refused.
    const BufferView in_place{sym.as() + w->rank() * n * 4, DType::F32, n};
    const std::string b = message([&] {
        all_gather(*w, in_place, BufferView{sym.as(), DType::F32, W * n}, stream, ring);
    });
    EXPECT_NE(b.find("expected CollOptions::algo auto in a World of several nodes"), std::string::npos) << b;
    const std::string c = message([&] { barrier_on_stream(*w, stream); });
    EXPECT_NE(c.find("barrier_on_stream runs within one node only"), std::string::npos) << c;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(plain);
    w->barrier("xnc rejects");
}

}  // namespace
}  // namespace loom
