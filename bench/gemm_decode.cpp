#include "gemm_decode.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>

#include "cublaslt.hpp"
#include "harness.hpp"
#include "loom/bf16.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "table.hpp"

namespace loom::bench {

GemmCheck compare_bf16(const void* c, const std::vector<uint16_t>& ref, std::size_t n) {
    std::vector<uint16_t> got(n);
    LOOM_CHECK_CUDA(cudaMemcpy(got.data(), c, n * 2, cudaMemcpyDeviceToHost));
    GemmCheck r;
    double xy = 0, xx = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const double x = bf16_to_float(got[i]), y = bf16_to_float(ref[i]);
        if (std::isnan(x)) {
            ++r.nans;
            continue;
        }
        xy += x * y;
        xx += x * x + y * y;
    }
    r.diff = xx > 0 ? 1 - 2 * xy / xx : (r.nans ? 1 : 0);
    return r;
}

namespace {

// The device-to-device copy rate: bytes read plus bytes written per second, of a 1 GiB cudaMemcpy (median of 20).
double measure_copy_gbps(cudaStream_t stream) {
    const std::size_t bytes = std::size_t{1} << 30;
    void *src = nullptr, *dst = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(&src, bytes));
    LOOM_CHECK_CUDA(cudaMalloc(&dst, bytes));
    LOOM_CHECK_CUDA(cudaMemsetAsync(src, 1, bytes, stream));
    TimeOptions t;
    t.iters = 20;
    t.flush_l2 = false;
    const Timing copy =
        time_op([&](cudaStream_t s) { LOOM_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s)); },
                stream, t);
    cudaFree(src);
    cudaFree(dst);
    return gbps(2.0 * static_cast<double>(bytes), copy.median_us);
}

struct Summary {
    double log_ratio = 0, worst = 1e9, frac_sum = 0, frac_min = 1e9;
    int shapes = 0, below_095 = 0, frac_shapes = 0, failed = 0;
};

// The decode plan's candidates for this shape (ops/gemm/decode_plan.cpp) timed against each other: the chosen config,
// the `count` cheapest by the model, the cheapest whole-tile one, the cheapest K-cluster plan of each size, every
// M-cluster plan and the gemv plan's (ops/gemm/gemv.cpp) K-splits halved, as planned and doubled; a line each and
// their JSON (model_us -1: no model).
nlohmann::json time_candidates(const MatrixView& A, const MatrixView& B, const MatrixView& C, const GemmConfig& chosen,
                               int count, const TimeOptions& topts, cudaStream_t stream) {
    int dev = 0, sms = 0;
    LOOM_CHECK_CUDA(cudaGetDevice(&dev));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    // The Hopper kernel's decode candidates (its heuristic plan first); the gemv kernel, when chosen, is timed first
    // and has no model cost (-1).
    std::vector<GemmDecodeCandidate> all = gemm_decode_candidates(
        A.rows, B.rows, A.cols, false, sms,
        chosen.gemv ? gemm_heuristic(A.rows, B.rows, A.cols, false, 90, sms, true, GemmTiles::Plain, A.dtype) : chosen);
    if (chosen.gemv) all.insert(all.begin(), GemmDecodeCandidate{chosen, -1.0});
    std::stable_sort(all.begin() + 1, all.end(),
                     [](const GemmDecodeCandidate& x, const GemmDecodeCandidate& y) { return x.cost_us < y.cost_us; });
    std::vector<GemmDecodeCandidate> picked;
    auto pick = [&](const GemmDecodeCandidate& c) {
        for (const auto& p : picked)
            if (p.config.str() == c.config.str()) return;
        picked.push_back(c);
    };
    pick(all.front());
    for (std::size_t i = 1; i < all.size() && static_cast<int>(picked.size()) <= count; ++i) pick(all[i]);
    for (std::size_t i = 1; i < all.size(); ++i)
        if (!all[i].config.gemv && all[i].config.tail_splits <= 1) {
            pick(all[i]);
            break;
        }
    // The cheapest K-cluster plan of each cluster size (the decode plan weighs them without choosing them): their
    // timings against the model's costs are what its K-cluster constants are fitted to.
    for (int s : {2, 4, 8})
        for (std::size_t i = 1; i < all.size(); ++i)
            if (all[i].config.cluster_k == s) {
                pick(all[i]);
                break;
            }
    // Every M-cluster plan (64-row tiles in 2-CTA clusters sharing B; weighed, not chosen): at most six.
    for (std::size_t i = 1; i < all.size(); ++i)
        if (all[i].config.cluster_m > 1) pick(all[i]);
    // The gemv plan where the kernel takes the shape (whether or not it was chosen), and with half and twice its
    // K-splits: what the heuristic's rule for taking it (gemm_gemv_preferred) and the plan's splits rest on.
    if (detail::gemm_gemv_supported(A.rows, false, A.dtype, 90)) {
        const GemmConfig plan = detail::gemm_gemv_plan(A.rows, B.rows, A.cols, A.dtype, sms);
        const int64_t slices = kernels::gemv_slices(A.cols * static_cast<int64_t>(dtype_size(A.dtype)));
        for (int splits : {plan.tail_splits, plan.tail_splits / 2, plan.tail_splits * 2}) {
            if (splits < 1 || splits > slices) continue;
            GemmConfig c = plan;
            c.tail_splits = splits;
            pick({c, -1.0});
        }
    }
    std::vector<std::function<void(cudaStream_t)>> fns;
    std::vector<GemmOptions> opts(picked.size());
    for (std::size_t i = 0; i < picked.size(); ++i) {
        opts[i].config = &picked[i].config;
        fns.push_back([&, i](cudaStream_t s) { gemm(A, B, C, opts[i], s); });
    }
    const auto ts = time_ops(fns, stream, topts);
    nlohmann::json out = nlohmann::json::array();
    for (std::size_t i = 0; i < picked.size(); ++i) {
        std::printf("    %-44s model %7.2f us  measured %7.2f us%s\n", picked[i].config.str().c_str(),
                    picked[i].cost_us, ts[i].median_us, i == 0 ? "  (chosen)" : "");
        out.push_back({{"config", picked[i].config.str()},
                       {"model_us", picked[i].cost_us},
                       {"loom_us", ts[i].median_us},
                       {"chosen", i == 0}});
    }
    return out;
}

}  // namespace

int run_decode_grid(const DecodeGrid& grid, int argc, char** argv) {
    cudaStream_t stream;
    LOOM_CHECK_CUDA(cudaStreamCreate(&stream));
    const double copy_gbps = grid.copy_gbps > 0 ? grid.copy_gbps : measure_copy_gbps(stream);
    std::printf("copy bandwidth: %.0f GB/s (%s); timed runs start with a clean L2 (TimeOptions::flush_l2_clean)\n",
                copy_gbps, grid.copy_gbps > 0 ? "given" : "device-to-device cudaMemcpy, read + write");

    Report report("gemm_decode", 1, argc, argv);
    TimeOptions topts;
    topts.iters = grid.iters;
    topts.flush_l2_clean = true;
    const Table table({{"dtype", 6, Align::Left},
                       {"MxNxK", 17, Align::Left},
                       {"config", 44, Align::Left},
                       {"loom us", 9},
                       {"cublaslt us", 11},
                       {"vs cublaslt", 11},
                       {"GB/s", 7},
                       {"of copy", 7},
                       {"check", 0, Align::Left}});
    std::printf("%s", table.header().c_str());
    std::map<DType, Summary> summaries;
    const int max_m = *std::max_element(grid.m.begin(), grid.m.end());
    const int max_n = *std::max_element(grid.n.begin(), grid.n.end());
    const int max_k = *std::max_element(grid.k.begin(), grid.k.end());
    for (DType in : grid.dtypes) {
        const bool f8 = in == DType::F8E4M3;
        const std::size_t isz = dtype_size(in);
        Summary& sum = summaries[in];
        // One random A and B of the largest shape; each shape reads a prefix of them with its own row stride, so they
        // are filled once (B is up to 1 GiB).
        void *a = nullptr, *b = nullptr, *c = nullptr, *c_ref = nullptr, *c_again = nullptr;
        LOOM_CHECK_CUDA(cudaMalloc(&a, std::size_t(max_m) * max_k * isz));
        LOOM_CHECK_CUDA(cudaMalloc(&b, std::size_t(max_n) * max_k * isz));
        LOOM_CHECK_CUDA(cudaMalloc(&c, std::size_t(max_m) * max_n * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&c_ref, std::size_t(max_m) * max_n * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&c_again, std::size_t(max_m) * max_n * 2));
        if (f8) {
            fill_random_e4m3(a, std::size_t(max_m) * max_k, 1);
            fill_random_e4m3(b, std::size_t(max_n) * max_k, 2);
        } else {
            fill_random_bf16(a, std::size_t(max_m) * max_k, 1);
            fill_random_bf16(b, std::size_t(max_n) * max_k, 2);
        }
        for (int n : grid.n)
            for (int k : grid.k) {
                for (int m : grid.m) {
                    const std::size_t mn = std::size_t(m) * n;
                    const MatrixView A{a, in, m, k, 0}, B{b, in, n, k, 0};
                    const MatrixView C{c, DType::BF16, m, n, 0}, C2{c_again, DType::BF16, m, n, 0};
                    const std::string shape = fmt::format("{}x{}x{}", m, n, k);
                    // The config loom::gemm takes for this call (autotuner off: the heuristic, or a persisted winner).
                    std::string source;
                    const GemmConfig cfg = gemm_config_for(A, B, C, {}, stream, &source);
                    LtGemm lt(m, n, k, f8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF, /*fast_accum=*/f8);
                    lt.run(a, b, c_ref, stream);
                    LOOM_CHECK_CUDA(cudaMemsetAsync(c, 0xff, mn * 2, stream));  // NaN: unwritten elements fail
                    LOOM_CHECK_CUDA(cudaMemsetAsync(c_again, 0xff, mn * 2, stream));
                    gemm(A, B, C, {}, stream);
                    gemm(A, B, C2, {}, stream);
                    LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
                    std::vector<uint16_t> ref(mn), first(mn), second(mn);
                    LOOM_CHECK_CUDA(cudaMemcpy(ref.data(), c_ref, mn * 2, cudaMemcpyDeviceToHost));
                    LOOM_CHECK_CUDA(cudaMemcpy(first.data(), c, mn * 2, cudaMemcpyDeviceToHost));
                    LOOM_CHECK_CUDA(cudaMemcpy(second.data(), c_again, mn * 2, cudaMemcpyDeviceToHost));
                    const GemmCheck chk = compare_bf16(c, ref, mn);
                    const bool same = std::memcmp(first.data(), second.data(), mn * 2) == 0;
                    nlohmann::json row = {{"shape", shape}, {"dtype", dtype_name(in)}, {"m", m},          {"n", n},
                                          {"k", k},         {"config", cfg.str()},     {"source", source}};
                    if (!chk.ok() || !same) {
                        ++sum.failed;
                        std::vector<std::string> cells = {dtype_name(in), shape, cfg.str()};
                        cells.resize(table.columns() - 1, "-");
                        cells.push_back(fmt::format("FAIL diff={:.3g} nan={} repeat {}", chk.diff, chk.nans,
                                                    same ? "equal" : "DIFFERS"));
                        std::printf("%s", table.row(cells).c_str());
                        row.update(
                            {{"check", "FAIL"}, {"calc_diff", chk.diff}, {"nans", chk.nans}, {"repeat_equal", same}});
                        report.add_row(row);
                        continue;
                    }
                    const auto ts = time_ops({[&](cudaStream_t s) { lt.run(a, b, c_ref, s); },
                                              [&](cudaStream_t s) { gemm(A, B, C, {}, s); }},
                                             stream, topts);
                    const double loom_us = ts[1].median_us, lt_us = ts[0].median_us;
                    const double ratio = lt_us / loom_us;
                    // What the GEMM must move: the weights, the activations and the bf16 output.
                    const double bytes = (double(n) * k + double(m) * k) * double(isz) + double(m) * n * 2.0;
                    const double rate = gbps(bytes, loom_us), frac = rate / copy_gbps;
                    sum.log_ratio += std::log(ratio);
                    sum.worst = std::min(sum.worst, ratio);
                    sum.below_095 += ratio < 0.95 ? 1 : 0;
                    ++sum.shapes;
                    if (m <= 16) {
                        sum.frac_sum += frac;
                        sum.frac_min = std::min(sum.frac_min, frac);
                        ++sum.frac_shapes;
                    }
                    std::printf("%s",
                                table
                                    .row({dtype_name(in), shape, cfg.str(), cell_us(loom_us), cell_us(lt_us),
                                          cell_ratio(ratio), fmt::format("{:.0f}", rate),
                                          fmt::format("{:.1f}%", 100 * frac), fmt::format("ok diff={:.2g}", chk.diff)})
                                    .c_str());
                    std::fflush(stdout);
                    row.update({{"check", "ok"},
                                {"calc_diff", chk.diff},
                                {"repeat_equal", true},
                                {"block_m", cfg.block_m},
                                {"block_n", cfg.block_n},
                                {"stages", cfg.stages},
                                {"grid", cfg.grid},
                                {"tail_splits", cfg.tail_splits},
                                {"loom_us", loom_us},
                                {"bytes", bytes},
                                {"loom_gbps", rate},
                                {"copy_gbps", copy_gbps},
                                {"copy_fraction", frac},
                                {"cublaslt_algo", lt.describe()},
                                {"baselines", {{"cublaslt", lt_us}}},
                                {"speedup", {{"cublaslt", ratio}}}});
                    if (grid.sweep > 0) row["candidates"] = time_candidates(A, B, C, cfg, grid.sweep, topts, stream);
                    report.add_row(row);
                }
                // What was measured so far, for a run that dies (a shape cuBLASLt has no algorithm for, a trap).
                if (!grid.out.empty()) std::ofstream(grid.out + ".partial") << report.to_json().dump(1) << "\n";
            }
        cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(c_ref), cudaFree(c_again);
    }
    int status = 0;
    for (const auto& [in, s] : summaries) {
        if (s.shapes > 0)
            std::printf("%s: geomean ratio to cuBLASLt %.3f, worst %.3f, %d of %d shapes below 0.95", dtype_name(in),
                        std::exp(s.log_ratio / s.shapes), s.worst, s.below_095, s.shapes);
        if (s.frac_shapes > 0)
            std::printf("; M <= 16: %.1f%% of the copy bandwidth on average, %.1f%% at least",
                        100 * s.frac_sum / s.frac_shapes, 100 * s.frac_min);
        std::printf("\n");
        if (s.failed > 0) {
            std::printf("%s: %d shapes FAILED their check\n", dtype_name(in), s.failed);
            status = 1;
        }
    }
    if (!grid.out.empty()) {
        report.write(grid.out, /*echo_rows=*/false);
        std::remove((grid.out + ".partial").c_str());
    }
    LOOM_CHECK_CUDA(cudaStreamDestroy(stream));
    return status;
}

}  // namespace loom::bench
