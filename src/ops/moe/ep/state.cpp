// The EP throughput mode's per-World state.
#include <cstring>

#include "loom/runtime/error.hpp"
#include "ops/moe/ep/ep.hpp"
#include "runtime/symmetric_zeroed.hpp"

namespace loom::moe::ep {

namespace kmoe = kernels::moe;

State::State(World& world) {
    sig = detail::alloc_zeroed<kmoe::EpSignals>(world, 1);
    counts_all = detail::alloc_zeroed<int32_t>(world, static_cast<std::size_t>(world.world_size()) * kmoe::kEpMaxCols);
    LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dev), sizeof(kmoe::EpDeviceState)));
    LOOM_CHECK_CUDA(cudaMemset(dev, 0, sizeof(kmoe::EpDeviceState)));
    LOOM_CHECK_CUDA(cudaMallocHost(reinterpret_cast<void**>(&host),
                                   (8 + static_cast<std::size_t>(world.world_size())) * sizeof(int32_t)));
    int device = 0;
    LOOM_CHECK_CUDA(cudaGetDevice(&device));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&device_sms, cudaDevAttrMultiProcessorCount, device));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());  // zeroed before any kernel of the op runs
}

State::~State() {
    cudaFree(dev);
    cudaFreeHost(host);
}

void State::release(World& world) {
    data.release(world);
    if (counts_all) world.free(counts_all);
    if (sig) world.free(sig);
    counts_all = nullptr;
    sig = nullptr;
}

State& state(World& world, const char* op, bool captured) {
    LOOM_CHECK(world.world_size() <= kmoe::kEpMaxRanks, "{}: expected a world of at most {} ranks, given {}", op,
               kmoe::kEpMaxRanks, world.world_size());
    return overlap::op_state<State>(world, op, captured);
}

bool multi_node(const World& world) { return world.world_size() != world.local_world_size(); }

bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    LOOM_CHECK_CUDA(cudaStreamIsCapturing(stream, &st));
    return st != cudaStreamCaptureStatusNone;
}

}  // namespace loom::moe::ep

namespace loom {

void release_moe_ep_state(World& world) { world.release_states(moe::ep::State::kKey); }

}  // namespace loom
