// Per-World state of the collectives: the symmetric synchronisation block, scratch and LL area, the topology
// facts the automatic choice needs, and the launch helpers shared by src/ops/{all_gather,reduce_scatter,
// all_reduce,all_to_all}.cpp.
//
// Created on the first collective call on a World (collective: every rank makes the same first call) and kept
// until release_coll_state(world) or process exit. Thread-safe lookup; calls on one World must come from one
// thread at a time (as for every collective).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/kernels/collectives/coll_params.hpp"
#include "loom/ops/collectives.hpp"

namespace loom::jit {
class Kernel;
}

namespace loom::coll {

// What decides a collective call's launch: the op, the buffers, their element type and counts, and the options.
// Everything the op validates and resolves is a function of these (symmetric-heap membership depends only on the
// pointer and size), so a call with the same key may replay the launch resolved the first time.
struct PlanKey {
    int op = 0;  // CollKind
    const void* in = nullptr;
    const void* out = nullptr;
    std::size_t in_count = 0, out_count = 0;
    int dtype = 0, algo = 0, path = 0, reduce_op = 0, num_sms = 0;
    bool operator==(const PlanKey&) const = default;
};
struct PlanKeyHash {
    std::size_t operator()(const PlanKey& k) const;
};
// A resolved single-kernel launch (copy-engine paths and all_to_all_v are not cached).
struct Plan {
    const loom::jit::Kernel* kernel = nullptr;
    Ctx ctx{};  // the World's (fixed for its lifetime)
    int blocks = 1, threads = 512;
    std::size_t smem = 0;
    bool programmatic = false;
    kernels::coll::Params params{};
};

// Rows of CollState::ce_sig (each kMaxLocalPeers signals): reduce_scatter's ready and freed, all_gather's ready and
// done (eager calls), all_gather's ready and done (calls captured in a CUDA graph).
inline constexpr int kCeSignals = 6;

struct CollState {
    kernels::coll::SyncState* sync = nullptr;  // symmetric, zeroed once
    char* scratch = nullptr;                   // symmetric
    std::size_t scratch_bytes = 0;             // LOOM_COLL_SCRATCH (default 64 MiB)
    char* ll = nullptr;                        // symmetric LL area
    std::size_t ll_bytes = 0;
    CollTopology topo;
    // SMs the collectives may use: the device attribute (the rank's MPS share), or shared_gpu_sm_budget.
    int num_sms = 0;
    // > 0: the most blocks a launch may have so that every peer's launch is resident beside it — ranks share a GPU
    // without an MPS share each, so their kernels compete for every SM (the SM budget). 0: no such limit (a GPU of
    // its own, or an MPS share per rank: a rank's blocks then always get its own SMs).
    int resident_blocks = 0;
    // Launches resolved by earlier calls (launch_cached): the host cost of a repeated call is one lookup and the
    // kernel launch, which is most of a small collective's latency. Bounded: cleared past kMaxPlans entries.
    std::unordered_map<PlanKey, Plan, PlanKeyHash> plans;
    static constexpr std::size_t kMaxPlans = 4096;
    // The copy-engine paths' stream signals, symmetric [kCeSignals][kMaxLocalPeers], zeroed once. Stream memory
    // operations take constant values, which a captured CUDA graph repeats on every replay, so where a path may be
    // captured no value depends on a host call count; instead a signal is reset to 0 by the rank it lives on, within
    // the call that raised it, once no peer can still write it in that call and before the owner meets its peers in
    // the next call. Graphs then replay back to back with no host synchronisation
    // (Collectives.GraphReplaysBackToBack).
    //   reduce_scatter (scatter / ce): ready[q] = k + 1 — rank q's push of round k of this call landed here;
    //     freed[q] = k + 1 — rank q reduced round k, its buffer k % 2 may be refilled. Reset at the end of a call.
    //   all_gather (push / ce), eager calls: ag_ready[q] = e — rank q's out may be written in call e; ag_done[q] =
    //     e — rank q's chunk of call e landed here; e = ce_ag_calls, never reset (a reset costs the eager call a
    //     stream operation on its critical path). Captured calls: the next two rows, values 1, reset once seen
    //     (all_gather.cpp).
    std::uint64_t* ce_sig = nullptr;
    std::uint64_t ce_ag_calls = 0;
    // Side streams of the copy-engine path (copy_engine_fanout), created on first use.
    std::vector<cudaStream_t> ce_streams;
    std::vector<cudaEvent_t> ce_done;
    cudaEvent_t ce_fork = nullptr;
    bool barrier_loaded = false;  // prepare_barrier ran (the JIT's own cache is per process)
};

// The World's state, created (collectively) on first use. Raises for a world the collectives do not support.
CollState& coll_state(World& world);
// Frees the state's symmetric buffers (collective). Later calls create a fresh state.
void release_coll_state(World& world);

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
void launch(World& world, const Launch& l, cudaStream_t stream);
// launch(), and remember the launch as the plan of `key` for launch_cached.
void launch(World& world, CollState& st, const PlanKey& key, const Launch& l, cudaStream_t stream);
// Replays the plan of `key` when one exists (returns true); otherwise the caller validates and resolves.
bool launch_cached(CollState& st, const PlanKey& key, cudaStream_t stream);
PlanKey plan_key(CollKind kind, const BufferView& in, const BufferView& out, const CollOptions& opts);
// The copy-engine data path: each job runs on its own side stream, so the copies to different peers and the own
// chunk's local copy run on different copy engines at once (one stream would serialise them: at 1 GiB, W = 2 the
// own chunk's copy added ~25 % to the all_gather). Every job is ordered after `stream`'s earlier work and `stream`
// waits for every job before its later work (event fork / join: capturable in a CUDA graph).
struct CopyJob {
    void* dst;
    const void* src;
    std::size_t bytes;
};
void copy_engine_fanout(CollState& st, cudaStream_t stream, const std::vector<CopyJob>& jobs);
// Side stream i of the copy-engine path (created on first use).
cudaStream_t ce_stream(CollState& st, std::size_t i);
// Side streams 0..n-1 start after `stream`'s work so far (ce_fork); `stream`'s later work starts after theirs
// (ce_join). Events only: capturable in a CUDA graph.
void ce_fork(CollState& st, cudaStream_t stream, std::size_t n);
void ce_join(CollState& st, cudaStream_t stream, std::size_t n);
// The one-block peer barrier (copy-engine path).
void launch_barrier(World& world, CollState& st, cudaStream_t stream, uint32_t hold_ns = 0);
// Compiles and loads launch_barrier's kernel without launching it: for a caller that launches it only when capturing a
// CUDA graph, where loading a module is not allowed, so its eager calls load it first.
void prepare_barrier(CollState& st);

// Params with the state's pointers filled in.
kernels::coll::Params base_params(const CollState& st);
// TMA staging of a launch: sets p.stages / p.stage_bytes and returns the dynamic smem bytes.
std::size_t tma_staging(kernels::coll::Params& p);
// Blocks for `work_bytes` of traffic per block-share: at least 1, at most `cap` and the num_sms budget.
int pick_blocks(std::size_t work_bytes, std::size_t bytes_per_block, int cap, const CollOptions& opts,
                const CollState& st);

// SMs one rank's collectives may use when ranks share a GPU. The ranks' barrier kernels run at once, and a block
// that waits for a peer block which has no SM to start on waits forever (seen: reduce_scatter at 4 and 8 ranks with
// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 for every rank). With an MPS share per rank (mps_percentage x ranks <= 100,
// as loomrun sets it) the device attribute already is the rank's share: attr_sms. Otherwise (unset, or shares past
// 100 %) attr_sms / ranks_per_gpu, at least 1, so that one block per SM of every rank fits the GPU at once (that
// ended the reduce_scatter deadlock; the LL kernels, whose packet capacity may need more blocks, then deal their
// packet blocks over that many: CollState::resident_blocks, setup_ll). The overlapped GEMMs do not keep to it: an MPS
// share per rank remains the supported setting.
int shared_gpu_sm_budget(int attr_sms, int ranks_per_gpu, const char* mps_percentage);

// The block cap of a grid-strided kernel (kFlagGridStride) when ranks share a GPU, where st.num_sms is the rank's MPS
// share of the SMs (loomrun's shares: 66, 26 and 14 SMs at 2, 4 and 8 ranks on an H200): one block per SM of the
// share for reduce_scatter's pull; for the fan-out all_gather push (fanout), whose writes are W times its reads, one
// per SM up to 32 and half the share beyond (at most the share). Measured on one H200, 64 MiB - 1 GiB: 2 ranks, 32 of
// 66 SMs' blocks 0.79 / 0.86 / 0.90 of the copy against 0.69 / 0.70 / 0.73 with 66 (session 13); 4 ranks, 26 of 26
// 0.81 / 0.86 / 0.89 against 0.67 / 0.71 / 0.72 with 16 (session 15); 8 ranks, 14 of 14 against 8 (session 13).
// `cap` where ranks do not share a GPU.
int grid_stride_block_cap(const CollState& st, int cap, bool fanout);

// The LL kernels of kernels/coll_ll.cuh: sets l.header, l.name ("loom::kernels::coll::<op>_ll"), grid, threads
// and packets per block for chunks of `chunk_bytes` (see Params::count). Raises when a chunk is over the LL
// area's capacity (ll_capacity_bytes()), naming the algorithms that fit.
void setup_ll(Launch& l, const char* op, std::size_t chunk_bytes, const CollOptions& opts, const CollState& st);
// The LL data-movement ops (all_gather, all_to_all): chunks of `chunk_bytes` moved as bytes; launched and
// remembered as the plan of `key`.
void launch_ll_bytes(World& world, CollState& st, const PlanKey& key, const char* op, const void* in, void* out,
                     std::size_t chunk_bytes, const CollOptions& opts, cudaStream_t stream);
constexpr std::size_t ll_capacity_bytes() {
    return std::size_t(kernels::coll::kMaxLLBlocks) * kernels::coll::kLLPacketsPerBlock * 8;
}

// ---- validation shared by the ops ------------------------------------------------------------------------------
void check_buffer(const char* op, const char* which, const BufferView& b);
void check_same_dtype(const char* op, const BufferView& in, const BufferView& out);
void check_float_dtype(const char* op, const BufferView& b);
// Raises "<op>: <which> (<ptr>, <bytes> bytes) is not in the symmetric heap; the <algo> algorithm needs it
// there: allocate it with world.alloc".
void check_symmetric(const char* op, const char* algo, const char* which, World& world, const BufferView& b);
bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn);
const char* cuda_type(DType t);  // "float", "__half", "__nv_bfloat16"
int path_arg(DataPath p);        // kPathLdSt / kPathTma
// Resolves Auto in opts from the choice; checks the algorithm / path pair is offered for the op.
CollChoice resolve(CollKind kind, std::size_t bytes, World& world, CollState& st, const CollOptions& opts,
                   bool in_symmetric, bool out_symmetric);

}  // namespace loom::coll
