// loom::reduce_scatter: validate, choose, dispatch to one algorithm (algorithms.hpp).
#include "loom/runtime/error.hpp"
#include "ops/collectives/coll_check.hpp"
#include "ops/collectives/hier/hier.hpp"
#include "ops/collectives/reduce_scatter/algorithms.hpp"
#include "runtime/nvtx_range.hpp"
#include "runtime/pointer_check.hpp"

namespace loom {

namespace {

void check_args(World& world, const BufferView& in, const BufferView& out) {
    const char* op = "reduce_scatter";
    coll::check_buffer(op, "in", world, in);
    coll::check_buffer(op, "out", world, out);
    coll::check_same_dtype(op, in, out);
    coll::check_float_dtype(op, in);
    const int W = world.world_size();
    LOOM_CHECK(in.count % static_cast<std::size_t>(W) == 0,
               "{}: expected in.count divisible by the world size {}, given {}", op, W, in.count);
    LOOM_CHECK(out.count == in.count / W, "{}: expected out.count == in.count / world size = {} / {} = {}, given {}",
               op, in.count, W, in.count / W, out.count);
    char* const my_chunk = static_cast<char*>(in.data) + world.rank() * out.count * dtype_size(in.dtype);
    LOOM_CHECK(out.data == my_chunk || !detail::overlaps(in.data, in.bytes(), out.data, out.bytes()),
               "{}: out overlaps in but is not in's chunk of this rank (in-place needs out == in + rank x out.count)",
               op);
}

}  // namespace

void reduce_scatter(World& world, BufferView in, BufferView out, cudaStream_t stream, const CollOptions& opts) {
    const loom::detail::NvtxRange nvtx("loom::reduce_scatter bytes={}", in.bytes());
    const char* op = "reduce_scatter";
    const detail::AgreedCall agreed(
        world, [&] { return coll::signature(world, CollKind::ReduceScatter, in, out, opts); },
        [&] { check_args(world, in, out); });
    if (world.num_nodes() > 1) {  // hierarchical: node step(s) by load/store, node-to-node through NVSHMEM
        if (!agreed.checked()) check_args(world, in, out);
        coll::hier::reduce_scatter(world, in, out, opts, stream);
        return;
    }
    coll::Core& core = coll::core(world, stream, op);
    const coll::PlanKey key = coll::plan_key(CollKind::ReduceScatter, in, out, opts);
    if (core.plans.replay(key, stream)) return;  // this exact call was validated and resolved before
    if (!agreed.checked()) check_args(world, in, out);
    const bool in_sym = world.is_symmetric(in.data, in.bytes()), out_sym = world.is_symmetric(out.data, out.bytes());
    CollChoice c = coll::resolve(CollKind::ReduceScatter, out.bytes(), core.budget.topo, opts, in_sym, out_sym);
    const bool in_place = out.data == static_cast<char*>(in.data) + world.rank() * out.bytes();
    if (in_place && opts.algo == CollAlgo::Auto && c.algo == CollAlgo::Scatter && c.path != DataPath::CopyEngine &&
        (opts.path == DataPath::Auto || opts.path == DataPath::LdSt)) {
        // The scatter algorithm's kernels are not in-place (its copy-engine form is); the pull is, on ld/st (staged
        // through the scratch where in is not symmetric). A tma path asked for keeps the scatter, which says so.
        CollOptions pull = opts;
        pull.algo = CollAlgo::Pull;
        c = coll::resolve(CollKind::ReduceScatter, out.bytes(), core.budget.topo, pull, in_sym, out_sym);
    }
    if (c.staged) {
        coll::reduce_scatter_staged(world, core, c, in, out, opts, stream);
    } else if (c.algo == CollAlgo::Scatter && c.path == DataPath::CopyEngine) {
        coll::reduce_scatter_scatter_ce(world, core, in, out, opts, stream);
    } else {
        coll::reduce_scatter_ld_tma(world, core, key, c, in, out, opts, stream);
    }
}

}  // namespace loom
