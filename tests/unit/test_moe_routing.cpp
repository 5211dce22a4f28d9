// The routing utilities' host logic: shape checks, the routing buffer's layout, and the host reference's layout
// rules (which the GPU tests hold moe_route to).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/moe_reference.hpp"
#include "loom/ops/moe.hpp"
#include "loom/runtime/error.hpp"
#include "ops/moe/routing_internal.hpp"

namespace {

using loom::MoeRoutingShape;

std::string error_of(const MoeRoutingShape& s) {
    try {
        (void)loom::moe_routing_bytes(s);
    } catch (const loom::Error& e) {
        return e.what();
    }
    return "";
}

TEST(MoeRouting, ShapeChecksNameTheField) {
    EXPECT_NE(error_of({8, 3, 2}).find("topk: expected <= num_experts (2), given 3"), std::string::npos)
        << error_of({8, 3, 2});
    EXPECT_NE(error_of({8, 0, 4}).find("topk: expected 1..32, given 0"), std::string::npos);
    EXPECT_NE(error_of({8, 2, 0}).find("num_experts: expected >= 1, given 0"), std::string::npos);
    EXPECT_NE(error_of({9, 2, 4, 2}).find("expected a multiple of ranks (2), given 9"), std::string::npos);
    EXPECT_NE(error_of({8, 2, 4, 1, 0}).find("align: expected 1..4096, given 0"), std::string::npos);
    EXPECT_NE(error_of({8, 2, 4096, 4}).find("groups (ranks x num_experts): expected <= 8192"), std::string::npos);
    EXPECT_EQ(error_of({8, 2, 4}), "");
    EXPECT_EQ(error_of({0, 2, 4}), "");  // no tokens: an empty layout
}

TEST(MoeRouting, LayoutArraysAreAlignedAndDisjoint) {
    for (const MoeRoutingShape s : {MoeRoutingShape{1, 1, 1}, MoeRoutingShape{8192, 8, 128, 1, 128},
                                    MoeRoutingShape{1024, 6, 64, 8, 1}, MoeRoutingShape{0, 2, 8}}) {
        const loom::moe::RoutingLayout l = loom::moe::routing_layout(s);
        const std::size_t G = static_cast<std::size_t>(s.num_groups());
        const std::size_t at[] = {l.offsets, l.counts, l.dest_rows, l.row_tokens, l.weights, l.workspace, l.bytes};
        const std::size_t need[] = {(G + 1) * 4,
                                    G * 4,
                                    static_cast<std::size_t>(s.entries()) * 4,
                                    static_cast<std::size_t>(s.max_rows()) * 4,
                                    static_cast<std::size_t>(s.entries()) * 4,
                                    static_cast<std::size_t>(loom::moe::route_chunks(s)) * G * 4};
        for (int i = 0; i < 6; ++i) {
            EXPECT_EQ(at[i] % 256, 0u);
            EXPECT_GE(at[i + 1] - at[i], need[i]) << "array " << i;
        }
        EXPECT_EQ(loom::moe_routing_bytes(s), l.bytes);
    }
}

TEST(MoeRouting, ViewChecksTheBuffer) {
    const MoeRoutingShape s{64, 2, 8};
    std::vector<char> storage(loom::moe_routing_bytes(s) + 256);
    void* aligned = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(storage.data()) + 255) / 256 * 256);
    EXPECT_THROW((void)loom::moe_routing_view(s, aligned, loom::moe_routing_bytes(s) - 1), loom::Error);
    EXPECT_THROW((void)loom::moe_routing_view(s, static_cast<char*>(aligned) + 4, loom::moe_routing_bytes(s)),
                 loom::Error);
    EXPECT_THROW((void)loom::moe_routing_view(s, nullptr, loom::moe_routing_bytes(s)), loom::Error);
    const loom::MoeRouting r = loom::moe_routing_view(s, aligned, loom::moe_routing_bytes(s));
    EXPECT_EQ(static_cast<void*>(r.offsets), aligned);
    EXPECT_LT(static_cast<void*>(r.counts), static_cast<void*>(r.dest_rows));
}

// The reference layout: groups in (rank, expert) order, entry order within a group, padding rows without a token.
TEST(MoeRouting, ReferenceLayoutRules) {
    const MoeRoutingShape s{4, 2, 3, 2, 4};  // 2 ranks x 2 tokens, top-2 of 3 experts, groups padded to 4
    const std::vector<int32_t> idx = {2, 0, 0, 1, 1, 2, 2, 1};
    const loom::test::RoutingRef r = loom::test::route_reference(s, idx);
    EXPECT_EQ(r.counts, (std::vector<int32_t>{2, 1, 1, 0, 2, 2}));
    EXPECT_EQ(r.offsets, (std::vector<int32_t>{0, 4, 8, 12, 12, 16, 20}));
    EXPECT_EQ(r.dest_rows, (std::vector<int32_t>{8, 0, 1, 4, 12, 16, 17, 13}));
    EXPECT_EQ(r.row_tokens[0], 0);
    EXPECT_EQ(r.row_tokens[1], 1);
    EXPECT_EQ(r.row_tokens[2], -1);
    EXPECT_EQ(r.row_tokens[12], 2);
    EXPECT_EQ(r.row_tokens[13], 3);
    EXPECT_EQ(r.row_tokens[16], 2);
}

TEST(MoeRouting, GeneratorsGiveDistinctInRangeExperts) {
    using loom::test::RoutingKind;
    for (RoutingKind k : {RoutingKind::Uniform, RoutingKind::Skewed, RoutingKind::OneExpert}) {
        const std::vector<int32_t> idx = loom::test::make_routing(k, 100, 4, 16, 7);
        for (int t = 0; t < 100; ++t)
            for (int s = 0; s < 4; ++s) {
                const int32_t e = idx[t * 4 + s];
                EXPECT_GE(e, 0);
                EXPECT_LT(e, 16);
                for (int u = 0; u < s; ++u) EXPECT_NE(idx[t * 4 + u], e);
            }
    }
}

}  // namespace
