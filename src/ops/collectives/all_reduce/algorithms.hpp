// The all_reduce algorithms, one per data path; all_reduce.cpp validates, chooses and calls one.
#pragma once

#include <cuda_runtime_api.h>

#include "ops/collectives/coll_state.hpp"

namespace loom::coll {

// LL, one-shot (ld/st or TMA) or two-shot (staged in the scratch when out is not symmetric: out_symmetric false)
// (kernels/collectives/all_reduce.cuh, coll_ll.cuh): one kernel, launched and remembered as the plan of `key`.
void all_reduce_ld_tma(World& world, Core& core, const PlanKey& key, const CollChoice& c, const BufferView& in,
                       const BufferView& out, bool out_symmetric, const CollOptions& opts, cudaStream_t stream);
// Two-shot with in staged (staged.cpp): any in (not symmetric), any out.
void all_reduce_staged(World& world, Core& core, const CollChoice& c, const BufferView& in, const BufferView& out,
                       bool out_symmetric, const CollOptions& opts, cudaStream_t stream);
// Two-shot with a copy-engine second half (two_shot_ce.cpp); in and out symmetric. Returns false, having enqueued
// nothing, where the shards do not split evenly with 16-byte alignment: the one-kernel two-shot then runs instead.
bool all_reduce_two_shot_ce(World& world, const BufferView& in, const BufferView& out, const CollOptions& opts,
                            cudaStream_t stream);

}  // namespace loom::coll
