// all_to_all_v in a World of several nodes (its hierarchical form, src/ops/collectives/hier/), on one machine through
// the emulated multi-node mode (docs/crossnode.md). Skipped in a one-node World.
//
// Run (the suite alone; its two kernels compile once, ~20 s each with nvcc on first use):
//   LOOM_NODE_SIZE=2 build/bin/loomrun -n 4 build/tests/loom_dist_tests --gtest_filter='CrossNodeAllToAllV.*'  # 2x2
//   LOOM_NODE_SIZE=4 build/bin/loomrun -n 8 build/tests/loom_dist_tests --gtest_filter='CrossNodeAllToAllV.*'  # 2x4
//   LOOM_NODE_SIZE=2 build/bin/loomrun -n 8 build/tests/loom_dist_tests --gtest_filter='CrossNodeAllToAllV.*'  # 4x2
//   LOOM_NODE_SIZE=1 build/bin/loomrun -n 3 build/tests/loom_dist_tests --gtest_filter='CrossNodeAllToAllV.*'  # 3x1
//
// Every rank computes the whole counts matrix from a seed, so every rank knows what every other sends; each rank checks
// its whole out element by element (bitwise: the blocks in sender order, then the poison past them), and its
// recv_counts. Verdicts are gathered from all ranks (test::agree) before they are asserted, so ranks fail together.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/device_io.hpp"
#include "common/symmetric.hpp"
#include "common/test_env.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/runtime/error.hpp"

namespace loom {
namespace {

using test::Sym;

class CrossNodeAllToAllV : public ::MultiNodeTest {};

using Matrix = std::vector<std::vector<std::int64_t>>;  // [s][j]: elements rank s sends to rank j

// The shapes of counts the tests draw.
enum class Shape {
    Tiny,     // 0, 1 or 2 elements per block
    Uneven,   // 0 .. 5000, a quarter of the blocks empty
    Large,    // 0 .. 300 000 (f32 blocks of up to 1.2 MB: several blocks of the grid per peer)
    AllZero,  // nothing moves
    OnePair,  // only rank 0 sends, only to the last rank (on another node)
    OneEach,  // every block 1 element
};

Matrix draw(Shape shape, int W, std::uint64_t seed) {
    Matrix c(W, std::vector<std::int64_t>(W, 0));
    std::uint64_t x = 0x9E3779B97F4A7C15ull ^ (seed * 0xD1B54A32D192ED03ull);
    const auto next = [&] {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        return x;
    };
    for (int s = 0; s < W; ++s)
        for (int j = 0; j < W; ++j) {
            const std::uint64_t r = next();
            switch (shape) {
                case Shape::Tiny:
                    c[s][j] = static_cast<std::int64_t>(r % 3);
                    break;
                case Shape::Uneven:
                    c[s][j] = r % 4 == 0 ? 0 : static_cast<std::int64_t>((r >> 8) % 5001);
                    break;
                case Shape::Large:
                    c[s][j] = static_cast<std::int64_t>((r >> 8) % 300001);
                    break;
                case Shape::AllZero:
                    break;
                case Shape::OnePair:
                    c[s][j] = s == 0 && j == W - 1 ? 777 : 0;
                    break;
                case Shape::OneEach:
                    c[s][j] = 1;
                    break;
            }
        }
    return c;
}

std::int64_t sent_by(const Matrix& c, int s) {
    std::int64_t a = 0;
    for (std::int64_t v : c[s]) a += v;
    return a;
}
std::int64_t received_by(const Matrix& c, int j) {
    std::int64_t a = 0;
    for (const auto& row : c) a += row[j];
    return a;
}

// Where rank s keeps its block for rank j in its in: packed in rank order, or (offsets) in reverse rank order with a
// gap of 3 elements before each block, so the layout differs from the packed one.
std::int64_t src_offset(const Matrix& c, int s, int j, bool offsets) {
    std::int64_t a = 0;
    for (int k = 0; k < static_cast<int>(c.size()); ++k)
        if (offsets ? k > j : k < j) a += c[s][k] + (offsets ? 3 : 0);
    return a + (offsets ? 3 : 0);
}
// Elements of rank s's in.
std::int64_t in_count(const Matrix& c, int s, bool offsets) {
    return sent_by(c, s) + (offsets ? 3 * static_cast<std::int64_t>(c.size()) : 0) + 1;
}

// Byte b of rank s's in (call k): distinct per rank, position and call.
char pattern(int s, std::size_t b, int k) {
    return static_cast<char>((s * 97 + b * 31 + k * 7 + (b >> 8) * 3 + (b >> 16) * 5 + 1) & 0xff);
}
std::vector<char> input(int s, std::size_t bytes, int k) {
    std::vector<char> v(bytes);
    for (std::size_t b = 0; b < bytes; ++b) v[b] = pattern(s, b, k);
    return v;
}
std::vector<char> as_bytes(const std::vector<std::int64_t>& v) {
    std::vector<char> b(v.size() * 8);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}
std::vector<std::int64_t> as_int64(const std::vector<char>& b) {
    std::vector<std::int64_t> v(b.size() / 8);
    std::memcpy(v.data(), b.data(), v.size() * 8);
    return v;
}

constexpr unsigned char kOutPoison = 0xA5;
constexpr std::int64_t kRecvPoison = -12345;

// Rank me's out (cap elements of es bytes) and recv_counts after a call with counts c (call k): the blocks of ranks
// 0..W-1 packed in rank order, each equal to the sender's in at its offset for me, every element after them poison.
std::string check_out(const Matrix& c, int me, const std::vector<char>& out, const std::vector<std::int64_t>& rc,
                      std::size_t es, bool offsets, int k) {
    const int W = static_cast<int>(c.size());
    for (int s = 0; s < W; ++s)
        if (rc[s] != c[s][me])
            return "recv_counts[" + std::to_string(s) + "] = " + std::to_string(rc[s]) + ", expected " +
                   std::to_string(c[s][me]);
    std::size_t at = 0;  // bytes
    for (int s = 0; s < W; ++s) {
        const std::size_t src = static_cast<std::size_t>(src_offset(c, s, me, offsets)) * es;
        const std::size_t n = static_cast<std::size_t>(c[s][me]) * es;
        for (std::size_t b = 0; b < n; ++b)
            if (out[at + b] != pattern(s, src + b, k))
                return "block from rank " + std::to_string(s) + " (" + std::to_string(c[s][me]) +
                       " elements): element " + std::to_string(b / es) + " byte " + std::to_string(b % es) +
                       " is wrong";
        at += n;
    }
    for (std::size_t b = at; b < out.size(); ++b)
        if (static_cast<unsigned char>(out[b]) != kOutPoison)
            return "byte " + std::to_string(b) + " past the " + std::to_string(at / es) +
                   " received elements was written";
    return "";
}

std::string label(Shape shape, DType t, bool offsets, int trial) {
    static const char* kNames[] = {"tiny", "uneven", "large", "all zero", "one pair", "one each"};
    return std::string(kNames[static_cast<int>(shape)]) + " " + dtype_name(t) + (offsets ? " offsets" : " packed") +
           " trial " + std::to_string(trial);
}

// One call with counts `c` (in and out symmetric; counts, offsets and recv_counts plain device memory or symmetric),
// checked on every rank.
std::string run_one(World& w, cudaStream_t stream, const Matrix& c, DType t, bool offsets, bool sym_args, int trial,
                    const CollOptions& opts = {}) {
    const int W = w.world_size(), me = w.rank();
    const std::size_t es = dtype_size(t);
    std::int64_t max_in = 0, max_recv = 0;
    for (int s = 0; s < W; ++s) max_in = std::max(max_in, in_count(c, s, offsets));
    for (int j = 0; j < W; ++j) max_recv = std::max(max_recv, received_by(c, j));
    const std::size_t cap = static_cast<std::size_t>(max_recv) + 5;  // the same on every rank
    const std::size_t n_in = static_cast<std::size_t>(in_count(c, me, offsets));
    // Symmetric allocations are collective and equal on every rank: in is sized for the largest sender.
    Sym in(w, static_cast<std::size_t>(max_in) * es), out(w, cap * es), args(w, 3 * W * 8);
    std::int64_t* plain = nullptr;
    if (!sym_args) test::cuda_or_die(cudaMalloc(reinterpret_cast<void**>(&plain), 3 * W * 8), "cudaMalloc");
    std::int64_t* const a = sym_args ? args.as<std::int64_t>() : plain;
    std::vector<std::int64_t> offs(W);
    for (int j = 0; j < W; ++j) offs[j] = src_offset(c, me, j, offsets);
    test::upload(in.as(), input(me, n_in * es, trial));
    test::upload(a, as_bytes(c[me]));
    test::upload(a + W, as_bytes(offs));
    test::upload(a + 2 * W, as_bytes(std::vector<std::int64_t>(W, kRecvPoison)));
    test::cuda_or_die(cudaMemset(out.as(), kOutPoison, cap * es), "poison");
    test::cuda_or_die(cudaDeviceSynchronize(), "sync");
    w.barrier("xn a2av in");
    all_to_all_v(w, BufferView{in.as(), t, n_in}, BufferView{out.as(), t, cap}, a, offsets ? a + W : nullptr, a + 2 * W,
                 stream, opts);
    test::sync_or_die(stream);
    const std::string v = check_out(c, me, test::download(out.as(), cap * es),
                                    as_int64(test::download(a + 2 * W, W * 8)), es, offsets, trial);
    if (plain) cudaFree(plain);
    return v;
}

TEST_F(CrossNodeAllToAllV, RandomUnevenCountsReachEveryRank) {
    struct Case {
        Shape shape;
        DType t;
        bool offsets, sym_args;
    };
    // One element size per case: the kernels move bytes, so every dtype runs the same two kernels.
    const Case cases[] = {
        {Shape::Tiny, DType::F32, false, false},    {Shape::Tiny, DType::U8, true, true},
        {Shape::OneEach, DType::I64, false, true},  {Shape::OneEach, DType::BF16, true, false},
        {Shape::Uneven, DType::F32, false, false},  {Shape::Uneven, DType::F32, true, true},
        {Shape::Uneven, DType::U8, false, true},    {Shape::Uneven, DType::I64, true, false},
        {Shape::Large, DType::F32, false, false},   {Shape::Large, DType::BF16, true, true},
        {Shape::AllZero, DType::F32, false, false}, {Shape::OnePair, DType::U8, true, false},
    };
    int trial = 0;
    for (const Case& k : cases)
        for (int rep = 0; rep < 2; ++rep, ++trial) {
            const Matrix c = draw(k.shape, w->world_size(), 1000 + trial);
            const std::string what = label(k.shape, k.t, k.offsets, trial);
            const std::string v = run_one(*w, stream, c, k.t, k.offsets, k.sym_args, trial);
            ASSERT_EQ(test::agree(*w, v, "xn a2av " + what), "") << what;
        }
}

// CollOptions the hierarchical form takes: path ldst, and a block budget (1 block: every peer's block moved by one).
TEST_F(CrossNodeAllToAllV, OptionsItTakes) {
    CollOptions ldst;
    ldst.path = DataPath::LdSt;
    CollOptions one_sm;
    one_sm.num_sms = 1;
    int trial = 0;
    for (const CollOptions& o : {ldst, one_sm}) {
        const Matrix c = draw(Shape::Large, w->world_size(), 77 + trial);
        const std::string v = run_one(*w, stream, c, DType::F32, trial == 1, false, trial, o);
        ASSERT_EQ(test::agree(*w, v, "xn a2av opts " + std::to_string(trial)), "") << "options case " << trial;
        ++trial;
    }
}

// 50 calls back to back on one stream with different counts each, no host synchronisation between them: the counts
// of call k are read from device memory (one plain array holding every call's), in is refilled on the stream before
// each call and out and recv_counts copied aside after it, so a rank that raced ahead into the next call would
// corrupt what is checked.
TEST_F(CrossNodeAllToAllV, BackToBackCallsWithCountsChangingOnTheDevice) {
    constexpr int kCalls = 50;
    const int W = w->world_size(), me = w->rank();
    std::vector<Matrix> cs;
    for (int k = 0; k < kCalls; ++k) cs.push_back(draw(k % 3 == 0 ? Shape::Tiny : Shape::Uneven, W, 5000 + k));
    std::int64_t max_in = 0, max_recv = 0;
    for (const Matrix& c : cs)
        for (int r = 0; r < W; ++r) {
            max_in = std::max(max_in, in_count(c, r, false));
            max_recv = std::max(max_recv, received_by(c, r));
        }
    const std::size_t es = 4, cap = static_cast<std::size_t>(max_recv) + 5, in_bytes = max_in * es;
    Sym inputs(*w, kCalls * in_bytes), in(*w, in_bytes), out(*w, cap * es), out_hist(*w, kCalls * cap * es);
    std::int64_t *counts = nullptr, *rc_hist = nullptr;
    test::cuda_or_die(cudaMalloc(reinterpret_cast<void**>(&counts), kCalls * W * 8), "cudaMalloc");
    test::cuda_or_die(cudaMalloc(reinterpret_cast<void**>(&rc_hist), kCalls * W * 8), "cudaMalloc");
    std::vector<char> all_in, all_counts;
    for (int k = 0; k < kCalls; ++k) {
        const auto x = input(me, in_bytes, k);
        all_in.insert(all_in.end(), x.begin(), x.end());
        const auto b = as_bytes(cs[k][me]);
        all_counts.insert(all_counts.end(), b.begin(), b.end());
    }
    test::upload(inputs.as(), all_in);
    test::upload(counts, all_counts);
    sync_all("xn a2av b2b");
    for (int k = 0; k < kCalls; ++k) {
        LOOM_CHECK_CUDA(
            cudaMemcpyAsync(in.as(), inputs.as() + k * in_bytes, in_bytes, cudaMemcpyDeviceToDevice, stream));
        LOOM_CHECK_CUDA(cudaMemsetAsync(out.as(), kOutPoison, cap * es, stream));
        all_to_all_v(*w, BufferView{in.as(), DType::F32, static_cast<std::size_t>(in_count(cs[k], me, false))},
                     BufferView{out.as(), DType::F32, cap}, counts + k * W, nullptr, rc_hist + k * W, stream);
        LOOM_CHECK_CUDA(
            cudaMemcpyAsync(out_hist.as() + k * cap * es, out.as(), cap * es, cudaMemcpyDeviceToDevice, stream));
    }
    test::sync_or_die(stream);
    const auto h = test::download(out_hist.as(), kCalls * cap * es);
    const auto rc = as_int64(test::download(rc_hist, kCalls * W * 8));
    std::string verdict;
    for (int k = 0; k < kCalls && verdict.empty(); ++k) {
        const std::string v =
            check_out(cs[k], me, std::vector<char>(h.begin() + k * cap * es, h.begin() + (k + 1) * cap * es),
                      std::vector<std::int64_t>(rc.begin() + k * W, rc.begin() + (k + 1) * W), es, false, k);
        if (!v.empty()) verdict = "call " + std::to_string(k) + ": " + v;
    }
    cudaFree(counts);
    cudaFree(rc_hist);
    ASSERT_EQ(test::agree(*w, verdict, "xn a2av b2b v"), "");
}

// Captured once in a CUDA graph (after one eager call, which creates the state and loads the kernels), then replayed
// with other counts and inputs written into the same device arrays: the graph reads them at replay.
TEST_F(CrossNodeAllToAllV, CapturedInACudaGraphReadsTheCountsAtReplay) {
    const int W = w->world_size(), me = w->rank();
    constexpr int kReplays = 3;
    std::vector<Matrix> cs;
    for (int k = 0; k <= kReplays; ++k) cs.push_back(draw(Shape::Uneven, W, 9000 + k));
    std::int64_t max_in = 0, max_recv = 0;
    for (const Matrix& c : cs)
        for (int r = 0; r < W; ++r) {
            max_in = std::max(max_in, in_count(c, r, true));
            max_recv = std::max(max_recv, received_by(c, r));
        }
    const std::size_t es = 4, cap = static_cast<std::size_t>(max_recv) + 5;
    Sym in(*w, max_in * es), out(*w, cap * es), args(*w, 3 * W * 8);
    std::int64_t* const a = args.as<std::int64_t>();
    // in.count is a host argument the graph keeps: the largest sender's, on every rank.
    const BufferView iv{in.as(), DType::F32, static_cast<std::size_t>(max_in)}, ov{out.as(), DType::F32, cap};
    const auto prepare = [&](int k) {
        std::vector<std::int64_t> offs(W);
        for (int j = 0; j < W; ++j) offs[j] = src_offset(cs[k], me, j, true);
        test::upload(in.as(), input(me, max_in * es, k));
        test::upload(a, as_bytes(cs[k][me]));
        test::upload(a + W, as_bytes(offs));
        test::upload(a + 2 * W, as_bytes(std::vector<std::int64_t>(W, kRecvPoison)));
        test::cuda_or_die(cudaMemset(out.as(), kOutPoison, cap * es), "poison");
        sync_all("xn a2av graph " + std::to_string(k));
    };
    const auto verdict = [&](int k) {
        return check_out(cs[k], me, test::download(out.as(), cap * es), as_int64(test::download(a + 2 * W, W * 8)), es,
                         true, k);
    };
    prepare(0);
    all_to_all_v(*w, iv, ov, a, a + W, a + 2 * W, stream);  // eager: state and kernels
    test::sync_or_die(stream);
    ASSERT_EQ(test::agree(*w, verdict(0), "xn a2av graph eager"), "");
    w->barrier("xn a2av graph capture");
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    all_to_all_v(*w, iv, ov, a, a + W, a + 2 * W, stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    cudaGraphDestroy(graph);
    for (int k = 1; k <= kReplays; ++k) {
        prepare(k);
        ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
        test::sync_or_die(stream);
        ASSERT_EQ(test::agree(*w, verdict(k), "xn a2av graph " + std::to_string(k)), "") << "replay " << k;
    }
    cudaGraphExecDestroy(exec);
}

// What all_to_all_v cannot take across nodes raises on every rank before anything is launched, naming it; the World
// is still usable afterwards.
TEST_F(CrossNodeAllToAllV, RejectsBadInputsOnEveryRank) {
    const int W = w->world_size();
    const std::size_t n = 64;
    Sym in(*w, W * n * 4), out(*w, W * n * 4), cnt(*w, W * 8);
    void* plain = nullptr;
    ASSERT_EQ(cudaMalloc(&plain, W * n * 4), cudaSuccess);
    test::upload(cnt.as(), as_bytes(std::vector<std::int64_t>(W, 1)));
    const std::int64_t* const c = cnt.as<std::int64_t>();
    const auto message = [](auto&& f) -> std::string {
        try {
            f();
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    };
    const BufferView i{in.as(), DType::F32, W * n}, o{out.as(), DType::F32, W * n};
    const BufferView i_plain{plain, DType::F32, W * n}, o_plain{plain, DType::F32, W * n};
    std::string e = message([&] { all_to_all_v(*w, i, o_plain, c, nullptr, nullptr, stream); });
    EXPECT_NE(e.find("out ("), std::string::npos) << e;
    EXPECT_NE(e.find("the hierarchical algorithm needs it there"), std::string::npos) << e;
    e = message([&] { all_to_all_v(*w, i_plain, o, c, nullptr, nullptr, stream); });
    EXPECT_NE(e.find("in ("), std::string::npos) << e;
    EXPECT_NE(e.find("the hierarchical algorithm needs it there"), std::string::npos) << e;
    CollOptions pull;
    pull.algo = CollAlgo::Pull;
    e = message([&] { all_to_all_v(*w, i, o, c, nullptr, nullptr, stream, pull); });
    EXPECT_NE(e.find("expected CollOptions::algo auto in a World of several nodes"), std::string::npos) << e;
    CollOptions tma;
    tma.path = DataPath::Tma;
    e = message([&] { all_to_all_v(*w, i, o, c, nullptr, nullptr, stream, tma); });
    EXPECT_NE(e.find("expected CollOptions::path auto or ldst"), std::string::npos) << e;
    e = message([&] { all_to_all_v(*w, i, o, nullptr, nullptr, nullptr, stream); });
    EXPECT_NE(e.find("expected send_counts (device int64[" + std::to_string(W) + "]), given nullptr"),
              std::string::npos)
        << e;
    e = message([&] { all_to_all_v(*w, i, BufferView{in.as() + 4, DType::F32, n}, c, nullptr, nullptr, stream); });
    EXPECT_NE(e.find("in and out overlap"), std::string::npos) << e;
    // Counts read back in checking mode (on in the tests): a block past the sender's in, and more than out holds.
    {
        std::vector<std::int64_t> bad(W, 0);
        bad[W - 1] = 17;  // rank 0 sends 17 of its 16 elements to the last rank (on another node)
        Sym bc(*w, W * 8);
        test::upload(bc.as(), as_bytes(w->rank() == 0 ? bad : std::vector<std::int64_t>(W, 0)));
        e = message([&] {
            all_to_all_v(*w, BufferView{in.as(), DType::F32, 16}, o, bc.as<std::int64_t>(), nullptr, nullptr, stream);
        });
        EXPECT_NE(e.find("rank 0's block for rank " + std::to_string(W - 1) + " lies outside its in"),
                  std::string::npos)
            << e;
        EXPECT_NE(e.find("> in.count = 16"), std::string::npos) << e;
        test::upload(bc.as(), as_bytes(std::vector<std::int64_t>(W, 2)));  // every rank sends 2 to each: 2W each
        e = message([&] {
            all_to_all_v(*w, i, BufferView{out.as(), DType::F32, static_cast<std::size_t>(2 * W - 1)},
                         bc.as<std::int64_t>(), nullptr, nullptr, stream);
        });
        EXPECT_NE(e.find("receives more than out.count = " + std::to_string(2 * W - 1) + " elements"),
                  std::string::npos)
            << e;
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(plain);
    w->barrier("xn a2av rejects");
    // Nothing was launched by the errors: a good call still runs.
    const Matrix m = draw(Shape::Tiny, W, 4242);
    ASSERT_EQ(test::agree(*w, run_one(*w, stream, m, DType::F32, false, false, 0), "xn a2av after errors"), "");
}

}  // namespace
}  // namespace loom
