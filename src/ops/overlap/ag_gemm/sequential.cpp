// ag_gemm's sequence (AgProducer::Sequential): loom::all_gather of the shards into the gather buffer (the caller's
// `gathered` or the gather state's, [M, K] dense), then loom::gemm over it with loom::gemm's own config. No signal or
// counter is touched, so calls may mix it with the overlapped producers: its all_gather meets every peer in this call
// (each peer's earlier GEMMs over its gather buffer are done), and the next overlapped call's copies into this rank's
// buffer wait for its ready signal, raised behind this call's GEMM.
#include "loom/ops/collectives.hpp"
#include "loom/ops/gemm.hpp"
#include "ops/overlap/ag_gemm/ag_gemm.hpp"
#include "ops/overlap/common/hooked_gemm.hpp"

namespace loom::overlap {

void ag_gemm_sequential(const AgCall& x) {
    const MatrixView& a = x.a;
    all_gather(*x.world, BufferView{a.data, a.dtype, static_cast<std::size_t>(a.rows * a.cols)},
               BufferView{x.gview.data, a.dtype, static_cast<std::size_t>(x.gview.rows * x.gview.cols)}, x.stream);
    gemm(x.gview, x.b, x.c, gemm_options(x.sc), x.stream);
}

}  // namespace loom::overlap
