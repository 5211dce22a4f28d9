// Plain data shared by the decode-attention kernels (kernels/attention/decode.cuh, sp_decode.cuh) and their host
// launchers (src/ops/attention/). Compiles under the host compiler, nvcc and NVRTC.
#pragma once

#include "loom/config.hpp"

namespace loom::kernels::attention {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// A decode block is 128 x head_split threads; in each 128-thread half a token's head row of D elements is read by
// D / 8 lanes, 16 bytes each, so a half has 128 / (D / 8) token lanes.
LOOM_HOST_DEVICE constexpr int decode_token_lanes(int head_dim) { return 128 / (head_dim / 8); }
// Most query heads one decode block holds (a KV group larger than this is split over blocks, each reading K / V).
inline constexpr int kDecodeMaxHeads = 8;
// Threads of an SP-decode combine block, and the most blocks one launch may use (about one per SM: the combine's
// loops are latency-bound, so many rows want many blocks).
inline constexpr int kSpThreads = 256;
inline constexpr int kSpMaxBlocks = 128;
// Packets one SP-decode block handles per source (the fixed stride of its region of the LL area), and the fp32 values
// the same region holds in the direct exchange.
inline constexpr int kSpPacketsPerBlock = 2048;
inline constexpr int kSpRegionFloats = kSpPacketsPerBlock * 4;

// Block-table slots of decode_split's ring (one int32 per token row of a tile): the entries of a tile are copied
// `stages` tiles ahead of the tile itself, and the prologue holds 2 stages - 1 tiles' entries at once.
LOOM_HOST_DEVICE constexpr int decode_table_slots(int stages) { return 2 * stages - 1; }

// Dynamic shared memory of decode_split<T, D, heads, head_split, stages, tile> (2-byte T): the larger of the K / V
// pipeline (stages x tile x D of K and of V) with the block-table ring after it (decode_table_slots x tile int32) and
// the sequence's block-table row pointer (16 bytes kept), and the token lanes' final (acc, m, l) in fp32.
LOOM_HOST_DEVICE constexpr int decode_split_smem_bytes(int head_dim, int heads, int stages, int tile) {
    const int pipeline = 2 * stages * tile * head_dim * 2 + decode_table_slots(stages) * tile * 4 + 16;
    const int lanes = decode_token_lanes(head_dim) * heads * (head_dim + 2) * 4;
    return pipeline > lanes ? pipeline : lanes;
}

// One decode launch: grid (head_chunks, splits, batch x num_kv_heads), 128 x head_split threads.
//
// The KV cache is paged: token t of sequence b lives in page block_table[b * max_pages + t / page_size], slot
// t % page_size, as K[page][slot][kv_head][0, D) (likewise V). A contiguous cache [batch, max_seq_len, Hkv, D] is the
// same with block_table null, page b and page_size = max_seq_len (1 when that is 0).
struct DecodeParams {
    const void* q;  // [batch, num_q_heads, D] of T
    const void* k;  // pages [num_pages, page_size, num_kv_heads, D] of T
    const void* v;
    const int32_t* block_table;  // [batch, max_pages]; null: contiguous (page b)
    const int32_t* seq_lens;     // [batch] tokens of each sequence, read on the device
    void* o;          // [batch, num_q_heads, D] of T: written when splits == 1, or by the fused merge; null: partials
    float* lse;       // [batch, num_q_heads], natural log; null: not written
    float* part_o;    // [batch, num_q_heads, splits, D] fp32, normalised: written when splits > 1 or o null
    float* part_lse;  // [batch, num_q_heads, splits], log2 domain; -inf for a split without tokens
    // Fused merge: [batch x num_kv_heads x head_chunks] arrival counters, 0 between launches (each launch's last
    // split block wraps its counter back to 0); set with splits > 1 and o, the last split block of each counter
    // merges the partials into o / lse. Null: the partials stay for decode_merge (or sp_decode's combine).
    uint32_t* merge_counters;
    int32_t batch, num_q_heads, num_kv_heads;
    int32_t group;      // num_q_heads / num_kv_heads
    int32_t max_pages;  // block table columns
    int32_t page_size;
    int32_t num_pages;
    int32_t splits;
    int32_t chunk;        // tokens per split (a multiple of the block's step)
    int32_t max_seq_len;  // a sequence longer traps (the splits cover only this many tokens)
    float scale_log2;     // softmax scale x log2(e)
    float scale;          // softmax scale
    float softcap;        // > 0: s = softcap x tanh(scale x q.k / softcap)
};

// The combine of split partials (decode_merge) and of ranks' partials (sp_decode): rows of num_q_heads x batch.
struct MergeParams {
    const float* part_o;    // [rows, splits, D]
    const float* part_lse;  // [rows, splits], log2
    void* o;                // [rows, D] of T
    float* lse;             // [rows], natural log; null: not written
    int32_t rows, splits;
};

// SP decode: the local split partials of every row, exchanged and combined on every rank. As LL16 packets
// (sp_decode_combine), a row's packets: D / 2 packets of the merged local O (two fp32 each), then one {lse (log2), 0}.
// Directly (sp_decode_combine_direct), a region holds the rows' merged O ([rows_per_block][D] fp32) and then their
// LSEs (log2), published by one flag per block and source. In two shots (sp_decode_combine_two_shot), region (b,
// source q) of rank p holds q's merged O and LSE of the rows p owns ([own_rows][D] fp32, [own_rows] log2), then, from
// offset sp_two_shot_final_offset, the combined rows q owns ([own_rows][D] of T, [own_rows] natural-log LSE).
struct SpParams {
    const float* part_o;    // [rows, splits, D] this rank's split partials
    const float* part_lse;  // [rows, splits]
    void* o;                // [rows, D] of T
    float* lse;             // [rows] natural log; null: not written
    void* ll;               // the LL area (symmetric): [parity 2][block kSpMaxBlocks][source W][kSpPacketsPerBlock]
    uint64_t* epoch;        // [kSpMaxBlocks] per-block call counters (this rank's device memory)
    uint64_t* flags;        // direct: [kSpMaxBlocks][source W] (symmetric) the epoch a source's region is complete at
    uint64_t*
        final_flags;  // two shots: [kSpMaxBlocks][owner W] (symmetric) the epoch an owner's combined rows landed at
    int32_t rows, splits;
    int32_t rows_per_block;  // rows [b * rows_per_block, +rows_per_block) go to block b
    int32_t own_rows;        // two shots: block rows [q * own_rows, +own_rows) are combined by rank q
};

// Two shots: the float offset of the combined rows in a region (after own_rows x (D + 1) floats, 16-byte aligned),
// and the most rows a rank owns per block that one region holds (the partials, the T rows and their LSEs).
LOOM_HOST_DEVICE constexpr int sp_two_shot_final_offset(int own_rows, int head_dim) {
    return (own_rows * (head_dim + 1) + 3) / 4 * 4;
}
LOOM_HOST_DEVICE constexpr int sp_two_shot_max_own_rows(int head_dim) {
    return (kSpRegionFloats - 3) / (head_dim + 1 + head_dim / 2 + 1);
}

}  // namespace loom::kernels::attention
