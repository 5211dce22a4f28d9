// State and launch plumbing of the low-latency expert-parallel ops (loom::ep_ll_dispatch / ep_ll_combine,
// kernels/moe/ep_ll.cuh). State "moe/ep_ll/buffers": the two symmetric areas (dispatch, combine: two parity halves
// each, zeroed when allocated, then in a World of several nodes the staging of what goes to other nodes), each rank's
// per-block phase epochs and the dispatch's per-expert counters, and the parameters of a send whose receive is still
// pending (return without waiting).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "loom/jit/jit.hpp"
#include "loom/kernels/moe/ep_ll_params.hpp"
#include "loom/ops/moe_ep_ll.hpp"
#include "loom/runtime/world.hpp"
#include "loom/runtime/world_state.hpp"

namespace loom::moe::ep_ll {

// One symmetric area of two parity halves and the staging after them (none in a one-node World) laid out for one
// shape (`layout`); a call with another layout reallocates it (zeroed: a stale byte of another layout never reads as
// a flag).
struct Area {
    char* p = nullptr;
    int64_t half_bytes = 0;
    std::string layout;
};

struct LlState final : WorldState {
    static constexpr const char* kKey = "moe/ep_ll/buffers";
    explicit LlState(World& world);
    ~LlState() override;
    void release(World& world) override;

    int blocks = 0;                        // the grid of every launch: fixed, so every block's epochs advance together
    uint64_t* dispatch_epochs = nullptr;   // [2][kEpLlMaxBlocks] (send, receive)
    uint64_t* combine_epochs = nullptr;    // [2][kEpLlMaxBlocks]
    uint32_t* counters = nullptr;          // [2][kEpLlMaxExperts]
    uint64_t* combine_arrivals = nullptr;  // blocks that finished a combine receive phase, over all calls
    Area dispatch, combine;
    // A send launched with return_without_waiting, its receive not yet launched.
    bool dispatch_pending = false, combine_pending = false, dispatch_fp8 = true;
    kernels::moe::EpLlParams pending_dispatch{}, pending_combine{};
    bool remote = false;  // the World spans several nodes: kernels with remote peers, staging
};

// Validation (raise loom::Error naming the argument).
void check_shape(const char* op, const EpLowLatencyShape& s, int world_size);
void check_world(const char* op, const World& world);

// The World's state (created on first use: collective, synchronising; raises while `captured`).
LlState& state(World& world, const char* op, bool captured);
// `area` laid out for `layout` with halves of `half_bytes` and `staging_bytes` after them (reallocated, zeroed, when
// the layout differs: collective, synchronising; raises while `captured`).
void ensure_area(World& world, Area& area, const std::string& layout, int64_t half_bytes, int64_t staging_bytes,
                 const char* op, bool captured);

// The kernels as the ops compile them: with remote peers (nvcc + NVSHMEM) when the World spans several nodes, else
// under NVRTC.
jit::KernelSpec dispatch_spec(bool fp8, bool remote = false);
jit::KernelSpec combine_spec(bool remote = false);

}  // namespace loom::moe::ep_ll
