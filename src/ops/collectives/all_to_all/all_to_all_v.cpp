// loom::all_to_all_v: validate, choose, launch (kernels/collectives/all_to_all.cuh: all_to_all_v_push / _pull; with
// out or the counts staged through symmetric memory: staged_v.cpp). Not cached as a plan: the counts and offsets are
// part of the call.
#include "loom/runtime/error.hpp"
#include "ops/collectives/all_to_all/algorithms.hpp"
#include "ops/collectives/coll_check.hpp"
#include "runtime/nvtx_range.hpp"

namespace loom {

namespace {

constexpr const char* kOp = "all_to_all_v";

void check_args(World& world, const BufferView& in, const BufferView& out, const int64_t* send_counts) {
    coll::check_buffer(kOp, "in", in);
    coll::check_buffer(kOp, "out", out);
    coll::check_same_dtype(kOp, in, out);
    const int W = world.world_size();
    LOOM_CHECK(send_counts != nullptr, "{}: expected send_counts (device int64[{}]), given nullptr", kOp, W);
    LOOM_CHECK(!coll::overlaps(in.data, in.bytes(), out.data, out.bytes()),
               "{}: in and out overlap (all_to_all_v is not in-place)", kOp);
}

// Pull (out anywhere: each rank reads its blocks from the senders) needs in symmetric; push needs out symmetric
// unless staged. The counts and offsets that peers read are staged where they are not symmetric (staged_v.cpp).
void check_placement(World& world, const CollChoice& c, const BufferView& in, const BufferView& out) {
    if (c.algo == CollAlgo::Pull)
        coll::check_symmetric(kOp, "pull", "in", world, in);
    else if (!c.staged)
        coll::check_symmetric(kOp, "push", "out", world, out);
}

}  // namespace

void all_to_all_v(World& world, BufferView in, BufferView out, const int64_t* send_counts, const int64_t* send_offsets,
                  int64_t* recv_counts, cudaStream_t stream, const CollOptions& opts) {
    const loom::detail::NvtxRange nvtx("loom::all_to_all_v capacity={}", out.bytes());
    check_args(world, in, out, send_counts);
    coll::Core& core = coll::core(world, stream, kOp);
    const int W = world.world_size();
    const CollChoice c =
        coll::resolve(CollKind::AllToAllV, out.bytes() / W, core.budget.topo, opts,
                      world.is_symmetric(in.data, in.bytes()), world.is_symmetric(out.data, out.bytes()));
    const bool pull = c.algo == CollAlgo::Pull, tma = c.path == DataPath::Tma;
    check_placement(world, c, in, out);
    const coll::A2avArgs a =
        coll::stage_a2av_args(world, stream, pull, coll::A2avArgs{send_counts, send_offsets, recv_counts});
    coll::Launch l;
    l.header = "loom/kernels/collectives/all_to_all.cuh";
    l.name = pull ? "loom::kernels::coll::all_to_all_v_pull" : "loom::kernels::coll::all_to_all_v_push";
    static const char* kSized[] = {"", "unsigned char",     "unsigned short", "", "unsigned int", "", "",
                                   "", "unsigned long long"};
    l.template_args = {kSized[dtype_size(in.dtype)], std::to_string(coll::path_arg(c.path))};
    l.params = core.params();
    l.params.in = in.data;
    l.params.out = out.data;
    l.params.count = out.count;  // capacity
    l.params.send_counts = a.send_counts;
    l.params.send_offsets = a.send_offsets;
    l.params.recv_counts = a.recv_counts;
    if (tma) l.smem = coll::tma_staging(l.params);
    // The counts are on the device: size the grid from the capacity (an upper bound of the traffic per peer).
    l.blocks = coll::pick_blocks(out.bytes() / W, tma ? 512 * 1024 : 64 * 1024, tma ? 32 : 64, opts, core.budget);
    if (c.staged)
        coll::all_to_all_v_staged(world, core, l, out, stream);
    else
        coll::launch(world, l, stream);
}

}  // namespace loom
