// Plain data of expert-parallel dispatch / combine, throughput mode (kernels/moe/ep_dispatch.cuh, ep_combine.cuh),
// shared by the host launcher (src/ops/moe/ep/) and the device code. Compiles under the host compiler, nvcc and NVRTC.
//
// Names: W ranks (global: the World may span nodes), E experts, L = E / W local experts (expert e on rank e / L as
// local expert e % L), T this rank's tokens, k slots per token. Entry j = (token j / k, slot j % k). A token's "pair"
// with rank d exists when one of its slots names an expert of d; the pair is the unit of transfer (the token's row
// crosses to d once).
//
// Layout columns: C = E + W counters per rank: columns [0, E) count entries per expert, columns [E, E + W) count pairs
// per destination rank.
//
// Ranks on another node (a World of several nodes; the kernels are then built with remote peers): rows and pair
// records for such a rank are staged in this rank's symmetric stage rows (NVSHMEM's network transports read a put's
// source from the registered heap) and put from there; each rank's stage rows hold its pairs with other nodes' ranks
// in (rank, pair) order, and the combine's partial sums for those pairs come back into the same rows.
//
// Signals (EpSignals, symmetric, zeroed once, never reset) carry call numbers kept on the device (EpDeviceState), not
// host counts, so a replayed CUDA graph advances them: dispatch call e sets counts_ready[me] := e and arrived[me] := e
// at every rank; the combine's launch c sets combined[me] := c at every rank. Waits are `>=` (acquire, sys, bounded).
// The per-expert push (ep_moe_experts, Overlapped) adds 1 to expert_ready[l] at every rank d for each of d's local
// experts l once its rows of l are stored there; each rank zeroes its own L counters on its stream before the call's
// count kernel, so once every rank's push of the call landed expert_ready[l] = W.
#pragma once

#include "loom/config.hpp"
#include "loom/lang/launch_epoch.cuh"

namespace loom::kernels::moe {

inline constexpr int kEpChunk = 256;         // entries per block of the layout count / index kernels
inline constexpr int kEpScanThreads = 1024;  // threads of the single-block scan
inline constexpr int kEpThreads = 512;       // threads of the data kernels (a warp per token or pair)
inline constexpr int kEpMaxExperts = 1024;   // E the scan keeps in shared memory
inline constexpr int kEpMaxTopk = 32;        // k: a token's slots fit one warp
inline constexpr int kEpMaxRanks = 512;      // W: the signals' arrays (a thread per rank in the data kernels)
inline constexpr int kEpMaxCols = kEpMaxExperts + kEpMaxRanks;
static_assert(kEpMaxRanks <= kEpThreads, "a thread per rank in the data kernels' waits");
inline constexpr int kEpExpertRows = 32;  // rows per work item of the per-expert push

struct EpSignals {
    uint64_t counts_ready[kEpMaxRanks];    // at d: the last dispatch whose rank r counts row landed in d's counts
    uint64_t arrived[kEpMaxRanks];         // at d: the last dispatch whose rank r rows and pair records landed at d
    uint64_t combined[kEpMaxRanks];        // at r: the last combine whose partial rows rank d has ready for r (for
                                           // a rank d on another node: put into r's stage rows)
    uint64_t expert_ready[kEpMaxExperts];  // at d, per local expert l: sources whose rows of l landed in the current
                                           // per-expert push (zeroed by d before it)
    // At r, written by rank d's combine send before its combined signal: d's expert_out as a byte offset into d's
    // heap (-1: not in the heap) and its row stride in 16-byte words. r's reduce reads a one-slot pair's row there.
    int64_t out_offset[kEpMaxRanks];
    int64_t out_ld_words[kEpMaxRanks];
};

// Local device memory of one World's EP state, zeroed once.
struct EpDeviceState {
    uint64_t dispatch_calls;    // the scan kernel's thread 0 advances it: the current dispatch's number
    lang::LaunchEpoch combine;  // the combine send kernel's launches: the current combine's number
    uint32_t push_ticket;       // wrapping last-block tickets (atom.inc to gridDim.x - 1)
    uint32_t send_ticket;
    int32_t overflow;    // the current dispatch: 1 when some rank would receive more rows (or stage more pairs) than
                         // the capacity
    int32_t need_rows;   // the current dispatch: the most rows any rank receives
    int32_t need_pairs;  // the current dispatch: the most pairs any rank receives
    int32_t need_stage;  // the current dispatch: the most pairs any rank has with ranks of other nodes (0 on one node)
    int32_t recv_pairs;  // the current dispatch: pairs this rank receives
    int32_t pad;
    uint32_t expert_ticket[kEpMaxExperts];  // the per-expert push: per expert, its work items' wrapping ticket
};

// Every dispatch / combine kernel's arguments (one struct: the kernels share most of them).
struct EpParams {
    // Call inputs (this rank's).
    const void* x;              // [T, H] bf16, row stride x_ld_words 16-byte words
    const int32_t* topk_idx;    // [T, k]
    const float* topk_weights;  // [T, k] or null: 1
    const void* expert_out;     // combine: [>= capacity, H] bf16, rows aligned with recv_x, stride out_ld_words
    void* y;                    // combine: [T, H] bf16, stride y_ld_words
    // Local device layout of the current call.
    EpDeviceState* dev;
    int32_t* chunk_counts;  // [chunks, C]: per chunk counts, then (scan) exclusive bases over the chunks
    int32_t* recv_offsets;  // [L + 1] the received rows' expert segments
    int32_t* recv_counts;   // [L]
    int32_t* send_base;     // [E]: first row of this rank's segment of expert e at its rank
    int32_t* pair_base;     // [W]: first pair record index of this rank's pairs at rank d
    int32_t* entry_row;     // [T, k]: row of entry j at its expert's rank; -1 for an unused slot
    int32_t* token_pair;    // [T, W]: pair record index of (t, d) at d; -1 where t does not go to d
    // The per-expert push's (null on the other path): this rank's entries grouped by expert, token order within one.
    int32_t* send_prefix;  // [E + 1]: exclusive prefix over the experts of this rank's entries per expert
    int32_t* send_entry;   // [T x k]: entries [send_prefix[e], send_prefix[e + 1]) are those of expert e
    // Ranks on other nodes (null on one node): per rank d, the first stage row of this rank's pairs with d (other
    // nodes' ranks only); per source rank s, the first stage row at s of s's pairs with this rank (other nodes' s
    // only); per source rank s, the first received pair record index of s's pairs ([W + 1]).
    int32_t* stage_base;
    int32_t* ret_base;
    int32_t* src_pair_base;
    // Symmetric (this rank's addresses; peers' through the Ctx).
    EpSignals* sig;
    int32_t* counts_all;   // [W, C]: row r = rank r's column totals
    void* recv_x;          // [capacity, H] bf16
    int32_t* pair_rows;    // [pair_capacity, k]: per received pair, the row of each slot at this rank or -1
    float* pair_weights;   // [pair_capacity, k]
    void* combine_rows;    // [pair_capacity, H] bf16: per received pair, its weighted partial sum
    void* stage_x;         // [capacity, H] bf16 (several nodes; else null): rows to other nodes, then their partials
    int32_t* stage_rows;   // [capacity, k]: the staged pairs' records (the pair_rows / pair_weights sent)
    float* stage_weights;  // [capacity, k]
    int64_t x_ld_words, out_ld_words, y_ld_words, row_words;  // row_words: H x 2 / 16
    int32_t tokens, topk, num_experts, local_experts, chunks;
    int32_t capacity, pair_capacity;
    int32_t pad;
};

// The grouped GEMM's hooks of ep_moe_experts, Overlapped (kernels/moe/ep_experts.cuh): a tile of local expert l waits
// for expert_ready[l] >= target = W (every source's rows of l in this call) before its A rows are loaded.
struct EpExpertHookArgs {
    const uint64_t* expert_ready;  // this rank's EpSignals::expert_ready
    uint64_t target;
    uint64_t timeout_ns;
};

}  // namespace loom::kernels::moe
