// A launch's call number kept in device memory: the epoch of kernels that every CTA of one launch shares (the
// overlapped GEMMs' fused epilogues), with no host value and no reset, so a CUDA graph that replays the launch gets
// a new number each replay.
//
// State: one LaunchEpoch per kernel family and rank (in the symmetric heap or plain device memory), zeroed once at
// allocation. `calls` is the number of the last launch that entered; `arrived` counts the CTAs of the current launch
// that have read it (back to 0 once all did).
//
// Contract of launch_epoch_enter (one thread of every CTA, exactly once per CTA, before the CTA uses the number):
//   - the launches that share a LaunchEpoch are ordered (one stream, or stream-ordered across streams): a launch
//     starts after the previous one has ended, so it reads the number the previous launch's last CTA stored;
//   - every CTA of the launch calls it (the last of gridDim.x * gridDim.y * gridDim.z arrivals advances `calls`);
//     the CTAs need not be co-resident: nobody waits here.
// Returns the launch's number (1, 2, ...), the same in every CTA of the launch. Launch k of a rank on a World is
// launch k on every rank when the ranks make the same calls in the same order, as collective ops do.
#pragma once

#include "loom/config.hpp"

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#include "loom/ptx/memory.cuh"
#endif

namespace loom::lang {

struct LaunchEpoch {
    uint64_t calls;    // the last launch's number (advanced by that launch's last arriving CTA)
    uint32_t arrived;  // CTAs of the current launch that have read `calls` (wraps to 0 at the last)
    uint32_t reserved;
};

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
LOOM_DEVICE inline uint64_t launch_epoch_enter(LaunchEpoch* s) {
    const uint64_t e = ptx::ld_relaxed_gpu(&s->calls) + 1;
    const uint32_t last = gridDim.x * gridDim.y * gridDim.z - 1;
    // acq_rel: this CTA's read of `calls` is ordered before its arrival, and the last arrival's store after every
    // arrival, so no CTA of this launch can read the advanced number; atom.inc wraps `arrived` back to 0 there.
    if (ptx::atom_inc_acq_rel_gpu(&s->arrived, last) == last) ptx::st_relaxed_gpu(&s->calls, e);
    return e;
}
#endif

}  // namespace loom::lang
