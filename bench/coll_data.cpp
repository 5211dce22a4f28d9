#include "coll_data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "loom/bf16.hpp"
#include "loom/runtime/error.hpp"

namespace loom::bench {
namespace {

std::uint64_t splitmix64(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// The hash behind element i of rank r's input (i < 2^48).
std::uint64_t element_hash(std::uint64_t seed, int r, std::size_t i) {
    return splitmix64(seed * 0xd1b54a32d192ed03ull + (static_cast<std::uint64_t>(r) << 48) + i);
}

// Largest integer magnitude the type holds exactly with every smaller one: 2^(mantissa bits + 1).
long long exact_limit(DType t) {
    switch (t) {
        case DType::BF16:
            return 256;
        case DType::F16:
            return 2048;
        default:
            return 1ll << 24;
    }
}

// Rank r's input element i of a reduction: an integer in [-L, L], L = limit / ranks.
long long int_value(const CollCase& c, int r, std::size_t i) {
    const long long L = std::max(1ll, exact_limit(c.dtype) / c.ranks);
    return static_cast<long long>(element_hash(c.seed, r, i) % static_cast<std::uint64_t>(2 * L + 1)) - L;
}

// An integer of magnitude <= 2048 as IEEE binary16 bits (exact).
std::uint16_t int_to_half(long long v) {
    if (v == 0) return 0;
    const std::uint16_t sign = v < 0 ? 0x8000 : 0;
    const unsigned long long a = static_cast<unsigned long long>(v < 0 ? -v : v);
    int e = 0;
    while ((a >> (e + 1)) != 0) ++e;  // a in [2^e, 2^(e+1))
    const std::uint16_t mant = static_cast<std::uint16_t>(((a << 10) >> e) & 0x3ff);
    return static_cast<std::uint16_t>(sign | ((e + 15) << 10) | mant);
}

float half_to_float(std::uint16_t h) {
    const int exp = (h >> 10) & 0x1f;
    const int mant = h & 0x3ff;
    float v;
    if (exp == 0) {
        v = std::ldexp(static_cast<float>(mant), -24);
    } else if (exp == 0x1f) {
        v = mant ? NAN : INFINITY;
    } else {
        v = std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
    }
    return (h & 0x8000) ? -v : v;
}

// An exact integer as the type's bits.
std::uint64_t int_bits(DType t, long long v) {
    switch (t) {
        case DType::BF16:
            return float_to_bf16(static_cast<float>(v));
        case DType::F16:
            return int_to_half(v);
        default: {
            const float f = static_cast<float>(v);
            std::uint32_t u;
            std::memcpy(&u, &f, 4);
            return u;
        }
    }
}

double decode(DType t, const void* base, std::size_t i) {
    switch (t) {
        case DType::BF16: {
            std::uint16_t h;
            std::memcpy(&h, static_cast<const char*>(base) + 2 * i, 2);
            return bf16_to_float(h);
        }
        case DType::F16: {
            std::uint16_t h;
            std::memcpy(&h, static_cast<const char*>(base) + 2 * i, 2);
            return half_to_float(h);
        }
        default: {
            float f;
            std::memcpy(&f, static_cast<const char*>(base) + 4 * i, 4);
            return f;
        }
    }
}

std::uint64_t mask_bits(DType t, std::uint64_t bits) {
    const int n = dtype_size(t);
    return n >= 8 ? bits : bits & ((1ull << (8 * n)) - 1);
}

// Rank r's input element i of a data movement: random bits, never all ones (the poison bench-collectives writes
// into out first), so an element left unwritten always counts as wrong.
std::uint64_t random_bits(const CollCase& c, int r, std::size_t i) {
    const std::uint64_t bits = mask_bits(c.dtype, element_hash(c.seed, r, i));
    return bits == mask_bits(c.dtype, ~0ull) ? bits ^ 1 : bits;
}

std::uint64_t load_bits(DType t, const void* base, std::size_t i) {
    const std::size_t n = static_cast<std::size_t>(dtype_size(t));
    std::uint64_t v = 0;
    std::memcpy(&v, static_cast<const char*>(base) + n * i, n);  // little-endian: the low bytes
    return v;
}

bool reduction(CollKind k) { return k == CollKind::ReduceScatter || k == CollKind::AllReduce; }

// Rank `rank`'s reduced out element i, as an integer.
long long reduced(const CollCase& c, int rank, std::size_t i) {
    const std::size_t src = c.kind == CollKind::ReduceScatter ? static_cast<std::size_t>(rank) * c.chunk + i : i;
    long long acc = int_value(c, 0, src);
    for (int r = 1; r < c.ranks; ++r) {
        const long long v = int_value(c, r, src);
        acc = c.op == ReduceOp::Max ? std::max(acc, v) : acc + v;
    }
    return acc;
}

// Data movement: the (source rank, source index) rank `rank`'s out element i comes from.
std::uint64_t moved_bits(const CollCase& c, int rank, std::size_t i) {
    const int src_rank = static_cast<int>(i / c.chunk);
    const std::size_t j = i % c.chunk;
    const std::size_t src = c.kind == CollKind::AllToAll ? static_cast<std::size_t>(rank) * c.chunk + j : j;
    return random_bits(c, src_rank, src);
}

void check_case(const CollCase& c) {
    LOOM_CHECK(c.ranks >= 1 && c.chunk >= 1, "CollCase: expected ranks >= 1 and chunk >= 1, given {} and {}", c.ranks,
               c.chunk);
    LOOM_CHECK(c.kind != CollKind::AllToAllV, "CollCase: all_to_all_v has no fixed reference");
    LOOM_CHECK(!reduction(c.kind) || c.dtype == DType::F32 || c.dtype == DType::F16 || c.dtype == DType::BF16,
               "CollCase: {} reduces f32, f16 or bf16, given {}", to_string(c.kind), dtype_name(c.dtype));
}

}  // namespace

std::size_t CollCase::in_count() const {
    return kind == CollKind::AllGather || kind == CollKind::AllReduce ? chunk : chunk * static_cast<std::size_t>(ranks);
}
std::size_t CollCase::out_count() const {
    return kind == CollKind::ReduceScatter || kind == CollKind::AllReduce ? chunk
                                                                          : chunk * static_cast<std::size_t>(ranks);
}

void fill_input(const CollCase& c, int rank, void* dst) {
    check_case(c);
    const std::size_t n = c.in_count(), es = static_cast<std::size_t>(dtype_size(c.dtype));
    char* d = static_cast<char*>(dst);
    for (std::size_t i = 0; i < n; ++i) {
        const std::uint64_t bits =
            reduction(c.kind) ? int_bits(c.dtype, int_value(c, rank, i)) : random_bits(c, rank, i);
        std::memcpy(d + es * i, &bits, es);
    }
}

std::uint64_t expected_bits(const CollCase& c, int rank, std::size_t i) {
    return reduction(c.kind) ? int_bits(c.dtype, reduced(c, rank, i)) : moved_bits(c, rank, i);
}

std::size_t count_wrong(const CollCase& c, int rank, const void* out, Mismatch* first) {
    check_case(c);
    const std::size_t n = c.out_count();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
        if (reduction(c.kind)) {
            const long long want = reduced(c, rank, i);
            const double got = decode(c.dtype, out, i);
            if (got == static_cast<double>(want)) continue;  // NaN never equals
            if (first && wrong == 0) *first = {i, fmt::format("{}", got), fmt::format("{}", want)};
        } else {
            const std::uint64_t want = moved_bits(c, rank, i), got = load_bits(c.dtype, out, i);
            if (got == want) continue;
            if (first && wrong == 0) *first = {i, fmt::format("{:#x}", got), fmt::format("{:#x}", want)};
        }
        ++wrong;
    }
    return wrong;
}

}  // namespace loom::bench
