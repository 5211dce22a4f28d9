// loom::gemm: C[M, N] = alpha * A[M, K] * B^T + beta * C + bias[N].
//
// A is [M, K] row-major; B is [N, K] row-major (the weight layout of a linear layer) or, with b_kn, [K, N]
// row-major. bf16 or fp16 inputs (both the same), fp32 accumulation, bf16 / fp16 / fp32 output. M, N, K are
// multiples of 8 (16-byte rows for TMA), tails of the tile shape are handled.
// fp8 e4m3 inputs (DType::F8E4M3, both A and B; Hopper only): B as [N, K] (wgmma reads 8-bit operands K-major
// only), K a multiple of 16. Per-tensor scales go into alpha (alpha = scale_a * scale_b) or the device scales below.
// The tensor cores add the e4m3 products with fewer than fp32's mantissa bits (no promotion to CUDA-core fp32 sums:
// cuBLASLt's CUBLASLT_MATMUL_DESC_FAST_ACCUM mode); docs/gemm.md "FP8".
//
// Stream-ordered; the kernel is compiled at first use by Loom's JIT and cached. On sm_90 the Hopper kernel runs
// (kernels/gemm/gemm.cuh: TMA + wgmma, warp-specialised, persistent); on sm_80 / sm_89, or with force_sm80, the
// mma.sync kernel (kernels/gemm/gemm_sm80.cuh).
//
// Config choice, without GemmOptions::config: per (M, N, K, types, B layout, epilogue kind, device, SM count) and
// process, the first of: the autotuner's winner (Settings::autotune, LOOM_AUTOTUNE=1: the candidate configs timed on
// the caller's stream, on a scratch output, the first time the key is seen — a one-off cost of seconds, JIT compiles
// included — and the winner persisted under the cache directory's tune/gemm/), a winner persisted by an earlier
// tuning run, or the analytic heuristic (deterministic). Tune with one process per GPU: ranks sharing a GPU would
// time each other's work. While the stream captures a graph nothing is timed. With log level debug
// (LOOM_LOG_LEVEL=debug) every call prints its config and where it came from to stderr.
//
// Split-K tail (GemmConfig::tail_splits >= 2, Hopper kernel without clusters): the last, partial wave's tiles are
// split along K over more CTAs and reduced through an fp32 workspace that loom::gemm owns per (device, stream)
// (docs/gemm.md "Split-K tail"). The result is bitwise reproducible run to run (a fixed summation order).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "loom/tensor.hpp"

namespace loom {

// Tile configuration of the Hopper kernel (ignored by the sm_80 path, whose tile is fixed).
struct GemmConfig {
    int block_m = 128;  // 64, 128 or 192: one, two or three consumer warpgroups (192: cluster_m 1)
    int block_n = 256;  // multiple of 16 in [16, 256] (<= 176 with block_m 192); multiple of 64 when B is [K, N]
    int block_k = 64;   // one 128-byte swizzle row of the inputs: 64 for bf16 / fp16, 128 for fp8 e4m3
                        // (the heuristic sets it from the input type; a config with another value is rejected)
    int stages = 4;
    int cluster_m = 1;      // 1, or 2: CTA pairs along M share the B tile by TMA multicast
    int group_m = 8;        // raster group (M-blocks swept together)
    int grid = 0;           // persistent CTAs; 0 = min(#tiles, #SMs) rounded to whole clusters
    int tail_splits = 1;    // split-K tail: >= 2 splits the tiles after the full waves that many ways along K
                            // (cluster_m 1 only; capped at the k-blocks); 1: every tile whole
    bool tma_store = true;  // epilogue through shared memory + TMA stores; needs beta == 0 (gemm() clears it)
    bool sm80 = false;      // use the mma.sync kernel
    // The weight-streaming kernel for decode-sized M (M <= 32, B as [N, K]; kernels/gemm/gemv.cuh): block_n = 64 rows
    // of B per CTA, stages = its ring of 256-byte K-slices, tail_splits = K-splits over the grid; the other fields
    // unused.
    bool gemv = false;
    // K-clusters: 2, 4 or 8 CTAs per tile split its K and sum the partials in distributed shared memory (one cluster
    // per tile, grid = tiles x cluster_k; K of at least cluster_k k-blocks; cluster_m 1, tail_splits 1, direct
    // stores); 1: off. Without a given config, loom::gemm runs them only where the autotuner picked them.
    int cluster_k = 1;
    int consumers() const { return block_m / 64; }
    std::string str() const;  // "sm90 128x256x64 st4 wg2 cluster1 g8 grid132 tail3" (tail only when split)
};

struct GemmOptions {
    float alpha = 1.f;
    float beta = 0.f;  // 0: C is not read (may hold anything)
    // Device scales: C = alpha x (*scale_a) x (*scale_b) x A B^T + ..., each one float in device memory, read when the
    // kernel runs (stream-ordered: a scale computed on the GPU needs no host synchronisation; fp8's per-tensor scales,
    // as torch._scaled_mm's). nullptr: 1.
    const float* scale_a = nullptr;
    const float* scale_b = nullptr;
    BufferView bias{};                   // [N] f32/bf16/f16; data == nullptr: no bias
    bool b_kn = false;                   // B given as [K, N] instead of [N, K]
    const GemmConfig* config = nullptr;  // overrides the heuristic and the autotuner (validated)
    bool force_sm80 = false;             // the portable kernel even on Hopper
};

// Raises loom::Error naming what was expected and what was given when the inputs or the config do not fit.
void gemm(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& opts = {},
          cudaStream_t stream = nullptr);

}  // namespace loom
