// NCCL's C API as a benchmark baseline: one communicator over a World's ranks. NCCL needs one GPU per rank, so
// on a shared GPU (or in a build without nccl.h / libnccl) the baseline is absent and note() says why.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "loom/runtime/world.hpp"
#include "loom/tensor.hpp"

namespace loom::bench {

class NcclBaseline {
  public:
    // Collective over `world` when enabled and !shared_gpu; otherwise ok() is false and no rank calls NCCL.
    NcclBaseline(World& world, bool enabled, bool shared_gpu);
    ~NcclBaseline();
    NcclBaseline(const NcclBaseline&) = delete;
    NcclBaseline& operator=(const NcclBaseline&) = delete;

    bool ok() const { return comm_ != nullptr; }
    const std::string& note() const { return note_; }  // why the baseline is absent ("" when ok)

    // Counts in elements of `dt`, as NCCL takes them; sums for the reductions. Raise loom::Error on failure.
    void all_gather(const void* in, void* out, std::size_t count_per_rank, DType dt, cudaStream_t s);
    void reduce_scatter(const void* in, void* out, std::size_t out_count, DType dt, cudaStream_t s);
    void all_reduce(const void* in, void* out, std::size_t count, DType dt, cudaStream_t s);
    void all_to_all(const void* in, void* out, std::size_t count_per_peer, DType dt, cudaStream_t s);

  private:
    void* comm_ = nullptr;  // ncclComm_t
    std::string note_;
};

}  // namespace loom::bench
