// Plain-data parameters of the expert-parallel low-latency dispatch / combine kernels (kernels/moe/ep_ll.cuh), shared
// by the host launcher (src/ops/moe/ep/ll_*.cpp) and the device code, and the layout of their symmetric buffers.
#pragma once

#include "loom/config.hpp"

namespace loom::kernels::moe {

inline constexpr int kEpLlThreads = 512;  // threads of every LL launch: 16 warps
inline constexpr int kEpLlWarps = kEpLlThreads / 32;
inline constexpr int kEpLlMaxBlocks = 1024;         // grid bound (the per-block epoch arrays)
inline constexpr int kEpLlScaleBlock = 128;         // elements per fp8 scale
inline constexpr int kEpLlMaxExperts = 1024;        // E bound (the dispatch's per-block histogram in smem)
inline constexpr int kEpLlMaxTopk = 32;             // k bound (a lane per slot)
inline constexpr int kEpLlBatch = 8;                // 16-byte loads a lane keeps in flight
inline constexpr int kEpLlSend = 1, kEpLlRecv = 2;  // EpLlParams::phases

// One dispatch message (one (token, expert) entry), 16-byte aligned pieces:
//   [0, payload)                    the token's row: H fp8 e4m3 bytes, or H bf16
//   [payload, payload + scales)     fp8 only: H / 128 fp32 scales (x ~ fp8 x scale), padded to 16 bytes
//   [.., + 16)                      header: int32 source entry t x k + slot, then 12 unused bytes
LOOM_HOST_DEVICE constexpr int64_t ep_ll_payload_bytes(int64_t hidden, bool fp8) { return fp8 ? hidden : 2 * hidden; }
LOOM_HOST_DEVICE constexpr int64_t ep_ll_scale_bytes(int64_t hidden, bool fp8) {
    return fp8 ? (hidden / kEpLlScaleBlock * 4 + 15) / 16 * 16 : 0;
}
LOOM_HOST_DEVICE constexpr int64_t ep_ll_msg_bytes(int64_t hidden, bool fp8) {
    return ep_ll_payload_bytes(hidden, fp8) + ep_ll_scale_bytes(hidden, fp8) + 16;
}

// One parity half of the dispatch area on the receiving rank (L local experts, W = the world's ranks, M = max_tokens):
//   messages [L][W][M] x msg_bytes, then counts [L][W] uint64: {low 32: entries sent, high 32: the call's flag},
//   then (direct receive) free [W] EpLlFree: rank r's receive layout for the call, written by r when its call starts
LOOM_HOST_DEVICE constexpr int64_t ep_ll_dispatch_count_offset(int64_t L, int64_t W, int64_t M, int64_t msg) {
    return L * W * M * msg;
}
LOOM_HOST_DEVICE constexpr int64_t ep_ll_dispatch_free_offset(int64_t L, int64_t W, int64_t M, int64_t msg) {
    return ep_ll_dispatch_count_offset(L, W, M, msg) + L * W * 8;
}
LOOM_HOST_DEVICE constexpr int64_t ep_ll_dispatch_half_bytes(int64_t L, int64_t W, int64_t M, int64_t msg) {
    return (ep_ll_dispatch_free_offset(L, W, M, msg) + W * 32 + 1023) / 1024 * 1024;
}
// A receiving rank's layout for one call with direct receive: the heap offsets of its recv arrays (x, scales,
// src_info), then the call's flag (release: the offsets are written first).
struct EpLlFree {
    int64_t x, scales, src_info;
    uint64_t flag;
};
static_assert(sizeof(EpLlFree) == 32);
// A World of several nodes: after the two halves, this rank's staging of the messages to experts on other nodes,
// [M][k] x msg_bytes (entry t x k + slot's message, written by the warp, then put from there: NVSHMEM's network
// transports take a put's source from the symmetric heap only).
LOOM_HOST_DEVICE constexpr int64_t ep_ll_dispatch_staging_bytes(int64_t M, int64_t k, int64_t msg) {
    return (M * k * msg + 1023) / 1024 * 1024;
}
// One parity half of the combine area on the token's rank (M = max_tokens, k = top-k, E experts, W ranks):
//   rows [M][k][H] bf16     entry t x k + slot's expert output, where the expert's rank pushed it
//   table [M][k] int64      entry t x k + slot's source, written by the expert's rank when it can reach this rank:
//                           the byte offset of the output row in the expert rank's symmetric heap (this rank reads
//                           it from there), or -1 (the row was pushed into rows)
//   flags [E] uint64        index: expert rank x L + local expert; value: the call's flag, written after that
//                           expert's rows / table entries for this rank
//   done [W] uint64         index: token rank; value: the call's flag, written once that rank has read every row it
//                           pulls from this rank's heap
LOOM_HOST_DEVICE constexpr int64_t ep_ll_combine_table_offset(int64_t M, int64_t k, int64_t H) { return M * k * H * 2; }
LOOM_HOST_DEVICE constexpr int64_t ep_ll_combine_flag_offset(int64_t M, int64_t k, int64_t H) {
    return ep_ll_combine_table_offset(M, k, H) + M * k * 8;
}
LOOM_HOST_DEVICE constexpr int64_t ep_ll_combine_done_offset(int64_t M, int64_t k, int64_t H, int64_t E) {
    return ep_ll_combine_flag_offset(M, k, H) + E * 8;
}
LOOM_HOST_DEVICE constexpr int64_t ep_ll_combine_half_bytes(int64_t M, int64_t k, int64_t H, int64_t E, int64_t W) {
    return (ep_ll_combine_done_offset(M, k, H, E) + W * 8 + 1023) / 1024 * 1024;
}
// A World of several nodes: after the two halves, one staging row of H bf16 per warp of the grid ([blocks x
// kEpLlWarps][H], indexed by the global warp id): a row to a token rank on another node is copied there, then put.
LOOM_HOST_DEVICE constexpr int64_t ep_ll_combine_staging_bytes(int64_t blocks, int64_t H) {
    return (blocks * kEpLlWarps * H * 2 + 1023) / 1024 * 1024;
}

struct EpLlParams {
    int32_t tokens = 0;         // T of this rank (0..max_tokens)
    int32_t hidden = 0;         // H, a multiple of 128
    int32_t topk = 0;           // k
    int32_t num_experts = 0;    // E
    int32_t local_experts = 0;  // L = E / W
    int32_t max_tokens = 0;     // M
    int32_t phases = 0;         // kEpLlSend | kEpLlRecv
    int32_t pull = 0;           // combine: expert_out is in this rank's symmetric heap; token ranks this rank reaches
                                // read their rows from it (table offsets) rather than receiving them (push)
    int32_t direct = 0;         // dispatch, every rank's: recv_x / recv_scales / recv_src_info are in the symmetric
                                // heap; senders write each entry there (after the receiver's free slot), no copy
    int32_t pad = 0;

    const int32_t* topk_idx = nullptr;    // [T, k]
    const float* topk_weights = nullptr;  // [T, k] (combine)
    const void* x = nullptr;              // dispatch: [T, H] bf16, row stride x_ld elements
    int64_t x_ld = 0;
    void* y = nullptr;  // combine: [T, H] bf16, row stride y_ld elements
    int64_t y_ld = 0;
    const void* expert_out = nullptr;  // combine: [L, W x M, H] bf16, dense

    // The receive layout (dispatch writes it, combine reads src_info and counts):
    void* recv_x = nullptr;            // [L, W x M, H] fp8 e4m3 (or bf16)
    float* recv_scales = nullptr;      // [L, W x M, H / 128] fp32 (fp8 only)
    int32_t* recv_src_info = nullptr;  // [L, W x M]: the source entry t x k + slot
    int32_t* recv_counts = nullptr;    // [L, W]: entries received from each source rank

    char* area = nullptr;  // symmetric: two parity halves of half_bytes, then (several nodes) the staging at
                           // area + 2 x half_bytes (ep_ll_dispatch_staging_bytes / ep_ll_combine_staging_bytes)
    int64_t half_bytes = 0;
    uint64_t* epochs = nullptr;    // this rank's [2][kEpLlMaxBlocks]: send and receive phase epochs of each block
    uint32_t* counters = nullptr;  // dispatch, this rank's [2][E]: slots taken and entries sent per expert in the
                                   // running send phase (zero between calls: the phase resets what it used)
    uint64_t* arrivals = nullptr;  // combine, this rank's: blocks that finished a receive phase, over all calls (the
                                   // last block of call e sees e x gridDim)
};

}  // namespace loom::kernels::moe
