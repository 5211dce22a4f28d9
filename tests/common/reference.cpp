#include "common/reference.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>

namespace loom::test {

std::uint16_t float_to_half(float f) {
    // IEEE binary16, round to nearest even, with subnormals.
    std::uint32_t x;
    std::memcpy(&x, &f, 4);
    std::uint32_t sign = (x >> 16) & 0x8000u;
    std::uint32_t mant = x & 0x007fffffu;
    int exp = static_cast<int>((x >> 23) & 0xffu);
    if (exp == 0xff) return static_cast<std::uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
    int e = exp - 127 + 15;
    if (e >= 0x1f) return static_cast<std::uint16_t>(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10) return static_cast<std::uint16_t>(sign);
        mant |= 0x00800000u;
        int shift = 14 - e;
        std::uint32_t half = mant >> shift;
        std::uint32_t rem = mant & ((1u << shift) - 1);
        std::uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) ++half;
        return static_cast<std::uint16_t>(sign | half);
    }
    std::uint32_t half = sign | (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
    std::uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(half);
}

float half_to_float(std::uint16_t h) {
    std::uint32_t sign = (h & 0x8000u) << 16;
    int exp = (h >> 10) & 0x1f;
    std::uint32_t mant = h & 0x3ffu;
    float f;
    if (exp == 0) {
        f = std::ldexp(static_cast<float>(mant), -24);
        std::uint32_t u;
        std::memcpy(&u, &f, 4);
        u |= sign;
        std::memcpy(&f, &u, 4);
        return f;
    }
    std::uint32_t u = exp == 0x1f ? (sign | 0x7f800000u | (mant << 13))
                                  : (sign | (static_cast<std::uint32_t>(exp - 15 + 127) << 23) | (mant << 13));
    std::memcpy(&f, &u, 4);
    return f;
}

std::uint64_t run_seed(std::uint64_t seed) {
    static const std::uint64_t salt = [] {
        const char* v = std::getenv("LOOM_TEST_SEED");
        return v ? std::strtoull(v, nullptr, 10) : 0ull;
    }();
    if (salt == 0) return seed;
    std::uint64_t x = seed ^ (salt * 0x9e3779b97f4a7c15ull);  // splitmix64's finaliser
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
    std::mt19937_64 rng(run_seed(seed));
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

double calc_diff(std::span<const double> ref, std::span<const double> got) {
    double xy = 0, xx = 0, yy = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
        xy += ref[i] * got[i];
        xx += ref[i] * ref[i];
        yy += got[i] * got[i];
    }
    double denom = xx + yy;
    return denom == 0 ? 0.0 : 1.0 - 2.0 * xy / denom;
}

double rel_l2(std::span<const double> ref, std::span<const double> got) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
        double d = got[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

double value_at(DType t, std::span<const char> raw, std::size_t i) {
    if (t == DType::F32) {
        float f;
        std::memcpy(&f, raw.data() + 4 * i, 4);
        return f;
    }
    std::uint16_t h;
    std::memcpy(&h, raw.data() + 2 * i, 2);
    return t == DType::BF16 ? bf16_to_float(h) : half_to_float(h);
}

double sum_tolerance(DType t, double ref, int W) {
    const double rel = t == DType::F32 ? 1e-6 * W : t == DType::BF16 ? 1.0 / 128 : 1.0 / 1024;
    return std::fabs(ref) * rel + (t == DType::F32 ? 1e-6 : 1e-3) * W;
}

}  // namespace loom::test
