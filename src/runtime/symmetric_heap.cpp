#include "loom/runtime/symmetric_heap.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>

#include "loom/config.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "runtime/fd_passing.hpp"
#include "runtime/log.hpp"

namespace loom {
namespace {

// What each rank tells the others before anything is allocated.
struct Announce {
    std::uint64_t requested;
    std::uint64_t granularity;
    std::int32_t node;
    std::int32_t local_rank;
    char uuid[16];  // the rank's physical GPU, to find it among this process's visible devices
};

template <class T>
Bytes to_bytes(const T& v) {
    Bytes b(sizeof(T));
    std::memcpy(b.data(), &v, sizeof(T));
    return b;
}

template <class T>
T from_bytes(const Bytes& b, const char* what) {
    LOOM_CHECK(b.size() == sizeof(T), "{}: expected {} bytes from a peer, given {}", what, sizeof(T), b.size());
    T v;
    std::memcpy(&v, b.data(), sizeof(T));
    return v;
}

// Visible ordinal of the device with this UUID, or -1.
int find_device(const char (&uuid)[16]) {
    int count = 0;
    LOOM_CHECK_CUDA(cudaGetDeviceCount(&count));
    for (int d = 0; d < count; ++d) {
        cudaDeviceProp p{};
        LOOM_CHECK_CUDA(cudaGetDeviceProperties(&p, d));
        if (std::memcmp(p.uuid.bytes, uuid, 16) == 0) return d;
    }
    return -1;
}

// Cleanup never throws: a failing release is reported and the rest still released.
void warn_cu(CUresult r, const char* what) {
    if (r == CUDA_SUCCESS) return;
    const char* name = nullptr;
    if (driver::available()) driver::api().cuGetErrorName(r, &name);
    log(LogLevel::Warn, "warning: {} failed during symmetric heap teardown ({})", what, name ? name : "unknown error");
}

}  // namespace

struct SymmetricHeap::Impl {
    std::size_t size = 0;
    std::size_t granularity = 0;
    int local_rank = 0;
    int local_world = 1;
    int device = -1;
    std::vector<int> access_devices;
    CUdeviceptr va = 0;                                 // reserved range: local_world * size bytes
    std::vector<CUmemGenericAllocationHandle> handles;  // index = local peer; 0 = not (yet) held
    std::vector<bool> mapped;

    ~Impl() {
        if (!driver::available()) return;
        const auto& cu = driver::api();
        if (device >= 0) {
            cudaSetDevice(device);
            if (cudaDeviceSynchronize() != cudaSuccess) {
                cudaGetLastError();
                log(LogLevel::Warn, "warning: device {} reported an error before the heap was released", device);
            }
        }
        for (std::size_t i = 0; i < mapped.size(); ++i)
            if (mapped[i]) warn_cu(cu.cuMemUnmap(va + i * size, size), "cuMemUnmap");
        if (va) warn_cu(cu.cuMemAddressFree(va, size * static_cast<std::size_t>(local_world)), "cuMemAddressFree");
        for (auto h : handles)
            if (h) warn_cu(cu.cuMemRelease(h), "cuMemRelease");
    }
};

SymmetricHeap::SymmetricHeap(Store& store, const RankInfo& info, int device, std::size_t bytes)
    : impl_(std::make_unique<Impl>()) {
    if (!driver::available()) LOOM_FAIL("no GPU: {}", driver::unavailable_reason());
    LOOM_CHECK(bytes > 0, "symmetric heap: expected a positive size (LOOM_SYMMETRIC_SIZE), given 0");
    LOOM_CHECK(info.local_world_size >= 1 && info.local_world_size <= kMaxLocalPeers,
               "symmetric heap: expected at most {} ranks per node (kMaxLocalPeers), given {}", kMaxLocalPeers,
               info.local_world_size);
    Impl& h = *impl_;
    h.local_rank = info.local_rank;
    h.local_world = info.local_world_size;
    LOOM_CHECK_CUDA(cudaSetDevice(device));
    LOOM_CHECK_CUDA(cudaFree(nullptr));  // make the primary context current
    h.device = device;
    CUdevice cu_device;
    LOOM_CU(cuDeviceGet, &cu_device, device);

    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = cu_device;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    std::size_t gran = 0;
    LOOM_CU(cuMemGetAllocationGranularity, &gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);

    // Every rank must agree on the size (Ctx.heap_size is one number) and on the rounding.
    Announce mine{};
    mine.requested = bytes;
    mine.granularity = gran;
    mine.node = info.node;
    mine.local_rank = info.local_rank;
    cudaDeviceProp props{};
    LOOM_CHECK_CUDA(cudaGetDeviceProperties(&props, device));
    std::memcpy(mine.uuid, props.uuid.bytes, 16);
    std::vector<Announce> all;
    for (const auto& b : store.all_gather("loom/heap/announce", to_bytes(mine)))
        all.push_back(from_bytes<Announce>(b, "symmetric heap"));
    std::string sizes;
    bool same = true;
    for (std::size_t r = 0; r < all.size(); ++r) {
        same = same && all[r].requested == all[0].requested;
        gran = std::max<std::size_t>(gran, all[r].granularity);
        sizes += fmt::format("{}rank {} asked {} bytes", r ? ", " : "", r, all[r].requested);
    }
    LOOM_CHECK(same, "symmetric heap: every rank must ask the same size (LOOM_SYMMETRIC_SIZE), given: {}", sizes);
    h.granularity = gran;
    h.size = (bytes + gran - 1) / gran * gran;

    // The physical memory of this rank, exported as a file descriptor.
    h.handles.assign(h.local_world, 0);
    h.mapped.assign(h.local_world, false);
    try {
        LOOM_CU(cuMemCreate, &h.handles[h.local_rank], h.size, &prop, 0);
    } catch (const Error& e) {
        LOOM_FAIL("symmetric heap: cannot allocate {} bytes on device {} ({}); lower LOOM_SYMMETRIC_SIZE", h.size,
                  device, e.detail());
    }
    int exported = -1;
    LOOM_CU(cuMemExportToShareableHandle, &exported, h.handles[h.local_rank], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0);
    detail::UniqueFd my_fd(exported);

    // Socket names unique per job: rank 0 publishes a fresh nonce.
    if (info.rank == 0) {
        std::random_device rd;
        std::uint64_t nonce = (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^ static_cast<std::uint64_t>(::getpid()) ^
                              static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
        store.set("loom/heap/nonce", fmt::format("{:016x}", nonce));
    }
    const std::string prefix = fmt::format("loom-{}-n{}", store.get_string("loom/heap/nonce"), info.node);
    auto fds = detail::exchange_fds(
        prefix, h.local_rank, h.local_world, my_fd.get(), [&] { store.barrier("loom/heap/listening"); },
        store.timeout());
    my_fd.reset();
    for (int p = 0; p < h.local_world; ++p) {
        if (p == h.local_rank) continue;
        LOOM_CU(cuMemImportFromShareableHandle, &h.handles[p],
                reinterpret_cast<void*>(static_cast<std::intptr_t>(fds[p].get())),
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        fds[p].reset();  // the handle keeps the memory; the descriptor is no longer needed
    }

    // One range for the node: heap p at va + p * size.
    LOOM_CU(cuMemAddressReserve, &h.va, h.size * static_cast<std::size_t>(h.local_world), h.granularity, 0, 0);
    for (int p = 0; p < h.local_world; ++p) {
        LOOM_CU(cuMemMap, h.va + static_cast<std::size_t>(p) * h.size, h.size, 0, h.handles[p], 0);
        h.mapped[p] = true;
    }

    // Access for every device of the node's ranks that this process sees (its own first). Memory on another
    // GPU is reachable only over P2P: say so plainly instead of letting cuMemSetAccess fail obscurely.
    std::vector<int> physical(h.local_world, -1);  // visible ordinal of local peer p's GPU, or -1
    for (const auto& a : all) {
        if (a.node != info.node) continue;
        LOOM_CHECK(a.local_rank >= 0 && a.local_rank < h.local_world,
                   "symmetric heap: expected local ranks in [0, {}), given {}", h.local_world, a.local_rank);
        physical[a.local_rank] = find_device(a.uuid);
    }
    h.access_devices = {device};
    for (int d : physical)
        if (d >= 0 && std::find(h.access_devices.begin(), h.access_devices.end(), d) == h.access_devices.end())
            h.access_devices.push_back(d);
    for (int p = 0; p < h.local_world; ++p) {
        for (int a : h.access_devices) {
            if (physical[p] < 0 || physical[p] == a) continue;
            int can = 0;
            LOOM_CHECK_CUDA(cudaDeviceCanAccessPeer(&can, a, physical[p]));
            LOOM_CHECK(can, "symmetric heap: local rank {}'s heap is on GPU {}, which GPU {} cannot reach over P2P", p,
                       physical[p], a);
        }
    }
    std::vector<CUmemAccessDesc> access;
    for (int d : h.access_devices) {
        CUmemAccessDesc desc{};
        desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        CUdevice cd;
        LOOM_CU(cuDeviceGet, &cd, d);
        desc.location.id = cd;
        desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        access.push_back(desc);
    }
    for (int p = 0; p < h.local_world; ++p)
        LOOM_CU(cuMemSetAccess, h.va + static_cast<std::size_t>(p) * h.size, h.size, access.data(), access.size());

    // Signals start at 0: zero our own heap, then make sure nobody writes into it before that is done.
    LOOM_CHECK_CUDA(cudaMemset(local_base(), 0, h.size));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    store.barrier("loom/heap/ready");
}

SymmetricHeap::~SymmetricHeap() = default;

std::size_t SymmetricHeap::size() const { return impl_->size; }
std::size_t SymmetricHeap::granularity() const { return impl_->granularity; }
int SymmetricHeap::local_rank() const { return impl_->local_rank; }
int SymmetricHeap::local_world_size() const { return impl_->local_world; }
int SymmetricHeap::device() const { return impl_->device; }
const std::vector<int>& SymmetricHeap::access_devices() const { return impl_->access_devices; }

char* SymmetricHeap::base(int local_peer) const {
    LOOM_CHECK(local_peer >= 0 && local_peer < impl_->local_world,
               "symmetric heap: expected a local peer in [0, {}), given {}", impl_->local_world, local_peer);
    return reinterpret_cast<char*>(impl_->va + static_cast<std::size_t>(local_peer) * impl_->size);
}

}  // namespace loom
