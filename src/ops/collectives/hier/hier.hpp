// The collectives in a World of several nodes (kernels/collectives/hier.cuh): the public entries call these, after
// their own argument checks, when world.num_nodes() > 1. Each op is a host-composed sequence of kernels compiled with
// remote peers: an intra-node step among the node's ranks (load/store) and an inter-node step among the ranks of one
// local rank (NVSHMEM put_signal), or for all_to_all among all the ranks of the other nodes.
//
//   all_gather      inter (own chunk to the same local rank on every node), then intra (the N chunks to every node
//                   peer); out symmetric
//   reduce_scatter  intra (node reduce of the N chunks of this local rank, pulled), then inter (the N partials
//                   exchanged and reduced); in symmetric, 2 x nodes x out.count elements of the collective scratch
//   all_reduce      intra (node reduce of range l of L, pulled), inter (partials exchanged and reduced), intra
//                   (range l pushed to the node peers); in and out symmetric, (nodes + 1) x ceil(count / L) elements
//                   of the collective scratch
//   all_to_all      intra (blocks of the node peers, load/store), then inter (blocks of every rank on another node,
//                   NVSHMEM); in and out symmetric
//   all_to_all_v    counts (one block: entry barrier with every rank, each rank's send_counts put to every rank's
//                   counts matrix), then data (every block pushed to its receiver: node peers by load/store, other
//                   nodes through NVSHMEM put_signal); in and out symmetric, the counts, offsets and recv_counts any
//                   device memory of the rank
//
// Steps: Intra or Inter launches only that step's kernel(s): each kernel meets its peers on entry, so one step alone
// runs back to back; the results are then incomplete. For the benchmark's per-step times (bench-crossnode).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <string>

#include "loom/jit/jit.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/runtime/world_state.hpp"

namespace loom::coll::hier {

enum class Steps { All, Intra, Inter };
const char* to_string(Steps s);

// Signals of the hierarchical kernels (kernels::coll::HierParams::epoch / sig) and all_to_all_v's counts matrix
// (HierParams::counts), one symmetric allocation, zeroed when created (which synchronises the device and meets every
// rank: not during a CUDA-graph capture).
struct State final : WorldState {
    static constexpr const char* kKey = "collectives/hier";
    explicit State(World& world);
    void release(World& world) override;

    std::uint64_t* epoch = nullptr;  // [kHierMaxBlocks]
    std::uint64_t* sig = nullptr;    // [kHierMaxBlocks x world]
    std::int64_t* counts = nullptr;  // [world x world]: all_to_all_v's counts matrix
    // Loaded by this World's calls, by "name,targs" (",profiled" while the profiler is on).
    std::map<std::string, const jit::Kernel*> kernels;
};

// A second set of the hierarchical kernels' signals, for kernels that run on one stream while others of the same
// call run on another stream with State's (gemm_rs across nodes). Symmetric, zeroed when created (collective; not
// during a CUDA-graph capture).
struct BesideState final : WorldState {
    static constexpr const char* kKey = "collectives/hier/beside";
    explicit BesideState(World& world);
    void release(World& world) override;
    std::uint64_t* epoch = nullptr;  // [kHierMaxBlocks]
    std::uint64_t* sig = nullptr;    // [kHierMaxBlocks x world]
};

// Validated calls (the public entry's checks have run): these check what the hierarchical forms add (the options,
// symmetric buffers, the scratch) and launch.
void all_gather(World& world, const BufferView& in, const BufferView& out, const CollOptions& opts, cudaStream_t stream,
                Steps steps = Steps::All);
// Creates the signals and loads all_gather's kernels without launching them (collective: the first load meets every
// rank; creating the signals synchronises the device): for a caller that launches them behind work that waits on its
// peers.
void prepare_all_gather(World& world, cudaStream_t stream);
// all_gather's chunks of the other nodes only (ag_gemm across nodes, which gathers the node's own chunks by the copy
// engine beside it): the inter step (in to this rank's chunk of out, unless in is that chunk, then to the same local
// rank of every other node), then the intra step for the other nodes' chunks. out symmetric; at most num_sms blocks
// (0: blocks_for's count).
void all_gather_other_nodes(World& world, const BufferView& in, const BufferView& out, int num_sms,
                            cudaStream_t stream);
void reduce_scatter(World& world, const BufferView& in, const BufferView& out, const CollOptions& opts,
                    cudaStream_t stream, Steps steps = Steps::All);
// reduce_scatter (sum) in three parts, for gemm_rs across nodes, whose GEMM writes the other nodes' rows of `in` first:
//   OtherNodes  on a side stream once those rows are written: the intra step for the other nodes' chunks and the inter
//               step's exchange (State's signals);
//   OwnNode     on the stream once this node's rows are written: the intra step for its chunks (BesideState's);
//   Combine     on the stream after both: out = this node's partial and the other nodes' (BesideState's).
// in symmetric; 2 x nodes x out.count elements of the collective scratch. prepare_reduce_scatter creates the states
// and loads the kernels (collective) before any part is launched.
enum class RsPart { OtherNodes, OwnNode, Combine };
void prepare_reduce_scatter(World& world, const BufferView& in, const BufferView& out, cudaStream_t stream);
void reduce_scatter_part(World& world, const BufferView& in, const BufferView& out, RsPart part, cudaStream_t stream);
void all_reduce(World& world, const BufferView& in, const BufferView& out, const CollOptions& opts, cudaStream_t stream,
                Steps steps = Steps::All);
void all_to_all(World& world, const BufferView& in, const BufferView& out, const CollOptions& opts, cudaStream_t stream,
                Steps steps = Steps::All);
// What all_to_all_v's hierarchical form adds to the public entry's checks (the options; in and out symmetric).
void check_all_to_all_v(World& world, const BufferView& in, const BufferView& out, const CollOptions& opts);
// Both steps always (the data kernel depends on the counts kernel's exchange).
void all_to_all_v(World& world, const BufferView& in, const BufferView& out, const int64_t* send_counts,
                  const int64_t* send_offsets, int64_t* recv_counts, const CollOptions& opts, cudaStream_t stream);

}  // namespace loom::coll::hier
