// loom::sp_decode_attention at any world size (ranks may share one GPU): each sequence's KV cut at random points into
// one uneven shard per rank (some rank holding 0 tokens of some sequence; one sequence empty everywhere), each rank's
// shard a paged or contiguous cache of its own; every rank's O and LSE against the fp64 reference over the whole KV,
// every element; 1000 back-to-back calls alternating two queries and outputs, checked as they go; CUDA-graph capture
// and replay bitwise equal to the eager calls. Every exchange of the partials (LL packets; direct: plain fp32 and
// per-block flags; two shots: each rank combines a share of the rows and sends them back) on the same cases. Verdicts
// are all-gathered so every rank fails together.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/attention_reference.hpp"
#include "common/device_io.hpp"
#include "common/reference.hpp"
#include "common/test_env.hpp"
#include "loom/ops/attention.hpp"
#include "loom/runtime/error.hpp"
#include "ops/attention/decode_plan.hpp"

namespace loom {
namespace {

struct Dev {
    void* p = nullptr;
    std::size_t bytes = 0;
    explicit Dev(std::size_t n) : bytes(n) { test::cuda_or_die(cudaMalloc(&p, n ? n : 16), "cudaMalloc"); }
    template <class T>
    explicit Dev(const std::vector<T>& v) : Dev(v.size() * sizeof(T)) {
        test::upload(p, v);
    }
    ~Dev() { cudaFree(p); }
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
};

// The whole KV (contiguous, the same on every rank) and this rank's shard of it as its own cache.
struct Sharded {
    test::HostCache whole, mine;
};

Sharded shard(const std::vector<int32_t>& lens, int hkv, int d, int page_size, DType t, int rank, int world,
              uint64_t seed) {
    std::mt19937_64 rng(test::run_seed(seed));
    Sharded s;
    s.whole = test::make_cache(lens, hkv, d, 0, t, rng);
    // Cuts: W - 1 random points per sequence; sequence 0's last rank holds nothing, sequence 1 goes wholly to rank 0.
    std::vector<int32_t> lo(lens.size()), hi(lens.size());
    for (std::size_t b = 0; b < lens.size(); ++b) {
        std::vector<int32_t> cuts = {0, lens[b]};
        for (int i = 1; i < world; ++i) cuts.push_back(static_cast<int32_t>(rng() % (lens[b] + 1)));
        if (b == 0 && world > 1) cuts.push_back(lens[b]), cuts.erase(cuts.begin() + 2);
        std::sort(cuts.begin(), cuts.end());
        if (b == 1) cuts.assign(world + 1, lens[b]), cuts[0] = 0;
        lo[b] = cuts[rank];
        hi[b] = cuts[rank + 1];
    }
    std::vector<int32_t> my_lens(lens.size());
    for (std::size_t b = 0; b < lens.size(); ++b) my_lens[b] = hi[b] - lo[b];
    std::mt19937_64 rng2(test::run_seed(seed * 31 + rank));
    s.mine = test::make_cache(my_lens, hkv, d, page_size, t, rng2);
    // Copy the shard's tokens from the whole cache.
    for (std::size_t b = 0; b < lens.size(); ++b)
        for (int j = 0; j < my_lens[b]; ++j)
            for (int h = 0; h < hkv; ++h) {
                const std::size_t from = s.whole.offset(static_cast<int>(b), lo[b] + j, h);
                const std::size_t to = s.mine.offset(static_cast<int>(b), j, h);
                std::memcpy(&s.mine.k[to], &s.whole.k[from], std::size_t(d) * 2);
                std::memcpy(&s.mine.v[to], &s.whole.v[from], std::size_t(d) * 2);
            }
    return s;
}

// Where the result differs from the reference ("" when it matches).
std::string check(const std::vector<char>& out, const std::vector<char>& lse, const std::vector<double>& ro,
                  const std::vector<double>& rl, int d, DType t) {
    const double otol = t == DType::BF16 ? 1.2e-2 : 4e-3;
    for (std::size_t r = 0; r < rl.size(); ++r) {
        float l;
        std::memcpy(&l, lse.data() + r * 4, 4);
        const bool ok =
            std::isinf(rl[r]) ? (std::isinf(l) && l < 0) : std::abs(l - rl[r]) <= 2e-3 + 2e-4 * std::abs(rl[r]);
        if (!ok) return "row " + std::to_string(r) + " lse " + std::to_string(l) + " expected " + std::to_string(rl[r]);
        for (int e = 0; e < d; ++e) {
            uint16_t h;
            std::memcpy(&h, out.data() + (r * d + e) * 2, 2);
            const double got = test::half_bits_to_float(h, t), want = ro[r * d + e];
            if (!(std::abs(got - want) <= otol * (0.25 + std::abs(want))))
                return "row " + std::to_string(r) + " col " + std::to_string(e) + ": " + std::to_string(got) +
                       " expected " + std::to_string(want);
        }
    }
    return "";
}

struct SpCase {
    std::vector<int32_t> lens;
    int hq, hkv, d, page_size;
    DType t = DType::BF16;
    int64_t max_seq_len = 0;  // DecodeOptions::max_seq_len, the same on every rank
};

class SpDecode : public ::WorldStreamTest {
  protected:
    void TearDown() override {
        if (w) release_attention_state(*w);
        ::WorldStreamTest::TearDown();
    }

    // Runs `calls` calls alternating two queries (q0, q1) into two outputs; checks both against the reference.
    void run(const SpCase& c, uint64_t seed, int calls = 1, bool graph = false,
             attention::SpExchange exchange = attention::SpExchange::Auto) {
        const int me = w->rank(), W = w->world_size();
        const Sharded s = shard(c.lens, c.hkv, c.d, c.page_size, c.t, me, W, seed);
        std::mt19937_64 rng(test::run_seed(seed + 99));  // the same queries on every rank
        const int B = static_cast<int>(c.lens.size());
        const std::size_t rows = std::size_t(B) * c.hq;
        const auto q0 = test::random_halves(rows * c.d, c.t, rng), q1 = test::random_halves(rows * c.d, c.t, rng);
        Dev dq0(q0), dq1(q1), dk(s.mine.k), dv(s.mine.v), dl(s.mine.lens), dtab(s.mine.block_table);
        Dev o0(rows * c.d * 2), o1(rows * c.d * 2), l0(rows * 4), l1(rows * 4);
        for (Dev* b : {&o0, &o1, &l0, &l1}) test::poison_nan(b->p, b->bytes);
        KvCache kv;
        kv.k = dk.p;
        kv.v = dv.p;
        kv.num_kv_heads = c.hkv;
        kv.seq_lens = static_cast<const int32_t*>(dl.p);
        if (c.page_size == 0) {
            kv.max_seq_len = s.mine.max_seq_len;
        } else {
            kv.block_table = static_cast<const int32_t*>(dtab.p);
            kv.max_pages = s.mine.max_pages;
            kv.num_pages = s.mine.num_pages;
            kv.page_size = c.page_size;
        }
        // The whole KV's maximum length bounds every shard's: the same splits on every rank is not needed, but the
        // same options are.
        const DecodeQuery dq0v{dq0.p, c.t, B, c.hq, c.d}, dq1v{dq1.p, c.t, B, c.hq, c.d};
        DecodeOptions opts;
        opts.max_seq_len = c.max_seq_len;
        auto call = [&](int i) {
            if (i % 2 == 0) {
                attention::sp_decode_exchange(*w, dq0v, kv, o0.p, static_cast<float*>(l0.p), stream, opts, exchange);
            } else {
                attention::sp_decode_exchange(*w, dq1v, kv, o1.p, static_cast<float*>(l1.p), stream, opts, exchange);
            }
        };
        std::vector<double> r0o, r0l, r1o, r1l;
        test::reference_decode(q0, c.hq, s.whole, c.t, 1.0 / std::sqrt(double(c.d)), 0, r0o, r0l);
        test::reference_decode(q1, c.hq, s.whole, c.t, 1.0 / std::sqrt(double(c.d)), 0, r1o, r1l);
        std::string verdict;
        auto verify = [&](int last) {
            test::sync_or_die(stream);
            if (!verdict.empty()) return;
            verdict = check(test::download(o0.p, o0.bytes), test::download(l0.p, l0.bytes), r0o, r0l, c.d, c.t);
            if (verdict.empty() && last >= 1)
                verdict = check(test::download(o1.p, o1.bytes), test::download(l1.p, l1.bytes), r1o, r1l, c.d, c.t);
            if (!verdict.empty()) verdict = "after call " + std::to_string(last) + ": " + verdict;
        };
        // Verified after call 0, every 250th and the last, each verification reading the outputs of its call and the
        // one before (call i writes o[i % 2], l[i % 2]); those two calls' outputs are poisoned just before each runs,
        // so a call that writes nothing fails.
        auto verified = [&](int i) { return i == 0 || i % 250 == 249 || i == calls - 1; };
        Dev* const outputs_of[2][2] = {{&o0, &l0}, {&o1, &l1}};  // call i writes outputs_of[i % 2]
        for (int i = 0; i < calls; ++i) {
            if (verified(i) || (i + 1 < calls && verified(i + 1)))
                for (Dev* b : outputs_of[i % 2]) test::poison_nan(b->p, b->bytes);
            call(i);
            if (verified(i)) verify(i);
        }
        if (graph) {
            const auto eager0 = test::download(o0.p, o0.bytes), eager1 = test::download(o1.p, o1.bytes);
            for (Dev* b : {&o0, &o1}) test::poison_nan(b->p, b->bytes);
            cudaGraph_t g;
            test::cuda_or_die(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
            for (int i = 0; i < 10; ++i) call(i);
            test::cuda_or_die(cudaStreamEndCapture(stream, &g), "end capture");
            cudaGraphExec_t ge;
            test::cuda_or_die(cudaGraphInstantiate(&ge, g, 0), "instantiate");
            for (int i = 0; i < 20; ++i) test::cuda_or_die(cudaGraphLaunch(ge, stream), "graph launch");
            test::sync_or_die(stream);
            if (verdict.empty() &&
                (test::download(o0.p, o0.bytes) != eager0 || test::download(o1.p, o1.bytes) != eager1))
                verdict = "graph replay differs from the eager calls";
            cudaGraphExecDestroy(ge);
            cudaGraphDestroy(g);
        }
        const std::string all = test::agree(*w, verdict, "sp_decode/" + std::to_string(seed));
        EXPECT_TRUE(all.empty()) << all;
    }
};

using attention::SpExchange;

TEST_F(SpDecode, UnevenShardsPaged16) {
    for (SpExchange x : {SpExchange::Packets, SpExchange::Direct, SpExchange::TwoShot})
        run({{3000, 500, 0, 17, 4097}, 32, 8, 128, 16}, 1, 1, false, x);
}
// The whole KV's longest sequence as DecodeOptions::max_seq_len on every rank: past the shorter shards' capacities
// (sequence 1 is all on rank 0, the others hold none of it), each rank bounds its own shard by its capacity.
TEST_F(SpDecode, OneMaxSeqLenOverUnevenShards) {
    for (int page : {0, 16})
        run({{3000, 500, 0, 17, 4097}, 32, 8, 128, page, DType::BF16, 4097}, 7, 1, false, SpExchange::Auto);
}
TEST_F(SpDecode, ContiguousMhaFp16) {
    for (SpExchange x : {SpExchange::Packets, SpExchange::Direct, SpExchange::TwoShot})
        run({{1000, 64, 2}, 8, 8, 64, 0, DType::F16}, 2, 1, false, x);
}
TEST_F(SpDecode, PageOneMqaD256) {
    for (SpExchange x : {SpExchange::Packets, SpExchange::Direct, SpExchange::TwoShot})
        run({{700, 9, 300}, 8, 1, 256, 1}, 3, 1, false, x);
}
TEST_F(SpDecode, ManyRowsTakeSeveralLaunches) {
    // 64 x 64 rows: as packets (65 per row) more than one launch's regions (kSpMaxBlocks x 31 rows); Auto takes the
    // direct exchange, whose one launch holds them (kSpMaxBlocks x 63 rows).
    std::vector<int32_t> lens(64);
    for (int i = 0; i < 64; ++i) lens[i] = 50 + 17 * i;
    for (SpExchange x : {SpExchange::Packets, SpExchange::Auto}) run({lens, 64, 8, 128, 16}, 4, 1, false, x);
}
TEST_F(SpDecode, DirectManyRowsTakeSeveralLaunches) {
    // 80 x 64 rows of D 256: more than one direct launch's regions (kSpMaxBlocks x 31 rows).
    std::vector<int32_t> lens(80);
    for (int i = 0; i < 80; ++i) lens[i] = 1 + 7 * i;
    run({lens, 64, 8, 256, 0}, 7, 3, false, SpExchange::Direct);
}
TEST_F(SpDecode, TwoShotManyRowsTakeSeveralLaunches) {
    // 200 x 64 rows of D 256: more than one two-shot launch's regions at up to 4 ranks (kSpMaxBlocks x 21 rows per
    // rank); Auto takes two shots from 2 ranks (13 MB per peer in the direct exchange). Short sequences: the fp64
    // reference of 12800 rows.
    std::vector<int32_t> lens(200);
    for (int i = 0; i < 200; ++i) lens[i] = 1 + (7 * i) % 61;
    for (SpExchange x : {SpExchange::TwoShot, SpExchange::Auto}) run({lens, 64, 8, 256, 0}, 8, 2, false, x);
}
TEST_F(SpDecode, ThousandBackToBackCalls) {
    for (SpExchange x : {SpExchange::Packets, SpExchange::Direct, SpExchange::TwoShot})
        run({{2000, 100, 3}, 32, 8, 128, 16}, 5, 1000, false, x);
}
TEST_F(SpDecode, GraphCaptureReplays) {
    for (SpExchange x : {SpExchange::Packets, SpExchange::Direct, SpExchange::TwoShot})
        run({{1200, 77}, 16, 4, 128, 0}, 6, 2, /*graph=*/true, x);
}

TEST_F(SpDecode, BadInputsRaiseOnEveryRank) {
    Dev buf(1 << 20), lens(std::vector<int32_t>{1});
    KvCache kv;
    kv.k = kv.v = buf.p;
    kv.num_kv_heads = 3;
    kv.max_seq_len = 8;
    kv.seq_lens = static_cast<const int32_t*>(lens.p);
    std::string verdict = "no error";
    try {
        sp_decode_attention(*w, {buf.p, DType::BF16, 1, 8, 128}, kv, buf.p, nullptr, stream);
    } catch (const Error& e) {
        verdict = std::string(e.what()).find("integral GQA group") != std::string::npos ? "" : e.what();
    }
    const std::string all = test::agree(*w, verdict, "sp_decode/bad");
    EXPECT_TRUE(all.empty()) << all;
}

}  // namespace
}  // namespace loom
