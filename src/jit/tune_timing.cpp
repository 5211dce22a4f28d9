#include "jit/tune_timing.hpp"

#include <algorithm>
#include <vector>

#include "loom/runtime/device_memory.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "loom/runtime/stream_ops.hpp"

namespace loom::detail {

DeviceScratch::DeviceScratch(std::size_t bytes) { LOOM_CHECK_CUDA(cudaMalloc(&p, std::max<std::size_t>(bytes, 16))); }

DeviceScratch::~DeviceScratch() {
    forget_device_memory(p);  // it was an op's output while timing: its range leaves the op checks' cache
    cudaFree(p);
}

bool capturing_and_tuning(cudaStream_t stream) { return settings().autotune && stream_ops::capturing(stream); }

double median_launch_us(const std::function<void()>& launch, cudaStream_t stream, const DeviceScratch& flush,
                        const std::function<void()>& align) {
    constexpr int kReps = 9;
    launch();
    LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
    cudaEvent_t ev[2 * kReps];
    for (auto& e : ev) LOOM_CHECK_CUDA(cudaEventCreate(&e));
    std::vector<float> ms(kReps);
    try {
        for (int r = 0; r < kReps; ++r) {
            LOOM_CHECK_CUDA(cudaMemsetAsync(flush.p, r, kTuneFlushBytes, stream));
            if (align) align();
            LOOM_CHECK_CUDA(cudaEventRecord(ev[2 * r], stream));
            launch();
            LOOM_CHECK_CUDA(cudaEventRecord(ev[2 * r + 1], stream));
        }
        LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
        for (int r = 0; r < kReps; ++r) LOOM_CHECK_CUDA(cudaEventElapsedTime(&ms[r], ev[2 * r], ev[2 * r + 1]));
    } catch (...) {
        for (auto& e : ev) cudaEventDestroy(e);
        throw;
    }
    for (auto& e : ev) cudaEventDestroy(e);
    std::nth_element(ms.begin(), ms.begin() + kReps / 2, ms.end());
    return 1000.0 * ms[kReps / 2];
}

}  // namespace loom::detail
