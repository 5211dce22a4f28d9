// The profiler's ring per process and GPU, module binding, and the clock ping (profile_ring.hpp).
#include "runtime/profile_ring.hpp"

#include <cuda_runtime_api.h>

#include <chrono>
#include <map>
#include <mutex>

#include "loom/jit/jit.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "runtime/log.hpp"

namespace loom::profile::detail {
namespace {

struct Rings {
    std::mutex mu;
    std::map<int, lang::ProfileRing*> by_device;  // never freed: a kernel of a finished World may still record
};
Rings& rings() {
    static Rings* r = new Rings;
    return *r;
}

int current_device() {
    int d = 0;
    LOOM_CHECK_CUDA(cudaGetDevice(&d));
    return d;
}

lang::ProfileRing* ring_locked(Rings& rs, bool create) {
    const int dev = current_device();
    if (auto it = rs.by_device.find(dev); it != rs.by_device.end()) return it->second;
    if (!create) return nullptr;
    void* p = nullptr;
    const std::size_t bytes = sizeof(lang::ProfileRing) + std::size_t{kRingRecords} * sizeof(lang::ProfileEvent);
    LOOM_CHECK_CUDA(cudaMalloc(&p, bytes));
    lang::ProfileRing header{};
    header.capacity = kRingRecords;
    LOOM_CHECK_CUDA(cudaMemcpy(p, &header, sizeof header, cudaMemcpyHostToDevice));
    auto* ring = static_cast<lang::ProfileRing*>(p);
    rs.by_device[dev] = ring;
    return ring;
}

// One host-to-device copy on a private non-blocking stream (it never waits for the legacy stream's kernels).
void write_global(CUdeviceptr global, const void* value, std::size_t bytes) {
    cudaStream_t s = nullptr;
    LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaError_t e = cudaMemcpyAsync(reinterpret_cast<void*>(global), value, bytes, cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    LOOM_CHECK_CUDA(e);
}

int64_t host_now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace

void bind_library(CUlibrary library) {
    CUdeviceptr global = 0;
    std::size_t bytes = 0;
    const CUresult r = driver::api().cuLibraryGetGlobal(&global, &bytes, library, "loom_profile_ring");
    if (r == CUDA_ERROR_NOT_FOUND) return;  // not a profiled kernel
    LOOM_CHECK_CU(r);
    LOOM_CHECK(bytes == sizeof(lang::ProfileRing*), "loom_profile_ring: expected a pointer ({} bytes), given {} bytes",
               sizeof(lang::ProfileRing*), bytes);
    Rings& rs = rings();
    std::lock_guard lock(rs.mu);
    lang::ProfileRing* ring = ring_locked(rs, true);
    write_global(global, &ring, sizeof ring);
}

RankRecords take_records(int rank) {
    RankRecords out;
    out.rank = rank;
    Rings& rs = rings();
    std::lock_guard lock(rs.mu);
    lang::ProfileRing* ring = ring_locked(rs, false);
    if (!ring) return out;
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    lang::ProfileRing header{};
    LOOM_CHECK_CUDA(cudaMemcpy(&header, ring, sizeof header, cudaMemcpyDeviceToHost));
    const uint64_t n = header.count < header.capacity ? header.count : header.capacity;
    out.dropped = header.count - n;
    out.events.resize(n);
    if (n)
        LOOM_CHECK_CUDA(
            cudaMemcpy(out.events.data(), ring + 1, n * sizeof(lang::ProfileEvent), cudaMemcpyDeviceToHost));
    LOOM_CHECK_CUDA(cudaMemset(&ring->count, 0, sizeof ring->count));
    return out;
}

ClockReading read_clock() {
    constexpr int kPings = 16;
    constexpr int64_t kTimeoutNs = 2'000'000'000;  // per ping, on either side
    jit::KernelSpec spec;
    spec.header = "loom/kernels/profile/clock_ping.cuh";
    spec.name = "loom::kernels::profile::clock_ping";
    const jit::Kernel& ping = jit::get_kernel(spec);

    struct Shared {
        uint32_t flag;
        uint32_t pad;
        uint64_t reply[kPings];
    };
    Shared* host = nullptr;
    LOOM_CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&host), sizeof(Shared), cudaHostAllocMapped));
    ClockReading best{0, 0, INT64_MAX};
    cudaStream_t stream = nullptr;
    try {
        *host = Shared{};
        Shared* dev = nullptr;
        LOOM_CHECK_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), host, 0));
        LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        jit::LaunchConfig lc;
        lc.grid = dim3(1);
        lc.block = dim3(32);
        lc.stream = stream;
        const volatile uint32_t* flag = &dev->flag;
        volatile uint64_t* reply = dev->reply;
        ping(lc, flag, reply, kPings, static_cast<uint64_t>(kTimeoutNs));
        volatile Shared* h = host;
        for (int i = 0; i < kPings; ++i) {
            const int64_t t0 = host_now_ns();
            h->flag = static_cast<uint32_t>(i + 1);
            int64_t t1 = t0;
            while (h->reply[i] == 0) {
                t1 = host_now_ns();
                LOOM_CHECK(t1 - t0 < kTimeoutNs, "profile clock: the GPU did not answer ping {} within {} ms", i,
                           kTimeoutNs / 1'000'000);
            }
            t1 = host_now_ns();
            const int64_t half = (t1 - t0) / 2;
            if (half < best.half_window_ns) best = {t0 + half, static_cast<int64_t>(h->reply[i]), half};
        }
        LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
    } catch (...) {
        if (stream) cudaStreamDestroy(stream);
        cudaFreeHost(host);
        throw;
    }
    cudaStreamDestroy(stream);
    cudaFreeHost(host);
    return best;
}

}  // namespace loom::profile::detail

namespace loom::profile::detail {

RingCounts peek_counts() {
    Rings& rs = rings();
    std::lock_guard lock(rs.mu);
    lang::ProfileRing* ring = ring_locked(rs, false);
    if (!ring) return {};
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    lang::ProfileRing header{};
    LOOM_CHECK_CUDA(cudaMemcpy(&header, ring, sizeof header, cudaMemcpyDeviceToHost));
    const uint64_t n = header.count < header.capacity ? header.count : header.capacity;
    return {n, header.count - n};
}

}  // namespace loom::profile::detail
