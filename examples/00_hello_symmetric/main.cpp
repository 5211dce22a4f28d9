// Hello, symmetric memory: each rank writes a rank-specific pattern into every peer's copy of a symmetric
// buffer with one kernel, then checks every element it received.
//
//   loomrun -n 2 build/examples/00_hello_symmetric [elements per slot, default 1M]
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "hello_symmetric.cuh"
#include "loom/jit/jit.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/world.hpp"

namespace fs = std::filesystem;

// The kernel header: beside the sources this was built from, or at the same place relative to the executable
// (<root>/<build>/examples/00_hello_symmetric) when the build was carried elsewhere with the tree.
static std::string example_dir() {
    std::error_code ec;
    std::vector<fs::path> dirs{LOOM_EXAMPLE_DIR};
    fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) dirs.push_back(exe.parent_path().parent_path().parent_path() / "examples/00_hello_symmetric");
    for (const auto& d : dirs)
        if (fs::is_regular_file(d / "hello_symmetric.cuh", ec)) return fs::canonical(d).string();
    LOOM_FAIL("hello_symmetric.cuh not found beside {} or the executable", LOOM_EXAMPLE_DIR);
}

static int run(std::uint64_t n) {
    loom::World world = loom::World::from_env();
    const int L = world.local_world_size(), me = world.rank();

    // One symmetric buffer: a slot of n elements per local rank, at the same offset in every rank's heap.
    auto* buf = world.alloc<std::uint64_t>(L * n);
    LOOM_CHECK_CUDA(cudaMemset(buf, 0, L * n * sizeof(std::uint64_t)));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    world.barrier("cleared");

    const auto& kernel =
        loom::jit::get_kernel({.header = example_dir() + "/hello_symmetric.cuh", .name = "hello::write_to_peers"});
    int sms = 0;
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, world.device()));
    kernel({.grid = dim3(2 * sms), .block = dim3(256)}, world.ctx(), buf, n);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    world.barrier("written");  // every rank's writes into our buffer are complete

    std::vector<std::uint64_t> got(L * n);
    LOOM_CHECK_CUDA(cudaMemcpy(got.data(), buf, got.size() * sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
    std::uint64_t bad = 0;
    for (int p = 0; p < L; ++p)
        for (std::uint64_t i = 0; i < n; ++i) bad += got[p * n + i] != hello::pattern(world.node() * L + p, me, i);
    const std::uint64_t checked = got.size() * sizeof(std::uint64_t);
    std::printf("rank %d/%d device %d heap %.2f GiB: checked %llu bytes from %d ranks: %s\n", me, world.world_size(),
                world.device(), world.heap().size() / double(1 << 30), static_cast<unsigned long long>(checked), L,
                bad ? "FAILED" : "OK");
    if (bad)
        std::printf("rank %d: %llu of %llu elements wrong\n", me, static_cast<unsigned long long>(bad),
                    static_cast<unsigned long long>(got.size()));
    std::fflush(stdout);

    // Every rank learns whether any failed, so all exit alike.
    loom::Bytes mine(16);
    std::memcpy(mine.data(), &checked, 8);
    std::memcpy(mine.data() + 8, &bad, 8);
    std::uint64_t total = 0, total_bad = 0;
    for (const auto& r : world.store().all_gather("hello/result", mine)) {
        std::uint64_t c, b;
        std::memcpy(&c, r.data(), 8);
        std::memcpy(&b, r.data() + 8, 8);
        total += c;
        total_bad += b;
    }
    if (me == 0)
        std::printf("hello_symmetric: %d ranks, %llu bytes verified: %s\n", world.world_size(),
                    static_cast<unsigned long long>(total), total_bad ? "FAILED" : "OK");
    world.barrier("reported");
    world.free(buf);
    return total_bad ? 1 : 0;
}

int main(int argc, char** argv) {
    if (!loom::driver::available()) {
        std::printf("no GPU: %s\n", loom::driver::unavailable_reason().c_str());
        return 1;
    }
    try {
        std::uint64_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : (1u << 20);
        LOOM_CHECK(n > 0, "elements per slot: expected a positive number, given '{}'", argv[1]);
        return run(n);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "00_hello_symmetric: %s\n", e.what());
        return 1;
    }
}
