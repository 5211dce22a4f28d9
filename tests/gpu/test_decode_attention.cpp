// loom::decode_attention against an fp64 host reference (tests/common/attention_reference.hpp) on fresh random
// inputs: contiguous and paged caches (page sizes 1, 3, 7, 16, 48, 100, 256, pages dealt in random order), GQA groups 1
// / 4 / 8 / 12 / all, head dims 64 / 128 / 256, bf16 and fp16, soft-cap, lengths 0 ... 32K that are not multiples of a
// page or a split, forced split counts, every kernel shape of the sweep. O and LSE are poisoned first; every element is
// checked. Bad inputs raise loom::Error; a block-table entry or a length out of range traps, naming itself (in a child
// process).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/attention_reference.hpp"
#include "common/child_process.hpp"
#include "common/device_io.hpp"
#include "common/reference.hpp"
#include "common/test_env.hpp"
#include "loom/jit/jit.hpp"
#include "loom/ops/attention.hpp"
#include "loom/runtime/error.hpp"
#include "ops/attention/decode_plan.hpp"

namespace {

using loom::DType;

struct Dev {
    void* p = nullptr;
    std::size_t bytes = 0;
    explicit Dev(std::size_t n) : bytes(n) { loom::test::cuda_or_die(cudaMalloc(&p, n ? n : 16), "cudaMalloc"); }
    template <class T>
    explicit Dev(const std::vector<T>& v) : Dev(v.size() * sizeof(T)) {
        if (!v.empty()) loom::test::cuda_or_die(cudaMemcpy(p, v.data(), bytes, cudaMemcpyHostToDevice), "upload");
    }
    ~Dev() { cudaFree(p); }
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
};

struct Case {
    std::vector<int32_t> lens;
    int hq = 32, hkv = 8, d = 128;
    int page_size = 0;  // 0: contiguous
    DType dtype = DType::BF16;
    float softcap = 0.f;
    int num_splits = 0;
    bool tight_max_len = false;  // DecodeOptions::max_seq_len = the longest length
    const loom::DecodeConfig* config = nullptr;
    int expect_stages = 0;  // > 0: the plan's pipeline depth must be this
};

std::string describe(const Case& c) {
    std::string s = "B=" + std::to_string(c.lens.size()) + " Hq=" + std::to_string(c.hq) +
                    " Hkv=" + std::to_string(c.hkv) + " D=" + std::to_string(c.d) +
                    " page=" + std::to_string(c.page_size) + " " + loom::dtype_name(c.dtype) +
                    " softcap=" + std::to_string(c.softcap) + " splits=" + std::to_string(c.num_splits) +
                    (c.config != nullptr ? " config " + c.config->str() : std::string()) + " lens:";
    for (std::size_t i = 0; i < c.lens.size() && i < 8; ++i) s += " " + std::to_string(c.lens[i]);
    return s;
}

void run_case(const Case& c, uint64_t seed) {
    SCOPED_TRACE(describe(c));
    std::mt19937_64 rng(loom::test::run_seed(seed));
    const int B = static_cast<int>(c.lens.size());
    const auto cache = loom::test::make_cache(c.lens, c.hkv, c.d, c.page_size, c.dtype, rng);
    const auto q = loom::test::random_halves(std::size_t(B) * c.hq * c.d, c.dtype, rng);
    Dev dq(q), dk(cache.k), dv(cache.v), dlens(cache.lens), dtable(cache.block_table);
    const std::size_t rows = std::size_t(B) * c.hq;
    Dev dout(rows * c.d * 2), dlse(rows * 4);
    loom::test::poison_nan(dout.p, dout.bytes);
    loom::test::poison_nan(dlse.p, dlse.bytes);

    loom::DecodeQuery dqv{dq.p, c.dtype, B, c.hq, c.d};
    loom::KvCache kv;
    kv.k = dk.p;
    kv.v = dv.p;
    kv.num_kv_heads = c.hkv;
    kv.seq_lens = static_cast<const int32_t*>(dlens.p);
    if (c.page_size == 0) {
        kv.max_seq_len = cache.max_seq_len;
    } else {
        kv.block_table = static_cast<const int32_t*>(dtable.p);
        kv.max_pages = cache.max_pages;
        kv.num_pages = cache.num_pages;
        kv.page_size = c.page_size;
    }
    loom::DecodeOptions o;
    o.softcap = c.softcap;
    o.num_splits = c.num_splits;
    o.config = c.config;
    if (c.tight_max_len) o.max_seq_len = std::max(1, *std::max_element(c.lens.begin(), c.lens.end()));
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    loom::decode_attention(dqv, kv, dout.p, static_cast<float*>(dlse.p), stream, o);
    loom::test::sync_or_die(stream);
    if (c.expect_stages > 0) {
        const auto plan =
            loom::attention::plan_decode("decode_attention", dqv, kv, dout.p, static_cast<float*>(dlse.p), o, nullptr);
        EXPECT_EQ(plan.config.stages, c.expect_stages) << plan.config.str();
    }
    cudaStreamDestroy(stream);

    const auto out = loom::test::download(dout.p, dout.bytes);
    const auto lse = loom::test::download(dlse.p, dlse.bytes);
    std::vector<double> ro, rl;
    loom::test::reference_decode(q, c.hq, cache, c.dtype, 1.0 / std::sqrt(double(c.d)), c.softcap, ro, rl);
    const double otol = c.dtype == DType::BF16 ? 1.2e-2 : 4e-3;
    int bad = 0;
    for (std::size_t r = 0; r < rows && bad < 10; ++r) {
        float got_lse;
        std::memcpy(&got_lse, lse.data() + r * 4, 4);
        const bool empty = std::isinf(rl[r]);
        if (empty ? !(std::isinf(got_lse) && got_lse < 0)
                  : !(std::abs(got_lse - rl[r]) <= 2e-3 + 2e-4 * std::abs(rl[r]))) {
            ADD_FAILURE() << "row " << r << " lse " << got_lse << " expected " << rl[r];
            ++bad;
        }
        for (int e = 0; e < c.d; ++e) {
            uint16_t h;
            std::memcpy(&h, out.data() + (r * c.d + e) * 2, 2);
            const double got = loom::test::half_bits_to_float(h, c.dtype), want = ro[r * c.d + e];
            if (!(std::abs(got - want) <= otol * (0.25 + std::abs(want)))) {
                ADD_FAILURE() << "row " << r << " (b " << r / c.hq << ", head " << r % c.hq << ") col " << e << ": "
                              << got << " expected " << want;
                if (++bad >= 10) break;
            }
        }
    }
}

class DecodeAttention : public ::testing::Test {
  protected:
    void SetUp() override { LOOM_REQUIRE_GPU(); }
};

TEST_F(DecodeAttention, MhaContiguous) { run_case({{1, 7, 100, 513}, 8, 8, 128}, 1); }
TEST_F(DecodeAttention, Gqa4Paged16) { run_case({{1000, 16, 17, 0, 4095}, 32, 8, 128, 16}, 2); }
TEST_F(DecodeAttention, Gqa8PageOne) { run_case({{300, 1, 77}, 64, 8, 128, 1}, 3); }
TEST_F(DecodeAttention, MqaGroup16Page256) { run_case({{5000, 256, 257}, 16, 1, 64, 256}, 4); }
TEST_F(DecodeAttention, Group12MasksHalfABlock) { run_case({{999, 33}, 24, 2, 128, 16}, 5); }
TEST_F(DecodeAttention, Group6Fp16) { run_case({{1500, 2}, 12, 2, 64, 0, DType::F16}, 6); }
TEST_F(DecodeAttention, HeadDim256SoftcapFp16) {
    Case c{{2049, 10, 700}, 8, 2, 256, 0, DType::F16};
    c.softcap = 2.f;  // scores reach about +-3: the cap bends them
    run_case(c, 7);
}
TEST_F(DecodeAttention, HeadDim64SoftcapPaged) {
    Case c{{3000, 1}, 32, 4, 64, 16};
    c.softcap = 1.5f;
    run_case(c, 8);
}
TEST_F(DecodeAttention, Long32K) {
    run_case({{32768}, 32, 8, 128, 16}, 9);
    run_case({{32000, 12345}, 8, 1, 128, 0}, 10);
}
TEST_F(DecodeAttention, ForcedSplits) {
    for (int s : {1, 2, 3, 7, 128}) {
        Case c{{1000, 999, 1}, 16, 4, 128, 16};
        c.num_splits = s;
        run_case(c, 20 + s);
    }
}
// Page sizes that do and do not divide a tile (the block-table ring holds one entry per token row; pages straddle
// tiles and splits), shuffled pages, lengths that end mid-page, on the tensor-core (group 4) and CUDA-core (group 1)
// shapes, with the heuristic's splits and forced ones (the fused merge of 3 and 37 splits).
TEST_F(DecodeAttention, PageSizesAcrossTiles) {
    uint64_t seed = 300;
    for (int page : {1, 3, 7, 16, 48, 100, 256}) {
        for (int splits : {0, 3, 37}) {
            Case gqa{{2500, 1, page + 1, 3 * page - 1, 0}, 32, 8, 128, page};
            gqa.num_splits = splits;
            run_case(gqa, ++seed);
            Case mha{{1025, 2 * page + 5}, 4, 4, 64, page, DType::F16};
            mha.num_splits = splits;
            run_case(mha, ++seed);
        }
    }
    Case wide{{4097, 300}, 16, 2, 256, 3};  // head dim 256, 8 heads per block
    wide.num_splits = 9;
    run_case(wide, ++seed);
}
TEST_F(DecodeAttention, ZeroLengths) {
    run_case({{0, 0}, 8, 8, 64}, 30);
    run_case({{0, 5, 0}, 8, 2, 128, 16}, 31);
}
TEST_F(DecodeAttention, ManySequences) {
    std::mt19937 rng(static_cast<uint32_t>(loom::test::run_seed(40)));
    std::vector<int32_t> lens(64);
    for (auto& l : lens) l = static_cast<int32_t>(rng() % 2048);
    run_case({lens, 32, 8, 128, 16}, 41);
    Case c{lens, 32, 8, 128, 0};
    c.tight_max_len = true;
    run_case(c, 42);
}

// 16 sequences of 12 kv heads with groups of 8 (192 blocks): the heuristic splits them in two, 3 blocks on most SMs,
// which only 2 stages keep resident at once (on an H200); lengths that end mid-tile and one empty sequence.
TEST_F(DecodeAttention, ShallowPipelineHoldsEveryBlockOfAnSm) {
    std::mt19937 rng(static_cast<uint32_t>(loom::test::run_seed(45)));
    std::vector<int32_t> lens(16);
    for (auto& l : lens) l = static_cast<int32_t>(3000 + rng() % 1096);
    lens[5] = 0;
    Case c{lens, 96, 12, 128, 0};
    int dev = 0, sms = 0;
    ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
    ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
    if (sms == 132) c.expect_stages = 2;
    run_case(c, 46);
    c.page_size = 16;
    run_case(c, 47);
}

// Every kernel shape bench-attention's sweep times (the heuristic's splits, one forced count, and the merge as a
// second launch), on a fragmented page-1 cache and a contiguous one, for the groups of 8 and 4: lengths that end
// mid-tile and mid-split, an empty sequence, and a sequence shorter than one tile.
TEST_F(DecodeAttention, EverySweepShapeMatches) {
    int dev = 0, smem = 0;
    ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
    ASSERT_EQ(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), cudaSuccess);
    uint64_t seed = 60;
    for (int hkv_group : {8, 4}) {
        const auto configs = loom::attention::decode_sweep_configs(128, hkv_group, smem);
        loom::attention::decode_precompile(DType::BF16, 128, hkv_group, configs, loom::jit::current_arch());
        for (loom::DecodeConfig cfg : configs) {
            for (int splits : {0, 5}) {
                cfg.splits = splits;
                Case paged{{5000, 17, 0, 4099}, 8 * hkv_group, 8, 128, 1};
                paged.config = &cfg;
                run_case(paged, ++seed);
                Case contiguous{{3001, 40}, 2 * hkv_group, 2, 128, 0};
                contiguous.config = &cfg;
                run_case(contiguous, ++seed);
            }
        }
    }
}

// A soft-cap, fp16 and head dims 64 / 256 through every sweep shape of their head dim (group 8).
TEST_F(DecodeAttention, SweepShapesOtherHeadDims) {
    int dev = 0, smem = 0;
    ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
    ASSERT_EQ(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), cudaSuccess);
    uint64_t seed = 200;
    for (int d : {64, 256}) {
        const auto configs = loom::attention::decode_sweep_configs(d, 8, smem);
        loom::attention::decode_precompile(DType::F16, d, 8, configs, loom::jit::current_arch());
        for (const loom::DecodeConfig& cfg : configs) {
            Case c{{2500, 3}, 16, 2, d, 16, DType::F16};
            c.softcap = 2.f;
            c.config = &cfg;
            run_case(c, ++seed);
        }
    }
}

TEST_F(DecodeAttention, BadConfigRaises) {
    Dev buf(1 << 20), lens(std::vector<int32_t>{4, 4});
    loom::KvCache kv;
    kv.k = kv.v = buf.p;
    kv.num_kv_heads = 8;
    kv.max_seq_len = 16;
    kv.seq_lens = static_cast<const int32_t*>(lens.p);
    const loom::DecodeQuery q{buf.p, DType::BF16, 2, 32, 128};
    loom::DecodeConfig cfg;
    cfg.stages = 1;
    loom::DecodeOptions o;
    o.config = &cfg;
    try {
        loom::decode_attention(q, kv, buf.p, nullptr, nullptr, o);
        ADD_FAILURE() << "no error for stages 1";
    } catch (const loom::Error& e) {
        EXPECT_NE(std::string(e.what()).find("DecodeConfig::stages in [2, 8], given 1"), std::string::npos) << e.what();
    }
}

// Back-to-back calls reuse the split workspace of the stream; a captured graph replays them.
TEST_F(DecodeAttention, GraphReplayMatchesEager) {
    std::mt19937_64 rng(loom::test::run_seed(50));
    const std::vector<int32_t> lens = {4000, 123};
    const auto cache = loom::test::make_cache(lens, 8, 128, 16, DType::BF16, rng);
    const auto q = loom::test::random_halves(2 * 32 * 128, DType::BF16, rng);
    Dev dq(q), dk(cache.k), dv(cache.v), dlens(cache.lens), dtable(cache.block_table), o1(2 * 32 * 128 * 2),
        o2(2 * 32 * 128 * 2);
    loom::KvCache kv;
    kv.k = dk.p;
    kv.v = dv.p;
    kv.num_kv_heads = 8;
    kv.seq_lens = static_cast<const int32_t*>(dlens.p);
    kv.block_table = static_cast<const int32_t*>(dtable.p);
    kv.max_pages = cache.max_pages;
    kv.num_pages = cache.num_pages;
    kv.page_size = 16;
    const loom::DecodeQuery dqv{dq.p, DType::BF16, 2, 32, 128};
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    for (int i = 0; i < 3; ++i) loom::decode_attention(dqv, kv, o1.p, nullptr, s);
    loom::test::poison_nan(o2.p, o2.bytes);
    cudaGraph_t g;
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    loom::decode_attention(dqv, kv, o2.p, nullptr, s);
    ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
    cudaGraphExec_t ge;
    ASSERT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
    for (int i = 0; i < 5; ++i) ASSERT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
    loom::test::sync_or_die(s);
    EXPECT_EQ(loom::test::download(o1.p, o1.bytes), loom::test::download(o2.p, o2.bytes));  // deterministic
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
}

TEST_F(DecodeAttention, BadInputsRaise) {
    Dev buf(1 << 20), lens(std::vector<int32_t>{4, 4});
    loom::KvCache kv;
    kv.k = kv.v = buf.p;
    kv.num_kv_heads = 8;
    kv.max_seq_len = 16;
    kv.seq_lens = static_cast<const int32_t*>(lens.p);
    const loom::DecodeQuery q{buf.p, DType::BF16, 2, 32, 128};
    auto expect = [&](const loom::DecodeQuery& qq, const loom::KvCache& kk, void* o, const char* needle) {
        try {
            loom::decode_attention(qq, kk, o, nullptr, nullptr);
            ADD_FAILURE() << "no error for " << needle;
        } catch (const loom::Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    auto k3 = kv;
    k3.num_kv_heads = 3;
    expect(q, k3, buf.p, "integral GQA group");
    auto q96 = q;
    q96.head_dim = 96;
    expect(q96, kv, buf.p, "head_dim 64, 128 or 256");
    expect(q, kv, nullptr, "expected o non-null");
    auto kn = kv;
    kn.seq_lens = nullptr;
    expect(q, kn, buf.p, "seq_lens");
    std::vector<char> host(1 << 20);
    auto kh = kv;
    kh.k = host.data() + (16 - reinterpret_cast<std::uintptr_t>(host.data()) % 16) % 16;
    expect(q, kh, buf.p, "kv k");
    auto ks = kv;
    ks.max_seq_len = 1 << 20;  // K would be 2 x 2^20 x 8 x 128 x 2 bytes: past the allocation
    expect(q, ks, buf.p, "kv k");
}

// A block-table entry out of range and a length past the capacity trap with a message naming them.
TEST_F(DecodeAttention, BadDeviceDataTraps) {
    const auto page = loom::test::run_child("decode-bad-page", {});
    EXPECT_NE(page.status, 0) << page.output;
    EXPECT_NE(page.output.find("block_table[1][2] = 99 is outside [0, 8)"), std::string::npos) << page.output;
    const auto len = loom::test::run_child("decode-bad-len", {});
    EXPECT_NE(len.status, 0) << len.output;
    EXPECT_NE(len.output.find("seq_lens[0] = 40 is outside [0, 32]"), std::string::npos) << len.output;
}

}  // namespace
