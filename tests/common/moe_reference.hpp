// Host references of the MoE routing utilities and of routed expert products (tests and the TP-MoE example's
// checks), and routing generators (uniform, skewed, empty experts).
#pragma once

#include <cstdint>
#include <vector>

#include "loom/ops/moe.hpp"

namespace loom::test {

// The layout moe_route must produce for `shape` (same rules: groups (t / tokens_per_rank) * E + e, entry order within a
// group, sizes padded to align).
struct RoutingRef {
    std::vector<int32_t> offsets, counts, dest_rows, row_tokens;  // row_tokens: max_rows entries, -1 where no token
};
RoutingRef route_reference(const MoeRoutingShape& shape, const std::vector<int32_t>& topk_idx);

enum class RoutingKind {
    Uniform,    // k distinct experts per token, uniformly at random
    Skewed,     // most tokens' first slot goes to expert 0, the rest crowd into the first quarter of the experts
    OneExpert,  // every token's first slot on expert E - 1 (others distinct, from the low experts): the rest empty
};
// topk_idx [tokens, k]: distinct experts per token (k <= E).
std::vector<int32_t> make_routing(RoutingKind kind, int tokens, int topk, int num_experts, uint64_t seed);
// weights [tokens, k] in (0, 1), each token's summing to 1.
std::vector<float> make_topk_weights(int tokens, int topk, uint64_t seed);

// y[t] = sum_s w[t, s] * rows[dest(t, s)] in double; rows [*, cols] as doubles.
std::vector<double> topk_reduce_reference(const std::vector<double>& rows, int64_t cols,
                                          const std::vector<int32_t>& dest_rows, const std::vector<float>& weights,
                                          int tokens, int topk);

}  // namespace loom::test
