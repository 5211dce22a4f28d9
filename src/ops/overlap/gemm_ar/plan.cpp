// gemm_ar's choice: the algorithm Auto resolves to, the plan of the GEMM (and the reduce kernel's blocks), and the
// autotuner's candidates.
#include "ops/overlap/common/plan.hpp"

#include <algorithm>
#include <cstdint>

#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "ops/overlap/gemm_ar/gemm_ar.hpp"

namespace loom {

const char* to_string(ArAlgo a) {
    switch (a) {
        case ArAlgo::Auto:
            return "auto";
        case ArAlgo::FusedEpilogue:
            return "fused-epilogue";
        case ArAlgo::ReduceKernel:
            return "reduce-kernel";
        case ArAlgo::Sequential:
            return "sequential";
    }
    return "?";
}

ArAlgo gemm_ar_algo(ArAlgo requested, bool ranks_share_gpu, const GemmConfig* config, int out_bytes) {
    LOOM_CHECK(requested != ArAlgo::Sequential || config == nullptr,
               "gemm_ar: the sequential algorithm runs loom::gemm's own config; expected no config");
    if (requested != ArAlgo::Auto) return requested;
    // With the caller's tile, that tile decides whether the fused epilogue fits.
    if (config)
        return overlap::whole_tile_unfit(*config, out_bytes).empty() ? ArAlgo::FusedEpilogue : ArAlgo::ReduceKernel;
    return ranks_share_gpu ? ArAlgo::Sequential : ArAlgo::Auto;
}

OverlapPlan gemm_ar_plan(int64_t m, int64_t n, int64_t k_loc, int world_size, int comm_sms, int arch, int num_sms,
                         ArAlgo algo, int out_bytes, DType in) {
    (void)world_size;
    OverlapPlan p;
    if (algo != ArAlgo::ReduceKernel) {
        // The fused epilogue takes no SM from the GEMM (for M <= 128 one wave of tiles bound by reading B).
        GemmConfig f =
            overlap::whole_tile_config(overlap::gemm_config(m, n, k_loc, arch, num_sms, false, in), out_bytes);
        f.grid = static_cast<int>(gemm_sm90_grid(m, n, f, num_sms));
        if (algo == ArAlgo::FusedEpilogue || overlap::whole_tile_unfit(f, out_bytes).empty()) {
            p.gemm = f;
            p.ar_algo = ArAlgo::FusedEpilogue;
            return p;
        }
    }
    const GemmConfig all =
        gemm_heuristic(m, n, k_loc, false, arch, num_sms, /*split_tail=*/false, GemmTiles::Overlap, in);
    const int64_t tiles = overlap::tile_count(m, n, all);
    // One reduce block per tile (a tile's pull is ~W x 16-64 KiB), at most 32; the GEMM keeps the rest.
    p.comm_blocks = overlap::comm_blocks(comm_sms, static_cast<int>(std::clamp<int64_t>(tiles, 1, 32)), num_sms);
    p.gemm = overlap::gemm_config(m, n, k_loc, arch, num_sms - p.comm_blocks, false, in);
    p.ar_algo = ArAlgo::ReduceKernel;
    return p;
}

namespace overlap {

void choose_algo(ArCall& x, const GemmArOptions& o) {
    constexpr const char* op = "gemm_ar";
    x.algo = gemm_ar_algo(o.algo, x.dev->shared_gpu, o.config, x.out_bytes);
    if (x.algo == ArAlgo::Sequential) return;
    x.plan = gemm_ar_plan(x.M, x.N, x.K, x.W, o.comm_sms, x.dev->arch, x.num_sms, x.algo, x.out_bytes, x.a.dtype);
    use_config(op, x.plan, o.config, x.M, x.N, x.num_sms, x.a.dtype);
    check_tile_count(op, x.M, x.N, x.plan.gemm);
    if (debug())
        fmt::print(stderr, "loom::gemm_ar M={} N={} K_loc={} W={} SMs {} of {}: {}\n", x.M, x.N, x.K, x.W, x.num_sms,
                   x.dev->device_sms, x.plan.str());
    if (x.captured) check_capture(x.stream, op, x.plan.ar_algo == ArAlgo::FusedEpilogue);
}

std::vector<TuneOption<GemmArOptions>> gemm_ar_candidates(const World& world, const MatrixView& a, const MatrixView& b,
                                                          const MatrixView& c, const DeviceFacts& dev, int num_sms) {
    auto with = [](ArAlgo algo) {
        GemmArOptions x;
        x.algo = algo;
        return x;
    };
    std::vector<TuneOption<GemmArOptions>> v{{"auto", {}, {}}};
    v.push_back({"sequential", with(ArAlgo::Sequential), {}});
    v.push_back({"fused-epilogue", with(ArAlgo::FusedEpilogue), {}});
    v.push_back({"reduce-kernel", with(ArAlgo::ReduceKernel), {}});
    const OverlapPlan plan = gemm_ar_plan(a.rows, b.rows, a.cols, world.world_size(), 0, dev.arch, num_sms,
                                          ArAlgo::Auto, static_cast<int>(dtype_size(c.dtype)), a.dtype);
    add_tiles(v, plan.gemm, a.rows, b.rows, num_sms);
    return v;
}

}  // namespace overlap

}  // namespace loom
