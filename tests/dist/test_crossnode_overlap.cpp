// The overlapped GEMMs (ag_gemm, gemm_rs, gemm_ar) in a World of several nodes (docs/crossnode.md, docs/overlap.md
// "Across nodes"): every algorithm that runs there (ag_gemm: Auto, Sequential and the two-level CopyEngine form;
// gemm_rs: Auto, Sequential and the two-level ScatterReduce form; gemm_ar: Auto and Sequential) against an fp64 device
// reference (every rank regenerates its peers' inputs from their seeds), M per rank from 1 row to several waves of
// tiles, N and K_loc off the tiles, C strided or in the symmetric heap, ag_gemm's gathered buffer in and outside the
// heap (checked bitwise), calls back to back; and the error of an algorithm that runs within one node only. Outputs
// poisoned with NaN, every element checked; verdicts agreed across ranks. One input dtype (bf16): each kernel compiled
// with remote peers is a JIT of ~20 s on first use. In a one-node World the same checks run the one-node forms; only
// the refusal test skips.
//
// Run:
//   LOOM_NODE_SIZE=2 build/bin/loomrun -n 4 build/tests/loom_dist_tests --gtest_filter='CrossNodeOverlap.*'  # 2x2
//   LOOM_NODE_SIZE=4 build/bin/loomrun -n 8 build/tests/loom_dist_tests --gtest_filter='CrossNodeOverlap.*'  # 2x4
//   LOOM_NODE_SIZE=2 build/bin/loomrun -n 8 build/tests/loom_dist_tests --gtest_filter='CrossNodeOverlap.*'  # 4x2
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/device_io.hpp"
#include "common/gemm_reference.hpp"
#include "common/reference.hpp"
#include "common/symmetric.hpp"
#include "common/test_env.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/error.hpp"

namespace loom {
namespace {

uint64_t seed_of(int rank, int tc, int what) { return 0x9e3779b97f4a7c15ull * (rank + 1) + 6151ull * tc + what + 17; }

using test::DevMem;

// C's memory: plain (cudaMalloc) or symmetric, `rows` x ld bf16 elements.
struct COut {
    std::optional<DevMem> plain;
    std::optional<test::Sym> sym;
    void* p = nullptr;
    COut(World& w, int64_t rows, int64_t ld, bool symmetric) {
        const std::size_t bytes = static_cast<std::size_t>(rows * ld) * 2;
        if (symmetric) {
            p = sym.emplace(w, bytes).p;
        } else {
            p = plain.emplace(bytes).p;
        }
    }
};

// Runs `op` (which enqueues the call on s) and checks rows [row0, row0 + rows) of C (bf16, [rows, n], ld) against the
// reference; "" or what is wrong. Tolerance: partial sums rounded to bf16 once (`roundings` = 1) or not at all.
template <class Op>
std::string run_and_compare(cudaStream_t s, const Op& op, const test::DeviceReference& ref, const void* c, int64_t row0,
                            int64_t rows, int64_t n, int64_t ld, int roundings) {
    try {
        op();
        const cudaError_t e = cudaStreamSynchronize(s);
        if (e != cudaSuccess) return std::string("stream failed: ") + cudaGetErrorString(e);
    } catch (const std::exception& e) {
        return e.what();
    }
    std::vector<double> r, a;
    ref.download(r, a, row0, rows, s);
    return test::compare_to_reference(test::download_matrix(c, DType::BF16, rows, n, ld), r, a, n, 1.0 / 128,
                                      roundings ? 1.0 / 256 : 1.0 / 65536, 1e-3);
}

class CrossNodeOverlap : public WorldStreamTest {};

std::string tag(const char* op, int64_t m, int64_t n, int64_t k, const std::string& what) {
    return fmt::format("{}_m{}_n{}_k{}_{}", op, m, n, k, what);
}

// ---- ag_gemm: C[rows W, N] = all_gather(A_r[rows, K]) B_me[N, K]^T
// ---------------------------------------------------
struct AgCase {
    int64_t rows, n, k;
    int tc;
    AgGemmOptions o;
    std::string label;
    bool gathered = false;      // a gathered buffer, checked bitwise
    bool gathered_sym = false;  // ... in the symmetric heap
};

void check_ag(World& w, cudaStream_t s, const AgCase& t) {
    const int W = w.world_size(), me = w.rank();
    const int64_t rows = t.rows, n = t.n, k = t.k, m = rows * W;
    const std::size_t gbytes = static_cast<std::size_t>(m * k) * 2;
    DevMem a(rows * k * 2), b(n * k * 2), c(m * n * 2), expect(gbytes);
    for (int r = 0; r < W; ++r)  // the gathered A, regenerated shard by shard
        test::upload_random_bf16(static_cast<char*>(expect.p) + r * rows * k * 2, rows * k, seed_of(r, t.tc, 5));
    test::upload_random_bf16(a.p, rows * k, seed_of(me, t.tc, 5));
    test::upload_random_bf16(b.p, n * k, seed_of(me, t.tc, 6));
    std::optional<COut> g;
    AgGemmOptions o = t.o;
    if (t.gathered) {
        g.emplace(w, m, k, t.gathered_sym);
        test::poison_nan(g->p, gbytes);
        o.gathered = MatrixView{g->p, DType::BF16, m, k, 0};
    }
    test::DeviceReference ref(m, n);
    ref.add(expect.p, b.p, DType::BF16, false, k, 1.0, false, s);
    test::poison_nan(c.p, m * n * 2);
    LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
    w.barrier();
    std::string err = run_and_compare(
        s,
        [&] {
            ag_gemm(w, MatrixView{a.p, DType::BF16, rows, k, 0}, MatrixView{b.p, DType::BF16, n, k, 0},
                    MatrixView{c.p, DType::BF16, m, n, 0}, s, o);
        },
        ref, c.p, 0, m, n, n, 0);
    if (err.empty() && g) {
        std::vector<char> got(gbytes), want(gbytes);
        LOOM_CHECK_CUDA(cudaMemcpy(got.data(), g->p, gbytes, cudaMemcpyDeviceToHost));
        LOOM_CHECK_CUDA(cudaMemcpy(want.data(), expect.p, gbytes, cudaMemcpyDeviceToHost));
        for (std::size_t i = 0; i < gbytes && err.empty(); ++i)
            if (got[i] != want[i])
                err = fmt::format("gathered buffer: byte {} (row {}) differs from all_gather(A)", i, i / (k * 2));
    }
    const std::string all = test::agree(w, err, "test/crossnode_overlap/" + t.label);
    EXPECT_TRUE(all.empty()) << t.label << ":\n" << all;
    w.barrier();
}

AgGemmOptions producer(AgProducer p) {
    AgGemmOptions o;
    o.producer = p;
    return o;
}

// Rows per rank from 1 to 251 (not multiples of the tile), each producer that runs across nodes.
TEST_F(CrossNodeOverlap, AgGemmOverM) {
    int tc = 0;
    for (int64_t rows : {1, 17, 128, 251}) {
        const int64_t n = tc % 2 ? 136 : 1032, k = tc % 2 ? 520 : 136;
        for (AgProducer p : {AgProducer::Auto, AgProducer::Sequential, AgProducer::CopyEngine})
            check_ag(*w, stream, {rows, n, k, 10 + tc, producer(p), tag("ag", rows, n, k, to_string(p))});
        ++tc;
    }
}

// Several waves of tiles (Auto takes the two-level form with a GPU per rank), on the default and on one comm block,
// and on a GEMM planned on 16 SMs.
TEST_F(CrossNodeOverlap, AgGemmLarge) {
    const int64_t rows = 1000, n = 1032, k = 264;
    check_ag(*w, stream, {rows, n, k, 20, {}, tag("ag", rows, n, k, "auto")});
    AgGemmOptions one = producer(AgProducer::CopyEngine);
    one.comm_sms = 1;
    check_ag(*w, stream, {rows, n, k, 21, one, tag("ag", rows, n, k, "copy-engine-comm1")});
    AgGemmOptions few = producer(AgProducer::CopyEngine);
    few.num_sms = 16;
    check_ag(*w, stream, {rows, n, k, 22, few, tag("ag", rows, n, k, "copy-engine-sms16")});
}

// A gathered buffer outside the heap (the sequence and the two-level form gather into the op's own and copy it out)
// and in it (gathered into directly).
TEST_F(CrossNodeOverlap, AgGemmGathered) {
    const int64_t rows = 97, n = 264, k = 72;
    int tc = 30;
    for (AgProducer p : {AgProducer::Sequential, AgProducer::CopyEngine})
        for (bool sym : {false, true}) {
            AgCase t{rows,
                     n,
                     k,
                     tc++,
                     producer(p),
                     tag("ag", rows, n, k, fmt::format("{}-gathered-{}", to_string(p), sym ? "symmetric" : "plain"))};
            t.gathered = true;
            t.gathered_sym = sym;
            check_ag(*w, stream, t);
        }
}

// 24 calls with no host synchronisation between them: two input sets alternating, rows per rank alternating 128 and 40
// (a smaller call after a larger one), the two-level form mixed with the sequence (they share the gather buffer); C
// checked at a few calls.
TEST_F(CrossNodeOverlap, AgGemmBackToBack) {
    World& wr = *w;
    const int W = wr.world_size(), me = wr.rank();
    const int64_t n = 264, k = 136, kCalls = 24;
    const int64_t kRows[2] = {128, 40};
    // Inputs [set][rows], uploaded before the first call (the calls read them while later ones are enqueued).
    std::vector<std::unique_ptr<DevMem>> a, b;
    for (int set = 0; set < 2; ++set)
        for (int sz = 0; sz < 2; ++sz) {
            const int tc = 40 + set * 2 + sz;
            a.push_back(std::make_unique<DevMem>(kRows[sz] * k * 2));
            b.push_back(std::make_unique<DevMem>(n * k * 2));
            test::upload_random_bf16(a.back()->p, kRows[sz] * k, seed_of(me, tc, 5));
            test::upload_random_bf16(b.back()->p, n * k, seed_of(me, tc, 6));
        }
    DevMem full(kRows[0] * W * k * 2), c(kRows[0] * W * n * 2);
    wr.barrier();
    std::string err;
    for (int64_t i = 0; i < kCalls && err.empty(); ++i) {
        const int set = static_cast<int>(i % 2), sz = static_cast<int>((i / 2) % 2), tc = 40 + set * 2 + sz;
        const int64_t rows = kRows[sz], m = rows * W;
        const bool check = i == 0 || i == 1 || i == 2 || i == 3 || i == 13 || i == kCalls - 1;
        const AgGemmOptions o = producer(i % 3 == 2 ? AgProducer::Sequential : AgProducer::CopyEngine);
        try {
            if (check) LOOM_CHECK_CUDA(cudaMemsetAsync(c.p, 0xFF, m * n * 2, stream));  // NaN
            ag_gemm(wr, MatrixView{a[set * 2 + sz]->p, DType::BF16, rows, k, 0},
                    MatrixView{b[set * 2 + sz]->p, DType::BF16, n, k, 0}, MatrixView{c.p, DType::BF16, m, n, 0}, stream,
                    o);
            if (!check) continue;
            const cudaError_t e = cudaStreamSynchronize(stream);
            if (e != cudaSuccess) {
                err = fmt::format("stream failed at call {}: {}", i, cudaGetErrorString(e));
                break;
            }
            for (int r = 0; r < W; ++r)
                test::upload_random_bf16(static_cast<char*>(full.p) + r * rows * k * 2, rows * k, seed_of(r, tc, 5));
            test::DeviceReference ref(m, n);
            ref.add(full.p, b[set * 2 + sz]->p, DType::BF16, false, k, 1.0, false, stream);
            std::vector<double> r, ab;
            ref.download(r, ab, 0, m, stream);
            const std::string e2 = test::compare_to_reference(test::download_matrix(c.p, DType::BF16, m, n, n), r, ab,
                                                              n, 1.0 / 128, 1.0 / 65536, 1e-3);
            if (!e2.empty()) err = fmt::format("call {} (rows {}, {}): {}", i, rows, to_string(o.producer), e2);
        } catch (const std::exception& e) {
            err = fmt::format("call {}: {}", i, e.what());
        }
    }
    if (err.empty() && cudaStreamSynchronize(stream) != cudaSuccess) err = "stream failed";
    const std::string all = test::agree(wr, err, "test/crossnode_overlap/ag_back_to_back");
    EXPECT_TRUE(all.empty()) << all;
    wr.barrier();
}

// ---- gemm_rs: C_r[rows, N] = rows [r rows, (r + 1) rows) of the sum over ranks of A_r[rows W, K] B_r[N, K]^T ------
void check_rs(World& w, cudaStream_t s, int64_t rows, int64_t n, int64_t k, int tc, const GemmRsOptions& o, int64_t ldc,
              bool sym_c, const std::string& label) {
    const int W = w.world_size(), me = w.rank();
    const int64_t m = rows * W;
    DevMem a(m * k * 2), b(n * k * 2), pa(m * k * 2), pb(n * k * 2);
    COut c(w, rows, ldc, sym_c);
    test::DeviceReference ref(m, n);
    for (int r = 0; r < W; ++r) {
        test::upload_random_bf16(pa.p, m * k, seed_of(r, tc, 3));
        test::upload_random_bf16(pb.p, n * k, seed_of(r, tc, 4));
        ref.add(pa.p, pb.p, DType::BF16, false, k, 1.0, r > 0, s);
        LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
    }
    test::upload_random_bf16(a.p, m * k, seed_of(me, tc, 3));
    test::upload_random_bf16(b.p, n * k, seed_of(me, tc, 4));
    test::poison_nan(c.p, rows * ldc * 2);
    w.barrier();
    const std::string err = run_and_compare(
        s,
        [&] {
            gemm_rs(w, MatrixView{a.p, DType::BF16, m, k, 0}, MatrixView{b.p, DType::BF16, n, k, 0},
                    MatrixView{c.p, DType::BF16, rows, n, ldc}, s, o);
        },
        ref, c.p, me * rows, rows, n, ldc, 1);
    const std::string all = test::agree(w, err, "test/crossnode_overlap/" + label);
    EXPECT_TRUE(all.empty()) << label << ":\n" << all;
    w.barrier();
}

TEST_F(CrossNodeOverlap, GemmRsOverM) {
    int tc = 50;
    for (int64_t rows : {1, 17, 128, 251}) {
        const int64_t n = tc % 2 ? 136 : 1032, k = tc % 2 ? 520 : 136;
        // ScatterReduce: across nodes the two-level form.
        for (RsAlgo algo : {RsAlgo::Auto, RsAlgo::Sequential, RsAlgo::ScatterReduce}) {
            GemmRsOptions o;
            o.algo = algo;
            check_rs(*w, stream, rows, n, k, tc, o, n, false, tag("rs", rows, n, k, to_string(algo)));
        }
        ++tc;
    }
    // C strided, and C in the symmetric heap; the sequence and the two-level form.
    for (RsAlgo algo : {RsAlgo::Sequential, RsAlgo::ScatterReduce}) {
        GemmRsOptions o;
        o.algo = algo;
        check_rs(*w, stream, 97, 264, 72, 60, o, 264 + 24, false,
                 tag("rs", 97, 264, 72, fmt::format("{}-strided", to_string(algo))));
        check_rs(*w, stream, 97, 264, 72, 61, o, 264, true,
                 tag("rs", 97, 264, 72, fmt::format("{}-symmetric-c", to_string(algo))));
    }
}

// gemm_rs back to back with no host synchronisation between the calls: two input sets alternating, rows per rank
// alternating 96 and 40, the two-level form mixed with the sequence (they share the partials' parity halves); C
// checked at a few calls.
TEST_F(CrossNodeOverlap, GemmRsBackToBack) {
    World& wr = *w;
    const int W = wr.world_size(), me = wr.rank();
    const int64_t n = 264, k = 136, kCalls = 20;
    const int64_t kRows[2] = {96, 40};
    std::vector<std::unique_ptr<DevMem>> a, b;
    std::vector<std::unique_ptr<test::DeviceReference>> refs;
    DevMem pa(kRows[0] * W * k * 2), pb(n * k * 2), c(kRows[0] * n * 2);
    for (int set = 0; set < 2; ++set)
        for (int sz = 0; sz < 2; ++sz) {
            const int tc = 140 + set * 2 + sz;
            const int64_t m = kRows[sz] * W;
            a.push_back(std::make_unique<DevMem>(m * k * 2));
            b.push_back(std::make_unique<DevMem>(n * k * 2));
            test::upload_random_bf16(a.back()->p, m * k, seed_of(me, tc, 3));
            test::upload_random_bf16(b.back()->p, n * k, seed_of(me, tc, 4));
            refs.push_back(std::make_unique<test::DeviceReference>(m, n));
            for (int r = 0; r < W; ++r) {
                test::upload_random_bf16(pa.p, m * k, seed_of(r, tc, 3));
                test::upload_random_bf16(pb.p, n * k, seed_of(r, tc, 4));
                refs.back()->add(pa.p, pb.p, DType::BF16, false, k, 1.0, r > 0, stream);
                LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
            }
        }
    wr.barrier();
    std::string err;
    for (int64_t i = 0; i < kCalls && err.empty(); ++i) {
        const int set = static_cast<int>(i % 2), sz = static_cast<int>((i / 2) % 2), j = set * 2 + sz;
        const int64_t rows = kRows[sz], m = rows * W;
        const bool check = i < 4 || i == 11 || i == kCalls - 1;
        GemmRsOptions o;
        o.algo = i % 3 == 2 ? RsAlgo::Sequential : RsAlgo::ScatterReduce;
        try {
            if (check) LOOM_CHECK_CUDA(cudaMemsetAsync(c.p, 0xFF, rows * n * 2, stream));  // NaN
            gemm_rs(wr, MatrixView{a[j]->p, DType::BF16, m, k, 0}, MatrixView{b[j]->p, DType::BF16, n, k, 0},
                    MatrixView{c.p, DType::BF16, rows, n, 0}, stream, o);
            if (!check) continue;
            const cudaError_t e = cudaStreamSynchronize(stream);
            if (e != cudaSuccess) {
                err = fmt::format("stream failed at call {}: {}", i, cudaGetErrorString(e));
                break;
            }
            std::vector<double> r, ab;
            refs[j]->download(r, ab, me * rows, rows, stream);
            const std::string e2 = test::compare_to_reference(test::download_matrix(c.p, DType::BF16, rows, n, n), r,
                                                              ab, n, 1.0 / 128, 1.0 / 256, 1e-3);
            if (!e2.empty()) err = fmt::format("call {} (rows {}, {}): {}", i, rows, to_string(o.algo), e2);
        } catch (const std::exception& e) {
            err = fmt::format("call {}: {}", i, e.what());
        }
    }
    if (err.empty() && cudaStreamSynchronize(stream) != cudaSuccess) err = "stream failed";
    const std::string all = test::agree(wr, err, "test/crossnode_overlap/rs_back_to_back");
    EXPECT_TRUE(all.empty()) << all;
    wr.barrier();
}

// ---- gemm_ar: C[M, N] = sum over ranks of A_r[M, K] B_r[N, K]^T ---------------------------------------------------
void check_ar(World& w, cudaStream_t s, int64_t m, int64_t n, int64_t k, int tc, const GemmArOptions& o, int64_t ldc,
              bool sym_c, const std::string& label) {
    const int W = w.world_size(), me = w.rank();
    DevMem a(m * k * 2), b(n * k * 2), pa(m * k * 2), pb(n * k * 2);
    COut c(w, m, ldc, sym_c);
    test::DeviceReference ref(m, n);
    for (int r = 0; r < W; ++r) {
        test::upload_random_bf16(pa.p, m * k, seed_of(r, tc, 1));
        test::upload_random_bf16(pb.p, n * k, seed_of(r, tc, 2));
        ref.add(pa.p, pb.p, DType::BF16, false, k, 1.0, r > 0, s);
        LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
    }
    test::upload_random_bf16(a.p, m * k, seed_of(me, tc, 1));
    test::upload_random_bf16(b.p, n * k, seed_of(me, tc, 2));
    test::poison_nan(c.p, m * ldc * 2);
    w.barrier();
    const std::string err = run_and_compare(
        s,
        [&] {
            gemm_ar(w, MatrixView{a.p, DType::BF16, m, k, 0}, MatrixView{b.p, DType::BF16, n, k, 0},
                    MatrixView{c.p, DType::BF16, m, n, ldc}, s, o);
        },
        ref, c.p, 0, m, n, ldc, 1);
    const std::string all = test::agree(w, err, "test/crossnode_overlap/" + label);
    EXPECT_TRUE(all.empty()) << label << ":\n" << all;
    w.barrier();
}

TEST_F(CrossNodeOverlap, GemmArOverM) {
    int tc = 70;
    for (int64_t m : {1, 17, 300, 1000}) {
        const int64_t n = tc % 2 ? 136 : 1032, k = tc % 2 ? 520 : 136;
        for (ArAlgo algo : {ArAlgo::Auto, ArAlgo::Sequential}) {
            GemmArOptions o;
            o.algo = algo;
            check_ar(*w, stream, m, n, k, tc, o, n, false, tag("ar", m, n, k, to_string(algo)));
        }
        ++tc;
    }
    // C strided, and C in the symmetric heap (all_reduced into directly).
    check_ar(*w, stream, 97, 264, 72, 80, {}, 264 + 24, false, tag("ar", 97, 264, 72, "auto-strided"));
    check_ar(*w, stream, 97, 264, 72, 81, {}, 264, true, tag("ar", 97, 264, 72, "auto-symmetric-c"));
}

// ---- CUDA graphs: the sequences replay
// ------------------------------------------------------------------------------- One eager call (it creates the op's
// state and loads its kernels), then the same call captured in a CUDA graph and replayed 4 times, the inputs
// alternating between two sets (uploaded into the captured buffers before each replay) and C poisoned: every replay's C
// checked. load(set) uploads set `set`; call() enqueues the op on s; check(set): "" or what is wrong.
template <class Load, class Call, class Check>
std::string replayed(World& w, cudaStream_t s, const Load& load, const Call& call, const Check& check) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    std::string err;
    try {
        load(0);
        w.barrier();
        call();
        LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
        err = check(0);
        if (!err.empty()) return "eager call: " + err;
        w.barrier();
        LOOM_CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        try {
            call();
        } catch (...) {
            cudaStreamEndCapture(s, &graph);
            throw;
        }
        LOOM_CHECK_CUDA(cudaStreamEndCapture(s, &graph));
        LOOM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        for (int i = 0; i < 4 && err.empty(); ++i) {
            load(i % 2);
            w.barrier();
            LOOM_CHECK_CUDA(cudaGraphLaunch(exec, s));
            LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
            err = check(i % 2);
            if (!err.empty()) err = fmt::format("replay {}: {}", i, err);
        }
    } catch (const std::exception& e) {
        err = e.what();
    }
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    return err;
}

TEST_F(CrossNodeOverlap, GraphReplaysSequences) {
    World& wr = *w;
    const int W = wr.world_size(), me = wr.rank();
    const int64_t rows = 40, n = 264, k = 136, m = rows * W;
    // ag_gemm: A [rows, k] a rank, C [m, n]; gemm_rs: A [m, k], C [rows, n]; gemm_ar: A [rows, k], C [rows, n].
    DevMem a(m * k * 2), b(n * k * 2), c(m * n * 2), full(m * k * 2), pa(m * k * 2), pb(n * k * 2);
    auto load = [&](int64_t a_rows, int tc) {
        return [&, a_rows, tc](int set) {
            test::upload_random_bf16(a.p, a_rows * k, seed_of(me, tc + set, 1));
            test::upload_random_bf16(b.p, n * k, seed_of(me, tc + set, 2));
            test::poison_nan(c.p, m * n * 2);
        };
    };
    // The reference of a sum over ranks of A_r [a_rows, k] B_r^T for set `set` of test case tc.
    auto sum_ref = [&](test::DeviceReference& ref, int64_t a_rows, int tc) {
        for (int r = 0; r < W; ++r) {
            test::upload_random_bf16(pa.p, a_rows * k, seed_of(r, tc, 1));
            test::upload_random_bf16(pb.p, n * k, seed_of(r, tc, 2));
            ref.add(pa.p, pb.p, DType::BF16, false, k, 1.0, r > 0, stream);
            LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
        }
    };
    auto compare = [&](const test::DeviceReference& ref, int64_t row0, int64_t c_rows, int roundings) {
        std::vector<double> r, ab;
        ref.download(r, ab, row0, c_rows, stream);
        return test::compare_to_reference(test::download_matrix(c.p, DType::BF16, c_rows, n, n), r, ab, n, 1.0 / 128,
                                          roundings ? 1.0 / 256 : 1.0 / 65536, 1e-3);
    };
    std::string err;
    {  // ag_gemm
        test::DeviceReference ref[2] = {test::DeviceReference(m, n), test::DeviceReference(m, n)};
        for (int set = 0; set < 2; ++set) {
            for (int r = 0; r < W; ++r)
                test::upload_random_bf16(static_cast<char*>(full.p) + r * rows * k * 2, rows * k,
                                         seed_of(r, 100 + set, 1));
            test::upload_random_bf16(pb.p, n * k, seed_of(me, 100 + set, 2));
            ref[set].add(full.p, pb.p, DType::BF16, false, k, 1.0, false, stream);
            LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
        }
        const std::string e = replayed(
            wr, stream, load(rows, 100),
            [&] {
                ag_gemm(wr, MatrixView{a.p, DType::BF16, rows, k, 0}, MatrixView{b.p, DType::BF16, n, k, 0},
                        MatrixView{c.p, DType::BF16, m, n, 0}, stream, producer(AgProducer::Sequential));
            },
            [&](int set) { return compare(ref[set], 0, m, 0); });
        if (!e.empty()) err += "ag_gemm sequential: " + e + "\n";
    }
    {  // gemm_rs
        test::DeviceReference ref[2] = {test::DeviceReference(m, n), test::DeviceReference(m, n)};
        for (int set = 0; set < 2; ++set) sum_ref(ref[set], m, 110 + set);
        GemmRsOptions o;
        o.algo = RsAlgo::Sequential;
        const std::string e = replayed(
            wr, stream, load(m, 110),
            [&] {
                gemm_rs(wr, MatrixView{a.p, DType::BF16, m, k, 0}, MatrixView{b.p, DType::BF16, n, k, 0},
                        MatrixView{c.p, DType::BF16, rows, n, 0}, stream, o);
            },
            [&](int set) { return compare(ref[set], me * rows, rows, 1); });
        if (!e.empty()) err += "gemm_rs sequential: " + e + "\n";
    }
    {  // gemm_ar
        test::DeviceReference ref[2] = {test::DeviceReference(rows, n), test::DeviceReference(rows, n)};
        for (int set = 0; set < 2; ++set) sum_ref(ref[set], rows, 120 + set);
        GemmArOptions o;
        o.algo = ArAlgo::Sequential;
        const std::string e = replayed(
            wr, stream, load(rows, 120),
            [&] {
                gemm_ar(wr, MatrixView{a.p, DType::BF16, rows, k, 0}, MatrixView{b.p, DType::BF16, n, k, 0},
                        MatrixView{c.p, DType::BF16, rows, n, 0}, stream, o);
            },
            [&](int set) { return compare(ref[set], 0, rows, 1); });
        if (!e.empty()) err += "gemm_ar sequential: " + e + "\n";
    }
    const std::string all = test::agree(wr, err, "test/crossnode_overlap/graphs");
    EXPECT_TRUE(all.empty()) << all;
    wr.barrier();
}

// ---- the algorithms that run within one node ------------------------------------------------------------------------
// Every rank raises the same error before the call touches any state; the World stays usable (a call after them runs).
TEST_F(CrossNodeOverlap, RefusesOneNodeAlgorithms) {
    if (w->num_nodes() == 1) GTEST_SKIP() << kNeedsNodes;
    const int W = w->world_size();
    const int64_t rows = 64, n = 128, k = 64, m = rows * W;
    DevMem a(m * k * 2), b(n * k * 2), c(m * n * 2);
    test::upload_random_bf16(a.p, m * k, seed_of(w->rank(), 90, 1));
    test::upload_random_bf16(b.p, n * k, seed_of(w->rank(), 90, 2));
    const MatrixView A{a.p, DType::BF16, m, k, 0}, Ash{a.p, DType::BF16, rows, k, 0}, B{b.p, DType::BF16, n, k, 0};
    const std::string nodes = fmt::format("in a World of {} nodes x {} ranks", w->num_nodes(), w->local_world_size());
    std::string err;
    auto expect_refused = [&](const char* what, const std::string& algo, const auto& call) {
        if (!err.empty()) return;
        try {
            call();
            err = fmt::format("{} {}: expected an error, the call ran", what, algo);
        } catch (const Error& e) {
            const std::string msg = e.what();
            if (msg.find(std::string("the ") + (std::strstr(what, "ag_gemm") ? "producer " : "algorithm ") + algo +
                         " runs within one node") == std::string::npos ||
                msg.find(nodes) == std::string::npos)
                err = fmt::format("{} {}: unexpected message: {}", what, algo, msg);
        }
    };
    for (AgProducer p : {AgProducer::Sm, AgProducer::Direct})
        expect_refused("ag_gemm", to_string(p), [&] {
            ag_gemm(*w, Ash, B, MatrixView{c.p, DType::BF16, m, n, 0}, stream, producer(p));
        });
    for (RsAlgo algo : {RsAlgo::FusedEpilogue, RsAlgo::FusedPull}) {
        GemmRsOptions o;
        o.algo = algo;
        expect_refused("gemm_rs", to_string(algo), [&] {
            gemm_rs(*w, A, B, MatrixView{c.p, DType::BF16, rows, n, 0}, stream, o);
        });
    }
    for (ArAlgo algo : {ArAlgo::FusedEpilogue, ArAlgo::ReduceKernel}) {
        GemmArOptions o;
        o.algo = algo;
        expect_refused("gemm_ar", to_string(algo), [&] {
            gemm_ar(*w, A, B, MatrixView{c.p, DType::BF16, m, n, 0}, stream, o);
        });
    }
    GemmArOptions shots;
    shots.shots = ArShots::TwoShot;  // asks for the reduce kernel
    expect_refused("gemm_ar", to_string(ArAlgo::ReduceKernel), [&] {
        gemm_ar(*w, A, B, MatrixView{c.p, DType::BF16, m, n, 0}, stream, shots);
    });
    const std::string all = test::agree(*w, err, "test/crossnode_overlap/refused");
    EXPECT_TRUE(all.empty()) << all;
    // The World still runs the ops.
    check_ar(*w, stream, 17, 136, 72, 91, {}, 136, false, "ar_after_refusals");
}

}  // namespace
}  // namespace loom
