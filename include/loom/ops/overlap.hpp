// Overlapped GEMM + collective ops for tensor-parallel layers on one node (docs/overlap.md):
//
//   ag_gemm   C[M, N_loc]   = all_gather(A)[M, K] * B[N_loc, K]^T          A: [M / W, K] per rank (row shard)
//   gemm_rs   C[M / W, N]   = reduce_scatter over ranks of A[M, K_loc] * B[N, K_loc]^T   (rows split by rank)
//   gemm_ar   C[M, N]       = all_reduce over ranks of A[M, K_loc] * B[N, K_loc]^T       (small M <= 128)
//
// Contract (every function): collective over the World — every rank calls it in the same order with the same
// shapes, dtypes and options. Work is enqueued on `stream` (plus a side stream the op owns, joined back into
// `stream` before the call returns): the call never synchronises the host. bf16 / fp16 inputs (A and B the
// same), or fp8 e4m3 (K a multiple of 16; the tensor cores' own e4m3 sums, as loom::gemm's: docs/gemm.md "FP8"),
// fp32 accumulation; an optional scale `alpha` on the products (fp8's per-tensor scales); C bf16 / fp16 / fp32
// (gemm_rs / gemm_ar reduce their partial products in C's type, summed in fp32). B is [N, K] row-major (a linear
// layer's weight). The communication buffers (gather buffer, scratch, partial products, signals) are symmetric-heap
// memory the op allocates (world.alloc) on first use and keeps per World until release_overlap_state(); A, B and C may
// be any device memory of this rank. Needs sm_90 (the Hopper GEMM with overlap hooks) and a single-node world (world
// size == local world size).
// CUDA graphs: these may be captured and replayed back to back —
//   - the sequential algorithms (AgProducer / RsAlgo / ArAlgo::Sequential: loom::gemm and a collective);
//   - gemm_ar's fused epilogue (ArAlgo::FusedEpilogue, Auto's choice with a GPU per rank where the tile fits) and
//     gemm_rs's fused epilogue with the SM transport (RsAlgo::FusedEpilogue, RsTransport::Sm; Auto's choice with a
//     GPU per rank when the GEMM's tiles fit one wave; past three waves Auto takes the copy-engine transport, which
//     cannot be replayed), which number their calls on the device;
//   - default options (every choice left to Loom), when the options an eager call decided for the shapes are one of
//     the above.
// Call the op once outside the capture with the same shapes and options first: that creates its state and buffers,
// loads its kernels and makes the default options' choice, none of which a capture allows. The other overlapped
// algorithms compute their signal targets and buffer halves on the host per call, which a replay would repeat: on a
// capturing stream they raise, before touching any state.
//
// Autotuning: a call that leaves every choice to Loom (default options: no config, algorithm / producer / transport /
// data path Auto, comm_sms 0, no gathered buffer, no CE chunk size) runs the options decided once per (World, shape,
// types, SMs) and process: with LOOM_AUTOTUNE=1 the op's candidates (Auto, each algorithm or producer, Auto with other
// tile widths) are timed on every rank at that first call — the ops in step into scratch outputs, each run after a
// device barrier, three rotated rounds — and rank 0's pick of the slowest-rank medians is persisted under
// LOOM_CACHE_DIR/tune/<op>/; without it a persisted pick is taken (rank 0's reading, all-gathered), else Auto. Any
// option given runs as given, untuned. src/ops/overlap/overlap_tune.hpp; docs/overlap.md "Configs".
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "loom/ops/collectives.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/runtime/env.hpp"
#include "loom/runtime/world.hpp"
#include "loom/tensor.hpp"

namespace loom {

// Who moves A's chunks in ag_gemm.
enum class AgProducer {
    Auto,        // Direct where ranks share a GPU (and it applies); with a GPU per rank Sequential when the GEMM's
                 // tiles fit one wave, else the copy engine (the GEMM keeps every SM); see ag_gemm_producer
    CopyEngine,  // cudaMemcpyAsync to each peer's gather buffer + cuStreamWriteValue64 signal, on a side stream
    Sm,          // ag_gemm_push blocks on a side stream (comm_sms of them; the GEMM gets the other SMs)
    Direct,      // no gather: each rank copies its shard into its own symmetric staging, and the GEMMs read every
                 // peer's rows in place from there (TMA through per-rank tensor maps). For ranks sharing a GPU,
                 // where a peer's memory is this GPU's; needs M / W a multiple of the GEMM's BLOCK_M and no
                 // `gathered` buffer
    Sequential,  // loom::all_gather into the gather buffer, then loom::gemm: no overlap
};
const char* to_string(AgProducer p);

struct AgGemmOptions {
    AgProducer producer = AgProducer::Auto;
    DataPath sm_path = DataPath::Auto;  // Sm producer: LdSt or Tma (Auto: Tma)
    int comm_sms = 0;                   // Sm producer blocks; 0: heuristic (ag_gemm_comm_sms)
    // Optional: the gather buffer, [M, K] dense, of A's dtype, in the symmetric heap (world.alloc); it then holds
    // all_gather(A) when the call's work completes. data == nullptr: the op's internal buffer.
    MatrixView gathered{};
    const GemmConfig* config = nullptr;  // GEMM tile config (cluster_m must be 1); nullptr: the heuristic
    // C = alpha x scale_a x scale_b x gather(A) B^T: fp8's per-tensor scales, as a host float (alpha) or as device
    // floats read when the op runs (scale_a / scale_b: no host synchronisation for scales computed on the GPU; null:
    // 1). One scale for every rank's rows of A.
    float alpha = 1.f;
    const float* scale_a = nullptr;
    const float* scale_b = nullptr;
};

// How gemm_rs reduces (docs/overlap.md).
enum class RsAlgo {
    Auto,           // where ranks share a GPU: FusedPull when M / W is a multiple of 64 and K_loc x the input's
                    // bytes <= kSharedPullMaxKBytes, else Sequential; with a GPU
                    // per rank: when M / W is a multiple of the GEMM's BLOCK_M, by the GEMM's waves of tiles the
                    // FusedEpilogue (Sm transport: one wave; CopyEngine: three or more) or Sequential (between; see
                    // gemm_rs_distinct_auto), else ScatterReduce
    FusedEpilogue,  // the GEMM's epilogue pushes peers' tiles (bulk copies) and sums its own rows: one kernel
    ScatterReduce,  // GEMM + a scatter-reduce kernel of comm_sms blocks on a side stream (any M / W)
    Sequential,     // loom::gemm into a symmetric buffer, then loom::reduce_scatter: no overlap. Auto's choice where
                    // ranks share a GPU and FusedPull is not (above). The fused epilogue measured slower than it
                    // there (8 ranks on one H200: 0.89-1.01x; each rank's share of the SMs runs its tiles at its own
                    // pace, and an own tile's sum waits for the slowest peer's copy)
    FusedPull,      // one kernel (M / W a multiple of BLOCK_M): the GEMM stores its whole partial product (plain
                    // epilogue) and publishes each tile to the rank owning its rows; the producer warpgroup's spare
                    // warps pull the W copies of this rank's tiles as they become ready and sum them into C. Nothing
                    // in the GEMM's consumers waits (kernels/gemm_rs_pull.cuh)
};
const char* to_string(RsAlgo a);

// How gemm_rs's fused epilogue moves the tiles of peers' rows (docs/overlap.md).
enum class RsTransport {
    Auto,        // CopyEngine when every rank has a GPU of its own, else Sm (src/ops/overlap/gemm_rs/gemm_rs.cpp says why)
    Sm,          // the epilogue bulk-copies each tile (cp.async.bulk shared -> peer global) over NVLink
    CopyEngine,  // the epilogue stores each tile locally (an outbox); a side stream waits for whole chunks (runs of
                 // columns of one raster group) and copies them with the copy engine (ranks on distinct GPUs only:
                 // within one GPU a copy is a runtime copy kernel, which the persistent GEMM would starve)
};
const char* to_string(RsTransport t);

struct GemmRsOptions {
    int comm_sms = 0;                    // ScatterReduce blocks; 0: heuristic (16, or fewer for small outputs)
    const GemmConfig* config = nullptr;  // cluster_m must be 1
    RsAlgo algo = RsAlgo::Auto;
    RsTransport transport = RsTransport::Auto;  // FusedEpilogue only
    std::size_t ce_chunk_bytes = 0;             // CopyEngine: bytes per copy (whole tile columns); 0: 2 MiB
    // This rank's partial product times alpha x scale_a x scale_b before the sum (fp8: its per-tensor scales; the
    // device floats scale_a / scale_b are read when the op runs; null: 1).
    float alpha = 1.f;
    const float* scale_a = nullptr;
    const float* scale_b = nullptr;
};

enum class ArAlgo {
    Auto,           // Sequential where ranks share a GPU; else FusedEpilogue when the GEMM's tile fits it (BLOCK_N x
                    // C's element size a multiple of 128 bytes, stages beside the staged tile), else ReduceKernel
    FusedEpilogue,  // the GEMM's epilogue pushes each tile to every peer and sums the W copies itself: one kernel,
                    // every SM for the GEMM
    ReduceKernel,   // GEMM + a reduce kernel of comm_sms blocks on a side stream pulling each tile once stored
    Sequential,     // loom::gemm into a symmetric buffer, then loom::all_reduce: no overlap. Auto's choice where ranks
                    // share a GPU, where both overlapped algorithms measured slower than it (8 ranks on one H200:
                    // 0.54-0.73x; each rank's share of the SMs runs its tiles at its own pace, and a tile's reduction
                    // waits for the slowest rank's)
};
const char* to_string(ArAlgo a);

struct GemmArOptions {
    int comm_sms = 0;                    // ReduceKernel blocks; 0: heuristic (one per tile, at most 32)
    const GemmConfig* config = nullptr;  // cluster_m must be 1
    ArAlgo algo = ArAlgo::Auto;
    // This rank's partial product times alpha x scale_a x scale_b before the sum (fp8: its per-tensor scales; the
    // device floats scale_a / scale_b are read when the op runs; null: 1).
    float alpha = 1.f;
    const float* scale_a = nullptr;
    const float* scale_b = nullptr;
};

// a: [M / W, K] (this rank's rows, dense), b: [N_loc, K], c: [M, N_loc]. M / W may be any size >= 1.
void ag_gemm(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
             const AgGemmOptions& opts = {});
// a: [M, K_loc], b: [N, K_loc], c: [M / W, N] (M a multiple of W).
void gemm_rs(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
             const GemmRsOptions& opts = {});
// a: [M, K_loc] with M <= 128, b: [N, K_loc], c: [M, N].
void gemm_ar(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
             const GemmArOptions& opts = {});

// The configs the heuristics pick (printed by LOOM_OVERLAP_DEBUG=1).
struct OverlapPlan {
    GemmConfig gemm;  // grid = the SMs left to the GEMM
    int comm_blocks = 0;
    // SMs left free for work the CUDA runtime runs on SMs behind the op's back: a cudaMemcpyAsync between two
    // allocations of one GPU (ranks sharing it) is a copy kernel, which a persistent GEMM spinning on that very
    // copy's signal would otherwise starve (seen on the H200: ag_gemm's copy-engine producer trapped there).
    int reserved_sms = 0;
    RsAlgo rs_algo = RsAlgo::Auto;  // gemm_rs_plan: the algorithm chosen (never Auto there)
    ArAlgo ar_algo = ArAlgo::Auto;  // gemm_ar_plan: the algorithm chosen (never Auto there)
    std::string str() const;
};
// in: the input type (fp8's k-blocks are 128 elements: block_k, and the bytes the SM producer moves).
OverlapPlan ag_gemm_plan(int64_t m, int64_t n_loc, int64_t k, int world_size, AgProducer producer, int comm_sms,
                         int arch, int num_sms, bool ranks_share_gpu = false, DType in = DType::BF16);
// out_bytes: C's element size (the fused epilogue's slabs need BLOCK_N * out_bytes a multiple of 128).
OverlapPlan gemm_rs_plan(int64_t m, int64_t n, int64_t k_loc, int world_size, int comm_sms, int arch, int num_sms,
                         RsAlgo algo = RsAlgo::Auto, int out_bytes = 2, DType in = DType::BF16);
OverlapPlan gemm_ar_plan(int64_t m, int64_t n, int64_t k_loc, int world_size, int comm_sms, int arch, int num_sms,
                         ArAlgo algo = ArAlgo::Auto, int out_bytes = 2, DType in = DType::BF16);

// What Auto resolves to, or the requested choice once checked; raise loom::Error for a combination that cannot run.
// ag_gemm's producer: Direct where ranks share a GPU and it applies (world > 1, rows_per_rank = M / W a multiple of
// the GEMM's block_m, no gathered buffer); with a GPU per rank Sequential when the GEMM's `tiles` fit one wave on
// `num_sms` (every tile then runs at once, so a peer's tile waits for its rows as long as the sequence's GEMM does,
// and the copy engine's latency comes on top; two H200s, M = 256-512: the sequence 8-25 % faster), else CopyEngine
// (tiles 0: not known, CopyEngine). gemm_rs's transport: CopyEngine for the fused epilogue when every rank has its own
// GPU, else Sm (the copy engine is refused with ranks sharing a GPU, and for the scatter-reduce, which pushes with
// its own blocks).
AgProducer ag_gemm_producer(AgProducer requested, int world_size, int64_t rows_per_rank, int block_m, bool gathered,
                            bool ranks_share_gpu, int64_t tiles = 0, int num_sms = 0);
RsTransport gemm_rs_transport(RsTransport requested, RsAlgo algo, bool ranks_share_gpu);
// gemm_rs's Auto with a GPU per rank, once the plan took the fused epilogue, by the plan's waves of `tiles` on
// `num_sms` (two H200s, W = 2, M = 512-4096, docs/overlap.md "Session 20"): one wave or less, the fused epilogue with
// its own NVLink pushes (Sm: the lowest latency; the copy engine's chunks would wait for whole raster groups); up to
// three waves, the sequence (the copy engine's chunks of the peers' tiles arrive too late for the own tiles'
// epilogues, and the Sm pushes stall the GEMM's loads); from three waves, the copy engine.
struct RsChoice {
    RsAlgo algo;
    RsTransport transport;
};
RsChoice gemm_rs_distinct_auto(int64_t tiles, int num_sms);
// gemm_rs's algorithm: where ranks share a GPU and no config is given, FusedPull when M / W = rows_seg is a multiple
// of 64 and k_bytes (K_loc x the input's element size) <= kSharedPullMaxKBytes, else Sequential (with a deep K the
// reduce-scatter is a small part of the GEMM's time and the pull's own cost exceeds it); with a config (the hooked
// GEMM's tile), when that tile fits (rows_seg a multiple of BLOCK_M) FusedPull where ranks share a GPU and
// FusedEpilogue where not, else ScatterReduce; otherwise Auto (gemm_rs_plan decides by the heuristic's tile).
// Requested algorithms pass through; Sequential with a config is refused (it runs loom::gemm's own).
inline constexpr int64_t kSharedPullMaxKBytes = 8192;
RsAlgo gemm_rs_algo(RsAlgo requested, bool ranks_share_gpu, const GemmConfig* config, int64_t rows_seg,
                    int64_t k_bytes);
// gemm_ar's algorithm: Auto is Sequential where ranks share a GPU and no config is given; with a config (the hooked
// GEMM's tile), FusedEpilogue when that tile stages whole slabs of out_bytes elements, else ReduceKernel; otherwise
// Auto (gemm_ar_plan decides by the heuristic's tile). Requested algorithms pass through; Sequential with a config is
// refused (it runs loom::gemm's own).
ArAlgo gemm_ar_algo(ArAlgo requested, bool ranks_share_gpu, const GemmConfig* config, int out_bytes);

// The SMs this process can occupy at once, which the plans divide between the GEMM and the communication blocks:
// LOOM_OVERLAP_SMS when set (> 0, at most device_sms), else device_sms. Under MPS, cudaDevAttrMultiProcessorCount
// already reports the client's share (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; on the H200 8 ranks at 12 % see 14 SMs),
// so device_sms is that attribute. Raises for a malformed value.
int overlap_usable_sms(int device_sms, const EnvLookup& env = process_env());

// Frees the overlapped ops' symmetric buffers for this World (collective; synchronises the device).
void release_overlap_state(World& world);

}  // namespace loom
