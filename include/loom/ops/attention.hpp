// Attention ops: decode (decode_attention, sp_decode_attention) and Ulysses sequence parallelism (qkv_gemm_a2a,
// a2a_o_gemm). See docs/attention.md for the algorithms, layouts and limits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "loom/ops/gemm.hpp"
#include "loom/runtime/world.hpp"
#include "loom/tensor.hpp"

namespace loom {

// Frees all the state the attention ops keep in the World: sp_decode_attention's LL area and the Ulysses ops' buffers,
// signals and side streams (World::release_states("attention/"); release_ulysses_state frees the Ulysses part
// only). Collective: every rank calls it, with no attention op of this World in flight; synchronises the device when
// there is state to free. decode_attention keeps none in the World.
void release_attention_state(World& world);

// ---- decode ----------------------------------------------------------------------------------------------------
//
// One query token per sequence: O[b, h] = sum_t softmax_t(s_t) V[b, t, h / group], s_t = scale x q[b, h] . K[b, t,
// h / group] (with a soft-cap: softcap x tanh(s_t / softcap)), group = num_q_heads / num_kv_heads (MHA: 1, MQA:
// num_q_heads). LSE[b, h] = ln(sum_t exp(s_t)) (natural log, fp32). A sequence of length 0 gets O = 0, LSE = -inf.

// q [batch, num_heads, head_dim] (bf16 or f16, dense, 16-byte aligned), device memory.
struct DecodeQuery {
    const void* data = nullptr;
    DType dtype = DType::BF16;
    int batch = 0;
    int num_heads = 0;
    int head_dim = 0;  // 64, 128 or 256
};

// The KV cache, K and V of q's dtype, rows of head_dim elements (NHD: token-major, heads inside).
//   contiguous (block_table == nullptr): k, v [batch, max_seq_len, num_kv_heads, head_dim];
//   paged: k, v [num_pages, page_size, num_kv_heads, head_dim]; token t of sequence b lives in page
//          block_table[b * max_pages + t / page_size] (int32 [batch, max_pages], device), slot t % page_size.
// seq_lens (int32 [batch], device) holds each sequence's length, read on the device (no host synchronisation): a
// length above the capacity (max_seq_len, or max_pages x page_size) or DecodeOptions::max_seq_len, or a block-table
// entry outside [0, num_pages) that a length reaches, traps naming itself.
struct KvCache {
    const void* k = nullptr;
    const void* v = nullptr;
    int num_kv_heads = 0;
    const int32_t* seq_lens = nullptr;
    int64_t max_seq_len = 0;  // contiguous: tokens per sequence allocated
    const int32_t* block_table = nullptr;
    int max_pages = 0;  // paged: block-table columns
    int num_pages = 0;  // paged: pages in k and in v
    int page_size = 0;  // paged: 1 ... 256 tokens
};

// The decode kernel's shape (docs/attention.md "Decode kernel"). DecodeOptions::config; nullptr: the heuristic's.
struct DecodeConfig {
    int head_split = 1;       // 1 or 2: 128 x head_split threads, each 128-thread half holding its share of the
                              // block's query heads (and reading every K / V row of a tile from shared memory)
    int stages = 4;           // shared-memory stages, 2 ... 8: stages - 1 tiles in flight while one is consumed
    int tile_tokens = 0;      // tokens per stage: a multiple of 128 / (D / 8) x head_split, at most 8 per token lane
                              // (8 x 128 / (D / 8)); 0: 4096 / D (16 KiB of K + V per stage), 64 with mma
    int splits = 0;           // KV splits per sequence; 0: DecodeOptions::num_splits, else the heuristic's
    bool fused_merge = true;  // with more than one split the last split block merges them (else a second launch)
    bool mma = false;         // tensor-core consumers (mma.sync; D 64 or 128, head_split 1, tile_tokens a multiple of
                              // 64 up to 512): the block's heads as the rows of one 16-row operand
    std::string str() const;  // "hs1 st4 tile32 splits33 fused" (" mma" when set)
};

struct DecodeOptions {
    float scale = 0.f;    // 0: 1 / sqrt(head_dim)
    float softcap = 0.f;  // > 0: scores soft-capped (Gemma 2, Grok)
    // Upper bound on every seq_lens entry; 0: the cache's capacity. The split of the KV length over SMs is sized for
    // it, so a tight bound gives short sequences in a large cache more parallelism.
    int64_t max_seq_len = 0;
    int num_splits = 0;                    // KV splits per sequence; 0: chosen from the SM count (docs/attention.md)
    const DecodeConfig* config = nullptr;  // the kernel's shape; nullptr: the heuristic's (tuning and benchmarks)
};

// O (q's dtype, [batch, num_heads, head_dim], device) and LSE (fp32 [batch, num_heads], device; nullptr: not
// written). Enqueued on `stream`; never synchronises the host; CUDA-graph capturable once a call of the same shape
// ran eagerly (the split workspace grows outside capture only: the error says so). Raises loom::Error naming the
// argument for a bad shape, dtype, pointer or option.
void decode_attention(const DecodeQuery& q, const KvCache& kv, void* o, float* lse, cudaStream_t stream,
                      const DecodeOptions& opts = {});

// Sequence-parallel decode: each sequence's KV is sharded over the ranks of `world` (each rank passes its own shard
// as `kv` with its own lengths; a rank may hold 0 tokens of a sequence). Every rank gets the attention over the whole
// KV: O and LSE as decode_attention's over the concatenated shards (the order of the shards does not matter).
// Collective: every rank calls it with the same q shape, dtype and options (q itself is each rank's: normally the
// same; DecodeOptions::max_seq_len bounds each rank's shard up to that shard's capacity, so a rank holding fewer or
// no tokens passes the same options). One local decode launch and one combine launch that all-gathers the partials (as
// LL packets for few rows, as plain fp32 published by per-block flags for many) with no barrier and no host
// synchronisation: back-to-back calls and CUDA-graph capture work. The first call creates the state
// ("attention/sp_decode": an exchange area of world size x 8 MiB, symmetric) — collective and synchronising, so not
// inside a capture. Node-local worlds only.
void sp_decode_attention(World& world, const DecodeQuery& q, const KvCache& kv, void* o, float* lse,
                         cudaStream_t stream, const DecodeOptions& opts = {});

// ---- Ulysses sequence parallelism ------------------------------------------------------------------------------
// DeepSpeed-Ulysses' all-to-alls around attention, overlapped with the projections (docs/attention.md "Ulysses
// sequence parallelism"). W ranks split a sequence of S tokens (S / W each) and the heads (Hq / W q heads each):
//
//   qkv_gemm_a2a  x[S / W, hidden] * W_qkv[(Hq + 2 Hkv) D, hidden]^T, then heads <-> sequence: every rank ends with
//                 q[S, Hq / W, D], k[S, Hkv_r, D], v[S, Hkv_r, D] (the whole sequence, its heads).
//   a2a_o_gemm    o[S, Hq / W, D] (attention's output, its heads), then sequence <-> heads: o_shard[S / W, Hq D],
//                 out[S / W, hidden] = o_shard * W_o[hidden, Hq D]^T.
//
// Heads: rank r owns q heads [r Hq / W, (r + 1) Hq / W) and kv heads [floor(r Hkv / W), + Hkv_r), Hkv_r =
// max(Hkv / W, 1): W must divide Hq and Hq / Hkv must be whole; either W divides Hkv (each rank its Hkv / W kv heads)
// or Hkv divides W (each rank the one kv head of its q heads, replicated on W / Hkv ranks). Rows of a [S, heads, D]
// tensor are tokens in rank order: rank p's shard is rows [p S / W, (p + 1) S / W).
// Collective over the World (every rank the same shapes and options, in the same order); enqueued on `stream`
// without synchronising the host. bf16 or fp16 throughout, fp32 accumulation; D a multiple of 8; every buffer
// anywhere on the device (the ops stage through their own symmetric buffers). Single-node worlds, sm_90.
enum class UlyssesAlgo {
    Auto,        // Fused with more than one rank and a GPU per rank, else Sequential
    Fused,       // qkv_gemm_a2a: the GEMM publishes each tile and a side-stream kernel pulls this rank's head columns
                 // of every rank's tiles as they are stored; a2a_o_gemm: a side-stream kernel pushes o's row chunks
                 // to their owners while the GEMM's tiles wait for their chunks
    Sequential,  // loom::gemm, then the all-to-all kernel (a2a_o_gemm: the all-to-all, then loom::gemm): no overlap
};
const char* to_string(UlyssesAlgo a);

struct UlyssesHeads {
    int64_t q = 0;    // Hq: query heads (all ranks)
    int64_t kv = 0;   // Hkv: key / value heads (all ranks); Hq a multiple of it
    int64_t dim = 0;  // D
};

struct UlyssesOptions {
    UlyssesAlgo algo = UlyssesAlgo::Auto;
    int comm_sms = 0;                    // Fused: the all-to-all kernel's blocks; 0: 16 (at most a quarter of the SMs)
    const GemmConfig* config = nullptr;  // Fused: the GEMM's tile config (cluster_m 1); nullptr: the heuristic
    int num_sms = 0;                     // the SMs the op plans on; 0: the device's (under MPS the client's share)
};

// x: [S / W, hidden]; w_qkv: [(Hq + 2 Hkv) D, hidden] (rows: the q heads', then k's, then v's); q: [S, Hq / W x D];
// k, v: [S, Hkv_r x D] (row strides may exceed the widths).
void qkv_gemm_a2a(World& world, const MatrixView& x, const MatrixView& w_qkv, const UlyssesHeads& heads,
                  const MatrixView& q, const MatrixView& k, const MatrixView& v, cudaStream_t stream,
                  const UlyssesOptions& opts = {});
// o: [S, Hq / W x D]; w_o: [hidden, Hq D]; out: [S / W, hidden].
void a2a_o_gemm(World& world, const MatrixView& o, const MatrixView& w_o, const MatrixView& out, cudaStream_t stream,
                const UlyssesOptions& opts = {});

// Frees the Ulysses ops' state on this World only (World::release_states("attention/ulysses/")): buffers, signals,
// side streams; sp_decode_attention's stays. Collective, like release_attention_state.
void release_ulysses_state(World& world);

}  // namespace loom
