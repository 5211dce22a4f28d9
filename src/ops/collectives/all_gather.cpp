// Host launcher of include/loom/kernels/collectives/all_gather.cuh: validate, choose, launch.
#include <vector>

#include "loom/runtime/error.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "ops/collectives/coll_state.hpp"
#include "runtime/env_vars.hpp"

namespace loom {

namespace {

// Push through the copy engine, paced by stream signals instead of barrier kernels (no SM involved): `stream` raises
// ready[me] = v at every peer (its out may be written: its earlier work on out is done, stream order); side stream i
// waits for ready[d] of its destination d, copies this rank's chunk into slot `me` of d's out and raises done[me] =
// v at d; the own chunk (out of place) is copied on a side stream too; `stream` joins the side streams and waits for
// done[q] from every peer. Measured against two barrier-kernel launches (entry, exit): see docs/collectives.md.
// Two signal sets (CollState::ce_sig):
//   called eagerly: v = this call's count (the same on every rank), waits >= v; nothing is reset;
//   captured in a CUDA graph, whose replays repeat every value: v = 1, waits == 1, and each signal is reset by the
//   rank it lives on once seen — ready[d] on the side stream before the copy, done[q] on `stream` at the end. A
//   reset cannot meet a peer's next write: d raises ready[d] here for its next call only after its current call
//   saw done[me], which this rank raises after the reset (a stream write carries a memory barrier); q raises done[q]
//   here for its next call only after this rank's next ready, which `stream` raises after this call's resets.
// Eager calls keep the counts because each reset is one more stream operation on the critical path (two ranks on
// one H200, 256 KiB - 16 MiB: the resets cost 4-7 us a call, session 28).
//
// Ranks on distinct GPUs: the first `head` bytes of every chunk (LOOM_AG_CE_SM_SHARE percent, default 15, 16-byte
// multiple) go through all_gather_push (ld/st, on `stream`, between the fork and the join) while the copy engine
// moves the rest: the kernel's stores start while the copy engine's handshake (ready signal, stream wait) is still
// under way. Two H200s, 64 MiB: 119 us with the copy engine alone, 112 / 113 / 119 / 117 us at 10 / 20 / 30 / 45 %
// (copy-engine puts without any signal: 95.7 us); 1 GiB: 1421 alone, 1423-1428 at 10-20 %, 1565 at 45 %.
void all_gather_push_copy_engine(World& world, coll::CollState& st, const BufferView& inv, const BufferView& outv,
                                 cudaStream_t stream, const CollOptions& opts) {
    const int W = world.world_size(), me = world.rank();
    const std::size_t B = inv.bytes();
    const char* const in = static_cast<const char*>(inv.data);
    char* const mine = static_cast<char*>(outv.data) + me * B;
    static const long long share = [] {
        const long long v = env_int("LOOM_AG_CE_SM_SHARE", 15);
        LOOM_CHECK(v >= 0 && v <= 100, "LOOM_AG_CE_SM_SHARE: expected a percentage in [0, 100], given {}", v);
        return v;
    }();
    const std::size_t head = st.topo.shared_gpu ? 0 : B * static_cast<std::size_t>(share) / 100 / 16 * 16;
    const bool graph = stream_ops::capturing(stream);
    std::uint64_t* const ready = st.ce_sig + (graph ? 4 : 2) * kMaxLocalPeers;
    std::uint64_t* const done = st.ce_sig + (graph ? 5 : 3) * kMaxLocalPeers;
    const std::uint64_t v = graph ? 1 : ++st.ce_ag_calls;
    const stream_ops::WaitCmp cmp = graph ? stream_ops::WaitCmp::EQ : stream_ops::WaitCmp::GEQ;
    for (int d = 0; d < W; ++d)
        if (d != me) stream_ops::signal_ce(world, &ready[me], v, d, stream);
    const bool own_copy = in != mine;
    const std::size_t n = static_cast<std::size_t>(W - 1) + (own_copy ? 1 : 0);
    coll::ce_fork(st, stream, n);
    if (head > 0) {
        coll::Launch l;
        l.header = "loom/kernels/collectives/all_gather.cuh";
        l.name = "loom::kernels::coll::all_gather_push";
        l.template_args = {"unsigned char", std::to_string(coll::path_arg(DataPath::LdSt))};
        l.params = coll::base_params(st);
        l.params.in = in;
        l.params.out = outv.data;
        l.params.count = B;           // chunk stride, bytes
        l.params.round_elems = head;  // bytes of each chunk moved
        l.blocks = coll::pick_blocks(head, 64 * 1024, 64, opts, st);
        coll::launch(world, l, stream);
    }
    for (int i = 1; i < W; ++i) {
        const int d = (me + i) % W;
        cudaStream_t side = coll::ce_stream(st, static_cast<std::size_t>(i - 1));
        // head == B: every byte went through the kernel, whose own barrier paced it. Eagerly only the done signal
        // is raised; captured, ready[d] is still waited for, to be reset.
        if (head < B || graph) stream_ops::wait_value(side, &ready[d], v, cmp);
        if (graph) stream_ops::write_value(side, &ready[d], 0);
        if (head < B) stream_ops::put_ce(world, mine + head, in + head, B - head, d, side);
        stream_ops::signal_ce(world, &done[me], v, d, side);
    }
    if (own_copy && head < B)
        LOOM_CHECK_CUDA(
            cudaMemcpyAsync(mine + head, in + head, B - head, cudaMemcpyDefault, coll::ce_stream(st, n - 1)));
    coll::ce_join(st, stream, n);
    for (int q = 0; q < W; ++q)
        if (q != me) stream_ops::wait_value(stream, &done[q], v, cmp);
    if (graph)
        for (int q = 0; q < W; ++q)
            if (q != me) stream_ops::write_value(stream, &done[q], 0);
}

}  // namespace

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

    if (c.path == DataPath::CopyEngine && c.algo == CollAlgo::Push) {
        all_gather_push_copy_engine(world, st, in, out, stream, opts);
        return;
    }
    if (c.path == DataPath::CopyEngine) {
        // Pull: entry barrier, the W-1 peer copies and the own chunk's copy at once (side streams), exit barrier:
        // all ordered on `stream`.
        coll::launch_barrier(world, st, stream);
        std::vector<coll::CopyJob> jobs;
        for (int i = 0; i < W; ++i) {
            const int peer = (me + i) % W;
            if (peer == me && in.data == mine) continue;
            char* dst = static_cast<char*>(out.data) + peer * B;
            // In place, the peer's input is slot `peer` of its out (my in is slot `me`: not a symmetric offset).
            const void* src = world.peer_ptr(in.data == mine ? static_cast<const void*>(dst) : in.data, peer);
            jobs.push_back({dst, src, B});
        }
        coll::copy_engine_fanout(st, stream, jobs);
        coll::launch_barrier(world, st, stream);
        return;
    }
    coll::Launch l;
    l.header = "loom/kernels/collectives/all_gather.cuh";
    LOOM_CHECK(c.algo == CollAlgo::Push || c.algo == CollAlgo::Pull || c.algo == CollAlgo::Ring,
               "{}: unknown algorithm {}", op, to_string(c.algo));
    // Ranks sharing a GPU: push over ld/st reads each vector once for all destinations (every byte, the own chunk's
    // too, goes through the one GPU's memory); on distinct GPUs the per-peer loop keeps NVLink stores first.
    const bool fanout = c.algo == CollAlgo::Push && c.path == DataPath::LdSt && st.topo.shared_gpu;
    if (fanout) {
        l.name = "loom::kernels::coll::all_gather_push_fanout";
        l.template_args = {std::to_string(W)};
    } else {
        l.name = c.algo == CollAlgo::Push   ? "loom::kernels::coll::all_gather_push"
                 : c.algo == CollAlgo::Pull ? "loom::kernels::coll::all_gather_pull"
                                            : "loom::kernels::coll::all_gather_ring";
        l.template_args = {"unsigned char", std::to_string(coll::path_arg(c.path))};
    }
    l.params = coll::base_params(st);
    l.params.in = in.data;
    l.params.out = out.data;
    l.params.count = B;  // moved as bytes
    if (c.path == DataPath::Tma) l.smem = coll::tma_staging(l.params);
    if (fanout) l.params.flags |= kernels::coll::kFlagGridStride;
    // ~64 KiB per block per peer keeps enough bytes in flight; TMA needs fewer blocks (one thread drives each); the
    // grid-strided fan-out takes its cap from the rank's SM share.
    const int cap = c.path == DataPath::Tma ? 32 : fanout ? coll::grid_stride_block_cap(st, 64, true) : 64;
    l.blocks = coll::pick_blocks(B, c.path == DataPath::Tma ? 512 * 1024 : 64 * 1024, cap, opts, st);
    coll::launch(world, st, key, l, stream);
}

}  // namespace loom
