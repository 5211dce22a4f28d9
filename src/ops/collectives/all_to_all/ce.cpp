// all_to_all through the copy engine: an entry barrier (peers' in written / out free), the W copies on side
// streams, an exit barrier (every copy landed / every peer read my in); all ordered on `stream`.
#include <vector>

#include "ops/collectives/all_to_all/algorithms.hpp"
#include "ops/collectives/barrier.hpp"
#include "ops/collectives/copy_engine.hpp"

namespace loom::coll {

void all_to_all_ce(World& world, Core& core, bool pull, const BufferView& in, const BufferView& out,
                   cudaStream_t stream) {
    const int W = world.world_size(), me = world.rank();
    const std::size_t B = in.bytes() / W;  // per peer
    launch_barrier(world, core, stream);
    std::vector<CopyEngine::Copy> copies;
    for (int i = 0; i < W; ++i) {
        const int peer = (me + i) % W;
        if (pull)
            copies.push_back({static_cast<char*>(out.data) + peer * B,
                              world.peer_ptr(static_cast<const char*>(in.data) + me * B, peer), B});
        else
            copies.push_back({world.peer_ptr(static_cast<char*>(out.data) + me * B, peer),
                              static_cast<const char*>(in.data) + peer * B, B});
    }
    world.state<CopyEngine>().fanout(stream, copies);
    launch_barrier(world, core, stream);
}

}  // namespace loom::coll
