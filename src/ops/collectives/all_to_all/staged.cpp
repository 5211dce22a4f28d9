// all_to_all with in staged through the scratch (Auto's choice where neither in nor out is symmetric, past the LL
// sizes; pull asked for by name with an in that is not symmetric). After a barrier kernel (every peer finished its
// earlier collectives, which may still read this rank's scratch), each round copies the next C bytes of each of in's
// W blocks into this rank's scratch, packed (one 2D device-to-device copy on the stream), and runs the pull kernel
// over them: every rank reads round k of its block from every peer's scratch into block q of its out at offset k x C
// (kernels/collectives/all_to_all.cuh, round_elems). The pull kernel's exit barrier frees the scratch for the next
// round. Cost beyond the pull on symmetric buffers: one local copy of in and one barrier kernel, and a kernel launch
// per round past the scratch.
#include <algorithm>
#include <string>

#include "loom/runtime/error.hpp"
#include "ops/collectives/all_to_all/algorithms.hpp"
#include "ops/collectives/barrier.hpp"

namespace loom::coll {

void all_to_all_staged(World& world, Core& core, const CollChoice& c, const BufferView& in, const BufferView& out,
                       const CollOptions& opts, cudaStream_t stream) {
    const int W = world.world_size();
    const std::size_t B = in.bytes() / W;  // per peer
    const Scratch& scratch = world.state<Scratch>();
    const std::size_t C = std::min(B, scratch.bytes / W / 16 * 16);  // bytes per block per round
    // count: out's block stride, bytes
    Launch l = staged_pull_launch("all_to_all", c, "loom/kernels/collectives/all_to_all.cuh",
                                  "loom::kernels::coll::all_to_all_pull", core.params(), scratch.data, B, C, opts,
                                  core.budget);
    const jit::Kernel& k = load(l);  // compiled before anything is enqueued
    launch_barrier(world, core, stream);
    for (std::size_t off = 0; off < B; off += C) {
        const std::size_t n = std::min(C, B - off);
        pack_round(scratch.data, static_cast<const char*>(in.data), B, off, n, W, stream);
        l.params.out = static_cast<char*>(out.data) + off;
        l.params.round_elems = n;
        launch(world, k, l, stream);
    }
}

}  // namespace loom::coll
