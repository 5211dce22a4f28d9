// ag_gemm's copy-engine producer: cudaMemcpyAsync of this rank's shard into every peer's gather buffer and a
// cuStreamWriteValue64 of chunk[me] after each, on the state's side stream, beside the hooked GEMM (ag_gemm.hpp).
// Across nodes it runs on the node's part of the call (across_nodes.cpp): peers x.base + d, d < x.W.
#include "loom/runtime/error.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "ops/overlap/ag_gemm/ag_gemm.hpp"
#include "ops/overlap/common/hooked_gemm.hpp"
#include "runtime/stream_watchdog.hpp"

namespace loom::overlap {
namespace {

// The side stream's work: this rank's ready signal, then per peer d (from me + 1): wait d's ready, copy the shard into
// d's gather rows, raise chunk[me] there; with own_local chunk[me] here too (nothing to copy).
void enqueue_side(const AgCall& x, AgGatherState& st, char* my_rows, uint64_t epoch, bool own_local,
                  detail::WatchedWaits& watch) {
    World& world = *x.world;
    auto* const sig = st.sig.p;
    const cudaStream_t side = st.side.stream;
    for (int d = 0; d < x.W; ++d)
        if (d != x.me) stream_ops::signal_ce(world, &sig->ready[x.me], epoch, x.base + d, side);
    for (int i = 1; i < x.W; ++i) {
        const int d = (x.me + i) % x.W;
        watch.wait_value(side, &sig->ready[d], epoch, x.base + d);
        stream_ops::put_ce(world, my_rows, x.a.data, x.chunk_bytes, x.base + d, side);
        stream_ops::signal_ce(world, &sig->chunk[x.me], st.chunk_total, x.base + d, side);
    }
    // In place (own_local): chunk[me] still gets this call's total, so that a later call with the SM producer, which
    // adds to it, reaches its target.
    if (own_local) stream_ops::signal_ce(world, &sig->chunk[x.me], st.chunk_total, x.base + x.me, side);
}

}  // namespace

void ag_gemm_copy_engine(const AgCall& x, kernels::overlap::AgGemmHookArgs h) {
    AgGatherState& st = *x.st;
    World& world = *x.world;
    const bool own_local = h.own_local != 0;
    const uint64_t epoch = ++st.calls;
    auto* const sig = st.sig.p;
    char* const my_rows = static_cast<char*>(x.gather) + static_cast<std::size_t>(x.me) * x.chunk_bytes;
    detail::WatchedWaits watch(world, "ag_gemm", epoch, x.stream);  // the side stream's waits, bounded on the host
    fork(st.side, x.stream);
    st.chunk_total += 1;
    // This rank's own rows, unless read in place: a copy within one GPU is a runtime copy kernel, which the persistent
    // GEMM (every SM when no other rank shares the GPU) would starve if both were queued at once. In stream order
    // before the GEMM it never competes (and the GEMM starts on these rows anyway).
    if (!own_local) {
        stream_ops::put_ce(world, my_rows, x.a.data, x.chunk_bytes, x.base + x.me, x.stream);
        stream_ops::signal_ce(world, &sig->chunk[x.me], st.chunk_total, x.base + x.me, x.stream);
    }
    if (x.own_rows) LOOM_CHECK_CUDA(cudaEventRecord(x.own_rows, x.stream));
    // Ranks sharing a GPU: every copy is a runtime copy kernel, which needs SMs of this rank's MPS share; next to the
    // persistent GEMM (all but two SMs of the share, spinning on the peers' chunks) a sender's copy could find no SM
    // and never land (a hang). So the GEMM starts after this rank's copies, which then never compete with its GEMM: no
    // overlap on shared GPUs with this producer.
    if (x.dev->shared_gpu) {
        enqueue_side(x, st, my_rows, epoch, own_local, watch);
        join(st.side, x.stream);
    }
    h.chunk = sig->chunk;
    h.target = st.chunk_total;
    launch_gemm(kAgHooks, kAgHeader, x.gview, x.b, x.c, x.plan.gemm, x.num_sms, x.stream, h, x.sc,
                ScaleAt::Accumulators);
    // With one GPU per rank the side stream's work is enqueued after the GEMM's launch: the GEMM starts on the own
    // rows, which need none of it, and its launch does not wait behind the host's 3W - 2 stream operations.
    if (!x.dev->shared_gpu) enqueue_side(x, st, my_rows, epoch, own_local, watch);
    join(st.side, x.stream);
    watch.enqueued();
}

}  // namespace loom::overlap
