// The grouped GEMM's config: the analytic heuristic and the checks of a given config.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "ops/moe/grouped_gemm_internal.hpp"

namespace loom::moe {
namespace {

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int grouped_gemm_fitting_stages(int bm, int bn, int groups, bool staged) {
    int s = 12;
    while (s > 2 && kernels::moe::grouped_gemm_sm90_smem_bytes(bm, bn, s, groups, staged) +
                            kernels::moe::kGroupedStaticSmemBytes >
                        kernels::kGemmSm90MaxSmem)
        --s;
    return s;
}

int64_t grouped_gemm_max_tiles(int64_t rows, int64_t n_out, int groups, const GemmConfig& cfg, bool swiglu) {
    const int bm = cfg.sm80 ? kernels::kSm80BlockM : cfg.block_m;
    const int bn = cfg.sm80 ? kernels::kSm80BlockN : cfg.block_n;
    const int out_cols = swiglu ? bn / 2 : bn;
    return std::max<int64_t>(1, (ceil_div(rows, bm) + groups) * ceil_div(n_out, out_cols));
}

GemmConfig grouped_gemm_heuristic(int64_t rows, int64_t n, int64_t k, int groups, bool b_kn, MoeActivation act,
                                  DType in, int arch, int num_sms, bool sm80, bool block_scale) {
    (void)k;
    const bool swiglu = act == MoeActivation::SwiGLU;
    const int64_t n_out = swiglu ? n / 2 : n;
    GemmConfig c;
    c.cluster_m = 1;
    c.tail_splits = 1;
    // Hopper: the staged epilogue (shared memory, 16-byte stores; grouped_gemm.cuh, kStagedStore). sm_80 ignores it.
    c.tma_store = true;
    c.group_m = 8;
    if (sm80 || arch < 90) {
        c.sm80 = true;
        c.grid = static_cast<int>(std::min<int64_t>(grouped_gemm_max_tiles(rows, n_out, groups, c, swiglu), 1 << 30));
        return c;
    }
    c.block_k = kernels::gemm_block_k(static_cast<int>(dtype_size(in)));
    c.block_m = rows <= 64 * static_cast<int64_t>(groups) ? 64 : 128;
    std::vector<int> widths = block_scale ? std::vector<int>{128, 64}
                              : b_kn      ? (swiglu ? std::vector<int>{256, 128} : std::vector<int>{256, 192, 128})
                                          : std::vector<int>{256, 224, 192, 160, 128};
    const int narrowest = block_scale ? 64 : 128;
    // The width that wastes the fewest output columns (ties: the wider, listed first).
    int best = widths.front();
    int64_t best_cols = INT64_MAX;
    for (int w : widths) {
        const int out = swiglu ? w / 2 : w;
        const int64_t cols = ceil_div(n_out, out) * out;
        if (cols < best_cols) best = w, best_cols = cols;
    }
    // Narrower while the tiles (groups' average rows) would not fill the SMs.
    const auto tiles = [&](int w) {
        const int out = swiglu ? w / 2 : w;
        return (ceil_div(rows, c.block_m) + std::min<int64_t>(groups, std::max<int64_t>(rows, 1)) / 2) *
               ceil_div(n_out, out);
    };
    while (best > narrowest && tiles(best) < num_sms) {
        const auto it = std::find(widths.begin(), widths.end(), best);
        best = *(it + 1);
    }
    c.block_n = best;
    c.stages = grouped_gemm_fitting_stages(c.block_m, c.block_n, groups, c.tma_store);
    c.grid = static_cast<int>(std::min<int64_t>(num_sms, grouped_gemm_max_tiles(rows, n_out, groups, c, swiglu)));
    return c;
}

void grouped_gemm_validate_config(const GemmConfig& c, const GroupedGemmProblem& p) {
    LOOM_CHECK(c.grid >= 0, "grouped_gemm config: expected grid >= 0, given {}", c.grid);
    LOOM_CHECK(c.group_m >= 1 && c.group_m <= kGemmMaxGroupM,
               "grouped_gemm config: expected group_m in [1, {}], given {}", kGemmMaxGroupM, c.group_m);
    if (c.sm80) return;  // the portable kernel's tile is fixed
    LOOM_CHECK(c.block_m == 64 || c.block_m == 128, "grouped_gemm config: expected block_m 64 or 128, given {}",
               c.block_m);
    LOOM_CHECK(c.block_n % 16 == 0 && c.block_n >= 16 && c.block_n <= 256,
               "grouped_gemm config: expected block_n a multiple of 16 in [16, 256], given {}", c.block_n);
    const int bn_unit = p.b_kn() ? (p.swiglu() ? 128 : 64) : (p.swiglu() ? 32 : 16);
    LOOM_CHECK(c.block_n % bn_unit == 0,
               "grouped_gemm config: expected block_n a multiple of {} (B layout {}, activation {}), given {}", bn_unit,
               p.b_kn() ? "KN" : "NK", p.swiglu() ? "SwiGLU" : "not SwiGLU", c.block_n);
    const int block_k = kernels::gemm_block_k(static_cast<int>(dtype_size(p.a.dtype)));
    LOOM_CHECK(c.block_k == block_k, "grouped_gemm config: expected block_k {} (one 128-byte row of {}), given {}",
               block_k, dtype_name(p.a.dtype), c.block_k);
    LOOM_CHECK(c.cluster_m == 1 && c.tail_splits == 1 && c.cluster_k == 1,
               "grouped_gemm config: expected cluster_m 1, tail_splits 1 and cluster_k 1, given {}, {} and {}",
               c.cluster_m, c.tail_splits, c.cluster_k);
    if (p.block_scaled()) {
        const int cols = p.swiglu() ? c.block_n / 2 : c.block_n;  // a tile's columns per scale lookup
        LOOM_CHECK(c.block_n <= 128 && kernels::moe::kGroupedScaleBlock % cols == 0,
                   "grouped_gemm config: per-128-block scales expect block_n <= 128 with {} dividing 128 (a tile's "
                   "columns within one scale block), given {}",
                   p.swiglu() ? "block_n / 2" : "block_n", c.block_n);
    }
    // The dynamic bytes and the kernel's static scratch.
    const uint32_t smem =
        kernels::moe::grouped_gemm_sm90_smem_bytes(c.block_m, c.block_n, c.stages, p.num_groups, c.tma_store) +
        kernels::moe::kGroupedStaticSmemBytes;
    LOOM_CHECK(c.stages >= 2 && c.stages <= 16 && smem <= kernels::kGemmSm90MaxSmem,
               "grouped_gemm config: expected stages in [2, 16] within {} B of shared memory, given {} stages ({} B "
               "with {} groups)",
               kernels::kGemmSm90MaxSmem, c.stages, smem, p.num_groups);
}

GemmConfig grouped_gemm_config(const GroupedGemmProblem& p, int arch, int num_sms) {
    const bool sm80 = arch < 90 || p.opts.force_sm80 || (p.opts.config != nullptr && p.opts.config->sm80);
    GemmConfig c = p.opts.config != nullptr && !sm80
                       ? *p.opts.config
                       : grouped_gemm_heuristic(p.planned_rows(), p.n(), p.k(), p.num_groups, p.b_kn(),
                                                p.opts.activation, p.a.dtype, arch, num_sms, sm80, p.block_scaled());
    if (p.opts.config != nullptr && sm80 && p.opts.config->grid > 0) c.grid = p.opts.config->grid;
    grouped_gemm_validate_config(c, p);
    return c;
}

}  // namespace loom::moe
