// loom::all_to_all_v: validate, choose, launch (kernels/collectives/all_to_all.cuh: all_to_all_v_push / _pull; with
// out or the counts staged through symmetric memory: staged_v.cpp; in a World of several nodes the hierarchical form,
// hier/hier.cpp). Not cached as a plan: the counts and offsets are part of the call.
#include <cstring>
#include <vector>

#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "ops/collectives/all_to_all/algorithms.hpp"
#include "ops/collectives/coll_check.hpp"
#include "ops/collectives/coll_state.hpp"
#include "ops/collectives/hier/hier.hpp"
#include "runtime/nvtx_range.hpp"
#include "runtime/pointer_check.hpp"

namespace loom {

namespace {

constexpr const char* kOp = "all_to_all_v";

// An int64[world] argument: aligned, and memory this rank's GPU may use.
void check_counts_array(World& world, const char* which, const int64_t* p) {
    const std::size_t bytes = sizeof(int64_t) * static_cast<std::size_t>(world.world_size());
    LOOM_CHECK(reinterpret_cast<std::uintptr_t>(p) % alignof(int64_t) == 0,
               "{}: expected {} (int64[{}]) aligned to 8 bytes, given address {}", kOp, which, world.world_size(),
               static_cast<const void*>(p));
    detail::check_memory(&world, world.device(), kOp, which, p, bytes);
}

void check_args(World& world, const BufferView& in, const BufferView& out, const int64_t* send_counts,
                const int64_t* send_offsets, const int64_t* recv_counts) {
    coll::check_buffer(kOp, "in", world, in);
    coll::check_buffer(kOp, "out", world, out);
    coll::check_same_dtype(kOp, in, out);
    const int W = world.world_size();
    LOOM_CHECK(send_counts != nullptr, "{}: expected send_counts (device int64[{}]), given nullptr", kOp, W);
    check_counts_array(world, "send_counts", send_counts);
    if (send_offsets) check_counts_array(world, "send_offsets", send_offsets);
    if (recv_counts) check_counts_array(world, "recv_counts", recv_counts);
    LOOM_CHECK(!detail::overlaps(in.data, in.bytes(), out.data, out.bytes()),
               "{}: in and out overlap (all_to_all_v is not in-place)", kOp);
    // recv_counts is written while this rank's blocks and its peers still read send_counts / send_offsets (and in).
    if (recv_counts) {
        const std::size_t bytes = static_cast<std::size_t>(W) * sizeof(int64_t);
        detail::check_disjoint(kOp, "recv_counts", recv_counts, bytes, "send_counts", send_counts, bytes);
        if (send_offsets)
            detail::check_disjoint(kOp, "recv_counts", recv_counts, bytes, "send_offsets", send_offsets, bytes);
        detail::check_disjoint(kOp, "recv_counts", recv_counts, bytes, "in", in.data, in.bytes());
        detail::check_disjoint(kOp, "recv_counts", recv_counts, bytes, "out", out.data, out.bytes());
    }
}

// Checking mode, outside a graph capture: the counts and offsets the kernel will read, copied to the host (a stream
// synchronisation) and exchanged, so that a block past a sender's in or past a receiver's out raises the same
// loom::Error on every rank before the launch instead of trapping in it.
void check_counts_on_host(World& world, const BufferView& in, const BufferView& out, const int64_t* send_counts,
                          const int64_t* send_offsets, cudaStream_t stream) {
    const int W = world.world_size();
    std::vector<int64_t> mine(2 + 2 * static_cast<std::size_t>(W), 0);
    mine[0] = static_cast<int64_t>(in.count);
    mine[1] = send_offsets != nullptr;
    LOOM_CHECK_CUDA(cudaMemcpyAsync(mine.data() + 2, send_counts, sizeof(int64_t) * W, cudaMemcpyDefault, stream));
    if (send_offsets)
        LOOM_CHECK_CUDA(
            cudaMemcpyAsync(mine.data() + 2 + W, send_offsets, sizeof(int64_t) * W, cudaMemcpyDefault, stream));
    LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
    Bytes b(mine.size() * sizeof(int64_t));
    std::memcpy(b.data(), mine.data(), b.size());
    std::vector<coll::A2avSends> all;
    for (const Bytes& r : world.store().all_gather("loom/a2av-counts", b)) {
        LOOM_CHECK(r.size() == b.size(), "{}: a peer's counts are {} bytes, expected {}", kOp, r.size(), b.size());
        std::vector<int64_t> v(mine.size());
        std::memcpy(v.data(), r.data(), r.size());
        coll::A2avSends s;
        s.in_count = static_cast<std::uint64_t>(v[0]);
        s.counts.assign(v.begin() + 2, v.begin() + 2 + W);
        if (v[1]) s.offsets.assign(v.begin() + 2 + W, v.end());
        all.push_back(std::move(s));
    }
    const std::string e = coll::a2av_counts_error(all, out.count);
    LOOM_CHECK(e.empty(), "{} (checked on the host because LOOM_CHECK_AGREEMENT is on)", e);
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
    const bool capturing = settings().check_agreement && stream_ops::capturing(stream);  // asked in checking mode only
    const detail::AgreedCall agreed(
        world,
        [&] {
            return coll::signature(world, CollKind::AllToAllV, in, out, opts)
                .add("send_counts", detail::placement_field(world, send_counts))
                .add("send_offsets", detail::placement_field(world, send_offsets))
                .add("stream capturing", capturing ? "yes" : "no");
        },
        [&] { check_args(world, in, out, send_counts, send_offsets, recv_counts); });
    if (!agreed.checked()) check_args(world, in, out, send_counts, send_offsets, recv_counts);
    if (world.num_nodes() > 1) {  // hierarchical: node peers by load/store, other nodes through NVSHMEM
        coll::hier::check_all_to_all_v(world, in, out, opts);
        if (agreed.checked() && !capturing) check_counts_on_host(world, in, out, send_counts, send_offsets, stream);
        coll::hier::all_to_all_v(world, in, out, send_counts, send_offsets, recv_counts, opts, stream);
        return;
    }
    coll::Core& core = coll::core(world, stream, kOp);
    const int W = world.world_size();
    const CollChoice c =
        coll::resolve(CollKind::AllToAllV, out.bytes() / W, core.budget.topo, opts,
                      world.is_symmetric(in.data, in.bytes()), world.is_symmetric(out.data, out.bytes()));
    const bool pull = c.algo == CollAlgo::Pull, tma = c.path == DataPath::Tma;
    check_placement(world, c, in, out);
    if (agreed.checked() && !capturing) check_counts_on_host(world, in, out, send_counts, send_offsets, stream);
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
    l.params.in_count = in.count;
    if (tma) l.smem = coll::tma_staging(l.params);
    // The counts are on the device: size the grid from the capacity (an upper bound of the traffic per peer).
    l.blocks = coll::pick_blocks(out.bytes() / W, tma ? 512 * 1024 : 64 * 1024, tma ? 32 : 64, opts, core.budget);
    if (c.staged)
        coll::all_to_all_v_staged(world, core, l, out, stream);
    else
        coll::launch(world, l, stream);
}

}  // namespace loom
