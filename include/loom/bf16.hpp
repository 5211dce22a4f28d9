// Host conversions between float and bf16 bits (round to nearest even; NaN stays a quiet NaN): for filling and
// checking bf16 buffers from host code (tests, benchmarks, examples). Host only.
#pragma once

#include <cstdint>
#include <cstring>

namespace loom {

inline std::uint16_t float_to_bf16(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<std::uint16_t>(u >> 16);
}

inline float bf16_to_float(std::uint16_t h) {
    const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

}  // namespace loom
