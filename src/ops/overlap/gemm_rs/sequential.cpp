// gemm_rs's sequence (RsAlgo::Sequential): loom::gemm into this call's parity half of a symmetric [M, N] buffer
// (RsSequentialState), then loom::reduce_scatter (across nodes its hierarchical form).
#include "loom/ops/collectives.hpp"
#include "loom/runtime/error.hpp"
#include "ops/collectives/barrier.hpp"
#include "ops/overlap/common/hooked_gemm.hpp"
#include "ops/overlap/gemm_rs/gemm_rs.hpp"

namespace loom::overlap {

void gemm_rs_sequential(const RsCall& x) {
    World& world = *x.world;
    const MatrixView& c = x.c;
    RsSequentialState& st = op_state<RsSequentialState>(world, "gemm_rs", x.captured);
    const int me = world.rank();
    const int64_t N = x.N;
    const std::size_t es = dtype_size(c.dtype), count = static_cast<std::size_t>(x.M * N);
    const std::size_t seg = static_cast<std::size_t>(x.rows_seg * N);
    // Parity halves: a peer may still read (pull) this rank's partial of call e while call e + 1's GEMM runs; it has
    // finished by the time this rank's reduce_scatter of call e + 1 has met it, before call e + 2 writes the half.
    // Captured in a graph, every replay writes the same half: the ranks meet on the device first (every peer's
    // earlier reads of it are done). Eager calls load that barrier's kernel (loading is not allowed in a capture).
    // Across nodes the hierarchical reduce_scatter's node step, the only one that reads a peer's partial, ends by
    // meeting the node's ranks once their reads are done: no barrier is needed (nor runs: barrier_on_stream is a
    // node's).
    if (x.nodes == 1 && x.captured) barrier_on_stream(world, x.stream);
    if (x.nodes == 1 && !x.captured) coll::prepare_barrier(world);
    char* const partial = gemm_into_parity_half(world, st.partials, x.a, x.b, c.dtype, x.sc, x.stream, x.captured);
    const BufferView in{partial, c.dtype, count};
    // Straight into a dense C, symmetric or not: the pull ReduceScatter (each rank reads its rows of every partial)
    // needs only the input symmetric; in place and copied out costs an extra pass over C. A strided C: in place, then
    // copied out.
    if (c.stride() == N) {
        reduce_scatter(world, in, BufferView{c.data, c.dtype, seg}, x.stream);
        return;
    }
    char* const mine = partial + static_cast<std::size_t>(me) * seg * es;
    reduce_scatter(world, in, BufferView{mine, c.dtype, seg}, x.stream);
    LOOM_CHECK_CUDA(cudaMemcpy2DAsync(c.data, static_cast<std::size_t>(c.stride()) * es, mine, N * es, N * es,
                                      static_cast<std::size_t>(x.rows_seg), cudaMemcpyDeviceToDevice, x.stream));
}

}  // namespace loom::overlap
