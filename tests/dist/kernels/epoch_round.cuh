// What loom_test::epochs (lang_test.cuh) records for each round, and how it packs the answers of the compare under
// test. Shared by the kernel and the host check (tests/common/epoch_rounds.hpp): compiles under NVRTC and the host
// compiler.
//
// Round k (1-based) waits for target = base + k. The kernel asks the compare `v <cmp> target` for every cmp, in
// lang::Cmp's order (EQ, NE, GE, GT, LE, LT), at two values v:
//   kBefore    target - 1: the epoch the counter holds until the round's notify lands (what wait() compares while
//              it spins);
//   kObserved  the value the wait returned.
// Answer bit probe * kNumCmps + cmp is set when the compare answered true.
#pragma once

#include "loom/config.hpp"

namespace loom_test {

inline constexpr int kNumCmps = 6;
enum EpochProbe : int { kBefore = 0, kObserved = 1 };

struct EpochRound {
    loom::uint64_t observed;  // the value the round's wait returned
    loom::uint32_t answers;   // bit probe * kNumCmps + cmp: the compare's answer
    loom::uint32_t unused;
};

// The answer bits of `compare(v, cmp, target)` (cmp as an int in lang::Cmp's order) for both probes of a round.
template <class Compare>
LOOM_HOST_DEVICE inline loom::uint32_t epoch_answers(loom::uint64_t target, loom::uint64_t observed,
                                                     Compare&& compare) {
    loom::uint32_t bits = 0;
    for (int c = 0; c < kNumCmps; ++c) {
        bits |= static_cast<loom::uint32_t>(compare(target - 1, c, target)) << (kBefore * kNumCmps + c);
        bits |= static_cast<loom::uint32_t>(compare(observed, c, target)) << (kObserved * kNumCmps + c);
    }
    return bits;
}

}  // namespace loom_test
