// Plain data shared by the collective kernels (include/loom/kernels/collectives/{all_gather,reduce_scatter,all_reduce,
// all_to_all}.cuh) and their host launchers (src/ops/collectives/). Compiles under the host compiler, nvcc and NVRTC.
#pragma once

#include "loom/config.hpp"

namespace loom::kernels::coll {

// Most blocks one collective launch may use (the num_sms budget is clamped to it).
inline constexpr int kMaxBlocks = 128;
// Signal values are (epoch << kPhaseBits) + phase: a call may use phases 1 .. 2^kPhaseBits - 1.
inline constexpr int kPhaseBits = 20;
// LL collectives (kernels/coll_ll.cuh): packets (8 data bytes each) one block handles, so a chunk holds at most
// kMaxLLBlocks x kLLPacketsPerBlock x 8 bytes (512 KiB); the LL area holds 2 parities x kMaxLLBlocks x world x
// kLLPacketsPerBlock packets of 16 bytes (2 MiB per peer).
inline constexpr int kMaxLLBlocks = 128;
inline constexpr int kLLPacketsPerBlock = 512;

enum : int { kPathLdSt = 0, kPathTma = 1 };
enum : int { kOpSum = 0, kOpMax = 1 };
// Params::flags. kFlagGridStride: the kernel's threads share its range grid-wide (thread_share in coll_common.cuh)
// instead of a contiguous range per block; the host sets it for the memory-bound kernels when ranks share a GPU.
// kFlagStagedOut: all_reduce_two_shot with an out that is not symmetric — each rank's reduced shard goes through
// its scratch (kernels/all_reduce.cuh).
enum : uint32_t { kFlagGridStride = 1u, kFlagStagedOut = 2u };
// Vectors in flight per thread in reduce_multi (coll_common.cuh): kDepthOne, one per source (fewest registers);
// kDepthDeep, 8 whatever the source count, for kernels reading peers over NVLink; kDepthGrid, two per source up to 4
// sources (one beyond), for grid-strided kernels with ranks sharing a GPU (a grid-strided 2 -> 1 and 8 -> 1 sum on
// one H200 streamed 3.2 TB/s at one 512-thread block per SM with two per source, 2.5 with four, and 3.7 at two
// blocks per SM: bench/probes/hbm_fanout.cu).
enum : int { kDepthOne = 0, kDepthDeep = 1, kDepthGrid = 2 };

// Per-rank synchronisation state in the symmetric heap, zeroed once when the World's collective state is
// created and never reset afterwards.
//   epoch[b]   how many launches block b of this rank has made (any collective). Read and advanced by block b
//              of each launch only; stream order makes the value of launch n+1 follow launch n.
//   sig[b][p]  last value local rank p's block b published to this rank: (epoch << kPhaseBits) + phase. Written
//              only by rank p (store-release, monotonic), waited on with GE (wrap-safe).
// Every rank launches the same sequence of collectives with the same grids, so block b's epoch is equal on
// every rank for a given call.
struct SyncState {
    uint64_t epoch[kMaxBlocks];
    uint64_t sig[kMaxBlocks][kMaxLocalPeers];
};

// Kernel arguments (by value). Counts are elements of the kernel's element type.
struct Params {
    const void* in;
    void* out;
    uint64_t count;   // all_gather: elements per rank (in); reduce_scatter: elements of out; all_reduce: elements;
                      // all_to_all: elements per peer; all_to_all_v: capacity of out
    SyncState* sync;  // symmetric
    char* scratch;    // symmetric general scratch (one-shot / scatter staging)
    uint64_t scratch_bytes;       // per rank
    char* ll;                     // symmetric LL area (LL packets only: nothing else is ever written there)
    uint64_t round_elems;         // scratch rounds: elements per peer per round
    uint64_t round_base;          // all_to_all_v with out staged: the round's first element of out (its window)
    const int64_t* send_counts;   // all_to_all_v: symmetric, [world] elements this rank sends to each peer
    const int64_t* send_offsets;  // all_to_all_v: local, [world] element offsets into in (null: packed)
    int64_t* recv_counts;         // all_to_all_v: local, [world] filled with what each peer sent (may be null)
    uint64_t in_count;            // all_to_all_v: elements of this rank's in (its blocks must lie inside)
    uint32_t stage_bytes;         // TMA staging: bytes per stage
    uint32_t stages;              // TMA staging: stages
    uint32_t ll_packets;          // LL: packets per block
    uint32_t flags;               // kFlag* bits
    uint32_t ll_blocks;           // LL: packet blocks (<= kMaxLLBlocks), dealt over the launch's blocks (gridDim.x <=)
    uint32_t hold_ns;             // coll_barrier: how long it keeps the stream after every rank has met it
};

// Hierarchical collectives (a World of several nodes, kernels/collectives/hier.cuh). Their synchronisation block, in
// the symmetric heap, zeroed once and never reset:
//   epoch[b]                    launches block b of this rank has made (any hierarchical kernel)
//   sig[b * world + s]          last value rank s's block b published to this rank: (epoch << kPhaseBits) + phase,
//                               written only by rank s (node-local: store-release; other nodes: NVSHMEM signal)
// At most 16 blocks per launch: 8 ranks sharing one GPU keep every block of every rank resident (a block spins on its
// peers' block of the same index).
inline constexpr int kHierMaxBlocks = 16;

struct HierParams {
    const void* in;
    void* out;
    uint64_t count;        // all_gather: bytes per rank; all_to_all: bytes per peer; reduce_scatter: elements of out;
                           // all_reduce: elements; all_to_all_v: capacity of out (elements)
    uint64_t* epoch;       // symmetric, [kHierMaxBlocks]
    uint64_t* sig;         // symmetric, [kHierMaxBlocks * world]
    char* scratch;         // symmetric: reductions' partials and what the other nodes send (reduce_scatter, all_reduce)
    uint64_t stride;       // reduce_scatter / all_reduce: elements between the partial and the receive area's slots
    uint32_t node_subset;  // all_gather's and reduce_scatter's intra steps: the chunks of which nodes (kHierNodes*)
    uint32_t inter_part;   // reduce_scatter's inter step: what it runs (kHierInter*)
    // all_to_all_v
    const int64_t* send_counts;   // [world] elements this rank sends to each rank (device memory of this rank)
    const int64_t* send_offsets;  // [world] element offsets into in (device memory of this rank; null: packed)
    int64_t* recv_counts;         // [world] filled with what each rank sent (device memory of this rank; may be null)
    int64_t* counts;              // symmetric, [world * world]: row s = rank s's send_counts of the call
    uint64_t in_count;            // elements of this rank's in (its blocks must lie inside)
    uint64_t elem_bytes;          // bytes per element
};

// HierParams::node_subset: every node's chunks (the collectives), the other nodes' only, or this node's only (the
// overlapped GEMMs across nodes, which handle the rest beside them).
inline constexpr uint32_t kHierNodesAll = 0, kHierNodesOther = 1, kHierNodesOwn = 2;
// HierParams::inter_part: reduce_scatter's inter step whole; its exchange only (meet, send the partials, wait for the
// other nodes'); its combine only (this node's partial with the received ones, after an exchange-only launch).
inline constexpr uint32_t kHierInterAll = 0, kHierInterExchange = 1, kHierInterCombine = 2;

}  // namespace loom::kernels::coll
