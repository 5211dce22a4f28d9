// State of the overlapped ops (ag_gemm, gemm_rs, gemm_ar), owned by the World (loom::WorldState).
//
// Each algorithm declares one state type with the key "overlap/<op>/<algorithm>": its symmetric signals (a struct of
// kernels/overlap/overlap_params.hpp holding the fields it uses), its buffers, a side stream where it has one, and the
// host-side call counters from which its signal targets are computed. op_state<S>() creates it on the algorithm's
// first call on a World (collective: every rank makes the same first call) and the World keeps it until
// release_overlap_state(world) (World::release_states("overlap/")) or its own end. Calls on one World come from one
// thread at a time (as for collectives). The pieces below are what the states are made of; the helpers work on them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "loom/kernels/overlap/overlap_params.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/world.hpp"
#include "loom/runtime/world_state.hpp"
#include "ops/gemm/gemm_internal.hpp"

namespace loom::overlap {

// The device facts every overlapped op plans on (no symmetric memory). Created on the first overlapped call on a
// World: collective, the ranks compare their GPUs through the store.
struct DeviceFacts final : WorldState {
    static constexpr const char* kKey = "overlap/device";
    explicit DeviceFacts(World& world);
    int device = 0;
    int arch = 0;             // compute capability x 10
    int device_sms = 0;       // cudaDevAttrMultiProcessorCount (under MPS: this client's share)
    int num_sms = 0;          // the SMs this process can occupy (overlap_usable_sms): what the plans divide
    bool shared_gpu = false;  // another rank runs on this GPU (collective_topology)
};

// Raises the op's error for a state that a CUDA graph capture (`captured`) would have to create.
void check_state_outside_capture(const char* op, bool captured);

// The World's S (an algorithm's state, or DeviceFacts), created on first use. While capturing a CUDA graph
// (`captured`) it must exist already: creating a state synchronises the device (and meets the peers).
template <class S>
S& op_state(World& world, const char* op, bool captured = false) {
    if (S* s = world.find_state<S>()) return *s;
    check_state_outside_capture(op, captured);
    return world.state<S>();
}

// The World's DeviceFacts (op_state); raises for a World the overlapped ops do not support.
const DeviceFacts& device_facts(World& world, const char* op, bool captured = false);

// An algorithm's symmetric signals: one Sig in the symmetric heap, zeroed once. Creating them meets every rank after
// zeroing, so no peer writes a rank's signals before they are zero. Freed by release() (the state's).
void zero_symmetric_signals(World& world, void* p, std::size_t bytes, const char* key);
template <class Sig>
struct SymmetricSignals {
    Sig* p = nullptr;
    SymmetricSignals(World& world, const char* key) : p(world.alloc<Sig>(1)) {
        zero_symmetric_signals(world, p, sizeof(Sig), key);
    }
    Sig* operator->() const { return p; }
    void release(World& world) {
        if (p) world.free(p);
        p = nullptr;
    }
};

// A symmetric buffer an algorithm grows on demand (gather buffer, scratch, partial products). Freed by release().
struct SymmetricBuffer {
    void* p = nullptr;
    std::size_t bytes = 0;
    void release(World& world);
};

// A local device buffer (cudaMalloc), freed with its state.
struct LocalBuffer {
    void* p = nullptr;
    std::size_t bytes = 0;
    LocalBuffer() = default;
    LocalBuffer(const LocalBuffer&) = delete;
    LocalBuffer& operator=(const LocalBuffer&) = delete;
    ~LocalBuffer();
};

// A side stream with its fork / join events, destroyed with its state.
struct SideStream {
    cudaStream_t stream = nullptr;
    cudaEvent_t forked = nullptr, joined = nullptr;
    SideStream();
    SideStream(const SideStream&) = delete;
    SideStream& operator=(const SideStream&) = delete;
    ~SideStream();
};

// buf with at least `bytes` (collective: every rank asks for the same sizes in the same calls). Growing synchronises
// the device and meets every rank first (peers may still read the old buffer), then reallocates; while capturing a
// CUDA graph (`captured`) it raises instead.
void* ensure_symmetric(World& world, SymmetricBuffer& buf, std::size_t bytes, bool captured = false);
// buf as two parity halves of at least `half_bytes` each (ensure_symmetric's collective growth); returns the offset
// of half 1 (half e % 2 of call e starts at (e % 2) x that). The halves sit at half of the allocation, 1 KiB aligned,
// not at this call's size: the same on every rank and in every call between growths, so a smaller call right after a
// larger one does not write its half inside the previous call's, which peers may still be reading.
std::size_t ensure_parity_halves(World& world, SymmetricBuffer& buf, std::size_t half_bytes, bool captured = false);
// buf with at least `bytes` (cudaMalloc; the device is synchronised before a reallocation).
void* ensure_local(LocalBuffer& buf, std::size_t bytes);

// The side stream starts after everything enqueued on `stream` so far (fork) and `stream` continues after
// everything enqueued on the side stream (join).
void fork(SideStream& side, cudaStream_t stream);
void join(SideStream& side, cudaStream_t stream);

// The sequential algorithms' partial products: loom::gemm's output in parity halves of one symmetric buffer, the half
// chosen by the call counter.
struct PartialHalves {
    SymmetricBuffer buf;
    std::uint64_t calls = 0;  // the calls that wrote a half (the epoch of the current call)
};

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
// The sequential algorithms' first step: loom::gemm into this call's parity half of `partials` ([M, N] of `dtype`, the
// products scaled by `sc`); advances partials.calls and returns the half (the halves alternate with the other calls
// that share `partials`).
// Captured in a CUDA graph (`captured`: check_capture's answer), every replay writes the half picked at capture (the
// caller makes that safe: gemm_rs meets its peers first, gemm_ar's all_reduce lets no peer read a rank's input after it
// completes there).
char* gemm_into_parity_half(World& world, PartialHalves& partials, const MatrixView& a, const MatrixView& b,
                            DType dtype, const OpScale& sc, cudaStream_t stream, bool captured);
// Where a hooks policy's kernel applies the products' scale: on the accumulators after the mainloop (the policies
// tile::kScalesAccumulators names: AgGemmHooks, RsAccHooks, RsPullHooks; the kernel's epilogue stays the unscaled
// one) or in the affine epilogue (TileNotifyHooks, ArEpilogueHooks: TBias = float where `sc` is not 1).
enum class ScaleAt { Accumulators, Epilogue };
// Launch the Hopper GEMM with a hooks policy whose kernel scales `at` (as tile::kScalesAccumulators says);
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
