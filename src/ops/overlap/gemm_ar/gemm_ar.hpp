// gemm_ar's pieces (src/ops/overlap/gemm_ar/): the algorithms' states, the validated call they take, and the choice.
// Three algorithms (kernels/overlap/gemm_ar.cuh; docs/overlap.md):
//
// FusedEpilogue (Auto's choice with a GPU per rank when the GEMM's tiles fit one wave and the tile stages whole slabs),
// one kernel on the caller's stream, every usable SM (fused_epilogue.cpp):
//   stream  GEMM with ArEpilogueHooks: per tile part, push it into our slot of every peer's receive half (e % 2),
//           tile_in[me][part] := e there; wait tile_in[q][part] >= e of every peer q; sum the W copies (rank order,
//           fp32), TMA-store C. The call number e is the device's (ArFusedSignals::launches), so the call can be
//           captured in a CUDA graph and replayed; its buffer and signals are its own (ArFusedState).
// ReduceKernel (reduce_kernel.cpp), one-shot or two-shot (ArShots):
//   stream  fork ── GEMM(partial[e % 2] (symmetric), tile[i] = e after each tile's stores) ── reduce ── join
//   side         gemm_ar_reduce on comm_blocks SMs: per tile in the GEMM's order, one-shot: wait tile[i] >= e on
//                every rank, sum the W partial tiles (rank order, fp32), write C; two-shot: the same for the tiles
//                this rank owns (every W-th), written back into its partial too, then reduced[i] := e; a peer's
//                tile copied from its owner's partial once reduced[i] >= e there
//   reduce  the same kernel on every usable SM after the GEMM; both launches claim tiles from one counter, so the
//           side blocks sum what is ready under the GEMM and the full grid the rest
// Sequential (sequential.cpp): loom::gemm into this call's parity half, then loom::all_reduce.
// Auto between ReduceKernel and Sequential: gemm_ar_cost's model. ReduceKernel and Sequential take their parity half
// from one symmetric buffer and share its call counter (ArPartialsState), so calls may mix them (and the fused
// epilogue, which keeps to its own state).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "loom/kernels/overlap/overlap_params.hpp"
#include "loom/ops/overlap.hpp"
#include "ops/overlap/common/checks.hpp"
#include "ops/overlap/common/plan.hpp"
#include "ops/overlap/common/state.hpp"
#include "ops/overlap/common/tune.hpp"

namespace loom {

// C's bytes above which ArShots::Auto takes the two-shot reduction (at more than 2 ranks): the all_reduce's own
// switch from its flag-in-data one-shot to its two-shot (collectives/coll_choice.cpp, AllReduce rows).
inline constexpr int64_t kArTwoShotMinBytes = 256 << 10;
// gemm_ar_cost's rates: the hooked GEMM's bf16 / fp16 FLOPs per SM and microsecond (fp8: twice), ~660 TFLOP/s over an
// H200's 132 SMs (4 ranks sharing one H200 measured 5.5e6 on their 26 SMs each); and the bytes a reduce block
// (256 threads, 16 loads of 16 bytes in flight each) moves per microsecond, with a GPU per rank (peer reads over
// NVLink) and with ranks sharing a GPU. Shared: 4 ranks on one H200, N = 5120, M = 2048-16384, K_loc = 2048 and 6400,
// the reduce kernel on 4 side blocks alone (before the full-grid launch after the GEMM): its time past the GEMM's (on
// the other SMs) over its traffic gives 2.1e4-4.1e4 per block for two-shot, 3.4e4-5.6e4 for one-shot; the least is
// the rate. Model rates: `bench-overlap --ops ar` (the forced reduce kernel, overlap_reduce-kernel-*_us) and
// `--ar-comm-sms` (each block count).
inline constexpr double kArGemmFlopsPerSmUs = 5.0e6;
inline constexpr double kArReduceBlockBytesPerUs = 5.0e4;
inline constexpr double kArReduceBlockBytesPerUsShared = 2.0e4;
// Auto takes the reduce kernel only where the model puts it at least this fraction below the sequence (the model's
// error, measured: the reduce kernel read 2.5x its estimate with ranks sharing a GPU before the shared rate).
inline constexpr double kArMinGain = 0.10;
// Most reduce blocks the cost model weighs.
inline constexpr int kMaxCommBlocksAr = 32;

// gemm_ar's algorithm before the plan: a requested one passes through (Sequential with a config is refused, it runs
// loom::gemm's own; ArShots other than Auto with FusedEpilogue or Sequential are refused); ArShots other than Auto
// ask for ReduceKernel; with a config (the hooked GEMM's tile), FusedEpilogue when that tile stages whole slabs of
// out_bytes elements, else ReduceKernel; otherwise Auto (gemm_ar_plan decides).
ArAlgo gemm_ar_algo(ArAlgo requested, ArShots shots, const GemmConfig* config, int out_bytes);
// gemm_ar's algorithm in a World of several nodes (nodes > 1, ranks_per_node each): Auto (with ArShots::Auto)
// resolves to Sequential (loom::gemm, then loom::all_reduce's hierarchical form); Sequential as asked; the others
// raise (they reach the peers' tiles through the node's heap only), as does a config (the sequence runs loom::gemm's
// own).
ArAlgo gemm_ar_algo_across_nodes(ArAlgo requested, ArShots shots, int nodes, int ranks_per_node, bool config = false);
// Whether the reduce kernel runs two-shot: as requested, else (Auto) at more than 2 ranks with C above
// kArTwoShotMinBytes (at 2 ranks one-shot moves 3 units of C per rank, as two-shot does, with one hop less).
bool gemm_ar_two_shot(ArShots requested, int world_size, int64_t c_bytes);

// The cost model that weighs the reduce kernel against the sequence (microseconds, per rank). The GEMM runs at
// kArGemmFlopsPerSmUs per SM; the sequence's all_reduce is the collectives' model (coll::model_us) of what
// choose_collective picks for C (not symmetric: the caller's C is any memory); the reduce kernel's traffic (one-shot
// W + 1, two-shot 3 units of C) streams at min(blocks x the block rate, a rank's share of the memory's rate): on P
// side blocks beside the GEMM on num_sms - P SMs, the rest after it on num_sms blocks. A GPU per rank (block rate
// kArReduceBlockBytesPerUs): the side blocks take what the GEMM stores before its last wave; ranks sharing a GPU
// (kArReduceBlockBytesPerUsShared): nothing, as measured there (the 4 side blocks of each rank moved little while the
// ranks' GEMMs ran):
//   sequence = gemm(num_sms) + all_reduce(C)
//   overlap  = gemm(num_sms - P) + (traffic - hidden) / full rate + two launches
//   hidden   = min(traffic - the last wave's, gemm(num_sms - P) x the P blocks' rate)   (a GPU per rank; shared: 0)
// P: comm_sms when given, else the power of two up to min(kMaxCommBlocksAr, tiles, num_sms / 4) with the least
// overlap. ranks_per_gpu > 1: ranks share the GPU (their memory traffic shares its rate). tile: the GEMM's.
struct ArCost {
    double sequence_us = 0;
    double overlap_us = 0;
    int comm_blocks = 1;
    bool two_shot = false;
};
ArCost gemm_ar_cost(int64_t m, int64_t n, int64_t k_loc, int world_size, int num_sms, int ranks_per_gpu, int out_bytes,
                    DType in, const GemmConfig& tile, bool two_shot, int comm_sms);
// The plan on `num_sms` SMs (plan.ar_algo, never Auto): requested FusedEpilogue, or Auto with a GPU per rank where the
// tile fits and the tiles fit one wave: the fused epilogue (every SM to the GEMM); requested ReduceKernel: the reduce
// kernel with gemm_ar_cost's blocks; Auto otherwise: the reduce kernel where gemm_ar_cost puts it kArMinGain or more
// below the sequence, else Sequential (plan.gemm unset). out_bytes: C's element size; ranks_per_gpu: as gemm_ar_cost.
OverlapPlan gemm_ar_plan(int64_t m, int64_t n, int64_t k_loc, int world_size, int comm_sms, int arch, int num_sms,
                         ArAlgo algo = ArAlgo::Auto, int out_bytes = 2, DType in = DType::BF16,
                         ArShots shots = ArShots::Auto, int ranks_per_gpu = 1);

}  // namespace loom

namespace loom::overlap {

inline constexpr const char* kArHeader = "loom/kernels/overlap/gemm_ar.cuh";

// The partial products' halves and their call counter, which the reduce kernel and the sequence share. Symmetric:
// 2 x M x N of C's type (no signals).
struct ArPartialsState final : PartialsState {
    static constexpr const char* kKey = "overlap/gemm_ar/partials";
    explicit ArPartialsState(World&) {}
};

// The reduce kernel's signals and side stream (its partials: ArPartialsState). Symmetric: ArReduceSignals (1 MiB +
// 128 bytes); buf unused. claims: the value of the signals' claim counter when the next call starts (every call's
// claims: its tiles, plus one per block of its two reduce launches).
struct ArReduceState final : SignalState<kernels::overlap::ArReduceSignals> {
    static constexpr const char* kKey = "overlap/gemm_ar/reduce_kernel";
    explicit ArReduceState(World& world) : SignalState(world) {}
    SideStream side;
    std::uint64_t claims = 0;
};

// The fused epilogue; the kernel numbers the calls. Symmetric: ArFusedSignals (4 MiB + 128 bytes) and buf, the
// receive buffer: two parity halves of W - 1 slots.
struct ArFusedState final : SignalState<kernels::overlap::ArFusedSignals> {
    static constexpr const char* kKey = "overlap/gemm_ar/fused_epilogue";
    explicit ArFusedState(World& world) : SignalState(world) {}
};

// One call of gemm_ar, validated (gemm_ar.cpp), then chosen (choose_algo).
struct ArCall : OpCall {
    int64_t M = 0, K = 0, N = 0;
    int out_bytes = 0;  // C's element size
    // Chosen:
    ArAlgo algo = ArAlgo::Auto;  // Sequential, or what the plan then resolves (plan.ar_algo)
    OverlapPlan plan;
};

// The algorithm (x.algo) and, unless it is the sequence, its plan with the caller's tile, checked; a capture refused
// unless the choice replays.
void choose_algo(ArCall& x, const GemmArOptions& o);

void gemm_ar_sequential(const ArCall& x);
void gemm_ar_fused(const ArCall& x);
void gemm_ar_reduce_kernel(const ArCall& x);

// The autotuner's candidates for a call with every choice left to Loom (Auto first).
std::vector<TuneOption<GemmArOptions>> gemm_ar_candidates(const World& world, const MatrixView& a, const MatrixView& b,
                                                          const MatrixView& c, const DeviceFacts& dev, int num_sms);

}  // namespace loom::overlap
