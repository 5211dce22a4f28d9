// gemm_ar's choice: the algorithm Auto resolves to, the plan of the GEMM (and the reduce kernel's blocks), and the
// autotuner's candidates.
#include "ops/overlap/common/plan.hpp"

#include <algorithm>
#include <cstdint>

#include "loom/runtime/error.hpp"
#include "ops/collectives/coll_choice.hpp"
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

const char* to_string(ArShots s) {
    switch (s) {
        case ArShots::Auto:
            return "auto";
        case ArShots::OneShot:
            return "one-shot";
        case ArShots::TwoShot:
            return "two-shot";
    }
    return "?";
}

ArAlgo gemm_ar_algo(ArAlgo requested, ArShots shots, const GemmConfig* config, int out_bytes) {
    LOOM_CHECK(requested != ArAlgo::Sequential || config == nullptr,
               "gemm_ar: the sequential algorithm runs loom::gemm's own config; expected no config");
    LOOM_CHECK(shots == ArShots::Auto || requested == ArAlgo::Auto || requested == ArAlgo::ReduceKernel,
               "gemm_ar: ArShots::{} is the reduce kernel's; the {} algorithm reduces its own way (expected "
               "ArShots::Auto, or ArAlgo::ReduceKernel / Auto)",
               to_string(shots), to_string(requested));
    if (requested != ArAlgo::Auto) return requested;
    if (shots != ArShots::Auto) return ArAlgo::ReduceKernel;
    // With the caller's tile, that tile decides whether the fused epilogue fits.
    if (config)
        return config->block_m <= 128 && overlap::whole_tile_unfit(*config, out_bytes).empty() ? ArAlgo::FusedEpilogue
                                                                                               : ArAlgo::ReduceKernel;
    return ArAlgo::Auto;
}

ArAlgo gemm_ar_algo_across_nodes(ArAlgo requested, ArShots shots, int nodes, int ranks_per_node, bool config) {
    LOOM_CHECK(shots == ArShots::Auto || requested == ArAlgo::Auto || requested == ArAlgo::ReduceKernel,
               "gemm_ar: ArShots::{} is the reduce kernel's; the {} algorithm reduces its own way (expected "
               "ArShots::Auto)",
               to_string(shots), to_string(requested));
    if (requested == ArAlgo::Auto && shots == ArShots::Auto) requested = ArAlgo::Sequential;
    if (requested == ArAlgo::Auto) requested = ArAlgo::ReduceKernel;  // ArShots ask for the reduce kernel
    const char* needs = requested == ArAlgo::FusedEpilogue ? "its epilogue copies every tile to every peer"
                                                           : "its blocks read every peer's copy of each tile";
    overlap::check_across_nodes("gemm_ar", "algorithm", to_string(requested), requested == ArAlgo::Sequential, needs,
                                "ArAlgo::Sequential or Auto (with ArShots::Auto)", nodes, ranks_per_node);
    LOOM_CHECK(!config,
               "gemm_ar: in a World of several nodes the sequential algorithm runs loom::gemm's own config; expected "
               "no config");
    return requested;
}

bool gemm_ar_two_shot(ArShots requested, int world_size, int64_t c_bytes) {
    if (requested != ArShots::Auto) return requested == ArShots::TwoShot;
    return world_size > 2 && c_bytes > kArTwoShotMinBytes;
}

ArCost gemm_ar_cost(int64_t m, int64_t n, int64_t k_loc, int world_size, int num_sms, int ranks_per_gpu, int out_bytes,
                    DType in, const GemmConfig& tile, bool two_shot, int comm_sms) {
    const double c_bytes = static_cast<double>(m) * static_cast<double>(n) * out_bytes;
    const double flops_per_sm_us = kArGemmFlopsPerSmUs * (dtype_size(in) == 1 ? 2.0 : 1.0);
    const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k_loc);
    auto gemm_us = [&](int sms) { return flops / (flops_per_sm_us * std::max(sms, 1)); };
    CollTopology topo;
    topo.world = world_size;
    topo.shared_gpu = ranks_per_gpu > 1;
    topo.ranks_per_gpu = std::max(ranks_per_gpu, 1);
    const std::size_t bytes = static_cast<std::size_t>(c_bytes);
    // The sequence's all_reduce: from the symmetric partial into a C that is not symmetric (sequential.cpp).
    const CollChoice ar = choose_collective(CollKind::AllReduce, bytes, topo, /*in_symmetric=*/true,
                                            /*out_symmetric=*/false);
    ArCost cost;
    cost.two_shot = two_shot;
    cost.sequence_us = gemm_us(num_sms) + coll::model_us(CollKind::AllReduce, ar.algo, bytes, topo, ar.staged, false);
    // The reducer's traffic per rank in units of C: one-shot, W tiles read and one written; two-shot, the owned 1 / W
    // read W times and written twice (C, the partial), the rest read once from its owner and written once.
    const double units = two_shot ? 3.0 : world_size + 1.0;
    const double stream = coll::kModelBytesPerUs / topo.ranks_per_gpu;  // a rank's share of the memory's rate
    const double block_rate = topo.shared_gpu ? kArReduceBlockBytesPerUsShared : kArReduceBlockBytesPerUs;
    const int64_t tiles = overlap::tile_count(m, n, tile);
    const double tile_bytes = static_cast<double>(tile.block_m) * tile.block_n * out_bytes * units;
    // P side blocks beside the GEMM on num_sms - P SMs, then the full grid (num_sms blocks) after it for what is
    // left: with a GPU per rank what the side blocks did not reach under the GEMM (never its last wave's tiles, stored
    // at its end); with ranks sharing a GPU all of it (measured: the side blocks hide next to nothing under the GEMMs).
    const double full_rate = std::min(num_sms * block_rate, stream);
    auto overlap_us = [&](int p) {
        const double rate = std::min(p * block_rate, stream);
        const double traffic = units * c_bytes;
        const int gemm_sms = num_sms - p;
        const double gemm_t = gemm_us(gemm_sms);
        const double last_wave =
            std::min(traffic, static_cast<double>(std::min<int64_t>(tiles, gemm_sms)) * tile_bytes);
        const double hidden = topo.shared_gpu ? 0.0 : std::min(traffic - last_wave, gemm_t * rate);
        return gemm_t + (traffic - hidden) / full_rate + 2 * coll::kModelLaunchUs;
    };
    if (comm_sms > 0) {
        cost.comm_blocks = overlap::comm_blocks(comm_sms, comm_sms, num_sms);
        cost.overlap_us = overlap_us(cost.comm_blocks);
        return cost;
    }
    // The reducer's blocks: the powers of two up to a quarter of the SMs (overlap::comm_blocks) and the tile count.
    const int most =
        overlap::comm_blocks(0, static_cast<int>(std::clamp<int64_t>(tiles, 1, kMaxCommBlocksAr)), num_sms);
    cost.comm_blocks = 1;
    cost.overlap_us = overlap_us(1);
    for (int p = 2; p <= most; p *= 2) {
        const double t = overlap_us(p);
        if (t < cost.overlap_us) {
            cost.overlap_us = t;
            cost.comm_blocks = p;
        }
    }
    return cost;
}

OverlapPlan gemm_ar_plan(int64_t m, int64_t n, int64_t k_loc, int world_size, int comm_sms, int arch, int num_sms,
                         ArAlgo algo, int out_bytes, DType in, ArShots shots, int ranks_per_gpu) {
    const bool shared = ranks_per_gpu > 1;
    OverlapPlan p;
    if (algo == ArAlgo::FusedEpilogue || (algo == ArAlgo::Auto && !shared)) {
        // The fused epilogue takes no SM from the GEMM. Auto (a GPU per rank) takes it for one wave of tiles: each
        // tile's epilogue waits for the peers' copies of it, which a later wave would wait for with its tensor cores
        // idle (gemm_rs_distinct_auto's rule).
        GemmConfig f =
            overlap::whole_tile_config(overlap::gemm_config(m, n, k_loc, arch, num_sms, false, in), out_bytes);
        f.grid = static_cast<int>(gemm_sm90_grid(m, n, f, num_sms));
        if (algo == ArAlgo::FusedEpilogue ||
            (overlap::whole_tile_unfit(f, out_bytes).empty() && overlap::tile_count(m, n, f) <= num_sms)) {
            p.gemm = f;
            p.ar_algo = ArAlgo::FusedEpilogue;
            return p;
        }
    }
    const bool two_shot = gemm_ar_two_shot(shots, world_size, m * n * out_bytes);
    const GemmConfig tile = overlap::gemm_config(m, n, k_loc, arch, num_sms, false, in);
    const ArCost cost =
        gemm_ar_cost(m, n, k_loc, world_size, num_sms, ranks_per_gpu, out_bytes, in, tile, two_shot, comm_sms);
    if (algo == ArAlgo::Auto && cost.overlap_us > (1.0 - kArMinGain) * cost.sequence_us) {
        p.ar_algo = ArAlgo::Sequential;
        return p;
    }
    p.comm_blocks = cost.comm_blocks;
    p.gemm = overlap::gemm_config(m, n, k_loc, arch, num_sms - p.comm_blocks, false, in);
    p.ar_algo = ArAlgo::ReduceKernel;
    p.ar_two_shot = two_shot;
    return p;
}

namespace overlap {

void choose_algo(ArCall& x, const GemmArOptions& o) {
    constexpr const char* op = "gemm_ar";
    x.algo = x.nodes > 1 ? gemm_ar_algo_across_nodes(o.algo, o.shots, x.nodes, x.L, o.config != nullptr)
                         : gemm_ar_algo(o.algo, o.shots, o.config, x.out_bytes);
    if (x.algo == ArAlgo::Sequential) return;
    x.plan = gemm_ar_plan(x.M, x.N, x.K, x.W, o.comm_sms, x.dev->arch, x.num_sms, x.algo, x.out_bytes, x.a.dtype,
                          o.shots, x.dev->ranks_per_gpu);
    if (x.plan.ar_algo == ArAlgo::Sequential) {
        x.algo = ArAlgo::Sequential;
        if (debug())
            fmt::print(stderr,
                       "loom::gemm_ar M={} N={} K_loc={} W={} SMs {}: sequential (loom::gemm, loom::all_reduce)\n", x.M,
                       x.N, x.K, x.W, x.num_sms);
        return;
    }
    use_config(op, x.plan, o.config, x.M, x.N, x.num_sms, x.a.dtype);
    // The fused epilogue's per-tile signals count two consumer warpgroups a tile (kernels/overlap/gemm_ar.cuh).
    LOOM_CHECK(x.plan.ar_algo != ArAlgo::FusedEpilogue || x.plan.gemm.block_m <= 128,
               "{}: the fused epilogue expects config.block_m 64 or 128 (two consumer warpgroups), given {}", op,
               x.plan.gemm.block_m);
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
    if (world.num_nodes() > 1) return v;  // the forms that run across nodes (gemm_ar_algo_across_nodes)
    v.push_back({"fused-epilogue", with(ArAlgo::FusedEpilogue), {}});
    v.push_back({"reduce-kernel", with(ArAlgo::ReduceKernel), {}});
    for (ArShots s : {ArShots::OneShot, ArShots::TwoShot}) {
        GemmArOptions x = with(ArAlgo::ReduceKernel);
        x.shots = s;
        v.push_back({fmt::format("reduce-kernel/{}", to_string(s)), x, {}});
    }
    // The tiles of the hooked GEMM the plan runs (the reduce kernel's where Auto takes the sequence).
    const int out_bytes = static_cast<int>(dtype_size(c.dtype));
    auto plan_of = [&](ArAlgo algo) {
        return gemm_ar_plan(a.rows, b.rows, a.cols, world.world_size(), 0, dev.arch, num_sms, algo, out_bytes, a.dtype,
                            ArShots::Auto, dev.ranks_per_gpu);
    };
    OverlapPlan plan = plan_of(ArAlgo::Auto);
    if (plan.ar_algo == ArAlgo::Sequential) plan = plan_of(ArAlgo::ReduceKernel);
    add_tiles(v, plan.gemm, a.rows, b.rows, num_sms);
    return v;
}

}  // namespace overlap

}  // namespace loom
