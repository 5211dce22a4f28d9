// Plain-data parameters of the GEMM kernels, shared by the device templates (gemm.cuh, gemm_sm80.cuh) and
// the host launcher (src/ops/gemm.cpp). Compiles under the host compiler, nvcc and NVRTC.
#pragma once

#include "loom/config.hpp"

namespace loom::kernels {

// Runtime arguments shared by the GEMM kernels.
struct GemmArgs {
    void* d;           // [m, n] row-major output (also the beta input)
    const void* bias;  // [n] or null
    int64_t ldd;       // elements
    int32_t m, n, k;
    float alpha, beta;
    int32_t group_m;  // raster group (M-blocks)
};

inline constexpr int kGemmBlockK = 64;  // one 128-byte swizzle row of bf16/fp16

// TMA-store epilogue of gemm_sm90_tma_wgmma: each consumer warpgroup stages its 64 output rows in slabs of
// 128 bytes per row (one 128B swizzle span) in two buffers; the host encodes D's tensor map with boxes of
// 64 rows x gemm_store_box_cols(sizeof(TOut)) columns.
inline constexpr uint32_t kGemmStoreBufBytes = 64u * 128u;
LOOM_HOST_DEVICE constexpr int gemm_store_box_cols(int out_elem_bytes) { return 128 / out_elem_bytes; }

// Dynamic shared memory of gemm_sm90_tma_wgmma: STAGES x (A + B tiles), the epilogue's staging buffers
// (2 per consumer warpgroup), the barriers, 1 KiB alignment slack.
LOOM_HOST_DEVICE constexpr uint32_t gemm_sm90_smem_bytes(int block_m, int block_n, int stages) {
    return static_cast<uint32_t>(stages) * static_cast<uint32_t>(block_m + block_n) * 128u +
           static_cast<uint32_t>(block_m / 64) * 2u * kGemmStoreBufBytes + static_cast<uint32_t>(stages) * 16u + 1024u;
}

// The sm_80 kernel's fixed tile: 128 x 128 x 32, 256 threads.
inline constexpr int kSm80BlockM = 128, kSm80BlockN = 128, kSm80BlockK = 32, kSm80Threads = 256;

LOOM_HOST_DEVICE constexpr uint32_t gemm_sm80_smem_bytes(int stages) {
    return static_cast<uint32_t>(stages) * (kSm80BlockM + kSm80BlockN) * kSm80BlockK * 2u;
}

}  // namespace loom::kernels
