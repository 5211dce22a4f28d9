// SHA-256 (FIPS 180-4) for the JIT cache key. Incremental; hex digest.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom::jit::detail {

class Sha256 {
  public:
    Sha256();
    Sha256& update(const void* data, std::size_t n);
    Sha256& update(std::string_view s) { return update(s.data(), s.size()); }
    // Adds a length-prefixed field so that ("ab", "c") and ("a", "bc") hash differently.
    Sha256& field(std::string_view s);
    std::array<std::uint8_t, 32> digest();  // finalises; the object must not be updated afterwards
    std::string hex();                      // digest() as 64 lowercase hex characters

  private:
    void block(const std::uint8_t* p);
    std::array<std::uint32_t, 8> h_;
    std::array<std::uint8_t, 64> buf_{};
    std::size_t buf_len_ = 0;
    std::uint64_t total_ = 0;
};

std::string sha256_hex(std::string_view s);

}  // namespace loom::jit::detail
