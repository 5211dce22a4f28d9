// Plain data of the TP-MoE ops' fused algorithms (kernels/moe/tp_moe.cuh), shared by the host launchers
// (src/ops/moe/tp/fused_ag.cpp, fused_rs.cpp) and the device code. Compiles under the host compiler, nvcc and NVRTC.
//
// Signal conventions: every signal is a 64-bit value in the symmetric heap, zeroed once when the algorithm's state is
// created and never reset. The value is the call number e (1, 2, ...) of the algorithm on this World, counted on the
// host (the ops are collective: every rank makes the same calls in the same order), set with release semantics by the
// last of the sender's blocks to finish (a cumulative ticket of the sender's blocks), and waited for with `>= e`
// (acquire, bounded).
#pragma once

#include "loom/config.hpp"

namespace loom::kernels::moe {

// Threads of the fused ops' communication kernels.
inline constexpr int kTpMoeThreads = 512;

// ag_moe, Fused: arrived[r] at rank d = the last call whose rank r's routed rows landed in d's gather half.
struct MoeAgSignals {
    uint64_t arrived[kMaxLocalPeers];
};

// moe_rs, Fused: reduced[q] at rank d = the last call whose rank q's top-k reduced partial sums of d's tokens landed
// in d's receive half (slot q).
struct MoeRsSignals {
    uint64_t reduced[kMaxLocalPeers];
};

// moe_ar, Fused: reduced[q] at rank d = the last call whose rank q's top-k reduced partial sums of every token landed
// in d's receive half (slot q).
struct MoeArSignals {
    uint64_t reduced[kMaxLocalPeers];
};

// moe_ag_push: this rank's routed rows [offsets[me E], offsets[(me + 1) E]) of the gathered layout, gathered from its
// own tokens x (row_tokens are gathered token ids: rank me's are [me T_loc, (me + 1) T_loc); -1 padding: zeros), into
// the same rows of every rank's gather half; then arrived[me] := epoch at every rank.
struct MoeAgPushParams {
    const void* x;              // [t_loc, row_words] words of 16 bytes, dense
    void* gather;               // this call's half of the symmetric gather buffer (this rank's address), dense rows
    const int32_t* offsets;     // the gathered routing's [G + 1]
    const int32_t* row_tokens;  // the gathered routing's [max_rows]
    MoeAgSignals* sig;          // symmetric
    uint64_t* ticket;           // local, one counter: blocks of this rank's pushes that finished (cumulative)
    uint64_t ticket_target;     // the blocks of every push so far, this call's included: its last block sees it
    uint64_t epoch;
    int64_t row_words;                 // 16-byte words per row (H x element size / 16)
    int32_t t_loc, num_experts, rows;  // rows: the routing's max_rows (offsets are clamped to [0, rows])
    int32_t pad;
};

// The grouped GEMM's hooks of ag_moe Fused (MoeAgHooks): wait for a group's source rank's rows, own groups first.
struct MoeAgHookArgs {
    const uint64_t* arrived;  // this rank's MoeAgSignals::arrived
    uint64_t epoch;
    uint64_t timeout_ns;  // 0: unbounded
    int32_t me;           // local rank: its groups are pushed before the GEMM, in stream order (no wait)
    int32_t num_experts;
    int32_t first_group;  // me x E: the rotated order starts there
    int32_t pad;
};

// The grouped GEMM's hooks of moe_rs Fused (MoeRsHooks): peers' groups first (starting with rank me + 1's), own last;
// every stored tile adds 1 to done[its group's source rank] (release, gpu).
struct MoeRsHookArgs {
    uint64_t* done;  // local [kMaxLocalPeers], cumulative tile counts
    int32_t num_experts;
    int32_t first_group;
};

// moe_rs_reduce_send: per source rank r (me + 1, me + 2, ..., me), once the GEMM stored every tile of r's groups
// (done[r] >= expected[e % 2][r] = expected[(e - 1) % 2][r] + r's tiles of this call), the top-k reduce (fp32) of
// r's tokens' rows of the partial product, stored into slot me of r's receive half (fp32 [W][t_loc][H]); the last
// block sets reduced[me] := epoch at r. Then this rank's tokens: out = sum over slots q (rank order) after
// reduced[q] >= epoch for every peer q.
struct MoeRsReduceParams {
    const void* partial;       // [rows, h] of the output type, dense: the grouped GEMM's output
    void* out;                 // [t_loc, h] dense
    float* recv;               // this call's half of the symmetric receive buffer (this rank's address)
    const int32_t* offsets;    // [G + 1]
    const int32_t* dest_rows;  // [W t_loc, k]
    const float* weights;      // [W t_loc, k]
    const uint64_t* done;      // local [kMaxLocalPeers] (MoeRsHookArgs::done)
    uint64_t* expected;        // local [2][kMaxLocalPeers]: cumulative tile targets by call parity
    uint64_t* ticket;          // local [kMaxLocalPeers]: blocks that finished their share for rank r (cumulative)
    MoeRsSignals* sig;         // symmetric
    uint64_t ticket_target;    // the blocks of every call so far, this call's included (per rank r)
    uint64_t epoch;
    int64_t h;
    int32_t t_loc, topk, num_experts, rows;  // rows: the routing's max_rows (offsets clamped to [0, rows])
    int32_t block_m, num_n;                  // the GEMM's tiles: BLOCK_M rows, num_n column blocks
};

// moe_ar_reduce_push: once the grouped GEMM (MoeRsHooks with one source rank: done[0] counts every stored tile) stored
// every tile of this call (done[0] >= expected[e % 2] = expected[(e - 1) % 2] + this call's tiles), the top-k reduce
// (fp32) of every token's rows of the partial product, pushed into slot me of every rank's receive half (fp32
// [W][tokens][H]); the last block sets reduced[me] := epoch at every rank. Then out = the sum over slots q (rank
// order: the same bits on every rank) after reduced[q] >= epoch for every peer q.
struct MoeArReduceParams {
    const void* partial;       // [rows, h] of the output type, dense: the grouped GEMM's output
    void* out;                 // [tokens, h] dense
    float* recv;               // this call's half of the symmetric receive buffer (this rank's address)
    const int32_t* offsets;    // [E + 1]
    const int32_t* dest_rows;  // [tokens, k]
    const float* weights;      // [tokens, k]
    const uint64_t* done;      // local, one counter (MoeRsHookArgs::done)
    uint64_t* expected;        // local [2]: cumulative tile targets by call parity
    uint64_t* ticket;          // local, one counter: blocks that finished their pushes (cumulative)
    MoeArSignals* sig;         // symmetric
    uint64_t ticket_target;    // the blocks of every call so far, this call's included
    uint64_t epoch;
    int64_t h;
    int32_t tokens, topk, num_experts, rows;  // rows: the routing's max_rows (offsets clamped to [0, rows])
    int32_t block_m, num_n;                   // the GEMM's tiles: BLOCK_M rows, num_n column blocks
};

}  // namespace loom::kernels::moe
