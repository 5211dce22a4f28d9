// The intra-kernel profiler's device side (docs/profiling.md): begin / end / instant records with the global timer,
// SM, block and warp, a tag and a 32-bit value, into the process's ring for this GPU (layout: lang/profile_event.hpp).
//
// Compiled in only where the translation unit defines LOOM_PROFILE=1: the JIT adds that define to every kernel it
// compiles while profiling is on (LOOM_PROFILE=<dir>, loom::profile::set_enabled), so the define is part of the
// compile key and profiled kernels are cached apart from the others. Without it every macro below expands to nothing:
// its arguments are not even evaluated, and the kernel is the one that was never instrumented (the CPU test
// ProfileCompile.OffIsTheUninstrumentedKernel compares the cubins).
//
//   LOOM_PROF_BEGIN(tag, value)    a span starts (call it from one thread: the one whose track it is)
//   LOOM_PROF_END(tag, value)      the span of `tag` started last on this thread ends
//   LOOM_PROF_INSTANT(tag, value)  a point event
//   LOOM_PROF_BLOCK_SPAN(tag, value) a span over the enclosing scope, recorded by the block's thread 0
//   LOOM_PROF_AT_SCOPE_EXIT(...)   statements run when the enclosing scope exits (a late record_at)
//   LOOM_PROF_ONLY(...)            code that exists only in profiled kernels (e.g. a predicate shared by two records)
//
// Cost when on: per record one read of %globaltimer, one atomicAdd on the ring's counter (a single L2 atomic; records
// are per tile / chunk / phase, not per element) and two 16-byte stores. Records past the ring's capacity are counted
// and dropped. The module global `loom_profile_ring` is written by the JIT when it loads the module (null: record
// nothing); it is defined here, in the one translation unit the JIT compiles per kernel.
#pragma once

#include "loom/config.hpp"
#include "loom/lang/profile_event.hpp"

#if defined(LOOM_PROFILE) && LOOM_PROFILE

#include "loom/ptx/special.cuh"

extern "C" {
__device__ loom::lang::ProfileRing* loom_profile_ring;
}

namespace loom::lang::profile {

inline constexpr bool kEnabled = true;

// A record with a timestamp read earlier (ptx::globaltimer()).
LOOM_DEVICE LOOM_FORCEINLINE void record_at(uint64_t t, uint16_t tag, uint8_t kind, uint32_t value) {
    ProfileRing* const ring = loom_profile_ring;
    if (ring == nullptr) return;
    const unsigned long long i = atomicAdd(&ring->count, 1ull);
    if (i >= ring->capacity) return;
    const uint32_t warp = ptx::warp_id();
    const uint32_t block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    uint4* const dst = reinterpret_cast<uint4*>(reinterpret_cast<ProfileEvent*>(ring + 1) + i);
    dst[0] = make_uint4(static_cast<uint32_t>(t), static_cast<uint32_t>(t >> 32), value,
                        static_cast<uint32_t>(tag) | (static_cast<uint32_t>(kind) << 16) | (warp << 24));
    dst[1] = make_uint4(ptx::smid(), block, 0u, 0u);
}

LOOM_DEVICE LOOM_FORCEINLINE void record(uint16_t tag, uint8_t kind, uint32_t value) {
    record_at(ptx::globaltimer(), tag, kind, value);  // the timestamp first: the atomic does not delay it
}

// Runs `f` when the object leaves its scope (every exit, a `continue` too): a record written later than the event it
// marks, e.g. once registers are free again (the GEMM's mainloop end, written after its epilogue).
template <class F>
struct AtScopeExit {
    F f;
    LOOM_DEVICE LOOM_FORCEINLINE ~AtScopeExit() { f(); }
};
template <class F>
AtScopeExit(F) -> AtScopeExit<F>;

// A span over a whole block's scope: thread 0 records its begin at construction and its end at every exit.
struct BlockSpan {
    uint16_t tag;
    uint32_t value;
    LOOM_DEVICE LOOM_FORCEINLINE BlockSpan(uint16_t t, uint32_t v) : tag(t), value(v) {
        if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) record(tag, kProfileBegin, value);
    }
    LOOM_DEVICE LOOM_FORCEINLINE ~BlockSpan() {
        if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) record(tag, kProfileEnd, value);
    }
};

}  // namespace loom::lang::profile

#define LOOM_PROF_CAT2(a, b) a##b
#define LOOM_PROF_CAT(a, b) LOOM_PROF_CAT2(a, b)
#define LOOM_PROF_BLOCK_SPAN(tag, value)                                                   \
    const ::loom::lang::profile::BlockSpan LOOM_PROF_CAT(loom_prof_span_, __LINE__)((tag), \
                                                                                    static_cast<unsigned int>(value))
#define LOOM_PROF_AT_SCOPE_EXIT(...)                                                    \
    const ::loom::lang::profile::AtScopeExit LOOM_PROF_CAT(loom_prof_exit_, __LINE__) { \
        [&] { __VA_ARGS__; }                                                            \
    }
#define LOOM_PROF_BEGIN(tag, value) \
    ::loom::lang::profile::record((tag), ::loom::lang::kProfileBegin, static_cast<unsigned int>(value))
#define LOOM_PROF_END(tag, value) \
    ::loom::lang::profile::record((tag), ::loom::lang::kProfileEnd, static_cast<unsigned int>(value))
#define LOOM_PROF_INSTANT(tag, value) \
    ::loom::lang::profile::record((tag), ::loom::lang::kProfileInstant, static_cast<unsigned int>(value))
#define LOOM_PROF_ONLY(...) __VA_ARGS__

#else

namespace loom::lang::profile {
inline constexpr bool kEnabled = false;
}  // namespace loom::lang::profile

#define LOOM_PROF_BLOCK_SPAN(tag, value)
#define LOOM_PROF_AT_SCOPE_EXIT(...)
#define LOOM_PROF_BEGIN(tag, value) ((void)0)
#define LOOM_PROF_END(tag, value) ((void)0)
#define LOOM_PROF_INSTANT(tag, value) ((void)0)
#define LOOM_PROF_ONLY(...)

#endif
