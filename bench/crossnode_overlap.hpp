// bench-crossnode's rows of the overlapped GEMMs in a World of several nodes (ag_gemm, gemm_rs; the fields:
// bench_crossnode.cpp's header).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/runtime/world.hpp"

namespace loom::bench {

// One layer's GEMM over every rank, C[M, N] = A[M, K] B[N, K]^T: ag_gemm splits A's rows and B's rows (N_loc = N / W
// columns of C per rank), gemm_rs the inner dimension (K_loc = K / W) and C's rows.
struct GemmShape {
    int64_t m = 0, n = 0, k = 0;
};

// "MxNxK[,MxNxK...]"; raises naming the item it cannot read.
std::vector<GemmShape> parse_gemm_shapes(const std::string& list);

// The row of `op` ("ag_gemm" or "gemm_rs") at `shape`, every figure the slowest rank's median of `iters` timed runs.
// Collective: every rank calls it with the same arguments, in the same order. Checks the op's result against the
// sequence's before timing and raises on every rank when a rank's differs.
nlohmann::json crossnode_overlap_row(World& w, const std::string& op, const GemmShape& shape, int iters,
                                     cudaStream_t stream);

}  // namespace loom::bench
