// bench-crossnode's rows of the overlapped GEMMs across nodes (crossnode_overlap.hpp). Per row, on the same inputs,
// outputs and buffers (bf16 in and out):
//   loom_us                  the op's two-level form (ag_gemm: AgProducer::CopyEngine, src/ops/overlap/ag_gemm/
//                            across_nodes.cpp; gemm_rs: RsAlgo::ScatterReduce,
//                            src/ops/overlap/gemm_rs/across_nodes.cpp)
//   auto_us                  the op with default options: across nodes ag_gemm's Auto runs the sequence when the
//                            GEMM's tiles fit one wave, else the two-level form; gemm_rs's Auto runs the sequence
//                            (LOOM_AUTOTUNE=1: whichever the first call timed faster)
//   baselines.loom_sequence  the public calls one after the other: loom::all_gather (its hierarchical form) into a
//                            symmetric [M, K], then loom::gemm over it; loom::gemm into a symmetric [M, N], then
//                            loom::reduce_scatter (its hierarchical form) into C
//   gemm_us                  that loom::gemm alone (the rank's whole GEMM: the op's shape)
//   coll_us                  the sequence's hierarchical collective alone, whole; intra_us and inter_us its intra-node
//                            step alone and its inter-node step alone (coll::hier::Steps), on the sequence's buffers
//   overlap_efficiency       loom_us / max(gemm_us, coll_us) (1: the shorter part wholly hidden; bench-overlap's)
//   tflops                   2 M N K / loom_us: every rank's GEMM together (the layer's)
// Check, before timing: C of the two-level form and of the default call, each written over NaN, against the
// sequence's C on the same random bf16 inputs in [-1, 1): max |x - y| / max |y| over every element of C below 2e-2
// on every rank. A tolerance, not bitwise: the forms cut the GEMM into other row blocks and tiles than the sequence's
// one loom::gemm, and gemm_rs's two-level form sums the ranks' bf16 partials in another order (the node's first, then
// the other nodes'), so the results agree to a few bf16 roundings of the largest value; a missing, stale or misplaced
// tile differs by the values' own size.
#include "crossnode_overlap.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "cublaslt.hpp"
#include "harness.hpp"
#include "loom/bf16.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/store.hpp"
#include "ops/collectives/coll_choice.hpp"
#include "ops/collectives/hier/hier.hpp"

namespace loom::bench {
namespace {

using json = nlohmann::json;
using Steps = coll::hier::Steps;

constexpr double kTolerance = 2e-2;  // max |x - y| / max |y| (bench-overlap's check)

// max |x - y| / max |y| over n bf16 elements of two device buffers; infinity where x or y holds a NaN.
double max_scaled_diff(const void* x, const void* y, std::size_t n) {
    std::vector<std::uint16_t> a(n), b(n);
    LOOM_CHECK_CUDA(cudaMemcpy(a.data(), x, n * 2, cudaMemcpyDeviceToHost));
    LOOM_CHECK_CUDA(cudaMemcpy(b.data(), y, n * 2, cudaMemcpyDeviceToHost));
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const float fa = bf16_to_float(a[i]), fb = bf16_to_float(b[i]);
        if (std::isnan(fa) || std::isnan(fb)) return INFINITY;
        worst = std::max(worst, static_cast<double>(std::fabs(fa - fb)));
        scale = std::max(scale, static_cast<double>(std::fabs(fb)));
    }
    return scale > 0 ? worst / scale : (worst > 0 ? INFINITY : 0);
}

// Every rank's difference gathered over the store; raises on every rank when one is not below the tolerance (a rank
// raising alone would leave the others waiting in the timed runs' collectives). Returns the largest.
double agreed_diff(World& w, double diff, const std::string& what) {
    Bytes mine(sizeof diff);
    std::memcpy(mine.data(), &diff, sizeof diff);
    const std::vector<Bytes> all = w.store().all_gather("bench-crossnode/check", mine);
    std::string bad;
    double worst = 0;
    for (std::size_t r = 0; r < all.size(); ++r) {
        double d = INFINITY;
        if (all[r].size() == sizeof d) std::memcpy(&d, all[r].data(), sizeof d);
        worst = std::max(worst, d);
        if (!(d < kTolerance)) bad += fmt::format("{}rank {}: {:.3g}", bad.empty() ? "" : ", ", r, d);
    }
    LOOM_CHECK(bad.empty(), "{}: C differs from the sequence's (max |diff| / max |ref|, expected below {}): {}", what,
               kTolerance, bad);
    return worst;
}

// NaN in every bf16 element, complete before the next call (whose stream does not wait for the legacy stream).
void poison(void* p, std::size_t count) {
    LOOM_CHECK_CUDA(cudaMemset(p, 0xFF, count * 2));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
}

}  // namespace

std::vector<GemmShape> parse_gemm_shapes(const std::string& list) {
    std::vector<GemmShape> v;
    std::stringstream ss(list);
    for (std::string item; std::getline(ss, item, ',');) {
        if (item.empty()) continue;
        long long m = 0, n = 0, k = 0;
        int used = 0;
        const bool ok = std::sscanf(item.c_str(), "%lldx%lldx%lld%n", &m, &n, &k, &used) == 3 &&
                        static_cast<std::size_t>(used) == item.size() && m > 0 && n > 0 && k > 0;
        LOOM_CHECK(ok, "--gemm-shapes: expected MxNxK with positive integers, given '{}'", item);
        v.push_back({m, n, k});
    }
    LOOM_CHECK(!v.empty(), "--gemm-shapes: expected at least one MxNxK, given '{}'", list);
    return v;
}

json crossnode_overlap_row(World& w, const std::string& op, const GemmShape& shape, int iters, cudaStream_t stream) {
    const bool ag = op == "ag_gemm";
    LOOM_CHECK(ag || op == "gemm_rs", "expected ag_gemm or gemm_rs, given {}", op);
    const int W = w.world_size(), me = w.rank(), nodes = w.num_nodes(), L = w.local_world_size();
    const int64_t M = shape.m, N = shape.n, K = shape.k, R = M / W;
    const std::string name = fmt::format("{} {}x{}x{} bf16 {}x{}", op, M, N, K, nodes, L);
    LOOM_CHECK(M % W == 0 && (ag ? N : K) % (8 * W) == 0 && N % 8 == 0 && K % 8 == 0,
               "{}: expected M a multiple of the {} ranks and {} a multiple of 8 x {} (M, N, K "
               "multiples of 8)",
               name, W, ag ? "N" : "K", W);
    // ag_gemm: A [R, K], B [N / W, K], C [M, N / W], the sequence's gathered A [M, K].
    // gemm_rs: A [M, K / W], B [N, K / W], C [R, N], the sequence's partial product [M, N].
    const int64_t n_loc = ag ? N / W : N, k_loc = ag ? K : K / W;
    const int64_t a_rows = ag ? R : M, c_rows = ag ? M : R;
    const std::size_t a_count = static_cast<std::size_t>(a_rows * k_loc),
                      b_count = static_cast<std::size_t>(n_loc * k_loc);
    const std::size_t c_count = static_cast<std::size_t>(c_rows * n_loc);
    const std::size_t mid_count = static_cast<std::size_t>(ag ? M * K : M * N);
    void *a, *b, *c, *c_ref;
    LOOM_CHECK_CUDA(cudaMalloc(&a, a_count * 2));
    LOOM_CHECK_CUDA(cudaMalloc(&b, b_count * 2));
    LOOM_CHECK_CUDA(cudaMalloc(&c, c_count * 2));
    LOOM_CHECK_CUDA(cudaMalloc(&c_ref, c_count * 2));
    void* mid = w.alloc_bytes(mid_count * 2);
    fill_random_bf16(a, a_count, 1 + me);
    fill_random_bf16(b, b_count, 100 + me);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    w.barrier("bench-crossnode/filled");

    const MatrixView A{a, DType::BF16, a_rows, k_loc, 0}, B{b, DType::BF16, n_loc, k_loc, 0};
    const MatrixView C{c, DType::BF16, c_rows, n_loc, 0};
    // The sequence's collective: ag_gemm's all_gather of the A shards, gemm_rs's reduce_scatter of the partials.
    const BufferView coll_in = ag ? BufferView{a, DType::BF16, a_count} : BufferView{mid, DType::BF16, mid_count};
    const BufferView coll_out = ag ? BufferView{mid, DType::BF16, mid_count} : BufferView{c, DType::BF16, c_count};
    const MatrixView gemm_a = ag ? MatrixView{mid, DType::BF16, M, K, 0} : A;
    const MatrixView gemm_c = ag ? C : MatrixView{mid, DType::BF16, M, N, 0};
    const auto sequence = [&](void* out, cudaStream_t st) {
        if (ag) {
            all_gather(w, coll_in, coll_out, st);
            gemm(gemm_a, B, MatrixView{out, DType::BF16, c_rows, n_loc, 0}, {}, st);
        } else {
            gemm(A, B, gemm_c, {}, st);
            reduce_scatter(w, coll_in, BufferView{out, DType::BF16, c_count}, st);
        }
    };
    const auto overlapped = [&](bool two_level) {
        return [&, two_level](cudaStream_t st) {
            if (ag) {
                AgGemmOptions o;
                if (two_level) o.producer = AgProducer::CopyEngine;
                ag_gemm(w, A, B, C, st, o);
            } else {
                GemmRsOptions o;
                if (two_level) o.algo = RsAlgo::ScatterReduce;
                gemm_rs(w, A, B, C, st, o);
            }
        };
    };
    const auto step = [&](Steps s) {
        return [&, s](cudaStream_t st) {
            if (ag) coll::hier::all_gather(w, coll_in, coll_out, CollOptions{}, st, s);
            if (!ag) coll::hier::reduce_scatter(w, coll_in, coll_out, CollOptions{}, st, s);
        };
    };

    // The reference, then each form of the op checked against it once.
    sequence(c_ref, stream);
    LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
    double worst = 0;
    for (const bool two_level : {true, false}) {
        poison(c, c_count);
        overlapped(two_level)(stream);
        LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
        const std::string what = name + (two_level ? " two-level form" : " default options");
        worst = std::max(worst, agreed_diff(w, max_scaled_diff(c, c_ref, c_count), what));
    }

    TimeOptions topts;
    topts.warmup = 3;
    topts.iters = iters;
    topts.world = &w;
    const std::vector<Timing> t =
        time_ops({overlapped(true), overlapped(false), [&](cudaStream_t st) { sequence(c, st); },
                  [&](cudaStream_t st) { gemm(gemm_a, B, gemm_c, {}, st); }, step(Steps::All), step(Steps::Intra),
                  step(Steps::Inter)},
                 stream, topts);
    const bool shared_gpu = collective_topology(w).shared_gpu;
    json row = {{"shape", name},
                {"op", op},
                {"M", M},
                {"N", N},
                {"K", K},
                {ag ? "N_loc" : "K_loc", ag ? n_loc : k_loc},
                {"dtype", "bf16"},
                {"ranks", W},
                {"world", W},
                {"nodes", nodes},
                {"ranks_per_node", L},
                {"loom_us", t[0].median_us},
                {"min_us", t[0].min_us},
                {"p90_us", t[0].p90_us},
                {"auto_us", t[1].median_us},
                {"gemm_us", t[3].median_us},
                {"coll_us", t[4].median_us},
                {"intra_us", t[5].median_us},
                {"inter_us", t[6].median_us},
                {"overlap_efficiency", t[0].median_us / std::max(t[3].median_us, t[4].median_us)},
                {"tflops", 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) /
                               (t[0].median_us * 1e6)},
                {"iters", iters},
                {"checked", true},
                {"check_diff", worst},
                {"shared_gpu", shared_gpu},
                {"machine",
                 std::getenv("LOOM_NODE_SIZE") ? "emulated nodes (LOOM_NODE_SIZE) on one host" : "one node per host"},
                {"baselines", {{"loom_sequence", t[2].median_us}}}};
    if (me == 0)
        std::printf(
            "%-36s two-level %9.1f us  auto %9.1f us  sequence %9.1f us (%.3fx)  gemm %9.1f us  coll %9.1f us"
            "  intra %9.1f us  inter %9.1f us\n",
            name.c_str(), t[0].median_us, t[1].median_us, t[2].median_us, t[2].median_us / t[0].median_us,
            t[3].median_us, t[4].median_us, t[5].median_us, t[6].median_us);

    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    w.free(mid);
    release_overlap_state(w);
    cudaFree(c_ref);
    cudaFree(c);
    cudaFree(b);
    cudaFree(a);
    return row;
}

}  // namespace loom::bench
