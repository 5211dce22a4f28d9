// loom::all_to_all: validate, choose, dispatch to one algorithm (algorithms.hpp; the LL kernels: coll_ll.hpp).
#include "loom/runtime/error.hpp"
#include "ops/collectives/all_to_all/algorithms.hpp"
#include "ops/collectives/coll_check.hpp"
#include "ops/collectives/coll_ll.hpp"
#include "ops/collectives/hier/hier.hpp"
#include "runtime/nvtx_range.hpp"
#include "runtime/pointer_check.hpp"

namespace loom {

namespace {

void check_args(World& world, const BufferView& in, const BufferView& out) {
    const char* op = "all_to_all";
    coll::check_buffer(op, "in", world, in);
    coll::check_buffer(op, "out", world, out);
    coll::check_same_dtype(op, in, out);
    const int W = world.world_size();
    LOOM_CHECK(in.count % static_cast<std::size_t>(W) == 0,
               "{}: expected in.count divisible by the world size {}, given {}", op, W, in.count);
    LOOM_CHECK(out.count == in.count, "{}: expected out.count == in.count = {}, given {}", op, in.count, out.count);
    LOOM_CHECK(!detail::overlaps(in.data, in.bytes(), out.data, out.bytes()),
               "{}: in and out overlap (all_to_all is not in-place)", op);
}

}  // namespace

void all_to_all(World& world, BufferView in, BufferView out, cudaStream_t stream, const CollOptions& opts) {
    const loom::detail::NvtxRange nvtx("loom::all_to_all bytes={}", in.bytes());
    const char* op = "all_to_all";
    const detail::AgreedCall agreed(
        world, [&] { return coll::signature(world, CollKind::AllToAll, in, out, opts); },
        [&] { check_args(world, in, out); });
    if (world.num_nodes() > 1) {  // hierarchical: node step(s) by load/store, node-to-node through NVSHMEM
        if (!agreed.checked()) check_args(world, in, out);
        coll::hier::all_to_all(world, in, out, opts, stream);
        return;
    }
    coll::Core& core = coll::core(world, stream, op);
    const coll::PlanKey key = coll::plan_key(CollKind::AllToAll, in, out, opts);
    if (core.plans.replay(key, stream)) return;  // this exact call was validated and resolved before
    if (!agreed.checked()) check_args(world, in, out);
    const std::size_t B = in.bytes() / world.world_size();  // per peer
    const bool in_sym = world.is_symmetric(in.data, in.bytes()), out_sym = world.is_symmetric(out.data, out.bytes());
    const CollChoice c = coll::resolve(CollKind::AllToAll, B, core.budget.topo, opts, in_sym, out_sym);
    if (c.algo == CollAlgo::LL) {
        coll::launch_ll_bytes(world, core, key, op, in.data, out.data, B, opts, stream);
        return;
    }
    if (c.staged) {
        coll::all_to_all_staged(world, core, c, in, out, opts, stream);
        return;
    }
    const bool pull = c.algo == CollAlgo::Pull;  // out anywhere: read the blocks from the peers' in
    if (pull) {
        coll::check_symmetric(op, "pull", "in", world, in);
    } else {
        coll::check_symmetric(op, "push", "out", world, out);
    }
    if (c.path == DataPath::CopyEngine) {
        coll::all_to_all_ce(world, core, pull, in, out, stream);
    } else {
        coll::all_to_all_ld_tma(world, core, key, c, in, out, opts, stream);
    }
}

}  // namespace loom
