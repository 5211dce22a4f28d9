// bench-collectives' default output: nccl-tests' table, one per collective, of Loom's call (the automatic choice,
// or the algorithm / data path asked for) out-of-place and in-place, with #wrong from every element of every rank's
// result checked against the host reference (coll_data.hpp).
//
// Per size and placement: the inputs are written, the output poisoned (0xff bytes) where it does not overlap the
// input, one call is made and checked (-c 1) or just made (-c 0: the first call creates the algorithm's state and
// may compile; it is never timed), then -w untimed calls, then --runs timed runs of -n calls back to back behind
// loom::barrier_on_stream; the time is per call, the median run's, of the slowest rank. In-place forms (Loom's):
// all_reduce out == in, all_gather in == out + rank x chunk, reduce_scatter out == in + rank x chunk; all_to_all has
// none (N/A).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "loom/ops/collectives.hpp"
#include "loom/runtime/world.hpp"
#include "nccl_args.hpp"

namespace loom::bench {

struct TableRun {
    std::vector<CollKind> kinds;
    NcclArgs args;
    CollAlgo algo = CollAlgo::Auto;
    DataPath path = DataPath::Auto;
    double align_hold_us = 0;  // loom::barrier_on_stream's hold before each timed run
};

// Prints the tables on rank 0 (every rank calls it); in and out are symmetric buffers of `buf_bytes` each.
// Returns the number of wrong elements over every size, placement and rank (0 when -c 0).
long long run_tables(World& w, const TableRun& run, void* in, void* out, std::size_t buf_bytes, cudaStream_t stream);

}  // namespace loom::bench
