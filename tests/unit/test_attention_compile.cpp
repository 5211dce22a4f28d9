// CPU tests of the decode attention (docs/attention.md): every kernel variant compiles for sm_90a and sm_80 without
// local-memory spills, the choice of heads per block and of splits, and the shape validation (no GPU needed: the
// checks that raise come before any device query).
#include <gtest/gtest.h>

#include <string>

#include "loom/jit/jit.hpp"
#include "loom/kernels/attention/decode_params.hpp"
#include "loom/ops/attention.hpp"
#include "loom/runtime/error.hpp"
#include "ops/attention/decode_plan.hpp"

namespace {

using loom::DType;
namespace la = loom::attention;

void expect_clean(const loom::jit::KernelSpec& spec, int arch) {
    const auto r = loom::jit::compile(spec, arch);
    EXPECT_EQ(r.spill_bytes, 0) << spec.display() << " sm_" << arch << "\n" << r.resource_report;
}

// Every (dtype, head_dim, heads per block) the launcher can pick.
TEST(AttentionCompile, DecodeSplitHasNoSpills) {
    for (int arch : {90, 80})
        for (DType t : {DType::BF16, DType::F16})
            for (int d : {64, 128, 256})
                for (int h : {1, 2, 4, 8}) expect_clean(la::decode_split_spec(t, d, h), arch);
}

TEST(AttentionCompile, MergeAndSpCombineHaveNoSpills) {
    for (int arch : {90, 80})
        for (DType t : {DType::BF16, DType::F16})
            for (int d : {64, 128, 256}) {
                expect_clean(la::decode_merge_spec(t, d), arch);
                expect_clean(la::sp_combine_spec(t, d), arch);
            }
}

TEST(AttentionPlan, HeadsPerBlockCoverTheGroup) {
    EXPECT_EQ(la::decode_heads_per_block(1), 1);
    EXPECT_EQ(la::decode_heads_per_block(3), 4);
    EXPECT_EQ(la::decode_heads_per_block(4), 4);
    EXPECT_EQ(la::decode_heads_per_block(8), 8);
    EXPECT_EQ(la::decode_heads_per_block(12), 8);  // two blocks of the group
    EXPECT_EQ(la::decode_heads_per_block(96), 8);
}

TEST(AttentionPlan, SplitsFillTheSmsAndKeepSplitsLong) {
    // One sequence, 8 kv heads, 32K tokens on 132 SMs: ceil(264 / 8) = 33 splits.
    EXPECT_EQ(la::decode_splits(8, 32768, 32, 132, 0), 33);
    // Enough blocks already: one split.
    EXPECT_EQ(la::decode_splits(64 * 8, 32768, 32, 132, 0), 1);
    // Short sequences: at least 256 tokens per split.
    EXPECT_EQ(la::decode_splits(8, 1000, 32, 132, 0), 4);
    EXPECT_EQ(la::decode_splits(8, 0, 32, 132, 0), 1);
    // Capped, and the request wins.
    EXPECT_EQ(la::decode_splits(1, 1 << 20, 32, 132, 0), 128);
    EXPECT_LE(la::decode_splits(1, 1 << 30, 32, 1000, 0), la::kMaxSplits);
    EXPECT_EQ(la::decode_splits(8, 1000, 32, 132, 7), 7);
}

// Shape errors raise before anything touches the device.
TEST(AttentionPlan, BadShapesRaiseNamingTheArgument) {
    alignas(16) static char buf[64];
    auto expect_error = [](const loom::DecodeQuery& q, const loom::KvCache& kv, const loom::DecodeOptions& o,
                           const char* needle) {
        try {
            la::plan_decode("decode_attention", q, kv, buf, nullptr, o, nullptr);
            ADD_FAILURE() << "no error for " << needle;
        } catch (const loom::Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    const loom::DecodeQuery q{buf, DType::BF16, 2, 32, 128};
    loom::KvCache kv;
    kv.k = kv.v = buf;
    kv.num_kv_heads = 8;
    kv.max_seq_len = 16;
    kv.seq_lens = reinterpret_cast<const int32_t*>(buf);
    const loom::DecodeOptions o;
    auto qd = q;
    qd.head_dim = 96;
    expect_error(qd, kv, o, "head_dim 64, 128 or 256, given 96");
    auto kv3 = kv;
    kv3.num_kv_heads = 3;
    expect_error(q, kv3, o, "integral GQA group");
    auto qf = q;
    qf.dtype = DType::F32;
    expect_error(qf, kv, o, "bf16 or f16, given f32");
    auto kvp = kv;
    kvp.block_table = reinterpret_cast<const int32_t*>(buf);
    kvp.max_seq_len = 0;
    kvp.num_pages = 4;
    kvp.max_pages = 2;
    kvp.page_size = 512;
    expect_error(q, kvp, o, "page_size in [1, 256], given 512");
    auto oc = o;
    oc.softcap = -1.f;
    expect_error(q, kv, oc, "softcap");
    auto os = o;
    os.num_splits = 1000;
    expect_error(q, kv, os, "num_splits");
    auto q0 = q;
    q0.batch = 0;
    expect_error(q0, kv, o, "batch >= 1, given 0");
}

}  // namespace
