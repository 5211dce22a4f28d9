// Host side of the LL kernels (include/loom/kernels/collectives/coll_ll.cuh): their state, the LL area, and their
// launch. Used by every op's LL algorithm.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "loom/kernels/collectives/coll_params.hpp"
#include "loom/runtime/world_state.hpp"
#include "ops/collectives/coll_launch.hpp"

namespace loom::coll {

struct Core;

// The LL area: per rank [parity 2][block kMaxLLBlocks][source W][kLLPacketsPerBlock] packets of 16 bytes (2 MiB x
// world size), symmetric, zeroed once (a packet's flag is its sender block's epoch, never 0 after the first launch);
// nothing but LL packets is ever written there. Created by the first LL call (coll::state).
struct LLArea final : WorldState {
    static constexpr const char* kKey = "collectives/ll";
    explicit LLArea(World& world);
    void release(World& world) override;

    char* data = nullptr;
    std::size_t bytes = 0;
};

constexpr std::size_t ll_capacity_bytes() {
    return std::size_t(kernels::coll::kMaxLLBlocks) * kernels::coll::kLLPacketsPerBlock * 8;
}

// The LL kernel of `op`: sets l.header, l.name ("loom::kernels::coll::<op>_ll"), grid, threads and packets per block
// for chunks of `chunk_bytes` (see Params::count). Raises when a chunk is over the LL area's capacity
// (ll_capacity_bytes()), naming the algorithms that fit. The caller sets the params' LL area (LLArea::data).
void setup_ll(Launch& l, const char* op, std::size_t chunk_bytes, const CollOptions& opts, const Budget& b);
// The LL data-movement ops (all_gather, all_to_all): chunks of `chunk_bytes` moved as bytes; launched and remembered
// as the plan of `key`.
void launch_ll_bytes(World& world, Core& core, const PlanKey& key, const char* op, const void* in, void* out,
                     std::size_t chunk_bytes, const CollOptions& opts, cudaStream_t stream);

}  // namespace loom::coll
