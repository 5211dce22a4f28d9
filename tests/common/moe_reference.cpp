#include "common/moe_reference.hpp"

#include <algorithm>
#include <numeric>
#include <random>

#include "common/reference.hpp"

namespace loom::test {

RoutingRef route_reference(const MoeRoutingShape& s, const std::vector<int32_t>& topk_idx) {
    const int G = s.num_groups();
    const int per_rank = std::max(1, s.tokens / s.ranks);
    auto group = [&](int64_t j) { return static_cast<int>(j / s.topk / per_rank) * s.num_experts + topk_idx[j]; };
    RoutingRef r;
    r.counts.assign(G, 0);
    for (int64_t j = 0; j < s.entries(); ++j) ++r.counts[group(j)];
    r.offsets.assign(G + 1, 0);
    for (int g = 0; g < G; ++g) r.offsets[g + 1] = r.offsets[g] + (r.counts[g] + s.align - 1) / s.align * s.align;
    r.row_tokens.assign(static_cast<std::size_t>(s.max_rows()), -1);
    r.dest_rows.assign(static_cast<std::size_t>(s.entries()), -1);
    std::vector<int32_t> next(r.offsets.begin(), r.offsets.end() - 1);
    for (int64_t j = 0; j < s.entries(); ++j) {
        const int32_t row = next[group(j)]++;
        r.dest_rows[j] = row;
        r.row_tokens[row] = static_cast<int32_t>(j / s.topk);
    }
    return r;
}

std::vector<int32_t> make_routing(RoutingKind kind, int tokens, int topk, int num_experts, uint64_t seed) {
    std::mt19937_64 rng(run_seed(seed));
    std::vector<int32_t> idx(static_cast<std::size_t>(tokens) * topk);
    std::vector<int32_t> experts(num_experts);
    for (int t = 0; t < tokens; ++t) {
        std::iota(experts.begin(), experts.end(), 0);
        if (kind == RoutingKind::Uniform) {
            std::shuffle(experts.begin(), experts.end(), rng);
        } else if (kind == RoutingKind::Skewed) {
            const int low = std::max(topk, num_experts / 4);
            std::shuffle(experts.begin(), experts.begin() + low, rng);
            if (rng() % 8 != 0) {  // 7 of 8 tokens: expert 0 first
                std::swap(*std::find(experts.begin(), experts.end(), 0), experts[0]);
            }
        } else {
            std::swap(experts[0], experts[num_experts - 1]);  // E - 1 first, then 1, 2, ... (0 moved to the end)
            std::shuffle(experts.begin() + 1, experts.begin() + std::min(num_experts - 1, topk + 1), rng);
        }
        for (int s = 0; s < topk; ++s) idx[static_cast<std::size_t>(t) * topk + s] = experts[s];
    }
    return idx;
}

std::vector<float> make_topk_weights(int tokens, int topk, uint64_t seed) {
    std::mt19937_64 rng(run_seed(seed));
    std::uniform_real_distribution<float> u(0.05f, 1.f);
    std::vector<float> w(static_cast<std::size_t>(tokens) * topk);
    for (int t = 0; t < tokens; ++t) {
        float sum = 0;
        for (int s = 0; s < topk; ++s) sum += (w[static_cast<std::size_t>(t) * topk + s] = u(rng));
        for (int s = 0; s < topk; ++s) w[static_cast<std::size_t>(t) * topk + s] /= sum;
    }
    return w;
}

std::vector<double> topk_reduce_reference(const std::vector<double>& rows, int64_t cols,
                                          const std::vector<int32_t>& dest_rows, const std::vector<float>& weights,
                                          int tokens, int topk) {
    std::vector<double> y(static_cast<std::size_t>(tokens) * cols, 0.0);
    for (int t = 0; t < tokens; ++t)
        for (int s = 0; s < topk; ++s) {
            const std::size_t j = static_cast<std::size_t>(t) * topk + s;
            const double w = weights.empty() ? 1.0 : weights[j];
            for (int64_t c = 0; c < cols; ++c)
                y[static_cast<std::size_t>(t) * cols + c] +=
                    w * rows[static_cast<std::size_t>(dest_rows[j]) * cols + c];
        }
    return y;
}

}  // namespace loom::test
