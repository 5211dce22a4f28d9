// Overlapped GEMM + collectives (ag_gemm, gemm_rs, gemm_ar) against an fp64 CPU reference on every rank: fresh
// random inputs per rank (every rank regenerates its peers' inputs from their seeds), outputs poisoned with NaN,
// every element checked; rows per rank not a multiple of the tile; both AllGather producers (copy engine, SM
// with ld/st and TMA paths); 1000 back-to-back calls with inputs changing between calls, checked at a few
// points. A rank's verdict is all-gathered through the store so that every rank fails together (never a hang).
// Run under loomrun at 2, 4 and 8 ranks (ranks may share one GPU under MPS).
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/device_io.hpp"
#include "common/reference.hpp"
#include "common/scoped_env.hpp"
#include "common/test_env.hpp"
#include "loom/jit/jit.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "ops/collectives/coll_choice.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "ops/overlap/common/state.hpp"
#include "ops/overlap/gemm_rs/gemm_rs.hpp"
#include "runtime/settings_override.hpp"

namespace loom {
namespace {

std::uint64_t seed_of(int rank, int tc, int what, int set = 0) {
    return 0x9e3779b97f4a7c15ull * (rank + 1) + 1000003ull * tc + 7919ull * what + 104729ull * set + 77;
}

// An input matrix (bf16, or fp8 e4m3): its bytes for upload, its exact values for the reference.
struct HostMat {
    std::vector<std::uint8_t> raw;
    std::vector<double> val;
};
HostMat make_input(std::size_t n, std::uint64_t seed, DType in = DType::BF16) {
    const auto f = test::random_floats(n, seed);
    HostMat m;
    m.raw.resize(n * dtype_size(in));
    m.val.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        if (in == DType::F8E4M3) {
            const __nv_fp8_e4m3 v(f[i]);  // round to nearest even, satfinite
            std::memcpy(&m.raw[i], &v, 1);
            m.val[i] = static_cast<float>(v);
        } else {
            const std::uint16_t bits = test::float_to_bf16(f[i]);
            std::memcpy(&m.raw[2 * i], &bits, 2);
            m.val[i] = test::bf16_to_float(bits);
        }
    }
    return m;
}
HostMat make_bf16(std::size_t n, std::uint64_t seed) { return make_input(n, seed); }

// fp8 calls scale each rank's products by its own alpha (the per-tensor scales an fp8 caller passes; exact in fp32).
float fp8_alpha(int rank) { return 0.5f + 0.25f * static_cast<float>(rank % 4); }
// The tolerance fp8 adds per unit of sum |a b|: the tensor cores' e4m3 sums keep about 2^-12 of the running sum per
// k32 step (docs/gemm.md "FP8"; tests/gpu/test_gemm.cpp bounds each step's error by the same).
double fp8_slack(DType in, int64_t k) { return in == DType::F8E4M3 ? (1.0 + double(k) / 32.0) / 4096.0 : 0.0; }

// out[i, j] += scale x sum_k a[i, k] * b[j, k] (row-major [m, k] x [n, k]), fp64; abs_out gets |scale| x sum_k |a b|
// (for tolerances).
void ref_gemm(const double* a, const double* b, int64_t m, int64_t n, int64_t k, double* out, double* abs_out,
              double scale = 1.0) {
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            double s = 0, sa = 0;
            for (int64_t x = 0; x < k; ++x) {
                const double p = a[i * k + x] * b[j * k + x];
                s += p;
                sa += std::fabs(p);
            }
            out[i * n + j] += scale * s;
            abs_out[i * n + j] += std::fabs(scale) * sa;
        }
}

struct DevBuf {
    void* p = nullptr;
    explicit DevBuf(std::size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes < 256 ? 256 : bytes), cudaSuccess); }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
    ~DevBuf() { cudaFree(p); }
};
void upload(void* dst, const HostMat& m) { test::upload(dst, m.raw); }
std::vector<double> download_bf16(const void* src, std::size_t n) {
    std::vector<std::uint16_t> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), src, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<double> out(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = test::bf16_to_float(h[i]);
    return out;
}
// n elements of dtype `dt` (bf16, f16 or f32) as doubles.
std::vector<double> download_as(const void* src, std::size_t n, DType dt) {
    if (dt == DType::BF16) return download_bf16(src, n);
    std::vector<double> out(n);
    if (dt == DType::F32) {
        std::vector<float> h(n);
        EXPECT_EQ(cudaMemcpy(h.data(), src, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        for (std::size_t i = 0; i < n; ++i) out[i] = h[i];
    } else {
        std::vector<std::uint16_t> h(n);
        EXPECT_EQ(cudaMemcpy(h.data(), src, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
        for (std::size_t i = 0; i < n; ++i) out[i] = test::half_to_float(h[i]);
    }
    return out;
}
// NaN in bf16 / f16 / f32, ordered after every earlier call and before the next (the calls' streams are
// non-blocking: a memset on the legacy stream is not ordered with them).
void poison(void* p, std::size_t bytes) {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemset(p, 0xFF, bytes), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// An fp8 call's scales: alpha 0.5 on the host times two device floats, fp8_alpha(rank) and 2 (their product is
// fp8_alpha(rank) exactly), so that each of the three must reach the products.
struct Fp8Scales {
    DevBuf buf{2 * sizeof(float)};
    explicit Fp8Scales(int rank) {
        const float v[2] = {fp8_alpha(rank), 2.f};
        EXPECT_EQ(cudaMemcpy(buf.p, v, sizeof v, cudaMemcpyHostToDevice), cudaSuccess);
    }
    template <class Opts>
    void apply(Opts& o) const {
        o.alpha = 0.5f;
        o.scale_a = static_cast<const float*>(buf.p);
        o.scale_b = static_cast<const float*>(buf.p) + 1;
    }
};

// Every element within tolerance: fp32 accumulation, partial products rounded to bf16 `roundings` times, plus
// slack x abs (fp8's sums: fp8_slack); and the whole output's similarity to the reference (DeepGEMM's calc_diff:
// ~1e-5 for right bf16 outputs, ~1e-2 for a wrong tile) below 1e-3, which the per-element bound, wide where many
// roundings add up, does not give alone. Returns "" or the first mismatch.
std::string compare(const std::vector<double>& got, const std::vector<double>& ref, const std::vector<double>& abs,
                    int roundings, int64_t cols, double slack = 0.0) {
    for (std::size_t i = 0; i < ref.size(); ++i) {
        const double tol = std::fabs(ref[i]) / 128.0 + (roundings / 256.0 + slack) * abs[i] + 1e-3;
        if (!(std::fabs(got[i] - ref[i]) <= tol))
            return "element (" + std::to_string(i / cols) + ", " + std::to_string(i % cols) + "): got " +
                   std::to_string(got[i]) + " expected " + std::to_string(ref[i]) + " (tol " + std::to_string(tol) +
                   ")";
    }
    const double diff = ref.empty() ? 0.0 : test::calc_diff(ref, got);
    if (!(diff < 1e-3)) return "similarity to the reference " + std::to_string(diff) + " (expected < 1e-3)";
    return "";
}

// Every rank's verdict; the test fails on every rank when any rank failed.
void agree(World& w, const std::string& mine, const std::string& what) {
    const std::string v = test::agree(w, mine, "test/overlap/" + what);
    EXPECT_TRUE(v.empty()) << what << ":\n" << v;
}

class Overlap : public WorldStreamTest {};

// Back-to-back calls with no host synchronisation between unchecked ones: run(i, check) enqueues call i (its input
// copies, the output's poison when checked, the op) and returns the call's variant for the error message; on the calls
// `check` selects the stream is synchronised and verify(i) returns "" or what differs. The first error, or "".
std::string back_to_back(cudaStream_t s, int calls, const std::function<bool(int)>& check,
                         const std::function<std::string(int, bool)>& run,
                         const std::function<std::string(int)>& verify) {
    try {
        for (int i = 0; i < calls; ++i) {
            const bool c = check(i);
            const std::string variant = run(i, c);
            if (!c) continue;
            if (cudaStreamSynchronize(s) != cudaSuccess) return "stream failed at call " + std::to_string(i);
            const std::string e = verify(i);
            if (!e.empty()) return variant + " at call " + std::to_string(i) + ": " + e;
        }
        if (cudaStreamSynchronize(s) != cudaSuccess) return "stream failed";
    } catch (const std::exception& e) {
        return e.what();
    }
    return "";
}

// ---- AllGather+GEMM ----------------------------------------------------------------------------------------------
struct AgCase {
    int64_t rows, n, k;
    std::vector<HostMat> a;  // every rank's shard
    HostMat b;               // this rank's B
    std::vector<double> ref, abs;
};
// in: the inputs' type; alpha: this rank's scale of its products.
AgCase ag_case(World& w, int64_t rows, int64_t n, int64_t k, int tc, int set, DType in = DType::BF16,
               double alpha = 1.0) {
    const int W = w.world_size();
    AgCase c{rows, n, k, {}, {}, {}, {}};
    for (int r = 0; r < W; ++r) c.a.push_back(make_input(rows * k, seed_of(r, tc, 1, set), in));
    c.b = make_input(n * k, seed_of(w.rank(), tc, 2, set), in);
    c.ref.assign(rows * W * n, 0.0);
    c.abs.assign(rows * W * n, 0.0);
    for (int r = 0; r < W; ++r)
        ref_gemm(c.a[r].val.data(), c.b.val.data(), rows, n, k, c.ref.data() + r * rows * n,
                 c.abs.data() + r * rows * n, alpha);
    return c;
}

// with_gathered: pass a gathered buffer and check it too; without one, the copy-engine producer reads the own rows
// in place where M / W is a multiple of BLOCK_M (ag_gemm's own_local). in: the inputs' type (fp8: each rank scales by
// its fp8_alpha). plain_gathered: the gathered buffer from cudaMalloc, outside the symmetric heap.
void run_ag(World& w, cudaStream_t s, const AgGemmOptions& o, int64_t rows, int64_t n, int64_t k, int tc,
            const std::string& label, bool with_gathered = true, DType in = DType::BF16, bool plain_gathered = false) {
    const int W = w.world_size(), me = w.rank();
    const std::size_t es = dtype_size(in);
    AgGemmOptions opts = o;
    std::optional<Fp8Scales> f8s;
    if (in == DType::F8E4M3) f8s.emplace(me);
    if (f8s) f8s->apply(opts);
    const AgCase c = ag_case(w, rows, n, k, tc, 0, in, f8s ? fp8_alpha(me) : 1.0);
    DevBuf a(rows * k * es), b(n * k * es), out(rows * W * n * 2);
    upload(a.p, c.a[me]);
    upload(b.p, c.b);
    poison(out.p, rows * W * n * 2);
    void* gathered = nullptr;
    if (plain_gathered)
        EXPECT_EQ(cudaMalloc(&gathered, rows * W * k * es), cudaSuccess);
    else
        gathered = w.alloc_bytes(rows * W * k * es);
    poison(gathered, rows * W * k * es);
    if (with_gathered) opts.gathered = MatrixView{gathered, in, rows * W, k, 0};
    w.barrier();
    std::string err;
    try {
        ag_gemm(w, MatrixView{a.p, in, rows, k, 0}, MatrixView{b.p, in, n, k, 0},
                MatrixView{out.p, DType::BF16, rows * W, n, 0}, s, opts);
        if (cudaStreamSynchronize(s) != cudaSuccess) err = "stream failed";
    } catch (const std::exception& e) {
        err = e.what();
    }
    if (err.empty()) err = compare(download_bf16(out.p, rows * W * n), c.ref, c.abs, 0, n, fp8_slack(in, k));
    if (err.empty() && with_gathered) {
        std::vector<std::uint8_t> g(rows * W * k * es);
        EXPECT_EQ(cudaMemcpy(g.data(), gathered, g.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        for (int r = 0; r < W && err.empty(); ++r)
            if (std::memcmp(g.data() + r * rows * k * es, c.a[r].raw.data(), rows * k * es) != 0)
                err = "gathered rows of rank " + std::to_string(r) + " differ";
    }
    agree(w, err, label);
    w.barrier();
    if (plain_gathered)
        cudaFree(gathered);
    else
        w.free(gathered);
}

// `calls` ag_gemm calls back to back with the inputs alternating between two sets (call i: set i % 2, options(i)),
// no host synchronisation but on the calls `check` selects, whose output is poisoned first and then compared with the
// set's reference. in: the inputs' type (fp8: each rank scales by its fp8_alpha). The first error, or "".
std::string ag_back_to_back(World& w, cudaStream_t stream, int64_t rows, int64_t n, int64_t k, int tc, int calls,
                            const std::function<bool(int)>& check, const std::function<AgGemmOptions(int)>& options,
                            DType in = DType::BF16) {
    const int W = w.world_size(), me = w.rank();
    const int64_t m = rows * W, es = static_cast<int64_t>(dtype_size(in));
    const float alpha = in == DType::F8E4M3 ? fp8_alpha(me) : 1.f;
    std::optional<Fp8Scales> f8s;
    if (in == DType::F8E4M3) f8s.emplace(me);
    const AgCase cs[2] = {ag_case(w, rows, n, k, tc, 0, in, alpha), ag_case(w, rows, n, k, tc, 1, in, alpha)};
    DevBuf src0(rows * k * es), src1(rows * k * es), bsrc0(n * k * es), bsrc1(n * k * es);
    DevBuf* src[2] = {&src0, &src1};
    DevBuf* bsrc[2] = {&bsrc0, &bsrc1};
    for (int s = 0; s < 2; ++s) {
        upload(src[s]->p, cs[s].a[me]);
        upload(bsrc[s]->p, cs[s].b);
    }
    DevBuf a(rows * k * es), b(n * k * es), c(m * n * 2);
    w.barrier();
    return back_to_back(
        stream, calls, check,
        [&](int i, bool chk) {
            LOOM_CHECK_CUDA(cudaMemcpyAsync(a.p, src[i % 2]->p, rows * k * es, cudaMemcpyDeviceToDevice, stream));
            LOOM_CHECK_CUDA(cudaMemcpyAsync(b.p, bsrc[i % 2]->p, n * k * es, cudaMemcpyDeviceToDevice, stream));
            if (chk) poison(c.p, m * n * 2);
            AgGemmOptions o = options(i);
            if (f8s) f8s->apply(o);
            ag_gemm(w, MatrixView{a.p, in, rows, k, 0}, MatrixView{b.p, in, n, k, 0},
                    MatrixView{c.p, DType::BF16, m, n, 0}, stream, o);
            return std::string("ag_gemm (") + to_string(o.producer) + (o.config ? ", " + o.config->str() : "") + ")";
        },
        [&](int i) {
            return compare(download_bf16(c.p, m * n), cs[i % 2].ref, cs[i % 2].abs, 0, n, fp8_slack(in, k));
        });
}

TEST_F(Overlap, AgGemmCopyEngine) {
    run_ag(*w, stream, AgGemmOptions{AgProducer::CopyEngine}, 200, 192, 256, 1, "ag_ce_200");
    run_ag(*w, stream, AgGemmOptions{AgProducer::CopyEngine}, 256, 256, 512, 2, "ag_ce_256");
    run_ag(*w, stream, AgGemmOptions{AgProducer::CopyEngine}, 40, 136, 128, 3, "ag_ce_40");  // tile spans ranks
}
// The own rows read in place (no gathered buffer; rows per rank whole M-blocks for every tile height), then calls
// that alternate with the SM producer and the gathered copy path back to back: chunk[me] must stay in step with
// the call totals whichever path raised it.
TEST_F(Overlap, AgGemmOwnRowsInPlace) {
    run_ag(*w, stream, AgGemmOptions{AgProducer::CopyEngine}, 256, 192, 256, 40, "ag_own_256", false);
    run_ag(*w, stream, AgGemmOptions{AgProducer::CopyEngine}, 128, 256, 320, 41, "ag_own_128", false);
    run_ag(*w, stream, AgGemmOptions{AgProducer::CopyEngine}, 200, 192, 256, 42, "ag_own_200_copies", false);
    for (int i = 0; i < 6; ++i) {  // in place, SM producer, gathered copy, in place, ...
        const AgProducer p = i % 3 == 1 ? AgProducer::Sm : AgProducer::CopyEngine;
        run_ag(*w, stream, AgGemmOptions{p}, 256, 128, 192, 43 + i, "ag_own_mixed_" + std::to_string(i), i % 3 != 0);
    }
}
// The sequence (all_gather into the gather buffer, then loom::gemm): with and without a gathered buffer, rows per rank
// off the tile, then 60 calls back to back mixing it with the copy engine and the SM producer, whose signals and
// counters it leaves as they were; a config with it is a clear error.
// A gathered buffer outside the symmetric heap (A, B and C are cudaMalloc'd in every test here): the copy engine and
// the SM producer gather into their own buffer and copy it into the caller's after the GEMM, the sequence
// all_gathers into it (staged); each call checks C and the gathered rows; then 40 calls back to back alternating
// the producers with the plain gathered buffer in every call (C checked at a few).
TEST_F(Overlap, AgGemmPlainGathered) {
    int tc = 80;
    for (AgProducer p : {AgProducer::CopyEngine, AgProducer::Sm, AgProducer::Sequential})
        for (int64_t rows : {int64_t(200), int64_t(256)})
            run_ag(*w, stream, AgGemmOptions{p}, rows, 192, 256, ++tc,
                   std::string("ag_plain_gathered_") + to_string(p) + "_" + std::to_string(rows), true, DType::BF16,
                   true);
    World& W_ = *w;
    const int64_t rows = 128, k = 256;
    void* gathered = nullptr;
    ASSERT_EQ(cudaMalloc(&gathered, rows * W_.world_size() * k * 2), cudaSuccess);
    const std::string err = ag_back_to_back(
        W_, stream, rows, 192, k, ++tc, 40, [](int i) { return i < 3 || i % 13 == 0 || i == 39; },
        [&](int i) {
            AgGemmOptions o{i % 3 == 0 ? AgProducer::CopyEngine : i % 3 == 1 ? AgProducer::Sm : AgProducer::Sequential};
            o.gathered = MatrixView{gathered, DType::BF16, rows * W_.world_size(), k, 0};
            return o;
        });
    agree(W_, err, "ag_plain_gathered_back_to_back");
    cudaFree(gathered);
}

TEST_F(Overlap, AgGemmSequential) {
    const AgGemmOptions seq{AgProducer::Sequential};
    run_ag(*w, stream, seq, 256, 192, 256, 60, "ag_seq_256");
    run_ag(*w, stream, seq, 200, 136, 320, 61, "ag_seq_200", false);
    World& W_ = *w;
    const std::string err = ag_back_to_back(
        W_, stream, 128, 192, 256, 62, 60, [](int i) { return i < 4 || i % 13 == 0 || i == 59; },
        [](int i) {
            return AgGemmOptions{i % 3 == 0   ? AgProducer::Sequential
                                 : i % 3 == 1 ? AgProducer::CopyEngine
                                              : AgProducer::Sm};
        });
    agree(W_, err, "ag_seq_back_to_back");
    const int W = W_.world_size();
    DevBuf a2(128 * 64 * 2), b2(64 * 64 * 2), c2(128 * W * 64 * 2);
    const GemmConfig cfg = gemm_heuristic(128 * W, 64, 64, false, 90, 132);
    AgGemmOptions with_cfg = seq;
    with_cfg.config = &cfg;
    EXPECT_THROW(ag_gemm(W_, MatrixView{a2.p, DType::BF16, 128, 64, 0}, MatrixView{b2.p, DType::BF16, 64, 64, 0},
                         MatrixView{c2.p, DType::BF16, 128 * W, 64, 0}, stream, with_cfg),
                 Error);
    W_.barrier();
}
// The direct producer (peers' rows read in place from their staging): single calls, then 300 back to back with the
// inputs alternating between two sets and every fourth call taking the copy engine (separate buffers and signals),
// so a staging half is rewritten while peers may still be in the previous call; rows per rank not a multiple of the
// tile is a clear error, and so is one rank (no peer to read from).
TEST_F(Overlap, AgGemmDirect) {
    const AgGemmOptions direct{AgProducer::Direct};
    if (w->world_size() == 1) {
        // One rank has no peer to read from: the direct producer refuses, naming the rank count.
        DevBuf a(128 * 256 * 2), b(192 * 256 * 2), c(128 * 192 * 2);
        std::string err;
        try {
            ag_gemm(*w, MatrixView{a.p, DType::BF16, 128, 256, 0}, MatrixView{b.p, DType::BF16, 192, 256, 0},
                    MatrixView{c.p, DType::BF16, 128, 192, 0}, stream, direct);
        } catch (const Error& e) {
            err = e.what();
        }
        EXPECT_NE(err.find("the direct producer needs"), std::string::npos) << err;
        EXPECT_NE(err.find("more than one rank (given 1)"), std::string::npos) << err;
        return;
    }
    run_ag(*w, stream, direct, 256, 192, 256, 50, "ag_direct_256", false);
    run_ag(*w, stream, direct, 128, 136, 320, 51, "ag_direct_128_n136", false);
    World& W_ = *w;
    const int W = W_.world_size();
    const std::string err = ag_back_to_back(
        W_, stream, 128, 192, 256, 52, 300, [](int i) { return i < 5 || i % 61 == 0 || i == 299; },
        [](int i) { return AgGemmOptions{i % 4 == 3 ? AgProducer::CopyEngine : AgProducer::Direct}; });
    agree(W_, err, "ag_direct_back_to_back");
    DevBuf a2(200 * 64 * 2), b2(64 * 64 * 2), c2(200 * W * 64 * 2);
    EXPECT_THROW(ag_gemm(W_, MatrixView{a2.p, DType::BF16, 200, 64, 0}, MatrixView{b2.p, DType::BF16, 64, 64, 0},
                         MatrixView{c2.p, DType::BF16, 200 * W, 64, 0}, stream, direct),
                 Error);
    W_.barrier();
}
// The hooked GEMM with a split-K tail (ag_gemm's plan takes the plain GEMM's, kernels/gemm.cuh kSplitTail): a config
// whose grid leaves a tail, split 3 ways, under every producer that applies here (Auto: the direct producer where
// ranks share a GPU, else the copy engine; the SM producer; the gathered copy), then 40 back to back with two input
// sets: the tail's workspace counters must come back to zero after every launch. Then 240- and 176-wide tiles.
TEST_F(Overlap, AgGemmSplitTail) {
    GemmConfig cfg;
    cfg.block_m = 128;
    cfg.block_n = 128;
    cfg.stages = 4;
    cfg.group_m = 2;
    cfg.grid = 5;  // 6W tiles on 5 CTAs: a tail of 2, 4, 3 tiles at W = 2, 4, 8 (whole tiles where 5 divides 6W)
    cfg.tail_splits = 3;
    AgGemmOptions o;
    o.config = &cfg;
    run_ag(*w, stream, o, 256, 384, 1024, 60, "ag_split_auto", false);
    run_ag(*w, stream, o, 256, 384, 1024, 61, "ag_split_gathered", true);
    AgGemmOptions sm = o;
    sm.producer = AgProducer::Sm;
    sm.comm_sms = 2;
    run_ag(*w, stream, sm, 256, 384, 1024, 62, "ag_split_sm", true);
    // Tiles whose width is not a multiple of 64 (the plan's 128 x 240 at N_loc = 5504, 128 x 176 at 1376): N tails
    // in the split tail's partials and the partial-slab TMA stores.
    GemmConfig wide = cfg;
    wide.block_n = 240;
    wide.tail_splits = 2;
    o.config = &wide;
    run_ag(*w, stream, o, 256, 600, 1024, 64, "ag_split_bn240", false);
    GemmConfig mid = cfg;
    mid.block_n = 176;
    mid.tail_splits = 1;
    o.config = &mid;
    run_ag(*w, stream, o, 256, 440, 512, 65, "ag_bn176", false);
    o.config = &cfg;
    World& W_ = *w;
    const std::string err = ag_back_to_back(
        W_, stream, 256, 384, 1024, 63, 40, [](int i) { return i < 3 || i % 13 == 0 || i == 39; },
        [&](int) { return o; });
    agree(W_, err, "ag_split_back_to_back");
    W_.barrier();
}
TEST_F(Overlap, AgGemmSmProducer) {
    AgGemmOptions ld{AgProducer::Sm, DataPath::LdSt, 3};
    AgGemmOptions tma{AgProducer::Sm, DataPath::Tma, 0};
    run_ag(*w, stream, ld, 200, 192, 256, 4, "ag_sm_ldst_200");
    run_ag(*w, stream, tma, 200, 192, 256, 5, "ag_sm_tma_200");
    run_ag(*w, stream, tma, 40, 136, 128, 6, "ag_sm_tma_40");
}

// ---- GEMM+RS / GEMM+AR: references summed over every rank's partial product -----------------------------------
struct SumCase {
    std::vector<HostMat> a, b;
    std::vector<double> ref, abs;  // [m, n]
};
// in: the inputs' type; fp8: rank r's products scaled by fp8_alpha(r).
SumCase sum_case(World& w, int64_t m, int64_t n, int64_t k, int tc, int set, DType in = DType::BF16) {
    SumCase c;
    c.ref.assign(m * n, 0.0);
    c.abs.assign(m * n, 0.0);
    for (int r = 0; r < w.world_size(); ++r) {
        c.a.push_back(make_input(m * k, seed_of(r, tc, 3, set), in));
        c.b.push_back(make_input(n * k, seed_of(r, tc, 4, set), in));
        ref_gemm(c.a[r].val.data(), c.b[r].val.data(), m, n, k, c.ref.data(), c.abs.data(),
                 in == DType::F8E4M3 ? fp8_alpha(r) : 1.0);
    }
    return c;
}

// This rank's rows [me * rows, (me + 1) * rows) of a sum case's [m, n] reference, compared with C (tolerance 1: rounded
// partials).
std::string compare_segment(const SumCase& c, int me, int64_t rows, int64_t n, const void* out, DType dt = DType::BF16,
                            double slack = 0.0) {
    const std::vector<double> ref(c.ref.begin() + me * rows * n, c.ref.begin() + (me + 1) * rows * n);
    const std::vector<double> abs(c.abs.begin() + me * rows * n, c.abs.begin() + (me + 1) * rows * n);
    return compare(download_as(out, rows * n, dt), ref, abs, 1, n, slack);
}

// The fused pull's reducers hand every part to its finish kernel (kernels/overlap/gemm_rs.cuh kRsDiagSkip bit 2):
// a diagnostic build of its kernel with right results, the tests' way to gemm_rs_pull_finish's whole path.
constexpr int kPullAllToFinish = 4;
// gemm_rs calls made through call_gemm_rs while a ScopedRsDiag lives run overlap::gemm_rs_diagnostic with its bits.
int rs_diag_skip = 0;
struct ScopedRsDiag {
    explicit ScopedRsDiag(int skip) { rs_diag_skip = skip; }
    ~ScopedRsDiag() { rs_diag_skip = 0; }
    ScopedRsDiag(const ScopedRsDiag&) = delete;
    ScopedRsDiag& operator=(const ScopedRsDiag&) = delete;
};
void call_gemm_rs(World& w, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t s,
                  const GemmRsOptions& o) {
    if (rs_diag_skip != 0) return overlap::gemm_rs_diagnostic(w, a, b, c, s, o, rs_diag_skip);
    gemm_rs(w, a, b, c, s, o);
}

// sym_out: C in the symmetric heap; ldc > 0: C with that row stride (elements); out_t: C's dtype; in: the inputs'
// type (fp8: each rank scales by its fp8_alpha).
void run_rs(World& w, cudaStream_t s, int64_t rows_seg, int64_t n, int64_t k, int tc, const GemmRsOptions& o,
            const std::string& label, bool sym_out = false, int64_t ldc = 0, DType out_t = DType::BF16,
            DType in = DType::BF16) {
    const int W = w.world_size(), me = w.rank();
    const int64_t m = rows_seg * W, stride = ldc > 0 ? ldc : n;
    const int64_t es = static_cast<int64_t>(dtype_size(out_t)), ies = static_cast<int64_t>(dtype_size(in));
    const SumCase c = sum_case(w, m, n, k, tc, 0, in);
    GemmRsOptions opts = o;
    std::optional<Fp8Scales> f8s;
    if (in == DType::F8E4M3) f8s.emplace(me);
    if (f8s) f8s->apply(opts);
    DevBuf a(m * k * ies), b(n * k * ies), plain_out(sym_out ? 0 : rows_seg * stride * es);
    void* const out = sym_out ? w.alloc_bytes(rows_seg * stride * es) : plain_out.p;
    upload(a.p, c.a[me]);
    upload(b.p, c.b[me]);
    poison(out, rows_seg * stride * es);
    w.barrier();
    std::string err;
    try {
        call_gemm_rs(w, MatrixView{a.p, in, m, k, 0}, MatrixView{b.p, in, n, k, 0},
                     MatrixView{out, out_t, rows_seg, n, ldc}, s, opts);
        if (cudaStreamSynchronize(s) != cudaSuccess) err = "stream failed";
    } catch (const std::exception& e) {
        err = e.what();
    }
    if (err.empty() && stride != n) {  // gather the rows into a dense copy (the padding stays unchecked)
        DevBuf dense(rows_seg * n * es);
        LOOM_CHECK_CUDA(cudaMemcpy2D(dense.p, n * es, out, stride * es, n * es, rows_seg, cudaMemcpyDeviceToDevice));
        err = compare_segment(c, me, rows_seg, n, dense.p, out_t, fp8_slack(in, k));
    } else if (err.empty()) {
        err = compare_segment(c, me, rows_seg, n, out, out_t, fp8_slack(in, k));
    }
    if (sym_out) w.free(out);
    agree(w, err, label);
}

// Auto: with a GPU per rank the fused epilogue (segments a multiple of the tile) or the scatter-reduce; ranks sharing
// a GPU take the fused pull (segments a multiple of 64) or the sequence.
TEST_F(Overlap, GemmRs) {
    run_rs(*w, stream, 136, 256, 256, 10, {}, "rs_136");          // segments not a multiple of the tile: scatter-reduce
    run_rs(*w, stream, 256, 512, 512, 11, {}, "rs_256");          // the fused epilogue
    run_rs(*w, stream, 24, 136, 128, 12, {3, nullptr}, "rs_24");  // several segments per tile, 3 blocks
}

// The sequential algorithm (loom::gemm, then loom::reduce_scatter) with a plain C, a symmetric C and a strided C (in
// place, then copied out); with a config or a transport it is refused.
TEST_F(Overlap, GemmRsSequential) {
    GemmRsOptions seq;
    seq.algo = RsAlgo::Sequential;
    run_rs(*w, stream, 136, 200, 256, 17, seq, "rs_sequential_136_n200");
    run_rs(*w, stream, 256, 512, 512, 18, seq, "rs_sequential_symmetric_c", /*sym_out=*/true);
    run_rs(*w, stream, 64, 136, 128, 19, seq, "rs_sequential_strided_c", /*sym_out=*/false, /*ldc=*/200);
    DevBuf a(64 * w->world_size() * 64 * 2), b(64 * 64 * 2), c(64 * 64 * 2);
    const MatrixView av{a.p, DType::BF16, 64 * w->world_size(), 64, 0}, bv{b.p, DType::BF16, 64, 64, 0},
        cv{c.p, DType::BF16, 64, 64, 0};
    GemmConfig cfg = gemm_heuristic(64 * w->world_size(), 64, 64, false, 90, 132);
    GemmRsOptions with_config = seq;
    with_config.config = &cfg;
    EXPECT_THROW(gemm_rs(*w, av, bv, cv, stream, with_config), Error);
    GemmRsOptions with_transport = seq;
    with_transport.transport = RsTransport::Sm;
    EXPECT_THROW(gemm_rs(*w, av, bv, cv, stream, with_transport), Error);
}

// A 64 x 128 tile for gemm_rs with 64 rows per rank and N = 200 (the heuristic's config, single-CTA, whole tiles),
// with the ring depth of that tile: the heuristic's own tile may be narrower (64 x 64 at W = 1, whose 12 stages do not
// fit beside a 128-wide B tile).
GemmConfig tile_64x128(const World& w) {
    GemmConfig c = gemm_heuristic(64 * w.world_size(), 200, 128, false, 90, 132);
    c.block_m = 64;
    c.block_n = 128;
    c.stages = kernels::gemm_sm90_plan_stages(c.block_m, c.block_n);
    c.cluster_m = 1;
    c.tma_store = true;
    c.tail_splits = 1;
    c.grid = 0;
    return c;
}

// The two algorithms forced: the fused epilogue with N tails (N not a multiple of BLOCK_N), several M-blocks per
// rank, a 64-row tile; the scatter-reduce on a shape the fused epilogue would take.
TEST_F(Overlap, GemmRsAlgorithms) {
    const GemmRsOptions fused{0, nullptr, RsAlgo::FusedEpilogue};
    run_rs(*w, stream, 128, 136, 256, 13, fused, "fused_128_n136");
    run_rs(*w, stream, 384, 320, 192, 14, fused, "fused_384_n320");
    const GemmConfig small = tile_64x128(*w);
    run_rs(*w, stream, 64, 200, 128, 15, {0, &small, RsAlgo::FusedEpilogue}, "fused_64x128_tile");
    run_rs(*w, stream, 256, 512, 512, 16, {0, nullptr, RsAlgo::ScatterReduce}, "scatter_256");
    // Not a multiple of BLOCK_M: a clear error, on every rank, before anything is enqueued.
    DevBuf a(136 * w->world_size() * 64 * 2), b(64 * 64 * 2), c(136 * 64 * 2);
    for (RsAlgo algo : {RsAlgo::FusedEpilogue, RsAlgo::FusedPull})
        EXPECT_THROW(gemm_rs(*w, MatrixView{a.p, DType::BF16, 136 * w->world_size(), 64, 0},
                             MatrixView{b.p, DType::BF16, 64, 64, 0}, MatrixView{c.p, DType::BF16, 136, 64, 0}, stream,
                             {0, nullptr, algo}),
                     Error);
}

// The fused pull (kernels/gemm_rs_pull.cuh): N tails (a partial N-block, one narrower than a tile), several M-blocks
// per rank, a 64-row tile, a symmetric and a strided C (the reducers store 16-byte vectors: check_inputs' alignment
// rules for C cover them).
TEST_F(Overlap, GemmRsFusedPull) {
    const GemmRsOptions pull{0, nullptr, RsAlgo::FusedPull};
    run_rs(*w, stream, 128, 136, 256, 25, pull, "pull_128_n136");
    run_rs(*w, stream, 384, 320, 192, 26, pull, "pull_384_n320");
    run_rs(*w, stream, 256, 1040, 320, 27, pull, "pull_256_n1040");
    const GemmConfig small = tile_64x128(*w);
    run_rs(*w, stream, 64, 200, 128, 28, {0, &small, RsAlgo::FusedPull}, "pull_64x128_tile");
    run_rs(*w, stream, 256, 512, 512, 29, pull, "pull_symmetric_c", /*sym_out=*/true);
    run_rs(*w, stream, 128, 200, 256, 30, pull, "pull_strided_c", /*sym_out=*/false, /*ldc=*/208);
    // Every part summed by the finish kernel instead of the GEMM's reducers (as when a rank is late).
    const ScopedRsDiag to_finish(kPullAllToFinish);
    run_rs(*w, stream, 384, 320, 192, 31, pull, "pull_finish_kernel_384_n320");
    run_rs(*w, stream, 64, 200, 128, 32, {0, &small, RsAlgo::FusedPull}, "pull_finish_kernel_64x128_tile");
}

// C in f16 and f32 (bf16 everywhere else): every algorithm, with an N tail; the fused epilogue with the SM transport,
// its automatic one on a 64-row tile, and (ranks on distinct GPUs) the copy-engine transport. The peers' partials
// arrive in C's dtype.
TEST_F(Overlap, GemmRsOutputTypes) {
    const bool own_gpus = !collective_topology(*w).shared_gpu;
    for (DType dt : {DType::F16, DType::F32}) {
        const std::string t = dtype_name(dt);
        run_rs(*w, stream, 256, 200, 256, 20, {0, nullptr, RsAlgo::FusedEpilogue, RsTransport::Sm}, "fused_sm_" + t,
               false, 0, dt);
        run_rs(*w, stream, 192, 320, 192, 21, {0, nullptr, RsAlgo::FusedEpilogue}, "fused_64row_n320_" + t, false, 0,
               dt);  // M / W = 192: a 64-row tile
        if (own_gpus)
            run_rs(*w, stream, 256, 200, 256, 22, {0, nullptr, RsAlgo::FusedEpilogue, RsTransport::CopyEngine},
                   "fused_ce_" + t, false, 0, dt);
        run_rs(*w, stream, 256, 200, 256, 23, {0, nullptr, RsAlgo::ScatterReduce}, "scatter_" + t, false, 0, dt);
        run_rs(*w, stream, 256, 200, 256, 25, {0, nullptr, RsAlgo::FusedPull}, "pull_" + t, false, 0, dt);
        GemmRsOptions seq;
        seq.algo = RsAlgo::Sequential;
        run_rs(*w, stream, 136, 200, 256, 24, seq, "sequential_" + t, false, 0, dt);
    }
}

// The fused epilogue with the copy-engine transport: ranks on distinct GPUs check it element-wise on shapes with N
// tails, several chunks per band (small ce_chunk_bytes: one M-block per copy) and a band not a multiple of the
// raster group, then 200 back-to-back calls alternating transports and input sets; ranks sharing a GPU get the clear
// error instead (the copies would be runtime copy kernels the waiting GEMM starves).
TEST_F(Overlap, GemmRsCopyEngine) {
    GemmRsOptions ce{0, nullptr, RsAlgo::FusedEpilogue, RsTransport::CopyEngine};
    if (collective_topology(*w).shared_gpu) {
        DevBuf a(256 * w->world_size() * 64 * 2), b(64 * 64 * 2), c(256 * 64 * 2);
        std::string err;
        try {
            gemm_rs(*w, MatrixView{a.p, DType::BF16, 256 * w->world_size(), 64, 0},
                    MatrixView{b.p, DType::BF16, 64, 64, 0}, MatrixView{c.p, DType::BF16, 256, 64, 0}, stream, ce);
            err = "no error for the copy-engine transport with ranks sharing a GPU";
        } catch (const Error& e) {
            if (std::string(e.what()).find("copy-engine transport") == std::string::npos)
                err = std::string("unexpected message: ") + e.what();
        }
        agree(*w, err, "rs_ce_shared_gpu_rejected");
        return;
    }
    run_rs(*w, stream, 384, 320, 192, 17, ce, "ce_384_n320");
    ce.ce_chunk_bytes = 1;  // one M-block per copy
    run_rs(*w, stream, 384, 136, 256, 18, ce, "ce_384_n136_chunk1");
    run_rs(*w, stream, 640, 512, 128, 19, ce, "ce_640_chunk1");  // 5 M-blocks per band: group_m narrowed to 5 or 1
    World& W_ = *w;
    const int W = W_.world_size(), me = W_.rank();
    const int64_t rows = 256, m = rows * W, n = 256, k = 128;
    SumCase cases[2] = {sum_case(W_, m, n, k, 50, 0), sum_case(W_, m, n, k, 50, 1)};
    DevBuf src_a0(m * k * 2), src_a1(m * k * 2), src_b0(n * k * 2), src_b1(n * k * 2);
    DevBuf* src_a[2] = {&src_a0, &src_a1};
    DevBuf* src_b[2] = {&src_b0, &src_b1};
    for (int s = 0; s < 2; ++s) {
        upload(src_a[s]->p, cases[s].a[me]);
        upload(src_b[s]->p, cases[s].b[me]);
    }
    DevBuf a(m * k * 2), b(n * k * 2), c(rows * n * 2);
    W_.barrier();
    const std::string err = back_to_back(
        stream, 200, [](int i) { return i < 6 || i % 37 == 0 || i == 199; },
        [&](int i, bool check) {
            LOOM_CHECK_CUDA(cudaMemcpyAsync(a.p, src_a[i % 2]->p, m * k * 2, cudaMemcpyDeviceToDevice, stream));
            LOOM_CHECK_CUDA(cudaMemcpyAsync(b.p, src_b[i % 2]->p, n * k * 2, cudaMemcpyDeviceToDevice, stream));
            if (check) poison(c.p, rows * n * 2);
            GemmRsOptions o = ce;
            o.ce_chunk_bytes = 0;
            if (i % 3 == 2) o.transport = RsTransport::Sm;
            gemm_rs(W_, MatrixView{a.p, DType::BF16, m, k, 0}, MatrixView{b.p, DType::BF16, n, k, 0},
                    MatrixView{c.p, DType::BF16, rows, n, 0}, stream, o);
            return std::string("gemm_rs (") + to_string(o.transport) + ")";
        },
        [&](int i) { return compare_segment(cases[i % 2], me, rows, n, c.p); });
    agree(W_, err, "rs_ce_back_to_back");
}

// 1000 back-to-back gemm_rs calls, call i with algo_of(i): inputs alternate between two sets, rows per rank between
// 256 and 128 every second call (a smaller call right after a larger one on either parity half); returns the first
// difference ("" when none).
// in: the inputs' type (fp8: each rank scales by its fp8_alpha; K = 256, two fp8 k-blocks).
std::string rs_back_to_back(World& W_, cudaStream_t stream, const std::function<RsAlgo(int)>& algo_of,
                            DType in = DType::BF16) {
    const int W = W_.world_size(), me = W_.rank();
    const int64_t n = 192, k = in == DType::F8E4M3 ? 256 : 128, es = static_cast<int64_t>(dtype_size(in));
    const int64_t rows_of[2] = {256, 128};
    const int kCalls = 1000;
    std::optional<Fp8Scales> f8s;
    if (in == DType::F8E4M3) f8s.emplace(me);
    SumCase cases[2][2];  // [size][input set]
    std::unique_ptr<DevBuf> src_a[2][2], src_b[2][2];
    for (int z = 0; z < 2; ++z)
        for (int s = 0; s < 2; ++s) {
            const int64_t m = rows_of[z] * W;
            cases[z][s] = sum_case(W_, m, n, k, 40 + z, s, in);
            src_a[z][s] = std::make_unique<DevBuf>(m * k * es);
            src_b[z][s] = std::make_unique<DevBuf>(n * k * es);
            upload(src_a[z][s]->p, cases[z][s].a[me]);
            upload(src_b[z][s]->p, cases[z][s].b[me]);
        }
    DevBuf a(rows_of[0] * W * k * es), b(n * k * es), c(rows_of[0] * n * 2);
    W_.barrier();
    const std::string err = back_to_back(
        stream, kCalls, [&](int i) { return i < 8 || i % 97 == 0 || i == kCalls - 1; },
        [&](int i, bool check) {
            const int s = i % 2, z = (i / 2) % 2;
            const int64_t rows = rows_of[z], m = rows * W;
            LOOM_CHECK_CUDA(cudaMemcpyAsync(a.p, src_a[z][s]->p, m * k * es, cudaMemcpyDeviceToDevice, stream));
            LOOM_CHECK_CUDA(cudaMemcpyAsync(b.p, src_b[z][s]->p, n * k * es, cudaMemcpyDeviceToDevice, stream));
            if (check) poison(c.p, rows * n * 2);
            GemmRsOptions o;
            o.algo = algo_of(i);
            if (f8s) f8s->apply(o);
            call_gemm_rs(W_, MatrixView{a.p, in, m, k, 0}, MatrixView{b.p, in, n, k, 0},
                         MatrixView{c.p, DType::BF16, rows, n, 0}, stream, o);
            return std::string("gemm_rs (") + to_string(o.algo) + ")";
        },
        [&](int i) {
            const int z = (i / 2) % 2;
            return compare_segment(cases[z][i % 2], me, rows_of[z], n, c.p, DType::BF16, fp8_slack(in, k));
        });
    return err;
}

// The fused epilogue's scratch halves and signals back to back; every fifth call takes the scatter-reduce, every fifth
// another the sequence, every fifth another the fused pull (the algorithms keep separate buffers and signals).
TEST_F(Overlap, GemmRsFusedBackToBack) {
    const std::string err = rs_back_to_back(*w, stream, [](int i) {
        return i % 5 == 4   ? RsAlgo::ScatterReduce
               : i % 5 == 2 ? RsAlgo::Sequential
               : i % 5 == 1 ? RsAlgo::FusedPull
                            : RsAlgo::FusedEpilogue;
    });
    agree(*w, err, "rs_fused_back_to_back");
}

// The fused pull's partial halves, signals and leftover lists, every call the fused pull: a rank writes a half again
// two calls later, while its peers' reducers may still read it unless the protocol holds (kernels/gemm_rs_pull.cuh).
// Every third call its reducers hand every part to the finish kernel (kPullAllToFinish), which otherwise sums only
// the parts left when a rank is late.
TEST_F(Overlap, GemmRsFusedPullBackToBack) {
    std::optional<ScopedRsDiag> to_finish;  // set for the call about to be made
    const std::string err = rs_back_to_back(*w, stream, [&](int i) {
        to_finish.reset();
        if (i % 3 == 1) to_finish.emplace(kPullAllToFinish);
        return RsAlgo::FusedPull;
    });
    to_finish.reset();
    agree(*w, err, "rs_pull_back_to_back");
}

// sym_out: C in the symmetric heap (the sequential algorithm all-reduces straight into a symmetric C).
// in: the inputs' type (fp8: each rank scales by its fp8_alpha).
void run_ar(World& w, cudaStream_t s, int64_t m, int64_t n, int64_t k, int tc, const std::string& label,
            const GemmArOptions& o = {}, bool sym_out = false, DType in = DType::BF16) {
    const int me = w.rank();
    const int64_t ies = static_cast<int64_t>(dtype_size(in));
    const SumCase c = sum_case(w, m, n, k, tc, 0, in);
    GemmArOptions opts = o;
    std::optional<Fp8Scales> f8s;
    if (in == DType::F8E4M3) f8s.emplace(me);
    if (f8s) f8s->apply(opts);
    DevBuf a(m * k * ies), b(n * k * ies), plain_out(sym_out ? 0 : m * n * 2);
    void* const out = sym_out ? w.alloc_bytes(m * n * 2) : plain_out.p;
    upload(a.p, c.a[me]);
    upload(b.p, c.b[me]);
    poison(out, m * n * 2);
    // The non-overlapped sequence the fused op must agree with: loom::gemm (fp32 out), then all_reduce (fp32).
    void* part32 = w.alloc_bytes(m * n * 4);
    void* sum32 = w.alloc_bytes(m * n * 4);
    w.barrier();
    std::string err;
    try {
        gemm_ar(w, MatrixView{a.p, in, m, k, 0}, MatrixView{b.p, in, n, k, 0}, MatrixView{out, DType::BF16, m, n, 0}, s,
                opts);
        GemmOptions go;
        go.alpha = opts.alpha;
        go.scale_a = opts.scale_a;
        go.scale_b = opts.scale_b;
        gemm(MatrixView{a.p, in, m, k, 0}, MatrixView{b.p, in, n, k, 0}, MatrixView{part32, DType::F32, m, n, 0}, go,
             s);
        all_reduce(w, BufferView{part32, DType::F32, static_cast<std::size_t>(m * n)},
                   BufferView{sum32, DType::F32, static_cast<std::size_t>(m * n)}, s);
        if (cudaStreamSynchronize(s) != cudaSuccess) err = "stream failed";
    } catch (const std::exception& e) {
        err = e.what();
    }
    const auto got = download_bf16(out, m * n);
    if (err.empty()) err = compare(got, c.ref, c.abs, 1, n, fp8_slack(in, k));
    if (err.empty()) {
        std::vector<float> seq(m * n);
        EXPECT_EQ(cudaMemcpy(seq.data(), sum32, m * n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        for (int64_t i = 0; i < m * n && err.empty(); ++i) {
            const double tol =
                std::fabs(seq[i]) / 128.0 + (w.world_size() / 256.0 + 2 * fp8_slack(in, k)) * c.abs[i] + 1e-3;
            if (!(std::fabs(got[i] - seq[i]) <= tol))
                err = "vs gemm + all_reduce at " + std::to_string(i) + ": " + std::to_string(got[i]) + " vs " +
                      std::to_string(seq[i]);
        }
    }
    agree(w, err, label);
    w.barrier();
    w.free(sum32);
    w.free(part32);
    if (sym_out) w.free(out);
}

// M = 8192, N = K_loc = 4608 (the heuristic's GEMM splits its tail there, in the last rank's rows at 8 ranks): each
// step of the sequential reference against an independent one, on every rank, every element — bench-overlap's own
// sequence (default GEMM into a symmetric buffer, Auto ReduceScatter, no host synchronisation between them) against
// whole tiles + scatter, the heuristic GEMM (split tail where the heuristic picks it) against whole tiles, the pull
// ReduceScatter against the scatter one, and gemm_rs (Auto) against the ReduceScatter of the whole-tile GEMM. A failure
// names the step. An element-wise measure reads an ulp of the split-tail partials (rounded to bf16 in another order)
// next to sums near zero as large (see worst_scaled).
TEST_F(Overlap, GemmRsReferenceStepsAgree) {
    World& W_ = *w;
    const int W = W_.world_size(), me = W_.rank();
    const int64_t rows = 8192 % W == 0 ? 8192 / W : 1024, m = rows * W, n = 4608, k = 4608;
    const HostMat a = make_bf16(static_cast<std::size_t>(m * k), seed_of(me, 60, 1));
    const HostMat b = make_bf16(static_cast<std::size_t>(n * k), seed_of(me, 60, 2));
    DevBuf da(m * k * 2), db(n * k * 2), split(m * n * 2), out_pull(rows * n * 2), out_scatter(rows * n * 2),
        out_rs(rows * n * 2);
    void* whole = W_.alloc_bytes(m * n * 2);  // symmetric: the pull ReduceScatter reads the peers' copies
    upload(da.p, a);
    upload(db.p, b);
    for (void* p : {split.p, out_pull.p, out_scatter.p, out_rs.p}) poison(p, p == split.p ? m * n * 2 : rows * n * 2);
    poison(whole, m * n * 2);
    const MatrixView A{da.p, DType::BF16, m, k, 0}, B{db.p, DType::BF16, n, k, 0};
    // Largest |x - y| / (|y| + 1) (bench-overlap's measure) over every element; NaN counts as infinite.
    auto worst = [](const std::vector<double>& x, const std::vector<double>& y, int64_t cols) {
        double d = 0;
        std::size_t at = 0;
        for (std::size_t i = 0; i < y.size(); ++i) {
            const double e = std::isnan(x[i]) ? INFINITY : std::fabs(x[i] - y[i]) / (std::fabs(y[i]) + 1.0);
            if (!(e <= d)) d = e, at = i;
        }
        return d < 2e-2 ? std::string()
                        : "max rel diff " + std::to_string(d) + " at (" + std::to_string(at / cols) + ", " +
                              std::to_string(at % cols) + ")";
    };
    // Against the reference's largest magnitude, max |x - y| / max |y|: for sums of W partials that two GEMMs with
    // different summation orders (split tail or not) each rounded to bf16. Element-wise, an ulp of an addend next to
    // a sum near zero reads large (0.19 at 8 ranks).
    auto worst_scaled = [](const std::vector<double>& x, const std::vector<double>& y) {
        double d = 0, scale = 0;
        for (std::size_t i = 0; i < y.size(); ++i) {
            d = std::isnan(x[i]) ? INFINITY : std::max(d, std::fabs(x[i] - y[i]));
            scale = std::max(scale, std::fabs(y[i]));
            if (std::isinf(d)) break;
        }
        return d / scale < 1e-2 ? std::string() : "max |diff| / max |ref| " + std::to_string(d / scale);
    };
    std::string err;
    // bench-overlap's reference, first and exactly as there (a fresh stream workspace, the default options, no host
    // synchronisation between the GEMM and the ReduceScatter): checked below against whole tiles + scatter.
    DevBuf out_bench(rows * n * 2);
    void* bench_partial = W_.alloc_bytes(m * n * 2);
    poison(out_bench.p, rows * n * 2);
    poison(bench_partial, m * n * 2);
    try {
        gemm(A, B, MatrixView{bench_partial, DType::BF16, m, n, 0}, {}, stream);
        reduce_scatter(W_, BufferView{bench_partial, DType::BF16, static_cast<std::size_t>(m * n)},
                       {out_bench.p, DType::BF16, static_cast<std::size_t>(rows * n)}, stream);
        LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
    } catch (const std::exception& e) {
        err = std::string("bench sequence: ") + e.what();
    }
    // Its result as it was right after the call, and its partial: a later difference means a later step wrote there.
    const std::vector<double> bench_out_then = download_bf16(out_bench.p, rows * n);
    const std::vector<double> bench_partial_then = download_bf16(bench_partial, m * n);
    try {
        int dev = 0, sms = 0, major = 0, minor = 0;
        LOOM_CHECK_CUDA(cudaGetDevice(&dev));
        LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));  // the MPS share
        LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        GemmConfig heur = gemm_heuristic(m, n, k, false, major * 10 + minor, sms);
        if (me == 0) std::printf("GemmRsReferenceStepsAgree: %d SMs, heuristic %s\n", sms, heur.str().c_str());
        GemmConfig tiles = heur;
        tiles.tail_splits = 1;
        GemmOptions go;
        go.config = &heur;
        gemm(A, B, MatrixView{split.p, DType::BF16, m, n, 0}, go, stream);
        go.config = &tiles;
        gemm(A, B, MatrixView{whole, DType::BF16, m, n, 0}, go, stream);
        LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
        const std::string e1 = worst(download_bf16(split.p, m * n), download_bf16(whole, m * n), n);
        if (!e1.empty()) err = "gemm (" + heur.str() + ") against whole tiles: " + e1;
        const BufferView in{whole, DType::BF16, static_cast<std::size_t>(m * n)};
        reduce_scatter(W_, in, {out_pull.p, DType::BF16, static_cast<std::size_t>(rows * n)}, stream,
                       CollOptions{CollAlgo::Pull, DataPath::LdSt});
        reduce_scatter(W_, in, {out_scatter.p, DType::BF16, static_cast<std::size_t>(rows * n)}, stream,
                       CollOptions{CollAlgo::Scatter, DataPath::LdSt});
        gemm_rs(W_, A, B, MatrixView{out_rs.p, DType::BF16, rows, n, 0}, stream);
        LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
        const std::vector<double> scatter = download_bf16(out_scatter.p, rows * n);
        const std::string e2 = worst(download_bf16(out_pull.p, rows * n), scatter, n);
        if (!e2.empty() && err.empty()) err = "reduce_scatter pull against scatter: " + e2;
        // Against whole tiles + scatter it is measured scaled: the fused epilogue adds the peers' bf16 partials to
        // its own fp32 one (not rounded first, as whole tiles + scatter do), and where gemm_rs takes the sequence
        // (ranks sharing a GPU, M / W not a multiple of 64) its GEMM is the heuristic's (split tail here) and rounds
        // its partials to bf16 in another order than whole tiles. The element-wise measure reads either as large next
        // to sums near zero (an addend's ulp: 0.125 at 8 ranks, 0.22-0.24 at 2 for the fused epilogue on two H200s).
        // The sequence is also checked element-wise against the bench sequence (the same GEMM; the ReduceScatter may
        // sum in another order).
        const std::vector<double> rs_out = download_bf16(out_rs.p, rows * n);
        const bool sequential =
            gemm_rs_algo(RsAlgo::Auto, collective_topology(W_).shared_gpu, nullptr, rows, 2 * k) == RsAlgo::Sequential;
        const std::string e3 = worst_scaled(rs_out, scatter);
        if (!e3.empty() && err.empty()) err = "gemm_rs against gemm + reduce_scatter: " + e3;
        const std::string e3b = sequential ? worst(rs_out, bench_out_then, n) : std::string();
        if (!e3b.empty() && err.empty()) err = "gemm_rs (sequential) against the bench sequence: " + e3b;
        const std::string e4 = worst(download_bf16(bench_partial, m * n), download_bf16(whole, m * n), n);
        if (!e4.empty() && err.empty()) err = "bench sequence's gemm (" + heur.str() + ") against whole tiles: " + e4;
        const std::string e5 = worst_scaled(bench_out_then, scatter);
        if (!e5.empty() && err.empty()) err = "bench sequence's reduce_scatter against whole tiles + scatter: " + e5;
        const std::string e6 = worst(download_bf16(out_bench.p, rows * n), bench_out_then, n);
        if (!e6.empty()) err += "; its output changed after the call: " + e6;
        const std::string e7 = worst(download_bf16(bench_partial, m * n), bench_partial_then, n);
        if (!e7.empty()) err += "; its partial changed after the call: " + e7;
    } catch (const std::exception& e) {
        err = e.what();
    }
    agree(W_, err, "gemm_rs_reference_steps");
    W_.barrier();
    W_.free(bench_partial);
    W_.free(whole);
}

// gemm_ar's algorithms, the reduce kernel with each reduction, and Auto; with their tags.
std::vector<std::pair<GemmArOptions, std::string>> ar_variants() {
    std::vector<std::pair<GemmArOptions, std::string>> v;
    for (ArAlgo algo : {ArAlgo::FusedEpilogue, ArAlgo::ReduceKernel, ArAlgo::Sequential, ArAlgo::Auto}) {
        GemmArOptions o;
        o.algo = algo;
        v.emplace_back(o, std::string("_") + to_string(algo));
    }
    for (ArShots shots : {ArShots::OneShot, ArShots::TwoShot}) {
        GemmArOptions o;
        o.algo = ArAlgo::ReduceKernel;
        o.shots = shots;
        v.emplace_back(o, std::string("_reduce-kernel-") + to_string(shots));
    }
    return v;
}

// Every algorithm and reduction (Auto: the fused epilogue at these shapes, the sequence where ranks share a GPU): M of
// one row, M not a multiple of 8 or of the tile, an N tail (N = 448: 7 slabs of 64), two consumer warpgroups (M = 128),
// the second of them partly past M (M = 100: the fused epilogue sends and sums only the 16-row groups inside C).
TEST_F(Overlap, GemmAr) {
    for (const auto& [o, tag] : ar_variants()) {
        run_ar(*w, stream, 1, 256, 256, 20, "ar_1" + tag, o);
        run_ar(*w, stream, 40, 384, 512, 21, "ar_40" + tag, o);
        run_ar(*w, stream, 37, 448, 320, 23, "ar_37" + tag, o);
        run_ar(*w, stream, 128, 512, 256, 22, "ar_128" + tag, o);
        run_ar(*w, stream, 100, 384, 192, 25, "ar_100" + tag, o);
    }
    GemmArOptions seq;
    seq.algo = ArAlgo::Sequential;
    run_ar(*w, stream, 100, 2048, 256, 24, "ar_100_sequential_symmetric_c", seq, /*sym_out=*/true);
}

// ---- 1000 back-to-back calls, inputs changing every call (two input sets alternate), gemm_ar's M changing every
// second call ----------------------------------------------------------------------------------------------------
TEST_F(Overlap, BackToBack) {
    World& W_ = *w;
    const int W = W_.world_size(), me = W_.rank();
    const int64_t rows = 72, n = 128, k = 128, m = rows * W;
    const int kCalls = 1000;
    // Checked: the first and last calls of every mix (ag_gemm's producer cycles with period 3, gemm_ar's algorithm and
    // shots with 10, its M with 4) and one in the middle.
    auto checked = [&](int i) { return i < 12 || i == 499 || i >= kCalls - 12; };
    // AG: sets 0/1 of A and B; RS and AR: sets 0/1 of A and B.
    const AgCase ag[2] = {ag_case(W_, rows, n, k, 30, 0), ag_case(W_, rows, n, k, 30, 1)};
    const SumCase rs[2] = {sum_case(W_, m, n, k, 31, 0), sum_case(W_, m, n, k, 31, 1)};
    const SumCase ar[2] = {sum_case(W_, 16, n, k, 32, 0), sum_case(W_, 16, n, k, 32, 1)};
    DevBuf ag_src[2] = {DevBuf(rows * k * 2), DevBuf(rows * k * 2)},
           ag_bsrc[2] = {DevBuf(n * k * 2), DevBuf(n * k * 2)};
    DevBuf rs_src[2] = {DevBuf(m * k * 2), DevBuf(m * k * 2)}, rs_bsrc[2] = {DevBuf(n * k * 2), DevBuf(n * k * 2)};
    DevBuf ar_src[2] = {DevBuf(16 * k * 2), DevBuf(16 * k * 2)}, ar_bsrc[2] = {DevBuf(n * k * 2), DevBuf(n * k * 2)};
    for (int s = 0; s < 2; ++s) {
        upload(ag_src[s].p, ag[s].a[me]);
        upload(ag_bsrc[s].p, ag[s].b);
        upload(rs_src[s].p, rs[s].a[me]);
        upload(rs_bsrc[s].p, rs[s].b[me]);
        upload(ar_src[s].p, ar[s].a[me]);
        upload(ar_bsrc[s].p, ar[s].b[me]);
    }
    DevBuf a_ag(rows * k * 2), b_ag(n * k * 2), c_ag(m * n * 2);
    DevBuf a_rs(m * k * 2), b_rs(n * k * 2), c_rs(rows * n * 2);
    DevBuf a_ar(16 * k * 2), b_ar(n * k * 2), c_ar(16 * n * 2);
    W_.barrier();
    std::string err;
    try {
        for (int i = 0; i < kCalls && err.empty(); ++i) {
            const int s = i % 2;
            const bool check = checked(i);
            auto cp = [&](void* d, const void* src, std::size_t bytes) {
                LOOM_CHECK_CUDA(cudaMemcpyAsync(d, src, bytes, cudaMemcpyDeviceToDevice, stream));
            };
            cp(a_ag.p, ag_src[s].p, rows * k * 2);
            cp(b_ag.p, ag_bsrc[s].p, n * k * 2);
            cp(a_rs.p, rs_src[s].p, m * k * 2);
            cp(b_rs.p, rs_bsrc[s].p, n * k * 2);
            cp(a_ar.p, ar_src[s].p, 16 * k * 2);
            cp(b_ar.p, ar_bsrc[s].p, n * k * 2);
            if (check) {
                poison(c_ag.p, m * n * 2);
                poison(c_rs.p, rows * n * 2);
                poison(c_ar.p, 16 * n * 2);
            }
            AgGemmOptions ao;
            ao.producer = i % 3 == 2 ? AgProducer::Sm : AgProducer::CopyEngine;  // both producers, interleaved
            ag_gemm(W_, MatrixView{a_ag.p, DType::BF16, rows, k, 0}, MatrixView{b_ag.p, DType::BF16, n, k, 0},
                    MatrixView{c_ag.p, DType::BF16, m, n, 0}, stream, ao);
            gemm_rs(W_, MatrixView{a_rs.p, DType::BF16, m, k, 0}, MatrixView{b_rs.p, DType::BF16, n, k, 0},
                    MatrixView{c_rs.p, DType::BF16, rows, n, 0}, stream);
            // M alternates 16, 16, 8, 8, ...: a smaller call right after a larger one, on either parity half (the
            // halves must not move with the call's size while peers still read the previous call's half).
            const int64_t ar_rows = (i / 2) % 2 == 0 ? 16 : 8;
            // Every algorithm, mixed (they share the call counter and the parity halves).
            GemmArOptions aro;
            aro.algo = i % 5 == 4 ? ArAlgo::ReduceKernel : i % 5 == 2 ? ArAlgo::Sequential : ArAlgo::FusedEpilogue;
            if (aro.algo == ArAlgo::ReduceKernel) aro.shots = (i / 5) % 2 == 0 ? ArShots::OneShot : ArShots::TwoShot;
            gemm_ar(W_, MatrixView{a_ar.p, DType::BF16, ar_rows, k, 0}, MatrixView{b_ar.p, DType::BF16, n, k, 0},
                    MatrixView{c_ar.p, DType::BF16, ar_rows, n, 0}, stream, aro);
            if (!check) continue;
            if (cudaStreamSynchronize(stream) != cudaSuccess) {
                err = "stream failed at call " + std::to_string(i);
                break;
            }
            const std::string at = " at call " + std::to_string(i);
            std::string e = compare(download_bf16(c_ag.p, m * n), ag[s].ref, ag[s].abs, 0, n);
            if (!e.empty()) err = "ag_gemm" + at + ": " + e;
            e = compare_segment(rs[s], me, rows, n, c_rs.p);
            if (!e.empty() && err.empty()) err = "gemm_rs" + at + ": " + e;
            // Rows are independent: the first ar_rows rows of the 16-row reference.
            const std::vector<double> aref(ar[s].ref.begin(), ar[s].ref.begin() + ar_rows * n);
            const std::vector<double> aabs(ar[s].abs.begin(), ar[s].abs.begin() + ar_rows * n);
            e = compare(download_bf16(c_ar.p, ar_rows * n), aref, aabs, 1, n);
            if (!e.empty() && err.empty()) err = "gemm_ar" + at + ": " + e;
        }
        if (cudaStreamSynchronize(stream) != cudaSuccess && err.empty()) err = "stream failed";
    } catch (const std::exception& e) {
        err = e.what();
    }
    agree(W_, err, "back_to_back");
}

// LOOM_AUTOTUNE=1: each op's first call of a shape times its candidates on every rank (the ops in step, into scratch
// outputs), every rank runs rank 0's pick — against the reference, every element, at that call and the next (decided
// from memory) — and rank 0 persisted one result per op under the cache's tune/ directory.
TEST_F(Overlap, AutotunedOptions) {
    const detail::ScopedSettings tune([](Settings& s) { s.autotune = true; });
    for (int call = 0; call < 2; ++call) {
        const std::string tag = "_call" + std::to_string(call);
        run_rs(*w, stream, 128, 256, 256, 70, {}, "rs_tuned" + tag);
        run_ag(*w, stream, AgGemmOptions{}, 128, 192, 256, 71, "ag_tuned" + tag, /*with_gathered=*/false);
        run_ar(*w, stream, 64, 256, 256, 72, "ar_tuned" + tag);
    }
    if (w->rank() == 0) {
        namespace fs = std::filesystem;
        const std::string key = "_w" + std::to_string(w->world_size()) + "_";
        for (const char* op : {"gemm_rs", "ag_gemm", "gemm_ar"}) {
            int found = 0;
            const fs::path dir = fs::path(jit::cache_dir()) / "tune" / op;
            if (fs::exists(dir))
                for (const auto& e : fs::directory_iterator(dir))
                    found += e.path().filename().string().find(key) != std::string::npos;
            EXPECT_GE(found, 1) << "no persisted tuning result for " << op << " in " << dir;
        }
    }
    w->barrier();
}

// ---- the SM share under MPS: overlap_usable_sms trusts cudaDevAttrMultiProcessorCount to be the client's share -----
TEST_F(Overlap, MpsShareIsTheAttribute) {
    const char* pct = std::getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    if (!pct) GTEST_SKIP() << "not an MPS client with an active thread percentage";
    int sms = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, w->device()), cudaSuccess);
    cudaDeviceProp prop{};
    ASSERT_EQ(cudaGetDeviceProperties(&prop, w->device()), cudaSuccess);
    const double share = std::atof(pct) / 100.0;
    // MPS rounds the share to whole TPCs; allow a TPC either way of p % of the H200's 132 SMs when the GPU is one.
    if (std::string(prop.name).find("H200") != std::string::npos) {
        EXPECT_NEAR(sms, 132 * share, 2.0 + 1e-9) << "attribute " << sms << " at " << pct << " %";
    }
    EXPECT_EQ(overlap_usable_sms(sms, 0), sms);
}

// ---- input validation: clear errors, raised identically on every rank (no collective step is reached) -----------
// ---- fp8 e4m3 inputs: every producer / algorithm, each rank scaling its products by its own alpha ---------------
// K = 400: a partial last k-block (128 fp8 elements per k-block); rows per rank off the tile; N tails.
TEST_F(Overlap, Fp8AgGemm) {
    const DType f8 = DType::F8E4M3;
    const bool shared = collective_topology(*w).shared_gpu;
    run_ag(*w, stream, AgGemmOptions{AgProducer::CopyEngine}, 200, 192, 400, 70, "f8_ag_ce_200", true, f8);
    run_ag(*w, stream, AgGemmOptions{AgProducer::CopyEngine}, 256, 136, 512, 71, "f8_ag_ce_own_in_place", false, f8);
    run_ag(*w, stream, AgGemmOptions{AgProducer::Sm, DataPath::Tma}, 200, 192, 400, 72, "f8_ag_sm_tma", true, f8);
    run_ag(*w, stream, AgGemmOptions{AgProducer::Sm, DataPath::LdSt}, 40, 136, 256, 73, "f8_ag_sm_ldst_40", true, f8);
    run_ag(*w, stream, AgGemmOptions{AgProducer::Sequential}, 200, 192, 400, 74, "f8_ag_sequential", true, f8);
    run_ag(*w, stream, AgGemmOptions{}, 256, 256, 512, 75, "f8_ag_auto", false, f8);
    if (shared) run_ag(*w, stream, AgGemmOptions{AgProducer::Direct}, 256, 192, 400, 76, "f8_ag_direct", false, f8);
}

TEST_F(Overlap, Fp8GemmRs) {
    const DType f8 = DType::F8E4M3, bf = DType::BF16;
    const bool own_gpus = !collective_topology(*w).shared_gpu;
    run_rs(*w, stream, 256, 512, 512, 80, {}, "f8_rs_auto", false, 0, bf, f8);
    run_rs(*w, stream, 136, 256, 400, 81, {}, "f8_rs_auto_136", false, 0, bf, f8);  // scatter-reduce / sequence
    run_rs(*w, stream, 128, 200, 400, 82, {0, nullptr, RsAlgo::FusedEpilogue, RsTransport::Sm}, "f8_rs_fused_sm", false,
           0, bf, f8);
    if (own_gpus)
        run_rs(*w, stream, 256, 200, 256, 83, {0, nullptr, RsAlgo::FusedEpilogue, RsTransport::CopyEngine},
               "f8_rs_fused_ce", false, 0, bf, f8);
    run_rs(*w, stream, 128, 200, 400, 84, {0, nullptr, RsAlgo::FusedPull}, "f8_rs_pull", false, 0, bf, f8);
    run_rs(*w, stream, 256, 200, 256, 85, {0, nullptr, RsAlgo::ScatterReduce}, "f8_rs_scatter_f32", false, 0,
           DType::F32, f8);
    GemmRsOptions seq;
    seq.algo = RsAlgo::Sequential;
    run_rs(*w, stream, 136, 200, 400, 86, seq, "f8_rs_sequential", false, 0, bf, f8);
}

// Back to back with fp8 inputs (two input sets alternating, no host synchronisation but at the checked calls): 60
// ag_gemm calls mixing the producers, 1000 gemm_rs calls mixing the algorithms and two sizes.
TEST_F(Overlap, Fp8BackToBack) {
    World& W_ = *w;
    const bool shared = collective_topology(W_).shared_gpu;
    const std::string ag = ag_back_to_back(
        W_, stream, 256, 192, 256, 95, 60, [](int i) { return i < 4 || i % 13 == 0 || i == 59; },
        [shared](int i) {
            const AgProducer p = i % 4 == 0   ? AgProducer::Sequential
                                 : i % 4 == 1 ? AgProducer::CopyEngine
                                 : i % 4 == 2 ? AgProducer::Sm
                                              : (shared ? AgProducer::Direct : AgProducer::Auto);
            return AgGemmOptions{p};
        },
        DType::F8E4M3);
    agree(W_, ag, "f8_ag_back_to_back");
    const std::string rs = rs_back_to_back(
        W_, stream,
        [](int i) {
            return i % 4 == 3   ? RsAlgo::ScatterReduce
                   : i % 4 == 2 ? RsAlgo::Sequential
                   : i % 4 == 1 ? RsAlgo::FusedPull
                                : RsAlgo::FusedEpilogue;
        },
        DType::F8E4M3);
    agree(W_, rs, "f8_rs_back_to_back");
}

TEST_F(Overlap, Fp8GemmAr) {
    for (const auto& [o, tag] : ar_variants()) {
        run_ar(*w, stream, 1, 256, 256, 90, "f8_ar_1" + tag, o, false, DType::F8E4M3);
        run_ar(*w, stream, 40, 384, 400, 91, "f8_ar_40" + tag, o, false, DType::F8E4M3);
        run_ar(*w, stream, 128, 512, 512, 92, "f8_ar_128" + tag, o, false, DType::F8E4M3);
    }
}

// The overlapped algorithms that cannot be replayed refuse a capturing stream (their signal targets and buffer halves
// are the host's, per call: a replayed graph would reuse one call's), before touching any state: the capture stays
// valid and ends cleanly, and the ops then run eagerly as before. Default options (every choice left to Loom) under
// capture run only what an eager call with the same shapes decided: with none, the op raises. (The replayable
// algorithms are captured below.)
TEST_F(Overlap, RefusesGraphCapture) {
    const int W = w->world_size();
    DevBuf a(64 * 64 * W * 2), b(64 * 64 * 2), c(64 * 64 * W * 2);
    const MatrixView bv{b.p, DType::BF16, 64, 64, 0};
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    auto refused = [&](const std::function<void()>& call) {
        try {
            call();
        } catch (const Error& e) {
            return std::string(e.what()).find("CUDA graph") != std::string::npos;
        }
        return false;
    };
    AgGemmOptions ce;
    ce.producer = AgProducer::CopyEngine;
    GemmRsOptions pull;
    pull.algo = RsAlgo::FusedPull;
    GemmArOptions reduce;
    reduce.algo = ArAlgo::ReduceKernel;
    const bool ag = refused([&] {
        ag_gemm(*w, MatrixView{a.p, DType::BF16, 8, 64, 0}, bv, MatrixView{c.p, DType::BF16, 8 * W, 64, 0}, stream, ce);
    });
    const bool rs = refused([&] {
        gemm_rs(*w, MatrixView{a.p, DType::BF16, 8 * W, 64, 0}, bv, MatrixView{c.p, DType::BF16, 8, 64, 0}, stream,
                pull);
    });
    const bool ar = refused([&] {
        gemm_ar(*w, MatrixView{a.p, DType::BF16, 8, 64, 0}, bv, MatrixView{c.p, DType::BF16, 8, 64, 0}, stream, reduce);
    });
    // No eager call has decided the default options for M = 7.
    const bool ar_undecided = refused([&] {
        gemm_ar(*w, MatrixView{a.p, DType::BF16, 7, 64, 0}, bv, MatrixView{c.p, DType::BF16, 7, 64, 0}, stream);
    });
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);  // still a valid (empty) capture
    cudaGraphDestroy(graph);
    EXPECT_TRUE(ag) << "ag_gemm (copy engine) did not refuse the capturing stream";
    EXPECT_TRUE(rs) << "gemm_rs (fused pull) did not refuse the capturing stream";
    EXPECT_TRUE(ar) << "gemm_ar (reduce kernel) did not refuse the capturing stream";
    EXPECT_TRUE(ar_undecided) << "gemm_ar with undecided default options did not refuse the capturing stream";
    gemm_ar(*w, MatrixView{a.p, DType::BF16, 8, 64, 0}, bv, MatrixView{c.p, DType::BF16, 8, 64, 0}, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    w->barrier();
}

// The replayable algorithms in one CUDA graph, replayed back to back with no host synchronisation: ag_gemm, gemm_rs
// and gemm_ar Sequential (loom::gemm and a collective; the buffer halves fixed at capture, gemm_rs meeting its peers
// before its GEMM), gemm_rs's fused epilogue with the SM transport, gemm_ar's fused epilogue twice (two shapes: its
// device call number flips the buffer half inside a replay) and gemm_ar with default options (what the eager call
// decided), gemm_rs with default options at a decode-sized shape (its Auto replays on either topology). Before replay r
// the inputs of set r % 2 are copied in on the stream and one rank starts late (a large copy first), so its peers run
// ahead into the next replay; after it the outputs are copied out. After replay 2 one eager call of each fused op runs
// (an odd count: every later replay uses the halves the other way round). Every element of every output is checked.
TEST_F(Overlap, GraphReplaysBackToBack) {
    const int W = w->world_size(), me = w->rank();
    constexpr int kReplays = 6, kEagerAfter = 2;
    const DType bf = DType::BF16;
    const int64_t ag_rows = 72, ag_n = 192, ag_k = 256;  // ag_gemm: A [72, 256] a rank, C [72 W, 192]
    const int64_t rs_seg = 40, rs_n = 320, rs_k = 192;   // gemm_rs: A [40 W, 192], C [40, 320]
    const int64_t ar_m = 24, ar_n = 256, ar_k = 320;     // gemm_ar: C [24, 256]
    const int64_t fm = 100, fn = 448, fk = 192;          // gemm_ar fused, second shape: C [100, 448]
    const int64_t rf_seg = 128, rf_n = 384, rf_k = 256;  // gemm_rs fused: A [128 W, 256], C [128, 384]
    // gemm_rs with default options, a decode-sized layer: the sequence where ranks share a GPU (K_loc x 2 bytes >
    // 8 KiB), the fused epilogue with the SM transport with a GPU per rank (one wave of tiles) — both replayable.
    const int64_t rd_seg = 128, rd_n = 128, rd_k = 4160;
    const AgCase ag[2] = {ag_case(*w, ag_rows, ag_n, ag_k, 90, 0), ag_case(*w, ag_rows, ag_n, ag_k, 90, 1)};
    const SumCase rs[2] = {sum_case(*w, rs_seg * W, rs_n, rs_k, 91, 0), sum_case(*w, rs_seg * W, rs_n, rs_k, 91, 1)};
    const SumCase ar[2] = {sum_case(*w, ar_m, ar_n, ar_k, 92, 0), sum_case(*w, ar_m, ar_n, ar_k, 92, 1)};
    const SumCase arf[2] = {sum_case(*w, fm, fn, fk, 93, 0), sum_case(*w, fm, fn, fk, 93, 1)};
    const SumCase rsf[2] = {sum_case(*w, rf_seg * W, rf_n, rf_k, 94, 0), sum_case(*w, rf_seg * W, rf_n, rf_k, 94, 1)};
    const SumCase rsd[2] = {sum_case(*w, rd_seg * W, rd_n, rd_k, 95, 0), sum_case(*w, rd_seg * W, rd_n, rd_k, 95, 1)};
    std::vector<std::unique_ptr<DevBuf>> keep;
    auto dev = [&](std::size_t bytes) {
        keep.push_back(std::make_unique<DevBuf>(bytes));
        return keep.back()->p;
    };
    struct Input {
        void* dst;
        void* src[2];
        std::size_t bytes;
    };
    std::vector<Input> inputs;
    auto input = [&](const HostMat& set0, const HostMat& set1) {
        const std::size_t bytes = set0.raw.size();
        const Input in{dev(bytes), {dev(bytes), dev(bytes)}, bytes};
        upload(in.src[0], set0);
        upload(in.src[1], set1);
        inputs.push_back(in);
        return in.dst;
    };
    void* const ag_a = input(ag[0].a[me], ag[1].a[me]);
    void* const ag_b = input(ag[0].b, ag[1].b);
    void* const rs_a = input(rs[0].a[me], rs[1].a[me]);
    void* const rs_b = input(rs[0].b[me], rs[1].b[me]);
    void* const ar_a = input(ar[0].a[me], ar[1].a[me]);
    void* const ar_b = input(ar[0].b[me], ar[1].b[me]);
    void* const arf_a = input(arf[0].a[me], arf[1].a[me]);
    void* const arf_b = input(arf[0].b[me], arf[1].b[me]);
    void* const rsf_a = input(rsf[0].a[me], rsf[1].a[me]);
    void* const rsf_b = input(rsf[0].b[me], rsf[1].b[me]);
    void* const rsd_a = input(rsd[0].a[me], rsd[1].a[me]);
    void* const rsd_b = input(rsd[0].b[me], rsd[1].b[me]);
    // An output: its buffer, and where each replay's copy of it goes. check(set, bytes): "" or what is wrong.
    struct Output {
        std::string name;
        void* c;
        std::size_t bytes;
        char* replays;
        std::function<std::string(int, const void*)> check;
    };
    std::vector<Output> outputs;
    auto output = [&](const std::string& name, std::size_t bytes, std::function<std::string(int, const void*)> check) {
        outputs.push_back({name, dev(bytes), bytes, static_cast<char*>(dev(bytes * kReplays)), std::move(check)});
        return outputs.back().c;
    };
    auto ar_check = [&](const SumCase* cs, int64_t m, int64_t n) {
        return [cs, m, n](int set, const void* p) {
            return compare(download_bf16(p, m * n), cs[set].ref, cs[set].abs, 1, n);
        };
    };
    void* const ag_c = output("ag_gemm sequential", ag_rows * W * ag_n * 2, [&](int set, const void* p) {
        return compare(download_bf16(p, ag_rows * W * ag_n), ag[set].ref, ag[set].abs, 0, ag_n);
    });
    void* const rs_c = output("gemm_rs sequential", rs_seg * rs_n * 2,
                              [&](int set, const void* p) { return compare_segment(rs[set], me, rs_seg, rs_n, p); });
    auto rsf_check = [&](int set, const void* p) { return compare_segment(rsf[set], me, rf_seg, rf_n, p); };
    void* const rsf_c = output("gemm_rs fused (SM transport)", rf_seg * rf_n * 2, rsf_check);
    void* const rsd_c = output("gemm_rs default options", rd_seg * rd_n * 2,
                               [&](int set, const void* p) { return compare_segment(rsd[set], me, rd_seg, rd_n, p); });
    void* const ar_c = output("gemm_ar sequential", ar_m * ar_n * 2, ar_check(ar, ar_m, ar_n));
    void* const arf1_c = output("gemm_ar fused", ar_m * ar_n * 2, ar_check(ar, ar_m, ar_n));
    void* const arf2_c = output("gemm_ar fused (second shape)", fm * fn * 2, ar_check(arf, fm, fn));
    void* const ard_c = output("gemm_ar default options", ar_m * ar_n * 2, ar_check(ar, ar_m, ar_n));
    void* const eager_c = dev(fm * fn * 2);  // the eager fused calls' outputs
    void* const eager_rs_c = dev(rf_seg * rf_n * 2);
    constexpr std::size_t kDelayBytes = std::size_t{64} << 20;
    char* const delay = static_cast<char*>(dev(2 * kDelayBytes));
    for (const Input& in : inputs) LOOM_CHECK_CUDA(cudaMemcpy(in.dst, in.src[0], in.bytes, cudaMemcpyDeviceToDevice));
    AgGemmOptions ago;
    ago.producer = AgProducer::Sequential;
    GemmRsOptions rso;
    rso.algo = RsAlgo::Sequential;
    GemmRsOptions rsfo;
    rsfo.algo = RsAlgo::FusedEpilogue;
    rsfo.transport = RsTransport::Sm;
    GemmArOptions seq, fused;
    seq.algo = ArAlgo::Sequential;
    fused.algo = ArAlgo::FusedEpilogue;
    auto rs_fused = [&](void* c) {
        gemm_rs(*w, MatrixView{rsf_a, bf, rf_seg * W, rf_k, 0}, MatrixView{rsf_b, bf, rf_n, rf_k, 0},
                MatrixView{c, bf, rf_seg, rf_n, 0}, stream, rsfo);
    };
    auto fused_second = [&](void* c) {
        gemm_ar(*w, MatrixView{arf_a, bf, fm, fk, 0}, MatrixView{arf_b, bf, fn, fk, 0}, MatrixView{c, bf, fm, fn, 0},
                stream, fused);
    };
    auto enqueue = [&] {
        ag_gemm(*w, MatrixView{ag_a, bf, ag_rows, ag_k, 0}, MatrixView{ag_b, bf, ag_n, ag_k, 0},
                MatrixView{ag_c, bf, ag_rows * W, ag_n, 0}, stream, ago);
        gemm_rs(*w, MatrixView{rs_a, bf, rs_seg * W, rs_k, 0}, MatrixView{rs_b, bf, rs_n, rs_k, 0},
                MatrixView{rs_c, bf, rs_seg, rs_n, 0}, stream, rso);
        rs_fused(rsf_c);
        gemm_rs(*w, MatrixView{rsd_a, bf, rd_seg * W, rd_k, 0}, MatrixView{rsd_b, bf, rd_n, rd_k, 0},
                MatrixView{rsd_c, bf, rd_seg, rd_n, 0}, stream);
        const MatrixView a{ar_a, bf, ar_m, ar_k, 0}, b{ar_b, bf, ar_n, ar_k, 0};
        gemm_ar(*w, a, b, MatrixView{ar_c, bf, ar_m, ar_n, 0}, stream, seq);
        gemm_ar(*w, a, b, MatrixView{arf1_c, bf, ar_m, ar_n, 0}, stream, fused);
        fused_second(arf2_c);
        gemm_ar(*w, a, b, MatrixView{ard_c, bf, ar_m, ar_n, 0}, stream);
    };
    // One eager round (it creates the ops' state and buffers, loads every kernel and decides the default options:
    // all of which synchronise, which a capturing thread must not do), then the capture.
    w->barrier();
    enqueue();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    w->barrier();
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    std::string err;
    try {
        enqueue();
    } catch (const std::exception& e) {
        err = std::string("capture: ") + e.what();
    }
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    if (err.empty() && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) err = "graph instantiate failed";
    cudaGraphDestroy(graph);
    agree(*w, err, "graph_capture");
    if (!err.empty()) return;
    try {
        for (int r = 0; r < kReplays; ++r) {
            if (r % W == me)  // this replay's late rank
                LOOM_CHECK_CUDA(
                    cudaMemcpyAsync(delay + kDelayBytes, delay, kDelayBytes, cudaMemcpyDeviceToDevice, stream));
            for (const Input& in : inputs)
                LOOM_CHECK_CUDA(cudaMemcpyAsync(in.dst, in.src[r % 2], in.bytes, cudaMemcpyDeviceToDevice, stream));
            for (const Output& o : outputs) LOOM_CHECK_CUDA(cudaMemsetAsync(o.c, 0xFF, o.bytes, stream));  // NaN
            LOOM_CHECK_CUDA(cudaGraphLaunch(exec, stream));
            for (const Output& o : outputs)
                LOOM_CHECK_CUDA(
                    cudaMemcpyAsync(o.replays + r * o.bytes, o.c, o.bytes, cudaMemcpyDeviceToDevice, stream));
            if (r == kEagerAfter) {
                LOOM_CHECK_CUDA(cudaMemsetAsync(eager_c, 0xFF, fm * fn * 2, stream));
                LOOM_CHECK_CUDA(cudaMemsetAsync(eager_rs_c, 0xFF, rf_seg * rf_n * 2, stream));
                fused_second(eager_c);  // inputs of set r % 2, as this replay's
                rs_fused(eager_rs_c);
            }
        }
    } catch (const std::exception& e) {
        err = std::string("replays: ") + e.what();
    }
    if (cudaStreamSynchronize(stream) != cudaSuccess && err.empty()) err = "stream failed";
    for (int r = 0; r < kReplays && err.empty(); ++r)
        for (const Output& o : outputs) {
            const std::string e = o.check(r % 2, o.replays + r * o.bytes);
            if (!e.empty()) {
                err = "replay " + std::to_string(r) + ", " + o.name + ": " + e;
                break;
            }
        }
    if (err.empty()) {
        const std::string e = ar_check(arf, fm, fn)(kEagerAfter % 2, eager_c);
        if (!e.empty()) err = "eager gemm_ar fused between replays: " + e;
    }
    if (err.empty()) {
        const std::string e = rsf_check(kEagerAfter % 2, eager_rs_c);
        if (!e.empty()) err = "eager gemm_rs fused between replays: " + e;
    }
    cudaGraphExecDestroy(exec);
    agree(*w, err, "graph_replays");
    w->barrier();
}

TEST_F(Overlap, RejectsBadInputs) {
    const int W = w->world_size();
    DevBuf a(64 * 64 * 2), b(64 * 64 * 2), c(64 * 64 * W * 2);
    EXPECT_THROW(gemm_rs(*w, MatrixView{a.p, DType::BF16, 8 * W + 1, 64, 0}, MatrixView{b.p, DType::BF16, 64, 64, 0},
                         MatrixView{c.p, DType::BF16, 8, 64, 0}, stream),
                 Error);  // M not a multiple of W (W > 1) or C's shape wrong (W == 1)
    EXPECT_THROW(ag_gemm(*w, MatrixView{a.p, DType::F32, 8, 64, 0}, MatrixView{b.p, DType::BF16, 64, 64, 0},
                         MatrixView{c.p, DType::BF16, 8 * W, 64, 0}, stream),
                 Error);  // fp32 A
    AgGemmOptions o;
    o.gathered = MatrixView{c.p, DType::BF16, 8 * W, 64, 0};  // C's own memory
    EXPECT_THROW(ag_gemm(*w, MatrixView{a.p, DType::BF16, 8, 64, 0}, MatrixView{b.p, DType::BF16, 64, 64, 0},
                         MatrixView{c.p, DType::BF16, 8 * W, 64, 0}, stream, o),
                 Error);
    EXPECT_THROW(gemm_ar(*w, MatrixView{a.p, DType::BF16, 8, 64, 0}, MatrixView{b.p, DType::BF16, 64, 64, 0},
                         MatrixView{c.p, DType::BF16, 16, 64, 0}, stream),
                 Error);  // C's rows not M
    GemmArOptions shots_fused;
    shots_fused.algo = ArAlgo::FusedEpilogue;
    shots_fused.shots = ArShots::TwoShot;
    EXPECT_THROW(gemm_ar(*w, MatrixView{a.p, DType::BF16, 8, 64, 0}, MatrixView{b.p, DType::BF16, 64, 64, 0},
                         MatrixView{c.p, DType::BF16, 8, 64, 0}, stream, shots_fused),
                 Error);  // a reduction asked of the fused epilogue
    const DType f8 = DType::F8E4M3;
    EXPECT_THROW(ag_gemm(*w, MatrixView{a.p, f8, 8, 64, 0}, MatrixView{b.p, DType::BF16, 64, 64, 0},
                         MatrixView{c.p, DType::BF16, 8 * W, 64, 0}, stream),
                 Error);  // fp8 A with a bf16 B
    EXPECT_THROW(gemm_rs(*w, MatrixView{a.p, f8, 8 * W, 24, 32}, MatrixView{b.p, f8, 64, 24, 32},
                         MatrixView{c.p, DType::BF16, 8, 64, 0}, stream),
                 Error);  // fp8 with K = 24, not a multiple of 16
    GemmArOptions nan_alpha;
    nan_alpha.alpha = NAN;
    EXPECT_THROW(gemm_ar(*w, MatrixView{a.p, DType::BF16, 8, 64, 0}, MatrixView{b.p, DType::BF16, 64, 64, 0},
                         MatrixView{c.p, DType::BF16, 8, 64, 0}, stream, nan_alpha),
                 Error);  // alpha not finite
    float host_scale = 1.f;
    GemmRsOptions host_ptr;
    host_ptr.scale_a = &host_scale;
    EXPECT_THROW(gemm_rs(*w, MatrixView{a.p, DType::BF16, 8 * W, 64, 0}, MatrixView{b.p, DType::BF16, 64, 64, 0},
                         MatrixView{c.p, DType::BF16, 8, 64, 0}, stream, host_ptr),
                 Error);  // a device scale in host memory
    w->barrier();
}

}  // namespace
}  // namespace loom
