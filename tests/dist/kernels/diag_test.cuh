// Kernels of the diagnostic-mailbox tests: tests/unit/test_diag_mailbox.cpp compiles them, loom_test_child runs
// missing_notify for tests/dist/test_diag_mailbox.cpp, and bench/probes/pipeline_stall.cpp runs pipeline_stall. By
// default they are the kernels the mailbox exists for: LOOM_NO_DEVICE_PRINTF 1, defined before any Loom header.
// Compiled with LOOM_DIAG_TEST_WITH_PRINTF they are the control: the same waits with device printf.
#pragma once

#if !defined(LOOM_DIAG_TEST_WITH_PRINTF)
#define LOOM_NO_DEVICE_PRINTF 1
#endif

#include "loom/lang/lang.cuh"
#include "loom/ptx/wgmma.cuh"
#include "loom/tile/pipeline.cuh"

namespace loom_diag_test {
using namespace loom;
using namespace loom::lang;

// A wait nobody satisfies: the leader times out after ctx.wait_timeout_ns, records, traps.
__global__ void missing_notify(Ctx ctx, uint64_t* sig) { wait(block, ctx, sig, Cmp::GE, 1); }

// A pipeline whose producer never arrives: every thread's consumer_wait times out after kMbarrierTimeoutCycles
// (~17 s), records (no Ctx: through the module global the JIT bound) and traps.
__global__ void pipeline_stall() {
    __shared__ tile::TmaPipeline<2> pipe;
    if (threadIdx.x == 0) pipe.init(1);
    __syncthreads();
    tile::PipelineState<2> st;
    pipe.consumer_wait(st);
}

// Compile-only (never launched): the shape of an overlapped GEMM consumer. A signal wait and a pipeline wait
// inside the k-loop while one wgmma group is still in flight, symm_at on the output. With printf in any of these
// waits' cold paths ptxas serialises the wgmma (C7510); with LOOM_NO_DEVICE_PRINTF it must not.
__global__ void __launch_bounds__(128, 1)
    wgmma_with_waits(Ctx ctx, const uint64_t* sig, float* out_symm, int peer, uint32_t iters) {
    __shared__ alignas(1024) char smem_a[64 * 16 * 2];
    __shared__ alignas(1024) char smem_b[64 * 16 * 2];
    __shared__ tile::TmaPipeline<2> pipe;
    if (threadIdx.x == 0) pipe.init(4);
    __syncthreads();
    const uint64_t da = ptx::wgmma_smem_desc(smem_a, 128, 256, ptx::SmemSwizzle::None);
    const uint64_t db = ptx::wgmma_smem_desc(smem_b, 128, 256, ptx::SmemSwizzle::None);
    float d[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) d[j] = 0.f;
    tile::PipelineState<2> st;
    for (uint32_t i = 0; i < iters; ++i) {
        if (threadIdx.x == 0) signal_wait_until(ctx, sig, Cmp::GE, i + 1);
        pipe.consumer_wait(st);
        ptx::wgmma_fence();
        ptx::wgmma_m64k16<64, true>(d, da, db, 1);
        ptx::wgmma_commit_group();
        ptx::wgmma_wait_group<1>();
        if (threadIdx.x % 32 == 0) pipe.consumer_release(st.stage);
        st.advance();
    }
    ptx::wgmma_wait_group<0>();
    float* out = symm_at(ctx, out_symm, peer);
#pragma unroll
    for (int j = 0; j < 32; ++j) out[threadIdx.x * 32 + j] = d[j];
}

}  // namespace loom_diag_test
