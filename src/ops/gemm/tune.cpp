// loom::gemm's config choice: the autotuner's winner (timed here with Settings::autotune, or persisted by an earlier
// tuning run), else the heuristic; decided once per key and process (loom/ops/gemm.hpp, "Config choice").
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "jit/tune_timing.hpp"
#include "loom/jit/autotune.hpp"
#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"

namespace loom {
namespace {

using nlohmann::json;

// The epilogue kind selects the kernel instantiation (and with beta != 0 the direct stores), so it is part of the key.
const char* epilogue_kind(const GemmOptions& o) {
    if (o.beta != 0.f) return "beta";
    return o.bias.data != nullptr || o.alpha != 1.f || o.scale_a || o.scale_b ? "affine" : "plain";
}

// What selects a config: the exact shape (not autotune's power-of-two buckets: the best BLOCK_N follows N itself,
// 8192 x 1376 x 4096 and 8192 x 1792 x 4096 take 176- and 224-wide tiles), types, B layout, epilogue kind, and the
// device with its SM count (an MPS client's share).
struct Key {
    int device, num_sms;
    int64_t m, n, k;
    DType in, out;
    bool b_kn;
    std::string_view epilogue;
    auto tie() const { return std::tie(device, num_sms, m, n, k, in, out, b_kn, epilogue); }
    bool operator<(const Key& o) const { return tie() < o.tie(); }
    std::string bucket() const {
        return fmt::format("m{}_n{}_k{}_{}_{}_{}_{}_sms{}", m, n, k, dtype_name(in), dtype_name(out),
                           b_kn ? "kn" : "nk", epilogue, num_sms);
    }
};

struct Decision {
    GemmConfig config;
    std::string source;  // "tuned", "persisted" or "heuristic"
};

// The autotuner's decision for `key` (jit/autotune.hpp): timed when tuning, else persisted or the heuristic. The
// candidates run on a scratch output: the user's C is neither overwritten by the tuning runs nor read (beta) by them.
Decision decide(const Key& key, const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o,
                const detail::GemmDevice& dev, cudaStream_t stream) {
    jit::TuneRequest req;
    req.op = "gemm";
    req.shape_bucket = key.bucket();
    req.arch = dev.arch;
    for (const GemmConfig& cand : gemm_tune_candidates(key.m, key.n, key.k, o.b_kn, a.dtype, dev.arch, dev.num_sms))
        req.candidates.push_back({cand.str(), gemm_config_to_json(cand)});
    req.heuristic = 0;
    req.rounds = 3;  // rotated: the GPU warms over a tuning run (jit/autotune.hpp)
    std::optional<detail::DeviceScratch> out, flush;
    req.time_us = [&](const jit::TuneCandidate& cand) {
        if (!out) {
            out.emplace(static_cast<size_t>(c.rows) * c.stride() * dtype_size(c.dtype));
            flush.emplace(detail::kTuneFlushBytes);
        }
        const MatrixView scratch{out->p, c.dtype, c.rows, c.cols, c.ld};
        const GemmConfig cfg = gemm_config_from_json(cand.config);
        return detail::median_launch_us([&] { detail::gemm_launch(a, b, scratch, o, cfg, dev, stream, nullptr); },
                                        stream, *flush);
    };
    const jit::TuneResult r = jit::autotune(req, nullptr);
    return Decision{gemm_config_from_json(r.choice.config), r.source};
}

}  // namespace

bool& detail::gemm_tuning_suppressed() {
    thread_local bool suppressed = false;
    return suppressed;
}

std::string gemm_config_to_json(const GemmConfig& c) {
    return json{
        {"block_m", c.block_m},     {"block_n", c.block_n}, {"block_k", c.block_k}, {"stages", c.stages},
        {"cluster_m", c.cluster_m}, {"group_m", c.group_m}, {"grid", c.grid},       {"tail_splits", c.tail_splits},
        {"tma_store", c.tma_store}, {"sm80", c.sm80},       {"gemv", c.gemv},       {"cluster_k", c.cluster_k}}
        .dump();
}

GemmConfig gemm_config_from_json(const std::string& text) {
    try {
        const json j = json::parse(text);
        GemmConfig c;
        c.block_m = j.at("block_m").get<int>();
        c.block_n = j.at("block_n").get<int>();
        c.block_k = j.at("block_k").get<int>();
        c.stages = j.at("stages").get<int>();
        c.cluster_m = j.at("cluster_m").get<int>();
        c.group_m = j.at("group_m").get<int>();
        c.grid = j.at("grid").get<int>();
        c.tail_splits = j.at("tail_splits").get<int>();
        c.tma_store = j.at("tma_store").get<bool>();
        c.sm80 = j.at("sm80").get<bool>();
        c.gemv = j.value("gemv", false);        // absent in winners persisted before the gemv kernel
        c.cluster_k = j.value("cluster_k", 1);  // a winner persisted without the field: no K-clusters
        return c;
    } catch (const json::exception& e) {
        LOOM_FAIL("gemm_config_from_json: expected every GemmConfig field, given '{}': {}", text, e.what());
    }
}

std::vector<GemmConfig> gemm_tune_candidates(int64_t m, int64_t n, int64_t k, bool b_kn, DType in, int arch,
                                             int num_sms) {
    const GemmConfig h = gemm_heuristic(m, n, k, b_kn, arch, num_sms, true, GemmTiles::Plain, in);
    if (h.sm80) return {h};  // one kernel
    // Where loom::gemm's heuristic takes the gemv kernel, the Hopper plans compete with it.
    std::vector<GemmConfig> out;
    if (detail::gemm_gemv_preferred(m, k, b_kn, in, arch)) out.push_back(detail::gemm_gemv_plan(m, n, k, in, num_sms));
    out.push_back(h);
    auto push = [&](const GemmConfig& c) {
        try {
            gemm_validate_config(c, b_kn, in);
        } catch (const Error&) {
            return;  // e.g. BLOCK_N not a multiple of 64 for [K, N] B
        }
        for (const GemmConfig& x : out)
            if (x.str() == c.str()) return;
        out.push_back(c);
    };
    // A tile choice completed as the heuristic completes its own; splits 1: whole tiles, 0: the automatic split tail,
    // n: n splits (skipped where the grid leaves no tail to split).
    auto completed = [&](int bm, int bn, int cluster) {
        GemmConfig c = h;
        c.block_m = bm;
        c.block_n = bn;
        c.cluster_m = cluster;
        c.tail_splits = 1;
        detail::gemm_complete_config(c, m, n, num_sms);
        return c;
    };
    auto tile = [&](int bm, int bn, int cluster, int splits) {
        GemmConfig c = completed(bm, bn, cluster);
        if (splits != 1) {
            const GemmTailPlan p = gemm_tail_plan(m, n, k, c, c.grid, splits);
            if (p.splits < 2) return;
            c.tail_splits = p.splits;
        }
        push(c);
    };
    if (h.tail_splits >= 2) {
        GemmConfig c = h;
        c.tail_splits = 1;
        push(c);
    } else if (h.cluster_m == 1) {
        tile(h.block_m, h.block_n, 1, 2);
    }
    if (m <= kGemmDecodeMaxM) {
        // K-clusters, which the decode plan does not choose (its model does not rank them): 64- and 128-column tiles
        // of the decode plan's rows, 2, 4 or 8 CTAs each. A cluster size this context cannot co-schedule raises at
        // launch, and the tuner skips it.
        for (int bn : {64, 128})
            for (int s : {2, 4, 8})
                if (const std::optional<GemmConfig> kc =
                        gemm_cluster_k_plan(completed(m <= 64 ? 64 : 128, bn, 1), m, n, k, s, num_sms))
                    push(*kc);
    }
    if (m <= 64) {
        for (int bn : {256, 192, 128, 64}) {
            tile(64, bn, 1, 1);
            tile(64, bn, 1, 0);
        }
        return out;
    }
    for (int bn : {256, 240, 224, 208, 192, 176, 160, 144, 128}) tile(128, bn, 1, 1);
    if (m > 128) {
        for (int bn : {176, 160, 144, 128}) {
            tile(192, bn, 1, 1);
            tile(192, bn, 1, 0);
        }
        tile(128, 256, 2, 1);
        tile(128, h.block_n, 2, 1);
    }
    return out;
}

GemmConfig gemm_config_for(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o,
                           cudaStream_t stream, std::string* source) {
    return detail::gemm_config_for(a, b, c, o, detail::gemm_device(), stream, source);
}

GemmConfig detail::gemm_config_for(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o,
                                   const GemmDevice& dev, cudaStream_t stream, std::string* source) {
    auto decided_by = [source](const char* s, const GemmConfig& cfg) {
        if (source) *source = s;
        return cfg;
    };
    if (o.config) return decided_by("config", *o.config);
    const int64_t m = a.rows, k = a.cols, n = c.cols;
    auto heuristic = [&] {
        if (!gemm_takes_sm80(o, dev) && gemm_gemv_preferred(m, k, o.b_kn, a.dtype, dev.arch))
            return gemm_gemv_plan(m, n, k, a.dtype, dev.num_sms);
        return gemm_heuristic(m, n, k, o.b_kn, dev.arch, dev.num_sms, true, GemmTiles::Plain, a.dtype);
    };
    // The sm_80 path has one config: nothing to tune. Suppressed: an overlapped op's candidates are being timed.
    if (gemm_takes_sm80(o, dev) || gemm_tuning_suppressed()) return decided_by("heuristic", heuristic());
    const Key key{dev.device, dev.num_sms, m, n, k, a.dtype, c.dtype, o.b_kn, epilogue_kind(o)};
    // Held while a key is decided: a tuning run (seconds, once per key) keeps other threads' first calls waiting.
    static std::mutex mu;
    static std::map<Key, Decision> decided;
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = decided.find(key); it != decided.end()) {
        if (source) *source = it->second.source;
        return it->second.config;
    }
    // No timing inside a capture: this call takes the heuristic, a later one tunes.
    if (capturing_and_tuning(stream)) return decided_by("heuristic", heuristic());
    // The heuristic's config is kept too: a key's config is decided once per process, which also spares later calls
    // the heuristic's host time.
    const Decision& d = decided.emplace(key, decide(key, a, b, c, o, dev, stream)).first->second;
    if (source) *source = d.source;
    return d.config;
}

}  // namespace loom
