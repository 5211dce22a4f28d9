// The profiler's device-side state on the host: one ring per process and GPU, the module globals that point at it,
// and the clock reading (internal; public API: loom/runtime/profile.hpp).
#pragma once

#include <cuda.h>

#include <string>

#include "loom/runtime/profile.hpp"
#include "runtime/profile_trace.hpp"

namespace loom::profile::detail {

// Records per ring (32 bytes each: 32 MiB of device memory per process and GPU, allocated at the first profiled
// kernel's load).
inline constexpr uint32_t kRingRecords = 1u << 20;

// The JIT, after loading a module: when the module defines loom_profile_ring (a profiled kernel), create this GPU's
// ring if needed and write its address there (a private non-blocking stream; never waits for running kernels).
void bind_library(CUlibrary library);

// Synchronises the device, copies the current GPU's records out and empties the ring. No ring: none.
RankRecords take_records(int rank);

// The current GPU's clock paired with the host's monotonic clock (a clock_ping kernel, 16 pings, the tightest kept).
ClockReading read_clock();

}  // namespace loom::profile::detail

namespace loom {
class Store;
}

namespace loom::profile::detail {

// write_trace over a Store (World::shutdown calls it while the store is still up): see loom::profile::write_trace.
std::string write_trace_with(Store& store, int rank, int world_size, const std::string& path);

// The current GPU's ring counts without emptying it (synchronises the device).
RingCounts peek_counts();

}  // namespace loom::profile::detail
