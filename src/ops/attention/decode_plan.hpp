// The decode launch (kernels/attention/decode.cuh), shared by decode_attention and sp_decode_attention: validation of
// the inputs, the choice of heads per block and of the split of the KV length, and the launches.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "loom/jit/jit.hpp"
#include "loom/kernels/attention/decode_params.hpp"
#include "loom/ops/attention.hpp"

namespace loom::attention {

// Most KV splits per sequence.
inline constexpr int kMaxSplits = 128;

// Query heads one block holds for a KV group of `group` heads: the group rounded up to a power of two, at most
// kDecodeMaxHeads (a larger group is split over ceil(group / 8) blocks, each reading the group's K / V).
int decode_heads_per_block(int group);
// Splits of the KV length: enough blocks for about two per SM (batch x kv heads x head chunks x splits), each split
// at least 256 tokens (or one step) long, at most kMaxSplits; `requested` > 0 overrides the count.
int decode_splits(int64_t blocks_per_split, int64_t max_len, int step, int num_sms, int requested);

struct DecodePlan {
    kernels::attention::DecodeParams params{};  // workspace pointers (part_o, part_lse) left null
    int head_dim = 0;
    int heads_per_block = 0;
    int head_chunks = 0;
    DType dtype = DType::BF16;
    std::size_t rows = 0;  // batch x num_q_heads
    // fp32 bytes of the split partials (part_o then part_lse) when params.splits > 1 (or when partial output is forced)
    std::size_t workspace_bytes(bool partial) const;
};

// Validates every input (raises loom::Error naming the argument, what was expected and what was given; `world` may be
// null) and plans the launch for the current device.
DecodePlan plan_decode(const char* op, const DecodeQuery& q, const KvCache& kv, void* o, float* lse,
                       const DecodeOptions& opts, const World* world);

jit::KernelSpec decode_split_spec(DType dtype, int head_dim, int heads_per_block);
jit::KernelSpec decode_merge_spec(DType dtype, int head_dim);
jit::KernelSpec sp_combine_spec(DType dtype, int head_dim);  // sp_decode.cpp

// The split kernel with p (its outputs set: o / lse, or part_o / part_lse).
void launch_decode_split(const DecodePlan& plan, const kernels::attention::DecodeParams& p, cudaStream_t stream);
// The merge of p.splits partials into o / lse.
void launch_decode_merge(const DecodePlan& plan, const kernels::attention::DecodeParams& p, cudaStream_t stream);

// A device buffer of at least `bytes` for `stream`'s launches on the current device, grown outside CUDA-graph capture
// only (raises naming `op` when a capture would need it to grow). Buffers are never freed before process exit: a
// graph captured earlier may hold a smaller one.
void* decode_workspace(const char* op, std::size_t bytes, cudaStream_t stream);

}  // namespace loom::attention
