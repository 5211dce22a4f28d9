// Mixture-of-experts ops (docs/moe.md). Every op shares the "grouped rows" layout: a token-sorted matrix A[rows, K]
// split into G consecutive groups, group g owning rows [offsets[g], offsets[g + 1]) — offsets a DEVICE int32[G + 1],
// non-decreasing, offsets[0] = 0, written by the GPU and never read by the host — and multiplying with expert
// group_expert(g) = g % E (G = E: plain MoE; G = W x E: (source rank, expert) groups). Group sizes may be 0 and need
// not be multiples of any tile; rows that belong to no group (alignment padding) are never written.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "loom/ops/gemm.hpp"
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
    // fp8 per-128-block scales (DeepSeek-V3): A [rows, ceil(K / 128)] and B [E, ceil(N / 128), ceil(K / 128)] fp32.
    // Not supported yet: grouped_gemm raises loom::Error when either is given.
    const float* scale_a_blocks = nullptr;
    const float* scale_b_blocks = nullptr;
    // Tile config (Hopper kernel: block_m 64 or 128, block_n, stages, group_m, grid; cluster_m 1, tail_splits 1;
    // sm80 = true: the portable kernel). nullptr: the heuristic.
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
// kernels/moe/grouped_gemm.cuh; sm_80 / sm_89 or force_sm80: mma.sync, kernels/moe/grouped_gemm_sm80.cuh). Offsets
// outside [0, rows] are clamped (never an out-of-bounds write). Raises loom::Error naming the argument on bad input.
void grouped_gemm(const MatrixView& a, const MatrixView& b, int num_experts, const MatrixView& c,
                  const int32_t* group_offsets, int num_groups, cudaStream_t stream,
                  const GroupedGemmOptions& opts = {});

}  // namespace loom
