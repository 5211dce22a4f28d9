// The checks every op makes of its arguments before launching, on the host and without a GPU: sizes that overflow,
// the memory answers (host, another GPU's, a short buffer, a short symmetric allocation) and their cache, the
// cross-rank agreement of a call's signature, and all_to_all_v's counts. Each raises loom::Error naming the argument.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "loom/runtime/error.hpp"
#include "ops/collectives/coll_check.hpp"
#include "runtime/call_agreement.hpp"
#include "runtime/pointer_check.hpp"

namespace {

using loom::BufferView;
using loom::DType;
using loom::MatrixView;
using loom::detail::CallSignature;
using loom::detail::CallVerdict;
using loom::detail::MemoryKind;
using loom::detail::MemoryRange;

template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const loom::Error& e) {
        return e.what();
    }
    return "";
}

bool has(const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; }

constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();

TEST(OpChecks, SizesThatOverflowNameTheArgument) {
    EXPECT_EQ(loom::detail::buffer_bytes("all_reduce", "in", 1000, DType::F32), 4000u);
    std::string m = error_of([] { loom::detail::buffer_bytes("all_reduce", "in", kMax / 2, DType::F32); });
    EXPECT_TRUE(has(m, "all_reduce") && has(m, "in.count") && has(m, "overflows")) << m;
    alignas(16) static char buf[64];
    m = error_of([] { loom::coll::check_view("all_gather", "out", BufferView{buf, DType::I64, kMax / 4}); });
    EXPECT_TRUE(has(m, "out.count") && has(m, "overflows")) << m;
    m = error_of([] { loom::coll::times_world("all_gather", "world size x in.count", kMax / 3, 4); });
    EXPECT_TRUE(has(m, "world size x in.count") && has(m, "overflows")) << m;
    EXPECT_EQ(loom::coll::times_world("all_gather", "x", 10, 8), 80u);
}

TEST(OpChecks, MatrixExtent) {
    alignas(16) static char buf[64];
    // ((rows - 1) x ld + cols) x element size: 3 rows of 8 in rows of 16 bf16.
    EXPECT_EQ(loom::detail::matrix_bytes("gemm", "A", MatrixView{buf, DType::BF16, 3, 8, 16}), (2 * 16 + 8) * 2u);
    const int64_t big = std::numeric_limits<int64_t>::max() / 2;
    std::string m = error_of([&] { loom::detail::matrix_bytes("gemm", "C", MatrixView{buf, DType::F32, 4, 8, big}); });
    EXPECT_TRUE(has(m, "C's extent") && has(m, "overflows")) << m;
    m = error_of([] { loom::detail::matrix_bytes("ag_gemm", "B", MatrixView{buf, DType::F32, 0, 8, 0}); });
    EXPECT_TRUE(has(m, "ag_gemm") && has(m, "B")) << m;
    m = error_of([] { loom::detail::matrix_bytes("gemm_rs", "A", MatrixView{buf, DType::F32, 2, 8, 4}); });
    EXPECT_TRUE(has(m, "ld >= cols")) << m;
}

TEST(OpChecks, OverlappingMatricesAreRefused) {
    alignas(16) static char buf[1 << 16];
    using loom::detail::check_disjoint;
    const MatrixView a{buf, DType::BF16, 64, 64};
    // The same memory, a row inside, the next rows, the element after the last.
    EXPECT_TRUE(has(error_of([&] { check_disjoint("gemm", "C", a, "A", a); }), "gemm: expected C not to overlap A"));
    EXPECT_FALSE(error_of([&] {
                     check_disjoint("gemm", "C", MatrixView{buf + 64 * 64 * 2 - 2, DType::BF16, 1, 8}, "A", a);
                 }).empty());
    EXPECT_TRUE(error_of([&] {
                    check_disjoint("gemm", "C", MatrixView{buf + 64 * 64 * 2, DType::BF16, 1, 8}, "A", a);
                }).empty());
    // Column slices of one [64, 192] buffer (q, k, v of a fused projection) do not overlap; a slice that reaches into
    // the next one does.
    const MatrixView q{buf, DType::BF16, 64, 64, 192}, k{buf + 128, DType::BF16, 64, 64, 192};
    EXPECT_TRUE(error_of([&] { check_disjoint("op", "q", q, "k", k); }).empty());
    EXPECT_TRUE(error_of([&] { check_disjoint("op", "k", k, "q", q); }).empty());
    const MatrixView wide{buf + 120, DType::BF16, 64, 64, 192};
    EXPECT_FALSE(error_of([&] { check_disjoint("op", "q", q, "wide", wide); }).empty());
    EXPECT_FALSE(error_of([&] { check_disjoint("op", "wide", wide, "k", k); }).empty());
    // The last column slice against the first one of the next rows: disjoint.
    const MatrixView v{buf + 256, DType::BF16, 63, 64, 192}, q1{buf + 384, DType::BF16, 63, 64, 192};
    EXPECT_TRUE(error_of([&] { check_disjoint("op", "v", v, "q1", q1); }).empty());
    // Other pitches: x's rows (200 B apart) miss q's (384 B apart) until x's row 5 [1128, 1160) meets q's row 3.
    EXPECT_TRUE(error_of([&] {
                    check_disjoint("op", "q", q, "x", MatrixView{buf + 128, DType::BF16, 5, 16, 100});
                }).empty());
    EXPECT_FALSE(error_of([&] {
                     check_disjoint("op", "q", q, "x", MatrixView{buf + 128, DType::BF16, 6, 16, 100});
                 }).empty());
    // A dense C over a padded A, and a one-row view over a dense matrix.
    EXPECT_FALSE(error_of([&] {
                     check_disjoint("gemm", "C", MatrixView{buf, DType::BF16, 64, 64}, "A",
                                    MatrixView{buf, DType::BF16, 64, 64, 128});
                 }).empty());
    EXPECT_FALSE(error_of([&] {
                     check_disjoint("gemm", "C", MatrixView{buf + 4000, DType::BF16, 1, 8, 64}, "A", a);
                 }).empty());
}

// check_disjoint against element-by-element overlap over random small views: dense and padded, one and two-byte
// elements, every offset (fresh each run).
TEST(OpChecks, DisjointMatchesElementOverlap) {
    alignas(16) static char buf[1 << 12];
    std::mt19937 rng(std::random_device{}());
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    auto view = [&] {
        const DType t = pick(0, 1) ? DType::BF16 : DType::F32;
        const int rows = pick(1, 5), cols = pick(1, 6), ld = pick(0, 2) ? cols + pick(0, 7) : 0;
        const int es = static_cast<int>(loom::dtype_size(t));
        return MatrixView{buf + es * pick(0, 64), t, rows, cols, ld};
    };
    auto bytes = [](const MatrixView& m) {
        std::set<const char*> s;
        const auto es = static_cast<int64_t>(loom::dtype_size(m.dtype));
        for (int64_t r = 0; r < m.rows; ++r)
            for (int64_t c = 0; c < m.cols * es; ++c)
                s.insert(static_cast<const char*>(m.data) + r * m.stride() * es + c);
        return s;
    };
    for (int i = 0; i < 20000; ++i) {
        const MatrixView x = view(), y = view();
        const auto bx = bytes(x), by = bytes(y);
        bool meet = false;
        for (const char* p : bx) meet = meet || by.count(p) > 0;
        const bool refused = !error_of([&] { loom::detail::check_disjoint("op", "x", x, "y", y); }).empty();
        ASSERT_EQ(refused, meet) << "x at +" << static_cast<const char*>(x.data) - buf << " " << x.rows << " x "
                                 << x.cols << " ld " << x.stride() << " (" << loom::dtype_name(x.dtype) << "), y at +"
                                 << static_cast<const char*>(y.data) - buf << " " << y.rows << " x " << y.cols << " ld "
                                 << y.stride() << " (" << loom::dtype_name(y.dtype) << ")";
    }
}

MemoryRange device_range(std::uintptr_t start, std::size_t size, int device) {
    return MemoryRange{MemoryKind::Device, device, start, size};
}

TEST(OpChecks, HostAndForeignMemoryAreRefusedByName) {
    const void* p = reinterpret_cast<const void*>(0x10000);
    const MemoryRange host{}, pinned{MemoryKind::Host, 0, 0, 0}, other = device_range(0x10000, 4096, 1);
    const MemoryRange mine = device_range(0x10000, 4096, 0), managed{MemoryKind::Managed, 0, 0x10000, 4096};
    std::string m = error_of([&] { loom::detail::check_usable("all_reduce", "in", p, 64, 0, host, host); });
    EXPECT_TRUE(has(m, "all_reduce") && has(m, "expected in ") && has(m, "malloc")) << m;
    m = error_of([&] { loom::detail::check_usable("gemm", "C", p, 64, 0, pinned, pinned); });
    EXPECT_TRUE(has(m, "C") && has(m, "page-locked host memory")) << m;
    m = error_of([&] { loom::detail::check_usable("all_gather", "out", p, 64, 0, other, other); });
    EXPECT_TRUE(has(m, "out") && has(m, "device memory of GPU 1")) << m;
    // Past the end of a cudaMalloc: the last byte is not device memory.
    m = error_of([&] { loom::detail::check_usable("all_to_all", "out", p, 8192, 0, mine, host); });
    EXPECT_TRUE(has(m, "all 8192 bytes of out") && has(m, "shorter")) << m;
    EXPECT_EQ(error_of([&] { loom::detail::check_usable("all_reduce", "in", p, 4096, 0, mine, mine); }), "");
    EXPECT_EQ(error_of([&] { loom::detail::check_usable("all_reduce", "in", p, 4096, 3, managed, managed); }), "");
}

TEST(OpChecks, ShortSymmetricBufferNamesNeededAndAllocatedBytes) {
    alignas(256) static char heap[4096];
    const loom::World::Allocation a{heap + 1024, 1024};
    std::string m = error_of([&] { loom::detail::check_in_allocation("all_gather", "out", heap + 1024, 2048, a); });
    EXPECT_TRUE(has(m, "all_gather") && has(m, "out") && has(m, "2048 bytes") && has(m, "allocation of 1024 bytes"))
        << m;
    m = error_of([&] { loom::detail::check_in_allocation("all_gather", "in", heap + 1536, 1024, a); });
    EXPECT_TRUE(has(m, "at offset 512") && has(m, "at least 1536 bytes")) << m;
    m = error_of([&] { loom::detail::check_in_allocation("reduce_scatter", "in", heap, 8, std::nullopt); });
    EXPECT_TRUE(has(m, "reduce_scatter") && has(m, "no live allocation")) << m;
    EXPECT_EQ(error_of([&] { loom::detail::check_in_allocation("x", "in", heap + 1024, 1024, a); }), "");
}

TEST(OpChecks, MemoryRangesAreAskedOncePerAllocation) {
    int asked = 0;
    loom::detail::MemoryRangeCache cache([&](std::uintptr_t a) {
        ++asked;
        if (a >= 0x100000 && a < 0x200000) return device_range(0x100000, 0x100000, 0);
        return MemoryRange{};  // host
    });
    EXPECT_EQ(cache.find(0x100000).kind, MemoryKind::Device);
    EXPECT_EQ(cache.find(0x1fffff).start, 0x100000u);
    EXPECT_EQ(cache.find(0x180000).size, 0x100000u);
    EXPECT_EQ(asked, 1);  // one allocation, one question
    EXPECT_EQ(cache.find(0x300000).kind, MemoryKind::Unregistered);
    EXPECT_EQ(cache.find(0x300000).kind, MemoryKind::Unregistered);
    EXPECT_EQ(asked, 3);  // host answers are not kept
    EXPECT_EQ(cache.size(), 1u);
    cache.forget(0x150000);  // freed: the next question goes to the driver again
    EXPECT_EQ(cache.size(), 0u);
    cache.find(0x100000);
    EXPECT_EQ(asked, 4);
    cache.clear();
    EXPECT_EQ(cache.size(), 0u);
}

TEST(OpChecks, MemoryRangeCacheIsBounded) {
    loom::detail::MemoryRangeCache cache([](std::uintptr_t a) { return device_range(a & ~0xfffULL, 0x1000, 0); }, 8);
    for (std::uintptr_t i = 1; i <= 20; ++i) cache.find(i << 12);
    EXPECT_LE(cache.size(), 8u);
}

CallVerdict verdict(const std::string& op, std::size_t count, const std::string& dtype = "f32") {
    CallVerdict v;
    v.sig = CallSignature(op);
    v.sig.add("in.count", count).add("in.dtype", dtype).add("CollOptions::algo", "auto");
    return v;
}

TEST(CallAgreement, SameCallsAgree) {
    EXPECT_EQ(loom::detail::disagreement({verdict("all_reduce", 64), verdict("all_reduce", 64)}), "");
}

TEST(CallAgreement, NamesTheRankAndTheField) {
    std::string m = loom::detail::disagreement(
        {verdict("all_reduce", 64), verdict("all_reduce", 64), verdict("all_reduce", 128), verdict("all_reduce", 64)});
    EXPECT_TRUE(has(m, "all_reduce") && has(m, "in.count") && has(m, "rank 2 gives 128") &&
                has(m, "ranks 0, 1, 3 give 64"))
        << m;
    m = loom::detail::disagreement({verdict("all_gather", 64), verdict("all_gather", 64, "bf16")});
    EXPECT_TRUE(has(m, "in.dtype") && has(m, "rank 1 gives bf16") && has(m, "rank 0 gives f32")) << m;
    m = loom::detail::disagreement({verdict("all_gather", 64), verdict("all_reduce", 64)});
    EXPECT_TRUE(has(m, "the op") && has(m, "rank 1 calls all_reduce") && has(m, "rank 0 calls all_gather")) << m;
    CallVerdict fewer = verdict("all_gather", 64);
    fewer.sig = CallSignature("all_gather");
    m = loom::detail::disagreement({verdict("all_gather", 64), fewer});
    EXPECT_TRUE(has(m, "rank 1 gives (absent)")) << m;
}

TEST(CallAgreement, ARankWhoseChecksFailedIsNamedOnEveryRank) {
    CallVerdict bad = verdict("all_reduce", 64);
    bad.error = "all_reduce: expected a device pointer for in, given nullptr";
    const std::string m = loom::detail::disagreement({verdict("all_reduce", 64), bad});
    EXPECT_TRUE(has(m, "rank 1's arguments were refused") && has(m, "for in, given nullptr")) << m;
}

TEST(CallAgreement, VerdictsRoundTrip) {
    CallVerdict v = verdict("all_to_all_v", 7, "u8");
    v.error = std::string("two\nlines and a \0 byte", 22);
    const CallVerdict w = loom::detail::decode(loom::detail::encode(v));
    EXPECT_EQ(w.sig.op(), "all_to_all_v");
    EXPECT_EQ(w.error, v.error);
    EXPECT_EQ(w.sig.fields(), v.sig.fields());
    loom::Bytes cut = loom::detail::encode(v);
    cut.resize(cut.size() - 3);
    EXPECT_THROW(loom::detail::decode(cut), loom::Error);
    EXPECT_EQ(loom::detail::dtype_field(static_cast<DType>(42)), "DType value 42");
}

TEST(A2avCounts, SendAndReceiveSidesAreChecked) {
    using loom::coll::A2avSends;
    // Two ranks, packed sends of 3 + 2 and 1 + 4 from ins of 5 elements; out capacity 5.
    std::vector<A2avSends> ok{{5, {3, 2}, {}}, {5, {1, 4}, {}}};
    EXPECT_EQ(loom::coll::a2av_counts_error(ok, 6), "");
    // Receive side: rank 1 gets 2 + 4 = 6 > 5.
    std::string m = loom::coll::a2av_counts_error(ok, 5);
    EXPECT_TRUE(has(m, "rank 1 receives more than out.count = 5")) << m;
    // Send side, explicit offsets: rank 0's block for rank 1 at 4 + 2 > 5.
    std::vector<A2avSends> past{{5, {3, 2}, {0, 4}}, {5, {1, 4}, {}}};
    m = loom::coll::a2av_counts_error(past, 16);
    EXPECT_TRUE(has(m, "rank 0's block for rank 1") &&
                has(m, "send_offsets[1] + send_counts[1] = 4 + 2 > in.count = 5"))
        << m;
    // Packed: the prefix sums run past in.
    std::vector<A2avSends> packed{{4, {3, 2}, {}}, {5, {1, 4}, {}}};
    m = loom::coll::a2av_counts_error(packed, 16);
    EXPECT_TRUE(has(m, "rank 0's block for rank 1") && has(m, "packed")) << m;
    // Negative counts and offsets; sums that would overflow int64.
    m = loom::coll::a2av_counts_error({{5, {-1, 2}, {}}, {5, {1, 4}, {}}}, 16);
    EXPECT_TRUE(has(m, "send_counts[0] = -1 is negative")) << m;
    m = loom::coll::a2av_counts_error({{5, {1, 2}, {-2, 0}}, {5, {1, 4}, {}}}, 16);
    EXPECT_TRUE(has(m, "rank 0's block for rank 0")) << m;
    const int64_t huge = std::numeric_limits<int64_t>::max();
    m = loom::coll::a2av_counts_error({{5, {1, huge}, {0, 2}}, {5, {1, 4}, {}}}, 16);
    EXPECT_TRUE(has(m, "rank 0's block for rank 1")) << m;
    m = loom::coll::a2av_counts_error({{kMax, {huge, huge}, {0, 0}}, {kMax, {huge, huge}, {0, 0}}}, kMax);
    EXPECT_EQ(m, "");  // 2 x (2^63 - 1) fits a 64-bit capacity
    m = loom::coll::a2av_counts_error(
        {{kMax, {huge, huge}, {0, 0}}, {kMax, {huge, huge}, {0, 0}}, {kMax, {huge, huge}, {0, 0}}}, kMax);
    EXPECT_TRUE(has(m, "receives more than out.count")) << m;
}

}  // namespace
