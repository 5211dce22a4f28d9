// The low-latency EP ops' state: symmetric areas, epochs, counters; shape and world checks; kernel specs.
#include "ops/moe/ep/ll_state.hpp"

#include <algorithm>

#include "loom/runtime/error.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "ops/overlap/common/state.hpp"
#include "runtime/symmetric_zeroed.hpp"

namespace loom::moe::ep_ll {

namespace kmoe = kernels::moe;

LlState::LlState(World& world) {
    // Every launch keeps to the rank's SM share (one block per SM): a receiving warp waits for the peers' sending
    // warps and the dispatch's signalling warps for this rank's sending warps, so every block must be resident.
    // DeviceFacts' SM count: the attribute (under MPS the rank's share), or the rank's part of the GPU where ranks
    // share one without an MPS share each.
    const overlap::DeviceFacts& dev = overlap::op_state<overlap::DeviceFacts>(world, "ep_ll");
    blocks = std::clamp(dev.device_sms, 1, kmoe::kEpLlMaxBlocks);
    remote = world.world_size() != world.local_world_size();
    const std::size_t epoch_bytes = 2 * kmoe::kEpLlMaxBlocks * sizeof(uint64_t);
    LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dispatch_epochs), epoch_bytes));
    LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&combine_epochs), epoch_bytes));
    LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&counters), 2 * kmoe::kEpLlMaxExperts * sizeof(uint32_t)));
    LOOM_CHECK_CUDA(cudaMemset(dispatch_epochs, 0, epoch_bytes));
    LOOM_CHECK_CUDA(cudaMemset(combine_epochs, 0, epoch_bytes));
    LOOM_CHECK_CUDA(cudaMemset(counters, 0, 2 * kmoe::kEpLlMaxExperts * sizeof(uint32_t)));
    LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&combine_arrivals), sizeof(uint64_t)));
    LOOM_CHECK_CUDA(cudaMemset(combine_arrivals, 0, sizeof(uint64_t)));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
}

LlState::~LlState() {
    cudaFree(dispatch_epochs);
    cudaFree(combine_epochs);
    cudaFree(counters);
    cudaFree(combine_arrivals);
}

void LlState::release(World& world) {
    for (Area* a : {&dispatch, &combine}) {
        if (a->p != nullptr) world.free(a->p);
        a->p = nullptr;
        a->layout.clear();
    }
}

// Any number of nodes (peers on other nodes through NVSHMEM); the bounds on the world size are check_shape's (E is a
// multiple of it, at most kEpLlMaxExperts).
void check_world(const char* op, const World& world) {
    LOOM_CHECK(world.local_world_size() <= kMaxLocalPeers && world.world_size() % world.local_world_size() == 0,
               "{}: expected nodes of equal size, at most {} ranks each, given {} ranks with {} on this node", op,
               kMaxLocalPeers, world.world_size(), world.local_world_size());
}

void check_shape(const char* op, const EpLowLatencyShape& s, int world_size) {
    LOOM_CHECK(s.max_tokens >= 1, "{}: shape.max_tokens: expected >= 1, given {}", op, s.max_tokens);
    LOOM_CHECK(s.hidden >= kmoe::kEpLlScaleBlock && s.hidden % kmoe::kEpLlScaleBlock == 0,
               "{}: shape.hidden: expected a positive multiple of {}, given {}", op, kmoe::kEpLlScaleBlock, s.hidden);
    LOOM_CHECK(s.topk >= 1 && s.topk <= kmoe::kEpLlMaxTopk, "{}: shape.topk: expected 1..{}, given {}", op,
               kmoe::kEpLlMaxTopk, s.topk);
    LOOM_CHECK(s.num_experts >= 1 && s.num_experts <= kmoe::kEpLlMaxExperts,
               "{}: shape.num_experts: expected 1..{}, given {}", op, kmoe::kEpLlMaxExperts, s.num_experts);
    LOOM_CHECK(s.num_experts % world_size == 0,
               "{}: shape.num_experts: expected a multiple of the world size {}, given {}", op, world_size,
               s.num_experts);
    LOOM_CHECK(static_cast<int64_t>(s.max_tokens) * s.topk < (int64_t{1} << 31) &&
                   static_cast<int64_t>(s.max_tokens) * world_size * s.hidden < (int64_t{1} << 40),
               "{}: shape: max_tokens {} x topk {} (x world {} x hidden {}) too large", op, s.max_tokens, s.topk,
               world_size, s.hidden);
}

LlState& state(World& world, const char* op, bool captured) {
    if (LlState* s = world.find_state<LlState>()) return *s;
    overlap::check_state_outside_capture(op, captured);
    return world.state<LlState>();
}

void ensure_area(World& world, Area& area, const std::string& layout, int64_t half_bytes, int64_t staging_bytes,
                 const char* op, bool captured) {
    if (area.p != nullptr && area.layout == layout) return;
    LOOM_CHECK(!captured,
               "{}: a CUDA graph capture needs the op's buffers for shape {} (they are laid out for '{}'): make a call "
               "of this shape and options outside the capture first (allocating synchronises the device)",
               op, layout, area.layout);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    world.barrier("loom/moe/ep_ll/grow");  // no peer still writes the old area
    if (area.p != nullptr) world.free(area.p);
    area.p = nullptr;
    area.p = static_cast<char*>(detail::alloc_zeroed(world, static_cast<std::size_t>(2 * half_bytes + staging_bytes)));
    area.half_bytes = half_bytes;
    area.layout = layout;
}

// A timed-out wait or a bad index posts to the diagnostic mailbox (decoded into the host's loom::Error) and traps,
// inline: the out-of-line printing path takes the Ctx by reference, which costs every launch a local copy of it.
jit::KernelSpec dispatch_spec(bool fp8, bool remote) {
    jit::KernelSpec s;
    s.header = "loom/kernels/moe/ep_ll.cuh";
    s.name = "loom::kernels::moe::ep_ll_dispatch";
    s.template_args = {fp8 ? "true" : "false"};
    s.defines = {"LOOM_NO_DEVICE_PRINTF=1"};
    s.remote_peers = remote;
    return s;
}

jit::KernelSpec combine_spec(bool remote) {
    jit::KernelSpec s;
    s.header = "loom/kernels/moe/ep_ll.cuh";
    s.name = "loom::kernels::moe::ep_ll_combine";
    s.defines = {"LOOM_NO_DEVICE_PRINTF=1"};
    s.remote_peers = remote;
    return s;
}

}  // namespace loom::moe::ep_ll
