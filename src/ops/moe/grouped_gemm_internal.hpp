// loom::grouped_gemm's internals: validation, the config choice, the kernels' JIT specs and launch builders — and the
// hooked launch that the fused MoE ops (ag_moe, moe_rs) use with their hooks policies (kernels/moe/grouped_tiles.cuh).
//
// Files of src/ops/moe/ for grouped_gemm: grouped_gemm.cpp (the entry: validate, choose, dispatch),
// grouped_gemm_validate.cpp, grouped_gemm_plan.cpp (heuristic, config checks), grouped_gemm_launch.cpp (specs, tensor
// maps, arguments, launch dimensions).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "loom/jit/jit.hpp"
#include "loom/kernels/moe/grouped_gemm_params.hpp"
#include "loom/ops/moe.hpp"

namespace loom::moe {

// One grouped_gemm call's operands as the public entry takes them.
struct GroupedGemmProblem {
    MatrixView a, b, c;
    int num_experts = 1;
    const int32_t* offsets = nullptr;
    int num_groups = 1;
    GroupedGemmOptions opts{};

    bool b_kn() const { return opts.b_layout == BLayout::KN; }
    bool swiglu() const { return opts.activation == MoeActivation::SwiGLU; }
    int64_t k() const { return a.cols; }
    int64_t n() const { return b_kn() ? b.cols : b.rows / (num_experts > 0 ? num_experts : 1); }  // product columns
    int64_t n_out() const { return swiglu() ? n() / 2 : n(); }
    // Per-128-block scales given (fp8; the kernels' kBlockScale variant).
    bool block_scaled() const { return opts.scale_a_blocks != nullptr || opts.scale_b_blocks != nullptr; }
    // Rows the grid is planned for: opts.max_rows (at most A's rows), else A's rows.
    int64_t planned_rows() const { return opts.max_rows > 0 && opts.max_rows < a.rows ? opts.max_rows : a.rows; }
};

// Raises loom::Error naming the argument, what was expected and what was given. `device`: the memory checks'
// (runtime/pointer_check.hpp); -1 skips them (CPU tests).
void grouped_gemm_validate(const GroupedGemmProblem& p, int device);

// The analytic choice for a problem of `rows` rows over `groups` groups (a pure function): 64-row tiles when the
// groups average at most 64 rows, else 128; the block_n that wastes the fewest columns of N (ties: the wider),
// narrowed while the tiles would not fill the SMs; the staged epilogue (tma_store); the most stages that fit beside it
// and the row-block prefix (<= 12); the persistent grid min(#SMs, tiles' upper bound). arch < 90 or sm80: the portable
// kernel's fixed tile. block_scale: block_n 128 or 64 (a tile's columns within one 128-column scale block).
GemmConfig grouped_gemm_heuristic(int64_t rows, int64_t n, int64_t k, int groups, bool b_kn, MoeActivation act,
                                  DType in, int arch, int num_sms, bool sm80 = false, bool block_scale = false);
// The most stages (<= 12) of bm x bn tiles that fit in shared memory beside a prefix of `groups` groups (and the
// staged epilogue's buffers when `staged`).
int grouped_gemm_fitting_stages(int bm, int bn, int groups, bool staged);
// Raises loom::Error when the Hopper kernel cannot take `cfg` for this problem (cfg.sm80: the portable kernel's fixed
// tile takes every problem that grouped_gemm_validate accepts).
void grouped_gemm_validate_config(const GemmConfig& cfg, const GroupedGemmProblem& p);
// The config a call runs: opts.config (checked) or the heuristic; the portable kernel below sm_90 or when forced.
GemmConfig grouped_gemm_config(const GroupedGemmProblem& p, int arch, int num_sms);

// Upper bound on the tiles of a launch: (ceil(rows / block_m) + groups) row blocks x n blocks.
int64_t grouped_gemm_max_tiles(int64_t rows, int64_t n_out, int groups, const GemmConfig& cfg, bool swiglu);

// JIT spec of grouped_gemm_sm90 (grouped_gemm_sm80 when cfg.sm80) with literal template arguments. `hooks` names the
// policy type; `header` the header that defines it and includes the kernel's header (a fused op's header includes
// both kernels' headers when it may run either); "" = the kernel's own header. block_scale: the kernel's
// per-128-block scale variant (fp8).
jit::KernelSpec grouped_gemm_kernel_spec(const GemmConfig& cfg, DType in, DType out, bool b_kn, MoeActivation act,
                                         const std::string& hooks = "loom::kernels::moe::GroupedNoHooks",
                                         const std::string& header = "", bool block_scale = false);

// Everything but the hooks object to launch a grouped kernel: Hopper: kernel(launch, tmap_a, tmap_b, args, hooks);
// sm_80 (cfg.sm80): kernel(launch, args, hooks).
struct GroupedGemmLaunch {
    CUtensorMap tmap_a{};
    CUtensorMap tmap_b{};
    kernels::moe::GroupedGemmArgs args{};
    jit::LaunchConfig launch;
    bool sm80 = false;
};
GroupedGemmLaunch grouped_gemm_launch_for(const GroupedGemmProblem& p, const GemmConfig& cfg, int num_sms,
                                          cudaStream_t stream);

// Launch the grouped kernel of `cfg` with a hooks policy: `hooks` its type's name, `header` the header defining it,
// `hook_args` its bytes (trivially copyable). The problem validated, A non-empty.
template <class HookArgs>
void grouped_gemm_launch_hooked(const char* hooks, const char* header, const GroupedGemmProblem& p,
                                const GemmConfig& cfg, int num_sms, cudaStream_t stream, const HookArgs& hook_args) {
    const GroupedGemmLaunch l = grouped_gemm_launch_for(p, cfg, num_sms, stream);
    const jit::Kernel& kernel = jit::get_kernel(grouped_gemm_kernel_spec(
        cfg, p.a.dtype, p.c.dtype, p.b_kn(), p.opts.activation, hooks, header, p.block_scaled()));
    if (l.sm80) {
        kernel(l.launch, l.args, hook_args);
    } else {
        kernel(l.launch, l.tmap_a, l.tmap_b, l.args, hook_args);
    }
}

}  // namespace loom::moe
