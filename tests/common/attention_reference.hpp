// Host side of the decode-attention tests: random caches (contiguous or paged) of bf16 / fp16 values and the fp64
// reference of decode attention over them.
#pragma once

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "loom/bf16.hpp"
#include "loom/tensor.hpp"

namespace loom::test {

inline float half_bits_to_float(uint16_t h, DType t) {
    if (t == DType::BF16) return bf16_to_float(h);
    __half x;
    std::memcpy(&x, &h, 2);
    return __half2float(x);
}
inline uint16_t float_to_half_bits(float f, DType t) {
    if (t == DType::BF16) return float_to_bf16(f);
    const __half x = __float2half_rn(f);
    uint16_t h;
    std::memcpy(&h, &x, 2);
    return h;
}

// Random values in [-1, 1) as 16-bit elements.
inline std::vector<uint16_t> random_halves(std::size_t n, DType t, std::mt19937_64& rng) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = float_to_half_bits(u(rng), t);
    return v;
}

// A KV cache on the host, laid out as the op takes it, and each sequence's tokens in order for the reference.
struct HostCache {
    int batch = 0, hkv = 0, d = 0, page_size = 0;  // page_size 0: contiguous
    int64_t max_seq_len = 0;                       // contiguous capacity
    int num_pages = 0, max_pages = 0;
    std::vector<int32_t> lens, block_table;
    std::vector<uint16_t> k, v;  // contiguous [B, S, Hkv, D]; paged [num_pages, page, Hkv, D]
    // Element offset of (b, t, h, 0).
    std::size_t offset(int b, int t, int h) const {
        std::size_t row;
        if (page_size == 0) {
            row = std::size_t(b) * max_seq_len + t;
        } else {
            row = std::size_t(block_table[std::size_t(b) * max_pages + t / page_size]) * page_size + t % page_size;
        }
        return (row * hkv + h) * d;
    }
};

// Pages are dealt to the sequences in a random order (plus `spare` unused pages), so no sequence's pages are
// contiguous; the block table's unused entries hold -1 (never read: past the length).
inline HostCache make_cache(const std::vector<int32_t>& lens, int hkv, int d, int page_size, DType t,
                            std::mt19937_64& rng, int spare = 3) {
    HostCache c;
    c.batch = static_cast<int>(lens.size());
    c.hkv = hkv;
    c.d = d;
    c.page_size = page_size;
    c.lens = lens;
    const int64_t longest = std::max<int64_t>(1, *std::max_element(lens.begin(), lens.end()));
    if (page_size == 0) {
        c.max_seq_len = longest + 5;  // capacity beyond the longest
        const std::size_t n = std::size_t(c.batch) * c.max_seq_len * hkv * d;
        c.k = random_halves(n, t, rng);
        c.v = random_halves(n, t, rng);
        return c;
    }
    c.max_pages = static_cast<int>((longest + page_size - 1) / page_size) + 1;
    int used = 0;
    for (int32_t l : lens) used += (l + page_size - 1) / page_size;
    c.num_pages = used + spare;
    std::vector<int32_t> perm(c.num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    c.block_table.assign(std::size_t(c.batch) * c.max_pages, -1);
    int next = 0;
    for (int b = 0; b < c.batch; ++b)
        for (int i = 0; i < (lens[b] + page_size - 1) / page_size; ++i)
            c.block_table[std::size_t(b) * c.max_pages + i] = perm[next++];
    const std::size_t n = std::size_t(c.num_pages) * page_size * hkv * d;
    c.k = random_halves(n, t, rng);
    c.v = random_halves(n, t, rng);
    return c;
}

// fp64 decode attention of q [B, Hq, D] over the tokens [t_lo, t_hi) of each sequence (clipped at its length):
// o [B, Hq, D], lse [B, Hq] (natural log; -inf and o = 0 without tokens).
inline void reference_decode(const std::vector<uint16_t>& q, int hq, const HostCache& c, DType t, double scale,
                             double softcap, std::vector<double>& o, std::vector<double>& lse) {
    const int B = c.batch, D = c.d, G = hq / c.hkv;
    o.assign(std::size_t(B) * hq * D, 0.0);
    lse.assign(std::size_t(B) * hq, -std::numeric_limits<double>::infinity());
    std::vector<double> s, qf(D);
    for (int b = 0; b < B; ++b) {
        const int len = c.lens[b];
        s.resize(len);
        for (int h = 0; h < hq; ++h) {
            const int kvh = h / G;
            for (int e = 0; e < D; ++e) qf[e] = half_bits_to_float(q[(std::size_t(b) * hq + h) * D + e], t);
            double mx = -std::numeric_limits<double>::infinity();
            for (int j = 0; j < len; ++j) {
                const std::size_t off = c.offset(b, j, kvh);
                double dot = 0;
                for (int e = 0; e < D; ++e) dot += qf[e] * half_bits_to_float(c.k[off + e], t);
                double x = dot * scale;
                if (softcap > 0) x = softcap * std::tanh(x / softcap);
                s[j] = x;
                mx = std::max(mx, x);
            }
            if (len == 0) continue;
            double sum = 0;
            double* out = &o[(std::size_t(b) * hq + h) * D];
            for (int j = 0; j < len; ++j) {
                const double p = std::exp(s[j] - mx);
                sum += p;
                const std::size_t off = c.offset(b, j, kvh);
                for (int e = 0; e < D; ++e) out[e] += p * half_bits_to_float(c.v[off + e], t);
            }
            for (int e = 0; e < D; ++e) out[e] /= sum;
            lse[std::size_t(b) * hq + h] = mx + std::log(sum);
        }
    }
}

}  // namespace loom::test
