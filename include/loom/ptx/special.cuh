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

}  // namespace loom::ptx
