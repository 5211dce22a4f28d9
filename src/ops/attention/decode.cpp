// loom::decode_attention: validate, plan the split of the KV length, launch the split kernel (and the merge of the
// splits' partials when there is more than one).
#include <fmt/format.h>

#include "loom/ops/attention.hpp"
#include "ops/attention/decode_plan.hpp"
#include "runtime/nvtx_range.hpp"

namespace loom {

void decode_attention(const DecodeQuery& q, const KvCache& kv, void* o, float* lse, cudaStream_t stream,
                      const DecodeOptions& opts) {
    const detail::NvtxRange nvtx("loom::decode_attention B={} Hq={} Hkv={} D={}", q.batch, q.num_heads, kv.num_kv_heads,
                                 q.head_dim);
    const attention::DecodePlan plan = attention::plan_decode("decode_attention", q, kv, o, lse, opts, nullptr);
    kernels::attention::DecodeParams p = plan.params;
    if (p.splits == 1) {
        attention::launch_decode_split(plan, p, stream);
        return;
    }
    auto* ws =
        static_cast<float*>(attention::decode_workspace("decode_attention", plan.workspace_bytes(false), stream));
    p.part_o = ws;
    p.part_lse = ws + plan.rows * p.splits * plan.head_dim;
    if (plan.config.fused_merge) {  // the last split block of each (sequence, kv head, head chunk) merges
        p.merge_counters = static_cast<uint32_t*>(attention::decode_workspace(
            "decode_attention", plan.counters() * sizeof(uint32_t), stream, /*zeroed=*/true));
        attention::launch_decode_split(plan, p, stream);
        return;
    }
    p.o = nullptr;  // the split kernel writes partials only
    attention::launch_decode_split(plan, p, stream);
    p.o = o;
    attention::launch_decode_merge(plan, p, stream);
}

std::string DecodeConfig::str() const {
    return fmt::format("hs{} st{} tile{} splits{} {}{}", head_split, stages, tile_tokens, splits,
                       fused_merge ? "fused" : "merge-launch", mma ? " mma" : "");
}

}  // namespace loom

// Declared in loom/ops/attention.hpp.
void loom::release_attention_state(World& world) { world.release_states("attention/"); }
