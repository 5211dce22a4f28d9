#include "ops/overlap/common/plan.hpp"

#include <algorithm>
#include <string>

#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/kernels/overlap/overlap_params.hpp"
#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"

namespace loom::overlap {

std::string whole_tile_unfit(const GemmConfig& cfg, int out_bytes) {
    if ((cfg.block_n * out_bytes) % 128 != 0)
        return fmt::format("BLOCK_N x {} bytes a multiple of 128 (whole staging slabs), given BLOCK_N = {}", out_bytes,
                           cfg.block_n);
    const uint32_t smem = kernels::gemm_sm90_smem_bytes(cfg.block_m, cfg.block_n, cfg.stages, out_bytes);
    if (smem > kernels::kGemmSm90MaxSmem)
        return fmt::format("{} stages of {}x{} beside the whole staged tile within {} bytes of shared memory, given {}",
                           cfg.stages, cfg.block_m, cfg.block_n, kernels::kGemmSm90MaxSmem, smem);
    return "";
}

GemmConfig whole_tile_config(GemmConfig c, int out_bytes) {
    const int step = 128 / std::max(out_bytes, 1);
    c.block_n = std::min(256, (c.block_n + step - 1) / step * step);
    for (;;) {
        c.stages = kernels::gemm_sm90_plan_stages(c.block_m, c.block_n, out_bytes);
        if (c.stages >= 3 || c.block_n - 64 < step) break;
        c.block_n -= 64;
    }
    return c;
}

int64_t tile_count(int64_t m, int64_t n, const GemmConfig& cfg) {
    return ((m + cfg.block_m - 1) / cfg.block_m) * ((n + cfg.block_n - 1) / cfg.block_n);
}

GemmConfig gemm_config(int64_t m, int64_t n, int64_t k, int arch, int gemm_sms, bool split_tail, DType in) {
    // 128-row tiles, weighed as the plain GEMM weighs them (GemmTiles::Overlap): the hooks align M-blocks with
    // the ranks' row chunks (ag_gemm's direct producer and gemm_rs's fused epilogue need M / W a multiple of BLOCK_M,
    // which 192 rarely divides), and the 192-row kernel has not been run with hooks.
    GemmConfig cfg = gemm_heuristic(m, n, k, false, arch, gemm_sms, split_tail, GemmTiles::Overlap, in);
    cfg.cluster_m = 1;
    cfg.tma_store = true;
    // cfg.grid: the heuristic's, planned on gemm_sms (one CTA per SM, or a skinny GEMM's split units).
    return cfg;
}

void groups_inside_bands(GemmConfig& cfg, int64_t blocks_per_rank) {
    LOOM_CHECK(blocks_per_rank >= 1, "groups_inside_bands: expected >= 1 M-block per rank, given {}", blocks_per_rank);
    cfg.group_m = static_cast<int>(std::clamp<int64_t>(cfg.group_m, 1, blocks_per_rank));
    while (blocks_per_rank % cfg.group_m != 0) --cfg.group_m;
}

int comm_blocks(int requested, int dflt, int num_sms) {
    const int p = requested > 0 ? requested : std::min(dflt, std::max(1, num_sms / 4));
    return std::max(1, std::min({p, kernels::overlap::kMaxCommBlocks, num_sms - 1}));
}

}  // namespace loom::overlap

std::string loom::OverlapPlan::str() const {
    return fmt::format("{} comm_blocks {} reserved_sms {}{}{}{}{}{}", gemm.str(), comm_blocks, reserved_sms,
                       rs_algo == RsAlgo::Auto ? "" : " rs ", rs_algo == RsAlgo::Auto ? "" : to_string(rs_algo),
                       ar_algo == ArAlgo::Auto ? "" : " ar ", ar_algo == ArAlgo::Auto ? "" : to_string(ar_algo),
                       ar_algo == ArAlgo::ReduceKernel ? (ar_two_shot ? " two-shot" : " one-shot") : "");
}
