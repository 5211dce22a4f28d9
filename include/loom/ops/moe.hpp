// Mixture-of-experts ops (docs/moe.md). Every op shares the "grouped rows" layout: a token-sorted matrix A[rows, K]
// split into G consecutive groups, group g owning rows [offsets[g], offsets[g + 1]) — offsets a DEVICE int32[G + 1],
// non-decreasing, offsets[0] = 0, written by the GPU and never read by the host — and multiplying with expert
// group_expert(g) = g % E (G = E: plain MoE; G = W x E: (source rank, expert) groups). Group sizes may be 0 and need
// not be multiples of any tile; rows that belong to no group (alignment padding) are never written.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "loom/ops/gemm.hpp"
#include "loom/runtime/world.hpp"
#include "loom/tensor.hpp"

namespace loom {

// ---- grouped_gemm ---------------------------------------------------------------------------------------------------

enum class MoeActivation {
    None,
    SwiGLU,  // C has N / 2 columns: C[:, j] = silu(X[:, j]) * X[:, N / 2 + j] of the product X (gate columns first,
             // then up columns); N a multiple of 16
    GeLU,    // C = gelu(X), erf form (torch.nn.functional.gelu's default)
};

enum class BLayout {
    NK,  // B_e is [N, K] row-major (a linear layer's weight); B stacked as [E * N, K]
    KN,  // B_e is [K, N] row-major; B stacked as [E * K, N]
};

struct GroupedGemmOptions {
    BLayout b_layout = BLayout::NK;
    MoeActivation activation = MoeActivation::None;
    // The products are scaled by alpha x (*scale_a) x scale_b[e] before the activation; null scales are 1. Device
    // memory, read when the kernel runs (no host synchronisation). Any input type; fp8's per-tensor scales:
    float alpha = 1.f;
    const float* scale_a = nullptr;  // 1 float: A's scale
    const float* scale_b = nullptr;  // E floats: expert e's weight scale
    // fp8 per-128-block scales (DeepSeek-V3), both or neither: A [rows, ceil(K / 128)] (row r's scale of K block kb
    // at r x ceil(K / 128) + kb; rows follow A's rows, i.e. the grouped layout) and B [E, ceil(N / 128), ceil(K / 128)]
    // fp32, device memory. The product is sum over kb of (A_kb B_kb^T) x sa[r, kb] x sb[e, n / 128, kb] in fp32,
    // then the scales above. f8e4m3 inputs only (either kernel); SwiGLU: N / 2 a multiple of 128.
    const float* scale_a_blocks = nullptr;
    const float* scale_b_blocks = nullptr;
    // Tile config (Hopper kernel: block_m 64 or 128, block_n, stages, group_m, grid; cluster_m 1, tail_splits 1;
    // tma_store: the epilogue staged through shared memory with 16-byte stores (the heuristic's), false: pair stores
    // from registers; sm80 = true: the portable kernel). nullptr: the heuristic.
    const GemmConfig* config = nullptr;
    int num_sms = 0;   // SMs the persistent grid may use; 0: the device's
    int max_rows = 0;  // upper bound on offsets[G] for planning the grid (and the heuristic's rows per group); 0: rows
    bool force_sm80 = false;  // the portable kernel even on Hopper
};

// C_g = act(alpha x scale_a x scale_b[e] x A_g x B_e^T) for every group g (rows [offsets[g], offsets[g + 1]) of A and
// C), e = g % num_experts. a: [rows, K] bf16 / fp16 / f8e4m3; b: the E experts stacked as one MatrixView of [E * N, K]
// (NK) or [E * K, N] (KN), of A's dtype (f8e4m3: NK only); c: [rows, N] (N / 2 with SwiGLU) bf16 / fp16 / f32. K and N
// multiples of 8 (f8e4m3: K a multiple of 16); rows of C outside every group are left untouched. Stream-ordered, no
// host synchronisation; the kernel is compiled at first use by Loom's JIT (sm_90: the persistent TMA + wgmma kernel,
// kernels/moe/grouped_gemm.cuh; sm_80 / sm_89 or force_sm80: mma.sync, kernels/moe/grouped_gemm_sm80.cuh, which
// converts f8e4m3 to bf16 exactly in shared memory). Offsets outside [0, rows] are clamped (never an out-of-bounds
// write). Raises loom::Error naming the argument on bad input.
void grouped_gemm(const MatrixView& a, const MatrixView& b, int num_experts, const MatrixView& c,
                  const int32_t* group_offsets, int num_groups, cudaStream_t stream,
                  const GroupedGemmOptions& opts = {});

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

// ---- TP-MoE -------------------------------------------------------------------------------------------------------
//
// Tensor-parallel MoE layers on one node (docs/moe.md): every rank holds an N-slice of every expert. Collective over
// the World (same order, shapes and options on every rank); work is enqueued on `stream`, the host is not
// synchronised (except when a state is created or grows). Buffers, state: the ops' own, in the symmetric heap, kept
// until release_moe_state(world).
//
//   ag_moe   out = grouped GEMM of all_gather(x)'s routed rows with w_up's slices: the up projection
//   moe_rs   out[T_loc, H] = reduce_scatter(top-k reduce(grouped GEMM of rows with w_down's slices)): the down
//            projection, each rank receiving its own tokens
//   moe_ar   out[T, H] = all_reduce(top-k reduce(grouped GEMM of rows with w_down's slices)): the down projection of a
//            decode batch every rank holds whole

enum class TpMoeAlgo {
    Auto,        // Fused where it applies (ag_moe / moe_rs: world > 1, one node, sm_90, not capturing) for calls of
                 // 2048 routed rows (gathered tokens x top-k) or more, else Sequential
    Sequential,  // Loom's collectives (all_gather / reduce_scatter / all_reduce) around the routing utilities and
                 // grouped_gemm: no overlap
    Fused,       // ag_moe: each rank pushes its own tokens' routed rows to every rank while the grouped GEMM consumes
                 // them as they arrive (a tile waits for the source ranks of its rows); moe_rs: the top-k reduce and
                 // send of a source rank's tokens, in chunks, runs beside the grouped GEMM as soon as that rank's tiles
                 // are stored, and a full grid after the GEMM sends the rest; moe_ar (one-shot): after the GEMM, one
                 // kernel reduces every token's top-k rows and pushes the sums (out's type) to every rank. Then the
                 // stream waits for every rank's sums and a kernel adds them in rank order. Auto never picks it for
                 // moe_ar
};
const char* to_string(TpMoeAlgo a);

struct TpMoeOptions {
    TpMoeAlgo algo = TpMoeAlgo::Auto;
    GroupedGemmOptions gemm{};  // the grouped GEMM's options (ag_moe: e.g. activation = SwiGLU); max_rows is set by
                                // the op
    int comm_sms = 0;  // moe_rs Fused: reduce blocks beside the GEMM; 0: sized by the work that becomes ready while the
                       // GEMM runs (at most a quarter of the SMs), none where ranks share a GPU or the routing is
                       // expert-major; < 0: none (the GEMM takes every SM, the reduce runs after it); at most the
                       // usable SMs - 1; > 0 needs a source-major routing
};

// x: [T_loc, H] this rank's tokens; topk_idx, topk_weights: [T_loc, k] (device int32 / fp32; weights may be null:
// 1); w_up: E experts' N-slices stacked, [E x N_loc, H] (GroupedGemmOptions::b_layout NK; KN: [E x H, N_loc]);
// routing: a routing of shape {W x T_loc, k, E, ranks, align} (moe_routing_view), which the op fills for the gathered
// tokens (rank r's tokens are rows [r x T_loc, ...) of the gathered x): ranks 1, expert-major (group e: every rank's
// tokens routed to expert e; each expert's weights read once per tile of its rows: the fastest measured), or ranks
// W, source-major (group r x E + e: rank r's tokens routed to e; moe_rs's side blocks need it); every algorithm runs
// on either;
// out: [>= routing max_rows, N_loc] (N_loc / 2 with SwiGLU), x's dtype or fp32 — the grouped rows.
void ag_moe(World& world, const MatrixView& x, const int32_t* topk_idx, const float* topk_weights,
            const MatrixView& w_up, const MoeRouting& routing, const MatrixView& out, cudaStream_t stream,
            const TpMoeOptions& opts = {});
// rows: [>= routing max_rows, K_loc] (ag_moe's out after the activation); w_down: [E x H, K_loc] (NK) — this rank's
// K-slice of every expert's down weight; routing: ag_moe's; out: [T_loc, H] this rank's tokens, bf16 / fp16 / fp32.
// The partial products are reduced over slots in fp32 (routing.weights), then over ranks in out's type.
void moe_rs(World& world, const MatrixView& rows, const MatrixView& w_down, const MoeRouting& routing,
            const MatrixView& out, cudaStream_t stream, const TpMoeOptions& opts = {});
// As moe_rs for a batch every rank holds whole: routing of shape {T, k, E} (ranks 1, moe_route on the same ids on
// every rank); out: [T, H], the same on every rank (Fused: the same bits).
void moe_ar(World& world, const MatrixView& rows, const MatrixView& w_down, const MoeRouting& routing,
            const MatrixView& out, cudaStream_t stream, const TpMoeOptions& opts = {});

// Frees the TP-MoE ops' state on this World (collective; synchronises the device); the expert-parallel ops' state
// stays (release_moe_ep_state, release_ep_ll_state).
void release_moe_state(World& world);

}  // namespace loom
