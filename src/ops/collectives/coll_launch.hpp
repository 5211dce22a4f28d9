// How a collective kernel launch is built, sized and made: the kernel and its arguments (Launch), the plan cache that
// replays a repeated call's launch, and the grid sizing from the rank's SM budget (Budget).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/kernels/collectives/coll_params.hpp"
#include "ops/collectives/coll_choice.hpp"

namespace loom::jit {
class Kernel;
}

namespace loom::coll {

// Resolved launch: which kernel, grid, smem, and the kernel arguments.
struct Launch {
    std::string name;                        // "loom::kernels::coll::all_gather_push"
    std::string header;                      // "loom/kernels/collectives/all_gather.cuh"
    std::vector<std::string> template_args;  // {"__nv_bfloat16", "1"}
    int blocks = 1;
    int threads = 512;
    std::size_t smem = 0;
    // Programmatic launch (jit::LaunchConfig::programmatic): the kernel calls ptx::griddep_wait() first. The LL
    // kernels are: back to back, their launches then overlap the previous call's tail.
    bool programmatic = false;
    kernels::coll::Params params{};
};
// Launches `l` on `stream` (the JIT compiles and loads its kernel on first use).
void launch(World& world, const Launch& l, cudaStream_t stream);
// The kernel of `l`, compiled and loaded (jit::get_kernel), and a launch of it.
const jit::Kernel& load(const Launch& l);
void launch(World& world, const jit::Kernel& k, const Launch& l, cudaStream_t stream);

// What decides a collective call's launch: the op, the buffers, their element type and counts, and the options.
// Everything the op validates and resolves is a function of these while no memory is freed (symmetric-heap membership
// depends only on the pointer and size), so a call with the same key may replay the launch resolved the first time.
struct PlanKey {
    int op = 0;  // CollKind
    const void* in = nullptr;
    const void* out = nullptr;
    std::size_t in_count = 0, out_count = 0;
    int dtype = 0, out_dtype = 0, algo = 0, path = 0, reduce_op = 0, num_sms = 0;
    bool profiled = false;  // profile::enabled(): the profiled kernels are other kernels
    // detail::memory_generation(): after a free the buffers are checked again (an address may return as a shorter
    // allocation).
    std::uint64_t memory_generation = 0;
    bool operator==(const PlanKey&) const = default;
};
struct PlanKeyHash {
    std::size_t operator()(const PlanKey& k) const;
};
PlanKey plan_key(CollKind kind, const BufferView& in, const BufferView& out, const CollOptions& opts);

// Single-kernel launches resolved by earlier calls (copy-engine paths and all_to_all_v are not cached): the host cost
// of a repeated call is one lookup and the kernel launch, which is most of a small collective's latency. Bounded:
// cleared past kMaxPlans entries. A plan holds the state pointers of its Params: it lives in coll::Core and is
// cleared whenever a state it may point into is released.
class PlanCache {
  public:
    // Replays the plan of `key` when one exists (returns true); otherwise the caller validates and resolves.
    bool replay(const PlanKey& key, cudaStream_t stream) const;
    // launch(world, l, stream), remembered as the plan of `key`.
    void launch(World& world, const PlanKey& key, const Launch& l, cudaStream_t stream);
    void clear() { plans_.clear(); }

  private:
    struct Plan {
        const jit::Kernel* kernel = nullptr;
        Ctx ctx{};  // the World's (fixed for its lifetime)
        int blocks = 1, threads = 512;
        std::size_t smem = 0;
        bool programmatic = false;
        kernels::coll::Params params{};
    };
    static constexpr std::size_t kMaxPlans = 4096;
    std::unordered_map<PlanKey, Plan, PlanKeyHash> plans_;
};

// ---- grid sizing ------------------------------------------------------------------------------------------------

// The topology and the SMs this rank's collective launches may use.
struct Budget {
    CollTopology topo;
    // SMs the collectives may use: the device attribute (the rank's MPS share), or shared_gpu_sm_budget.
    int num_sms = 0;
    // > 0: the most blocks a launch may have so that every peer's launch is resident beside it — ranks share a GPU
    // without an MPS share each, so their kernels compete for every SM (the SM budget). 0: no such limit (a GPU of
    // its own, or an MPS share per rank: a rank's blocks then always get its own SMs).
    int resident_blocks = 0;
};

// The block cap of a grid-strided kernel (kFlagGridStride) when ranks share a GPU, where num_sms is the rank's MPS
// share of the SMs (loomrun's shares: 66, 26 and 14 SMs at 2, 4 and 8 ranks on an H200): one block per SM of the
// share for reduce_scatter's pull; for the fan-out all_gather push (fanout), whose writes are W times its reads, one
// per SM up to 32 and half the share beyond (at most the share) (docs/perf/all_gather.json, push/ld rows, shared).
// `cap` where ranks do not share a GPU.
int grid_stride_block_cap(const Budget& b, int cap, bool fanout);

// Blocks for `work_bytes` of traffic per block-share: at least 1, at most `cap`, the num_sms option, kMaxBlocks and
// the rank's SMs.
int pick_blocks(std::size_t work_bytes, std::size_t bytes_per_block, int cap, const CollOptions& opts, const Budget& b);

// TMA staging of a launch: sets p.stages / p.stage_bytes and returns the dynamic smem bytes.
std::size_t tma_staging(kernels::coll::Params& p);

// The pull launch of a path that stages in through the scratch (all_gather's and all_to_all's staged paths): bytes
// moved ("unsigned char"), in = the scratch, out's chunks or blocks `stride` bytes apart, blocks sized for
// `round_bytes` per round; out and round_elems are the caller's, per round. Raises unless c is pull over ld/st or
// TMA (the staged paths never use the copy engine).
Launch staged_pull_launch(const char* op, const CollChoice& c, const char* header, const char* name,
                          const kernels::coll::Params& base, void* scratch, std::size_t stride, std::size_t round_bytes,
                          const CollOptions& opts, const Budget& budget);

// Columns [off, off + n) (bytes) of the W rows of src, `pitch` bytes apart, packed into dst (n bytes apart): one 2D
// device-to-device copy on `stream` (one copy per row where the pitch is past cudaMemcpy2DAsync's limit). The
// staged all_to_all and reduce_scatter copy in into the scratch with it, round by round.
void pack_round(char* dst, const char* src, std::size_t pitch, std::size_t off, std::size_t n, int W,
                cudaStream_t stream);

const char* cuda_type(DType t);  // "float", "__half", "__nv_bfloat16"; other types moved as unsigned words
int path_arg(DataPath p);        // kPathLdSt / kPathTma

}  // namespace loom::coll
