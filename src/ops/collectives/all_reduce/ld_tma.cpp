// all_reduce in one kernel: LL (kernels/collectives/coll_ll.cuh), one-shot, two-shot
// (kernels/collectives/all_reduce.cuh).
#include <algorithm>
#include <string>

#include "loom/runtime/error.hpp"
#include "ops/collectives/all_reduce/algorithms.hpp"
#include "ops/collectives/coll_check.hpp"
#include "ops/collectives/coll_ll.hpp"

namespace loom::coll {

namespace {

constexpr const char* kOp = "all_reduce";

// One-shot: every rank pushes its whole input into slot `me` of every peer's scratch and reduces its own, in rounds
// of C elements per peer (W x C fitting the scratch; C a multiple of 16 elements).
void setup_one_shot(World& world, const Core& core, Launch& l, const CollChoice& c, const BufferView& in,
                    const CollOptions& opts) {
    const int W = world.world_size();
    const std::size_t es = dtype_size(in.dtype);
    const Scratch& scratch = world.state<Scratch>();
    scratch.attach(l.params);
    l.name = "loom::kernels::coll::all_reduce_one_shot";
    l.template_args.push_back(std::to_string(path_arg(c.path)));
    if (c.path == DataPath::Tma) l.smem = tma_staging(l.params);
    std::size_t C = scratch.bytes / (W * es);
    C = C / 16 * 16;
    if (C > in.count) C = in.count;
    l.params.round_elems = C;
    l.blocks = pick_blocks(C * es * W, 64 * 1024, 64, opts, core.budget);
}

// Two-shot: each rank reduces its shard from every peer's in and writes it to every peer's out; into an out that is
// not symmetric, each rank's reduced shard is staged in its scratch (kernels/collectives/all_reduce.cuh; rounds when a
// shard outgrows it).
void setup_two_shot(World& world, const Core& core, Launch& l, const BufferView& in, bool out_symmetric,
                    const CollOptions& opts) {
    const int W = world.world_size();
    const std::size_t es = dtype_size(in.dtype);
    check_symmetric(kOp, "two_shot", "in", world, in);
    l.name = "loom::kernels::coll::all_reduce_two_shot";
    if (!out_symmetric) {
        const Scratch& scratch = world.state<Scratch>();
        scratch.attach(l.params);
        l.params.flags |= kernels::coll::kFlagStagedOut;
        const std::size_t shard = ((in.count + W - 1) / W + 15) / 16 * 16;  // >= the kernel's S
        l.params.round_elems = std::min(shard, scratch.bytes / es / 16 * 16);
    }
    l.blocks = pick_blocks(in.bytes() * 2, 128 * 1024, 64, opts, core.budget);
}

}  // namespace

void all_reduce_ld_tma(World& world, Core& core, const PlanKey& key, const CollChoice& c, const BufferView& in,
                       const BufferView& out, bool out_symmetric, const CollOptions& opts, cudaStream_t stream) {
    Launch l;
    l.header = "loom/kernels/collectives/all_reduce.cuh";
    l.params = core.params();
    l.params.in = in.data;
    l.params.out = out.data;
    l.params.count = in.count;
    l.template_args = {cuda_type(in.dtype), opts.op == ReduceOp::Max ? "1" : "0"};
    if (c.algo == CollAlgo::LL) {
        setup_ll(l, kOp, in.bytes(), opts, core.budget);
        l.params.ll = state<LLArea>(world, stream, kOp).data;
    } else if (c.algo == CollAlgo::OneShot) {
        setup_one_shot(world, core, l, c, in, opts);
    } else if (c.algo == CollAlgo::TwoShot) {
        setup_two_shot(world, core, l, in, out_symmetric, opts);
    } else {
        LOOM_FAIL("{}: the {} algorithm is not offered", kOp, to_string(c.algo));
    }
    core.plans.launch(world, key, l, stream);
}

}  // namespace loom::coll
