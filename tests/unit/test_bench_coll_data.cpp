// bench-collectives' host reference (bench/coll_data.hpp): every rank's inputs, and the #wrong count of a result.
// Each collective is run on the host from its definition (reductions summed in double from the decoded inputs, data
// movement copied byte for byte), independently of coll_data's own formulas; that result must count 0 wrong, and
// every poisoned element must count. CPU only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "coll_data.hpp"
#include "common/reference.hpp"
#include "loom/runtime/error.hpp"

namespace {

using loom::CollKind;
using loom::DType;
using loom::ReduceOp;
using loom::bench::CollCase;
using loom::bench::count_wrong;
using loom::bench::fill_input;
using loom::bench::Mismatch;

using Buf = std::vector<unsigned char>;

std::size_t es(DType t) { return static_cast<std::size_t>(loom::dtype_size(t)); }

double decode(DType t, const Buf& b, std::size_t i) {
    std::uint16_t h;
    float f;
    switch (t) {
        case DType::BF16:
            std::memcpy(&h, b.data() + 2 * i, 2);
            return loom::test::bf16_to_float(h);
        case DType::F16:
            std::memcpy(&h, b.data() + 2 * i, 2);
            return loom::test::half_to_float(h);
        default:
            std::memcpy(&f, b.data() + 4 * i, 4);
            return f;
    }
}

void encode(DType t, Buf& b, std::size_t i, double v) {
    std::uint16_t h;
    const float f = static_cast<float>(v);
    switch (t) {
        case DType::BF16:
            h = loom::test::float_to_bf16(f);
            std::memcpy(b.data() + 2 * i, &h, 2);
            return;
        case DType::F16:
            h = loom::test::float_to_half(f);
            std::memcpy(b.data() + 2 * i, &h, 2);
            return;
        default:
            std::memcpy(b.data() + 4 * i, &f, 4);
    }
}

std::uint64_t bits_at(const Buf& b, std::size_t i, std::size_t e) {
    std::uint64_t v = 0;
    std::memcpy(&v, b.data() + i * e, e);
    return v;
}

// Every rank's input.
std::vector<Buf> inputs(const CollCase& c) {
    std::vector<Buf> in(c.ranks, Buf(c.in_count() * es(c.dtype)));
    for (int r = 0; r < c.ranks; ++r) fill_input(c, r, in[r].data());
    return in;
}

// Rank `rank`'s result, computed from the collective's definition.
Buf simulate(const CollCase& c, const std::vector<Buf>& in, int rank) {
    const std::size_t e = es(c.dtype), chunk = c.chunk;
    Buf out(c.out_count() * e);
    switch (c.kind) {
        case CollKind::AllGather:  // out block r = rank r's in
            for (int r = 0; r < c.ranks; ++r) std::memcpy(out.data() + r * chunk * e, in[r].data(), chunk * e);
            break;
        case CollKind::AllToAll:  // out block r = block `rank` of rank r's in
            for (int r = 0; r < c.ranks; ++r)
                std::memcpy(out.data() + r * chunk * e, in[r].data() + rank * chunk * e, chunk * e);
            break;
        default: {  // reductions over the ranks, of the whole buffer or of chunk `rank`
            const std::size_t base = c.kind == CollKind::ReduceScatter ? rank * chunk : 0;
            for (std::size_t i = 0; i < chunk; ++i) {
                double acc = c.op == ReduceOp::Max ? -INFINITY : 0.0;
                for (int r = 0; r < c.ranks; ++r) {
                    const double v = decode(c.dtype, in[r], base + i);
                    acc = c.op == ReduceOp::Max ? std::max(acc, v) : acc + v;
                }
                encode(c.dtype, out, i, acc);
            }
        }
    }
    return out;
}

struct Case {
    CollKind kind;
    DType dtype;
    ReduceOp op;
};

std::vector<Case> cases() {
    std::vector<Case> v;
    for (DType t : {DType::F32, DType::F16, DType::BF16})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max})
            for (CollKind k : {CollKind::AllReduce, CollKind::ReduceScatter}) v.push_back({k, t, op});
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::I32, DType::I64, DType::U8})
        for (CollKind k : {CollKind::AllGather, CollKind::AllToAll}) v.push_back({k, t, ReduceOp::Sum});
    return v;
}

TEST(BenchCollData, TheDefinitionCountsNoneWrongAndEveryPoisonCounts) {
    std::mt19937_64 rng(std::random_device{}());
    for (const Case& k : cases()) {
        for (int ranks : {1, 2, 3, 8}) {
            const CollCase c{k.kind, k.dtype, k.op, ranks, 1 + rng() % 700, rng() | 1};
            const auto in = inputs(c);
            for (int rank = 0; rank < ranks; ++rank) {
                SCOPED_TRACE(::testing::Message() << loom::to_string(c.kind) << " " << loom::dtype_name(c.dtype)
                                                  << (c.op == ReduceOp::Max ? " max" : " sum") << " ranks " << ranks
                                                  << " rank " << rank << " chunk " << c.chunk << " seed " << c.seed);
                Buf out = simulate(c, in, rank);
                ASSERT_EQ(count_wrong(c, rank, out.data()), 0u);
                for (std::size_t i = 0; i < c.out_count(); ++i)
                    ASSERT_EQ(loom::bench::expected_bits(c, rank, i), bits_at(out, i, es(c.dtype))) << i;
                // One element with a bit of its last byte flipped: counted, and named.
                const std::size_t bad = rng() % c.out_count();
                out[bad * es(c.dtype) + es(c.dtype) - 1] ^= 0x01;
                Mismatch first;
                ASSERT_EQ(count_wrong(c, rank, out.data(), &first), 1u);
                EXPECT_EQ(first.index, bad);
                EXPECT_NE(first.got, first.expected);
                // The poison the benchmark writes (0xff bytes) counts in every element.
                std::fill(out.begin(), out.end(), 0xff);
                EXPECT_EQ(count_wrong(c, rank, out.data()), c.out_count());
            }
        }
    }
}

TEST(BenchCollData, ReductionInputsAreExactSmallIntegersThatDifferByRankAndSeed) {
    for (DType t : {DType::F32, DType::F16, DType::BF16}) {
        const int ranks = 8;
        const CollCase c{CollKind::AllReduce, t, ReduceOp::Sum, ranks, 4096, 12345};
        const auto in = inputs(c);
        const double limit = t == DType::BF16 ? 256 : t == DType::F16 ? 2048 : double(1 << 24);
        int distinct = 0;
        for (std::size_t i = 0; i < c.chunk; ++i) {
            const double v0 = decode(t, in[0], i), v1 = decode(t, in[1], i);
            EXPECT_EQ(v0, std::round(v0));
            EXPECT_LE(std::fabs(v0) * ranks, limit);  // any sum of 8 stays exact
            distinct += v0 != v1;
        }
        EXPECT_GT(distinct, 4096 * 3 / 4) << loom::dtype_name(t);  // ranks hold different values
        CollCase other = c;
        other.seed = 54321;
        EXPECT_NE(inputs(other)[0], in[0]) << loom::dtype_name(t);
    }
}

TEST(BenchCollData, NaNIsWrongInAReduction) {
    const CollCase c{CollKind::AllReduce, DType::F32, ReduceOp::Sum, 2, 16, 7};
    Buf out = simulate(c, inputs(c), 0);
    const float nan = NAN;
    std::memcpy(out.data() + 4 * 3, &nan, 4);
    EXPECT_EQ(count_wrong(c, 0, out.data()), 1u);
}

TEST(BenchCollData, BadCasesRaise) {
    Buf out(64);
    EXPECT_THROW(count_wrong(CollCase{CollKind::AllReduce, DType::I32, ReduceOp::Sum, 2, 4, 1}, 0, out.data()),
                 loom::Error);
    EXPECT_THROW(count_wrong(CollCase{CollKind::AllGather, DType::F32, ReduceOp::Sum, 2, 0, 1}, 0, out.data()),
                 loom::Error);
    EXPECT_THROW(fill_input(CollCase{CollKind::AllToAllV, DType::F32, ReduceOp::Sum, 2, 4, 1}, 0, out.data()),
                 loom::Error);
}

}  // namespace
