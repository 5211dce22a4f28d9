// JIT cost: cold compile (cache emptied) with NVRTC and nvcc, warm cache hit (disk read), first load on the
// GPU from a warm disk cache, and the in-process hit, for the GEMM kernel (the largest Loom kernel).
//   bench-jit [--reps 3] [--out docs/perf/jit.json]
// Uses its own cache directory under /tmp (LOOM_CACHE_DIR is overridden), so the user's cache is untouched.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "harness.hpp"
#include "loom/jit/jit.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/runtime/driver.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "runtime/settings_override.hpp"

namespace fs = std::filesystem;

namespace {

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

template <class F>
double time_us(F&& f) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

// The GEMM launcher's own spec (default config: 128 x 256 tiles, 4 stages, bf16 in/out), so the bench follows
// the kernel's template signature.
loom::jit::KernelSpec gemm_spec(bool nvcc) {
    loom::jit::KernelSpec s =
        loom::gemm_kernel_spec(loom::GemmConfig{}, loom::DType::BF16, loom::DType::BF16, loom::DType::F32, false);
    s.force_nvcc = nvcc;
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    int reps = 3;
    std::string out;
    CLI::App app{"bench-jit: cold and warm JIT compile / load times (docs/perf/jit.json)"};
    app.add_option("--reps", reps, "repetitions per measurement")->capture_default_str()->check(CLI::PositiveNumber);
    app.add_option("--out", out, "output file (default: print only)");
    loom::bench::parse_or_exit(app, argc, argv);
    const fs::path cache = fs::temp_directory_path() / ("loom-bench-jit-" + std::to_string(::getpid()));
    const loom::detail::ScopedSettings in_cache([&](loom::Settings& s) { s.cache_dir = cache.string(); });
    loom::bench::Report report("jit", 1, argc, argv);
    const auto spec = gemm_spec(false);

    // Cold: an empty cache each time (the embedded headers are re-materialised too).
    std::vector<double> cold;
    loom::jit::CompileResult last;
    for (int r = 0; r < reps; ++r) {
        fs::remove_all(cache);
        cold.push_back(time_us([&] { last = loom::jit::compile(spec, 90); }));
    }
    report.add_row({{"case", "cold_compile_nvrtc"},
                    {"kernel", spec.display()},
                    {"loom_us", median(cold)},
                    {"registers", last.registers},
                    {"cubin_bytes", last.cubin.size()},
                    {"reps", reps},
                    {"baselines", nlohmann::json::object()}});
    // nvcc cold compile of the same kernel, as the baseline the NVRTC path avoids.
    try {
        auto nvcc_spec = gemm_spec(true);
        double t = time_us([&] { loom::jit::compile(nvcc_spec, 90); });
        report.add_row({{"case", "cold_compile_nvcc"},
                        {"kernel", nvcc_spec.display()},
                        {"loom_us", t},
                        {"reps", 1},
                        {"baselines", nlohmann::json::object()}});
    } catch (const std::exception& e) {
        std::fprintf(stderr, "nvcc compile skipped: %s\n", e.what());
    }

    // Warm: a disk-cache hit (hash the TU + headers, read cubin and meta).
    std::vector<double> warm;
    for (int r = 0; r < std::max(20, reps); ++r) warm.push_back(time_us([&] { loom::jit::compile(spec, 90); }));
    report.add_row({{"case", "warm_cache_hit"},
                    {"kernel", spec.display()},
                    {"loom_us", median(warm)},
                    {"reps", warm.size()},
                    {"baselines", {{"cold_compile_nvrtc", median(cold)}}}});

    if (loom::driver::available() && loom::jit::current_arch() == 90) {
        // First get_kernel in this process with a warm disk cache: compile() hit + cuLibraryLoadData + lookup.
        double load = time_us([&] { loom::jit::get_kernel(spec); });
        report.add_row({{"case", "warm_load_get_kernel"},
                        {"kernel", spec.display()},
                        {"loom_us", load},
                        {"reps", 1},
                        {"baselines", {{"cold_compile_nvrtc", median(cold)}}}});
        std::vector<double> hit;
        for (int r = 0; r < 1000; ++r) hit.push_back(time_us([&] { loom::jit::get_kernel(spec); }));
        report.add_row({{"case", "in_process_hit_get_kernel"},
                        {"kernel", spec.display()},
                        {"loom_us", median(hit)},
                        {"reps", hit.size()},
                        {"baselines", nlohmann::json::object()}});
    } else {
        std::fprintf(stderr, "no sm_90 GPU: load timings skipped (%s)\n", loom::driver::unavailable_reason().c_str());
    }
    fs::remove_all(cache);
    if (!out.empty())
        report.write(out);
    else
        std::printf("%s\n", report.to_json().dump(2).c_str());
    return 0;
}
