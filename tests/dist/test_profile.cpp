// The intra-kernel profiler on the GPU (docs/profiling.md), under loomrun at 2, 4 and 8 ranks: a profiled ag_gemm
// writes one trace whose GEMM spans cover every tile of the GEMM on every rank, and its output is bitwise the
// unprofiled call's; a profiled all_reduce leaves its collective spans on every rank, same output. Inputs are fresh
// random values, outputs poisoned first; every rank's verdict is agreed through the store.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/device_io.hpp"
#include "common/reference.hpp"
#include "common/test_env.hpp"
#include "common/trace_check.hpp"
#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/profile.hpp"
#include "ops/gemm/gemm_internal.hpp"

namespace loom {
namespace {

namespace fs = std::filesystem;

class Profile : public ::WorldStreamTest {
  protected:
    void TearDown() override {
        profile::set_enabled(false);
        ::WorldStreamTest::TearDown();
    }
};

struct Dev {
    void* p = nullptr;
    explicit Dev(std::size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
    ~Dev() { cudaFree(p); }
};

void upload_random_bf16(void* dst, std::size_t n, std::uint64_t seed) {
    const std::vector<float> f = test::random_floats(n, seed);
    std::vector<std::uint16_t> h(n);
    for (std::size_t i = 0; i < n; ++i) h[i] = test::float_to_bf16(f[i]);
    test::upload(dst, h);
}

std::vector<std::uint8_t> download(const void* src, std::size_t bytes) {
    std::vector<std::uint8_t> h(bytes);
    EXPECT_EQ(cudaMemcpy(h.data(), src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

// A failed stream raises (the caller's verdict then still reaches the peers).
void sync(cudaStream_t s) {
    const cudaError_t e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) throw std::runtime_error(std::string("stream: ") + cudaGetErrorString(e));
}

// Every rank's trace path (only rank 0's is written) in a directory of this process.
fs::path trace_path(const std::string& name) {
    const fs::path dir = fs::temp_directory_path() / ("loom_profile_test_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    return dir / name;
}

nlohmann::json read_json(const std::string& path) {
    std::ifstream f(path);
    return nlohmann::json::parse(f);
}

TEST_F(Profile, AgGemmTraceCoversEveryTile) {
    World& world = *w;
    const int W = world.world_size(), me = world.rank();
    const int64_t rows = 256, n = 384, k = 512, M = rows * W;
    // A fixed 128 x 128 tile, so that the test knows the tile grid.
    GemmConfig cfg = gemm_heuristic(M, n, k, false, 90, 132);
    cfg.block_m = 128;
    cfg.block_n = 128;
    cfg.stages = kernels::gemm_sm90_plan_stages(cfg.block_m, cfg.block_n);
    cfg.cluster_m = 1;
    cfg.tma_store = true;
    cfg.tail_splits = 1;
    cfg.grid = 0;
    AgGemmOptions opts;
    opts.config = &cfg;
    const std::uint64_t seed = std::random_device{}();
    Dev a(rows * k * 2), b(n * k * 2), plain(M * n * 2), profiled(M * n * 2);
    upload_random_bf16(a.p, rows * k, seed + 2 * me);
    upload_random_bf16(b.p, n * k, seed + 2 * me + 1);
    EXPECT_EQ(cudaMemset(plain.p, 0xff, M * n * 2), cudaSuccess);  // NaN poison
    EXPECT_EQ(cudaMemset(profiled.p, 0xff, M * n * 2), cudaSuccess);
    const MatrixView A{a.p, DType::BF16, rows, k, 0}, B{b.p, DType::BF16, n, k, 0};

    std::string err;
    std::string path;
    try {
        profile::set_enabled(false);
        ag_gemm(world, A, B, MatrixView{plain.p, DType::BF16, M, n, 0}, stream, opts);
        sync(stream);
        profile::clear();
        profile::set_enabled(true);
        ag_gemm(world, A, B, MatrixView{profiled.p, DType::BF16, M, n, 0}, stream, opts);
        sync(stream);
        profile::set_enabled(false);
        path = profile::write_trace(world, trace_path("ag_gemm.json").string());
    } catch (const std::exception& e) {
        err = e.what();
    }
    if (err.empty() && download(plain.p, M * n * 2) != download(profiled.p, M * n * 2))
        err = "the profiled ag_gemm's output differs from the unprofiled one";
    if (err.empty() && path.empty()) err = "no trace written";
    if (err.empty() && me == 0) try {  // an error here must reach the agreement, not leave the peers waiting
            const nlohmann::json trace = read_json(path);
            err = loom_test::check_trace(trace);
            const int64_t num_m = (M + 127) / 128, num_n = (n + 127) / 128;
            const auto tiles = loom_test::span_args(trace, "gemm.tile");
            const auto waits = loom_test::span_args(trace, "ag_gemm.chunk_wait");
            for (int r = 0; r < W && err.empty(); ++r) {
                std::set<std::pair<int64_t, int64_t>> seen;
                std::size_t spans = 0;
                if (auto it = tiles.find(r); it != tiles.end()) {
                    for (const auto& args : it->second)
                        seen.emplace(args.at("m_block").get<int64_t>(), args.at("n_block").get<int64_t>());
                    spans = it->second.size();
                }
                if (static_cast<int64_t>(seen.size()) != num_m * num_n)
                    err = fmt::format("rank {}: {} of {} tiles in the trace", r, seen.size(), num_m * num_n);
                else if (spans != static_cast<std::size_t>(2 * num_m * num_n))  // two consumer warpgroups per tile
                    err = fmt::format("rank {}: {} tile spans, expected {}", r, spans, 2 * num_m * num_n);
                else if (W > 1 && !waits.count(r))
                    err = fmt::format("rank {}: no ag_gemm.chunk_wait span", r);
            }
            if (err.empty()) std::printf("profile trace: %s\n", path.c_str());
        } catch (const std::exception& e) {
            err = std::string("reading the trace: ") + e.what();
        }
    const std::string verdict = test::agree(world, err, "test/profile/ag_gemm");
    EXPECT_EQ(verdict, "");
}

TEST_F(Profile, AllReduceTraceHasEveryRank) {
    World& world = *w;
    const int W = world.world_size(), me = world.rank();
    const std::size_t count = std::size_t{1} << 20;
    void* in = world.alloc_bytes(count * 2);
    void* out = world.alloc_bytes(count * 2);
    void* out2 = world.alloc_bytes(count * 2);
    upload_random_bf16(in, count, std::random_device{}() + me);
    EXPECT_EQ(cudaMemset(out, 0xff, count * 2), cudaSuccess);
    EXPECT_EQ(cudaMemset(out2, 0xff, count * 2), cudaSuccess);
    world.barrier();
    std::string err, path;
    try {
        profile::set_enabled(false);
        all_reduce(world, {in, DType::BF16, count}, {out, DType::BF16, count}, stream);
        sync(stream);
        profile::clear();
        profile::set_enabled(true);
        all_reduce(world, {in, DType::BF16, count}, {out2, DType::BF16, count}, stream);
        sync(stream);
        profile::set_enabled(false);
        path = profile::write_trace(world, trace_path("all_reduce.json").string());
    } catch (const std::exception& e) {
        err = e.what();
    }
    if (err.empty() && download(out, count * 2) != download(out2, count * 2))
        err = "the profiled all_reduce's output differs from the unprofiled one";
    if (err.empty() && path.empty()) err = "no trace written";
    if (err.empty() && me == 0) try {  // an error here must reach the agreement, not leave the peers waiting
            const nlohmann::json trace = read_json(path);
            err = loom_test::check_trace(trace);
            std::set<int> ranks;
            for (const auto& e : trace["traceEvents"])
                if (e["ph"] == "B" && e["name"].get<std::string>().rfind("coll.", 0) == 0)
                    ranks.insert(e["pid"].get<int>());
            if (err.empty() && static_cast<int>(ranks.size()) != W)
                err = fmt::format("collective spans on {} of {} ranks", ranks.size(), W);
        } catch (const std::exception& e) {
            err = std::string("reading the trace: ") + e.what();
        }
    const std::string verdict = test::agree(world, err, "test/profile/all_reduce");
    world.barrier();
    world.free(out2);
    world.free(out);
    world.free(in);
    EXPECT_EQ(verdict, "");
}

}  // namespace
}  // namespace loom
