#include "ops/collectives/coll_check.hpp"

#include <cstdint>

#include "loom/runtime/error.hpp"

namespace loom::coll {

void check_buffer(const char* op, const char* which, const BufferView& b) {
    // First: every later check and size computation divides or multiplies by the element size.
    LOOM_CHECK(dtype_size(b.dtype) > 0,
               "{}: expected {} of a known dtype (f32, f16, bf16, f8e4m3, i32, i64, u8), given DType value {}", op,
               which, static_cast<int>(b.dtype));
    LOOM_CHECK(b.count > 0, "{}: expected {} to hold at least one element, given count 0", op, which);
    LOOM_CHECK(b.data != nullptr, "{}: expected a device pointer for {}, given nullptr", op, which);
    const auto a = reinterpret_cast<std::uintptr_t>(b.data);
    LOOM_CHECK(a % static_cast<std::uintptr_t>(dtype_size(b.dtype)) == 0,
               "{}: expected {} aligned to its element size ({} bytes for {}), given address {}", op, which,
               dtype_size(b.dtype), dtype_name(b.dtype), b.data);
}

void check_same_dtype(const char* op, const BufferView& in, const BufferView& out) {
    LOOM_CHECK(in.dtype == out.dtype, "{}: expected in and out of the same dtype, given in {} and out {}", op,
               dtype_name(in.dtype), dtype_name(out.dtype));
}

void check_float_dtype(const char* op, const BufferView& b) {
    LOOM_CHECK(b.dtype == DType::F32 || b.dtype == DType::F16 || b.dtype == DType::BF16,
               "{}: expected dtype f32, f16 or bf16, given {}", op, dtype_name(b.dtype));
}

void check_symmetric(const char* op, const char* algo, const char* which, World& world, const BufferView& b) {
    LOOM_CHECK(world.is_symmetric(b.data, b.bytes()),
               "{}: {} ({}, {} bytes) is not in the symmetric heap; the {} algorithm needs it there: allocate it "
               "with world.alloc",
               op, which, b.data, b.bytes(), algo);
}

bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) {
    const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
    return x < y + bn && y < x + an;
}

}  // namespace loom::coll
