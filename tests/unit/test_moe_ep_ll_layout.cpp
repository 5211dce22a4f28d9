// CPU tests of the low-latency expert-parallel ops (docs/moe.md): both kernels compile for sm_90a and sm_80 without
// local-memory spills, the message and area layouts, the receive sizes, and the shape validation (no GPU needed).
#include <gtest/gtest.h>

#include <string>

#include "loom/jit/jit.hpp"
#include "loom/kernels/moe/ep_ll_params.hpp"
#include "loom/ops/moe_ep_ll.hpp"
#include "loom/runtime/error.hpp"
#include "ops/moe/ep/ll_state.hpp"

namespace {

namespace km = loom::kernels::moe;
namespace ll = loom::moe::ep_ll;

void expect_clean(const loom::jit::KernelSpec& spec, int arch) {
    const auto r = loom::jit::compile(spec, arch);
    EXPECT_EQ(r.spill_bytes, 0) << spec.display() << " sm_" << arch << "\n" << r.resource_report;
    EXPECT_EQ(r.stack_bytes, 0) << spec.display() << " sm_" << arch << "\n" << r.resource_report;
}

TEST(MoeEpLlCompile, DispatchAndCombineHaveNoSpills) {
    for (int arch : {90, 80}) {
        expect_clean(ll::dispatch_spec(true), arch);
        expect_clean(ll::dispatch_spec(false), arch);
        expect_clean(ll::combine_spec(), arch);
    }
}

TEST(MoeEpLlLayout, MessagesAre16ByteAlignedPieces) {
    // H = 7168: 7168 fp8 bytes + 56 scales (224 bytes) + the 16-byte header.
    EXPECT_EQ(km::ep_ll_payload_bytes(7168, true), 7168);
    EXPECT_EQ(km::ep_ll_scale_bytes(7168, true), 224);
    EXPECT_EQ(km::ep_ll_msg_bytes(7168, true), 7168 + 224 + 16);
    EXPECT_EQ(km::ep_ll_msg_bytes(7168, false), 2 * 7168 + 16);
    // 17 scale blocks: 68 bytes of scales padded to 80.
    EXPECT_EQ(km::ep_ll_scale_bytes(2176, true), 80);
    EXPECT_EQ(km::ep_ll_scale_bytes(2176, false), 0);
    for (int h = 128; h <= 8192; h += 128)
        for (bool fp8 : {true, false}) {
            EXPECT_EQ(km::ep_ll_msg_bytes(h, fp8) % 16, 0) << h;
            EXPECT_EQ(km::ep_ll_payload_bytes(h, fp8) % 16, 0) << h;
        }
}

TEST(MoeEpLlLayout, AreasHoldMessagesThenSignals) {
    // L = 32 local experts, W = 8, M = 128, H = 7168 fp8: 32 x 8 x 128 messages, then 256 counts.
    const int64_t msg = km::ep_ll_msg_bytes(7168, true);
    EXPECT_EQ(km::ep_ll_dispatch_count_offset(32, 8, 128, msg), int64_t{32} * 8 * 128 * msg);
    const int64_t half = km::ep_ll_dispatch_half_bytes(32, 8, 128, msg);
    EXPECT_GE(half, km::ep_ll_dispatch_count_offset(32, 8, 128, msg) + 32 * 8 * 8);
    EXPECT_EQ(half % 1024, 0);
    // Combine: 128 tokens x 8 slots of bf16 rows, an int64 table entry per slot, one flag per expert, one done mark
    // per rank (W = 8); each region 8-byte aligned.
    EXPECT_EQ(km::ep_ll_combine_table_offset(128, 8, 7168), int64_t{128} * 8 * 7168 * 2);
    EXPECT_EQ(km::ep_ll_combine_flag_offset(128, 8, 7168), int64_t{128} * 8 * 7168 * 2 + 128 * 8 * 8);
    EXPECT_EQ(km::ep_ll_combine_done_offset(128, 8, 7168, 256), km::ep_ll_combine_flag_offset(128, 8, 7168) + 256 * 8);
    const int64_t chalf = km::ep_ll_combine_half_bytes(128, 8, 7168, 256, 8);
    EXPECT_GE(chalf, km::ep_ll_combine_done_offset(128, 8, 7168, 256) + 8 * 8);
    EXPECT_EQ(chalf % 1024, 0);
    EXPECT_EQ(km::ep_ll_combine_table_offset(1, 1, 128) % 8, 0);
    // Several nodes: a staging message per (token, slot), a staging row per warp of the grid; whole KiBs each.
    EXPECT_GE(km::ep_ll_dispatch_staging_bytes(128, 8, msg), int64_t{128} * 8 * msg);
    EXPECT_EQ(km::ep_ll_dispatch_staging_bytes(128, 8, msg) % 1024, 0);
    EXPECT_EQ(km::ep_ll_combine_staging_bytes(132, 7168), int64_t{132} * km::kEpLlWarps * 7168 * 2);
    EXPECT_EQ(km::ep_ll_combine_staging_bytes(3, 128) % 1024, 0);
    EXPECT_GE(km::ep_ll_combine_staging_bytes(3, 128), 3 * km::kEpLlWarps * 128 * 2);
}

TEST(MoeEpLlLayout, RecvSizesFollowTheExpertMajorLayout) {
    const loom::EpLowLatencyShape s{128, 7168, 8, 256};
    EXPECT_EQ(loom::ep_ll_recv_x_bytes(s, 8, true), std::size_t(32) * 8 * 128 * 7168);
    EXPECT_EQ(loom::ep_ll_recv_x_bytes(s, 8, false), std::size_t(32) * 8 * 128 * 7168 * 2);
    EXPECT_EQ(loom::ep_ll_recv_scales_bytes(s, 8), std::size_t(32) * 8 * 128 * 56 * 4);
    EXPECT_EQ(loom::ep_ll_recv_src_info_bytes(s, 8), std::size_t(32) * 8 * 128 * 4);
    EXPECT_EQ(loom::ep_ll_recv_counts_bytes(s, 8), std::size_t(32) * 8 * 4);
}

std::string shape_error(const loom::EpLowLatencyShape& s, int world) {
    try {
        ll::check_shape("ep_ll_dispatch", s, world);
    } catch (const loom::Error& e) {
        return e.what();
    }
    return "";
}

TEST(MoeEpLlChecks, ShapesAreValidatedWithNamedArguments) {
    EXPECT_EQ(shape_error({128, 7168, 8, 256}, 8), "");
    EXPECT_EQ(shape_error({1, 128, 1, 2}, 2), "");
    EXPECT_NE(shape_error({0, 7168, 8, 256}, 8).find("shape.max_tokens"), std::string::npos);
    EXPECT_NE(shape_error({128, 7100, 8, 256}, 8).find("shape.hidden"), std::string::npos);
    EXPECT_NE(shape_error({128, 0, 8, 256}, 8).find("shape.hidden"), std::string::npos);
    EXPECT_NE(shape_error({128, 7168, 0, 256}, 8).find("shape.topk"), std::string::npos);
    EXPECT_NE(shape_error({128, 7168, 33, 256}, 8).find("shape.topk"), std::string::npos);
    EXPECT_NE(shape_error({128, 7168, 8, 250}, 8).find("multiple of the world size 8"), std::string::npos);
    EXPECT_NE(shape_error({128, 7168, 8, 2048}, 8).find("shape.num_experts"), std::string::npos);
}

}  // namespace
