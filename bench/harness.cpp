#include "harness.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>

#include "loom/jit/jit.hpp"
#include "loom/runtime/env.hpp"
#include "loom/runtime/error.hpp"
#include "loom/version.hpp"

namespace loom::bench {
namespace {

// Scratch that evicts L2 when rewritten: twice the L2 size of the current device. The clean flush then reads a second
// buffer of that size (TimeOptions::flush_l2_clean), allocated and its kernel compiled at first use.
struct L2Flusher {
    void* buf = nullptr;
    void* clean = nullptr;
    uint32_t* sink = nullptr;
    const jit::Kernel* read = nullptr;
    int sms = 0;
    std::size_t bytes = 0;
    explicit L2Flusher() {
        int dev = 0, l2 = 0;
        LOOM_CHECK_CUDA(cudaGetDevice(&dev));
        LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
        LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        bytes = std::max<std::size_t>(2 * static_cast<std::size_t>(l2), 64 << 20);
        LOOM_CHECK_CUDA(cudaMalloc(&buf, bytes));
    }
    ~L2Flusher() {
        cudaFree(buf);
        cudaFree(clean);
        cudaFree(sink);
    }
    void flush(cudaStream_t s, bool leave_clean) {
        LOOM_CHECK_CUDA(cudaMemsetAsync(buf, 0x5a, bytes, s));
        if (!leave_clean) return;
        if (read == nullptr) {
            LOOM_CHECK_CUDA(cudaMalloc(&clean, bytes));
            LOOM_CHECK_CUDA(cudaMemsetAsync(clean, 0x3c, bytes, s));
            LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&sink), sizeof(uint32_t)));
            read = &jit::get_kernel(
                {.header = source_file("bench/kernels/l2_flush.cuh"), .name = "loom_bench::read_vec16"});
        }
        jit::LaunchConfig lc;
        lc.grid = dim3(static_cast<unsigned>(4 * sms));
        lc.block = dim3(512);
        lc.stream = s;
        const unsigned long long n16 = bytes / 16;
        const uint32_t never = 0x9e3779b9u;
        (*read)(lc, clean, n16, never, sink);
    }
};

std::string run_capture(const char* cmd) {
    std::string out;
    if (FILE* p = popen(cmd, "r")) {
        char line[256];
        while (fgets(line, sizeof line, p)) out += line;
        pclose(p);
    }
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return out;
}

double percentile(std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    std::size_t i = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
    return v[std::min(i, v.size() - 1)];
}

}  // namespace

std::vector<Timing> time_ops(const std::vector<std::function<void(cudaStream_t)>>& fns, cudaStream_t stream,
                             const TimeOptions& opts) {
    LOOM_CHECK(opts.iters > 0, "time_op: iters must be positive, given {}", opts.iters);
    LOOM_CHECK(opts.reps > 0, "time_op: reps must be positive, given {}", opts.reps);
    static thread_local L2Flusher flusher;
    cudaEvent_t start, stop;
    LOOM_CHECK_CUDA(cudaEventCreate(&start));
    LOOM_CHECK_CUDA(cudaEventCreate(&stop));
    for (const auto& fn : fns)
        for (int i = 0; i < opts.warmup; ++i) fn(stream);
    LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));

    std::vector<std::vector<double>> us(fns.size());
    for (auto& u : us) u.reserve(opts.iters);
    // Interleaved, every op seeing the same clocks and heat, in an order shuffled per iteration (fixed seed): the
    // H200 adds about 1 us to every fourth timed run of a few microseconds, which a fixed order of two ops puts on
    // the same op in every iteration.
    std::mt19937 rng(0x10c0);
    std::vector<std::size_t> order(fns.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    for (int i = 0; i < opts.iters; ++i) {
        std::shuffle(order.begin(), order.end(), rng);
        for (const std::size_t f : order) {
            if (opts.flush_l2) flusher.flush(stream, opts.flush_l2_clean);
            if (opts.world) {
                LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
                opts.world->barrier("bench");
            }
            if (opts.align) opts.align(stream);
            LOOM_CHECK_CUDA(cudaEventRecord(start, stream));
            for (int r = 0; r < opts.reps; ++r) fns[f](stream);
            LOOM_CHECK_CUDA(cudaEventRecord(stop, stream));
            LOOM_CHECK_CUDA(cudaEventSynchronize(stop));
            float ms = 0;
            LOOM_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
            us[f].push_back(ms * 1e3 / opts.reps);
        }
    }
    LOOM_CHECK_CUDA(cudaGetLastError());
    cudaEventDestroy(start);
    cudaEventDestroy(stop);

    std::vector<Timing> out(fns.size());
    for (std::size_t f = 0; f < fns.size(); ++f) {
        Timing& t = out[f];
        t.iters = opts.iters;
        t.median_us = percentile(us[f], 0.5);
        t.min_us = percentile(us[f], 0.0);
        t.p90_us = percentile(us[f], 0.9);
        if (opts.world && opts.world->world_size() > 1) {
            // The slowest rank's figures decide; every rank returns the same Timing.
            double mine[3] = {t.median_us, t.min_us, t.p90_us};
            Bytes b(sizeof mine);
            std::memcpy(b.data(), mine, sizeof mine);
            auto all = opts.world->store().all_gather("bench-timing", b);
            for (const auto& r : all) {
                double other[3];
                std::memcpy(other, r.data(), sizeof other);
                t.median_us = std::max(t.median_us, other[0]);
                t.min_us = std::max(t.min_us, other[1]);
                t.p90_us = std::max(t.p90_us, other[2]);
            }
        }
    }
    return out;
}

Timing time_op(const std::function<void(cudaStream_t)>& fn, cudaStream_t stream, const TimeOptions& opts) {
    return time_ops({fn}, stream, opts)[0];
}

std::string gpu_name() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        return "none";
    }
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceProp p{};
    LOOM_CHECK_CUDA(cudaGetDeviceProperties(&p, dev));
    return p.name;
}

Report::Report(std::string op, int ranks, int argc, char** argv) {
    std::string command;
    for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
    if (const char* c = std::getenv("LOOM_BENCH_COMMAND")) command = c;  // the full launcher line, when wrapped
    const char* commit = std::getenv("LOOM_GIT_COMMIT");
    char date[32];
    std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    doc_ = {{"op", std::move(op)},
            {"command", command},
            {"gpu", gpu_name()},
            {"commit", commit ? std::string(commit) : run_capture("git rev-parse --short HEAD 2>/dev/null")},
            {"date", date},
            {"ranks", nlohmann::json::array({ranks})},  // docs/perf lists the rank counts a file holds
            {"rows", nlohmann::json::array()}};
}

void Report::add_row(nlohmann::json row) {
    if (!row.contains("speedup") && row.contains("baselines") && row.contains("loom_us")) {
        nlohmann::json s = nlohmann::json::object();
        double loom = row["loom_us"].get<double>();
        for (auto& [name, us] : row["baselines"].items())
            if (loom > 0 && us.is_number()) s[name] = us.get<double>() / loom;
        row["speedup"] = s;
    }
    doc_["rows"].push_back(std::move(row));
}

nlohmann::json Report::to_json() const { return doc_; }

void Report::write(const std::string& path, bool echo_rows) const {
    // The rank counts the file holds: its rows' own where they carry one (files merged with --append), else the run's.
    nlohmann::json doc = doc_;
    std::set<int> ranks;
    for (const auto& row : doc["rows"])
        if (row.contains("ranks") && row["ranks"].is_number_integer()) ranks.insert(row["ranks"].get<int>());
    if (!ranks.empty()) doc["ranks"] = ranks;
    if (path.empty()) {
        std::printf("%s\n", doc.dump(2).c_str());
        return;
    }
    // The report's directory is made when missing (a fresh --out DIR), as the collectives' benchmark does.
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    std::ofstream f(path);
    LOOM_CHECK(f.good(), "cannot write benchmark report {}", path);
    f << doc.dump(2) << "\n";
    if (echo_rows)
        for (const auto& row : doc_["rows"]) std::printf("%s\n", row.dump().c_str());
    std::printf("wrote %s\n", path.c_str());
}

std::string source_file(const std::string& rel) {
    namespace fs = std::filesystem;
    std::error_code ec;
    std::vector<fs::path> roots;
    if (const char* s = std::getenv("LOOM_SOURCE_DIR")) roots.emplace_back(s);
    fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) roots.push_back(exe.parent_path().parent_path().parent_path());
    roots.push_back(fs::current_path());
    for (const auto& r : roots)
        if (fs::is_regular_file(r / rel, ec)) return fs::canonical(r / rel).string();
    LOOM_FAIL("{} not found (set LOOM_SOURCE_DIR to the source tree)", rel);
}

CLI::Option* add_bytes_option(CLI::App& app, const std::string& name, std::size_t& target, const std::string& help) {
    return app.add_option_function<std::string>(
        name,
        [&target, name](const std::string& text) {
            try {
                target = loom::parse_bytes(text, name);
            } catch (const loom::Error& e) {
                throw CLI::ValidationError(name, e.what());
            }
        },
        help);
}

void parse_or_exit(CLI::App& app, int argc, char** argv) {
    app.set_version_flag(
        "--version", fmt::format("{} (Loom {})", std::filesystem::path(argv[0]).filename().string(), loom::version()));
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        std::exit(app.exit(e));
    }
}

}  // namespace loom::bench
