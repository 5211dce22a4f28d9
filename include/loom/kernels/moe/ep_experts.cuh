// ep_moe_experts, Overlapped, on the device (host side: src/ops/moe/ep/experts.cpp): the grouped GEMM's hooks over the
// per-expert push of kernels/moe/ep_dispatch.cuh (ep_dispatch_push_experts).
//
//   grouped GEMM with EpExpertHooks over recv_x and the L local experts' segments: the grouped raster of
//                GroupedNoHooks (the tiles plain grouped_gemm computes, in the same order: the same bits), and before a
//                tile of local expert l is loaded its producer thread waits (bounded, acquire, sys) for
//                expert_ready[l] >= W (zeroed on this rank's stream before the call's push): every source rank's
//                rows of l have landed. The push orders its work local expert 0 first, so the first groups fill
//                first.
//
// Progress with ranks sharing a GPU (MPS): the GEMM's blocks wait only for other kernels — this rank's push (earlier
// on the stream: complete before the GEMM starts) and the peers' pushes, which wait for nothing (they follow the
// peers' scans, which waited for this rank's scan, also earlier on this stream). No block waits for another block of
// its own kernel, so no co-residency is assumed; a peer's push progresses on its own SM share however long this
// rank's GEMM blocks spin.
#pragma once

#ifndef LOOM_NO_DEVICE_PRINTF
#define LOOM_NO_DEVICE_PRINTF 1  // wgmma kernel in this TU: no printf anywhere (ptxas C7510)
#endif

#include "loom/kernels/moe/ep_dispatch.cuh"
#include "loom/kernels/moe/ep_params.hpp"
#include "loom/kernels/moe/grouped_gemm.cuh"
#include "loom/kernels/moe/grouped_gemm_sm80.cuh"
#include "loom/lang/lang.cuh"

namespace loom::kernels::moe {

struct EpExpertHooks {
    EpExpertHookArgs a;
    LOOM_DEVICE LOOM_FORCEINLINE void tile_order(int32_t linear, const GroupedTileGrid& g, int32_t& rb,
                                                 int32_t& nb) const {
        GroupedNoHooks{}.tile_order(linear, g, rb, nb);
    }
    // The producer thread (Hopper) / thread 0 (sm_80), once per tile; group = local expert.
    LOOM_DEVICE LOOM_FORCEINLINE void before_load(int32_t group, int32_t) const {
        lang::wait_ge_sys_or_trap(a.expert_ready + group, a.target, a.timeout_ns,
                                  "ep_moe_experts: grouped GEMM waits for an expert's rows");
    }
    LOOM_DEVICE LOOM_FORCEINLINE uint64_t wait_bound_ns() const { return a.timeout_ns; }
};
static_assert(GroupedHooks<EpExpertHooks> && GroupedLoadWait<EpExpertHooks> && !GroupedStoreNotify<EpExpertHooks>);

}  // namespace loom::kernels::moe
