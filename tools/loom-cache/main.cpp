// loom-cache: inspect, clear and warm Loom's JIT cache.
//   loom-cache list                 kernels in the cache (key, kernel, target, compiler, size, registers)
//   loom-cache tuned                the autotuner's persisted results (op, shape, world size, arch, winner, times)
//   loom-cache clear                remove the cache's kernels, headers and tuning results
//   loom-cache precompile --arch 90 compile every registered sample kernel (src/jit/kernel_samples.cpp)
#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "jit/kernel_samples.hpp"
#include "loom/jit/jit.hpp"
#include "loom/runtime/error.hpp"
#include "loom/version.hpp"

namespace fs = std::filesystem;

namespace {

int list() {
    fs::path jit = fs::path(loom::jit::cache_dir()) / "jit";
    int n = 0;
    std::uintmax_t bytes = 0;
    fmt::print("{:<16} {:<8} {:<15} {:>9} {:>5}  {}\n", "key", "target", "compiler", "bytes", "regs", "kernel");
    if (fs::exists(jit)) {
        for (const auto& e : fs::directory_iterator(jit)) {
            fs::path meta = e.path() / "meta.json";
            if (!fs::exists(meta)) continue;
            try {
                auto m = nlohmann::json::parse(std::ifstream(meta));
                std::uintmax_t b = m.value("cubin_bytes", 0ull);
                bytes += b;
                ++n;
                fmt::print("{:<16} {:<8} {:<15} {:>9} {:>5}  {}\n", e.path().filename().string().substr(0, 16),
                           m.value("target", "?"), m.value("compiler", "?"), b, m.value("registers", -1),
                           m.value("kernel", "?"));
            } catch (const std::exception& ex) {
                fmt::print("{:<16} damaged entry: {}\n", e.path().filename().string().substr(0, 16), ex.what());
            }
        }
    }
    fmt::print("{} kernels, {} bytes of cubins in {}\n", n, bytes, jit.string());
    return 0;
}

// Each persisted result of jit::autotune (LOOM_AUTOTUNE=1 runs): what won, and by how much over the heuristic's pick.
int tuned() {
    fs::path tune = fs::path(loom::jit::cache_dir()) / "tune";
    int n = 0;
    fmt::print("{:<10} {:<52} {:>3} {:>4} {:>11} {:>11} {:>7}  {}\n", "op", "shape", "W", "sm", "winner_us", "heur_us",
               "gain", "winner");
    if (fs::exists(tune)) {
        for (const auto& e : fs::recursive_directory_iterator(tune)) {
            if (!e.is_regular_file() || e.path().extension() != ".json") continue;
            try {
                const auto j = nlohmann::json::parse(std::ifstream(e.path()));
                const double won = j.value("winner_us", 0.0);
                const double heur = j.at("heuristic_us").is_number() ? j.at("heuristic_us").get<double>() : 0.0;
                ++n;
                fmt::print("{:<10} {:<52} {:>3} {:>4} {:>11.1f} {:>11.1f} {:>7}  {}\n", j.value("op", "?"),
                           j.value("shape_bucket", "?"), j.value("world_size", 0), j.value("arch", 0), won, heur,
                           won > 0 && heur > 0 ? fmt::format("{:.3f}x", heur / won) : std::string("-"),
                           j.value("winner", "?"));
            } catch (const std::exception& ex) {
                fmt::print("damaged tuning result {}: {}\n", e.path().string(), ex.what());
            }
        }
    }
    fmt::print("{} tuning results in {} (gain: the heuristic's time over the winner's, as tuned)\n", n, tune.string());
    return 0;
}

int clear() {
    fs::path root = loom::jit::cache_dir();
    std::uintmax_t removed = 0;
    for (const char* sub : {"jit", "headers", "tune"}) removed += fs::remove_all(root / sub);
    fmt::print("removed {} files and directories under {}\n", removed, root.string());
    return 0;
}

int precompile(int arch, bool stop_on_error) {
    int ok = 0, failed = 0, cached = 0;
    for (const auto& s : loom::jit::kernel_samples()) {
        if (s.sm90_only && arch != 90) continue;
        auto spec = s.spec();
        try {
            auto r = loom::jit::compile(spec, arch);
            (r.from_cache ? cached : ok)++;
            fmt::print("{:<6} {:>7.2f} s  {} ({} regs)\n", r.from_cache ? "cached" : "built", r.seconds, spec.display(),
                       r.registers);
        } catch (const loom::Error& e) {
            ++failed;
            fmt::print(stderr, "FAILED {}: {}\n", spec.display(), e.what());
            if (stop_on_error) break;
        }
    }
    fmt::print("{} compiled, {} already cached, {} failed (sm_{}, cache {})\n", ok, cached, failed, arch,
               loom::jit::cache_dir());
    return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Loom's JIT cache (LOOM_CACHE_DIR, default ~/.cache/loom)"};
    app.set_version_flag("--version", fmt::format("loom-cache {}", loom::version()));
    app.require_subcommand(1);
    auto* l = app.add_subcommand("list", "list cached kernels");
    auto* t = app.add_subcommand("tuned", "list the autotuner's persisted results");
    auto* c = app.add_subcommand("clear", "remove cached kernels, headers and tuning results");
    auto* p = app.add_subcommand("precompile", "compile every registered sample kernel");
    int arch = 90;
    bool stop = false;
    p->add_option("--arch", arch, "compute capability x 10 (90 -> sm_90a, 80 -> sm_80)")->check(CLI::Range(50, 130));
    p->add_flag("--stop-on-error", stop, "stop at the first failure");
    CLI11_PARSE(app, argc, argv);
    try {
        if (*l) return list();
        if (*t) return tuned();
        if (*c) return clear();
        if (*p) return precompile(arch, stop);
    } catch (const std::exception& e) {
        fmt::print(stderr, "loom-cache: {}\n", e.what());
        return 1;
    }
    return 0;
}
