// loom::sp_decode_attention: the local decode of this rank's KV shard into fp32 split partials, then one combine
// launch (kernels/attention/sp_decode.cuh) that merges them, exchanges the rows' (O, LSE) as LL packets, directly or
// in two shots (SpExchange) and combines every rank's. State "attention/sp_decode": the exchange area, the direct and
// two-shot exchanges' flags and the per-block epochs.
#include <algorithm>
#include <optional>
#include <vector>

#include "loom/jit/jit.hpp"
#include "loom/kernels/attention/decode_params.hpp"
#include "loom/ops/attention.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "ops/attention/decode_plan.hpp"
#include "runtime/call_agreement.hpp"
#include "runtime/nvtx_range.hpp"
#include "runtime/symmetric_zeroed.hpp"

namespace loom::attention {

namespace ka = kernels::attention;

namespace {

// The exchange area ([parity 2][block kSpMaxBlocks][source W][kSpPacketsPerBlock] packets of 16 bytes: world size x 8
// MiB, symmetric, zeroed once), the direct and two-shot exchanges' flags ([block][source], and the two-shot combined
// rows' [block][owner]; symmetric, zeroed once) and the per-block epochs (this rank's, zeroed once, never reset).
// Created by the first call: collective, synchronising.
struct SpDecodeState final : WorldState {
    static constexpr const char* kKey = "attention/sp_decode";
    explicit SpDecodeState(World& world)
        : ll_bytes(std::size_t(2) * ka::kSpMaxBlocks * world.world_size() * ka::kSpPacketsPerBlock * 16) {
        LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&epoch), ka::kSpMaxBlocks * sizeof(uint64_t)));
        LOOM_CHECK_CUDA(cudaMemset(epoch, 0, ka::kSpMaxBlocks * sizeof(uint64_t)));
        ll = detail::alloc_zeroed(world, ll_bytes);  // synchronises the device (the memset above included)
        flags = detail::alloc_zeroed<uint64_t>(world, std::size_t(ka::kSpMaxBlocks) * world.world_size());
        final_flags = detail::alloc_zeroed<uint64_t>(world, std::size_t(ka::kSpMaxBlocks) * world.world_size());
    }
    ~SpDecodeState() override {
        cudaFree(epoch);
        for (void* p : retired) cudaFree(p);
        if (part != nullptr) cudaFree(part);
    }
    void release(World& world) override {
        world.free(ll);
        world.free(flags);
        world.free(final_flags);
    }

    // The local split partials, grown outside capture only; smaller buffers are kept (a captured graph may use them).
    float* partials(std::size_t bytes, cudaStream_t stream) {
        if (part_bytes >= bytes) return part;
        LOOM_CHECK(!stream_ops::capturing(stream),
                   "sp_decode_attention: the partials buffer must grow to {} bytes (has {}), which a CUDA-graph "
                   "capture does not allow: make a call of the same shape once without capturing first",
                   bytes, part_bytes);
        const std::size_t grown = std::max(bytes, 2 * part_bytes);
        void* p = nullptr;
        LOOM_CHECK_CUDA(cudaMalloc(&p, grown));
        if (part != nullptr) retired.push_back(part);
        part = static_cast<float*>(p);
        part_bytes = grown;
        return part;
    }

    std::size_t ll_bytes = 0;
    void* ll = nullptr;
    uint64_t* flags = nullptr;
    uint64_t* final_flags = nullptr;
    uint64_t* epoch = nullptr;
    float* part = nullptr;
    std::size_t part_bytes = 0;
    std::vector<float*> retired;
};

SpDecodeState& sp_state(World& world, cudaStream_t stream) {
    if (SpDecodeState* s = world.find_state<SpDecodeState>()) return *s;
    LOOM_CHECK(!stream_ops::capturing(stream),
               "sp_decode_attention: the state '{}' does not exist yet, and creating it synchronises the device, which "
               "a CUDA-graph capture does not allow: make the same call once without capturing first (a warm-up)",
               SpDecodeState::kKey);
    return world.state<SpDecodeState>();
}

}  // namespace

SpExchange sp_auto_exchange(std::size_t rows, int ranks, int head_dim) {
    if (rows < kSpDirectMinRows) return SpExchange::Packets;
    const std::size_t direct_bytes = rows * (std::size_t(head_dim) + 1) * 4 * std::size_t(std::max(ranks - 1, 0));
    return direct_bytes >= kSpTwoShotMinBytes ? SpExchange::TwoShot : SpExchange::Direct;
}

const char* to_string(SpExchange x) {
    switch (x) {
        case SpExchange::Auto:
            return "auto";
        case SpExchange::Packets:
            return "packets";
        case SpExchange::Direct:
            return "direct";
        case SpExchange::TwoShot:
            return "two_shot";
    }
    return "?";
}

jit::KernelSpec sp_combine_spec(DType dtype, int head_dim, SpExchange exchange) {
    jit::KernelSpec s;
    s.header = "loom/kernels/attention/sp_decode.cuh";
    s.name = exchange == SpExchange::Direct    ? "loom::kernels::attention::sp_decode_combine_direct"
             : exchange == SpExchange::TwoShot ? "loom::kernels::attention::sp_decode_combine_two_shot"
                                               : "loom::kernels::attention::sp_decode_combine";
    s.template_args = {dtype_cuda_name(dtype), std::to_string(head_dim)};
    // A timed-out poll posts to the diagnostic mailbox (decoded into the host's loom::Error) and traps, inline: the
    // out-of-line printing path would make ptxas save the combine loop's registers around its call.
    s.defines = {"LOOM_NO_DEVICE_PRINTF=1"};
    return s;
}

// Rows per combine block: spread over up to kSpMaxBlocks blocks, at most what one block's regions hold (as packets:
// D / 2 + 1 per row; directly: D + 1 floats per row; in two shots: sp_two_shot_max_own_rows per rank).
int sp_rows_per_block(std::size_t rows, int head_dim, SpExchange x, int ranks) {
    const int cap = x == SpExchange::Direct    ? ka::kSpRegionFloats / (head_dim + 1)
                    : x == SpExchange::TwoShot ? ka::sp_two_shot_max_own_rows(head_dim) * ranks
                                               : ka::kSpPacketsPerBlock / (head_dim / 2 + 1);
    const std::size_t want = (rows + ka::kSpMaxBlocks - 1) / ka::kSpMaxBlocks;
    return static_cast<int>(std::clamp<std::size_t>(want, 1, static_cast<std::size_t>(cap)));
}

namespace {
// What every rank must give alike: the query's shape and type, the heads, the softmax's scale and soft-cap (the merge
// of the ranks' partials assumes one) and the exchange. Each rank's cache, lengths, sequence bound, splits and kernel
// config are its own shard's: its partial is merged locally before the exchange.
detail::CallSignature sp_signature(const char* op, const DecodeQuery& q, const KvCache& kv, const DecodeOptions& o,
                                   SpExchange exchange) {
    detail::CallSignature s(op);
    s.add("q.batch", q.batch).add("q.num_heads", q.num_heads).add("q.head_dim", q.head_dim);
    s.add("q.dtype", detail::dtype_field(q.dtype)).add("kv.num_kv_heads", kv.num_kv_heads);
    s.add("DecodeOptions::scale", fmt::format("{}", o.scale))
        .add("DecodeOptions::softcap", fmt::format("{}", o.softcap));
    s.add("exchange", static_cast<int>(exchange));
    return s;
}
}  // namespace

void sp_decode_exchange(World& world, const DecodeQuery& q, const KvCache& kv, void* o, float* lse, cudaStream_t stream,
                        const DecodeOptions& opts, SpExchange exchange) {
    const detail::NvtxRange nvtx("loom::sp_decode_attention B={} Hq={} Hkv={} D={}", q.batch, q.num_heads,
                                 kv.num_kv_heads, q.head_dim);
    const char* op = "sp_decode_attention";
    auto checks = [&] {
        LOOM_CHECK(world.world_size() == world.local_world_size() && world.world_size() <= kMaxLocalPeers,
                   "{}: expected a node-local world of at most {} ranks, given {} ranks with {} on this node", op,
                   kMaxLocalPeers, world.world_size(), world.local_world_size());
        return plan_decode(op, q, kv, o, lse, opts, &world);
    };
    // Checking mode: every rank's checks and call agree before any exchange (the shards, and so the caches, differ);
    // the plan they make is kept.
    std::optional<DecodePlan> planned;
    const detail::AgreedCall agreed(
        world, [&] { return sp_signature(op, q, kv, opts, exchange); }, [&] { planned = checks(); });
    const DecodePlan plan = planned ? *planned : checks();
    SpDecodeState& st = sp_state(world, stream);
    const int W = world.world_size();
    if (exchange == SpExchange::Auto) exchange = sp_auto_exchange(plan.rows, W, plan.head_dim);

    kernels::attention::DecodeParams p = plan.params;
    auto* ws = st.partials(plan.workspace_bytes(/*partial=*/true), stream);
    p.part_o = ws;
    p.part_lse = ws + plan.rows * p.splits * plan.head_dim;
    p.o = nullptr;
    p.lse = nullptr;
    launch_decode_split(plan, p, stream);

    kernels::attention::SpParams sp{};
    sp.part_o = p.part_o;
    sp.part_lse = p.part_lse;
    sp.o = o;
    sp.lse = lse;
    sp.ll = st.ll;
    sp.flags = st.flags;
    sp.final_flags = st.final_flags;
    sp.epoch = st.epoch;
    sp.rows = static_cast<int32_t>(plan.rows);
    sp.splits = p.splits;
    sp.rows_per_block = sp_rows_per_block(plan.rows, plan.head_dim, exchange, W);
    sp.own_rows = (sp.rows_per_block + W - 1) / W;
    const jit::Kernel& k = jit::get_kernel(sp_combine_spec(plan.dtype, plan.head_dim, exchange));
    const Ctx ctx = world.ctx();
    // Rows beyond one launch's regions (kSpMaxBlocks x rows_per_block) take further launches.
    const std::size_t per_launch = std::size_t(ka::kSpMaxBlocks) * sp.rows_per_block;
    for (std::size_t row0 = 0; row0 < plan.rows; row0 += per_launch) {
        const std::size_t n = std::min(per_launch, plan.rows - row0);
        jit::LaunchConfig cfg;
        cfg.grid = dim3(static_cast<unsigned>((n + sp.rows_per_block - 1) / sp.rows_per_block));
        cfg.block = dim3(ka::kSpThreads);
        cfg.stream = stream;
        // Its launch overlaps the split kernel's tail: every thread waits in griddep_wait() (sp_block) first.
        cfg.programmatic = true;
        const int32_t r0 = static_cast<int32_t>(row0);
        k(cfg, ctx, sp, r0);
    }
}

}  // namespace loom::attention

namespace loom {

void sp_decode_attention(World& world, const DecodeQuery& q, const KvCache& kv, void* o, float* lse,
                         cudaStream_t stream, const DecodeOptions& opts) {
    attention::sp_decode_exchange(world, q, kv, o, lse, stream, opts, attention::SpExchange::Auto);
}

}  // namespace loom
