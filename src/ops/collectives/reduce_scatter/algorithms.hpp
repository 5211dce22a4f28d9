// The reduce_scatter algorithms, one per data path; reduce_scatter.cpp validates, chooses and calls one.
#pragma once

#include <cuda_runtime_api.h>

#include "ops/collectives/coll_state.hpp"

namespace loom::coll {

// LL, pull (in symmetric), scatter or ring over ld/st or TMA (kernels/collectives/reduce_scatter.cuh, coll_ll.cuh):
// one kernel, launched and remembered as the plan of `key`.
void reduce_scatter_ld_tma(World& world, Core& core, const PlanKey& key, const CollChoice& c, const BufferView& in,
                           const BufferView& out, const CollOptions& opts, cudaStream_t stream);
// Pull with in staged through the scratch, in rounds (staged.cpp): any in and out, in place too.
void reduce_scatter_staged(World& world, Core& core, const CollChoice& c, const BufferView& in, const BufferView& out,
                           const CollOptions& opts, cudaStream_t stream);
// Scatter through the copy engine, reduced locally, in rounds (scatter_ce.cpp). Any in and out.
void reduce_scatter_scatter_ce(World& world, Core& core, const BufferView& in, const BufferView& out,
                               const CollOptions& opts, cudaStream_t stream);

}  // namespace loom::coll
