// all_gather, pull through the copy engine: an entry barrier, the W - 1 peer copies and the own chunk's copy at once
// (side streams), an exit barrier; all ordered on `stream`.
#include <vector>

#include "ops/collectives/all_gather/algorithms.hpp"
#include "ops/collectives/barrier.hpp"
#include "ops/collectives/copy_engine.hpp"

namespace loom::coll {

void all_gather_pull_ce(World& world, Core& core, const BufferView& in, const BufferView& out, cudaStream_t stream) {
    const int W = world.world_size(), me = world.rank();
    const std::size_t B = in.bytes();
    char* const mine = static_cast<char*>(out.data) + me * B;
    launch_barrier(world, core, stream);
    std::vector<CopyEngine::Copy> copies;
    for (int i = 0; i < W; ++i) {
        const int peer = (me + i) % W;
        if (peer == me && in.data == mine) continue;
        char* dst = static_cast<char*>(out.data) + peer * B;
        // In place, the peer's input is slot `peer` of its out (my in is slot `me`: not a symmetric offset).
        const void* src = world.peer_ptr(in.data == mine ? static_cast<const void*>(dst) : in.data, peer);
        copies.push_back({dst, src, B});
    }
    world.state<CopyEngine>().fanout(stream, copies);
    launch_barrier(world, core, stream);
}

}  // namespace loom::coll
