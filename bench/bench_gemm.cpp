// loom::gemm vs cuBLASLt (bf16 in, or fp8 e4m3 with --dtype f8e4m3; bf16 out, fp32 accumulate, same inputs, best
// heuristic algorithm): 8192^3,
// 4096^3 and the per-rank TP=8 MLP GEMMs at M = 8192 (AllGather+GEMM and GEMM+ReduceScatter), or --shapes.
// cuBLASLt and each loom config are timed interleaved, run by run (harness.hpp: time_ops): timed one after the
// other, the second paid for the heat and lower clocks the first left (8192x6656x16384: 0.91x sequentially, 1.00x
// interleaved, same binary). Each row names cuBLASLt's chosen algorithm (cublaslt_algo: cublasLt.h enum ids).
//
//   bench-gemm [--json docs/perf/gemm.json] [--quick] [--sweep] [--cluster 1|2] [--iters N] [--shapes MxNxK,...]
//              [--dtype bf16|f8e4m3] [--autotune] [--heuristic-cluster 1|2]
//   bench-gemm --decode [--json docs/perf/gemm_decode.json] [--decode-m 1,8,...] [--decode-n ...] [--decode-k ...]
//              [--dtype bf16|f8e4m3] [--copy-gbps G] [--iters N] [--decode-sweep N]
//
// Prints an aligned table, a line per (shape, variant) as it is timed: kind, MxNxK, variant and config, Loom's us,
// cuBLASLt's us, the ratio cuBLASLt / Loom (> 1: Loom faster), with fp8 also cuBLASLt's promoted mode and its ratio,
// Loom's TFLOP/s and the check. --json FILE (also spelled --out) writes the rows as JSON too.
//
// --autotune: per shape, also the config loom::gemm takes when tuning (Settings::autotune: its candidates timed by the
// autotuner, the winner persisted under the cache directory's tune/gemm/), checked and timed like the heuristic's as
// variant "autotuned". --heuristic-cluster: the heuristic's plan with that cluster size instead of its own choice.
//
// fp8 (op "gemm_fp8"): the ratio is to cuBLASLt with CUBLASLT_MATMUL_DESC_FAST_ACCUM (the products summed in the
// tensor cores' precision, as Loom's kernel sums them); cuBLASLt's default (partial sums promoted to fp32 on the CUDA
// cores, more precise, slower) is timed in the same interleaved runs as baseline "cublaslt_promoted".
//
// --decode (gemm_decode.hpp): the decode grid, M in {1, 8, 16, 32, 64, 128} x N in {1K, 4K, 8K, 16K, 32K} x K in {1K,
// 4K, 8K, 16K} by default, bf16 and fp8 (only --dtype's when given), loom::gemm with the config it chooses itself, each
// shape checked against cuBLASLt and two of its runs compared bitwise, then timed interleaved with cuBLASLt from a
// clean L2 (TimeOptions::flush_l2_clean); the table adds the bytes moved per second and their fraction of the copy
// bandwidth. --decode-sweep N also times, per shape, the decode plan's candidates (ops/gemm/decode_plan.cpp): the
// chosen one, the N cheapest by its model, the cheapest whole-tile one and the cheapest K-cluster plan of each cluster
// size, interleaved, each with its modelled time (the row's "candidates"): how the model ranks them against how they
// run.
//
// Every timed loom config is first checked against cuBLASLt's output on the same inputs (similarity
// calc_diff < 1e-5, no NaN; C is pre-filled with NaN so unwritten elements fail); a failing config is reported
// and never timed. --sweep times, per shape, the heuristic config and alternatives (BLOCK_N, cluster on/off,
// stages (the plans' depth; skinny M: narrow tiles with rings as deep as fit, and for 64 < M <= 128 64-row tiles in
// 2-CTA clusters), and the heuristic's BLOCK_N with the split-K tail toggled: off where the heuristic splits, 2 splits
// where it does not but the grid leaves a tail) and prints one line per (shape, variant). Configs without a cluster run
// first for every shape, then the clustered ones (a deadlock traps after ~17 s and ends the process: the partial JSON,
// <out>.partial, keeps what was measured). --cluster 1|2 restricts the sweep to one kind. docs/gemm.md says how to read
// the table.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cublaslt.hpp"
#include "gemm_decode.hpp"
#include "harness.hpp"
#include "loom/bf16.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "runtime/settings_override.hpp"
#include "table.hpp"

namespace {

struct Shape {
    const char* kind;
    int m, n, k;
};

struct Variant {
    std::string name;
    loom::GemmConfig cfg;
};

// The heuristic's plan for `s`: its own cluster size (heuristic_cluster 0) or the one given.
loom::GemmConfig heuristic(const Shape& s, int arch, int sms, loom::DType in, bool split_tail, int heuristic_cluster) {
    if (heuristic_cluster == 0)
        return loom::gemm_heuristic(s.m, s.n, s.k, false, arch, sms, split_tail, loom::GemmTiles::Plain, in);
    return loom::detail::gemm_heuristic_clustered(s.m, s.n, s.k, false, arch, sms, split_tail, loom::GemmTiles::Plain,
                                                  in, heuristic_cluster);
}

// The heuristic's config plus alternatives with cluster_m == `cluster` (the heuristic is listed in its own pass).
std::vector<Variant> variants(const Shape& s, const loom::GemmConfig& heur, int cluster, int sms, loom::DType in,
                              int heuristic_cluster) {
    std::vector<Variant> v;
    auto push = [&](const std::string& name, const loom::GemmConfig& c) {
        for (const auto& x : v)
            if (x.cfg.str() == c.str()) return;
        v.push_back({name, c});
    };
    if (heur.cluster_m == cluster) v.push_back({"heuristic", heur});
    // The split-K tail on / off at the heuristic's BLOCK_N (single-CTA tiles only).
    if (heur.cluster_m == cluster && cluster == 1) {
        loom::GemmConfig c = heur;
        if (heur.tail_splits >= 2) {
            c.tail_splits = 1;
            push("heuristic_nosplit", c);
            // The heuristic's own plan without splits: its BLOCK_N and grid may differ, e.g. where fewer tiles than
            // SMs make the whole GEMM a split tail.
            push("heuristic_splits_off", heuristic(s, 90, sms, in, /*split_tail=*/false, heuristic_cluster));
        } else if (const auto plan = loom::gemm_tail_plan(s.m, s.n, s.k, heur, heur.grid, 2); plan.splits >= 2) {
            c.tail_splits = plan.splits;
            push("heuristic_tail2", c);
        }
    }
    auto add = [&](int bm, int bn, int stages, int group_m, int splits) {
        loom::GemmConfig c = heur;
        c.block_m = bm;
        c.block_n = bn;
        c.stages = stages;
        c.cluster_m = cluster;
        c.group_m = group_m;
        c.tail_splits = 1;
        c.grid = static_cast<int>(loom::gemm_sm90_grid(s.m, s.n, c, sms));
        if (splits != 1) {  // 0: the automatic split, n: n splits
            const auto plan = loom::gemm_tail_plan(s.m, s.n, s.k, c, c.grid, splits);
            if (plan.splits < 2) return;
            c.tail_splits = plan.splits;
        }
        push(fmt::format("bm{}_bn{}_st{}_c{}_g{}{}", bm, bn, stages, cluster, group_m,
                         c.tail_splits > 1 ? fmt::format("_tail{}", c.tail_splits) : ""),
             c);
    };
    // Skinny GEMMs (M <= 128) stream B from memory: narrow tiles at ring depths around the plan's (12 at 64 x 64).
    if (s.m <= 128 && cluster == 1) {
        for (int bn : {64, 128}) {
            const int deepest = loom::kernels::gemm_sm90_max_stages(heur.block_m, bn);
            for (int st : {4, 8, 10, 12, deepest})
                if (st <= deepest) add(heur.block_m, bn, st, 1, 1);
        }
    }
    // 64 < M <= 128: 64-row tiles too, the two M-blocks sharing each N-block's B: single CTAs through L2, 2-CTA
    // clusters by multicast (each CTA loads half of it), these also at the deepest ring that fits.
    if (s.m > 64 && s.m <= 128)
        for (int bn : {64, 128, 256}) {
            add(64, bn, loom::kernels::gemm_sm90_plan_stages(64, bn), 2, 1);
            if (cluster == 2) add(64, bn, loom::kernels::gemm_sm90_max_stages(64, bn), 2, 1);
        }
    // The BLOCK_N / stage / group alternatives run every tile whole (128-row tiles: not for M <= 64).
    if (s.m > 64) {
        for (int bn : {256, 240, 224, 208, 192, 176, 160, 144, 128})
            add(128, bn, loom::kernels::gemm_sm90_plan_stages(128, bn), heur.group_m, 1);
        add(128, 256, 3, heur.group_m, 1);
        add(128, heur.block_n, loom::kernels::gemm_sm90_plan_stages(128, heur.block_n), 16, 1);
    }
    // 192-row tiles (three consumer warpgroups; BLOCK_N <= kGemmMaxBlockN192 under their 128-register cap),
    // single-CTA only, whole and with the automatic split tail.
    if (cluster == 1 && s.m > 128) {
        for (int bn : {176, 160, 144, 128}) {
            add(192, bn, loom::kernels::gemm_sm90_plan_stages(192, bn), heur.group_m, 1);
            add(192, bn, loom::kernels::gemm_sm90_plan_stages(192, bn), heur.group_m, 0);
        }
    }
    return v;
}

}  // namespace

int main(int argc, char** argv) {
    std::string out;
    bool quick = false, sweep = false;
    int only_cluster = 0, iters = 30;
    CLI::App app{"bench-gemm: Loom's GEMM against cuBLASLt on the issue's shapes (docs/perf/gemm.json)"};
    app.add_option("--json,--out", out, "also write the rows as JSON to this file (docs/perf/gemm.json)");
    app.add_flag("--quick", quick, "the two square shapes only");
    app.add_flag("--sweep", sweep, "also time every BLOCK_N / stage config per shape");
    app.add_option("--cluster", only_cluster, "only this cluster_m (0: the heuristic's)")->check(CLI::Range(0, 2));
    app.add_option("--iters", iters, "timed runs per shape")->capture_default_str()->check(CLI::PositiveNumber);
    std::vector<std::string> custom;
    app.add_option("--shapes", custom, "these shapes (MxNxK, comma-separated) instead of the issue's")->delimiter(',');
    bool autotune = false;
    app.add_flag("--autotune", autotune, "also time the autotuner's choice per shape (variant \"autotuned\")");
    int heuristic_cluster = 0;
    app.add_option("--heuristic-cluster", heuristic_cluster,
                   "the heuristic's plan with this cluster_m instead of its own choice (0: its own)")
        ->check(CLI::Range(0, 2));
    std::string dtype = "bf16";
    app.add_option("--dtype", dtype, "input type (fp8: B as [N, K], K a multiple of 16)")
        ->capture_default_str()
        ->check(CLI::IsMember({"bf16", "f8e4m3"}));
    bool decode = false;
    app.add_flag("--decode", decode,
                 "the decode grid (docs/perf/gemm_decode.json): M x N x K over --decode-m / -n / -k, bf16 and fp8 "
                 "(or --dtype), loom::gemm's own config, with the copy-bandwidth fraction");
    loom::bench::DecodeGrid grid;
    app.add_option("--decode-m", grid.m, "decode grid: M values")->delimiter(',');
    app.add_option("--decode-n", grid.n, "decode grid: N values")->delimiter(',');
    app.add_option("--decode-k", grid.k, "decode grid: K values")->delimiter(',');
    app.add_option("--decode-sweep", grid.sweep,
                   "decode grid: also time this many of the decode plan's cheapest candidates per shape (its model "
                   "against measurement), plus the chosen and the cheapest whole-tile config");
    app.add_option(
        "--copy-gbps", grid.copy_gbps,
        "decode grid: the copy bandwidth to compare with, GB/s (0: a device-to-device copy measured in the run)");
    loom::bench::parse_or_exit(app, argc, argv);
    if (decode) {
        grid.iters = iters;
        grid.out = out;
        if (app.count("--dtype") > 0) grid.dtypes = {dtype == "f8e4m3" ? loom::DType::F8E4M3 : loom::DType::BF16};
        for (const auto* v : {&grid.m, &grid.n, &grid.k})
            for (int x : *v) LOOM_CHECK(x > 0, "--decode-m/-n/-k: expected positive values, given {}", x);
        for (int x : grid.n) LOOM_CHECK(x % 8 == 0, "--decode-n: expected multiples of 8, given {}", x);
        for (int x : grid.k) LOOM_CHECK(x % 16 == 0, "--decode-k: expected multiples of 16, given {}", x);
        return loom::bench::run_decode_grid(grid, argc, argv);
    }
    const bool f8 = dtype == "f8e4m3";
    const loom::DType in = f8 ? loom::DType::F8E4M3 : loom::DType::BF16;
    const size_t isz = f8 ? 1 : 2;
    std::vector<Shape> shapes = {{"square", 8192, 8192, 8192}, {"square", 4096, 4096, 4096}};
    for (auto [n, k] :
         std::vector<std::pair<int, int>>{{11008, 4096}, {14336, 4096}, {28672, 8192}, {53248, 16384}, {29568, 8192}})
        shapes.push_back({"ag_gemm", 8192, n / 8, k});
    for (auto [n, k] : std::vector<std::pair<int, int>>{
             {4096, 11008}, {4096, 14336}, {3584, 14336}, {4608, 36864}, {8192, 28672}, {8192, 29568}})
        shapes.push_back({"gemm_rs", 8192, n, k / 8});
    if (quick) shapes.resize(2);
    if (!custom.empty()) {
        shapes.clear();
        for (const std::string& c : custom) {
            Shape sh{"custom", 0, 0, 0};
            char tail = 0;
            LOOM_CHECK(std::sscanf(c.c_str(), "%dx%dx%d%c", &sh.m, &sh.n, &sh.k, &tail) == 3 && sh.m > 0 &&
                           sh.n % 8 == 0 && sh.k % 8 == 0 && sh.n > 0 && sh.k > 0,
                       "--shapes: expected MxNxK with N and K positive multiples of 8, given '{}'", c);
            shapes.push_back(sh);
        }
    }

    loom::bench::Report report(f8 ? "gemm_fp8" : "gemm", 1, argc, argv);
    cudaStream_t stream;
    LOOM_CHECK_CUDA(cudaStreamCreate(&stream));
    int dev = 0, sms = 0, major = 0, minor = 0;
    LOOM_CHECK_CUDA(cudaGetDevice(&dev));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    loom::bench::TimeOptions topts;
    topts.iters = iters;

    // Pass order: unclustered configs for every shape, then clustered ones (see the header comment).
    std::vector<int> passes = sweep ? std::vector<int>{1, 2} : std::vector<int>{0};
    if (sweep && (only_cluster == 1 || only_cluster == 2)) passes = {only_cluster};
    double log_heur = 0, log_best = 0, worst_heur = 1e9, log_tuned = 0, worst_tuned = 1e9;
    int n_heur = 0, n_tuned = 0;
    std::vector<double> best_ratio(shapes.size(), 0);
    std::vector<std::string> best_name(shapes.size());
    std::vector<loom::bench::Column> cols = {{"kind", 7, loom::bench::Align::Left},
                                             {"MxNxK", 17, loom::bench::Align::Left},
                                             {"variant / config", 56, loom::bench::Align::Left},
                                             {"loom us", 9},
                                             {"cublaslt us", 11},
                                             {"vs cublaslt", 11}};
    if (f8) cols.insert(cols.end(), {{"promoted us", 11}, {"vs promoted", 11}});  // cuBLASLt's default fp8 mode
    cols.insert(cols.end(), {{"loom TFLOP/s", 12}, {"check", 0, loom::bench::Align::Left}});
    const loom::bench::Table table(cols);
    std::printf("%s", table.header().c_str());
    for (int pass : passes) {
        for (size_t si = 0; si < shapes.size(); ++si) {
            const Shape& s = shapes[si];
            void *a, *b, *c, *c_ref;
            const size_t mn = size_t(s.m) * s.n;
            LOOM_CHECK_CUDA(cudaMalloc(&a, size_t(s.m) * s.k * isz));
            LOOM_CHECK_CUDA(cudaMalloc(&b, size_t(s.n) * s.k * isz));
            LOOM_CHECK_CUDA(cudaMalloc(&c, mn * 2));
            LOOM_CHECK_CUDA(cudaMalloc(&c_ref, mn * 2));
            if (f8) {
                loom::bench::fill_random_e4m3(a, size_t(s.m) * s.k, 1);
                loom::bench::fill_random_e4m3(b, size_t(s.n) * s.k, 2);
            } else {
                loom::bench::fill_random_bf16(a, size_t(s.m) * s.k, 1);
                loom::bench::fill_random_bf16(b, size_t(s.n) * s.k, 2);
            }
            loom::MatrixView A{a, in, s.m, s.k, 0}, B{b, in, s.n, s.k, 0};
            loom::MatrixView C{c, loom::DType::BF16, s.m, s.n, 0};
            const auto heur = heuristic(s, major * 10 + minor, sms, in, true, heuristic_cluster);
            // fp8: the like-for-like baseline sums in the tensor cores' precision (fast accumulation).
            loom::bench::LtGemm lt(s.m, s.n, s.k, f8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF, /*fast_accum=*/f8);
            std::optional<loom::bench::LtGemm> lt_promoted;
            if (f8) lt_promoted.emplace(s.m, s.n, s.k, CUDA_R_8F_E4M3, false);
            lt.run(a, b, c_ref, stream);
            LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
            std::vector<uint16_t> ref(mn);
            LOOM_CHECK_CUDA(cudaMemcpy(ref.data(), c_ref, mn * 2, cudaMemcpyDeviceToHost));
            const double flops = 2.0 * s.m * s.n * s.k;
            std::vector<Variant> vs = pass == 0 ? std::vector<Variant>{{"heuristic", heur}}
                                                : variants(s, heur, pass, sms, in, heuristic_cluster);
            if (pass == 0 && autotune) {
                const loom::detail::ScopedSettings tune([](loom::Settings& s) { s.autotune = true; });
                std::string source;
                const loom::GemmConfig tuned = loom::gemm_config_for(A, B, C, {}, stream, &source);
                vs.push_back({"autotuned", tuned});
            }
            const std::string shape_str = fmt::format("{}x{}x{}", s.m, s.n, s.k);
            for (const Variant& v : vs) {
                loom::GemmOptions opts;
                opts.config = &v.cfg;
                LOOM_CHECK_CUDA(cudaMemsetAsync(c, 0xff, mn * 2, stream));  // NaN: unwritten elements fail
                loom::gemm(A, B, C, opts, stream);                          // also compiles outside the timing
                LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
                const loom::bench::GemmCheck chk = loom::bench::compare_bf16(c, ref, mn);
                const std::string label = v.name + " " + v.cfg.str();
                if (!chk.ok()) {
                    std::vector<std::string> cells = {s.kind, shape_str, label};
                    cells.resize(table.columns() - 1, "-");
                    cells.push_back(fmt::format("FAIL diff={:.3g} nan={}", chk.diff, chk.nans));
                    std::printf("%s", table.row(cells).c_str());
                    report.add_row({{"kind", s.kind},
                                    {"m", s.m},
                                    {"n", s.n},
                                    {"k", s.k},
                                    {"variant", v.name},
                                    {"config", v.cfg.str()},
                                    {"check", "FAIL"},
                                    {"calc_diff", chk.diff},
                                    {"nans", chk.nans}});
                    continue;
                }
                // cuBLASLt and this config interleaved, run by run (harness.hpp: time_ops).
                std::vector<std::function<void(cudaStream_t)>> ops = {
                    [&](cudaStream_t st) { lt.run(a, b, c_ref, st); },
                    [&](cudaStream_t st) { loom::gemm(A, B, C, opts, st); }};
                if (lt_promoted) ops.push_back([&](cudaStream_t st) { lt_promoted->run(a, b, c_ref, st); });
                const auto ts = loom::bench::time_ops(ops, stream, topts);
                const loom::bench::Timing &t_lt = ts[0], &t = ts[1];
                nlohmann::json baselines = {{"cublaslt", t_lt.median_us}};
                nlohmann::json speedup = {{"cublaslt", t_lt.median_us / t.median_us}};
                if (lt_promoted) {
                    baselines["cublaslt_promoted"] = ts[2].median_us;
                    speedup["cublaslt_promoted"] = ts[2].median_us / t.median_us;
                }
                const double ratio = t_lt.median_us / t.median_us;
                std::vector<std::string> cells = {s.kind,
                                                  shape_str,
                                                  label,
                                                  loom::bench::cell_us(t.median_us),
                                                  loom::bench::cell_us(t_lt.median_us),
                                                  loom::bench::cell_ratio(ratio)};
                if (lt_promoted)
                    cells.insert(cells.end(), {loom::bench::cell_us(ts[2].median_us),
                                               loom::bench::cell_ratio(ts[2].median_us / t.median_us)});
                cells.insert(cells.end(), {fmt::format("{:.1f}", flops / t.median_us / 1e6),
                                           fmt::format("ok diff={:.2g}", chk.diff)});
                std::printf("%s", table.row(cells).c_str());
                std::fflush(stdout);
                if (v.name == "heuristic") {
                    log_heur += std::log(ratio);
                    worst_heur = std::min(worst_heur, ratio);
                    ++n_heur;
                }
                if (v.name == "autotuned") {
                    log_tuned += std::log(ratio);
                    worst_tuned = std::min(worst_tuned, ratio);
                    ++n_tuned;
                }
                if (ratio > best_ratio[si]) {
                    best_ratio[si] = ratio;
                    best_name[si] = v.cfg.str();
                }
                report.add_row({{"kind", s.kind},
                                {"dtype", dtype},
                                {"m", s.m},
                                {"n", s.n},
                                {"k", s.k},
                                {"variant", v.name},
                                {"config", v.cfg.str()},
                                {"block_n", v.cfg.block_n},
                                {"stages", v.cfg.stages},
                                {"cluster_m", v.cfg.cluster_m},
                                {"group_m", v.cfg.group_m},
                                {"tail_splits", v.cfg.tail_splits},
                                {"check", "ok"},
                                {"calc_diff", chk.diff},
                                {"loom_us", t.median_us},
                                {"loom_tflops", flops / t.median_us / 1e6},
                                {"cublaslt_tflops", flops / t_lt.median_us / 1e6},
                                {"cublaslt_algo", lt.describe()},
                                {"baselines", baselines},
                                {"speedup", speedup}});
            }
            cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(c_ref);
            if (!out.empty()) std::ofstream(out + ".partial") << report.to_json().dump(1) << "\n";
        }
    }
    if (n_heur > 0)
        std::printf("heuristic: geomean ratio to cuBLASLt %.3f, worst %.3f (%d shapes)\n", std::exp(log_heur / n_heur),
                    worst_heur, n_heur);
    if (n_tuned > 0)
        std::printf("autotuned: geomean ratio to cuBLASLt %.3f, worst %.3f (%d shapes)\n",
                    std::exp(log_tuned / n_tuned), worst_tuned, n_tuned);
    if (sweep) {
        int nb = 0;
        for (size_t si = 0; si < shapes.size(); ++si) {
            if (best_ratio[si] <= 0) continue;
            log_best += std::log(best_ratio[si]);
            ++nb;
            std::printf("best %dx%dx%d: %.3f  %s\n", shapes[si].m, shapes[si].n, shapes[si].k, best_ratio[si],
                        best_name[si].c_str());
        }
        if (nb > 0) std::printf("best per shape: geomean ratio %.3f\n", std::exp(log_best / nb));
    }
    if (!out.empty()) {
        report.write(out, /*echo_rows=*/false);
        std::remove((out + ".partial").c_str());  // complete: the partial copy is only for a run that dies
    }
    return 0;
}
