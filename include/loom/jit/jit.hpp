// Loom's runtime compiler: compile a kernel template instantiation at run time, cache it, load it, launch it.
//
// A KernelSpec names a header (one of Loom's, embedded in the library, or a user's own file) and one
// kernel template instantiation with literal arguments. compile() needs no GPU; get_kernel() compiles or
// fetches from the cache and loads the cubin for the current device.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace loom::jit {

struct KernelSpec {
    // Header to #include: a Loom header ("loom/kernels/gemm/gemm.cuh") or a path to a user's file.
    std::string header;
    // Kernel template (qualified) and its literal template arguments: {"loom::kernels::gemm", {"128", "4"}}.
    // With no template_args the kernel is a plain __global__ function.
    std::string name;
    std::vector<std::string> template_args;
    std::vector<std::string> defines;       // "NAME" or "NAME=VALUE"
    std::vector<std::string> include_dirs;  // extra -I for user kernels
    bool needs_nvshmem = false;             // compile relocatable and link libnvshmem_device (nvcc path)
    // The kernel may reach peers on other nodes (docs/language.md, "Remote peers"): compiled with
    // LOOM_REMOTE_PEERS=1, so that put / get / put_signal / signal_op / notify / barrier_all / fence / quiet send
    // such peers through NVSHMEM's device calls. Implies needs_nvshmem. Without it a kernel that names a peer on
    // another node traps with a diagnostic naming the peer and its node.
    bool remote_peers = false;
    bool force_nvcc = false;  // skip NVRTC (also LOOM_JIT_COMPILER=nvcc)

    std::string display() const;  // "loom::kernels::gemm<128, 4>"
};

// Architecture as a compute capability times ten (90 → sm_90a, 89 → sm_89, 80 → sm_80).
int current_arch();

struct CompileResult {
    std::vector<char> cubin;
    std::string lowered_name;  // mangled name of the instantiation in the cubin
    std::string cache_key;
    std::string compiler;         // "nvrtc" or "nvcc"
    std::string log;              // compiler output (warnings); errors raise instead
    std::string resource_report;  // registers, smem, stack, spills (from the cubin's attributes / ptxas -v)
    bool from_cache = false;
    double seconds = 0;  // compile (or cache read) time
    // From `ptxas -v` for the entry (-1 when the assembler did not report it).
    int registers = -1;     // per thread
    int spill_bytes = -1;   // spill stores + spill loads per thread
    int stack_bytes = -1;   // stack frame per thread
    int smem_bytes = -1;    // static shared memory per block
    std::string tu_path;    // the generated translation unit, kept beside the cubin in the cache
    std::string cache_dir;  // the cache entry's directory
};

// Compile (or read from the disk cache). Needs no GPU. Thread- and process-safe: concurrent compiles of one
// key leave one valid cache entry. Raises loom::Error with the kernel name, template
// arguments, the generated TU's path and the compiler log when compilation fails.
CompileResult compile(const KernelSpec& spec, int arch);

struct LaunchConfig {
    dim3 grid{1, 1, 1};
    dim3 block{1, 1, 1};
    std::size_t smem = 0;  // dynamic shared memory; the kernel's limit is raised when above 48 KiB
    dim3 cluster{1, 1, 1};
    cudaStream_t stream = nullptr;
    bool cooperative = false;  // all blocks co-resident (grid barriers)
    // Programmatic stream serialization (PDL, sm_90+; ignored on older devices): the launch may begin while the
    // stream's previous kernel finishes, hiding most of the launch latency of back-to-back small kernels. The kernel
    // must call ptx::griddep_wait() before touching memory the previous kernel may use.
    bool programmatic = false;
};

class Kernel {
  public:
    CUfunction function() const { return function_; }
    const std::string& name() const { return name_; }
    int num_registers() const;
    int local_bytes() const;  // stack/local memory per thread (spills show here)
    int static_smem_bytes() const;
    // Occupancy on this context's SMs (its MPS share, fixed for the process), asked of the driver once per shape:
    // blocks of block_threads / dynamic_smem one SM holds at once, and clusters of cfg.cluster (of cfg.block /
    // cfg.smem CTAs) resident at once (0 where one does not fit).
    int max_blocks_per_sm(int block_threads, std::size_t dynamic_smem) const;
    int max_active_clusters(const LaunchConfig& cfg) const;

    void launch(const LaunchConfig& cfg, void** args) const;
    // launch() of `count` arguments of sizes[i] bytes each, raising unless the kernel takes that many parameters of
    // those sizes (the driver would read each parameter's size from wherever args[i] points).
    void launch_checked(const LaunchConfig& cfg, void** args, const std::size_t* sizes, std::size_t count) const;
    // The kernel's parameters' sizes in bytes, in order (asked of the driver once); nullopt where the driver cannot
    // tell.
    const std::optional<std::vector<std::size_t>>& param_sizes() const;
    template <class... Args>
    void operator()(const LaunchConfig& cfg, const Args&... args) const {
        void* ptrs[] = {const_cast<void*>(static_cast<const void*>(&args))..., nullptr};
        launch(cfg, ptrs);
    }

    Kernel(CUfunction f, std::string name) : function_(f), name_(std::move(name)) {}
    // A kernel loaded by get_kernel: `library` owns the code (never unloaded), `info` is its compile record.
    Kernel(CUfunction f, std::string name, CUlibrary library, CompileResult info);
    Kernel(const Kernel&) = delete;
    Kernel& operator=(const Kernel&) = delete;

    CUlibrary library() const { return library_; }
    const CompileResult& info() const { return info_; }  // cubin emptied after loading

  private:
    CUfunction function_;
    std::string name_;
    CUlibrary library_ = nullptr;
    CompileResult info_;
    // Sets MAX_DYNAMIC_SHARED_SIZE_BYTES to `bytes` where it is lower (occupancy queries and launches need it).
    void raise_dynamic_smem(std::size_t bytes) const;
    mutable std::atomic<std::size_t> smem_raised_{48 * 1024};  // MAX_DYNAMIC_SHARED_SIZE_BYTES set so far
    mutable std::atomic<long long> smem_budget_{-1};           // opt-in limit - static smem; -1: not yet asked
    mutable std::atomic<int> programmatic_{-1};  // 1: the device takes programmatic launches (sm_90+); -1: not asked
    bool programmatic_supported() const;
    mutable std::once_flag params_once_;
    mutable std::optional<std::vector<std::size_t>> param_sizes_;
    // Occupancy answers by {block threads, dynamic smem, cluster x, y, z} (cluster 0: blocks per SM).
    mutable std::mutex occupancy_mu_;
    mutable std::map<std::array<std::size_t, 5>, int> occupancy_;
    template <class Ask>
    int occupancy(const std::array<std::size_t, 5>& key, Ask&& ask) const;
};

// Compile-or-fetch and load for the current device. Thread-safe; the returned reference lives until process
// exit (kernels are cached per device in-process).
const Kernel& get_kernel(const KernelSpec& spec);

// The disk cache's root: LOOM_CACHE_DIR, else $XDG_CACHE_HOME/loom, else ~/.cache/loom. Kernels are under
// <root>/jit/<key>/, tuning results under <root>/tune/.
std::string cache_dir();

}  // namespace loom::jit
