// The bad-input catalogue: for every public op, bad calls (null, host memory, misaligned, wrong and out-of-range
// dtypes, sizes that overflow, a short symmetric buffer, a freed one, and — with more than one rank — ranks that
// disagree) each raise loom::Error on every rank, with a message naming the argument; then a good call of the op runs
// and every element of its result is checked (no bad call launched anything: the context is still usable).
//
// Checking mode (Settings::check_agreement) is on here, as in every test binary (tests/common/test_main.cpp).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/device_io.hpp"
#include "common/reference.hpp"
#include "common/test_env.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/error.hpp"
#include "runtime/settings_override.hpp"

namespace loom {
namespace {

constexpr std::size_t kHuge = std::numeric_limits<std::size_t>::max() / 2;
alignas(256) char host_array[1 << 20];  // a static array: host memory CUDA does not know

// A symmetric allocation freed (collectively) at scope exit.
struct Sym {
    World& w;
    void* p;
    std::size_t bytes;
    Sym(World& world, std::size_t n) : w(world), p(world.alloc_bytes(n)), bytes(n) {}
    ~Sym() { w.free(p); }
    template <class T = char>
    T* as() const {
        return static_cast<T*>(p);
    }
};

template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

struct Case {
    std::string what;
    std::function<void()> call;
    std::vector<std::string> expect;  // parts of the message
};

// Runs the cases on every rank; every rank's verdicts are gathered so that all ranks pass or fail together.
void run_cases(World& w, const std::string& op, const std::vector<Case>& cases) {
    EXPECT_GE(cases.size(), 8u) << op;
    std::string bad;
    for (const Case& c : cases) {
        const std::string m = error_of(c.call);
        if (m.empty()) bad += op + " / " + c.what + ": no loom::Error\n";
        for (const std::string& part : c.expect)
            if (!m.empty() && m.find(part) == std::string::npos)
                bad += op + " / " + c.what + ": \"" + part + "\" not in: " + m + "\n";
    }
    EXPECT_EQ(test::agree(w, bad, "bad-inputs/" + op), "");
}

// Small integers as f32 (exact sums), seeded by (rank, salt).
std::vector<float> ints(std::size_t n, int rank, int salt) {
    std::mt19937 g(static_cast<unsigned>(test::run_seed(rank * 7919 + salt)));
    std::uniform_int_distribution<int> d(-50, 50);
    std::vector<float> v(n);
    for (auto& x : v) {
        const int i = d(g);
        x = static_cast<float>(i == 0 ? 51 : i);  // never zero
    }
    return v;
}

template <class T>
std::vector<T> download(const void* p, std::size_t n) {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

class BadInputs : public WorldStreamTest {
  protected:
    void SetUp() override {
        WorldStreamTest::SetUp();
        if (IsSkipped()) return;
        agreement.emplace([](Settings& s) { s.check_agreement = true; });
        ASSERT_EQ(cudaMallocHost(&pinned, 1 << 16), cudaSuccess);
        heap_buf = std::malloc(1 << 16);
    }
    void TearDown() override {
        if (pinned) cudaFreeHost(pinned);
        std::free(heap_buf);
        agreement.reset();
        WorldStreamTest::TearDown();
    }
    // A symmetric pointer that was freed (collectively): in the heap, in no live allocation.
    void* freed_symmetric() {
        void* p = w->alloc_bytes(4096);
        w->free(p);
        return p;
    }
    std::optional<detail::ScopedSettings> agreement;
    void* pinned = nullptr;
    void* heap_buf = nullptr;
};

using CollFn = void (*)(World&, BufferView, BufferView, cudaStream_t, const CollOptions&);

// The cases every collective of the form op(world, in, out, stream, opts) shares; in_count / out_count are a good
// call's (f32), `in` and `out` good buffers of that size.
std::vector<Case> collective_cases(World& w, cudaStream_t s, CollFn fn, std::size_t in_count, std::size_t out_count,
                                   const Sym& in, const Sym& out, void* pinned, void* heap_buf, void* freed) {
    const DType f = DType::F32;
    const BufferView gi{in.p, f, in_count}, go{out.p, f, out_count};
    auto call = [&w, s, fn](BufferView i, BufferView o, CollOptions opt = {}) {
        return [&w, s, fn, i, o, opt] { fn(w, i, o, s, opt); };
    };
    std::vector<Case> c{
        {"null in", call({nullptr, f, in_count}, go), {"in", "nullptr"}},
        {"null out", call(gi, {nullptr, f, out_count}), {"out", "nullptr"}},
        {"static array in", call({host_array, f, in_count}, go), {"expected in to be device memory", "malloc"}},
        {"malloc'd out", call(gi, {heap_buf, f, out_count}), {"expected out to be device memory"}},
        {"pinned host in", call({pinned, f, in_count}, go), {"in", "page-locked host memory"}},
        {"misaligned in", call({in.as() + 2, f, in_count}, go), {"in", "aligned"}},
        {"dtype mismatch", call(gi, {out.p, DType::BF16, out_count}), {"same dtype"}},
        {"out-of-range dtype", call({in.p, static_cast<DType>(42), in_count}, go), {"in", "known dtype", "42"}},
        {"in.count overflow", call({in.p, f, kHuge}, go), {"in.count", "overflows"}},
        {"freed symmetric in", call({freed, f, in_count}, go), {"in", "no live allocation"}},
    };
    if (w.world_size() > 1) {
        const bool odd = w.rank() == 1;
        c.push_back({"a rank's host in", call({odd ? host_array : in.p, f, in_count}, go), {"in", "device memory"}});
        CollOptions other;
        other.num_sms = odd ? 3 : 0;
        c.push_back({"a rank's other option", call(gi, go, other), {"rank 1", "CollOptions::num_sms"}});
        c.push_back({"a rank's other count",
                     call({in.p, f, odd ? in_count / 2 : in_count}, {out.p, f, odd ? out_count / 2 : out_count}),
                     {"rank 1", "in.count"}});
    }
    return c;
}

// A short symmetric `which` buffer: the message names it, the bytes needed and the allocation's.
Case short_symmetric(const std::string& which, std::function<void()> call, std::size_t needed, std::size_t have) {
    return {"short symmetric " + which,
            std::move(call),
            {which, "one symmetric allocation", std::to_string(needed) + " bytes",
             "allocation of " + std::to_string(have) + " bytes"}};
}

void fill(const Sym& b, const std::vector<float>& v) {
    ASSERT_EQ(cudaMemcpy(b.p, v.data(), v.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
}

std::string check_equal(const std::vector<float>& got, const std::vector<double>& want, const char* op) {
    for (std::size_t i = 0; i < want.size(); ++i)
        if (got[i] != want[i])
            return std::string(op) + ": element " + std::to_string(i) + " is " + std::to_string(got[i]) +
                   ", expected " + std::to_string(want[i]);
    return "";
}

constexpr std::size_t kN = 1024;  // elements per rank of the good calls

TEST_F(BadInputs, AllGather) {
    const int W = w->world_size(), r = w->rank();
    Sym in(*w, kN * 4), out(*w, kN * W * 4), small(*w, kN * W * 2);
    auto cases = collective_cases(*w, stream, all_gather, kN, kN * W, in, out, pinned, heap_buf, freed_symmetric());
    cases.push_back(short_symmetric(
        "out",
        [&] {
            all_gather(*w, {in.p, DType::F32, kN}, {small.p, DType::F32, kN * W}, stream);
        },
        kN * W * 4, kN * W * 2));
    cases.push_back({"out.count overflow",
                     [&] {
                         all_gather(*w, {in.p, DType::F32, kN}, {out.p, DType::F32, kHuge}, stream);
                     },
                     {"out.count", "overflows"}});
    run_cases(*w, "all_gather", cases);
    fill(in, ints(kN, r, 1));
    all_gather(*w, {in.p, DType::F32, kN}, {out.p, DType::F32, kN * W}, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<double> want;
    for (int p = 0; p < W; ++p)
        for (float x : ints(kN, p, 1)) want.push_back(x);
    EXPECT_EQ(test::agree(*w, check_equal(download<float>(out.p, kN * W), want, "all_gather"), "ag-good"), "");
}

TEST_F(BadInputs, ReduceScatter) {
    const int W = w->world_size(), r = w->rank();
    Sym in(*w, kN * W * 4), out(*w, kN * 4), small(*w, kN * W * 2);
    auto cases = collective_cases(*w, stream, reduce_scatter, kN * W, kN, in, out, pinned, heap_buf, freed_symmetric());
    cases.push_back(short_symmetric(
        "in",
        [&] {
            reduce_scatter(*w, {small.p, DType::F32, kN * W}, {out.p, DType::F32, kN}, stream);
        },
        kN * W * 4, kN * W * 2));
    cases.push_back({"integer dtype",
                     [&] {
                         reduce_scatter(*w, {in.p, DType::I32, kN * W}, {out.p, DType::I32, kN}, stream);
                     },
                     {"f32, f16 or bf16"}});
    run_cases(*w, "reduce_scatter", cases);
    fill(in, ints(kN * W, r, 2));
    reduce_scatter(*w, {in.p, DType::F32, kN * W}, {out.p, DType::F32, kN}, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<double> want(kN, 0.0);
    for (int p = 0; p < W; ++p) {
        const auto v = ints(kN * W, p, 2);
        for (std::size_t i = 0; i < kN; ++i) want[i] += v[r * kN + i];
    }
    EXPECT_EQ(test::agree(*w, check_equal(download<float>(out.p, kN), want, "reduce_scatter"), "rs-good"), "");
}

TEST_F(BadInputs, AllReduce) {
    const int W = w->world_size(), r = w->rank();
    Sym in(*w, kN * 4), out(*w, kN * 4), small(*w, kN * 2);
    auto cases = collective_cases(*w, stream, all_reduce, kN, kN, in, out, pinned, heap_buf, freed_symmetric());
    cases.push_back(short_symmetric(
        "out",
        [&] {
            all_reduce(*w, {in.p, DType::F32, kN}, {small.p, DType::F32, kN}, stream);
        },
        kN * 4, kN * 2));
    cases.push_back({"integer dtype",
                     [&] {
                         all_reduce(*w, {in.p, DType::I32, kN}, {out.p, DType::I32, kN}, stream);
                     },
                     {"f32, f16 or bf16"}});
    run_cases(*w, "all_reduce", cases);
    fill(in, ints(kN, r, 3));
    all_reduce(*w, {in.p, DType::F32, kN}, {out.p, DType::F32, kN}, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<double> want(kN, 0.0);
    for (int p = 0; p < W; ++p) {
        const auto v = ints(kN, p, 3);
        for (std::size_t i = 0; i < kN; ++i) want[i] += v[i];
    }
    EXPECT_EQ(test::agree(*w, check_equal(download<float>(out.p, kN), want, "all_reduce"), "ar-good"), "");
}

TEST_F(BadInputs, AllToAll) {
    const int W = w->world_size(), r = w->rank();
    const std::size_t n = kN * W, b = kN;  // b elements per peer
    Sym in(*w, n * 4), out(*w, n * 4), small(*w, n * 2);
    auto cases = collective_cases(*w, stream, all_to_all, n, n, in, out, pinned, heap_buf, freed_symmetric());
    cases.push_back(short_symmetric(
        "out",
        [&] {
            all_to_all(*w, {in.p, DType::F32, n}, {small.p, DType::F32, n}, stream);
        },
        n * 4, n * 2));
    run_cases(*w, "all_to_all", cases);
    fill(in, ints(n, r, 4));
    all_to_all(*w, {in.p, DType::F32, n}, {out.p, DType::F32, n}, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<double> want(n);
    for (int p = 0; p < W; ++p) {
        const auto v = ints(n, p, 4);
        for (std::size_t i = 0; i < b; ++i) want[p * b + i] = v[r * b + i];
    }
    EXPECT_EQ(test::agree(*w, check_equal(download<float>(out.p, n), want, "all_to_all"), "a2a-good"), "");
}

TEST_F(BadInputs, AllToAllV) {
    const int W = w->world_size(), r = w->rank();
    // Rank s sends 1 + (s + j) % 3 elements to rank j, packed; out holds 3 x W.
    auto count = [](int s, int j) { return static_cast<std::int64_t>(1 + (s + j) % 3); };
    const std::size_t cap = 3 * static_cast<std::size_t>(W);
    Sym in(*w, cap * 4), out(*w, cap * 4), counts(*w, W * 8), offsets(*w, W * 8), small(*w, cap * 2);
    std::vector<std::int64_t> mine(W), offs(W);
    std::int64_t sent = 0;
    for (int j = 0; j < W; ++j) {
        mine[j] = count(r, j);
        offs[j] = sent;
        sent += mine[j];
    }
    ASSERT_EQ(cudaMemcpy(counts.p, mine.data(), W * 8, cudaMemcpyHostToDevice), cudaSuccess);
    const auto* sc = counts.as<const std::int64_t>();
    auto a2av = [&](BufferView i, BufferView o, const std::int64_t* cnt, const std::int64_t* off,
                    std::int64_t* recv = nullptr) {
        return [=, this] { all_to_all_v(*w, i, o, cnt, off, recv, stream); };
    };
    const BufferView gi{in.p, DType::F32, cap}, go{out.p, DType::F32, cap};
    std::vector<Case> cases{
        {"null in", a2av({nullptr, DType::F32, cap}, go, sc, nullptr), {"in", "nullptr"}},
        {"static array out",
         a2av(gi, {host_array, DType::F32, cap}, sc, nullptr),
         {"expected out to be device memory"}},
        {"null send_counts", a2av(gi, go, nullptr, nullptr), {"send_counts", "nullptr"}},
        {"host send_offsets",
         a2av(gi, go, sc, reinterpret_cast<const std::int64_t*>(host_array)),
         {"expected send_offsets to be device memory"}},
        {"pinned recv_counts",
         a2av(gi, go, sc, nullptr, static_cast<std::int64_t*>(pinned)),
         {"recv_counts", "page-locked"}},
        {"misaligned send_offsets",
         a2av(gi, go, sc, reinterpret_cast<const std::int64_t*>(offsets.as() + 4)),
         {"send_offsets", "aligned"}},
        {"dtype mismatch", a2av(gi, {out.p, DType::I32, cap}, sc, nullptr), {"same dtype"}},
        {"out-of-range dtype", a2av({in.p, static_cast<DType>(-3), cap}, go, sc, nullptr), {"in", "known dtype"}},
        {"in.count overflow", a2av({in.p, DType::F32, kHuge}, go, sc, nullptr), {"in.count", "overflows"}},
        short_symmetric("out", a2av(gi, {small.p, DType::F32, cap}, sc, nullptr), cap * 4, cap * 2),
        {"freed symmetric send_counts",
         a2av(gi, go, static_cast<const std::int64_t*>(freed_symmetric()), nullptr),
         {"send_counts", "no live allocation"}},
    };
    // The counts, read back on the host in checking mode: a block past the sender's in, an out too small.
    std::vector<std::int64_t> past = offs;
    past[W - 1] = static_cast<std::int64_t>(cap);  // rank r's last block starts at in's end
    ASSERT_EQ(cudaMemcpy(offsets.p, past.data(), W * 8, cudaMemcpyHostToDevice), cudaSuccess);
    cases.push_back({"block past in",
                     a2av(gi, go, sc, offsets.as<const std::int64_t>()),
                     {"block for rank", "lies outside its in", "send_offsets["}});
    if (W > 1) {  // every rank receives more than W elements (counts of 1 to 3, not all 1)
        cases.push_back({"out too small",
                         a2av(gi, {out.p, DType::F32, static_cast<std::size_t>(W)}, sc, nullptr),
                         {"receives more than out.count"}});
        cases.push_back({"a rank's other capacity",
                         a2av(gi, {out.p, DType::F32, r == 1 ? cap - 1 : cap}, sc, nullptr),
                         {"rank 1", "out.count"}});
    }
    run_cases(*w, "all_to_all_v", cases);
    // A good call: packed blocks, every element and the received counts checked.
    fill(in, ints(cap, r, 5));
    Sym recv(*w, W * 8);
    all_to_all_v(*w, gi, go, sc, nullptr, recv.as<std::int64_t>(), stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<double> want;
    std::vector<std::int64_t> want_recv(W);
    for (int s = 0; s < W; ++s) {
        const auto v = ints(cap, s, 5);
        std::int64_t at = 0;
        for (int j = 0; j < r; ++j) at += count(s, j);
        for (std::int64_t i = 0; i < count(s, r); ++i) want.push_back(v[at + i]);
        want_recv[s] = count(s, r);
    }
    std::string verdict = check_equal(download<float>(out.p, want.size()), want, "all_to_all_v");
    if (download<std::int64_t>(recv.p, W) != want_recv) verdict += " recv_counts differ";
    EXPECT_EQ(test::agree(*w, verdict, "a2av-good"), "");
}

// ---- loom::gemm and the overlapped GEMMs: bf16 A, B of small integers, f32 C (exact) ------------------------------

std::vector<std::uint16_t> bf16_ints(std::size_t n, int rank, int salt, std::vector<double>& vals) {
    std::mt19937 g(static_cast<unsigned>(test::run_seed(rank * 104729 + salt)));
    std::uniform_int_distribution<int> d(-2, 2);
    std::vector<std::uint16_t> h(n);
    vals.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        vals[i] = d(g);
        h[i] = test::float_to_bf16(static_cast<float>(vals[i]));
    }
    return h;
}

// Device buffer of bf16 integers seeded by (rank, salt); `vals` their values.
void upload_bf16(void* dst, std::size_t n, int rank, int salt, std::vector<double>& vals) {
    const auto h = bf16_ints(n, rank, salt, vals);
    test::upload(dst, h);
}

// C[m, n] += A[m, k] B[n, k]^T in double.
void add_gemm(std::vector<double>& c, const std::vector<double>& a, const std::vector<double>& b, std::size_t m,
              std::size_t n, std::size_t k, std::size_t a_row0 = 0) {
    for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < n; ++j) {
            double s = 0;
            for (std::size_t t = 0; t < k; ++t) s += a[(a_row0 + i) * k + t] * b[j * k + t];
            c[i * n + j] += s;
        }
}

using MatFn = std::function<void(const MatrixView&, const MatrixView&, const MatrixView&, const float* scale_a)>;

// The cases every GEMM-shaped op shares: a [m, k], b [n, k], c [cm, n] good bf16 / f32 buffers.
std::vector<Case> matrix_cases(const MatFn& fn, void* a, void* b, void* c, int64_t m, int64_t n, int64_t k, int64_t cm,
                               void* pinned, void* heap_buf) {
    const DType h = DType::BF16, f = DType::F32;
    const MatrixView ga{a, h, m, k, 0}, gb{b, h, n, k, 0}, gc{c, f, cm, n, 0};
    auto call = [&fn](MatrixView x, MatrixView y, MatrixView z, const float* s = nullptr) {
        return [fn, x, y, z, s] { fn(x, y, z, s); };
    };
    const int64_t huge_ld = (std::numeric_limits<int64_t>::max() / 4) & ~int64_t{7};
    return {
        {"null A", call({nullptr, h, m, k, 0}, gb, gc), {"A", "nullptr"}},
        {"static array A", call({host_array, h, m, k, 0}, gb, gc), {"expected A to be device memory", "malloc"}},
        {"malloc'd C", call(ga, gb, {heap_buf, f, cm, n, 0}), {"expected C to be device memory"}},
        {"pinned B", call(ga, {pinned, h, n, k, 0}, gc), {"B", "page-locked"}},
        {"misaligned B", call(ga, {static_cast<char*>(b) + 2, h, n, k, 0}, gc), {"B", "16-byte aligned"}},
        {"B of another dtype", call(ga, {b, DType::F16, n, k, 0}, gc), {"B of A's dtype"}},
        {"out-of-range dtype", call({a, static_cast<DType>(42), m, k, 0}, gb, gc), {"expected A"}},
        {"A's extent overflows", call({a, h, m, k, huge_ld}, gb, gc), {"A's extent", "overflows"}},
        {"host scale_a", call(ga, gb, gc, reinterpret_cast<const float*>(host_array)), {"scale_a"}},
    };
}

TEST_F(BadInputs, Gemm) {
    const int64_t m = 128, n = 128, k = 128;
    Sym a(*w, m * k * 2), b(*w, n * k * 2), c(*w, m * n * 4);
    const MatFn fn = [this](const MatrixView& x, const MatrixView& y, const MatrixView& z, const float* s) {
        GemmOptions o;
        o.scale_a = s;
        gemm(x, y, z, o, stream);
    };
    auto cases = matrix_cases(fn, a.p, b.p, c.p, m, n, k, m, pinned, heap_buf);
    GemmOptions host_bias;
    host_bias.bias = BufferView{host_array, DType::F32, static_cast<std::size_t>(n)};
    cases.push_back({"host bias",
                     [&] {
                         gemm({a.p, DType::BF16, m, k, 0}, {b.p, DType::BF16, n, k, 0}, {c.p, DType::F32, m, n, 0},
                              host_bias, stream);
                     },
                     {"expected bias to be device memory"}});
    // C over A's memory (bf16 C of A's size: the memory checks pass, the kernel would read A where it stores C).
    cases.push_back(
        {"C over A",
         [&] {
             gemm({a.p, DType::BF16, m, k, 0}, {b.p, DType::BF16, n, k, 0}, {a.p, DType::BF16, m, n, 0}, {}, stream);
         },
         {"expected C not to overlap A"}});
    run_cases(*w, "gemm", cases);
    std::vector<double> va, vb;
    upload_bf16(a.p, m * k, w->rank(), 6, va);
    upload_bf16(b.p, n * k, w->rank(), 7, vb);
    gemm({a.p, DType::BF16, m, k, 0}, {b.p, DType::BF16, n, k, 0}, {c.p, DType::F32, m, n, 0}, {}, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<double> want(m * n, 0.0);
    add_gemm(want, va, vb, m, n, k);
    EXPECT_EQ(test::agree(*w, check_equal(download<float>(c.p, m * n), want, "gemm"), "gemm-good"), "");
}

// The disagreement cases of an overlapped op (W > 1): rank 1 with another N, or another option.
template <class Opts>
void add_overlap_disagreements(std::vector<Case>& cases, World& w,
                               const std::function<void(const Opts&, int64_t)>& call, const char* option_field,
                               Opts other) {
    if (w.world_size() < 2) return;
    const bool odd = w.rank() == 1;
    cases.push_back({"a rank's other N", [=] { call(Opts{}, odd ? 64 : 128); }, {"rank 1", "B.rows"}});
    cases.push_back({"a rank's other option", [=] { call(odd ? other : Opts{}, 128); }, {"rank 1", option_field}});
}

TEST_F(BadInputs, AgGemm) {
    const int W = w->world_size(), r = w->rank();
    const int64_t rows = 128, n = 128, k = 128, m = rows * W;
    Sym a(*w, rows * k * 2), b(*w, n * k * 2), c(*w, m * n * 4), short_c(*w, m * n * 2), gathered(*w, m * k);
    const MatFn fn = [this](const MatrixView& x, const MatrixView& y, const MatrixView& z, const float* s) {
        AgGemmOptions o;
        o.scale_a = s;
        ag_gemm(*w, x, y, z, stream, o);
    };
    auto cases = matrix_cases(fn, a.p, b.p, c.p, rows, n, k, m, pinned, heap_buf);
    cases.push_back(short_symmetric(
        "C",
        [&] {
            ag_gemm(*w, {a.p, DType::BF16, rows, k, 0}, {b.p, DType::BF16, n, k, 0}, {short_c.p, DType::F32, m, n, 0},
                    stream);
        },
        m * n * 4, m * n * 2));
    AgGemmOptions g;
    g.gathered = MatrixView{gathered.p, DType::BF16, m, k, 0};
    cases.push_back(short_symmetric(
        "AgGemmOptions::gathered",
        [&] {
            ag_gemm(*w, {a.p, DType::BF16, rows, k, 0}, {b.p, DType::BF16, n, k, 0}, {c.p, DType::F32, m, n, 0}, stream,
                    g);
        },
        m * k * 2, m * k));
    AgGemmOptions seq;
    seq.producer = AgProducer::Sequential;
    add_overlap_disagreements<AgGemmOptions>(
        cases, *w,
        [&](const AgGemmOptions& o, int64_t nn) {
            ag_gemm(*w, {a.p, DType::BF16, rows, k, 0}, {b.p, DType::BF16, nn, k, 0}, {c.p, DType::F32, m, nn, 0},
                    stream, o);
        },
        "AgGemmOptions::producer", seq);
    run_cases(*w, "ag_gemm", cases);
    std::vector<double> va, vb, all_a;
    for (int p = 0; p < W; ++p) {
        std::vector<double> v;
        bf16_ints(rows * k, p, 8, v);
        all_a.insert(all_a.end(), v.begin(), v.end());
    }
    upload_bf16(a.p, rows * k, r, 8, va);
    upload_bf16(b.p, n * k, r, 9, vb);
    ag_gemm(*w, {a.p, DType::BF16, rows, k, 0}, {b.p, DType::BF16, n, k, 0}, {c.p, DType::F32, m, n, 0}, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<double> want(m * n, 0.0);
    add_gemm(want, all_a, vb, m, n, k);
    EXPECT_EQ(test::agree(*w, check_equal(download<float>(c.p, m * n), want, "ag_gemm"), "ag-gemm-good"), "");
}

TEST_F(BadInputs, GemmRs) {
    const int W = w->world_size(), r = w->rank();
    const int64_t m = 128 * W, n = 128, k = 128, seg = m / W;
    Sym a(*w, m * k * 2), b(*w, n * k * 2), c(*w, seg * n * 4), short_c(*w, seg * n * 2);
    const MatFn fn = [this](const MatrixView& x, const MatrixView& y, const MatrixView& z, const float* s) {
        GemmRsOptions o;
        o.scale_a = s;
        gemm_rs(*w, x, y, z, stream, o);
    };
    auto cases = matrix_cases(fn, a.p, b.p, c.p, m, n, k, seg, pinned, heap_buf);
    cases.push_back(short_symmetric(
        "C",
        [&] {
            gemm_rs(*w, {a.p, DType::BF16, m, k, 0}, {b.p, DType::BF16, n, k, 0}, {short_c.p, DType::F32, seg, n, 0},
                    stream);
        },
        seg * n * 4, seg * n * 2));
    GemmRsOptions seq;
    seq.algo = RsAlgo::Sequential;
    add_overlap_disagreements<GemmRsOptions>(
        cases, *w,
        [&](const GemmRsOptions& o, int64_t nn) {
            gemm_rs(*w, {a.p, DType::BF16, m, k, 0}, {b.p, DType::BF16, nn, k, 0}, {c.p, DType::F32, seg, nn, 0},
                    stream, o);
        },
        "GemmRsOptions::algo", seq);
    run_cases(*w, "gemm_rs", cases);
    std::vector<double> va, vb;
    upload_bf16(a.p, m * k, r, 10, va);
    upload_bf16(b.p, n * k, r, 11, vb);
    gemm_rs(*w, {a.p, DType::BF16, m, k, 0}, {b.p, DType::BF16, n, k, 0}, {c.p, DType::F32, seg, n, 0}, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<double> want(seg * n, 0.0);
    for (int p = 0; p < W; ++p) {
        std::vector<double> pa, pb;
        bf16_ints(m * k, p, 10, pa);
        bf16_ints(n * k, p, 11, pb);
        add_gemm(want, pa, pb, seg, n, k, r * seg);
    }
    EXPECT_EQ(test::agree(*w, check_equal(download<float>(c.p, seg * n), want, "gemm_rs"), "gemm-rs-good"), "");
}

TEST_F(BadInputs, GemmAr) {
    const int W = w->world_size(), r = w->rank();
    const int64_t m = 16, n = 128, k = 128;
    Sym a(*w, m * k * 2), b(*w, n * k * 2), c(*w, m * n * 4), short_c(*w, m * n * 2);
    const MatFn fn = [this](const MatrixView& x, const MatrixView& y, const MatrixView& z, const float* s) {
        GemmArOptions o;
        o.scale_a = s;
        gemm_ar(*w, x, y, z, stream, o);
    };
    auto cases = matrix_cases(fn, a.p, b.p, c.p, m, n, k, m, pinned, heap_buf);
    cases.push_back(short_symmetric(
        "C",
        [&] {
            gemm_ar(*w, {a.p, DType::BF16, m, k, 0}, {b.p, DType::BF16, n, k, 0}, {short_c.p, DType::F32, m, n, 0},
                    stream);
        },
        m * n * 4, m * n * 2));
    GemmArOptions seq;
    seq.algo = ArAlgo::Sequential;
    add_overlap_disagreements<GemmArOptions>(
        cases, *w,
        [&](const GemmArOptions& o, int64_t nn) {
            gemm_ar(*w, {a.p, DType::BF16, m, k, 0}, {b.p, DType::BF16, nn, k, 0}, {c.p, DType::F32, m, nn, 0}, stream,
                    o);
        },
        "GemmArOptions::algo", seq);
    run_cases(*w, "gemm_ar", cases);
    std::vector<double> va, vb;
    upload_bf16(a.p, m * k, r, 12, va);
    upload_bf16(b.p, n * k, r, 13, vb);
    gemm_ar(*w, {a.p, DType::BF16, m, k, 0}, {b.p, DType::BF16, n, k, 0}, {c.p, DType::F32, m, n, 0}, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<double> want(m * n, 0.0);
    for (int p = 0; p < W; ++p) {
        std::vector<double> pa, pb;
        bf16_ints(m * k, p, 12, pa);
        bf16_ints(n * k, p, 13, pb);
        add_gemm(want, pa, pb, m, n, k);
    }
    EXPECT_EQ(test::agree(*w, check_equal(download<float>(c.p, m * n), want, "gemm_ar"), "gemm-ar-good"), "");
}

// With more than one rank, a rank calling another op than its peers: every rank raises naming the ops.
TEST_F(BadInputs, RanksCallingDifferentOps) {
    const int W = w->world_size();
    if (W < 2) GTEST_SKIP() << "needs two ranks";
    Sym in(*w, kN * W * 4), out(*w, kN * W * 4);
    const std::string e = error_of([&] {
        if (w->rank() == 1)
            all_reduce(*w, {in.p, DType::F32, kN}, {out.p, DType::F32, kN}, stream);
        else
            all_gather(*w, {in.p, DType::F32, kN}, {out.p, DType::F32, kN * W}, stream);
    });
    std::string bad;
    for (const char* part : {"the ranks disagree on the op", "rank 1 calls all_reduce", "all_gather"})
        if (e.find(part) == std::string::npos) bad = std::string("\"") + part + "\" not in: " + e;
    EXPECT_EQ(test::agree(*w, bad, "bad-inputs/different-ops"), "");
    all_reduce(*w, {in.p, DType::F32, kN}, {out.p, DType::F32, kN}, stream);  // still usable
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
}

}  // namespace
}  // namespace loom
