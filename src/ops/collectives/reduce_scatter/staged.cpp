// reduce_scatter with in staged through the scratch: the pull (one pass, reduced in registers) where in is not
// symmetric (Auto's choice past the LL sizes where the cost model puts it below scatter; pull asked for by name).
// After a barrier kernel (every peer finished its earlier collectives, which may still read this rank's scratch: the
// staged two-shot's last round does), each round copies columns [off, off + C) of in's W chunks into this rank's
// scratch, packed (one 2D device-to-device copy on the stream), and runs the pull kernel over them with chunks C
// elements apart: every rank reduces round k of its chunk from every peer's scratch into out[off, off + C). The pull
// kernel's exit barrier (every peer has read my scratch) frees the scratch for the next round's copy. Rounds write
// only out[off, off + C), which in place (out = in's chunk of this rank) no later round reads. Cost beyond the pull
// on a symmetric in: one local copy of in (W x out bytes read and written), the barrier kernel, and a copy and a
// kernel launch per round past the scratch.
#include <algorithm>
#include <string>

#include "loom/runtime/error.hpp"
#include "ops/collectives/barrier.hpp"
#include "ops/collectives/reduce_scatter/algorithms.hpp"

namespace loom::coll {

void reduce_scatter_staged(World& world, Core& core, const CollChoice& c, const BufferView& in, const BufferView& out,
                           const CollOptions& opts, cudaStream_t stream) {
    LOOM_CHECK(c.algo == CollAlgo::Pull && c.path == DataPath::LdSt,
               "reduce_scatter: staged through the scratch runs pull over ld/st, given {}/{}", to_string(c.algo),
               to_string(c.path));
    const int W = world.world_size();
    const std::size_t es = dtype_size(in.dtype), S = out.count;
    const Scratch& scratch = world.state<Scratch>();
    // Elements of each chunk per round: W x C fill the scratch; C a multiple of 16 elements, the same on every rank.
    const std::size_t C = std::min(S, scratch.bytes / (static_cast<std::size_t>(W) * es) / 16 * 16);
    Launch l;
    l.header = "loom/kernels/collectives/reduce_scatter.cuh";
    l.name = "loom::kernels::coll::reduce_scatter_pull";
    l.template_args = {cuda_type(in.dtype), opts.op == ReduceOp::Max ? "1" : "0"};
    l.params = core.params();
    l.params.in = scratch.data;
    if (core.budget.topo.shared_gpu) {  // as the pull on a symmetric in (ld_tma.cpp)
        l.template_args.push_back(std::to_string(kernels::coll::kDepthGrid));
        l.template_args.push_back(std::to_string(W));
        l.params.flags |= kernels::coll::kFlagGridStride;
    }
    l.blocks = pick_blocks(C * es * W, 128 * 1024, grid_stride_block_cap(core.budget, 64, false), opts, core.budget);
    const jit::Kernel& k = load(l);  // compiled before anything is enqueued
    launch_barrier(world, core, stream);
    const char* const src = static_cast<const char*>(in.data);
    for (std::size_t off = 0; off < S; off += C) {
        const std::size_t n = std::min(C, S - off);
        pack_round(scratch.data, src, S * es, off * es, n * es, W, stream);
        l.params.out = static_cast<char*>(out.data) + off * es;
        l.params.count = n;  // the chunks' stride in the scratch and the elements reduced
        launch(world, k, l, stream);
    }
}

}  // namespace loom::coll
