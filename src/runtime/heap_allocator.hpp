// Offset bookkeeping of the symmetric heap: a first-fit allocator over [0, capacity) with alignment, pure CPU.
//
// Contract: the World keeps one HeapAllocator per rank and feeds every rank the same sequence of calls (after
// checking over the store that all ranks asked the same thing), so the allocator being deterministic is what
// makes an allocation land at the same offset on every rank. It knows nothing of GPUs or addresses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>

namespace loom::detail {

class HeapAllocator {
  public:
    explicit HeapAllocator(std::size_t capacity);

    // First free block (lowest offset) that can hold `bytes` at an offset aligned to `alignment`; the block
    // is split around the allocation so the padding stays free. Returns std::nullopt when no block fits.
    // Raises loom::Error when bytes == 0 or alignment is not a power of two.
    std::optional<std::size_t> allocate(std::size_t bytes, std::size_t alignment);

    // Frees the allocation that starts at `offset` and merges it with free neighbours. Returns its size.
    // Raises loom::Error when `offset` is not the start of a live allocation.
    std::size_t free(std::size_t offset);

    // Size of the live allocation starting at `offset`, if any.
    std::optional<std::size_t> allocation_size(std::size_t offset) const;
    // The live allocation containing `offset` (start, size), if any.
    std::optional<std::pair<std::size_t, std::size_t>> allocation_containing(std::size_t offset) const;

    std::size_t capacity() const { return capacity_; }
    std::size_t used() const { return used_; }
    std::size_t largest_free_block() const;
    std::size_t num_free_blocks() const { return free_.size(); }
    std::size_t num_allocations() const { return live_.size(); }

  private:
    std::size_t capacity_;
    std::size_t used_ = 0;
    std::map<std::size_t, std::size_t> free_;  // offset -> size; never two adjacent blocks (always coalesced)
    std::map<std::size_t, std::size_t> live_;  // offset -> size
};

}  // namespace loom::detail
