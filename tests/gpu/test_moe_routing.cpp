// The MoE routing utilities on a GPU against the host reference (tests/common/moe_reference.hpp): the layout
// (offsets, counts, every entry's row, every row's token) exactly, permute bitwise with zero padding rows, the
// weighted top-k reduce against a double reference; uniform, skewed and one-expert routings, (rank, expert) groups,
// block alignment, no tokens. Run: build/tests/loom_gpu_tests --gtest_filter='MoeRouting*'
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/child_process.hpp"
#include "common/moe_reference.hpp"
#include "common/reference.hpp"
#include "common/test_env.hpp"
#include "loom/ops/moe.hpp"
#include "loom/runtime/error.hpp"

namespace {

using loom::test::RoutingKind;

template <class T>
struct Dev {
    T* p = nullptr;
    std::size_t n = 0;
    explicit Dev(std::size_t count) : n(count ? count : 1) {
        LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)));
        LOOM_CHECK_CUDA(cudaMemset(p, 0xA5, n * sizeof(T)));  // poison
    }
    ~Dev() { cudaFree(p); }
    Dev(const Dev&) = delete;
    void upload(const std::vector<T>& h) {
        LOOM_CHECK_CUDA(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    std::vector<T> download(std::size_t count) const {
        std::vector<T> h(count);
        LOOM_CHECK_CUDA(cudaMemcpy(h.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost));
        return h;
    }
};

struct Case {
    loom::MoeRoutingShape shape;
    RoutingKind kind;
    int hidden;
};

std::string name(const Case& c) {
    return "T" + std::to_string(c.shape.tokens) + " k" + std::to_string(c.shape.topk) + " E" +
           std::to_string(c.shape.num_experts) + " W" + std::to_string(c.shape.ranks) + " align" +
           std::to_string(c.shape.align) + " kind" + std::to_string(static_cast<int>(c.kind)) + " H" +
           std::to_string(c.hidden);
}

void run_case(const Case& c, uint64_t seed) {
    SCOPED_TRACE(name(c));
    const loom::MoeRoutingShape& s = c.shape;
    const std::vector<int32_t> idx = loom::test::make_routing(c.kind, s.tokens, s.topk, s.num_experts, seed);
    const std::vector<float> w = loom::test::make_topk_weights(s.tokens, s.topk, seed + 1);
    const loom::test::RoutingRef ref = loom::test::route_reference(s, idx);

    Dev<int32_t> d_idx(idx.size());
    Dev<float> d_w(w.size());
    d_idx.upload(idx);
    d_w.upload(w);
    Dev<char> buf(loom::moe_routing_bytes(s));
    const loom::MoeRouting r = loom::moe_routing_view(s, buf.p, loom::moe_routing_bytes(s));
    loom::moe_route(d_idx.p, d_w.p, r, nullptr);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());

    const int G = s.num_groups();
    auto offsets = std::vector<int32_t>(G + 1), counts = std::vector<int32_t>(G);
    LOOM_CHECK_CUDA(cudaMemcpy(offsets.data(), r.offsets, (G + 1) * 4, cudaMemcpyDeviceToHost));
    LOOM_CHECK_CUDA(cudaMemcpy(counts.data(), r.counts, G * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(offsets, ref.offsets);
    EXPECT_EQ(counts, ref.counts);
    std::vector<int32_t> dest(s.entries()), row_tokens(s.max_rows());
    std::vector<float> weights(s.entries());
    if (s.entries() > 0) {
        LOOM_CHECK_CUDA(cudaMemcpy(dest.data(), r.dest_rows, dest.size() * 4, cudaMemcpyDeviceToHost));
        LOOM_CHECK_CUDA(cudaMemcpy(row_tokens.data(), r.row_tokens, row_tokens.size() * 4, cudaMemcpyDeviceToHost));
        LOOM_CHECK_CUDA(cudaMemcpy(weights.data(), r.weights, weights.size() * 4, cudaMemcpyDeviceToHost));
    }
    EXPECT_EQ(dest, ref.dest_rows);
    EXPECT_EQ(row_tokens, ref.row_tokens);
    EXPECT_EQ(std::memcmp(weights.data(), w.data(), w.size() * 4), 0);

    // permute: bf16 rows, an odd hidden size moves 2-byte words, a multiple of 8 moves 16-byte words.
    const int H = c.hidden;
    std::vector<uint16_t> x(static_cast<std::size_t>(s.tokens) * H);
    // Values in [-1, 1) (random bit patterns span 1e-38..1e38: the reduce's check would see only the largest term).
    const std::vector<float> xf = loom::test::random_floats(x.size(), seed);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = loom::test::float_to_bf16(xf[i]);
    Dev<uint16_t> d_x(x.size()), d_rows(static_cast<std::size_t>(s.max_rows()) * H);
    d_x.upload(x);
    const loom::MatrixView xv{d_x.p, loom::DType::BF16, s.tokens, H};
    const loom::MatrixView rv{d_rows.p, loom::DType::BF16, s.max_rows(), H};
    loom::moe_permute(xv, r, rv, nullptr);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<uint16_t> rows = d_rows.download(static_cast<std::size_t>(s.max_rows()) * H);
    int64_t bad = 0;
    for (int64_t row = 0; row < s.max_rows(); ++row) {
        const int32_t t = ref.row_tokens[row];
        for (int col = 0; col < H; ++col) {
            const uint16_t got = rows[row * H + col];
            const uint16_t want = row >= ref.offsets[G] ? 0xA5A5 : t < 0 ? 0 : x[static_cast<std::size_t>(t) * H + col];
            if (got != want && bad++ < 5)
                ADD_FAILURE() << "rows[" << row << ", " << col << "] = " << got << ", want " << want;
        }
    }
    EXPECT_EQ(bad, 0);

    // top-k reduce of the permuted rows (as bf16 values) into fp32 and bf16 outputs.
    std::vector<double> rows_d(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) rows_d[i] = loom::test::bf16_to_float(rows[i]);
    const std::vector<double> want = loom::test::topk_reduce_reference(rows_d, H, ref.dest_rows, w, s.tokens, s.topk);
    Dev<float> d_y(static_cast<std::size_t>(s.tokens) * H);
    loom::moe_topk_reduce(rv, r, loom::MatrixView{d_y.p, loom::DType::F32, s.tokens, H}, nullptr);
    Dev<uint16_t> d_yb(static_cast<std::size_t>(s.tokens) * H);
    loom::moe_topk_reduce(rv, r, loom::MatrixView{d_yb.p, loom::DType::BF16, s.tokens, H}, nullptr);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<float> y = d_y.download(want.size());
    const std::vector<uint16_t> yb = d_yb.download(want.size());
    bad = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
        const double tol = 1e-5 * (1 + std::abs(want[i]));
        const double tol_b = 1e-2 * (1 + std::abs(want[i]));  // one bf16 rounding of the fp32 sum
        if (!(std::abs(y[i] - want[i]) <= tol && std::abs(loom::test::bf16_to_float(yb[i]) - want[i]) <= tol_b) &&
            bad++ < 5)
            ADD_FAILURE() << "y[" << i << "] = " << y[i] << " / " << loom::test::bf16_to_float(yb[i]) << ", want "
                          << want[i];
    }
    EXPECT_EQ(bad, 0);
}

TEST(MoeRouting, LayoutPermuteReduceMatchReference) {
    LOOM_REQUIRE_GPU();
    const Case cases[] = {
        {{128, 2, 8}, RoutingKind::Uniform, 64},
        {{1000, 8, 128}, RoutingKind::Uniform, 33},
        {{1000, 8, 128}, RoutingKind::Skewed, 40},
        {{777, 6, 64, 1, 128}, RoutingKind::OneExpert, 24},
        {{8192, 4, 60}, RoutingKind::Skewed, 16},
        {{512, 2, 8, 4}, RoutingKind::Uniform, 72},       // (rank, expert) groups, G = 32
        {{1024, 8, 128, 8, 64}, RoutingKind::Skewed, 8},  // G = 1024, aligned
        {{1, 1, 1}, RoutingKind::Uniform, 8},
        {{0, 2, 8}, RoutingKind::Uniform, 8},  // no tokens: offsets all 0
        {{300, 32, 256}, RoutingKind::Uniform, 8},
    };
    uint64_t seed = std::random_device{}();
    for (const Case& c : cases) run_case(c, seed++);
}

TEST(MoeRouting, BadExpertIdTrapsWithNamedDiagnostic) {
    LOOM_REQUIRE_GPU();
    const auto [status, output] = loom::test::run_child("moe-bad-expert", {});
    EXPECT_EQ(status, 3) << output;
    EXPECT_NE(output.find("moe_route topk_idx"), std::string::npos) << output;
    EXPECT_NE(output.find("index 8"), std::string::npos) << output;
}

TEST(MoeRouting, HostChecksNameTheArgument) {
    LOOM_REQUIRE_GPU();
    const loom::MoeRoutingShape s{16, 2, 8};
    Dev<char> buf(loom::moe_routing_bytes(s));
    const loom::MoeRouting r = loom::moe_routing_view(s, buf.p, loom::moe_routing_bytes(s));
    Dev<uint16_t> x(16 * 32), rows(32 * 32);
    auto msg = [](auto&& f) {
        try {
            f();
        } catch (const loom::Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    EXPECT_NE(msg([&] {
                  loom::moe_permute({x.p, loom::DType::BF16, 15, 32}, r, {rows.p, loom::DType::BF16, 32, 32}, nullptr);
              }).find("x: expected 16 rows"),
              std::string::npos);
    EXPECT_NE(msg([&] {
                  loom::moe_permute({x.p, loom::DType::BF16, 16, 32}, r, {rows.p, loom::DType::BF16, 31, 32}, nullptr);
              }).find("rows: expected >= 32 rows"),
              std::string::npos);
    EXPECT_NE(
        msg([&] {
            loom::moe_topk_reduce({rows.p, loom::DType::U8, 32, 32}, r, {x.p, loom::DType::BF16, 16, 32}, nullptr);
        }).find("rows: expected dtype f32, f16 or bf16, given u8"),
        std::string::npos);
}

}  // namespace
