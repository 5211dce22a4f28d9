// The benchmark harness's own kernels (bench/kernels/, JIT-compiled by the benchmarks at run time) compile for sm_90a
// and sm_80: the clean L2 flush's read kernel (harness.hpp: TimeOptions::flush_l2_clean).
#include <gtest/gtest.h>

#include <string>

#include "loom/jit/jit.hpp"

namespace {

TEST(BenchKernels, L2FlushReadCompiles) {
    loom::jit::KernelSpec spec;
    spec.header = std::string(LOOM_SOURCE_DIR) + "/bench/kernels/l2_flush.cuh";
    spec.name = "loom_bench::read_vec16";
    for (int arch : {90, 80}) EXPECT_FALSE(loom::jit::compile(spec, arch).cubin.empty()) << "sm_" << arch;
}

}  // namespace
