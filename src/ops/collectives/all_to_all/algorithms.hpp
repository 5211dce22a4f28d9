// The all_to_all algorithms, one per data path; all_to_all.cpp validates, chooses and calls one. `pull` reads the
// blocks from the peers' in (in symmetric), push writes them into the peers' out (out symmetric).
#pragma once

#include <cuda_runtime_api.h>

#include "ops/collectives/coll_state.hpp"

namespace loom::coll {

// Push or pull over ld/st or TMA (kernels/collectives/all_to_all.cuh): one kernel, launched and remembered as the
// plan of `key`.
void all_to_all_ld_tma(World& world, Core& core, const PlanKey& key, const CollChoice& c, const BufferView& in,
                       const BufferView& out, const CollOptions& opts, cudaStream_t stream);
// Push or pull through the copy engine between two barrier kernels (ce.cpp).
void all_to_all_ce(World& world, Core& core, bool pull, const BufferView& in, const BufferView& out,
                   cudaStream_t stream);

}  // namespace loom::coll
