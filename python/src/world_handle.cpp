#include "world_handle.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

namespace loom::py {

void WorldHandle::drop(std::uint64_t offset) {
    std::lock_guard<std::mutex> lock(mu);
    if (!shut_down) pending.insert(offset);
}

std::size_t WorldHandle::collect() {
    std::vector<std::uint64_t> mine;
    {
        std::lock_guard<std::mutex> lock(mu);
        mine.assign(pending.begin(), pending.end());
    }
    Bytes blob(mine.size() * sizeof(std::uint64_t));
    if (!mine.empty()) std::memcpy(blob.data(), mine.data(), blob.size());
    const std::vector<Bytes> all = world.store().all_gather("loom.python/collect", blob);
    // The offsets every rank dropped: the same list on every rank, ascending.
    std::vector<std::uint64_t> common = mine;
    for (const Bytes& b : all) {
        std::vector<std::uint64_t> theirs(b.size() / sizeof(std::uint64_t));
        if (!theirs.empty()) std::memcpy(theirs.data(), b.data(), b.size());
        std::vector<std::uint64_t> keep;
        std::set_intersection(common.begin(), common.end(), theirs.begin(), theirs.end(), std::back_inserter(keep));
        common.swap(keep);
    }
    if (common.empty()) return 0;
    char* base = world.heap().local_base();
    for (std::uint64_t off : common) {
        world.free(base + off);
        std::lock_guard<std::mutex> lock(mu);
        pending.erase(off);
    }
    return common.size();
}

void WorldHandle::shutdown() {
    if (world.is_shut_down()) return;
    try {
        collect();
    } catch (...) {
        // A peer already gone: shutdown below still releases the local resources.
    }
    {
        std::lock_guard<std::mutex> lock(mu);
        shut_down = true;
        pending.clear();
    }
    world.shutdown();
}

SymAlloc::~SymAlloc() {
    if (!world || !ptr) return;
    {
        std::lock_guard<std::mutex> lock(world->mu);
        if (world->shut_down || world->world.is_shut_down()) return;
    }
    try {
        char* base = world->world.heap().local_base();
        world->drop(static_cast<std::uint64_t>(static_cast<char*>(ptr) - base));
    } catch (...) {
        // Only a World without a heap raises here, and such a World never handed out a SymAlloc.
    }
}

}  // namespace loom::py
