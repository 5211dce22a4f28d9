// Cooperating groups as typed arguments: every language primitive takes the group that calls it.
//
// Contract shared by all primitives: every thread of the group calls the primitive with the same arguments
// (convergent, like __syncthreads), and the primitive splits the work among the group's threads. `Thread` is
// one thread alone; `Warp` is the 32 lanes of a fully active warp; `Block` is every thread of the CTA.
#pragma once

#include "loom/config.hpp"
#include "loom/ptx/special.cuh"

namespace loom::lang {

struct Thread {
    LOOM_DEVICE LOOM_FORCEINLINE uint32_t rank() const { return 0; }
    LOOM_DEVICE LOOM_FORCEINLINE uint32_t size() const { return 1; }
    LOOM_DEVICE LOOM_FORCEINLINE void sync() const {}
    LOOM_DEVICE LOOM_FORCEINLINE bool leader() const { return true; }
};

struct Warp {
    LOOM_DEVICE LOOM_FORCEINLINE uint32_t rank() const { return ptx::lane_id(); }
    LOOM_DEVICE LOOM_FORCEINLINE uint32_t size() const { return 32; }
    LOOM_DEVICE LOOM_FORCEINLINE void sync() const { __syncwarp(); }
    LOOM_DEVICE LOOM_FORCEINLINE bool leader() const { return ptx::lane_id() == 0; }
};

struct Block {
    LOOM_DEVICE LOOM_FORCEINLINE uint32_t rank() const {
        return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    }
    LOOM_DEVICE LOOM_FORCEINLINE uint32_t size() const { return blockDim.x * blockDim.y * blockDim.z; }
    LOOM_DEVICE LOOM_FORCEINLINE void sync() const { __syncthreads(); }
    LOOM_DEVICE LOOM_FORCEINLINE bool leader() const { return rank() == 0; }
};

// Every block of the grid; only barrier_all takes it (it needs all blocks co-resident).
struct Grid {
    LOOM_DEVICE LOOM_FORCEINLINE uint32_t num_blocks() const { return gridDim.x * gridDim.y * gridDim.z; }
    LOOM_DEVICE LOOM_FORCEINLINE uint32_t block_rank() const {
        return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    }
};

// The tags as values: notify(lang::block, ...). (constexpr __device__: usable in device code under nvcc.)
constexpr LOOM_DEVICE Thread thread{};
constexpr LOOM_DEVICE Warp warp{};
constexpr LOOM_DEVICE Block block{};
constexpr LOOM_DEVICE Grid grid{};

}  // namespace loom::lang
