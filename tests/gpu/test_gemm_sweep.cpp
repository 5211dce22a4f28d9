// loom::gemm over the configs its heuristic can pick, each against an fp64 device reference (a naive kernel with
// nothing in common with the GEMM: tests/common/kernels/gemm_reference.cuh) on fresh random inputs, C poisoned with NaN
// first (an unwritten element fails), every element checked, and C's row padding and the words past its end checked
// untouched (no store outside the matrix).
//   - the reported case: M = 17, N = 4096, K = 2048 with the heuristic's config at 26 SMs (a 20 % MPS share of an H200:
//     64 x 160, 7 stages, 26 CTAs), and M / output / epilogue variants of it;
//   - every BLOCK_N of 64-row tiles and a sample of 128- and 192-row ones, with N tails of several residue classes mod
//     BLOCK_N (one tile, several, more tiles than CTAs), M tails, grids smaller and larger than the tile count;
//   - the heuristic's own config at SM counts 8..132 (the SM count is the heuristic's argument: an MPS client's share
//     is what it sees, so these run the configs of those shares on the whole GPU), M 1..300 and N / K of several sizes.
// Distinct kernels are capped (kMaxKernels, ~1 s of JIT each on first use); a case whose kernel would pass the cap is
// reported and skipped. Run: build/tests/loom_gpu_tests --gtest_filter='GemmSweep.*'
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "common/device_io.hpp"
#include "common/gemm_reference.hpp"
#include "common/reference.hpp"
#include "common/test_env.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"

namespace {

using loom::DType;
using loom::GemmConfig;

constexpr std::size_t kMaxKernels = 40;

struct SweepCase {
    int64_t m, n, k;
    GemmConfig cfg;  // passed as GemmOptions::config (grid 0: the launch's default)
    DType out = DType::BF16;
    float alpha = 1.f;   // 1: the kernel without epilogue arithmetic (stmatrix staging); else the affine one
    int64_t ld_pad = 0;  // C's row stride is n + ld_pad
};

std::string describe(const SweepCase& c) {
    return fmt::format("M={} N={} K={} {} out {} alpha {} ldc {}", c.m, c.n, c.k, c.cfg.str(), loom::dtype_name(c.out),
                       c.alpha, c.n + c.ld_pad);
}

// What selects the kernel instantiation a case launches (its JIT cost): the tile, ring, epilogue kind and output type,
// and whether the launch splits the tail at its grid.
std::string kernel_key(const SweepCase& c) {
    const GemmConfig& g = c.cfg;
    const int64_t grid = g.grid > 0 ? g.grid : loom::gemm_sm90_grid(c.m, c.n, g, 132);
    const bool split = g.tail_splits >= 2 && loom::gemm_tail_plan(c.m, c.n, c.k, g, grid, g.tail_splits).splits >= 2;
    return fmt::format("{}x{} st{} c{} {} {} {}", g.block_m, g.block_n, g.stages, g.cluster_m, loom::dtype_name(c.out),
                       c.alpha == 1.f ? "plain" : "affine", split ? "split" : "whole");
}

// The kernels compiled so far by this binary's sweep cases.
std::set<std::string>& kernels_used() {
    static std::set<std::string> s;
    return s;
}

// Whether the case may run: its kernel is compiled already or the cap leaves room for it.
bool within_budget(const SweepCase& c) {
    const std::string key = kernel_key(c);
    if (kernels_used().count(key)) return true;
    if (kernels_used().size() >= kMaxKernels) {
        std::printf("[ skipped  ] %s: kernel %s past the cap of %zu kernels\n", describe(c).c_str(), key.c_str(),
                    kMaxKernels);
        return false;
    }
    kernels_used().insert(key);
    return true;
}

using loom::test::DevMem;

using loom::test::upload_random_bf16;

// Runs the case on fresh inputs and checks it: "" or what is wrong.
std::string run_checked(const SweepCase& c, uint64_t seed) {
    const int64_t m = c.m, n = c.n, k = c.k, ld = n + c.ld_pad;
    const std::size_t es = loom::dtype_size(c.out);
    constexpr int64_t kGuard = 4096;  // elements past C's end that must stay poisoned
    DevMem a(static_cast<std::size_t>(m * k) * 2), b(static_cast<std::size_t>(n * k) * 2);
    const std::size_t c_bytes = static_cast<std::size_t>(m * ld + kGuard) * es;
    DevMem out(c_bytes);
    upload_random_bf16(a.p, static_cast<std::size_t>(m * k), seed);
    upload_random_bf16(b.p, static_cast<std::size_t>(n * k), seed + 1);
    LOOM_CHECK_CUDA(cudaMemset(out.p, 0xFF, c_bytes));  // NaN in bf16 / f16 / f32
    loom::test::DeviceReference ref(m, n);
    ref.add(a.p, b.p, DType::BF16, false, k, c.alpha, false, nullptr);
    loom::GemmOptions o;
    o.alpha = c.alpha;
    o.config = &c.cfg;
    try {
        loom::gemm(loom::MatrixView{a.p, DType::BF16, m, k, 0}, loom::MatrixView{b.p, DType::BF16, n, k, 0},
                   loom::MatrixView{out.p, c.out, m, n, ld}, o);
        const cudaError_t e = cudaDeviceSynchronize();
        if (e != cudaSuccess) return std::string("the launch failed: ") + cudaGetErrorString(e);
    } catch (const loom::Error& e) {
        return std::string("loom::Error: ") + e.what();
    }
    std::vector<double> r, s;
    ref.download(r, s, 0, m, nullptr);
    const double rel = c.out == DType::F32 ? 1e-6 : 1.0 / 256;  // bf16: twice its rounding
    std::string err = loom::test::compare_to_reference(loom::test::download_matrix(out.p, c.out, m, n, ld), r, s, n,
                                                       rel, 1.0 / 65536, 1e-4);
    // The padding of every row and the words past the end: still the poison bytes.
    std::vector<unsigned char> all(c_bytes);
    LOOM_CHECK_CUDA(cudaMemcpy(all.data(), out.p, c_bytes, cudaMemcpyDeviceToHost));
    std::size_t touched = 0;
    for (int64_t row = 0; row < m; ++row)
        for (std::size_t byte = static_cast<std::size_t>(row * ld + n) * es;
             byte < static_cast<std::size_t>((row + 1) * ld) * es; ++byte)
            touched += all[byte] != 0xFF;
    for (std::size_t byte = static_cast<std::size_t>(m * ld) * es; byte < c_bytes; ++byte) touched += all[byte] != 0xFF;
    if (touched) err += fmt::format(" {} bytes outside C written", touched);
    return err;
}

void check(const SweepCase& c, uint64_t seed) {
    if (!within_budget(c)) return;
    const std::string err = run_checked(c, seed);
    EXPECT_EQ(err, "") << describe(c) << " (kernel " << kernel_key(c) << ")";
}

class GemmSweep : public ::testing::Test {
  protected:
    void SetUp() override {
        LOOM_REQUIRE_GPU();
        const loom::detail::GemmDevice dev = loom::detail::gemm_device();
        if (dev.arch < 90) GTEST_SKIP() << "the Hopper kernel needs sm_90, given " << dev.arch;
    }
};

// Issue #40's case: a process with a 20 % MPS share of an H200 (26 SMs) gets this config from the heuristic. Here the
// config is given explicitly, so the same kernel and grid run whatever the GPU's SM count.
TEST_F(GemmSweep, ReportedSkinnyCaseAt26Sms) {
    const GemmConfig cfg = loom::gemm_heuristic(17, 4096, 2048, false, 90, 26);
    EXPECT_EQ(cfg.str(), "sm90 64x160x64 st7 wg1 cluster1 g1 grid26");
    check({17, 4096, 2048, cfg}, 4000);
    // M = 1 and 16 (warp 0's rows only), 33 and 64 (three and four warps), the affine epilogue, fp32 out, a padded C.
    for (int64_t m : {1, 16, 33, 64}) check({m, 4096, 2048, cfg}, 4001 + m);
    check({17, 4096, 2048, cfg, DType::BF16, 0.75f}, 4100);
    check({17, 4096, 2048, cfg, DType::F32, 0.75f, 64}, 4101);
    // And the heuristic of this process (the whole GPU here, or an MPS share where one is set).
    const loom::detail::GemmDevice dev = loom::detail::gemm_device();
    check({17, 4096, 2048, loom::gemm_heuristic(17, 4096, 2048, false, 90, dev.num_sms)}, 4102);
}

// A tile as the heuristic completes it (the most stages that fit, its raster group), with a forced grid (0: default).
GemmConfig tile(int bm, int bn, int64_t m, int64_t n, int grid) {
    GemmConfig c;
    c.block_m = bm;
    c.block_n = bn;
    c.cluster_m = 1;
    loom::detail::gemm_complete_config(c, m, n, 26);
    c.grid = grid;
    return c;
}

// N = q x BLOCK_N + r for residues r = BLOCK_N (no tail), 8, about half, BLOCK_N - 8 (and 96 at BLOCK_N 160, the
// reported tail), q = 0 (one partial tile), 3 and 25 (4096's at 160): the last tile's slabs, past-N B rows, the
// persistent walk with more tiles than CTAs (grid 3) and fewer (grid 26 or the default).
TEST_F(GemmSweep, EveryBlockNWithTailsOfEveryClass) {
    struct Tiles {
        int bm;
        std::vector<int> widths;
        std::vector<int64_t> rows;
    };
    const std::vector<Tiles> sets = {
        {64, {64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256}, {17, 64}},
        {128, {80, 112, 144, 160, 208, 256}, {97, 145}},
        {192, {112, 144}, {251}},
    };
    uint64_t seed = 5000;
    for (const Tiles& t : sets)
        for (int bn : t.widths) {
            std::vector<int> residues = {bn, 8, bn / 2 / 8 * 8, bn - 8};
            if (bn == 160) residues.push_back(96);
            int variant = 0;
            for (int r : residues)
                for (int64_t q : {0, 3, 25}) {
                    if (q == 25 && r != residues.back()) continue;  // the long N once per width
                    const int64_t n = q * bn + r;
                    const int64_t m = t.rows[static_cast<std::size_t>(variant) % t.rows.size()];
                    const int grid = std::vector<int>{3, 26, 0}[static_cast<std::size_t>(variant) % 3];
                    const int64_t k = q == 25 ? 1024 : (variant % 2 ? 520 : 192);
                    SweepCase c{m, n, k, tile(t.bm, bn, m, n, grid)};
                    c.ld_pad = variant % 2 ? 64 : 0;
                    check(c, seed++);
                    ++variant;
                }
        }
}

// The heuristic's config at each SM count (8..132), as a process with that share of the GPU would get it, on skinny to
// mid-size shapes (M 1..300 with tails of every tile height, N with and without tails, short and long K).
TEST_F(GemmSweep, HeuristicConfigsAtSmCounts) {
    struct Shape {
        int64_t m, n, k;
    };
    const std::vector<Shape> shapes = {{17, 4096, 2048}, {1, 4096, 512},  {97, 1032, 520},  {251, 2056, 264},
                                       {300, 1376, 512}, {64, 8192, 256}, {128, 1792, 640}, {200, 520, 1504}};
    uint64_t seed = 6000;
    for (int sms : {8, 13, 20, 26, 33, 44, 57, 66, 78, 97, 114, 132})
        for (const Shape& s : shapes) {
            const GemmConfig cfg = loom::gemm_heuristic(s.m, s.n, s.k, false, 90, sms);
            SCOPED_TRACE(fmt::format("{} SMs", sms));
            check({s.m, s.n, s.k, cfg}, seed++);
        }
    std::printf("GemmSweep: %zu distinct kernels\n", kernels_used().size());
}

}  // namespace
