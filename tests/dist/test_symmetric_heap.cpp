// The symmetric heap across ranks (run under loomrun at 2, 4 and 8 ranks; ranks may share one GPU under MPS):
// every rank writes every peer's memory and checks all it received; collective allocation is deterministic;
// misuse (exhaustion, asymmetric sizes, foreign pointers) raises on every rank (one rank cannot ask asymmetric sizes:
// its requests allocate).
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/test_env.hpp"
#include "kernels/symmetric_heap_kernels.cuh"
#include "loom/jit/jit.hpp"
#include "loom/runtime/error.hpp"

namespace {

namespace fs = std::filesystem;

// The kernels folder: $LOOM_SOURCE_DIR, the source tree this binary was built from, or beside the build
// directory (when the build was carried to another machine with the tree).
std::string kernels_dir() {
    std::vector<fs::path> roots;
    if (const char* s = std::getenv("LOOM_SOURCE_DIR")) roots.emplace_back(s);
    roots.emplace_back(LOOM_SOURCE_DIR);
    std::error_code ec;
    fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) roots.push_back(exe.parent_path().parent_path().parent_path());  // <root>/<build>/tests/<exe>
    roots.push_back(fs::current_path());
    for (const auto& r : roots) {
        fs::path d = r / "tests/dist/kernels";
        if (fs::is_regular_file(d / "symmetric_heap_kernels.cuh", ec)) return fs::canonical(d).string();
    }
    LOOM_FAIL("tests/dist/kernels not found (set LOOM_SOURCE_DIR to the source tree)");
}

const loom::jit::Kernel& kernel(const char* name) {
    return loom::jit::get_kernel(loom::jit::KernelSpec{.header = kernels_dir() + "/symmetric_heap_kernels.cuh",
                                                       .name = std::string("loom_test::") + name});
}

std::uint64_t offset_of(loom::World& w, const void* p) {
    return static_cast<std::uint64_t>(static_cast<const char*>(p) - w.heap().local_base());
}

// Every rank's value, in rank order.
std::vector<std::uint64_t> gather(loom::World& w, std::uint64_t mine) {
    loom::Bytes b(8);
    std::memcpy(b.data(), &mine, 8);
    std::vector<std::uint64_t> all;
    for (const auto& r : w.store().all_gather("test/gather", b)) {
        std::uint64_t v;
        std::memcpy(&v, r.data(), 8);
        all.push_back(v);
    }
    return all;
}

template <class Fn>
std::string error_of(Fn&& fn) {
    try {
        fn();
    } catch (const loom::Error& e) {
        return e.what();
    }
    return "";
}

// Offsets are checked exactly, so each test starts from an empty heap: every test (of every suite sharing the
// World) frees what it allocates. A leak shows here as a failure naming it, on every rank alike.
class SymmetricHeap : public ::testing::Test {
  protected:
    void SetUp() override {
        LOOM_REQUIRE_GPU();
        auto& w = loom::test::world();
        std::string err = error_of([&] { w.free(w.alloc_bytes(w.heap().size())); });
        ASSERT_EQ(err, "") << "the symmetric heap is not empty at the start of the test (a test leaked an allocation)";
    }
};

TEST_F(SymmetricHeap, CtxMapsEveryLocalPeer) {
    auto& w = loom::test::world();
    const loom::Ctx c = w.ctx();
    EXPECT_EQ(c.rank, w.rank());
    EXPECT_EQ(c.world, w.world_size());
    EXPECT_EQ(c.local_world, w.local_world_size());
    EXPECT_EQ(c.local_base_rank, w.node() * w.local_world_size());
    EXPECT_EQ(c.heap_size, w.heap().size());
    EXPECT_EQ(c.heap_size % w.heap().granularity(), 0u);
    for (int i = 0; i < c.local_world; ++i) {
        EXPECT_EQ(c.heap[i], w.heap().base(i));
        EXPECT_EQ(c.heap[i], c.heap[0] + i * c.heap_size) << "heaps are laid out back to back";
    }
    for (int i = c.local_world; i < loom::kMaxLocalPeers; ++i) EXPECT_EQ(c.heap[i], nullptr);
    EXPECT_TRUE(c.is_symmetric(c.heap[c.local_rank]));
    EXPECT_FALSE(c.is_symmetric(c.heap[c.local_rank] + c.heap_size));
    // The heap starts zeroed (signals start at 0). First-fit allocation leaves the end of the heap untouched
    // unless a test fills it with data, so sample the last 64 KiB of every local peer's heap.
    std::vector<std::uint64_t> tail(8192);
    for (int i = 0; i < c.local_world; ++i) {
        ASSERT_EQ(
            cudaMemcpy(tail.data(), c.heap[i] + c.heap_size - tail.size() * 8, tail.size() * 8, cudaMemcpyDeviceToHost),
            cudaSuccess);
        for (auto v : tail) ASSERT_EQ(v, 0u) << "local peer " << i << "'s heap is not zeroed";
    }
}

TEST_F(SymmetricHeap, EveryRankWritesEveryPeer) {
    auto& w = loom::test::world();
    const int L = w.local_world_size(), me = w.local_rank();
    for (std::uint64_t n : {std::uint64_t{1} << 10, (std::uint64_t{1} << 20) + 77}) {  // 4 KiB; 4 MiB + a tail
        auto* buf = w.alloc<std::uint32_t>(L * n);
        ASSERT_EQ(cudaMemset(buf, 0xff, L * n * 4), cudaSuccess);  // poison: never a valid pattern
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        w.barrier("poisoned");  // nobody writes into a buffer before its owner has poisoned it

        int sms = 0;
        ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, w.device()), cudaSuccess);
        kernel("write_pattern_to_peers")({.grid = dim3(2 * sms), .block = dim3(256)}, w.ctx(), buf, n);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        w.barrier("written");  // every peer's kernel has finished writing into this rank's buffer

        std::vector<std::uint32_t> got(L * n);
        ASSERT_EQ(cudaMemcpy(got.data(), buf, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        std::size_t bad = 0;
        for (int p = 0; p < L; ++p) {
            const int src = w.node() * L + p;
            for (std::uint64_t i = 0; i < n; ++i) {
                std::uint32_t want = loom_test::symm_pattern(src, w.rank(), i);
                if (got[p * n + i] != want && bad++ < 5)
                    ADD_FAILURE() << "rank " << w.rank() << ": word " << i << " from rank " << src << " is "
                                  << got[p * n + i] << ", expected " << want;
            }
        }
        EXPECT_EQ(bad, 0u) << "mismatched words on rank " << w.rank() << " (n = " << n << ")";

        // And through this process's mappings of the peers: what this rank wrote is in their memory.
        for (int p = 0; p < L; ++p) {
            std::vector<std::uint32_t> there(n);
            auto* remote = w.peer_ptr(buf, w.node() * L + p) + static_cast<std::uint64_t>(me) * n;
            ASSERT_EQ(cudaMemcpy(there.data(), remote, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
            std::size_t wrong = 0;
            for (std::uint64_t i = 0; i < n; ++i)
                wrong += there[i] != loom_test::symm_pattern(w.rank(), w.node() * L + p, i);
            EXPECT_EQ(wrong, 0u) << "rank " << w.rank() << " reading its slot in local peer " << p;
        }
        w.barrier("verified");  // nobody frees (and so reuses) the buffer while a peer still reads it
        w.free(buf);
    }
}

TEST_F(SymmetricHeap, AllocationIsDeterministicAndReusesFreedSpace) {
    auto& w = loom::test::world();
    void* a = w.alloc_bytes(1 << 20);
    void* b = w.alloc_bytes(3 << 20, 4096);
    void* c = w.alloc_bytes(100, 2048);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % 4096, 0u);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(c) % 2048, 0u);
    EXPECT_TRUE(w.is_symmetric(a, 1 << 20));
    EXPECT_TRUE(w.is_symmetric(b, 3 << 20));
    // The same offsets on every rank.
    for (void* p : {a, b, c}) {
        auto all = gather(w, offset_of(w, p));
        for (std::size_t r = 0; r < all.size(); ++r) EXPECT_EQ(all[r], all[0]) << "rank " << r;
    }
    w.free(a);
    void* d = w.alloc_bytes(512 << 10);
    EXPECT_EQ(d, a) << "first fit reuses the freed block";
    void* e = w.alloc_bytes(512 << 10);
    EXPECT_EQ(static_cast<char*>(e), static_cast<char*>(a) + (512 << 10));
    w.free(d);
    w.free(e);
    // Repeated alloc/free of the same size lands on the same offset every time.
    for (int i = 0; i < 50; ++i) {
        void* p = w.alloc_bytes(1 << 20);
        EXPECT_EQ(p, a) << "iteration " << i;
        w.free(p);
    }
    w.free(b);
    w.free(c);
    // Everything freed: the whole heap is one block again.
    void* all = w.alloc_bytes(w.heap().size());
    EXPECT_EQ(all, w.heap().local_base());
    w.free(all);
}

TEST_F(SymmetricHeap, ExhaustionRaisesOnEveryRank) {
    auto& w = loom::test::world();
    const std::size_t total = w.heap().size();
    std::string err = error_of([&] { w.alloc_bytes(total + 1); });
    EXPECT_NE(err.find(fmt::format("symmetric heap exhausted: requested {} bytes, largest free block {} of {}",
                                   total + 1, total, total)),
              std::string::npos)
        << err;
    EXPECT_NE(err.find("raise LOOM_SYMMETRIC_SIZE"), std::string::npos) << err;
    void* half = w.alloc_bytes(total / 2);
    err = error_of([&] { w.alloc_bytes(total / 2 + 4096); });
    EXPECT_NE(err.find(fmt::format("largest free block {} of {}", total - total / 2, total)), std::string::npos) << err;
    w.free(half);
    void* p = w.alloc_bytes(4096);  // the failures changed nothing
    EXPECT_EQ(p, w.heap().local_base());
    w.free(p);
}

TEST_F(SymmetricHeap, AsymmetricAllocationRaisesOnEveryRank) {
    auto& w = loom::test::world();
    if (w.world_size() == 1) {
        // One rank always agrees with itself: both calls allocate, at the start of the heap, with their alignment.
        void* a = nullptr;
        EXPECT_EQ(error_of([&] { a = w.alloc_bytes(8192); }), "");
        EXPECT_EQ(a, w.heap().local_base());
        if (a) w.free(a);
        void* b = nullptr;
        EXPECT_EQ(error_of([&] { b = w.alloc_bytes(4096, 256); }), "");
        EXPECT_EQ(b, w.heap().local_base());
        if (b) w.free(b);
        return;
    }
    std::string err = error_of([&] { w.alloc_bytes(w.rank() == 1 ? 4096 : 8192); });
    EXPECT_NE(err.find("rank 0 asked 8192 bytes"), std::string::npos) << err;
    EXPECT_NE(err.find("rank 1 asked 4096 bytes"), std::string::npos) << err;
    err = error_of([&] { w.alloc_bytes(4096, w.rank() == 0 ? 256 : 1024); });
    EXPECT_NE(err.find("rank 1 asked 4096 bytes (alignment 1024)"), std::string::npos) << err;
    // Nothing was allocated and every rank is still in step.
    void* p = w.alloc_bytes(64);
    EXPECT_EQ(p, w.heap().local_base());
    w.free(p);
}

TEST_F(SymmetricHeap, ForeignPointersRaise) {
    auto& w = loom::test::world();
    void* dev = nullptr;
    ASSERT_EQ(cudaMalloc(&dev, 4096), cudaSuccess);
    std::string err = error_of([&] { w.free(dev); });
    EXPECT_NE(err.find(fmt::format("rank {} freed", w.rank())), std::string::npos) << err;
    EXPECT_NE(err.find("not in the symmetric heap"), std::string::npos) << err;
    EXPECT_FALSE(w.is_symmetric(dev));
    EXPECT_NE(error_of([&] { w.peer_ptr(dev, w.rank()); }).find("peer_ptr"), std::string::npos);
    cudaFree(dev);

    char* buf = static_cast<char*>(w.alloc_bytes(8192));
    err = error_of([&] { w.free(buf + 256); });  // inside an allocation, not its start
    EXPECT_NE(err.find("not a pointer returned by alloc"), std::string::npos) << err;
    // Only rank 0 passes a bad pointer: every rank still raises, naming rank 0.
    err = error_of([&] { w.free(w.rank() == 0 ? buf + 16 : buf); });
    EXPECT_NE(err.find("rank 0 freed"), std::string::npos) << err;
    w.free(buf);
    err = error_of([&] { w.free(buf); });  // double free
    EXPECT_NE(err.find("not a pointer returned by alloc"), std::string::npos) << err;
    EXPECT_NE(error_of([&] { w.peer_ptr(w.heap().local_base(), w.world_size()); }).find("expected a peer on this node"),
              std::string::npos);
}

}  // namespace
