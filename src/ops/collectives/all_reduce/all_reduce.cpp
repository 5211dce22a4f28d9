// loom::all_reduce: validate, choose, dispatch to one algorithm (algorithms.hpp).
#include "loom/runtime/error.hpp"
#include "ops/collectives/all_reduce/algorithms.hpp"
#include "ops/collectives/coll_check.hpp"
#include "ops/collectives/coll_ll.hpp"
#include "ops/collectives/hier/hier.hpp"
#include "runtime/nvtx_range.hpp"
#include "runtime/pointer_check.hpp"

namespace loom {

namespace {

constexpr const char* kOp = "all_reduce";

void check_args(World& world, const BufferView& in, const BufferView& out) {
    coll::check_buffer(kOp, "in", world, in);
    coll::check_buffer(kOp, "out", world, out);
    coll::check_same_dtype(kOp, in, out);
    coll::check_float_dtype(kOp, in);
    LOOM_CHECK(out.count == in.count, "{}: expected out.count == in.count = {}, given {}", kOp, in.count, out.count);
    LOOM_CHECK(in.data == out.data || !detail::overlaps(in.data, in.bytes(), out.data, out.bytes()),
               "{}: in and out overlap without being the same buffer", kOp);
}

// The choice with all_reduce's own rules: Auto never picks LL past its capacity; two-shot into an out that is not
// symmetric stages each rank's reduced shard in its scratch (one kernel, no copy afterwards), which the copy-engine
// all_gather half cannot: Auto's copy-engine path then falls back to ld/st, and one asked for by name is an error.
CollChoice choose(const coll::Core& core, const BufferView& out, std::size_t bytes, const CollOptions& opts,
                  bool in_sym, bool out_sym) {
    const CollTopology& topo = core.budget.topo;
    CollOptions o = opts;
    if (o.algo == CollAlgo::Auto) {
        const CollChoice a = coll::resolve(CollKind::AllReduce, bytes, topo, o, in_sym, out_sym);
        o.algo = a.algo == CollAlgo::LL && bytes > coll::ll_capacity_bytes() ? CollAlgo::OneShot : a.algo;
        if (o.path == DataPath::Auto) o.path = a.path;
    }
    CollChoice c = coll::resolve(CollKind::AllReduce, bytes, topo, o, in_sym, out_sym);
    if (c.algo == CollAlgo::TwoShot && !out_sym && c.path == DataPath::CopyEngine) {
        LOOM_CHECK(opts.path != DataPath::CopyEngine,
                   "{}: two_shot through the copy engine needs out in the symmetric heap: allocate it with world.alloc "
                   "(out {} is not), or leave the data path to Loom",
                   kOp, out.data);
        c.path = DataPath::LdSt;
    }
    return c;
}

}  // namespace

void all_reduce(World& world, BufferView in, BufferView out, cudaStream_t stream, const CollOptions& opts) {
    const loom::detail::NvtxRange nvtx("loom::all_reduce bytes={}", in.bytes());
    const detail::AgreedCall agreed(
        world, [&] { return coll::signature(world, CollKind::AllReduce, in, out, opts); },
        [&] { check_args(world, in, out); });
    if (world.num_nodes() > 1) {  // hierarchical: node step(s) by load/store, node-to-node through NVSHMEM
        if (!agreed.checked()) check_args(world, in, out);
        coll::hier::all_reduce(world, in, out, opts, stream);
        return;
    }
    coll::Core& core = coll::core(world, stream, kOp);
    const coll::PlanKey key = coll::plan_key(CollKind::AllReduce, in, out, opts);
    if (core.plans.replay(key, stream)) return;  // this exact call was validated and resolved before
    if (!agreed.checked()) check_args(world, in, out);
    const std::size_t bytes = in.bytes();
    const bool in_sym = world.is_symmetric(in.data, bytes), out_sym = world.is_symmetric(out.data, bytes);
    CollChoice c = choose(core, out, bytes, opts, in_sym, out_sym);
    if (c.staged) {
        coll::all_reduce_staged(world, core, c, in, out, out_sym, opts, stream);
        return;
    }
    if (c.algo == CollAlgo::TwoShot && c.path == DataPath::CopyEngine) {
        if (coll::all_reduce_two_shot_ce(world, in, out, opts, stream)) return;
        c.path = DataPath::LdSt;
    }
    coll::all_reduce_ld_tma(world, core, key, c, in, out, out_sym, opts, stream);
}

}  // namespace loom
