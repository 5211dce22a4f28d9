// reduce_scatter, scatter through the copy engine, reduced locally, in rounds (no SM moves data between GPUs). After
// an entry barrier (every peer finished its earlier calls, so every scratch buffer is free), round k of the call
// pushes, for every peer d, elements [off, off + n) of in's chunk d into slot `me` of buffer k % 2 of d's scratch
// (cudaMemcpyAsync on side stream d; from round 2 on after d freed that buffer: freed[d] >= k - 1) and raises
// ready[me] = k + 1 at d; the caller's stream waits for ready[q] >= k + 1 from every peer, reduces the round into
// out[off, off + n) (reduce_scatter_ce_reduce) and, where a later round of the call refills the buffer, raises
// freed[me] = k + 1 at every peer. Two buffers, so the pushes of round k + 1 run under the reduce of round k. At the
// end the stream resets this rank's ready and freed to 0: every write a peer makes to them in this call was waited
// for, and the peers' next writes follow the next call's entry barrier. The values depend only on the round within
// the call, so a captured graph replays correctly. Any in and out; only the scratch is symmetric.
#include <cstdint>

#include "loom/runtime/error.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "ops/collectives/barrier.hpp"
#include "ops/collectives/copy_engine.hpp"
#include "ops/collectives/reduce_scatter/algorithms.hpp"
#include "runtime/stream_watchdog.hpp"
#include "runtime/symmetric_zeroed.hpp"

namespace loom::coll {

namespace {

// The stream signals of the copy-engine scatter, symmetric [2][kMaxLocalPeers] (128 bytes): ready (row 0) and freed
// (row 1), zeroed when created and reset to 0 at the end of every call.
struct ScatterCeSignals final : WorldState {
    static constexpr const char* kKey = "collectives/reduce_scatter/scatter_ce";
    explicit ScatterCeSignals(World& world) { sig = detail::alloc_zeroed<std::uint64_t>(world, 2 * kMaxLocalPeers); }
    void release(World& world) override { world.free(sig); }

    std::uint64_t* sig = nullptr;
    std::uint64_t calls = 0;  // this rank's calls, for the watchdog's diagnostic
};

}  // namespace

void reduce_scatter_scatter_ce(World& world, Core& core, const BufferView& in, const BufferView& out,
                               const CollOptions& opts, cudaStream_t stream) {
    const int W = world.world_size(), me = world.rank();
    const std::size_t es = dtype_size(in.dtype), S = out.count;
    const Scratch& scratch = world.state<Scratch>();
    ScatterCeSignals& signals = state<ScatterCeSignals>(world, stream, "reduce_scatter");
    std::uint64_t* const ready = signals.sig;
    std::uint64_t* const freed = ready + kMaxLocalPeers;
    CopyEngine& ce = world.state<CopyEngine>();
    std::size_t C = scratch.bytes / (2 * static_cast<std::size_t>(W) * es) / 16 * 16;  // per slot per buffer
    if (C > S) C = S;
    const char* const src = static_cast<const char*>(in.data);
    char* const dst = static_cast<char*>(out.data);
    detail::WatchedWaits watch(world, "reduce_scatter", ++signals.calls, stream);  // bounded on the host
    // Entry barrier: every peer finished its earlier collectives, whose kernels may still have used the scratch.
    launch_barrier(world, core, stream);
    ce.fork(stream, static_cast<std::size_t>(W - 1));
    Launch l;
    l.header = "loom/kernels/collectives/reduce_scatter.cuh";
    l.name = "loom::kernels::coll::reduce_scatter_ce_reduce";
    l.template_args = {cuda_type(in.dtype), opts.op == ReduceOp::Max ? "1" : "0"};
    l.params = core.params();
    scratch.attach(l.params);
    l.params.round_elems = C;
    const std::size_t rounds = (S + C - 1) / C;
    for (std::size_t k = 0; k < rounds; ++k) {
        const std::size_t off = k * C, n = S - off < C ? S - off : C;
        char* const buf = scratch.data + (k % 2) * static_cast<std::size_t>(W) * C * es;
        for (int i = 1; i < W; ++i) {
            const int d = (me + i) % W;
            cudaStream_t side = ce.stream(i - 1);
            if (k >= 2) watch.wait_value(side, &freed[d], k - 1, d);
            stream_ops::put_ce(world, buf + static_cast<std::size_t>(me) * C * es, src + (d * S + off) * es, n * es, d,
                               side);
            stream_ops::signal_ce(world, &ready[me], k + 1, d, side);
        }
        for (int q = 0; q < W; ++q)
            if (q != me) watch.wait_value(stream, &ready[q], k + 1, q);
        l.params.in = src + (me * S + off) * es;
        l.params.out = dst + off * es;
        l.params.count = n;
        l.params.scratch = buf;
        l.blocks = pick_blocks(n * es * W, 256 * 1024, 64, opts, core.budget);
        launch(world, l, stream);
        if (k + 2 < rounds)
            for (int d = 0; d < W; ++d)
                if (d != me) stream_ops::signal_ce(world, &freed[me], k + 1, d, stream);
    }
    // Join the side streams (their last waits on freed are in stream order before the reset), then reset.
    ce.join(stream, static_cast<std::size_t>(W - 1));
    LOOM_CHECK_CUDA(cudaMemsetAsync(ready, 0, 2 * kMaxLocalPeers * sizeof(std::uint64_t), stream));  // ready, freed
    watch.enqueued();
}

}  // namespace loom::coll
