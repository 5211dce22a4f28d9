// Argument checks shared by the collectives' public entries: each raises loom::Error saying what was expected and
// what was given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/ops/collectives.hpp"
#include "loom/runtime/world.hpp"
#include "loom/tensor.hpp"
#include "runtime/call_agreement.hpp"

namespace loom::coll {

// b holds at least one element of a known dtype, at a non-null address aligned to its element size, and its size in
// bytes fits in size_t. Needs no GPU.
void check_view(const char* op, const char* which, const BufferView& b);
// check_view, then the whole of b is memory this rank's GPU may use: inside one live symmetric allocation when b starts
// in the heap, else device memory of world.device() (detail::check_memory, runtime/pointer_check.hpp).
void check_buffer(const char* op, const char* which, World& world, const BufferView& b);
// `count` x `world size` as all_gather's out.count and the like, raising when it overflows.
std::size_t times_world(const char* op, const char* what, std::size_t count, int world_size);
void check_same_dtype(const char* op, const BufferView& in, const BufferView& out);
void check_float_dtype(const char* op, const BufferView& b);
// Raises "<op>: <which> (<ptr>, <bytes> bytes) is not in the symmetric heap; the <algo> algorithm needs it
// there: allocate it with world.alloc".
void check_symmetric(const char* op, const char* algo, const char* which, World& world, const BufferView& b);

// One rank's side of an all_to_all_v call, read back to the host in checking mode: its in.count, send_counts[world]
// and send_offsets[world] (empty: packed prefix sums).
struct A2avSends {
    std::uint64_t in_count = 0;
    std::vector<std::int64_t> counts, offsets;
};
// "" when every rank's blocks lie in its in (send_offsets[j] + send_counts[j] <= in.count, no count negative) and every
// rank's out (out_count elements) holds what the ranks send it; else the first problem, naming the rank, the index
// and the values. Overflow-safe.
std::string a2av_counts_error(const std::vector<A2avSends>& ranks, std::uint64_t out_count);

// A collective call's signature for the cross-rank check (runtime/call_agreement.hpp): the counts (all_to_all_v: out's
// only, in.count may differ by rank), dtypes, where each buffer lies in the symmetric heap (peers address it at this
// rank's offset) and the options.
detail::CallSignature signature(World& world, CollKind kind, const BufferView& in, const BufferView& out,
                                const CollOptions& opts);

}  // namespace loom::coll
