// The TP-MoE ops' choice of algorithm and the fused algorithms' block counts and work items (pure functions:
// tests/unit).
#include <algorithm>
#include <cmath>

#include "loom/kernels/moe/tp_moe_params.hpp"
#include "loom/runtime/error.hpp"
#include "ops/moe/tp/tp_moe.hpp"
#include "ops/overlap/common/plan.hpp"

namespace loom::moe {

namespace {

// Why the fused algorithm cannot run ("" when it can).
const char* fused_unfit(const TpMoeFacts& f) {
    if (f.world < 2) return "it needs a world of 2 or more ranks";
    if (!f.single_node) return "it needs one node (world size == local world size, at most 8 ranks)";
    if (f.captured)
        return "its signal values are host call counts, which a CUDA graph replay would repeat: use Sequential in "
               "captures";
    if (f.arch < 90) return "it needs a GPU of compute capability >= 9.0";
    if (f.device_sms < 2) return "it needs at least 2 SMs (the GEMM's and the communication blocks')";
    if (!f.x_words)
        return "its push moves x in 16-byte words: expected x's rows a multiple of 16 bytes from a 16-byte aligned "
               "address";
    return "";
}

}  // namespace

TpMoeAlgo choose_tp_moe_algo(const char* op, TpMoeAlgo requested, const TpMoeFacts& f) {
    if (requested == TpMoeAlgo::Sequential) return requested;
    const char* why = fused_unfit(f);
    if (requested == TpMoeAlgo::Fused) LOOM_CHECK(*why == '\0', "{}: opts.algo: fused cannot run here: {}", op, why);
    if (requested == TpMoeAlgo::Auto && f.rows < kTpMoeFusedMinRows) return TpMoeAlgo::Sequential;
    return *why == '\0' ? TpMoeAlgo::Fused : TpMoeAlgo::Sequential;
}

bool x_in_words(const MatrixView& x) {
    const std::size_t row_bytes = static_cast<std::size_t>(x.cols) * dtype_size(x.dtype);
    return row_bytes % 16 == 0 && reinterpret_cast<std::uintptr_t>(x.data) % 16 == 0;
}

int ag_push_blocks(int64_t push_bytes, int device_sms) {
    return static_cast<int>(
        std::clamp<int64_t>(push_bytes >> 16, 1, 2 * static_cast<int64_t>(std::max(1, device_sms))));
}

int down_chunk_tokens(int64_t tokens, int64_t h, int elem_bytes, int topk) {
    const int64_t words = std::max<int64_t>(1, h * elem_bytes / 16);
    int64_t c = std::max<int64_t>(1, 4096 / words);
    c = std::min<int64_t>(c, std::max<int64_t>(1, (tokens + 7) / 8));
    c = std::min<int64_t>(c, kernels::moe::kTpMoeMaxChunkEntries / std::max(1, topk));
    return static_cast<int>(c);
}

int rs_side_blocks(double side_bytes, double gemm_flops, double gemm_bytes, int num_sms) {
    constexpr double kSmFlops = 5e12;  // bf16 tensor-core FLOP/s per SM (H200: ~660 TFLOP/s over 132 SMs)
    constexpr double kSmBytes = 30e9;  // bytes/s per SM, the GEMM's streams and the reduce's alike (~4 TB/s / 132)
    const double sms = std::max(1, num_sms);
    const double gemm_s = std::max(gemm_flops / (sms * kSmFlops), gemm_bytes / (sms * kSmBytes));
    const double need = gemm_s > 0 ? side_bytes / (0.5 * gemm_s * kSmBytes) : 1.0;
    const int dflt = static_cast<int>(std::clamp(std::ceil(need), 1.0, 64.0));
    return overlap::comm_blocks(0, dflt, num_sms);
}

int down_tail_blocks(int64_t items, int num_sms) {
    return static_cast<int>(std::clamp<int64_t>(items, 1, 2 * static_cast<int64_t>(std::max(1, num_sms))));
}

}  // namespace loom::moe
