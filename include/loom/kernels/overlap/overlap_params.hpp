// Plain data shared by the overlapped GEMM kernels (kernels/overlap/{ag_gemm,gemm_rs,gemm_rs_pull,gemm_ar}.cuh) and
// their host launchers (src/ops/overlap/). Compiles under the host compiler, nvcc and NVRTC.
//
// Signal conventions (docs/overlap.md): every counter is a 64-bit monotonic value in the symmetric heap, zeroed
// once when the algorithm's state is created and never reset. Targets are computed on the host from per-algorithm
// call counts that are equal on every rank (the ops are collective: every rank makes the same calls in the same
// order with the same shapes and options), and compared wrap-safely (GE) — except gemm_ar's fused epilogue and
// gemm_rs's with the SM transport, whose call numbers live on the device (`launches`), so that their calls replay
// from a CUDA graph.
#pragma once

#include "loom/config.hpp"
#include "loom/lang/launch_epoch.cuh"
#include "loom/tile/tile_order.hpp"

namespace loom::kernels::overlap {

// Tile signals per algorithm: one per output tile (m_block * num_n + n_block) of the local GEMM.
inline constexpr int kMaxTileSignals = 1 << 16;
// Most blocks a communication kernel of an overlapped op may use.
inline constexpr int kMaxCommBlocks = 64;
// Threads of a gemm_rs_scatter_reduce block.
inline constexpr int kScatterReduceThreads = 384;

// ---- symmetric signals: one struct per algorithm, holding the fields it uses --------------------------------------
// Each lives in the symmetric heap, one per World and algorithm (its state in src/ops/overlap/). Fields are written by
// the named producers only.

// ag_gemm, copy-engine and SM producers (kernels/overlap/ag_gemm.cuh). 136 bytes.
struct AgGatherSignals {
    // chunk[r] at rank d: cumulative count of rank r's chunk pieces that landed in d's gather buffer (the SM producer
    // adds 1 per block, the copy engine sets the new total).
    uint64_t chunk[kMaxLocalPeers];
    // ready[r] at rank d: the last call for which rank r's gather buffer is free (its previous GEMM finished).
    uint64_t ready[kMaxLocalPeers];
    // SM producer blocks of this rank that are running (the GEMM's stream waits for them: the GEMM never occupies the
    // SMs they need).
    uint64_t started;
};

// ag_gemm, direct producer (ag_gemm_direct_stage). 128 bytes.
struct AgDirectSignals {
    // chunk[r] at rank d: cumulative count of the blocks of rank r's stage kernels that copied their share of r's
    // shard into r's staging half.
    uint64_t chunk[kMaxLocalPeers];
    // read_done[r] at rank d: the last call whose GEMM on rank r finished (it read d's staging half of that call; d
    // overwrites the half two calls later only once every peer is past it).
    uint64_t read_done[kMaxLocalPeers];
};

// gemm_rs, scatter-reduce (TileNotifyHooks + gemm_rs_scatter_reduce). 4.5 MiB.
struct RsScatterSignals {
    // freed[r] at rank d: cumulative count of rank r's scatter-reduce blocks that finished reading r's scratch (d may
    // then push the next call's tiles into it).
    uint64_t freed[kMaxLocalPeers];
    // tile[i] = the call number whose tile i the local GEMM has stored (TMA stores complete).
    uint64_t tile[kMaxTileSignals];
    // tile_in[r][i] at rank d = the last call whose rows of output tile i owned by d rank r pushed into d's scratch
    // (set, not added: a tile index that gets no push in some call, because that call's shape made different tiles,
    // must not fall behind).
    uint64_t tile_in[kMaxLocalPeers][kMaxTileSignals];
};

// gemm_rs, fused epilogue with the SM transport (RsAccHooks, launches set). 4 MiB + 128 bytes.
struct RsFusedSmSignals {
    // The kernel's call number, kept and advanced on the device (lang/launch_epoch.cuh), so a replayed CUDA graph
    // numbers its calls anew. This rank's only.
    lang::LaunchEpoch launches;
    uint64_t pad[14];
    // tile_in[q][i] at rank d = the last call whose tile i of d's rows rank q pushed into d's scratch.
    uint64_t tile_in[kMaxLocalPeers][kMaxTileSignals];
};

// gemm_rs, fused epilogue with the copy-engine transport (RsAccHooks, outbox set). 4.5 MiB.
struct RsFusedCeSignals {
    // stored[lead] = cumulative count of the tiles of chunk `lead` the local GEMM stored into its outbox (the host's
    // copy stream waits for each whole chunk).
    uint64_t stored[kMaxTileSignals];
    // tile_in[q][lead] at rank d = the last call whose chunk `lead` of d's rows rank q's copy engine copied into d's
    // scratch.
    uint64_t tile_in[kMaxLocalPeers][kMaxTileSignals];
};

// gemm_rs, fused pull (RsPullHooks). 4 MiB.
struct RsPullSignals {
    // tile_in[q][i] at rank d = the last call whose tile i of d's rows rank q stored (and published) in its partial.
    uint64_t tile_in[kMaxLocalPeers][kMaxTileSignals];
};

// gemm_ar, reduce kernel (TileNotifyHooks + gemm_ar_reduce). 1 MiB + 128 bytes.
struct ArReduceSignals {
    // tile[i] = the call number whose tile i the local GEMM has stored (TMA stores complete); peers read it.
    uint64_t tile[kMaxTileSignals];
    // Two-shot: reduced[i] = the call number whose tile i this rank (its owner) summed back into its partial; peers
    // read it.
    uint64_t reduced[kMaxTileSignals];
    // The tiles' claim counter (this rank's; its two reduce launches of a call claim from it): never reset, each
    // call's claims are its value minus ArParams::claim_base.
    uint64_t claims;
    uint64_t pad[15];
};

// gemm_ar, fused epilogue (ArEpilogueHooks). 4 MiB + 128 bytes.
struct ArFusedSignals {
    // The kernel's call number, kept and advanced on the device (lang/launch_epoch.cuh). This rank's only.
    lang::LaunchEpoch launches;
    uint64_t pad[14];
    // tile_in[q][2 i + warpgroup] at rank d = the last call whose part (tile i, warpgroup) rank q pushed into d's
    // receive buffer.
    uint64_t tile_in[kMaxLocalPeers][kMaxTileSignals];
};

// ---- GEMM hook arguments (the hooks in the .cuh files wrap them; the host passes these bytes) -----------------

// A CUtensorMap's bytes (ptx::TmaDescriptor on the device), for hook arguments that carry one.
struct alignas(64) TensorMapBytes {
    uint64_t opaque[16];
};

// AllGather+GEMM: wait for the chunks that hold a tile's rows; rank-rotated order (own rows first).
struct AgGemmHookArgs {
    const uint64_t* chunk;  // this rank's AgGatherSignals::chunk or AgDirectSignals::chunk
    uint64_t target;        // chunk[r] >= target: rank r's rows of this call are in the gather buffer
    uint64_t timeout_ns;    // 0: unbounded
    int32_t rows_per_rank;  // M / world
    int32_t shift_m;        // first M-block of this rank's rows
    // own_local != 0: this rank's own rows [own_row0, own_row0 + rows_per_rank) are read in place from its A shard
    // through a_local (same box as the gather map; rows_per_rank a multiple of BLOCK_M) and never waited for; the
    // gather buffer's copy of them is then not made.
    int32_t own_local;
    int32_t own_row0;
    // direct != 0 (the direct producer, ranks sharing a GPU): the rows of every other rank r are read in place from
    // r's staging copy of its shard through a_peer[r] (same box as the gather map; rows_per_rank a multiple of
    // BLOCK_M, and own_local set), after chunk[r] >= target; there is no gather buffer.
    int32_t direct;
    int32_t world;  // local world size (the a_peer maps in use)
    TensorMapBytes a_local;
    TensorMapBytes a_peer[kMaxLocalPeers];
};

// GEMM+RS / GEMM+AR: publish each stored tile; order rotated by shift_m M-blocks.
struct TileNotifyHookArgs {
    uint64_t* tile;  // this rank's RsScatterSignals::tile or ArReduceSignals::tile
    uint64_t epoch;  // value stored for this call
    int32_t num_n;   // N-blocks of the GEMM
    int32_t shift_m;
};

// GEMM+RS, fused epilogue (RsAccHooks, kernels/gemm_rs.cuh). Every M-block belongs to one rank's rows
// (rows_per_rank is a multiple of BLOCK_M). The scratch is this call's parity half of the op's symmetric buffer:
// W - 1 slots (slot_bytes each): sender q's is slot q, or q - 1 above this rank (rs_slot_of); it holds the tiles q
// pushed here, tile (m_block - me * blocks_per_rank, n_block) at rs_slot_tile(...) * BLOCK_M * BLOCK_N * sizeof(TOut),
// each tile as its warpgroups' parts (64 x BLOCK_N each) in the accumulators' fragment order (see RsAccHooks).
LOOM_HOST_DEVICE inline int64_t rs_slot_of(int q, int d) { return q < d ? q : q - 1; }

// Tile index inside a slot of band-relative M-block `rel` and N-block `n` (band of bpr M-blocks, num_n N-blocks):
// groups of `group` M-blocks (the band's last may be shorter), each group column-major — the GEMM's raster order
// inside a group when `group` is its group_m and divides bpr —, groups one after the other. So a run of consecutive
// columns of one group, which the GEMM completes in that order, is contiguous: the copy-engine transport's chunk.
LOOM_HOST_DEVICE inline int64_t rs_slot_tile(int32_t rel, int32_t n, int32_t bpr, int32_t num_n, int32_t group) {
    const int32_t first = rel / group * group;
    const int32_t rows = bpr - first < group ? bpr - first : group;
    return static_cast<int64_t>(first) * num_n + static_cast<int64_t>(n) * rows + (rel - first);
}
// The copy-engine chunk of that tile (columns [n0, n0 + chunk_n) of its group, n0 = n rounded down to a multiple of
// chunk_n), named by its first tile's slot index.
LOOM_HOST_DEVICE inline int64_t rs_chunk_lead(int32_t rel, int32_t n, int32_t bpr, int32_t num_n, int32_t group,
                                              int32_t chunk_n) {
    return rs_slot_tile(rel / group * group, n / chunk_n * chunk_n, bpr, num_n, group);
}

// The call number e: with `launches` (the SM transport) the device's (RsFusedSmSignals::launches), and
// this call's half is scratch + (e % 2) * half_stride, so that a replayed CUDA graph numbers its calls anew; without
// (the copy-engine transport, whose stream operations carry the host's number) `epoch`, and `scratch` is the half.
struct RsFusedHookArgs {
    uint8_t* scratch;   // this rank's scratch (symmetric): both halves, or this call's half (see above)
    uint64_t* tile_in;  // this rank's Rs{FusedSm,FusedCe}Signals::tile_in[0] ([kMaxLocalPeers][kMaxTileSignals])
    lang::LaunchEpoch* launches;  // this rank's RsFusedSmSignals::launches, or null
    int64_t half_stride;          // offset of parity half 1 (with `launches`)
    int64_t heap_bytes;           // Ctx::heap_size: rank d's copy of symmetric p is p + (d - me) * heap_bytes
    int64_t slot_bytes;           // blocks_per_rank * num_n tiles
    uint64_t epoch;               // without `launches`: this call's number, the value of tile_in signals
    uint64_t timeout_ns;          // bound of the waits for peers' tiles (0: unbounded)
    int32_t me, world;            // local rank and local world size
    int32_t blocks_per_rank;      // (M / W) / BLOCK_M
    int32_t num_n;                // N-blocks
    int32_t shift_m;              // first M-block of rank me + 1: own rows last
    int32_t rows_per_rank;        // M / W
    int32_t group;                // M-blocks per group of the slot layout (rs_slot_tile): the GEMM's group_m
    // Copy-engine transport (RsTransport::CopyEngine; outbox == nullptr: the epilogue stores peers' tiles over
    // NVLink itself). Chunk: chunk_n consecutive columns of one group of a band (rs_chunk_lead), named by
    // band * blocks_per_rank * num_n + its lead (`lead` below). A peer's tile is stored into this rank's local outbox
    // instead, band d's slot at d * slot_bytes, and stored[lead] += 1 (release, gpu) once the stores are performed;
    // the host's copy-engine stream waits for each whole chunk (stored[lead] at its cumulative target), copies it
    // into our slot of the owner's scratch and sets tile_in[me][lead] := epoch there. An own tile waits for
    // tile_in[q][lead of its chunk] of every peer q.
    int32_t chunk_n;   // columns per copy-engine chunk (>= 1)
    uint8_t* outbox;   // local [world][slot_bytes]
    uint64_t* stored;  // this rank's RsFusedCeSignals::stored, indexed by lead (cumulative counts; host targets)
};

// GEMM+RS, fused pull (RsPullHooks, kernels/gemm_rs_pull.cuh). Every M-block belongs to one rank's rows (rows_per_rank
// a multiple of BLOCK_M). The GEMM stores its whole partial product [M, N] (TOut) into this call's parity half of the
// op's symmetric buffer with the plain epilogue and publishes each tile to the rank that owns its rows:
// tile_in[me][m_block * num_n + n_block] := epoch there. The producer warpgroup's spare warps of every CTA pull the
// W copies of this rank's own tiles, as they become ready, and store their fp32 sum (rank order) into C.
struct RsPullHookArgs {
    uint8_t* partial;         // this call's parity half of this rank's symmetric partial [M, N] (row stride n)
    uint8_t* out;             // C [M / W, N], leading dimension ldc (elements)
    uint64_t* tile_in;        // this rank's RsPullSignals::tile_in[0] ([kMaxLocalPeers][kMaxTileSignals], flat)
    int64_t heap_bytes;       // Ctx::heap_size: rank d's copy of symmetric p is p + (d - me) * heap_bytes
    int64_t ldc;              // C's row stride (elements)
    uint64_t epoch;           // this call's number: the value of tile_in signals
    uint64_t timeout_ns;      // bound of gemm_rs_pull_finish's waits for a tile (0: unbounded)
    int32_t me, world;        // local rank and local world size
    int32_t blocks_per_rank;  // (M / W) / BLOCK_M
    int32_t num_n;            // N-blocks
    int32_t n;                // N (the last N-block may be partial)
    int32_t group;            // M-blocks per raster group inside a band (divides blocks_per_rank)
    // Units (own tile j, part p: u = j W + p) the GEMM's reducers left to gemm_rs_pull_finish (local, zeroed once):
    // [0, 2) the counts of calls of parity 0 / 1, [4 + parity * kMaxTileSignals, ...) their unit lists.
    uint32_t* leftover;
};
// Words of RsPullHookArgs::leftover.
inline constexpr int64_t kRsPullLeftoverWords = 4 + 2 * int64_t(kMaxTileSignals);
// Threads of a gemm_rs_pull_finish block.
inline constexpr int kRsPullFinishThreads = 256;

// The fused pull's tile order: the bands (ranks' rows) interleaved tile by tile — linear index l is tile l / W of
// band l % W in that band's grouped raster (group M-blocks, `group` dividing bpr) — so that every rank completes
// every band's tiles at the same pace and an owner can reduce its tiles all along the GEMM, not at its end. Every
// rank walks the same order: tile j of band d is linear d + W j everywhere.
LOOM_HOST_DEVICE inline void rs_pull_tile_order(int32_t linear, int32_t world, int32_t bpr, int32_t num_n,
                                                int32_t group, int32_t& m_block, int32_t& n_block) {
    const int32_t band = linear % world;
    tile::grouped_order(linear / world, tile::TileGrid{bpr, num_n, group}, m_block, n_block);
    m_block += band * bpr;
}

// ---- communication kernels -----------------------------------------------------------------------------------

// ag_gemm_push: this rank's A shard -> every rank's gather buffer (rows [me * rows_per_rank, ...)).
struct AgPushParams {
    const void* a_local;   // [rows_per_rank, K] dense
    void* gather;          // symmetric [M, K] dense
    AgGatherSignals* sig;  // symmetric
    uint64_t chunk_bytes;  // rows_per_rank * K * element size
    uint64_t epoch;        // this call (ready signals)
    uint32_t stage_bytes;  // TMA data path staging
    uint32_t stages;
};

// ag_gemm_direct_stage (the direct producer, ranks sharing a GPU): this rank's shard -> its own staging half.
struct AgDirectParams {
    const void* shard;     // [rows_per_rank, K] dense: this rank's A
    void* staging;         // this call's half of the op's symmetric staging (this rank's address)
    AgDirectSignals* sig;  // symmetric
    uint64_t bytes;        // rows_per_rank * K * element size
    uint64_t epoch;        // this call (1, 2, ...)
};

// gemm_rs_scatter_reduce: tiles of the local partial product -> the scratch of the rank that owns their rows;
// this rank's own tiles reduced (fp32) as soon as every peer's copy of them landed.
struct RsParams {
    const void* partial;    // [m, n] dense, written by the GEMM of this call
    void* scratch;          // symmetric [world][rows_seg][n]: slot r holds rank r's rows destined to this rank
    void* out;              // [rows_seg, n], leading dimension ldo
    RsScatterSignals* sig;  // symmetric
    int64_t ldo;
    int32_t m, n, rows_seg;  // rows_seg = m / world
    int32_t block_m, block_n, group_m, shift_m;
    uint64_t epoch;        // this call's number: the value of tile and tile_in signals
    uint64_t free_target;  // freed[r] >= free_target: rank r finished reading the previous call's scratch
};

// gemm_ar_reduce: pull reduction of every rank's partial tiles as they are stored, one-shot (every rank sums every
// tile) or two-shot (each tile's owner sums it back into its partial; the others copy it from there).
// Threads of a gemm_ar_reduce block.
inline constexpr int kArReduceThreads = 256;

struct ArParams {
    void* partial;         // symmetric [m, n] dense (this call's parity buffer); two-shot: owned tiles summed in place
    void* out;             // [m, n], leading dimension ldo
    const uint64_t* tile;  // this rank's ArReduceSignals::tile (peers' copies are read through symm_at)
    uint64_t* reduced;     // this rank's ArReduceSignals::reduced (two-shot)
    uint64_t* claims;      // this rank's ArReduceSignals::claims
    // The counter's value when this call's first claim is made: the previous calls' claims, one per tile and one
    // (the last, past the tiles) per block launched.
    uint64_t claim_base;
    int64_t ldo;
    int32_t m, n, block_m, block_n, group_m;
    int32_t two_shot;  // 0: one-shot, 1: two-shot
    uint64_t epoch;
};

// GEMM+AR, fused epilogue (ArEpilogueHooks, kernels/gemm_ar.cuh). The receive buffer is this call's parity half of
// the fused epilogue's own symmetric buffer (its state: buffer, ArFusedSignals): W - 1 slots (slot_bytes each),
// sender q's at rs_slot_of(q, me); each holds every output tile q pushed here, tile i (m_block * num_n + n_block) at i
// * BLOCK_M * BLOCK_N * sizeof(TOut), as its 128B-swizzled 8 KiB staging slabs, warpgroup-major. Signals: tile_in[q][2
// * i + warpgroup] at rank d = the last call whose part (tile i, warpgroup) rank q pushed into d's receive buffer. No
// host per-call value: the call number e comes from `launches` on the device (every CTA reads it at its start), and the
// call's half of the receive buffer is recv + (e % 2) * half_stride, so the same arguments serve every call and every
// replay of a captured one.
struct ArFusedHookArgs {
    uint8_t* recv;      // this rank's receive buffer (symmetric): two parity halves
    uint64_t* tile_in;  // this rank's ArFusedSignals::tile_in[0] ([kMaxLocalPeers][kMaxTileSignals], flat)
    lang::LaunchEpoch*
        launches;         // this rank's ArFusedSignals::launches: the value of tile_in signals is the call number
    int64_t half_stride;  // offset of parity half 1
    int64_t heap_bytes;   // Ctx::heap_size: rank d's copy of symmetric p is p + (d - me) * heap_bytes
    int64_t slot_bytes;   // num_m * num_n tiles
    uint64_t timeout_ns;  // bound of the waits for peers' parts (0: unbounded)
    int32_t me, world;    // local rank and local world size
    int32_t num_n;        // N-blocks
    int32_t pad;
};

// The GEMM hooks' tile order (tile::rotated_order: grouped raster rotated by shift_m M-blocks, 0 <= shift_m <
// num_m), for the host and the communication kernels that follow the GEMM tile by tile.
LOOM_HOST_DEVICE inline void overlap_tile_order(int32_t linear, int32_t num_m, int32_t num_n, int32_t group_m,
                                                int32_t shift_m, int32_t& m_block, int32_t& n_block) {
    tile::rotated_order(linear, tile::TileGrid{num_m, num_n, group_m}, shift_m, m_block, n_block);
}

}  // namespace loom::kernels::overlap
