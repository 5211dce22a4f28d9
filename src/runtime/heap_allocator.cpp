#include "runtime/heap_allocator.hpp"

#include <algorithm>
#include <iterator>

#include "loom/runtime/error.hpp"

namespace loom::detail {

HeapAllocator::HeapAllocator(std::size_t capacity) : capacity_(capacity) {
    if (capacity > 0) free_.emplace(0, capacity);
}

std::optional<std::size_t> HeapAllocator::allocate(std::size_t bytes, std::size_t alignment) {
    LOOM_CHECK(bytes > 0, "symmetric allocation: expected a positive size, given 0 bytes");
    LOOM_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0,
               "symmetric allocation: expected a power-of-two alignment, given {}", alignment);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
        const std::size_t start = it->first, end = it->first + it->second;
        const std::size_t aligned = (start + alignment - 1) & ~(alignment - 1);
        if (aligned < start || aligned > end || end - aligned < bytes) continue;  // aligned < start: overflow
        free_.erase(it);
        if (aligned > start) free_.emplace(start, aligned - start);
        if (aligned + bytes < end) free_.emplace(aligned + bytes, end - aligned - bytes);
        live_.emplace(aligned, bytes);
        used_ += bytes;
        return aligned;
    }
    return std::nullopt;
}

std::size_t HeapAllocator::free(std::size_t offset) {
    auto live = live_.find(offset);
    LOOM_CHECK(live != live_.end(), "symmetric free: expected the start of a live allocation, given offset {}", offset);
    const std::size_t freed = live->second;
    live_.erase(live);
    used_ -= freed;
    std::size_t start = offset, size = freed;
    // Merge with the free block ending where this one starts and with the one starting where it ends.
    auto next = free_.lower_bound(offset);
    if (next != free_.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == offset) {
            start = prev->first;
            size += prev->second;
            free_.erase(prev);
        }
    }
    if (next != free_.end() && next->first == offset + freed) {
        size += next->second;
        free_.erase(next);
    }
    free_.emplace(start, size);
    return freed;
}

std::optional<std::size_t> HeapAllocator::allocation_size(std::size_t offset) const {
    auto it = live_.find(offset);
    if (it == live_.end()) return std::nullopt;
    return it->second;
}

std::optional<std::pair<std::size_t, std::size_t>> HeapAllocator::allocation_containing(std::size_t offset) const {
    auto it = live_.upper_bound(offset);
    if (it == live_.begin()) return std::nullopt;
    --it;
    if (offset - it->first >= it->second) return std::nullopt;
    return std::make_pair(it->first, it->second);
}

std::size_t HeapAllocator::largest_free_block() const {
    std::size_t best = 0;
    for (const auto& [offset, size] : free_) best = std::max(best, size);
    return best;
}

}  // namespace loom::detail
