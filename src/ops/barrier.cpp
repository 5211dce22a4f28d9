// Host side of loom::barrier_on_stream: the collectives' one-block barrier kernel (kernels/coll_common.cuh).
#include "loom/ops/collectives.hpp"
#include "ops/coll_state.hpp"

namespace loom {

void barrier_on_stream(World& world, cudaStream_t stream) {
    coll::CollState& st = coll::coll_state(world);
    coll::launch_barrier(world, st, stream);
}

}  // namespace loom
