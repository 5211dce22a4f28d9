#include "ops/overlap/common/tune.hpp"

#include <fmt/format.h>

#include <cstring>
#include <optional>
#include <string>

#include "jit/tune_timing.hpp"
#include "loom/jit/autotune.hpp"
#include "loom/jit/jit.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "ops/gemm/gemm_internal.hpp"

namespace loom::overlap {

std::size_t tuned_choice(World& world, const std::string& op, const std::string& bucket,
                         const std::vector<std::string>& names, const std::function<void(std::size_t)>& run,
                         cudaStream_t stream) {
    jit::TuneRequest req;
    req.op = op;
    req.shape_bucket = bucket;
    req.arch = jit::current_arch();
    for (const std::string& n : names) req.candidates.push_back({n, n});
    req.heuristic = 0;
    req.rounds = 3;  // rotated: the GPU warms over a tuning run (jit/autotune.hpp)
    std::optional<detail::DeviceScratch> flush;
    req.time_us = [&](const jit::TuneCandidate& c) {
        std::size_t i = 0;
        while (i < names.size() && names[i] != c.name) ++i;
        if (!flush) flush.emplace(detail::kTuneFlushBytes);
        // Aligned on a device barrier before each run, as bench-overlap times the ops: unaligned, ranks sharing a GPU
        // under MPS drift apart and a rank's time includes its peers' lag (8 ranks on one H200: the fused pull read
        // 4x its aligned time there, the sequence not).
        return detail::median_launch_us([&] { run(i); }, stream, *flush, [&] { barrier_on_stream(world, stream); });
    };
    // No nested loom::gemm tuning while the candidates run (detail::gemm_tuning_suppressed).
    struct Suppress {
        bool old = detail::gemm_tuning_suppressed();
        Suppress() { detail::gemm_tuning_suppressed() = true; }
        ~Suppress() { detail::gemm_tuning_suppressed() = old; }
    };
    const jit::TuneResult r = [&] {
        const Suppress guard;
        return jit::autotune(req, &world);
    }();
    if (settings().autotune) return r.index;  // rank 0 picked, every rank got its pick
    // Persisted or heuristic, read by each rank on its own: take rank 0's.
    Bytes mine(sizeof(std::uint64_t));
    const std::uint64_t index = r.index;
    std::memcpy(mine.data(), &index, sizeof index);
    const auto all = world.store().all_gather("loom/tune/" + op + "/" + bucket + "/agree", mine);
    std::uint64_t chosen = 0;
    std::memcpy(&chosen, all.at(0).data(), sizeof chosen);
    LOOM_CHECK(chosen < names.size(), "{}: rank 0 chose candidate {} of {}", op, chosen, names.size());
    return static_cast<std::size_t>(chosen);
}

std::vector<GemmConfig> tile_alternatives(const GemmConfig& plan_tile, int64_t m, int64_t n, int num_sms) {
    std::vector<GemmConfig> out;
    for (int bn : {256, 224, 192, 160, 128}) {
        if (bn == plan_tile.block_n) continue;
        GemmConfig c = plan_tile;
        c.block_m = 128;
        c.block_n = bn;
        c.cluster_m = 1;
        c.tail_splits = 1;
        c.tma_store = true;
        detail::gemm_complete_config(c, m, n, num_sms);
        c.grid = 0;
        out.push_back(c);
    }
    return out;
}

std::string tune_key(const MatrixView& a, const MatrixView& b, const MatrixView& c, const World& world,
                     const DeviceFacts& dev, int num_sms) {
    // A World of several nodes runs other algorithms than one node of the same size: its keys name the nodes.
    const std::string nodes = world.num_nodes() > 1 ? fmt::format("_nodes{}", world.num_nodes()) : "";
    return fmt::format("m{}_n{}_k{}_{}_{}_w{}{}_sms{}{}", a.rows, b.rows, a.cols, dtype_name(a.dtype),
                       dtype_name(c.dtype), world.world_size(), nodes, num_sms, dev.shared_gpu ? "_shared" : "");
}

MatrixView ScratchOut::view() {
    if (!buf) buf.emplace(static_cast<std::size_t>(c.rows * c.stride()) * dtype_size(c.dtype));
    return MatrixView{buf->p, c.dtype, c.rows, c.cols, c.ld};
}

}  // namespace loom::overlap
