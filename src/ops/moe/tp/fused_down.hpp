// The down projection's fused algorithms (moe_rs, moe_ar): a grouped GEMM into a local partial product, and a reduce
// kernel whose work items (chunks of tokens) blocks claim from a counter. moe_rs launches the reduce kernel twice: a
// few blocks beside the GEMM on a side stream (MoeRsHooks count the stored tiles per source rank; the side blocks take
// the items that become ready while the GEMM runs) and a full grid after the GEMM on its stream (the rest at the whole
// share's bandwidth). moe_ar's items become ready only when the whole GEMM is done: its GEMM has every SM and the
// reduce kernel runs after it. Then the stream waits for every rank's items (stream memory operations: no SM is held
// while a peer is late) and moe_tp_sum_slots sums them. plan_fused_down plans and compiles (before the callers advance
// their counters: a JIT error leaves them as they were); launch_fused_down launches.
#pragma once

#include <cstdint>

#include "loom/jit/jit.hpp"
#include "loom/kernels/moe/tp_moe_params.hpp"
#include "ops/moe/grouped_gemm_internal.hpp"
#include "ops/moe/tp/tp_moe.hpp"
#include "ops/overlap/common/state.hpp"
#include "runtime/stream_watchdog.hpp"

namespace loom::moe {

inline constexpr const char* kTpHeader = "loom/kernels/moe/tp_moe.cuh";

struct FusedDown {
    GroupedGemmProblem gemm;  // rows x w_down into the partial [max_rows, H] (out's dtype)
    GemmConfig cfg;           // planned on gemm_sms
    int gemm_sms = 0;         // SMs the persistent GEMM may use
    int side_blocks = 0;      // reduce kernel blocks beside the GEMM (0: none; the GEMM has every usable SM)
    int tail_blocks = 0;      // reduce kernel blocks after the GEMM
    int sum_blocks = 0;       // moe_tp_sum_slots blocks
    int block_m = 0;          // the GEMM's tile (the side reduce blocks count tiles per group)
    int num_n = 0;            // tiles across H
    int row_words = 0;        // 16-byte words of out's type per row
    int chunk = 0;            // tokens per work item
    int64_t chunks = 0;       // items per source rank: ceil(tokens / chunk)
    int64_t claims = 0;       // claims on the work counter per call: sources x chunks + one failing claim per block
    void* partial = nullptr;  // the local partial product
    const jit::Kernel* reduce = nullptr;
    const jit::Kernel* sum = nullptr;  // moe_tp_sum_slots for out's dtype
    // The GEMM counts its stored tiles per source rank (MoeRsHooks) exactly when side blocks wait on them: the launch
    // after it needs no count, and a release per tile costs small tiles a drain of their stores each.
    bool hooked() const { return side_blocks > 0; }
};

// `tokens`: the tokens of one source rank (moe_rs: T_loc; moe_ar: T); `sources`: source ranks (moe_rs: W; moe_ar: 1);
// items: sources x chunks (the sends; the final sums are moe_tp_sum_slots). `side`: the GEMM counts its tiles
// (MoeRsHooks) and the reduce may run beside it (moe_rs: c.opts.comm_sms blocks, 0: rs_side_blocks, < 0: none).
// `reduce_kernel`: the kernel's name in tp_moe.cuh (instantiated for out's dtype). Grows `partial` (outside captures
// only).
FusedDown plan_fused_down(const MoeDownCall& c, const char* op, overlap::LocalBuffer& partial, int64_t tokens,
                          int sources, const char* reduce_kernel, bool side);

// op: the op's name (a string literal); side, side_rp: the side stream and the side launch's parameters (used when
// f.side_blocks > 0; else side may be null); tail_rp: the launch after the GEMM's; hooks: the GEMM's when f.hooked();
// landed: this rank's copy of MoeDownSignals::landed; recv: this call's receive half (this rank's address), whose W
// slots of out's rows the final sums add into out.
template <class ReduceParams>
void launch_fused_down(const char* op, const MoeDownCall& c, const FusedDown& f, overlap::SideStream* side,
                       const ReduceParams& side_rp, const ReduceParams& tail_rp,
                       const kernels::moe::MoeRsHookArgs& hooks, const uint64_t* landed, uint64_t epoch,
                       const void* recv) {
    jit::LaunchConfig lc;
    lc.block = dim3(kernels::moe::kTpMoeThreads);
    if (f.side_blocks > 0) {
        overlap::fork(*side, c.stream);
        lc.grid = dim3(static_cast<unsigned>(f.side_blocks));
        lc.stream = side->stream;
        (*f.reduce)(lc, c.world->ctx(), side_rp);
    }
    if (f.hooked()) {
        grouped_gemm_launch_hooked("loom::kernels::moe::MoeRsHooks", kTpHeader, f.gemm, f.cfg, f.gemm_sms, c.stream,
                                   hooks);
    } else {
        struct NoHooks {
        } none;  // loom::kernels::moe::GroupedNoHooks: an empty object
        grouped_gemm_launch_hooked("loom::kernels::moe::GroupedNoHooks", "", f.gemm, f.cfg, f.gemm_sms, c.stream, none);
    }
    lc.grid = dim3(static_cast<unsigned>(f.tail_blocks));
    lc.stream = c.stream;
    (*f.reduce)(lc, c.world->ctx(), tail_rp);
    if (f.side_blocks > 0) overlap::join(*side, c.stream);
    detail::WatchedWaits waits(*c.world, op, epoch, c.stream);  // bounded on the host
    // Every rank adds 1 per call of this parity: W x (calls of this parity so far, this one included).
    const uint64_t target = static_cast<uint64_t>(c.world->local_world_size()) * ((epoch + 1) / 2);
    waits.wait_value(c.stream, landed + epoch % 2, target, -1);
    kernels::moe::MoeTpSumParams sum{};
    sum.recv = recv;
    sum.out = c.out.data;
    sum.tokens = static_cast<int32_t>(c.out.rows);
    sum.row_words = f.row_words;
    sum.chunk = f.chunk;
    sum.chunks = static_cast<int32_t>(f.chunks);
    lc.grid = dim3(static_cast<unsigned>(f.sum_blocks));
    (*f.sum)(lc, c.world->ctx(), sum);
    waits.enqueued();
}

}  // namespace loom::moe
