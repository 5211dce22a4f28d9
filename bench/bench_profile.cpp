// The intra-kernel profiler's overhead (docs/profiling.md): ag_gemm, gemm_rs and all_reduce, each timed unprofiled
// and profiled in the same run, alternated (time_ops: one timed run is both calls, each with its flush and barrier),
// medians over the slowest rank. loom_us is the profiled call, baselines.unprofiled the same call without the
// profiler, so speedup.unprofiled = unprofiled / profiled (1.0: no overhead; 0.98: 2 % slower profiled).
//
//   loomrun -n 4 build/bench/bench-profile --out docs/perf/profiler_overhead.json [--iters 30] [--m 8192 --n 4096
//   --k 4096] [--ar-bytes 64M]
// The profiler's ring is emptied between the ops; records past its capacity are dropped at the same cost.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "harness.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/profile.hpp"
#include "loom/runtime/world.hpp"

namespace {

struct Args {
    std::string out = "profiler_overhead.json";
    int iters = 30;
    int64_t m = 8192, n = 4096, k = 4096;
    std::size_t ar_bytes = std::size_t{64} << 20;
};

Args parse(int argc, char** argv) {
    Args a;
    CLI::App app{"bench-profile: the intra-kernel profiler's overhead, profiled vs unprofiled calls alternated"};
    app.add_option("--out", a.out, "output file (rank 0 writes it)")->capture_default_str();
    app.add_option("--iters", a.iters, "timed runs per op")->capture_default_str()->check(CLI::PositiveNumber);
    app.add_option("--m", a.m, "M of ag_gemm and gemm_rs (a multiple of the rank count)")->capture_default_str();
    app.add_option("--n", a.n, "N (ag_gemm: this rank's columns; gemm_rs: C's)")->capture_default_str();
    app.add_option("--k", a.k, "K (gemm_rs: this rank's share of K)")->capture_default_str();
    loom::bench::add_bytes_option(app, "--ar-bytes", a.ar_bytes, "all_reduce's bf16 buffer (default 64M)");
    loom::bench::parse_or_exit(app, argc, argv);
    return a;
}

void* device_bytes(std::size_t bytes) {
    void* p = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(&p, bytes));
    LOOM_CHECK_CUDA(cudaMemset(p, 0x3c, bytes));  // bf16 1.1719: finite products and sums
    return p;
}

// [unprofiled, profiled] medians of `op`, alternated; the ring emptied afterwards.
std::vector<loom::bench::Timing> off_on(loom::World& w, cudaStream_t s, int iters,
                                        const std::function<void(cudaStream_t)>& op) {
    loom::bench::TimeOptions t;
    t.world = &w;
    t.iters = iters;
    const auto off = [&](cudaStream_t st) {
        loom::profile::set_enabled(false);
        op(st);
    };
    const auto on = [&](cudaStream_t st) {
        loom::profile::set_enabled(true);
        op(st);
    };
    std::vector<loom::bench::Timing> r = loom::bench::time_ops({off, on}, s, t);
    loom::profile::set_enabled(false);
    loom::profile::clear();
    return r;
}

nlohmann::json row(const std::string& op, const std::string& shape, const std::vector<loom::bench::Timing>& r) {
    const double off = r[0].median_us, on = r[1].median_us;
    return {{"op", op},
            {"shape", shape},
            {"loom_us", on},
            {"baselines", {{"unprofiled", off}}},
            {"overhead_pct", 100.0 * (on - off) / off},
            {"note", "loom_us: profiled call; baselines.unprofiled: the same call unprofiled, alternated"}};
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Args a = parse(argc, argv);
        if (!loom::driver::available()) {
            std::printf("no GPU: %s\n", loom::driver::unavailable_reason().c_str());
            return 1;
        }
        loom::World w = loom::World::from_env();
        const int W = w.world_size();
        LOOM_CHECK(a.m % W == 0, "--m: expected a multiple of the rank count {}, given {}", W, a.m);
        cudaStream_t s;
        LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        loom::bench::Report report("profiler_overhead", W, argc, argv);
        const std::string shape = fmt::format("M={} N={} K={}", a.m, a.n, a.k);
        {
            void* A = device_bytes(a.m / W * a.k * 2);
            void* B = device_bytes(a.n * a.k * 2);
            void* C = device_bytes(a.m * a.n * 2);
            const auto r = off_on(w, s, a.iters, [&](cudaStream_t st) {
                loom::ag_gemm(w, {A, loom::DType::BF16, a.m / W, a.k, 0}, {B, loom::DType::BF16, a.n, a.k, 0},
                              {C, loom::DType::BF16, a.m, a.n, 0}, st);
            });
            report.add_row(row("ag_gemm", shape, r));
            for (void* p : {A, B, C}) cudaFree(p);
        }
        {
            void* A = device_bytes(a.m * a.k * 2);
            void* B = device_bytes(a.n * a.k * 2);
            void* C = device_bytes(a.m / W * a.n * 2);
            const auto r = off_on(w, s, a.iters, [&](cudaStream_t st) {
                loom::gemm_rs(w, {A, loom::DType::BF16, a.m, a.k, 0}, {B, loom::DType::BF16, a.n, a.k, 0},
                              {C, loom::DType::BF16, a.m / W, a.n, 0}, st);
            });
            report.add_row(row("gemm_rs", shape, r));
            for (void* p : {A, B, C}) cudaFree(p);
        }
        {
            const std::size_t count = a.ar_bytes / 2;
            void* in = w.alloc_bytes(a.ar_bytes);
            void* out = w.alloc_bytes(a.ar_bytes);
            LOOM_CHECK_CUDA(cudaMemset(in, 0x3c, a.ar_bytes));
            const auto r = off_on(w, s, a.iters, [&](cudaStream_t st) {
                loom::all_reduce(w, {in, loom::DType::BF16, count}, {out, loom::DType::BF16, count}, st);
            });
            report.add_row(row("all_reduce", fmt::format("bytes={}", a.ar_bytes), r));
            w.barrier();
            w.free(out);
            w.free(in);
        }
        if (w.rank() == 0) report.write(a.out);
        cudaStreamDestroy(s);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench-profile: %s\n", e.what());
        return 1;
    }
}
