// Mixture-of-experts ops (docs/moe.md): the grouped GEMM, the routing utilities and the tensor-parallel MoE layers.
//
// Layout every MoE op shares ("grouped rows"): a token-sorted matrix A[rows, K] split into G consecutive groups;
// group g owns rows [offsets[g], offsets[g + 1]) (offsets: device int32[G + 1], non-decreasing, offsets[0] = 0,
// written by the GPU and never read by the host) and multiplies with expert g % E. G = E is plain MoE; G = W x E are
// the (source rank, expert) groups of the TP-MoE ops: group r * E + e holds rank r's tokens routed to expert e.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "loom/runtime/world.hpp"
#include "loom/tensor.hpp"

namespace loom {

// ---- routing ----------------------------------------------------------------------------------------------------
//
// From top-k routing results (topk_idx[T, k], int32 expert ids on the device) to the grouped-rows layout and back,
// with no host synchronisation. Entry (t, s) (token t, slot s) belongs to group (t / tokens_per_rank) * E +
// topk_idx[t, s]; rows of a group are in entry order (t, then s), so the layout is deterministic. With align > 1
// each group's size is rounded up to a multiple of align (the padding rows carry no token: permute writes zeros
// there, the reduce never reads them).

struct MoeRoutingShape {
    int tokens = 0;       // T (for the TP ops: the gathered tokens, W x T_loc)
    int topk = 0;         // k, 1..32, <= num_experts
    int num_experts = 0;  // E
    int ranks = 1;        // source ranks: tokens [r * T / ranks, (r + 1) * T / ranks) are rank r's; G = ranks x E
    int align = 1;        // group sizes rounded up to a multiple of this (e.g. the GEMM's BLOCK_M)

    int num_groups() const { return ranks * num_experts; }
    int64_t entries() const { return static_cast<int64_t>(tokens) * topk; }
    // Rows the layout may take: T x k plus each group's padding.
    int64_t max_rows() const { return entries() + static_cast<int64_t>(num_groups()) * (align - 1); }
};

// One routing's device arrays (carved from one buffer by moe_routing_view; written by moe_route).
struct MoeRouting {
    MoeRoutingShape shape;
    int32_t* offsets = nullptr;     // [G + 1] row offsets of the groups (padded sizes)
    int32_t* counts = nullptr;      // [G]     rows with a token per group (unpadded)
    int32_t* dest_rows = nullptr;   // [T, k]  row of entry (t, s)
    int32_t* row_tokens = nullptr;  // [max_rows] token of each row; -1 for padding and unused rows
    float* weights = nullptr;       // [T, k]  the routing weights (moe_route's copy; 1 where none were given)
    void* workspace = nullptr;      // the scan's scratch
};

// Bytes of the buffer a routing of `shape` needs (device memory, 256-byte aligned). Raises on a bad shape.
std::size_t moe_routing_bytes(const MoeRoutingShape& shape);
// The routing's arrays in `buffer` (device memory of at least moe_routing_bytes(shape) bytes, 256-byte aligned).
MoeRouting moe_routing_view(const MoeRoutingShape& shape, void* buffer, std::size_t bytes);

// Fills `routing` from topk_idx [T, k] (device int32) and topk_weights [T, k] (device fp32, or null: weights 1).
// An id outside [0, E) traps the kernel with a "bad index ... moe_route topk_idx" diagnostic (the next CUDA call
// raises loom::Error with it); the context is then lost, so check ids on the host where they are there.
void moe_route(const int32_t* topk_idx, const float* topk_weights, const MoeRouting& routing, cudaStream_t stream);

// rows[r] = x[row_tokens[r]] for the layout's rows (zeros for padding rows); rows past offsets[G] are untouched.
// x: [T, H]; rows: [>= max_rows, H], same dtype (any). Row bytes a multiple of 16 move 16 bytes at a time.
void moe_permute(const MatrixView& x, const MoeRouting& routing, const MatrixView& rows, cudaStream_t stream);

// y[t] = sum over slots s of routing.weights[t, s] * rows[dest_rows[t, s]] (fp32 sum in slot order), t < T.
// rows: [>= offsets[G], H] bf16 / fp16 / fp32; y: [T, H] bf16 / fp16 / fp32.
void moe_topk_reduce(const MatrixView& rows, const MoeRouting& routing, const MatrixView& y, cudaStream_t stream);

}  // namespace loom
