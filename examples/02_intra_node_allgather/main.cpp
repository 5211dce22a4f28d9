// Example 02: every rank pushes its chunk to every peer with put_signal, then checks the gathered buffer
// bitwise against what each rank is known to have sent.
//   loomrun -n 4 build/examples/02_intra_node_allgather [chunk_bytes]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "loom/jit/jit.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/world.hpp"

namespace {
// The bytes rank r contributes in call `epoch`: any rank can recompute them.
std::vector<unsigned char> chunk_of(int r, uint64_t epoch, std::size_t n) {
    std::vector<unsigned char> v(n);
    uint64_t x = 0x9E3779B97F4A7C15ull * (r + 1) ^ epoch;
    for (auto& b : v) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b = static_cast<unsigned char>(x);
    }
    return v;
}
}  // namespace

int main(int argc, char** argv) {
    if (!loom::driver::available()) {
        std::printf("no GPU: %s\n", loom::driver::unavailable_reason().c_str());
        return 1;
    }
    const std::size_t chunk = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : (1u << 20) + 13;
    auto world = loom::World::from_env();
    const int me = world.rank(), n = world.world_size();

    auto* out = world.alloc<char>(chunk * n);
    auto* ready = world.alloc<uint64_t>(n);
    char* in = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(&in, chunk));
    LOOM_CHECK_CUDA(cudaMemset(ready, 0, n * sizeof(uint64_t)));

    loom::jit::KernelSpec spec;
    spec.header = LOOM_EXAMPLE_DIR "/allgather.cuh";
    spec.name = "example::all_gather_push";
    const auto& kernel = loom::jit::get_kernel(spec);

    bool ok = true;
    std::vector<unsigned char> got(chunk * n);
    for (uint64_t epoch = 1; epoch <= 3; ++epoch) {
        const auto mine = chunk_of(me, epoch, chunk);
        LOOM_CHECK_CUDA(cudaMemcpy(in, mine.data(), chunk, cudaMemcpyHostToDevice));
        LOOM_CHECK_CUDA(cudaMemset(out, 0xA5, chunk * n));  // poison
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
        world.barrier("allgather-ready");
        kernel(loom::jit::LaunchConfig{dim3(n), dim3(512)}, world.ctx(), out, static_cast<const char*>(in),
               uint64_t(chunk), ready, epoch);
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());  // the kernel waited for every peer's signal
        LOOM_CHECK_CUDA(cudaMemcpy(got.data(), out, chunk * n, cudaMemcpyDeviceToHost));
        for (int r = 0; r < n; ++r) {
            const bool same = std::memcmp(got.data() + r * chunk, chunk_of(r, epoch, chunk).data(), chunk) == 0;
            if (!same)
                std::printf("rank %d: call %llu: slot %d differs from rank %d's chunk\n", me,
                            static_cast<unsigned long long>(epoch), r, r);
            ok &= same;
        }
        world.barrier("allgather-checked");  // nobody overwrites `out` while a peer still reads it
    }
    std::printf("rank %d: all-gather of %d x %zu bytes: %s\n", me, n, chunk, ok ? "bitwise OK" : "MISMATCH");
    LOOM_CHECK_CUDA(cudaFree(in));
    world.free(ready);
    world.free(out);
    return ok ? 0 : 1;
}
