// The intra-kernel profiler's host side (docs/profiling.md; device side: loom/lang/profile.cuh).
//
// On with LOOM_PROFILE=<dir> (or `loomrun --profile DIR`): every kernel the JIT compiles from then on is the profiled
// instantiation (LOOM_PROFILE=1 is part of its compile key), writing begin / end records into one ring of device
// memory per process and GPU. write_trace() collects every rank's records, aligns the ranks' clocks and writes one
// Chrome-trace / Perfetto JSON; a World writes one into the directory when it shuts down.
#pragma once

#include <cstdint>
#include <string>

namespace loom {

class World;

namespace profile {

// Whether kernels fetched now are the profiled ones: LOOM_PROFILE is set, unless set_enabled overrides it.
bool enabled();
// Process-wide override of LOOM_PROFILE (benchmarks alternate profiled and unprofiled calls of one op). Takes effect
// at the next kernel fetch, so at an op's next call. Every rank must make the same calls (write_trace is collective).
void set_enabled(bool on);

// Names a user kernel's tag (>= lang::kProfileUserTag0) in the traces. Raises loom::Error for a tag below it.
void register_tag(uint16_t tag, const std::string& name);

// Collective (every rank of the World calls it): synchronises the device, takes every record of this process's
// ring (and empties it), and rank 0 writes one trace of every rank to `path` (empty: a new
// <LOOM_PROFILE>/loom_trace_<pid>_<n>.json). Returns the path on every rank, "" when no rank recorded anything.
// Raises loom::Error when the directory cannot be written or a rank does not arrive within the store's timeout.
std::string write_trace(World& world, const std::string& path = "");

// Drops this rank's records so far (not collective; synchronises the device).
void clear();

// Records this rank's ring holds, and those dropped because it was full, since it was last emptied.
struct RingCounts {
    uint64_t recorded = 0;
    uint64_t dropped = 0;
};
RingCounts ring_counts();

}  // namespace profile
}  // namespace loom
