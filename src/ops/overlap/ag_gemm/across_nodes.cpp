// ag_gemm's copy-engine producer in a World of several nodes: the two-level form. Per call on every rank (node n of
// N, L ranks per node, R rows per rank; the node's rows [n L R, (n + 1) L R)):
//   stream  the copy-engine producer and its hooked GEMM over the node's rows (copy_engine.cpp on the node's part of
//           the call: its ranks the node's, its gather buffer and C the node's rows); own_rows recorded once this
//           rank's rows are in its gather buffer (or, read in place, before the GEMM)
//   side    after own_rows: the other nodes' chunks (hier::all_gather_other_nodes: this rank's chunk by NVSHMEM
//           put_signal to its local rank on every other node, then the chunks received by the node's ranks, pushed to
//           each other by load / store), on the comm_sms blocks the node's GEMM leaves free
//   stream  joins the side, then loom::gemm over the other nodes' rows (those before the node's and those after; in
//           AgGemmOptions::config's tiles where one is given, as the node's GEMM)
// The node's GEMM hides the inter-node transfer; the other nodes' rows are multiplied once every one has landed.
// Buffer reuse: the hierarchical kernels meet their peers on entry (each peer's side stream runs after its previous
// call, whose GEMMs over the rows they write are done) and the intra step meets the node's ranks again at its end.
#include <algorithm>

#include "loom/ops/gemm.hpp"
#include "loom/runtime/error.hpp"
#include "ops/collectives/hier/hier.hpp"
#include "ops/overlap/ag_gemm/ag_gemm.hpp"
#include "ops/overlap/common/hooked_gemm.hpp"

namespace loom::overlap {

AgNodesState::AgNodesState(World&) { LOOM_CHECK_CUDA(cudaEventCreateWithFlags(&own_rows, cudaEventDisableTiming)); }

AgNodesState::~AgNodesState() {
    if (own_rows) cudaEventDestroy(own_rows);
}

void ag_gemm_across_nodes(const AgCall& x, const AgGemmOptions& o) {
    World& world = *x.world;
    AgNodesState& ns = op_state<AgNodesState>(world, "ag_gemm", x.captured);
    // The other nodes' kernels loaded (their first load meets every rank) before the producer's work, which waits on
    // the node's ranks, is enqueued; a JIT error leaves the producer's counters as they were.
    coll::hier::prepare_all_gather(world, x.stream);
    const std::size_t es = dtype_size(x.a.dtype), ces = dtype_size(x.c.dtype);
    const int64_t node_rows = x.L * x.R, row0 = world.node() * node_rows;
    // The side's blocks: one per 256 KiB of the chunk, at most 8 (as the SM producer's), or comm_sms.
    const int dflt = static_cast<int>(std::clamp<std::size_t>(x.chunk_bytes / (256 << 10), 1, 8));
    const int comm = comm_blocks(o.comm_sms, dflt, x.num_sms);
    AgCall n = x;
    n.W = x.L;
    n.me = world.local_rank();
    n.base = world.node() * x.L;
    n.M = node_rows;
    n.gather = static_cast<char*>(x.gather) + static_cast<std::size_t>(row0 * x.K) * es;
    n.gview = MatrixView{n.gather, x.a.dtype, node_rows, x.K, 0};
    n.c = MatrixView{static_cast<char*>(x.c.data) + static_cast<std::size_t>(row0 * x.c.stride()) * ces, x.c.dtype,
                     node_rows, x.N, x.c.stride()};
    n.num_sms = x.num_sms - comm;
    n.plan = ag_gemm_plan(n.M, n.N, n.K, n.W, AgProducer::CopyEngine, 0, x.dev->arch, n.num_sms, x.dev->shared_gpu,
                          x.a.dtype);
    n.own_rows = ns.own_rows;
    n.gathered_out = nullptr;
    const kernels::overlap::AgGemmHookArgs h = prepare_overlapped(n, o);
    ag_gemm_copy_engine(n, h);
    // This rank's chunk goes out from its gather rows when the producer copied it there, else from A (the inter step
    // then writes the gather rows too, which the node's GEMM does not read).
    char* const mine = static_cast<char*>(x.gather) + static_cast<std::size_t>(world.rank()) * x.chunk_bytes;
    const void* const in = h.own_local ? x.a.data : mine;
    LOOM_CHECK_CUDA(cudaStreamWaitEvent(ns.side.stream, ns.own_rows, 0));
    coll::hier::all_gather_other_nodes(world, BufferView{const_cast<void*>(in), x.a.dtype, x.chunk_bytes / es},
                                       BufferView{x.gather, x.a.dtype, static_cast<std::size_t>(x.M * x.K)}, comm,
                                       ns.side.stream);
    join(ns.side, x.stream);
    // The other nodes' rows: those before the node's, then those after; in the caller's tile config where one is given.
    GemmOptions go = gemm_options(x.sc);
    go.config = o.config;
    for (const auto& [lo, hi] : {std::pair<int64_t, int64_t>{0, row0}, {row0 + node_rows, x.M}}) {
        if (hi <= lo) continue;
        const MatrixView a{static_cast<char*>(x.gather) + static_cast<std::size_t>(lo * x.K) * es, x.a.dtype, hi - lo,
                           x.K, 0};
        const MatrixView c{static_cast<char*>(x.c.data) + static_cast<std::size_t>(lo * x.c.stride()) * ces, x.c.dtype,
                           hi - lo, x.N, x.c.stride()};
        gemm(a, x.b, c, go, x.stream);
    }
}

}  // namespace loom::overlap
