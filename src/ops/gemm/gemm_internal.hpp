// loom::gemm's internals: the heuristic and the split-tail plan, the autotuner's candidates, validation, and the
// launch builders that the overlapped GEMMs (src/ops/overlap/) reuse with their hooks.
//
// Files of src/ops/gemm/: gemm.cpp (the entry: validate, choose, dispatch), heuristic.cpp (the analytic choice and the
// tile plans), tune.cpp (the config choice per key, the autotuner), validate.cpp, launch_sm90.cpp (kernel spec, tensor
// maps, the Hopper launch), launch_sm80.cpp, gemv.cpp (the weight-streaming kernel for decode-sized M), split_tail.cpp
// (the split-K workspace per device and stream).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "loom/jit/jit.hpp"
#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/runtime/world.hpp"

namespace loom {

// ---- the analytic choice -----------------------------------------------------------------------------------------

// Which tiles gemm_heuristic weighs.
enum class GemmTiles {
    // loom::gemm: 128- and 192-row tiles (64-row ones for M <= 64), 128 x 256 preferred within kGemmTileMargin.
    Plain,
    // The overlapped GEMMs (ag_gemm, gemm_rs, gemm_ar): 128-row tiles only (their hooks align M-blocks with the ranks'
    // row chunks, which 192 rarely divides), weighed as Plain weighs them (the hooked kernels share the plain kernel's
    // mainloop and epilogue); no clusters.
    Overlap,
};

// The analytic choice, a pure function of its arguments: minimise (waves of persistent tiles) x (cost of one tile,
// from the measured efficiency of each BLOCK_M x BLOCK_N). A partial last wave costs a whole wave, or, split s ways
// along K (gemm_tail_plan), 1 / s + kGemmTailFixupCost of one. Where that plan fills at most half the SMs (a skinny
// GEMM with few tiles), it is redone with the tail planned on every SM: the one partial wave is then the whole GEMM,
// split along K, and the grid becomes one CTA per split unit. split_tail = false: never split the tail (gemm_rs /
// gemm_ar, whose hooked kernels publish every tile). `in`: the input type (its size sets block_k and so the k-blocks
// the split tail counts).
GemmConfig gemm_heuristic(int64_t m, int64_t n, int64_t k, bool b_kn, int arch, int num_sms, bool split_tail = true,
                          GemmTiles tiles = GemmTiles::Plain, DType in = DType::BF16);

// fp8's 2-CTA clusters need at least this many SMs: faster on a whole H200 (132, docs/perf/gemm_fp8.json), slower than
// single-CTA tiles on a 26-SM MPS share (docs/perf/ag_gemm_fp8.json: gemm_us at 4 ranks on one H200).
inline constexpr int kGemmFp8ClusterMinSms = 100;
// K-clusters (GemmConfig::cluster_k) are planned (gemm_cluster_k_plan: the decode plan's and the autotuner's) only on
// at least this many SMs: a cluster of up to 8 CTAs needs that many SMs free in one GPC, which a small MPS share may
// not give.
inline constexpr int kGemmClusterKMinSms = 100;

// The widest BLOCK_N of 192-row tiles: their 512-thread CTA compiles under a 128-register cap. wgmma n208 does not
// compile under it (ptxas: "Insufficient registers (128)"), and 192-wide tiles spill in the affine, [K, N]-B and
// split-tail kernels (tests/unit/test_gemm_compile.cpp checks every 192-row kernel for spills).
inline constexpr int kGemmMaxBlockN192 = 176;

// The heuristic's preference for 128 x 256 tiles: another tile must be this much cheaper by the cost model, whose
// fitted per-tile efficiencies spread +-1-2 % between runs (docs/perf/gemm_sweep.json).
inline constexpr double kGemmTileMargin = 0.01;

// Heuristic cost of a split tail's fix-up (writing, and in one CTA reading back, the fp32 partials), in tiles.
inline constexpr double kGemmTailFixupCost = 0.1;
// A persistent plan of 64-row tiles that fills between a third and a half of the SMs runs whole, not split on every
// SM, when K has at most this many k-blocks (docs/perf/gemm_skinny.json).
inline constexpr int64_t kGemmSkinnyWholeMaxKBlocks = 128;
// Between this M and 128 a thin wave of 128-row tiles gives way to 64 x 64 tiles over both M-blocks, whole (the same
// k-block bound): below it the second M-block is mostly past M (docs/perf/gemm_skinny.json).
inline constexpr int64_t kGemmNarrowMinM = 96;

// The largest M, N or K: the kernels' int32 row, column and k-block indices reach one tile (<= 256) past the edge.
inline constexpr int64_t kGemmMaxDim = INT32_MAX - 256;
// The largest raster group a config may ask for (M-blocks per group; the tile orders multiply it by the N-blocks in
// int32, and past the M-blocks of a GEMM a group is all of them).
inline constexpr int kGemmMaxGroupM = 1024;
// The largest persistent grid a config may ask for: the scheduler steps its tile index by the grid in int32.
inline constexpr int kGemmMaxGrid = 1 << 20;

// The most K-splits of a tail tile: the kernel packs (tail tile << 8) | split into an int32.
inline constexpr int kGemmMaxTailSplits = 256;

// Decode GEMMs (M <= kGemmDecodeMaxM, loom::gemm's plain tiles with the split tail allowed): the heuristic's persistent
// plan competes with the decode plan's whole and split-K plans of every BLOCK_N (gemm_decode_plan).
inline constexpr int64_t kGemmDecodeMaxM = 128;
// A decode plan replaces the persistent one only when the model finds it this much cheaper (the measured persistent
// plans of docs/perf/gemm_skinny.json stay where the model cannot tell them apart).
inline constexpr double kGemmDecodeMargin = 0.02;

// The split-K tail of the Hopper kernel with `grid` persistent CTAs (kernels/gemm/gemm.cuh, tile/tile_order.hpp).
struct GemmTailPlan {
    int64_t tiles = 0;       // output tiles
    int64_t dp_tiles = 0;    // computed whole: floor(tiles / grid) * grid, the full waves
    int64_t tail_tiles = 0;  // tiles - dp_tiles
    int splits = 1;          // K-splits of each tail tile; 1: no split tail
    int64_t units() const { return dp_tiles + tail_tiles * splits; }
};
// `requested` splits: 0 = automatic, min(grid / tail_tiles, num_k_blocks / 4); n >= 1: n, capped at the number of
// k-blocks (every split gets at least one). splits is 1 when that leaves < 2, when there is no tail, or for
// cluster_m != 1 or cluster_k != 1.
GemmTailPlan gemm_tail_plan(int64_t m, int64_t n, int64_t k, const GemmConfig& cfg, int64_t grid, int requested);

// Persistent grid of the Hopper kernel: min(#tiles, #SMs), rounded to whole clusters; with K-clusters (cluster_k > 1)
// one cluster per tile, tiles x cluster_k.
int64_t gemm_sm90_grid(int64_t m, int64_t n, const GemmConfig& cfg, int num_sms);

// The decode plan's bandwidth model: the time in us that `cfg` (as the launch runs it: its grid, its split tail at that
// grid) takes to stream the weights on a GPU of `num_sms` SMs. Each CTA runs its units one after another, each at a
// fixed cost plus its k-blocks (B's BLOCK_N rows, from memory, at a per-SM rate set by the B bytes its ring keeps in
// flight; A from L2); the slowest CTA and the memory's rate for the weights bound the time together; a split plan adds
// its fix-up (the completing CTA's hand-off and slot reads). Relative: for choosing between configs of one shape.
double gemm_decode_cost_us(int64_t m, int64_t n, int64_t k, const GemmConfig& cfg, int num_sms);

// The decode plan for M <= kGemmDecodeMaxM: `persistent` (the heuristic's plan without it), or the cheapest by
// gemm_decode_cost_us of 64-row (M <= 64) or 128-row tiles of every BLOCK_N >= 64 (multiples of 64 with B as [K, N]),
// whole on the persistent grid or split s = 2..64 ways along K on every SM (each split at least 2 k-blocks), where it
// is more than kGemmDecodeMargin cheaper than `persistent`. It weighs K-clusters and, for 64 < M <= 128, M-clusters
// too (gemm_decode_candidates) but does not choose them: measured, its model does not rank K-clusters and M-clusters
// lost at 43 of 44 shapes (docs/gemm.md); the autotuner's candidates include K-clusters.
GemmConfig gemm_decode_plan(int64_t m, int64_t n, int64_t k, bool b_kn, int num_sms, const GemmConfig& persistent);

// `tile` (its block_m, block_n, block_k and stages; a plain or decode plan's tile) as K-clusters of `s` CTAs (2, 4 or
// 8) for an M x N x K GEMM: one cluster per tile, the ring deep enough for the partial, the direct epilogue. None where
// the launch would not be one wave (tiles x s > num_sms), on fewer than kGemmClusterKMinSms SMs, where s does not
// divide the tile's 8-column fragments, or where a rank would stream fewer than 2 k-blocks.
std::optional<GemmConfig> gemm_cluster_k_plan(const GemmConfig& tile, int64_t m, int64_t n, int64_t k, int s,
                                              int num_sms);

// Every plan gemm_decode_plan weighs, `persistent` first, each with its gemm_decode_cost_us (bench-gemm --decode-sweep
// times them to check the model's ranking).
struct GemmDecodeCandidate {
    GemmConfig config;
    double cost_us = 0;
};
std::vector<GemmDecodeCandidate> gemm_decode_candidates(int64_t m, int64_t n, int64_t k, bool b_kn, int num_sms,
                                                        const GemmConfig& persistent);

// ---- autotuning (jit/autotune.hpp) -------------------------------------------------------------------------------

// The autotuner's candidates: loom::gemm's heuristic config first (the gemv plan where gemm_gemv_preferred, followed by
// gemm_heuristic's Hopper plan), then what bench-gemm --sweep times — 128-row tiles of every
// BLOCK_N (the most stages that fit, whole tiles), 192-row tiles whole and with the automatic split tail (M > 128),
// 64-row tiles (M <= 64), the heuristic with its split tail toggled, 2-CTA clusters at BLOCK_N 256 and the
// heuristic's (with one CTA per tile where the heuristic clusters). Every candidate passes gemm_validate_config.
std::vector<GemmConfig> gemm_tune_candidates(int64_t m, int64_t n, int64_t k, bool b_kn, DType in, int arch,
                                             int num_sms);
// A config as the autotuner keeps it (JSON of every field), and back; from_json raises loom::Error on a malformed one.
std::string gemm_config_to_json(const GemmConfig& cfg);
GemmConfig gemm_config_from_json(const std::string& json);

// The config loom::gemm runs for these arguments (opts.config if given, else as loom/ops/gemm.hpp describes; may
// tune, and then synchronises `stream`). `source`, when given, gets "config", "tuned", "persisted" or "heuristic".
GemmConfig gemm_config_for(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& opts,
                           cudaStream_t stream = nullptr, std::string* source = nullptr);

// ---- building blocks for kernels that reuse the Hopper GEMM with overlap hooks (AllGather+GEMM, GEMM+RS) ----------

// JIT spec of gemm_sm90_tma_wgmma (or gemm_sm80_mma_sync when cfg.sm80) with literal template arguments.
// `hooks` names the policy type (default loom::tile::GemmNoHooks); `header` the header that defines it and
// includes loom/kernels/gemm/gemm.cuh. cfg.tail_splits >= 2 selects the split-tail instantiation (the default hooks or
// ag_gemm's: kernels/gemm/gemm.cuh admits hooks without epilogue or after-store parts).
// `bias`: the bias element type of a kernel that applies alpha and a bias; std::nullopt for one whose launches have
// alpha = 1 and no bias (TBias = void: the Hopper TMA-store epilogue then stages with stmatrix, no arithmetic; the
// caller makes sure of alpha and bias, and that the config uses that epilogue — gemm_plain_epilogue()).
jit::KernelSpec gemm_kernel_spec(const GemmConfig& cfg, DType in, DType out, std::optional<DType> bias, bool b_kn,
                                 const std::string& hooks = "loom::tile::GemmNoHooks",
                                 const std::string& header = "loom/kernels/gemm/gemm.cuh");

// Whether a Hopper config's kernel stores through TMA: cfg.tma_store, except with K-clusters (each rank stores its own
// columns directly, kernels/gemm/gemm.cuh).
inline bool gemm_tma_store(const GemmConfig& cfg) { return cfg.tma_store && cfg.cluster_k == 1; }

// Whether a Hopper config's launches can take the TBias = void kernel (gemm_kernel_spec with no bias type): the
// TMA-store epilogue (gemm_tma_store, BLOCK_N at least one store box of `out`) with a 16-bit `out`, not the sm_80
// path.
bool gemm_plain_epilogue(const GemmConfig& cfg, DType out);
// The bias type gemm_kernel_spec should get for launches with these options: the bias's type when there is one, none
// (the kernel without epilogue arithmetic) for alpha = 1 where gemm_plain_epilogue() holds, else F32 (unused).
std::optional<DType> gemm_kernel_bias(const GemmConfig& cfg, DType out, const GemmOptions& opts);

// Everything but the hooks object to launch the Hopper kernel: kernel(launch, tmap_a, tmap_b, tmap_d, args, hooks).
// The launch carries the cluster dims (cfg.cluster_m, 1, 1). args has no split tail (tail_splits 1, no
// workspace): gemm_bind_split_tail adds it.
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

// ---- validation --------------------------------------------------------------------------------------------------

// A device scale (GemmOptions::scale_a / scale_b and the overlapped ops'): null, or 4-byte aligned device (or managed)
// memory of `device` (-1: the current device); raises loom::Error naming `op` and `name` otherwise.
void gemm_check_device_scale(const char* op, const char* name, const float* p, int device = -1);
// After gemm_validate: A, B, C and the bias, each whole, are memory `device` may use (one live symmetric allocation of
// `world` when in its heap; world may be null). runtime/pointer_check.hpp.
void gemm_check_memory(const char* op, const MatrixView& a, const MatrixView& b, const MatrixView& c,
                       const GemmOptions& o, const World* world, int device);

// Validation shared by gemm() and the overlapped ops: raises loom::Error naming what was expected and given.
// allow_f8: fp8 e4m3 inputs are accepted (loom::gemm and the overlapped ops pass it).
void gemm_validate(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& opts,
                   bool allow_f8 = false);
// `in`: the input type, whose 128-byte rows set the expected block_k.
void gemm_validate_config(const GemmConfig& cfg, bool b_kn, DType in = DType::BF16);

namespace detail {

inline constexpr int64_t gemm_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct GemmDevice {
    int device = 0;
    int arch = 0;     // e.g. 90
    int num_sms = 0;  // as the device reports it (an MPS client's share where MPS limits it)
};
// The current device's, cached per device.
GemmDevice gemm_device();
// Whether loom::gemm runs the sm_80 kernel: below sm_90, or forced (GemmOptions::force_sm80).
bool gemm_takes_sm80(const GemmOptions& o, const GemmDevice& dev);

// gemm_heuristic with the cluster size given (1 or 2) instead of chosen: what the heuristic would plan with that
// cluster size (bench-gemm --heuristic-cluster). gemm_heuristic is this with its own choice.
GemmConfig gemm_heuristic_clustered(int64_t m, int64_t n, int64_t k, bool b_kn, int arch, int num_sms, bool split_tail,
                                    GemmTiles tiles, DType in, int cluster_m);

// Stages (kernels::gemm_sm90_plan_stages: the most that fit, <= 12), raster group (about sqrt(SMs x BLOCK_N / BLOCK_M)
// M-blocks) and persistent grid of a tile choice, as gemm_heuristic sets them; tail_splits is left as it is.
void gemm_complete_config(GemmConfig& c, int64_t m, int64_t n, int num_sms);

// gemm_config_for() for the device `dev` (loom::gemm has looked it up already).
GemmConfig gemm_config_for(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o,
                           const GemmDevice& dev, cudaStream_t stream, std::string* source);

// Set on this thread while an overlapped op's candidates are timed (src/ops/overlap/common/tune.cpp): loom::gemm calls
// made by those candidates (the sequential algorithms' GEMM) then take the heuristic, neither timing nor remembering
// anything — a rank whose GEMM key was already decided would otherwise skip a tuning its peers run, and wait for them
// inside the collective part for seconds.
bool& gemm_tuning_suppressed();

// Launches validated inputs with `cfg` as loom::gemm does after choosing it: the sm_80 path where forced or below
// sm_90, the direct-store epilogue for beta != 0, the split tail bound to (device, stream). Raises loom::Error on a
// config the inputs cannot take. `source` names where cfg came from, printed with the config at log level debug;
// nullptr prints nothing.
void gemm_launch(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o, GemmConfig cfg,
                 const GemmDevice& dev, cudaStream_t stream, const char* source);

// The split-K workspace of (device, stream) with room for `partial_floats` fp32 slots and `num_counters` arrival
// counters (zero between launches: each launch leaves them zero), locked in `lock` until the caller's launch is
// enqueued; null pointers while the stream captures a graph (a captured launch must not keep a workspace that a later
// call may grow). split_tail.cpp.
struct GemmSplitWorkspace {
    float* partials = nullptr;
    uint32_t* counters = nullptr;
};
GemmSplitWorkspace gemm_split_workspace(cudaStream_t stream, size_t partial_floats, size_t num_counters,
                                        std::unique_lock<std::mutex>& lock);

// ---- the weight-streaming kernel for decode-sized M (gemv.cpp, kernels/gemm/gemv.cuh) --------------------------

// Whether the gemv kernel takes these inputs: M <= kernels::kGemvMaxM, B as [N, K], a GPU whose mma.sync takes the
// input type (sm_80, fp8 sm_89).
bool gemm_gemv_supported(int64_t m, bool b_kn, DType in, int arch);
// Whether loom::gemm's heuristic takes it over the Hopper kernel's decode plan: where it measured faster on an H200
// (docs/perf/gemm_decode.json, bench-gemm --decode-sweep): 16-bit inputs, rows of at least
// kGemvPreferMinKBytesOneTile at M <= 8 (one n8 tile of A's rows) and of at least kGemvPreferMinKBytes at
// M <= kGemvPreferMaxM. Elsewhere the Hopper plan's whole tiles are faster: fp8 (slower at 7 of 8 shapes at M = 1) and
// M = 32 run at mma.sync's rate rather than the memory's, and shorter rows stream faster in 64 x 64 tiles.
inline constexpr int64_t kGemvPreferMaxM = 16;
inline constexpr int64_t kGemvPreferMinKBytes = 4096;
inline constexpr int64_t kGemvPreferMinKBytesOneTile = 2048;
bool gemm_gemv_preferred(int64_t m, int64_t k, bool b_kn, DType in, int arch);
// The gemv plan: 64-row blocks of B, a ring sized for two CTAs per SM, and K split so that blocks x splits fill the
// SMs once (each split at least kGemvMinSlicesPerSplit slices of 256 bytes, at most 32 splits; none where the blocks
// alone fill them).
GemmConfig gemm_gemv_plan(int64_t m, int64_t n, int64_t k, DType in, int num_sms);
// JIT spec of gemm_gemv_mma for M rows of A (its n8 tiles: 1, 2 or 4) and a ring of `stages`; `bias` as
// gemm_kernel_bias gives it (none: an f32 bias type, unused without a bias); `cluster`: its K-splits sum in a cluster
// (sm_90), else through the workspace.
jit::KernelSpec gemm_gemv_kernel_spec(DType in, DType out, std::optional<DType> bias, int64_t m, int stages,
                                      bool cluster);
// The launch for a config with gemv set, inputs that gemm_gemv_supported takes, on a GPU of compute capability
// `arch` (from sm_90, M <= 8 sums up to kGemvMaxClusterSplits K-splits in a cluster).
void gemm_launch_gemv(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o,
                      const GemmConfig& cfg, std::optional<DType> bias, int arch, cudaStream_t stream,
                      const char* source);

// The two kernels' launches for a checked config (cfg.sm80 selects the first); `bias` as gemm_kernel_bias gives it.
void gemm_launch_sm80(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o,
                      const GemmConfig& cfg, std::optional<DType> bias, cudaStream_t stream, const char* source);
void gemm_launch_sm90(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o,
                      GemmConfig cfg, std::optional<DType> bias, int num_sms, cudaStream_t stream, const char* source);

// Prints "loom::gemm M= N= K=: <config> (<source>)" to stderr at log level debug; nothing for a null source.
void gemm_log_config(int64_t m, int64_t n, int64_t k, const GemmConfig& cfg, const char* source);

// The kernels' arguments for whole tiles (no split tail); gemm_bind_split_tail sets the split-tail fields.
kernels::GemmArgs gemm_whole_tile_args(const MatrixView& c, int64_t m, int64_t n, int64_t k, const GemmOptions& o);

}  // namespace detail
}  // namespace loom
