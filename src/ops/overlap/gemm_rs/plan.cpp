// gemm_rs's choice: the algorithm and transport Auto resolves to, the plan of the GEMM (and its communication blocks),
// and the autotuner's candidates.
#include "ops/overlap/common/plan.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "ops/overlap/gemm_rs/gemm_rs.hpp"

namespace loom {

namespace {

// The heuristic's tile for the fused epilogue: when asked for explicitly, a 64-row tile if M / W is a multiple of 64
// only; and a width next to the heuristic's where ptxas (CUDA 13.0) spills the RsAccHooks kernel (BLOCK_N 240 / 224,
// and 208 / 144 with fp32 out; the plain and the other hooked kernels do not): OverlapCompile.HookedGemmHasNoSpills
// compiles every width this leaves.
GemmConfig fused_config(GemmConfig c, int64_t m, int64_t n, int64_t rows_seg, int out_bytes, bool forced, int num_sms) {
    if (forced && rows_seg % c.block_m != 0 && rows_seg % 64 == 0) c.block_m = 64;
    if (c.block_n == 240 || c.block_n == 224) c.block_n = 256;
    if (out_bytes == 4 && (c.block_n == 208 || c.block_n == 144)) c.block_n -= 16;
    c.stages = kernels::gemm_sm90_plan_stages(c.block_m, c.block_n);
    c.grid = static_cast<int>(gemm_sm90_grid(m, n, c, num_sms));
    return c;
}

}  // namespace

const char* to_string(RsTransport t) {
    switch (t) {
        case RsTransport::Auto:
            return "auto";
        case RsTransport::Sm:
            return "sm";
        case RsTransport::CopyEngine:
            return "copy-engine";
    }
    return "?";
}

const char* to_string(RsAlgo a) {
    switch (a) {
        case RsAlgo::Auto:
            return "auto";
        case RsAlgo::FusedEpilogue:
            return "fused-epilogue";
        case RsAlgo::ScatterReduce:
            return "scatter-reduce";
        case RsAlgo::Sequential:
            return "sequential";
        case RsAlgo::FusedPull:
            return "fused-pull";
    }
    return "?";
}

RsTransport gemm_rs_transport(RsTransport requested, RsAlgo algo, bool ranks_share_gpu) {
    if (requested == RsTransport::Auto)
        return !ranks_share_gpu && algo == RsAlgo::FusedEpilogue ? RsTransport::CopyEngine : RsTransport::Sm;
    LOOM_CHECK(
        requested != RsTransport::CopyEngine || !ranks_share_gpu,
        "gemm_rs: the copy-engine transport needs every rank on its own GPU (here ranks share one: a copy within "
        "a GPU is a copy kernel the waiting GEMM would starve); use RsTransport::Sm or Auto");
    LOOM_CHECK(requested == RsTransport::Sm || algo == RsAlgo::FusedEpilogue,
               "gemm_rs: the {} transport is the fused epilogue's; the {} algorithm moves its tiles its own way",
               to_string(requested), to_string(algo));
    return requested;
}

RsChoice gemm_rs_distinct_auto(int64_t tiles, int num_sms) {
    const int64_t sms = std::max(num_sms, 1);
    if (tiles <= sms) return {RsAlgo::FusedEpilogue, RsTransport::Sm};
    if (tiles < 3 * sms) return {RsAlgo::Sequential, RsTransport::Auto};
    return {RsAlgo::FusedEpilogue, RsTransport::CopyEngine};
}

RsAlgo gemm_rs_algo(RsAlgo requested, bool ranks_share_gpu, const GemmConfig* config, int64_t rows_seg,
                    int64_t k_bytes) {
    LOOM_CHECK(requested != RsAlgo::Sequential || config == nullptr,
               "gemm_rs: the sequential algorithm runs loom::gemm's own config; expected no config");
    if (requested != RsAlgo::Auto) return requested;
    // With the caller's tile, that tile decides whether a fused algorithm fits: where ranks share a GPU the fused
    // pull (nothing in the GEMM waits for the slowest rank's share), else the fused epilogue.
    if (config) {
        if (!overlap::fused_unfit(rows_seg, *config).empty()) return RsAlgo::ScatterReduce;
        return ranks_share_gpu ? RsAlgo::FusedPull : RsAlgo::FusedEpilogue;
    }
    // Ranks sharing a GPU: the fused pull where its tile (128 rows, or 64: gemm_rs_plan) fits M / W and the
    // reduce-scatter is worth hiding, else the sequence. All ranks' GEMMs and their reduce-scatter share one GPU, so
    // the reduce-scatter's time over the GEMM's goes as 1 / (K_loc x the input's bytes) whatever W is, while the
    // pull's own cost (its interleaved tile order, publishing, reducers beside the MMAs) is a few % of the GEMM: past
    // kSharedPullMaxKBytes the pull's cost exceeds what it hides.
    if (ranks_share_gpu)
        return rows_seg % 64 == 0 && k_bytes <= kSharedPullMaxKBytes ? RsAlgo::FusedPull : RsAlgo::Sequential;
    return RsAlgo::Auto;
}

RsAlgo gemm_rs_algo_across_nodes(RsAlgo requested, int nodes, int ranks_per_node, bool config) {
    if (requested == RsAlgo::Auto) requested = RsAlgo::Sequential;
    const char* needs = requested == RsAlgo::FusedPull ? "its warps pull the peers' tiles of this rank's rows"
                                                       : "its epilogue copies every tile of a peer's rows to that peer";
    overlap::check_across_nodes("gemm_rs", "algorithm", to_string(requested),
                                requested == RsAlgo::Sequential || requested == RsAlgo::ScatterReduce, needs,
                                "RsAlgo::Sequential, ScatterReduce or Auto", nodes, ranks_per_node);
    LOOM_CHECK(!config,
               "gemm_rs: in a World of several nodes the {} algorithm runs loom::gemm's own config; expected no config",
               to_string(requested));
    return requested;
}

OverlapPlan gemm_rs_plan(int64_t m, int64_t n, int64_t k_loc, int world_size, int comm_sms, int arch, int num_sms,
                         RsAlgo algo, int out_bytes, DType in) {
    const int64_t rows_seg = m / std::max(world_size, 1);
    if (algo != RsAlgo::ScatterReduce) {
        // The fused algorithms take no SM from the GEMM; the pull runs the fused epilogue's tile.
        const bool forced = algo == RsAlgo::FusedEpilogue || algo == RsAlgo::FusedPull;
        OverlapPlan f;
        f.gemm = fused_config(overlap::gemm_config(m, n, k_loc, arch, num_sms, false, in), m, n, rows_seg, out_bytes,
                              forced, num_sms);
        f.rs_algo = algo == RsAlgo::FusedPull ? RsAlgo::FusedPull : RsAlgo::FusedEpilogue;
        if (forced || overlap::fused_unfit(rows_seg, f.gemm).empty()) return f;
    }
    OverlapPlan p;
    p.rs_algo = RsAlgo::ScatterReduce;
    // 16 blocks of ld/st pushes (~20-30 GB/s each over NVLink) keep up with the GEMM's output rate on the
    // Triton-distributed shapes; small outputs need fewer (each block reduces at least one row).
    p.comm_blocks = overlap::comm_blocks(comm_sms, static_cast<int>(std::clamp<int64_t>(rows_seg, 1, 16)), num_sms);
    p.gemm = overlap::gemm_config(m, n, k_loc, arch, num_sms - p.comm_blocks, false, in);
    return p;
}

namespace overlap {

bool fused_by_copy_engine(RsTransport transport, int world_size) {
    return transport == RsTransport::CopyEngine && world_size > 1;
}

std::string fused_unfit(int64_t rows_seg, const GemmConfig& cfg) {
    if (rows_seg % cfg.block_m != 0)
        return fmt::format("M / W = {} a multiple of BLOCK_M = {} (each M-block one rank's rows)", rows_seg,
                           cfg.block_m);
    return "";
}

void choose_algo(RsCall& x, const GemmRsOptions& o) {
    const DeviceFacts& dev = *x.dev;
    // A requested transport asks for the fused epilogue: Auto takes the fused pull or the sequence (ranks sharing a
    // GPU) only when none was requested. Across nodes, the sequence (its transport check below).
    x.algo = x.nodes > 1 ? gemm_rs_algo_across_nodes(o.algo, x.nodes, x.L, o.config != nullptr)
                         : gemm_rs_algo(o.algo, dev.shared_gpu && o.transport == RsTransport::Auto, o.config,
                                        x.rows_seg, x.K * static_cast<int64_t>(dtype_size(x.a.dtype)));
    x.transport = o.transport;
    if (x.algo != RsAlgo::Sequential)
        x.plan = gemm_rs_plan(x.M, x.N, x.K, x.W, o.comm_sms, dev.arch, x.num_sms, x.algo, x.out_bytes, x.a.dtype);
    // Nothing requested, a GPU per rank: the plan's waves of tiles choose between the fused epilogue's transports
    // and the sequence (gemm_rs_distinct_auto).
    if (x.algo == RsAlgo::Auto && !dev.shared_gpu && !o.config && o.transport == RsTransport::Auto &&
        x.plan.rs_algo == RsAlgo::FusedEpilogue) {
        const RsChoice ch = gemm_rs_distinct_auto(tile_count(x.M, x.N, x.plan.gemm), x.num_sms);
        x.algo = ch.algo;
        x.transport = ch.transport;
    }
    LOOM_CHECK(x.nodes == 1 || o.transport == RsTransport::Auto,
               "gemm_rs: in a World of several nodes the {} algorithm moves no tiles by a transport; expected "
               "RsTransport::Auto, given {}",
               to_string(x.algo), to_string(o.transport));
    if (x.algo != RsAlgo::Sequential) return;
    LOOM_CHECK(o.transport == RsTransport::Auto,
               "gemm_rs: the sequential algorithm moves no tiles itself; expected RsTransport::Auto, given {}",
               to_string(o.transport));
    if (debug())
        fmt::print(stderr, "loom::gemm_rs M={} N={} K_loc={} W={}: sequential (loom::gemm, loom::reduce_scatter)\n",
                   x.M, x.N, x.K, x.W);
}

void prepare_overlapped(RsCall& x, const GemmRsOptions& o) {
    constexpr const char* op = "gemm_rs";
    use_config(op, x.plan, o.config, x.M, x.N, x.num_sms, x.a.dtype);
    check_tile_count(op, x.M, x.N, x.plan.gemm);
    if (debug())
        fmt::print(stderr, "loom::gemm_rs M={} N={} K_loc={} W={} SMs {} of {}: {}\n", x.M, x.N, x.K, x.W, x.num_sms,
                   x.dev->device_sms, x.plan.str());
    gemm_validate(x.a, x.b, MatrixView{x.c.data, x.c.dtype, x.M, x.N, 0}, GemmOptions{}, /*allow_f8=*/true);
    // The fused epilogue's transport. Auto: the copy engine when every rank has its own GPU (the epilogue's own NVLink
    // bulk copies stall the GEMM's TMA loads), else Sm: ranks sharing a GPU cannot take the copy engine (a copy
    // within one GPU is a runtime copy kernel: the persistent GEMM, waiting for the peers' copies, would starve it).
    x.transport = gemm_rs_transport(x.transport, x.plan.rs_algo, x.dev->shared_gpu);
    if (x.captured)
        check_capture(x.stream, op, x.plan.rs_algo == RsAlgo::FusedEpilogue && !fused_by_copy_engine(x.transport, x.W));
}

std::vector<TuneOption<GemmRsOptions>> gemm_rs_candidates(const World& world, const MatrixView& a, const MatrixView& b,
                                                          const MatrixView& c, const DeviceFacts& dev, int num_sms) {
    auto with = [](RsAlgo algo, RsTransport t = RsTransport::Auto) {
        GemmRsOptions x;
        x.algo = algo;
        x.transport = t;
        return x;
    };
    std::vector<TuneOption<GemmRsOptions>> v{{"auto", {}, {}}};
    v.push_back({"sequential", with(RsAlgo::Sequential), {}});
    if (world.num_nodes() > 1) {  // the forms that run across nodes (gemm_rs_algo_across_nodes)
        v.push_back({"two-level", with(RsAlgo::ScatterReduce), {}});
        return v;
    }
    v.push_back({"fused-epilogue", with(RsAlgo::FusedEpilogue), {}});
    if (!dev.shared_gpu) v.push_back({"fused-epilogue/sm", with(RsAlgo::FusedEpilogue, RsTransport::Sm), {}});
    v.push_back({"fused-pull", with(RsAlgo::FusedPull), {}});
    v.push_back({"scatter-reduce", with(RsAlgo::ScatterReduce), {}});
    const OverlapPlan plan = gemm_rs_plan(a.rows, b.rows, a.cols, world.world_size(), 0, dev.arch, num_sms,
                                          RsAlgo::Auto, static_cast<int>(dtype_size(c.dtype)), a.dtype);
    add_tiles(v, plan.gemm, a.rows, b.rows, num_sms);
    return v;
}

}  // namespace overlap

}  // namespace loom
