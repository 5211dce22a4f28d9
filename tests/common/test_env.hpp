// Shared test support: the world-aware GoogleTest environment and GPU skips.
//
// loom_dist_tests runs one process per rank under loomrun; LoomTestEnv owns the World (created on first use),
// and only rank 0 prints GoogleTest's output. Fixtures skip with a clear message when there is no GPU.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>

#include "loom/ops/collectives.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/store.hpp"
#include "loom/runtime/world.hpp"

namespace loom::test {

// The process's World for multi-rank tests (created from the environment on first call).
World& world();
// True when a GPU and driver are present.
bool has_gpu();

// Every rank's verdict (`mine`: "" = passed), gathered through the store under `tag`: "" when every rank passed,
// else one line per failing rank. Every rank calls it at the same point; assert on the result, so that all ranks
// fail together and the next collective step still finds every peer (no hang until loomrun's timeout).
inline std::string agree(World& w, const std::string& mine, const std::string& tag) {
    const auto all = w.store().all_gather(tag, Bytes(mine.begin(), mine.end()));
    std::string s;
    for (std::size_t r = 0; r < all.size(); ++r)
        if (!all[r].empty()) s += "rank " + std::to_string(r) + ": " + std::string(all[r].begin(), all[r].end()) + "\n";
    return s;
}

}  // namespace loom::test

// Skip the current test when no GPU is present, saying why.
#define LOOM_REQUIRE_GPU()                                                                                \
    do {                                                                                                  \
        if (!::loom::test::has_gpu()) GTEST_SKIP() << "no GPU: " << ::loom::driver::unavailable_reason(); \
    } while (0)

// Fixture of multi-rank GPU tests: the World and a non-blocking stream (skipped without a GPU). TearDown hands
// back the symmetric state the ops keep per World (collectives' scratch, overlapped ops' signals and buffers), so
// every suite starts from an empty heap (SymmetricHeap checks exactly that); both calls are collective and no-ops
// when nothing is held.
class WorldStreamTest : public ::testing::Test {
  protected:
    void SetUp() override {
        LOOM_REQUIRE_GPU();
        w = &::loom::test::world();
        ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    }
    void TearDown() override {
        if (w && stream) {
            ::loom::release_overlap_state(*w);
            ::loom::release_collective_state(*w);
        }
        if (stream) cudaStreamDestroy(stream);
    }
    ::loom::World* w = nullptr;
    cudaStream_t stream = nullptr;
};

// Why a test of cross-node algorithms skips in a World of one node.
inline constexpr const char* kNeedsNodes =
    "needs a World of several nodes: run under loomrun with LOOM_NODE_SIZE=k (emulated nodes of k ranks, "
    "docs/crossnode.md), or on several hosts";

// A WorldStreamTest of the cross-node algorithms: skipped in a World of one node.
class MultiNodeTest : public WorldStreamTest {
  protected:
    void SetUp() override {
        WorldStreamTest::SetUp();
        if (IsSkipped()) return;
        if (w->num_nodes() == 1) GTEST_SKIP() << kNeedsNodes;
    }
    // Every rank's device idle, then a barrier of the World named `tag`.
    void sync_all(const std::string& tag) {
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        w->barrier(tag);
    }
};
