#include "ops/overlap/common/state.hpp"

#include <algorithm>
#include <string>

#include "loom/ops/collectives.hpp"
#include "loom/runtime/device_memory.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "ops/collectives/coll_choice.hpp"

namespace loom::overlap {

DeviceFacts::DeviceFacts(World& world) : device(world.device()) {
    int major = 0, minor = 0;
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&device_sms, cudaDevAttrMultiProcessorCount, device));
    arch = major * 10 + minor;
    const CollTopology topo = collective_topology(world);
    shared_gpu = topo.shared_gpu;
    ranks_per_gpu = topo.ranks_per_gpu;
    // Ranks sharing the GPU without an MPS share each (torchrun, mpirun): every rank plans on its part of the SMs, so
    // that the ranks' persistent GEMMs and communication blocks, which wait for each other, are resident at once.
    if (shared_gpu) device_sms = shared_gpu_sm_budget(device_sms, topo.ranks_per_gpu, settings().mps_thread_percentage);
}

void check_state_outside_capture(const char* op, bool captured) {
    LOOM_CHECK(!captured,
               "{}: a CUDA graph capture needs the op's state: call {} once outside the capture with the same shape "
               "and options first (creating it synchronises the device, which a capture forbids)",
               op, op);
}

const DeviceFacts& device_facts(World& world, const char* op, bool captured) {
    LOOM_CHECK(world.local_world_size() <= kMaxLocalPeers, "{}: expected at most {} ranks per node, given {}", op,
               kMaxLocalPeers, world.local_world_size());
    const DeviceFacts& d = op_state<DeviceFacts>(world, op, captured);
    LOOM_CHECK(d.arch >= 90,
               "{}: expected a GPU of compute capability >= 9.0 (Hopper GEMM with overlap hooks), "
               "given {}.{}",
               op, d.arch / 10, d.arch % 10);
    return d;
}

int plan_sms(const DeviceFacts& dev, int requested, const char* op) {
    // Under MPS the attribute reports this client's share of the SMs; the GEMM grids and comm-block counts are
    // planned on it (docs/overlap.md "Deadlock freedom").
    const int sms = overlap_usable_sms(dev.device_sms, requested);
    LOOM_CHECK(sms >= 2,
               "{}: expected at least 2 usable SMs (one for the GEMM, one for the communication blocks), given {} "
               "(device {} SMs; CUDA_MPS_ACTIVE_THREAD_PERCENTAGE / the options' num_sms)",
               op, sms, dev.device_sms);
    return sms;
}

void SymmetricBuffer::release(World& world) {
    if (p) world.free(p);
    p = nullptr;
    bytes = 0;
}

LocalBuffer::~LocalBuffer() {
    if (!p) return;
    forget_device_memory(p);  // may have been an op's buffer: its range leaves the op checks' cache
    cudaFree(p);
}

SideStream::SideStream() {
    LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    LOOM_CHECK_CUDA(cudaEventCreateWithFlags(&forked, cudaEventDisableTiming));
    LOOM_CHECK_CUDA(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming));
}

SideStream::~SideStream() {
    if (stream) cudaStreamDestroy(stream);
    if (forked) cudaEventDestroy(forked);
    if (joined) cudaEventDestroy(joined);
}

void* ensure_symmetric(World& world, SymmetricBuffer& buf, std::size_t bytes, bool captured) {
    if (bytes <= buf.bytes) return buf.p;
    LOOM_CHECK(!captured,
               "overlap: a CUDA graph capture needs the op's buffer of {} bytes (it has {}): call the op once outside "
               "the capture with the same shape and options first (growing it synchronises the device)",
               bytes, buf.bytes);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    world.barrier("loom/overlap/grow");  // every rank's device is done with the old buffer
    buf.release(world);
    buf.p = world.alloc_bytes(bytes, 1024);
    buf.bytes = bytes;
    return buf.p;
}

std::size_t ensure_parity_halves(World& world, SymmetricBuffer& buf, std::size_t half_bytes, bool captured) {
    half_bytes = (half_bytes + 1023) / 1024 * 1024;
    ensure_symmetric(world, buf, 2 * half_bytes, captured);
    const std::size_t stride = buf.bytes / 2 / 1024 * 1024;
    LOOM_CHECK(stride >= half_bytes, "overlap: internal: parity half {} B < {} B", stride, half_bytes);
    return stride;
}

void* ensure_local(LocalBuffer& buf, std::size_t bytes) {
    if (bytes <= buf.bytes) return buf.p;
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    if (buf.p) {
        forget_device_memory(buf.p);
        LOOM_CHECK_CUDA(cudaFree(buf.p));
    }
    buf.p = nullptr;
    buf.bytes = 0;
    LOOM_CHECK_CUDA(cudaMalloc(&buf.p, bytes));
    buf.bytes = bytes;
    return buf.p;
}

void fork(SideStream& side, cudaStream_t stream) {
    LOOM_CHECK_CUDA(cudaEventRecord(side.forked, stream));
    LOOM_CHECK_CUDA(cudaStreamWaitEvent(side.stream, side.forked, 0));
}

void join(SideStream& side, cudaStream_t stream) {
    LOOM_CHECK_CUDA(cudaEventRecord(side.joined, side.stream));
    LOOM_CHECK_CUDA(cudaStreamWaitEvent(stream, side.joined, 0));
}

}  // namespace loom::overlap

// Declared in loom/ops/overlap.hpp (namespace loom).
void loom::release_overlap_state(World& world) { world.release_states("overlap/"); }

int loom::overlap_usable_sms(int device_sms, int requested) {
    LOOM_CHECK(device_sms >= 1, "overlap_usable_sms: expected the device's SM count >= 1, given {}", device_sms);
    LOOM_CHECK(requested >= 0, "num_sms: expected a number of SMs >= 0 (0: the device's), given {}", requested);
    if (requested > 0) return std::min(requested, device_sms);
    // Under MPS the attribute already reports the client's share (14 SMs at CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=12 on the
    // H200), so it is used as is.
    return device_sms;
}
