// gemm_ar's pieces (src/ops/overlap/gemm_ar/): the algorithms' states, the validated call they take, and the choice.
// Three algorithms (kernels/overlap/gemm_ar.cuh; docs/overlap.md):
//
// FusedEpilogue (the default where the tile fits), one kernel on the caller's stream, every usable SM
// (fused_epilogue.cpp):
//   stream  GEMM with ArEpilogueHooks: per tile part, push it into our slot of every peer's receive half (e % 2),
//           tile_in[me][part] := e there; wait tile_in[q][part] >= e of every peer q; sum the W copies (rank order,
//           fp32), TMA-store C. The call number e is the device's (ArFusedSignals::launches), so the call can be
//           captured in a CUDA graph and replayed; its buffer and signals are its own (ArFusedState).
// ReduceKernel (reduce_kernel.cpp):
//   stream  fork ── GEMM(partial[e % 2] (symmetric), tile[i] = e after each tile's stores) ── join
//   side         gemm_ar_reduce: per tile, wait tile[i] >= e on every rank, sum the W partial tiles (rank
//                order, fp32), write C
// Sequential (Auto's choice where ranks share a GPU; sequential.cpp): loom::gemm into this call's parity half, then
// loom::all_reduce.
// ReduceKernel and Sequential take their parity half from one symmetric buffer and share its call counter
// (ArPartialsState), so calls may mix them (and the fused epilogue, which keeps to its own state).
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

// gemm_ar's algorithm: Auto is Sequential where ranks share a GPU and no config is given; with a config (the hooked
// GEMM's tile), FusedEpilogue when that tile stages whole slabs of out_bytes elements, else ReduceKernel; otherwise
// Auto (gemm_ar_plan decides by the heuristic's tile). Requested algorithms pass through; Sequential with a config is
// refused (it runs loom::gemm's own).
ArAlgo gemm_ar_algo(ArAlgo requested, bool ranks_share_gpu, const GemmConfig* config, int out_bytes);
// The GEMM and the algorithm (plan.ar_algo, never Auto) on `num_sms` SMs: the fused epilogue where the tile fits
// (every SM to the GEMM), else the reduce kernel's blocks beside it. out_bytes: C's element size.
OverlapPlan gemm_ar_plan(int64_t m, int64_t n, int64_t k_loc, int world_size, int comm_sms, int arch, int num_sms,
                         ArAlgo algo = ArAlgo::Auto, int out_bytes = 2, DType in = DType::BF16);

}  // namespace loom

namespace loom::overlap {

inline constexpr const char* kArHeader = "loom/kernels/overlap/gemm_ar.cuh";
// gemm_ar is the low-latency one-shot variant: M at most this.
inline constexpr int64_t kArMaxM = 128;

// The partial products' halves and their call counter, which the reduce kernel and the sequence share. Symmetric:
// 2 x M x N of C's type (no signals).
struct ArPartialsState final : PartialsState {
    static constexpr const char* kKey = "overlap/gemm_ar/partials";
    explicit ArPartialsState(World&) {}
};

// The reduce kernel's signals and side stream (its partials: ArPartialsState). Symmetric: ArReduceSignals (512 KiB);
// buf unused.
struct ArReduceState final : SignalState<kernels::overlap::ArReduceSignals> {
    static constexpr const char* kKey = "overlap/gemm_ar/reduce_kernel";
    explicit ArReduceState(World& world) : SignalState(world) {}
    SideStream side;
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
