// Inputs of a checked collective call and the result every rank must hold, on the host (bench-collectives' #wrong).
//
// Reductions (reduce_scatter, all_reduce) reduce random integers of magnitude <= limit / ranks (bfloat16 256,
// half 2048, float 2^24): every partial sum is exact in the type, so the result is exact whatever order the ranks'
// values are combined in, and an element is wrong when it differs at all (NaN included). Data movement (all_gather,
// all_to_all) moves random bits, never all ones (0xff bytes: the poison), and compares them bit for bit. Element i
// of rank r's input is a hash of (seed, r, i): each rank builds every rank's inputs itself, with no exchange.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "loom/ops/collectives.hpp"
#include "loom/tensor.hpp"

namespace loom::bench {

struct CollCase {
    CollKind kind = CollKind::AllReduce;
    DType dtype = DType::F32;
    ReduceOp op = ReduceOp::Sum;
    int ranks = 1;
    std::size_t chunk = 0;  // elements of one rank's chunk (all_reduce: of the whole buffer)
    std::uint64_t seed = 0;

    std::size_t in_count() const;   // per rank: all_gather chunk; all_reduce chunk; the others ranks x chunk
    std::size_t out_count() const;  // per rank: reduce_scatter chunk; all_reduce chunk; the others ranks x chunk
};

// Rank `rank`'s input, in_count() elements of c.dtype, written to `dst` (host memory).
void fill_input(const CollCase& c, int rank, void* dst);

// The first wrong element of a result (index into out, and both values as text).
struct Mismatch {
    std::size_t index = 0;
    std::string got, expected;
};

// Elements of `out` (out_count() elements of c.dtype, rank `rank`'s result, host memory) that differ from the
// reference; the first one goes to *first when given.
std::size_t count_wrong(const CollCase& c, int rank, const void* out, Mismatch* first = nullptr);

// The reference itself: rank `rank`'s out element i as the type's bits (low dtype_size bytes).
std::uint64_t expected_bits(const CollCase& c, int rank, std::size_t i);

}  // namespace loom::bench
