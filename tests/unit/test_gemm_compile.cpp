// CPU tests of the GEMM: the heuristic's choices, input validation, and JIT compilation of the kernels for
// sm_90a / sm_80 without a GPU (no local-memory spills, small stack, HGMMA in the SASS when cuobjdump exists).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "loom/jit/jit.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/runtime/error.hpp"

namespace {

using loom::DType;

TEST(GemmHeuristic, PicksWideTilesAndFitsSharedMemory) {
    const auto c = loom::gemm_heuristic(8192, 8192, 8192, false, 90, 132);
    EXPECT_FALSE(c.sm80);
    EXPECT_EQ(c.block_m, 128);
    EXPECT_EQ(c.block_n, 256);
    EXPECT_EQ(c.stages, 4);
    EXPECT_EQ(c.grid, 132);
    EXPECT_EQ(c.cluster_m, 1);  // clusters measured slower on the H200 (docs/perf/gemm_cluster2.json)
    setenv("LOOM_GEMM_CLUSTER", "2", 1);
    EXPECT_EQ(loom::gemm_heuristic(8192, 8192, 8192, false, 90, 132).cluster_m, 2);  // forced
    unsetenv("LOOM_GEMM_CLUSTER");
    EXPECT_NO_THROW(loom::gemm_validate_config(c, false));
    // N = 1792: 7 x 256 columns leave a 4th wave at 448 tiles; 224 fills 8 x 64 = 512 tiles in 4 waves.
    EXPECT_EQ(loom::gemm_heuristic(8192, 1792, 4096, false, 90, 132).block_n, 224);
    // Skinny M uses one consumer warpgroup.
    EXPECT_EQ(loom::gemm_heuristic(16, 4096, 4096, false, 90, 132).block_m, 64);
    // B as [K, N] restricts BLOCK_N to multiples of 64.
    for (int n : {1376, 1792, 3696, 520})
        EXPECT_EQ(loom::gemm_heuristic(8192, n, 4096, true, 90, 132).block_n % 64, 0) << n;
    EXPECT_TRUE(loom::gemm_heuristic(1024, 1024, 1024, false, 80, 108).sm80);
    EXPECT_FALSE(c.str().empty());
}

TEST(GemmHeuristic, RejectsBadConfigs) {
    loom::GemmConfig c;
    c.block_n = 72;
    EXPECT_THROW(loom::gemm_validate_config(c, false), loom::Error);
    c.block_n = 224;
    EXPECT_THROW(loom::gemm_validate_config(c, true), loom::Error);  // [K, N] B needs multiples of 64
    c.block_n = 256;
    c.stages = 6;  // 6 x 48 KiB > 227 KiB
    EXPECT_THROW(loom::gemm_validate_config(c, false), loom::Error);
}

TEST(GemmValidate, NamesTheProblem) {
    alignas(16) static char buf[1 << 16];
    loom::MatrixView a{buf, DType::BF16, 64, 64, 0}, b{buf, DType::BF16, 64, 64, 0}, c{buf, DType::BF16, 64, 64, 0};
    EXPECT_NO_THROW(loom::gemm_validate(a, b, c, {}));
    loom::MatrixView bad_k{buf, DType::BF16, 64, 60, 0};
    EXPECT_THROW(loom::gemm_validate(a, bad_k, c, {}), loom::Error);
    loom::MatrixView f8{buf, DType::F8E4M3, 64, 64, 0};
    EXPECT_THROW(loom::gemm_validate(f8, b, c, {}), loom::Error);
    loom::MatrixView mis{buf + 2, DType::BF16, 64, 64, 0};
    EXPECT_THROW(loom::gemm_validate(mis, b, c, {}), loom::Error);
    loom::MatrixView ld{buf, DType::BF16, 64, 64, 68};  // 136-byte rows: not a multiple of 16
    EXPECT_THROW(loom::gemm_validate(ld, b, c, {}), loom::Error);
    loom::GemmOptions o;
    o.bias = loom::BufferView{buf, DType::F32, 63};
    EXPECT_THROW(loom::gemm_validate(a, b, c, o), loom::Error);
}

void expect_clean(const loom::jit::CompileResult& r, const std::string& what) {
    EXPECT_FALSE(r.cubin.empty()) << what;
    EXPECT_EQ(r.spill_bytes, 0) << what << "\n" << r.resource_report;
    EXPECT_GE(r.stack_bytes, 0) << what;
    EXPECT_LE(r.stack_bytes, 64) << what << "\n" << r.resource_report;  // printf args of the hang report only
}

// Every config bench-gemm --sweep times (BLOCK_N 128..256 with the most stages that fit, 3 stages, cluster on and
// off), both B layouts, plus a skinny one-consumer config with fp32 output: no spills, no wgmma serialisation.
TEST(GemmCompile, HopperKernelHasNoSpills) {
    std::vector<loom::GemmConfig> cfgs;
    for (int cluster : {1, 2}) {
        for (int bn : {256, 224, 192, 160, 128}) {
            loom::GemmConfig c;
            c.block_n = bn;
            c.cluster_m = cluster;
            c.stages = 6;
            while (c.stages > 2 && loom::kernels::gemm_sm90_smem_bytes(c.block_m, bn, c.stages) > 227 * 1024)
                --c.stages;
            cfgs.push_back(c);
        }
        loom::GemmConfig three;
        three.stages = 3;
        three.cluster_m = cluster;
        cfgs.push_back(three);
        loom::GemmConfig direct;  // beta != 0: direct global stores
        direct.tma_store = false;
        direct.cluster_m = cluster;
        cfgs.push_back(direct);
    }
    for (const auto& cfg : cfgs) {
        for (bool b_kn : {false, true}) {
            if (b_kn && cfg.block_n % 64 != 0) continue;
            EXPECT_NO_THROW(loom::gemm_validate_config(cfg, b_kn)) << cfg.str();
            auto spec = loom::gemm_kernel_spec(cfg, DType::BF16, DType::BF16, DType::F32, b_kn);
            const auto r = loom::jit::compile(spec, 90);
            expect_clean(r, spec.display());
            EXPECT_EQ(r.resource_report.find("C7510"), std::string::npos)
                << "wgmma serialised in " << spec.display() << "\n"
                << r.resource_report;
        }
    }
    // SASS check where the toolkit ships cuobjdump (CUDA 13.0 here may not).
    loom::GemmConfig cfg;
    const auto r = loom::jit::compile(loom::gemm_kernel_spec(cfg, DType::BF16, DType::BF16, DType::F32, false), 90);
    const char* cuda = std::getenv("CUDA_HOME");
    const std::string tool = std::string(cuda ? cuda : "/usr/local/cuda") + "/bin/cuobjdump";
    if (std::ifstream(tool).good()) {
        const std::string path = testing::TempDir() + "loom_gemm_sm90.cubin";
        std::ofstream(path, std::ios::binary).write(r.cubin.data(), static_cast<std::streamsize>(r.cubin.size()));
        std::string sass;
        if (FILE* p = popen((tool + " -sass " + path).c_str(), "r")) {
            char line[512];
            while (fgets(line, sizeof line, p)) sass += line;
            pclose(p);
        }
        EXPECT_NE(sass.find("HGMMA"), std::string::npos) << "no HGMMA in the SASS of " << cfg.str();
    }
    loom::GemmConfig small;
    small.block_m = 64;
    small.block_n = 176;
    small.stages = 6;
    small.cluster_m = 1;
    expect_clean(loom::jit::compile(loom::gemm_kernel_spec(small, DType::F16, DType::F32, DType::BF16, false), 90),
                 small.str());
    loom::GemmConfig f32out;  // TMA-store epilogue with 32-column fp32 boxes
    f32out.block_n = 128;
    f32out.stages = 5;
    expect_clean(loom::jit::compile(loom::gemm_kernel_spec(f32out, DType::BF16, DType::F32, DType::BF16, true), 90),
                 f32out.str());
}

TEST(GemmCompile, Sm80KernelCompilesForAmpereAndAda) {
    loom::GemmConfig cfg;
    cfg.sm80 = true;
    for (int arch : {80, 89}) {
        for (bool b_kn : {false, true}) {
            auto spec = loom::gemm_kernel_spec(cfg, DType::BF16, DType::BF16, DType::F32, b_kn);
            expect_clean(loom::jit::compile(spec, arch), spec.display() + " sm_" + std::to_string(arch));
        }
    }
}

}  // namespace
