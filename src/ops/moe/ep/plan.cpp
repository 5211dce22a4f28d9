// The EP throughput mode's buffer layouts and block counts (pure functions: tests/unit/test_moe_ep_layout.cpp).
#include <algorithm>

#include "ops/moe/ep/ep.hpp"

namespace loom::moe::ep {

namespace {
std::size_t up(std::size_t b) { return (b + 255) / 256 * 256; }
}  // namespace

DataLayout data_layout(int64_t rows, int64_t hidden, int topk, bool staged) {
    const auto R = static_cast<std::size_t>(std::max<int64_t>(rows, 1));
    const auto row_bytes = static_cast<std::size_t>(hidden) * 2;
    DataLayout l;
    std::size_t at = 0;
    l.recv_x = at, at += up(R * row_bytes);
    l.combine_rows = at, at += up(R * row_bytes);
    l.pair_rows = at, at += up(R * static_cast<std::size_t>(topk) * 4);
    l.pair_weights = at, at += up(R * static_cast<std::size_t>(topk) * 4);
    if (staged) {
        l.stage_x = at, at += up(R * row_bytes);
        l.stage_rows = at, at += up(R * static_cast<std::size_t>(topk) * 4);
        l.stage_weights = at, at += up(R * static_cast<std::size_t>(topk) * 4);
    }
    l.bytes = at;
    return l;
}

int layout_chunks(int64_t tokens, int topk) {
    const int64_t entries = tokens * topk;
    return static_cast<int>(std::max<int64_t>(1, (entries + kernels::moe::kEpChunk - 1) / kernels::moe::kEpChunk));
}

LocalLayout local_layout(int64_t tokens, int topk, int num_experts, int world) {
    const auto C = static_cast<std::size_t>(num_experts + world);
    const auto T = static_cast<std::size_t>(std::max<int64_t>(tokens, 1));
    const auto L = static_cast<std::size_t>(num_experts / world);
    LocalLayout l;
    std::size_t at = 0;
    l.chunk_counts = at, at += up(static_cast<std::size_t>(layout_chunks(tokens, topk)) * C * 4);
    l.recv_offsets = at, at += up((L + 1) * 4);
    l.recv_counts = at, at += up(L * 4);
    l.send_base = at, at += up(static_cast<std::size_t>(num_experts) * 4);
    l.pair_base = at, at += up(static_cast<std::size_t>(world) * 4);
    l.entry_row = at, at += up(T * static_cast<std::size_t>(topk) * 4);
    l.token_pair = at, at += up(T * static_cast<std::size_t>(world) * 4);
    l.send_prefix = at, at += up((static_cast<std::size_t>(num_experts) + 1) * 4);
    l.send_entry = at, at += up(T * static_cast<std::size_t>(topk) * 4);
    l.stage_base = at, at += up(static_cast<std::size_t>(world) * 4);
    l.ret_base = at, at += up(static_cast<std::size_t>(world) * 4);
    l.src_pair_base = at, at += up((static_cast<std::size_t>(world) + 1) * 4);
    l.bytes = at;
    return l;
}

int data_blocks(int64_t items, int device_sms, int requested) {
    if (requested > 0) return requested;
    const int64_t b = (items + 15) / 16;
    return static_cast<int>(std::clamp<int64_t>(b, 1, 2 * static_cast<int64_t>(std::max(device_sms, 1))));
}

int64_t auto_capacity(int64_t need) { return (std::max<int64_t>(need, 1) + 255) / 256 * 256; }

}  // namespace loom::moe::ep
