// The TP-MoE ops' choice of algorithm and the fused algorithms' block counts (pure functions: tests/unit).
#include <algorithm>

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
    return "";
}

}  // namespace

TpMoeAlgo choose_tp_moe_algo(const char* op, TpMoeAlgo requested, const TpMoeFacts& f) {
    if (requested == TpMoeAlgo::Sequential) return requested;
    const char* why = fused_unfit(f);
    if (requested == TpMoeAlgo::Fused) LOOM_CHECK(*why == '\0', "{}: opts.algo: fused cannot run here: {}", op, why);
    if (requested == TpMoeAlgo::Auto && f.reduce && f.shared_gpu) return TpMoeAlgo::Sequential;
    return *why == '\0' ? TpMoeAlgo::Fused : TpMoeAlgo::Sequential;
}

int ag_push_blocks(int64_t shard_bytes, int device_sms) {
    const int64_t b = std::clamp<int64_t>(shard_bytes >> 17, 1, 32);
    return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(b, device_sms)));
}

int rs_reduce_blocks(int64_t t_loc, int num_sms) {
    const int dflt = static_cast<int>(std::clamp<int64_t>((t_loc + 7) / 8, 1, 16));
    return overlap::comm_blocks(0, dflt, num_sms);
}

}  // namespace loom::moe
