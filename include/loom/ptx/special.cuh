// Special registers and thread-identity helpers.
#pragma once

#include "loom/config.hpp"

namespace loom::ptx {

// Global nanosecond timer (same clock on every SM; ~1 us update granularity on Hopper).
LOOM_DEVICE LOOM_FORCEINLINE uint64_t globaltimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// Index of the SM this thread runs on (may change only across preemption).
LOOM_DEVICE LOOM_FORCEINLINE uint32_t smid() {
    uint32_t v;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(v));
    return v;
}
LOOM_DEVICE LOOM_FORCEINLINE uint32_t lane_id() {
    uint32_t v;
    asm("mov.u32 %0, %%laneid;" : "=r"(v));
    return v;
}
// Logical warp index inside the block (linear thread index / 32), not the physical %warpid.
LOOM_DEVICE LOOM_FORCEINLINE uint32_t warp_id() {
    return (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) >> 5;
}
// %tid.x read through asm volatile: what is computed from it is recomputed where it is used instead of being hoisted
// out of a loop and held in registers across it (for kernels at their register limit; costs a few ALU ops).
LOOM_DEVICE LOOM_FORCEINLINE uint32_t tid_x_unhoisted() {
    uint32_t v;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(v));
    return v;
}
LOOM_DEVICE LOOM_FORCEINLINE void nanosleep(uint32_t ns) { asm volatile("nanosleep.u32 %0;" ::"r"(ns)); }

// Programmatic dependent launch (sm_90+; no-ops below, where the host never sets the launch attribute).
// A kernel launched with programmatic stream serialization (jit::LaunchConfig::programmatic) may start while the
// previous kernel of its stream still runs; griddep_wait() blocks until that kernel has completed and its memory
// operations are visible, so every thread calls it before touching memory the previous kernel may use. It returns
// at once when the launch was not programmatic.
LOOM_DEVICE LOOM_FORCEINLINE void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the next kernel of the stream, when launched programmatically, start launching once every block of this
// grid has called it (or exited). It orders nothing: the next kernel still waits in griddep_wait() for this one to
// complete.
LOOM_DEVICE LOOM_FORCEINLINE void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace loom::ptx
