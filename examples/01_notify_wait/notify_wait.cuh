// Example 01: ping-pong between rank pairs with notify / wait.
//
// Ranks 2i and 2i+1 form a pair (an odd last rank plays with itself). In round r the even rank notifies its
// partner (sets the partner's `sig` to r, release) and waits for its own `sig` to reach r (acquire); the odd
// rank waits first, then answers. Signals are monotonic: round r waits for >= r, nothing is ever reset.
#pragma once

#include "loom/lang/lang.cuh"

namespace example {
using namespace loom::lang;
using loom::uint32_t;
using loom::uint64_t;

// One thread per rank. Writes the round trip time of all `rounds` (ns, globaltimer) to *elapsed_ns.
__global__ void ping_pong(loom::Ctx ctx, uint64_t* sig, uint32_t rounds, int partner, uint64_t* elapsed_ns) {
    const bool initiator = rank(ctx) % 2 == 0;
    const uint64_t start = loom::ptx::globaltimer();
    for (uint64_t r = 1; r <= rounds; ++r) {
        if (initiator) {
            notify(thread, ctx, sig, partner, r);
            wait(thread, ctx, sig, Cmp::GE, r);
        } else {
            wait(thread, ctx, sig, Cmp::GE, r);
            notify(thread, ctx, sig, partner, r);
        }
    }
    *elapsed_ns = loom::ptx::globaltimer() - start;
}

}  // namespace example
