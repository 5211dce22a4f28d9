// Cross-node Worlds and the language's remote column, on one machine through the emulated multi-node mode:
// LOOM_NODE_SIZE splits loomrun's ranks into nodes whose peers are reached only through NVSHMEM.
//
// Run (docs/crossnode.md):
//   LOOM_NODE_SIZE=2 build/bin/loomrun -n 4 build/tests/loom_dist_tests --gtest_filter='CrossNode*'   # 2 nodes x 2
//   LOOM_NODE_SIZE=4 build/bin/loomrun -n 8 build/tests/loom_dist_tests --gtest_filter='CrossNode*'   # 2 nodes x 4
//   LOOM_NODE_SIZE=2 build/bin/loomrun -n 8 build/tests/loom_dist_tests --gtest_filter='CrossNode*'   # 4 nodes x 2
// Without LOOM_NODE_SIZE the same tests run on one node: the kernels compiled with remote peers then take only the
// load/store paths and NVSHMEM is never initialised.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/child_process.hpp"
#include "common/test_env.hpp"
#include "loom/jit/jit.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/nvshmem.hpp"
#include "loom/runtime/settings.hpp"

namespace {

using loom::jit::LaunchConfig;

const char* const kGroups[] = {"loom::lang::Thread", "loom::lang::Warp", "loom::lang::Block"};

// tests/dist/kernels/crossnode.cuh's kernel `name`, compiled with remote peers unless `remote` is false.
const loom::jit::Kernel& xnode_kernel(const std::string& name, std::vector<std::string> targs = {},
                                      bool remote = true) {
    loom::jit::KernelSpec spec;
    spec.header = std::string(LOOM_SOURCE_DIR) + "/tests/dist/kernels/crossnode.cuh";
    spec.name = "xnode_test::" + name;
    spec.template_args = std::move(targs);
    spec.remote_peers = remote;
    return loom::jit::get_kernel(spec);
}

// The device's xnode_test::word.
uint32_t word(uint32_t sender, uint32_t dest, uint64_t round, uint32_t i) {
    uint32_t x =
        sender * 0x9E3779B9u ^ dest * 0x7F4A7C15u ^ static_cast<uint32_t>(round) * 0x85EBCA6Bu ^ i * 0xC2B2AE35u;
    x ^= x >> 15;
    return x * 0x2C1B3C6Du;
}
uint8_t byte_of(uint32_t sender, uint32_t dest, uint64_t variant, uint64_t i) {
    return static_cast<uint8_t>(word(sender, dest, variant, static_cast<uint32_t>(i)) >> 8);
}

// The peer this rank sends to in the message-passing tests: the same local rank on the next node (a remote peer),
// or the next rank in a one-node World.
int next_peer(const loom::World& w) {
    return w.num_nodes() > 1 ? (w.rank() + w.local_world_size()) % w.world_size() : (w.rank() + 1) % w.world_size();
}
int prev_peer(const loom::World& w) {
    const int step = w.num_nodes() > 1 ? w.local_world_size() : 1;
    return (w.rank() - step + w.world_size()) % w.world_size();
}

void sync_and_meet(loom::World& w, const std::string& tag) {
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    w.barrier(tag);
}

TEST(CrossNode, WorldSplitsIntoNodesAndLeavesRemotePeersOutOfThePeerTable) {
    LOOM_REQUIRE_GPU();
    auto& w = loom::test::world();
    const int node_size = loom::settings().rank.node_size;
    if (node_size) {
        EXPECT_EQ(w.local_world_size(), node_size);
        EXPECT_EQ(w.num_nodes(), w.world_size() / node_size);
    }
    EXPECT_EQ(w.node(), w.rank() / w.local_world_size());
    EXPECT_EQ(w.local_rank(), w.rank() % w.local_world_size());
    const loom::Ctx c = w.ctx();
    EXPECT_EQ(c.num_nodes(), w.num_nodes());
    // NVSHMEM is initialised by (and only by) a World of several nodes, which registers the heap with it.
    EXPECT_EQ(c.remote_heap != nullptr, w.num_nodes() > 1);
    EXPECT_EQ(loom::nvshmem::initialized(), w.num_nodes() > 1);
    if (w.num_nodes() > 1) {
        EXPECT_EQ(loom::nvshmem::my_pe(), w.rank());
        EXPECT_EQ(loom::nvshmem::n_pes(), w.world_size());
    }
    // The peer table holds the node's heaps only: nothing reaches a remote peer by load/store.
    for (int i = 0; i < loom::kMaxLocalPeers; ++i)
        EXPECT_EQ(c.heap[i] != nullptr, i < w.local_world_size()) << "peer table entry " << i;
    auto* p = w.alloc<uint64_t>(1);
    for (int peer = 0; peer < w.world_size(); ++peer) {
        const bool same_node = w.node_of(peer) == w.node();
        EXPECT_EQ(c.reachable(peer), same_node) << "peer " << peer;
        if (same_node) {
            EXPECT_NO_THROW(w.peer_ptr(p, peer));
        } else {
            EXPECT_THROW(w.peer_ptr(p, peer), loom::Error) << "peer " << peer;
        }
    }
    w.free(p);
}

// put / put_nbi to every peer (node-local by load/store, remote through NVSHMEM) at thread, warp and block scope;
// every byte checked at every receiver. Slots of 12348 bytes: not a multiple of 16, so every slot but the first is
// misaligned for the vector path.
TEST(CrossNode, PutReachesEveryPeerAtEveryScope) {
    LOOM_REQUIRE_GPU();
    auto& w = loom::test::world();
    const uint64_t slot = 12348, n = static_cast<uint64_t>(w.world_size());
    auto* send = w.alloc<uint8_t>(n * slot);
    auto* recv = w.alloc<uint8_t>(n * slot);
    const uint32_t me = static_cast<uint32_t>(w.rank());
    uint64_t variant = 0;
    for (const char* g : kGroups) {
        for (int nbi = 0; nbi < 2; ++nbi) {
            ++variant;
            std::vector<uint8_t> h(n * slot);
            for (uint64_t d = 0; d < n; ++d)
                for (uint64_t i = 0; i < slot; ++i) h[d * slot + i] = byte_of(me, static_cast<uint32_t>(d), variant, i);
            LOOM_CHECK_CUDA(cudaMemcpy(send, h.data(), h.size(), cudaMemcpyHostToDevice));
            LOOM_CHECK_CUDA(cudaMemset(recv, 0xEE, n * slot));  // poison
            sync_and_meet(w, "xn-put-ready");
            xnode_kernel("put_all", {g})(LaunchConfig{dim3(1), dim3(128)}, w.ctx(), reinterpret_cast<char*>(recv),
                                         reinterpret_cast<const char*>(send), slot, nbi);
            sync_and_meet(w, "xn-put-done");
            LOOM_CHECK_CUDA(cudaMemcpy(h.data(), recv, h.size(), cudaMemcpyDeviceToHost));
            std::string bad;
            for (uint64_t s = 0; s < n && bad.empty(); ++s)
                for (uint64_t i = 0; i < slot; ++i)
                    if (h[s * slot + i] != byte_of(static_cast<uint32_t>(s), me, variant, i)) {
                        bad = std::string(g) + (nbi ? " put_nbi" : " put") + ": byte " + std::to_string(i) +
                              " from rank " + std::to_string(s) + " (node " + std::to_string(w.node_of(int(s))) +
                              ") is " + std::to_string(h[s * slot + i]);
                        break;
                    }
            const std::string failed = loom::test::agree(w, bad, "xn-put-verdict");
            EXPECT_TRUE(failed.empty()) << failed;
        }
    }
    w.free(recv);
    w.free(send);
}

// get / get_nbi from every peer at every scope: each rank fetches the slot every peer prepared for it.
TEST(CrossNode, GetReachesEveryPeerAtEveryScope) {
    LOOM_REQUIRE_GPU();
    auto& w = loom::test::world();
    const uint64_t slot = 12348, n = static_cast<uint64_t>(w.world_size());
    auto* send = w.alloc<uint8_t>(n * slot);
    auto* dst = w.alloc<uint8_t>(n * slot);
    const uint32_t me = static_cast<uint32_t>(w.rank());
    uint64_t variant = 100;
    for (const char* g : kGroups) {
        for (int nbi = 0; nbi < 2; ++nbi) {
            ++variant;
            std::vector<uint8_t> h(n * slot);
            for (uint64_t d = 0; d < n; ++d)
                for (uint64_t i = 0; i < slot; ++i) h[d * slot + i] = byte_of(me, static_cast<uint32_t>(d), variant, i);
            LOOM_CHECK_CUDA(cudaMemcpy(send, h.data(), h.size(), cudaMemcpyHostToDevice));
            LOOM_CHECK_CUDA(cudaMemset(dst, 0xEE, n * slot));
            sync_and_meet(w, "xn-get-ready");  // every send buffer is written before anyone reads it
            xnode_kernel("get_all", {g})(LaunchConfig{dim3(1), dim3(128)}, w.ctx(), reinterpret_cast<char*>(dst),
                                         reinterpret_cast<const char*>(send), slot, nbi);
            sync_and_meet(w, "xn-get-done");  // nobody rewrites a send buffer while a peer still reads it
            LOOM_CHECK_CUDA(cudaMemcpy(h.data(), dst, h.size(), cudaMemcpyDeviceToHost));
            std::string bad;
            for (uint64_t s = 0; s < n && bad.empty(); ++s)
                for (uint64_t i = 0; i < slot; ++i)
                    if (h[s * slot + i] != byte_of(static_cast<uint32_t>(s), me, variant, i)) {
                        bad = std::string(g) + (nbi ? " get_nbi" : " get") + ": byte " + std::to_string(i) +
                              " from rank " + std::to_string(s) + " is " + std::to_string(h[s * slot + i]);
                        break;
                    }
            const std::string failed = loom::test::agree(w, bad, "xn-get-verdict");
            EXPECT_TRUE(failed.empty()) << failed;
        }
    }
    w.free(dst);
    w.free(send);
}

// Message passing with the same local rank on the next node: put_signal, put + notify, put_nbi + quiet +
// signal_op_relaxed, put + signal_op; the receiver checks every word after its wait, and acknowledges through a
// remote notify. 100 rounds per (scope, mode).
TEST(CrossNode, SignalsPublishRemotePuts) {
    LOOM_REQUIRE_GPU();
    auto& w = loom::test::world();
    const uint32_t words = 3000, rounds = 100;
    auto* recv = w.alloc<uint32_t>(words);
    auto* send = w.alloc<uint32_t>(words);
    auto* sig = w.alloc<uint64_t>(1);
    auto* ack = w.alloc<uint64_t>(1);
    uint32_t* errors = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(&errors, sizeof(uint32_t)));
    const char* const modes[] = {"put_signal", "put + notify", "put_nbi + quiet + signal_op_relaxed",
                                 "put + signal_op"};
    for (const char* g : kGroups) {
        for (int mode = 0; mode < 4; ++mode) {
            LOOM_CHECK_CUDA(cudaMemset(sig, 0, 8));
            LOOM_CHECK_CUDA(cudaMemset(ack, 0, 8));
            LOOM_CHECK_CUDA(cudaMemset(recv, 0xEE, words * 4));
            LOOM_CHECK_CUDA(cudaMemset(errors, 0, 4));
            sync_and_meet(w, "xn-ring-ready");
            xnode_kernel("signal_ring", {g})(LaunchConfig{dim3(1), dim3(128)}, w.ctx(), recv, send, words, sig, ack,
                                             next_peer(w), prev_peer(w), rounds, mode, errors);
            sync_and_meet(w, "xn-ring-done");
            uint32_t bad = 1;
            LOOM_CHECK_CUDA(cudaMemcpy(&bad, errors, 4, cudaMemcpyDeviceToHost));
            uint64_t last = 0;
            LOOM_CHECK_CUDA(cudaMemcpy(&last, sig, 8, cudaMemcpyDeviceToHost));
            const uint64_t want_last = rounds;  // Set r, or Add 1 per round: both end at `rounds`
            std::string mine;
            if (bad || last != want_last)
                mine = std::string(g) + " " + modes[mode] + ": " + std::to_string(bad) + " wrong words, signal " +
                       std::to_string(last) + " (expected " + std::to_string(want_last) + ")";
            const std::string failed = loom::test::agree(w, mine, "xn-ring-verdict");
            EXPECT_TRUE(failed.empty()) << failed;
        }
    }
    LOOM_CHECK_CUDA(cudaFree(errors));
    w.free(ack);
    w.free(sig);
    w.free(send);
    w.free(recv);
}

// A token around the ring of the same local rank on every node (remote peers), 1000 rounds, with relaxed signals and
// relaxed waits only: every wait returns exactly its round, and every rank's signal ends at the last round.
TEST(CrossNode, RelaxedWaitsPassATokenAroundTheNodes) {
    LOOM_REQUIRE_GPU();
    auto& w = loom::test::world();
    const uint32_t rounds = 1000;
    auto* sig = w.alloc<uint64_t>(1);
    uint32_t* errors = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(&errors, sizeof(uint32_t)));
    LOOM_CHECK_CUDA(cudaMemset(sig, 0, 8));
    LOOM_CHECK_CUDA(cudaMemset(errors, 0, 4));
    const int first = w.rank() < (w.num_nodes() > 1 ? w.local_world_size() : 1);
    sync_and_meet(w, "xn-token-ready");
    xnode_kernel("relaxed_token_ring")(LaunchConfig{dim3(1), dim3(32)}, w.ctx(), sig, next_peer(w), first, rounds,
                                       errors);
    sync_and_meet(w, "xn-token-done");
    uint32_t bad = 1;
    uint64_t last = 0;
    LOOM_CHECK_CUDA(cudaMemcpy(&bad, errors, 4, cudaMemcpyDeviceToHost));
    LOOM_CHECK_CUDA(cudaMemcpy(&last, sig, 8, cudaMemcpyDeviceToHost));
    std::string mine;
    if (bad || last != rounds)
        mine = std::to_string(bad) + " waits returned another round than their own, signal " + std::to_string(last) +
               " (expected " + std::to_string(rounds) + ")";
    const std::string failed = loom::test::agree(w, mine, "xn-token-verdict");
    EXPECT_TRUE(failed.empty()) << failed;
    LOOM_CHECK_CUDA(cudaFree(errors));
    w.free(sig);
}

// barrier_all across nodes at every scope: puts to every peer before each barrier are all delivered after it.
TEST(CrossNode, BarrierSpansNodes) {
    LOOM_REQUIRE_GPU();
    auto& w = loom::test::world();
    const uint32_t rounds = 50;
    // loom::lang::BarrierState: 2 + 6 + 8 words (kMaxLocalPeers = 8), zeroed once.
    auto* st = w.alloc<uint64_t>(16);
    auto* slots = w.alloc<uint64_t>(static_cast<std::size_t>(w.world_size()));
    auto* value = w.alloc<uint64_t>(1);
    uint32_t* errors = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(&errors, sizeof(uint32_t)));
    LOOM_CHECK_CUDA(cudaMemset(st, 0, 16 * 8));
    for (const char* g : kGroups) {
        LOOM_CHECK_CUDA(cudaMemset(slots, 0, static_cast<std::size_t>(w.world_size()) * 8));
        LOOM_CHECK_CUDA(cudaMemset(errors, 0, 4));
        sync_and_meet(w, "xn-barrier-ready");
        xnode_kernel("barrier_rounds", {g})(LaunchConfig{dim3(1), dim3(128)}, w.ctx(), st, slots, value, rounds,
                                            errors);
        sync_and_meet(w, "xn-barrier-done");
        uint32_t bad = 1;
        LOOM_CHECK_CUDA(cudaMemcpy(&bad, errors, 4, cudaMemcpyDeviceToHost));
        const std::string mine = bad ? std::string(g) + ": " + std::to_string(bad) + " stale slots" : "";
        const std::string failed = loom::test::agree(w, mine, "xn-barrier-verdict");
        EXPECT_TRUE(failed.empty()) << failed;
    }
    LOOM_CHECK_CUDA(cudaFree(errors));
    w.free(value);
    w.free(slots);
    w.free(st);
}

// A kernel compiled without remote peers that names a peer on another node traps with a diagnostic naming the peer,
// its node and the fix. In a child process (a one-rank Ctx of two nodes, no World), outside MPS: the trap stays in
// the child's context.
TEST(CrossNode, UndeclaredRemotePeerTrapsWithANamedDiagnostic) {
    LOOM_REQUIRE_GPU();
    auto& w = loom::test::world();
    if (w.rank() == 0) {
        const auto [status, output] = loom::test::run_child("xnode-undeclared-remote", {});
        EXPECT_EQ(status, 3) << output;
        EXPECT_NE(output.find("peer 1 is on node 1 (this rank: node 0, ranks 0..0): not load/store reachable; compile "
                              "the kernel with remote peers (jit::KernelSpec::remote_peers)"),
                  std::string::npos)
            << output;
    }
    w.barrier("xn-trap-child");
}

}  // namespace
