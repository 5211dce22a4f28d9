#include "loom/runtime/stream_ops.hpp"

#include <chrono>
#include <thread>

#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "loom/runtime/world.hpp"

namespace loom::stream_ops {
namespace {

CUdeviceptr devptr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

void* checked_peer_ptr(World& world, const void* p, std::size_t bytes, int peer, const char* what) {
    LOOM_CHECK(peer >= 0 && peer < world.world_size(), "{}: expected a peer rank in [0, {}), given {}", what,
               world.world_size(), peer);
    LOOM_CHECK(world.is_symmetric(p, bytes), "{}: expected a symmetric range of {} bytes, given {} ({} bytes)", what,
               bytes, p, bytes);
    return world.peer_ptr(p, peer);  // raises for a peer that is not load/store reachable
}

}  // namespace

void put_ce(World& world, void* dst, const void* src, std::size_t bytes, int peer, cudaStream_t stream) {
    if (bytes == 0) return;
    void* remote = checked_peer_ptr(world, dst, bytes, peer, "put_ce");
    LOOM_CHECK_CUDA(cudaMemcpyAsync(remote, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

void write_value(cudaStream_t stream, std::uint64_t* addr, std::uint64_t value) {
    LOOM_CHECK(addr && reinterpret_cast<std::uintptr_t>(addr) % 8 == 0,
               "write_value: expected an 8-byte aligned device address, given {}", static_cast<void*>(addr));
    LOOM_CU(cuStreamWriteValue64, stream, devptr(addr), value, CU_STREAM_WRITE_VALUE_DEFAULT);
}

void wait_value(cudaStream_t stream, const std::uint64_t* addr, std::uint64_t value, WaitCmp cmp) {
    LOOM_CHECK(addr && reinterpret_cast<std::uintptr_t>(addr) % 8 == 0,
               "wait_value: expected an 8-byte aligned device address, given {}", static_cast<const void*>(addr));
    const unsigned flags = (cmp == WaitCmp::GEQ ? CU_STREAM_WAIT_VALUE_GEQ : CU_STREAM_WAIT_VALUE_EQ);
    LOOM_CU(cuStreamWaitValue64, stream, devptr(addr), value, flags);
}

void signal_ce(World& world, std::uint64_t* sig, std::uint64_t value, int peer, cudaStream_t stream) {
    auto* remote = static_cast<std::uint64_t*>(checked_peer_ptr(world, sig, sizeof(std::uint64_t), peer, "signal_ce"));
    write_value(stream, remote, value);
}

void put_signal_ce(World& world, void* dst, const void* src, std::size_t bytes, std::uint64_t* sig, std::uint64_t value,
                   int peer, cudaStream_t stream) {
    put_ce(world, dst, src, bytes, peer, stream);
    signal_ce(world, sig, value, peer, stream);
}

bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    LOOM_CHECK_CUDA(cudaStreamIsCapturing(stream, &status));
    return status != cudaStreamCaptureStatusNone;
}

void wait_stream_bounded(cudaStream_t stream, const char* what) {
    const auto timeout = settings().wait_timeout;
    if (timeout.count() <= 0) {
        LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
        return;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        const cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) LOOM_CHECK_CUDA(e);
        LOOM_CHECK(std::chrono::steady_clock::now() < deadline,
                   "{}: expected the stream to drain within LOOM_WAIT_TIMEOUT_MS = {} ms, given a stream still "
                   "waiting (a signal that never came?)",
                   what, timeout.count());
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

}  // namespace loom::stream_ops
