// Collectives against a CPU reference on every rank: fresh random inputs, poisoned outputs, every element
// checked (bitwise for data movement, fp64-referenced tolerance for reductions). Run under loomrun at 2, 4, 8
// ranks (ranks may share one GPU under MPS).
//
// Multi-rank discipline: a rank never leaves a test (or a step of it) alone. Every check computes its verdict,
// the verdicts of all ranks are gathered through the store (agree()), and only then asserted, so all ranks fail
// and return together and the next collective call finds every peer (a lone failing rank would leave its
// peers waiting until loomrun's timeout). Host writes to device buffers are complete (device synchronised)
// before the host barrier that precedes a collective: the collectives run on a non-blocking stream, which does
// not wait for the legacy default stream that cudaMemcpy / cudaMemset use.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/device_io.hpp"
#include "common/reference.hpp"
#include "common/symmetric.hpp"
#include "common/test_env.hpp"
#include "loom/kernels/collectives/coll_params.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "loom/runtime/store.hpp"

namespace loom {
namespace {

using test::Sym;

// Host values of `dtype` (raw bits) from random floats; `vals` gets the exactly representable doubles.
std::vector<char> make_input(DType t, std::size_t n, std::uint64_t seed, std::vector<double>* vals = nullptr) {
    const auto f = test::random_floats(n, seed);
    std::vector<char> raw(n * dtype_size(t));
    if (vals) vals->resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        double v;
        if (t == DType::F32) {
            std::memcpy(raw.data() + 4 * i, &f[i], 4);
            v = f[i];
        } else if (t == DType::BF16) {
            const std::uint16_t h = test::float_to_bf16(f[i]);
            std::memcpy(raw.data() + 2 * i, &h, 2);
            v = test::bf16_to_float(h);
        } else {
            const std::uint16_t h = test::float_to_half(f[i]);
            std::memcpy(raw.data() + 2 * i, &h, 2);
            v = test::half_to_float(h);
        }
        if (vals) (*vals)[i] = v;
    }
    return raw;
}
// Extra error of the ring reduce-scatter: W-1 partial sums rounded to T (unit roundoff u), each at most mag.
double ring_extra(DType t, double mag, int W) {
    const double u = t == DType::F32 ? 0x1p-24 : t == DType::BF16 ? 0x1p-8 : 0x1p-11;
    return (W - 1) * mag * u;
}
std::uint64_t seed_of(int rank, int test_case, int iter = 0) {
    return 0x9e3779b97f4a7c15ull * (rank + 1) + 1000003ull * test_case + 7919ull * iter + 12345;
}

using test::cuda_or_die;
using test::download;
using test::kPoison;
using test::poison;
using test::sync_or_die;
using test::upload;
using test::value_at;

// One eager round of `enqueue` (it creates the collective state and side streams and JIT-loads every kernel, all of
// which synchronise, which a capturing thread must not do), then the same calls captured into an instantiated graph.
cudaGraphExec_t warm_and_capture(World& w, cudaStream_t s, const std::function<void()>& enqueue) {
    enqueue();
    sync_or_die(s);
    w.barrier();
    cudaGraph_t graph = nullptr;
    cuda_or_die(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
    enqueue();
    cuda_or_die(cudaStreamEndCapture(s, &graph), "end capture");
    cudaGraphExec_t exec = nullptr;
    cuda_or_die(cudaGraphInstantiate(&exec, graph, 0), "graph instantiate");
    cudaGraphDestroy(graph);
    return exec;
}

std::string agree(World& w, const std::string& mine) { return test::agree(w, mine, "test/collectives/verdict"); }

struct AlgoPath {
    CollAlgo algo;
    DataPath path;
};
std::string label(const AlgoPath& a) { return std::string(to_string(a.algo)) + "/" + to_string(a.path); }

class Collectives : public WorldStreamTest {};

// ---- AllGather ---------------------------------------------------------------------------------------------------
void check_all_gather(World& w, cudaStream_t s, DType t, std::size_t n, const CollOptions& o, int tc, bool in_place) {
    const int W = w.world_size(), me = w.rank();
    const std::size_t es = dtype_size(t), B = n * es;
    Sym in(w, B), out(w, B * W);
    std::vector<std::vector<char>> all(W);
    for (int r = 0; r < W; ++r) all[r] = make_input(t, n, seed_of(r, tc));
    poison(out.p, B * W);
    void* src = in_place ? out.as() + me * B : in.p;
    upload(src, all[me]);
    w.barrier();
    all_gather(w, BufferView{src, t, n}, BufferView{out.p, t, n * W}, s, o);
    sync_or_die(s);
    const auto got = download(out.p, B * W);
    std::string err;
    for (int r = 0; r < W && err.empty(); ++r)
        for (std::size_t i = 0; i < B && err.empty(); ++i)
            if (got[r * B + i] != all[r][i])
                err = "all_gather " + std::string(to_string(o.algo)) + "/" + to_string(o.path) +
                      (in_place ? " in place" : "") + " n " + std::to_string(n) + ": chunk of rank " +
                      std::to_string(r) + " differs first at byte " + std::to_string(i) + " of " + std::to_string(B);
    const std::string v = agree(w, err);
    ASSERT_TRUE(v.empty()) << v;
}

TEST_F(Collectives, AllGatherEveryAlgorithmAndPath) {
    const AlgoPath aps[] = {
        {CollAlgo::Push, DataPath::LdSt}, {CollAlgo::Push, DataPath::Tma}, {CollAlgo::Push, DataPath::CopyEngine},
        {CollAlgo::Pull, DataPath::LdSt}, {CollAlgo::Pull, DataPath::Tma}, {CollAlgo::Pull, DataPath::CopyEngine},
        {CollAlgo::Ring, DataPath::LdSt}, {CollAlgo::Ring, DataPath::Tma}, {CollAlgo::LL, DataPath::LdSt}};
    int tc = 0;
    for (const auto& ap : aps)
        // LL's largest: 60001 f32 = 240004 bytes per rank, under its 256 KiB capacity, 469 blocks' worth of packets.
        for (std::size_t n : {std::size_t(1), std::size_t(1001), ap.algo == CollAlgo::LL ? 60001 : std::size_t(300007)})
            for (DType t : {DType::BF16, DType::F32}) {
                SCOPED_TRACE(label(ap) + " n " + std::to_string(n) + " " + dtype_name(t));
                check_all_gather(*w, stream, t, n, CollOptions{ap.algo, ap.path}, ++tc, false);
            }
}

TEST_F(Collectives, AllGatherInPlaceAutoAndLarge) {
    // In place on every algorithm and path. Chunks of 8194 bytes start 2 bytes past a 16-byte boundary, so the
    // TMA paths move a byte head, a bulk body and a byte tail; pull must read each peer's input from the peer's
    // own slot of its out (slot `me` of the peer's out is poison).
    const AlgoPath aps[] = {
        {CollAlgo::Push, DataPath::LdSt}, {CollAlgo::Push, DataPath::Tma}, {CollAlgo::Push, DataPath::CopyEngine},
        {CollAlgo::Pull, DataPath::LdSt}, {CollAlgo::Pull, DataPath::Tma}, {CollAlgo::Pull, DataPath::CopyEngine},
        {CollAlgo::Ring, DataPath::LdSt}, {CollAlgo::Ring, DataPath::Tma}, {CollAlgo::LL, DataPath::LdSt}};
    int tc = 10;
    for (const auto& ap : aps)
        check_all_gather(*w, stream, DType::F16, 4097, CollOptions{ap.algo, ap.path}, ++tc, true);
    // Several TMA blocks per chunk, each share with a head and a tail (2000002 bytes per rank: 4 blocks).
    check_all_gather(*w, stream, DType::F16, 1000001, CollOptions{CollAlgo::Pull, DataPath::Tma}, 30, true);
    check_all_gather(*w, stream, DType::F16, 1000001, CollOptions{CollAlgo::Push, DataPath::Tma}, 31, false);
    check_all_gather(*w, stream, DType::BF16, 3, {}, 4, false);
    // 32 MiB per rank (256 MiB gathered at 8 ranks).
    check_all_gather(*w, stream, DType::F32, (std::size_t(32) << 20) / 4 / w->world_size() * 8 / 8, {}, 5, false);
}

// ---- ReduceScatter -------------------------------------------------------------------------------------------------
void check_reduce_scatter(World& w, cudaStream_t s, DType t, std::size_t n, const CollOptions& o, int tc,
                          bool in_place) {
    const int W = w.world_size(), me = w.rank();
    const std::size_t es = dtype_size(t);
    Sym in(w, n * W * es), out(w, n * es);
    std::vector<std::vector<char>> all(W);
    for (int r = 0; r < W; ++r) all[r] = make_input(t, n * W, seed_of(r, tc));
    upload(in.p, all[me]);
    void* dst = in_place ? in.as() + me * n * es : out.p;
    if (!in_place) poison(out.p, n * es);
    w.barrier();
    reduce_scatter(w, BufferView{in.p, t, n * W}, BufferView{dst, t, n}, s, o);
    sync_or_die(s);
    const auto got = download(dst, n * es);
    std::string err;
    for (std::size_t i = 0; i < n && err.empty(); ++i) {
        double ref = value_at(t, all[0], me * n + i), mag = std::fabs(ref);
        for (int r = 1; r < W; ++r) {
            const double v = value_at(t, all[r], me * n + i);
            ref = o.op == ReduceOp::Max ? std::max(ref, v) : ref + v;
            mag += std::fabs(v);
        }
        const double g = value_at(t, got, i);
        // The ring rounds its partial sums to T at every hop: up to W-1 extra roundings of partials <= mag.
        const double tol = test::sum_tolerance(t, ref, W) + (o.algo == CollAlgo::Ring ? ring_extra(t, mag, W) : 0.0);
        if (!(std::fabs(g - ref) <= tol))
            err = "reduce_scatter " + std::string(to_string(o.algo)) + "/" + to_string(o.path) + " " + dtype_name(t) +
                  " element " + std::to_string(i) + " of " + std::to_string(n) + ": got " + std::to_string(g) +
                  ", expected " + std::to_string(ref) + " +- " + std::to_string(tol);
    }
    const std::string v = agree(w, err);
    ASSERT_TRUE(v.empty()) << v;
}

TEST_F(Collectives, ReduceScatterEveryAlgorithmPathDtype) {
    const AlgoPath aps[] = {{CollAlgo::Pull, DataPath::LdSt},   {CollAlgo::Scatter, DataPath::LdSt},
                            {CollAlgo::Scatter, DataPath::Tma}, {CollAlgo::Ring, DataPath::LdSt},
                            {CollAlgo::LL, DataPath::LdSt},     {CollAlgo::Scatter, DataPath::CopyEngine}};
    int tc = 100;
    for (const auto& ap : aps)
        for (DType t : {DType::F32, DType::F16, DType::BF16})
            for (std::size_t n :
                 {std::size_t(1), std::size_t(777), ap.algo == CollAlgo::LL ? 50001 : std::size_t(100003)}) {
                SCOPED_TRACE(label(ap) + " n " + std::to_string(n) + " " + dtype_name(t));
                check_reduce_scatter(*w, stream, t, n, CollOptions{ap.algo, ap.path}, ++tc, false);
            }
}

TEST_F(Collectives, ReduceScatterInPlaceMaxLarge) {
    check_reduce_scatter(*w, stream, DType::BF16, 5001, CollOptions{CollAlgo::Pull, DataPath::LdSt}, 1, true);
    check_reduce_scatter(*w, stream, DType::F32, 4099, CollOptions{CollAlgo::Pull, DataPath::LdSt, ReduceOp::Max}, 2,
                         false);
    // Bigger than the scratch at 8 ranks: the scatter algorithm goes in rounds.
    check_reduce_scatter(*w, stream, DType::BF16, (std::size_t(3) << 20) + 5,
                         CollOptions{CollAlgo::Scatter, DataPath::Tma}, 3, false);
    check_reduce_scatter(*w, stream, DType::F32, std::size_t(4) << 20, {}, 4, false);
    // Ring: in place, max, and past scratch / (W-1) (rounds at 8 ranks: 64 MiB / 7 / 2 bytes < 5 M elements).
    check_reduce_scatter(*w, stream, DType::BF16, 5001, CollOptions{CollAlgo::Ring, DataPath::LdSt}, 5, true);
    check_reduce_scatter(*w, stream, DType::F16, 4099, CollOptions{CollAlgo::Ring, DataPath::LdSt, ReduceOp::Max}, 6,
                         false);
    check_reduce_scatter(*w, stream, DType::BF16, (std::size_t(5) << 20) + 3, CollOptions{CollAlgo::Ring}, 7, false);
    // Copy-engine scatter: in place, max, and rounds (4 M + 3 elements: 3 rounds at 8 ranks with the default
    // scratch; the dist_small_scratch step runs many).
    check_reduce_scatter(*w, stream, DType::BF16, 5001, CollOptions{CollAlgo::Scatter, DataPath::CopyEngine}, 10, true);
    check_reduce_scatter(*w, stream, DType::F32, 4099,
                         CollOptions{CollAlgo::Scatter, DataPath::CopyEngine, ReduceOp::Max}, 11, false);
    check_reduce_scatter(*w, stream, DType::BF16, (std::size_t(4) << 20) + 3,
                         CollOptions{CollAlgo::Scatter, DataPath::CopyEngine}, 12, false);
    // LL: in place, max, odd count (packets straddle the chunk ends).
    check_reduce_scatter(*w, stream, DType::BF16, 5001, CollOptions{CollAlgo::LL}, 8, true);
    check_reduce_scatter(*w, stream, DType::F16, 4099, CollOptions{CollAlgo::LL, DataPath::Auto, ReduceOp::Max}, 9,
                         false);
}

// The message of the loom::Error f throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// ---- AllReduce -----------------------------------------------------------------------------------------------------
// plain_out: out from cudaMalloc, outside the symmetric heap (two-shot then stages its shards in the scratch).
void check_all_reduce(World& w, cudaStream_t s, DType t, std::size_t n, const CollOptions& o, int tc, bool in_place,
                      bool plain_out = false) {
    const int W = w.world_size(), me = w.rank();
    const std::size_t es = dtype_size(t);
    Sym in(w, n * es), out(w, n * es);
    void* plain = nullptr;
    if (plain_out) ASSERT_EQ(cudaMalloc(&plain, n * es), cudaSuccess);
    std::unique_ptr<void, decltype(&cudaFree)> plain_owner(plain, &cudaFree);
    std::vector<std::vector<char>> all(W);
    for (int r = 0; r < W; ++r) all[r] = make_input(t, n, seed_of(r, tc));
    upload(in.p, all[me]);
    void* dst = in_place ? in.p : plain_out ? plain : out.p;
    if (!in_place) poison(dst, n * es);
    w.barrier();
    all_reduce(w, BufferView{in.p, t, n}, BufferView{dst, t, n}, s, o);
    sync_or_die(s);
    const auto got = download(dst, n * es);
    std::string err;
    for (std::size_t i = 0; i < n && err.empty(); ++i) {
        double ref = value_at(t, all[0], i);
        for (int r = 1; r < W; ++r) {
            const double v = value_at(t, all[r], i);
            ref = o.op == ReduceOp::Max ? std::max(ref, v) : ref + v;
        }
        const double g = value_at(t, got, i);
        if (!(std::fabs(g - ref) <= test::sum_tolerance(t, ref, W)))
            err = "all_reduce " + std::string(to_string(o.algo)) + "/" + to_string(o.path) + " " + dtype_name(t) +
                  " element " + std::to_string(i) + " of " + std::to_string(n) + ": got " + std::to_string(g) +
                  ", expected " + std::to_string(ref);
    }
    const std::string v = agree(w, err);
    ASSERT_TRUE(v.empty()) << v;
}

// LL holds at most kMaxLLBlocks x kLLPacketsPerBlock x 8 bytes per chunk (512 KiB): an explicit LL request stays
// within it (the largest size here fills it exactly, with a partial last packet for 16-bit types); past it, see
// AllReduceLLOverCapacity.
constexpr std::size_t kLLMaxBytes = std::size_t(kernels::coll::kMaxLLBlocks) * kernels::coll::kLLPacketsPerBlock * 8;

// The copy-engine scatter back to back (its two scratch buffers reused within and across calls): 200 calls
// alternating a large size (rounds at 8 ranks, and at any rank count with the dist_small_scratch step's 1 MiB) and an
// odd small one and two input sets, an all_reduce (another scratch user) every 25th, every element checked at five
// calls.
TEST_F(Collectives, ReduceScatterCopyEngineBackToBack) {
    const int W = w->world_size(), me = w->rank();
    const DType t = DType::BF16;
    const std::size_t big = (std::size_t(5) << 20) + 3, small = 4099;
    Sym in0(*w, big * W * 2), in1(*w, big * W * 2), out(*w, big * 2), ar(*w, 4096 * 2);
    std::vector<std::vector<char>> all[2];
    for (int k = 0; k < 2; ++k) {
        for (int r = 0; r < W; ++r) all[k].push_back(make_input(t, big * W, seed_of(r, 700, k)));
        upload(k == 0 ? in0.p : in1.p, all[k][me]);
    }
    w->barrier();
    const CollOptions ce{CollAlgo::Scatter, DataPath::CopyEngine};
    for (int it = 0; it < 200; ++it) {
        const int k = it % 2;
        const std::size_t n = (it / 2) % 2 == 0 ? big : small;
        void* src = k == 0 ? in0.p : in1.p;
        const bool check = it < 3 || it == 101 || it == 199;
        if (check) {
            sync_or_die(stream);
            poison(out.p, n * 2);
            w->barrier();
        }
        // The chunks of an n-element call: in[r * n, (r + 1) * n) of the 'big'-strided input (dense n * W prefix).
        reduce_scatter(*w, BufferView{src, t, n * W}, BufferView{out.p, t, n}, stream, ce);
        if (it % 25 == 24)
            all_reduce(*w, BufferView{src, t, 4096}, BufferView{ar.p, t, 4096}, stream, CollOptions{CollAlgo::TwoShot});
        if (!check) continue;
        sync_or_die(stream);
        const auto got = download(out.p, n * 2);
        std::string err;
        for (std::size_t i = 0; i < n && err.empty(); ++i) {
            double ref = 0;
            for (int r = 0; r < W; ++r) ref += value_at(t, all[k][r], me * n + i);
            if (!(std::fabs(value_at(t, got, i) - ref) <= test::sum_tolerance(t, ref, W)))
                err = "call " + std::to_string(it) + " element " + std::to_string(i) + " of " + std::to_string(n) +
                      ": got " + std::to_string(value_at(t, got, i)) + ", expected " + std::to_string(ref);
        }
        const std::string v = agree(*w, err);
        ASSERT_TRUE(v.empty()) << v;
    }
}

TEST_F(Collectives, AllReduceEveryAlgorithmDtype) {
    int tc = 200;
    const AlgoPath aps[] = {{CollAlgo::LL, DataPath::LdSt},
                            {CollAlgo::OneShot, DataPath::LdSt},
                            {CollAlgo::OneShot, DataPath::Tma},
                            {CollAlgo::TwoShot, DataPath::LdSt}};
    for (const auto& ap : aps)
        for (DType t : {DType::F32, DType::F16, DType::BF16}) {
            const std::size_t es = dtype_size(t);
            const std::size_t big = ap.algo == CollAlgo::LL ? kLLMaxBytes / es - 1 : std::size_t(65539);
            for (std::size_t n : {std::size_t(1), std::size_t(3), std::size_t(1001), big}) {
                SCOPED_TRACE(label(ap) + " n " + std::to_string(n) + " " + dtype_name(t));
                check_all_reduce(*w, stream, t, n, CollOptions{ap.algo, ap.path}, ++tc, false);
            }
        }
}

TEST_F(Collectives, AllReduceLLOverCapacity) {
    Sym a(*w, kLLMaxBytes + 64), b(*w, kLLMaxBytes + 64);
    // Explicit LL one element past the capacity: a clear error on every rank, nothing launched.
    const std::size_t n = kLLMaxBytes / 4 + 1;
    std::string e;
    try {
        all_reduce(*w, BufferView{a.p, DType::F32, n}, BufferView{b.p, DType::F32, n}, stream,
                   CollOptions{CollAlgo::LL});
    } catch (const Error& err) {
        e = err.what();
    }
    EXPECT_NE(e.find("the ll algorithm holds at most " + std::to_string(kLLMaxBytes) + " bytes"), std::string::npos)
        << e;
    EXPECT_NE(e.find("given " + std::to_string(kLLMaxBytes + 4)), std::string::npos) << e;
    // Auto at the same size never picks LL past its capacity, and at the capacity LL still works.
    check_all_reduce(*w, stream, DType::F32, n, {}, 250, false);
    check_all_reduce(*w, stream, DType::F32, kLLMaxBytes / 4, CollOptions{CollAlgo::LL}, 251, false);
}

TEST_F(Collectives, AllReduceInPlaceMaxAutoLarge) {
    for (CollAlgo a : {CollAlgo::LL, CollAlgo::OneShot, CollAlgo::TwoShot})
        check_all_reduce(*w, stream, DType::BF16, 3001, CollOptions{a}, 1, true);
    check_all_reduce(*w, stream, DType::F32, 999, CollOptions{CollAlgo::LL, DataPath::Auto, ReduceOp::Max}, 2, false);
    check_all_reduce(*w, stream, DType::F16, 999, CollOptions{CollAlgo::TwoShot, DataPath::Auto, ReduceOp::Max}, 3,
                     false);
    for (std::size_t n : {std::size_t(5), std::size_t(20000), std::size_t(200001), std::size_t(8) << 20})
        check_all_reduce(*w, stream, DType::BF16, n, {}, 4, false);
    // One-shot past the scratch: rounds.
    check_all_reduce(*w, stream, DType::F32, (std::size_t(5) << 20) + 1, CollOptions{CollAlgo::OneShot}, 5, false);
    // Two-shot through the copy engine (reduce_scatter pull + copy-engine all_gather): even shards in place, out
    // of place with max, and a count that does not split evenly (falls back to the one-kernel two-shot).
    const std::size_t W = w->world_size();
    const CollOptions ce{CollAlgo::TwoShot, DataPath::CopyEngine};
    check_all_reduce(*w, stream, DType::BF16, W * 65536, ce, 6, true);
    check_all_reduce(*w, stream, DType::F32, W * 1000,
                     CollOptions{CollAlgo::TwoShot, DataPath::CopyEngine, ReduceOp::Max}, 7, false);
    check_all_reduce(*w, stream, DType::F16, W * 1000 + 1, ce, 8, false);
}

// Out outside the symmetric heap: two-shot (explicit, and Auto past the LL sizes) stages each rank's reduced shard in
// its scratch; odd counts (a short last shard), max, every dtype; at 5 M elements the shard outgrows a small scratch
// (the dist_small_scratch step's 1 MiB) and goes in rounds.
TEST_F(Collectives, AllReducePlainOut) {
    int tc = 900;
    for (DType t : {DType::F32, DType::F16, DType::BF16})
        for (std::size_t n : {std::size_t(1), std::size_t(3), std::size_t(1001), std::size_t(65539)}) {
            SCOPED_TRACE(std::string("two_shot plain out n ") + std::to_string(n) + " " + dtype_name(t));
            check_all_reduce(*w, stream, t, n, CollOptions{CollAlgo::TwoShot}, ++tc, false, true);
        }
    check_all_reduce(*w, stream, DType::BF16, 4099, CollOptions{CollAlgo::TwoShot, DataPath::Auto, ReduceOp::Max}, ++tc,
                     false, true);
    for (std::size_t n : {std::size_t(300001), (std::size_t(5) << 20) + 3}) {
        SCOPED_TRACE("auto plain out n " + std::to_string(n));
        check_all_reduce(*w, stream, DType::BF16, n, {}, ++tc, false, true);
        check_all_reduce(*w, stream, DType::F32, n, CollOptions{CollAlgo::TwoShot}, ++tc, false, true);
    }
    // The copy-engine two-shot asked for by name needs a symmetric out: a clear error on every rank.
    Sym in(*w, 4096 * 4);
    void* plain = nullptr;
    ASSERT_EQ(cudaMalloc(&plain, 4096 * 4), cudaSuccess);
    std::unique_ptr<void, decltype(&cudaFree)> plain_owner(plain, &cudaFree);
    const std::string e = error_of([&] {
        all_reduce(*w, BufferView{in.p, DType::F32, 4096}, BufferView{plain, DType::F32, 4096}, stream,
                   CollOptions{CollAlgo::TwoShot, DataPath::CopyEngine});
    });
    EXPECT_NE(e.find("two_shot through the copy engine needs out in the symmetric heap"), std::string::npos) << e;
}

// Staged two-shot and one-shot share the scratch: 60 calls back to back alternating them (and a reduce_scatter
// scatter, a third scratch user), inputs changing every call, results checked at five calls.
TEST_F(Collectives, AllReducePlainOutBackToBack) {
    const int W = w->world_size(), me = w->rank();
    const DType t = DType::BF16;
    const std::size_t n = 70001;
    constexpr int kSets = 3;
    Sym in(*w, n * 2 * kSets), sym_out(*w, n * 2), rs_out(*w, 4096 * 2);
    void* plain = nullptr;
    ASSERT_EQ(cudaMalloc(&plain, n * 2), cudaSuccess);
    std::unique_ptr<void, decltype(&cudaFree)> plain_owner(plain, &cudaFree);
    std::vector<std::vector<char>> all[kSets];
    for (int k = 0; k < kSets; ++k) {
        for (int r = 0; r < W; ++r) all[k].push_back(make_input(t, n, seed_of(r, 950, k)));
        ASSERT_EQ(cudaMemcpy(in.as<char>() + k * n * 2, all[k][me].data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
    }
    w->barrier();
    for (int it = 0; it < 60; ++it) {
        const int k = it % kSets;
        const bool staged = it % 2 == 0, check = it < 3 || it == 31 || it == 58;
        void* dst = staged ? plain : sym_out.p;
        if (check) {
            sync_or_die(stream);
            poison(dst, n * 2);
            w->barrier();
        }
        const BufferView src{in.as<char>() + k * n * 2, t, n};
        all_reduce(*w, src, BufferView{dst, t, n}, stream, CollOptions{staged ? CollAlgo::TwoShot : CollAlgo::OneShot});
        if (it % 7 == 3)
            reduce_scatter(*w, BufferView{src.data, t, std::size_t(4096) * W}, BufferView{rs_out.p, t, 4096}, stream,
                           CollOptions{CollAlgo::Scatter, DataPath::LdSt});
        if (!check) continue;
        sync_or_die(stream);
        const auto got = download(dst, n * 2);
        std::string err;
        for (std::size_t i = 0; i < n && err.empty(); ++i) {
            double ref = 0;
            for (int r = 0; r < W; ++r) ref += value_at(t, all[k][r], i);
            if (!(std::fabs(value_at(t, got, i) - ref) <= test::sum_tolerance(t, ref, W)))
                err = "call " + std::to_string(it) + (staged ? " (staged two-shot)" : " (one-shot)") + " element " +
                      std::to_string(i) + ": got " + std::to_string(value_at(t, got, i)) + ", expected " +
                      std::to_string(ref);
        }
        const std::string v = agree(*w, err);
        ASSERT_TRUE(v.empty()) << v;
    }
}

// ---- scratch rounds: three rounds, the last one short, at every world size -------------------------------------
// Elements per peer per round for a scratch of `slots` x C elements (mirrors src/ops: multiples of 16).
std::size_t round_elems(std::size_t slots, std::size_t es) {
    const std::size_t scratch = test::world().coll_scratch();
    return scratch / (slots * es) / 16 * 16;
}

// A round loop with a shorter last round must keep each block on the same scratch addresses in every round (its
// barrier frees only its own range): these counts give rounds of C, C and C/3 + 5 elements. Host memory per rank
// is W x the input (every rank builds every rank's input for the reference), so the reduce-scatter cases shrink
// the scratch's share when W x in would pass 1 GiB (--coll-scratch=1M runs them at full size; see
// scripts/gpu_session.sh dist_small_scratch).
TEST_F(Collectives, ScratchRoundsKeepTheirAddresses) {
    const int W = w->world_size();
    auto three_rounds = [](std::size_t C) { return 2 * C + C / 3 + 5; };
    check_all_reduce(*w, stream, DType::F32, three_rounds(round_elems(W, 4)), CollOptions{CollAlgo::OneShot}, 40,
                     false);
    check_all_reduce(*w, stream, DType::BF16, three_rounds(round_elems(W, 2)), CollOptions{CollAlgo::OneShot}, 41,
                     true);
    const std::size_t host_budget = std::size_t(1) << 30;
    std::string skipped;
    for (CollAlgo a : {CollAlgo::Scatter, CollAlgo::Ring}) {
        const std::size_t C = round_elems(a == CollAlgo::Ring ? std::max(W - 1, 1) : W, 2);
        const std::size_t n = three_rounds(C);
        if (std::size_t(W) * W * n * 2 > host_budget) {
            skipped += std::string(skipped.empty() ? "" : ", ") + to_string(a) + " (" + std::to_string(n) +
                       " elements x " + std::to_string(W) + " ranks)";
            continue;
        }
        check_reduce_scatter(*w, stream, DType::BF16, n, CollOptions{a}, 42 + static_cast<int>(a), false);
    }
    // Reported as a skip, not a pass: these reduce_scatter cases ran nowhere in this process.
    if (!skipped.empty())
        GTEST_SKIP() << "reduce_scatter " << skipped
                     << " exceed the host reference budget; run with --coll-scratch=1M for these cases";
}

// ---- AllToAll ------------------------------------------------------------------------------------------------------
TEST_F(Collectives, AllToAllEqual) {
    const int W = w->world_size(), me = w->rank();
    int tc = 300;
    // Pull (and Auto past LL) also into an out from cudaMalloc, outside the symmetric heap.
    struct Case {
        AlgoPath ap;
        bool plain_out;
    };
    const Case cases[] = {
        {{CollAlgo::Push, DataPath::LdSt}, false},       {{CollAlgo::Push, DataPath::Tma}, false},
        {{CollAlgo::Push, DataPath::CopyEngine}, false}, {{CollAlgo::LL, DataPath::LdSt}, false},
        {{CollAlgo::Pull, DataPath::LdSt}, false},       {{CollAlgo::Pull, DataPath::LdSt}, true},
        {{CollAlgo::Pull, DataPath::Tma}, true},         {{CollAlgo::Pull, DataPath::CopyEngine}, true},
        {{CollAlgo::Auto, DataPath::Auto}, true}};
    for (const auto& [ap, plain_out] : cases)
        // LL's largest: 100001 bf16 = 200002 bytes per peer, under its 256 KiB capacity.
        for (std::size_t n :
             {std::size_t(1), std::size_t(999), ap.algo == CollAlgo::LL ? 100001 : std::size_t(200003)}) {
            SCOPED_TRACE(label(ap) + (plain_out ? " plain out" : "") + " n " + std::to_string(n));
            const DType t = DType::BF16;
            const std::size_t B = n * 2;
            Sym in(*w, B * W), out(*w, B * W);
            void* plain = nullptr;
            if (plain_out) ASSERT_EQ(cudaMalloc(&plain, B * W), cudaSuccess);
            std::unique_ptr<void, decltype(&cudaFree)> plain_owner(plain, &cudaFree);
            void* const dst = plain_out ? plain : out.p;
            ++tc;
            std::vector<std::vector<char>> all(W);
            for (int r = 0; r < W; ++r) all[r] = make_input(t, n * W, seed_of(r, tc));
            upload(in.p, all[me]);
            poison(dst, B * W);
            w->barrier();
            all_to_all(*w, BufferView{in.p, t, n * W}, BufferView{dst, t, n * W}, stream,
                       CollOptions{ap.algo, ap.path});
            sync_or_die(stream);
            const auto got = download(dst, B * W);
            std::string err;
            for (int r = 0; r < W && err.empty(); ++r)
                if (std::memcmp(got.data() + r * B, all[r].data() + me * B, B) != 0)
                    err = "all_to_all " + label(ap) + " n " + std::to_string(n) + ": block from rank " +
                          std::to_string(r) + " differs";
            const std::string v = agree(*w, err);
            ASSERT_TRUE(v.empty()) << v;
        }
}

// Modes: push (out symmetric) and pull (in symmetric: into a symmetric or a plain out; packed or with explicit
// send_offsets, which pull reads on the senders, so they are symmetric; the explicit layout stores the blocks in
// reverse rank order, so that it differs from the packed one), and Auto into a plain out.
TEST_F(Collectives, AllToAllVariableCountsOnDevice) {
    const int W = w->world_size(), me = w->rank();
    struct Mode {
        CollAlgo algo;
        DataPath path;
        bool plain_out, offsets;
    };
    const Mode modes[] = {
        {CollAlgo::Push, DataPath::LdSt, false, false}, {CollAlgo::Push, DataPath::Tma, false, false},
        {CollAlgo::Push, DataPath::LdSt, false, true},  {CollAlgo::Pull, DataPath::LdSt, false, false},
        {CollAlgo::Pull, DataPath::LdSt, true, false},  {CollAlgo::Pull, DataPath::Tma, true, true},
        {CollAlgo::Auto, DataPath::Auto, true, false}};
    for (const Mode& m : modes)
        for (int trial = 0; trial < 3; ++trial) {
            const std::string what = std::string("all_to_all_v ") + to_string(m.algo) + "/" + to_string(m.path) +
                                     (m.plain_out ? " plain out" : "") + (m.offsets ? " offsets" : "") + " trial " +
                                     std::to_string(trial);
            SCOPED_TRACE(what);
            // counts[s][j]: what rank s sends to rank j (every rank computes the whole matrix from the seed).
            std::vector<std::vector<std::int64_t>> counts(W, std::vector<std::int64_t>(W));
            std::uint64_t x = 88172645463325252ull + trial;
            for (int s = 0; s < W; ++s)
                for (int j = 0; j < W; ++j) {
                    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                    counts[s][j] = trial == 0 ? static_cast<std::int64_t>(x % 3) : static_cast<std::int64_t>(x % 5000);
                }
            // Where rank s keeps its block for rank j: packed in rank order, or (offsets) in reverse rank order.
            auto src_offset = [&](int s, int j) {
                std::int64_t a = 0;
                for (int k = 0; k < W; ++k)
                    if (m.offsets ? k > j : k < j) a += counts[s][k];
                return a;
            };
            std::int64_t sent = 0, max_sent = 0;
            for (int j = 0; j < W; ++j) sent += counts[me][j];
            for (int s = 0; s < W; ++s) {
                std::int64_t a = 0;
                for (int j = 0; j < W; ++j) a += counts[s][j];
                max_sent = std::max(max_sent, a);
            }
            const std::size_t cap = 5000 * W + 7;
            const DType t = DType::F32;
            // Symmetric allocations are collective and equal on every rank: in is sized for the largest sender.
            Sym in(*w, (max_sent + 1) * 4), out(*w, cap * 4), cnt(*w, W * 8), offs(*w, W * 8), rcv(*w, W * 8);
            void* plain = nullptr;
            if (m.plain_out) ASSERT_EQ(cudaMalloc(&plain, cap * 4), cudaSuccess);
            std::unique_ptr<void, decltype(&cudaFree)> plain_owner(plain, &cudaFree);
            void* const dst = m.plain_out ? plain : out.p;
            const auto data = make_input(t, sent + 1, seed_of(me, 400 + trial));
            upload(in.p, data);
            upload(cnt.p, std::vector<char>(reinterpret_cast<const char*>(counts[me].data()),
                                            reinterpret_cast<const char*>(counts[me].data()) + W * 8));
            std::vector<std::int64_t> my_offs(W);
            for (int j = 0; j < W; ++j) my_offs[j] = src_offset(me, j);
            upload(offs.p, std::vector<char>(reinterpret_cast<const char*>(my_offs.data()),
                                             reinterpret_cast<const char*>(my_offs.data()) + W * 8));
            poison(dst, cap * 4);
            w->barrier();
            all_to_all_v(*w, BufferView{in.p, t, static_cast<std::size_t>(sent + 1)}, BufferView{dst, t, cap},
                         cnt.as<std::int64_t>(), m.offsets ? offs.as<std::int64_t>() : nullptr, rcv.as<std::int64_t>(),
                         stream, CollOptions{m.algo, m.path});
            sync_or_die(stream);
            const auto got = download(dst, cap * 4);
            std::vector<std::int64_t> rc(W);
            const auto rcb = download(rcv.p, W * 8);
            std::memcpy(rc.data(), rcb.data(), W * 8);
            std::size_t off = 0;
            std::string err;
            for (int s = 0; s < W && err.empty(); ++s) {
                if (rc[s] != counts[s][me]) {
                    err = what + ": recv_counts[" + std::to_string(s) + "] = " + std::to_string(rc[s]) + ", expected " +
                          std::to_string(counts[s][me]);
                    break;
                }
                // Rank s's data for me: its input at its offset for me.
                std::int64_t total = 0;
                for (int j = 0; j < W; ++j) total += counts[s][j];
                const auto src = make_input(t, 1 + total, seed_of(s, 400 + trial));
                if (std::memcmp(got.data() + off * 4, src.data() + src_offset(s, me) * 4, counts[s][me] * 4) != 0)
                    err = what + ": block from rank " + std::to_string(s) + " differs";
                off += counts[s][me];
            }
            const std::string v = agree(*w, err);
            ASSERT_TRUE(v.empty()) << v;
        }
}

// ---- back to back, graphs ----------------------------------------------------------------------------------------
TEST_F(Collectives, TenThousandBackToBackWithChangingInputs) {
    const int W = w->world_size(), me = w->rank();
    const std::size_t n = 257;
    const int kInputs = 8, kIters = 10000;
    const DType t = DType::F32;
    Sym in(*w, kInputs * n * 4), out(*w, 2 * n * 4), ag(*w, n * 4 * W);
    std::vector<std::vector<std::vector<char>>> all(kInputs, std::vector<std::vector<char>>(W));
    std::vector<char> mine;
    for (int k = 0; k < kInputs; ++k) {
        for (int r = 0; r < W; ++r) all[k][r] = make_input(t, n, seed_of(r, 500, k));
        mine.insert(mine.end(), all[k][me].begin(), all[k][me].end());
    }
    upload(in.p, mine);
    w->barrier();
    auto check = [&](int it) {
        sync_or_die(stream);
        const int k = it % kInputs;
        const auto got = download(out.as() + (it % 2) * n * 4, n * 4);
        std::string err;
        for (std::size_t i = 0; i < n && err.empty(); ++i) {
            double ref = 0;
            for (int r = 0; r < W; ++r) ref += value_at(t, all[k][r], i);
            if (!(std::fabs(value_at(t, got, i) - ref) <= test::sum_tolerance(t, ref, W)))
                err = "iteration " + std::to_string(it) + " element " + std::to_string(i) + ": got " +
                      std::to_string(value_at(t, got, i)) + ", expected " + std::to_string(ref);
        }
        return agree(*w, err);
    };
    const CollAlgo algos[] = {CollAlgo::LL, CollAlgo::OneShot, CollAlgo::TwoShot};
    for (int it = 0; it < kIters; ++it) {
        const int k = it % kInputs;
        all_reduce(*w, BufferView{in.as() + k * n * 4, t, n}, BufferView{out.as() + (it % 2) * n * 4, t, n}, stream,
                   CollOptions{algos[(it / 7) % 3]});
        if (it % 1000 == 999) {
            // Interleave another collective (different grid) to exercise the per-block epochs.
            all_gather(*w, BufferView{in.as() + k * n * 4, t, n}, BufferView{ag.p, t, n * W}, stream,
                       CollOptions{CollAlgo::Ring});
        }
        // Checked: each algorithm at least once (LL at 2, OneShot at 8, TwoShot at 17), and late calls.
        if (it == 2 || it == 8 || it == 17 || it == 4321 || it == kIters - 1) {
            const std::string v = check(it);
            ASSERT_TRUE(v.empty()) << v;
        }
    }
}

// In-place all_reduce chained back to back, each call reading what the previous one wrote. The LL kernels launch
// programmatically (PDL: a call may start while the previous one still runs) and must wait in griddep_wait()
// before reading; without that wait a call reads its input before the previous call has written it. Every third
// call is two-shot (not programmatic), so LL follows both kinds of kernels. Exact in fp32: small integers, every
// call after the first multiplies the sums by W, and the chain stops below 2^24.
TEST_F(Collectives, LLChainedInPlaceBackToBack) {
    const int W = w->world_size(), me = w->rank();
    const std::size_t n = 5003;  // ~40 LL blocks, and an odd tail
    const DType t = DType::F32;
    Sym x(*w, n * 4);
    auto x0 = [](int rank, int round, std::size_t i) {
        return static_cast<float>((i * 7 + static_cast<std::size_t>(round) * 3 + static_cast<std::size_t>(rank)) % 11);
    };
    int steps = 1;
    for (double top = 10.0 * W; top * W < double(1 << 24) && steps < 9; top *= W) ++steps;
    std::string err;
    for (int round = 0; round < 24 && err.empty(); ++round) {
        std::vector<char> mine(n * 4);
        for (std::size_t i = 0; i < n; ++i) {
            const float v = x0(me, round, i);
            std::memcpy(mine.data() + i * 4, &v, 4);
        }
        upload(x.p, mine);
        w->barrier();
        for (int s = 0; s < steps; ++s)
            all_reduce(*w, BufferView{x.p, t, n}, BufferView{x.p, t, n}, stream,
                       CollOptions{s % 3 == 2 ? CollAlgo::TwoShot : CollAlgo::LL});
        sync_or_die(stream);
        const auto got = download(x.p, n * 4);
        double scale = 1;
        for (int s = 1; s < steps; ++s) scale *= W;
        for (std::size_t i = 0; i < n && err.empty(); ++i) {
            double ref = 0;
            for (int r = 0; r < W; ++r) ref += x0(r, round, i);
            ref *= scale;
            if (value_at(t, got, i) != ref)
                err = "round " + std::to_string(round) + " (" + std::to_string(steps) + " chained calls) element " +
                      std::to_string(i) + ": got " + std::to_string(value_at(t, got, i)) + ", expected " +
                      std::to_string(ref);
        }
        const std::string v = agree(*w, err);
        if (!v.empty()) err = v;
    }
    ASSERT_TRUE(err.empty()) << err;
}

// A graph of collectives with different grids, replayed with fresh inputs: LL (5 blocks of 52 packets), the
// copy-engine all_gather (its barrier kernels advance only block 0's epoch), two-shot (1 block), and LL again with
// another grid and packet count (64 blocks of 79 packets). The LL area's layout is fixed per (parity, block, source):
// with the launch's packets per block as the stride, a block could read a stale packet of another block whose flag
// (that block's epoch then) equals its own epoch now.
TEST_F(Collectives, CudaGraphCaptureAndReplay) {
    const int W = w->world_size(), me = w->rank();
    const std::size_t n = 1025, n2 = 20000;
    const DType t = DType::BF16;
    Sym in(*w, n * 2), ar(*w, n * 2), agout(*w, n * 2 * W), ar2(*w, n * 2), in2(*w, n2 * 2), ar3(*w, n2 * 2);
    auto enqueue = [&] {
        all_reduce(*w, BufferView{in.p, t, n}, BufferView{ar.p, t, n}, stream, CollOptions{CollAlgo::LL});
        all_gather(*w, BufferView{in.p, t, n}, BufferView{agout.p, t, n * W}, stream,
                   CollOptions{CollAlgo::Push, DataPath::CopyEngine});
        all_reduce(*w, BufferView{in.p, t, n}, BufferView{ar2.p, t, n}, stream, CollOptions{CollAlgo::TwoShot});
        all_reduce(*w, BufferView{in2.p, t, n2}, BufferView{ar3.p, t, n2}, stream, CollOptions{CollAlgo::LL});
    };
    cudaGraphExec_t exec = warm_and_capture(*w, stream, enqueue);
    std::string err;
    for (int replay = 0; replay < 6 && err.empty(); ++replay) {
        std::vector<std::vector<char>> all(W), all2(W);
        for (int r = 0; r < W; ++r) {
            all[r] = make_input(t, n, seed_of(r, 600, replay));
            all2[r] = make_input(t, n2, seed_of(r, 601, replay));
        }
        upload(in.p, all[me]);
        upload(in2.p, all2[me]);
        poison(ar.p, n * 2);
        poison(ar2.p, n * 2);
        poison(ar3.p, n2 * 2);
        poison(agout.p, n * 2 * W);
        w->barrier();  // every rank's inputs and poison are on the device before any graph runs
        cuda_or_die(cudaGraphLaunch(exec, stream), "graph launch");
        sync_or_die(stream);
        const auto g1 = download(ar.p, n * 2), g2 = download(ar2.p, n * 2), g3 = download(agout.p, n * 2 * W);
        const auto g4 = download(ar3.p, n2 * 2);
        auto check_sum = [&](const char* what, const std::vector<std::vector<char>>& x, const std::vector<char>& g,
                             std::size_t cnt) {
            for (std::size_t i = 0; i < cnt && err.empty(); ++i) {
                double ref = 0;
                for (int r = 0; r < W; ++r) ref += value_at(t, x[r], i);
                if (!(std::fabs(value_at(t, g, i) - ref) <= test::sum_tolerance(t, ref, W)))
                    err = "replay " + std::to_string(replay) + " " + what + " element " + std::to_string(i) + ": got " +
                          std::to_string(value_at(t, g, i)) + ", expected " + std::to_string(ref);
            }
        };
        check_sum("ll all_reduce", all, g1, n);
        check_sum("two_shot all_reduce", all, g2, n);
        check_sum("ll all_reduce (64 blocks)", all2, g4, n2);
        for (int r = 0; r < W && err.empty(); ++r)
            if (std::memcmp(g3.data() + r * n * 2, all[r].data(), n * 2) != 0)
                err = "replay " + std::to_string(replay) + " ce all_gather: chunk of rank " + std::to_string(r);
        // Every rank leaves the loop at the same replay (all verdicts agree), so the graphs stay in step.
        const std::string v = agree(*w, err);
        if (!v.empty()) err = v;
    }
    cudaGraphExecDestroy(exec);
    ASSERT_TRUE(err.empty()) << err;
}

// One graph replayed back to back with no host synchronisation between replays (#6: capturable in a CUDA graph and
// reusable back to back). The copy-engine paths pace themselves with stream memory operations, whose values a
// graph freezes: with per-call host counts, a rank in replay k + 1 would pass its waits on the signals of replay k
// and take stale data. Each replay takes new inputs (copied in on the stream before it) and
// its outputs are copied out on the stream after it; one rank per replay starts late (a large copy first), so its
// peers run ahead into the next replay. Every element of every replay is checked. With --coll-scratch=1M
// (the dist_small_scratch step) the copy-engine reduce_scatter runs several rounds per call.
TEST_F(Collectives, GraphReplaysBackToBack) {
    const int W = w->world_size(), me = w->rank();
    const DType t = DType::BF16;
    constexpr int kReplays = 6;
    const std::size_t n = 384 * 1024 / W + 5, B = n * 2;  // elements per rank (odd: tails)
    struct Case {
        const char* name;
        CollKind kind;
        CollOptions opts;
    };
    const std::vector<Case> cases = {
        {"all_gather push/ce", CollKind::AllGather, {CollAlgo::Push, DataPath::CopyEngine}},
        {"all_gather pull/ce", CollKind::AllGather, {CollAlgo::Pull, DataPath::CopyEngine}},
        {"all_gather auto", CollKind::AllGather, {}},
        {"reduce_scatter auto", CollKind::ReduceScatter, {}},
        {"reduce_scatter scatter/ce", CollKind::ReduceScatter, {CollAlgo::Scatter, DataPath::CopyEngine}},
        {"all_reduce two_shot/ce", CollKind::AllReduce, {CollAlgo::TwoShot, DataPath::CopyEngine}},
        {"all_reduce auto", CollKind::AllReduce, {}},
        {"all_to_all push/ce", CollKind::AllToAll, {CollAlgo::Push, DataPath::CopyEngine}},
    };
    // Elements in and out per rank of each case: all_gather n -> W n, reduce_scatter W n -> n, all_reduce n -> n,
    // all_to_all W n -> W n (n per peer).
    auto in_count = [&](CollKind k) { return k == CollKind::ReduceScatter || k == CollKind::AllToAll ? n * W : n; };
    auto out_count = [&](CollKind k) { return k == CollKind::AllGather || k == CollKind::AllToAll ? n * W : n; };
    std::vector<std::unique_ptr<Sym>> ins, outs;
    std::vector<void*> staged, history;  // per case: kReplays inputs, kReplays outputs (plain device memory)
    std::vector<std::vector<std::vector<std::vector<char>>>> inputs(cases.size());  // [case][replay][rank]
    for (std::size_t c = 0; c < cases.size(); ++c) {
        const std::size_t ib = in_count(cases[c].kind) * 2, ob = out_count(cases[c].kind) * 2;
        ins.push_back(std::make_unique<Sym>(*w, ib));
        outs.push_back(std::make_unique<Sym>(*w, ob));
        void *st = nullptr, *h = nullptr;
        cuda_or_die(cudaMalloc(&st, ib * kReplays), "cudaMalloc");
        cuda_or_die(cudaMalloc(&h, ob * kReplays), "cudaMalloc");
        staged.push_back(st);
        history.push_back(h);
        inputs[c].resize(kReplays);
        for (int r = 0; r < kReplays; ++r) {
            for (int q = 0; q < W; ++q)
                inputs[c][r].push_back(
                    make_input(t, in_count(cases[c].kind), seed_of(q, 700 + static_cast<int>(c), r)));
            upload(static_cast<char*>(st) + r * ib, inputs[c][r][me]);
        }
    }
    void* delay = nullptr;  // the late rank's copy: 2 x 128 MiB
    constexpr std::size_t kDelayBytes = std::size_t{128} << 20;
    cuda_or_die(cudaMalloc(&delay, 2 * kDelayBytes), "cudaMalloc");
    auto enqueue = [&] {
        for (std::size_t c = 0; c < cases.size(); ++c) {
            const Case& k = cases[c];
            const BufferView in{ins[c]->p, t, in_count(k.kind)}, out{outs[c]->p, t, out_count(k.kind)};
            switch (k.kind) {
                case CollKind::AllGather:
                    all_gather(*w, in, out, stream, k.opts);
                    break;
                case CollKind::ReduceScatter:
                    reduce_scatter(*w, in, out, stream, k.opts);
                    break;
                case CollKind::AllReduce:
                    all_reduce(*w, in, out, stream, k.opts);
                    break;
                default:
                    all_to_all(*w, in, out, stream, k.opts);
                    break;
            }
        }
    };
    cudaGraphExec_t exec = warm_and_capture(*w, stream, enqueue);
    for (int r = 0; r < kReplays; ++r) {
        if (r % W == me)  // this replay's late rank
            cuda_or_die(cudaMemcpyAsync(static_cast<char*>(delay) + kDelayBytes, delay, kDelayBytes,
                                        cudaMemcpyDeviceToDevice, stream),
                        "delay copy");
        for (std::size_t c = 0; c < cases.size(); ++c) {
            const std::size_t ib = in_count(cases[c].kind) * 2, ob = out_count(cases[c].kind) * 2;
            cuda_or_die(cudaMemcpyAsync(ins[c]->p, static_cast<char*>(staged[c]) + r * ib, ib, cudaMemcpyDeviceToDevice,
                                        stream),
                        "input copy");
            cuda_or_die(cudaMemsetAsync(outs[c]->p, kPoison, ob, stream), "poison");
        }
        cuda_or_die(cudaGraphLaunch(exec, stream), "graph launch");
        for (std::size_t c = 0; c < cases.size(); ++c) {
            const std::size_t ob = out_count(cases[c].kind) * 2;
            cuda_or_die(cudaMemcpyAsync(static_cast<char*>(history[c]) + r * ob, outs[c]->p, ob,
                                        cudaMemcpyDeviceToDevice, stream),
                        "output copy");
        }
    }
    sync_or_die(stream);
    std::string err;
    for (std::size_t c = 0; c < cases.size() && err.empty(); ++c) {
        const CollKind k = cases[c].kind;
        const std::size_t ob = out_count(k) * 2;
        const auto h = download(history[c], ob * kReplays);
        for (int r = 0; r < kReplays && err.empty(); ++r) {
            const std::vector<char> got(h.begin() + r * ob, h.begin() + (r + 1) * ob);
            const auto& x = inputs[c][r];
            auto fail = [&](std::size_t i, double g, double want) {
                err = std::string(cases[c].name) + ", replay " + std::to_string(r) + ", element " + std::to_string(i) +
                      ": got " + std::to_string(g) + ", expected " + std::to_string(want);
            };
            if (k == CollKind::AllGather || k == CollKind::AllToAll) {  // bitwise: chunk q = rank q's (chunk for me)
                const std::size_t from = k == CollKind::AllGather ? 0 : me * n;
                for (int q = 0; q < W && err.empty(); ++q)
                    for (std::size_t i = 0; i < n && err.empty(); ++i)
                        if (std::memcmp(got.data() + (q * n + i) * 2, x[q].data() + (from + i) * 2, 2) != 0)
                            fail(q * n + i, value_at(t, got, q * n + i), value_at(t, x[q], from + i));
            } else {
                const std::size_t base = k == CollKind::ReduceScatter ? me * n : 0;
                for (std::size_t i = 0; i < n && err.empty(); ++i) {
                    double ref = 0;
                    for (int q = 0; q < W; ++q) ref += value_at(t, x[q], base + i);
                    const double g = value_at(t, got, i);
                    if (!(std::fabs(g - ref) <= test::sum_tolerance(t, ref, W))) fail(i, g, ref);
                }
            }
        }
    }
    const std::string v = agree(*w, err);
    cudaGraphExecDestroy(exec);
    for (void* p : staged) cudaFree(p);
    for (void* p : history) cudaFree(p);
    cudaFree(delay);
    ASSERT_TRUE(v.empty()) << v;
}

// LL needs no symmetric buffer (only its LL area is): all_gather and all_to_all between plain cudaMalloc buffers.
TEST_F(Collectives, LLWithPlainBuffers) {
    const int W = w->world_size(), me = w->rank();
    const DType t = DType::BF16;
    const std::size_t n = 3001, B = n * 2;
    char *in = nullptr, *out = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&in), B * W), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), B * W), cudaSuccess);
    std::vector<std::vector<char>> all(W);
    for (int r = 0; r < W; ++r) all[r] = make_input(t, n * W, seed_of(r, 800));
    upload(in, all[me]);
    std::string err;
    poison(out, B * W);
    all_gather(*w, BufferView{in, t, n}, BufferView{out, t, n * W}, stream, CollOptions{CollAlgo::LL});
    sync_or_die(stream);
    auto got = download(out, B * W);
    for (int r = 0; r < W && err.empty(); ++r)
        if (std::memcmp(got.data() + r * B, all[r].data(), B) != 0)
            err = "all_gather ll (plain buffers): chunk of rank " + std::to_string(r) + " differs";
    poison(out, B * W);
    all_to_all(*w, BufferView{in, t, n * W}, BufferView{out, t, n * W}, stream, CollOptions{CollAlgo::LL});
    sync_or_die(stream);
    got = download(out, B * W);
    for (int r = 0; r < W && err.empty(); ++r)
        if (std::memcmp(got.data() + r * B, all[r].data() + me * B, B) != 0)
            err = "all_to_all ll (plain buffers): block from rank " + std::to_string(r) + " differs";
    cudaFree(in);
    cudaFree(out);
    const std::string v = agree(*w, err);
    ASSERT_TRUE(v.empty()) << v;
}

// ---- bad input -----------------------------------------------------------------------------------------------------
// loom::barrier_on_stream: no rank's stream passes it before every rank's stream reached it. Every rank but 0
// enqueues its flag write late (a host sleep), so rank 0's reads of the peers' flags right behind the barrier
// see this round's values only if the barrier held rank 0's stream; the last round also holds the stream after
// the barrier (hold_us), as the benchmarks do. A host barrier ends each round, so no rank rewrites its flag while
// a peer still reads the previous round's.
TEST_F(Collectives, BarrierOnStreamOrdersEveryRanksEarlierWork) {
    const int W = w->world_size(), me = w->rank();
    Sym flag(*w, 256);
    for (int round = 1; round <= 3; ++round) {
        if (me != 0) std::this_thread::sleep_for(std::chrono::milliseconds(30));
        ASSERT_EQ(cudaMemsetAsync(flag.p, round, 256, stream), cudaSuccess);
        barrier_on_stream(*w, stream, round == 3 ? 20.0 : 0.0);
        std::vector<unsigned char> seen(W, 0);
        for (int q = 0; q < W; ++q)
            ASSERT_EQ(cudaMemcpyAsync(&seen[q], w->peer_ptr(flag.as<unsigned char>(), q) + 255, 1,
                                      cudaMemcpyDeviceToHost, stream),
                      cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        std::string err;
        for (int q = 0; q < W; ++q)
            if (seen[q] != round)
                err += "rank " + std::to_string(me) + " read " + std::to_string(seen[q]) + " from rank " +
                       std::to_string(q) + " in round " + std::to_string(round) + "; ";
        ASSERT_EQ(agree(*w, err), "");
        w->barrier("test/collectives/barrier-on-stream");
    }
    EXPECT_NE(error_of([&] { barrier_on_stream(*w, stream, -1.0); }).find("hold_us"), std::string::npos);
}

TEST_F(Collectives, BadInputGivesClearErrors) {
    const int W = w->world_size();
    Sym a(*w, 4096 * W * 4), b(*w, 4096 * W * 4);
    void* plain = nullptr;
    ASSERT_EQ(cudaMalloc(&plain, 4096 * W * 4), cudaSuccess);
    std::string e;
    if (W > 1) {
        e = error_of([&] {
            reduce_scatter(*w, BufferView{a.p, DType::F32, std::size_t(W) * 10 + 1}, BufferView{b.p, DType::F32, 10},
                           stream);
        });
        EXPECT_NE(e.find("divisible"), std::string::npos) << e;
    }
    e = error_of([&] {
        all_gather(*w, BufferView{a.p, DType::F32, 16}, BufferView{b.p, DType::BF16, std::size_t(16) * W}, stream);
    });
    EXPECT_NE(e.find("same dtype"), std::string::npos) << e;
    // Pull reads the peers' in: named with a plain in, it stages in through the scratch and runs.
    ASSERT_EQ(cudaMemset(plain, 0, 4096 * W * 4), cudaSuccess);
    e = error_of([&] {
        all_gather(*w, BufferView{plain, DType::F32, 16}, BufferView{b.p, DType::F32, std::size_t(16) * W}, stream,
                   CollOptions{CollAlgo::Pull});
    });
    EXPECT_EQ(e, "");
    // Two-shot reads the peers' in: named with a plain in, it copies in into the symmetric out and runs there.
    e = error_of([&] {
        all_reduce(*w, BufferView{plain, DType::F32, 100}, BufferView{b.p, DType::F32, 100}, stream,
                   CollOptions{CollAlgo::TwoShot});
    });
    EXPECT_EQ(e, "");
    // Push writes the peers' out and has no staged variant: a plain out is refused, naming the buffer.
    e = error_of([&] {
        all_gather(*w, BufferView{a.p, DType::F32, 16}, BufferView{plain, DType::F32, std::size_t(16) * W}, stream,
                   CollOptions{CollAlgo::Push});
    });
    EXPECT_NE(e.find("allocate it with world.alloc"), std::string::npos) << e;
    e = error_of([&] { all_gather(*w, BufferView{a.p, DType::F32, 16}, BufferView{b.p, DType::F32, 15}, stream); });
    EXPECT_NE(e.find("out.count"), std::string::npos) << e;
    e = error_of([&] { all_reduce(*w, BufferView{a.p, DType::I32, 16}, BufferView{b.p, DType::I32, 16}, stream); });
    EXPECT_NE(e.find("f32, f16 or bf16"), std::string::npos) << e;
    e = error_of([&] {
        all_reduce(*w, BufferView{a.p, DType::F32, 16}, BufferView{b.p, DType::F32, 16}, stream,
                   CollOptions{CollAlgo::Ring});
    });
    EXPECT_NE(e.find("no ld data path"), std::string::npos) << e;
    // LL over its capacity: an explicit request is refused with the capacity named.
    const std::size_t over = kLLMaxBytes / 4 + 1;
    Sym big_in(*w, over * 4), big_out(*w, over * 4 * W);
    e = error_of([&] {
        all_gather(*w, BufferView{big_in.p, DType::F32, over}, BufferView{big_out.p, DType::F32, over * W}, stream,
                   CollOptions{CollAlgo::LL});
    });
    EXPECT_NE(e.find("the ll algorithm holds at most " + std::to_string(kLLMaxBytes) + " bytes per chunk"),
              std::string::npos)
        << e;
    // all_to_all_v whose block for rank 0 runs past the sender's in (17 of 16 elements): in checking mode (on in
    // the tests) the counts are read back and every rank raises naming the block, before any launch.
    {
        Sym cnts(*w, W * 8);
        std::vector<std::int64_t> c(W, 0);
        c[0] = 17;
        ASSERT_EQ(cudaMemcpy(cnts.p, c.data(), W * 8, cudaMemcpyHostToDevice), cudaSuccess);
        e = error_of([&] {
            all_to_all_v(*w, BufferView{a.p, DType::F32, 16}, BufferView{plain, DType::F32, std::size_t(32) * W},
                         cnts.as<std::int64_t>(), nullptr, nullptr, stream);
        });
        EXPECT_NE(e.find("lies outside its in"), std::string::npos) << e;
        EXPECT_NE(e.find("> in.count = 16"), std::string::npos) << e;
    }
    // AllToAll's pull reads the peers' in: named with a plain in, it stages in through the scratch and runs.
    e = error_of([&] {
        all_to_all(*w, BufferView{plain, DType::F32, std::size_t(16) * W},
                   BufferView{b.p, DType::F32, std::size_t(16) * W}, stream, CollOptions{CollAlgo::Pull});
    });
    EXPECT_EQ(e, "");
    cudaFree(plain);
    // The world is still usable after the errors (no collective was launched by them).
    check_all_reduce(*w, stream, DType::F32, 100, {}, 700, false);
}

}  // namespace
}  // namespace loom
