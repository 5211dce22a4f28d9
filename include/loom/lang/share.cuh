// A launch's blocks splitting a byte or element range between them: block b takes the b-th contiguous share.
// (The collectives and the overlapped ops' copy kernels all partition their data this way.)
#pragma once

#include "loom/config.hpp"

namespace loom::lang {

// [lo, hi): a part of a range; empty when hi <= lo.
struct Range {
    uint64_t lo, hi;
    LOOM_DEVICE LOOM_FORCEINLINE uint64_t size() const { return hi > lo ? hi - lo : 0; }
};

// This block's share of [0, n): ceil(n / gridDim.x) rounded up to a multiple of `align` per block, so every share
// starts at a multiple of `align`; the blocks past the end get empty shares.
LOOM_DEVICE LOOM_FORCEINLINE Range block_share(uint64_t n, uint64_t align) {
    const uint64_t nb = gridDim.x;
    uint64_t per = (n + nb - 1) / nb;
    per = (per + align - 1) / align * align;
    uint64_t lo = per * blockIdx.x, hi = lo + per;
    if (lo > n) lo = n;
    if (hi > n) hi = n;
    return Range{lo, hi};
}

}  // namespace loom::lang
