// The all_gather algorithms, one per data path; all_gather.cpp validates, chooses and calls one. Each takes the
// validated, resolved call: out symmetric for push and ring, in symmetric for pull (staged: neither).
#pragma once

#include <cuda_runtime_api.h>

#include "ops/collectives/coll_state.hpp"

namespace loom::coll {

// Push, pull or ring over ld/st or TMA (kernels/collectives/all_gather.cuh), and the fan-out push where ranks share
// a GPU: one kernel, launched and remembered as the plan of `key`.
void all_gather_ld_tma(World& world, Core& core, const PlanKey& key, const CollChoice& c, const BufferView& in,
                       const BufferView& out, const CollOptions& opts, cudaStream_t stream);
// Push through the copy engine, paced by stream signals (push_ce.cpp).
void all_gather_push_ce(World& world, Core& core, const BufferView& in, const BufferView& out, const CollOptions& opts,
                        cudaStream_t stream);
// Pull through the copy engine between two barrier kernels (pull_ce.cpp).
void all_gather_pull_ce(World& world, Core& core, const BufferView& in, const BufferView& out, cudaStream_t stream);
// Pull with in staged through the scratch, in rounds (staged.cpp): any in and out.
void all_gather_staged(World& world, Core& core, const CollChoice& c, const BufferView& in, const BufferView& out,
                       const CollOptions& opts, cudaStream_t stream);

}  // namespace loom::coll
