// gemm_rs's pieces (src/ops/overlap/gemm_rs/): the algorithms' states, the validated call they take, and the choice.
// Four algorithms (kernels/overlap/gemm_rs.cuh, gemm_rs_pull.cuh; docs/overlap.md):
//
// FusedEpilogue (M / W a multiple of BLOCK_M), one kernel on the caller's stream, every usable SM (fused_epilogue.cpp):
//   GEMM(tiles rows-of-rank-(me+1) first, own rows last): the accumulators of a peer's tile are stored into slot
//   `me` of its scratch half (e % 2) and tile_in[me][tile] := e raised there (or, copy-engine transport, into the
//   local outbox, whose chunks a side stream copies); an own tile waits for tile_in[q][tile] >= e of every peer q,
//   adds their copies to its accumulators and is stored to C. With the SM transport the call number e is the
//   device's (RsFusedSmSignals::launches), so the call can be captured in a CUDA graph; the copy-engine transport's
//   stream operations carry the host's. Each transport has its own state (scratch, signals).
//
// FusedPull (M / W a multiple of BLOCK_M; Auto's choice where ranks share a GPU, M / W is a multiple of 64 and
// K_loc x the input's bytes <= kSharedPullMaxKBytes), on the caller's stream, every usable SM (fused_pull.cpp):
//   GEMM(partial [M, N] into this call's parity half of a symmetric buffer, bands interleaved tile by tile; each
//   tile published to its owner: tile_in[me][tile] := e there); the producer warpgroup's spare warps sum the W copies
//   of this rank's tiles into C as tile_in[q][tile] >= e for every rank q; gemm_rs_pull_finish sums what they left.
//
// Sequential (Auto's choice where ranks share a GPU and the fused pull is not; sequential.cpp): loom::gemm into this
// call's parity half of a symmetric [M, N] buffer, then loom::reduce_scatter (straight into C when C is dense, else in
// place and copied out).
//
// ScatterReduce (any M / W; P scatter-reduce blocks, the same on every rank; scatter_reduce.cpp):
//   stream  fork ── GEMM(partial [M, N], tiles rows-of-rank-(me+1) first, own rows last; tile[i] = e) ── join
//   side         gemm_rs_scatter_reduce: wait freed[d] >= F; per ready tile: push its rows to their owners'
//                scratch, tile_in[me][tile] := e there; then (second walk) reduce its own rows once
//                tile_in[q][tile] >= e for every peer q; freed[me] += 1 on every peer at the end
//   F = P x (calls before e) (freed_total before the call).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/kernels/overlap/overlap_params.hpp"
#include "loom/ops/overlap.hpp"
#include "ops/overlap/common/checks.hpp"
#include "ops/overlap/common/plan.hpp"
#include "ops/overlap/common/state.hpp"
#include "ops/overlap/common/tune.hpp"

namespace loom {

// The fused epilogue's transport Auto resolves to, or the requested one once checked: CopyEngine when every rank has
// its own GPU, else Sm (the copy engine is refused with ranks sharing a GPU, and for the other algorithms, which move
// their tiles their own way).
RsTransport gemm_rs_transport(RsTransport requested, RsAlgo algo, bool ranks_share_gpu);

// gemm_rs's Auto with a GPU per rank once the plan took the fused epilogue, by the plan's waves of `tiles` on `num_sms`
// (docs/perf/gemm_rs.json): one wave or less, the fused epilogue with its own NVLink pushes (Sm: the lowest latency;
// the copy engine's chunks would wait for whole raster groups); up to three waves, the sequence (the copy engine's
// chunks of the peers' tiles arrive too late for the own tiles' epilogues, and the Sm pushes stall the GEMM's loads);
// from three waves, the copy engine.
struct RsChoice {
    RsAlgo algo;
    RsTransport transport;
};
RsChoice gemm_rs_distinct_auto(int64_t tiles, int num_sms);

// Ranks sharing a GPU: K_loc x the input's bytes up to which Auto takes the fused pull (docs/perf/gemm_rs.json, one
// H200: the pull's speedup over the sequence 0.99-1.06x up to 7.4 KiB, 0.96-1.00x at 14-18 KiB).
inline constexpr int64_t kSharedPullMaxKBytes = 8192;
// gemm_rs's algorithm. Ranks sharing a GPU, no config: FusedPull when M / W = rows_seg is a multiple of 64 and k_bytes
// (K_loc x the input's element size) <= kSharedPullMaxKBytes, else Sequential (with a deep K the reduce-scatter is a
// small part of the GEMM's time and the pull's own cost exceeds it). With a config (the hooked GEMM's tile): when that
// tile fits (rows_seg a multiple of BLOCK_M) FusedPull where ranks share a GPU and FusedEpilogue where not, else
// ScatterReduce. Otherwise Auto (gemm_rs_plan decides by the heuristic's tile). Requested algorithms pass through;
// Sequential with a config is refused (it runs loom::gemm's own).
RsAlgo gemm_rs_algo(RsAlgo requested, bool ranks_share_gpu, const GemmConfig* config, int64_t rows_seg,
                    int64_t k_bytes);
// gemm_rs's algorithm in a World of several nodes (nodes > 1, ranks_per_node each): Auto resolves to Sequential
// (loom::gemm, then loom::reduce_scatter's hierarchical form); Sequential as asked; ScatterReduce runs the two-level
// form (across_nodes.cpp: the other nodes' rows first, reduced and sent beside the GEMM of the node's rows); the fused
// algorithms raise (their tiles reach the peers through the node's heap only), as does a config (both forms run
// loom::gemm's own).
RsAlgo gemm_rs_algo_across_nodes(RsAlgo requested, int nodes, int ranks_per_node, bool config = false);
// The GEMM and the algorithm (plan.rs_algo, never Auto) on `num_sms` SMs: the fused algorithms where the tile fits
// (every SM to the GEMM), else the scatter-reduce's blocks beside it. out_bytes: C's element size.
OverlapPlan gemm_rs_plan(int64_t m, int64_t n, int64_t k_loc, int world_size, int comm_sms, int arch, int num_sms,
                         RsAlgo algo = RsAlgo::Auto, int out_bytes = 2, DType in = DType::BF16);

}  // namespace loom

namespace loom::overlap {

inline constexpr const char* kRsHeader = "loom/kernels/overlap/gemm_rs.cuh";
inline constexpr const char* kRsPullHeader = "loom/kernels/overlap/gemm_rs_pull.cuh";

// The sequence's state: its partial products' halves (no signals). Symmetric: 2 x M x N of C's type.
struct RsSequentialState final : PartialsState {
    static constexpr const char* kKey = "overlap/gemm_rs/sequential";
    explicit RsSequentialState(World&) {}
};

// The two-level form across nodes (across_nodes.cpp): its side stream (its partials are RsSequentialState's).
struct RsNodesState final : WorldState {
    static constexpr const char* kKey = "overlap/gemm_rs/nodes";
    explicit RsNodesState(World&) {}
    SideStream side;
};

// The fused epilogue with the SM transport; the kernel numbers the calls (RsFusedSmSignals::launches), so they replay
// from a CUDA graph. Symmetric: RsFusedSmSignals (4 MiB + 128 bytes) and buf, the scratch: two parity halves of W - 1
// slots.
struct RsFusedSmState final : SignalState<kernels::overlap::RsFusedSmSignals> {
    static constexpr const char* kKey = "overlap/gemm_rs/fused_epilogue_sm";
    explicit RsFusedSmState(World& world) : SignalState(world) {}
};

// The fused epilogue with the copy-engine transport: its stream operations carry the host's call number. Symmetric:
// RsFusedCeSignals (4.5 MiB) and buf, the scratch: two parity halves of W - 1 slots.
struct RsFusedCeState final : SignalState<kernels::overlap::RsFusedCeSignals> {
    static constexpr const char* kKey = "overlap/gemm_rs/fused_epilogue_ce";
    explicit RsFusedCeState(World& world) : SignalState(world) {}
    LocalBuffer outbox;  // [W][slot_bytes]
    SideStream side;     // the copies
    uint64_t calls = 0;  // this transport's calls on the World (the epoch of the current call)
    // RsFusedCeSignals::stored[lead] (tiles of that chunk stored to the outbox, cumulative over calls) once the
    // current call's GEMM is done.
    std::vector<uint64_t> stored_total;
};

// The fused pull. Symmetric: RsPullSignals (4 MiB) and buf, the partial products: two parity halves of [M, N]; local:
// the reducers' leftover lists.
struct RsPullState final : SignalState<kernels::overlap::RsPullSignals> {
    static constexpr const char* kKey = "overlap/gemm_rs/fused_pull";
    explicit RsPullState(World& world) : SignalState(world) {}
    LocalBuffer leftover;  // kRsPullLeftoverWords
    uint64_t calls = 0;    // the fused pull's calls on the World (the epoch of the current call)
};

// The scatter-reduce. Symmetric: RsScatterSignals (4.5 MiB) and buf, the scratch [W][M / W][N]; local: the partial
// product.
struct RsScatterState final : SignalState<kernels::overlap::RsScatterSignals> {
    static constexpr const char* kKey = "overlap/gemm_rs/scatter_reduce";
    explicit RsScatterState(World& world) : SignalState(world) {}
    LocalBuffer partial;  // [M, N]
    SideStream side;
    uint64_t calls = 0;        // the scatter-reduce's calls on the World (the epoch of the current call)
    uint64_t freed_total = 0;  // RsScatterSignals::freed a peer reaches once it finished the last call
};

// One call of gemm_rs, validated (gemm_rs.cpp), then chosen (choose_algo).
struct RsCall : OpCall {
    int64_t M = 0, K = 0, N = 0, rows_seg = 0;  // rows_seg = M / W
    int out_bytes = 0;                          // C's element size
    int diag = 0;                               // gemm_rs_diagnostic's bits (0: the shipping kernels)
    // Chosen:
    RsAlgo algo = RsAlgo::Auto;                 // Sequential, or what the plan then resolves (plan.rs_algo)
    RsTransport transport = RsTransport::Auto;  // the fused epilogue's
    OverlapPlan plan;
};

// Whether the fused epilogue's tiles go through the copy engine: only between ranks (W > 1). Its stream operations
// carry the host's call number (RsFusedCeState), so such a call cannot be replayed from a CUDA graph; otherwise the
// kernel numbers its calls on the device (RsFusedSmState) and can.
bool fused_by_copy_engine(RsTransport transport, int world_size);
// Why the fused algorithms cannot run this shape with this tile config, or "" when they can.
std::string fused_unfit(int64_t rows_seg, const GemmConfig& cfg);

// The algorithm (x.algo) and, unless it is the sequence, its plan and requested transport.
void choose_algo(RsCall& x, const GemmRsOptions& o);
// The hooked algorithms' GEMM: the caller's tile or the plan's, checked; the fused epilogue's transport (x.transport);
// a capture refused unless the choice replays.
void prepare_overlapped(RsCall& x, const GemmRsOptions& o);

void gemm_rs_sequential(const RsCall& x);
// RsAlgo::ScatterReduce in a World of several nodes: the two-level form (across_nodes.cpp).
void gemm_rs_across_nodes(const RsCall& x);
void gemm_rs_fused(const RsCall& x, std::size_t ce_chunk_bytes);
void gemm_rs_pull(const RsCall& x);
void gemm_rs_scatter(const RsCall& x);

// gemm_rs with the options as given and its fused kernels built with LOOM_DIAG_RS_FUSED_SKIP = `skip` (the bits of
// kernels/overlap/gemm_rs.cuh kRsDiagSkip: & 11 for the fused epilogue, & 7 for the fused pull); bit 4 (16) makes the
// copy-engine transport copy no bytes. For bench-overlap --rs-fused-diag and the tests' way to the pull's finish
// kernel; the ops never build these kernels.
void gemm_rs_diagnostic(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c,
                        cudaStream_t stream, const GemmRsOptions& o, int skip);

// The autotuner's candidates for a call with every choice left to Loom (Auto first).
std::vector<TuneOption<GemmRsOptions>> gemm_rs_candidates(const World& world, const MatrixView& a, const MatrixView& b,
                                                          const MatrixView& c, const DeviceFacts& dev, int num_sms);

}  // namespace loom::overlap
