// The checks every op makes of its buffers before launching (include/loom/runtime/device_memory.hpp states the
// contract): sizes free of overflow, and each buffer's whole extent memory the op's GPU can use — one live symmetric
// allocation, or device / managed memory of that GPU by the driver's answer, cached per allocation range.
// Every check raises loom::Error naming the op and the argument, what was expected and what was given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>

#include "loom/runtime/world.hpp"
#include "loom/tensor.hpp"

namespace loom::detail {

// ---- sizes -----------------------------------------------------------------------------------------------------

// a * b, or raises "<op>: <what> overflows: <a> x <b>" when it does not fit in size_t.
std::size_t checked_mul(const char* op, const char* what, std::size_t a, std::size_t b);
// Bytes of `count` elements of `dtype` (a known dtype), raising on overflow.
std::size_t buffer_bytes(const char* op, const char* which, std::size_t count, DType dtype);
// Bytes from a matrix's first element to one past its last: ((rows - 1) x stride + cols) x element size, rows and cols
// positive, stride >= cols; raises on overflow.
std::size_t matrix_bytes(const char* op, const char* which, const MatrixView& m);

// ---- what the driver says of an address ---------------------------------------------------------------------------

enum class MemoryKind {
    Unregistered,  // not known to CUDA: malloc, a static array, the stack, an unmapped address
    Host,          // page-locked host memory (cudaMallocHost, cudaHostRegister)
    Device,        // device memory of MemoryRange::device
    Managed,       // managed memory (cudaMallocManaged): any device may use it
};
const char* to_string(MemoryKind k);

// The driver's answer for one address: its kind, the device of device memory, and for device and managed memory the
// allocation (or mapping) holding it.
struct MemoryRange {
    MemoryKind kind = MemoryKind::Unregistered;
    int device = -1;
    std::uintptr_t start = 0;
    std::size_t size = 0;
    bool contains(std::uintptr_t a) const { return a >= start && a - start < size; }
};

// Asks the driver (cuPointerGetAttributes).
MemoryRange query_memory(std::uintptr_t address);

// Device and managed ranges by start address; a miss asks `query` and keeps a device or managed answer (host and
// unregistered answers are refused by the checks, so never asked twice in a correct program). Bounded: cleared past
// max_entries. Thread-safe.
class MemoryRangeCache {
  public:
    using Query = std::function<MemoryRange(std::uintptr_t)>;
    explicit MemoryRangeCache(Query query, std::size_t max_entries = 4096);
    MemoryRange find(std::uintptr_t address);
    void forget(std::uintptr_t address);  // drops the range holding address
    void clear();
    std::size_t size() const;

  private:
    Query query_;
    std::size_t max_entries_;
    mutable std::mutex mu_;
    std::map<std::uintptr_t, MemoryRange> ranges_;  // start -> range
};

// The process's cache over query_memory.
MemoryRangeCache& memory_ranges();

// Counts the frees Loom knows of (forget_device_memory, World::free): a cache of checked calls (the collectives'
// plans) keys on it, so that a replayed call is checked again once any memory it may have named was freed.
std::uint64_t memory_generation();
void bump_memory_generation();

// Raises unless `device` may use [p, p + bytes) by the answers for its first byte (`first`) and last byte (`last`):
// each device memory of `device`, or managed memory. Pure: the tests give it answers.
void check_usable(const char* op, const char* which, const void* p, std::size_t bytes, int device,
                  const MemoryRange& first, const MemoryRange& last);
// Raises unless [p, p + bytes) lies in the allocation `a` (nullopt: p is in the heap but in no live allocation).
void check_in_allocation(const char* op, const char* which, const void* p, std::size_t bytes,
                         const std::optional<World::Allocation>& a);

// Whether [a, a + an) and [b, b + bn) share a byte (empty ranges share none; no wrap-around past the address space).
bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn);

// Raises unless [a, a + a_bytes) and [b, b + b_bytes) share no byte ("<op>: expected <a_name> not to overlap
// <b_name>, ..."): an op that reads one while writing the other in another order than element by element.
void check_disjoint(const char* op, const char* a_name, const void* a, std::size_t a_bytes, const char* b_name,
                    const void* b, std::size_t b_bytes);

// Raises when two matrices share an element: some row of one meets a row of the other, for any two row pitches (column
// slices of one buffer, whose rows interleave without meeting, pass). Empty or null views share nothing.
void check_disjoint(const char* op, const char* a_name, const MatrixView& a, const char* b_name, const MatrixView& b);

// ---- the op-boundary check ----------------------------------------------------------------------------------------

// The extent [p, p + bytes) of the op's argument `which` (p non-null, bytes > 0): inside one live symmetric allocation
// of `world` when p is in its heap, else memory `device` may use (check_usable over the cached answers). world may be
// null (loom::gemm): then the driver's answer only.
void check_memory(const World* world, int device, const char* op, const char* which, const void* p, std::size_t bytes);
// check_memory over a matrix's extent (matrix_bytes: raises for an empty view).
void check_memory(const World* world, int device, const char* op, const char* which, const MatrixView& m);

}  // namespace loom::detail
