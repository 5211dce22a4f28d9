// The copy-engine data path's side streams: each copy runs on its own side stream, so the copies to different peers
// and the own chunk's local copy run on different copy engines at once (one stream would serialise them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "loom/runtime/world_state.hpp"

namespace loom::coll {

// Local state only (no symmetric memory): side streams and their events, created on first use and destroyed with the
// World. Shared by every copy-engine path; a path uses side streams 0..n-1 between ce_fork and ce_join.
class CopyEngine final : public WorldState {
  public:
    static constexpr const char* kKey = "collectives/copy_engine";
    explicit CopyEngine(World&) {}
    ~CopyEngine() override;

    // Side stream i (created on first use).
    cudaStream_t stream(std::size_t i);
    // Side streams 0..n-1 start after `stream`'s work so far (fork); `stream`'s later work starts after theirs
    // (join). Events only: capturable in a CUDA graph.
    void fork(cudaStream_t stream, std::size_t n);
    void join(cudaStream_t stream, std::size_t n);

    struct Copy {
        void* dst;
        const void* src;
        std::size_t bytes;
    };
    // Copy i on side stream i, every copy ordered after `stream`'s earlier work and before its later work.
    void fanout(cudaStream_t stream, const std::vector<Copy>& copies);

  private:
    std::vector<cudaStream_t> streams_;
    std::vector<cudaEvent_t> done_;
    cudaEvent_t fork_ = nullptr;
};

}  // namespace loom::coll
