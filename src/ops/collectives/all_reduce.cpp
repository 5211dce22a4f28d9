// Host launcher of include/loom/kernels/collectives/all_reduce.cuh: validate, choose, launch.
#include <algorithm>

#include "loom/runtime/error.hpp"
#include "ops/collectives/coll_state.hpp"

namespace loom {

void all_reduce(World& world, BufferView in, BufferView out, cudaStream_t stream, const CollOptions& opts) {
    const char* op = "all_reduce";
    coll::CollState& st = coll::coll_state(world);
    const coll::PlanKey key = coll::plan_key(CollKind::AllReduce, in, out, opts);
    if (coll::launch_cached(st, key, stream)) return;  // this exact call was validated and resolved before
    coll::check_buffer(op, "in", in);
    coll::check_buffer(op, "out", out);
    coll::check_same_dtype(op, in, out);
    coll::check_float_dtype(op, in);
    LOOM_CHECK(out.count == in.count, "{}: expected out.count == in.count = {}, given {}", op, in.count, out.count);
    LOOM_CHECK(in.data == out.data || !coll::overlaps(in.data, in.bytes(), out.data, out.bytes()),
               "{}: in and out overlap without being the same buffer", op);
    const int W = world.world_size();
    const std::size_t es = dtype_size(in.dtype), bytes = in.bytes();
    const bool in_sym = world.is_symmetric(in.data, bytes), out_sym = world.is_symmetric(out.data, bytes);
    CollOptions o = opts;
    const std::size_t ll_max = coll::ll_capacity_bytes();
    // Auto never picks LL past its capacity.
    if (o.algo == CollAlgo::Auto) {
        const CollChoice a = coll::resolve(CollKind::AllReduce, bytes, world, st, o, in_sym, out_sym);
        o.algo = a.algo == CollAlgo::LL && bytes > ll_max ? CollAlgo::OneShot : a.algo;
        if (o.path == DataPath::Auto) o.path = a.path;
    }
    CollChoice c = coll::resolve(CollKind::AllReduce, bytes, world, st, o, in_sym, out_sym);
    // Two-shot into an out that is not symmetric stages each rank's reduced shard in its scratch (kernels/
    // all_reduce.cuh; rounds when a shard outgrows it): one kernel, no copy afterwards.
    const bool staged = c.algo == CollAlgo::TwoShot && !out_sym;
    if (staged && c.path == DataPath::CopyEngine) {  // the copy-engine all_gather half needs out symmetric
        LOOM_CHECK(opts.path != DataPath::CopyEngine,
                   "{}: two_shot through the copy engine needs out in the symmetric heap: allocate it with world.alloc "
                   "(out {} is not), or leave the data path to Loom",
                   op, out.data);
        c.path = DataPath::LdSt;
    }
    if (c.algo == CollAlgo::TwoShot && c.path == DataPath::CopyEngine) {
        // Two-shot with a copy-engine second half: reduce_scatter (pull, ld/st) of every rank's shard into this
        // rank's shard of out, then an in-place all_gather of the shards through the copy engine. Shards must
        // split evenly and keep 16-byte alignment; otherwise the one-kernel two-shot (same buffer needs).
        coll::check_symmetric(op, "two_shot", "in", world, in);
        coll::check_symmetric(op, "two_shot", "out", world, out);
        const std::size_t S = in.count / W;
        if (in.count % W == 0 && (S * es) % 16 == 0) {
            const int me = world.rank();
            const BufferView shard{static_cast<char*>(out.data) + me * S * es, in.dtype, S};
            reduce_scatter(world, in, shard, stream,
                           CollOptions{CollAlgo::Pull, DataPath::LdSt, opts.op, opts.num_sms});
            all_gather(world, shard, out, stream, CollOptions{CollAlgo::Push, DataPath::CopyEngine});
            return;
        }
        c.path = DataPath::LdSt;
    }
    coll::Launch l;
    l.header = "loom/kernels/collectives/all_reduce.cuh";
    l.params = coll::base_params(st);
    l.params.in = in.data;
    l.params.out = out.data;
    l.params.count = in.count;
    const std::string T = coll::cuda_type(in.dtype), kop = opts.op == ReduceOp::Max ? "1" : "0";
    l.template_args = {T, kop};
    if (c.algo == CollAlgo::LL) {
        coll::setup_ll(l, op, bytes, opts, st);
    } else if (c.algo == CollAlgo::OneShot) {
        l.name = "loom::kernels::coll::all_reduce_one_shot";
        l.template_args.push_back(std::to_string(coll::path_arg(c.path)));
        if (c.path == DataPath::Tma) l.smem = coll::tma_staging(l.params);
        std::size_t C = st.scratch_bytes / (W * es);
        C = C / 16 * 16;
        if (C > in.count) C = in.count;
        l.params.round_elems = C;
        l.blocks = coll::pick_blocks(C * es * W, 64 * 1024, 64, opts, st);
    } else if (c.algo == CollAlgo::TwoShot) {
        coll::check_symmetric(op, "two_shot", "in", world, in);
        l.name = "loom::kernels::coll::all_reduce_two_shot";
        if (!out_sym) {
            l.params.flags |= kernels::coll::kFlagStagedOut;
            const std::size_t shard = ((in.count + W - 1) / W + 15) / 16 * 16;  // >= the kernel's S
            l.params.round_elems = std::min(shard, st.scratch_bytes / es / 16 * 16);
        }
        l.blocks = coll::pick_blocks(bytes * 2, 128 * 1024, 64, opts, st);
    } else {
        LOOM_FAIL("{}: the {} algorithm is not offered", op, to_string(c.algo));
    }
    coll::launch(world, st, key, l, stream);
}

}  // namespace loom
