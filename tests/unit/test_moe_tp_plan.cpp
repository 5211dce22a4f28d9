// CPU tests of the TP-MoE ops' fused algorithms: the choice between the algorithms, the communication kernels' block
// counts, and JIT compilation of the fused kernels (the hooked grouped GEMMs, the push and the reduce-send) for sm_90a
// without spills.
#include <gtest/gtest.h>

#include <string>

#include "loom/jit/jit.hpp"
#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/kernels/moe/tp_moe_params.hpp"
#include "loom/ops/moe.hpp"
#include "loom/runtime/error.hpp"
#include "ops/moe/grouped_gemm_internal.hpp"
#include "ops/moe/tp/tp_moe.hpp"
#include "runtime/settings_override.hpp"

namespace {

using loom::DType;
using loom::GemmConfig;
using loom::MatrixView;
using loom::MoeActivation;
using loom::TpMoeAlgo;
using loom::moe::TpMoeFacts;

TpMoeFacts hopper(int world) {
    TpMoeFacts f;
    f.world = world;
    f.arch = 90;
    f.device_sms = 132;
    f.rows = 16384;
    return f;
}

std::string error_of(TpMoeAlgo a, const TpMoeFacts& f) {
    try {
        (void)loom::moe::choose_tp_moe_algo("ag_moe", a, f);
    } catch (const loom::Error& e) {
        return e.what();
    }
    return "no error";
}

TEST(MoeTpPlan, AutoPicksFusedWhereItApplies) {
    for (int w : {2, 3, 4, 8})
        EXPECT_EQ(loom::moe::choose_tp_moe_algo("x", TpMoeAlgo::Auto, hopper(w)), TpMoeAlgo::Fused);
    TpMoeFacts f = hopper(1);
    EXPECT_EQ(loom::moe::choose_tp_moe_algo("x", TpMoeAlgo::Auto, f), TpMoeAlgo::Sequential);
    f = hopper(4);
    f.captured = true;
    EXPECT_EQ(loom::moe::choose_tp_moe_algo("x", TpMoeAlgo::Auto, f), TpMoeAlgo::Sequential);
    f = hopper(4);
    f.arch = 80;
    EXPECT_EQ(loom::moe::choose_tp_moe_algo("x", TpMoeAlgo::Auto, f), TpMoeAlgo::Sequential);
    f = hopper(4);
    f.single_node = false;
    EXPECT_EQ(loom::moe::choose_tp_moe_algo("x", TpMoeAlgo::Auto, f), TpMoeAlgo::Sequential);
    f = hopper(4);
    f.device_sms = 1;
    EXPECT_EQ(loom::moe::choose_tp_moe_algo("x", TpMoeAlgo::Auto, f), TpMoeAlgo::Sequential);
    f = hopper(4);
    f.x_words = false;  // ag_moe's x not in 16-byte words
    EXPECT_EQ(loom::moe::choose_tp_moe_algo("x", TpMoeAlgo::Auto, f), TpMoeAlgo::Sequential);
    // Calls below kTpMoeFusedMinRows routed rows: Sequential under Auto; Fused still runs when asked for.
    f = hopper(4);
    f.rows = loom::moe::kTpMoeFusedMinRows - 1;
    EXPECT_EQ(loom::moe::choose_tp_moe_algo("x", TpMoeAlgo::Auto, f), TpMoeAlgo::Sequential);
    EXPECT_EQ(loom::moe::choose_tp_moe_algo("x", TpMoeAlgo::Fused, f), TpMoeAlgo::Fused);
    f.rows = loom::moe::kTpMoeFusedMinRows;
    EXPECT_EQ(loom::moe::choose_tp_moe_algo("x", TpMoeAlgo::Auto, f), TpMoeAlgo::Fused);
    // Sequential always runs, whatever the facts.
    f = hopper(4);
    f.device_sms = 1;
    f.arch = 0;
    EXPECT_EQ(loom::moe::choose_tp_moe_algo("x", TpMoeAlgo::Sequential, f), TpMoeAlgo::Sequential);
}

TEST(MoeTpPlan, FusedWhereItCannotRunNamesWhy) {
    EXPECT_EQ(loom::moe::choose_tp_moe_algo("x", TpMoeAlgo::Fused, hopper(2)), TpMoeAlgo::Fused);
    EXPECT_NE(error_of(TpMoeAlgo::Fused, hopper(1)).find("ag_moe: opts.algo: fused cannot run here: it needs a world"),
              std::string::npos);
    TpMoeFacts f = hopper(4);
    f.captured = true;
    EXPECT_NE(error_of(TpMoeAlgo::Fused, f).find("CUDA graph"), std::string::npos) << error_of(TpMoeAlgo::Fused, f);
    f = hopper(4);
    f.arch = 89;
    EXPECT_NE(error_of(TpMoeAlgo::Fused, f).find("compute capability >= 9.0"), std::string::npos);
    f = hopper(4);
    f.x_words = false;
    EXPECT_NE(error_of(TpMoeAlgo::Fused, f).find("16-byte words"), std::string::npos);
}

TEST(MoeTpPlan, XInWordsNeedsWholeWordsAndAlignment) {
    alignas(16) static char buf[256];
    EXPECT_TRUE(loom::moe::x_in_words(MatrixView{buf, DType::BF16, 4, 8}));
    EXPECT_FALSE(loom::moe::x_in_words(MatrixView{buf, DType::BF16, 4, 12}));     // 24-byte rows
    EXPECT_FALSE(loom::moe::x_in_words(MatrixView{buf + 8, DType::BF16, 4, 8}));  // 8-byte aligned
    EXPECT_TRUE(loom::moe::x_in_words(MatrixView{buf + 16, DType::F32, 2, 4}));
}

TEST(MoeTpPlan, BlockCounts) {
    EXPECT_EQ(loom::moe::ag_push_blocks(0, 132), 1);
    EXPECT_EQ(loom::moe::ag_push_blocks(1 << 20, 132), 16);
    EXPECT_EQ(loom::moe::ag_push_blocks(int64_t{1} << 30, 132), 264);
    EXPECT_EQ(loom::moe::ag_push_blocks(int64_t{1} << 30, 8), 16);  // never more than two per SM
    EXPECT_EQ(loom::moe::ag_push_blocks(int64_t{1} << 30, 0), 2);
    // The side blocks leave the GEMM at least one SM and take at most a quarter, more of them for more side work.
    for (int sms : {2, 3, 16, 33, 66, 132})
        for (double bytes : {0.0, 1e3, 1e6, 1e8, 1e10}) {
            const int p = loom::moe::rs_side_blocks(bytes, 1e11, 1e8, sms);
            EXPECT_GE(p, 1);
            EXPECT_LE(p, sms - 1) << sms << " SMs, " << bytes << " B";
            EXPECT_LE(p, std::max(1, sms / 4)) << sms << " SMs, " << bytes << " B";
        }
    // Mixtral-8x7B's down projection at 8192 tokens, 4 ranks: 151 MB of peers' sends beside a 481 GFLOP GEMM.
    EXPECT_EQ(loom::moe::rs_side_blocks(151e6, 481e9, 486e6, 33), 4);    // a quarter of an H200 (ranks share it)
    EXPECT_EQ(loom::moe::rs_side_blocks(151e6, 481e9, 486e6, 132), 14);  // a whole H200
    EXPECT_EQ(loom::moe::rs_side_blocks(1e3, 481e9, 486e6, 132), 1);
    EXPECT_EQ(loom::moe::rs_side_blocks(1e6, 0, 0, 132), 1);  // no GEMM estimate: one block
    EXPECT_LE(loom::moe::rs_side_blocks(1e6, 481e9, 486e6, 132), loom::moe::rs_side_blocks(1e8, 481e9, 486e6, 132));
    // Blocks after the GEMM: two per SM, at most one per item.
    EXPECT_EQ(loom::moe::down_tail_blocks(1, 132), 1);
    EXPECT_EQ(loom::moe::down_tail_blocks(100, 132), 100);
    EXPECT_EQ(loom::moe::down_tail_blocks(100000, 132), 264);
    EXPECT_EQ(loom::moe::down_tail_blocks(0, 33), 1);
}

TEST(MoeTpPlan, ChunkTokens) {
    // ~4096 16-byte words of output per item, at least 8 items where the tokens allow.
    EXPECT_EQ(loom::moe::down_chunk_tokens(2048, 4096, 2, 2), 8);   // Mixtral-8x7B, 8192 tokens over 4 ranks
    EXPECT_EQ(loom::moe::down_chunk_tokens(2048, 2048, 2, 8), 16);  // Qwen3-30B-A3B
    EXPECT_EQ(loom::moe::down_chunk_tokens(32, 2048, 2, 8), 4);     // 128 tokens over 4 ranks
    EXPECT_EQ(loom::moe::down_chunk_tokens(1, 64, 4, 2), 1);        // one token
    EXPECT_EQ(loom::moe::down_chunk_tokens(0, 64, 4, 2), 1);        // no tokens: still a valid divisor
    EXPECT_EQ(loom::moe::down_chunk_tokens(65536, 8, 2, 32), 32);   // the staged pairs: chunk x topk <= 1024
    EXPECT_EQ(loom::moe::down_chunk_tokens(65536, 1 << 20, 2, 2), 1);
    for (int64_t t : {1, 7, 33, 1000, 65536})
        for (int64_t h : {8, 64, 2048, 7168})
            for (int k : {1, 6, 32}) {
                const int c = loom::moe::down_chunk_tokens(t, h, 2, k);
                EXPECT_GE(c, 1);
                EXPECT_LE(c * k, loom::kernels::moe::kTpMoeMaxChunkEntries);
            }
}

void expect_clean(const loom::jit::CompileResult& r, const std::string& what) {
    EXPECT_FALSE(r.cubin.empty()) << what;
    EXPECT_EQ(r.spill_bytes, 0) << what << "\n" << r.resource_report;
    EXPECT_LE(r.stack_bytes, 64) << what << "\n" << r.resource_report;
    EXPECT_EQ(r.resource_report.find("C7510"), std::string::npos) << "wgmma serialised in " << what << "\n"
                                                                  << r.resource_report;
}

GemmConfig hopper_cfg(int bm, int bn, int stages) {
    GemmConfig c;
    c.block_m = bm;
    c.block_n = bn;
    c.stages = stages;
    c.block_k = loom::kernels::gemm_block_k(2);
    c.tma_store = false;
    return c;
}

TEST(MoeTpCompile, FusedKernelsHaveNoSpills) {
    const loom::detail::ScopedSettings nvrtc_only([](loom::Settings& s) { s.jit_nvcc_fallback = false; });
    const char* header = "loom/kernels/moe/tp_moe.cuh";
    for (int bm : {64, 128})
        for (int bn : {128, 256}) {
            for (MoeActivation act : {MoeActivation::None, MoeActivation::SwiGLU}) {
                const auto spec =
                    loom::moe::grouped_gemm_kernel_spec(hopper_cfg(bm, bn, 4), DType::BF16, DType::BF16, false, act,
                                                        "loom::kernels::moe::MoeAgHooks", header);
                expect_clean(loom::jit::compile(spec, 90), spec.display());
            }
            for (DType out : {DType::BF16, DType::F32}) {
                const auto spec =
                    loom::moe::grouped_gemm_kernel_spec(hopper_cfg(bm, bn, 4), DType::BF16, out, false,
                                                        MoeActivation::None, "loom::kernels::moe::MoeRsHooks", header);
                expect_clean(loom::jit::compile(spec, 90), spec.display());
            }
        }
    loom::jit::KernelSpec push;
    push.header = header;
    push.name = "loom::kernels::moe::moe_ag_push";
    expect_clean(loom::jit::compile(push, 90), push.display());
    for (const char* t : {"__nv_bfloat16", "__half", "float"}) {
        loom::jit::KernelSpec rs;
        rs.header = header;
        rs.name = "loom::kernels::moe::moe_rs_reduce_send";
        rs.template_args = {t};
        expect_clean(loom::jit::compile(rs, 90), rs.display());
        loom::jit::KernelSpec ar = rs;
        ar.name = "loom::kernels::moe::moe_ar_reduce_push";
        expect_clean(loom::jit::compile(ar, 90), ar.display());
        loom::jit::KernelSpec sum = rs;
        sum.name = "loom::kernels::moe::moe_tp_sum_slots";
        expect_clean(loom::jit::compile(sum, 90), sum.display());
    }
}

}  // namespace
