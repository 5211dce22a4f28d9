// Autotuning of the overlapped ops (ag_gemm, gemm_rs, gemm_ar): when a call leaves every choice to Loom (no config,
// algorithm / producer / transport Auto, comm_sms 0, ...), the options it runs with are decided once per (World, op,
// shape, types) by jit::autotune over the op's candidates — the first of which is Auto itself:
//   settings().autotune (LOOM_AUTOTUNE=1)  every candidate timed on every rank (collective: the ops run in step; an
//                    output scratch, not the caller's C), the slowest rank's median decides, the winner persisted
//                    (rank 0);
//   otherwise        a persisted winner, else Auto.
// Every rank runs the same choice: without autotune rank 0's reading of the persisted file is all-gathered
// and taken by all (the ranks might read it at different times). The first call of a key is collective, as every
// call of these ops is.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "jit/tune_timing.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "loom/runtime/world.hpp"
#include "loom/runtime/world_state.hpp"
#include "ops/overlap/common/state.hpp"

namespace loom::overlap {

// The index of the chosen candidate (see above). `run(i)` runs candidate i once, on `stream`, into scratch outputs.
std::size_t tuned_choice(World& world, const std::string& op, const std::string& bucket,
                         const std::vector<std::string>& names, const std::function<void(std::size_t)>& run,
                         cudaStream_t stream);

// One candidate: a name unique among the op's, its options, and the GEMM config they point at (options hold a
// pointer; the candidate owns the config).
template <class Opts>
struct TuneOption {
    std::string name;
    Opts opts;
    std::optional<GemmConfig> config;
    Opts resolved() const {
        Opts o = opts;
        o.config = config ? &*config : nullptr;
        return o;
    }
};

// An op's decisions on one World, per key: the chosen candidate, kept with the World's overlap state
// (release_overlap_state drops them; the next call decides again). Key: "overlap/<op>/tuned" (kTunedKey).
template <class Opts>
inline constexpr const char* kTunedKey = nullptr;
template <>
inline constexpr const char* kTunedKey<AgGemmOptions> = "overlap/ag_gemm/tuned";
template <>
inline constexpr const char* kTunedKey<GemmRsOptions> = "overlap/gemm_rs/tuned";
template <>
inline constexpr const char* kTunedKey<GemmArOptions> = "overlap/gemm_ar/tuned";

template <class Opts>
class TunedOptions final : public WorldState {
  public:
    static constexpr const char* kKey = kTunedKey<Opts>;
    explicit TunedOptions(World&) {}

    // The options for `key`, deciding them on first use (make(): the candidates, Auto first; run(o): one call of the
    // op with options o into scratch outputs). The returned options point into this object (stable).
    Opts get(World& world, const char* op, const std::string& key,
             const std::function<std::vector<TuneOption<Opts>>()>& make, const std::function<void(const Opts&)>& run,
             cudaStream_t stream) {
        if (auto it = chosen_.find(key); it != chosen_.end()) return it->second.resolved();
        const std::vector<TuneOption<Opts>> candidates = make();
        std::vector<std::string> names;
        for (const auto& c : candidates) names.push_back(c.name);
        const std::size_t i = tuned_choice(
            world, op, key, names, [&](std::size_t j) { run(candidates[j].resolved()); }, stream);
        return chosen_.emplace(key, candidates[i]).first->second.resolved();
    }

    // The options decided for `key` by an earlier get, if any (no tuning, nothing collective).
    std::optional<Opts> find(const std::string& key) const {
        const auto it = chosen_.find(key);
        if (it == chosen_.end()) return std::nullopt;
        return it->second.resolved();
    }

  private:
    std::map<std::string, TuneOption<Opts>> chosen_;
};

// The BLOCK_N alternatives of an overlapped GEMM's tile (128-row tiles, one CTA each, whole tiles, the most stages
// that fit, grid 0: the op plans it), the plan's own width left out.
std::vector<GemmConfig> tile_alternatives(const GemmConfig& plan_tile, int64_t m, int64_t n, int num_sms);

// Candidates "auto/<tile>": Auto with each of tile_alternatives' tiles.
template <class Opts>
void add_tiles(std::vector<TuneOption<Opts>>& out, const GemmConfig& plan_tile, int64_t m, int64_t n, int num_sms) {
    for (const GemmConfig& t : tile_alternatives(plan_tile, m, n, num_sms))
        out.push_back({"auto/" + t.str(), Opts{}, t});
}

// The key of a call: shape, types, world (and its nodes when more than one), the SMs the op plans on, whether ranks
// share a GPU.
std::string tune_key(const MatrixView& a, const MatrixView& b, const MatrixView& c, const World& world,
                     const DeviceFacts& dev, int num_sms);

// Scratch output of C's shape for the tuning runs (the caller's C is left alone), allocated on first use.
struct ScratchOut {
    const MatrixView& c;
    std::optional<detail::DeviceScratch> buf;
    MatrixView view();
};

// A candidate's options with the caller's scales and SM count: tuning chooses how the op runs, never what it
// computes nor on how many SMs.
template <class Opts>
Opts with_callers_terms(Opts x, const Opts& caller) {
    x.alpha = caller.alpha;
    x.scale_a = caller.scale_a;
    x.scale_b = caller.scale_b;
    x.num_sms = caller.num_sms;
    return x;
}

// Runs the op with the options decided for this call's key (num_sms: the caller's request, overlap_usable_sms).
// candidates(dev, sms): the op's candidates, Auto first;
// run(x, out): the op with options x into out (the tuning runs' into a scratch output, the call's into C).
// While `stream` captures a CUDA graph nothing may be decided (deciding may time candidates and meets the ranks): the
// options an eager call with this key decided run, and the op raises if they cannot be replayed (check_capture).
template <class Opts, class Candidates, class Run>
void run_tuned(World& world, const char* op, const MatrixView& a, const MatrixView& b, const MatrixView& c,
               cudaStream_t stream, int num_sms, const Candidates& candidates, const Run& run) {
    const bool captured = stream_ops::capturing(stream);
    const DeviceFacts& dev = device_facts(world, op, captured);
    const int sms = plan_sms(dev, num_sms, op);
    const std::string key = tune_key(a, b, c, world, dev, sms);
    if (captured) {
        const auto* tuned = world.find_state<TunedOptions<Opts>>();
        const std::optional<Opts> decided = tuned ? tuned->find(key) : std::optional<Opts>();
        LOOM_CHECK(decided.has_value(),
                   "{}: a CUDA graph capture with every choice left to Loom runs the options an eager call decided: "
                   "call {} once outside the capture with the same shapes first (deciding may time the candidates)",
                   op, op);
        run(*decided, c);
        return;
    }
    ScratchOut scratch{c, {}};
    const Opts chosen = world.state<TunedOptions<Opts>>().get(
        world, op, key, [&] { return candidates(dev, sms); }, [&](const Opts& x) { run(x, scratch.view()); }, stream);
    run(chosen, c);
}

}  // namespace loom::overlap
