// reduce_scatter in one kernel: LL (kernels/collectives/coll_ll.cuh), pull, scatter, ring
// (kernels/collectives/reduce_scatter.cuh).
#include <string>

#include "loom/runtime/error.hpp"
#include "ops/collectives/coll_check.hpp"
#include "ops/collectives/coll_ll.hpp"
#include "ops/collectives/reduce_scatter/algorithms.hpp"

namespace loom::coll {

namespace {

constexpr const char* kOp = "reduce_scatter";

// Pull: every rank reads its chunk from every peer's in. Ranks sharing a GPU: the grid sweeps the chunks together
// (kernels/collectives/coll_common.cuh: thread_share), with two vectors in flight per source and the world size
// compiled in (its pointers only in registers).
void setup_pull(World& world, const Core& core, Launch& l, const BufferView& in, const BufferView& out,
                const CollOptions& opts) {
    const int W = world.world_size();
    check_symmetric(kOp, "pull", "in", world, in);
    l.name = "loom::kernels::coll::reduce_scatter_pull";
    if (core.budget.topo.shared_gpu) {
        l.template_args.push_back(std::to_string(kernels::coll::kDepthGrid));
        l.template_args.push_back(std::to_string(W));
        l.params.flags |= kernels::coll::kFlagGridStride;
    }
    l.blocks =
        pick_blocks(out.bytes() * W, 128 * 1024, grid_stride_block_cap(core.budget, 64, false), opts, core.budget);
}

// Scatter: rounds of C elements per peer, W x C fitting the scratch; C a multiple of 16 bytes.
void setup_scatter(World& world, const Core& core, Launch& l, const CollChoice& c, const BufferView& in,
                   const BufferView& out, const CollOptions& opts) {
    const int W = world.world_size();
    const std::size_t es = dtype_size(in.dtype);
    LOOM_CHECK(out.data != static_cast<char*>(in.data) + world.rank() * out.count * es,
               "{}: the scatter algorithm is not in-place (out == in + rank x out.count): use pull with a "
               "symmetric in",
               kOp);
    const Scratch& scratch = world.state<Scratch>();
    scratch.attach(l.params);
    l.name = "loom::kernels::coll::reduce_scatter_scatter";
    l.template_args.push_back(std::to_string(path_arg(c.path)));
    std::size_t C = scratch.bytes / (W * es);
    C = C / 16 * 16;
    if (C > out.count) C = out.count;
    l.params.round_elems = C;
    if (c.path == DataPath::Tma) l.smem = tma_staging(l.params);
    l.blocks = pick_blocks(C * es * W, 128 * 1024, 64, opts, core.budget);
}

// Ring: rounds of C elements, W - 1 slots of C fitting the scratch; C a multiple of 16 elements. Each block moves its
// share of one chunk per step: W - 1 sequential steps, so fewer bytes per block.
void setup_ring(World& world, const Core& core, Launch& l, const BufferView& in, const BufferView& out,
                const CollOptions& opts) {
    const int W = world.world_size();
    const std::size_t es = dtype_size(in.dtype);
    const Scratch& scratch = world.state<Scratch>();
    scratch.attach(l.params);
    l.name = "loom::kernels::coll::reduce_scatter_ring";
    std::size_t C = scratch.bytes / (static_cast<std::size_t>(W > 1 ? W - 1 : 1) * es);
    C = C / 16 * 16;
    if (C > out.count) C = out.count;
    l.params.round_elems = C;
    l.blocks = pick_blocks(C * es, 64 * 1024, 64, opts, core.budget);
}

}  // namespace

void reduce_scatter_ld_tma(World& world, Core& core, const PlanKey& key, const CollChoice& c, const BufferView& in,
                           const BufferView& out, const CollOptions& opts, cudaStream_t stream) {
    Launch l;
    l.header = "loom/kernels/collectives/reduce_scatter.cuh";
    l.params = core.params();
    l.params.in = in.data;
    l.params.out = out.data;
    l.params.count = out.count;
    l.template_args = {cuda_type(in.dtype), opts.op == ReduceOp::Max ? "1" : "0"};
    if (c.algo == CollAlgo::LL) {
        setup_ll(l, kOp, out.bytes(), opts, core.budget);
        l.params.ll = state<LLArea>(world, stream, kOp).data;
    } else if (c.algo == CollAlgo::Pull) {
        setup_pull(world, core, l, in, out, opts);
    } else if (c.algo == CollAlgo::Scatter) {
        setup_scatter(world, core, l, c, in, out, opts);
    } else if (c.algo == CollAlgo::Ring) {
        setup_ring(world, core, l, in, out, opts);
    } else {
        LOOM_FAIL("{}: the {} algorithm is not offered", kOp, to_string(c.algo));
    }
    core.plans.launch(world, key, l, stream);
}

}  // namespace loom::coll
