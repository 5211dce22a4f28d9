// The overlapped GEMMs (gemm_ar, gemm_rs, ag_gemm) over a grid of M from 1 to 300 (primes 17, 97, 251 among them), a
// few N and K_loc (gemm_ar also at M = 1000, 4096 and 16384, and back to back), at whatever world size loomrun gives
// (1..8), against an fp64 device reference: every rank regenerates its peers' inputs from their seeds and sums their
// products with a naive kernel (tests/common/kernels/gemm_reference.cuh). Outputs poisoned with NaN, every element
// checked; verdicts agreed across ranks. Also loom::gemm at issue #40's shape with this process's own heuristic (under
// loomrun's MPS shares, the share's config), and gemm_ar at that shape planned on 26 SMs. Run: loomrun -n {1,2,3,4,8}
// build/tests/loom_dist_tests --gtest_filter='OverlapShapes.*'
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/device_io.hpp"
#include "common/gemm_reference.hpp"
#include "common/reference.hpp"
#include "common/test_env.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/error.hpp"

namespace loom {
namespace {

uint64_t seed_of(int rank, int tc, int what) { return 0x2545f4914f6cdd1dull * (rank + 1) + 7919ull * tc + what + 31; }

using test::DevMem;

// Runs `op` (which enqueues the call on s) and checks rows [row0, row0 + rows) of C (bf16, [rows, n]) against the
// reference; "" or what is wrong. Tolerance: partial sums rounded to bf16 once (`roundings` = 1) or not at all.
template <class Op>
std::string run_and_compare(cudaStream_t s, const Op& op, const test::DeviceReference& ref, const void* c, int64_t row0,
                            int64_t rows, int64_t n, int roundings) {
    try {
        op();
        const cudaError_t e = cudaStreamSynchronize(s);
        if (e != cudaSuccess) return std::string("stream failed: ") + cudaGetErrorString(e);
    } catch (const std::exception& e) {
        return e.what();
    }
    std::vector<double> r, a;
    ref.download(r, a, row0, rows, s);
    return test::compare_to_reference(test::download_matrix(c, DType::BF16, rows, n, n), r, a, n, 1.0 / 128,
                                      roundings ? 1.0 / 256 : 1.0 / 65536, 1e-3);
}

class OverlapShapes : public WorldStreamTest {};

// gemm_ar: C[M, N] = sum over ranks of A_r[M, K] B_r[N, K]^T.
void check_ar(World& w, cudaStream_t s, int64_t m, int64_t n, int64_t k, int tc, GemmArOptions o,
              const std::string& label) {
    const int W = w.world_size(), me = w.rank();
    DevMem a(m * k * 2), b(n * k * 2), c(m * n * 2), pa(m * k * 2), pb(n * k * 2);
    test::DeviceReference ref(m, n);
    for (int r = 0; r < W; ++r) {  // every rank's inputs, regenerated from its seeds
        test::upload_random_bf16(pa.p, m * k, seed_of(r, tc, 1));
        test::upload_random_bf16(pb.p, n * k, seed_of(r, tc, 2));
        ref.add(pa.p, pb.p, DType::BF16, false, k, 1.0, r > 0, s);
        LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
    }
    test::upload_random_bf16(a.p, m * k, seed_of(me, tc, 1));
    test::upload_random_bf16(b.p, n * k, seed_of(me, tc, 2));
    test::poison_nan(c.p, m * n * 2);
    w.barrier();
    const std::string err = run_and_compare(
        s,
        [&] {
            gemm_ar(w, MatrixView{a.p, DType::BF16, m, k, 0}, MatrixView{b.p, DType::BF16, n, k, 0},
                    MatrixView{c.p, DType::BF16, m, n, 0}, s, o);
        },
        ref, c.p, 0, m, n, 1);
    const std::string all = test::agree(w, err, "test/overlap_shapes/" + label);
    EXPECT_TRUE(all.empty()) << label << ":\n" << all;
    w.barrier();
}

// gemm_rs: C_r[rows, N] = rows [r rows, (r + 1) rows) of the sum over ranks of A_r[rows W, K] B_r[N, K]^T.
void check_rs(World& w, cudaStream_t s, int64_t rows, int64_t n, int64_t k, int tc, GemmRsOptions o,
              const std::string& label) {
    const int W = w.world_size(), me = w.rank();
    const int64_t m = rows * W;
    DevMem a(m * k * 2), b(n * k * 2), c(rows * n * 2), pa(m * k * 2), pb(n * k * 2);
    test::DeviceReference ref(m, n);
    for (int r = 0; r < W; ++r) {
        test::upload_random_bf16(pa.p, m * k, seed_of(r, tc, 3));
        test::upload_random_bf16(pb.p, n * k, seed_of(r, tc, 4));
        ref.add(pa.p, pb.p, DType::BF16, false, k, 1.0, r > 0, s);
        LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
    }
    test::upload_random_bf16(a.p, m * k, seed_of(me, tc, 3));
    test::upload_random_bf16(b.p, n * k, seed_of(me, tc, 4));
    test::poison_nan(c.p, rows * n * 2);
    w.barrier();
    const std::string err = run_and_compare(
        s,
        [&] {
            gemm_rs(w, MatrixView{a.p, DType::BF16, m, k, 0}, MatrixView{b.p, DType::BF16, n, k, 0},
                    MatrixView{c.p, DType::BF16, rows, n, 0}, s, o);
        },
        ref, c.p, me * rows, rows, n, 1);
    const std::string all = test::agree(w, err, "test/overlap_shapes/" + label);
    EXPECT_TRUE(all.empty()) << label << ":\n" << all;
    w.barrier();
}

// ag_gemm: C[rows W, N] = all_gather(A_r[rows, K]) B_me[N, K]^T (one rounding: the GEMM's output).
void check_ag(World& w, cudaStream_t s, int64_t rows, int64_t n, int64_t k, int tc, AgGemmOptions o,
              const std::string& label) {
    const int W = w.world_size(), me = w.rank();
    const int64_t m = rows * W;
    DevMem a(rows * k * 2), b(n * k * 2), c(m * n * 2), gathered(m * k * 2);
    for (int r = 0; r < W; ++r)  // the gathered A, regenerated shard by shard
        test::upload_random_bf16(static_cast<char*>(gathered.p) + r * rows * k * 2, rows * k, seed_of(r, tc, 5));
    test::upload_random_bf16(a.p, rows * k, seed_of(me, tc, 5));
    test::upload_random_bf16(b.p, n * k, seed_of(me, tc, 6));
    test::DeviceReference ref(m, n);
    ref.add(gathered.p, b.p, DType::BF16, false, k, 1.0, false, s);
    test::poison_nan(c.p, m * n * 2);
    LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
    w.barrier();
    const std::string err = run_and_compare(
        s,
        [&] {
            ag_gemm(w, MatrixView{a.p, DType::BF16, rows, k, 0}, MatrixView{b.p, DType::BF16, n, k, 0},
                    MatrixView{c.p, DType::BF16, m, n, 0}, s, o);
        },
        ref, c.p, 0, m, n, 0);
    const std::string all = test::agree(w, err, "test/overlap_shapes/" + label);
    EXPECT_TRUE(all.empty()) << label << ":\n" << all;
    w.barrier();
}

struct NK {
    int64_t n, k;
};
// Two (N, K_loc) pairs, alternated over the M grid: an N tail of every common tile width with a deeper K, and a wide N
// with a short K.
constexpr NK kShapes[] = {{1032, 136}, {136, 520}};

std::string tag(const char* op, int64_t m, const NK& s, const char* algo) {
    return fmt::format("{}_m{}_n{}_k{}_{}", op, m, s.n, s.k, algo);
}

// The reduce kernel with the given reduction.
GemmArOptions reduce_kernel(ArShots shots) {
    GemmArOptions o;
    o.algo = ArAlgo::ReduceKernel;
    o.shots = shots;
    return o;
}

// Every algorithm (the reduce kernel with each reduction) and Auto at M; `fused`: the fused epilogue too.
void check_ar_algos(World& w, cudaStream_t s, int64_t m, const NK& sh, int tc, bool fused) {
    for (ArAlgo algo : {ArAlgo::Auto, ArAlgo::Sequential, ArAlgo::FusedEpilogue}) {
        if (algo == ArAlgo::FusedEpilogue && !fused) continue;
        GemmArOptions o;
        o.algo = algo;
        check_ar(w, s, m, sh.n, sh.k, tc, o, tag("ar", m, sh, to_string(algo)));
    }
    for (ArShots shots : {ArShots::OneShot, ArShots::TwoShot})
        check_ar(w, s, m, sh.n, sh.k, tc, reduce_kernel(shots),
                 tag("ar", m, sh, fmt::format("reduce-kernel-{}", to_string(shots)).c_str()));
}

TEST_F(OverlapShapes, GemmArOverM) {
    int tc = 0;
    for (int64_t m : {1, 2, 7, 17, 64, 97, 128, 129, 251, 300}) {
        const NK& s = kShapes[tc % 2];
        // Every algorithm at M = 7, 97, 129 and 251; Auto elsewhere.
        if (m == 7 || m == 97 || m == 129 || m == 251) {
            check_ar_algos(*w, stream, m, s, 100 + tc, true);
        } else {
            check_ar(*w, stream, m, s.n, s.k, 100 + tc, {}, tag("ar", m, s, "auto"));
        }
        ++tc;
    }
}

// M in the thousands (prefill): every algorithm and reduction, N and K_loc not multiples of the tiles, C's tiles
// spread over several waves. The fused epilogue up to M = 4096 (its receive buffer holds W - 1 copies of C).
TEST_F(OverlapShapes, GemmArLargeM) {
    constexpr NK kLarge[] = {{1032, 136}, {520, 200}, {264, 72}};
    int tc = 0;
    for (int64_t m : {1000, 4096, 16384}) {
        check_ar_algos(*w, stream, m, kLarge[tc], 150 + tc, m <= 4096);
        ++tc;
    }
}

// The reduce kernel's work split: its side blocks claim the tiles stored under the GEMM and a full grid after the GEMM
// claims the rest, from one counter. The side blocks at their fewest (1: the full grid sums nearly every tile) and
// at 16 (they may sum every tile before the full grid starts), each reduction, at M = 1 (one row of tiles), 129 (a
// one-row M-block after a whole one) and 1000 (not a multiple of the tile), and on 8 SMs (a small full grid).
TEST_F(OverlapShapes, GemmArReduceSplit) {
    int tc = 0;
    for (int64_t m : {1, 129, 1000}) {
        const NK& s = kShapes[tc % 2];
        for (int comm : {1, 16}) {
            for (ArShots shots : {ArShots::OneShot, ArShots::TwoShot}) {
                GemmArOptions o = reduce_kernel(shots);
                o.comm_sms = comm;
                check_ar(*w, stream, m, s.n, s.k, 180 + tc, o,
                         tag("ar", m, s, fmt::format("split-{}-{}", comm, to_string(shots)).c_str()));
            }
        }
        GemmArOptions few = reduce_kernel(ArShots::TwoShot);
        few.num_sms = 8;
        check_ar(*w, stream, m, s.n, s.k, 180 + tc, few, tag("ar", m, s, "split-sms8"));
        ++tc;
    }
}

// A caller's 192-row tiles (three consumer warpgroups): the reduce kernel takes them with either reduction, and Auto
// gives them the reduce kernel (the fused epilogue's per-tile signals count two warpgroups); M not a multiple of the
// tile, N a 176-column tail.
TEST_F(OverlapShapes, GemmArCallersThreeWarpgroupTiles) {
    GemmConfig cfg;
    cfg.block_m = 192;
    cfg.block_n = 176;
    cfg.stages = 3;
    const NK s{520, 136};
    int tc = 0;
    for (int64_t m : {100, 500}) {
        for (const auto& [o, name] : {std::pair{reduce_kernel(ArShots::OneShot), "reduce-kernel-one-shot"},
                                      std::pair{reduce_kernel(ArShots::TwoShot), "reduce-kernel-two-shot"},
                                      std::pair{GemmArOptions{}, "auto"}}) {
            GemmArOptions with = o;
            with.config = &cfg;
            check_ar(*w, stream, m, s.n, s.k, 190 + tc, with, tag("ar", m, s, (std::string(name) + "-bm192").c_str()));
        }
        ++tc;
    }
}

// The reduce kernel's two reductions back to back with no host synchronisation between the calls: two input sets
// alternating and M alternating 1000, 1000, 616, 616, ... (a smaller call right after a larger one, on either parity
// half), the reductions mixed with the sequence (they share the partials and their call counter), the side blocks and
// the full grid varied between calls (comm_sms 1 or the plan's, num_sms 8 or all: the claim counter's base moves by
// each call's blocks); C checked at a few calls, every element.
TEST_F(OverlapShapes, GemmArBackToBack) {
    World& W_ = *w;
    const int W = W_.world_size(), me = W_.rank();
    const int64_t mmax = 1000, n = 264, k = 72;
    const int kCalls = 40;
    DevMem a[2] = {DevMem(mmax * k * 2), DevMem(mmax * k * 2)}, b[2] = {DevMem(n * k * 2), DevMem(n * k * 2)};
    DevMem pa(mmax * k * 2), pb(n * k * 2), c(mmax * n * 2);
    test::DeviceReference ref0(mmax, n), ref1(mmax, n);
    test::DeviceReference* refs[2] = {&ref0, &ref1};
    for (int set = 0; set < 2; ++set) {
        for (int r = 0; r < W; ++r) {
            test::upload_random_bf16(pa.p, mmax * k, seed_of(r, 170 + set, 1));
            test::upload_random_bf16(pb.p, n * k, seed_of(r, 170 + set, 2));
            refs[set]->add(pa.p, pb.p, DType::BF16, false, k, 1.0, r > 0, stream);
            LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
        }
        test::upload_random_bf16(a[set].p, mmax * k, seed_of(me, 170 + set, 1));
        test::upload_random_bf16(b[set].p, n * k, seed_of(me, 170 + set, 2));
    }
    W_.barrier();
    std::string err;
    for (int i = 0; i < kCalls && err.empty(); ++i) {
        const int set = i % 2;
        const int64_t m = (i / 2) % 2 == 0 ? mmax : 616;
        const bool check = i == 0 || i == 1 || i == 17 || i == kCalls - 1;
        GemmArOptions o = reduce_kernel(i % 3 == 0 ? ArShots::OneShot : ArShots::TwoShot);
        if (i % 4 == 1) o.comm_sms = 1;
        if (i % 5 == 2) o.num_sms = 8;
        if (i % 7 == 3) {
            o.algo = ArAlgo::Sequential;
            o.shots = ArShots::Auto;
        }
        try {
            if (check) LOOM_CHECK_CUDA(cudaMemsetAsync(c.p, 0xFF, mmax * n * 2, stream));  // NaN
            gemm_ar(W_, MatrixView{a[set].p, DType::BF16, m, k, 0}, MatrixView{b[set].p, DType::BF16, n, k, 0},
                    MatrixView{c.p, DType::BF16, m, n, 0}, stream, o);
            if (!check) continue;
            const cudaError_t e = cudaStreamSynchronize(stream);
            if (e != cudaSuccess) {
                err = fmt::format("stream failed at call {}: {}", i, cudaGetErrorString(e));
                break;
            }
        } catch (const std::exception& e) {
            err = fmt::format("call {}: {}", i, e.what());
            break;
        }
        std::vector<double> r, ab;
        refs[set]->download(r, ab, 0, m, stream);
        const std::string e = test::compare_to_reference(test::download_matrix(c.p, DType::BF16, m, n, n), r, ab, n,
                                                         1.0 / 128, 1.0 / 256, 1e-3);
        if (!e.empty()) err = fmt::format("call {} (M = {}, {}): {}", i, m, to_string(o.shots), e);
    }
    if (err.empty() && cudaStreamSynchronize(stream) != cudaSuccess) err = "stream failed";
    const std::string all = test::agree(W_, err, "test/overlap_shapes/ar_back_to_back");
    EXPECT_TRUE(all.empty()) << all;
    W_.barrier();
}

TEST_F(OverlapShapes, GemmRsOverM) {
    int tc = 0;
    for (int64_t rows : {1, 2, 17, 64, 97, 128, 251, 300}) {
        const NK& s = kShapes[tc % 2];
        for (RsAlgo algo : {RsAlgo::Auto, RsAlgo::Sequential, RsAlgo::ScatterReduce, RsAlgo::FusedPull}) {
            // The fused pull needs rows a multiple of its tile's BLOCK_M (64 or 128): rows 64 and 128 only.
            if (algo == RsAlgo::FusedPull && rows % 64 != 0) continue;
            if (algo != RsAlgo::Auto && algo != RsAlgo::FusedPull && rows != 17 && rows != 97 && rows != 251) continue;
            GemmRsOptions o;
            o.algo = algo;
            check_rs(*w, stream, rows, s.n, s.k, 200 + tc, o, tag("rs", rows, s, to_string(algo)));
        }
        ++tc;
    }
}

TEST_F(OverlapShapes, AgGemmOverM) {
    int tc = 0;
    for (int64_t rows : {1, 2, 17, 64, 97, 128, 251, 300}) {
        const NK& s = kShapes[tc % 2];
        for (AgProducer p : {AgProducer::Auto, AgProducer::CopyEngine, AgProducer::Sm, AgProducer::Sequential}) {
            if (p != AgProducer::Auto && rows != 17 && rows != 97 && rows != 251) continue;
            AgGemmOptions o;
            o.producer = p;
            check_ag(*w, stream, rows, s.n, s.k, 300 + tc, o, tag("ag", rows, s, to_string(p)));
        }
        ++tc;
    }
}

// Issue #40: loom::gemm at M = 17, N = 4096, K = 2048 with this process's own heuristic (under loomrun -n 4 on one
// H200 each rank has a 20 % MPS share, 26 SMs, and gets 64 x 160 tiles), then gemm_ar at that shape with its default
// plan and planned on 26 SMs.
TEST_F(OverlapShapes, IssueShapeAtThisShare) {
    const int64_t m = 17, n = 4096, k = 2048;
    {
        DevMem a(m * k * 2), b(n * k * 2), c(m * n * 2);
        test::upload_random_bf16(a.p, m * k, seed_of(w->rank(), 400, 1));
        test::upload_random_bf16(b.p, n * k, seed_of(w->rank(), 400, 2));
        test::DeviceReference ref(m, n);
        ref.add(a.p, b.p, DType::BF16, false, k, 1.0, false, stream);
        test::poison_nan(c.p, m * n * 2);
        LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
        const std::string err = run_and_compare(
            stream,
            [&] {
                gemm(MatrixView{a.p, DType::BF16, m, k, 0}, MatrixView{b.p, DType::BF16, n, k, 0},
                     MatrixView{c.p, DType::BF16, m, n, 0}, {}, stream);
            },
            ref, c.p, 0, m, n, 0);
        const std::string all = test::agree(*w, err, "test/overlap_shapes/issue_gemm");
        EXPECT_TRUE(all.empty()) << "loom::gemm 17 x 4096 x 2048 at this process's SMs:\n" << all;
    }
    check_ar(*w, stream, m, n, k, 401, {}, "issue_gemm_ar");
    GemmArOptions at26;
    at26.num_sms = 26;
    check_ar(*w, stream, m, n, k, 402, at26, "issue_gemm_ar_26_sms");
}

}  // namespace
}  // namespace loom
