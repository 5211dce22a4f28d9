// SMs the collectives use per rank when ranks share a GPU (src/ops/coll_state.cpp: shared_gpu_sm_budget): the MPS
// share when every rank has one, else the GPU divided among the ranks, so that their barrier kernels fit at once.
#include <gtest/gtest.h>

#include "ops/coll_state.hpp"

namespace loom::coll {
namespace {

TEST(CollSmBudget, AnMpsSharePerRankIsTheAttribute) {
    EXPECT_EQ(shared_gpu_sm_budget(14, 8, "12"), 14);  // loomrun at 8 ranks: 12 % each, the attribute reads 14
    EXPECT_EQ(shared_gpu_sm_budget(66, 2, "50"), 66);
    EXPECT_EQ(shared_gpu_sm_budget(32, 4, "25"), 32);
}

TEST(CollSmBudget, WithoutSharesTheGpuIsDivided) {
    EXPECT_EQ(shared_gpu_sm_budget(132, 8, "100"), 16);  // shares past 100 %: 8 x 100
    EXPECT_EQ(shared_gpu_sm_budget(132, 8, nullptr), 16);
    EXPECT_EQ(shared_gpu_sm_budget(132, 2, ""), 66);
    EXPECT_EQ(shared_gpu_sm_budget(132, 4, "30"), 33);
    EXPECT_EQ(shared_gpu_sm_budget(4, 8, nullptr), 1);  // never below one block
}

}  // namespace
}  // namespace loom::coll
