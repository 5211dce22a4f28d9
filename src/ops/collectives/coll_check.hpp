// Argument checks shared by the collectives' public entries: each raises loom::Error saying what was expected and
// what was given.
#pragma once

#include <cstddef>

#include "loom/runtime/world.hpp"
#include "loom/tensor.hpp"

namespace loom::coll {

// b holds at least one element, at a non-null address aligned to its element size.
void check_buffer(const char* op, const char* which, const BufferView& b);
void check_same_dtype(const char* op, const BufferView& in, const BufferView& out);
void check_float_dtype(const char* op, const BufferView& b);
// Raises "<op>: <which> (<ptr>, <bytes> bytes) is not in the symmetric heap; the <algo> algorithm needs it
// there: allocate it with world.alloc".
void check_symmetric(const char* op, const char* algo, const char* which, World& world, const BufferView& b);
bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn);

}  // namespace loom::coll
