// ag_gemm's pieces (src/ops/overlap/ag_gemm/): the producers' states, the validated call they take, and the choice.
//
// Per call e on every rank (W ranks, this one `me`, R = M / W rows per rank, chunk = R x K elements):
//   stream      fork ── [CE: own rows, chunk[me] = T] ── [Sm: wait started] ── GEMM(hooks: wait chunk[r] >= T) ── join
//   side             ready[me] = e on every rank; for d = me+1, me+2, ... (Sm: from d = me): [d != me: wait
//                    ready[d] >= e]; copy chunk -> d's gather rows [me R, me R + R); chunk[me] on d += pieces
//                    (target T). The copy engine's own rows go on the stream, before the GEMM: a copy within one
//                    GPU is a runtime copy kernel, which the persistent GEMM would starve (docs/overlap.md). With
//                    ranks sharing a GPU every copy is such a kernel: the stream joins the side before the GEMM.
//                    Where it can (own_local) the GEMM reads the own rows from A in place instead: no copy.
//                    With one GPU per rank the host enqueues the side stream's work after the GEMM's launch.
// T (chunk_total) counts pieces over all calls: the copy engine sets the new total, each SM block adds 1.
// Direct (ranks sharing a GPU): direct.cpp. Sequential (Auto's choice with a GPU per rank when the GEMM's tiles fit one
// wave): loom::all_gather, then loom::gemm. The heuristic's raster groups are narrowed to lie inside one rank's rows
// (groups_inside_bands). Across nodes: Sequential, or CopyEngine's two-level form (across_nodes.cpp: the above on the
// node's part of the call beside the other nodes' shards through NVSHMEM, then loom::gemm over their rows).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "loom/kernels/overlap/overlap_params.hpp"
#include "loom/ops/overlap.hpp"
#include "ops/overlap/common/checks.hpp"
#include "ops/overlap/common/plan.hpp"
#include "ops/overlap/common/state.hpp"
#include "ops/overlap/common/tune.hpp"

namespace loom {

// The producer Auto resolves to, or the requested one once checked (raises for one that cannot run). Ranks sharing a
// GPU: Direct where it applies (world > 1, rows_per_rank = M / W a multiple of the GEMM's block_m, no gathered
// buffer), else CopyEngine. A GPU per rank: Sequential when the GEMM's `tiles` fit one wave on `num_sms` (every tile
// then runs at once, so a peer's tile waits for its rows as long as the sequence's GEMM does, and the copy engine's
// latency comes on top; docs/perf/ag_gemm.json), else CopyEngine (tiles 0: not known).
AgProducer ag_gemm_producer(AgProducer requested, int world_size, int64_t rows_per_rank, int block_m, bool gathered,
                            bool ranks_share_gpu, int64_t tiles = 0, int num_sms = 0);
// The producer in a World of several nodes (nodes > 1, ranks_per_node each). CopyEngine runs the two-level form
// (across_nodes.cpp): the copy-engine producer and its hooked GEMM over the node's rows, beside the other nodes'
// shards arriving through NVSHMEM, then loom::gemm over their rows. Auto resolves as on one node with a GPU per rank:
// Sequential (loom::all_gather's hierarchical form, then loom::gemm) when the GEMM's `tiles` fit one wave on
// `num_sms`, else CopyEngine; with the caller's tile (`config`) CopyEngine. Sm and Direct raise (they reach their
// peers through the node's heap only).
AgProducer ag_gemm_producer_across_nodes(AgProducer requested, int nodes, int ranks_per_node, int64_t tiles = 0,
                                         int num_sms = 0, bool config = false);
// Where ag_gemm gathers A's shards for `producer` (no gathered buffer is allowed with Direct, which gathers nothing):
//   Own          the gather state's buffer (no gathered buffer given);
//   Callers      the caller's gathered buffer: symmetric, or any for Sequential in one node (loom::all_gather takes
//                any out there);
//   OwnThenCopy  the overlapped producers (CopyEngine, Sm), whose peers write into it, and Sequential across nodes
//                (the hierarchical all_gather writes a symmetric out), with a gathered buffer outside the symmetric
//                heap: the state's buffer, copied into the caller's after the GEMM (one local copy of M x K elements
//                on the stream; gathered_copy.cpp);
//   None         Direct.
enum class AgGatherAt { Own, Callers, OwnThenCopy, None };
AgGatherAt ag_gather_at(AgProducer producer, bool gathered_given, bool gathered_symmetric, bool across_nodes = false);
// The GEMM beside the producer on `num_sms` SMs (the SM producer's blocks take comm_sms or a default by the chunk
// size). in: the input type (fp8's k-blocks are 128 elements: block_k, and the bytes the SM producer moves).
OverlapPlan ag_gemm_plan(int64_t m, int64_t n_loc, int64_t k, int world_size, AgProducer producer, int comm_sms,
                         int arch, int num_sms, bool ranks_share_gpu = false, DType in = DType::BF16);

}  // namespace loom

namespace loom::overlap {

inline constexpr const char* kAgHooks = "loom::kernels::overlap::AgGemmHooks";
inline constexpr const char* kAgHeader = "loom/kernels/overlap/ag_gemm.cuh";

// The copy-engine and SM producers' state (the sequence without a gathered buffer takes only its gather buffer).
// Symmetric: AgGatherSignals (136 bytes) and buf, the gather buffer [M, K].
struct AgGatherState final : SignalState<kernels::overlap::AgGatherSignals> {
    static constexpr const char* kKey = "overlap/ag_gemm/gather";
    explicit AgGatherState(World& world) : SignalState(world) {}
    SideStream side;
    uint64_t calls = 0;          // the producers' calls on this World (the epoch of the current call)
    uint64_t chunk_total = 0;    // target of chunk after the current call
    uint64_t started_total = 0;  // SM producer: target of started
};

// The direct producer's state. Symmetric: AgDirectSignals (128 bytes) and buf, the staging: two parity halves of this
// rank's shard.
struct AgDirectState final : SignalState<kernels::overlap::AgDirectSignals> {
    static constexpr const char* kKey = "overlap/ag_gemm/direct";
    explicit AgDirectState(World& world) : SignalState(world) {}
    uint64_t calls = 0;        // the direct producer's calls on this World (the epoch of the current call)
    uint64_t chunk_total = 0;  // target of chunk after the current call
};

// The two-level form's own resources (across nodes): the side stream of the other nodes' shards and the event after
// which they may be sent (this rank's shard in its gather rows, or the GEMM's start when it reads the shard in place).
struct AgNodesState final : WorldState {
    static constexpr const char* kKey = "overlap/ag_gemm/nodes";
    explicit AgNodesState(World&);
    ~AgNodesState() override;
    AgNodesState(const AgNodesState&) = delete;
    AgNodesState& operator=(const AgNodesState&) = delete;
    SideStream side;
    cudaEvent_t own_rows = nullptr;
};

// One call of ag_gemm, validated (ag_gemm.cpp), then chosen (choose_producer). Across nodes the copy-engine producer
// runs on a copy for the node's part of it (across_nodes.cpp): W the node's ranks, me the local rank, base the node's
// first rank, M, the gather buffer and C the node's rows.
struct AgCall : OpCall {
    int base = 0;                        // the world rank of the call's rank 0 (its node's first rank across nodes)
    int me = 0;                          // local rank
    int64_t R = 0, M = 0, K = 0, N = 0;  // R = M / W rows per rank
    std::size_t chunk_bytes = 0;         // R x K x the element size
    // Chosen:
    AgProducer producer = AgProducer::Auto;
    OverlapPlan plan;
    AgGatherState* st = nullptr;   // copy engine, SM producer, and the sequence without a gathered buffer
    void* gather = nullptr;        // the caller's gathered buffer or st's (none for the direct producer)
    void* gathered_out = nullptr;  // AgGatherAt::OwnThenCopy: the caller's gathered buffer, copied into after the GEMM
    MatrixView gview;              // the GEMM's A: [M, K] over the gather buffer (the direct producer: over A)
    cudaEvent_t own_rows = nullptr;  // recorded on the stream once this rank's rows are in its gather buffer (or
                                     // before the GEMM that reads them in place): the copy-engine producer across nodes
};

// The producer and its plan, and the producers' state and gather buffer (created or grown here: collective).
void choose_producer(AgCall& x, const AgGemmOptions& o);
// The overlapped producers' GEMM: the caller's tile or the plan's (raster groups inside bands), compiled; the hooks'
// arguments common to the producers (the own rows in place where they can be: own_local).
kernels::overlap::AgGemmHookArgs prepare_overlapped(AgCall& x, const AgGemmOptions& o);

void ag_gemm_sequential(const AgCall& x);
void ag_gemm_copy_engine(const AgCall& x, kernels::overlap::AgGemmHookArgs h);
void ag_gemm_sm_push(const AgCall& x, kernels::overlap::AgGemmHookArgs h, bool tma);
void ag_gemm_direct(const AgCall& x, kernels::overlap::AgGemmHookArgs h);
// The copy-engine producer in a World of several nodes (the two-level form, across_nodes.cpp).
void ag_gemm_across_nodes(const AgCall& x, const AgGemmOptions& o);
// AgGatherAt::OwnThenCopy: the gather buffer copied into the caller's gathered buffer, on the stream after the GEMM.
void ag_gemm_copy_gathered(const AgCall& x);

// The autotuner's candidates for a call with every choice left to Loom (Auto first).
std::vector<TuneOption<AgGemmOptions>> ag_gemm_candidates(const World& world, const MatrixView& a, const MatrixView& b,
                                                          const DeviceFacts& dev, int num_sms);

}  // namespace loom::overlap
