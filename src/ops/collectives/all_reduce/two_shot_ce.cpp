// all_reduce, two-shot with a copy-engine second half: reduce_scatter (pull, ld/st) of every rank's shard into this
// rank's shard of out, then an in-place all_gather of the shards through the copy engine (push). Shards must split
// evenly and keep 16-byte alignment.
#include "ops/collectives/all_reduce/algorithms.hpp"
#include "ops/collectives/coll_check.hpp"

namespace loom::coll {

bool all_reduce_two_shot_ce(World& world, const BufferView& in, const BufferView& out, const CollOptions& opts,
                            cudaStream_t stream) {
    check_symmetric("all_reduce", "two_shot", "in", world, in);
    check_symmetric("all_reduce", "two_shot", "out", world, out);
    const int W = world.world_size();
    const std::size_t es = dtype_size(in.dtype), S = in.count / W;
    if (in.count % W != 0 || (S * es) % 16 != 0) return false;
    const BufferView shard{static_cast<char*>(out.data) + world.rank() * S * es, in.dtype, S};
    reduce_scatter(world, in, shard, stream, CollOptions{CollAlgo::Pull, DataPath::LdSt, opts.op, opts.num_sms});
    all_gather(world, shard, out, stream, CollOptions{CollAlgo::Push, DataPath::CopyEngine});
    return true;
}

}  // namespace loom::coll
