// Host side of loom::barrier_on_stream: the collectives' one-block barrier kernel (kernels/coll_common.cuh).
#include "loom/ops/collectives.hpp"
#include "loom/runtime/error.hpp"
#include "ops/collectives/coll_state.hpp"

namespace loom {

void barrier_on_stream(World& world, cudaStream_t stream, double hold_us) {
    LOOM_CHECK(hold_us >= 0 && hold_us <= 1e6, "barrier_on_stream: expected hold_us in [0, 1e6], given {}", hold_us);
    coll::CollState& st = coll::coll_state(world);
    coll::launch_barrier(world, st, stream, static_cast<uint32_t>(hold_us * 1e3));
}

}  // namespace loom
