// Plain data shared by the Ulysses sequence-parallel kernels (kernels/attention/ulysses.cuh, ulysses_o_gemm.cuh) and
// their host launchers (src/ops/attention/ulysses/). Compiles under the host compiler, nvcc and NVRTC.
//
// Head layout (docs/attention.md "Ulysses sequence parallelism"): the QKV projection's columns are [Q heads | K heads |
// V heads], D columns per head. Of W ranks, rank r owns q heads [r Hq / W, (r + 1) Hq / W) and kv heads
// [floor(r Hkv / W), + max(Hkv / W, 1)): with Hkv >= W (W dividing Hkv) its Hkv / W heads; with Hkv < W (Hkv dividing
// W) the one kv head its q heads attend to, replicated on the W / Hkv ranks that share it.
//
// Signals are 64-bit monotonic counters in the symmetric heap, zeroed once when the state is created and never reset;
// every value is a call number e (1, 2, ...) that is equal on every rank (the ops are collective), set (not added),
// and waited for with >= (wrap-safe).
#pragma once

#include "loom/config.hpp"

namespace loom::kernels::attention {

// Tile signals of the QKV GEMM (one per output tile of [S / W, (Hq + 2 Hkv) D]).
inline constexpr int kUlyssesMaxTiles = 1 << 16;
// Row chunks of a2a_o_gemm's gathered operand ([S / W, Hq D]), per source rank.
inline constexpr int kUlyssesMaxChunks = 1 << 12;
// Threads of the all-to-all kernels.
inline constexpr int kUlyssesThreads = 512;

// First kv head of rank r (of W) and how many it holds: see the top of the file.
LOOM_HOST_DEVICE constexpr int64_t ulysses_kv_first(int64_t r, int64_t hkv, int64_t world) { return r * hkv / world; }
LOOM_HOST_DEVICE constexpr int64_t ulysses_kv_count(int64_t hkv, int64_t world) {
    return hkv >= world ? hkv / world : 1;
}

// qkv_gemm_a2a's signals (UlyssesQkvState). 512 KiB + 64 bytes.
struct UlyssesQkvSignals {
    // tile[i] at rank p = the last call whose QKV tile i (m_block * num_n + n_block) rank p's GEMM stored in its
    // buffer (Fused: TileNotifyHooks, st.release.sys after the tile's TMA stores completed). Peers read it in place.
    uint64_t tile[kUlyssesMaxTiles];
    // ready[p] at rank d = the last call whose whole QKV product rank p holds (Sequential: p's all-to-all kernel,
    // which follows p's GEMM in stream order, sets it at every rank before reading).
    uint64_t ready[kMaxLocalPeers];
};

// a2a_o_gemm's signals (UlyssesOState). 256 KiB + 64 bytes.
struct UlyssesOSignals {
    // Cumulative count of this rank's push blocks that started (Fused: the GEMM's stream waits until every block is
    // resident, so the GEMM's spinning CTAs never keep them off the SMs).
    uint64_t started;
    uint64_t pad[7];
    // arrived[p][c] at rank d = the last call whose row chunk c of d's gathered operand rank p wrote (its columns
    // [p w, (p + 1) w), w = Hq / W x D).
    uint64_t arrived[kMaxLocalPeers][kUlyssesMaxChunks];
};

// ulysses_qkv_a2a: every rank p's QKV product [R, N] (R = S / W rows, N = (Hq + 2 Hkv) D, dense, this call's parity
// half of p's symmetric buffer) -> this rank's q, k, v: rows [p R, (p + 1) R) of slice s are columns
// [col_bytes[s], + width_bytes[s]) of p's rows. The work is split by the QKV GEMM's tiles (block_m x block_n in its
// grouped raster order; for Sequential any tiling) so that each piece waits for the one tile it reads.
struct UlyssesQkvParams {
    const uint8_t* qkv;       // this call's half of this rank's symmetric QKV buffer (peers' through symm_at)
    uint8_t* out[3];          // q, k, v of this rank: [S, width] each, leading dimension out_ld_bytes
    int64_t out_ld_bytes[3];  // row strides of q, k, v in bytes
    int64_t col_bytes[3];     // this rank's slice in a QKV row: first byte of its q, k, v columns
    int64_t width_bytes[3];   // bytes per row of each slice (Hq / W x D, kv count x D, times the element size)
    int64_t row_bytes;        // N x the element size (the QKV buffer is dense)
    UlyssesQkvSignals* sig;   // symmetric
    uint64_t epoch;           // this call's number
    int32_t rows_per_rank;    // R
    int32_t block_m;          // the tiling's rows
    int32_t block_n_bytes;    // the tiling's columns in bytes
    int32_t num_m, num_n;     // tiles of the tiling over [R, N]
    int32_t group_m;          // its raster group (>= 1)
    int32_t whole;            // 1 (Sequential): wait for ready[p] instead of p's tile signals
    int32_t pad;
};

// ulysses_o_a2a: this rank's attention output o [S, w] (its head slice, all rows) -> every rank d's gathered operand
// [R, W w] (this call's parity half of d's symmetric buffer): rows [d R, (d + 1) R) of o land in columns [me w, + w)
// there, in row chunks of chunk_rows; arrived[me][c] := epoch at d once chunk c landed.
struct UlyssesOParams {
    const uint8_t* o;       // this rank's o (anywhere on the device)
    uint8_t* gather;        // this call's half of this rank's symmetric gathered buffer (peers' through symm_at)
    UlyssesOSignals* sig;   // symmetric
    int64_t o_ld_bytes;     // o's row stride in bytes
    int64_t width_bytes;    // w x the element size
    uint64_t epoch;         // this call's number
    int32_t rows_per_rank;  // R
    int32_t chunk_rows;     // rows per chunk
    int32_t num_chunks;     // ceil(R / chunk_rows)
    int32_t wait_all;       // 1 (Sequential): the kernel ends once every rank's chunks landed here
};

// a2a_o_gemm's GEMM policy (UlyssesOGemmHooks): before a tile's operands load, wait until every rank's chunks that
// hold the tile's rows landed in this call.
struct UlyssesOHookArgs {
    const uint64_t* arrived;  // this rank's UlyssesOSignals::arrived[0] ([kMaxLocalPeers][kUlyssesMaxChunks], flat)
    uint64_t epoch;           // this call's number
    uint64_t timeout_ns;      // 0: unbounded
    int32_t chunk_rows;
    int32_t world;  // local world size
};

}  // namespace loom::kernels::attention
