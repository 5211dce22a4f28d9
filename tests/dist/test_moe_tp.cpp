// ag_moe / moe_rs / moe_ar at any world size against an fp64 host reference of the whole layer (every rank builds
// every rank's inputs from shared seeds): uniform, skewed and one-expert routings, an empty rank, bf16 products;
// Fused against Sequential and the reference (T_loc = 1, one expert, 64 experts; the reduce's work split: tokens not a
// multiple of its chunk, many chunks, bf16 out, k 32, no tokens); 1000 back-to-back calls (Auto, and Fused checked at
// calls 1, 500, 1000 with poisoned outputs); Fused calls of two shapes alternating; moe_ar Sequential and Fused
// (one-shot) against the reference and each other; a CUDA graph of the three ops replayed; bad inputs naming the
// argument. Run: loomrun -n N build/tests/loom_dist_tests --gtest_filter='MoeTp*'
// Seeds are fixed so that every rank draws the same full inputs.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/device_io.hpp"
#include "common/moe_reference.hpp"
#include "common/reference.hpp"
#include "common/test_env.hpp"
#include "loom/ops/moe.hpp"
#include "loom/runtime/error.hpp"

namespace loom {
namespace {

using test::RoutingKind;

class MoeTp : public ::WorldStreamTest {
  protected:
    void TearDown() override {
        if (w) release_moe_state(*w);
        WorldStreamTest::TearDown();
    }
};

struct Dev {
    void* p = nullptr;
    explicit Dev(std::size_t bytes) {
        LOOM_CHECK_CUDA(cudaMalloc(&p, std::max<std::size_t>(bytes, 256)));
        LOOM_CHECK_CUDA(cudaMemset(p, 0xA5, std::max<std::size_t>(bytes, 256)));
    }
    ~Dev() { cudaFree(p); }
    template <class T>
    T* as() const {
        return static_cast<T*>(p);
    }
};

std::vector<uint16_t> bf16_of(const std::vector<float>& f) {
    std::vector<uint16_t> b(f.size());
    for (std::size_t i = 0; i < f.size(); ++i) b[i] = test::float_to_bf16(f[i]);
    return b;
}
template <class T>
void put(void* d, const std::vector<T>& h) {
    test::upload(d, h);
}

// One layer: T_loc tokens per rank, hidden H, E experts of width N (each rank: an N / W slice), top-k.
struct Layer {
    int t_loc, H, E, N, k;
    RoutingKind kind;
    DType out = DType::F32;  // moe_rs's output
};

// y = sum over slots of w * down_e(up_e(x)) with the rank slices' sum, in fp64 from the bf16-rounded inputs; the
// intermediate rounded to bf16 as the GEMM's output is.
std::vector<double> layer_reference(const Layer& L, int W, const std::vector<float>& x, const std::vector<int32_t>& idx,
                                    const std::vector<float>& wts, const std::vector<float>& up,
                                    const std::vector<float>& down) {
    const int T = L.t_loc * W;
    std::vector<double> y(static_cast<std::size_t>(T) * L.H, 0.0);
    std::vector<double> h(L.N);
    for (int t = 0; t < T; ++t)
        for (int s = 0; s < L.k; ++s) {
            const int e = idx[t * L.k + s];
            for (int n = 0; n < L.N; ++n) {
                double a = 0;
                for (int c = 0; c < L.H; ++c)
                    a += double(x[static_cast<std::size_t>(t) * L.H + c]) *
                         up[(static_cast<std::size_t>(e) * L.N + n) * L.H + c];
                h[n] = test::bf16_to_float(test::float_to_bf16(static_cast<float>(a)));
            }
            for (int c = 0; c < L.H; ++c) {
                double a = 0;
                for (int n = 0; n < L.N; ++n) a += h[n] * down[(static_cast<std::size_t>(e) * L.H + c) * L.N + n];
                y[static_cast<std::size_t>(t) * L.H + c] += wts[t * L.k + s] * a;
            }
        }
    return y;
}

// One layer's inputs on this rank (every rank draws the same full inputs, rounded to bf16, and takes its part), its
// device buffers and this rank's part of the fp64 reference.
struct LayerRun {
    Layer L;
    int W, r;
    MoeRoutingShape shape;
    std::vector<double> mine;  // this rank's tokens of the reference
    std::unique_ptr<Dev> d_x, d_idx, d_w, d_up, d_down, d_route, d_h, d_y;
    MoeRouting routing;
    MatrixView xv, upv, hv, downv, yv;
    int rs_comm_sms = 0;  // moe_rs's TpMoeOptions::comm_sms

    // ranks: the routing's source ranks, the world size (source-major groups, 0 here) or 1 (expert-major); align: its
    // group alignment (padding rows past 1).
    LayerRun(World& w, const Layer& layer, uint64_t seed, int ranks = 0, int align = 1)
        : L(layer), W(w.world_size()), r(w.rank()) {
        const int T = L.t_loc * W, n_loc = L.N / W;
        auto round = [](std::vector<float> v) {
            for (float& f : v) f = test::bf16_to_float(test::float_to_bf16(f));
            return v;
        };
        const std::vector<float> x = round(test::random_floats(static_cast<std::size_t>(T) * L.H, seed));
        const std::vector<float> up = round(test::random_floats(static_cast<std::size_t>(L.E) * L.N * L.H, seed + 1));
        const std::vector<float> down = round(test::random_floats(static_cast<std::size_t>(L.E) * L.H * L.N, seed + 2));
        const std::vector<int32_t> idx = test::make_routing(L.kind, T, L.k, L.E, seed + 3);
        const std::vector<float> wts = test::make_topk_weights(T, L.k, seed + 4);
        const std::vector<double> want = layer_reference(L, W, x, idx, wts, up, down);
        mine.assign(want.begin() + static_cast<std::ptrdiff_t>(r) * L.t_loc * L.H,
                    want.begin() + static_cast<std::ptrdiff_t>(r + 1) * L.t_loc * L.H);
        // This rank's parts: its tokens, its N-slice of every expert's up (rows) and down (columns) weight.
        std::vector<float> x_r(x.begin() + static_cast<std::ptrdiff_t>(r) * L.t_loc * L.H,
                               x.begin() + static_cast<std::ptrdiff_t>(r + 1) * L.t_loc * L.H);
        std::vector<int32_t> idx_r(idx.begin() + r * L.t_loc * L.k, idx.begin() + (r + 1) * L.t_loc * L.k);
        std::vector<float> w_r(wts.begin() + r * L.t_loc * L.k, wts.begin() + (r + 1) * L.t_loc * L.k);
        std::vector<float> up_r(static_cast<std::size_t>(L.E) * n_loc * L.H),
            down_r(static_cast<std::size_t>(L.E) * L.H * n_loc);
        for (int e = 0; e < L.E; ++e) {
            for (int n = 0; n < n_loc; ++n)
                for (int c = 0; c < L.H; ++c)
                    up_r[(static_cast<std::size_t>(e) * n_loc + n) * L.H + c] =
                        up[(static_cast<std::size_t>(e) * L.N + r * n_loc + n) * L.H + c];
            for (int c = 0; c < L.H; ++c)
                for (int n = 0; n < n_loc; ++n)
                    down_r[(static_cast<std::size_t>(e) * L.H + c) * n_loc + n] =
                        down[(static_cast<std::size_t>(e) * L.H + c) * L.N + r * n_loc + n];
        }
        shape = MoeRoutingShape{T, L.k, L.E, ranks > 0 ? ranks : W, align};
        d_x = std::make_unique<Dev>(x_r.size() * 2);
        d_idx = std::make_unique<Dev>(idx_r.size() * 4);
        d_w = std::make_unique<Dev>(w_r.size() * 4);
        d_up = std::make_unique<Dev>(up_r.size() * 2);
        d_down = std::make_unique<Dev>(down_r.size() * 2);
        d_route = std::make_unique<Dev>(moe_routing_bytes(shape));
        d_h = std::make_unique<Dev>(static_cast<std::size_t>(shape.max_rows()) * n_loc * 2);
        d_y = std::make_unique<Dev>(static_cast<std::size_t>(L.t_loc) * L.H * 4);
        put(d_x->p, bf16_of(x_r));
        put(d_idx->p, idx_r);
        put(d_w->p, w_r);
        put(d_up->p, bf16_of(up_r));
        put(d_down->p, bf16_of(down_r));
        routing = moe_routing_view(shape, d_route->p, moe_routing_bytes(shape));
        xv = {d_x->p, DType::BF16, L.t_loc, L.H};
        upv = {d_up->p, DType::BF16, int64_t{L.E} * n_loc, L.H};
        hv = {d_h->p, DType::BF16, shape.max_rows(), n_loc};
        downv = {d_down->p, DType::BF16, int64_t{L.E} * L.H, n_loc};
        yv = {d_y->p, L.out, L.t_loc, L.H};
    }

    // ag_moe -> moe_rs with `ag` / `rs` as the algorithms; poison: the outputs are set to 0xFF bytes (NaN) first.
    void call(World& w, cudaStream_t stream, TpMoeAlgo ag, TpMoeAlgo rs, bool poison) {
        if (poison) {
            LOOM_CHECK_CUDA(cudaMemsetAsync(d_h->p, 0xFF, static_cast<std::size_t>(hv.rows) * hv.cols * 2, stream));
            LOOM_CHECK_CUDA(cudaMemsetAsync(d_y->p, 0xFF, static_cast<std::size_t>(yv.rows) * yv.cols * 4, stream));
        }
        TpMoeOptions oa, orr;
        oa.algo = ag;
        orr.algo = rs;
        orr.comm_sms = rs_comm_sms;
        ag_moe(w, xv, d_idx->as<int32_t>(), d_w->as<float>(), upv, routing, hv, stream, oa);
        moe_rs(w, hv, downv, routing, yv, stream, orr);
    }

    std::vector<uint16_t> h() const {
        std::vector<uint16_t> v(static_cast<std::size_t>(hv.rows) * hv.cols);
        LOOM_CHECK_CUDA(cudaMemcpy(v.data(), d_h->p, v.size() * 2, cudaMemcpyDeviceToHost));
        return v;
    }
    std::vector<float> y() const {
        std::vector<float> v(static_cast<std::size_t>(yv.rows) * yv.cols);
        if (yv.dtype == DType::F32) {
            LOOM_CHECK_CUDA(cudaMemcpy(v.data(), d_y->p, v.size() * 4, cudaMemcpyDeviceToHost));
        } else {
            std::vector<uint16_t> b(v.size());
            LOOM_CHECK_CUDA(cudaMemcpy(b.data(), d_y->p, b.size() * 2, cudaMemcpyDeviceToHost));
            for (std::size_t i = 0; i < b.size(); ++i) v[i] = test::bf16_to_float(b[i]);
        }
        return v;
    }

    // This rank's tokens of y against the reference, every element.
    void check(const std::vector<float>& y, const std::string& what) const {
        SCOPED_TRACE(what);
        std::vector<double> got(y.begin(), y.end());
        if (!mine.empty()) {
            EXPECT_LT(test::calc_diff(mine, got), 1e-4);
        }
        // bf16 out: each rank's partial sum and every hop of the reduction round at the partials' magnitude, which
        // exceeds an element's own where the ranks' partials cancel: a bound of 2^-5 of y's RMS on top (a missing or
        // misplaced contribution is off by about the RMS itself).
        double rms = 0;
        for (double v : mine) rms += v * v;
        rms = mine.empty() ? 0 : std::sqrt(rms / double(mine.size()));
        const double cancel = L.out == DType::BF16 ? rms / 32 : 0;
        int bad = 0;
        for (std::size_t i = 0; i < mine.size(); ++i) {
            const double tol = 0.02 * (1 + std::abs(mine[i])) + 0.01 * std::sqrt(double(L.N)) + cancel;
            if (!(std::abs(got[i] - mine[i]) <= tol) && bad++ < 5)
                ADD_FAILURE() << "rank " << r << " y[" << i << "] = " << got[i] << ", want " << mine[i];
        }
        EXPECT_EQ(bad, 0);
    }
};

std::string describe(const Layer& L) {
    return "T_loc " + std::to_string(L.t_loc) + " H " + std::to_string(L.H) + " E " + std::to_string(L.E) + " N " +
           std::to_string(L.N) + " k " + std::to_string(L.k) + " out " + dtype_name(L.out);
}

// Runs ag_moe -> moe_rs (calls times, Auto) and checks this rank's tokens of the first and the last call, each with
// its outputs poisoned before it.
void run_layer(World& w, cudaStream_t stream, const Layer& L, uint64_t seed, int calls = 1) {
    SCOPED_TRACE(describe(L));
    LayerRun run(w, L, seed);
    for (int i = 0; i < calls; ++i) {
        const bool checked = i == 0 || i == calls - 1;
        run.call(w, stream, TpMoeAlgo::Auto, TpMoeAlgo::Auto, checked);
        if (checked) {
            ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
            run.check(run.y(), "auto, call " + std::to_string(i));
        }
    }
}

// Sequential and Fused on the same inputs: both against the reference; ag_moe's routed rows bitwise equal (the same
// routing and GEMM config), moe_rs's outputs within rounding of each other (both round each rank's top-k sums to out's
// type and sum the ranks in fp32, in their own orders).
// ranks, align: the routing's (ranks 0: the world size, source-major).
void fused_vs_sequential(World& w, cudaStream_t stream, const Layer& L, uint64_t seed, int rs_comm_sms = 0,
                         int ranks = 0, int align = 1) {
    SCOPED_TRACE(describe(L) + " comm_sms " + std::to_string(rs_comm_sms) + " ranks " + std::to_string(ranks) +
                 " align " + std::to_string(align));
    LayerRun run(w, L, seed, ranks, align);
    run.rs_comm_sms = rs_comm_sms;
    run.call(w, stream, TpMoeAlgo::Sequential, TpMoeAlgo::Sequential, true);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<uint16_t> h_seq = run.h();
    const std::vector<float> y_seq = run.y();
    run.check(y_seq, "sequential");
    run.call(w, stream, TpMoeAlgo::Fused, TpMoeAlgo::Fused, true);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<uint16_t> h_fused = run.h();
    const std::vector<float> y_fused = run.y();
    run.check(y_fused, "fused");
    // Every row: routed rows, padding rows (zeros through the GEMM) and rows past the layout (the poison, in both).
    int bad = 0;
    for (int64_t i = 0; i < run.hv.rows * run.hv.cols; ++i)
        if (h_seq[i] != h_fused[i] && bad++ < 5)
            ADD_FAILURE() << "ag_moe rows: element " << i << " fused " << h_fused[i] << " != sequential " << h_seq[i];
    EXPECT_EQ(bad, 0);
    // bf16 out: both round the ranks' partial sums (of magnitude ~ sqrt(N)) to bf16; Sequential's ring reduce_scatter
    // rounds again at each hop.
    const double rel = L.out == DType::F32 ? 1e-3 : 1.0 / 64;
    const double slack = L.out == DType::F32 ? 0 : 0.01 * std::sqrt(double(L.N));
    for (std::size_t i = 0; i < y_seq.size(); ++i)
        if (!(std::abs(y_seq[i] - y_fused[i]) <= rel * (1 + std::abs(y_seq[i])) + slack) && bad++ < 5)
            ADD_FAILURE() << "moe_rs y[" << i << "]: fused " << y_fused[i] << ", sequential " << y_seq[i];
    EXPECT_EQ(bad, 0);
    // Mixed: each fused op with the other's sequential algorithm.
    run.call(w, stream, TpMoeAlgo::Fused, TpMoeAlgo::Sequential, true);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    run.check(run.y(), "fused ag_moe, sequential moe_rs");
    run.call(w, stream, TpMoeAlgo::Sequential, TpMoeAlgo::Fused, true);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    run.check(run.y(), "sequential ag_moe, fused moe_rs");
}

TEST_F(MoeTp, AgMoeThenMoeRsMatchReference) {
    const uint64_t seed = 1000;
    const int W = w->world_size();
    run_layer(*w, stream, {64, 128, 8, 64 * W, 2, RoutingKind::Uniform}, seed);
    run_layer(*w, stream, {96, 64, 16, 32 * W, 4, RoutingKind::Skewed}, seed + 10);
    run_layer(*w, stream, {33, 64, 8, 16 * W, 2, RoutingKind::OneExpert}, seed + 20);  // empty experts
    run_layer(*w, stream, {0, 64, 8, 16 * W, 2, RoutingKind::Uniform}, seed + 30);     // no tokens at all
}

// An expert-major routing (ranks 1: one group per expert over all gathered tokens), whose grouped GEMMs read each
// expert's weights once: Auto, then both fused ops against Sequential (ag_moe's rows bit for bit, padding rows
// included), poisoned outputs, every element against the reference. moe_rs's side blocks asked for with it raise,
// naming the layout.
TEST_F(MoeTp, ExpertMajorRoutingMatchesReference) {
    const uint64_t seed = 2000;
    const int W = w->world_size();
    for (const Layer& L :
         {Layer{64, 128, 8, 64 * W, 2, RoutingKind::Uniform}, Layer{17, 64, 16, 32 * W, 4, RoutingKind::Skewed},
          Layer{1, 64, 8, 16 * W, 3, RoutingKind::OneExpert}, Layer{0, 64, 8, 16 * W, 2, RoutingKind::Uniform}}) {
        SCOPED_TRACE(describe(L));
        LayerRun run(*w, L, seed + L.t_loc, 1);
        for (int i = 0; i < 3; ++i) run.call(*w, stream, TpMoeAlgo::Auto, TpMoeAlgo::Auto, true);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        run.check(run.y(), "expert-major, auto");
        if (W < 2) continue;
        for (int i = 0; i < 3; ++i) run.call(*w, stream, TpMoeAlgo::Fused, TpMoeAlgo::Fused, true);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        run.check(run.y(), "expert-major, fused");
        run.rs_comm_sms = 1;
        std::string what = "no error";
        try {
            run.call(*w, stream, TpMoeAlgo::Sequential, TpMoeAlgo::Fused, false);
        } catch (const Error& e) {
            what = e.what();
        }
        EXPECT_NE(what.find("moe_rs: opts.comm_sms: reduce blocks beside the GEMM wait for a source rank's tiles"),
                  std::string::npos)
            << what;
        run.rs_comm_sms = 0;
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        // Fused after the refused call: the state it left is whole.
        run.call(*w, stream, TpMoeAlgo::Fused, TpMoeAlgo::Fused, true);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        run.check(run.y(), "expert-major, fused after the refused call");
    }
    if (W < 2) return;
    // Fused against Sequential on both layouts with padded groups (align 128: tiles of padding rows only too),
    // a tile whose rows span every source rank, and one expert holding every token.
    for (int ranks : {1, W}) {
        fused_vs_sequential(*w, stream, {64, 128, 8, 64 * W, 2, RoutingKind::Uniform}, seed + 100, 0, ranks, 16);
        fused_vs_sequential(*w, stream, {5, 64, 4, 16 * W, 2, RoutingKind::Skewed}, seed + 110, 0, ranks, 128);
        fused_vs_sequential(*w, stream, {300, 64, 8, 16 * W, 1, RoutingKind::OneExpert}, seed + 120, 0, ranks, 8);
    }
    fused_vs_sequential(*w, stream, {200, 256, 16, 32 * W, 4, RoutingKind::Skewed}, seed + 130, 0, 1);
}

TEST_F(MoeTp, FusedMatchesSequentialAndReference) {
    const int W = w->world_size();
    if (W < 2) GTEST_SKIP() << "the fused algorithms need 2 or more ranks";
    const uint64_t seed = 3000;
    fused_vs_sequential(*w, stream, {64, 128, 8, 64 * W, 2, RoutingKind::Uniform}, seed);
    fused_vs_sequential(*w, stream, {96, 64, 16, 32 * W, 4, RoutingKind::Skewed}, seed + 10);
    fused_vs_sequential(*w, stream, {33, 64, 8, 16 * W, 2, RoutingKind::OneExpert}, seed + 20);    // empty experts
    fused_vs_sequential(*w, stream, {1, 64, 8, 16 * W, 2, RoutingKind::Uniform}, seed + 30);       // T_loc = 1
    fused_vs_sequential(*w, stream, {200, 256, 4, 64 * W, 1, RoutingKind::OneExpert}, seed + 40);  // one expert
    fused_vs_sequential(*w, stream, {130, 64, 64, 16 * W, 6, RoutingKind::Skewed}, seed + 50);     // 64 experts, k 6
}

// The reduce's work split: chunks of tokens claimed by the blocks of two launches. Tokens not a multiple of the chunk,
// many chunks per source rank, bf16 partial sums sent (bf16 out), a chunk capped by the staged pairs (k 32), no
// tokens.
TEST_F(MoeTp, FusedWorkSplitMatchesSequentialAndReference) {
    const int W = w->world_size();
    if (W < 2) GTEST_SKIP() << "the fused algorithms need 2 or more ranks";
    const uint64_t seed = 3500;
    fused_vs_sequential(*w, stream, {300, 512, 8, 32 * W, 2, RoutingKind::Uniform}, seed);  // 10 chunks, last 12
    fused_vs_sequential(*w, stream, {300, 512, 8, 32 * W, 2, RoutingKind::Uniform, DType::BF16}, seed + 10);
    fused_vs_sequential(*w, stream, {257, 128, 16, 16 * W, 8, RoutingKind::Skewed, DType::BF16}, seed + 20);
    fused_vs_sequential(*w, stream, {1, 64, 8, 16 * W, 2, RoutingKind::Uniform, DType::BF16}, seed + 30);
    fused_vs_sequential(*w, stream, {41, 64, 4, 16 * W, 1, RoutingKind::OneExpert, DType::BF16}, seed + 40);
    fused_vs_sequential(*w, stream, {400, 64, 32, 16 * W, 32, RoutingKind::Uniform}, seed + 50);  // chunk 32 (k 32)
    fused_vs_sequential(*w, stream, {0, 64, 8, 16 * W, 2, RoutingKind::Uniform}, seed + 60);      // no tokens
    // The side blocks asked for: none (all after the GEMM), one, many.
    for (int comm_sms : {-1, 1, 12})
        fused_vs_sequential(*w, stream, {150, 256, 8, 32 * W, 2, RoutingKind::Skewed, DType::BF16}, seed + 70,
                            comm_sms);
}

// Fused calls of two shapes alternating, with and without side blocks: the work counter, the tickets and the tile
// targets carry over between calls whose item, block and launch counts differ.
TEST_F(MoeTp, FusedAlternatingShapes) {
    const int W = w->world_size();
    if (W < 2) GTEST_SKIP() << "the fused algorithms need 2 or more ranks";
    LayerRun a(*w, {200, 256, 8, 32 * W, 2, RoutingKind::Skewed, DType::BF16}, 3600);
    LayerRun b(*w, {7, 64, 16, 16 * W, 4, RoutingKind::Uniform}, 3610);
    for (int i = 1; i <= 40; ++i) {
        LayerRun& run = i % 2 ? a : b;
        run.rs_comm_sms = i % 3 == 0 ? -1 : (i % 3 == 1 ? 0 : 3);
        const bool checked = i <= 6 || i >= 35;
        run.call(*w, stream, TpMoeAlgo::Fused, TpMoeAlgo::Fused, checked);
        if (checked) {
            ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
            run.check(run.y(), describe(run.L) + ", call " + std::to_string(i));
        }
    }
}

TEST_F(MoeTp, ThousandBackToBackCalls) {
    const int W = w->world_size();
    run_layer(*w, stream, {16, 64, 4, 16 * W, 2, RoutingKind::Skewed}, 77, 1000);
}

TEST_F(MoeTp, ThousandBackToBackFusedCalls) {
    const int W = w->world_size();
    if (W < 2) GTEST_SKIP() << "the fused algorithms need 2 or more ranks";
    const Layer L{16, 64, 4, 16 * W, 2, RoutingKind::Skewed};
    SCOPED_TRACE(describe(L));
    LayerRun run(*w, L, 91);
    for (int i = 1; i <= 1000; ++i) {
        const bool checked = i == 1 || i == 500 || i == 1000;
        run.call(*w, stream, TpMoeAlgo::Fused, TpMoeAlgo::Fused, checked);
        if (checked) {
            ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
            run.check(run.y(), "call " + std::to_string(i));
        }
    }
}

// moe_ar's batch: every rank holds all T tokens' routed rows h [T x k, N] (its K-slice of N) and its slice of every
// expert's down weight; the reference sums over the whole N in fp64.
struct MoeArRun {
    int W, r, T, H, E, k, N;
    MoeRoutingShape shape;
    std::vector<double> want;
    std::unique_ptr<Dev> d_idx, d_w, d_rows, d_down, d_route, d_y;
    MoeRouting routing;
    MatrixView rowsv, downv, yv;

    MoeArRun(World& w, cudaStream_t stream, int tokens, int hidden, int experts, int topk, int n_per_rank,
             RoutingKind kind, uint64_t seed, DType out = DType::F32)
        : W(w.world_size()), r(w.rank()), T(tokens), H(hidden), E(experts), k(topk), N(n_per_rank * W) {
        const int n_loc = n_per_rank;
        auto round = [](std::vector<float> v) {
            for (float& f : v) f = test::bf16_to_float(test::float_to_bf16(f));
            return v;
        };
        const std::vector<float> h = round(test::random_floats(static_cast<std::size_t>(T) * k * N, seed));
        const std::vector<float> down = round(test::random_floats(static_cast<std::size_t>(E) * H * N, seed + 1));
        const std::vector<int32_t> idx = test::make_routing(kind, T, k, E, seed + 2);
        const std::vector<float> wts = test::make_topk_weights(T, k, seed + 3);
        shape = MoeRoutingShape{T, k, E};
        const test::RoutingRef ref = test::route_reference(shape, idx);
        // rows in the routed layout: row dest(t, s) holds h[t * k + s]; this rank's K-slice.
        std::vector<float> rows_r(static_cast<std::size_t>(shape.max_rows()) * n_loc),
            down_r(static_cast<std::size_t>(E) * H * n_loc);
        for (int j = 0; j < T * k; ++j)
            for (int n = 0; n < n_loc; ++n)
                rows_r[static_cast<std::size_t>(ref.dest_rows[j]) * n_loc + n] =
                    h[static_cast<std::size_t>(j) * N + r * n_loc + n];
        for (int eh = 0; eh < E * H; ++eh)
            for (int n = 0; n < n_loc; ++n)
                down_r[static_cast<std::size_t>(eh) * n_loc + n] =
                    down[static_cast<std::size_t>(eh) * N + r * n_loc + n];
        want.assign(static_cast<std::size_t>(T) * H, 0.0);
        for (int j = 0; j < T * k; ++j)
            for (int c = 0; c < H; ++c) {
                double a = 0;
                for (int n = 0; n < N; ++n)
                    a += double(h[static_cast<std::size_t>(j) * N + n]) *
                         down[(static_cast<std::size_t>(idx[j]) * H + c) * N + n];
                want[static_cast<std::size_t>(j / k) * H + c] += wts[j] * a;
            }
        d_idx = std::make_unique<Dev>(idx.size() * 4);
        d_w = std::make_unique<Dev>(wts.size() * 4);
        d_rows = std::make_unique<Dev>(rows_r.size() * 2);
        d_down = std::make_unique<Dev>(down_r.size() * 2);
        d_route = std::make_unique<Dev>(moe_routing_bytes(shape));
        d_y = std::make_unique<Dev>(want.size() * dtype_size(out));
        put(d_idx->p, idx);
        put(d_w->p, wts);
        put(d_rows->p, bf16_of(rows_r));
        put(d_down->p, bf16_of(down_r));
        routing = moe_routing_view(shape, d_route->p, moe_routing_bytes(shape));
        moe_route(d_idx->as<int32_t>(), d_w->as<float>(), routing, stream);
        rowsv = {d_rows->p, DType::BF16, shape.max_rows(), n_loc};
        downv = {d_down->p, DType::BF16, int64_t{E} * H, n_loc};
        yv = {d_y->p, out, T, H};
    }

    void poison(cudaStream_t stream) const {
        LOOM_CHECK_CUDA(cudaMemsetAsync(d_y->p, 0xFF, want.size() * dtype_size(yv.dtype), stream));
    }
    void call(World& w, cudaStream_t stream, TpMoeAlgo algo, bool poisoned = true) const {
        if (poisoned) poison(stream);
        TpMoeOptions o;
        o.algo = algo;
        moe_ar(w, rowsv, downv, routing, yv, stream, o);
    }
    std::vector<double> y() const {
        std::vector<double> v(want.size());
        if (yv.dtype == DType::F32) {
            std::vector<float> f(want.size());
            LOOM_CHECK_CUDA(cudaMemcpy(f.data(), d_y->p, f.size() * 4, cudaMemcpyDeviceToHost));
            v.assign(f.begin(), f.end());
        } else {
            std::vector<uint16_t> b(want.size());
            LOOM_CHECK_CUDA(cudaMemcpy(b.data(), d_y->p, b.size() * 2, cudaMemcpyDeviceToHost));
            for (std::size_t i = 0; i < b.size(); ++i) v[i] = test::bf16_to_float(b[i]);
        }
        return v;
    }
    // Every element against the reference.
    void check(const std::vector<double>& y, const std::string& what) const {
        SCOPED_TRACE(what);
        const double rel = yv.dtype == DType::F32 ? 0.02 : 0.03;
        int bad = 0;
        for (std::size_t i = 0; i < want.size(); ++i)
            if (!(std::abs(y[i] - want[i]) <= rel * (1 + std::abs(want[i]))) && bad++ < 5)
                ADD_FAILURE() << "rank " << r << " y[" << i << "] = " << y[i] << ", want " << want[i];
        EXPECT_EQ(bad, 0);
        if (!want.empty()) EXPECT_LT(test::calc_diff(want, y), 1e-4);
    }
};

TEST_F(MoeTp, MoeArMatchesReference) {
    const MoeArRun run(*w, stream, 24, 64, 8, 2, 16, RoutingKind::Skewed, 5000);
    run.call(*w, stream, TpMoeAlgo::Auto);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    run.check(run.y(), "auto");
}

// The fused (one-shot) moe_ar against the reference and against Sequential on the same inputs: both round each
// rank's top-k sums to out's type and sum the ranks in fp32, in their own orders (Fused in rank order, so every rank's
// out is the same bits).
TEST_F(MoeTp, FusedMoeArMatchesSequentialAndReference) {
    const int W = w->world_size();
    if (W < 2) GTEST_SKIP() << "the fused algorithms need 2 or more ranks";
    struct S {
        int T, H, E, k, n_loc;
        RoutingKind kind;
        DType out;
    };
    uint64_t seed = 5100;
    for (const S& s : {S{24, 64, 8, 2, 16, RoutingKind::Skewed, DType::F32},
                       S{128, 256, 64, 6, 32, RoutingKind::Uniform, DType::BF16},   // decode batch, 64 experts
                       S{1, 64, 8, 2, 16, RoutingKind::Uniform, DType::F32},        // one token
                       S{77, 192, 16, 4, 24, RoutingKind::OneExpert, DType::BF16},  // empty experts, odd T
                       S{0, 64, 8, 2, 16, RoutingKind::Uniform, DType::F32}}) {     // no tokens
        SCOPED_TRACE("T " + std::to_string(s.T) + " H " + std::to_string(s.H) + " E " + std::to_string(s.E) + " k " +
                     std::to_string(s.k));
        const MoeArRun run(*w, stream, s.T, s.H, s.E, s.k, s.n_loc, s.kind, seed++, s.out);
        run.call(*w, stream, TpMoeAlgo::Sequential);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        const std::vector<double> y_seq = run.y();
        run.check(y_seq, "sequential");
        run.call(*w, stream, TpMoeAlgo::Fused);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        const std::vector<double> y_fused = run.y();
        run.check(y_fused, "fused");
        const double rel = s.out == DType::F32 ? 1e-3 : 1.0 / 64;
        int bad = 0;
        for (std::size_t i = 0; i < y_seq.size(); ++i)
            if (!(std::abs(y_seq[i] - y_fused[i]) <= rel * (1 + std::abs(y_seq[i]))) && bad++ < 5)
                ADD_FAILURE() << "y[" << i << "]: fused " << y_fused[i] << ", sequential " << y_seq[i];
        EXPECT_EQ(bad, 0);
        // Every rank holds the same bits (the ranks summed in rank order everywhere).
        std::vector<float> mine(y_fused.begin(), y_fused.end());
        std::string same;
        const auto all = w->store().all_gather("test/moe_tp/ar_bits/" + std::to_string(seed),
                                               Bytes(reinterpret_cast<const uint8_t*>(mine.data()),
                                                     reinterpret_cast<const uint8_t*>(mine.data()) + mine.size() * 4));
        for (std::size_t q = 1; q < all.size(); ++q)
            if (all[q] != all[0]) same += "rank " + std::to_string(q) + " differs from rank 0; ";
        EXPECT_TRUE(same.empty()) << same;
    }
}

// Fused calls of two shapes alternating (the work counter carries over between calls of different item counts).
TEST_F(MoeTp, FusedMoeArAlternatingShapes) {
    const int W = w->world_size();
    if (W < 2) GTEST_SKIP() << "the fused algorithms need 2 or more ranks";
    const MoeArRun a(*w, stream, 300, 512, 8, 2, 16, RoutingKind::Skewed, 5300, DType::BF16);
    const MoeArRun b(*w, stream, 3, 64, 8, 4, 16, RoutingKind::Uniform, 5310, DType::F32);
    for (int i = 1; i <= 40; ++i) {
        const MoeArRun& run = i % 2 ? a : b;
        const bool checked = i <= 4 || i >= 37;
        run.call(*w, stream, TpMoeAlgo::Fused, checked);
        if (checked) {
            ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
            run.check(run.y(), "call " + std::to_string(i));
        }
    }
}

// Back-to-back fused calls (the receive halves alternate, the counters carry over), mixed with Sequential ones.
TEST_F(MoeTp, FusedMoeArBackToBack) {
    const int W = w->world_size();
    if (W < 2) GTEST_SKIP() << "the fused algorithms need 2 or more ranks";
    const MoeArRun run(*w, stream, 32, 128, 8, 2, 16, RoutingKind::Skewed, 5200, DType::BF16);
    for (int i = 1; i <= 300; ++i) {
        // Checked: the first calls, a Sequential call (25) and the Fused one after it, late calls.
        const bool checked = i == 1 || i == 2 || i == 25 || i == 26 || i == 150 || i == 300;
        run.call(*w, stream, i % 50 == 25 ? TpMoeAlgo::Sequential : TpMoeAlgo::Fused, checked);
        if (checked) {
            ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
            run.check(run.y(), "call " + std::to_string(i));
        }
    }
}

// ag_moe -> moe_rs and moe_ar captured in one CUDA graph (Auto: Sequential while capturing) after one eager
// Sequential round, replayed with poisoned outputs, eager Fused calls between the replays; every replay checked.
// Fused asked for inside the capture raises, naming the graph.
TEST_F(MoeTp, CudaGraphReplay) {
    const int W = w->world_size();
    const Layer L{24, 64, 8, 16 * W, 2, RoutingKind::Skewed};
    LayerRun layer(*w, L, 6000);
    const MoeArRun ar(*w, stream, 40, 64, 8, 2, 16, RoutingKind::Uniform, 6100);
    layer.call(*w, stream, TpMoeAlgo::Sequential, TpMoeAlgo::Sequential, true);
    ar.call(*w, stream, TpMoeAlgo::Sequential);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    w->barrier();
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    std::string err, fused_err;
    try {
        layer.call(*w, stream, TpMoeAlgo::Auto, TpMoeAlgo::Auto, false);
        ar.call(*w, stream, TpMoeAlgo::Auto, false);
        try {
            ar.call(*w, stream, TpMoeAlgo::Fused, false);
            fused_err = "no error";
        } catch (const Error& e) {
            fused_err = e.what();
        }
    } catch (const std::exception& e) {
        err = std::string("capture: ") + e.what();
    }
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    if (err.empty() && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) err = "graph instantiate failed";
    cudaGraphDestroy(graph);
    const std::string all = test::agree(*w, err, "test/moe_tp/graph_capture");
    ASSERT_TRUE(all.empty()) << all;
    // Fused refused in the capture: for its host-counted signals (W > 1), for the world size (W = 1).
    EXPECT_NE(fused_err.find(W > 1 ? "CUDA graph" : "fused cannot run here"), std::string::npos) << fused_err;
    for (int rep = 0; rep < 4; ++rep) {
        SCOPED_TRACE("replay " + std::to_string(rep));
        LOOM_CHECK_CUDA(
            cudaMemsetAsync(layer.d_h->p, 0xFF, static_cast<std::size_t>(layer.hv.rows) * layer.hv.cols * 2, stream));
        LOOM_CHECK_CUDA(
            cudaMemsetAsync(layer.d_y->p, 0xFF, static_cast<std::size_t>(layer.yv.rows) * layer.yv.cols * 4, stream));
        ar.poison(stream);
        ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        layer.check(layer.y(), "ag_moe -> moe_rs");
        ar.check(ar.y(), "moe_ar");
        if (W > 1 && rep == 1) {  // eager fused calls between replays: their own state, untouched by the graph
            layer.call(*w, stream, TpMoeAlgo::Fused, TpMoeAlgo::Fused, true);
            ar.call(*w, stream, TpMoeAlgo::Fused);
            ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
            layer.check(layer.y(), "eager fused ag_moe -> moe_rs");
            ar.check(ar.y(), "eager fused moe_ar");
        }
    }
    cudaGraphExecDestroy(exec);
}

TEST_F(MoeTp, BadInputsNameTheArgument) {
    const int W = w->world_size();
    const MoeRoutingShape shape{8 * W, 2, 4, W};
    Dev x(8 * 64 * 2), idx(8 * 2 * 4), up(5 * 16 * 64 * 2), route(moe_routing_bytes(shape)),
        out(static_cast<std::size_t>(shape.max_rows()) * 16 * 2);
    const MoeRouting routing = moe_routing_view(shape, route.p, moe_routing_bytes(shape));
    auto msg = [](auto&& f) {
        try {
            f();
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    const MatrixView xv{x.p, DType::BF16, 8, 64}, outv{out.p, DType::BF16, shape.max_rows(), 16};
    // w_up of 66 rows with a routing of 4 experts: no whole number of rows per expert. (5 experts' slices of 16
    // rows, 80, would read as 4 experts of 20 rows, which the out check names instead.)
    const std::string e1 = msg([&] {
        ag_moe(*w, xv, idx.as<int32_t>(), nullptr, {up.p, DType::BF16, 4 * 16 + 2, 64}, routing, outv, stream);
    });
    EXPECT_NE(e1.find("w_up: expected rows a positive multiple of the routing's num_experts (4)"), std::string::npos)
        << e1;
    const std::string e2 = msg([&] { (void)moe_routing_bytes({8, 5, 4}); });
    EXPECT_NE(e2.find("topk: expected <= num_experts (4), given 5"), std::string::npos) << e2;
    const std::string e3 = msg([&] {
        ag_moe(*w, {x.p, DType::BF16, 7, 64}, idx.as<int32_t>(), nullptr, {up.p, DType::BF16, 4 * 16, 64}, routing,
               outv, stream);
    });
    EXPECT_NE(e3.find("routing tokens"), std::string::npos) << e3;
    const std::string e4 = msg([&] {
        moe_ar(*w, outv, {up.p, DType::BF16, 4 * 64, 16}, routing, {x.p, DType::BF16, 8 * W, 64}, stream);
    });
    EXPECT_NE(e4.find("moe_ar: routing ranks: expected 1"), std::string::npos) << e4;
    if (W > 2) {  // neither the world size nor 1
        const MoeRoutingShape two{8 * W, 2, 4, 2};
        Dev route2(moe_routing_bytes(two));
        const MoeRouting r2 = moe_routing_view(two, route2.p, moe_routing_bytes(two));
        const std::string e = msg([&] {
            ag_moe(*w, xv, idx.as<int32_t>(), nullptr, {up.p, DType::BF16, 4 * 16, 64}, r2, outv, stream);
        });
        EXPECT_NE(
            e.find(fmt::format("ag_moe: routing ranks: expected the world size {} (source-major groups) or 1", W)),
            std::string::npos)
            << e;
    }
    // A fused call that cannot run names why.
    const MoeRoutingShape one{8, 2, 4};
    Dev route1(moe_routing_bytes(one));
    const MoeRouting r1 = moe_routing_view(one, route1.p, moe_routing_bytes(one));
    TpMoeOptions fused;
    fused.algo = TpMoeAlgo::Fused;
    if (W == 1) {
        const std::string e5 = msg([&] {
            moe_ar(*w, {out.p, DType::BF16, one.max_rows(), 16}, {up.p, DType::BF16, 4 * 64, 16}, r1,
                   {x.p, DType::BF16, 8, 64}, stream, fused);
        });
        EXPECT_NE(e5.find("moe_ar: opts.algo: fused cannot run here"), std::string::npos) << e5;
        const std::string e6 = msg([&] {
            ag_moe(*w, xv, idx.as<int32_t>(), nullptr, {up.p, DType::BF16, 4 * 16, 64}, routing, outv, stream, fused);
        });
        EXPECT_NE(e6.find("ag_moe: opts.algo: fused cannot run here"), std::string::npos) << e6;
    }
    // Mismatched expert counts: w_down of 5 experts' rows against a routing of 4 (moe_rs and moe_ar).
    const std::string e7 = msg([&] {
        moe_ar(*w, {out.p, DType::BF16, one.max_rows(), 16}, {up.p, DType::BF16, 4 * 64 + 3, 16}, r1,
               {x.p, DType::BF16, 8, 64}, stream);
    });
    EXPECT_NE(e7.find("moe_ar: w_down: expected rows a positive multiple of the routing's num_experts (4)"),
              std::string::npos)
        << e7;
    const std::string e8 = msg([&] {
        moe_rs(*w, outv, {up.p, DType::BF16, 4 * 64 + 3, 16}, routing, {x.p, DType::F32, 8, 64}, stream);
    });
    EXPECT_NE(e8.find("moe_rs: w_down: expected rows a positive multiple of the routing's num_experts (4)"),
              std::string::npos)
        << e8;
    if (W > 1) {
        // An expert-major routing (ranks 1) of tokens that the ranks cannot share evenly: nothing to scatter.
        const MoeRoutingShape odd{8 * W - 1, 2, 4};
        Dev route_odd(moe_routing_bytes(odd));
        const MoeRouting r_odd = moe_routing_view(odd, route_odd.p, moe_routing_bytes(odd));
        const std::string e = msg([&] {
            moe_rs(*w, {out.p, DType::BF16, odd.max_rows(), 16}, {up.p, DType::BF16, 4 * 64, 16}, r_odd,
                   {x.p, DType::F32, odd.tokens / W, 64}, stream);
        });
        EXPECT_NE(e.find(fmt::format("moe_rs: routing tokens: expected a multiple of the world size {}", W)),
                  std::string::npos)
            << e;
    }
    // Per-128-block scales cannot follow ag_moe's routed rows.
    TpMoeOptions blocks;
    blocks.gemm.scale_a_blocks = blocks.gemm.scale_b_blocks = x.as<float>();
    const std::string e9 = msg([&] {
        ag_moe(*w, xv, idx.as<int32_t>(), nullptr, {up.p, DType::BF16, 4 * 16, 64}, routing, outv, stream, blocks);
    });
    EXPECT_NE(e9.find("ag_moe: opts.gemm: expected no per-128-block scales"), std::string::npos) << e9;
    // Out-of-range expert ids on the device trap (a named diagnostic): tests/gpu/test_moe_routing.cpp runs that in a
    // child process, since a trap ends the CUDA context.
}

}  // namespace
}  // namespace loom
