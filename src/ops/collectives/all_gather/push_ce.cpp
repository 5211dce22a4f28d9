// all_gather, push through the copy engine, paced by stream signals instead of barrier kernels (no SM involved):
// `stream` raises ready[me] = v at every peer (its out may be written: its earlier work on out is done, stream
// order); side stream i waits for ready[d] of its destination d, copies this rank's chunk into slot `me` of d's out
// and raises done[me] = v at d; the own chunk (out of place) is copied on a side stream too; `stream` joins the side
// streams and waits for done[q] from every peer. Two signal sets (PushCeSignals):
//   called eagerly: v = this call's count (the same on every rank), waits >= v; nothing is reset;
//   captured in a CUDA graph, whose replays repeat every value: v = 1, waits == 1, and each signal is reset by the
//   rank it lives on once seen — ready[d] on the side stream before the copy, done[q] on `stream` at the end. A
//   reset cannot meet a peer's next write: d raises ready[d] here for its next call only after its current call
//   saw done[me], which this rank raises after the reset (a stream write carries a memory barrier); q raises done[q]
//   here for its next call only after this rank's next ready, which `stream` raises after this call's resets.
// Eager calls keep the counts because each reset is one more stream operation on the critical path (4-7 us a call
// with two ranks on one H200, 256 KiB - 16 MiB).
//
// Ranks on distinct GPUs: the first `head` bytes of every chunk (kSmSharePercent, a 16-byte multiple) go through
// all_gather_push (ld/st, on `stream`, between the fork and the join) while the copy engine moves the rest: the
// kernel's stores start while the copy engine's handshake (ready signal, stream wait) is still under way.
#include <cstdint>
#include <string>

#include "loom/runtime/error.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "ops/collectives/all_gather/algorithms.hpp"
#include "ops/collectives/copy_engine.hpp"
#include "runtime/stream_watchdog.hpp"
#include "runtime/symmetric_zeroed.hpp"

namespace loom::coll {

namespace {

// Percent of every chunk moved by SM stores beside the copy engine, ranks on distinct GPUs: two H200s, 64 MiB, 112 us
// against 119 with the copy engine alone, 1 GiB unchanged (docs/perf/all_gather.json push/ce rows are measured with
// it).
constexpr std::size_t kSmSharePercent = 15;

// The stream signals of the copy-engine push, symmetric [4][kMaxLocalPeers] (256 bytes), zeroed once: ready and done
// of eager calls (rows 0, 1), of captured calls (rows 2, 3).
struct PushCeSignals final : WorldState {
    static constexpr const char* kKey = "collectives/all_gather/push_ce";
    explicit PushCeSignals(World& world) { sig = detail::alloc_zeroed<std::uint64_t>(world, 4 * kMaxLocalPeers); }
    void release(World& world) override { world.free(sig); }

    std::uint64_t* sig = nullptr;
    std::uint64_t eager_calls = 0;  // v of the last eager call
};

// The head kernel: all_gather_push over the first `head` bytes of every chunk (stride B).
void launch_head(World& world, const Core& core, const BufferView& in, const BufferView& out, std::size_t head,
                 const CollOptions& opts, cudaStream_t stream) {
    Launch l;
    l.header = "loom/kernels/collectives/all_gather.cuh";
    l.name = "loom::kernels::coll::all_gather_push";
    l.template_args = {"unsigned char", std::to_string(path_arg(DataPath::LdSt))};
    l.params = core.params();
    l.params.in = in.data;
    l.params.out = out.data;
    l.params.count = in.bytes();  // chunk stride, bytes
    l.params.round_elems = head;  // bytes of each chunk moved
    l.blocks = pick_blocks(head, 64 * 1024, 64, opts, core.budget);
    launch(world, l, stream);
}

}  // namespace

void all_gather_push_ce(World& world, Core& core, const BufferView& inv, const BufferView& outv,
                        const CollOptions& opts, cudaStream_t stream) {
    const int W = world.world_size(), me = world.rank();
    const std::size_t B = inv.bytes();
    const char* const in = static_cast<const char*>(inv.data);
    char* const mine = static_cast<char*>(outv.data) + me * B;
    const std::size_t head = core.budget.topo.shared_gpu ? 0 : B * kSmSharePercent / 100 / 16 * 16;
    const bool graph = stream_ops::capturing(stream);
    PushCeSignals& s = state<PushCeSignals>(world, stream, "all_gather");
    CopyEngine& ce = world.state<CopyEngine>();
    std::uint64_t* const ready = s.sig + (graph ? 2 : 0) * kMaxLocalPeers;
    std::uint64_t* const done = s.sig + (graph ? 3 : 1) * kMaxLocalPeers;
    const std::uint64_t v = graph ? 1 : ++s.eager_calls;
    const stream_ops::WaitCmp cmp = graph ? stream_ops::WaitCmp::EQ : stream_ops::WaitCmp::GEQ;
    detail::WatchedWaits watch(world, "all_gather", v, stream);  // the copy engine's waits, bounded on the host
    for (int d = 0; d < W; ++d)
        if (d != me) stream_ops::signal_ce(world, &ready[me], v, d, stream);
    const bool own_copy = in != mine;
    const std::size_t n = static_cast<std::size_t>(W - 1) + (own_copy ? 1 : 0);
    ce.fork(stream, n);
    if (head > 0) launch_head(world, core, inv, outv, head, opts, stream);
    for (int i = 1; i < W; ++i) {
        const int d = (me + i) % W;
        cudaStream_t side = ce.stream(static_cast<std::size_t>(i - 1));
        // head == B: every byte went through the kernel, whose own barrier paced it. Eagerly only the done signal
        // is raised; captured, ready[d] is still waited for, to be reset.
        if (head < B || graph) watch.wait_value(side, &ready[d], v, d, cmp);
        if (graph) stream_ops::write_value(side, &ready[d], 0);
        if (head < B) stream_ops::put_ce(world, mine + head, in + head, B - head, d, side);
        stream_ops::signal_ce(world, &done[me], v, d, side);
    }
    if (own_copy && head < B)
        LOOM_CHECK_CUDA(cudaMemcpyAsync(mine + head, in + head, B - head, cudaMemcpyDefault, ce.stream(n - 1)));
    ce.join(stream, n);
    for (int q = 0; q < W; ++q)
        if (q != me) watch.wait_value(stream, &done[q], v, q, cmp);
    if (graph)
        for (int q = 0; q < W; ++q)
            if (q != me) stream_ops::write_value(stream, &done[q], 0);
    watch.enqueued();
}

}  // namespace loom::coll
