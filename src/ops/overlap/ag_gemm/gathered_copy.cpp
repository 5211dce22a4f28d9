// ag_gemm with a gathered buffer outside the symmetric heap and an overlapped producer (AgGatherAt::OwnThenCopy): the
// peers write the shards into the gather state's symmetric buffer, as without a gathered buffer, and the stream
// copies it into the caller's once the GEMM (which waited for every shard) is done: one local copy of M x K elements
// (read and written: ~2 x M x K x the element size / 4.3 TB/s on an H200, 16 us for 32 MiB). The next call's
// peers write the buffer again only after this rank's next ready signal, raised behind this copy on the stream.
#include "loom/runtime/error.hpp"
#include "ops/overlap/ag_gemm/ag_gemm.hpp"

namespace loom::overlap {

void ag_gemm_copy_gathered(const AgCall& x) {
    const std::size_t bytes = static_cast<std::size_t>(x.M * x.K) * dtype_size(x.a.dtype);
    LOOM_CHECK_CUDA(cudaMemcpyAsync(x.gathered_out, x.gather, bytes, cudaMemcpyDeviceToDevice, x.stream));
}

}  // namespace loom::overlap
