// Timing for the ops' autotuning (loom::gemm's and the overlapped ops' candidates; jit/autotune.hpp decides).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>

namespace loom::detail {

// Device memory for tuning runs, freed with the object.
struct DeviceScratch {
    void* p = nullptr;
    explicit DeviceScratch(std::size_t bytes);
    ~DeviceScratch();
    DeviceScratch(const DeviceScratch&) = delete;
    DeviceScratch& operator=(const DeviceScratch&) = delete;
};

// Over twice the H200's 50 MB L2: what median_launch_us overwrites before each timed launch.
inline constexpr std::size_t kTuneFlushBytes = std::size_t{128} << 20;

// Tuning (Settings::autotune) while `stream` captures a graph: nothing may be timed (the call runs its default,
// undecided).
bool capturing_and_tuning(cudaStream_t stream);

// Median time of `launch` on `stream` in microseconds: one untimed launch first (it compiles the kernels and warms the
// clocks), then 9 launches, each after `flush` (kTuneFlushBytes) is overwritten so that the operands are not left in
// L2 by the launch before, and after `align` (when given; untimed), as the benchmarks time them. A collective `launch`
// runs in step on every rank: each rank makes the same calls in the same order, and `align` (a device barrier over
// the ranks) starts them together. Synchronises `stream`.
double median_launch_us(const std::function<void()>& launch, cudaStream_t stream, const DeviceScratch& flush,
                        const std::function<void()>& align = {});

}  // namespace loom::detail
