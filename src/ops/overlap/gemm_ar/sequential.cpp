// gemm_ar's sequence (ArAlgo::Sequential): loom::gemm into this call's parity half of the partials (ArPartialsState),
// then loom::all_reduce (across nodes its hierarchical form).
#include "loom/ops/collectives.hpp"
#include "loom/runtime/error.hpp"
#include "ops/overlap/common/hooked_gemm.hpp"
#include "ops/overlap/gemm_ar/gemm_ar.hpp"

namespace loom::overlap {

void gemm_ar_sequential(const ArCall& x) {
    World& world = *x.world;
    const MatrixView& c = x.c;
    ArPartialsState& st = op_state<ArPartialsState>(world, "gemm_ar", x.captured);
    const int64_t M = x.M, N = x.N;
    const std::size_t es = dtype_size(c.dtype), count = static_cast<std::size_t>(M * N);
    char* const partial = gemm_into_parity_half(world, st.partials, x.a, x.b, c.dtype, x.sc, x.stream, x.captured);
    // Into C directly when C is dense, symmetric or not (all_reduce's two-shot stages the shards of a plain C in its
    // scratch: no copy afterwards); across nodes only a symmetric C (the hierarchical form writes a symmetric out). A
    // strided C, or across nodes one outside the heap: in place on the symmetric partial, then copied.
    if (c.stride() == N && (x.nodes == 1 || world.is_symmetric(c.data, count * es))) {
        all_reduce(world, BufferView{partial, c.dtype, count}, BufferView{c.data, c.dtype, count}, x.stream);
        return;
    }
    all_reduce(world, BufferView{partial, c.dtype, count}, BufferView{partial, c.dtype, count}, x.stream);
    LOOM_CHECK_CUDA(cudaMemcpy2DAsync(c.data, static_cast<std::size_t>(c.stride()) * es, partial, N * es, N * es,
                                      static_cast<std::size_t>(M), cudaMemcpyDeviceToDevice, x.stream));
}

}  // namespace loom::overlap
