// What the numbered examples share: reproducible bf16 data (the same values for the same seed on every rank, so a
// rank can regenerate its peers' inputs for its check) and uploads.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "loom/bf16.hpp"
#include "loom/runtime/error.hpp"

namespace loom_example {

// The next value of an xorshift64 stream (x != 0).
inline uint64_t next_random(uint64_t& x) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
}

// n bf16 values (as bits) in [-scale, scale) from the stream of `seed`.
inline std::vector<uint16_t> random_bf16(std::size_t n, uint64_t seed, float scale = 1.f) {
    std::vector<uint16_t> h(n);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (auto& v : h)
        v = loom::float_to_bf16(scale *
                                (static_cast<float>((next_random(x) >> 40) & 0xffffff) / 16777216.f * 2.f - 1.f));
    return h;
}

// The same values as floats (bf16 values are exact in float).
inline std::vector<float> random_bf16_floats(std::size_t n, uint64_t seed, float scale = 1.f) {
    const std::vector<uint16_t> bits = random_bf16(n, seed, scale);
    std::vector<float> h(n);
    for (std::size_t i = 0; i < n; ++i) h[i] = loom::bf16_to_float(bits[i]);
    return h;
}

// A device copy of h (cudaMalloc'd, at least 256 bytes so that an empty vector still has an address).
template <class T>
void* upload(const std::vector<T>& h) {
    void* d = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(&d, std::max<std::size_t>(h.size() * sizeof(T), 256)));
    LOOM_CHECK_CUDA(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

}  // namespace loom_example
