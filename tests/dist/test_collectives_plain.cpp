// Collectives on buffers outside the symmetric heap (cudaMalloc, as a PyTorch tensor's) against a CPU reference on
// every rank: every op with in plain, out plain and both, below and past the LL sizes and past the scratch (a 1 MiB
// scratch, so the staged paths and the scratch algorithms go in rounds, the last one short), odd counts; bitwise for
// data movement, an fp64 reference for reductions; outputs poisoned first, every element checked. all_to_all_v also
// with its counts and offsets outside the heap, and the elements of out that no block lands on checked to keep their
// values. Then staged calls back to back with the other scratch users. Run under loomrun at 2, 4 and 8 ranks.
//
// As in test_collectives.cpp, every check gathers every rank's verdict (test::agree) before asserting, so that all
// ranks fail together; host writes to device memory are complete before the host barrier that precedes a call.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/device_io.hpp"
#include "common/reference.hpp"
#include "common/test_env.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "ops/collectives/coll_choice.hpp"

namespace loom {
namespace {

using test::cuda_or_die;
using test::download;
using test::kPoison;
using test::poison;
using test::sync_or_die;
using test::upload;
using test::value_at;

std::uint64_t seed_of(int rank, int test_case, int iter = 0) {
    return 0x9e3779b97f4a7c15ull * (rank + 1) + 1000003ull * test_case + 7919ull * iter + 4242;
}
// Raw values of `t` (bf16 or f32) from random floats.
std::vector<char> make_input(DType t, std::size_t n, std::uint64_t seed) {
    const auto f = test::random_floats(n, seed);
    std::vector<char> raw(n * dtype_size(t));
    for (std::size_t i = 0; i < n; ++i) {
        if (t == DType::F32) {
            std::memcpy(raw.data() + 4 * i, &f[i], 4);
        } else {
            const std::uint16_t h = test::float_to_bf16(f[i]);
            std::memcpy(raw.data() + 2 * i, &h, 2);
        }
    }
    return raw;
}

std::string agree(World& w, const std::string& mine) { return test::agree(w, mine, "test/collectives_plain/verdict"); }

// Where the call's buffers live: plain (cudaMalloc) or symmetric (world.alloc).
struct Placement {
    bool in_plain, out_plain;
};
std::string name_of(const Placement& p) {
    return p.in_plain && p.out_plain ? "plain in and out" : p.in_plain ? "plain in" : "plain out";
}
constexpr Placement kPlacements[] = {{true, false}, {false, true}, {true, true}};

// A device buffer of `bytes`: plain (cudaMalloc) or symmetric (world.alloc: collective, the same size on every rank).
class Buf {
  public:
    Buf(World& w, std::size_t bytes, bool plain) : w_(w), plain_(plain) {
        bytes = std::max<std::size_t>(bytes, 256);
        if (plain)
            cuda_or_die(cudaMalloc(reinterpret_cast<void**>(&p), bytes), "cudaMalloc");
        else
            p = static_cast<char*>(w.alloc_bytes(bytes));
    }
    ~Buf() {
        if (plain_)
            cudaFree(p);
        else
            w_.free(p);
    }
    Buf(const Buf&) = delete;
    Buf& operator=(const Buf&) = delete;
    char* p = nullptr;

  private:
    World& w_;
    bool plain_;
};

// The World's collective scratch replaced by one of `bytes` for the scope (released and recreated on the next
// call, at either end: collective).
class SmallScratch {
  public:
    SmallScratch(World& w, std::size_t bytes) : w_(w), before_(w.coll_scratch()) {
        w_.set_coll_scratch(bytes);
        w_.release_states("collectives/scratch");
    }
    ~SmallScratch() {
        w_.set_coll_scratch(before_);
        w_.release_states("collectives/scratch");
    }

  private:
    World& w_;
    std::size_t before_;
};

std::string what(const char* op, const Placement& pl, const CollOptions& o, DType t, std::size_t n) {
    return std::string(op) + " " + to_string(o.algo) + "/" + to_string(o.path) + " " + name_of(pl) + " " +
           dtype_name(t) + " n " + std::to_string(n);
}

// ---- data movement -------------------------------------------------------------------------------------------------
// all_gather of n elements per rank; in_place: in is this rank's chunk of out (in and out then both plain or both not).
std::string check_all_gather(World& w, cudaStream_t s, DType t, std::size_t n, const Placement& pl, int tc,
                             const CollOptions& o = {}, bool in_place = false) {
    const int W = w.world_size(), me = w.rank();
    const std::size_t B = n * dtype_size(t);
    Buf in(w, B, pl.in_plain), out(w, B * W, pl.out_plain);
    std::vector<std::vector<char>> all(W);
    for (int r = 0; r < W; ++r) all[r] = make_input(t, n, seed_of(r, tc));
    poison(out.p, B * W);
    char* const src = in_place ? out.p + me * B : in.p;
    upload(src, all[me]);
    w.barrier();
    std::string err;
    try {
        all_gather(w, BufferView{src, t, n}, BufferView{out.p, t, n * W}, s, o);
        sync_or_die(s);
    } catch (const Error& e) {
        err = e.what();
    }
    const auto got = err.empty() ? download(out.p, B * W) : std::vector<char>();
    for (int r = 0; r < W && err.empty(); ++r)
        for (std::size_t i = 0; i < B && err.empty(); ++i)
            if (got[r * B + i] != all[r][i])
                err = what("all_gather", pl, o, t, n) + (in_place ? " in place" : "") + ": chunk of rank " +
                      std::to_string(r) + " differs first at byte " + std::to_string(i) + " of " + std::to_string(B);
    return agree(w, err);
}

// all_to_all of n elements per peer.
std::string check_all_to_all(World& w, cudaStream_t s, DType t, std::size_t n, const Placement& pl, int tc,
                             const CollOptions& o = {}) {
    const int W = w.world_size(), me = w.rank();
    const std::size_t B = n * dtype_size(t);
    Buf in(w, B * W, pl.in_plain), out(w, B * W, pl.out_plain);
    std::vector<std::vector<char>> all(W);
    for (int r = 0; r < W; ++r) all[r] = make_input(t, n * W, seed_of(r, tc));
    upload(in.p, all[me]);
    poison(out.p, B * W);
    w.barrier();
    std::string err;
    try {
        all_to_all(w, BufferView{in.p, t, n * W}, BufferView{out.p, t, n * W}, s, o);
        sync_or_die(s);
    } catch (const Error& e) {
        err = e.what();
    }
    const auto got = err.empty() ? download(out.p, B * W) : std::vector<char>();
    for (int r = 0; r < W && err.empty(); ++r)
        for (std::size_t i = 0; i < B && err.empty(); ++i)
            if (got[r * B + i] != all[r][me * B + i])
                err = what("all_to_all", pl, o, t, n) + ": block from rank " + std::to_string(r) +
                      " differs first at byte " + std::to_string(i) + " of " + std::to_string(B);
    return agree(w, err);
}

// ---- reductions ----------------------------------------------------------------------------------------------------
// reduce_scatter into n elements per rank; in_place: out is this rank's chunk of in (both then placed as in).
std::string check_reduce_scatter(World& w, cudaStream_t s, DType t, std::size_t n, const Placement& pl, int tc,
                                 const CollOptions& o = {}, bool in_place = false) {
    const int W = w.world_size(), me = w.rank();
    const std::size_t es = dtype_size(t);
    Buf in(w, n * W * es, pl.in_plain), out(w, n * es, pl.out_plain);
    std::vector<std::vector<char>> all(W);
    for (int r = 0; r < W; ++r) all[r] = make_input(t, n * W, seed_of(r, tc));
    upload(in.p, all[me]);
    char* const dst = in_place ? in.p + me * n * es : out.p;
    if (!in_place) poison(out.p, n * es);
    w.barrier();
    std::string err;
    try {
        reduce_scatter(w, BufferView{in.p, t, n * W}, BufferView{dst, t, n}, s, o);
        sync_or_die(s);
    } catch (const Error& e) {
        err = e.what();
    }
    const auto got = err.empty() ? download(dst, n * es) : std::vector<char>();
    for (std::size_t i = 0; i < n && err.empty(); ++i) {
        double ref = 0;
        for (int r = 0; r < W; ++r) ref += value_at(t, all[r], me * n + i);
        const double g = value_at(t, got, i);
        if (!(std::fabs(g - ref) <= test::sum_tolerance(t, ref, W)))
            err = what("reduce_scatter", pl, o, t, n) + (in_place ? " in place" : "") + ": element " +
                  std::to_string(i) + " is " + std::to_string(g) + ", expected " + std::to_string(ref);
    }
    return agree(w, err);
}

std::string check_all_reduce(World& w, cudaStream_t s, DType t, std::size_t n, const Placement& pl, int tc,
                             const CollOptions& o = {}) {
    const int W = w.world_size(), me = w.rank();
    const std::size_t es = dtype_size(t);
    Buf in(w, n * es, pl.in_plain), out(w, n * es, pl.out_plain);
    std::vector<std::vector<char>> all(W);
    for (int r = 0; r < W; ++r) all[r] = make_input(t, n, seed_of(r, tc));
    upload(in.p, all[me]);
    poison(out.p, n * es);
    w.barrier();
    std::string err;
    try {
        all_reduce(w, BufferView{in.p, t, n}, BufferView{out.p, t, n}, s, o);
        sync_or_die(s);
    } catch (const Error& e) {
        err = e.what();
    }
    const auto got = err.empty() ? download(out.p, n * es) : std::vector<char>();
    for (std::size_t i = 0; i < n && err.empty(); ++i) {
        double ref = 0;
        for (int r = 0; r < W; ++r) ref += value_at(t, all[r], i);
        const double g = value_at(t, got, i);
        if (!(std::fabs(g - ref) <= test::sum_tolerance(t, ref, W)))
            err = what("all_reduce", pl, o, t, n) + ": element " + std::to_string(i) + " is " + std::to_string(g) +
                  ", expected " + std::to_string(ref);
    }
    return agree(w, err);
}

// ---- all_to_all_v --------------------------------------------------------------------------------------------------
// Variable splits, counts from [0, max_count) (every rank computes the whole matrix from the seed), f32. plain_args:
// send_counts and send_offsets from cudaMalloc too. offsets: explicit send_offsets that store the blocks in reverse
// rank order (else null: packed). Checks every received element, recv_counts, and that out past the received blocks
// keeps its poison.
std::string check_all_to_all_v(World& w, cudaStream_t s, const Placement& pl, bool plain_args, bool offsets,
                               std::int64_t max_count, int tc, const CollOptions& o = {}) {
    const int W = w.world_size(), me = w.rank();
    const DType t = DType::F32;
    std::vector<std::vector<std::int64_t>> counts(W, std::vector<std::int64_t>(W));
    std::uint64_t x = 88172645463325252ull + static_cast<std::uint64_t>(tc);
    for (int r = 0; r < W; ++r)
        for (int j = 0; j < W; ++j) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            counts[r][j] = static_cast<std::int64_t>(x % static_cast<std::uint64_t>(max_count));
        }
    auto src_offset = [&](int r, int j) {
        std::int64_t a = 0;
        for (int k = 0; k < W; ++k)
            if (offsets ? k > j : k < j) a += counts[r][k];
        return a;
    };
    auto sent_by = [&](int r) {
        std::int64_t a = 0;
        for (int j = 0; j < W; ++j) a += counts[r][j];
        return a;
    };
    std::int64_t max_sent = 0, received = 0;
    for (int r = 0; r < W; ++r) max_sent = std::max(max_sent, sent_by(r)), received += counts[r][me];
    const std::size_t cap = static_cast<std::size_t>(max_count) * W + 7;
    // Symmetric allocations are collective and equal on every rank: in is sized for the largest sender.
    Buf in(w, (max_sent + 1) * 4, pl.in_plain), out(w, cap * 4, pl.out_plain);
    Buf cnt(w, W * 8, plain_args), offs(w, W * 8, plain_args), rcv(w, W * 8, true);
    const auto data = make_input(t, sent_by(me) + 1, seed_of(me, tc));
    upload(in.p, data);
    upload(cnt.p, std::vector<char>(reinterpret_cast<const char*>(counts[me].data()),
                                    reinterpret_cast<const char*>(counts[me].data()) + W * 8));
    std::vector<std::int64_t> my_offs(W);
    for (int j = 0; j < W; ++j) my_offs[j] = src_offset(me, j);
    upload(offs.p, std::vector<char>(reinterpret_cast<const char*>(my_offs.data()),
                                     reinterpret_cast<const char*>(my_offs.data()) + W * 8));
    poison(out.p, cap * 4);
    w.barrier();
    const std::string label = std::string("all_to_all_v ") + to_string(o.algo) + "/" + to_string(o.path) + " " +
                              name_of(pl) + (plain_args ? ", plain counts" : "") + (offsets ? ", offsets" : "") +
                              " max_count " + std::to_string(max_count);
    std::string err;
    try {
        all_to_all_v(w, BufferView{in.p, t, static_cast<std::size_t>(sent_by(me) + 1)}, BufferView{out.p, t, cap},
                     reinterpret_cast<const std::int64_t*>(cnt.p),
                     offsets ? reinterpret_cast<const std::int64_t*>(offs.p) : nullptr,
                     reinterpret_cast<std::int64_t*>(rcv.p), s, o);
        sync_or_die(s);
    } catch (const Error& e) {
        err = label + ": " + e.what();
    }
    if (err.empty()) {
        const auto got = download(out.p, cap * 4);
        const auto rcb = download(rcv.p, W * 8);
        std::size_t off = 0;
        for (int r = 0; r < W && err.empty(); ++r) {
            std::int64_t rc;
            std::memcpy(&rc, rcb.data() + r * 8, 8);
            if (rc != counts[r][me]) {
                err = label + ": recv_counts[" + std::to_string(r) + "] = " + std::to_string(rc) + ", expected " +
                      std::to_string(counts[r][me]);
                break;
            }
            const auto src = make_input(t, sent_by(r) + 1, seed_of(r, tc));
            for (std::int64_t i = 0; i < counts[r][me] && err.empty(); ++i)
                if (std::memcmp(got.data() + (off + i) * 4, src.data() + (src_offset(r, me) + i) * 4, 4) != 0)
                    err = label + ": element " + std::to_string(i) + " of the block from rank " + std::to_string(r) +
                          " differs";
            off += counts[r][me];
        }
        for (std::size_t i = static_cast<std::size_t>(received) * 4; i < cap * 4 && err.empty(); ++i)
            if (static_cast<unsigned char>(got[i]) != kPoison)
                err = label + ": out byte " + std::to_string(i) + " past the " + std::to_string(received) +
                      " received elements was overwritten";
    }
    return agree(w, err);
}

class PlainBuffers : public WorldStreamTest {};

// Below the LL sizes (LL: no symmetric buffer needed), and past them (512 KiB per chunk and more, where no LL row
// applies): the staged pull for all_gather and all_to_all with both buffers plain, the algorithm that does without the
// plain one otherwise; for reduce_scatter and all_reduce what the cost model picks (scatter or pull with in staged;
// one-shot, or two-shot with in staged or its shards through the scratch). Odd counts throughout.
TEST_F(PlainBuffers, EveryCollectiveEveryPlacement) {
    int tc = 0;
    for (const Placement& pl : kPlacements)
        for (std::size_t n : {std::size_t(1), std::size_t(3), std::size_t(1001), std::size_t(300007)}) {
            SCOPED_TRACE(name_of(pl) + " n " + std::to_string(n));
            std::string v = check_all_gather(*w, stream, DType::BF16, n, pl, ++tc);
            ASSERT_TRUE(v.empty()) << v;
            v = check_all_to_all(*w, stream, DType::BF16, n, pl, ++tc);
            ASSERT_TRUE(v.empty()) << v;
            for (DType t : {DType::BF16, DType::F32}) {
                v = check_reduce_scatter(*w, stream, t, n, pl, ++tc);
                ASSERT_TRUE(v.empty()) << v;
                v = check_all_reduce(*w, stream, t, n, pl, ++tc);
                ASSERT_TRUE(v.empty()) << v;
            }
        }
    // In place with one plain buffer (all_gather's in is out's chunk of this rank).
    const std::string v = check_all_gather(*w, stream, DType::BF16, 300007, Placement{true, true}, ++tc, {}, true);
    ASSERT_TRUE(v.empty()) << v;
}

// Staged paths asked for by name: pull over ld/st and TMA for all_gather and all_to_all with in plain (out symmetric
// or not), push over ld/st and TMA for all_to_all_v into a plain out; in the middle of the range (one round).
TEST_F(PlainBuffers, StagedByName) {
    int tc = 100;
    for (DataPath p : {DataPath::LdSt, DataPath::Tma})
        for (const Placement& pl : {Placement{true, false}, Placement{true, true}}) {
            const CollOptions o{CollAlgo::Pull, p};
            std::string v = check_all_gather(*w, stream, DType::BF16, 70001, pl, ++tc, o);
            ASSERT_TRUE(v.empty()) << v;
            v = check_all_to_all(*w, stream, DType::F32, 30011, pl, ++tc, o);
            ASSERT_TRUE(v.empty()) << v;
            v = check_all_to_all_v(*w, stream, Placement{pl.in_plain, true}, false, false, 5000, ++tc,
                                   CollOptions{CollAlgo::Push, p});
            ASSERT_TRUE(v.empty()) << v;
        }
    // The copy engine cannot be staged: a clear error on every rank, nothing launched.
    const std::string v = check_all_gather(*w, stream, DType::BF16, 70001, Placement{true, true}, ++tc,
                                           CollOptions{CollAlgo::Pull, DataPath::CopyEngine});
    EXPECT_NE(v.find("pull through the copy engine needs in in the symmetric heap"), std::string::npos) << v;
}

// all_to_all_v: every placement of in and out, counts and offsets symmetric or plain (staged into a symmetric area
// where the kernel reads them on the senders), packed or explicit offsets, Auto and pull.
TEST_F(PlainBuffers, AllToAllVCountsAndBuffers) {
    int tc = 200;
    for (const Placement& pl : kPlacements)
        for (bool plain_args : {false, true})
            for (bool offsets : {false, true}) {
                std::string v = check_all_to_all_v(*w, stream, pl, plain_args, offsets, 3, ++tc);
                ASSERT_TRUE(v.empty()) << v;
                v = check_all_to_all_v(*w, stream, pl, plain_args, offsets, 20011, ++tc);
                ASSERT_TRUE(v.empty()) << v;
            }
    // Pull (in symmetric) with plain counts and plain explicit offsets, which the receivers read on the senders.
    const std::string v = check_all_to_all_v(*w, stream, Placement{false, true}, true, true, 20011, ++tc,
                                             CollOptions{CollAlgo::Pull, DataPath::LdSt});
    ASSERT_TRUE(v.empty()) << v;
}

// Past a 1 MiB scratch: the staged paths and the scratch algorithms in rounds (all_gather: 2 MiB + 10 bytes per rank,
// three rounds, the last of 10 bytes; all_to_all: 1.2 MB per peer, 3 rounds at 2 ranks and 10 at 8; all_to_all_v:
// windows of 262144 f32 over a capacity of 200001 x W + 7, blocks straddling the windows; reduce_scatter and
// all_reduce in rounds, as the cost model chooses).
TEST_F(PlainBuffers, PastTheScratchInRounds) {
    const SmallScratch small(*w, std::size_t(1) << 20);
    int tc = 300;
    for (const Placement& pl : kPlacements) {
        SCOPED_TRACE(name_of(pl));
        std::string v = check_all_gather(*w, stream, DType::BF16, (std::size_t(1) << 20) + 5, pl, ++tc);
        ASSERT_TRUE(v.empty()) << v;
        v = check_all_to_all(*w, stream, DType::BF16, 600001, pl, ++tc);
        ASSERT_TRUE(v.empty()) << v;
        v = check_all_to_all_v(*w, stream, pl, pl.in_plain, false, 200001, ++tc);
        ASSERT_TRUE(v.empty()) << v;
        v = check_reduce_scatter(*w, stream, DType::BF16, 300007, pl, ++tc);
        ASSERT_TRUE(v.empty()) << v;
        v = check_all_reduce(*w, stream, DType::F32, 300007, pl, ++tc);
        ASSERT_TRUE(v.empty()) << v;
    }
    const std::string v = check_all_gather(*w, stream, DType::BF16, (std::size_t(1) << 20) + 5, Placement{true, true},
                                           ++tc, CollOptions{CollAlgo::Pull, DataPath::Tma});
    ASSERT_TRUE(v.empty()) << v;
}

// reduce_scatter's pull and all_reduce's two-shot with in plain, staged: by name and by Auto, past a 1 MiB scratch
// (reduce_scatter: rounds of 1 MiB / W of every chunk, the last short; all_reduce with out plain: rounds of half the
// scratch, its shards through the other half; with out symmetric: in copied into out, reduced in place), odd counts,
// bf16 and f32, reduce_scatter in place too. Auto at 2,000,003 f32 per rank: the choice is checked to be staged there
// (the cost model stages both ops at that size for every rank count and GPU sharing).
TEST_F(PlainBuffers, StagedReductionsInRounds) {
    const SmallScratch small(*w, std::size_t(1) << 20);
    const CollTopology topo = collective_topology(*w);
    int tc = 500;
    for (const Placement& pl : {Placement{true, false}, Placement{true, true}}) {
        SCOPED_TRACE(name_of(pl));
        for (DType t : {DType::BF16, DType::F32})
            for (std::size_t n : {std::size_t(300007), std::size_t(1001)}) {
                std::string v = check_reduce_scatter(*w, stream, t, n, pl, ++tc, CollOptions{CollAlgo::Pull});
                ASSERT_TRUE(v.empty()) << v;
                v = check_all_reduce(*w, stream, t, n, pl, ++tc, CollOptions{CollAlgo::TwoShot});
                ASSERT_TRUE(v.empty()) << v;
            }
        const std::size_t big = 2000003;
        for (CollKind k : {CollKind::ReduceScatter, CollKind::AllReduce}) {
            const CollChoice c = choose_collective(k, big * 4, topo, false, !pl.out_plain);
            ASSERT_TRUE(c.staged) << to_string(k) << ": " << c.reason;
        }
        std::string v = check_reduce_scatter(*w, stream, DType::F32, big, pl, ++tc);
        ASSERT_TRUE(v.empty()) << v;
        v = check_all_reduce(*w, stream, DType::F32, big, pl, ++tc);
        ASSERT_TRUE(v.empty()) << v;
    }
    // In place with in plain (out is in's chunk of this rank): by name and Auto.
    for (const CollOptions& o : {CollOptions{CollAlgo::Pull}, CollOptions{}}) {
        const std::string v =
            check_reduce_scatter(*w, stream, DType::F32, 2000003, Placement{true, true}, ++tc, o, true);
        ASSERT_TRUE(v.empty()) << v;
    }
}

// The staged paths share the scratch with the other algorithms: 60 calls back to back, no host synchronisation but at
// the checked calls, alternating a staged all_gather, a two-shot all_reduce into a plain out (whose last round leaves
// the peers reading this rank's scratch when its kernel ends), a staged all_to_all, a staged reduce_scatter, a two-shot
// all_reduce with in and out plain (in staged) and a one-shot all_reduce, inputs changing every call; every element
// checked at five calls.
TEST_F(PlainBuffers, StagedBackToBackWithOtherScratchUsers) {
    const int W = w->world_size(), me = w->rank();
    const DType t = DType::BF16;
    const std::size_t n = 300007, B = n * 2;
    constexpr int kSets = 3;
    Buf in(*w, B * W * kSets, true), sym_in(*w, B * kSets, false), ag(*w, B * W, true), a2a(*w, B * W, true),
        ar(*w, B, true), rs(*w, B, true), ar2(*w, B, true), one_shot(*w, 4099 * 2, true);
    std::vector<std::vector<char>> all[kSets];
    for (int k = 0; k < kSets; ++k) {
        for (int r = 0; r < W; ++r) all[k].push_back(make_input(t, n * W, seed_of(r, 400, k)));
        cuda_or_die(cudaMemcpy(in.p + k * B * W, all[k][me].data(), B * W, cudaMemcpyHostToDevice), "upload");
        cuda_or_die(cudaMemcpy(sym_in.p + k * B, all[k][me].data(), B, cudaMemcpyHostToDevice), "upload");
    }
    cuda_or_die(cudaDeviceSynchronize(), "upload sync");
    w->barrier();
    std::string err;
    for (int it = 0; it < 60 && err.empty(); ++it) {
        const int k = it % kSets;
        const bool check = it < 4 || it == 31 || it == 59;
        if (check) {
            sync_or_die(stream);
            poison(ag.p, B * W);
            poison(a2a.p, B * W);
            poison(ar.p, B);
            poison(rs.p, B);
            poison(ar2.p, B);
            poison(one_shot.p, 4099 * 2);
            w->barrier();
        }
        char* const src = in.p + k * B * W;
        try {
            all_gather(*w, BufferView{src, t, n}, BufferView{ag.p, t, n * W}, stream);
            all_reduce(*w, BufferView{sym_in.p + k * B, t, n}, BufferView{ar.p, t, n}, stream,
                       CollOptions{CollAlgo::TwoShot});
            all_to_all(*w, BufferView{src, t, n * W}, BufferView{a2a.p, t, n * W}, stream);
            reduce_scatter(*w, BufferView{src, t, n * W}, BufferView{rs.p, t, n}, stream, CollOptions{CollAlgo::Pull});
            all_reduce(*w, BufferView{src, t, n}, BufferView{ar2.p, t, n}, stream, CollOptions{CollAlgo::TwoShot});
            if (it % 5 == 4)
                all_reduce(*w, BufferView{src, t, 4099}, BufferView{one_shot.p, t, 4099}, stream,
                           CollOptions{CollAlgo::OneShot});
        } catch (const Error& e) {
            err = e.what();
        }
        if (!check || !err.empty()) continue;
        sync_or_die(stream);
        const auto g_ag = download(ag.p, B * W), g_a2a = download(a2a.p, B * W), g_ar = download(ar.p, B),
                   g_rs = download(rs.p, B), g_ar2 = download(ar2.p, B);
        for (int r = 0; r < W && err.empty(); ++r) {
            if (std::memcmp(g_ag.data() + r * B, all[k][r].data(), B) != 0)
                err = "call " + std::to_string(it) + ": all_gather chunk of rank " + std::to_string(r) + " differs";
            else if (std::memcmp(g_a2a.data() + r * B, all[k][r].data() + me * B, B) != 0)
                err = "call " + std::to_string(it) + ": all_to_all block from rank " + std::to_string(r) + " differs";
        }
        for (std::size_t i = 0; i < n && err.empty(); ++i) {
            double ref = 0;
            for (int r = 0; r < W; ++r) ref += value_at(t, all[k][r], i);
            if (!(std::fabs(value_at(t, g_ar, i) - ref) <= test::sum_tolerance(t, ref, W)))
                err = "call " + std::to_string(it) + ": all_reduce element " + std::to_string(i) + " is " +
                      std::to_string(value_at(t, g_ar, i)) + ", expected " + std::to_string(ref);
            else if (!(std::fabs(value_at(t, g_ar2, i) - ref) <= test::sum_tolerance(t, ref, W)))
                err = "call " + std::to_string(it) + ": all_reduce (in staged) element " + std::to_string(i) + " is " +
                      std::to_string(value_at(t, g_ar2, i)) + ", expected " + std::to_string(ref);
            double rs_ref = 0;
            for (int r = 0; r < W; ++r) rs_ref += value_at(t, all[k][r], me * n + i);
            if (err.empty() && !(std::fabs(value_at(t, g_rs, i) - rs_ref) <= test::sum_tolerance(t, rs_ref, W)))
                err = "call " + std::to_string(it) + ": reduce_scatter element " + std::to_string(i) + " is " +
                      std::to_string(value_at(t, g_rs, i)) + ", expected " + std::to_string(rs_ref);
        }
        if (it % 5 == 4) {  // the one-shot all_reduce of the first 4099 elements (checked at call 59)
            const auto g_one = download(one_shot.p, 4099 * 2);
            for (std::size_t i = 0; i < 4099 && err.empty(); ++i) {
                double ref = 0;
                for (int r = 0; r < W; ++r) ref += value_at(t, all[k][r], i);
                if (!(std::fabs(value_at(t, g_one, i) - ref) <= test::sum_tolerance(t, ref, W)))
                    err = "call " + std::to_string(it) + ": one-shot all_reduce element " + std::to_string(i) + " is " +
                          std::to_string(value_at(t, g_one, i)) + ", expected " + std::to_string(ref);
            }
        }
    }
    sync_or_die(stream);
    const std::string v = agree(*w, err);
    ASSERT_TRUE(v.empty()) << v;
}

}  // namespace
}  // namespace loom
