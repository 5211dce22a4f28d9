// The down projection's fused algorithms (moe_rs, moe_ar): a grouped GEMM into a local partial with MoeRsHooks (a
// counter per stored tile) on the SMs a reduce kernel leaves, the reduce kernel waiting beside it on a side stream.
// plan_fused_down plans and compiles both (before the callers advance their counters: a JIT error leaves them as
// they were); launch_fused_down forks, launches the reduce kernel and the GEMM, and joins.
#pragma once

#include <cstdint>

#include "loom/jit/jit.hpp"
#include "loom/kernels/moe/tp_moe_params.hpp"
#include "ops/moe/grouped_gemm_internal.hpp"
#include "ops/moe/tp/tp_moe.hpp"
#include "ops/overlap/common/state.hpp"

namespace loom::moe {

inline constexpr const char* kTpHeader = "loom/kernels/moe/tp_moe.cuh";

struct FusedDown {
    GroupedGemmProblem gemm;  // rows x w_down into the partial [max_rows, H] (out's dtype)
    GemmConfig cfg;           // planned on gemm_sms
    int gemm_sms = 0;         // SMs the persistent GEMM may use
    int blocks = 0;           // reduce kernel blocks beside it
    int block_m = 0;          // the GEMM's tile (the reduce kernel counts tiles per group)
    int num_n = 0;            // tiles across H
    void* partial = nullptr;  // the local partial product
    const jit::Kernel* reduce = nullptr;
};

// `tokens`: the tokens the reduce kernel handles (moe_rs: T_loc; moe_ar: T); `reduce_kernel`: its name in tp_moe.cuh
// (instantiated for out's dtype). Grows `partial` (outside captures only).
FusedDown plan_fused_down(const MoeDownCall& c, const char* op, overlap::LocalBuffer& partial, int64_t tokens,
                          const char* reduce_kernel);

template <class ReduceParams>
void launch_fused_down(const MoeDownCall& c, const FusedDown& f, overlap::SideStream& side, const ReduceParams& rp,
                       const kernels::moe::MoeRsHookArgs& hooks) {
    overlap::fork(side, c.stream);
    jit::LaunchConfig lc;
    lc.grid = dim3(static_cast<unsigned>(f.blocks));
    lc.block = dim3(kernels::moe::kTpMoeThreads);
    lc.stream = side.stream;
    (*f.reduce)(lc, c.world->ctx(), rp);
    grouped_gemm_launch_hooked("loom::kernels::moe::MoeRsHooks", kTpHeader, f.gemm, f.cfg, f.gemm_sms, c.stream, hooks);
    overlap::join(side, c.stream);
}

}  // namespace loom::moe
