// Host launcher of include/loom/kernels/all_gather.cuh: validate, choose, launch.
#include <vector>

#include "loom/runtime/error.hpp"
#include "ops/coll_state.hpp"

namespace loom {

void all_gather(World& world, BufferView in, BufferView out, cudaStream_t stream, const CollOptions& opts) {
    const char* op = "all_gather";
    coll::CollState& st = coll::coll_state(world);
    const coll::PlanKey key = coll::plan_key(CollKind::AllGather, in, out, opts);
    if (coll::launch_cached(st, key, stream)) return;  // this exact call was validated and resolved before
    coll::check_buffer(op, "in", in);
    coll::check_buffer(op, "out", out);
    coll::check_same_dtype(op, in, out);
    const int W = world.world_size(), me = world.rank();
    LOOM_CHECK(out.count == in.count * static_cast<std::size_t>(W),
               "{}: expected out.count == world size x in.count = {} x {} = {}, given {}", op, W, in.count,
               in.count * W, out.count);
    const std::size_t B = in.bytes();
    char* const mine = static_cast<char*>(out.data) + me * B;
    LOOM_CHECK(in.data == mine || !coll::overlaps(in.data, B, out.data, out.bytes()),
               "{}: in overlaps out but is not out's chunk of this rank (in-place needs in == out + rank x in.count)",
               op);
    const bool in_sym = world.is_symmetric(in.data, B), out_sym = world.is_symmetric(out.data, out.bytes());
    const CollChoice c = coll::resolve(CollKind::AllGather, B, world, st, opts, in_sym, out_sym);
    if (c.algo == CollAlgo::LL) {
        coll::launch_ll_bytes(world, st, key, op, in.data, out.data, B, opts, stream);
        return;
    }
    if (c.algo == CollAlgo::Pull) {
        coll::check_symmetric(op, "pull", "in", world, in);
    } else {
        coll::check_symmetric(op, to_string(c.algo), "out", world, out);
    }

    if (c.path == DataPath::CopyEngine) {
        // Entry barrier, the W-1 peer copies and the own chunk's copy at once (side streams), exit barrier: all
        // ordered on `stream`.
        coll::launch_barrier(world, st, stream);
        std::vector<coll::CopyJob> jobs;
        for (int i = 0; i < W; ++i) {
            const int peer = (me + i) % W;
            if (peer == me && in.data == mine) continue;
            if (c.algo == CollAlgo::Push) {
                jobs.push_back({world.peer_ptr(mine, peer), in.data, B});
            } else {
                char* dst = static_cast<char*>(out.data) + peer * B;
                // In place, the peer's input is slot `peer` of its out (my in is slot `me`: not a symmetric offset).
                const void* src = world.peer_ptr(in.data == mine ? static_cast<const void*>(dst) : in.data, peer);
                jobs.push_back({dst, src, B});
            }
        }
        coll::copy_engine_fanout(st, stream, jobs);
        coll::launch_barrier(world, st, stream);
        return;
    }
    coll::Launch l;
    l.header = "loom/kernels/all_gather.cuh";
    l.name = c.algo == CollAlgo::Push   ? "loom::kernels::coll::all_gather_push"
             : c.algo == CollAlgo::Pull ? "loom::kernels::coll::all_gather_pull"
                                        : "loom::kernels::coll::all_gather_ring";
    LOOM_CHECK(c.algo == CollAlgo::Push || c.algo == CollAlgo::Pull || c.algo == CollAlgo::Ring,
               "{}: unknown algorithm {}", op, to_string(c.algo));
    l.template_args = {"unsigned char", std::to_string(coll::path_arg(c.path))};
    l.params = coll::base_params(st);
    l.params.in = in.data;
    l.params.out = out.data;
    l.params.count = B;  // moved as bytes
    if (c.path == DataPath::Tma) l.smem = coll::tma_staging(l.params);
    // ~64 KiB per block per peer keeps enough bytes in flight; TMA needs fewer blocks (one thread drives each).
    l.blocks = coll::pick_blocks(B, c.path == DataPath::Tma ? 512 * 1024 : 64 * 1024, c.path == DataPath::Tma ? 32 : 64,
                                 opts, st);
    coll::launch(world, st, key, l, stream);
}

}  // namespace loom
