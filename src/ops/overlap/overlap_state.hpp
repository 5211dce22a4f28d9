// Per-World state of the overlapped ops (ag_gemm, gemm_rs, gemm_ar): one OpState per op kind holding the
// symmetric signal block, the op's symmetric and local buffers, a side stream with its fork / join events and
// the host-side call counters from which every signal target is computed.
//
// Created on the first call of an op on a World (collective: every rank makes the same first call) and kept until
// release_overlap_state(world). Calls on one World must come from one thread at a time (as for collectives).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "loom/kernels/overlap/overlap_params.hpp"
#include "loom/ops/overlap.hpp"

namespace loom::overlap {

// GemmRsFused and GemmRsPull have their own signals and buffers: calls may switch gemm_rs algorithms, and no
// algorithm's write-after-read protocol covers another's buffers.
// AgGemmDirect likewise: its staging halves are read by peers' GEMMs while another producer's gather buffer would be
// written. GemmArFused, GemmRsFusedSm: gemm_ar's fused epilogue and gemm_rs's with the SM transport number their calls
// on the device (Signals::launches), which the host counters of the other algorithms (and of gemm_rs's copy-engine
// transport, GemmRsFused) cannot follow.
enum class OpKind : int {
    AgGemm = 0,
    GemmRs = 1,
    GemmAr = 2,
    GemmRsFused = 3,
    AgGemmDirect = 4,
    GemmRsSequential = 5,
    GemmRsPull = 6,
    GemmArFused = 7,
    GemmRsFusedSm = 8
};

struct OpState {
    kernels::overlap::Signals* sig = nullptr;  // symmetric, zeroed once
    void* sym = nullptr;                       // op buffer in the symmetric heap (gather / scratch / partials)
    std::size_t sym_bytes = 0;
    void* local = nullptr;  // local buffer (gemm_rs: the partial product)
    std::size_t local_bytes = 0;
    cudaStream_t side = nullptr;
    cudaEvent_t forked = nullptr, joined = nullptr;
    std::uint64_t calls = 0;          // this op's calls on this World (the epoch of the current call)
    std::uint64_t chunk_total = 0;    // ag_gemm: target of Signals::chunk after the current call
    std::uint64_t started_total = 0;  // ag_gemm (Sm producer): target of Signals::started
    std::uint64_t freed_total = 0;    // gemm_rs: Signals::freed a peer reaches once it finished the last call
    // gemm_rs fused, copy-engine transport: Signals::tile[m_block] (tiles of that M-block stored to the outbox,
    // cumulative over calls) once the current call's GEMM is done.
    std::vector<std::uint64_t> stored_total;
    int arch = 0;
    int device_sms = 0;       // cudaDevAttrMultiProcessorCount (under MPS: this client's share)
    bool shared_gpu = false;  // another rank runs on this GPU (ranks_share_gpu)
    int num_sms = 0;          // the SMs this process can occupy (overlap_usable_sms): what the plans divide
    int device = 0;
};

// The op's state, created (collectively) on first use; raises for a World the overlapped ops do not support. While
// capturing a CUDA graph (`captured`) it must exist already: creating it synchronises the device.
OpState& op_state(World& world, OpKind kind, const char* op, bool captured = false);

// st.sym with at least `bytes` (collective: every rank asks for the same sizes in the same calls). Growing
// synchronises the device and meets every rank first (peers may still read the old buffer), then reallocates; while
// capturing a CUDA graph (`captured`) it raises instead.
void* ensure_symmetric(World& world, OpState& st, std::size_t bytes, bool captured = false);
// st.sym as two parity halves of at least `half_bytes` each (ensure_symmetric's collective growth); returns the
// offset of half 1 (half e % 2 of call e starts at (e % 2) x that). The halves sit at half of the allocation, 1 KiB
// aligned, not at this call's size: the same on every rank and in every call between growths, so a smaller call right
// after a larger one does not write its half inside the previous call's, which peers may still be reading.
std::size_t ensure_parity_halves(World& world, OpState& st, std::size_t half_bytes, bool captured = false);
// st.local with at least `bytes` (cudaMalloc; the device is synchronised before a reallocation).
void* ensure_local(OpState& st, std::size_t bytes);

// The side stream starts after everything enqueued on `stream` so far (fork) and `stream` continues after
// everything enqueued on the side stream (join).
void fork(OpState& st, cudaStream_t stream);
void join(OpState& st, cudaStream_t stream);

// Shared validation: raises loom::Error naming what was expected and given.
void check_inputs(const char* op, const MatrixView& a, const MatrixView& b, const MatrixView& c);
// An op's scale of its products: the options' alpha and device scales (scale_a / scale_b, null: 1). As GemmOptions
// (gemm_options) they reach loom::gemm and the hooked GEMM's GemmArgs (gemm_sm90_launch); the hooked kernel applies
// them on the accumulators or in its affine epilogue (ScaleAt below).
struct OpScale {
    float alpha = 1.f;
    const float* a = nullptr;
    const float* b = nullptr;
};
template <class Opts>
OpScale scale_of(const Opts& o) {
    return OpScale{o.alpha, o.scale_a, o.scale_b};
}
void check_scale(const char* op, const OpScale& s);  // alpha finite; the device scales as gemm_check_device_scale
GemmOptions gemm_options(const OpScale& s);
// in: the input type (its block_k). split_tail_ok: the op's hooks publish nothing per tile, so its GEMM may split the
// tail (ag_gemm; the kernel spec names those hooks, gemm_kernel_spec); otherwise tail_splits must be 1.
void check_config(const char* op, const GemmConfig& cfg, DType in, bool split_tail_ok = false);
// The caller's tile, when given, in place of the plan's (a grid of 0 is planned on the SMs the plan leaves to the
// GEMM: num_sms minus the comm blocks and the reserved SMs); then check_config.
void use_config(const char* op, OverlapPlan& plan, const GemmConfig* config, int64_t m, int64_t n, int num_sms,
                DType in, bool split_tail_ok = false);
// Raises unless cfg's tiles over [m, n] fit the per-tile signals (kMaxTileSignals).
void check_tile_count(const char* op, int64_t m, int64_t n, const GemmConfig& cfg);
// The sequential algorithms' first step: loom::gemm into this call's parity half of st's symmetric buffer ([M, N] of
// `dtype`, the products scaled by `sc`); advances st.calls and returns the half (the halves alternate with the op's
// other algorithms' calls).
// Captured in a CUDA graph (`captured`: check_capture's answer), every replay writes the half picked at capture (the
// caller makes that safe: gemm_rs meets its peers first, gemm_ar's all_reduce lets no peer read a rank's input after it
// completes there).
char* gemm_into_parity_half(World& world, OpState& st, const MatrixView& a, const MatrixView& b, DType dtype,
                            const OpScale& sc, cudaStream_t stream, bool captured);
// Where a hooks policy's kernel applies the products' scale: on the accumulators after the mainloop (the policies
// tile::ScalesAccumulators names: AgGemmHooks, RsAccHooks, RsPullHooks; the kernel's epilogue stays the unscaled
// one) or in the affine epilogue (TileNotifyHooks, ArEpilogueHooks: TBias = float where `sc` is not 1).
enum class ScaleAt { Accumulators, Epilogue };
// Launch the Hopper GEMM with a hooks policy whose kernel scales `at` (as tile::ScalesAccumulators says);
// `hook_args` are the hooks' bytes (trivially copyable); the products scaled by `sc`.
template <class HookArgs>
void launch_gemm(const char* hooks, const char* header, const MatrixView& a, const MatrixView& b, const MatrixView& c,
                 const GemmConfig& cfg, int num_sms, cudaStream_t stream, const HookArgs& hook_args, const OpScale& sc,
                 ScaleAt at);

// Compile (or fetch from the JIT cache) the hooked GEMM that launch_gemm will launch for these operands, so that a
// JIT error is raised before the op advances its call counters.
void prepare_gemm(const char* hooks, const char* header, const MatrixView& a, const MatrixView& c,
                  const GemmConfig& cfg, const OpScale& sc, ScaleAt at);

// Whether `stream` is capturing a CUDA graph; raises if it is and the call's algorithm cannot be replayed
// (`replayable`). Replayable: the Sequential algorithms (AgProducer / RsAlgo / ArAlgo::Sequential: loom::gemm and the
// collectives, whose callers make their buffer reuse replay-safe), gemm_ar's fused epilogue and gemm_rs's with the SM
// transport (their call numbers and buffer halves are the device's). The other overlapped algorithms compute their
// signal targets and pick their buffer halves on the host, per call: a replayed graph would repeat one call's targets
// and halves, and its waits would pass on the previous replay's signals (wrong results) or never (a hang). Called
// before the op touches any state, so a refused capture stays valid and the caller can end it.
bool check_capture(cudaStream_t stream, const char* op, bool replayable);

bool debug();  // LOOM_OVERLAP_DEBUG

// Communication blocks of an op on `num_sms` usable SMs (overlap_usable_sms): `requested` (> 0, the caller's
// comm_sms) or the op's default `dflt` capped at a quarter of the SMs; never more than num_sms - 1 nor
// kMaxCommBlocks. Deadlock freedom rests on the cap: the comm kernel starts concurrently with the GEMM and its
// blocks spin (waiting for tiles, or for each other in gemm_rs's phase 2), so they must leave at least one SM to
// the GEMM (whose CTAs never wait in gemm_rs / gemm_ar), and all P of them must fit at once once the GEMM is done.
int comm_blocks(int requested, int dflt, int num_sms);

// Fused epilogues (gemm_rs's and gemm_ar's epilogue hooks stage each warpgroup's whole part of the tile): why `cfg`
// cannot stage its tile of `out_bytes` elements ("" when it can): BLOCK_N x out_bytes a multiple of 128 (whole slabs)
// and the stages beside the staged tile within the shared memory.
std::string whole_tile_unfit(const GemmConfig& cfg, int out_bytes);
// `c` adapted to a fused epilogue: BLOCK_N rounded up to whole 128-byte slab rows (the heuristic picks 144 or 160 on
// small shapes), then the stages that fit beside the staged tile (at most 12; at least 3, narrowing BLOCK_N by 64 if
// needed: 128 x 256 bf16 gets 3). The grid is left to the caller.
GemmConfig whole_tile_config(GemmConfig c, int out_bytes);

// The GEMM of an overlapped op on `gemm_sms` SMs: the plain heuristic, one CTA per tile (the hooks order single
// tiles), TMA-store epilogue (after_store publishes completed bulk stores), grid sized to those SMs. split_tail: the
// heuristic's split-K tail too (ag_gemm, whose hooks publish nothing per tile; gemm_rs / gemm_ar cannot take it).
// in: the input type (block_k: 64 for 16-bit inputs, 128 for fp8).
GemmConfig gemm_config(int64_t m, int64_t n, int64_t k, int arch, int gemm_sms, bool split_tail = false,
                       DType in = DType::BF16);
// Output tiles of cfg's BLOCK_M x BLOCK_N over [m, n].
int64_t tile_count(int64_t m, int64_t n, const GemmConfig& cfg);
// Narrows cfg.group_m to the largest divisor of `blocks_per_rank` (M-blocks of one rank's rows) not above it, so that
// no raster group of the rotated orders straddles two ranks' rows.
void groups_inside_bands(GemmConfig& cfg, int64_t blocks_per_rank);

}  // namespace loom::overlap

#include "loom/jit/jit.hpp"
#include "ops/gemm/gemm_internal.hpp"

namespace loom::overlap {
template <class HookArgs>
void launch_gemm(const char* hooks, const char* header, const MatrixView& a, const MatrixView& b, const MatrixView& c,
                 const GemmConfig& cfg, int num_sms, cudaStream_t stream, const HookArgs& hook_args, const OpScale& sc,
                 ScaleAt at) {
    const GemmOptions scaled = gemm_options(sc);
    GemmSm90Launch l = gemm_sm90_launch(a, b, c, scaled, cfg, num_sms, stream);
    const GemmOptions epilogue = at == ScaleAt::Epilogue ? scaled : GemmOptions{};
    // ag_gemm's config may split the tail (gemm_config(..., split_tail = true)): the launch binds the workspace.
    GemmConfig run = cfg;
    std::unique_lock<std::mutex> ws_lock;
    run.tail_splits = gemm_bind_split_tail(l, cfg, a.rows, c.cols, a.cols, stream, ws_lock);
    const jit::Kernel& kernel = jit::get_kernel(
        gemm_kernel_spec(run, a.dtype, c.dtype, gemm_kernel_bias(run, c.dtype, epilogue), false, hooks, header));
    kernel(l.launch, l.tmap_a, l.tmap_b, l.tmap_d, l.args, hook_args);
}
}  // namespace loom::overlap
