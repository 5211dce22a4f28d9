// The profiler's clock reading (host side: src/runtime/profile_clock.cpp). One thread answers `samples` pings: for
// ping i it waits until the host sets flag = i + 1 (host-mapped memory), then writes its %globaltimer into reply[i].
// The host brackets each ping with its monotonic clock; the tightest bracket pairs the two clocks. Every wait is
// bounded by timeout_ns of the GPU's clock (a host that stopped answering leaves reply[i] at 0).
#pragma once

#include "loom/config.hpp"
#include "loom/ptx/special.cuh"

namespace loom::kernels::profile {

__global__ void __launch_bounds__(32)
    clock_ping(const volatile uint32_t* flag, volatile uint64_t* reply, int samples, uint64_t timeout_ns) {
    if (threadIdx.x != 0) return;
    const uint64_t start = ptx::globaltimer();
    for (int i = 0; i < samples; ++i) {
        while (*flag < static_cast<uint32_t>(i + 1))
            if (ptx::globaltimer() - start > timeout_ns) return;
        reply[i] = ptx::globaltimer();
        __threadfence_system();
    }
}

}  // namespace loom::kernels::profile
