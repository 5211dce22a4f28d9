// CPU tests of loom::grouped_gemm: the heuristic, config and input validation, and JIT compilation of every grouped
// kernel variant for sm_90a / sm_80 without a GPU (no local-memory spills, no wgmma serialisation).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/jit/jit.hpp"
#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/kernels/moe/grouped_gemm_params.hpp"
#include "loom/ops/moe.hpp"
#include "loom/runtime/error.hpp"
#include "ops/moe/grouped_gemm_internal.hpp"

namespace {

using loom::BLayout;
using loom::DType;
using loom::GemmConfig;
using loom::MoeActivation;

alignas(256) char g_fake[256];  // a non-null, aligned address for problems that are only validated

void expect_clean(const loom::jit::CompileResult& r, const std::string& what) {
    EXPECT_FALSE(r.cubin.empty()) << what;
    EXPECT_EQ(r.spill_bytes, 0) << what << "\n" << r.resource_report;
    EXPECT_GE(r.stack_bytes, 0) << what;
    EXPECT_LE(r.stack_bytes, 64) << what << "\n" << r.resource_report;
    EXPECT_EQ(r.resource_report.find("C7510"), std::string::npos) << "wgmma serialised in " << what << "\n"
                                                                  << r.resource_report;
}

// staged: the staged epilogue (kStagedStore, the heuristic's); false: pair stores from registers.
GemmConfig hopper(int bm, int bn, int stages, DType in = DType::BF16, bool staged = true) {
    GemmConfig c;
    c.block_m = bm;
    c.block_n = bn;
    c.stages = stages;
    c.block_k = loom::kernels::gemm_block_k(static_cast<int>(loom::dtype_size(in)));
    c.tma_store = staged;
    return c;
}

// A problem description without device memory (validation with device -1 skips the memory checks).
loom::moe::GroupedGemmProblem problem(int64_t rows, int64_t n, int64_t k, int e, BLayout layout, MoeActivation act,
                                      DType in = DType::BF16, DType out = DType::BF16) {
    char* fake = g_fake;
    loom::moe::GroupedGemmProblem p;
    p.a = loom::MatrixView{fake, in, rows, k, 0};
    p.b = layout == BLayout::NK ? loom::MatrixView{fake, in, e * n, k, 0} : loom::MatrixView{fake, in, e * k, n, 0};
    p.c = loom::MatrixView{fake, out, rows, act == MoeActivation::SwiGLU ? n / 2 : n, 0};
    p.num_experts = e;
    p.offsets = reinterpret_cast<const int32_t*>(fake);
    p.num_groups = e;
    p.opts.b_layout = layout;
    p.opts.activation = act;
    return p;
}

// The stages the plan fits keep the dynamic bytes plus the kernel's static scratch within the opt-in limit (a launch
// of 64 x 128 staged tiles with 448 groups asked for 32 bytes too many when the scratch was not counted), and the
// compiled kernel's static shared memory is the scratch the plan counts.
TEST(GroupedGemmCompile, SharedMemoryFitsTheOptInLimit) {
    for (int bm : {64, 128})
        for (int bn : {128, 160, 192, 224, 256})
            for (bool staged : {false, true})
                for (int groups : {1, 8, 448, 1024, loom::kernels::moe::kGroupedMaxGroups}) {
                    const int stages = loom::moe::grouped_gemm_fitting_stages(bm, bn, groups, staged);
                    const uint32_t total =
                        loom::kernels::moe::grouped_gemm_sm90_smem_bytes(bm, bn, stages, groups, staged) +
                        loom::kernels::moe::kGroupedStaticSmemBytes;
                    EXPECT_LE(total, loom::kernels::kGemmSm90MaxSmem)
                        << bm << "x" << bn << " staged " << staged << " groups " << groups << " stages " << stages;
                    auto p = problem(4096, 4096, 4096, 8, BLayout::NK, MoeActivation::None);
                    p.num_groups = groups;
                    EXPECT_NO_THROW(
                        loom::moe::grouped_gemm_validate_config(hopper(bm, bn, stages, DType::BF16, staged), p));
                }
    const int stages = loom::moe::grouped_gemm_fitting_stages(64, 128, 448, true);
    const auto spec = loom::moe::grouped_gemm_kernel_spec(hopper(64, 128, stages), DType::BF16, DType::BF16, false,
                                                          MoeActivation::None);
    const loom::jit::CompileResult r = loom::jit::compile(spec, 90);
    EXPECT_EQ(r.smem_bytes, static_cast<int>(loom::kernels::moe::kGroupedStaticSmemBytes)) << r.resource_report;
}

// Every Hopper variant the heuristic picks over the issue's shapes, both layouts, every activation, bf16 / fp16 / fp8
// in, 16- and 32-bit out: compiles for sm_90a with no spills.
TEST(GroupedGemmCompile, HopperKernelsHaveNoSpills) {
    struct V {
        int bm, bn;
        DType in, out;
        bool kn;
        MoeActivation act;
    };
    std::vector<V> variants;
    for (int bm : {64, 128}) {
        for (int bn : {256, 224, 192, 160, 128}) {
            for (MoeActivation act : {MoeActivation::None, MoeActivation::SwiGLU, MoeActivation::GeLU}) {
                variants.push_back({bm, bn, DType::BF16, DType::BF16, false, act});
                if (bn % (act == MoeActivation::SwiGLU ? 128 : 64) == 0)
                    variants.push_back({bm, bn, DType::F16, DType::F16, true, act});
            }
        }
        variants.push_back({bm, 256, DType::F8E4M3, DType::BF16, false, MoeActivation::None});
        variants.push_back({bm, 256, DType::F8E4M3, DType::BF16, false, MoeActivation::SwiGLU});
        variants.push_back({bm, 128, DType::F8E4M3, DType::F32, false, MoeActivation::GeLU});
        variants.push_back({bm, 256, DType::BF16, DType::F32, false, MoeActivation::None});
    }
    for (const V& v : variants) {
        const GemmConfig c = hopper(v.bm, v.bn, 4, v.in);
        auto p = problem(8192, 4096, 4096, 8, v.kn ? BLayout::KN : BLayout::NK, v.act, v.in, v.out);
        EXPECT_NO_THROW(loom::moe::grouped_gemm_validate_config(c, p)) << c.str();
        const auto spec = loom::moe::grouped_gemm_kernel_spec(c, v.in, v.out, v.kn, v.act);
        expect_clean(loom::jit::compile(spec, 90), spec.display());
    }
}

// The register-store epilogue (tma_store = false), which a config may still ask for: both warpgroup counts, the widest
// and a narrow tile, every activation, 16- and 32-bit out, fp8 in.
TEST(GroupedGemmCompile, RegisterStoreKernelsHaveNoSpills) {
    struct V {
        int bm, bn;
        DType in, out;
        MoeActivation act;
    };
    std::vector<V> variants;
    for (int bm : {64, 128}) {
        for (int bn : {256, 160}) {
            for (MoeActivation act : {MoeActivation::None, MoeActivation::SwiGLU, MoeActivation::GeLU})
                variants.push_back({bm, bn, DType::BF16, DType::BF16, act});
        }
        variants.push_back({bm, 256, DType::F8E4M3, DType::BF16, MoeActivation::SwiGLU});
        variants.push_back({bm, 256, DType::BF16, DType::F32, MoeActivation::None});
    }
    for (const V& v : variants) {
        const GemmConfig c = hopper(v.bm, v.bn, 4, v.in, false);
        auto p = problem(8192, 4096, 4096, 8, BLayout::NK, v.act, v.in, v.out);
        EXPECT_NO_THROW(loom::moe::grouped_gemm_validate_config(c, p)) << c.str();
        const auto spec = loom::moe::grouped_gemm_kernel_spec(c, v.in, v.out, false, v.act);
        EXPECT_EQ(spec.template_args.size(), 8u) << spec.display();  // kBlockScale, kStagedStore defaulted (false)
        expect_clean(loom::jit::compile(spec, 90), spec.display());
    }
}

// The staged epilogue under the TP-MoE fused ops' hooks (GroupedLoadWait; GroupedStoreNotify after the staged
// stores): both warpgroup counts, 16- and 32-bit out.
TEST(GroupedGemmCompile, StagedStoreHookedKernelsHaveNoSpills) {
    const char* header = "loom/kernels/moe/tp_moe.cuh";
    for (int bm : {64, 128}) {
        const GemmConfig c = hopper(bm, 256, 4);
        const auto ag = loom::moe::grouped_gemm_kernel_spec(c, DType::BF16, DType::BF16, false, MoeActivation::SwiGLU,
                                                            "loom::kernels::moe::MoeAgHooks", header);
        expect_clean(loom::jit::compile(ag, 90), ag.display());
        for (DType out : {DType::BF16, DType::F32}) {
            const auto rs = loom::moe::grouped_gemm_kernel_spec(c, DType::BF16, out, false, MoeActivation::None,
                                                                "loom::kernels::moe::MoeRsHooks", header);
            expect_clean(loom::jit::compile(rs, 90), rs.display());
        }
    }
}

// The per-128-block scale variant (fp8, kBlockScale): the tile widths the heuristic and the config check allow, both
// warpgroup counts, every activation: sm_90a, no spills (acc and the per-k-block partial tile share the registers).
TEST(GroupedGemmCompile, BlockScaledKernelsHaveNoSpills) {
    struct V {
        int bm, bn;
        DType out;
        MoeActivation act;
    };
    for (const V& v : {V{64, 128, DType::BF16, MoeActivation::None}, V{128, 128, DType::BF16, MoeActivation::None},
                       V{128, 128, DType::BF16, MoeActivation::SwiGLU}, V{64, 64, DType::F32, MoeActivation::SwiGLU},
                       V{128, 64, DType::F32, MoeActivation::GeLU}}) {
        for (bool staged : {true, false}) {
            const GemmConfig c = hopper(v.bm, v.bn, 6, DType::F8E4M3, staged);
            auto p = problem(8192, 4096, 4096, 8, BLayout::NK, v.act, DType::F8E4M3, v.out);
            p.opts.scale_a_blocks = reinterpret_cast<const float*>(g_fake);
            p.opts.scale_b_blocks = reinterpret_cast<const float*>(g_fake);
            EXPECT_NO_THROW(loom::moe::grouped_gemm_validate_config(c, p)) << c.str();
            const auto spec = loom::moe::grouped_gemm_kernel_spec(c, DType::F8E4M3, v.out, false, v.act,
                                                                  "loom::kernels::moe::GroupedNoHooks", "", true);
            expect_clean(loom::jit::compile(spec, 90), spec.display());
        }
    }
}

TEST(GroupedGemmCompile, Sm80KernelCompilesForAmpereAndHopper) {
    GemmConfig c;
    c.sm80 = true;
    for (int arch : {80, 90}) {
        for (bool kn : {false, true}) {
            for (MoeActivation act : {MoeActivation::None, MoeActivation::SwiGLU, MoeActivation::GeLU}) {
                const auto spec = loom::moe::grouped_gemm_kernel_spec(c, DType::BF16, DType::BF16, kn, act);
                expect_clean(loom::jit::compile(spec, arch), spec.display() + " sm_" + std::to_string(arch));
            }
        }
        const auto f32 = loom::moe::grouped_gemm_kernel_spec(c, DType::F16, DType::F32, false, MoeActivation::None);
        expect_clean(loom::jit::compile(f32, arch), f32.display());
    }
}

// fp8 e4m3 on the portable kernel (converted to bf16 in shared memory; B as [N, K]): per-tensor and per-128-block
// scales (the second register tile), every activation, 16- and 32-bit out, for sm_80 and Hopper (force_sm80), and
// under the TP-MoE down projection's hooks: no spills.
TEST(GroupedGemmCompile, Sm80Fp8KernelsHaveNoSpills) {
    GemmConfig c;
    c.sm80 = true;
    struct V {
        DType out;
        MoeActivation act;
    };
    for (int arch : {80, 90}) {
        for (bool block_scale : {false, true}) {
            for (const V& v : {V{DType::BF16, MoeActivation::None}, V{DType::BF16, MoeActivation::SwiGLU},
                               V{DType::F16, MoeActivation::GeLU}, V{DType::F32, MoeActivation::SwiGLU},
                               V{DType::F32, MoeActivation::GeLU}}) {
                auto p = problem(8192, 4096, 4096, 8, BLayout::NK, v.act, DType::F8E4M3, v.out);
                if (block_scale) p.opts.scale_a_blocks = p.opts.scale_b_blocks = reinterpret_cast<const float*>(g_fake);
                EXPECT_NO_THROW(loom::moe::grouped_gemm_validate(p, -1));
                EXPECT_NO_THROW(loom::moe::grouped_gemm_validate_config(c, p));
                const auto spec = loom::moe::grouped_gemm_kernel_spec(
                    c, DType::F8E4M3, v.out, false, v.act, "loom::kernels::moe::GroupedNoHooks", "", block_scale);
                EXPECT_EQ(spec.template_args.size(), block_scale ? 7u : 6u) << spec.display();
                expect_clean(loom::jit::compile(spec, arch), spec.display() + " sm_" + std::to_string(arch));
            }
        }
    }
    for (bool block_scale : {false, true}) {
        const auto rs = loom::moe::grouped_gemm_kernel_spec(c, DType::F8E4M3, DType::F32, false, MoeActivation::None,
                                                            "loom::kernels::moe::MoeRsHooks",
                                                            "loom/kernels/moe/tp_moe.cuh", block_scale);
        expect_clean(loom::jit::compile(rs, 80), rs.display() + " sm_80");
    }
}

TEST(GroupedGemmHeuristic, FitsTheIssueShapes) {
    struct S {
        int64_t n, k;
        int e, topk;
    };
    for (const S& s : {S{14336, 4096, 8, 2}, S{16384, 6144, 8, 2}, S{1408, 2048, 60, 4}, S{1408, 2048, 64, 6},
                       S{768, 2048, 128, 8}}) {
        for (int64_t tokens : {8192, 128}) {
            for (bool kn : {false, true}) {
                for (MoeActivation act : {MoeActivation::None, MoeActivation::SwiGLU}) {
                    for (DType in : {DType::BF16, DType::F8E4M3}) {
                        if (kn && in == DType::F8E4M3) continue;
                        const int64_t rows = tokens * s.topk;
                        const GemmConfig c =
                            loom::moe::grouped_gemm_heuristic(rows, s.n, s.k, s.e, kn, act, in, 90, 132);
                        auto p = problem(rows, s.n, s.k, s.e, kn ? BLayout::KN : BLayout::NK, act, in);
                        EXPECT_NO_THROW(loom::moe::grouped_gemm_validate_config(c, p)) << c.str();
                        EXPECT_LE(c.grid, 132);
                        EXPECT_GE(c.grid, 1);
                        EXPECT_FALSE(c.sm80);
                        EXPECT_TRUE(c.tma_store) << c.str();  // the staged epilogue
                        if (tokens == 128 && s.e >= 60) EXPECT_EQ(c.block_m, 64) << c.str();
                        if (tokens == 8192 && s.e == 8) EXPECT_EQ(c.block_m, 128) << c.str();
                    }
                }
            }
        }
    }
    EXPECT_TRUE(
        loom::moe::grouped_gemm_heuristic(1024, 4096, 4096, 8, false, MoeActivation::None, DType::BF16, 80, 108).sm80);
    // Block scales: 128 or 64 columns (a tile within one scale block), for every shape above.
    for (const S& s : {S{14336, 4096, 8, 2}, S{1408, 2048, 64, 6}, S{768, 2048, 128, 8}}) {
        for (int64_t tokens : {8192, 128}) {
            for (MoeActivation act : {MoeActivation::None, MoeActivation::SwiGLU}) {
                const GemmConfig c = loom::moe::grouped_gemm_heuristic(tokens * s.topk, s.n, s.k, s.e, false, act,
                                                                       DType::F8E4M3, 90, 132, false, true);
                auto p = problem(tokens * s.topk, s.n, s.k, s.e, BLayout::NK, act, DType::F8E4M3);
                p.opts.scale_a_blocks = p.opts.scale_b_blocks = reinterpret_cast<const float*>(g_fake);
                EXPECT_TRUE(c.block_n == 128 || c.block_n == 64) << c.str();
                EXPECT_NO_THROW(loom::moe::grouped_gemm_validate_config(c, p)) << c.str();
            }
        }
    }
    // Stages shrink to leave room for a large prefix: 4095 groups (16 KiB).
    const GemmConfig big = loom::moe::grouped_gemm_heuristic(65536, 4096, 4096, loom::kernels::moe::kGroupedMaxGroups,
                                                             false, MoeActivation::None, DType::BF16, 90, 132);
    EXPECT_LE(loom::kernels::moe::grouped_gemm_sm90_smem_bytes(big.block_m, big.block_n, big.stages,
                                                               loom::kernels::moe::kGroupedMaxGroups, big.tma_store),
              loom::kernels::kGemmSm90MaxSmem);
    // The staged epilogue's buffers (16 KiB at 128 rows) count against the stages: the issue's widest tile keeps 4.
    const GemmConfig wide =
        loom::moe::grouped_gemm_heuristic(16384, 14336, 4096, 8, false, MoeActivation::None, DType::BF16, 90, 132);
    EXPECT_EQ(wide.block_m, 128);
    EXPECT_EQ(wide.block_n, 256);
    EXPECT_EQ(wide.stages, 4) << wide.str();
    EXPECT_EQ(loom::kernels::moe::grouped_gemm_sm90_smem_bytes(128, 256, 4, 8, true) -
                  loom::kernels::moe::grouped_gemm_sm90_smem_bytes(128, 256, 4, 8, false),
              16u * 1024u);
}

// Bad input names the argument.
TEST(GroupedGemmValidate, NamesTheProblem) {
    const auto expect_error = [](const loom::moe::GroupedGemmProblem& p, const std::string& needle) {
        try {
            loom::moe::grouped_gemm_validate(p, -1);
            ADD_FAILURE() << "no error; expected one naming " << needle;
        } catch (const loom::Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    const auto ok = problem(1000, 512, 256, 8, BLayout::NK, MoeActivation::None);
    EXPECT_NO_THROW(loom::moe::grouped_gemm_validate(ok, -1));
    EXPECT_NO_THROW(
        loom::moe::grouped_gemm_validate(problem(1000, 512, 256, 8, BLayout::KN, MoeActivation::SwiGLU), -1));
    auto p = ok;
    p.offsets = nullptr;
    expect_error(p, "group_offsets");
    p = ok;
    p.num_groups = 0;
    expect_error(p, "num_groups");
    p = ok;
    p.num_experts = 0;
    expect_error(p, "num_experts");
    p = ok;
    p.b.rows = 8 * 512 + 3;
    expect_error(p, "B as [E * N, K]");
    p = ok;
    p.c.cols = 256;
    expect_error(p, "C of 1000 x 512");
    p = ok;
    p.b.dtype = DType::F16;
    expect_error(p, "B of A's dtype");
    p = ok;
    p.c.dtype = DType::I32;
    expect_error(p, "C bf16, f16 or f32");
    p = ok;
    p.a.data = nullptr;
    expect_error(p, "pointer for A");
    // Per-128-block scales: both, fp8 in, SwiGLU's up half on a scale block.
    p = ok;
    p.opts.scale_b_blocks = reinterpret_cast<const float*>(p.a.data);
    expect_error(p, "scale_a_blocks and scale_b_blocks together");
    p.opts.scale_a_blocks = reinterpret_cast<const float*>(p.a.data);
    expect_error(p, "per-128-block scales expect f8e4m3");
    auto f8 = problem(1000, 512, 256, 8, BLayout::NK, MoeActivation::SwiGLU, DType::F8E4M3);
    f8.opts.scale_a_blocks = f8.opts.scale_b_blocks = reinterpret_cast<const float*>(p.a.data);
    EXPECT_NO_THROW(loom::moe::grouped_gemm_validate(f8, -1));
    EXPECT_NO_THROW(loom::moe::grouped_gemm_validate_config(hopper(128, 128, 4, DType::F8E4M3), f8));
    EXPECT_THROW(loom::moe::grouped_gemm_validate_config(hopper(128, 256, 4, DType::F8E4M3), f8), loom::Error);
    auto f8_plain = f8;
    f8_plain.opts.activation = MoeActivation::None;
    f8_plain.c.cols = 512;
    EXPECT_THROW(loom::moe::grouped_gemm_validate_config(hopper(128, 192, 4, DType::F8E4M3), f8_plain), loom::Error);
    EXPECT_NO_THROW(loom::moe::grouped_gemm_validate_config(hopper(64, 64, 4, DType::F8E4M3), f8_plain));
    f8 = problem(1000, 320, 256, 8, BLayout::NK, MoeActivation::SwiGLU, DType::F8E4M3);
    f8.opts.scale_a_blocks = f8.opts.scale_b_blocks = reinterpret_cast<const float*>(p.a.data);
    expect_error(f8, "N / 2 a multiple of 128");
    p = problem(1000, 512, 256, 8, BLayout::KN, MoeActivation::None, DType::F8E4M3);
    expect_error(p, "b_layout NK");
    p = problem(1000, 520, 256, 8, BLayout::NK, MoeActivation::SwiGLU);
    expect_error(p, "SwiGLU expects N");
    p = ok;
    p.opts.alpha = 1.f / 0.f;
    expect_error(p, "alpha");
    // Configs the Hopper kernel cannot take.
    GemmConfig c = hopper(192, 128, 4);
    EXPECT_THROW(loom::moe::grouped_gemm_validate_config(c, ok), loom::Error);
    c = hopper(128, 192, 4);
    EXPECT_THROW(
        loom::moe::grouped_gemm_validate_config(c, problem(1000, 512, 256, 8, BLayout::KN, MoeActivation::SwiGLU)),
        loom::Error);
    c = hopper(128, 256, 8);
    EXPECT_THROW(loom::moe::grouped_gemm_validate_config(c, ok), loom::Error);  // shared memory
    c = hopper(128, 256, 4);
    c.cluster_m = 2;
    EXPECT_THROW(loom::moe::grouped_gemm_validate_config(c, ok), loom::Error);
    // The portable kernel takes fp8 (NK; the layout check above), with block scales too.
    c = hopper(128, 256, 4);
    c.sm80 = true;
    EXPECT_NO_THROW(loom::moe::grouped_gemm_validate_config(
        c, problem(1000, 512, 256, 8, BLayout::NK, MoeActivation::None, DType::F8E4M3)));
    f8 = problem(1000, 512, 256, 8, BLayout::NK, MoeActivation::SwiGLU, DType::F8E4M3);
    f8.opts.scale_a_blocks = f8.opts.scale_b_blocks = reinterpret_cast<const float*>(g_fake);
    EXPECT_NO_THROW(loom::moe::grouped_gemm_validate(f8, -1));
    EXPECT_NO_THROW(loom::moe::grouped_gemm_validate_config(c, f8));
    p = problem(1000, 512, 200, 8, BLayout::NK, MoeActivation::None, DType::F8E4M3);
    expect_error(p, "K a multiple of 16");
}

}  // namespace
