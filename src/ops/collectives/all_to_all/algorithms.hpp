// The all_to_all algorithms, one per data path; all_to_all.cpp and all_to_all_v.cpp validate, choose and call one.
// `pull` reads the blocks from the peers' in (in symmetric), push writes them into the peers' out (out symmetric);
// the staged paths stand in the scratch for the buffer that is not.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/collectives/coll_state.hpp"

namespace loom::coll {

// Push or pull over ld/st or TMA (kernels/collectives/all_to_all.cuh): one kernel, launched and remembered as the
// plan of `key`.
void all_to_all_ld_tma(World& world, Core& core, const PlanKey& key, const CollChoice& c, const BufferView& in,
                       const BufferView& out, const CollOptions& opts, cudaStream_t stream);
// Push or pull through the copy engine between two barrier kernels (ce.cpp).
void all_to_all_ce(World& world, Core& core, bool pull, const BufferView& in, const BufferView& out,
                   cudaStream_t stream);
// Pull with in staged through the scratch, in rounds (staged.cpp): any in and out.
void all_to_all_staged(World& world, Core& core, const CollChoice& c, const BufferView& in, const BufferView& out,
                       const CollOptions& opts, cudaStream_t stream);

// all_to_all_v's counts and offsets as its kernels read them.
struct A2avArgs {
    const int64_t* send_counts;   // symmetric: every receiver reads it
    const int64_t* send_offsets;  // pull: symmetric (or null)
    int64_t* recv_counts;
};
// `given` with send_counts (and, pulling, non-null send_offsets) replaced where not symmetric by a copy in a symmetric
// area, made on `stream` (staged_v.cpp).
A2avArgs stage_a2av_args(World& world, cudaStream_t stream, bool pull, const A2avArgs& given);
// all_to_all_v's push launch `l` (push, built for an out of any placement) run in windows of out staged through the
// scratch (staged_v.cpp).
void all_to_all_v_staged(World& world, Core& core, Launch l, const BufferView& out, cudaStream_t stream);

}  // namespace loom::coll
