#include "loom/jit/autotune.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "jit/sha256.hpp"
#include "jit/sources.hpp"
#include "jit/toolchain.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "loom/runtime/world.hpp"
#include "loom/version.hpp"
#include "runtime/log.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace loom::jit {
namespace {

// What a tuned result depends on besides the key: Loom's version and headers (kernel code), the compilers.
std::string versions() {
    const auto& tc = detail::toolchain();
    return fmt::format("loom {} headers {} nvrtc {} driver {}", LOOM_VERSION_STRING,
                       detail::embedded_set_hash().substr(0, 16), tc.nvrtc_version, detail::driver_version());
}

std::string safe(const std::string& s) {
    std::string o;
    for (char c : s) o += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-') ? c : '_';
    return o;
}

std::optional<json> read_persisted(const std::string& path) {
    if (!detail::file_exists(path)) return std::nullopt;
    try {
        return json::parse(detail::read_file(path));
    } catch (const std::exception&) {
        return std::nullopt;  // damaged: re-tune or fall back to the heuristic
    }
}

void persist(const std::string& path, const json& j) {
    detail::make_dirs(fs::path(path).parent_path().string());
    std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
    detail::write_file(tmp, j.dump(2));
    std::error_code ec;
    fs::rename(tmp, path, ec);  // atomic replace: readers see the old or the new file
    LOOM_CHECK(!ec, "cannot write tuning result {}: {}", path, ec.message());
}

std::vector<std::uint8_t> pack(const std::vector<double>& v) {
    std::vector<std::uint8_t> b(v.size() * sizeof(double));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

std::vector<double> unpack(const std::vector<std::uint8_t>& b, std::size_t n, int rank) {
    LOOM_CHECK(b.size() == n * sizeof(double), "autotune: rank {} sent {} timings, expected {} (same candidates?)",
               rank, b.size() / sizeof(double), n);
    std::vector<double> v(n);
    std::memcpy(v.data(), b.data(), b.size());
    return v;
}

json result_json(const TuneRequest& req, const std::vector<double>& worst, std::size_t winner, int ranks) {
    auto us = [](double t) { return std::isfinite(t) ? json(t) : json(nullptr); };
    json c = json::array();
    for (std::size_t i = 0; i < req.candidates.size(); ++i) {
        c.push_back({{"name", req.candidates[i].name},
                     {"config", req.candidates[i].config},
                     {"slowest_rank_us", us(worst[i])}});
    }
    return json{{"op", req.op},
                {"shape_bucket", req.shape_bucket},
                {"world_size", ranks},
                {"arch", req.arch},
                {"versions", versions()},
                {"winner", req.candidates[winner].name},
                {"winner_config", req.candidates[winner].config},
                {"winner_us", worst[winner]},
                {"heuristic", req.candidates[req.heuristic].name},
                {"heuristic_us", us(worst[req.heuristic])},
                {"candidates", c}};
}

}  // namespace

std::string shape_bucket(std::initializer_list<std::pair<const char*, long long>> dims) {
    std::string s;
    for (const auto& [name, v] : dims) {
        LOOM_CHECK(v >= 0, "shape_bucket: expected a non-negative {}, given {}", name, v);
        long long p = 1;
        while (p < v) p <<= 1;
        s += fmt::format("{}{}{}", s.empty() ? "" : "_", name, v == 0 ? 0 : p);
    }
    return s;
}

std::string tune_file(const std::string& op, const std::string& bucket, int world_size, int arch) {
    std::string id = detail::Sha256()
                         .field(op)
                         .field(bucket)
                         .field(std::to_string(world_size))
                         .field(std::to_string(arch))
                         .field(versions())
                         .hex();
    return fmt::format("{}/tune/{}/{}-w{}-sm{}-{}.json", detail::cache_root(), safe(op), safe(bucket), world_size, arch,
                       id.substr(0, 16));
}

TuneResult autotune(const TuneRequest& req, World* world) {
    LOOM_CHECK(!req.candidates.empty(), "autotune({}): expected at least one candidate, given none", req.op);
    LOOM_CHECK(req.heuristic < req.candidates.size(), "autotune({}): heuristic index {} is not among {} candidates",
               req.op, req.heuristic, req.candidates.size());
    const int ranks = world ? world->world_size() : 1;
    const int rank = world ? world->rank() : 0;
    const std::string path = tune_file(req.op, req.shape_bucket, ranks, req.arch);
    auto index_of = [&](const std::string& name) -> std::optional<std::size_t> {
        for (std::size_t i = 0; i < req.candidates.size(); ++i)
            if (req.candidates[i].name == name) return i;
        return std::nullopt;
    };

    if (!settings().autotune) {
        if (auto j = read_persisted(path)) {
            if (auto i = index_of(j->value("winner", ""))) {
                return {req.candidates[*i], *i, "persisted", j->value("winner_us", 0.0)};
            }
        }
        return {req.candidates[req.heuristic], req.heuristic, "heuristic", 0};
    }

    LOOM_CHECK(static_cast<bool>(req.time_us), "autotune({}): LOOM_AUTOTUNE=1 needs a time_us callback", req.op);
    const double inf = std::numeric_limits<double>::infinity();
    const std::size_t n = req.candidates.size();
    std::vector<double> mine(n, inf);
    std::vector<std::string> errors(n);
    std::vector<std::vector<double>> runs(n);
    const std::size_t rounds = static_cast<std::size_t>(std::max(req.rounds, 1));
    double best_local = inf;
    for (std::size_t round = 0; round < rounds; ++round) {
        const std::size_t start = round * n / rounds;
        for (std::size_t j = 0; j < n; ++j) {
            const std::size_t i = (start + j) % n;
            // A candidate that threw is not run again: its error (e.g. a tile the shape cannot take) is the same on
            // every rank, so every rank skips it alike, as collective candidates need.
            if (!errors[i].empty()) continue;
            double t = inf;
            try {
                t = req.time_us(req.candidates[i]);
            } catch (const Error& e) {
                errors[i] = e.what();
            }
            if (std::isfinite(t) && t > 0) {
                runs[i].push_back(t);
                best_local = std::min(best_local, t);
            }
            if (rank == 0) {
                log_progress(LogLevel::Warn, "tune {} {}: round {}/{} {}/{} {} {} (best {:.1f} us)", req.op,
                             req.shape_bucket, round + 1, rounds, j + 1, n, req.candidates[i].name,
                             std::isfinite(t) ? fmt::format("{:.1f} us", t) : std::string("failed"), best_local);
            }
        }
    }
    for (std::size_t i = 0; i < n; ++i) {
        std::vector<double>& r = runs[i];
        if (!errors[i].empty() || r.size() != rounds) continue;  // failing once (error, no time): never wins
        std::nth_element(r.begin(), r.begin() + r.size() / 2, r.end());
        mine[i] = r[r.size() / 2];
    }

    // Slowest rank decides each candidate's cost; rank 0 picks and publishes so that every rank agrees.
    static std::atomic<int> call{0};
    const std::string tag = fmt::format("loom/tune/{}/{}/{}", call++, req.op, req.shape_bucket);
    std::vector<double> worst = mine;
    if (world) {
        auto all = world->store().all_gather(tag + "/times", pack(mine));
        for (int r = 0; r < static_cast<int>(all.size()); ++r) {
            auto v = unpack(all[r], n, r);
            for (std::size_t i = 0; i < n; ++i) worst[i] = std::max(worst[i], v[i]);
        }
    }
    std::size_t winner = 0;
    if (rank == 0) {
        for (std::size_t i = 1; i < n; ++i)
            if (worst[i] < worst[winner]) winner = i;
        if (!std::isfinite(worst[winner])) winner = n;  // nothing ran everywhere
        log_progress_end(LogLevel::Warn);
        if (winner < n) {
            // Persist before publishing: once any rank has the winner, the file is there for later runs.
            try {
                persist(path, result_json(req, worst, winner, ranks));
            } catch (const Error& e) {
                log(LogLevel::Warn, "tune {} {}: result not persisted: {}", req.op, req.shape_bucket, e.what());
            }
        }
        if (world) world->store().set(tag + "/winner", std::to_string(winner));
    } else {
        winner = std::stoul(world->store().get_string(tag + "/winner"));
    }
    if (winner == n) {
        std::string why;
        for (std::size_t i = 0; i < n; ++i)
            if (!errors[i].empty()) why += fmt::format("\n  {}: {}", req.candidates[i].name, errors[i]);
        LOOM_FAIL("autotune({} {}): no candidate ran on every rank{}", req.op, req.shape_bucket, why);
    }
    return {req.candidates[winner], winner, "tuned", worst[winner]};
}

}  // namespace loom::jit
