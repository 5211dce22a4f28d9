// Runtime benchmarks (run under loomrun; every rank runs the same program):
//  (a) start-up: process start -> World ready (store, device, symmetric heap mapped) -> first 1 GiB symmetric
//      allocation. Each rank measures; the slowest rank is reported.
//  (b) a vectorised copy kernel writing into the next local peer's symmetric memory, 64 MiB .. 1 GiB, all SMs,
//      against cudaMemcpy device-to-device of the same bytes (the local HBM bound) and cudaMemcpy into the same
//      peer mapping (the copy engine), in the same run with the same ranks running at once.
//
//   loomrun -n 2 build/bench/bench-runtime --out docs/perf/runtime.json [--append] [--max-bytes 1G] [--iters 20]
// --append keeps the rows of an existing report (runs at 2, 4 and 8 ranks collect into one file).
#include <cuda_runtime_api.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "harness.hpp"
#include "loom/jit/jit.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "loom/runtime/world.hpp"

namespace fs = std::filesystem;
using loom::bench::Report;

namespace {

// Microseconds since this process started: /proc/self/stat's start time (clock ticks since boot, so 10 ms
// resolution at the usual 100 Hz) against CLOCK_BOOTTIME.
double us_since_process_start() {
    std::ifstream f("/proc/self/stat");
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    auto close = stat.rfind(')');  // the command name may contain spaces
    LOOM_CHECK(close != std::string::npos, "cannot parse /proc/self/stat");
    std::vector<std::string> fields;
    std::size_t pos = close + 2;
    while (pos < stat.size()) {
        auto sp = stat.find(' ', pos);
        fields.push_back(stat.substr(pos, sp - pos));
        if (sp == std::string::npos) break;
        pos = sp + 1;
    }
    // fields[0] is field 3 (state); starttime is field 22.
    LOOM_CHECK(fields.size() > 19, "cannot parse /proc/self/stat");
    const double start_s = std::stod(fields[19]) / static_cast<double>(::sysconf(_SC_CLK_TCK));
    timespec now{};
    ::clock_gettime(CLOCK_BOOTTIME, &now);
    return (static_cast<double>(now.tv_sec) + now.tv_nsec * 1e-9 - start_s) * 1e6;
}

double max_over_ranks(loom::World& w, double mine) {
    loom::Bytes b(sizeof mine);
    std::memcpy(b.data(), &mine, sizeof mine);
    double best = mine;
    for (const auto& r : w.store().all_gather("bench-runtime/max", b)) {
        double v;
        std::memcpy(&v, r.data(), sizeof v);
        best = std::max(best, v);
    }
    return best;
}

std::string kernels_dir() {
    return std::filesystem::path(loom::bench::source_file("bench/kernels/peer_copy.cuh")).parent_path().string();
}

struct Args {
    std::string out = "runtime.json";
    bool append = false;
    std::size_t max_bytes = std::size_t{1} << 30;
    int iters = 20;
};

Args parse(int argc, char** argv) {
    Args a;
    CLI::App app{"bench-runtime: start-up, symmetric allocation and peer-copy figures (docs/perf/runtime.json)"};
    app.add_option("--out", a.out, "output file")->capture_default_str();
    app.add_flag("--append", a.append, "keep the file's rows of other rank counts");
    loom::bench::add_bytes_option(app, "--max-bytes", a.max_bytes, "largest copy (default 1G)");
    app.add_option("--iters", a.iters, "timed runs per point")->capture_default_str()->check(CLI::PositiveNumber);
    loom::bench::parse_or_exit(app, argc, argv);
    return a;
}

}  // namespace

int main(int argc, char** argv) {
    // (a) starts counting at process start, so nothing heavy may precede it.
    try {
        Args args = parse(argc, argv);
        if (!loom::driver::available()) {
            std::printf("no GPU: %s\n", loom::driver::unavailable_reason().c_str());
            return 1;
        }
        constexpr std::size_t kGiB = std::size_t{1} << 30;
        loom::WorldOptions opts;
        opts.symmetric_size = std::max(loom::settings().symmetric_size, kGiB);
        loom::World world = loom::World::from_env(opts);
        const double ready_us = us_since_process_start();
        char* dst = static_cast<char*>(world.alloc_bytes(kGiB));
        const double alloc_us = us_since_process_start();
        const double ready_max = max_over_ranks(world, ready_us), alloc_max = max_over_ranks(world, alloc_us);

        const int ranks = world.world_size();
        Report report("runtime", ranks, argc, argv);
        report.add_row({{"ranks", ranks},
                        {"metric", "start_to_world_ready"},
                        {"bytes", world.heap().size()},
                        {"loom_us", ready_max},
                        {"baselines", nlohmann::json::object()},
                        {"note", "process start (10 ms resolution) to World::from_env returned; slowest rank"}});
        report.add_row({{"ranks", ranks},
                        {"metric", "start_to_first_1GiB_symmetric_alloc"},
                        {"bytes", kGiB},
                        {"loom_us", alloc_max},
                        {"baselines", nlohmann::json::object()},
                        {"note", "process start to the first 1 GiB World::alloc_bytes returned; slowest rank"}});

        // (b) Copy into the next local peer's heap vs. cudaMemcpy D2D, every rank at once.
        const std::size_t max_bytes = std::min(args.max_bytes, kGiB);
        void *src = nullptr, *local_dst = nullptr;
        LOOM_CHECK_CUDA(cudaMalloc(&src, max_bytes));
        LOOM_CHECK_CUDA(cudaMalloc(&local_dst, max_bytes));
        LOOM_CHECK_CUDA(cudaMemset(src, 0x3c, max_bytes));
        cudaStream_t stream;
        LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        int sms = 0, gpus = 0;
        LOOM_CHECK_CUDA(cudaGetDeviceCount(&gpus));
        LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, world.device()));
        const auto& copy =
            loom::jit::get_kernel({.header = kernels_dir() + "/peer_copy.cuh", .name = "loom_bench::copy_vec16"});
        const int L = world.local_world_size();
        const int peer = world.node() * L + (world.local_rank() + 1) % L;
        auto* peer_dst = world.peer_ptr(dst, peer);
        world.barrier("bench-runtime/ready");

        loom::bench::TimeOptions topts;
        topts.world = &world;
        topts.iters = args.iters;
        for (std::size_t bytes = std::size_t{64} << 20; bytes <= max_bytes; bytes *= 2) {
            const std::uint64_t n16 = bytes / 16;
            auto loom_t = loom::bench::time_op(
                [&](cudaStream_t s) {
                    copy({.grid = dim3(4 * sms), .block = dim3(512), .stream = s}, reinterpret_cast<uint4*>(peer_dst),
                         static_cast<const uint4*>(src), n16);
                },
                stream, topts);
            auto memcpy_t = loom::bench::time_op(
                [&](cudaStream_t s) {
                    LOOM_CHECK_CUDA(cudaMemcpyAsync(local_dst, src, bytes, cudaMemcpyDeviceToDevice, s));
                },
                stream, topts);
            // The copy engine writing the same bytes through the same mapping (over NVLink when the peer is on
            // another GPU): the like-for-like baseline. cudaMemcpy_d2d is the local HBM bound.
            auto ce_t = loom::bench::time_op(
                [&](cudaStream_t s) {
                    LOOM_CHECK_CUDA(cudaMemcpyAsync(peer_dst, src, bytes, cudaMemcpyDeviceToDevice, s));
                },
                stream, topts);
            report.add_row(
                {{"ranks", ranks},
                 {"visible_gpus", gpus},
                 {"metric", "peer_write_copy_vec16"},
                 {"bytes", bytes},
                 {"loom_us", loom_t.median_us},
                 {"loom_GBps", loom::bench::gbps(static_cast<double>(bytes), loom_t.median_us)},
                 {"baselines", {{"cudaMemcpy_d2d", memcpy_t.median_us}, {"cudaMemcpy_to_peer", ce_t.median_us}}},
                 {"note", "every rank copies into the next local rank's heap at once; slowest rank's median"}});
        }
        // The kernel really writes the peer's memory: clear our heap copy, let the previous rank's kernel fill it
        // once more, and check the last bytes.
        LOOM_CHECK_CUDA(cudaMemset(dst, 0, max_bytes));
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
        world.barrier("bench-runtime/cleared");
        copy({.grid = dim3(4 * sms), .block = dim3(512), .stream = stream}, reinterpret_cast<uint4*>(peer_dst),
             static_cast<const uint4*>(src), static_cast<std::uint64_t>(max_bytes / 16));
        LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
        world.barrier("bench-runtime/copied");
        std::vector<unsigned char> tail(4096);
        LOOM_CHECK_CUDA(cudaMemcpy(tail.data(), dst + max_bytes - tail.size(), tail.size(), cudaMemcpyDeviceToHost));
        for (unsigned char c : tail) LOOM_CHECK(c == 0x3c, "peer copy check: expected 0x3c, found {:#x}", c);

        if (world.rank() == 0) {
            if (args.append && fs::exists(args.out)) {
                std::ifstream f(args.out);
                auto old = nlohmann::json::parse(f);
                Report merged("runtime", ranks, argc, argv);
                for (const auto& row : old["rows"])
                    if (row.value("ranks", -1) != ranks) merged.add_row(row);
                const nlohmann::json fresh = report.to_json();
                for (const auto& row : fresh["rows"]) merged.add_row(row);
                merged.write(args.out);
            } else {
                report.write(args.out);
            }
        }
        world.barrier("bench-runtime/done");
        world.free(dst);
        cudaFree(src);
        cudaFree(local_dst);
        cudaStreamDestroy(stream);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench-runtime: %s\n", e.what());
        return 1;
    }
}
