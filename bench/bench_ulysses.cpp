// bench-ulysses: Ulysses sequence parallelism's ops (docs/attention.md) per shape, each Fused, Sequential and Auto,
// against their parts alone: the projection GEMM (loom::gemm of the rank's shape) and an all-to-all of the same bytes
// (loom::all_to_all), timed interleaved run by run (harness time_ops). Rows in the docs/perf schema:
//   loomrun -n 8 build/bench/bench-ulysses --out docs/perf
// writes qkv_gemm_a2a.json and a2a_o_gemm.json (rank 0). Shapes: --s (sequence lengths) x --model (hidden, Hq pairs),
// Hkv (--hkv) and D (--d) fixed; shapes whose heads do not split over the ranks are skipped.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "harness.hpp"
#include "loom/ops/attention.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "loom/runtime/world.hpp"

namespace {

using loom::DType;
using loom::MatrixView;
using loom::UlyssesAlgo;

struct Args {
    std::vector<int64_t> seqs{8000, 8192, 32768};     // 8000: Triton-distributed's Ulysses test
    std::vector<int64_t> models{4096, 32, 8192, 64};  // hidden, Hq pairs
    int64_t hkv = 8, d = 128;
    int iters = 20;
    std::string out;
    int argc = 0;
    char** argv = nullptr;
};

void* dev_alloc(std::size_t bytes) {
    void* p = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(&p, std::max<std::size_t>(bytes, 256)));
    LOOM_CHECK_CUDA(cudaMemset(p, 0x3C, bytes));  // bf16 ~1.2: finite inputs
    return p;
}

bool heads_split(int W, int64_t hq, int64_t hkv) {
    return hq % W == 0 && hq % hkv == 0 && (hkv % W == 0 || W % hkv == 0);
}

loom::bench::TimeOptions time_options(loom::World& w, int iters) {
    loom::bench::TimeOptions o;
    o.world = &w;
    o.iters = iters;
    o.align = [&w](cudaStream_t st) { loom::barrier_on_stream(w, st); };
    return o;
}

// {Auto, Fused, Sequential, GEMM alone, all-to-all alone} medians, interleaved.
nlohmann::json time_row(loom::World& w, const Args& args, cudaStream_t s,
                        const std::function<void(cudaStream_t, UlyssesAlgo)>& op,
                        const std::function<void(cudaStream_t)>& gemm_alone,
                        const std::function<void(cudaStream_t)>& a2a_alone, double flops) {
    std::vector<std::function<void(cudaStream_t)>> fns;
    for (UlyssesAlgo a : {UlyssesAlgo::Auto, UlyssesAlgo::Fused, UlyssesAlgo::Sequential})
        fns.push_back([&op, a](cudaStream_t st) { op(st, a); });
    fns.push_back(gemm_alone);
    fns.push_back(a2a_alone);
    for (auto& f : fns) f(s);  // first calls: JIT and state outside the timing
    LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
    std::vector<double> us;
    for (const auto& t : loom::bench::time_ops(fns, s, time_options(w, args.iters))) us.push_back(t.median_us);
    nlohmann::json row;
    row["loom_us"] = us[0];
    row["fused_us"] = us[1];
    row["sequential_us"] = us[2];
    row["gemm_us"] = us[3];
    row["all_to_all_us"] = us[4];
    row["tflops"] = flops / (us[0] * 1e6);
    // The op as called (Auto) over the slower of its parts alone, and Fused's.
    row["overlap_efficiency"] = us[0] / std::max(us[3], us[4]);
    row["fused_overlap_efficiency"] = us[1] / std::max(us[3], us[4]);
    row["baselines"] = {{"loom_sequential", us[2]}, {"gemm_plus_all_to_all", us[3] + us[4]}};
    return row;
}

void bench(loom::World& w, const Args& args, cudaStream_t s) {
    const int W = w.world_size();
    loom::bench::Report qkv_report("qkv_gemm_a2a", W, args.argc, args.argv),
        o_report("a2a_o_gemm", W, args.argc, args.argv);
    for (int64_t S : args.seqs)
        for (std::size_t mi = 0; mi + 1 < args.models.size(); mi += 2) {
            const int64_t hidden = args.models[mi], hq = args.models[mi + 1], hkv = args.hkv, D = args.d;
            if (S % W != 0 || !heads_split(W, hq, hkv)) {
                if (w.rank() == 0)
                    std::printf("skipped S=%lld Hq=%lld Hkv=%lld: the heads or rows do not split over %d ranks\n",
                                static_cast<long long>(S), static_cast<long long>(hq), static_cast<long long>(hkv), W);
                continue;
            }
            const int64_t R = S / W, N = (hq + 2 * hkv) * D, hq_loc = hq / W, hkv_loc = hkv >= W ? hkv / W : 1;
            const loom::UlyssesHeads heads{hq, hkv, D};
            void* x = dev_alloc(R * hidden * 2);
            void* wqkv = dev_alloc(N * hidden * 2);
            void* q = dev_alloc(S * hq_loc * D * 2);
            void* k = dev_alloc(S * hkv_loc * D * 2);
            void* v = dev_alloc(S * hkv_loc * D * 2);
            void* wo = dev_alloc(hidden * hq * D * 2);
            void* out = dev_alloc(R * hidden * 2);
            void* prod = dev_alloc(std::max(R * N, R * hq * D) * 2);
            const std::size_t a2a_count = static_cast<std::size_t>(std::max(R * N, R * hq * D) / (8 * W) * 8 * W);
            void* a2a_in = dev_alloc(a2a_count * 2);
            void* a2a_out = dev_alloc(a2a_count * 2);
            const MatrixView mx{x, DType::BF16, R, hidden, 0}, mw{wqkv, DType::BF16, N, hidden, 0};
            const MatrixView mq{q, DType::BF16, S, hq_loc * D, 0}, mk{k, DType::BF16, S, hkv_loc * D, 0},
                mv{v, DType::BF16, S, hkv_loc * D, 0};
            const MatrixView mo{q, DType::BF16, S, hq_loc * D, 0}, mwo{wo, DType::BF16, hidden, hq * D, 0},
                mout{out, DType::BF16, R, hidden, 0};
            // The all-to-all alone: each rank's whole product (qkv) or o shard (o) in W equal pieces.
            auto a2a = [&](int64_t elems) {
                const std::size_t n = static_cast<std::size_t>(elems / (8 * W) * 8 * W);
                return [&w, a2a_in, a2a_out, n](cudaStream_t st) {
                    loom::all_to_all(w, {a2a_in, DType::BF16, n}, {a2a_out, DType::BF16, n}, st);
                };
            };
            nlohmann::json shape = {{"shape", fmt::format("S={} hidden={} Hq={} Hkv={} D={}", S, hidden, hq, hkv, D)},
                                    {"S", S},
                                    {"hidden", hidden},
                                    {"hq", hq},
                                    {"hkv", hkv},
                                    {"d", D}};

            nlohmann::json row = time_row(
                w, args, s,
                [&](cudaStream_t st, UlyssesAlgo a) { loom::qkv_gemm_a2a(w, mx, mw, heads, mq, mk, mv, st, {a}); },
                [&](cudaStream_t st) {
                    loom::gemm(mx, mw, {prod, DType::BF16, R, N, 0}, {}, st);
                },
                a2a(R * N), 2.0 * R * N * hidden);
            row.update(shape);
            qkv_report.add_row(row);
            if (w.rank() == 0)
                std::printf(
                    "qkv_gemm_a2a S=%lld hidden=%lld Hq=%lld: fused %.1f us sequential %.1f us gemm %.1f us "
                    "all_to_all %.1f us\n",
                    static_cast<long long>(S), static_cast<long long>(hidden), static_cast<long long>(hq),
                    row["fused_us"].get<double>(), row["sequential_us"].get<double>(), row["gemm_us"].get<double>(),
                    row["all_to_all_us"].get<double>());

            row = time_row(
                w, args, s, [&](cudaStream_t st, UlyssesAlgo a) { loom::a2a_o_gemm(w, mo, mwo, mout, st, {a}); },
                [&](cudaStream_t st) {
                    loom::gemm({prod, DType::BF16, R, hq * D, 0}, mwo, mout, {}, st);
                },
                a2a(R * hq * D), 2.0 * R * hidden * hq * D);
            row.update(shape);
            o_report.add_row(row);
            if (w.rank() == 0)
                std::printf(
                    "a2a_o_gemm   S=%lld hidden=%lld Hq=%lld: fused %.1f us sequential %.1f us gemm %.1f us "
                    "all_to_all %.1f us\n",
                    static_cast<long long>(S), static_cast<long long>(hidden), static_cast<long long>(hq),
                    row["fused_us"].get<double>(), row["sequential_us"].get<double>(), row["gemm_us"].get<double>(),
                    row["all_to_all_us"].get<double>());
            LOOM_CHECK_CUDA(cudaDeviceSynchronize());
            w.barrier();
            for (void* p : {x, wqkv, q, k, v, wo, out, prod, a2a_in, a2a_out}) cudaFree(p);
        }
    if (w.rank() == 0) {
        const std::string dir = args.out.empty() ? std::string(".") : args.out;
        qkv_report.write(dir + "/qkv_gemm_a2a.json");
        o_report.write(dir + "/a2a_o_gemm.json");
    }
}

}  // namespace

int main(int argc, char** argv) {
    Args args;
    args.argc = argc;
    args.argv = argv;
    CLI::App app{"bench-ulysses: qkv_gemm_a2a and a2a_o_gemm, Fused vs Sequential vs their parts"};
    app.add_option("--out", args.out, "output directory of the JSON reports");
    app.add_option("--iters", args.iters, "timed runs per point")->capture_default_str()->check(CLI::PositiveNumber);
    app.add_option("--s", args.seqs, "sequence lengths S")->delimiter(',')->check(CLI::PositiveNumber);
    app.add_option("--model", args.models, "hidden,Hq pairs (e.g. 4096,32,8192,64)")->delimiter(',');
    app.add_option("--hkv", args.hkv, "kv heads")->capture_default_str()->check(CLI::PositiveNumber);
    app.add_option("--d", args.d, "head dim")->capture_default_str()->check(CLI::PositiveNumber);
    loom::bench::parse_or_exit(app, argc, argv);
    if (args.models.size() % 2 != 0) {
        std::fprintf(stderr, "bench-ulysses: expected --model as hidden,Hq pairs, given %zu numbers\n",
                     args.models.size());
        return 2;
    }
    if (!loom::driver::available()) {
        std::printf("no GPU: %s\n", loom::driver::unavailable_reason().c_str());
        return 1;
    }
    try {
        loom::WorldOptions wopts;
        wopts.symmetric_size = std::max(loom::settings().symmetric_size, std::size_t{2} << 30);
        auto w = loom::World::from_env(wopts);
        cudaStream_t s;
        LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        bench(w, args, s);
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
        w.barrier();
        loom::release_ulysses_state(w);
        loom::release_collective_state(w);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench-ulysses: %s\n", e.what());
        return 1;
    }
}
