// The overlapped ops' GEMMs: the Hopper GEMM with a hooks policy (kernels/overlap/*.cuh), and loom::gemm into a parity
// half for the sequential algorithms.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>

#include "loom/jit/jit.hpp"
#include "loom/kernels/overlap/overlap_params.hpp"
#include "loom/ops/overlap.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "ops/overlap/common/checks.hpp"
#include "ops/overlap/common/state.hpp"

namespace loom::overlap {

GemmOptions gemm_options(const OpScale& s);

// Where a hooks policy's kernel applies the products' scale: on the accumulators after the mainloop (the policies
// tile::kScalesAccumulators names: AgGemmHooks, RsAccHooks, RsPullHooks; the kernel's epilogue stays the unscaled
// one) or in the affine epilogue (TileNotifyHooks, ArEpilogueHooks: TBias = float where `sc` is not 1).
enum class ScaleAt { Accumulators, Epilogue };

// Launch the Hopper GEMM with a hooks policy whose kernel scales `at` (as tile::kScalesAccumulators says);
// `hook_args` are the hooks' bytes (trivially copyable); the products scaled by `sc`.
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

// TileNotifyHooks' arguments (gemm_rs's scatter-reduce, gemm_ar's reduce kernel): tile[i] := epoch once the GEMM
// stored tile i, in the grouped raster rotated by shift_m M-blocks.
kernels::overlap::TileNotifyHookArgs tile_notify_args(uint64_t* tile, uint64_t epoch, int64_t num_n, int32_t shift_m);

// A communication kernel of `blocks` blocks of `threads` on `side` (the caller forked it), with `args`.
template <class... Args>
void launch_on_side(const jit::Kernel& kernel, const SideStream& side, unsigned blocks, unsigned threads,
                    const Args&... args) {
    jit::LaunchConfig lc;
    lc.grid = dim3(blocks);
    lc.block = dim3(threads);
    lc.stream = side.stream;
    kernel(lc, args...);
}

// Compile (or fetch from the JIT cache) the hooked GEMM that launch_gemm will launch for these operands, so that a
// JIT error is raised before the op advances its call counters.
void prepare_gemm(const char* hooks, const char* header, const MatrixView& a, const MatrixView& c,
                  const GemmConfig& cfg, const OpScale& sc, ScaleAt at);

// The sequential algorithms' first step: loom::gemm into this call's parity half of `partials` ([M, N] of `dtype`, the
// products scaled by `sc`); advances partials.calls and returns the half (the halves alternate with the other calls
// that share `partials`).
// Captured in a CUDA graph (`captured`: check_capture's answer), every replay writes the half picked at capture (the
// caller makes that safe: gemm_rs meets its peers first, gemm_ar's all_reduce lets no peer read a rank's input after it
// completes there).
char* gemm_into_parity_half(World& world, PartialHalves& partials, const MatrixView& a, const MatrixView& b,
                            DType dtype, const OpScale& sc, cudaStream_t stream, bool captured);

}  // namespace loom::overlap
