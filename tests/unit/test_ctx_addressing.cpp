// The Ctx's symmetric addressing on the host (the same inline code the device runs): heaps back to back, a peer's
// heap by arithmetic from heap[0], own-heap membership at both ends, unreachable peers.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "loom/lang/context.cuh"

namespace {

// A node of `local_world` ranks, this one `local_rank`, node `node`; heaps of `heap_size` bytes back to back in
// `backing` (as the runtime maps them).
loom::Ctx make_ctx(std::vector<char>& backing, int local_world, int local_rank, int node, std::uint64_t heap_size) {
    backing.assign(static_cast<std::size_t>(local_world) * heap_size, 0);
    loom::Ctx c{};
    c.local_world = local_world;
    c.local_rank = local_rank;
    c.node = node;
    c.local_base_rank = node * local_world;
    c.rank = c.local_base_rank + local_rank;
    c.world = 2 * local_world;  // a second node exists: its ranks are not reachable
    c.heap_size = heap_size;
    for (int i = 0; i < local_world; ++i) c.heap[i] = backing.data() + static_cast<std::uint64_t>(i) * heap_size;
    return c;
}

TEST(CtxAddressing, PeerHeapsAreArithmeticFromTheFirst) {
    std::vector<char> backing;
    const loom::Ctx c = make_ctx(backing, 4, 2, 1, 4096);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(c.heap_of(c.local_base_rank + i), c.heap[i]) << i;
}

TEST(CtxAddressing, OwnHeapMembershipAtBothEnds) {
    std::vector<char> backing;
    const loom::Ctx c = make_ctx(backing, 4, 2, 0, 4096);
    char* const own = c.heap[2];
    EXPECT_TRUE(c.is_symmetric(own));
    EXPECT_TRUE(c.is_symmetric(own + 4095));
    EXPECT_FALSE(c.is_symmetric(own + 4096));  // the next rank's heap
    EXPECT_FALSE(c.is_symmetric(own - 1));     // the previous rank's heap
    EXPECT_FALSE(c.is_symmetric(c.heap[0]));
    EXPECT_EQ(c.own_offset(own + 100), 100u);
    int on_stack = 0;
    EXPECT_FALSE(c.is_symmetric(&on_stack));
}

TEST(CtxAddressing, SymmAtArithmeticMatchesTheTable) {
    // symm_at(p, peer) = p + (peer - rank) * heap_size must be heap[peer's local index] + (p - own heap).
    std::vector<char> backing;
    const loom::Ctx c = make_ctx(backing, 8, 5, 1, 1 << 16);
    char* const p = c.heap[5] + 12345;
    for (int peer = c.local_base_rank; peer < c.local_base_rank + c.local_world; ++peer) {
        ASSERT_TRUE(c.reachable(peer));
        char* const via_arithmetic =
            p + static_cast<std::int64_t>(peer - c.rank) * static_cast<std::int64_t>(c.heap_size);
        EXPECT_EQ(via_arithmetic, c.heap[peer - c.local_base_rank] + 12345) << peer;
        EXPECT_EQ(via_arithmetic, c.heap_of(peer) + c.own_offset(p)) << peer;
    }
    EXPECT_FALSE(c.reachable(c.local_base_rank - 1));              // node 0
    EXPECT_FALSE(c.reachable(c.local_base_rank + c.local_world));  // past this node
}

TEST(CtxAddressing, NoHeapMeansNothingIsSymmetric) {
    loom::Ctx c{};
    c.local_world = 1;
    int x = 0;
    EXPECT_FALSE(c.is_symmetric(&x));
    EXPECT_FALSE(c.is_symmetric(nullptr));
}

}  // namespace
