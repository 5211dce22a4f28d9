// Copy-engine puts and stream-ordered signals: the host-side producers and consumers of the device language.
//
// A kernel can wait (lang::wait) for a signal that a copy-engine transfer raises, and a stream can wait for a
// signal that a kernel raises, so copy-engine data paths mix with kernel ones. Signals are the same 64-bit
// monotonic counters as on the device (symmetric memory); stream waits compare wrap-safely (GEQ) or exactly (EQ).
//
// Ordering: put_ce then signal_ce on one stream is a put_signal: the driver's stream write carries a memory
// barrier (CU_STREAM_WRITE_VALUE_DEFAULT), so a device wait that sees the value sees the data.
// Bounds: a stream wait cannot be bounded by the GPU. The library's ops enqueue theirs through
// detail::WatchedWaits (src/runtime/stream_watchdog.hpp), whose host watchdog reports a wait outstanding past
// LOOM_WAIT_TIMEOUT_MS and aborts the process; wait_stream_bounded() synchronises a stream against the same bound
// and raises.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace loom {
class World;
}

namespace loom::stream_ops {

enum class WaitCmp { GEQ, EQ };

// Copy `bytes` from `src` (this rank's device memory) to `peer`'s copy of the symmetric `dst` with the copy
// engine (cudaMemcpyAsync on World::peer_ptr). Raises for a non-symmetric dst, an unreachable peer, or a
// range that leaves the heap.
void put_ce(World& world, void* dst, const void* src, std::size_t bytes, int peer, cudaStream_t stream);

// Stream-ordered write of `value` to `peer`'s copy of the symmetric signal `sig` (cuStreamWriteValue64, with a
// memory barrier before it: everything earlier on the stream is visible to whoever sees the value).
void signal_ce(World& world, std::uint64_t* sig, std::uint64_t value, int peer, cudaStream_t stream);

// put_ce then signal_ce on the same stream.
void put_signal_ce(World& world, void* dst, const void* src, std::size_t bytes, std::uint64_t* sig, std::uint64_t value,
                   int peer, cudaStream_t stream);

// Write / wait on any device address (cuStreamWriteValue64 / cuStreamWaitValue64). GEQ is wrap-safe:
// (int64_t)(*addr - value) >= 0.
void write_value(cudaStream_t stream, std::uint64_t* addr, std::uint64_t value);
void wait_value(cudaStream_t stream, const std::uint64_t* addr, std::uint64_t value, WaitCmp cmp = WaitCmp::GEQ);

// Whether `stream` is capturing a CUDA graph: the stream operations then become graph nodes whose values every replay
// repeats, so a protocol that would write a per-call count must use constants and resets instead.
bool capturing(cudaStream_t stream);

// Synchronise `stream`, raising loom::Error after LOOM_WAIT_TIMEOUT_MS (unless 0) instead of hanging on a
// stream wait whose signal never comes.
void wait_stream_bounded(cudaStream_t stream, const char* what);

}  // namespace loom::stream_ops
