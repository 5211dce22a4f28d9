// all_reduce, two-shot with in staged (Auto's choice past the LL sizes where in is not symmetric and the cost model
// puts it below one-shot; two-shot asked for by name with an in that is not symmetric):
//   out symmetric: in is copied into out (a device-to-device copy on the stream) and the two-shot reduces in place
//     there. No scratch and no barrier kernel: the peers touch this rank's out only between the kernel's entry and
//     exit barriers, and the copy precedes the entry in stream order. Cost beyond the two-shot on a symmetric in: one
//     local copy of in.
//   out not symmetric: after a barrier kernel (every peer finished its earlier collectives, which may still read
//     this rank's scratch: the staged two-shot's last round does), rounds of R elements: the round of in is copied
//     into the first half of this rank's scratch and the staged two-shot (kFlagStagedOut) reduces it into out, its
//     shards through the second half. A round's kernel reads the peers' first halves only before its last barrier,
//     so when it ends on this rank the first half is free for the next round's copy; the peers' copies out of the
//     second half may outlast it, and the next kernel writes that half only after its entry barrier. Cost beyond the
//     staged two-shot on a symmetric in: one local copy of in, the barrier kernel, and a copy and a kernel launch per
//     round past half the scratch.
#include <algorithm>

#include "loom/runtime/error.hpp"
#include "ops/collectives/all_reduce/algorithms.hpp"
#include "ops/collectives/barrier.hpp"

namespace loom::coll {

void all_reduce_staged(World& world, Core& core, const CollChoice& c, const BufferView& in, const BufferView& out,
                       bool out_symmetric, const CollOptions& opts, cudaStream_t stream) {
    LOOM_CHECK(c.algo == CollAlgo::TwoShot && c.path == DataPath::LdSt,
               "all_reduce: staged in runs two_shot over ld/st, given {}/{}", to_string(c.algo), to_string(c.path));
    const int W = world.world_size();
    const std::size_t es = dtype_size(in.dtype), N = in.count;
    Launch l;
    l.header = "loom/kernels/collectives/all_reduce.cuh";
    l.name = "loom::kernels::coll::all_reduce_two_shot";
    l.template_args = {cuda_type(in.dtype), opts.op == ReduceOp::Max ? "1" : "0"};
    l.params = core.params();
    if (out_symmetric) {
        l.params.in = out.data;
        l.params.out = out.data;
        l.params.count = N;
        l.blocks = pick_blocks(in.bytes() * 2, 128 * 1024, 64, opts, core.budget);
        const jit::Kernel& k = load(l);  // compiled before anything is enqueued
        LOOM_CHECK_CUDA(cudaMemcpyAsync(out.data, in.data, in.bytes(), cudaMemcpyDeviceToDevice, stream));
        launch(world, k, l, stream);
        return;
    }
    const Scratch& scratch = world.state<Scratch>();
    const std::size_t half = scratch.bytes / 2 / 16 * 16;    // bytes: the round of in; the shards from there on
    const std::size_t R = std::min(N, half / es / 16 * 16);  // elements per round, the same on every rank
    l.params.in = scratch.data;
    l.params.scratch = scratch.data + half;
    l.params.scratch_bytes = scratch.bytes - half;
    l.params.flags |= kernels::coll::kFlagStagedOut;
    l.blocks = pick_blocks(R * es * 2, 128 * 1024, 64, opts, core.budget);
    const jit::Kernel& k = load(l);
    launch_barrier(world, core, stream);
    const char* const src = static_cast<const char*>(in.data);
    for (std::size_t off = 0; off < N; off += R) {
        const std::size_t n = std::min(R, N - off);
        LOOM_CHECK_CUDA(cudaMemcpyAsync(scratch.data, src + off * es, n * es, cudaMemcpyDeviceToDevice, stream));
        const std::size_t shard = ((n + W - 1) / W + 15) / 16 * 16;  // >= the kernel's shard
        l.params.out = static_cast<char*>(out.data) + off * es;
        l.params.count = n;
        l.params.round_elems = std::min(shard, l.params.scratch_bytes / es / 16 * 16);
        launch(world, k, l, stream);
    }
}

}  // namespace loom::coll
