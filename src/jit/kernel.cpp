// Loading (cuLibraryLoadData → cuLibraryGetKernel → cuKernelGetFunction), the in-process kernel cache, and
// launching through cuLaunchKernelEx.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

#include "loom/jit/jit.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/nvshmem.hpp"
#include "loom/runtime/profile.hpp"
#include "loom/runtime/settings.hpp"
#include "runtime/diag_mailbox.hpp"
#include "runtime/profile_ring.hpp"

namespace loom::jit {
namespace {

int device_attr(CUdevice_attribute a, CUdevice dev) {
    int v = 0;
    LOOM_CU(cuDeviceGetAttribute, &v, a, dev);
    return v;
}

// The current context, creating the runtime's primary context for the current device when none is current.
CUcontext current_context() {
    CUcontext ctx = nullptr;
    LOOM_CU(cuCtxGetCurrent, &ctx);
    if (!ctx) {
        int dev = 0;
        LOOM_CHECK_CUDA(cudaGetDevice(&dev));
        LOOM_CHECK_CUDA(cudaSetDevice(dev));  // initialises and binds the primary context (CUDA >= 12)
        LOOM_CU(cuCtxGetCurrent, &ctx);
        LOOM_CHECK(ctx, "no CUDA context is current after cudaSetDevice({})", dev);
    }
    return ctx;
}

// Not cuCtxGetDevice: the driver's entry-point query for that name at CUDA_VERSION 13000 returns
// cuCtxGetDevice_v2 (device, context), whose ABI differs from the one-argument declaration in cuda.h.
CUdevice current_device() {
    current_context();
    int ordinal = 0;
    LOOM_CHECK_CUDA(cudaGetDevice(&ordinal));
    CUdevice d = 0;
    LOOM_CU(cuDeviceGet, &d, ordinal);
    return d;
}

std::string spec_fingerprint(const KernelSpec& s) {
    std::string f = s.header + '\x1f' + s.display() + '\x1f';
    for (const auto& d : s.defines) f += d + '\x1e';
    f += '\x1f';
    for (const auto& d : s.include_dirs) f += d + '\x1e';
    f += fmt::format("\x1f{}{}{}", int(s.needs_nvshmem), int(s.force_nvcc), int(s.remote_peers));
    f += '\x1f';
    f += to_string(settings().jit_compiler);
    return f;
}

struct Registry {
    std::mutex mu;
    // (context, spec fingerprint) → kernel: the fast path for repeated get_kernel calls.
    std::map<std::pair<CUcontext, std::string>, const Kernel*> by_spec;
    // (context, cache key) → kernel: owns the kernels; two specs with one key share the load.
    std::map<std::pair<CUcontext, std::string>, std::unique_ptr<Kernel>> by_key;
};

Registry& registry() {
    static Registry* r = new Registry;  // never destroyed: kernels outlive static destructors
    return *r;
}

}  // namespace

int current_arch() {
    CUdevice d = current_device();
    int major = device_attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d);
    int minor = device_attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d);
    return major * 10 + minor;
}

Kernel::Kernel(CUfunction f, std::string name, CUlibrary library, CompileResult info)
    : function_(f), name_(std::move(name)), library_(library), info_(std::move(info)) {
    // The driver's default MAX_DYNAMIC_SHARED_SIZE_BYTES is 48 KiB less the kernel's static shared memory: a dynamic
    // size above that (even 48 KiB exactly, with static shared memory) needs the attribute raised.
    if (function_ == nullptr) return;
    int dynamic_default = 0;
    LOOM_CU(cuFuncGetAttribute, &dynamic_default, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, function_);
    smem_raised_.store(static_cast<std::size_t>(std::max(dynamic_default, 0)));
}

int Kernel::num_registers() const {
    int v = 0;
    LOOM_CU(cuFuncGetAttribute, &v, CU_FUNC_ATTRIBUTE_NUM_REGS, function_);
    return v;
}

int Kernel::local_bytes() const {
    int v = 0;
    LOOM_CU(cuFuncGetAttribute, &v, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, function_);
    return v;
}

int Kernel::static_smem_bytes() const {
    int v = 0;
    LOOM_CU(cuFuncGetAttribute, &v, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function_);
    return v;
}

void Kernel::raise_dynamic_smem(std::size_t bytes) const {
    if (bytes <= smem_raised_.load()) return;
    LOOM_CU(cuFuncSetAttribute, function_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(bytes));
    smem_raised_.store(bytes);
}

template <class Ask>
int Kernel::occupancy(const std::array<std::size_t, 5>& key, Ask&& ask) const {
    {
        const std::lock_guard<std::mutex> lock(occupancy_mu_);
        if (auto it = occupancy_.find(key); it != occupancy_.end()) return it->second;
    }
    const int n = ask();
    const std::lock_guard<std::mutex> lock(occupancy_mu_);
    occupancy_[key] = n;
    return n;
}

int Kernel::max_blocks_per_sm(int block_threads, std::size_t dynamic_smem) const {
    return occupancy({static_cast<std::size_t>(block_threads), dynamic_smem, 0, 0, 0}, [&] {
        raise_dynamic_smem(dynamic_smem);
        int n = 0;
        LOOM_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor, &n, function_, block_threads, dynamic_smem);
        return n;
    });
}

namespace {

// The driver's launch configuration of cfg with n attributes.
CUlaunchConfig driver_launch_config(const LaunchConfig& cfg, CUlaunchAttribute* attrs, unsigned n) {
    CUlaunchConfig lc{};
    lc.gridDimX = cfg.grid.x;
    lc.gridDimY = cfg.grid.y;
    lc.gridDimZ = cfg.grid.z;
    lc.blockDimX = cfg.block.x;
    lc.blockDimY = cfg.block.y;
    lc.blockDimZ = cfg.block.z;
    lc.sharedMemBytes = static_cast<unsigned>(cfg.smem);
    lc.hStream = reinterpret_cast<CUstream>(cfg.stream);
    lc.attrs = n ? attrs : nullptr;
    lc.numAttrs = n;
    return lc;
}

}  // namespace

int Kernel::max_active_clusters(const LaunchConfig& cfg) const {
    const std::size_t threads = std::size_t(cfg.block.x) * cfg.block.y * cfg.block.z;
    return occupancy({threads, cfg.smem, cfg.cluster.x, cfg.cluster.y, cfg.cluster.z}, [&] {
        raise_dynamic_smem(cfg.smem);
        CUlaunchAttribute attr{};
        attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attr.value.clusterDim.x = cfg.cluster.x;
        attr.value.clusterDim.y = cfg.cluster.y;
        attr.value.clusterDim.z = cfg.cluster.z;
        const CUlaunchConfig lc = driver_launch_config(cfg, &attr, 1);
        int n = 0;
        LOOM_CU(cuOccupancyMaxActiveClusters, &n, function_, &lc);
        return n;
    });
}

bool Kernel::programmatic_supported() const {
    int v = programmatic_.load(std::memory_order_relaxed);
    if (v < 0) {
        v = device_attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, current_device()) >= 9 ? 1 : 0;
        programmatic_.store(v, std::memory_order_relaxed);
    }
    return v == 1;
}

const std::optional<std::vector<std::size_t>>& Kernel::param_sizes() const {
    std::call_once(params_once_, [&] {
        // One index past the last parameter the driver answers CUDA_ERROR_INVALID_VALUE; any other answer, or no end
        // within the 32764 bytes a kernel's parameters fit in: unknown.
        constexpr std::size_t kMaxParams = 32764;
        std::vector<std::size_t> sizes;
        for (std::size_t i = 0; i < kMaxParams; ++i) {
            std::size_t offset = 0, size = 0;
            const CUresult rc = driver::api().cuFuncGetParamInfo(function_, i, &offset, &size);
            if (rc == CUDA_ERROR_INVALID_VALUE) {
                param_sizes_ = std::move(sizes);
                return;
            }
            if (rc != CUDA_SUCCESS) return;
            sizes.push_back(size);
        }
    });
    return param_sizes_;
}

void Kernel::launch_checked(const LaunchConfig& cfg, void** args, const std::size_t* sizes, std::size_t count) const {
    if (const auto& want = param_sizes()) {
        LOOM_CHECK(count == want->size(), "launch {}: expected {} kernel argument{}, given {}", name_, want->size(),
                   want->size() == 1 ? "" : "s", count);
        for (std::size_t i = 0; i < count; ++i)
            LOOM_CHECK(sizes[i] == (*want)[i],
                       "launch {}: argument {}: expected {} bytes (the kernel's parameter), given {}", name_, i,
                       (*want)[i], sizes[i]);
    }
    launch(cfg, args);
}

void Kernel::launch(const LaunchConfig& cfg, void** args) const {
    const unsigned threads = cfg.block.x * cfg.block.y * cfg.block.z;
    LOOM_CHECK(cfg.block.x > 0 && cfg.block.y > 0 && cfg.block.z > 0 && threads <= 1024,
               "launch {}: expected 1..1024 threads per block, given block ({}, {}, {})", name_, cfg.block.x,
               cfg.block.y, cfg.block.z);
    LOOM_CHECK(cfg.grid.x > 0 && cfg.grid.y > 0 && cfg.grid.z > 0 && cfg.grid.y <= 65535 && cfg.grid.z <= 65535,
               "launch {}: expected a grid with x >= 1 and y, z in 1..65535, given ({}, {}, {})", name_, cfg.grid.x,
               cfg.grid.y, cfg.grid.z);
    const unsigned cluster = cfg.cluster.x * cfg.cluster.y * cfg.cluster.z;
    LOOM_CHECK(cluster >= 1 && cfg.grid.x % cfg.cluster.x == 0 && cfg.grid.y % cfg.cluster.y == 0 &&
                   cfg.grid.z % cfg.cluster.z == 0,
               "launch {}: expected grid ({}, {}, {}) divisible by cluster ({}, {}, {})", name_, cfg.grid.x, cfg.grid.y,
               cfg.grid.z, cfg.cluster.x, cfg.cluster.y, cfg.cluster.z);
    LOOM_CHECK(cluster <= 16, "launch {}: expected at most 16 blocks per cluster, given {}", name_, cluster);

    // The dynamic shared memory this kernel may take (opt-in limit minus its static smem): two driver queries,
    // made on the first launch only (a CUfunction lives in one context, so one device). Small collectives are
    // host-bound, so every launch-path query counts.
    long long budget = smem_budget_.load(std::memory_order_relaxed);
    if (budget < 0) {
        const std::size_t optin = device_attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, current_device());
        budget = static_cast<long long>(optin) - static_smem_bytes();
        smem_budget_.store(budget, std::memory_order_relaxed);
    }
    LOOM_CHECK(static_cast<long long>(cfg.smem) <= budget,
               "launch {}: expected static + dynamic shared memory <= the device opt-in limit: at most {} dynamic "
               "bytes besides its {} static, given {}",
               name_, budget, static_smem_bytes(), cfg.smem);
    raise_dynamic_smem(cfg.smem);
    if (cluster > 8) {
        LOOM_CU(cuFuncSetAttribute, function_, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1);
    }
    if (cfg.cooperative) {
        const long long blocks = 1LL * cfg.grid.x * cfg.grid.y * cfg.grid.z;
        const long long resident = 1LL * max_blocks_per_sm(static_cast<int>(threads), cfg.smem) *
                                   device_attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, current_device());
        LOOM_CHECK(blocks <= resident,
                   "launch {}: cooperative launch needs every block resident: expected at most {} blocks, given {}",
                   name_, resident, blocks);
    }

    CUlaunchAttribute attrs[3];
    unsigned n = 0;
    if (cluster > 1) {
        attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attrs[n].value.clusterDim.x = cfg.cluster.x;
        attrs[n].value.clusterDim.y = cfg.cluster.y;
        attrs[n].value.clusterDim.z = cfg.cluster.z;
        ++n;
    }
    if (cfg.cooperative) {
        attrs[n].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        attrs[n].value.cooperative = 1;
        ++n;
    }
    if (cfg.programmatic && programmatic_supported()) {
        attrs[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attrs[n].value.programmaticStreamSerializationAllowed = 1;
        ++n;
    }
    const CUlaunchConfig lc = driver_launch_config(cfg, attrs, n);
    // A failed launch names the kernel (under CUDA_LAUNCH_BLOCKING=1 the error is the launched kernel's own).
    if (const int rc = static_cast<int>(driver::api().cuLaunchKernelEx(&lc, function_, args, nullptr)); rc != 0)
        detail::throw_cu(rc, fmt::format("cuLaunchKernelEx({})", name_).c_str(), __FILE__, __LINE__);
}

namespace {
const Kernel& get_kernel_as_given(const KernelSpec& spec);
}  // namespace

// While the profiler is on, the profiled instantiation: LOOM_PROFILE=1 (lang/profile.cuh) is one more define, so it is
// part of the fingerprint and the cache key, and the unprofiled kernel stays as it is.
const Kernel& get_kernel(const KernelSpec& spec) {
    if (!profile::enabled()) return get_kernel_as_given(spec);
    KernelSpec profiled = spec;
    profiled.defines.push_back("LOOM_PROFILE=1");
    return get_kernel_as_given(profiled);
}

namespace {
const Kernel& get_kernel_as_given(const KernelSpec& spec) {
    LOOM_CHECK(!spec.name.empty(), "get_kernel: expected a kernel name, given a header-only spec ({})", spec.header);
    CUcontext ctx = current_context();
    Registry& reg = registry();
    const std::string fp = spec_fingerprint(spec);
    {
        std::lock_guard lock(reg.mu);
        if (auto it = reg.by_spec.find({ctx, fp}); it != reg.by_spec.end()) return *it->second;
    }
    const CUdevice dev = current_device();
    const int arch = device_attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) * 10 +
                     device_attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    CompileResult r = compile(spec, arch);  // outside the lock: other kernels may load meanwhile

    std::lock_guard lock(reg.mu);
    auto& slot = reg.by_key[{ctx, r.cache_key}];
    if (!slot) {
        CUlibrary lib = nullptr;
        LOOM_CU(cuLibraryLoadData, &lib, r.cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
        CUkernel k = nullptr;
        CUfunction f = nullptr;
        try {
            LOOM_CU(cuLibraryGetKernel, &k, lib, r.lowered_name.c_str());
            LOOM_CU(cuKernelGetFunction, &f, k);
            diag::bind_library(lib);  // timed-out waits without a Ctx report through the module's mailbox global
            profile::detail::bind_library(lib);  // a profiled kernel records into this GPU's ring
            if (spec.needs_nvshmem) {
                LOOM_CHECK(nvshmem::initialized(),
                           "kernel {} needs NVSHMEM: call loom::nvshmem::init(world) before get_kernel",
                           spec.display());
                nvshmem::init_library(lib);
            } else if (spec.remote_peers && nvshmem::initialized()) {
                // A World of several nodes initialised NVSHMEM. In a one-node World every peer is load/store
                // reachable, so the kernel never calls into NVSHMEM and its device state may stay unset.
                nvshmem::init_library(lib);
            }
        } catch (...) {
            driver::api().cuLibraryUnload(lib);
            throw;
        }
        r.cubin.clear();
        r.cubin.shrink_to_fit();
        slot = std::make_unique<Kernel>(f, spec.display(), lib, std::move(r));
    }
    reg.by_spec[{ctx, fp}] = slot.get();
    return *slot;
}
}  // namespace

}  // namespace loom::jit
