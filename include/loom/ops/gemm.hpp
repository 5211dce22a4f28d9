// loom::gemm: C[M, N] = alpha * A[M, K] * B^T + beta * C + bias[N].
//
// A is [M, K] row-major; B is [N, K] row-major (the weight layout of a linear layer) or, with b_kn, [K, N]
// row-major. bf16 or fp16 inputs (both the same), fp32 accumulation, bf16 / fp16 / fp32 output. M, N, K are
// multiples of 8 (16-byte rows for TMA), tails of the tile shape are handled.
// fp8 e4m3 inputs (DType::F8E4M3, both A and B; Hopper only): B as [N, K] (wgmma reads 8-bit operands K-major
// only), K a multiple of 16. Per-tensor scales go into alpha (alpha = scale_a * scale_b). The tensor cores add the
// e4m3 products with fewer than fp32's mantissa bits (no promotion to CUDA-core fp32 sums: cuBLASLt's
// CUBLASLT_MATMUL_DESC_FAST_ACCUM mode); docs/gemm.md "FP8". Stream-ordered; the kernel is
// compiled at first use by Loom's JIT and cached.
//
// On sm_90 the Hopper kernel runs (kernels/gemm.cuh: TMA + wgmma, warp-specialised, persistent); on sm_80 /
// sm_89, or with force_sm80, the mma.sync kernel (kernels/gemm_sm80.cuh).
//
// Split-K tail (GemmConfig::tail_splits >= 2, Hopper kernel without clusters): the last, partial wave's tiles are
// split along K over more CTAs and reduced through an fp32 workspace that loom::gemm owns per (device, stream)
// (docs/gemm.md "Split-K tail"). The result is bitwise reproducible run to run (a fixed summation order).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <optional>
#include <string>

#include "loom/jit/jit.hpp"
#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/tensor.hpp"

namespace loom {

// Tile configuration of the Hopper kernel (ignored by the sm_80 path, whose tile is fixed).
struct GemmConfig {
    int block_m = 128;  // 64, 128 or 192: one, two or three consumer warpgroups (192: cluster_m 1)
    int block_n = 256;  // multiple of 16 in [16, 256] (<= kGemmMaxBlockN192 = 176 with block_m 192); multiple of 64
                        // when B is [K, N]
    int block_k = 64;   // one 128-byte swizzle row of the inputs: 64 for bf16 / fp16, 128 for fp8 e4m3
                        // (gemm_heuristic sets it from the input type; a config with another value is rejected)
    int stages = 4;
    int cluster_m = 1;      // 1, or 2: CTA pairs along M share the B tile by TMA multicast
    int group_m = 8;        // raster group (M-blocks swept together)
    int grid = 0;           // persistent CTAs; 0 = min(#tiles, #SMs) rounded to whole clusters
    int tail_splits = 1;    // split-K tail: >= 2 splits the tiles after the full waves that many ways along K
                            // (gemm_tail_plan; cluster_m 1 only); 1: every tile whole
    bool tma_store = true;  // epilogue through shared memory + TMA stores; needs beta == 0 (gemm() clears it)
    bool sm80 = false;      // use the mma.sync kernel
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
    const GemmConfig* config = nullptr;  // overrides the heuristic (validated)
    bool force_sm80 = false;             // the portable kernel even on Hopper
};

void gemm(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& opts = {},
          cudaStream_t stream = nullptr);

// The analytic choice: minimise (waves of persistent tiles) x (cost of one tile, from measured per-shape
// efficiency of each BLOCK_M x BLOCK_N: 128 or, for M > 128, 192 rows). A partial last wave costs a whole wave, or,
// split s ways along K (gemm_tail_plan), 1 / s + kGemmTailFixupCost of one. Where that plan fills at most half the SMs
// (a skinny GEMM with few tiles), it is redone with the tail planned on every SM: the one partial wave is then the
// whole GEMM, split along K, and the grid becomes one CTA per split unit. Deterministic and printable
// (GemmConfig::str()). split_tail = false: never split the tail (gemm_rs / gemm_ar, whose hooked kernels publish every
// tile). tiles: GemmTiles::Overlap for the overlapped GEMMs (see there).
// LOOM_GEMM_TAIL_SPLITS=0 (or 1) turns the split off, =n >= 2 forces n splits where there is a tail.
enum class GemmTiles {
    // loom::gemm: 128- and 192-row tiles, their efficiencies fitted to bench-gemm sweeps (session 14), 128 x 256
    // preferred within kGemmTileMargin.
    Plain,
    // The overlapped GEMMs (ag_gemm, gemm_rs, gemm_ar): 128-row tiles only (their hooks align M-blocks with the
    // ranks' row chunks, which 192 rarely divides), weighed as Plain weighs them (the hooked kernels share the plain
    // kernel's mainloop; docs/overlap.md "Session 17": session 8's table had made ag_gemm take 128 x 256 where the
    // plain GEMM measured faster with 240- or 176-wide tiles).
    Overlap,
};
// `in`: the input type (its size sets block_k and so the k-blocks the split tail counts).
GemmConfig gemm_heuristic(int64_t m, int64_t n, int64_t k, bool b_kn, int arch, int num_sms, bool split_tail = true,
                          GemmTiles tiles = GemmTiles::Plain, DType in = DType::BF16);

// fp8's 2-CTA clusters (gemm_heuristic) need at least this many SMs: measured faster on a whole H200 (132), 1.8x
// slower than single-CTA tiles on a 26-SM MPS share.
inline constexpr int kGemmFp8ClusterMinSms = 100;

// The widest BLOCK_N of 192-row tiles: their 512-thread CTA compiles under a 128-register cap. wgmma n208 does not
// compile under it (ptxas: "Insufficient registers (128)"), and 192-wide tiles spill in the affine, [K, N]-B and
// split-tail kernels (tests/unit/test_gemm_compile.cpp checks every 192-row kernel for spills).
inline constexpr int kGemmMaxBlockN192 = 176;

// The heuristic's preference for 128 x 256 tiles: another tile must be this much cheaper by the cost model, whose
// fitted per-tile efficiencies spread +-1-2 % between runs (e.g. 128 x 224 at N = 8192: 0.2 % cheaper by the model,
// measured 0.5 % slower over two calls).
inline constexpr double kGemmTileMargin = 0.01;

// Heuristic cost of a split tail's fix-up (writing, and in one CTA reading back, the fp32 partials), in tiles.
inline constexpr double kGemmTailFixupCost = 0.1;
// A persistent plan of 64-row tiles that fills between a third and a half of the SMs runs whole, not split on every
// SM, when K has at most this many k-blocks (gemm_heuristic; docs/gemm.md "Session 23").
inline constexpr int64_t kGemmSkinnyWholeMaxKBlocks = 128;
// Between this M and 128 a thin wave of 128-row tiles gives way to 64 x 64 tiles over both M-blocks, whole (the same
// k-block bound; gemm_heuristic, docs/gemm.md "Session 23"): below it the second M-block is mostly past M.
inline constexpr int64_t kGemmNarrowMinM = 96;

// The split-K tail of the Hopper kernel with `grid` persistent CTAs (kernels/gemm.cuh, tile/tile_order.hpp).
struct GemmTailPlan {
    int64_t tiles = 0;       // output tiles
    int64_t dp_tiles = 0;    // computed whole: floor(tiles / grid) * grid, the full waves
    int64_t tail_tiles = 0;  // tiles - dp_tiles
    int splits = 1;          // K-splits of each tail tile; 1: no split tail
    int64_t units() const { return dp_tiles + tail_tiles * splits; }
};
// `requested` splits: 0 = automatic, min(grid / tail_tiles, num_k_blocks / 4); n >= 1: n, capped at the number of
// k-blocks (every split gets at least one). splits is 1 when that leaves < 2, when there is no tail, or for
// cluster_m != 1.
GemmTailPlan gemm_tail_plan(int64_t m, int64_t n, int64_t k, const GemmConfig& cfg, int64_t grid, int requested);

// ---- autotuning (jit/autotune.hpp) -----------------------------------------------------------------------------
// loom::gemm without GemmOptions::config runs, per (M, N, K, types, B layout, epilogue kind, arch, SM count) and
// process, the first of: the autotuner's winner (LOOM_AUTOTUNE=1: every candidate below timed on the caller's stream,
// on a scratch output, the first time the key is seen — a one-off cost of seconds, JIT compiles included — and the
// winner persisted under LOOM_CACHE_DIR/tune/gemm/), a winner persisted by an earlier tuning run, or the heuristic.
// Tune with one process per GPU: ranks sharing a GPU would time each other's work. While the stream captures a graph
// nothing is timed (the heuristic or a persisted winner runs).

// The autotuner's candidates: the heuristic's config first, then what bench-gemm --sweep times — 128-row tiles of every
// BLOCK_N (the most stages that fit, whole tiles), 192-row tiles whole and with the automatic split tail (M > 128),
// 64-row tiles (M <= 64), the heuristic with its split tail toggled, 2-CTA clusters at BLOCK_N 256 and the
// heuristic's (with one CTA per tile where the heuristic clusters). Every candidate passes gemm_validate_config.
std::vector<GemmConfig> gemm_tune_candidates(int64_t m, int64_t n, int64_t k, bool b_kn, DType in, int arch,
                                             int num_sms);
// A config as the autotuner keeps it (JSON of every field), and back; from_json raises loom::Error on a malformed one.
std::string gemm_config_to_json(const GemmConfig& cfg);
GemmConfig gemm_config_from_json(const std::string& json);

// The config loom::gemm runs for these arguments (opts.config if given, else as described above; may tune, and then
// synchronises `stream`). `source`, when given, gets "config", "tuned", "persisted" or "heuristic".
GemmConfig gemm_config_for(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& opts,
                           cudaStream_t stream = nullptr, std::string* source = nullptr);

// ---- building blocks for kernels that reuse the Hopper GEMM with overlap hooks (AllGather+GEMM, GEMM+RS) ----

// JIT spec of gemm_sm90_tma_wgmma (or gemm_sm80_mma_sync when cfg.sm80) with literal template arguments.
// `hooks` names the policy type (default loom::tile::GemmNoHooks); `header` the header that defines it and
// includes loom/kernels/gemm/gemm.cuh. cfg.tail_splits >= 2 selects the split-tail instantiation (the default hooks or
// ag_gemm's: kernels/gemm.cuh admits hooks without epilogue or after-store parts).
// `bias`: the bias element type of a kernel that applies alpha and a bias; std::nullopt for one whose launches have
// alpha = 1 and no bias (TBias = void: the Hopper TMA-store epilogue then stages with stmatrix, no arithmetic; the
// caller makes sure of alpha and bias, and that the config uses that epilogue — gemm_plain_epilogue()).
jit::KernelSpec gemm_kernel_spec(const GemmConfig& cfg, DType in, DType out, std::optional<DType> bias, bool b_kn,
                                 const std::string& hooks = "loom::tile::GemmNoHooks",
                                 const std::string& header = "loom/kernels/gemm/gemm.cuh");

// Whether a Hopper config's launches can take the TBias = void kernel (gemm_kernel_spec with no bias type): the
// TMA-store epilogue (cfg.tma_store, BLOCK_N at least one store box of `out`) with a 16-bit `out`, not the sm_80
// path.
bool gemm_plain_epilogue(const GemmConfig& cfg, DType out);
// The bias type gemm_kernel_spec should get for launches with these options: the bias's type when there is one, none
// (the kernel without epilogue arithmetic) for alpha = 1 where gemm_plain_epilogue() holds, else F32 (unused).
std::optional<DType> gemm_kernel_bias(const GemmConfig& cfg, DType out, const GemmOptions& opts);

// Everything but the hooks object to launch the Hopper kernel: kernel(launch, tmap_a, tmap_b, tmap_d, args, hooks).
// The launch carries the cluster dims (cfg.cluster_m, 1, 1). args has no split tail (tail_splits 1, no
// workspace): loom::gemm adds its own when cfg.tail_splits >= 2.
struct GemmSm90Launch {
    CUtensorMap tmap_a;
    CUtensorMap tmap_b;
    CUtensorMap tmap_d;  // C, for the TMA-store epilogue: kGemmStoreBoxRows-row boxes (per-warp stores); a GEMM
                         // with epilogue hooks re-encodes it with kGemmWholeTileBoxRows
    kernels::GemmArgs args;
    jit::LaunchConfig launch;
};
GemmSm90Launch gemm_sm90_launch(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& opts,
                                const GemmConfig& cfg, int num_sms, cudaStream_t stream);

// The split-K tail of one launch (loom::gemm, and ag_gemm's hooked GEMM): with cfg.tail_splits >= 2, the tail plan
// at the launch's grid (none where the grid leaves no tail; splits capped at the k-blocks), the workspace of
// (device, stream) reserved and l.args' split fields set; returns the splits the launch runs (1: whole tiles; also
// while the stream captures a graph, whose launches must not keep a workspace that a later call may grow). From a
// return >= 2 on, `lock` holds the workspace until the caller's launch is enqueued.
int gemm_bind_split_tail(GemmSm90Launch& l, const GemmConfig& cfg, int64_t m, int64_t n, int64_t k, cudaStream_t stream,
                         std::unique_lock<std::mutex>& lock);

// Persistent grid of the Hopper kernel: min(#tiles, #SMs), rounded to whole clusters.
int64_t gemm_sm90_grid(int64_t m, int64_t n, const GemmConfig& cfg, int num_sms);

// A device scale (GemmOptions::scale_a / scale_b and the overlapped ops'): null, or 4-byte aligned device (or managed)
// memory; raises loom::Error naming `op` and `name` otherwise.
void gemm_check_device_scale(const char* op, const char* name, const float* p);

// Validation shared by gemm() and the overlapped ops: raises loom::Error naming what was expected and given.
// allow_f8: fp8 e4m3 inputs are accepted (loom::gemm and the overlapped ops pass it).
void gemm_validate(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& opts,
                   bool allow_f8 = false);
// `in`: the input type, whose 128-byte rows set the expected block_k.
void gemm_validate_config(const GemmConfig& cfg, bool b_kn, DType in = DType::BF16);

}  // namespace loom
