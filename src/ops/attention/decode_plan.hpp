// The decode launch (kernels/attention/decode.cuh), shared by decode_attention and sp_decode_attention: validation of
// the inputs, the choice of heads per block and of the split of the KV length, and the launches.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "loom/jit/jit.hpp"
#include "loom/kernels/attention/decode_params.hpp"
#include "loom/ops/attention.hpp"

namespace loom::attention {

// Most KV splits per sequence.
inline constexpr int kMaxSplits = 128;
// The widest tensor-core tile (tokens per stage): past it the stages' shared memory no longer fits in int.
inline constexpr int kMaxMmaTileTokens = 512;
// The split model's constants (decode_splits).
inline constexpr int kDecodeBlockOverheadBytes = 32 << 10;
inline constexpr double kDecodeSplitGain = 0.03;  // more splits only for a model gain above this
// The fewest heads per block the heuristic gives the tensor-core consumers (below: CUDA cores, where 16-row MMAs
// would be mostly padding).
inline constexpr int kDecodeMmaMinHeads = 4;

// Query heads one block holds for a KV group of `group` heads: the group rounded up to a power of two, at most
// kDecodeMaxHeads (a larger group is split over ceil(group / 8) blocks, each reading the group's K / V).
int decode_heads_per_block(int group);

// The heuristic's kernel shape for head_dim and heads per block (splits left 0). With at least kDecodeMmaMinHeads heads
// and D <= 128, tensor cores: 64-token tiles (32 KiB of K + V at D 128), 3 stages at D 128 and 4 at D 64. Otherwise
// CUDA cores: 4 stages of 4096 / D tokens (16 KiB each), one 128-thread half. Fewer stages where the device's shared
// memory per block (smem_per_block: its opt-in limit) is smaller.
DecodeConfig decode_default_config(int head_dim, int heads_per_block, int smem_per_block);
// Raises naming `op` unless `c` (tile_tokens resolved) is a valid shape for head_dim / heads per block that fits in
// smem_per_block bytes.
void check_decode_config(const char* op, const DecodeConfig& c, int head_dim, int heads_per_block, int smem_per_block);
// Every shape bench-attention's sweep times for head_dim / heads per block (the heuristic's among them).
std::vector<DecodeConfig> decode_sweep_configs(int head_dim, int heads_per_block, int smem_per_block);

// The pipeline depth for a launch whose busiest SM gets per_sm blocks (ceil(blocks / SMs)): c itself when
// resident(c) >= per_sm SM-resident blocks of it fit at once, else the deepest shallower shape (down to 2 stages, the
// tile kept) of which they do, else c. Blocks an SM runs after its resident ones start late, on whichever SMs free a
// slot first, and fill their pipelines alone; a shallower pipeline that holds them all at once streams as many bytes
// in flight per SM. On an H200 (bench-attention decode --sweep, 96/12 heads, batch 4, 384 blocks): 2 stages of 64
// tokens, 3 blocks per SM, took 56.8 / 188 / 711 us at kv 8K / 32K / 128K against 62.3 / 202 / 765 with 3 stages
// (2 per SM). With one block per SM the deeper pipeline stays (2 stages: up to 6 % slower there).
DecodeConfig decode_resident_config(DecodeConfig c, int64_t per_sm,
                                    const std::function<int(const DecodeConfig&)>& resident);

// Splits of the KV length: the count that minimises a model of the launch. base_blocks (batch x kv heads x head
// chunks) x splits blocks spread over num_sms SMs; one block saturates its SM, so the busiest SM runs its
// ceil(blocks / num_sms) blocks one after the other, each its chunk (a multiple of `tile`) plus a fixed overhead (the
// pipeline's fill, kDecodeBlockOverheadBytes of K + V); the fused merge adds splits x heads tokens; a count above the
// best so far must gain kDecodeSplitGain. Each split holds at least one tile; at most kMaxSplits; `requested` > 0
// wins. Measured on an H200 (bench-attention decode --sweep --splits, batch 1 / 4 / 16, kv 8K / 128K, 32/8 and 96/12
// heads): its picks within 8 % of the fastest count in each of the 12 cases (geometric mean 2 %), where counting two
// resident blocks of an SM as faster than one (a device-wide, fluid wave model) was up to 15 % off at batch 1.
int decode_splits(int64_t base_blocks, int64_t max_len, int tile, int head_dim, int heads, int num_sms, int requested);

struct DecodePlan {
    kernels::attention::DecodeParams params{};  // workspace pointers (part_o, part_lse, merge_counters) left null
    DecodeConfig config{};                      // resolved: tile_tokens and splits set
    int head_dim = 0;
    int heads_per_block = 0;
    int head_chunks = 0;
    int smem_bytes = 0;  // dynamic shared memory of the split kernel
    DType dtype = DType::BF16;
    std::size_t rows = 0;  // batch x num_q_heads
    // fp32 bytes of the split partials (part_o then part_lse) when params.splits > 1 (or when partial output is forced)
    std::size_t workspace_bytes(bool partial) const;
    std::size_t counters() const;  // the fused merge's counters: batch x kv heads x head chunks
};

// Validates every input (raises loom::Error naming the argument, what was expected and what was given; `world` may be
// null) and plans the launch for the current device.
DecodePlan plan_decode(const char* op, const DecodeQuery& q, const KvCache& kv, void* o, float* lse,
                       const DecodeOptions& opts, const World* world);

jit::KernelSpec decode_split_spec(DType dtype, int head_dim, int heads_per_block, const DecodeConfig& c);
jit::KernelSpec decode_merge_spec(DType dtype, int head_dim);
// Compiles (into the JIT's disk cache) the split kernels of `configs` for arch, on up to hardware-concurrency threads;
// needs no GPU. Returns each config's compile record, in order (raises the first compile error). The sweeps JIT a
// dozen shapes: one after the other that is a minute and more.
std::vector<jit::CompileResult> decode_precompile(DType dtype, int head_dim, int heads_per_block,
                                                  const std::vector<DecodeConfig>& configs, int arch);
// sp_decode.cpp. How the SP combine exchanges the partials: LL packets (small payloads: one hop), plain fp32 and one
// flag per block and source (large payloads: half the bytes), or in two shots (each rank combines a share of the rows
// and sends them back: about 1.5 x a rank's partials instead of W - 1 times them, for a second flag round trip).
enum class SpExchange { Auto, Packets, Direct, TwoShot };
inline constexpr std::size_t kSpDirectMinRows = 256;
// Auto's pick for `rows` rows of head_dim on `ranks` ranks: packets below kSpDirectMinRows rows; two shots where the
// direct exchange would send at least kSpTwoShotMinBytes from each rank (rows x (D + 1) fp32 to each of ranks - 1
// peers); direct otherwise. With ranks sharing one H200 (bench-attention sp, D 128) two shots took 354 us against
// the direct exchange's 382 at 8 ranks x 4096 rows (15 MB sent per rank), 567 against 565 at 8 x 2048 (7 MB) and 301
// against 298 at 4 x 4096 (6 MB).
inline constexpr std::size_t kSpTwoShotMinBytes = std::size_t(8) << 20;
SpExchange sp_auto_exchange(std::size_t rows, int ranks, int head_dim);
const char* to_string(SpExchange x);
jit::KernelSpec sp_combine_spec(DType dtype, int head_dim, SpExchange exchange = SpExchange::Packets);
// loom::sp_decode_attention with the exchange given (benchmarks time both).
void sp_decode_exchange(World& world, const DecodeQuery& q, const KvCache& kv, void* o, float* lse, cudaStream_t stream,
                        const DecodeOptions& opts, SpExchange exchange);

// The split kernel with p (its outputs set: o / lse, or part_o / part_lse).
void launch_decode_split(const DecodePlan& plan, const kernels::attention::DecodeParams& p, cudaStream_t stream);
// The merge of p.splits partials into o / lse.
void launch_decode_merge(const DecodePlan& plan, const kernels::attention::DecodeParams& p, cudaStream_t stream);

// A device buffer of at least `bytes` for `stream`'s launches on the current device, grown outside CUDA-graph capture
// only (raises naming `op` when a capture would need it to grow). Buffers are never freed before process exit: a
// graph captured earlier may hold a smaller one.
// zeroed: the buffer (a separate one) is zero when allocated; the fused merge's counters, which every launch leaves 0.
void* decode_workspace(const char* op, std::size_t bytes, cudaStream_t stream, bool zeroed = false);

}  // namespace loom::attention
