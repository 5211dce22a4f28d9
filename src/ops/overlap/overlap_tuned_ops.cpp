// loom::ag_gemm, loom::gemm_rs, loom::gemm_ar: where the caller leaves every choice to Loom, the options are the
// autotuner's (src/ops/overlap/overlap_tune.hpp); otherwise the caller's, as given.
#include <fmt/format.h>

#include <optional>
#include <string>
#include <vector>

#include "jit/tune_timing.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "ops/overlap/overlap_state.hpp"
#include "ops/overlap/overlap_tune.hpp"

namespace loom {
namespace {

// The key of a call: shape, types, world, the SMs the ops plan on, whether ranks share a GPU.
std::string tune_key(const MatrixView& a, const MatrixView& b, const MatrixView& c, const World& world,
                     const overlap::DeviceFacts& dev) {
    return fmt::format("m{}_n{}_k{}_{}_{}_w{}_sms{}{}", a.rows, b.rows, a.cols, dtype_name(a.dtype),
                       dtype_name(c.dtype), world.world_size(), dev.num_sms, dev.shared_gpu ? "_shared" : "");
}

// Scratch output of C's shape for the tuning runs (the caller's C is left alone), allocated on first use.
struct ScratchOut {
    const MatrixView& c;
    std::optional<detail::DeviceScratch> buf;
    MatrixView view() {
        if (!buf) buf.emplace(static_cast<std::size_t>(c.rows * c.stride()) * dtype_size(c.dtype));
        return MatrixView{buf->p, c.dtype, c.rows, c.cols, c.ld};
    }
};

// A candidate's options with the caller's scales: tuning chooses how the op runs, never what it computes.
template <class Opts>
Opts with_callers_scales(Opts x, const Opts& caller) {
    x.alpha = caller.alpha;
    x.scale_a = caller.scale_a;
    x.scale_b = caller.scale_b;
    return x;
}

template <class Opts>
void add_tiles(std::vector<overlap::TuneOption<Opts>>& out, const GemmConfig& plan_tile, int64_t m, int64_t n,
               int num_sms) {
    for (const GemmConfig& t : overlap::tile_alternatives(plan_tile, m, n, num_sms))
        out.push_back({"auto/" + t.str(), Opts{}, t});
}

// Runs the op with the options decided for this call's key. candidates(dev): the op's candidates, Auto first;
// run(x, out): the op with options x into out (the tuning runs' into a scratch output, the call's into C).
// While `stream` captures a CUDA graph nothing may be decided (deciding may time candidates and meets the ranks): the
// options an eager call with this key decided run, and the op raises if they cannot be replayed (check_capture).
template <class Opts, class Candidates, class Run>
void run_tuned(World& world, const char* op, const MatrixView& a, const MatrixView& b, const MatrixView& c,
               cudaStream_t stream, const Candidates& candidates, const Run& run) {
    const bool captured = stream_ops::capturing(stream);
    const overlap::DeviceFacts& dev = overlap::device_facts(world, op, captured);
    if (captured) {
        const auto* tuned = world.find_state<overlap::TunedOptions<Opts>>();
        const std::optional<Opts> decided = tuned ? tuned->find(tune_key(a, b, c, world, dev)) : std::optional<Opts>();
        LOOM_CHECK(decided.has_value(),
                   "{}: a CUDA graph capture with every choice left to Loom runs the options an eager call decided: "
                   "call {} once outside the capture with the same shapes first (deciding may time the candidates)",
                   op, op);
        run(*decided, c);
        return;
    }
    ScratchOut scratch{c, {}};
    const Opts chosen = world.state<overlap::TunedOptions<Opts>>().get(
        world, op, tune_key(a, b, c, world, dev), [&] { return candidates(dev); },
        [&](const Opts& x) { run(x, scratch.view()); }, stream);
    run(chosen, c);
}

}  // namespace

void ag_gemm(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
             const AgGemmOptions& o) {
    const bool choices_left = o.producer == AgProducer::Auto && o.sm_path == DataPath::Auto && o.comm_sms == 0 &&
                              o.config == nullptr && o.gathered.data == nullptr;
    if (!choices_left) return detail::ag_gemm_run(world, a, b, c, stream, o);
    run_tuned<AgGemmOptions>(
        world, "ag_gemm", a, b, c, stream,
        [&](const overlap::DeviceFacts& dev) {
            std::vector<overlap::TuneOption<AgGemmOptions>> v{{"auto", {}, {}}};
            v.push_back({"sequential", AgGemmOptions{AgProducer::Sequential}, {}});
            v.push_back({"copy-engine", AgGemmOptions{AgProducer::CopyEngine}, {}});
            v.push_back({"sm/tma", AgGemmOptions{AgProducer::Sm, DataPath::Tma}, {}});
            v.push_back({"sm/ldst", AgGemmOptions{AgProducer::Sm, DataPath::LdSt}, {}});
            if (dev.shared_gpu) v.push_back({"direct", AgGemmOptions{AgProducer::Direct}, {}});
            const int64_t W = world.world_size(), M = a.rows * W;
            const OverlapPlan plan = ag_gemm_plan(M, b.rows, a.cols, static_cast<int>(W), AgProducer::CopyEngine, 0,
                                                  dev.arch, dev.num_sms, dev.shared_gpu, a.dtype);
            add_tiles(v, plan.gemm, M, b.rows, dev.num_sms);
            return v;
        },
        [&](const AgGemmOptions& x, const MatrixView& out) {
            detail::ag_gemm_run(world, a, b, out, stream, with_callers_scales(x, o));
        });
}

void gemm_rs(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
             const GemmRsOptions& o) {
    const bool choices_left = o.algo == RsAlgo::Auto && o.transport == RsTransport::Auto && o.comm_sms == 0 &&
                              o.config == nullptr && o.ce_chunk_bytes == 0;
    if (!choices_left) return detail::gemm_rs_run(world, a, b, c, stream, o);
    auto with = [](RsAlgo algo, RsTransport t = RsTransport::Auto) {
        GemmRsOptions x;
        x.algo = algo;
        x.transport = t;
        return x;
    };
    run_tuned<GemmRsOptions>(
        world, "gemm_rs", a, b, c, stream,
        [&](const overlap::DeviceFacts& dev) {
            std::vector<overlap::TuneOption<GemmRsOptions>> v{{"auto", {}, {}}};
            v.push_back({"sequential", with(RsAlgo::Sequential), {}});
            v.push_back({"fused-epilogue", with(RsAlgo::FusedEpilogue), {}});
            if (!dev.shared_gpu) v.push_back({"fused-epilogue/sm", with(RsAlgo::FusedEpilogue, RsTransport::Sm), {}});
            v.push_back({"fused-pull", with(RsAlgo::FusedPull), {}});
            v.push_back({"scatter-reduce", with(RsAlgo::ScatterReduce), {}});
            const OverlapPlan plan = gemm_rs_plan(a.rows, b.rows, a.cols, world.world_size(), 0, dev.arch, dev.num_sms,
                                                  RsAlgo::Auto, static_cast<int>(dtype_size(c.dtype)), a.dtype);
            add_tiles(v, plan.gemm, a.rows, b.rows, dev.num_sms);
            return v;
        },
        [&](const GemmRsOptions& x, const MatrixView& out) {
            detail::gemm_rs_run(world, a, b, out, stream, with_callers_scales(x, o));
        });
}

void gemm_ar(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
             const GemmArOptions& o) {
    const bool choices_left = o.algo == ArAlgo::Auto && o.comm_sms == 0 && o.config == nullptr;
    if (!choices_left) return detail::gemm_ar_run(world, a, b, c, stream, o);
    auto with = [](ArAlgo algo) {
        GemmArOptions x;
        x.algo = algo;
        return x;
    };
    run_tuned<GemmArOptions>(
        world, "gemm_ar", a, b, c, stream,
        [&](const overlap::DeviceFacts& dev) {
            std::vector<overlap::TuneOption<GemmArOptions>> v{{"auto", {}, {}}};
            v.push_back({"sequential", with(ArAlgo::Sequential), {}});
            v.push_back({"fused-epilogue", with(ArAlgo::FusedEpilogue), {}});
            v.push_back({"reduce-kernel", with(ArAlgo::ReduceKernel), {}});
            const OverlapPlan plan = gemm_ar_plan(a.rows, b.rows, a.cols, world.world_size(), 0, dev.arch, dev.num_sms,
                                                  ArAlgo::Auto, static_cast<int>(dtype_size(c.dtype)), a.dtype);
            add_tiles(v, plan.gemm, a.rows, b.rows, dev.num_sms);
            return v;
        },
        [&](const GemmArOptions& x, const MatrixView& out) {
            detail::gemm_ar_run(world, a, b, out, stream, with_callers_scales(x, o));
        });
}

}  // namespace loom
