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

// moe_rs / moe_ar, Fused: landed[e % 2] at rank d counts, over the calls e of that parity, the ranks whose top-k
// reduced partial sums for d landed in d's receive half of the call (each rank adds 1 per call, release, sys): once it
// reaches W x (calls of that parity so far) every rank's slot of call e is in place. A rank adds for call e + 2 only
// after its stream waited, in call e + 1, for this rank's sums of call e + 1, which follow this rank's wait of call
// e: the counts of two calls of one parity never mix.
struct MoeDownSignals {
    uint64_t landed[2];
};

// moe_ag_push: this rank's routing entries (its tokens' top-k slots, entries [me T_loc k, (me + 1) T_loc k) of the
// gathered routing) copied from its own tokens x into their rows (dest_rows) of every rank's gather half, and zeros
// into every padding row of this rank's own half (local: no rank writes another's padding); then arrived[me] := epoch
// at every rank. Any layout: source-major (W x E groups) or expert-major (E groups).
struct MoeAgPushParams {
    const void* x;             // [t_loc, row_words] words of 16 bytes, dense
    void* gather;              // this call's half of the symmetric gather buffer (this rank's address), dense rows
    const int32_t* offsets;    // the gathered routing's [G + 1]
    const int32_t* counts;     // the gathered routing's [G]: rows with a token (the rest of a group is padding)
    const int32_t* dest_rows;  // the gathered routing's [W t_loc, k]
    MoeAgSignals* sig;         // symmetric
    uint64_t* ticket;          // local, one counter: blocks of this rank's pushes that finished (cumulative)
    uint64_t ticket_target;    // the blocks of every push so far, this call's included: its last block sees it
    uint64_t epoch;
    int64_t row_words;                // 16-byte words per row (H x element size / 16)
    int32_t t_loc, topk, num_groups;  //
    int32_t rows;                     // the routing's max_rows (offsets are clamped to [0, rows])
};

// The grouped GEMM's hooks of ag_moe Fused (MoeAgHooks), any layout. A tile's real rows (the first counts[g] of group
// g; moe_route keeps a group's rows in token order) hold the tokens of the source ranks [rank of its first row, rank
// of its last real row]; before its A rows are loaded it waits for arrived[r] >= epoch of each of them but this rank
// (pushed before the GEMM, in stream order), and a tile of padding rows only waits for nothing. Tiles in grouped
// raster order rotated to start at group first_group (source-major: this rank's first group, own rows first).
struct MoeAgHookArgs {
    const uint64_t* arrived;    // this rank's MoeAgSignals::arrived
    const int32_t* offsets;     // the gathered routing's [G + 1]
    const int32_t* counts;      // [G]
    const int32_t* row_tokens;  // [rows]: gathered token ids
    uint64_t epoch;
    uint64_t timeout_ns;  // 0: unbounded
    int32_t me, world;    // local rank and the world size
    int32_t t_loc;        // tokens per rank (rank of gathered token t: t / t_loc)
    int32_t rows;         // the routing's max_rows
    int32_t block_m;      // the GEMM's BLOCK_M
    int32_t first_group;
};

// The grouped GEMM's hooks of moe_rs Fused (MoeRsHooks): peers' groups first (starting with rank me + 1's), own last;
// every stored tile adds 1 to done[its group's source rank] (release, gpu).
struct MoeRsHookArgs {
    uint64_t* done;  // local [kMaxLocalPeers], cumulative tile counts
    int32_t num_experts;
    int32_t first_group;
};

// The down projection's reduce kernels (moe_rs_reduce_send, moe_ar_reduce_push) share their work through a claim
// counter: items are chunks of `chunk` tokens, claimed in a fixed order by blocks of any launch of the call (the side
// launch beside the GEMM and the launch after it), each block's last claim failing. The final sums are a kernel of
// their own (moe_tp_sum_slots) after stream waits for every rank's items.
//
// Tokens in one item: chunk x topk (row, weight) pairs are staged in shared memory.
inline constexpr int kTpMoeMaxChunkEntries = 1024;

// moe_rs_reduce_send: items W x chunks, chunks = ceil(t_loc / chunk). Item pos x chunks + c: source rank
// r = me + 1 + pos (mod W, the GEMM's order), tokens [c chunk, (c + 1) chunk) of r: once the GEMM stored every tile of
// r's groups (side launch: done[r] >= expected[e % 2][r] = expected[(e - 1) % 2][r] + r's tiles of this call, written
// by one launch of the call, with r's tiles counted only when the GEMM counts them (`counted`: it runs with
// MoeRsHooks exactly when there is a side launch); the launch after the GEMM needs no wait), their weighted top-k sums
// (fp32, slot order) rounded to out's type into slot me of r's receive half ([W][t_loc][H] of out's type); the block
// that completes r's last chunk adds 1 to landed[epoch % 2] at r (the own slot included).
struct MoeRsReduceParams {
    const void* partial;       // [rows, h] of the output type, dense: the grouped GEMM's output
    void* recv;                // this call's half of the symmetric receive buffer (this rank's address), out's type
    const int32_t* offsets;    // [G + 1]
    const int32_t* dest_rows;  // [W t_loc, k]
    const float* weights;      // [W t_loc, k]
    const uint64_t* done;      // local [kMaxLocalPeers] (MoeRsHookArgs::done)
    uint64_t* expected;        // local [2][kMaxLocalPeers]: cumulative tile targets by call parity (side launch)
    uint64_t* ticket;          // local [kMaxLocalPeers]: chunks of source rank r sent (cumulative)
    uint64_t* work;            // local, one counter: claims of every launch so far (cumulative)
    MoeDownSignals* sig;       // symmetric
    uint64_t ticket_target;    // chunks per source rank over every call so far, this call's included
    uint64_t work_base;        // *work before this call's launches
    uint64_t epoch;
    int32_t t_loc, topk, num_experts, rows;  // rows: the routing's max_rows (offsets clamped to [0, rows])
    int32_t block_m, num_n;                  // the GEMM's tiles: BLOCK_M rows, num_n column blocks
    int32_t row_words;                       // 16-byte words of out's type per row (H x elem / 16)
    int32_t chunk, chunks;                   // tokens per item (chunk x topk <= kTpMoeMaxChunkEntries), items per rank
    int32_t after_gemm;                      // 1: launched after the GEMM on its stream (no tile waits)
    int32_t write_expected;                  // 1 in one launch per call: its block 0 writes expected[e % 2]
    int32_t counted;                         // 1: the GEMM counts its tiles in done (MoeRsHooks); 0: the targets stay
};

// moe_ar_reduce_push, launched after the grouped GEMM on its stream: items chunks = ceil(tokens / chunk). Item c:
// tokens [c chunk, (c + 1) chunk): their weighted top-k sums (fp32, slot order) rounded to out's type, pushed into slot
// me of every rank's receive half ([W][tokens][H] of out's type); the block that completes the last chunk sets
// landed[epoch % 2] += 1 at every rank (this one included).
struct MoeArReduceParams {
    const void* partial;       // [rows, h] of the output type, dense: the grouped GEMM's output
    void* recv;                // this call's half of the symmetric receive buffer (this rank's address), out's type
    const int32_t* dest_rows;  // [tokens, k]
    const float* weights;      // [tokens, k]
    uint64_t* ticket;          // local, one counter: chunks pushed (cumulative)
    uint64_t* work;            // local, one counter: claims of every launch so far (cumulative)
    MoeDownSignals* sig;       // symmetric
    uint64_t ticket_target;    // chunks over every call so far, this call's included
    uint64_t work_base;        // *work before this call's launch
    uint64_t epoch;
    int32_t tokens, topk, rows;  // rows: the routing's max_rows
    int32_t row_words;           // 16-byte words of out's type per row (H x elem / 16)
    int32_t chunk, chunks;       // tokens per item (chunk x topk <= kTpMoeMaxChunkEntries), items: ceil(tokens / chunk)
    int32_t pad;
};

// moe_tp_sum_slots (moe_rs / moe_ar final sums), launched after the stream waited for every rank's sums (landed):
// out's tokens = the W slots of the receive half summed (fp32, rank order), rounded to out's type; block b takes the
// chunks b, b + grid, ...
struct MoeTpSumParams {
    const void* recv;   // this call's half of the symmetric receive buffer (this rank's address): [W][tokens][H]
    void* out;          // [tokens, h] dense
    int32_t tokens;     // tokens of out (moe_rs: t_loc; moe_ar: the batch)
    int32_t row_words;  // 16-byte words of out's type per row
    int32_t chunk, chunks;
};

}  // namespace loom::kernels::moe
