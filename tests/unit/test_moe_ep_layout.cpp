// CPU tests of expert-parallel dispatch / combine (throughput mode): the buffer layouts and block counts, the host
// reference of the receive layout on hand-made routings (what the GPU tests compare against), and JIT compilation of
// every EP kernel for sm_90a and sm_80 without spills (and with remote peers, as a World of several nodes builds them).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/ep_reference.hpp"
#include "common/nvshmem_build.hpp"
#include "loom/jit/jit.hpp"
#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/kernels/moe/ep_params.hpp"
#include "ops/moe/ep/ep.hpp"
#include "ops/moe/grouped_gemm_internal.hpp"

namespace {

namespace ep = loom::moe::ep;

TEST(MoeEpLayout, BuffersAreAlignedAndDisjoint) {
    for (int64_t rows : {1, 7, 4096, 40000})
        for (int64_t h : {8, 2048, 7168})
            for (int k : {1, 8, 32}) {
                const ep::DataLayout l = ep::data_layout(rows, h, k);
                EXPECT_EQ(l.recv_x % 256, 0u);
                EXPECT_EQ(l.combine_rows % 256, 0u);
                EXPECT_EQ(l.pair_rows % 256, 0u);
                EXPECT_EQ(l.pair_weights % 256, 0u);
                EXPECT_GE(l.combine_rows - l.recv_x, static_cast<std::size_t>(rows * h * 2));
                EXPECT_GE(l.pair_rows - l.combine_rows, static_cast<std::size_t>(rows * h * 2));
                EXPECT_GE(l.pair_weights - l.pair_rows, static_cast<std::size_t>(rows * k * 4));
                EXPECT_GE(l.bytes - l.pair_weights, static_cast<std::size_t>(rows * k * 4));
            }
    const ep::LocalLayout l = ep::local_layout(8192, 8, 256, 8);
    EXPECT_EQ(ep::layout_chunks(8192, 8), 8192 * 8 / loom::kernels::moe::kEpChunk);
    EXPECT_GE(l.recv_offsets - l.chunk_counts, static_cast<std::size_t>(256 * (256 + 8) * 4));
    EXPECT_GE(l.send_prefix - l.token_pair, static_cast<std::size_t>(8192 * 8 * 4));
    EXPECT_GE(l.send_entry - l.send_prefix, static_cast<std::size_t>((256 + 1) * 4));
    EXPECT_GE(l.bytes - l.send_entry, static_cast<std::size_t>(8192 * 8 * 4));
    EXPECT_EQ(l.send_prefix % 256, 0u);
    EXPECT_EQ(l.send_entry % 256, 0u);
    EXPECT_GE(l.ret_base - l.stage_base, static_cast<std::size_t>(8 * 4));
    EXPECT_GE(l.src_pair_base - l.ret_base, static_cast<std::size_t>(8 * 4));
    EXPECT_GE(l.bytes - l.src_pair_base, static_cast<std::size_t>(9 * 4));
    EXPECT_EQ(ep::layout_chunks(0, 8), 1);  // T = 0: one (empty) chunk
    EXPECT_GT(ep::local_layout(0, 1, 1, 1).bytes, 0u);
}

// Several nodes: the stage rows and their records follow the one-node parts, which keep their offsets.
TEST(MoeEpLayout, StagedBufferAppendsTheStageRows) {
    for (int64_t rows : {1, 7, 4096})
        for (int k : {1, 8}) {
            const ep::DataLayout one = ep::data_layout(rows, 7168, k);
            const ep::DataLayout l = ep::data_layout(rows, 7168, k, true);
            EXPECT_EQ(l.pair_weights, one.pair_weights);
            EXPECT_EQ(l.stage_x, one.bytes);
            EXPECT_EQ(l.stage_x % 256, 0u);
            EXPECT_GE(l.stage_rows - l.stage_x, static_cast<std::size_t>(rows * 7168 * 2));
            EXPECT_GE(l.stage_weights - l.stage_rows, static_cast<std::size_t>(rows * k * 4));
            EXPECT_GE(l.bytes - l.stage_weights, static_cast<std::size_t>(rows * k * 4));
        }
}

TEST(MoeEpLayout, BlocksAndAutoCapacity) {
    EXPECT_EQ(ep::data_blocks(0, 132, 0), 1);
    EXPECT_EQ(ep::data_blocks(17, 132, 0), 2);
    EXPECT_EQ(ep::data_blocks(1 << 20, 132, 0), 264);
    EXPECT_EQ(ep::data_blocks(1 << 20, 132, 5), 5);
    EXPECT_EQ(ep::auto_capacity(0), 256);
    EXPECT_EQ(ep::auto_capacity(257), 512);
    EXPECT_EQ(ep::auto_capacity(100), 256);  // rows are not carried over (the next call's H may be larger)
}

// 2 ranks, 4 experts (2 per rank), k = 3. Rank 0: token 0 -> {1, 0, 3} (rank 0 twice), token 1 -> {-1, 2, -1};
// rank 1: token 0 -> {3, 2, -1} (rank 1 twice), token 1 -> {0, -1, -1}.
TEST(MoeEpLayout, ReferenceSendsATokenOncePerRank) {
    const std::vector<std::vector<int32_t>> idx = {{1, 0, 3, -1, 2, -1}, {3, 2, -1, 0, -1, -1}};
    const loom::test::EpLayoutRef r = loom::test::ep_layout_reference(idx, 3, 4, 2);
    // Rank 0 receives expert 0: (r0 t0), (r1 t1); expert 1: (r0 t0).
    EXPECT_EQ(r.offsets[0], (std::vector<int32_t>{0, 2, 3}));
    EXPECT_EQ(r.row_src[0], (std::vector<int32_t>{0, 1, 0}));
    EXPECT_EQ(r.row_tok[0], (std::vector<int32_t>{0, 1, 0}));
    // Rank 1 receives expert 2: (r0 t1), (r1 t0); expert 3: (r0 t0), (r1 t0).
    EXPECT_EQ(r.offsets[1], (std::vector<int32_t>{0, 2, 4}));
    EXPECT_EQ(r.row_src[1], (std::vector<int32_t>{0, 1, 0, 1}));
    EXPECT_EQ(r.row_tok[1], (std::vector<int32_t>{1, 0, 0, 0}));
    EXPECT_EQ(r.entry_row[0], (std::vector<int32_t>{2, 0, 2, -1, 0, -1}));
    EXPECT_EQ(r.max_rows, 4);
    // Pairs sent to the other rank: rank 0's tokens 0 and 1 to rank 1; rank 1's token 1 to rank 0.
    EXPECT_EQ(r.pairs_out, (std::vector<int64_t>{2, 1}));
    // Combine of identity experts: out = 1 everywhere, weights 1 -> y = the number of slots of each token.
    const auto y = loom::test::ep_combine_reference(r, idx[0], {}, 0, 1, [](int, int32_t, int64_t) { return 1.f; });
    EXPECT_EQ(y, (std::vector<float>{3.f, 1.f}));
}

void expect_clean(const loom::jit::CompileResult& r, const std::string& what) {
    EXPECT_FALSE(r.cubin.empty()) << what;
    EXPECT_EQ(r.spill_bytes, 0) << what << "\n" << r.resource_report;
    EXPECT_LE(r.stack_bytes, 64) << what << "\n" << r.resource_report;
}

// Every EP throughput-mode kernel; `one_node`: the per-expert path's, never built with remote peers (it runs on one
// node only).
struct EpKernel {
    const char* header;
    const char* name;
    bool one_node;
};
const std::vector<EpKernel> kEpKernels = {
    {"loom/kernels/moe/ep_dispatch.cuh", "loom::kernels::moe::ep_layout_count", false},
    {"loom/kernels/moe/ep_dispatch.cuh", "loom::kernels::moe::ep_layout_scan", false},
    {"loom/kernels/moe/ep_dispatch.cuh", "loom::kernels::moe::ep_layout_index", false},
    {"loom/kernels/moe/ep_dispatch.cuh", "loom::kernels::moe::ep_dispatch_push", false},
    {"loom/kernels/moe/ep_dispatch.cuh", "loom::kernels::moe::ep_dispatch_arrive", false},
    {"loom/kernels/moe/ep_dispatch.cuh", "loom::kernels::moe::ep_dispatch_push_experts", true},
    {"loom/kernels/moe/ep_dispatch.cuh", "loom::kernels::moe::ep_dispatch_arrived_wait", true},
    {"loom/kernels/moe/ep_combine.cuh", "loom::kernels::moe::ep_combine_send", false},
    {"loom/kernels/moe/ep_combine.cuh", "loom::kernels::moe::ep_combine_reduce", false},
};

TEST(MoeEpCompile, KernelsHaveNoSpills) {
    for (int arch : {90, 80})
        for (const EpKernel& k : kEpKernels) {
            loom::jit::KernelSpec spec;
            spec.header = k.header;
            spec.name = k.name;
            expect_clean(loom::jit::compile(spec, arch), spec.display() + " sm_" + std::to_string(arch));
        }
}

// A World of several nodes builds the dispatch and combine kernels with remote peers (nvcc + NVSHMEM).
TEST(MoeEpCompile, RemotePeerKernelsCompile) {
    if (const auto why = loom::test::nvshmem_build_missing()) GTEST_SKIP() << *why;
    for (const EpKernel& k : kEpKernels) {
        if (k.one_node) continue;
        loom::jit::KernelSpec spec;
        spec.header = k.header;
        spec.name = k.name;
        spec.remote_peers = true;
        const loom::jit::CompileResult r = loom::jit::compile(spec, 90);
        EXPECT_EQ(r.compiler, "nvcc+nvjitlink") << spec.display();
        EXPECT_FALSE(r.cubin.empty()) << spec.display();
        EXPECT_EQ(r.spill_bytes, 0) << spec.display() << "\n" << r.resource_report;
    }
}

// ep_moe_experts' hooked grouped GEMM: the Hopper kernel at both tile heights, two widths, with SwiGLU; the portable
// kernel.
TEST(MoeEpCompile, ExpertHooksGemmHasNoSpills) {
    const char* header = "loom/kernels/moe/ep_experts.cuh";
    const char* hooks = "loom::kernels::moe::EpExpertHooks";
    for (int bm : {64, 128})
        for (int bn : {128, 256})
            for (loom::MoeActivation act : {loom::MoeActivation::None, loom::MoeActivation::SwiGLU}) {
                loom::GemmConfig c;
                c.block_m = bm;
                c.block_n = bn;
                c.stages = 4;
                c.block_k = loom::kernels::gemm_block_k(2);
                c.tma_store = false;
                const auto spec = loom::moe::grouped_gemm_kernel_spec(c, loom::DType::BF16, loom::DType::BF16, false,
                                                                      act, hooks, header);
                expect_clean(loom::jit::compile(spec, 90), spec.display());
            }
    const loom::GemmConfig sm80 = loom::moe::grouped_gemm_heuristic(
        4096, 7168, 2048, 32, false, loom::MoeActivation::None, loom::DType::BF16, 80, 108);
    ASSERT_TRUE(sm80.sm80);
    const auto spec = loom::moe::grouped_gemm_kernel_spec(sm80, loom::DType::BF16, loom::DType::BF16, false,
                                                          loom::MoeActivation::None, hooks, header);
    expect_clean(loom::jit::compile(spec, 80), spec.display() + " sm_80");
}

}  // namespace
