// ep_dispatch / ep_combine (throughput mode) at any world size against host references built by every rank for every
// rank (shared seeds; x from a hash of (rank, token, column)): the receive layout (offsets, every row bitwise) and the
// combine with identity experts (expert_out recv_x itself, a cudaMalloc copy, by rank either, or a strided heap copy)
// bitwise against ep_combine_reference's emulation of its arithmetic; routings uniform, skewed, one expert, every slot
// of a token on one rank, unused slots (-1), a rank with no tokens, tokens per rank that differ; T 1..8192, H 2048 /
// 7168, k 1..8, E up to 256; fixed and auto capacity; capacity overflow (ep_check raises on every rank, later calls
// work); CUDA graph replay with new routings between replays; an EP layer with loom::grouped_gemm against an fp64
// reference; ep_moe_experts Overlapped against Sequential bitwise and against the fp64 reference; bad inputs naming the
// argument. Run: loomrun -n N build/tests/loom_dist_tests --gtest_filter='MoeEp*'   (N = 2, 4, 8); across emulated
// nodes with LOOM_NODE_SIZE=2 (or 4): every rank of another node is then reached through NVSHMEM.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/device_io.hpp"
#include "common/ep_reference.hpp"
#include "common/moe_reference.hpp"
#include "common/reference.hpp"
#include "common/test_env.hpp"
#include "loom/bf16.hpp"
#include "loom/ops/moe.hpp"
#include "loom/ops/moe_ep.hpp"
#include "loom/runtime/error.hpp"

namespace loom {
namespace {

class MoeEp : public ::WorldStreamTest {
  protected:
    void TearDown() override {
        if (w) release_moe_ep_state(*w);
        WorldStreamTest::TearDown();
    }
};

struct Dev {
    void* p = nullptr;
    std::size_t bytes = 0;
    explicit Dev(std::size_t b) : bytes(std::max<std::size_t>(b, 256)) {
        LOOM_CHECK_CUDA(cudaMalloc(&p, bytes));
        LOOM_CHECK_CUDA(cudaMemset(p, 0xA5, bytes));  // poison
    }
    ~Dev() { cudaFree(p); }
    template <class T>
    T* as() const {
        return static_cast<T*>(p);
    }
};

// Token t of rank r, column c: a bf16 value in [-2, 2) from a hash (no rank stores the others' x).
float xval(int r, int64_t t, int64_t c) {
    uint64_t h = (static_cast<uint64_t>(r) << 48) ^ (static_cast<uint64_t>(t) << 20) ^ static_cast<uint64_t>(c);
    h ^= h >> 33, h *= 0xff51afd7ed558ccdull, h ^= h >> 33, h *= 0xc4ceb9fe1a85ec53ull, h ^= h >> 33;
    return bf16_to_float(float_to_bf16(static_cast<float>(static_cast<int64_t>(h % 4096) - 2048) / 1024.f));
}

enum class Kind { Uniform, Skewed, OneExpert, OneRank, Holes };

// Rank r's topk_idx [T, k]: Uniform / Skewed / OneExpert from test::make_routing; OneRank: every slot of a token on
// experts of one rank (distinct while the rank has enough, then -1); Holes: uniform with a quarter of the slots -1 and
// every 7th token with none.
std::vector<int32_t> routing(Kind kind, int64_t T, int k, int E, int W, uint64_t seed) {
    const int t = static_cast<int>(T);
    switch (kind) {
        case Kind::Uniform:
            return test::make_routing(test::RoutingKind::Uniform, t, k, E, seed);
        case Kind::Skewed:
            return test::make_routing(test::RoutingKind::Skewed, t, k, E, seed);
        case Kind::OneExpert:
            return test::make_routing(test::RoutingKind::OneExpert, t, k, E, seed);
        default:
            break;
    }
    std::vector<int32_t> idx = test::make_routing(test::RoutingKind::Uniform, t, k, E, seed);
    std::mt19937_64 rng(test::run_seed(seed + 99));
    const int L = E / W;
    for (int64_t i = 0; i < T; ++i) {
        if (kind == Kind::OneRank) {
            const int d = static_cast<int>(rng() % W);
            std::vector<int32_t> ex(L);
            for (int l = 0; l < L; ++l) ex[l] = d * L + l;
            std::shuffle(ex.begin(), ex.end(), rng);
            for (int s = 0; s < k; ++s) idx[i * k + s] = s < L ? ex[s] : -1;
        } else {
            for (int s = 0; s < k; ++s)
                if (i % 7 == 3 || rng() % 4 == 0) idx[i * k + s] = -1;
        }
    }
    return idx;
}

struct Case {
    int64_t T;
    int H, k, E;
    Kind kind;
    bool empty_rank = false;  // rank 1 has no tokens
    bool fixed = false;       // capacity: the exact need (else auto)
};

int64_t tokens_of(const Case& c, int r) {
    if (c.empty_rank && r == 1) return 0;
    return c.T > 3 ? c.T - r % 3 : c.T;  // ranks' token counts differ
}

// One case's inputs on this rank and the references of every rank's layout.
struct EpRun {
    Case c;
    int W, me;
    std::vector<std::vector<int32_t>> idx;  // every rank's
    std::vector<float> wts;                 // this rank's
    test::EpLayoutRef ref;
    std::unique_ptr<Dev> d_x, d_idx, d_w;
    MatrixView xv;

    EpRun(World& w, const Case& cs, uint64_t seed) : c(cs), W(w.world_size()), me(w.rank()) {
        for (int r = 0; r < W; ++r) idx.push_back(routing(c.kind, tokens_of(c, r), c.k, c.E, W, seed + 17 * r));
        const int64_t T = tokens_of(c, me);
        wts = test::make_topk_weights(static_cast<int>(T), c.k, seed + 1000 + me);
        ref = test::ep_layout_reference(idx, c.k, c.E, W);
        std::vector<uint16_t> x(static_cast<std::size_t>(T * c.H));
        for (int64_t t = 0; t < T; ++t)
            for (int64_t col = 0; col < c.H; ++col) x[t * c.H + col] = float_to_bf16(xval(me, t, col));
        d_x = std::make_unique<Dev>(x.size() * 2);
        d_idx = std::make_unique<Dev>(idx[me].size() * 4);
        d_w = std::make_unique<Dev>(wts.size() * 4);
        upload(x, idx[me], wts);
        xv = MatrixView{d_x->p, DType::BF16, T, c.H, 0};
    }
    void upload(const std::vector<uint16_t>& x, const std::vector<int32_t>& i, const std::vector<float>& wv) {
        test::upload(d_x->p, x);
        test::upload(d_idx->p, i);
        test::upload(d_w->p, wv);
    }
    EpOptions opts() const {
        EpOptions o;
        if (c.fixed) o.capacity = std::max<int64_t>(ref.max_rows, 1);
        return o;
    }
    std::string what() const {
        return "T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) + " k=" + std::to_string(c.k) +
               " E=" + std::to_string(c.E) + " kind=" + std::to_string(static_cast<int>(c.kind));
    }

    // The receive layout: offsets and every received row, bitwise. Returns the first mismatch ("" when none).
    std::string check_layout(const EpHandle& h) const {
        const int L = c.E / W;
        std::vector<int32_t> off(L + 1);
        LOOM_CHECK_CUDA(cudaMemcpy(off.data(), h.recv_offsets, off.size() * 4, cudaMemcpyDeviceToHost));
        if (off != ref.offsets[me]) return "recv_offsets differ from the reference";
        const int64_t rows = off[L];
        if (rows > h.capacity) return "rows past the capacity";
        std::vector<uint16_t> got(static_cast<std::size_t>(rows * c.H));
        if (rows > 0)
            LOOM_CHECK_CUDA(cudaMemcpy2D(got.data(), c.H * 2, h.recv_x.data, h.recv_x.stride() * 2, c.H * 2, rows,
                                         cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < rows; ++i)
            for (int64_t col = 0; col < c.H; ++col)
                if (got[i * c.H + col] != float_to_bf16(xval(ref.row_src[me][i], ref.row_tok[me][i], col)))
                    return "recv_x row " + std::to_string(i) + " col " + std::to_string(col) + " (source rank " +
                           std::to_string(ref.row_src[me][i]) + " token " + std::to_string(ref.row_tok[me][i]) + ")";
        return "";
    }

    // y of identity experts (expert_out = recv_x), bitwise against the emulation.
    std::string check_identity_y(const void* y) const {
        const int64_t T = tokens_of(c, me);
        const auto want = test::ep_combine_reference(ref, idx[me], wts, me, c.H, [&](int d, int32_t row, int64_t col) {
            return xval(ref.row_src[d][row], ref.row_tok[d][row], col);
        });
        std::vector<uint16_t> got(static_cast<std::size_t>(T * c.H));
        if (T > 0) LOOM_CHECK_CUDA(cudaMemcpy(got.data(), y, got.size() * 2, cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < T * c.H; ++i)
            if (got[i] != float_to_bf16(want[i]))
                return "y token " + std::to_string(i / c.H) + " col " + std::to_string(i % c.H) + ": got " +
                       std::to_string(bf16_to_float(got[i])) + ", expected " + std::to_string(want[i]);
        return "";
    }
};

// Where the identity experts' expert_out lives: recv_x itself (the symmetric heap: the token ranks read one-slot pairs'
// rows in place), a cudaMalloc copy (every pair's partial summed at the expert's rank), per rank by parity, or a heap
// copy whose rows are 64 columns further apart than H.
enum class OutIn { Heap, Device, Mixed, HeapStrided };

// dispatch -> identity experts -> combine, every check; the mismatches of every rank, "" when none.
std::string round_trip(World& w, cudaStream_t stream, const Case& c, uint64_t seed, OutIn out_in = OutIn::Heap) {
    EpRun run(w, c, seed);
    const EpHandle h =
        ep_dispatch(w, run.xv, run.d_idx->as<int32_t>(), run.d_w->as<float>(), c.k, c.E, stream, run.opts());
    std::string err;
    try {
        ep_check(w, h, stream);
    } catch (const Error& e) {
        err = e.what();
    }
    if (err.empty()) err = run.check_layout(h);
    if (err.empty() && ep_dispatch_bytes(w, h, stream) != run.ref.pairs_out[run.me] * c.H * 2)
        err = "ep_dispatch_bytes differs from the reference's pairs x H x 2";
    Dev y(static_cast<std::size_t>(tokens_of(c, run.me) * c.H * 2));
    const bool copy = out_in == OutIn::Device || (out_in == OutIn::Mixed && run.me % 2 == 1);
    const int64_t ld = c.H + 64;  // HeapStrided's row stride (elements)
    Dev out(copy ? static_cast<std::size_t>(h.capacity * c.H * 2) : 0);
    void* strided =
        out_in == OutIn::HeapStrided ? w.alloc_bytes(static_cast<std::size_t>(h.capacity * ld * 2)) : nullptr;
    MatrixView expert_out = h.recv_x;
    if (copy) {
        LOOM_CHECK_CUDA(cudaMemcpyAsync(out.p, h.recv_x.data, static_cast<std::size_t>(h.capacity * c.H * 2),
                                        cudaMemcpyDeviceToDevice, stream));
        expert_out = MatrixView{out.p, DType::BF16, h.capacity, c.H, 0};
    } else if (strided != nullptr) {
        LOOM_CHECK_CUDA(cudaMemcpy2DAsync(strided, ld * 2, h.recv_x.data, h.recv_x.stride() * 2, c.H * 2, h.capacity,
                                          cudaMemcpyDeviceToDevice, stream));
        expert_out = MatrixView{strided, DType::BF16, h.capacity, c.H, ld};
    }
    ep_combine(w, h, expert_out, MatrixView{y.p, DType::BF16, tokens_of(c, run.me), c.H, 0}, stream);
    LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
    if (err.empty()) err = run.check_identity_y(y.p);
    if (strided != nullptr) w.free(strided);  // collective: every rank allocated it
    if (!err.empty()) err = run.what() + ": " + err;
    return test::agree(w, err, "ep_round_trip");
}

TEST_F(MoeEp, IdentityRoundTripSmall) {
    const int W = w->world_size();
    const std::vector<Case> cases = {
        {1, 2048, 1, W, Kind::Uniform},
        {1, 2048, 8, 8 * W, Kind::Uniform, false, true},
        {37, 2048, 2, 2 * W, Kind::Uniform, true},
        {200, 2048, 8, 8 * W, Kind::OneRank},
        {200, 2048, 8, 8 * W, Kind::Holes, false, true},
        {256, 2048, 4, 16 * W, Kind::Skewed},
        {129, 2048, 6, 16 * W, Kind::OneExpert, true, true},
        {64, 7168, 8, 256, Kind::Uniform},
    };
    uint64_t seed = 1;
    int i = 0;
    for (const Case& c : cases) {
        if (c.E % W != 0 || c.k > c.E) continue;
        const std::string e = round_trip(*w, stream, c, seed += 10, static_cast<OutIn>(i++ % 4));
        EXPECT_TRUE(e.empty()) << e;
    }
}

TEST_F(MoeEp, IdentityRoundTripLarge) {
    // Sizes keep every rank's buffers (received rows x (2 x H x 2 + 8 x k) bytes) under the default 1 GiB heap at 8
    // ranks: skewed routings send most rows to one or two ranks, OneRank sends all W x T x k rows to one rank (384
    // tokens: 24576 rows of H 7168 at W = 8, 0.7 GiB).
    // E: 256 experts, or the largest multiple of the world size below (255 at 3 ranks).
    const int E = 256 / w->world_size() * w->world_size();
    const std::vector<Case> cases = {
        {8192, 2048, 8, E, Kind::Uniform},
        {384, 7168, 8, E, Kind::Skewed, false, true},
        {256, 7168, 8, E, Kind::OneExpert},
        {384, 7168, 8, E, Kind::OneRank},
    };
    uint64_t seed = 500;
    int i = 0;
    for (const Case& c : cases) {
        const std::string e = round_trip(
            *w, stream, c, seed += 10, static_cast<OutIn>(i++ % 3));  // no strided copy: the heap holds the large cases
        EXPECT_TRUE(e.empty()) << e;
    }
}

// A capacity below the need: every rank's ep_check raises naming the rows; y is left as it was; the next call with
// enough capacity is right.
TEST_F(MoeEp, CapacityOverflowRaisesThenRecovers) {
    const int W = w->world_size();
    const Case c{300, 2048, 4, 8 * W, Kind::Skewed};
    EpRun run(*w, c, 77);
    EpOptions small;
    small.capacity = std::max<int64_t>(1, run.ref.max_rows - 1);
    const EpHandle h = ep_dispatch(*w, run.xv, run.d_idx->as<int32_t>(), run.d_w->as<float>(), c.k, c.E, stream, small);
    std::string msg;
    try {
        ep_check(*w, h, stream);
    } catch (const Error& e) {
        msg = e.what();
    }
    EXPECT_NE(msg.find("capacity overflow"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(run.ref.max_rows)), std::string::npos) << msg;
    const int64_t T = tokens_of(c, run.me);
    Dev y(static_cast<std::size_t>(T * c.H * 2));
    Dev out(static_cast<std::size_t>(small.capacity * c.H * 2));
    ep_combine(*w, h, MatrixView{out.p, DType::BF16, small.capacity, c.H, 0}, MatrixView{y.p, DType::BF16, T, c.H, 0},
               stream);
    std::vector<uint16_t> got(static_cast<std::size_t>(T * c.H));
    LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
    LOOM_CHECK_CUDA(cudaMemcpy(got.data(), y.p, got.size() * 2, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](uint16_t v) { return v == 0xA5A5; })) << "y was written";
    const std::string e = round_trip(*w, stream, Case{300, 2048, 4, 8 * W, Kind::Skewed, false, true}, 78);
    EXPECT_TRUE(e.empty()) << e;
}

// dispatch -> combine captured once (fixed capacity), replayed with new routings and tokens written into the same
// buffers between replays; every replay checked. The device keeps the call numbers, so replays never reuse one.
TEST_F(MoeEp, GraphReplay) {
    const int W = w->world_size();
    const Case c{256, 2048, 8, 16 * W, Kind::Uniform, false, false};
    EpRun run(*w, c, 300);
    EpOptions o;
    o.capacity = static_cast<int64_t>(W) * c.T * std::min(c.k, c.E / W);  // the bound for any routing
    const int64_t T = tokens_of(c, run.me);
    Dev y(static_cast<std::size_t>(T * c.H * 2));
    const MatrixView yv{y.p, DType::BF16, T, c.H, 0};
    {  // state, buffers and kernels outside the capture
        const EpHandle h = ep_dispatch(*w, run.xv, run.d_idx->as<int32_t>(), run.d_w->as<float>(), c.k, c.E, stream, o);
        ep_combine(*w, h, h.recv_x, yv, stream);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    }
    w->barrier();
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    std::string err;
    try {
        const EpHandle h = ep_dispatch(*w, run.xv, run.d_idx->as<int32_t>(), run.d_w->as<float>(), c.k, c.E, stream, o);
        ep_combine(*w, h, h.recv_x, yv, stream);
    } catch (const std::exception& e) {
        err = std::string("capture: ") + e.what();
    }
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    if (err.empty() && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) err = "graph instantiate failed";
    cudaGraphDestroy(graph);
    ASSERT_EQ(test::agree(*w, err, "ep_graph_capture"), "");
    for (int replay = 0; replay < 3; ++replay) {
        Case ci = c;
        ci.kind = replay == 1 ? Kind::OneRank : (replay == 2 ? Kind::Holes : Kind::Skewed);
        EpRun next(*w, ci, 400 + 10 * replay);
        std::vector<uint16_t> x(static_cast<std::size_t>(T * c.H));
        for (int64_t t = 0; t < T; ++t)
            for (int64_t col = 0; col < c.H; ++col) x[t * c.H + col] = float_to_bf16(xval(run.me, t, col));
        run.upload(x, next.idx[run.me], next.wts);
        LOOM_CHECK_CUDA(cudaMemset(y.p, 0xA5, y.bytes));
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
        w->barrier();  // every rank's inputs are in place before any replay reads a peer's
        ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        const std::string e = next.check_identity_y(y.p);
        EXPECT_EQ(test::agree(*w, e, "ep_graph_replay"), "") << "replay " << replay;
    }
    cudaGraphExecDestroy(exec);
}

// An EP layer: dispatch -> grouped GEMM of each local expert (y_e = x W_e^T, bf16 out) -> combine, against fp64.
// Expert l of rank r's weight: element (n, col) of expert e = r L + l, bf16 values of magnitude <= 1 / 16.
float wval(int e, int64_t n, int64_t col) { return bf16_to_float(float_to_bf16(xval(1000 + e, n, col) / 32.f)); }

// This rank's L experts' weights [L x N, K] (NK) on the device.
std::unique_ptr<Dev> expert_weights(int me, int L, int64_t N, int64_t K, int salt) {
    std::vector<uint16_t> w(static_cast<std::size_t>(L * N * K));
    for (int l = 0; l < L; ++l)
        for (int64_t n = 0; n < N; ++n)
            for (int64_t col = 0; col < K; ++col)
                w[(l * N + n) * K + col] = float_to_bf16(wval(salt + me * L + l, n, col));
    auto d = std::make_unique<Dev>(w.size() * 2);
    test::upload(d->p, w);
    return d;
}

// y of an EP layer with one [H, H] projection per expert (weights wval(e, ...)) against an fp64 reference: the GEMM's
// outputs rounded to bf16 as the kernel stores them, the top-k sum in fp64. "" when within tolerance.
std::string layer_error(const EpRun& run, const void* y) {
    const int H = run.c.H, k = run.c.k;
    const int64_t T = tokens_of(run.c, run.me);
    std::vector<uint16_t> got(static_cast<std::size_t>(T * H));
    if (T > 0) LOOM_CHECK_CUDA(cudaMemcpy(got.data(), y, got.size() * 2, cudaMemcpyDeviceToHost));
    double err2 = 0, ref2 = 0, worst = 0;
    for (int64_t t = 0; t < T; ++t) {
        std::vector<double> yr(H, 0.0);
        for (int s = 0; s < k; ++s) {
            const int e = run.idx[run.me][t * k + s];
            if (e < 0) continue;
            for (int64_t n = 0; n < H; ++n) {
                double a = 0;
                for (int64_t col = 0; col < H; ++col) a += double(xval(run.me, t, col)) * wval(e, n, col);
                yr[n] += run.wts[t * k + s] * bf16_to_float(float_to_bf16(static_cast<float>(a)));
            }
        }
        for (int64_t n = 0; n < H; ++n) {
            const double d = bf16_to_float(got[t * H + n]) - yr[n];
            err2 += d * d, ref2 += yr[n] * yr[n];
            // bf16 roundings: the GEMM's outputs (as the reference), each rank's partial and y (~0.002 each at
            // these magnitudes, |y| ~ 0.5): an absolute floor for outputs near 0.
            worst = std::max(worst, std::abs(d) / (0.02 * std::abs(yr[n]) + 0.02));
        }
    }
    const double rel = std::sqrt(err2 / std::max(ref2, 1e-30));
    if (!(rel < 1e-2) || !(worst <= 1.0))
        return "relative error " + std::to_string(rel) + ", worst element " + std::to_string(worst);
    return "";
}

TEST_F(MoeEp, LayerWithGroupedGemm) {
    const int W = w->world_size();
    const int H = 512, k = 4, E = 8 * W, L = E / W;
    const Case c{192, H, k, E, Kind::Uniform};
    EpRun run(*w, c, 900);
    const auto d_wl = expert_weights(run.me, L, H, H, 0);
    const EpHandle h = ep_dispatch(*w, run.xv, run.d_idx->as<int32_t>(), run.d_w->as<float>(), k, E, stream);
    Dev out(static_cast<std::size_t>(h.capacity * H * 2));
    const MatrixView outv{out.p, DType::BF16, h.capacity, H, 0};
    GroupedGemmOptions g;
    g.max_rows = static_cast<int>(h.capacity);
    grouped_gemm(h.recv_x, MatrixView{d_wl->p, DType::BF16, static_cast<int64_t>(L) * H, H, 0}, L, outv, h.recv_offsets,
                 L, stream, g);
    const int64_t T = tokens_of(c, run.me);
    Dev y(static_cast<std::size_t>(T * H * 2));
    ep_combine(*w, h, outv, MatrixView{y.p, DType::BF16, T, H, 0}, stream);
    LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
    EXPECT_EQ(test::agree(*w, layer_error(run, y.p), "ep_layer"), "");
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "no error";
}

// ep_moe_experts: Overlapped against Sequential bitwise (same GEMM configs), one projection and an FFN (SwiGLU up,
// down); every routing kind, a rank with no tokens, fixed and auto capacity; calls back to back, the algorithms
// interleaved (the per-expert counters advance only on Overlapped calls) and the routing changing between calls. On
// several nodes (LOOM_NODE_SIZE) Overlapped raises its named error and Sequential / Auto are checked the same way.
TEST_F(MoeEp, ExpertsOverlappedEqualsSequential) {
    const int W = w->world_size();
    const bool multi_node = W != w->local_world_size();
    struct Ffn {
        Case c;
        int inter;  // 0: one [H, H] projection; else SwiGLU up [2 I, H] and down [H, I]
    };
    const std::vector<Ffn> cases = {
        {{256, 512, 4, 8 * W, Kind::Uniform}, 0},
        {{300, 512, 8, 4 * W, Kind::Skewed, false, true}, 0},
        {{128, 256, 6, 8 * W, Kind::OneExpert}, 0},
        {{200, 256, 4, 2 * W, Kind::OneRank, true}, 0},
        {{160, 256, 5, 8 * W, Kind::Holes}, 0},
        {{256, 512, 8, 8 * W, Kind::Uniform}, 256},
        {{96, 256, 4, 4 * W, Kind::Skewed, true, true}, 128},
    };
    std::string err;
    uint64_t seed = 5000;
    for (const Ffn& f : cases) {
        const Case& c = f.c;
        const int L = c.E / W;
        const auto w_up = expert_weights(w->rank(), L, f.inter > 0 ? 2 * f.inter : c.H, c.H, 0);
        const auto w_down = f.inter > 0 ? expert_weights(w->rank(), L, c.H, f.inter, 7777) : nullptr;
        const MatrixView up{w_up->p, DType::BF16, static_cast<int64_t>(L) * (f.inter > 0 ? 2 * f.inter : c.H), c.H, 0};
        const MatrixView down =
            f.inter > 0 ? MatrixView{w_down->p, DType::BF16, static_cast<int64_t>(L) * c.H, f.inter, 0} : MatrixView{};
        for (int round = 0; round < 2 && err.empty(); ++round) {  // a new routing each round
            EpRun run(*w, c, seed += 31);
            const int64_t T = tokens_of(c, run.me);
            EpMoeOptions o;
            o.ep = run.opts();
            if (f.inter > 0) o.up.activation = MoeActivation::SwiGLU;
            std::vector<std::vector<uint16_t>> ys;
            // Several nodes: Overlapped (one node only) raises a named error; Sequential and Auto run.
            const std::vector<EpMoeAlgo> algos =
                multi_node ? std::vector<EpMoeAlgo>{EpMoeAlgo::Sequential, EpMoeAlgo::Auto, EpMoeAlgo::Sequential}
                           : std::vector<EpMoeAlgo>{EpMoeAlgo::Overlapped, EpMoeAlgo::Sequential, EpMoeAlgo::Overlapped,
                                                    EpMoeAlgo::Overlapped, EpMoeAlgo::Auto};
            if (multi_node && round == 0 && err.empty()) {
                o.algo = EpMoeAlgo::Overlapped;
                Dev y(static_cast<std::size_t>(std::max<int64_t>(T, 1) * c.H * 2));
                const std::string e = error_of([&] {
                    ep_moe_experts(*w, run.xv, run.d_idx->as<int32_t>(), run.d_w->as<float>(), c.k, c.E, up, down,
                                   MatrixView{y.p, DType::BF16, T, c.H, 0}, stream, o);
                });
                if (e.find("Overlapped runs on one node") == std::string::npos)
                    err = "Overlapped on several nodes: expected a named error, given: " + e;
            }
            for (EpMoeAlgo a : algos) {
                o.algo = a;
                Dev y(static_cast<std::size_t>(T * c.H * 2));  // poisoned
                const EpHandle h = ep_moe_experts(*w, run.xv, run.d_idx->as<int32_t>(), run.d_w->as<float>(), c.k, c.E,
                                                  up, down, MatrixView{y.p, DType::BF16, T, c.H, 0}, stream, o);
                try {
                    ep_check(*w, h, stream);
                } catch (const Error& e) {
                    err = e.what();
                }
                std::vector<uint16_t> got(static_cast<std::size_t>(T * c.H));
                if (T > 0) LOOM_CHECK_CUDA(cudaMemcpy(got.data(), y.p, got.size() * 2, cudaMemcpyDeviceToHost));
                ys.push_back(std::move(got));
                if (f.inter == 0 && ys.size() == 1 && err.empty()) err = layer_error(run, y.p);
            }
            for (std::size_t i = 1; i < ys.size() && err.empty(); ++i)
                for (std::size_t j = 0; j < ys[0].size(); ++j)
                    if (ys[i][j] != ys[0][j]) {
                        err = "call " + std::to_string(i) + " (" + to_string(algos[i]) +
                              ") differs from the first call (" + to_string(algos[0]) + ") at token " +
                              std::to_string(j / c.H) + " col " + std::to_string(j % c.H);
                        break;
                    }
            if (!err.empty()) err = run.what() + " I=" + std::to_string(f.inter) + ": " + err;
        }
        if (!err.empty()) break;
    }
    EXPECT_EQ(test::agree(*w, err, "ep_moe_experts"), "");
}

TEST_F(MoeEp, BadInputsNameTheArgument) {
    const int W = w->world_size();
    Dev x(64 * 2048 * 4), idx(64 * 8 * 4);
    const int32_t* ids = idx.as<int32_t>();
    const MatrixView xv{x.p, DType::BF16, 64, 2048, 0};
    EXPECT_NE(error_of([&] {
                  ep_dispatch(*w, MatrixView{x.p, DType::F32, 64, 2048, 0}, ids, nullptr, 8, 8 * W, stream);
              }).find("x: expected dtype bf16"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  ep_dispatch(*w, MatrixView{x.p, DType::BF16, 64, 12, 0}, ids, nullptr, 8, 8 * W, stream);
              }).find("multiple of 8"),
              std::string::npos);
    EXPECT_NE(error_of([&] { ep_dispatch(*w, xv, ids, nullptr, 0, 8 * W, stream); }).find("topk"), std::string::npos);
    EXPECT_NE(error_of([&] { ep_dispatch(*w, xv, ids, nullptr, 33, 64 * W, stream); }).find("topk"), std::string::npos);
    EXPECT_NE(error_of([&] { ep_dispatch(*w, xv, nullptr, nullptr, 8, 8 * W, stream); }).find("topk_idx"),
              std::string::npos);
    EXPECT_NE(error_of([&] { ep_dispatch(*w, xv, ids, nullptr, 8, 2048, stream); }).find("num_experts"),
              std::string::npos);
    if (W > 1)
        EXPECT_NE(error_of([&] { ep_dispatch(*w, xv, ids, nullptr, 1, 2 * W + 1, stream); }).find("num_experts"),
                  std::string::npos);
    EpOptions neg;
    neg.capacity = -1;
    EXPECT_NE(error_of([&] { ep_dispatch(*w, xv, ids, nullptr, 8, 8 * W, stream, neg); }).find("capacity"),
              std::string::npos);
    // Combine: a stale handle, a second combine, short expert outputs, a y of the wrong shape.
    const Case c{16, 2048, 2, 4 * W, Kind::Uniform};
    EpRun run(*w, c, 5);
    const EpHandle h1 = ep_dispatch(*w, run.xv, run.d_idx->as<int32_t>(), run.d_w->as<float>(), c.k, c.E, stream);
    const EpHandle h2 = ep_dispatch(*w, run.xv, run.d_idx->as<int32_t>(), run.d_w->as<float>(), c.k, c.E, stream);
    const int64_t T = tokens_of(c, run.me);
    Dev y(static_cast<std::size_t>(T * c.H * 2 + 4096));
    const MatrixView yv{y.p, DType::BF16, T, c.H, 0};
    EXPECT_NE(error_of([&] { ep_combine(*w, h1, h1.recv_x, yv, stream); }).find("latest dispatch"), std::string::npos);
    MatrixView short_out = h2.recv_x;
    short_out.rows = h2.capacity - 1;
    EXPECT_NE(error_of([&] { ep_combine(*w, h2, short_out, yv, stream); }).find("expert_out"), std::string::npos);
    EXPECT_NE(error_of([&] {
                  ep_combine(*w, h2, h2.recv_x, MatrixView{y.p, DType::BF16, T + 1, c.H, 0}, stream);
              }).find("y: expected"),
              std::string::npos);
    ep_combine(*w, h2, h2.recv_x, yv, stream);
    EXPECT_NE(error_of([&] { ep_combine(*w, h2, h2.recv_x, yv, stream); }).find("combined already"), std::string::npos);
    LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
    // Auto capacity cannot be captured.
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const std::string cap =
        error_of([&] { ep_dispatch(*w, run.xv, run.d_idx->as<int32_t>(), run.d_w->as<float>(), c.k, c.E, stream); });
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream, &g);
    if (g) cudaGraphDestroy(g);
    EXPECT_NE(cap.find("fixed capacity"), std::string::npos) << cap;
    // ep_moe_experts: checked before anything is enqueued (every rank raises the same).
    // Every view lies in memory of its full size: the ops check that the whole of each buffer is device memory, which
    // would otherwise raise before the check under test.
    Dev wmem(std::size_t{4} * 2048 * 2048 * 4), ymem(std::size_t{64} * 2048 * 2);
    const MatrixView wv{wmem.p, DType::BF16, 4 * 2048, 2048, 0};  // L = 4 experts of [2048, 2048] (contents unused)
    const MatrixView y64{ymem.p, DType::BF16, 64, 2048, 0};
    EXPECT_NE(error_of([&] {
                  ep_moe_experts(*w, xv, ids, nullptr, 8, 4 * W, wv, MatrixView{},
                                 MatrixView{ymem.p, DType::BF16, 63, 2048, 0}, stream);
              }).find("y: expected"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  ep_moe_experts(*w, xv, ids, nullptr, 8, 4 * W, MatrixView{wmem.p, DType::BF16, 4 * 1024, 2048, 0},
                                 MatrixView{}, y64, stream);
              }).find("w_up: without w_down"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  ep_moe_experts(*w, xv, ids, nullptr, 8, 4 * W, wv, MatrixView{wmem.p, DType::F32, 4 * 2048, 2048, 0},
                                 y64, stream);
              }).find("w_down: expected bf16"),
              std::string::npos);
    EpMoeOptions bad_algo;
    bad_algo.algo = static_cast<EpMoeAlgo>(7);
    EXPECT_NE(error_of([&] {
                  ep_moe_experts(*w, xv, ids, nullptr, 8, 4 * W, wv, MatrixView{}, y64, stream, bad_algo);
              }).find("opts.algo"),
              std::string::npos);
    // Overlapped is refused inside a capture (its replay is untested).
    EpMoeOptions ov;
    ov.algo = EpMoeAlgo::Overlapped;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const std::string ov_cap =
        error_of([&] { ep_moe_experts(*w, xv, ids, nullptr, 8, 4 * W, wv, MatrixView{}, y64, stream, ov); });
    g = nullptr;
    cudaStreamEndCapture(stream, &g);
    if (g) cudaGraphDestroy(g);
    EXPECT_NE(ov_cap.find("CUDA graph"), std::string::npos) << ov_cap;
}

}  // namespace
}  // namespace loom
