// all_gather with in staged through the scratch (Auto's choice where neither in nor out is symmetric, past the LL
// sizes; pull asked for by name with an in that is not symmetric). After a barrier kernel (every peer finished its
// earlier collectives, which may still read this rank's scratch: the staged two-shot's last round does), each round
// copies the next C bytes of in into this rank's scratch (a device-to-device copy on the stream) and runs the pull
// kernel over them: every rank reads round k of every peer's input from the peer's scratch into chunk q of its out
// at offset k x C (kernels/collectives/all_gather.cuh, round_elems). The pull kernel's exit barrier (every peer has
// read my scratch) frees the scratch for the next round's copy. Cost beyond the pull on symmetric buffers: one local
// copy of in (B bytes read and written) and one barrier kernel, and a kernel launch per round past the scratch.
#include <algorithm>
#include <string>

#include "loom/runtime/error.hpp"
#include "ops/collectives/all_gather/algorithms.hpp"
#include "ops/collectives/barrier.hpp"

namespace loom::coll {

void all_gather_staged(World& world, Core& core, const CollChoice& c, const BufferView& in, const BufferView& out,
                       const CollOptions& opts, cudaStream_t stream) {
    const std::size_t B = in.bytes();
    const Scratch& scratch = world.state<Scratch>();
    const std::size_t C = std::min(B, scratch.bytes / 16 * 16);  // bytes per round, the same on every rank
    // count: out's chunk stride, bytes
    Launch l = staged_pull_launch("all_gather", c, "loom/kernels/collectives/all_gather.cuh",
                                  "loom::kernels::coll::all_gather_pull", core.params(), scratch.data, B, C, opts,
                                  core.budget);
    const jit::Kernel& k = load(l);  // compiled before anything is enqueued
    launch_barrier(world, core, stream);
    const char* const src = static_cast<const char*>(in.data);
    for (std::size_t off = 0; off < B; off += C) {
        const std::size_t n = std::min(C, B - off);
        LOOM_CHECK_CUDA(cudaMemcpyAsync(scratch.data, src + off, n, cudaMemcpyDeviceToDevice, stream));
        l.params.out = static_cast<char*>(out.data) + off;
        l.params.round_elems = n;
        launch(world, k, l, stream);
    }
}

}  // namespace loom::coll
