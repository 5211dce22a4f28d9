// CPU tests of the overlapped GEMM ops (docs/overlap.md): the hooked GEMM instantiations compile for sm_90a
// without spills, the communication kernels compile, the SM share under MPS, and the plans' deadlock-freedom
// invariants (comm blocks leave SMs to the GEMM; the GEMM grid fits beside them).
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <utility>

#include "loom/jit/jit.hpp"
#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "ops/overlap/ag_gemm/ag_gemm.hpp"
#include "ops/overlap/common/state.hpp"
#include "ops/overlap/gemm_ar/gemm_ar.hpp"
#include "ops/overlap/gemm_rs/gemm_rs.hpp"

namespace {

using loom::DType;

// Every BLOCK_N class the heuristic picks, one and two consumer warpgroups, bf16 and fp32 outputs: the hooks'
// tile order and waits must not push the 168-register consumers (128 accumulators at 128 x 256) into spills.
TEST(OverlapCompile, HookedGemmHasNoSpills) {
    const struct {
        const char* hooks;
        const char* header;
        int tail_splits;  // 2: the split-tail instantiation (ag_gemm's hooks take it)
    } policies[] = {{"loom::kernels::overlap::AgGemmHooks", "loom/kernels/overlap/ag_gemm.cuh"},
                    {"loom::kernels::overlap::AgGemmHooks", "loom/kernels/overlap/ag_gemm.cuh", 2},
                    {"loom::kernels::overlap::TileNotifyHooks", "loom/kernels/overlap/gemm_rs.cuh"},
                    {"loom::kernels::overlap::TileNotifyHooks", "loom/kernels/overlap/gemm_ar.cuh"},
                    {"loom::kernels::overlap::RsAccHooks", "loom/kernels/overlap/gemm_rs.cuh"},
                    {"loom::kernels::overlap::RsPullHooks", "loom/kernels/overlap/gemm_rs_pull.cuh"},
                    {"loom::kernels::overlap::ArEpilogueHooks", "loom/kernels/overlap/gemm_ar.cuh"}};
    for (const auto& pol : policies) {
        for (int bm : {128, 64}) {
            for (int bn : {256, 240, 224, 192, 176, 128, 64}) {
                if (bn == 64 && bm != 64) continue;  // the skinny tile (gemm_ar at M <= 64), with its 12-stage ring
                for (DType out : {DType::BF16, DType::F32}) {
                    // gemm_ar's fused epilogue stages whole 128-byte slab rows (it falls back to its reduce kernel
                    // for other tiles). gemm_rs's RsAccHooks keep the plain epilogue and its stages; its plan never
                    // takes BLOCK_N 240 / 224 (gemm_rs/plan.cpp fused_config: ptxas spills them).
                    const bool fused = std::string(pol.hooks).find("EpilogueHooks") != std::string::npos;
                    if (fused && (bn * static_cast<int>(loom::dtype_size(out))) % 128 != 0) continue;
                    if (std::string(pol.hooks).find("RsAccHooks") != std::string::npos && (bn == 240 || bn == 224))
                        continue;
                    loom::GemmConfig c;
                    c.block_m = bm;
                    c.block_n = bn;
                    c.cluster_m = 1;
                    c.tail_splits = pol.tail_splits > 0 ? pol.tail_splits : 1;
                    // The fused epilogue stages the whole tile (fewer pipeline stages fit beside it).
                    c.stages = loom::kernels::gemm_sm90_plan_stages(
                        bm, bn, fused ? static_cast<int>(loom::dtype_size(out)) : 0);
                    // The bias type the ops pass: none (the epilogue without arithmetic) where the plain TMA-store
                    // epilogue runs, F32 for the fused epilogue's hooks.
                    const std::optional<DType> bias =
                        fused ? std::optional(DType::F32) : loom::gemm_kernel_bias(c, out, loom::GemmOptions{});
                    const auto spec = loom::gemm_kernel_spec(c, DType::BF16, out, bias, false, pol.hooks, pol.header);
                    const auto r = loom::jit::compile(spec, 90);
                    EXPECT_FALSE(r.cubin.empty()) << spec.display();
                    EXPECT_EQ(r.spill_bytes, 0) << spec.display() << "\n" << r.resource_report;
                    EXPECT_EQ(r.resource_report.find("C7510"), std::string::npos)
                        << "wgmma serialised in " << spec.display() << "\n"
                        << r.resource_report;
                }
            }
        }
    }
}

// fp8 e4m3 inputs and scaled products: the same hooks over the e4m3
// wgmma mainloop, and with an alpha or device scales the affine epilogue's instantiation (TBias = float) of every
// policy that scales in its epilogue (the tile::ScalesAccumulators ones scale the accumulators in the unscaled
// instantiation), for bf16 inputs too; the widths the Overlap heuristic picks most (128-row tiles), bf16 and fp32
// outputs.
TEST(OverlapCompile, HookedFp8AndScaledGemmHasNoSpills) {
    const struct {
        const char* hooks;
        const char* header;
        int tail_splits;
    } policies[] = {{"loom::kernels::overlap::AgGemmHooks", "loom/kernels/overlap/ag_gemm.cuh"},
                    {"loom::kernels::overlap::AgGemmHooks", "loom/kernels/overlap/ag_gemm.cuh", 2},
                    {"loom::kernels::overlap::TileNotifyHooks", "loom/kernels/overlap/gemm_rs.cuh"},
                    {"loom::kernels::overlap::RsAccHooks", "loom/kernels/overlap/gemm_rs.cuh"},
                    {"loom::kernels::overlap::RsPullHooks", "loom/kernels/overlap/gemm_rs_pull.cuh"},
                    {"loom::kernels::overlap::ArEpilogueHooks", "loom/kernels/overlap/gemm_ar.cuh"}};
    const struct {
        DType in, out;
        bool scaled;
    } variants[] = {{DType::F8E4M3, DType::BF16, false},
                    {DType::F8E4M3, DType::F32, false},
                    {DType::F8E4M3, DType::BF16, true},
                    {DType::BF16, DType::BF16, true}};
    for (const auto& pol : policies) {
        const std::string hooks = pol.hooks;
        const bool fused = hooks.find("EpilogueHooks") != std::string::npos;
        const bool acc_hooks = hooks.find("RsAccHooks") != std::string::npos ||
                               hooks.find("RsPull") != std::string::npos || hooks.find("AgGemm") != std::string::npos;
        for (int bn : {256, 192, 128}) {
            for (const auto& v : variants) {
                if (v.scaled && acc_hooks) continue;  // scaled on the accumulators: the unscaled instantiation
                loom::GemmConfig c;
                c.block_m = 128;
                c.block_n = bn;
                c.block_k = loom::kernels::gemm_block_k(static_cast<int>(loom::dtype_size(v.in)));
                c.cluster_m = 1;
                c.tail_splits = pol.tail_splits > 0 ? pol.tail_splits : 1;
                c.stages = loom::kernels::gemm_sm90_plan_stages(128, bn,
                                                                fused ? static_cast<int>(loom::dtype_size(v.out)) : 0);
                loom::GemmOptions o;
                if (v.scaled) o.alpha = 0.5f;
                const std::optional<DType> bias =
                    fused ? std::optional(DType::F32) : loom::gemm_kernel_bias(c, v.out, o);
                const auto spec = loom::gemm_kernel_spec(c, v.in, v.out, bias, false, pol.hooks, pol.header);
                const auto r = loom::jit::compile(spec, 90);
                EXPECT_FALSE(r.cubin.empty()) << spec.display();
                EXPECT_EQ(r.spill_bytes, 0) << spec.display() << "\n" << r.resource_report;
            }
        }
    }
}

// fp8 plans: 128-element k-blocks (one 128-byte row), single-CTA tiles (loom::gemm takes 2-CTA clusters for fp8; the
// hooks order single tiles), so ag_gemm keeps its split tail; the SM producer's blocks count fp8's bytes.
TEST(OverlapPlan, Fp8PlansTakeFp8KBlocksAndSingleCtaTiles) {
    const DType f8 = DType::F8E4M3;
    const loom::OverlapPlan plans[] = {
        loom::ag_gemm_plan(8192, 3840, 8192, 8, loom::AgProducer::CopyEngine, 0, 90, 132, false, f8),
        loom::ag_gemm_plan(8192, 1376, 4096, 8, loom::AgProducer::Sm, 0, 90, 132, false, f8),
        loom::gemm_rs_plan(8192, 4096, 1792, 8, 0, 90, 132, loom::RsAlgo::Auto, 2, f8),
        loom::gemm_rs_plan(8192, 4096, 1792, 8, 0, 90, 132, loom::RsAlgo::ScatterReduce, 2, f8),
        loom::gemm_ar_plan(64, 8192, 3584, 2, 0, 90, 132, loom::ArAlgo::Auto, 2, f8),
        loom::gemm_ar_plan(64, 8192, 3584, 2, 0, 90, 132, loom::ArAlgo::ReduceKernel, 2, f8)};
    for (const auto& p : plans) {
        EXPECT_EQ(p.gemm.block_k, 128) << p.str();
        EXPECT_EQ(p.gemm.cluster_m, 1) << p.str();
        EXPECT_NO_THROW(loom::gemm_validate_config(p.gemm, false, f8)) << p.str();
    }
    // 8192 x 3840 x 8192 at W = 8: 7.3 waves of 128 x 256 tiles, whose tail the bf16 plan splits three ways
    // (test_gemm_compile.cpp); fp8's single-CTA plan splits it too.
    EXPECT_GE(plans[0].gemm.tail_splits, 2) << plans[0].str();
    // SM producer: one block per 256 KiB of a rank's chunk (1 MiB in bf16 at M = 2048, K = 512, W = 2; half in fp8).
    EXPECT_EQ(loom::ag_gemm_plan(2048, 1024, 512, 2, loom::AgProducer::Sm, 0, 90, 132).comm_blocks, 4);
    EXPECT_EQ(loom::ag_gemm_plan(2048, 1024, 512, 2, loom::AgProducer::Sm, 0, 90, 132, false, f8).comm_blocks, 2);
}

TEST(OverlapCompile, CommKernelsCompile) {
    const struct {
        const char* header;
        const char* name;
        const char* arg;
        bool no_spills;
    } kernels[] = {
        {"loom/kernels/overlap/ag_gemm.cuh", "loom::kernels::overlap::ag_gemm_push", "0", false},
        {"loom/kernels/overlap/ag_gemm.cuh", "loom::kernels::overlap::ag_gemm_push", "1", false},
        {"loom/kernels/overlap/ag_gemm.cuh", "loom::kernels::overlap::ag_gemm_direct_stage", nullptr, true},
        {"loom/kernels/overlap/gemm_rs.cuh", "loom::kernels::overlap::gemm_rs_scatter_reduce", "__nv_bfloat16", true},
        {"loom/kernels/overlap/gemm_rs.cuh", "loom::kernels::overlap::gemm_rs_scatter_reduce", "float", true},
        {"loom/kernels/overlap/gemm_ar.cuh", "loom::kernels::overlap::gemm_ar_reduce", "__nv_bfloat16", true},
        {"loom/kernels/overlap/gemm_ar.cuh", "loom::kernels::overlap::gemm_ar_reduce", "__half", true},
        {"loom/kernels/overlap/gemm_ar.cuh", "loom::kernels::overlap::gemm_ar_reduce", "float", true}};
    for (const auto& k : kernels) {
        loom::jit::KernelSpec spec;
        spec.header = k.header;
        spec.name = k.name;
        if (k.arg != nullptr) spec.template_args = {k.arg};
        const auto r = loom::jit::compile(spec, 90);
        EXPECT_FALSE(r.cubin.empty()) << spec.display();
        // ag_gemm_push spills 8-16 bytes outside its copy loops, which costs nothing measurable. The scatter-reduce
        // keeps U vectors per thread in flight (384 threads: up to 170 registers) and must not spill.
        if (k.no_spills) EXPECT_EQ(r.spill_bytes, 0) << spec.display() << "\n" << r.resource_report;
    }
}

// The fused pull's finish kernel (the parts its GEMM's reducers left): every output type, the tiles its GEMM takes.
TEST(OverlapCompile, PullFinishKernelCompiles) {
    for (const char* out : {"__nv_bfloat16", "__half", "float"}) {
        for (const auto& [bm, bn] : {std::pair{128, 256}, std::pair{64, 128}, std::pair{128, 176}}) {
            loom::jit::KernelSpec spec;
            spec.header = "loom/kernels/overlap/gemm_rs_pull.cuh";
            spec.name = "loom::kernels::overlap::gemm_rs_pull_finish";
            spec.template_args = {out, std::to_string(bm), std::to_string(bn)};
            const auto r = loom::jit::compile(spec, 90);
            EXPECT_FALSE(r.cubin.empty()) << spec.display();
            EXPECT_EQ(r.spill_bytes, 0) << spec.display() << "\n" << r.resource_report;
        }
    }
}

// The diagnostic builds of the fused gemm_rs kernels (LOOM_DIAG_RS_FUSED_SKIP: bench-overlap --rs-fused-diag and the
// tests' way to the pull's finish kernel) compile; the ops never build them.
TEST(OverlapCompile, DiagnosticBuildsCompile) {
    const struct {
        const char* hooks;
        const char* header;
        const char* skip;
    } builds[] = {{"loom::kernels::overlap::RsAccHooks", "loom/kernels/overlap/gemm_rs.cuh", "11"},
                  {"loom::kernels::overlap::RsPullHooks", "loom/kernels/overlap/gemm_rs_pull.cuh", "7"}};
    for (const auto& d : builds) {
        loom::GemmConfig c;
        c.block_m = 128;
        c.block_n = 256;
        c.cluster_m = 1;
        c.tail_splits = 1;
        c.stages = loom::kernels::gemm_sm90_plan_stages(128, 256);
        auto spec = loom::gemm_kernel_spec(c, DType::BF16, DType::BF16,
                                           loom::gemm_kernel_bias(c, DType::BF16, loom::GemmOptions{}), false, d.hooks,
                                           d.header);
        spec.defines.push_back(std::string("LOOM_DIAG_RS_FUSED_SKIP=") + d.skip);
        const auto r = loom::jit::compile(spec, 90);
        EXPECT_FALSE(r.cubin.empty()) << spec.display();
    }
}

// gemm_rs: Auto takes the fused epilogue when M / W is a multiple of BLOCK_M (every SM to the GEMM, the plain
// kernel's stages, no tile width its kernel spills at), the scatter-reduce otherwise.
TEST(OverlapPlan, GemmRsPicksTheFusedEpilogueWhereItFits) {
    for (int sms : {132, 66, 33, 14}) {
        for (int world : {1, 2, 4, 8}) {
            for (int out_bytes : {2, 4}) {
                const auto f =
                    loom::gemm_rs_plan(8192, 4096, 11008 / 8, world, 0, 90, sms, loom::RsAlgo::Auto, out_bytes);
                EXPECT_EQ(f.rs_algo, loom::RsAlgo::FusedEpilogue) << sms << " " << world << " " << f.str();
                EXPECT_EQ(f.comm_blocks, 0) << f.str();
                EXPECT_LE(f.gemm.grid, sms) << f.str();
                EXPECT_EQ((8192 / world) % f.gemm.block_m, 0) << f.str();
                EXPECT_EQ(f.gemm.stages, loom::kernels::gemm_sm90_plan_stages(f.gemm.block_m, f.gemm.block_n))
                    << f.str();
                EXPECT_LE(loom::kernels::gemm_sm90_smem_bytes(f.gemm.block_m, f.gemm.block_n, f.gemm.stages),
                          227u * 1024u)
                    << f.str();
            }
            // Never a width at which ptxas spills the fused kernel (gemm_rs/plan.cpp fused_config), whatever N.
            for (int64_t n = 512; n <= 16384; n += 112) {
                for (int out_bytes : {2, 4}) {
                    const auto g = loom::gemm_rs_plan(8192, n, 4096, world, 0, 90, sms, loom::RsAlgo::Auto, out_bytes);
                    if (g.rs_algo != loom::RsAlgo::FusedEpilogue) continue;
                    const int bn = g.gemm.block_n;
                    EXPECT_TRUE(bn != 240 && bn != 224 && (out_bytes == 2 || (bn != 208 && bn != 144)))
                        << n << " " << out_bytes << " " << g.str();
                }
            }
            // 136 rows per rank: no tile height divides it, so the scatter-reduce (with its comm blocks).
            const auto s = loom::gemm_rs_plan(136 * world, 256, 256, world, 0, 90, sms);
            EXPECT_EQ(s.rs_algo, world == 1 && 136 % s.gemm.block_m == 0 ? loom::RsAlgo::FusedEpilogue
                                                                         : loom::RsAlgo::ScatterReduce)
                << s.str();
            if (s.rs_algo == loom::RsAlgo::ScatterReduce) EXPECT_GE(s.comm_blocks, 1) << s.str();
            // Forced: a 64-row tile where M / W is a multiple of 64 only.
            const auto f64 = loom::gemm_rs_plan(192 * world, 512, 256, world, 0, 90, sms, loom::RsAlgo::FusedEpilogue);
            EXPECT_EQ(192 % f64.gemm.block_m, 0) << f64.str();
            EXPECT_EQ(f64.rs_algo, loom::RsAlgo::FusedEpilogue);
            EXPECT_EQ(loom::gemm_rs_plan(8192, 4096, 1376, world, 0, 90, sms, loom::RsAlgo::ScatterReduce).rs_algo,
                      loom::RsAlgo::ScatterReduce);
        }
    }
}

// With a GPU per rank, Auto takes the fused epilogue where its whole-tile config fits and the tiles are one wave;
// forced, the fused epilogue's config always fits.
TEST(OverlapPlan, GemmArPicksTheFusedEpilogueWhereItFits) {
    for (int sms : {132, 66, 14}) {
        for (int64_t m : {1, 16, 64, 100, 128}) {
            for (int out_bytes : {2, 4}) {
                const auto f = loom::gemm_ar_plan(m, 8192, 3584, 2, 0, 90, sms, loom::ArAlgo::FusedEpilogue, out_bytes);
                const int64_t tiles = (m + f.gemm.block_m - 1) / f.gemm.block_m * (8192 / f.gemm.block_n);
                const auto a = loom::gemm_ar_plan(m, 8192, 3584, 2, 0, 90, sms, loom::ArAlgo::Auto, out_bytes);
                if (tiles <= sms) {
                    EXPECT_EQ(a.ar_algo, loom::ArAlgo::FusedEpilogue) << a.str();
                } else {
                    EXPECT_NE(a.ar_algo, loom::ArAlgo::FusedEpilogue) << a.str();
                }
                EXPECT_EQ(f.ar_algo, loom::ArAlgo::FusedEpilogue) << f.str();
                EXPECT_EQ(f.comm_blocks, 0) << f.str();  // every SM for the GEMM
                EXPECT_LE(f.gemm.grid, sms) << f.str();
                EXPECT_EQ((f.gemm.block_n * out_bytes) % 128, 0) << f.str();
                EXPECT_GE(f.gemm.stages, 3) << f.str();
                EXPECT_LE(loom::kernels::gemm_sm90_smem_bytes(f.gemm.block_m, f.gemm.block_n, f.gemm.stages, out_bytes),
                          227u * 1024u)
                    << f.str();
            }
            const auto r = loom::gemm_ar_plan(m, 8192, 3584, 2, 0, 90, sms, loom::ArAlgo::ReduceKernel);
            EXPECT_EQ(r.ar_algo, loom::ArAlgo::ReduceKernel) << r.str();
            EXPECT_GE(r.comm_blocks, 1) << r.str();
        }
    }
}

TEST(OverlapPlan, UsableSmsAreTheAttributeOrTheOption) {
    // Under MPS the attribute already is the client's share (checked on the GPU by Overlap.MpsShareIsTheAttribute),
    // so the percentage is not applied a second time: with num_sms 0 the attribute is used as is.
    EXPECT_EQ(loom::overlap_usable_sms(132, 0), 132);
    EXPECT_EQ(loom::overlap_usable_sms(14, 0), 14);
    EXPECT_EQ(loom::overlap_usable_sms(66, 40), 40);  // the options' num_sms wins
    EXPECT_EQ(loom::overlap_usable_sms(132, 500), 132);
    EXPECT_THROW(loom::overlap_usable_sms(132, -3), loom::Error);
    EXPECT_THROW(loom::overlap_usable_sms(0, 0), loom::Error);
}

// The comm kernel runs concurrently with the persistent GEMM and its blocks spin: they must leave SMs to the GEMM
// and the GEMM's grid must fit beside them on the SMs this process can use (2 ranks under MPS: 66, 8 ranks: 14).
TEST(OverlapPlan, CommBlocksLeaveTheGemmItsSms) {
    for (int sms : {132, 66, 32, 14, 4, 2}) {
        for (int world : {2, 4, 8}) {
            const loom::OverlapPlan plans[] = {
                loom::ag_gemm_plan(8192, 3584, 8192, world, loom::AgProducer::Sm, 0, 90, sms),
                loom::ag_gemm_plan(8192, 3584, 8192, world, loom::AgProducer::CopyEngine, 0, 90, sms),
                loom::ag_gemm_plan(8192, 3584, 8192, world, loom::AgProducer::CopyEngine, 0, 90, sms, true),
                loom::gemm_rs_plan(8192, 4096, 1792, world, 0, 90, sms),
                loom::gemm_ar_plan(128, 8192, 4096, world, 0, 90, sms),
                loom::gemm_ar_plan(128, 8192, 4096, world, 0, 90, sms, loom::ArAlgo::ReduceKernel),
                loom::gemm_rs_plan(8192, 4096, 1792, world, 64, 90, sms),  // requested: still capped
            };
            for (const auto& p : plans) {
                if (p.ar_algo == loom::ArAlgo::Sequential) continue;  // loom::gemm then loom::all_reduce: no split
                EXPECT_GE(p.comm_blocks, 0) << sms << " " << p.str();
                EXPECT_LE(p.comm_blocks, sms - 1) << sms << " " << p.str();
                EXPECT_GE(p.gemm.grid, 1) << sms << " " << p.str();
                EXPECT_LE(p.gemm.grid + p.comm_blocks + p.reserved_sms, sms) << sms << " " << p.str();
                EXPECT_EQ(p.gemm.cluster_m, 1) << p.str();
            }
            // Copy engine with peers on this GPU: the copies run before the GEMM (ag_gemm), which keeps every SM.
            EXPECT_EQ(loom::ag_gemm_plan(8192, 3584, 8192, world, loom::AgProducer::CopyEngine, 0, 90, sms, true)
                          .reserved_sms,
                      0);
            // Defaults keep at least three quarters of the SMs for the GEMM.
            EXPECT_LE(loom::gemm_rs_plan(8192, 4096, 1792, world, 0, 90, sms).comm_blocks, std::max(1, sms / 4));
            EXPECT_LE(loom::gemm_ar_plan(128, 8192, 4096, world, 0, 90, sms).comm_blocks, std::max(1, sms / 4));
        }
    }
}

}  // namespace
