// loom::ep_ll_dispatch / ep_ll_combine (low-latency expert parallelism) at any world size (ranks may share one GPU),
// on one node or several (LOOM_NODE_SIZE splits the ranks into nodes whose peers are reached through NVSHMEM).
// Every rank builds every rank's inputs from the seed (tokens per rank, rows, routing, weights), so each checks what it
// received without exchanging anything: per (local expert, source rank) the count and the multiset of source entries
// against the routing, every row against its source token (bf16: bitwise; fp8: each scale = the block's amax / 448
// and each element within e4m3's rounding), and combine(identity experts(dispatch(x))) against x x (sum of the
// token's weights) for every element. Routings: uniform, skewed, all tokens to one expert, experts with no tokens,
// unused slots, top-k within one rank, T = 0 / 1 / max_tokens; H 2048..7168, k 1..8, E up to 256. 10^4 back-to-back
// dispatch + combine pairs over three rotating input sets (so that a call reading the other parity's stale data
// fails), CUDA-graph replay bitwise equal to the eager calls, the return-without-waiting halves, the device traps
// (child processes) and the host checks. Verdicts are all-gathered so every rank fails together.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/child_process.hpp"
#include "common/device_io.hpp"
#include "common/reference.hpp"
#include "common/test_env.hpp"
#include "loom/bf16.hpp"
#include "loom/ops/moe_ep_ll.hpp"
#include "loom/runtime/error.hpp"

namespace loom {
namespace {

// Device memory from cudaMalloc, or (given a World) from its symmetric heap: collective, freed in the same order.
struct Dev {
    void* p = nullptr;
    std::size_t bytes = 0;
    World* heap = nullptr;
    explicit Dev(std::size_t n, World* world = nullptr) : bytes(n), heap(world) {
        if (heap != nullptr)
            p = heap->alloc_bytes(n ? n : 16);
        else
            test::cuda_or_die(cudaMalloc(&p, n ? n : 16), "cudaMalloc");
    }
    template <class T>
    explicit Dev(const std::vector<T>& v) : Dev(v.size() * sizeof(T)) {
        test::upload(p, v);
    }
    ~Dev() {
        if (heap != nullptr)
            heap->free(p);
        else
            cudaFree(p);
    }
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
};

template <class T>
std::vector<T> fetch(const void* p, std::size_t n) {
    std::vector<T> v(n);
    if (n) test::cuda_or_die(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return v;
}

enum class Routing {
    Uniform,    // k distinct experts, uniformly
    Skewed,     // k distinct experts, most entries into experts 0..3
    OneExpert,  // every entry to expert E - 1 (k = 1)
    EvenOnly,   // only even experts; odd experts receive nothing; some slots -1
    OneRank,    // a token's k experts all on one rank (k <= L)
};

struct Case {
    int max_tokens, hidden, topk, experts;
    Routing routing;
    std::vector<int> tokens;  // T of rank r: tokens[r % size]
};

// One rank's inputs, the same on every rank for a (case, rank, seed).
struct Inputs {
    int T = 0;
    std::vector<uint16_t> x;   // [T, H] bf16
    std::vector<int32_t> idx;  // [T, k]
    std::vector<float> w;      // [T, k]
};

Inputs make_inputs(const Case& c, int rank, int world, uint64_t seed) {
    std::mt19937_64 rng(test::run_seed(seed * 1000003 + rank));
    Inputs in;
    in.T = std::min(c.tokens[rank % c.tokens.size()], c.max_tokens);
    const int H = c.hidden, k = c.topk, E = c.experts, L = E / world;
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_real_distribution<float> ud(-1.f, 1.f);
    in.x.resize(std::size_t(in.T) * H);
    for (std::size_t i = 0; i < in.x.size(); ++i) {
        // Rows at different scales, some elements much larger than their block: the per-128 scales matter.
        const int t = static_cast<int>(i / H);
        float v = nd(rng) * std::ldexp(1.f, (t % 7) - 3);
        if (rng() % 97 == 0) v *= 40.f;
        in.x[i] = float_to_bf16(v);
    }
    if (in.T > 0 && H >= 256) std::fill(in.x.begin(), in.x.begin() + 128, float_to_bf16(0.f));  // an all-zero block
    in.idx.assign(std::size_t(in.T) * k, -1);
    in.w.resize(std::size_t(in.T) * k);
    for (auto& v : in.w) v = ud(rng);
    for (int t = 0; t < in.T; ++t) {
        int32_t* row = in.idx.data() + std::size_t(t) * k;
        auto distinct = [&](auto draw) {
            for (int s = 0; s < k; ++s) {
                int32_t e;
                do e = draw();
                while (std::find(row, row + s, e) != row + s);
                row[s] = e;
            }
        };
        switch (c.routing) {
            case Routing::Uniform:
                distinct([&] { return static_cast<int32_t>(rng() % E); });
                break;
            case Routing::Skewed:
                distinct([&] {
                    return static_cast<int32_t>(rng() % 5 != 0 ? rng() % std::min(E, std::max(4, k)) : rng() % E);
                });
                break;
            case Routing::OneExpert:
                for (int s = 0; s < k; ++s) row[s] = s == 0 ? E - 1 : -1;
                break;
            case Routing::EvenOnly:
                distinct([&] { return static_cast<int32_t>((rng() % (E / 2)) * 2); });
                for (int s = 0; s < k; ++s)
                    if (rng() % 5 == 0) row[s] = -1;
                break;
            case Routing::OneRank: {
                const int r = static_cast<int>(rng() % world);
                distinct([&] { return static_cast<int32_t>(r * L + rng() % L); });
                break;
            }
        }
    }
    return in;
}

// e4m3 code -> value (bias 7, no infinities; 0x7f / 0xff are NaN).
double e4m3(uint8_t b) {
    const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return std::nan("");
    const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
    return s ? -v : v;
}

struct RecvHost {
    std::vector<char> x;
    std::vector<float> scales;
    std::vector<int32_t> src_info, counts;
};

// This rank's received entries against every source rank's inputs ("" when they match).
std::string check_dispatch(const Case& c, const std::vector<Inputs>& all, const RecvHost& r, int me, int world,
                           bool fp8) {
    const int M = c.max_tokens, H = c.hidden, k = c.topk, L = c.experts / world, sb = H / 128;
    const std::size_t payload = fp8 ? H : 2 * std::size_t(H);
    for (int le = 0; le < L; ++le)
        for (int s = 0; s < world; ++s) {
            const std::string at = "local expert " + std::to_string(le) + " from rank " + std::to_string(s) + ": ";
            std::vector<int32_t> want;
            for (std::size_t j = 0; j < all[s].idx.size(); ++j)
                if (all[s].idx[j] == me * L + le) want.push_back(static_cast<int32_t>(j));
            const int got_n = r.counts[std::size_t(le) * world + s];
            if (got_n != static_cast<int>(want.size()))
                return at + "count " + std::to_string(got_n) + ", expected " + std::to_string(want.size());
            const std::size_t slot0 = (std::size_t(le) * world + s) * M;
            std::vector<int32_t> got(r.src_info.begin() + slot0, r.src_info.begin() + slot0 + got_n);
            std::sort(got.begin(), got.end());
            if (got != want) return at + "the source entries differ from the routing's";
            for (int i = 0; i < got_n; ++i) {
                const std::size_t slot = slot0 + i;
                const int t = r.src_info[slot] / k;
                const uint16_t* x = all[s].x.data() + std::size_t(t) * H;
                const char* row = r.x.data() + slot * payload;
                if (!fp8) {
                    if (std::memcmp(row, x, payload) != 0) return at + "row of token " + std::to_string(t) + " differs";
                    continue;
                }
                for (int b = 0; b < sb; ++b) {
                    float amax = 0.f;
                    for (int j = 0; j < 128; ++j) amax = std::max(amax, std::abs(bf16_to_float(x[b * 128 + j])));
                    const float scale = std::max(amax, 1e-4f) / 448.f;
                    const float got_scale = r.scales[slot * sb + b];
                    if (!(std::abs(got_scale - scale) <= 1e-6f * scale))
                        return at + "token " + std::to_string(t) + " block " + std::to_string(b) + ": scale " +
                               std::to_string(got_scale) + ", expected " + std::to_string(scale);
                    for (int j = 0; j < 128; ++j) {
                        const double want_v = bf16_to_float(x[b * 128 + j]);
                        const double v = e4m3(static_cast<uint8_t>(row[b * 128 + j])) * got_scale;
                        if (!(std::abs(v - want_v) <= std::abs(want_v) / 16 + scale / 512.0 + 1e-7 * std::abs(want_v)))
                            return at + "token " + std::to_string(t) + " element " + std::to_string(b * 128 + j) +
                                   ": " + std::to_string(v) + ", expected " + std::to_string(want_v);
                    }
                }
            }
        }
    return "";
}

// y of this rank against x x (sum of each token's used weights): bf16 rounding, plus e4m3's when fp8.
std::string check_combine(const Case& c, const Inputs& in, const std::vector<uint16_t>& y, bool fp8) {
    const int H = c.hidden, k = c.topk;
    for (int t = 0; t < in.T; ++t) {
        double wsum = 0, wabs = 0;
        for (int s = 0; s < k; ++s)
            if (in.idx[std::size_t(t) * k + s] >= 0) {
                wsum += in.w[std::size_t(t) * k + s];
                wabs += std::abs(in.w[std::size_t(t) * k + s]);
            }
        for (int b = 0; b < H / 128; ++b) {
            double amax = 0;
            for (int j = 0; j < 128; ++j)
                amax = std::max(amax, double(std::abs(bf16_to_float(in.x[std::size_t(t) * H + b * 128 + j]))));
            for (int j = 0; j < 128; ++j) {
                const std::size_t i = std::size_t(t) * H + b * 128 + j;
                const double x = bf16_to_float(in.x[i]), want = x * wsum;
                const double got = bf16_to_float(y[i]);
                // fp8: each expert row within |x| / 16 + scale / 512 (then bf16); bf16: rows exact; then the fp32 sum
                // and the bf16 output.
                const double row_err = fp8 ? wabs * (std::abs(x) / 16 + (amax / 448) / 512 + std::abs(x) / 256) : 0;
                const double tol = row_err + std::abs(want) / 256 + wabs * std::abs(x) * 1e-6 + 1e-30;
                if (!(std::abs(got - want) <= tol))
                    return "y[" + std::to_string(t) + ", " + std::to_string(b * 128 + j) +
                           "] = " + std::to_string(got) + ", expected " + std::to_string(want) + " (tolerance " +
                           std::to_string(tol) + ")";
            }
        }
    }
    return "";
}

// One input set on the device: the inputs, a receive layout, identity expert outputs and y.
struct DevSet {
    Inputs in;
    std::unique_ptr<Dev> x, idx, w, rx, rs, ri, rc, eo, y;
    EpLowLatencyRecv recv() const {
        return {rx->p, static_cast<float*>(rs->p), static_cast<int32_t*>(ri->p), static_cast<int32_t*>(rc->p)};
    }
};

class EpLl : public ::WorldStreamTest {
  protected:
    void TearDown() override {
        if (w) release_ep_ll_state(*w);
        ::WorldStreamTest::TearDown();
    }

    EpLowLatencyShape shape(const Case& c) const { return {c.max_tokens, c.hidden, c.topk, c.experts}; }

    std::vector<Inputs> all_inputs(const Case& c, uint64_t seed) const {
        std::vector<Inputs> all;
        for (int r = 0; r < w->world_size(); ++r) all.push_back(make_inputs(c, r, w->world_size(), seed));
        return all;
    }

    // sym: the receive layout (x, scales, src_info) and expert_out in the symmetric heap (a dispatch with
    // options.recv_in_heap writes into them directly; a combine reading expert_out there pulls).
    DevSet upload(const Case& c, const Inputs& in, bool fp8, bool sym = false) const {
        const EpLowLatencyShape s = shape(c);
        const int W = w->world_size();
        DevSet d;
        d.in = in;
        d.x = std::make_unique<Dev>(in.x);
        d.idx = std::make_unique<Dev>(in.idx);
        d.w = std::make_unique<Dev>(in.w);
        d.rx = std::make_unique<Dev>(ep_ll_recv_x_bytes(s, W, fp8), sym ? w : nullptr);
        d.rs = std::make_unique<Dev>(ep_ll_recv_scales_bytes(s, W), sym ? w : nullptr);
        d.ri = std::make_unique<Dev>(ep_ll_recv_src_info_bytes(s, W), sym ? w : nullptr);
        d.rc = std::make_unique<Dev>(ep_ll_recv_counts_bytes(s, W));
        d.eo = std::make_unique<Dev>(ep_ll_recv_x_bytes(s, W, false), sym ? w : nullptr);
        d.y = std::make_unique<Dev>(std::size_t(in.T) * c.hidden * 2);
        for (Dev* b : {d.rx.get(), d.rs.get(), d.ri.get(), d.rc.get(), d.eo.get(), d.y.get()})
            test::poison(b->p, b->bytes);
        return d;
    }

    MatrixView xv(const Case& c, const DevSet& d) const { return {d.x->p, DType::BF16, d.in.T, c.hidden, 0}; }
    MatrixView yv(const Case& c, const DevSet& d) const { return {d.y->p, DType::BF16, d.in.T, c.hidden, 0}; }
    MatrixView eov(const Case& c, const void* p) const {
        const int W = w->world_size();
        return {const_cast<void*>(p), DType::BF16, int64_t(c.experts / W) * W * c.max_tokens, c.hidden, 0};
    }

    RecvHost download_recv(const Case& c, const DevSet& d, bool fp8) const {
        const EpLowLatencyShape s = shape(c);
        const int W = w->world_size();
        RecvHost r;
        r.x = test::download(d.rx->p, ep_ll_recv_x_bytes(s, W, fp8));
        if (fp8) r.scales = fetch<float>(d.rs->p, ep_ll_recv_scales_bytes(s, W) / 4);
        r.src_info = fetch<int32_t>(d.ri->p, ep_ll_recv_src_info_bytes(s, W) / 4);
        r.counts = fetch<int32_t>(d.rc->p, ep_ll_recv_counts_bytes(s, W) / 4);
        return r;
    }

    // Identity experts: expert_out rows = the received rows as bf16 (fp8: code x scale, rounded to bf16).
    std::vector<uint16_t> identity_experts(const Case& c, const RecvHost& r, bool fp8) const {
        const int W = w->world_size(), H = c.hidden, sb = H / 128;
        const std::size_t slots = std::size_t(c.experts / W) * W * c.max_tokens;
        std::vector<uint16_t> eo(slots * H, float_to_bf16(std::nanf("")));
        for (std::size_t pr = 0; pr < r.counts.size(); ++pr)
            for (int i = 0; i < r.counts[pr]; ++i) {
                const std::size_t slot = pr * c.max_tokens + i;
                for (int j = 0; j < H; ++j) {
                    if (fp8) {
                        eo[slot * H + j] = float_to_bf16(static_cast<float>(
                            e4m3(static_cast<uint8_t>(r.x[slot * H + j])) * r.scales[slot * sb + j / 128]));
                    } else {
                        std::memcpy(&eo[slot * H + j], r.x.data() + (slot * H + j) * 2, 2);
                    }
                }
            }
        return eo;
    }

    // dispatch -> check -> identity experts -> combine -> check, in fp8 and bf16; direct: the receive layout in the
    // symmetric heap, written by the senders (options.recv_in_heap).
    void run(const Case& c, uint64_t seed, bool hooked = false, std::vector<bool> modes = {true, false},
             bool direct = false) {
        const int me = w->rank(), W = w->world_size();
        const auto all = all_inputs(c, seed);
        std::string verdict;
        for (bool fp8 : modes) {
            if (!verdict.empty()) break;
            DevSet d = upload(c, all[me], fp8, direct);
            EpLowLatencyOptions o;
            o.fp8 = fp8;
            o.return_without_waiting = hooked;
            o.recv_in_heap = direct && w->num_nodes() == 1;  // across nodes: the op's buffers (checked below)
            ep_ll_dispatch(*w, xv(c, d), static_cast<int32_t*>(d.idx->p), shape(c), d.recv(), stream, o);
            if (hooked) ep_ll_dispatch_wait(*w, stream);
            test::sync_or_die(stream);
            const RecvHost r = download_recv(c, d, fp8);
            verdict = check_dispatch(c, all, r, me, W, fp8);
            if (!verdict.empty()) {
                verdict = std::string(fp8 ? "fp8" : "bf16") + " dispatch: " + verdict;
                break;
            }
            // The expert outputs where each rank's combine pushes them (cudaMalloc), where it has them read
            // (symmetric heap), and the two mixed (even ranks' in the heap).
            const std::vector<uint16_t> eo = identity_experts(c, r, fp8);
            test::upload(d.eo->p, eo);
            Dev eo_sym(d.eo->bytes, w);
            test::upload(eo_sym.p, eo);
            const char* where[] = {"pushed", "pulled", "mixed"};
            for (int m = 0; m < 3; ++m) {  // every rank makes every call (collective), whatever it found
                const void* out = m == 1 || (m == 2 && me % 2 == 0) ? eo_sym.p : d.eo->p;
                test::poison(d.y->p, d.y->bytes);
                ep_ll_combine(*w, eov(c, out), static_cast<int32_t*>(d.idx->p), static_cast<float*>(d.w->p), shape(c),
                              d.recv(), yv(c, d), stream, o);
                if (hooked) ep_ll_combine_wait(*w, stream);
                test::sync_or_die(stream);
                const std::string v =
                    check_combine(c, d.in, fetch<uint16_t>(d.y->p, std::size_t(d.in.T) * c.hidden), fp8);
                if (verdict.empty() && !v.empty())
                    verdict = std::string(fp8 ? "fp8" : "bf16") + " combine (" + where[m] + "): " + v;
            }
            test::sync_or_die(stream);  // eo_sym's free is collective; every combine has completed
        }
        const std::string agreed = test::agree(*w, verdict, "ep_ll/" + std::to_string(seed));
        EXPECT_TRUE(agreed.empty()) << agreed;
    }
};

int experts_for(int world, int per_rank) { return world * per_rank; }

TEST_F(EpLl, UniformTop8) {
    const int W = w->world_size();
    run({64, 2048, 8, std::min(256, experts_for(W, 32 / std::max(1, W / 2))), Routing::Uniform, {64, 37, 1, 50}}, 1);
}
TEST_F(EpLl, SkewedTop4) { run({48, 4096, 4, experts_for(w->world_size(), 4), Routing::Skewed, {48, 0, 13}}, 2); }
TEST_F(EpLl, AllTokensToOneExpert) {
    run({32, 2048, 1, experts_for(w->world_size(), 2), Routing::OneExpert, {32, 5}}, 3);
}
TEST_F(EpLl, ExpertsWithNoTokensAndUnusedSlots) {
    run({40, 2560, 6, experts_for(w->world_size(), 16), Routing::EvenOnly, {40, 1, 0, 17}}, 4);
}
TEST_F(EpLl, TopkWithinOneRank) { run({24, 2048, 3, experts_for(w->world_size(), 4), Routing::OneRank, {24, 9}}, 5); }
TEST_F(EpLl, OneTokenTop1) { run({1, 2048, 1, experts_for(w->world_size(), 1), Routing::Uniform, {1, 0}}, 6); }
TEST_F(EpLl, DecodeShapeH7168E256) {
    const int W = w->world_size();
    if (256 % W != 0) GTEST_SKIP() << "E = 256 needs a world size dividing 256";
    // fp8 only: the bf16 dispatch area of this shape (two halves of 470 MB) does not fit beside the rest in the default
    // 1 GiB heap.
    run({128, 7168, 8, 256, Routing::Uniform, {128, 100}}, 7, false, {true});
}
TEST_F(EpLl, ReturnWithoutWaitingHalves) {
    run({32, 3072, 5, experts_for(w->world_size(), 6), Routing::Skewed, {32, 3}}, 8, true);
}
TEST_F(EpLl, DirectReceiveUniformTop8) {
    const int W = w->world_size();
    run({64, 2048, 8, std::min(256, experts_for(W, 32 / std::max(1, W / 2))), Routing::Uniform, {64, 37, 1, 50}}, 9,
        false, {true, false}, true);
}
TEST_F(EpLl, DirectReceiveSkewedWithoutWaiting) {
    run({32, 3072, 5, experts_for(w->world_size(), 6), Routing::Skewed, {32, 0, 3}}, 10, true, {true, false}, true);
}

// 10^4 dispatch + combine pairs (bf16, identity experts: expert_out is recv.x itself) over three input sets in turn,
// with no synchronisation between calls; the sets' results are checked every 1000 pairs. With three sets the parity
// of a call and its set differ from the call two before, so data left by that call is the wrong data. Sets 0 and 1
// live in the symmetric heap (the dispatch writes their receive layout directly, and the combine's token ranks read
// recv.x there while the next dispatches run), set 2 in cudaMalloc memory (copied in, pushed back). Each set's y is
// poisoned before its last pair ahead of a check (the receive buffers in the heap are the peers' to write).
TEST_F(EpLl, TenThousandBackToBackPairs) {
    const int me = w->rank(), W = w->world_size();
    const Case c{16, 2048, 4, experts_for(W, 4), Routing::Uniform, {16, 11, 16, 2}};
    std::vector<DevSet> sets;
    std::vector<std::vector<Inputs>> alls;
    for (int i = 0; i < 3; ++i) {
        alls.push_back(all_inputs(c, 100 + i));
        sets.push_back(upload(c, alls.back()[me], false, i < 2));
    }
    EpLowLatencyOptions o;
    o.fp8 = false;
    std::string verdict;
    for (int i = 0; i < 10000 && verdict.empty(); ++i) {
        const DevSet& d = sets[i % 3];
        if (i % 1000 >= 997) test::poison_nan(d.y->p, d.y->bytes);
        o.recv_in_heap = i % 3 < 2 && w->num_nodes() == 1;
        ep_ll_dispatch(*w, xv(c, d), static_cast<int32_t*>(d.idx->p), shape(c), d.recv(), stream, o);
        ep_ll_combine(*w, eov(c, d.rx->p), static_cast<int32_t*>(d.idx->p), static_cast<float*>(d.w->p), shape(c),
                      d.recv(), yv(c, d), stream, o);
        if (i % 1000 == 999) {
            test::sync_or_die(stream);
            for (int s = 0; s < 3 && verdict.empty(); ++s) {
                verdict = check_dispatch(c, alls[s], download_recv(c, sets[s], false), me, W, false);
                if (verdict.empty())
                    verdict = check_combine(c, sets[s].in,
                                            fetch<uint16_t>(sets[s].y->p, std::size_t(sets[s].in.T) * c.hidden), false);
                if (!verdict.empty())
                    verdict = "after pair " + std::to_string(i) + ", set " + std::to_string(s) + ": " + verdict;
            }
        }
    }
    const std::string agreed = test::agree(*w, verdict, "ep_ll/back-to-back");
    EXPECT_TRUE(agreed.empty()) << agreed;
}

// 10^4 fp8 dispatches back to back over three input sets, checked every 2500 calls; each set's receive buffers (this
// rank's own memory: the dispatch copies into them) are poisoned before its last call ahead of a check.
TEST_F(EpLl, TenThousandBackToBackFp8Dispatches) {
    const int me = w->rank(), W = w->world_size();
    const Case c{8, 2048, 8, experts_for(W, std::max(2, (8 + W - 1) / W)), Routing::Uniform, {8, 3}};
    std::vector<DevSet> sets;
    std::vector<std::vector<Inputs>> alls;
    for (int i = 0; i < 3; ++i) {
        alls.push_back(all_inputs(c, 200 + i));
        sets.push_back(upload(c, alls.back()[me], true));
    }
    std::string verdict;
    for (int i = 0; i < 10000 && verdict.empty(); ++i) {
        const DevSet& d = sets[i % 3];
        if (i % 2500 >= 2497)
            for (Dev* b : {d.rx.get(), d.rs.get(), d.ri.get(), d.rc.get()}) test::poison(b->p, b->bytes);
        ep_ll_dispatch(*w, xv(c, d), static_cast<int32_t*>(d.idx->p), shape(c), d.recv(), stream);
        if (i % 2500 == 2499) {
            test::sync_or_die(stream);
            for (int s = 0; s < 3 && verdict.empty(); ++s) {
                verdict = check_dispatch(c, alls[s], download_recv(c, sets[s], true), me, W, true);
                if (!verdict.empty())
                    verdict = "after call " + std::to_string(i) + ", set " + std::to_string(s) + ": " + verdict;
            }
        }
    }
    const std::string agreed = test::agree(*w, verdict, "ep_ll/back-to-back-fp8");
    EXPECT_TRUE(agreed.empty()) << agreed;
}

// A captured sequence of three pairs (bf16, identity experts; sets 0 and 2 received directly and pulled, set 1 copied
// and pushed) replayed 20 times:
// y bitwise equal to the eager calls' (the receive order within an expert may differ; the sums are in slot order),
// the receive layout still right.
TEST_F(EpLl, GraphCaptureReplays) {
    const int me = w->rank(), W = w->world_size();
    const Case c{24, 2048, 6, experts_for(W, 8), Routing::Skewed, {24, 7, 19}};
    std::vector<DevSet> sets;
    std::vector<std::vector<Inputs>> alls;
    for (int i = 0; i < 3; ++i) {
        alls.push_back(all_inputs(c, 300 + i));
        sets.push_back(upload(c, alls.back()[me], false, i != 1));
    }
    EpLowLatencyOptions o;
    o.fp8 = false;
    auto pairs = [&] {
        for (int i = 0; i < 3; ++i) {
            const DevSet& d = sets[i];
            o.recv_in_heap = i != 1 && w->num_nodes() == 1;
            ep_ll_dispatch(*w, xv(c, d), static_cast<int32_t*>(d.idx->p), shape(c), d.recv(), stream, o);
            ep_ll_combine(*w, eov(c, d.rx->p), static_cast<int32_t*>(d.idx->p), static_cast<float*>(d.w->p), shape(c),
                          d.recv(), yv(c, d), stream, o);
        }
    };
    pairs();  // eager (creates the state)
    test::sync_or_die(stream);
    std::vector<std::vector<char>> eager;
    for (const DevSet& d : sets) eager.push_back(test::download(d.y->p, d.y->bytes));
    for (const DevSet& d : sets) test::poison(d.y->p, d.y->bytes);
    cudaGraph_t g;
    test::cuda_or_die(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
    pairs();
    test::cuda_or_die(cudaStreamEndCapture(stream, &g), "end capture");
    cudaGraphExec_t ge;
    test::cuda_or_die(cudaGraphInstantiate(&ge, g, 0), "instantiate");
    for (int i = 0; i < 20; ++i) test::cuda_or_die(cudaGraphLaunch(ge, stream), "graph launch");
    test::sync_or_die(stream);
    std::string verdict;
    for (int s = 0; s < 3 && verdict.empty(); ++s) {
        if (test::download(sets[s].y->p, sets[s].y->bytes) != eager[s])
            verdict = "set " + std::to_string(s) + ": y of the replays differs from the eager calls";
        if (verdict.empty()) verdict = check_dispatch(c, alls[s], download_recv(c, sets[s], false), me, W, false);
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    const std::string agreed = test::agree(*w, verdict, "ep_ll/graph");
    EXPECT_TRUE(agreed.empty()) << agreed;
}

TEST_F(EpLl, BadInputsRaiseOnEveryRank) {
    const int W = w->world_size();
    const Case c{8, 2048, 2, experts_for(W, 2), Routing::Uniform, {8}};
    DevSet d = upload(c, make_inputs(c, w->rank(), W, 9), true);
    const EpLowLatencyShape s = shape(c);
    std::string verdict;
    auto expect_error = [&](const std::string& what, auto&& call) {
        try {
            call();
            if (verdict.empty()) verdict = "no error for " + what;
        } catch (const Error& e) {
            if (std::string(e.what()).find(what) == std::string::npos && verdict.empty())
                verdict = "expected '" + what + "', got: " + e.what();
        }
    };
    auto idx = static_cast<int32_t*>(d.idx->p);
    // Capacity: more tokens than max_tokens.
    expect_error("at most shape.max_tokens = 4", [&] {
        ep_ll_dispatch(*w, xv(c, d), idx, {4, c.hidden, c.topk, c.experts}, d.recv(), stream);
    });
    expect_error("shape.hidden", [&] { ep_ll_dispatch(*w, xv(c, d), idx, {8, 2000, 2, c.experts}, d.recv(), stream); });
    expect_error("x: expected 2048 columns", [&] {
        ep_ll_dispatch(*w, {d.x->p, DType::BF16, 4, 1024, 0}, idx, s, d.recv(), stream);
    });
    expect_error("x: expected bf16", [&] {
        ep_ll_dispatch(*w, {d.x->p, DType::F16, 4, 2048, 0}, idx, s, d.recv(), stream);
    });
    if (W > 1)
        expect_error("multiple of the world size", [&] {
            ep_ll_dispatch(*w, xv(c, d), idx, {8, 2048, 2, W + 1}, d.recv(), stream);
        });
    expect_error("recv.scales", [&] {
        EpLowLatencyRecv r = d.recv();
        r.scales = nullptr;
        ep_ll_dispatch(*w, xv(c, d), idx, s, r, stream);
    });
    expect_error("topk_idx", [&] { ep_ll_dispatch(*w, xv(c, d), nullptr, s, d.recv(), stream); });
    // d's receive layout is cudaMalloc memory; across nodes the option is refused first.
    expect_error(w->num_nodes() == 1 ? "recv.x: options.recv_in_heap expects"
                                     : "options.recv_in_heap: expected a World of one node",
                 [&] {
                     EpLowLatencyOptions direct;
                     direct.recv_in_heap = true;
                     ep_ll_dispatch(*w, xv(c, d), idx, s, d.recv(), stream, direct);
                 });
    expect_error("expert_out: expected a dense", [&] {
        ep_ll_combine(*w, {d.eo->p, DType::BF16, 3, c.hidden, 0}, idx, static_cast<float*>(d.w->p), s, d.recv(),
                      yv(c, d), stream);
    });
    expect_error("ep_ll_dispatch_wait: expected a pending dispatch", [&] { ep_ll_dispatch_wait(*w, stream); });
    // A hooked dispatch must be completed before the next one.
    EpLowLatencyOptions hook;
    hook.return_without_waiting = true;
    ep_ll_dispatch(*w, xv(c, d), idx, s, d.recv(), stream, hook);
    expect_error("call ep_ll_dispatch_wait first", [&] { ep_ll_dispatch(*w, xv(c, d), idx, s, d.recv(), stream); });
    ep_ll_dispatch_wait(*w, stream);
    test::sync_or_die(stream);
    const std::string agreed = test::agree(*w, verdict, "ep_ll/bad");
    EXPECT_TRUE(agreed.empty()) << agreed;
}

// Device-side errors trap (they end the CUDA context), so a one-rank World in a child process of rank 0 meets them:
// an expert id out of range, and more entries for one expert than max_tokens (each token names it twice).
TEST_F(EpLl, DeviceErrorsTrapWithNamedDiagnostics) {
    if (w->rank() == 0) {
        for (const char* which : {"ep-ll-bad-expert", "ep-ll-capacity"}) {
            const auto [status, output] = test::run_child(which, {});
            EXPECT_EQ(status, 3) << which << "\n" << output;
            const std::string tag = std::string(which) == "ep-ll-capacity"
                                        ? "ep_ll_dispatch expert capacity (max_tokens) topk_idx"
                                        : "ep_ll_dispatch topk_idx";
            EXPECT_NE(output.find(tag), std::string::npos) << which << "\n" << output;
        }
    }
    w->barrier("ep-ll-trap-children");
}

}  // namespace
}  // namespace loom
