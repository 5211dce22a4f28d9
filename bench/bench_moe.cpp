// bench-moe: the MoE ops on one GPU. Mode `grouped`: loom::grouped_gemm (device group offsets) against cuBLAS's grouped
// GEMM (cublasGemmGroupedBatchedEx, host-side sizes, one call) on the expert shapes — (N, K, E, top-k) of
// Mixtral-8x7B, Mixtral-8x22B, Qwen1.5-MoE, DeepSeek-MoE, Qwen3-30B-A3B at 8192 and 128 tokens (rows = tokens x
// top-k), uniform and skewed routing, bf16 in and out, B as [N, K] — timed interleaved by the harness (L2 flush,
// events, median). Rows: docs/perf schema (shape fields, loom_us, baselines, speedup); bench/moe_torch_grouped.py times
// torch._grouped_mm on the same shapes for the same file (docs/perf/grouped_gemm.json). Each row also times Loom with
// the register-store epilogue (the heuristic's config with tma_store = false and the stages that then fit), as
// loom_register_store_us: the staged epilogue's gain, shape by shape, in the same run. --sweep also prints, at 8192
// uniform tokens, tile widths 256 / 192 / 128 x raster groups 2 ... 32 and the dense loom::gemm of the same M x N x K.
//
//     build/bench/bench-moe grouped --out grouped_gemm.json
//
// Mode `grouped-fp8`: the same shapes in fp8 e4m3, with per-tensor scales and with per-128-block scales (DeepSeek-V3),
// against Loom's bf16 grouped GEMM of the same shape; bench/moe_torch_grouped.py --fp8 adds torch._scaled_grouped_mm
// (row-wise scales) to the per-tensor rows (no library grouped GEMM takes 128-block scales).
//
//     build/bench/bench-moe grouped-fp8 --out docs/perf/grouped_gemm_fp8.json
// --portable runs every Loom call (fp8 and the bf16 reference) on the portable kernel (force_sm80), as on sm_80:
//     build/bench/bench-moe grouped-fp8 --portable --out docs/perf/grouped_gemm_fp8_portable.json
//     python bench/moe_torch_grouped.py --fp8 --merge-into docs/perf/grouped_gemm_fp8.json
//
// Mode `tp` (under loomrun -n W): the TP-MoE ops on the same (N, K, E, top-k) at 128 and 8192 tokens in total (T_loc =
// tokens / W per rank), uniform and skewed routing, bf16: each rank holds an N / W slice of every expert (ag_moe: w_up
// [E x N / W, K]; moe_rs: rows [*, N / W], w_down [E x K, N / W], out [T_loc, K]). Timed interleaved: ag_moe Fused and
// Sequential, moe_rs Fused and Sequential, and the parts alone — all_gather of x and the ids, the grouped GEMMs,
// reduce_scatter of the [T, K] reduced rows — for the overlap efficiency fused / max(GEMM alone, communication alone);
// also both ops with an expert-major routing (ranks 1: E groups, each expert's weights read once, where the W x E
// source-major groups read them once per source rank): Sequential, its grouped GEMMs alone, and Fused (a row of its
// own, shape "... expert-major");
// at 128 tokens also moe_ar Fused and Sequential on a decode batch every rank holds whole (the parts: the grouped GEMM,
// all_reduce of [T, K]). Rows go to DIR/moe.json (rank 0). --quick: Mixtral-8x7B and Qwen3-30B-A3B only; --op
// ag_moe | moe_rs | moe_ar: that op only (and its parts); --tokens T: that batch only (any T); --comm-sms N: moe_rs
// Fused's reduce blocks beside the GEMM (TpMoeOptions::comm_sms).
//
//     loomrun -n 4 build/bench/bench-moe tp --out DIR [--quick] [--op moe_rs] [--tokens 8192] [--comm-sms N]
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "cublaslt.hpp"
#include "harness.hpp"
#include "loom/bf16.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/ops/moe.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/world.hpp"
#include "ops/moe/grouped_gemm_internal.hpp"

namespace {

struct Model {
    const char* name;
    int n, k, e, topk;
};

// Rows per expert: uniform (rows / E, the remainder spread over the first experts) or skewed (a power law over the
// experts in a fixed permuted order: the busiest expert gets several times the average, some get few or none).
std::vector<int> routing(int rows, int e, bool skewed) {
    std::vector<int> s(e, rows / e);
    for (int i = 0; i < rows % e; ++i) ++s[i];
    if (!skewed) return s;
    // Weight (i + 1)^-1.2 to expert (7919 i) mod E (7919 is prime: a fixed permutation; moe_torch_grouped.py too).
    std::vector<double> w(e);
    for (int i = 0; i < e; ++i) w[(7919 * i) % e] = std::pow(1.0 / (i + 1), 1.2);
    double total = 0;
    for (double x : w) total += x;
    int given = 0;
    for (int i = 0; i < e; ++i) given += s[i] = static_cast<int>(std::floor(rows * w[i] / total));
    for (int i = 0; given < rows; i = (i + 1) % e, ++given) ++s[i];
    return s;
}

#define CUBLAS_OK(x)                                                                           \
    do {                                                                                       \
        const cublasStatus_t st_ = (x);                                                        \
        LOOM_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "{} failed: cuBLAS status {}", #x, int(st_)); \
    } while (0)

// n elements of elem_bytes at p: fill's random values for the first min(n, 2^24) elements, then that pool repeated by
// device copies (host generation of GiB-sized operands takes minutes; the timing needs varied values, not unique ones).
void fill_pooled(void* p, size_t n, size_t elem_bytes, void (*fill)(void*, size_t, uint64_t), uint64_t seed) {
    const size_t pool = std::min(n, size_t(1) << 24);
    fill(p, pool, seed);
    for (size_t done = pool; done < n;) {
        const size_t count = std::min(done, n - done);
        LOOM_CHECK_CUDA(
            cudaMemcpy(static_cast<char*>(p) + done * elem_bytes, p, count * elem_bytes, cudaMemcpyDeviceToDevice));
        done += count;
    }
}

// A grouped-mode row's shape fields: the model's (N, K, E, top-k), the batch, the routing and the input type.
nlohmann::json grouped_row(const Model& m, int tokens, int rows, const char* routing_name, const std::string& shape,
                           const char* dtype) {
    return {{"shape", shape},          {"model", m.name}, {"n", m.n},         {"k", m.k},
            {"experts", m.e},          {"topk", m.topk},  {"tokens", tokens}, {"rows", rows},
            {"routing", routing_name}, {"dtype", dtype}};
}

// DeepGEMM's calc_diff of two bf16 [rows, n] matrices over up to 256 rows spread evenly (NaN counts as a mismatch).
double sampled_diff(const void* got, const void* ref, int rows, int n) {
    const int step = std::max(1, rows / 256), count = (rows + step - 1) / step;
    const size_t pitch = size_t(step) * n * 2;
    std::vector<uint16_t> x(size_t(count) * n), y(size_t(count) * n);
    LOOM_CHECK_CUDA(cudaMemcpy2D(x.data(), size_t(n) * 2, got, pitch, size_t(n) * 2, count, cudaMemcpyDeviceToHost));
    LOOM_CHECK_CUDA(cudaMemcpy2D(y.data(), size_t(n) * 2, ref, pitch, size_t(n) * 2, count, cudaMemcpyDeviceToHost));
    double xy = 0, xx = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        const double a = loom::bf16_to_float(x[i]), b = loom::bf16_to_float(y[i]);
        if (std::isnan(a)) return 1;
        xy += a * b;
        xx += a * a + b * b;
    }
    return xx > 0 ? 1 - 2 * xy / xx : 0;
}

// fp8 e4m3, two scalings per shape: per-tensor (scale_a, scale_b[e]; the rows bench/moe_torch_grouped.py --fp8 times
// torch._scaled_grouped_mm on, whose row-wise scales cost the same epilogue multiply) and DeepSeek-V3's per-128-block
// scales (A [rows, K / 128], B [E, N / 128, K / 128]; no library grouped GEMM on the machine takes those), each
// against Loom's own bf16 grouped GEMM of the same shape, timed interleaved. Inputs: random e4m3 values in [-1, 1),
// scales 1 (the GPU tests check the results with other scales).
int grouped_fp8(const std::string& out, int iters, bool portable, int argc, char** argv) {
    const std::vector<Model> models = {{"Mixtral-8x7B", 14336, 4096, 8, 2},
                                       {"Mixtral-8x22B", 16384, 6144, 8, 2},
                                       {"Qwen1.5-MoE", 1408, 2048, 60, 4},
                                       {"DeepSeek-MoE", 1408, 2048, 64, 6},
                                       {"Qwen3-30B-A3B", 768, 2048, 128, 8}};
    loom::bench::Report report(portable ? "grouped_gemm_fp8_portable" : "grouped_gemm_fp8", 1, argc, argv);
    cudaStream_t stream;
    LOOM_CHECK_CUDA(cudaStreamCreate(&stream));
    loom::bench::TimeOptions topts;
    topts.iters = iters;
    std::printf("%-14s %6s %-8s %9s %9s %9s %9s %9s\n", "model", "tokens", "routing", "fp8_us", "block_us", "bf16_us",
                "TFLOP/s", "blk TF/s");
    for (const Model& m : models) {
        for (int tokens : {8192, 128}) {
            for (bool skewed : {false, true}) {
                const int rows = tokens * m.topk, kb = (m.k + 127) / 128, nb = (m.n + 127) / 128;
                const std::vector<int> sizes = routing(rows, m.e, skewed);
                std::vector<int32_t> offsets(m.e + 1, 0);
                for (int i = 0; i < m.e; ++i) offsets[i + 1] = offsets[i] + sizes[i];
                void *a8, *b8, *a, *b, *c, *off, *sa, *sb, *st;
                const size_t a_elems = size_t(rows) * m.k, b_elems = size_t(m.e) * m.n * m.k;
                LOOM_CHECK_CUDA(cudaMalloc(&a8, a_elems));
                LOOM_CHECK_CUDA(cudaMalloc(&b8, b_elems));
                LOOM_CHECK_CUDA(cudaMalloc(&a, a_elems * 2));
                LOOM_CHECK_CUDA(cudaMalloc(&b, b_elems * 2));
                LOOM_CHECK_CUDA(cudaMalloc(&c, size_t(rows) * m.n * 2));
                LOOM_CHECK_CUDA(cudaMalloc(&off, offsets.size() * 4));
                LOOM_CHECK_CUDA(cudaMalloc(&sa, size_t(rows) * kb * 4));
                LOOM_CHECK_CUDA(cudaMalloc(&sb, size_t(m.e) * nb * kb * 4));
                LOOM_CHECK_CUDA(cudaMalloc(&st, size_t(m.e + 1) * 4));
                fill_pooled(a8, a_elems, 1, loom::bench::fill_random_e4m3, 1);
                fill_pooled(b8, b_elems, 1, loom::bench::fill_random_e4m3, 2);
                fill_pooled(a, a_elems, 2, loom::bench::fill_random_bf16, 1);
                fill_pooled(b, b_elems, 2, loom::bench::fill_random_bf16, 2);
                const std::vector<float> ones(std::max(size_t(rows) * kb, size_t(m.e) * nb * kb), 1.f);
                LOOM_CHECK_CUDA(cudaMemcpy(sa, ones.data(), size_t(rows) * kb * 4, cudaMemcpyHostToDevice));
                LOOM_CHECK_CUDA(cudaMemcpy(sb, ones.data(), size_t(m.e) * nb * kb * 4, cudaMemcpyHostToDevice));
                LOOM_CHECK_CUDA(cudaMemcpy(st, ones.data(), size_t(m.e + 1) * 4, cudaMemcpyHostToDevice));
                LOOM_CHECK_CUDA(cudaMemcpy(off, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice));
                loom::GroupedGemmOptions ot, ob, o16;
                ot.force_sm80 = ob.force_sm80 = o16.force_sm80 = portable;
                ot.scale_a = static_cast<const float*>(st);
                ot.scale_b = static_cast<const float*>(st) + 1;
                ob.scale_a_blocks = static_cast<const float*>(sa);
                ob.scale_b_blocks = static_cast<const float*>(sb);
                const loom::MatrixView C{c, loom::DType::BF16, rows, m.n, 0};
                const loom::MatrixView A8{a8, loom::DType::F8E4M3, rows, m.k, 0};
                const loom::MatrixView B8{b8, loom::DType::F8E4M3, int64_t(m.e) * m.n, m.k, 0};
                const auto* o = static_cast<const int32_t*>(off);
                const auto run_fp8 = [&](cudaStream_t s) { loom::grouped_gemm(A8, B8, m.e, C, o, m.e, s, ot); };
                const auto run_block = [&](cudaStream_t s) { loom::grouped_gemm(A8, B8, m.e, C, o, m.e, s, ob); };
                const auto run_bf16 = [&](cudaStream_t s) {
                    loom::grouped_gemm({a, loom::DType::BF16, rows, m.k, 0},
                                       {b, loom::DType::BF16, int64_t(m.e) * m.n, m.k, 0}, m.e, C, o, m.e, s, o16);
                };
                run_fp8(stream);
                run_block(stream);
                run_bf16(stream);
                LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
                const auto ts = loom::bench::time_ops({run_fp8, run_block, run_bf16}, stream, topts);
                const double flops = 2.0 * rows * m.n * m.k;
                const double fp8_us = ts[0].median_us, block_us = ts[1].median_us, bf16_us = ts[2].median_us;
                const char* rname = skewed ? "skewed" : "uniform";
                std::printf("%-14s %6d %-8s %9.1f %9.1f %9.1f %9.1f %9.1f\n", m.name, tokens, rname, fp8_us, block_us,
                            bf16_us, flops / fp8_us / 1e6, flops / block_us / 1e6);
                for (const bool block : {false, true}) {
                    const double us = block ? block_us : fp8_us;
                    nlohmann::json row = grouped_row(
                        m, tokens, rows, rname,
                        fmt::format("{} E={} N={} K={} tokens={} top{} {} fp8e4m3{}{}", m.name, m.e, m.n, m.k, tokens,
                                    m.topk, rname, block ? " block128" : "", portable ? " portable" : ""),
                        block ? "f8e4m3 block128" : "f8e4m3 per-tensor");
                    row["loom_us"] = us;
                    row["loom_tflops"] = flops / us / 1e6;
                    row["baselines"] = {{"loom_bf16", bf16_us}};
                    report.add_row(std::move(row));
                }
                for (void* p : {a8, b8, a, b, c, off, sa, sb, st}) cudaFree(p);
            }
        }
    }
    report.write(out);  // empty: printed
    return 0;
}

int grouped(const std::string& out, int iters, bool sweep, int argc, char** argv) {
    const std::vector<Model> models = {{"Mixtral-8x7B", 14336, 4096, 8, 2},
                                       {"Mixtral-8x22B", 16384, 6144, 8, 2},
                                       {"Qwen1.5-MoE", 1408, 2048, 60, 4},
                                       {"DeepSeek-MoE", 1408, 2048, 64, 6},
                                       {"Qwen3-30B-A3B", 768, 2048, 128, 8}};
    loom::bench::Report report("grouped_gemm", 1, argc, argv);
    cudaStream_t stream;
    LOOM_CHECK_CUDA(cudaStreamCreate(&stream));
    cublasHandle_t handle;
    CUBLAS_OK(cublasCreate(&handle));
    CUBLAS_OK(cublasSetStream(handle, stream));
    loom::bench::TimeOptions topts;
    topts.iters = iters;
    int device = 0, major = 0, minor = 0, num_sms = 0;
    LOOM_CHECK_CUDA(cudaGetDevice(&device));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
    std::printf("%-14s %6s %-8s %9s %9s %9s %9s %8s\n", "model", "tokens", "routing", "loom_us", "reg_us", "cublas_us",
                "TFLOP/s", "speedup");
    for (const Model& m : models) {
        for (int tokens : {8192, 128}) {
            for (bool skewed : {false, true}) {
                const int rows = tokens * m.topk;
                const std::vector<int> sizes = routing(rows, m.e, skewed);
                std::vector<int32_t> offsets(m.e + 1, 0);
                for (int i = 0; i < m.e; ++i) offsets[i + 1] = offsets[i] + sizes[i];
                void *a, *b, *c, *c_ref, *off;
                const size_t a_bytes = size_t(rows) * m.k * 2, b_bytes = size_t(m.e) * m.n * m.k * 2,
                             c_bytes = size_t(rows) * m.n * 2;
                LOOM_CHECK_CUDA(cudaMalloc(&a, a_bytes));
                LOOM_CHECK_CUDA(cudaMalloc(&b, b_bytes));
                LOOM_CHECK_CUDA(cudaMalloc(&c, c_bytes));
                LOOM_CHECK_CUDA(cudaMalloc(&c_ref, c_bytes));
                LOOM_CHECK_CUDA(cudaMalloc(&off, offsets.size() * 4));
                loom::bench::fill_random_bf16(a, size_t(rows) * m.k, 1);
                loom::bench::fill_random_bf16(b, size_t(m.e) * m.n * m.k, 2);
                LOOM_CHECK_CUDA(cudaMemcpy(off, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice));

                // cuBLAS (column-major): C_e^T [N, M_e] = B_e^T' x A_e^T, i.e. m = N, n = M_e, k = K, B_e transposed.
                std::vector<int> gm, gn, gk, glda, gldb, gldc, gsize;
                std::vector<cublasOperation_t> ta, tb;
                std::vector<float> alpha, beta;
                std::vector<const void*> pa, pb;
                std::vector<void*> pc;
                for (int i = 0; i < m.e; ++i) {
                    if (sizes[i] == 0) continue;
                    gm.push_back(m.n), gn.push_back(sizes[i]), gk.push_back(m.k);
                    ta.push_back(CUBLAS_OP_T), tb.push_back(CUBLAS_OP_N);
                    glda.push_back(m.k), gldb.push_back(m.k), gldc.push_back(m.n), gsize.push_back(1);
                    alpha.push_back(1.f), beta.push_back(0.f);
                    pa.push_back(static_cast<char*>(b) + size_t(i) * m.n * m.k * 2);
                    pb.push_back(static_cast<char*>(a) + size_t(offsets[i]) * m.k * 2);
                    pc.push_back(static_cast<char*>(c_ref) + size_t(offsets[i]) * m.n * 2);
                }
                const int groups = static_cast<int>(gm.size());
                void **dpa, **dpb, **dpc;
                LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dpa), groups * sizeof(void*)));
                LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dpb), groups * sizeof(void*)));
                LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dpc), groups * sizeof(void*)));
                LOOM_CHECK_CUDA(cudaMemcpy(dpa, pa.data(), groups * sizeof(void*), cudaMemcpyHostToDevice));
                LOOM_CHECK_CUDA(cudaMemcpy(dpb, pb.data(), groups * sizeof(void*), cudaMemcpyHostToDevice));
                LOOM_CHECK_CUDA(cudaMemcpy(dpc, pc.data(), groups * sizeof(void*), cudaMemcpyHostToDevice));
                const auto run_cublas = [&](cudaStream_t) {
                    CUBLAS_OK(cublasGemmGroupedBatchedEx(handle, ta.data(), tb.data(), gm.data(), gn.data(), gk.data(),
                                                         alpha.data(), dpa, CUDA_R_16BF, glda.data(), dpb, CUDA_R_16BF,
                                                         gldb.data(), beta.data(), dpc, CUDA_R_16BF, gldc.data(),
                                                         groups, gsize.data(), CUBLAS_COMPUTE_32F));
                };
                const loom::MatrixView A{a, loom::DType::BF16, rows, m.k, 0};
                const loom::MatrixView B{b, loom::DType::BF16, int64_t(m.e) * m.n, m.k, 0};
                const loom::MatrixView C{c, loom::DType::BF16, rows, m.n, 0};
                const auto run_loom = [&](cudaStream_t s) {
                    loom::grouped_gemm(A, B, m.e, C, static_cast<const int32_t*>(off), m.e, s);
                };
                // The register-store epilogue: the heuristic's config without the staging buffers, with the stages
                // that then fit (Hopper only; elsewhere the same call as run_loom).
                loom::GemmConfig reg =
                    loom::moe::grouped_gemm_heuristic(rows, m.n, m.k, m.e, false, loom::MoeActivation::None,
                                                      loom::DType::BF16, 10 * major + minor, num_sms);
                if (!reg.sm80) {
                    reg.tma_store = false;
                    reg.stages = loom::moe::grouped_gemm_fitting_stages(reg.block_m, reg.block_n, m.e, false);
                }
                loom::GroupedGemmOptions reg_opts;
                reg_opts.config = &reg;
                const auto run_loom_reg = [&](cudaStream_t s) {
                    loom::grouped_gemm(A, B, m.e, C, static_cast<const int32_t*>(off), m.e, s, reg_opts);
                };
                run_loom_reg(stream);
                run_cublas(stream);
                LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
                const double reg_diff = sampled_diff(c, c_ref, rows, m.n);
                run_loom(stream);
                LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
                const double diff = sampled_diff(c, c_ref, rows, m.n);
                const auto ts = loom::bench::time_ops({run_loom, run_cublas, run_loom_reg}, stream, topts);
                const double flops = 2.0 * rows * m.n * m.k;
                const double loom_us = ts[0].median_us, cublas_us = ts[1].median_us, reg_us = ts[2].median_us;
                const char* rname = skewed ? "skewed" : "uniform";
                std::printf("%-14s %6d %-8s %9.1f %9.1f %9.1f %9.1f %8.3f  diff %.2g (reg %.2g)\n", m.name, tokens,
                            rname, loom_us, reg_us, cublas_us, flops / loom_us / 1e6, cublas_us / loom_us, diff,
                            reg_diff);
                if (sweep && tokens == 8192 && !skewed) {
                    // Tile widths x raster groups against the heuristic, and the dense GEMM of the same M x N x K
                    // (every row against expert 0's weights) as the rate the Hopper kernel reaches without groups.
                    std::vector<loom::GemmConfig> cfgs;
                    for (int bn : {256, 192, 128})
                        for (int gm : {2, 4, 8, 16, 32}) {
                            loom::GemmConfig c2 =
                                loom::moe::grouped_gemm_heuristic(rows, m.n, m.k, m.e, false, loom::MoeActivation::None,
                                                                  loom::DType::BF16, 10 * major + minor, num_sms);
                            if (c2.sm80) continue;
                            c2.block_n = bn;
                            c2.group_m = gm;
                            c2.stages = loom::moe::grouped_gemm_fitting_stages(c2.block_m, bn, m.e, c2.tma_store);
                            cfgs.push_back(c2);
                        }
                    std::vector<loom::GroupedGemmOptions> sopts(cfgs.size());
                    std::vector<std::function<void(cudaStream_t)>> fns{run_loom};
                    for (std::size_t i = 0; i < cfgs.size(); ++i) {
                        sopts[i].config = &cfgs[i];
                        fns.push_back([&, i](cudaStream_t s) {
                            loom::grouped_gemm(A, B, m.e, C, static_cast<const int32_t*>(off), m.e, s, sopts[i]);
                        });
                    }
                    const loom::MatrixView B0{b, loom::DType::BF16, m.n, m.k, 0};
                    fns.push_back([&](cudaStream_t s) { loom::gemm(A, B0, C, {}, s); });
                    const auto tsw = loom::bench::time_ops(fns, stream, topts);
                    std::printf("  sweep: heuristic %.1f us; dense gemm %.1f us (%.0f TFLOP/s)\n", tsw[0].median_us,
                                tsw.back().median_us, flops / tsw.back().median_us / 1e6);
                    for (std::size_t i = 0; i < cfgs.size(); ++i)
                        std::printf("    %-44s %9.1f us %6.0f TFLOP/s\n", cfgs[i].str().c_str(), tsw[i + 1].median_us,
                                    flops / tsw[i + 1].median_us / 1e6);
                }
                nlohmann::json row = grouped_row(m, tokens, rows, rname,
                                                 fmt::format("{} E={} N={} K={} tokens={} top{} {} bf16", m.name, m.e,
                                                             m.n, m.k, tokens, m.topk, rname),
                                                 "bf16");
                row["calc_diff"] = diff;
                row["loom_us"] = loom_us;
                row["loom_tflops"] = flops / loom_us / 1e6;
                row["loom_register_store_us"] = reg_us;
                row["register_store_calc_diff"] = reg_diff;
                row["baselines"] = {{"cublas_grouped", cublas_us}};
                report.add_row(std::move(row));
                cudaFree(dpa), cudaFree(dpb), cudaFree(dpc);
                cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(c_ref), cudaFree(off);
            }
        }
    }
    cublasDestroy(handle);
    report.write(out);  // empty: printed
    return 0;
}

// topk_idx [t, k] of one rank: k distinct experts per token, the first from the `routing` distribution (uniform or the
// skewed power law), the others uniformly among the rest.
std::vector<int32_t> tp_ids(int t, int e, int k, bool skewed, uint64_t seed) {
    std::vector<double> w(e, 1.0);
    if (skewed)
        for (int i = 0; i < e; ++i) w[(7919 * i) % e] = std::pow(1.0 / (i + 1), 1.2);
    std::vector<double> cdf(e);
    double acc = 0;
    for (int i = 0; i < e; ++i) cdf[i] = acc += w[i];
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    auto next = [&x] {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        return x;
    };
    std::vector<int32_t> ids(static_cast<std::size_t>(t) * k);
    std::vector<int> perm(e);
    for (int i = 0; i < t; ++i) {
        const double u = static_cast<double>(next() >> 11) / 9007199254740992.0 * acc;
        const int first = static_cast<int>(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
        for (int j = 0; j < e; ++j) perm[j] = j;
        std::swap(perm[0], perm[std::min(first, e - 1)]);
        for (int j = 1; j < k; ++j) std::swap(perm[j], perm[j + next() % (e - j)]);
        for (int j = 0; j < k; ++j) ids[static_cast<std::size_t>(i) * k + j] = perm[j];
    }
    return ids;
}

void* dev_alloc(std::size_t bytes, int fill = 0x3C) {
    void* p = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(&p, std::max<std::size_t>(bytes, 256)));
    LOOM_CHECK_CUDA(cudaMemset(p, fill, std::max<std::size_t>(bytes, 256)));  // bf16 0x3C3C: 0.0115
    return p;
}

int tp(const std::string& out_dir, int iters, bool quick, const std::string& only_op, int only_tokens, int comm_sms,
       int argc, char** argv) {
    using loom::DType;
    using loom::TpMoeAlgo;
    // The fused ag_moe's double-buffered gather of Mixtral-8x22B's routed rows alone takes 2 x 16384 x 6144 x 2 B
    // = 384 MiB, beside the Sequential state's buffers: 8 GiB covers every model at 8192 tokens.
    loom::WorldOptions wopts;
    wopts.symmetric_size = std::size_t{8} << 30;
    auto world = loom::World::from_env(wopts);
    const int W = world.world_size(), me = world.rank();
    std::vector<Model> models = {{"Mixtral-8x7B", 14336, 4096, 8, 2},
                                 {"Mixtral-8x22B", 16384, 6144, 8, 2},
                                 {"Qwen1.5-MoE", 1408, 2048, 60, 4},
                                 {"DeepSeek-MoE", 1408, 2048, 64, 6},
                                 {"Qwen3-30B-A3B", 768, 2048, 128, 8}};
    if (quick) models = {models[0], models[4]};
    loom::bench::Report report("moe", W, argc, argv);
    loom::bench::TimeOptions topts;
    topts.world = &world;
    topts.iters = iters;
    topts.warmup = 3;
    topts.align = [&world](cudaStream_t st) { loom::barrier_on_stream(world, st); };
    cudaStream_t stream;
    LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    if (me == 0)
        std::printf("%-14s %6s %-8s %-7s %9s %9s %9s %9s %7s %9s %9s\n", "model", "tokens", "routing", "op", "fused_us",
                    "seq_us", "gemm_us", "comm_us", "eff", "seq_em_us", "gemm_em_us");
    for (const Model& m : models) {
        const int n_loc = m.n / W;  // the slice of every expert
        if (n_loc % 16 != 0 || m.n % W != 0) {
            if (me == 0) std::printf("%s: N / W = %d / %d is not a multiple of 16: skipped\n", m.name, m.n, W);
            continue;
        }
        const std::vector<int> batches = only_tokens > 0 ? std::vector<int>{only_tokens} : std::vector<int>{128, 8192};
        for (int tokens : batches) {
            const int t_loc = std::max(1, tokens / W), T = t_loc * W;
            for (bool skewed : {false, true}) {
                const loom::MoeRoutingShape shape{T, m.topk, m.e, W};
                const int64_t rows = shape.max_rows();
                void* x = dev_alloc(static_cast<std::size_t>(t_loc) * m.k * 2);
                void* w_up = dev_alloc(static_cast<std::size_t>(m.e) * n_loc * m.k * 2);
                void* w_down = dev_alloc(static_cast<std::size_t>(m.e) * m.k * n_loc * 2);
                void* h = dev_alloc(static_cast<std::size_t>(rows) * n_loc * 2);
                void* part = dev_alloc(static_cast<std::size_t>(rows) * m.k * 2);
                void* y = dev_alloc(static_cast<std::size_t>(t_loc) * m.k * 2);
                void* xg = dev_alloc(static_cast<std::size_t>(rows) * m.k * 2);  // grouped GEMM A: rows x K
                void* red = dev_alloc(static_cast<std::size_t>(T) * m.k * 2);
                void* route = dev_alloc(loom::moe_routing_bytes(shape), 0);
                const loom::MoeRoutingShape eshape{T, m.topk, m.e};  // expert-major: E groups
                void* eroute = dev_alloc(loom::moe_routing_bytes(eshape), 0);
                const std::vector<int32_t> ids_h = tp_ids(t_loc, m.e, m.topk, skewed, 1 + me);
                void* ids = dev_alloc(ids_h.size() * 4);
                void* idsg = dev_alloc(ids_h.size() * 4 * W);
                LOOM_CHECK_CUDA(cudaMemcpy(ids, ids_h.data(), ids_h.size() * 4, cudaMemcpyHostToDevice));
                // dev_alloc's fills and the upload ran on the legacy stream (a pageable upload may still be in flight
                // when cudaMemcpy returns), which `stream` (non-blocking) does not wait for.
                LOOM_CHECK_CUDA(cudaDeviceSynchronize());
                const loom::MoeRouting routing = loom::moe_routing_view(shape, route, loom::moe_routing_bytes(shape));
                const loom::MoeRouting erouting =
                    loom::moe_routing_view(eshape, eroute, loom::moe_routing_bytes(eshape));
                const loom::MatrixView xv{x, DType::BF16, t_loc, m.k},
                    upv{w_up, DType::BF16, int64_t{m.e} * n_loc, m.k}, hv{h, DType::BF16, rows, n_loc},
                    downv{w_down, DType::BF16, int64_t{m.e} * m.k, n_loc}, yv{y, DType::BF16, t_loc, m.k},
                    partv{part, DType::BF16, rows, m.k};
                auto opts = [](TpMoeAlgo a) {
                    loom::TpMoeOptions o;
                    o.algo = a;
                    return o;
                };
                const auto ag = [&](TpMoeAlgo a, const loom::MoeRouting& r) {
                    return [&, a](cudaStream_t s) {
                        loom::ag_moe(world, xv, static_cast<int32_t*>(ids), nullptr, upv, r, hv, s, opts(a));
                    };
                };
                const auto rs = [&](TpMoeAlgo a, const loom::MoeRouting& r) {
                    loom::TpMoeOptions o = opts(a);
                    o.comm_sms = comm_sms;
                    return [&, o](cudaStream_t s) { loom::moe_rs(world, hv, downv, r, yv, s, o); };
                };
                const auto gather = [&](cudaStream_t s) {
                    const std::size_t xb = static_cast<std::size_t>(t_loc) * m.k * 2, ib = ids_h.size();
                    loom::all_gather(world, {x, DType::U8, xb}, {xg, DType::U8, xb * W}, s);
                    loom::all_gather(world, {ids, DType::I32, ib}, {idsg, DType::I32, ib * W}, s);
                };
                loom::GroupedGemmOptions g;
                g.max_rows = static_cast<int>(rows);
                const auto gemm_up = [&](const loom::MoeRouting& r) {
                    return [&](cudaStream_t s) {
                        loom::grouped_gemm({xg, DType::BF16, rows, m.k}, upv, m.e, hv, r.offsets, r.shape.num_groups(),
                                           s, g);
                    };
                };
                const auto gemm_down = [&](const loom::MoeRouting& r) {
                    return [&](cudaStream_t s) {
                        loom::grouped_gemm(hv, downv, m.e, partv, r.offsets, r.shape.num_groups(), s, g);
                    };
                };
                const std::size_t yn = static_cast<std::size_t>(t_loc) * m.k;
                const auto scatter = [&](cudaStream_t s) {
                    loom::reduce_scatter(world, {red, DType::BF16, yn * W}, {y, DType::BF16, yn}, s);
                };
                ag(TpMoeAlgo::Sequential, erouting)(stream);  // both routings, state, JIT
                ag(TpMoeAlgo::Sequential, routing)(stream);
                const bool time_ag = only_op.empty() || only_op == "ag_moe";
                const bool time_rs = only_op.empty() || only_op == "moe_rs";
                // Per op: Fused, Sequential, communication alone, GEMM alone, expert-major Sequential, its GEMM and
                // expert-major Fused.
                std::vector<std::function<void(cudaStream_t)>> ops;
                if (time_ag) {
                    ag(TpMoeAlgo::Fused, routing)(stream);
                    ag(TpMoeAlgo::Fused, erouting)(stream);
                    ops.insert(ops.end(), {ag(TpMoeAlgo::Fused, routing), ag(TpMoeAlgo::Sequential, routing), gather,
                                           gemm_up(routing), ag(TpMoeAlgo::Sequential, erouting), gemm_up(erouting),
                                           ag(TpMoeAlgo::Fused, erouting)});
                }
                if (time_rs) {
                    rs(TpMoeAlgo::Sequential, routing)(stream);
                    rs(TpMoeAlgo::Fused, routing)(stream);
                    rs(TpMoeAlgo::Sequential, erouting)(stream);
                    rs(TpMoeAlgo::Fused, erouting)(stream);
                    ops.insert(ops.end(), {rs(TpMoeAlgo::Fused, routing), rs(TpMoeAlgo::Sequential, routing), scatter,
                                           gemm_down(routing), rs(TpMoeAlgo::Sequential, erouting), gemm_down(erouting),
                                           rs(TpMoeAlgo::Fused, erouting)});
                }
                LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
                std::vector<loom::bench::Timing> t;
                if (!ops.empty()) t = loom::bench::time_ops(ops, stream, topts);
                const char* rname = skewed ? "skewed" : "uniform";
                // A row of op `name` (the fused algorithm's time `fused_us`): the shape's common fields, then `extra`.
                const auto tp_row = [&](const std::string& shape, const char* name, double fused_us, double gemm_us,
                                        double eff, nlohmann::json extra) {
                    nlohmann::json row = {{"shape", shape},
                                          {"op", name},
                                          {"model", m.name},
                                          {"n", m.n},
                                          {"k", m.k},
                                          {"n_loc", n_loc},
                                          {"experts", m.e},
                                          {"topk", m.topk},
                                          {"tokens", T},
                                          {"world", W},
                                          {"routing", rname},
                                          {"dtype", "bf16"},
                                          {"algo", "fused"},
                                          {"loom_us", fused_us},
                                          {"gemm_alone_us", gemm_us},
                                          {"overlap_efficiency", eff}};
                    row.update(extra);
                    report.add_row(row);
                };
                for (int op = 0; op < 2; ++op) {
                    if (!(op == 0 ? time_ag : time_rs)) continue;
                    const int b = op == 1 && time_ag ? 7 : 0;
                    const double fused = t[b].median_us, seq = t[b + 1].median_us, comm = t[b + 2].median_us,
                                 gemm = t[b + 3].median_us, seq_em = t[b + 4].median_us, gemm_em = t[b + 5].median_us;
                    const double eff = fused / std::max(gemm, comm);
                    const char* name = op == 0 ? "ag_moe" : "moe_rs";
                    if (me == 0)
                        std::printf("%-14s %6d %-8s %-7s %9.1f %9.1f %9.1f %9.1f %7.3f %9.1f %9.1f\n", m.name, T, rname,
                                    name, fused, seq, gemm, comm, eff, seq_em, gemm_em);
                    const std::string row_shape =
                        fmt::format("{} {} tokens={} {} N={} K={}", name, m.name, T, rname, m.n, m.k);
                    const char* comm_key = op == 0 ? "all_gather_alone_us" : "reduce_scatter_alone_us";
                    tp_row(row_shape, name, fused, gemm, eff,
                           {{"gemm_expert_major_alone_us", gemm_em},
                            {comm_key, comm},
                            {"baselines", {{"loom_sequential", seq}, {"loom_sequential_expert_major", seq_em}}}});
                    // Fused on the expert-major routing, against the expert-major GEMM alone.
                    const double fused_em = t[b + 6].median_us, eff_em = fused_em / std::max(gemm_em, comm);
                    if (me == 0)
                        std::printf("%-14s %6d %-8s %-7s %9.1f %9.1f %9.1f %9.1f %7.3f (expert-major)\n", m.name, T,
                                    rname, name, fused_em, seq_em, gemm_em, comm, eff_em);
                    tp_row(row_shape + " expert-major", name, fused_em, gemm_em, eff_em,
                           {{"layout", "expert-major"},
                            {comm_key, comm},
                            {"baselines",
                             {{"loom_sequential_expert_major", seq_em},
                              {"loom_sequential", seq},
                              {"loom_fused_source_major", fused}}}});
                }
                if (tokens == 128 && (only_op.empty() || only_op == "moe_ar")) {
                    // moe_ar: a decode batch of T tokens that every rank holds whole (the same ids everywhere), the
                    // down projection of its routed rows; the parts: the grouped GEMM, all_reduce of [T, K] bf16.
                    const loom::MoeRoutingShape ashape{T, m.topk, m.e};
                    void* aroute = dev_alloc(loom::moe_routing_bytes(ashape), 0);
                    const std::vector<int32_t> aids_h = tp_ids(T, m.e, m.topk, skewed, 1000);
                    void* aids = dev_alloc(aids_h.size() * 4);
                    void* ay = dev_alloc(static_cast<std::size_t>(T) * m.k * 2);
                    LOOM_CHECK_CUDA(cudaMemcpy(aids, aids_h.data(), aids_h.size() * 4, cudaMemcpyHostToDevice));
                    LOOM_CHECK_CUDA(cudaDeviceSynchronize());  // as above
                    const loom::MoeRouting ar_routing =
                        loom::moe_routing_view(ashape, aroute, loom::moe_routing_bytes(ashape));
                    loom::moe_route(static_cast<int32_t*>(aids), nullptr, ar_routing, stream);
                    const loom::MatrixView arows{h, DType::BF16, ashape.max_rows(), n_loc},
                        ayv{ay, DType::BF16, T, m.k};
                    const auto ar = [&](TpMoeAlgo a) {
                        return
                            [&, a](cudaStream_t s) { loom::moe_ar(world, arows, downv, ar_routing, ayv, s, opts(a)); };
                    };
                    loom::GroupedGemmOptions ga;
                    ga.max_rows = static_cast<int>(ashape.max_rows());
                    const auto gemm_ar_alone = [&](cudaStream_t s) {
                        loom::grouped_gemm(arows, downv, m.e, {part, DType::BF16, ashape.max_rows(), m.k},
                                           ar_routing.offsets, m.e, s, ga);
                    };
                    const std::size_t an = static_cast<std::size_t>(T) * m.k;
                    const auto reduce_all = [&](cudaStream_t s) {
                        loom::all_reduce(world, {red, DType::BF16, an}, {ay, DType::BF16, an}, s);
                    };
                    ar(TpMoeAlgo::Sequential)(stream);
                    ar(TpMoeAlgo::Fused)(stream);
                    LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
                    const auto ta = loom::bench::time_ops(
                        {ar(TpMoeAlgo::Fused), ar(TpMoeAlgo::Sequential), gemm_ar_alone, reduce_all}, stream, topts);
                    const double fused = ta[0].median_us, seq = ta[1].median_us, gemm = ta[2].median_us,
                                 comm = ta[3].median_us, eff = fused / std::max(gemm, comm);
                    if (me == 0)
                        std::printf("%-14s %6d %-8s %-7s %9.1f %9.1f %9.1f %9.1f %7.3f\n", m.name, T, rname, "moe_ar",
                                    fused, seq, gemm, comm, eff);
                    tp_row(fmt::format("moe_ar {} tokens={} {} N={} K={}", m.name, T, rname, m.n, m.k), "moe_ar", fused,
                           gemm, eff, {{"all_reduce_alone_us", comm}, {"baselines", {{"loom_sequential", seq}}}});
                    for (void* p : {aroute, aids, ay}) cudaFree(p);
                }
                for (void* p : {x, w_up, w_down, h, part, y, xg, red, route, eroute, ids, idsg}) cudaFree(p);
            }
        }
    }
    loom::release_moe_state(world);
    if (me == 0) report.write((out_dir.empty() ? std::string(".") : out_dir) + "/moe.json");
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::string mode = "grouped", out, only_op;
    int iters = 30, only_tokens = 0, comm_sms = 0;
    bool quick = false, sweep = false, portable = false;
    CLI::App app{
        "bench-moe: Loom's MoE ops (grouped: loom::grouped_gemm against cuBLAS's grouped GEMM; grouped-fp8: fp8 with "
        "per-tensor and 128-block scales against bf16; tp: ag_moe / moe_rs / "
        "moe_ar Fused against Sequential and the parts alone, under loomrun)"};
    app.add_option("mode", mode, "what to time")
        ->check(CLI::IsMember({"grouped", "grouped-fp8", "tp"}))
        ->capture_default_str();
    app.add_option("--out", out,
                   "grouped, grouped-fp8: output file (default: print only); tp: output folder (moe.json)");
    app.add_option("--iters", iters, "timed runs per shape (tp: 10 unless given)")->check(CLI::PositiveNumber);
    app.add_flag("--quick", quick, "tp: two models only (Mixtral-8x7B, Qwen3-30B-A3B)");
    app.add_flag(
        "--portable", portable,
        "grouped-fp8: every Loom call on the portable kernel (force_sm80: fp8 converted to bf16 for mma.sync)");
    app.add_flag("--sweep", sweep,
                 "grouped: at 8192 uniform tokens also time tile widths x raster groups and the dense GEMM of the "
                 "same size");
    app.add_option("--op", only_op, "tp: time this op only (with its parts)")
        ->check(CLI::IsMember({"ag_moe", "moe_rs", "moe_ar"}));
    app.add_option("--tokens", only_tokens, "tp: this many total tokens only (default: 128 and 8192)")
        ->check(CLI::PositiveNumber);
    app.add_option("--comm-sms", comm_sms,
                   "tp: moe_rs Fused's TpMoeOptions::comm_sms (reduce blocks beside the GEMM; 0: by the work, < 0: "
                   "none)");
    loom::bench::parse_or_exit(app, argc, argv);
    if (mode == "tp")
        return tp(out, app.count("--iters") ? iters : 10, quick, only_op, only_tokens, comm_sms, argc, argv);
    if (mode == "grouped-fp8") return grouped_fp8(out, iters, portable, argc, argv);
    return grouped(out, iters, sweep, argc, argv);
}
