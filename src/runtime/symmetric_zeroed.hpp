// Symmetric memory that peers signal into: allocated, zeroed on every rank, and the ranks met before any returns.
#pragma once

#include <cstddef>

#include "loom/runtime/world.hpp"

namespace loom::detail {

// world.alloc_bytes(bytes), zeroed; collective. Synchronises the device and meets every rank after zeroing, so no peer
// writes a rank's copy (a signal, an LL packet) before it is zero.
void* alloc_zeroed(World& world, std::size_t bytes);
template <class T>
T* alloc_zeroed(World& world, std::size_t n) {
    return static_cast<T*>(alloc_zeroed(world, n * sizeof(T)));
}

}  // namespace loom::detail
