// Attention ops. See docs/attention.md for the algorithms, layouts and limits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "loom/runtime/world.hpp"
#include "loom/tensor.hpp"

namespace loom {

// Frees the state the attention ops keep in the World (World::release_states("attention/")). Collective: every
// rank calls it, with no attention op of this World in flight.
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

struct DecodeOptions {
    float scale = 0.f;    // 0: 1 / sqrt(head_dim)
    float softcap = 0.f;  // > 0: scores soft-capped (Gemma 2, Grok)
    // Upper bound on every seq_lens entry; 0: the cache's capacity. The split of the KV length over SMs is sized for
    // it, so a tight bound gives short sequences in a large cache more parallelism.
    int64_t max_seq_len = 0;
    int num_splits = 0;  // KV splits per sequence; 0: chosen from the SM count (docs/attention.md)
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
// same). One local decode launch and one combine launch that all-gathers the partials as LL packets (no barrier,
// no host synchronisation): back-to-back calls and CUDA-graph capture work. The first call creates the state
// ("attention/sp_decode": an LL area of world size x 4 MiB, symmetric) — collective and synchronising, so not inside
// a capture. Node-local worlds only.
void sp_decode_attention(World& world, const DecodeQuery& q, const KvCache& kv, void* o, float* lse,
                         cudaStream_t stream, const DecodeOptions& opts = {});

}  // namespace loom
