// SMs the collectives and overlapped ops use per rank when ranks share a GPU (src/ops/collectives/coll_choice.cpp:
// shared_gpu_sm_budget): the MPS share when every rank has one, else the GPU divided among the ranks, so that their
// kernels fit at once.
#include <gtest/gtest.h>

#include <tuple>

#include "ops/collectives/coll_choice.hpp"
#include "ops/collectives/coll_launch.hpp"
#include "ops/collectives/coll_ll.hpp"

namespace loom::coll {
namespace {

TEST(CollSmBudget, AnMpsSharePerRankIsTheAttribute) {
    EXPECT_EQ(shared_gpu_sm_budget(14, 8, 12), 14);  // loomrun at 8 ranks: 12 % each, the attribute reads 14
    EXPECT_EQ(shared_gpu_sm_budget(66, 2, 50), 66);
    EXPECT_EQ(shared_gpu_sm_budget(32, 4, 25), 32);
}

TEST(CollSmBudget, WithoutSharesTheGpuIsDivided) {
    EXPECT_EQ(shared_gpu_sm_budget(132, 8, 100), 16);  // shares past 100 %: 8 x 100
    EXPECT_EQ(shared_gpu_sm_budget(132, 8, 0), 16);    // unset
    EXPECT_EQ(shared_gpu_sm_budget(132, 2, 0), 66);
    EXPECT_EQ(shared_gpu_sm_budget(132, 4, 30), 33);
    EXPECT_EQ(shared_gpu_sm_budget(4, 8, 0), 1);  // never below one block
}

// The grid-strided kernels' blocks with ranks sharing a GPU (grid_stride_block_cap): one per SM of the rank's share
// for the pull; for the fan-out push one per SM up to 32, half the share beyond (loomrun's shares on an H200: 66, 26
// and 14 SMs at 2, 4 and 8 ranks); the caller's cap on distinct GPUs.
TEST(CollSmBudget, GridStrideBlocksFollowTheShare) {
    Budget b;
    b.topo.shared_gpu = true;
    for (auto [sms, pull, fanout] : {std::tuple{66, 66, 33}, {26, 26, 26}, {14, 14, 14}, {40, 40, 32}, {1, 1, 1}}) {
        b.num_sms = sms;
        EXPECT_EQ(grid_stride_block_cap(b, 64, false), pull) << sms << " SMs";
        EXPECT_EQ(grid_stride_block_cap(b, 64, true), fanout) << sms << " SMs";
    }
    b.topo.shared_gpu = false;
    b.num_sms = 132;
    EXPECT_EQ(grid_stride_block_cap(b, 64, true), 64);
}

// LL launches: one block per packet block, except where the ranks' launches compete for every SM (no MPS share
// each: Budget::resident_blocks), where at most that many blocks deal the packet blocks (Params::ll_blocks).
// 240004 bytes per chunk: 30001 packets, 59 packet blocks of 512 (8 ranks on one GPU, 100 % each).
TEST(CollSmBudget, LlPacketBlocksStayWithinTheResidentBlocks) {
    Budget b;
    b.topo.shared_gpu = true;
    b.topo.ranks_per_gpu = 8;
    b.num_sms = 16;
    Launch shared;
    setup_ll(shared, "all_gather", 240004, CollOptions{}, b);
    EXPECT_EQ(shared.params.ll_blocks, 59u);
    EXPECT_EQ(shared.params.ll_packets, 512u);
    EXPECT_EQ(shared.blocks, 59);  // an MPS share per rank (resident_blocks 0): as many blocks as packet blocks
    b.resident_blocks = 16;
    Launch budgeted;
    setup_ll(budgeted, "all_gather", 240004, CollOptions{}, b);
    EXPECT_EQ(budgeted.params.ll_blocks, 59u);
    EXPECT_EQ(budgeted.blocks, 16);
    Launch small;  // fewer packet blocks than that: one block each
    setup_ll(small, "all_reduce", 4096, CollOptions{}, b);
    EXPECT_EQ(small.blocks, static_cast<int>(small.params.ll_blocks));
    EXPECT_LE(small.blocks, 16);
}

}  // namespace
}  // namespace loom::coll
