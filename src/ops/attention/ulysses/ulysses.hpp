// The Ulysses ops' pieces (src/ops/attention/ulysses/): the head layout, the plans, the states and the validated calls
// the algorithms take. Kernels: kernels/attention/ulysses.cuh (the all-to-alls), ulysses_o_gemm.cuh (a2a_o_gemm's GEMM
// policy); qkv_gemm_a2a's fused GEMM is gemm_rs's TileNotifyHooks GEMM (kernels/overlap/gemm_rs.cuh).
//
// qkv_gemm_a2a, per call e on every rank (R = S / W rows per rank, N = (Hq + 2 Hkv) D):
//   Fused       stream  fork ── GEMM x * W_qkv^T -> half e % 2 of the symmetric [R, N] buffer, tile[i] := e per tile ──
//   join
//               side         ulysses_qkv_a2a (comm blocks): for every (tile, rank p): wait p's tile[i] >= e, copy this
//                            rank's head columns of it into q / k / v rows [p R, ...)
//   Sequential  stream  loom::gemm -> half e % 2 ── ulysses_qkv_a2a (whole: ready[me] := e everywhere, wait ready[p])
// a2a_o_gemm, per call e (w = Hq / W x D, gathered operand [R, W w], chunks of kUlyssesChunkRows rows):
//   Fused       stream  fork ── wait started ── GEMM (tile waits arrived[p][chunk] >= e for every p) ── join
//               side         ulysses_o_a2a (comm blocks): o rows [d R + chunk] -> d's half e % 2 columns [me w, ...);
//                            arrived[me][chunk] := e at d
//   Sequential  stream  ulysses_o_a2a (then waits every chunk here) ── loom::gemm over half e % 2
// Both algorithms of an op share its state (signals, halves, call count), so calls may mix them (ulysses.cuh: why the
// halves need no further guard).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "loom/kernels/attention/ulysses_params.hpp"
#include "loom/ops/attention.hpp"
#include "ops/overlap/common/plan.hpp"
#include "ops/overlap/common/state.hpp"

namespace loom::ulysses {

// Rows per chunk of a2a_o_gemm's gathered operand (one GEMM M-block of the heuristic's usual 128).
inline constexpr int64_t kChunkRows = 128;
// Rows per piece of the Sequential QKV all-to-all (its tiling: whole rows of the product).
inline constexpr int32_t kSequentialPieceRows = 32;
// Default blocks of the all-to-all kernels beside a fused GEMM.
inline constexpr int kDefaultCommBlocks = 16;

// Which columns of the QKV product each rank owns (kernels/attention/ulysses_params.hpp: the rule).
struct QkvLayout {
    int world = 0;
    int64_t hq = 0, hkv = 0, d = 0;
    int64_t hq_loc = 0;   // Hq / W
    int64_t hkv_loc = 0;  // max(Hkv / W, 1)
    int64_t cols() const { return (hq + 2 * hkv) * d; }
    int64_t q_width() const { return hq_loc * d; }
    int64_t kv_width() const { return hkv_loc * d; }
    int64_t kv_first(int r) const { return kernels::attention::ulysses_kv_first(r, hkv, world); }
    // First column of rank r's slices in a QKV row.
    int64_t q_col(int r) const { return r * hq_loc * d; }
    int64_t k_col(int r) const { return (hq + kv_first(r)) * d; }
    int64_t v_col(int r) const { return (hq + hkv + kv_first(r)) * d; }
};
// The layout of `heads` over `world` ranks; raises loom::Error (naming `op` and the head counts) where the heads do
// not split: Hq, Hkv, D > 0, D a multiple of 8, Hkv dividing Hq, W dividing Hq, W dividing Hkv or Hkv dividing W.
QkvLayout qkv_layout(const char* op, int world, const UlyssesHeads& heads);

// The algorithm Auto resolves to, or the requested one. Auto: Fused with more than one rank, each on a GPU of its
// own; Sequential on one rank, and where ranks share a GPU (measured at 4 ranks on one H200, docs/perf/
// qkv_gemm_a2a.json and a2a_o_gemm.json: Fused 0.41-0.81x Sequential's speed, its copy blocks taking SMs from the GEMM
// that shares the rank's MPS share).
UlyssesAlgo choose_algo(UlyssesAlgo requested, int world, bool shared_gpu);

// Row chunks of a2a_o_gemm's gathered operand of `rows_per_rank` rows; raises past kUlyssesMaxChunks.
int32_t o_chunks(const char* op, int64_t rows_per_rank);

// The fused GEMM's config beside `comm_blocks` all-to-all blocks on `num_sms` SMs: the caller's (checked; a grid of 0
// planned) or the overlapped ops' heuristic (one CTA per tile, TMA-store epilogue, no split-K tail).
OverlapPlan fused_plan(const char* op, int64_t m, int64_t n, int64_t k, DType in, int arch, int num_sms, int comm_sms,
                       const GemmConfig* config);

// qkv_gemm_a2a's state (both algorithms). Symmetric: UlyssesQkvSignals and buf, two parity halves of [R, N].
struct QkvState final : overlap::SignalState<kernels::attention::UlyssesQkvSignals> {
    static constexpr const char* kKey = "attention/ulysses/qkv_gemm_a2a";
    explicit QkvState(World& world) : SignalState(world) {}
    overlap::SideStream side;
    uint64_t calls = 0;  // this op's calls on the World (the epoch of the current call)
};

// a2a_o_gemm's state (both algorithms). Symmetric: UlyssesOSignals and buf, two parity halves of [R, Hq D].
struct OState final : overlap::SignalState<kernels::attention::UlyssesOSignals> {
    static constexpr const char* kKey = "attention/ulysses/a2a_o_gemm";
    explicit OState(World& world) : SignalState(world) {}
    overlap::SideStream side;
    uint64_t calls = 0;          // this op's calls on the World (the epoch of the current call)
    uint64_t started_total = 0;  // target of started after the current call
};

// One validated call of either op.
struct Call {
    World* world = nullptr;
    cudaStream_t stream = nullptr;
    int W = 0, me = 0;
    int arch = 0, num_sms = 0;
    DType dtype = DType::BF16;
    int64_t R = 0;  // S / W
    UlyssesAlgo algo = UlyssesAlgo::Auto;
    OverlapPlan plan;  // Fused
};

struct QkvCall : Call {
    MatrixView x, w;
    MatrixView out[3];  // q, k, v
    QkvLayout layout;
};

struct OCall : Call {
    MatrixView o, w, out;
    int64_t width = 0;  // Hq / W x D: o's columns
    int32_t chunks = 0;
};

void qkv_fused(const QkvCall& x);
void qkv_sequential(const QkvCall& x);
void o_fused(const OCall& x);
void o_sequential(const OCall& x);

// The all-to-all kernels' parameters but the call's tiling, epoch and half.
kernels::attention::UlyssesQkvParams qkv_params(const QkvCall& x, QkvState& st);
kernels::attention::UlyssesOParams o_params(const OCall& x, OState& st);

inline constexpr const char* kHeader = "loom/kernels/attention/ulysses.cuh";
inline constexpr const char* kOGemmHeader = "loom/kernels/attention/ulysses_o_gemm.cuh";
inline constexpr const char* kOGemmHooks = "loom::kernels::attention::UlyssesOGemmHooks";

}  // namespace loom::ulysses

namespace loom::ulysses {

// One matrix argument of an op: `name`'s pointer (non-null, 16-byte aligned), dtype, shape [rows, cols] (`shape` says
// where the shape comes from), leading dimension (>= cols, a multiple of 16 bytes), and the whole in memory this
// rank's GPU may use. Raises loom::Error naming the op and the argument.
void check_view(World& world, const char* op, const char* name, const MatrixView& m, DType dtype, int64_t rows,
                int64_t cols, const char* shape);
// bf16 or fp16, named.
void check_input_dtype(const char* op, const char* name, DType dtype);
// The options' own fields (comm_sms, num_sms >= 0; the config's when given is checked by the plan).
void check_options(const char* op, const UlyssesOptions& o);
// One node: the kernels exchange heads and rows among the node's ranks by load / store.
void check_world(World& world, const char* op);
// Raises while `stream` captures a CUDA graph (the ops' signal values and halves are chosen on the host per call).
void check_not_capturing(const char* op, cudaStream_t stream);

}  // namespace loom::ulysses
