// gemm_rs's two-level form in a World of several nodes (RsAlgo::ScatterReduce there). Per call on every rank (node n
// of N, L ranks per node, R = M / W rows per rank; the node's rows [n L R, (n + 1) L R) of the partial product):
//   stream  loom::gemm of the other nodes' rows into this call's parity half of the partials (RsSequentialState's)
//   side    forked after it: the hierarchical reduce_scatter's intra step for the other nodes' chunks (the node's
//           ranks' partials summed, pulled by load / store) and its inter step's exchange (each sum put_signal through
//           NVSHMEM to the rank of this local rank on its node)
//   stream  beside the side: loom::gemm of the node's rows, then the intra step for the node's chunks; joins the side
//           and sums this node's part with the other nodes' received ones into C
// The other nodes' reduction and transfer run beside the GEMM of the node's rows. The two streams' kernels meet
// their peers through separate signals (hier::State, hier::BesideState) and write disjoint parts of the scratch.
#include <utility>

#include "loom/ops/gemm.hpp"
#include "loom/runtime/error.hpp"
#include "ops/collectives/hier/hier.hpp"
#include "ops/overlap/common/hooked_gemm.hpp"
#include "ops/overlap/gemm_rs/gemm_rs.hpp"

namespace loom::overlap {

void gemm_rs_across_nodes(const RsCall& x) {
    using coll::hier::RsPart;
    World& world = *x.world;
    const MatrixView& a = x.a;
    const MatrixView& c = x.c;
    RsSequentialState& st = op_state<RsSequentialState>(world, "gemm_rs", x.captured);
    RsNodesState& ns = op_state<RsNodesState>(world, "gemm_rs", x.captured);
    const int64_t N = x.N, node_rows = x.L * x.rows_seg, row0 = world.node() * node_rows;
    const std::size_t es = dtype_size(c.dtype), ies = dtype_size(a.dtype);
    const std::size_t count = static_cast<std::size_t>(x.M * N), seg = static_cast<std::size_t>(x.rows_seg * N);
    // Parity halves as the sequence's (sequential.cpp), with which calls may mix.
    const std::size_t half_stride = ensure_parity_halves(world, st.partials.buf, count * es, x.captured);
    char* const partial = static_cast<char*>(st.partials.buf.p) + (++st.partials.calls % 2) * half_stride;
    const BufferView in{partial, c.dtype, count};
    // Into a dense C directly (any memory: the combine writes this rank's C only); a strided C through this rank's rows
    // of the partial (read by nobody else once the node's intra steps are done), then copied.
    const bool dense = c.stride() == N;
    char* const mine = partial + static_cast<std::size_t>(world.rank()) * seg * es;
    const BufferView out{dense ? c.data : mine, c.dtype, seg};
    coll::hier::prepare_reduce_scatter(world, in, out, x.stream);
    const GemmOptions go = gemm_options(x.sc);
    auto gemm_rows = [&](int64_t lo, int64_t hi) {
        if (hi <= lo) return;
        gemm(MatrixView{static_cast<char*>(a.data) + static_cast<std::size_t>(lo * a.stride()) * ies, a.dtype, hi - lo,
                        x.K, a.stride()},
             x.b, MatrixView{partial + static_cast<std::size_t>(lo * N) * es, c.dtype, hi - lo, N, 0}, go, x.stream);
    };
    gemm_rows(0, row0);
    gemm_rows(row0 + node_rows, x.M);
    fork(ns.side, x.stream);
    coll::hier::reduce_scatter_part(world, in, out, RsPart::OtherNodes, ns.side.stream);
    gemm_rows(row0, row0 + node_rows);
    coll::hier::reduce_scatter_part(world, in, out, RsPart::OwnNode, x.stream);
    join(ns.side, x.stream);
    coll::hier::reduce_scatter_part(world, in, out, RsPart::Combine, x.stream);
    if (dense) return;
    LOOM_CHECK_CUDA(cudaMemcpy2DAsync(c.data, static_cast<std::size_t>(c.stride()) * es, mine, N * es, N * es,
                                      static_cast<std::size_t>(x.rows_seg), cudaMemcpyDeviceToDevice, x.stream));
}

}  // namespace loom::overlap
