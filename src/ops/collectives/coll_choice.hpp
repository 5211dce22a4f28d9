// The automatic choice of collective algorithm and data path: a table of rows, first feasible match wins
// (coll_choice.cpp). Update the rows from bench-collectives measurements (docs/perf/<op>.json; docs/collectives.md
// says how). Internal: used by the ops, their tests, bench-collectives --explain and the overlapped ops.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "loom/ops/collectives.hpp"

namespace loom {

struct CollChoice {
    CollAlgo algo = CollAlgo::Auto;
    DataPath path = DataPath::Auto;
    int blocks = 0;
    std::string reason;  // which table row (or constraint) decided
    // The algorithm runs with a copy of the buffer it needs symmetric in symmetric memory (coll::staged_buffer names
    // which; the ops' staged.cpp files): where no algorithm can run on the buffers as given, or where the cost model
    // (coll::model_us) puts the staged algorithm below the first one that can.
    bool staged = false;
};
struct CollTopology {
    int world = 1;
    bool shared_gpu = false;  // ranks share a GPU (MPS): some GPU of the World runs more than one rank
    int arch = 90;
    int ranks_per_gpu = 1;  // the most ranks any GPU of the World runs (the same on every rank)
};
// This world's topology as the choice sees it. Collective (a store all-gather): every rank calls it; the ops compute
// it once per World (coll::Core).
CollTopology collective_topology(World& world);
// SMs one rank's kernels may plan on when ranks share a GPU (the collectives' and the overlapped ops' grids). The
// ranks' kernels run at once, and a block that waits for a peer block which has no SM to start on waits forever
// (reduce_scatter at 4 and 8 ranks with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 for every rank; ag_gemm's persistent
// GEMMs under torchrun or mpirun with no share set). With an MPS share per rank (mps_percentage x ranks <= 100, as
// loomrun sets it) the device attribute already is the rank's share: attr_sms. Otherwise (0: unset, or shares past
// 100 %) attr_sms / ranks_per_gpu, at least 1, so that one block per SM of every rank fits the GPU at once (the LL
// kernels, whose packet capacity may need more blocks, then deal their packet blocks over that many:
// Budget::resident_blocks, setup_ll).
int shared_gpu_sm_budget(int attr_sms, int ranks_per_gpu, int mps_percentage);
// bytes: all_gather / all_to_all: the per-rank input; reduce_scatter: the per-rank output; all_reduce: the buffer.
// in_symmetric / out_symmetric say which algorithms are feasible. Two candidates: the first row feasible on the
// buffers as given, and the first row whose algorithm is feasible only staged (coll::stageable; its copy-engine path
// replaced by ld/st: the staged paths are kernels). The staged one wins where it is the only one, or where its row
// comes first and coll::model_us estimates it faster.
CollChoice choose_collective(CollKind kind, std::size_t bytes, const CollTopology& topo, bool in_symmetric = true,
                             bool out_symmetric = true);
// The table and the choice at a few sizes, as printed by bench-collectives --explain.
std::string explain_collectives(const CollTopology& topo);

namespace coll {

enum class GpuSharing { Any, Shared, Distinct };

struct ChoiceRow {
    CollKind kind;
    std::size_t max_bytes;  // the row applies up to this size (inclusive); SIZE_MAX: no limit
    GpuSharing sharing;
    CollAlgo algo;
    DataPath path;
    const char* why;
    int max_world = 0;  // the row applies up to this world size; 0: any
};

const std::vector<ChoiceRow>& choice_table();
// Is `algo` on `path` offered for `kind` (independent of buffers)?
bool offered(CollKind kind, CollAlgo algo, DataPath path);
// The data path an explicitly chosen algorithm uses when the caller leaves the path on Auto.
DataPath default_path(CollKind kind, CollAlgo algo, std::size_t bytes, const CollTopology& topo);
// Can `algo` run with these buffers (symmetric-ness)?
bool feasible(CollKind kind, CollAlgo algo, bool in_symmetric, bool out_symmetric);
// Which buffer a staged algorithm keeps in symmetric memory in place of the caller's.
enum class Staged { None, In, Out };
// The buffer `algo` stages when it runs staged: in for all_gather's, all_to_all's and reduce_scatter's pull (copied
// into the scratch round by round; the peers read it there) and for all_reduce's two-shot (copied into out where out
// is symmetric, then reduced in place; else into the scratch round by round); out for all_to_all_v's push (a window
// of out per round, copied back); None: `algo` has no staged variant.
Staged staged_buffer(CollKind kind, CollAlgo algo);
inline bool stageable(CollKind kind, CollAlgo algo) { return staged_buffer(kind, algo) != Staged::None; }

// The cost model that weighs a staged algorithm against one that runs on the buffers as given (choose_collective).
// Every collective past the LL sizes streams memory: its time is about its memory traffic per rank over the rate a
// rank gets, plus its launches. Estimated microseconds of `algo` (staged or not) at choose_collective's `bytes`:
//   (traffic_units x bytes) / (kModelBytesPerUs / ranks per GPU x efficiency) + launches x kModelLaunchUs
// traffic_units: bytes read and written per rank in units of `bytes` (model_traffic_units), the staging copy's
// included; efficiency: the fraction of the streaming rate the algorithm reaches (0.7 for reduce_scatter's scatter
// and all_reduce's one-shot, whose rounds through the scratch meet per round; 1 otherwise); launches: the staging
// copy and, staging through the scratch, the barrier kernel before it.
inline constexpr double kModelBytesPerUs = 3.0e6;  // 3 TB/s: what the collectives and copies stream on one H200
inline constexpr double kModelLaunchUs = 3.0;
double model_traffic_units(CollKind kind, CollAlgo algo, int world, bool staged, bool out_symmetric);
double model_us(CollKind kind, CollAlgo algo, std::size_t bytes, const CollTopology& topo, bool staged,
                bool out_symmetric);
// Resolves Auto in opts from the choice; checks the algorithm / path pair is offered for the op. An algorithm asked
// for by name that cannot run on the buffers as given runs staged where it can (stageable; then not on the copy
// engine); otherwise the op's own check names the buffer it needs symmetric.
CollChoice resolve(CollKind kind, std::size_t bytes, const CollTopology& topo, const CollOptions& opts,
                   bool in_symmetric, bool out_symmetric);

}  // namespace coll
}  // namespace loom
