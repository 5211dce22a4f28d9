// A symmetric allocation of the World's heap for tests, freed (collectively) at scope exit; at least 256 bytes, so
// that an empty buffer still has a valid symmetric address.
#pragma once

#include <cstddef>

#include "loom/runtime/world.hpp"

namespace loom::test {

struct Sym {
    World& w;
    void* p;
    Sym(World& world, std::size_t bytes) : w(world), p(world.alloc_bytes(bytes < 256 ? 256 : bytes)) {}
    ~Sym() { w.free(p); }
    Sym(const Sym&) = delete;
    Sym& operator=(const Sym&) = delete;
    template <class T = char>
    T* as() const {
        return static_cast<T*>(p);
    }
};

}  // namespace loom::test
