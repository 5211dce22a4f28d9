// loom::all_gather: validate, choose, dispatch to one algorithm (algorithms.hpp; the LL kernels: coll_ll.hpp).
#include "loom/runtime/error.hpp"
#include "ops/collectives/all_gather/algorithms.hpp"
#include "ops/collectives/coll_check.hpp"
#include "ops/collectives/coll_ll.hpp"
#include "ops/collectives/hier/hier.hpp"
#include "runtime/nvtx_range.hpp"
#include "runtime/pointer_check.hpp"

namespace loom {

namespace {

void check_args(World& world, const BufferView& in, const BufferView& out) {
    const char* op = "all_gather";
    coll::check_buffer(op, "in", world, in);
    coll::check_buffer(op, "out", world, out);
    coll::check_same_dtype(op, in, out);
    const int W = world.world_size();
    LOOM_CHECK(out.count == coll::times_world(op, "world size x in.count", in.count, W),
               "{}: expected out.count == world size x in.count = {} x {} = {}, given {}", op, W, in.count,
               in.count * W, out.count);
    const std::size_t B = in.bytes();
    char* const mine = static_cast<char*>(out.data) + world.rank() * B;
    LOOM_CHECK(in.data == mine || !detail::overlaps(in.data, B, out.data, out.bytes()),
               "{}: in overlaps out but is not out's chunk of this rank (in-place needs in == out + rank x in.count)",
               op);
}

}  // namespace

void all_gather(World& world, BufferView in, BufferView out, cudaStream_t stream, const CollOptions& opts) {
    const loom::detail::NvtxRange nvtx("loom::all_gather bytes={}", in.bytes());
    const char* op = "all_gather";
    const detail::AgreedCall agreed(
        world, [&] { return coll::signature(world, CollKind::AllGather, in, out, opts); },
        [&] { check_args(world, in, out); });
    if (world.num_nodes() > 1) {  // hierarchical: node step(s) by load/store, node-to-node through NVSHMEM
        if (!agreed.checked()) check_args(world, in, out);
        coll::hier::all_gather(world, in, out, opts, stream);
        return;
    }
    coll::Core& core = coll::core(world, stream, op);
    const coll::PlanKey key = coll::plan_key(CollKind::AllGather, in, out, opts);
    if (core.plans.replay(key, stream)) return;  // this exact call was validated and resolved before
    if (!agreed.checked()) check_args(world, in, out);
    const std::size_t B = in.bytes();
    const bool in_sym = world.is_symmetric(in.data, B), out_sym = world.is_symmetric(out.data, out.bytes());
    const CollChoice c = coll::resolve(CollKind::AllGather, B, core.budget.topo, opts, in_sym, out_sym);
    if (c.algo == CollAlgo::LL) {
        coll::launch_ll_bytes(world, core, key, op, in.data, out.data, B, opts, stream);
        return;
    }
    if (c.staged) {
        coll::all_gather_staged(world, core, c, in, out, opts, stream);
        return;
    }
    if (c.algo == CollAlgo::Pull) {
        coll::check_symmetric(op, "pull", "in", world, in);
    } else {
        coll::check_symmetric(op, to_string(c.algo), "out", world, out);
    }
    if (c.path != DataPath::CopyEngine) {
        coll::all_gather_ld_tma(world, core, key, c, in, out, opts, stream);
    } else if (c.algo == CollAlgo::Push) {
        coll::all_gather_push_ce(world, core, in, out, opts, stream);
    } else {
        coll::all_gather_pull_ce(world, core, in, out, stream);
    }
}

}  // namespace loom
