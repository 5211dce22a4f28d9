// bench-attention: the decode attention ops (docs/attention.md), rows in the docs/perf schema.
//
//   build/bench/bench-attention decode [--out DIR] [--quick]            -> DIR/decode_attention.json
//   build/bench/bench-attention decode --sweep [--out DIR]              -> DIR/decode_attention_sweep.json
//   loomrun -n W build/bench/bench-attention sp [--out DIR] [--quick]   -> DIR/sp_decode_attention.json (rank 0)
//
// decode: loom::decode_attention over a batch x KV-length grid (GQA, bf16), contiguous and paged (pages in a shuffled
// order), every sequence full. Each row has loom_us, the HBM bytes the op must move (K + V + q + O + LSE), the
// achieved GB/s and its fraction of --peak-gbps, and the roofline reference: a cudaMemcpyAsync (device to device)
// of the same K + V bytes, timed interleaved with the op (memcpy_us; memcpy_gbps counts its reads and writes, so a
// decode that streams K and V at the copy engine's rate takes about half of memcpy_us).
// decode --sweep: every kernel shape (loom::DecodeConfig) of the sweep against the heuristic's pick, on the cases of
// --head-pairs x --batch x --kv x --pages (bench_decode_sweep).
// sp: loom::sp_decode_attention (each rank an even shard of every sequence) against Loom's own sequence for the same
// result: decode_attention on the shard, loom::all_gather of the packed (O, LSE), then a combine kernel
// (bench/kernels/attention_combine.cuh); against decode_attention on the shard alone (the local part); and the LL
// all_gather of the combine's payload alone (per row the fp32 O and the LSE; Auto's algorithm where the payload is
// larger than LL's capacity): over_local_decode_us (loom_us - local_decode_us) against payload_all_gather_us is the
// issue's SP decode bound. packets_us, direct_us and two_shot_us: the op with each exchange of the partials forced
// (exchange: the one Auto takes).
// Every mode's timed runs start with a clean L2 (TimeOptions::flush_l2_clean): a memset flush alone leaves L2 full of
// dirty lines whose write-back, up to L2's size, would be timed with whatever reads the most bytes after it.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "harness.hpp"
#include "loom/bf16.hpp"
#include "loom/jit/jit.hpp"
#include "loom/ops/attention.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/world.hpp"
#include "ops/attention/decode_plan.hpp"

namespace {

using loom::DType;
using nlohmann::json;

struct Args {
    std::string mode;
    std::vector<int> batches{1, 16, 64, 128};
    std::vector<int64_t> kv_lens{1024, 4096, 16384, 65536};
    std::vector<int64_t> sp_shapes{1, 65536, 1, 262144, 16, 16384, 64, 8192, 128, 2048};  // batch, total KV pairs
    int hq = 32, hkv = 8, d = 128, page = 16;
    bool sweep = false;
    std::vector<int> head_pairs{96, 12, 32, 8};  // --sweep: q heads, kv heads pairs
    std::vector<int> pages{0, 1, 16};            // --sweep: layouts (0: contiguous)
    std::vector<int> split_counts;               // --sweep: also the heuristic's shape at each of these splits
    int iters = 30;
    double peak_gbps = 4300;
    bool quick = false;
    std::string out;
    int argc = 0;
    char** argv = nullptr;
};

struct DevBuf {
    void* p = nullptr;
    explicit DevBuf(std::size_t bytes) { LOOM_CHECK_CUDA(cudaMalloc(&p, std::max<std::size_t>(bytes, 256))); }
    ~DevBuf() { cudaFree(p); }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
    template <class T = void>
    T* as() const {
        return static_cast<T*>(p);
    }
};

// Fills `bytes` of device memory with bf16 values in [-1, 1): one 16 MiB random block, tiled. Complete on return (the
// copies run on the legacy stream, which the benchmark's non-blocking streams do not wait for).
void fill_random(void* dst, std::size_t bytes, uint64_t seed) {
    constexpr std::size_t kBlock = 16u << 20;
    std::vector<uint16_t> h(kBlock / 2);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto& v : h) v = loom::float_to_bf16(u(rng));
    const std::size_t first = std::min(bytes, kBlock);
    LOOM_CHECK_CUDA(cudaMemcpy(dst, h.data(), first, cudaMemcpyHostToDevice));
    auto* d = static_cast<unsigned char*>(dst);
    for (std::size_t off = first; off < bytes; off += kBlock)
        LOOM_CHECK_CUDA(cudaMemcpy(d + off, dst, std::min(kBlock, bytes - off), cudaMemcpyDeviceToDevice));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
}

// Complete on return, as fill_random.
template <class T>
void upload(void* dst, const std::vector<T>& h) {
    LOOM_CHECK_CUDA(cudaMemcpy(dst, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
}

json shape_keys(const char* layout, int batch, int64_t kv_len, const Args& a) {
    const bool paged = std::string(layout) == "paged";
    return {{"shape", fmt::format("B={} kv={} Hq={} Hkv={} D={} {}{} bf16", batch, kv_len, a.hq, a.hkv, a.d, layout,
                                  paged ? fmt::format(" page {}", a.page) : "")},
            {"layout", layout},
            {"batch", batch},
            {"kv_len", kv_len},
            {"hq", a.hq},
            {"hkv", a.hkv},
            {"d", a.d},
            {"page_size", paged ? a.page : 0},
            {"dtype", "bf16"}};
}

// ---- decode --------------------------------------------------------------------------------------------------------

void bench_decode(const Args& a, cudaStream_t s) {
    const std::size_t token_bytes = std::size_t(a.hkv) * a.d * 2;  // one token of K (or V)
    const int max_b = *std::max_element(a.batches.begin(), a.batches.end());
    const int64_t max_s = *std::max_element(a.kv_lens.begin(), a.kv_lens.end());
    // K and V (one buffer each) and the copy's destination (K + V): the largest grid point that fits, 2 GiB spare.
    std::size_t free_b = 0, total_b = 0;
    LOOM_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
    const std::size_t spare = std::size_t(2) << 30;
    const std::size_t fit_tokens = free_b > spare ? (free_b - spare) / (4 * token_bytes) : 0;
    const std::size_t cap_tokens = std::min<std::size_t>(fit_tokens, std::size_t(max_b) * max_s);
    LOOM_CHECK(cap_tokens > 0, "bench-attention: no device memory for a KV cache ({} bytes free)", free_b);
    const std::size_t cap_bytes = cap_tokens * token_bytes;
    DevBuf k(cap_bytes), v(cap_bytes), copy_dst(2 * cap_bytes);
    fill_random(k.p, cap_bytes, 1);
    fill_random(v.p, cap_bytes, 2);
    const std::size_t rows = std::size_t(max_b) * a.hq;
    DevBuf q(rows * a.d * 2), o(rows * a.d * 2), lse(rows * 4), lens(std::size_t(max_b) * 4);
    fill_random(q.p, rows * a.d * 2, 3);
    const int64_t max_pages_cap = (max_s + a.page - 1) / a.page;
    DevBuf table(std::size_t(max_b) * max_pages_cap * 4);

    loom::bench::Report report("decode_attention", 1, a.argc, a.argv);
    loom::bench::TimeOptions topts;
    topts.iters = a.iters;
    topts.warmup = a.quick ? 2 : 5;
    topts.flush_l2_clean = true;
    std::mt19937 rng(7);
    for (int B : a.batches)
        for (int64_t S : a.kv_lens) {
            const std::size_t tokens = std::size_t(B) * S;
            const int max_pages = static_cast<int>((S + a.page - 1) / a.page);
            if (std::size_t(B) * max_pages * a.page > cap_tokens) {
                std::printf("skipped batch %d kv %lld: K + V + the copy's destination do not fit in memory\n", B,
                            static_cast<long long>(S));
                continue;
            }
            const int num_pages = static_cast<int>(std::min<std::size_t>(cap_tokens / a.page, INT32_MAX));
            upload(lens.p, std::vector<int32_t>(B, static_cast<int32_t>(S)));
            std::vector<int32_t> pages(std::size_t(B) * max_pages);
            std::iota(pages.begin(), pages.end(), 0);
            std::shuffle(pages.begin(), pages.end(), rng);  // a fragmented cache: pages in no particular order
            upload(table.p, pages);

            const loom::DecodeQuery dq{q.p, DType::BF16, B, a.hq, a.d};
            loom::KvCache contiguous;
            contiguous.k = k.p, contiguous.v = v.p, contiguous.num_kv_heads = a.hkv;
            contiguous.seq_lens = lens.as<const int32_t>(), contiguous.max_seq_len = S;
            loom::KvCache paged = contiguous;
            paged.max_seq_len = 0;
            paged.block_table = table.as<const int32_t>(), paged.max_pages = max_pages;
            paged.num_pages = num_pages, paged.page_size = a.page;
            const std::size_t kv_bytes = 2 * tokens * token_bytes;
            std::vector<std::function<void(cudaStream_t)>> fns = {
                [&](cudaStream_t st) { loom::decode_attention(dq, contiguous, o.p, lse.as<float>(), st); },
                [&](cudaStream_t st) { loom::decode_attention(dq, paged, o.p, lse.as<float>(), st); },
                [&](cudaStream_t st) {
                    const std::size_t half = tokens * token_bytes;
                    LOOM_CHECK_CUDA(cudaMemcpyAsync(copy_dst.p, k.p, half, cudaMemcpyDeviceToDevice, st));
                    LOOM_CHECK_CUDA(
                        cudaMemcpyAsync(copy_dst.as<unsigned char>() + half, v.p, half, cudaMemcpyDeviceToDevice, st));
                }};
            for (auto& f : fns) f(s);  // JIT and workspaces outside the timing
            LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
            const auto t = loom::bench::time_ops(fns, s, topts);
            const double memcpy_us = t[2].median_us;
            const double io_bytes = double(kv_bytes) + double(B) * a.hq * (2.0 * a.d * 2 + 4);  // + q, O, LSE
            for (int li = 0; li < 2; ++li) {
                const char* layout = li == 0 ? "contiguous" : "paged";
                json row = shape_keys(layout, B, S, a);
                const double us = t[li].median_us, gbps = loom::bench::gbps(io_bytes, us);
                row["loom_us"] = us;
                row["bytes"] = io_bytes;
                row["gbps"] = gbps;
                row["hbm_fraction"] = gbps / a.peak_gbps;
                row["memcpy_us"] = memcpy_us;
                row["memcpy_gbps"] = loom::bench::gbps(2.0 * kv_bytes, memcpy_us);
                row["baselines"] = {{"memcpy_kv", memcpy_us}};
                report.add_row(row);
                std::printf("decode %-10s batch %4d kv %6lld: %9.1f us %7.0f GB/s (%.2f of %.0f)  memcpy %9.1f us\n",
                            layout, B, static_cast<long long>(S), us, gbps, gbps / a.peak_gbps, a.peak_gbps, memcpy_us);
            }
        }
    report.write((a.out.empty() ? std::string(".") : a.out) + "/decode_attention.json");
}

// ---- decode --sweep ------------------------------------------------------------------------------------------------
// Every shape of decode_sweep_configs (each with the splits the heuristic gives it) and the heuristic's own pick, timed
// interleaved on every case of (q heads, kv heads) x batch x KV length x layout (contiguous, each page size). One
// line per case: the heuristic's pick and time, the fastest shape, then every shape's us; then per shape the
// geometric mean of its time over the heuristic's and the cases it wins. The KV bytes are the op's HBM traffic
// (K + V + q + O + LSE); the fraction is of --peak-gbps.

void bench_decode_sweep(const Args& a, cudaStream_t s) {
    namespace la = loom::attention;
    int dev = 0, smem_per_block = 0;
    LOOM_CHECK_CUDA(cudaGetDevice(&dev));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    LOOM_CHECK(a.head_pairs.size() % 2 == 0 && !a.head_pairs.empty(),
               "bench-attention: expected --head-pairs as q,kv pairs, given {} numbers", a.head_pairs.size());
    int max_hkv = 0;
    for (std::size_t i = 1; i < a.head_pairs.size(); i += 2) max_hkv = std::max(max_hkv, a.head_pairs[i]);
    const int max_b = *std::max_element(a.batches.begin(), a.batches.end());
    const int64_t max_s = *std::max_element(a.kv_lens.begin(), a.kv_lens.end());
    const std::size_t token_bytes = std::size_t(max_hkv) * a.d * 2;
    std::size_t free_b = 0, total_b = 0;
    LOOM_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
    const std::size_t spare = std::size_t(2) << 30;
    const std::size_t fit_tokens = free_b > spare ? (free_b - spare) / (2 * token_bytes) : 0;
    const std::size_t cap_tokens = std::min<std::size_t>(fit_tokens, std::size_t(max_b) * max_s);
    LOOM_CHECK(cap_tokens > 0, "bench-attention: no device memory for a KV cache ({} bytes free)", free_b);
    DevBuf k(cap_tokens * token_bytes), v(cap_tokens * token_bytes);
    fill_random(k.p, cap_tokens * token_bytes, 1);
    fill_random(v.p, cap_tokens * token_bytes, 2);
    int max_hq = 0;
    for (std::size_t i = 0; i < a.head_pairs.size(); i += 2) max_hq = std::max(max_hq, a.head_pairs[i]);
    const std::size_t rows = std::size_t(max_b) * max_hq;
    DevBuf q(rows * a.d * 2), o(rows * a.d * 2), lse(rows * 4), lens(std::size_t(max_b) * 4);
    fill_random(q.p, rows * a.d * 2, 3);
    DevBuf table(std::size_t(max_b) * max_s * 4);  // page size 1 at most

    loom::bench::Report report("decode_attention_sweep", 1, a.argc, a.argv);
    loom::bench::TimeOptions topts;
    topts.iters = a.iters;
    topts.warmup = 1;
    topts.flush_l2_clean = true;
    std::mt19937 rng(7);
    struct Score {
        double log_ratio = 0;
        int cases = 0, wins = 0;
    };
    std::vector<Score> scores;
    std::vector<std::string> legend;
    for (std::size_t hp = 0; hp + 1 < a.head_pairs.size(); hp += 2) {
        const int hq = a.head_pairs[hp], hkv = a.head_pairs[hp + 1];
        LOOM_CHECK(hkv >= 1 && hq % hkv == 0, "bench-attention: expected q heads a multiple of kv heads, given {}, {}",
                   hq, hkv);
        const int hpb = la::decode_heads_per_block(hq / hkv);
        const std::vector<loom::DecodeConfig> configs = la::decode_sweep_configs(a.d, hpb, smem_per_block);
        la::decode_precompile(DType::BF16, a.d, hpb, configs, loom::jit::current_arch());  // the JIT on all cores
        std::printf("\nHq=%d Hkv=%d D=%d bf16: shapes timed (each with its heuristic splits)\n", hq, hkv, a.d);
        for (std::size_t c = 0; c < configs.size(); ++c) std::printf("  [%zu] %s\n", c, configs[c].str().c_str());
        if (scores.size() < configs.size()) {
            scores.resize(configs.size());
            legend.resize(configs.size());
        }
        for (std::size_t c = 0; c < configs.size(); ++c) legend[c] = configs[c].str();
        std::printf("%-34s %-34s %8s %6s %5s | %-6s %8s %5s |", "case", "heuristic pick", "us", "GB/s", "peak", "best",
                    "us", "peak");
        for (std::size_t c = 0; c < configs.size(); ++c) std::printf(" %7s", fmt::format("[{}]", c).c_str());
        std::printf("\n");
        for (int B : a.batches)
            for (int64_t S : a.kv_lens)
                for (int page : a.pages) {
                    const std::size_t tokens = std::size_t(B) * S;
                    const std::size_t need = page == 0 ? tokens : std::size_t(B) * ((S + page - 1) / page) * page;
                    if (need * hkv > cap_tokens * max_hkv) {
                        std::printf("skipped B=%d kv=%lld page %d: the KV cache does not fit in memory\n", B,
                                    static_cast<long long>(S), page);
                        continue;
                    }
                    upload(lens.p, std::vector<int32_t>(B, static_cast<int32_t>(S)));
                    const loom::DecodeQuery dq{q.p, DType::BF16, B, hq, a.d};
                    loom::KvCache kv;
                    kv.k = k.p, kv.v = v.p, kv.num_kv_heads = hkv;
                    kv.seq_lens = lens.as<const int32_t>();
                    if (page == 0) {
                        kv.max_seq_len = S;
                    } else {
                        const int max_pages = static_cast<int>((S + page - 1) / page);
                        const std::size_t pool_tokens = cap_tokens * max_hkv / hkv;
                        std::vector<int32_t> pages(std::size_t(B) * max_pages);
                        std::iota(pages.begin(), pages.end(), 0);
                        std::shuffle(pages.begin(), pages.end(), rng);  // a fragmented cache
                        upload(table.p, pages);
                        kv.block_table = table.as<const int32_t>(), kv.max_pages = max_pages;
                        kv.num_pages = static_cast<int>(std::min<std::size_t>(pool_tokens / page, INT32_MAX));
                        kv.page_size = page;
                    }
                    loom::DecodeOptions heuristic_opts;
                    const la::DecodePlan pick =
                        la::plan_decode("bench", dq, kv, o.p, lse.as<float>(), heuristic_opts, nullptr);
                    std::vector<loom::DecodeOptions> opts(configs.size());
                    std::vector<std::function<void(cudaStream_t)>> fns;
                    fns.push_back([&](cudaStream_t st) { loom::decode_attention(dq, kv, o.p, lse.as<float>(), st); });
                    for (std::size_t c = 0; c < configs.size(); ++c) {
                        opts[c].config = &configs[c];
                        fns.push_back([&, c](cudaStream_t st) {
                            loom::decode_attention(dq, kv, o.p, lse.as<float>(), st, opts[c]);
                        });
                    }
                    for (auto& f : fns) f(s);  // JIT and workspaces outside the timing
                    LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
                    const auto t = loom::bench::time_ops(fns, s, topts);
                    const double io_bytes = 2.0 * tokens * hkv * a.d * 2 + double(B) * hq * (2.0 * a.d * 2 + 4);
                    std::size_t best = 0;
                    for (std::size_t c = 1; c < configs.size(); ++c)
                        if (t[c + 1].median_us < t[best + 1].median_us) best = c;
                    const std::string label =
                        fmt::format("B={} kv={} Hq={} Hkv={} {}", B, S, hq, hkv,
                                    page == 0 ? std::string("contig") : fmt::format("page{}", page));
                    const double hu = t[0].median_us, bu = t[best + 1].median_us;
                    const double hg = loom::bench::gbps(io_bytes, hu);
                    std::printf("%-34s %-34s %8.1f %6.0f %4.0f%% | [%-4zu] %8.1f %4.0f%% |", label.c_str(),
                                pick.config.str().c_str(), hu, hg, 100 * hg / a.peak_gbps, best, bu,
                                100 * loom::bench::gbps(io_bytes, bu) / a.peak_gbps);
                    for (std::size_t c = 0; c < configs.size(); ++c) std::printf(" %7.1f", t[c + 1].median_us);
                    std::printf("\n");
                    std::fflush(stdout);
                    json row = shape_keys(page == 0 ? "contiguous" : "paged", B, S, a);
                    row["hq"] = hq, row["hkv"] = hkv, row["page_size"] = page;
                    row["shape"] = label;
                    row["bytes"] = io_bytes;
                    row["loom_us"] = hu;
                    row["gbps"] = hg;
                    row["hbm_fraction"] = hg / a.peak_gbps;
                    row["heuristic"] = pick.config.str();
                    json per = json::object();
                    for (std::size_t c = 0; c < configs.size(); ++c) {
                        per[configs[c].str()] = t[c + 1].median_us;
                        scores[c].log_ratio += std::log(t[c + 1].median_us / hu);
                        scores[c].cases += 1;
                    }
                    scores[best].wins += 1;
                    row["configs_us"] = per;
                    if (!a.split_counts.empty()) {
                        std::vector<loom::DecodeOptions> sopts(a.split_counts.size());
                        std::vector<std::function<void(cudaStream_t)>> sfns{fns[0]};
                        for (std::size_t i = 0; i < sopts.size(); ++i) {
                            sopts[i].num_splits = a.split_counts[i];
                            sfns.push_back([&, i](cudaStream_t st) {
                                loom::decode_attention(dq, kv, o.p, lse.as<float>(), st, sopts[i]);
                            });
                        }
                        for (auto& f : sfns) f(s);
                        LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
                        const auto ts = loom::bench::time_ops(sfns, s, topts);
                        json by_splits = json::object();
                        std::printf("    splits (heuristic %d: %.1f us):", pick.params.splits, ts[0].median_us);
                        for (std::size_t i = 0; i < sopts.size(); ++i) {
                            std::printf("  %d %.1f", a.split_counts[i], ts[i + 1].median_us);
                            by_splits[std::to_string(a.split_counts[i])] = ts[i + 1].median_us;
                        }
                        std::printf("\n");
                        row["splits_us"] = by_splits;
                    }
                    report.add_row(row);
                }
    }
    std::printf("\nper shape: geometric mean of its time / the heuristic's, and the cases it was fastest in\n");
    for (std::size_t c = 0; c < scores.size(); ++c)
        if (scores[c].cases > 0)
            std::printf("  [%zu] %-36s %.3f  %d of %d\n", c, legend[c].c_str(),
                        std::exp(scores[c].log_ratio / scores[c].cases), scores[c].wins, scores[c].cases);
    report.write((a.out.empty() ? std::string(".") : a.out) + "/decode_attention_sweep.json", false);
}

// ---- sp ------------------------------------------------------------------------------------------------------------

struct SpBuffers {
    std::size_t rows = 0, rank_bytes = 0;
    DevBuf q, k, v, lens, o_sp, lse_sp, part, o_seq, lse_seq;
    SpBuffers(const Args& a, int B, int64_t shard, std::size_t rows_, std::size_t rank_bytes_)
        : rows(rows_),
          rank_bytes(rank_bytes_),
          q(rows_ * a.d * 2),
          k(std::size_t(B) * shard * a.hkv * a.d * 2),
          v(std::size_t(B) * shard * a.hkv * a.d * 2),
          lens(std::size_t(B) * 4),
          o_sp(rows_ * a.d * 2),
          lse_sp(rows_ * 4),
          part(rank_bytes_),
          o_seq(rows_ * a.d * 2),
          lse_seq(rows_ * 4) {}
};

// Max |a - b| over n bf16 values on the device.
double max_diff_bf16(const void* a, const void* b, std::size_t n) {
    std::vector<uint16_t> ha(n), hb(n);
    LOOM_CHECK_CUDA(cudaMemcpy(ha.data(), a, n * 2, cudaMemcpyDeviceToHost));
    LOOM_CHECK_CUDA(cudaMemcpy(hb.data(), b, n * 2, cudaMemcpyDeviceToHost));
    double m = 0;
    for (std::size_t i = 0; i < n; ++i)
        m = std::max(m, double(std::fabs(loom::bf16_to_float(ha[i]) - loom::bf16_to_float(hb[i]))));
    return m;
}

void bench_sp(loom::World& w, const Args& a, cudaStream_t s) {
    namespace la = loom::attention;
    const int W = w.world_size(), me = w.rank();
    LOOM_CHECK(a.d == 128, "bench-attention sp: the combine kernel is instantiated for --d 128, given {}", a.d);
    const std::string dir =
        std::filesystem::path(loom::bench::source_file("bench/kernels/attention_combine.cuh")).parent_path().string();
    const auto& combine = loom::jit::get_kernel(
        {.header = dir + "/attention_combine.cuh", .name = "attn_bench::combine_gathered", .template_args = {"128"}});
    loom::bench::Report report("sp_decode_attention", W, a.argc, a.argv);
    loom::bench::TimeOptions topts;
    topts.world = &w;
    topts.iters = a.iters;
    topts.warmup = a.quick ? 2 : 5;
    topts.flush_l2_clean = true;
    topts.align = [&w](cudaStream_t st) { loom::barrier_on_stream(w, st); };
    for (std::size_t i = 0; i + 1 < a.sp_shapes.size(); i += 2) {
        const int B = static_cast<int>(a.sp_shapes[i]);
        const int64_t S = a.sp_shapes[i + 1], shard = (S + W - 1) / W;
        const int64_t mine = std::max<int64_t>(0, std::min<int64_t>(shard, S - me * shard));  // tokens on this rank
        const std::size_t rows = std::size_t(B) * a.hq;
        const std::size_t o_bytes = rows * a.d * 2, rank_bytes = (o_bytes + rows * 4 + 15) / 16 * 16;
        SpBuffers b(a, B, shard, rows, rank_bytes);
        fill_random(b.q.p, o_bytes, 3);  // the same q on every rank
        fill_random(b.k.p, std::size_t(B) * shard * a.hkv * a.d * 2, 10 + me);
        fill_random(b.v.p, std::size_t(B) * shard * a.hkv * a.d * 2, 20 + me);
        upload(b.lens.p, std::vector<int32_t>(B, static_cast<int32_t>(mine)));
        auto* gathered = w.alloc<unsigned char>(W * rank_bytes);
        // The combine's all-gather payload alone: per row the fp32 O and the LSE (8 bytes), as one LL all_gather.
        const std::size_t ll_bytes = rows * (a.d * 4 + 8);
        loom::CollAlgo ag_algo = loom::CollAlgo::LL;
        DevBuf ll_in(ll_bytes);
        auto* ll_out = w.alloc<unsigned char>(W * ll_bytes);

        const loom::DecodeQuery dq{b.q.p, DType::BF16, B, a.hq, a.d};
        loom::KvCache kv;
        kv.k = b.k.p, kv.v = b.v.p, kv.num_kv_heads = a.hkv;
        kv.seq_lens = b.lens.as<const int32_t>(), kv.max_seq_len = shard;
        auto* part_lse = reinterpret_cast<float*>(b.part.as<unsigned char>() + o_bytes);
        std::vector<std::function<void(cudaStream_t)>> fns = {
            [&](cudaStream_t st) { loom::sp_decode_attention(w, dq, kv, b.o_sp.p, b.lse_sp.as<float>(), st); },
            [&](cudaStream_t st) {
                loom::decode_attention(dq, kv, b.part.p, part_lse, st);
                loom::all_gather(w, {b.part.p, DType::U8, rank_bytes}, {gathered, DType::U8, W * rank_bytes}, st);
                combine({dim3(static_cast<unsigned>(rows)), dim3(static_cast<unsigned>(a.d)), 0, {1, 1, 1}, st},
                        static_cast<const unsigned char*>(gathered), static_cast<unsigned long long>(rank_bytes), W,
                        static_cast<int>(rows), b.o_seq.p, b.lse_seq.as<float>());
            },
            [&](cudaStream_t st) { loom::decode_attention(dq, kv, b.part.p, part_lse, st); },
            // Each exchange of the partials forced (Auto picks one of them by the rows).
            [&](cudaStream_t st) {
                la::sp_decode_exchange(w, dq, kv, b.o_sp.p, b.lse_sp.as<float>(), st, {}, la::SpExchange::Packets);
            },
            [&](cudaStream_t st) {
                la::sp_decode_exchange(w, dq, kv, b.o_sp.p, b.lse_sp.as<float>(), st, {}, la::SpExchange::Direct);
            },
            [&](cudaStream_t st) {
                la::sp_decode_exchange(w, dq, kv, b.o_sp.p, b.lse_sp.as<float>(), st, {}, la::SpExchange::TwoShot);
            },
            [&](cudaStream_t st) {
                loom::all_gather(w, {ll_in.p, DType::U8, ll_bytes}, {ll_out, DType::U8, W * ll_bytes}, st,
                                 {.algo = ag_algo});
            }};
        try {
            for (auto& f : fns) f(s);   // JIT and state outside the timing
        } catch (const loom::Error&) {  // the payload is larger than LL's capacity: Auto's all_gather instead
            ag_algo = loom::CollAlgo::Auto;
            fns.back()(s);
        }
        LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
        const double diff = max_diff_bf16(b.o_sp.p, b.o_seq.p, rows * a.d);  // both paths: the same attention
        const auto t = loom::bench::time_ops(fns, s, topts);
        json row = {{"shape", fmt::format("B={} kv={} Hq={} Hkv={} D={} bf16", B, S, a.hq, a.hkv, a.d)},
                    {"batch", B},
                    {"kv_len", S},
                    {"kv_per_rank", shard},
                    {"ranks", W},
                    {"hq", a.hq},
                    {"hkv", a.hkv},
                    {"d", a.d},
                    {"dtype", "bf16"},
                    {"loom_us", t[0].median_us},
                    {"local_decode_us", t[2].median_us},
                    // The bound: loom_us - local_decode_us <= payload_all_gather_us + 2.
                    {"over_local_decode_us", t[0].median_us - t[2].median_us},
                    {"payload_all_gather_bytes", ll_bytes},
                    {"payload_all_gather_us", t[6].median_us},
                    {"payload_all_gather_algo", loom::to_string(ag_algo)},
                    {"max_abs_diff_vs_sequence", diff},
                    {"packets_us", t[3].median_us},
                    {"direct_us", t[4].median_us},
                    {"two_shot_us", t[5].median_us},
                    {"exchange", la::to_string(la::sp_auto_exchange(rows, W, a.d))}};
        row["baselines"] = {{"decode_all_gather_combine", t[1].median_us}};
        report.add_row(row);
        if (me == 0)
            std::printf(
                "sp W=%d batch %4d kv %7lld: sp_decode %8.1f us  decode+all_gather+combine %8.1f us  local decode "
                "%8.1f us  payload all_gather (%s) %6.1f us  packets %8.1f us  direct %8.1f us  two shots %8.1f us  "
                "max|dO| %.1e\n",
                W, B, static_cast<long long>(S), t[0].median_us, t[1].median_us, t[2].median_us,
                loom::to_string(ag_algo), t[6].median_us, t[3].median_us, t[4].median_us, t[5].median_us, diff);
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
        w.barrier();
        w.free(ll_out);
        w.free(gathered);
    }
    if (me == 0) report.write((a.out.empty() ? std::string(".") : a.out) + "/sp_decode_attention.json");
}

}  // namespace

int main(int argc, char** argv) {
    Args a;
    a.argc = argc;
    a.argv = argv;
    CLI::App app{"bench-attention: decode_attention (decode) and sp_decode_attention (sp, under loomrun)"};
    app.add_option("mode", a.mode, "decode or sp")->required()->check(CLI::IsMember({"decode", "sp"}));
    app.add_option("--out", a.out, "output directory of the JSON report");
    app.add_flag("--quick", a.quick, "fewer timed runs per point (10)");
    app.add_flag("--sweep", a.sweep,
                 "decode: time every kernel shape against the heuristic's pick (defaults: --head-pairs 96,12,32,8 "
                 "--batch 1,16,64 --kv 8192,32768,131072 --pages 0,1,16 --iters 5)");
    app.add_option("--head-pairs", a.head_pairs, "decode --sweep: q heads, kv heads pairs")
        ->delimiter(',')
        ->check(CLI::PositiveNumber);
    app.add_option("--pages", a.pages, "decode --sweep: layouts, 0 contiguous or a page size")
        ->delimiter(',')
        ->check(CLI::Range(0, 256));
    app.add_option("--splits", a.split_counts, "decode --sweep: also time the heuristic's shape at these KV splits")
        ->delimiter(',')
        ->check(CLI::Range(1, 256));
    app.add_option("--iters", a.iters, "timed runs per point")->capture_default_str()->check(CLI::PositiveNumber);
    app.add_option("--batch", a.batches, "decode: batch sizes")->delimiter(',')->check(CLI::PositiveNumber);
    app.add_option("--kv", a.kv_lens, "decode: KV lengths")->delimiter(',')->check(CLI::PositiveNumber);
    app.add_option("--sp-shapes", a.sp_shapes, "sp: batch,total-KV pairs")->delimiter(',')->check(CLI::PositiveNumber);
    app.add_option("--hq", a.hq, "query heads")->capture_default_str()->check(CLI::PositiveNumber);
    app.add_option("--hkv", a.hkv, "KV heads")->capture_default_str()->check(CLI::PositiveNumber);
    app.add_option("--d", a.d, "head dim (64, 128, 256)")->capture_default_str()->check(CLI::IsMember({64, 128, 256}));
    app.add_option("--page", a.page, "decode: page size of the paged cache")
        ->capture_default_str()
        ->check(CLI::Range(1, 256));
    app.add_option("--peak-gbps", a.peak_gbps, "HBM bandwidth the fraction is of (H200: 4300)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    loom::bench::parse_or_exit(app, argc, argv);
    if (a.quick && app.count("--iters") == 0) a.iters = 10;
    if (a.sweep) {
        if (app.count("--batch") == 0) a.batches = {1, 16, 64};
        if (app.count("--kv") == 0) a.kv_lens = {8192, 32768, 131072};
        if (app.count("--iters") == 0) a.iters = 5;
    }
    if (a.sp_shapes.size() % 2 != 0) {
        std::fprintf(stderr, "bench-attention: expected --sp-shapes as batch,kv pairs, given %zu numbers\n",
                     a.sp_shapes.size());
        return 2;
    }
    if (!loom::driver::available()) {
        std::printf("no GPU: %s\n", loom::driver::unavailable_reason().c_str());
        return 1;
    }
    try {
        cudaStream_t s;
        LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        if (a.mode == "decode" && a.sweep) {
            bench_decode_sweep(a, s);
        } else if (a.mode == "decode") {
            bench_decode(a, s);
        } else {
            auto w = loom::World::from_env();
            bench_sp(w, a, s);
            LOOM_CHECK_CUDA(cudaDeviceSynchronize());
            w.barrier();
            loom::release_attention_state(w);
            loom::release_collective_state(w);
        }
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench-attention: %s\n", e.what());
        return 1;
    }
}
