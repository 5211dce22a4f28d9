// The collectives' one-block peer barrier (kernels/collectives/coll_common.cuh: coll_barrier): barrier_on_stream,
// and the entry and exit barriers of the copy-engine paths.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "loom/runtime/world_state.hpp"

namespace loom::jit {
class Kernel;
}

namespace loom::coll {

struct Core;

// Local state only: the barrier kernel, compiled and loaded when the state is created (the JIT's own cache is per
// process; loading a module is not allowed during a CUDA-graph capture).
struct BarrierKernel final : WorldState {
    static constexpr const char* kKey = "collectives/barrier";
    explicit BarrierKernel(World& world);
    const jit::Kernel* kernel = nullptr;
};

// The barrier on `stream` over the node's ranks, over core's sync block (block 0's epoch); hold_ns: how long the
// kernel keeps the stream after every rank has met it.
void launch_barrier(World& world, const Core& core, cudaStream_t stream, std::uint32_t hold_ns = 0);
// Creates the core state and loads launch_barrier's kernel without launching it: for a caller that launches it only
// when capturing a CUDA graph, where neither is allowed, so its eager calls prepare it first. Collective.
void prepare_barrier(World& world);

}  // namespace loom::coll
