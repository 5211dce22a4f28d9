// Host launcher of include/loom/kernels/collectives/all_to_all.cuh: validate, choose, launch.
#include <vector>

#include "loom/runtime/error.hpp"
#include "ops/collectives/coll_state.hpp"

namespace loom {

void all_to_all(World& world, BufferView in, BufferView out, cudaStream_t stream, const CollOptions& opts) {
    const char* op = "all_to_all";
    coll::CollState& st = coll::coll_state(world);
    const coll::PlanKey key = coll::plan_key(CollKind::AllToAll, in, out, opts);
    if (coll::launch_cached(st, key, stream)) return;  // this exact call was validated and resolved before
    coll::check_buffer(op, "in", in);
    coll::check_buffer(op, "out", out);
    coll::check_same_dtype(op, in, out);
    const int W = world.world_size(), me = world.rank();
    LOOM_CHECK(in.count % static_cast<std::size_t>(W) == 0,
               "{}: expected in.count divisible by the world size {}, given {}", op, W, in.count);
    LOOM_CHECK(out.count == in.count, "{}: expected out.count == in.count = {}, given {}", op, in.count, out.count);
    LOOM_CHECK(!coll::overlaps(in.data, in.bytes(), out.data, out.bytes()),
               "{}: in and out overlap (all_to_all is not in-place)", op);
    const std::size_t B = in.bytes() / W;  // per peer
    const bool out_sym = world.is_symmetric(out.data, out.bytes());
    const CollChoice c =
        coll::resolve(CollKind::AllToAll, B, world, st, opts, world.is_symmetric(in.data, in.bytes()), out_sym);
    if (c.algo == CollAlgo::LL) {
        coll::launch_ll_bytes(world, st, key, op, in.data, out.data, B, opts, stream);
        return;
    }
    const bool pull = c.algo == CollAlgo::Pull;  // out anywhere: read the blocks from the peers' in
    if (pull)
        coll::check_symmetric(op, "pull", "in", world, in);
    else
        coll::check_symmetric(op, "push", "out", world, out);
    if (c.path == DataPath::CopyEngine) {
        // Entry barrier (peers' in written / out free), the W copies on side streams, exit barrier (every copy
        // landed / every peer read my in): all ordered on `stream`.
        coll::launch_barrier(world, st, stream);
        std::vector<coll::CopyJob> jobs;
        for (int i = 0; i < W; ++i) {
            const int peer = (me + i) % W;
            if (pull)
                jobs.push_back({static_cast<char*>(out.data) + peer * B,
                                world.peer_ptr(static_cast<const char*>(in.data) + me * B, peer), B});
            else
                jobs.push_back({world.peer_ptr(static_cast<char*>(out.data) + me * B, peer),
                                static_cast<const char*>(in.data) + peer * B, B});
        }
        coll::copy_engine_fanout(st, stream, jobs);
        coll::launch_barrier(world, st, stream);
        return;
    }
    coll::Launch l;
    l.header = "loom/kernels/collectives/all_to_all.cuh";
    l.name = pull ? "loom::kernels::coll::all_to_all_pull" : "loom::kernels::coll::all_to_all_push";
    l.template_args = {"unsigned char", std::to_string(coll::path_arg(c.path))};
    l.params = coll::base_params(st);
    l.params.in = in.data;
    l.params.out = out.data;
    l.params.count = B;
    if (c.path == DataPath::Tma) l.smem = coll::tma_staging(l.params);
    l.blocks = coll::pick_blocks(B, c.path == DataPath::Tma ? 512 * 1024 : 64 * 1024, c.path == DataPath::Tma ? 32 : 64,
                                 opts, st);
    coll::launch(world, st, key, l, stream);
}

void all_to_all_v(World& world, BufferView in, BufferView out, const int64_t* send_counts, const int64_t* send_offsets,
                  int64_t* recv_counts, cudaStream_t stream, const CollOptions& opts) {
    const char* op = "all_to_all_v";
    coll::check_buffer(op, "in", in);
    coll::check_buffer(op, "out", out);
    coll::check_same_dtype(op, in, out);
    const int W = world.world_size();
    LOOM_CHECK(send_counts != nullptr, "{}: expected send_counts (device int64[{}]), given nullptr", op, W);
    LOOM_CHECK(world.is_symmetric(send_counts, sizeof(int64_t) * W),
               "{}: send_counts ({}, {} bytes) is not in the symmetric heap; peers read it: allocate it with "
               "world.alloc<int64_t>({})",
               op, static_cast<const void*>(send_counts), sizeof(int64_t) * W, W);
    LOOM_CHECK(!coll::overlaps(in.data, in.bytes(), out.data, out.bytes()),
               "{}: in and out overlap (all_to_all_v is not in-place)", op);
    coll::CollState& st = coll::coll_state(world);
    const CollChoice c =
        coll::resolve(CollKind::AllToAllV, out.bytes() / W, world, st, opts, world.is_symmetric(in.data, in.bytes()),
                      world.is_symmetric(out.data, out.bytes()));
    const bool pull = c.algo == CollAlgo::Pull;  // out anywhere: each rank reads its blocks from the senders
    if (pull) {
        coll::check_symmetric(op, "pull", "in", world, in);
        LOOM_CHECK(
            send_offsets == nullptr || world.is_symmetric(send_offsets, sizeof(int64_t) * W),
            "{}: the pull algorithm (Auto's choice for an out outside the symmetric heap) reads each sender's "
            "send_offsets: pass nullptr (packed blocks) or allocate them with world.alloc<int64_t>({}), given {}",
            op, W, static_cast<const void*>(send_offsets));
    } else {
        coll::check_symmetric(op, "push", "out", world, out);
    }
    coll::Launch l;
    l.header = "loom/kernels/collectives/all_to_all.cuh";
    l.name = pull ? "loom::kernels::coll::all_to_all_v_pull" : "loom::kernels::coll::all_to_all_v_push";
    static const char* kSized[] = {"", "unsigned char",     "unsigned short", "", "unsigned int", "", "",
                                   "", "unsigned long long"};
    l.template_args = {kSized[dtype_size(in.dtype)], std::to_string(coll::path_arg(c.path))};
    l.params = coll::base_params(st);
    l.params.in = in.data;
    l.params.out = out.data;
    l.params.count = out.count;  // capacity
    l.params.send_counts = send_counts;
    l.params.send_offsets = send_offsets;
    l.params.recv_counts = recv_counts;
    if (c.path == DataPath::Tma) l.smem = coll::tma_staging(l.params);
    // The counts are on the device: size the grid from the capacity (an upper bound of the traffic per peer).
    l.blocks = coll::pick_blocks(out.bytes() / W, c.path == DataPath::Tma ? 512 * 1024 : 64 * 1024,
                                 c.path == DataPath::Tma ? 32 : 64, opts, st);
    coll::launch(world, l, stream);
}

}  // namespace loom
