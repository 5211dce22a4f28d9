// Overlapped GEMM + collective ops for tensor-parallel layers on one node (docs/overlap.md):
//
//   ag_gemm   C[M, N_loc] = all_gather(A)[M, K] * B[N_loc, K]^T           A: [M / W, K] per rank (a row shard)
//   gemm_rs   C[M / W, N] = reduce_scatter over ranks of A[M, K_loc] * B[N, K_loc]^T   (rows split by rank)
//   gemm_ar   C[M, N]     = all_reduce over ranks of A[M, K_loc] * B[N, K_loc]^T       (any M)
//
// Every op is collective over the World (every rank calls it in the same order with the same shapes, dtypes and
// options) and enqueues its work on `stream` without synchronising the host. A, B: bf16 / fp16, or fp8 e4m3 (K a
// multiple of 16); C: bf16 / fp16 / fp32; fp32 accumulation and sums; B is [N, K] (a linear layer's weight). Products
// are scaled by alpha x scale_a x scale_b (device floats read when the op runs; null: 1) — gemm_rs / gemm_ar: each
// rank's own partial product. Buffers and signals live in the symmetric heap, allocated on an algorithm's first call
// and kept per World until release_overlap_state(). Needs sm_90. Across nodes the Sequential algorithms and ag_gemm's
// and gemm_rs's two-level forms run (docs/overlap.md, "Across nodes"); the others refuse a World of several nodes.
// CUDA graphs: the Sequential algorithms, gemm_ar's FusedEpilogue and gemm_rs's FusedEpilogue with the Sm transport
// replay back to back; default options replay what an eager call decided. Call the op once outside the capture with
// the same shapes and options first; the other algorithms raise on a capturing stream.
// Default options (no choice made, as below) run the options decided once per World and shape: with LOOM_AUTOTUNE=1
// timed on every rank at the first call and persisted, else a persisted pick, else Auto.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "loom/ops/collectives.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/runtime/world.hpp"
#include "loom/tensor.hpp"

namespace loom {

// Who moves A's chunks in ag_gemm. In a World of several nodes (docs/overlap.md "Across nodes") CopyEngine runs the
// two-level form, Sequential the hierarchical all_gather, Auto one of them; Sm and Direct raise.
enum class AgProducer {
    Auto,        // Direct where ranks share a GPU (when it applies); with a GPU per rank Sequential when the GEMM's
                 // tiles fit one wave, else CopyEngine
    CopyEngine,  // cudaMemcpyAsync into each peer's gather buffer + a stream-written signal, on a side stream
    Sm,          // ag_gemm_push blocks on a side stream (comm_sms of them; the GEMM gets the other SMs)
    Direct,      // ranks sharing a GPU: the GEMMs read every peer's rows in place (M / W a multiple of BLOCK_M)
    Sequential,  // loom::all_gather into the gather buffer, then loom::gemm: no overlap
};
const char* to_string(AgProducer p);

struct AgGemmOptions {
    AgProducer producer = AgProducer::Auto;
    DataPath sm_path = DataPath::Auto;  // Sm producer: LdSt or Tma (Auto: Tma)
    int comm_sms = 0;                   // Sm producer blocks; 0: by the chunk size
    // Optional gather buffer: [M, K] dense, A's dtype, in the symmetric heap (world.alloc); it holds all_gather(A) when
    // the call's work completes. data == nullptr: the op's own buffer.
    MatrixView gathered{};
    const GemmConfig* config = nullptr;  // the GEMM's tile config (cluster_m 1); nullptr: the heuristic
    float alpha = 1.f;
    const float* scale_a = nullptr;
    const float* scale_b = nullptr;
    int num_sms = 0;  // the SMs the op plans on; 0: the device's (under MPS the client's share)
};

// How gemm_rs reduces. In a World of several nodes ScatterReduce runs the two-level form, Sequential the hierarchical
// reduce_scatter, Auto the sequence; the fused algorithms raise.
enum class RsAlgo {
    Auto,           // ranks sharing a GPU: FusedPull when M / W is a multiple of 64 and K_loc is shallow, else
                    // Sequential; a GPU per rank: FusedEpilogue or Sequential by the GEMM's waves of tiles when M / W
                    // is a multiple of BLOCK_M, else ScatterReduce
    FusedEpilogue,  // the GEMM's epilogue pushes the peers' tiles and sums its own rows: one kernel
    ScatterReduce,  // GEMM + a scatter-reduce kernel of comm_sms blocks on a side stream (any M / W)
    Sequential,     // loom::gemm into a symmetric buffer, then loom::reduce_scatter: no overlap
    FusedPull,      // one kernel: the GEMM publishes its partial product's tiles; spare warps pull and sum this rank's
};
const char* to_string(RsAlgo a);

// How gemm_rs's fused epilogue moves the tiles of peers' rows.
enum class RsTransport {
    Auto,        // CopyEngine when every rank has a GPU of its own, else Sm
    Sm,          // the epilogue bulk-copies each tile to its owner over NVLink
    CopyEngine,  // a side stream copies the epilogue's tiles with the copy engine (ranks on distinct GPUs only)
};
const char* to_string(RsTransport t);

struct GemmRsOptions {
    int comm_sms = 0;                    // ScatterReduce blocks; 0: up to 16
    const GemmConfig* config = nullptr;  // cluster_m 1
    RsAlgo algo = RsAlgo::Auto;
    RsTransport transport = RsTransport::Auto;  // FusedEpilogue only
    std::size_t ce_chunk_bytes = 0;             // CopyEngine: bytes per copy (whole tile columns); 0: 2 MiB
    float alpha = 1.f;
    const float* scale_a = nullptr;
    const float* scale_b = nullptr;
    int num_sms = 0;  // the SMs the op plans on; 0: the device's (under MPS the client's share)
};

// How gemm_ar reduces (docs/overlap.md, "gemm_ar": where Auto picks what). In a World of several nodes only
// Sequential (the hierarchical all_reduce) runs, Auto's choice there.
enum class ArAlgo {
    Auto,           // a GPU per rank: FusedEpilogue when the GEMM's tiles fit one wave and the tile stages whole slabs;
                    // otherwise (and where ranks share a GPU) ReduceKernel or Sequential by the cost model of
                    // gemm_ar_plan (the GEMM's time on the SMs the reducer leaves against the all_reduce's)
    FusedEpilogue,  // the GEMM's epilogue pushes each tile to every peer and sums the W copies: one kernel
    ReduceKernel,   // GEMM + a reduce kernel of comm_sms blocks on a side stream pulling each tile once stored
    Sequential,     // loom::gemm into a symmetric buffer, then loom::all_reduce: no overlap
};
const char* to_string(ArAlgo a);

// How gemm_ar's reduce kernel splits the reduction (ArAlgo::ReduceKernel).
enum class ArShots {
    Auto,     // OneShot at 2 ranks or C up to kArTwoShotMinBytes (256 KiB), else TwoShot
    OneShot,  // every rank pulls every rank's copy of every tile and sums it: W + 1 tiles' bytes per tile and rank
    TwoShot,  // tile i (the GEMM's order) is summed by rank i % W into its partial, which the others copy: 3 tiles
};
const char* to_string(ArShots s);

struct GemmArOptions {
    int comm_sms = 0;                    // ReduceKernel blocks; 0: by the cost model (one per tile below it)
    const GemmConfig* config = nullptr;  // cluster_m 1
    ArAlgo algo = ArAlgo::Auto;
    ArShots shots = ArShots::Auto;  // ReduceKernel only; a choice other than Auto asks for the reduce kernel
    float alpha = 1.f;
    const float* scale_a = nullptr;
    const float* scale_b = nullptr;
    int num_sms = 0;  // the SMs the op plans on; 0: the device's (under MPS the client's share)
};

// a: [M / W, K] (this rank's rows, dense), b: [N_loc, K], c: [M, N_loc].
void ag_gemm(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
             const AgGemmOptions& opts = {});
// a: [M, K_loc], b: [N, K_loc], c: [M / W, N] (M a multiple of W).
void gemm_rs(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
             const GemmRsOptions& opts = {});
// a: [M, K_loc], b: [N, K_loc], c: [M, N].
void gemm_ar(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
             const GemmArOptions& opts = {});

// Frees the overlapped ops' state on this World: buffers, signals, side streams, decided options (collective;
// synchronises the device).
void release_overlap_state(World& world);

}  // namespace loom
