// loom::grouped_gemm against an fp64 host reference on fresh random inputs: random group sizes (0 included, all rows in
// one group, sizes not multiples of any tile), E up to 256, offsets in device memory, both B layouts, bf16 / fp16 / fp8
// in (fp8 with per-tensor and per-128-block scales), SwiGLU / GeLU, the Hopper kernel with either epilogue (staged
// through shared memory, or pair stores from registers) and the sm_80 kernel (fp8 too). C is poisoned with NaN first;
// every element of every group is checked, and every element outside the groups (rows before offsets[0] and past
// offsets[G], the padding columns of a C whose ld exceeds its columns) must keep its poison bit for bit. fp8's
// conversion on the sm_80 kernel is also checked bit for bit on every e4m3 value (PortableKernelFp8EveryValue).
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/device_io.hpp"
#include "common/reference.hpp"
#include "common/test_env.hpp"
#include "loom/ops/moe.hpp"
#include "loom/runtime/error.hpp"

namespace {

using loom::BLayout;
using loom::DType;
using loom::MoeActivation;

struct Case {
    int e = 8, groups = 0;  // groups 0: e
    int n = 256, k = 128;
    std::vector<int> sizes;  // rows per group; empty: random (`rows` in total)
    int rows = 700;
    int extra_rows = 5;  // rows of A / C past offsets[G]: never written
    int lead_rows = 0;   // rows of A / C before offsets[0]: never written
    int c_ld = 0;        // C's row stride in elements; 0: its columns (n_out)
    BLayout layout = BLayout::NK;
    DType in = DType::BF16, out = DType::BF16;
    MoeActivation act = MoeActivation::None;
    float alpha = 0.75f;
    bool scales = false;        // scale_a and per-expert scale_b
    bool block_scales = false;  // per-128-block scale_a_blocks [rows, K/128] and scale_b_blocks [E, N/128, K/128]
    bool sm80 = false;
    const loom::GemmConfig* config = nullptr;
};

float encode(float f, DType t, unsigned char* dst) {
    if (t == DType::F8E4M3) {
        const __nv_fp8_e4m3 v(f);
        std::memcpy(dst, &v, 1);
        return static_cast<float>(v);
    }
    const uint16_t h = t == DType::BF16 ? loom::test::float_to_bf16(f) : loom::test::float_to_half(f);
    std::memcpy(dst, &h, 2);
    return t == DType::BF16 ? loom::test::bf16_to_float(h) : loom::test::half_to_float(h);
}

double read_out(const unsigned char* p, DType t) {
    if (t == DType::F32) {
        float f;
        std::memcpy(&f, p, 4);
        return f;
    }
    uint16_t h;
    std::memcpy(&h, p, 2);
    return t == DType::BF16 ? loom::test::bf16_to_float(h) : loom::test::half_to_float(h);
}

struct Dev {
    void* p = nullptr;
    explicit Dev(size_t bytes) { LOOM_CHECK_CUDA(cudaMalloc(&p, bytes + 16)); }
    ~Dev() { cudaFree(p); }
};

// Group sizes summing to `rows`: random cut points (so some groups get 0, and sizes are arbitrary).
std::vector<int> random_sizes(int groups, int rows, uint64_t seed) {
    std::mt19937_64 rng(loom::test::run_seed(seed));
    std::vector<int> cuts(groups - 1);
    for (int& c : cuts) c = static_cast<int>(rng() % static_cast<uint64_t>(rows + 1));
    std::sort(cuts.begin(), cuts.end());
    std::vector<int> s(groups);
    int prev = 0;
    for (int g = 0; g < groups - 1; ++g) s[g] = cuts[g] - prev, prev = cuts[g];
    s[groups - 1] = rows - prev;
    return s;
}

void run_case(const Case& cs, uint64_t seed) {
    const int E = cs.e, G = cs.groups > 0 ? cs.groups : cs.e, N = cs.n, K = cs.k;
    const bool swiglu = cs.act == MoeActivation::SwiGLU;
    const int n_out = swiglu ? N / 2 : N;
    const std::vector<int> sizes = cs.sizes.empty() ? random_sizes(G, cs.rows, seed) : cs.sizes;
    ASSERT_EQ(static_cast<int>(sizes.size()), G);
    std::vector<int32_t> offsets(G + 1, cs.lead_rows);
    for (int g = 0; g < G; ++g) offsets[g + 1] = offsets[g] + sizes[g];
    const int used = offsets[G], rows = used + cs.extra_rows;
    const int ldc = cs.c_ld > 0 ? cs.c_ld : n_out;
    ASSERT_GE(ldc, n_out);
    const size_t isz = cs.in == DType::F8E4M3 ? 1 : 2, osz = dtype_size(cs.out);

    auto fa = loom::test::random_floats(size_t(rows) * K, seed + 1);
    auto fb = loom::test::random_floats(size_t(E) * N * K, seed + 2);  // [E][N][K]
    std::vector<unsigned char> ha(fa.size() * isz), hb(fb.size() * isz), hb_dev(fb.size() * isz);
    for (size_t i = 0; i < fa.size(); ++i) fa[i] = encode(fa[i], cs.in, &ha[i * isz]);
    for (size_t i = 0; i < fb.size(); ++i) fb[i] = encode(fb[i], cs.in, &hb[i * isz]);
    hb_dev = hb;
    if (cs.layout == BLayout::KN) {  // device gets [E][K][N]
        for (int e = 0; e < E; ++e)
            for (int r = 0; r < N; ++r)
                for (int c = 0; c < K; ++c)
                    std::memcpy(&hb_dev[((size_t(e) * K + c) * N + r) * isz], &hb[((size_t(e) * N + r) * K + c) * isz],
                                isz);
    }
    std::vector<float> scale_b(E);
    for (int e = 0; e < E; ++e) scale_b[e] = 0.5f + 0.125f * static_cast<float>(e % 8);
    const float scale_a = 1.5f;
    // Every result stays finite in the output type by construction. The inputs are at most 1 in magnitude (e4m3, bf16
    // or f16 of [-1, 1)) and each block scale is below 2^3, so |X| <= |alpha| x K, times scale_a x max scale_b with
    // per-tensor scales and 2^3 x 2^3 with block scales. GeLU and SiLU never grow a magnitude, so |C| is at most that
    // bound, or its square with SwiGLU (silu(gate) x up). With f16 out, alpha takes the largest power-of-two factor
    // (<= 1) that keeps this bound under 65504 / 4; the other output types keep alpha as given.
    const double x_max = std::fabs(double(cs.alpha)) * K *
                         (cs.scales ? double(scale_a) * *std::max_element(scale_b.begin(), scale_b.end()) : 1.0) *
                         (cs.block_scales ? 8.0 * 8.0 : 1.0);
    const auto c_max = [&](double f) { return swiglu ? (x_max * f) * (x_max * f) : x_max * f; };
    float fit = 1;
    while (cs.out == DType::F16 && c_max(fit) > 65504.0 / 4) fit /= 2;
    const float alpha = cs.alpha * fit;
    // Block scales: random in [2^-3, 2^3) so that a wrong block index shows (rows of A's scales follow A's rows).
    const int kblk = (K + 127) / 128, nblk = (N + 127) / 128;
    std::vector<float> sa_blk(cs.block_scales ? size_t(rows) * kblk : 0),
        sb_blk(cs.block_scales ? size_t(E) * nblk * kblk : 0);
    {
        std::mt19937_64 rng(loom::test::run_seed(seed + 3));
        std::uniform_real_distribution<float> u(-3.f, 3.f);
        for (float& v : sa_blk) v = std::exp2(u(rng));
        for (float& v : sb_blk) v = std::exp2(u(rng));
    }
    const auto blk = [&](int r, int e, int j, int kk) {
        return cs.block_scales ? double(sa_blk[size_t(r) * kblk + kk / 128]) *
                                     sb_blk[(size_t(e) * nblk + j / 128) * kblk + kk / 128]
                               : 1.0;
    };

    // Poison C: NaN in the output type.
    std::vector<unsigned char> hc(size_t(rows) * ldc * osz);
    for (size_t i = 0; i < size_t(rows) * ldc; ++i) {
        if (cs.out == DType::F32) {
            const float nan = std::nanf("");
            std::memcpy(&hc[i * 4], &nan, 4);
        } else {
            const uint16_t nan = cs.out == DType::BF16 ? 0x7fc0 : 0x7e00;
            std::memcpy(&hc[i * 2], &nan, 2);
        }
    }
    const std::vector<unsigned char> poison = hc;

    Dev da(ha.size()), db(hb_dev.size()), dc(hc.size()), doff(offsets.size() * 4), dsa(4), dsb(size_t(E) * 4);
    loom::test::upload(da.p, ha);
    loom::test::upload(db.p, hb_dev);
    loom::test::upload(dc.p, hc);
    loom::test::upload(doff.p, offsets);
    loom::test::upload(dsa.p, &scale_a, 1);
    loom::test::upload(dsb.p, scale_b);
    Dev dsab(sa_blk.size() * 4), dsbb(sb_blk.size() * 4);
    loom::test::upload(dsab.p, sa_blk);
    loom::test::upload(dsbb.p, sb_blk);

    const loom::MatrixView A{da.p, cs.in, rows, K, 0};
    const loom::MatrixView B = cs.layout == BLayout::NK ? loom::MatrixView{db.p, cs.in, int64_t(E) * N, K, 0}
                                                        : loom::MatrixView{db.p, cs.in, int64_t(E) * K, N, 0};
    const loom::MatrixView C{dc.p, cs.out, rows, n_out, cs.c_ld};
    loom::GroupedGemmOptions o;
    o.b_layout = cs.layout;
    o.activation = cs.act;
    o.alpha = alpha;
    if (cs.scales) {
        o.scale_a = static_cast<const float*>(dsa.p);
        o.scale_b = static_cast<const float*>(dsb.p);
    }
    if (cs.block_scales) {
        o.scale_a_blocks = static_cast<const float*>(dsab.p);
        o.scale_b_blocks = static_cast<const float*>(dsbb.p);
    }
    o.force_sm80 = cs.sm80;
    o.config = cs.config;
    loom::grouped_gemm(A, B, E, C, static_cast<const int32_t*>(doff.p), G, nullptr, o);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    LOOM_CHECK_CUDA(cudaMemcpy(hc.data(), dc.p, hc.size(), cudaMemcpyDeviceToHost));

    const double out_eps = cs.out == DType::F32 ? 1e-6 : (cs.out == DType::BF16 ? 1.0 / 256 : 1.0 / 2048);
    const bool f8 = cs.in == DType::F8E4M3;
    size_t bad = 0;
    std::vector<double> ref_all, got_all;
    for (int g = 0; g < G; ++g) {
        const int e = g % E;
        const double s = double(alpha) * (cs.scales ? double(scale_a) * scale_b[e] : 1.0);
        for (int r = offsets[g]; r < offsets[g + 1]; ++r) {
            // The product row X[r, :] in fp64, with each element's accumulation slack.
            std::vector<double> x(N), tol(N);
            for (int j = 0; j < N; ++j) {
                double acc = 0, mag = 0;
                const float* ar = &fa[size_t(r) * K];
                const float* br = &fb[(size_t(e) * N + j) * K];
                for (int kk = 0; kk < K; ++kk) {
                    const double p = double(ar[kk]) * br[kk] * blk(r, e, j, kk);
                    acc += p;
                    mag += std::fabs(p);
                }
                x[j] = s * acc;
                tol[j] = std::fabs(s) * (1e-5 * std::sqrt(double(K)) + (f8 ? mag / 2048 : 1e-6 * mag));
            }
            for (int j = 0; j < n_out; ++j) {
                double ref, t;
                if (swiglu) {
                    const double gt = x[j], up = x[N / 2 + j], sg = gt / (1 + std::exp(-gt));
                    ref = sg * up;
                    t = tol[j] * 1.1 * std::fabs(up) + tol[N / 2 + j] * std::fabs(sg);
                } else if (cs.act == MoeActivation::GeLU) {
                    ref = 0.5 * x[j] * (1 + std::erf(x[j] / std::sqrt(2.0)));
                    t = 1.2 * tol[j];
                } else {
                    ref = x[j];
                    t = tol[j];
                }
                t += out_eps * (std::fabs(ref) + 1e-3) + 1e-4;
                const double got = read_out(&hc[(size_t(r) * ldc + j) * osz], cs.out);
                ref_all.push_back(ref);
                got_all.push_back(got);
                if (!(std::fabs(got - ref) <= t)) {
                    if (bad < 5)
                        ADD_FAILURE() << "group " << g << " row " << r << " col " << j << ": got " << got
                                      << ", expected " << ref;
                    ++bad;
                }
            }
        }
    }
    EXPECT_EQ(bad, 0u);
    if (!ref_all.empty()) EXPECT_LT(loom::test::calc_diff(ref_all, got_all), f8 ? 1e-3 : 1e-5);
    // Every element outside the groups (rows before offsets[0] or past offsets[G], C's padding columns): untouched.
    size_t touched = 0;
    for (int r = 0; r < rows; ++r) {
        const bool in_group = r >= offsets[0] && r < offsets[G];
        for (int j = in_group ? n_out : 0; j < ldc; ++j) {
            const size_t at = (size_t(r) * ldc + j) * osz;
            if (std::memcmp(&hc[at], &poison[at], osz) != 0) {
                if (touched < 5)
                    ADD_FAILURE() << "row " << r << " col " << j << " is outside every group but was written";
                ++touched;
            }
        }
    }
    EXPECT_EQ(touched, 0u);
}

class GroupedGemm : public ::testing::Test {
  protected:
    void SetUp() override { LOOM_REQUIRE_GPU(); }
};

TEST_F(GroupedGemm, RandomGroupsBothLayouts) {
    uint64_t seed = 100;
    for (BLayout layout : {BLayout::NK, BLayout::KN}) {
        for (DType in : {DType::BF16, DType::F16}) {
            Case cs;
            cs.layout = layout;
            cs.in = in;
            cs.out = in;
            cs.n = 320;  // not a multiple of the tile
            cs.k = 200;
            SCOPED_TRACE(std::string(layout == BLayout::NK ? "NK " : "KN ") + dtype_name(in));
            run_case(cs, seed++);
        }
    }
}

TEST_F(GroupedGemm, EdgeGroupSizes) {
    Case cs;
    cs.e = 6;
    cs.sizes = {0, 0, 517, 0, 0, 0};  // all rows in one group
    run_case(cs, 7);
    cs.sizes = {1, 0, 127, 128, 129, 0};  // around the tile
    cs.out = DType::F32;
    run_case(cs, 8);
    cs.sizes = {0, 0, 0, 0, 0, 0};  // no rows at all
    cs.extra_rows = 3;
    run_case(cs, 9);
}

TEST_F(GroupedGemm, ManyExpertsAndSourceRankGroups) {
    Case cs;
    cs.e = 256;
    cs.rows = 3000;
    cs.n = 128;
    cs.k = 64;
    run_case(cs, 11);  // E = 256, ~12 rows per group: 64-row tiles
    cs.e = 8;
    cs.groups = 32;  // (source rank, expert) groups: group g uses expert g % 8
    cs.rows = 1500;
    cs.scales = true;
    run_case(cs, 12);
}

TEST_F(GroupedGemm, Activations) {
    uint64_t seed = 200;
    for (BLayout layout : {BLayout::NK, BLayout::KN}) {
        for (MoeActivation act : {MoeActivation::SwiGLU, MoeActivation::GeLU}) {
            Case cs;
            cs.layout = layout;
            cs.act = act;
            cs.n = 384;
            cs.k = 136;
            cs.scales = true;
            SCOPED_TRACE(std::to_string(static_cast<int>(act)));
            run_case(cs, seed++);
        }
    }
}

// fp8 with per-tensor scales: the Hopper kernel on sm_90, the portable one below.
TEST_F(GroupedGemm, Fp8PerTensorScales) {
    uint64_t seed = 300;
    for (MoeActivation act : {MoeActivation::None, MoeActivation::SwiGLU}) {
        Case cs;
        cs.in = DType::F8E4M3;
        cs.act = act;
        cs.k = 256;
        cs.n = 512;
        cs.scales = true;
        run_case(cs, seed++);
        cs.out = DType::F32;
        run_case(cs, seed++);
    }
}

// DeepSeek-V3 fp8: per-(row, 128-K block) scales of A and per-(128 x 128 block) scales of B, against the fp64 product
// of the dequantised inputs. K not a multiple of 128 (a partial last scale block), N not a multiple of the tile or of
// 128, random group sizes with empty groups and groups that are not tile multiples; the heuristic's tiles and forced
// 64- / 128-row x 64- / 128-column tiles with a few CTAs walking many tiles; SwiGLU (gate and up in different scale
// blocks), GeLU, per-tensor scales on top, (source rank, expert) groups. The Hopper kernel on sm_90; below sm_90 the
// portable kernel runs every case (a forced Hopper config keeps only its grid there).
TEST_F(GroupedGemm, Fp8BlockScales) {
    uint64_t seed = 600;
    for (MoeActivation act : {MoeActivation::None, MoeActivation::SwiGLU, MoeActivation::GeLU}) {
        for (DType out : {DType::BF16, DType::F32}) {
            Case cs;
            cs.in = DType::F8E4M3;
            cs.out = out;
            cs.act = act;
            cs.block_scales = true;
            cs.k = 400;
            cs.n = act == MoeActivation::SwiGLU ? 512 : 320;
            cs.rows = 900;
            cs.scales = out == DType::F32;
            SCOPED_TRACE(std::to_string(static_cast<int>(act)) + " " + dtype_name(out));
            run_case(cs, seed++);
        }
    }
    Case cs;
    cs.in = DType::F8E4M3;
    cs.block_scales = true;
    cs.k = 256;
    cs.n = 256;
    cs.sizes = {0, 1, 0, 127, 128, 129, 0, 300};  // around the tile, empty groups
    run_case(cs, seed++);
    cs.sizes = {};
    cs.e = 8;
    cs.groups = 32;  // (source rank, expert) groups
    cs.rows = 1200;
    run_case(cs, seed++);
    cs.groups = 0;
    cs.sizes = {0, 0, 0, 0, 0, 0, 0, 0};  // no rows
    run_case(cs, seed++);
    cs.sizes = {};
    cs.rows = 700;
    for (int bm : {64, 128}) {
        for (int bn : {64, 128}) {
            for (MoeActivation act : {MoeActivation::None, MoeActivation::SwiGLU}) {
                loom::GemmConfig c;
                c.block_m = bm;
                c.block_n = bn;
                c.block_k = 128;
                c.stages = 3;
                c.grid = 7;
                c.tma_store = bn == 128;  // the staged epilogue with 128-column tiles, the register one with 64
                cs.config = &c;
                cs.act = act;
                cs.n = act == MoeActivation::SwiGLU ? 768 : 448;
                cs.k = 528;
                SCOPED_TRACE("forced " + c.str());
                run_case(cs, seed++);
            }
        }
    }
}

// The epilogues' edges, staged and register: groups of one row, groups ending mid-tile followed by non-empty groups
// (the tile's rows past its group are the next group's and must not be written by it), rows before the first group,
// N not a multiple of the tile nor of the staged epilogue's 128-byte slab (a slab with one 16-byte chunk inside N),
// tiles narrower than whole slabs (160 columns; 80 with SwiGLU), a padded C (ld past its columns: the padding stays
// poisoned), 16- and 32-bit out, few CTAs walking many tiles.
TEST_F(GroupedGemm, EpilogueEdges) {
    int major = 0;
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    if (major < 9) GTEST_SKIP() << "Hopper configs";
    uint64_t seed = 700;
    for (bool staged : {true, false}) {
        for (int bm : {64, 128}) {
            for (int bn : {160, 256}) {
                for (DType out : {DType::BF16, DType::F32}) {
                    for (MoeActivation act : {MoeActivation::None, MoeActivation::SwiGLU}) {
                        loom::GemmConfig c;
                        c.block_m = bm;
                        c.block_n = bn;
                        c.stages = 3;
                        c.grid = 5;
                        c.tma_store = staged;
                        Case cs;
                        cs.config = &c;
                        cs.out = out;
                        cs.act = act;
                        cs.e = 8;
                        cs.sizes = {1, 0, 1, 70, 1, 130, 3, 64};
                        cs.lead_rows = 5;
                        cs.extra_rows = 7;
                        cs.n = act == MoeActivation::SwiGLU ? 336 : 328;  // n_out 168 / 328: 8 past a 64-column slab
                        cs.c_ld = (act == MoeActivation::SwiGLU ? 168 : 328) + 8;
                        cs.k = 136;
                        cs.scales = true;
                        SCOPED_TRACE("forced " + c.str() + " " + dtype_name(out) + " act " +
                                     std::to_string(static_cast<int>(act)));
                        run_case(cs, seed++);
                    }
                }
            }
        }
    }
}

TEST_F(GroupedGemm, PortableKernel) {
    uint64_t seed = 400;
    for (BLayout layout : {BLayout::NK, BLayout::KN}) {
        for (MoeActivation act : {MoeActivation::None, MoeActivation::SwiGLU, MoeActivation::GeLU}) {
            Case cs;
            cs.sm80 = true;
            cs.layout = layout;
            cs.act = act;
            cs.n = 272;
            cs.k = 200;
            cs.scales = true;
            run_case(cs, seed++);
        }
    }
}

// fp8 e4m3 on the portable kernel (force_sm80: converted to bf16 in shared memory, bf16 mma.sync), against the same
// fp64 reference as the Hopper fp8 cases: per-tensor and per-128-block scales (both on top of each other too), every
// activation, 16- and 32-bit out; K = 16 mod 32 (a half k-tile of zeros) and not a multiple of 128 (a partial last
// scale block); N not a multiple of the 128-column tile (nor, with SwiGLU, of the 64 output columns); random group
// sizes over 8 experts; then groups of 0, 1 and around the 128-row tile with rows before and after the groups and a
// padded C, few CTAs walking many tiles (each CTA reuses its shared memory tile after tile), (source rank, expert)
// groups and no rows at all.
TEST_F(GroupedGemm, PortableKernelFp8) {
    uint64_t seed = 800;
    for (bool block : {false, true}) {
        for (MoeActivation act : {MoeActivation::None, MoeActivation::SwiGLU, MoeActivation::GeLU}) {
            for (DType out : {DType::BF16, DType::F32, DType::F16}) {
                Case cs;
                cs.sm80 = true;
                cs.in = DType::F8E4M3;
                cs.out = out;
                cs.act = act;
                cs.block_scales = block;
                cs.scales = !block || out == DType::F32;
                cs.k = 400;
                cs.n = act == MoeActivation::SwiGLU ? (block ? 768 : 272) : 336;
                cs.rows = 900;
                SCOPED_TRACE(std::string(block ? "block scales " : "per-tensor scales ") + "act " +
                             std::to_string(static_cast<int>(act)) + " " + dtype_name(out));
                run_case(cs, seed++);
            }
        }
    }
    loom::GemmConfig few;
    few.sm80 = true;
    few.grid = 5;
    for (bool block : {false, true}) {
        Case cs;
        cs.sm80 = true;
        cs.config = &few;
        cs.in = DType::F8E4M3;
        cs.block_scales = block;
        cs.scales = true;
        cs.e = 8;
        cs.sizes = {0, 1, 0, 127, 128, 129, 0, 300};
        cs.lead_rows = 5;
        cs.extra_rows = 7;
        cs.act = MoeActivation::SwiGLU;
        cs.n = 512;
        cs.k = 208;
        cs.c_ld = 256 + 8;
        SCOPED_TRACE(block ? "block scales" : "per-tensor scales");
        run_case(cs, seed++);
        cs.sizes = {};
        cs.groups = 32;  // (source rank, expert) groups: group g uses expert g % 8
        cs.rows = 1200;
        cs.act = MoeActivation::None;
        cs.out = DType::F32;
        cs.n = 200;
        cs.c_ld = 0;
        run_case(cs, seed++);
        cs.groups = 0;
        cs.sizes = {0, 0, 0, 0, 0, 0, 0, 0};  // no rows
        run_case(cs, seed++);
    }
}

// The portable kernel's e4m3 -> bf16 conversion, bit for bit: A's rows hold every e4m3 value (a different order in each
// row), B_e = 2^e x identity, so C = A x B_e^T is A's values times 2^e, exact in fp32; with per-128-block scales
// (powers of two) times sa[r, n / 128] x sb[e, n / 128, n / 128], also exact, which pins each scale block to its
// columns. A NaN (either sign) makes its row NaN. C (fp32) is poisoned with a finite sentinel so that a NaN is never
// the poison. The same checks run on the default kernel (Hopper's wgmma on sm_90).
TEST_F(GroupedGemm, PortableKernelFp8EveryValue) {
    constexpr int E = 3, K = 256, N = 256;
    const std::vector<int> sizes = {0, 130, 171};  // group g uses expert g
    const int rows = 301, kblk = K / 128, nblk = N / 128;
    const auto e4m3 = [](unsigned char code) {
        __nv_fp8_e4m3 v;
        std::memcpy(&v, &code, 1);
        return static_cast<float>(v);
    };
    std::vector<unsigned char> ha(size_t(rows) * K), hb(size_t(E) * N * K, 0);
    std::vector<int> nan_rows = {7, 140, 300};
    for (int r = 0; r < rows; ++r) {
        for (int k = 0; k < K; ++k) {
            const unsigned char code = static_cast<unsigned char>((k * 7 + r * 13) % 256);  // 7 is odd: every code
            ha[size_t(r) * K + k] = (code & 0x7f) == 0x7f ? 0x00 : code;                    // NaN only where placed
        }
    }
    ha[size_t(nan_rows[0]) * K + 5] = 0x7f;
    ha[size_t(nan_rows[1]) * K + 200] = 0xff;
    ha[size_t(nan_rows[2]) * K + 255] = 0x7f;
    for (int e = 0; e < E; ++e)
        for (int n = 0; n < N; ++n) hb[(size_t(e) * N + n) * K + n] = static_cast<unsigned char>(0x38 + 8 * e);  // 2^e
    std::vector<float> sa(size_t(rows) * kblk), sb(size_t(E) * nblk * kblk);
    for (int r = 0; r < rows; ++r)
        for (int kb = 0; kb < kblk; ++kb) sa[size_t(r) * kblk + kb] = std::ldexp(1.f, (r + 3 * kb) % 5 - 2);
    for (int e = 0; e < E; ++e)
        for (int nb = 0; nb < nblk; ++nb)
            for (int kb = 0; kb < kblk; ++kb)
                sb[(size_t(e) * nblk + nb) * kblk + kb] = std::ldexp(1.f, (e + nb + 2 * kb) % 3 - 1);
    std::vector<int32_t> offsets(E + 1, 0);
    for (int g = 0; g < E; ++g) offsets[g + 1] = offsets[g] + sizes[g];
    ASSERT_EQ(offsets[E], rows);
    const float sentinel = -12345.f;
    const std::vector<float> poison(size_t(rows) * N, sentinel);

    Dev da(ha.size()), db(hb.size()), dc(poison.size() * 4), doff(offsets.size() * 4), dsa(sa.size() * 4),
        dsb(sb.size() * 4);
    loom::test::upload(da.p, ha);
    loom::test::upload(db.p, hb);
    loom::test::upload(doff.p, offsets);
    loom::test::upload(dsa.p, sa);
    loom::test::upload(dsb.p, sb);
    const loom::MatrixView A{da.p, DType::F8E4M3, rows, K, 0};
    const loom::MatrixView B{db.p, DType::F8E4M3, int64_t(E) * N, K, 0};
    const loom::MatrixView C{dc.p, DType::F32, rows, N, 0};
    for (bool sm80 : {true, false}) {
        for (bool block : {false, true}) {
            SCOPED_TRACE(std::string(sm80 ? "force_sm80" : "default kernel") + (block ? ", block scales" : ""));
            loom::test::upload(dc.p, poison);
            loom::GroupedGemmOptions o;
            o.force_sm80 = sm80;
            if (block) {
                o.scale_a_blocks = static_cast<const float*>(dsa.p);
                o.scale_b_blocks = static_cast<const float*>(dsb.p);
            }
            loom::grouped_gemm(A, B, E, C, static_cast<const int32_t*>(doff.p), E, nullptr, o);
            LOOM_CHECK_CUDA(cudaDeviceSynchronize());
            std::vector<float> hc(poison.size());
            LOOM_CHECK_CUDA(cudaMemcpy(hc.data(), dc.p, hc.size() * 4, cudaMemcpyDeviceToHost));
            size_t bad = 0;
            for (int g = 0; g < E; ++g) {
                for (int r = offsets[g]; r < offsets[g + 1]; ++r) {
                    const bool nan_row = std::find(nan_rows.begin(), nan_rows.end(), r) != nan_rows.end();
                    for (int n = 0; n < N; ++n) {
                        const float got = hc[size_t(r) * N + n];
                        const float want =
                            e4m3(ha[size_t(r) * K + n]) * std::ldexp(1.f, g) *
                            (block ? sa[size_t(r) * kblk + n / 128] * sb[(size_t(g) * nblk + n / 128) * kblk + n / 128]
                                   : 1.f);
                        if (nan_row ? !std::isnan(got) : got != want) {
                            if (bad < 5)
                                ADD_FAILURE() << "row " << r << " col " << n << " (A code 0x" << std::hex
                                              << int(ha[size_t(r) * K + n]) << std::dec << "): got " << got
                                              << ", expected " << (nan_row ? "NaN" : std::to_string(want));
                            ++bad;
                        }
                    }
                }
            }
            EXPECT_EQ(bad, 0u);
        }
    }
}

TEST_F(GroupedGemm, ForcedConfigs) {
    int major = 0;
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    if (major < 9) GTEST_SKIP() << "Hopper configs";
    uint64_t seed = 500;
    for (bool staged : {true, false}) {
        for (int bm : {64, 128}) {
            for (int bn : {128, 160, 256}) {
                loom::GemmConfig c;
                c.block_m = bm;
                c.block_n = bn;
                c.stages = 3;
                c.grid = 7;  // few CTAs: each walks many tiles
                c.tma_store = staged;
                Case cs;
                cs.config = &c;
                cs.n = 448;
                cs.k = 192;
                SCOPED_TRACE("forced " + c.str());
                run_case(cs, seed++);
            }
        }
    }
}

TEST_F(GroupedGemm, BadInputsRaise) {
    Dev buf(1 << 16);
    const loom::MatrixView A{buf.p, DType::BF16, 16, 64, 0};
    const loom::MatrixView B{buf.p, DType::BF16, 4 * 64, 64, 0};
    const loom::MatrixView C{buf.p, DType::BF16, 16, 64, 0};
    EXPECT_THROW(loom::grouped_gemm(A, B, 4, C, nullptr, 4, nullptr), loom::Error);
    int host_offsets[5] = {0, 4, 8, 12, 16};
    EXPECT_THROW(loom::grouped_gemm(A, B, 4, C, host_offsets, 4, nullptr), loom::Error);  // not device memory
    loom::GroupedGemmOptions o;
    o.scale_a_blocks = static_cast<const float*>(buf.p);
    EXPECT_THROW(loom::grouped_gemm(A, B, 4, C, static_cast<const int32_t*>(buf.p), 4, nullptr, o),
                 loom::Error);  // only one of the block scales
    o.scale_b_blocks = static_cast<const float*>(buf.p);
    EXPECT_THROW(loom::grouped_gemm(A, B, 4, C, static_cast<const int32_t*>(buf.p), 4, nullptr, o),
                 loom::Error);  // block scales with bf16 inputs
    const loom::MatrixView A8{buf.p, DType::F8E4M3, 16, 64, 0};
    const loom::MatrixView B8{buf.p, DType::F8E4M3, 4 * 64, 64, 0};
    o.force_sm80 = true;
    o.b_layout = BLayout::KN;
    EXPECT_THROW(loom::grouped_gemm(A8, B8, 4, C, static_cast<const int32_t*>(buf.p), 4, nullptr, o),
                 loom::Error);  // fp8 with B as [K, N], on either kernel
    o.b_layout = BLayout::NK;
    o.force_sm80 = false;
    o.scale_b_blocks = reinterpret_cast<const float*>(host_offsets);
    EXPECT_THROW(loom::grouped_gemm(A8, B8, 4, C, static_cast<const int32_t*>(buf.p), 4, nullptr, o),
                 loom::Error);  // host memory
}

}  // namespace
