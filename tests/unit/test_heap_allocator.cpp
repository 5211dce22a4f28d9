// The symmetric heap's offset bookkeeping (pure CPU): alignment, reuse, coalescing, exhaustion, bad frees.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "loom/runtime/error.hpp"
#include "runtime/heap_allocator.hpp"

namespace {

using loom::detail::HeapAllocator;

TEST(HeapAllocator, FirstFitRespectsAlignment) {
    HeapAllocator a(1 << 20);
    EXPECT_EQ(a.allocate(100, 256), 0u);
    EXPECT_EQ(a.allocate(1, 4096), 4096u);   // 256..4095 stays free as padding
    EXPECT_EQ(a.allocate(3000, 256), 256u);  // first fit goes back into the padding
    EXPECT_EQ(a.allocate(8, 8), 104u);       // the hole before 256 (100..255), aligned to 8
    EXPECT_EQ(a.num_allocations(), 4u);
    EXPECT_EQ(a.used(), 100u + 1 + 3000 + 8);
    for (std::size_t align : {1u, 2u, 64u, 1024u, 65536u}) {
        auto off = a.allocate(77, align);
        ASSERT_TRUE(off);
        EXPECT_EQ(*off % align, 0u) << "alignment " << align;
    }
}

TEST(HeapAllocator, ReusesFreedOffsetsDeterministically) {
    HeapAllocator a(1 << 16);
    auto x = a.allocate(4096, 256), y = a.allocate(4096, 256), z = a.allocate(4096, 256);
    ASSERT_TRUE(x && y && z);
    EXPECT_EQ(a.free(*y), 4096u);
    EXPECT_EQ(a.allocate(4096, 256), y);  // the hole is reused
    EXPECT_EQ(a.free(*y), 4096u);
    EXPECT_EQ(a.allocate(1000, 256), y);  // a smaller request lands in the same hole
    EXPECT_EQ(a.allocate(3000, 256), *y + 1024);
    // The same sequence of calls on fresh allocators gives the same offsets (what makes them symmetric).
    auto run = [] {
        HeapAllocator h(1 << 16);
        auto p = h.allocate(5000, 512), q = h.allocate(100, 4096);
        h.free(*p);
        auto r = h.allocate(64, 64);
        return std::vector<std::size_t>{*p, *q, *r};
    };
    EXPECT_EQ(run(), run());
}

TEST(HeapAllocator, CoalescesNeighbours) {
    HeapAllocator a(3 * 4096);
    auto x = a.allocate(4096, 4096), y = a.allocate(4096, 4096), z = a.allocate(4096, 4096);
    ASSERT_TRUE(x && y && z);
    EXPECT_FALSE(a.allocate(1, 1));
    a.free(*x);
    a.free(*z);
    EXPECT_EQ(a.num_free_blocks(), 2u);
    EXPECT_EQ(a.largest_free_block(), 4096u);
    EXPECT_FALSE(a.allocate(8192, 1));  // two separate 4 KiB holes do not make 8 KiB
    a.free(*y);                         // merges with both neighbours
    EXPECT_EQ(a.num_free_blocks(), 1u);
    EXPECT_EQ(a.largest_free_block(), 3u * 4096);
    EXPECT_EQ(a.allocate(3 * 4096, 4096), 0u);
}

TEST(HeapAllocator, ExhaustionReturnsNothingAndKeepsState) {
    HeapAllocator a(10000);
    EXPECT_FALSE(a.allocate(10001, 1));
    EXPECT_EQ(a.allocate(10000, 1), 0u);
    EXPECT_FALSE(a.allocate(1, 1));
    EXPECT_EQ(a.used(), 10000u);
    EXPECT_EQ(a.largest_free_block(), 0u);
    HeapAllocator b(4096 + 100);
    ASSERT_EQ(b.allocate(100, 1), 0u);
    EXPECT_FALSE(b.allocate(4096, 4096));  // 4096 bytes are free but not at an aligned offset with room
    EXPECT_EQ(b.largest_free_block(), 4096u);
    HeapAllocator huge(~std::size_t{0} - 10);
    EXPECT_FALSE(huge.allocate(~std::size_t{0} - 5, 1));
    ASSERT_TRUE(huge.allocate(16, 1));
    EXPECT_EQ(huge.allocate(16, std::size_t{1} << 63), std::size_t{1} << 63);
}

TEST(HeapAllocator, BadRequestsRaise) {
    HeapAllocator a(1 << 20);
    EXPECT_THROW(a.allocate(0, 256), loom::Error);
    EXPECT_THROW(a.allocate(16, 0), loom::Error);
    EXPECT_THROW(a.allocate(16, 48), loom::Error);
    auto x = a.allocate(4096, 256);
    ASSERT_TRUE(x);
    EXPECT_THROW(a.free(*x + 16), loom::Error);  // inside an allocation but not its start
    EXPECT_THROW(a.free(1 << 19), loom::Error);  // never allocated
    a.free(*x);
    try {
        a.free(*x);  // double free
        FAIL() << "double free did not raise";
    } catch (const loom::Error& e) {
        EXPECT_NE(std::string(e.what()).find("expected the start of a live allocation"), std::string::npos) << e.what();
    }
}

TEST(HeapAllocator, LooksUpAllocations) {
    HeapAllocator a(1 << 20);
    auto x = a.allocate(1000, 256), y = a.allocate(24, 256);
    ASSERT_TRUE(x && y);
    EXPECT_EQ(a.allocation_size(*x), 1000u);
    EXPECT_FALSE(a.allocation_size(*x + 1));
    EXPECT_EQ(a.allocation_containing(*x + 999), std::make_pair(*x, std::size_t{1000}));
    EXPECT_FALSE(a.allocation_containing(*x + 1000));  // padding between x and y
    EXPECT_EQ(a.allocation_containing(*y), std::make_pair(*y, std::size_t{24}));
}

// Random sequences against a brute-force model: no overlap, alignment kept, everything merges back at the end.
TEST(HeapAllocator, RandomSequencesKeepInvariants) {
    std::mt19937_64 rng(1234);
    const std::size_t cap = 1 << 20;
    HeapAllocator a(cap);
    std::map<std::size_t, std::size_t> live;
    for (int step = 0; step < 20000; ++step) {
        if (live.empty() || rng() % 3 != 0) {
            std::size_t bytes = 1 + rng() % 20000, align = std::size_t{1} << (rng() % 13);
            auto off = a.allocate(bytes, align);
            if (!off) {
                EXPECT_LT(a.largest_free_block(), bytes + align);
                continue;
            }
            ASSERT_EQ(*off % align, 0u);
            ASSERT_LE(*off + bytes, cap);
            auto next = live.lower_bound(*off);
            if (next != live.end()) {
                ASSERT_LE(*off + bytes, next->first) << "overlaps the next allocation";
            }
            if (next != live.begin()) {
                auto prev = std::prev(next);
                ASSERT_LE(prev->first + prev->second, *off) << "overlaps the previous allocation";
            }
            live.emplace(*off, bytes);
        } else {
            auto it = live.begin();
            std::advance(it, rng() % live.size());
            ASSERT_EQ(a.free(it->first), it->second);
            live.erase(it);
        }
        std::size_t used = 0;
        for (auto& [o, s] : live) used += s;
        ASSERT_EQ(a.used(), used);
    }
    for (auto& [o, s] : live) a.free(o);
    EXPECT_EQ(a.num_free_blocks(), 1u);
    EXPECT_EQ(a.largest_free_block(), cap);
}

}  // namespace
