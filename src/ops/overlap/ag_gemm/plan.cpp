// ag_gemm's choice: the producer Auto resolves to, the plan of the GEMM beside it, and the autotuner's candidates.
#include "ops/overlap/common/plan.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "loom/runtime/error.hpp"
#include "loom/runtime/tma.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "ops/overlap/ag_gemm/ag_gemm.hpp"
#include "ops/overlap/common/hooked_gemm.hpp"

namespace loom {

const char* to_string(AgProducer p) {
    switch (p) {
        case AgProducer::Auto:
            return "auto";
        case AgProducer::CopyEngine:
            return "copy-engine";
        case AgProducer::Sm:
            return "sm";
        case AgProducer::Direct:
            return "direct";
        case AgProducer::Sequential:
            return "sequential";
    }
    return "?";
}

AgProducer ag_gemm_producer(AgProducer requested, int world_size, int64_t rows_per_rank, int block_m, bool gathered,
                            bool ranks_share_gpu, int64_t tiles, int num_sms) {
    const bool direct_fits = world_size > 1 && block_m > 0 && rows_per_rank % block_m == 0 && !gathered;
    if (requested == AgProducer::Auto) {
        if (ranks_share_gpu) return direct_fits ? AgProducer::Direct : AgProducer::CopyEngine;
        return world_size > 1 && tiles > 0 && tiles <= num_sms ? AgProducer::Sequential : AgProducer::CopyEngine;
    }
    LOOM_CHECK(
        requested != AgProducer::Direct || direct_fits,
        "ag_gemm: the direct producer needs M / W = {} a multiple of the GEMM's BLOCK_M = {}, more than one rank "
        "(given {}), and no gathered buffer (it gathers nothing{})",
        rows_per_rank, block_m, world_size, gathered ? "; one was given" : "");
    return requested;
}

AgProducer ag_gemm_producer_across_nodes(AgProducer requested, int nodes, int ranks_per_node, int64_t tiles,
                                         int num_sms, bool config) {
    if (requested == AgProducer::Auto)
        return !config && tiles > 0 && tiles <= num_sms ? AgProducer::Sequential : AgProducer::CopyEngine;
    const char* needs = requested == AgProducer::Sm ? "its blocks store the shard into every peer's gather buffer"
                                                    : "its GEMM reads every peer's shard in place";
    overlap::check_across_nodes("ag_gemm", "producer", to_string(requested),
                                requested == AgProducer::Sequential || requested == AgProducer::CopyEngine, needs,
                                "AgProducer::CopyEngine, Sequential or Auto", nodes, ranks_per_node);
    return requested;
}

AgGatherAt ag_gather_at(AgProducer producer, bool gathered_given, bool gathered_symmetric, bool across_nodes) {
    if (producer == AgProducer::Direct) return AgGatherAt::None;
    if (!gathered_given) return AgGatherAt::Own;
    if (gathered_symmetric || (producer == AgProducer::Sequential && !across_nodes)) return AgGatherAt::Callers;
    return AgGatherAt::OwnThenCopy;
}

OverlapPlan ag_gemm_plan(int64_t m, int64_t n_loc, int64_t k, int world_size, AgProducer producer, int comm_sms,
                         int arch, int num_sms, bool ranks_share_gpu, DType in) {
    OverlapPlan p;
    if (producer == AgProducer::Sm) {
        // 8 SMs of TMA copies keep ~W - 1 chunks in flight at NVLink speed; fewer for small chunks.
        const int64_t chunk_bytes = m / std::max(world_size, 1) * k * static_cast<int64_t>(dtype_size(in));
        const int dflt = static_cast<int>(std::clamp<int64_t>(chunk_bytes / (256 << 10), 1, 8));
        p.comm_blocks = overlap::comm_blocks(comm_sms, dflt, num_sms);
    }
    // Copy engine with peers on this GPU: the copies are runtime copy kernels, and ag_gemm runs them before the
    // GEMM (copy_engine.cpp), so the GEMM keeps every SM. (ranks_share_gpu stays a parameter: the plan is the place
    // where sharing would change the split.)
    (void)ranks_share_gpu;
    p.gemm = overlap::gemm_config(m, n_loc, k, arch, num_sms - p.comm_blocks - p.reserved_sms, /*split_tail=*/true, in);
    return p;
}

namespace overlap {

void choose_producer(AgCall& x, const AgGemmOptions& o) {
    constexpr const char* op = "ag_gemm";
    const DeviceFacts& dev = *x.dev;
    // The copy engine's and the direct producer's plan (no comm blocks: the same GEMM); the SM producer's, planned
    // beside its blocks, only when it is the one.
    x.plan = ag_gemm_plan(x.M, x.N, x.K, x.W, AgProducer::CopyEngine, o.comm_sms, dev.arch, x.num_sms, dev.shared_gpu,
                          x.a.dtype);
    const GemmConfig& tile = o.config ? *o.config : x.plan.gemm;
    x.producer =
        x.nodes > 1 ? ag_gemm_producer_across_nodes(o.producer, x.nodes, x.L, o.config ? 0 : tile_count(x.M, x.N, tile),
                                                    x.num_sms, o.config != nullptr)
                    : ag_gemm_producer(o.producer, x.W, x.R, tile.block_m, o.gathered.data != nullptr, dev.shared_gpu,
                                       o.config ? 0 : tile_count(x.M, x.N, tile), x.num_sms);
    LOOM_CHECK(x.producer != AgProducer::Sequential || o.config == nullptr,
               "{}: the sequential producer runs loom::gemm's own config; expected no config", op);
    // Under capture Auto's choice must replay too: refused here, before the op touches its state.
    if (x.captured) check_capture(x.stream, op, x.producer == AgProducer::Sequential);
    if (x.producer == AgProducer::Sm)
        x.plan =
            ag_gemm_plan(x.M, x.N, x.K, x.W, x.producer, o.comm_sms, dev.arch, x.num_sms, dev.shared_gpu, x.a.dtype);
    const std::size_t es = dtype_size(x.a.dtype), gather_bytes = static_cast<std::size_t>(x.M * x.K) * es;
    const MatrixView& g = o.gathered;
    if (g.data)
        LOOM_CHECK(g.dtype == x.a.dtype && g.rows == x.M && g.cols == x.K && g.stride() == x.K,
                   "{}: expected the gathered buffer dense [{}, {}] {}, given {} x {} (ld {}) {}", op, x.M, x.K,
                   dtype_name(x.a.dtype), g.rows, g.cols, g.stride(), dtype_name(g.dtype));
    const AgGatherAt at =
        ag_gather_at(x.producer, g.data != nullptr, g.data && x.world->is_symmetric(g.data, gather_bytes), x.nodes > 1);
    // The producers' signals and gather buffer; the sequence's gather buffer only when it does not gather into the
    // caller's.
    if (at != AgGatherAt::None && (x.producer != AgProducer::Sequential || at != AgGatherAt::Callers))
        x.st = &op_state<AgGatherState>(*x.world, op, x.captured);
    if (at == AgGatherAt::Callers) x.gather = g.data;
    if (at == AgGatherAt::Own || at == AgGatherAt::OwnThenCopy)
        x.gather = ensure_symmetric(*x.world, x.st->buf, gather_bytes, x.captured);
    if (at == AgGatherAt::OwnThenCopy) x.gathered_out = g.data;
    // The direct producer has no gather buffer; its GEMM's A map (never read: every tile is redirected) spans A.
    x.gview = MatrixView{x.gather ? x.gather : x.a.data, x.a.dtype, x.M, x.K, 0};
    gemm_validate(x.gview, x.b, x.c, GemmOptions{}, /*allow_f8=*/true);
}

kernels::overlap::AgGemmHookArgs prepare_overlapped(AgCall& x, const AgGemmOptions& o) {
    constexpr const char* op = "ag_gemm";
    use_config(op, x.plan, o.config, x.M, x.N, x.num_sms, x.a.dtype, /*split_tail_ok=*/true);
    // Raster groups inside a rank's rows (the heuristic's plan; a caller's config is run as given): the rotated order
    // then runs every own tile before the first peer's, so no CTA of the first wave waits for a copy. A group
    // straddling two ranks' rows (M / W smaller than group_m M-blocks: small M, or W = 8) puts tiles of the next
    // rank's rows into the first wave, and a persistent CTA that waits there runs its whole walk that much later.
    GemmConfig& cfg = x.plan.gemm;
    if (!o.config && x.R % cfg.block_m == 0) groups_inside_bands(cfg, x.R / cfg.block_m);
    if (debug())
        fmt::print(stderr, "loom::ag_gemm M={} N={} K={} W={} producer {} SMs {} of {}: {} (call {}, signals at {})\n",
                   x.M, x.N, x.K, x.W, to_string(x.producer), x.num_sms, x.dev->device_sms, x.plan.str(),
                   x.st ? x.st->calls + 1 : 0, x.st ? static_cast<void*>(x.st->sig.p) : nullptr);
    LOOM_CHECK(o.sm_path == DataPath::Auto || o.sm_path == DataPath::LdSt || o.sm_path == DataPath::Tma,
               "{}: expected the Sm producer's data path LdSt or Tma, given {}", op, to_string(o.sm_path));
    // Compiled before the counters advance (a JIT error leaves them as they were).
    prepare_gemm(kAgHooks, kAgHeader, x.gview, x.c, cfg, x.sc, ScaleAt::Accumulators);
    // The own rows in place: with the copy engine (or direct), no gathered buffer asked for, own M-blocks whole and
    // a shard TMA can read, the GEMM loads this rank's tiles from its shard and the copy of them (a D2D copy kernel
    // in stream order before the GEMM) is not made.
    const bool own_local = (x.producer == AgProducer::CopyEngine || x.producer == AgProducer::Direct) &&
                           !o.gathered.data && x.R % cfg.block_m == 0 &&
                           reinterpret_cast<std::uintptr_t>(x.a.data) % 16 == 0;
    kernels::overlap::AgGemmHookArgs h{};
    if (own_local) {
        const CUtensorMap m = make_tma_2d(MatrixView{x.a.data, x.a.dtype, x.R, x.K, 0}, cfg.block_m, cfg.block_k);
        static_assert(sizeof(m) == sizeof(h.a_local), "CUtensorMap is 128 bytes");
        std::memcpy(&h.a_local, &m, sizeof(m));
        h.own_local = 1;
        h.own_row0 = static_cast<int32_t>(x.me * x.R);
    }
    h.timeout_ns = x.world->ctx().wait_timeout_ns;
    h.rows_per_rank = static_cast<int32_t>(x.R);
    h.shift_m = static_cast<int32_t>(x.me * x.R / cfg.block_m);
    return h;
}

std::vector<TuneOption<AgGemmOptions>> ag_gemm_candidates(const World& world, const MatrixView& a, const MatrixView& b,
                                                          const DeviceFacts& dev, int num_sms) {
    std::vector<TuneOption<AgGemmOptions>> v{{"auto", {}, {}}};
    v.push_back({"sequential", AgGemmOptions{AgProducer::Sequential}, {}});
    if (world.num_nodes() > 1) {  // the forms that run across nodes (ag_gemm_producer_across_nodes)
        v.push_back({"copy-engine", AgGemmOptions{AgProducer::CopyEngine}, {}});
        return v;
    }
    v.push_back({"copy-engine", AgGemmOptions{AgProducer::CopyEngine}, {}});
    v.push_back({"sm/tma", AgGemmOptions{AgProducer::Sm, DataPath::Tma}, {}});
    v.push_back({"sm/ldst", AgGemmOptions{AgProducer::Sm, DataPath::LdSt}, {}});
    if (dev.shared_gpu) v.push_back({"direct", AgGemmOptions{AgProducer::Direct}, {}});
    const int64_t W = world.world_size(), M = a.rows * W;
    const OverlapPlan plan = ag_gemm_plan(M, b.rows, a.cols, static_cast<int>(W), AgProducer::CopyEngine, 0, dev.arch,
                                          num_sms, dev.shared_gpu, a.dtype);
    add_tiles(v, plan.gemm, M, b.rows, num_sms);
    return v;
}

}  // namespace overlap

}  // namespace loom
